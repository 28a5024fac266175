// The message list behind ChatView.
#include "message_model.h"

#include <QJsonDocument>
#include <QJsonObject>

#include "markdown_blocks.h"

namespace granule::app {

MessageModel::MessageModel(QObject* parent) : ListModel(ContentRole, parent) {}

QVariant MessageModel::value(int row, int role) const {
  const StoredMessage& m = rows_[static_cast<size_t>(row)].stored;
  switch (role) {
    case MessageIdRole:
      return m.id;
    case SpeakerRole:
      return m.role;
    case ContentRole:
      return m.content;
    case BlocksRole:
      return rows_[static_cast<size_t>(row)].blocks;
    case GeneratingRole:
      return rows_[static_cast<size_t>(row)].generating;
    case TokensPerSecondRole:
      return m.tokens_per_second;
    case FinishReasonRole:
      return m.finish_reason;
    case TokenCountRole:
      return m.token_count;
    case VersionRole:
      return m.version;
    case VersionCountRole:
      return m.version_count;
    case TimeToFirstTokenMsRole:
      return m.time_to_first_token_ms;
    case PromptTokensRole:
      return m.prompt_tokens;
    case ViewStartsHereRole:
      return row == view_start_row_;
    case ReasoningRole:
      return m.reasoning;
    case ReasoningMsRole:
      return m.reasoning_ms;
    case ThinkingRole:
      return rows_[static_cast<size_t>(row)].generating && !m.reasoning.isEmpty() &&
             m.content.isEmpty();
    case ToolRole:
      return QJsonDocument::fromJson(m.tool.toUtf8()).object().toVariantMap();
    default:
      return {};
  }
}

void MessageModel::setMessages(const QList<StoredMessage>& messages) {
  beginResetModel();
  rows_.clear();
  for (const StoredMessage& m : messages)
    rows_.push_back({m, splitMarkdownCodeBlocks(m.content), false, 0, 0});
  endResetModel();
  Q_EMIT countChanged();
  Q_EMIT contextTokensChanged();
}

QList<StoredMessage> MessageModel::messages() const {
  QList<StoredMessage> result;
  for (const Row& row : rows_) result.append(row.stored);
  return result;
}

int MessageModel::append(const StoredMessage& message, bool generating) {
  const int row = count();
  beginInsertRows({}, row, row);
  rows_.push_back(
      {message, splitMarkdownCodeBlocks(message.content), generating, message.token_count, 0});
  endInsertRows();
  Q_EMIT countChanged();
  Q_EMIT contextTokensChanged();
  return row;
}

void MessageModel::appendText(int row, const QString& text, int tokens, double elapsed_s,
                              const QString& reasoning) {
  if (row < 0 || row >= count()) return;
  Row& r = rows_[static_cast<size_t>(row)];
  // The reasoning lasts from the first text until the answer's first text.
  if (!reasoning.isEmpty() || (!r.stored.reasoning.isEmpty() && r.stored.content.isEmpty()))
    r.stored.reasoning_ms = elapsed_s * 1000.0;
  r.stored.reasoning += reasoning;
  r.stored.content += text;
  r.blocks = splitMarkdownCodeBlocks(r.stored.content);
  const int streamed = r.stored.token_count - r.tokens_at_start;
  if (streamed == 0) r.first_chunk_tokens = tokens;
  r.stored.token_count += tokens;
  // The rate counts from the first text on, so the tokens that came with it are not in it;
  // under a quarter second the figure would be noise.
  if (elapsed_s >= 0.25)
    r.stored.tokens_per_second = (streamed + tokens - r.first_chunk_tokens) / elapsed_s;
  const QModelIndex i = index(row);
  Q_EMIT dataChanged(i, i,
                     {ContentRole, BlocksRole, TokensPerSecondRole, TokenCountRole, ReasoningRole,
                      ReasoningMsRole, ThinkingRole});
  Q_EMIT contextTokensChanged();
}

void MessageModel::setTimeToFirstToken(int row, double ms) {
  if (row < 0 || row >= count()) return;
  rows_[static_cast<size_t>(row)].stored.time_to_first_token_ms = ms;
  const QModelIndex i = index(row);
  Q_EMIT dataChanged(i, i, {TimeToFirstTokenMsRole});
}

void MessageModel::setPromptTokens(int row, int tokens) {
  if (row < 0 || row >= count() || tokens <= 0) return;
  Row& r = rows_[static_cast<size_t>(row)];
  if (r.stored.prompt_tokens == tokens) return;
  r.stored.prompt_tokens = tokens;
  const QModelIndex i = index(row);
  Q_EMIT dataChanged(i, i, {PromptTokensRole});
  Q_EMIT contextTokensChanged();
}

void MessageModel::resume(int row) {
  if (row < 0 || row >= count()) return;
  Row& r = rows_[static_cast<size_t>(row)];
  r.generating = true;
  r.tokens_at_start = r.stored.token_count;
  r.first_chunk_tokens = 0;
  r.stored.finish_reason.clear();
  const QModelIndex i = index(row);
  Q_EMIT dataChanged(i, i, {GeneratingRole, FinishReasonRole});
}

void MessageModel::finish(int row, const QString& finish_reason) {
  if (row < 0 || row >= count()) return;
  Row& r = rows_[static_cast<size_t>(row)];
  r.generating = false;
  r.stored.finish_reason = finish_reason;
  const QModelIndex i = index(row);
  Q_EMIT dataChanged(i, i, {GeneratingRole, FinishReasonRole, ThinkingRole});
}

int MessageModel::contextTokens() const {
  for (int i = count() - 1; i >= 0; --i) {
    const StoredMessage& m = rows_[static_cast<size_t>(i)].stored;
    if (m.role == QLatin1String("assistant") && m.prompt_tokens > 0)
      return m.prompt_tokens + m.token_count;
  }
  return 0;
}

void MessageModel::setViewStartRow(int row) {
  if (row == view_start_row_) return;
  const int old = view_start_row_;
  view_start_row_ = row;
  for (int r : {old, row})
    if (r >= 0 && r < count()) Q_EMIT dataChanged(index(r), index(r), {ViewStartsHereRole});
  Q_EMIT viewStartRowChanged();
}

void MessageModel::removeFrom(int row) {
  if (row < 0 || row >= count()) return;
  beginRemoveRows({}, row, count() - 1);
  rows_.erase(rows_.begin() + row, rows_.end());
  endRemoveRows();
  Q_EMIT countChanged();
  Q_EMIT contextTokensChanged();
}

int MessageModel::generatingRow() const {
  for (int i = count() - 1; i >= 0; --i)
    if (rows_[static_cast<size_t>(i)].generating) return i;
  return -1;
}

void MessageModel::replace(int row, const StoredMessage& message) {
  if (row < 0 || row >= count()) return;
  Row& r = rows_[static_cast<size_t>(row)];
  r.stored = message;
  r.blocks = splitMarkdownCodeBlocks(message.content);
  const QModelIndex i = index(row);
  Q_EMIT dataChanged(i, i);
}

}  // namespace granule::app
