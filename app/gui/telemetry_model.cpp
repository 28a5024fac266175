// Telemetry history and current figures for the panels.
#include "telemetry_model.h"

#include <numeric>

namespace granule::app {

TelemetryModel::TelemetryModel(QObject* parent) : QAbstractListModel(parent) {}

int TelemetryModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(latest_.chats.size());
}

QVariant TelemetryModel::data(const QModelIndex& index, int role) const {
  if (!index.isValid() || index.row() >= rowCount()) return {};
  const ChatTelemetry& chat = latest_.chats[index.row()];
  switch (role) {
    case ChatIdRole:
      return chat.chat_id;
    case Qt::DisplayRole:
    case TitleRole:
      return title_of_ ? title_of_(chat.chat_id) : QString::number(chat.chat_id);
    case TokensRole:
      return chat.tokens;
    case KvCommittedRole:
      return static_cast<double>(chat.kv_committed_bytes);
    case KvReservedRole:
      return static_cast<double>(chat.kv_reserved_bytes);
    case TokensPerSecondRole:
      return chat.tokens_per_second;
    case HighlightedRole:
      return chat.chat_id == highlighted_chat_id_;
    case WaitingRole:
      return chat.waiting;
    case PreemptionsRole:
      return chat.preemptions;
    default:
      return {};
  }
}

QHash<int, QByteArray> TelemetryModel::roleNames() const {
  return {{ChatIdRole, "chatId"},           {TitleRole, "title"},
          {TokensRole, "tokens"},           {KvCommittedRole, "kvCommitted"},
          {KvReservedRole, "kvReserved"},   {TokensPerSecondRole, "tokensPerSecond"},
          {HighlightedRole, "highlighted"}, {WaitingRole, "waiting"},
          {PreemptionsRole, "preemptions"}};
}

void TelemetryModel::addFrame(const TelemetryFrame& frame) {
  const bool rows_changed = frame.chats.size() != latest_.chats.size();
  if (rows_changed) beginResetModel();
  latest_ = frame;
  if (rows_changed) {
    endResetModel();
  } else if (!latest_.chats.isEmpty()) {
    Q_EMIT dataChanged(index(0), index(rowCount() - 1));
  }
  history_.push_back(frame);
  while (!history_.empty() && history_.front().time_s < frame.time_s - kHistorySeconds - 1.0)
    history_.pop_front();
  Q_EMIT updated();
}

bool TelemetryModel::isWaiting(double chatId) const {
  for (const ChatTelemetry& chat : latest_.chats)
    if (chat.waiting && static_cast<double>(chat.chat_id) == chatId) return true;
  return false;
}

double TelemetryModel::usedBytes() const {
  return static_cast<double>(
      std::accumulate(latest_.ledger_bytes.begin(), latest_.ledger_bytes.end(), quint64{0}));
}

QList<qreal> TelemetryModel::ledgerBytes() const {
  QList<qreal> bytes;
  for (quint64 b : latest_.ledger_bytes) bytes.append(static_cast<qreal>(b));
  return bytes;
}

QStringList TelemetryModel::ledgerCategories() const {
  QStringList names;
  for (const char* name : kLedgerCategories) names.append(QString::fromLatin1(name));
  return names;
}

void TelemetryModel::setHighlightedChatId(qint64 id) {
  if (id == highlighted_chat_id_) return;
  highlighted_chat_id_ = id;
  if (rowCount() > 0) Q_EMIT dataChanged(index(0), index(rowCount() - 1), {HighlightedRole});
  Q_EMIT highlightedChatIdChanged();
}

}  // namespace granule::app
