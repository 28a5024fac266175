// ConversationListModel: the sidebar's chats, most recently active first, filtered by the
// search box, with which of them are generating right now. GUI thread only.
#pragma once
#include <QtQml/qqmlregistration.h>

#include <optional>

#include "chat_store.h"
#include "list_model.h"

namespace granule::app {

class ConversationListModel : public granule::app::ListModel {
  Q_OBJECT
  QML_ELEMENT
  QML_UNCREATABLE("Chats come from ChatController")
  Q_PROPERTY(int totalCount READ totalCount NOTIFY countChanged)

 public:
  enum Role { ChatIdRole = Qt::UserRole + 1, TitleRole, GeneratingRole, UpdatedRole };
  Q_ENUM(Role)

  explicit ConversationListModel(QObject* parent = nullptr);

  int totalCount() const { return static_cast<int>(all_.size()); }

  void setConversations(const QList<StoredConversation>& conversations);
  // Adds a chat at the top.
  void prepend(const StoredConversation& conversation);
  // Takes a chat out (for undoable deletion) and returns it.
  std::optional<StoredConversation> take(qint64 id);
  // Puts a chat back at the position its update time gives it.
  void restore(const StoredConversation& conversation);
  const StoredConversation* find(qint64 id) const;
  // Replaces a chat's stored fields (title, prompt, sampling) and refreshes its row.
  void update(const StoredConversation& conversation);
  // Moves a chat to the top (it just got a message).
  void touch(qint64 id, qint64 updated_ms);
  void setGenerating(qint64 id, bool generating);
  bool isGenerating(qint64 id) const;
  // Shows only these chats (search results); nullopt shows all.
  void setFilter(std::optional<QList<qint64>> ids);
  // Row of a chat among the visible ones, or -1.
  Q_INVOKABLE int rowOf(qint64 id) const;
  Q_INVOKABLE qint64 idAt(int row) const;

 private:
  struct Entry {
    StoredConversation conversation;
    bool generating = false;
  };
  int itemCount() const override { return static_cast<int>(visible_.size()); }
  QVariant value(int row, int role) const override;
  void rebuildVisible();
  qsizetype indexInAll(qint64 id) const;

  QList<Entry> all_;          // newest first
  QList<qsizetype> visible_;  // indices into all_
  std::optional<QList<qint64>> filter_;
};

}  // namespace granule::app
