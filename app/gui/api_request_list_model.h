// ApiRequestListModel: the completions the window's OpenAI server is running, read-only, as
// the sidebar's "API requests" list shows them (from the telemetry frames). GUI thread only.
#pragma once
#include <QtQml/qqmlregistration.h>

#include <QAbstractListModel>

#include "worker_types.h"

namespace granule::app {

class ApiRequestListModel : public QAbstractListModel {
  Q_OBJECT
  QML_ELEMENT
  QML_UNCREATABLE("API requests come from the window's server")
  Q_PROPERTY(int count READ count NOTIFY countChanged)

 public:
  enum Role {
    RequestIdRole = Qt::UserRole + 1,
    EndpointRole,  // "chat" or "completions"
    StreamRole,
    PromptTokensRole,
    CompletionTokensRole,
    StateRole,  // "waiting", "prefill", "generating", "finishing"
    KvCommittedBytesRole,
    KvReservedBytesRole,
  };
  Q_ENUM(Role)

  explicit ApiRequestListModel(QObject* parent = nullptr);

  int rowCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role) const override;
  QHash<int, QByteArray> roleNames() const override;
  int count() const { return static_cast<int>(rows_.size()); }
  const QList<ApiRequestTelemetry>& rows() const { return rows_; }

  // The frame's requests: rows whose ids are unchanged are updated in place (no reset, so
  // the list does not flicker at 10 Hz).
  void setRequests(const QList<ApiRequestTelemetry>& requests);

 Q_SIGNALS:
  void countChanged();

 private:
  QList<ApiRequestTelemetry> rows_;
};

}  // namespace granule::app
