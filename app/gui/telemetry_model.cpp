// Telemetry history, the latest frame and the per-chat rows for the panels.
#include "telemetry_model.h"

namespace granule::app {

TelemetryModel::TelemetryModel(QObject* parent) : ListModel(TitleRole, parent) {}

QVariant TelemetryModel::value(int row, int role) const {
  // The chats' rows, then the API requests' (chat id 0, titled by the request's id).
  const bool api = row >= chatRows();
  const ApiRequestTelemetry* request = api ? &latest_.api_requests[row - chatRows()] : nullptr;
  const qint64 chat_id = api ? 0 : latest_.chats[row].chat_id;
  switch (role) {
    case ChatIdRole:
      return chat_id;
    case TitleRole:
      if (api) return request->request_id;
      return title_of_ ? title_of_(chat_id) : QString::number(chat_id);
    case HighlightedRole:
      return !api && chat_id == highlighted_chat_id_;
    case SequenceRole:
      return sectionFields(api ? request->sequence : latest_.chats[row].sequence);
    case ApiRole:
      return api;
    default:
      return {};
  }
}

void TelemetryModel::addFrame(TelemetryFrame frame) {
  if (frame.counts_tokens) {
    // The oldest live frame inside the window (the newest before it when none is inside).
    const TelemetryFrame* since = nullptr;
    for (auto it = history_.rbegin(); it != history_.rend(); ++it) {
      if (!it->counts_tokens || it->generated_tokens > frame.generated_tokens) break;
      since = &*it;
      if (it->time_s <= frame.time_s - kRateWindowSeconds) break;
    }
    double rate = 0;
    if (since && frame.time_s > since->time_s)
      rate = static_cast<double>(frame.generated_tokens - since->generated_tokens) /
             (frame.time_s - since->time_s);
    frame.engine.throughput.decode_tokens_per_second = rate;
  }
  const bool rows_changed = frame.chats.size() != latest_.chats.size() ||
                            frame.api_requests.size() != latest_.api_requests.size();
  if (rows_changed) beginResetModel();
  latest_ = frame;
  if (rows_changed) {
    endResetModel();
    Q_EMIT countChanged();
  } else if (rowCount() > 0) {
    Q_EMIT dataChanged(index(0), index(rowCount() - 1));
  }
  history_.push_back(frame);
  while (!history_.empty() && history_.front().time_s < frame.time_s - kHistorySeconds - 1.0)
    history_.pop_front();
  Q_EMIT updated();
}

bool TelemetryModel::isWaiting(double chatId) const {
  for (const ChatTelemetry& chat : latest_.chats)
    if (chat.sequence.waiting && static_cast<double>(chat.chat_id) == chatId) return true;
  return false;
}

QString TelemetryModel::waitingReason(double chatId) const {
  for (const ChatTelemetry& chat : latest_.chats)
    if (chat.sequence.waiting && static_cast<double>(chat.chat_id) == chatId)
      return chat.waiting_for_slot ? QStringLiteral("slot") : QStringLiteral("memory");
  return {};
}

QStringList TelemetryModel::ledgerCategories() const {
  QStringList names;
  for (MemoryCategory c : stackedLedgerCategories())
    names.append(detail::camelCase(memory_category_name(c)));
  return names;
}

void TelemetryModel::setReplaySource(const QString& name) {
  if (name == replay_source_) return;
  replay_source_ = name;
  Q_EMIT replaySourceChanged();
}

void TelemetryModel::setHighlightedChatId(qint64 id) {
  if (id == highlighted_chat_id_) return;
  highlighted_chat_id_ = id;
  if (rowCount() > 0) Q_EMIT dataChanged(index(0), index(rowCount() - 1), {HighlightedRole});
  Q_EMIT highlightedChatIdChanged();
}

}  // namespace granule::app
