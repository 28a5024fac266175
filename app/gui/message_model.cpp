// The message list behind ChatView.
#include "message_model.h"

#include "markdown_blocks.h"

namespace granule::app {

MessageModel::MessageModel(QObject* parent) : QAbstractListModel(parent) {}

int MessageModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : count();
}

QVariant MessageModel::data(const QModelIndex& index, int role) const {
  if (!index.isValid() || index.row() >= count()) return {};
  const Row& row = rows_[static_cast<size_t>(index.row())];
  switch (role) {
    case MessageIdRole:
      return row.stored.id;
    case RoleNameRole:
      return row.stored.role;
    case Qt::DisplayRole:
    case ContentRole:
      return row.stored.content;
    case BlocksRole:
      return row.blocks;
    case GeneratingRole:
      return row.generating;
    case TokensPerSecondRole:
      return row.stored.tokens_per_second;
    case FinishReasonRole:
      return row.stored.finish_reason;
    case TokenCountRole:
      return row.tokens;
    default:
      return {};
  }
}

QHash<int, QByteArray> MessageModel::roleNames() const {
  return {{MessageIdRole, "messageId"},       {RoleNameRole, "role"},
          {ContentRole, "content"},           {BlocksRole, "blocks"},
          {GeneratingRole, "generating"},     {TokensPerSecondRole, "tokensPerSecond"},
          {FinishReasonRole, "finishReason"}, {TokenCountRole, "tokenCount"}};
}

void MessageModel::setMessages(const QList<StoredMessage>& messages) {
  beginResetModel();
  rows_.clear();
  for (const StoredMessage& m : messages)
    rows_.push_back({m, splitMarkdownCodeBlocks(m.content), false, 0, 0});
  endResetModel();
  Q_EMIT countChanged();
}

QList<StoredMessage> MessageModel::messages() const {
  QList<StoredMessage> result;
  for (const Row& row : rows_) result.append(row.stored);
  return result;
}

int MessageModel::append(const StoredMessage& message, bool generating) {
  const int row = count();
  beginInsertRows({}, row, row);
  rows_.push_back({message, splitMarkdownCodeBlocks(message.content), generating, 0, 0});
  endInsertRows();
  Q_EMIT countChanged();
  return row;
}

void MessageModel::setMessageId(int row, qint64 id) {
  if (row < 0 || row >= count()) return;
  rows_[static_cast<size_t>(row)].stored.id = id;
  const QModelIndex i = index(row);
  Q_EMIT dataChanged(i, i, {MessageIdRole});
}

void MessageModel::appendText(int row, const QString& text, int tokens, double elapsed_s) {
  if (row < 0 || row >= count()) return;
  Row& r = rows_[static_cast<size_t>(row)];
  r.stored.content += text;
  r.blocks = splitMarkdownCodeBlocks(r.stored.content);
  if (r.tokens == 0) r.first_chunk_tokens = tokens;
  r.tokens += tokens;
  // The rate counts from the first text on, so the tokens that came with it are not in it;
  // under a quarter second the figure would be noise.
  if (elapsed_s >= 0.25) r.stored.tokens_per_second = (r.tokens - r.first_chunk_tokens) / elapsed_s;
  const QModelIndex i = index(row);
  Q_EMIT dataChanged(i, i, {ContentRole, BlocksRole, TokensPerSecondRole, TokenCountRole});
}

void MessageModel::finish(int row, const QString& finish_reason) {
  if (row < 0 || row >= count()) return;
  Row& r = rows_[static_cast<size_t>(row)];
  r.generating = false;
  r.stored.finish_reason = finish_reason;
  const QModelIndex i = index(row);
  Q_EMIT dataChanged(i, i, {GeneratingRole, FinishReasonRole});
}

void MessageModel::removeFrom(int row) {
  if (row < 0 || row >= count()) return;
  beginRemoveRows({}, row, count() - 1);
  rows_.erase(rows_.begin() + row, rows_.end());
  endRemoveRows();
  Q_EMIT countChanged();
}

int MessageModel::generatingRow() const {
  for (int i = count() - 1; i >= 0; --i)
    if (rows_[static_cast<size_t>(i)].generating) return i;
  return -1;
}

}  // namespace granule::app
