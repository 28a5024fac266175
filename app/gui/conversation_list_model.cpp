// The sidebar's chat list.
#include "conversation_list_model.h"

#include <QDateTime>
#include <algorithm>

namespace granule::app {

ConversationListModel::ConversationListModel(QObject* parent) : ListModel(TitleRole, parent) {}

QVariant ConversationListModel::value(int row, int role) const {
  const Entry& e = all_[visible_[row]];
  switch (role) {
    case ChatIdRole:
      return e.conversation.id;
    case TitleRole:
      return e.conversation.title;
    case GeneratingRole:
      return e.generating;
    case UpdatedRole:
      return QDateTime::fromMSecsSinceEpoch(e.conversation.updated_ms);
    default:
      return {};
  }
}

void ConversationListModel::setConversations(const QList<StoredConversation>& conversations) {
  beginResetModel();
  all_.clear();
  for (const StoredConversation& c : conversations) all_.append({c, false});
  std::stable_sort(all_.begin(), all_.end(), [](const Entry& a, const Entry& b) {
    return a.conversation.updated_ms > b.conversation.updated_ms;
  });
  rebuildVisible();
  endResetModel();
  Q_EMIT countChanged();
}

void ConversationListModel::prepend(const StoredConversation& conversation) {
  beginResetModel();
  all_.prepend({conversation, false});
  rebuildVisible();
  endResetModel();
  Q_EMIT countChanged();
}

std::optional<StoredConversation> ConversationListModel::take(qint64 id) {
  const qsizetype i = indexInAll(id);
  if (i < 0) return std::nullopt;
  beginResetModel();
  const StoredConversation taken = all_.takeAt(i).conversation;
  rebuildVisible();
  endResetModel();
  Q_EMIT countChanged();
  return taken;
}

void ConversationListModel::restore(const StoredConversation& conversation) {
  qsizetype at = 0;
  while (at < all_.size() && all_[at].conversation.updated_ms > conversation.updated_ms) ++at;
  beginResetModel();
  all_.insert(at, {conversation, false});
  rebuildVisible();
  endResetModel();
  Q_EMIT countChanged();
}

const StoredConversation* ConversationListModel::find(qint64 id) const {
  const qsizetype i = indexInAll(id);
  return i < 0 ? nullptr : &all_[i].conversation;
}

void ConversationListModel::update(const StoredConversation& conversation) {
  const qsizetype i = indexInAll(conversation.id);
  if (i < 0) return;
  all_[i].conversation = conversation;
  const int row = rowOf(conversation.id);
  if (row >= 0) Q_EMIT dataChanged(index(row), index(row), {TitleRole, UpdatedRole});
}

void ConversationListModel::touch(qint64 id, qint64 updated_ms) {
  const qsizetype i = indexInAll(id);
  if (i < 0) return;
  all_[i].conversation.updated_ms = updated_ms;
  if (i == 0) return;
  // A reset keeps this simple; the list is short and the view keeps no per-row state.
  beginResetModel();
  all_.move(i, 0);
  rebuildVisible();
  endResetModel();
}

void ConversationListModel::setGenerating(qint64 id, bool generating) {
  const qsizetype i = indexInAll(id);
  if (i < 0 || all_[i].generating == generating) return;
  all_[i].generating = generating;
  const int row = rowOf(id);
  if (row >= 0) Q_EMIT dataChanged(index(row), index(row), {GeneratingRole});
}

bool ConversationListModel::isGenerating(qint64 id) const {
  const qsizetype i = indexInAll(id);
  return i >= 0 && all_[i].generating;
}

void ConversationListModel::setFilter(std::optional<QList<qint64>> ids) {
  beginResetModel();
  filter_ = std::move(ids);
  rebuildVisible();
  endResetModel();
  Q_EMIT countChanged();
}

int ConversationListModel::rowOf(qint64 id) const {
  for (int row = 0; row < count(); ++row)
    if (all_[visible_[row]].conversation.id == id) return row;
  return -1;
}

qint64 ConversationListModel::idAt(int row) const {
  return row >= 0 && row < count() ? all_[visible_[row]].conversation.id : 0;
}

void ConversationListModel::rebuildVisible() {
  visible_.clear();
  for (qsizetype i = 0; i < all_.size(); ++i)
    if (!filter_ || filter_->contains(all_[i].conversation.id)) visible_.append(i);
}

qsizetype ConversationListModel::indexInAll(qint64 id) const {
  for (qsizetype i = 0; i < all_.size(); ++i)
    if (all_[i].conversation.id == id) return i;
  return -1;
}

}  // namespace granule::app
