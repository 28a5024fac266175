// The server's requests as list rows.
#include "api_request_list_model.h"

namespace granule::app {

ApiRequestListModel::ApiRequestListModel(QObject* parent) : ListModel(RequestIdRole, parent) {}

QVariant ApiRequestListModel::value(int row, int role) const {
  const ApiRequestTelemetry& r = rows_[row];
  switch (role) {
    case RequestIdRole:
      return r.request_id;
    case EndpointRole:
      return r.endpoint;
    case StreamRole:
      return r.stream;
    case PromptTokensRole:
      return static_cast<double>(r.prompt_tokens);
    case CompletionTokensRole:
      return static_cast<double>(r.completion_tokens);
    case RequestStateRole:
      return r.state;
    case KvCommittedBytesRole:
      return static_cast<double>(r.sequence.kv_committed_bytes);
    case KvReservedBytesRole:
      return static_cast<double>(r.sequence.kv_reserved_bytes);
    default:
      return {};
  }
}

void ApiRequestListModel::setRequests(const QList<ApiRequestTelemetry>& requests) {
  bool same_rows = requests.size() == rows_.size();
  for (qsizetype i = 0; same_rows && i < requests.size(); ++i)
    same_rows = requests[i].request_id == rows_[i].request_id;
  if (same_rows) {
    rows_ = requests;
    if (!rows_.isEmpty()) Q_EMIT dataChanged(index(0), index(rowCount() - 1));
    return;
  }
  const bool count_changed = requests.size() != rows_.size();
  beginResetModel();
  rows_ = requests;
  endResetModel();
  if (count_changed) Q_EMIT countChanged();
}

}  // namespace granule::app
