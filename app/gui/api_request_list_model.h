// ApiRequestListModel: the completions the window's OpenAI server is running, read-only, as
// the sidebar's "API requests" list shows them (from the telemetry frames). GUI thread only.
#pragma once
#include <QtQml/qqmlregistration.h>

#include "list_model.h"
#include "worker_types.h"

namespace granule::app {

class ApiRequestListModel : public granule::app::ListModel {
  Q_OBJECT
  QML_ELEMENT
  QML_UNCREATABLE("API requests come from the window's server")

 public:
  enum Role {
    RequestIdRole = Qt::UserRole + 1,
    EndpointRole,  // "chat" or "completions"
    StreamRole,
    PromptTokensRole,
    CompletionTokensRole,
    RequestStateRole,  // "waiting", "prefill", "generating", "finishing"
    KvCommittedBytesRole,
    KvReservedBytesRole,
  };
  Q_ENUM(Role)

  explicit ApiRequestListModel(QObject* parent = nullptr);

  const QList<ApiRequestTelemetry>& rows() const { return rows_; }

  // The frame's requests: rows whose ids are unchanged are updated in place (no reset, so
  // the list does not flicker at 10 Hz).
  void setRequests(const QList<ApiRequestTelemetry>& requests);

 private:
  int itemCount() const override { return static_cast<int>(rows_.size()); }
  QVariant value(int row, int role) const override;

  QList<ApiRequestTelemetry> rows_;
};

}  // namespace granule::app
