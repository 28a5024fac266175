// ChatStore: chats, messages and settings in SQLite (Qt SQL) with WAL, transactions and
// versioned migrations. Used on the GUI thread only.
#pragma once
#include <QList>
#include <QString>
#include <optional>

#include "worker_types.h"

namespace granule::app {

struct StoredConversation {
  qint64 id = 0;
  QString title;
  QString system_prompt;
  SamplingSettings sampling;
  qint64 created_ms = 0;
  qint64 updated_ms = 0;
};

struct StoredMessage {
  qint64 id = 0;
  qint64 conversation_id = 0;
  qint32 position = 0;
  QString role;
  QString content;
  double tokens_per_second = 0;
  QString finish_reason;  // "" while generating or for user messages
  qint64 created_ms = 0;
};

class ChatStore {
 public:
  static constexpr int kSchemaVersion = 2;

  // Opens (creating the file and folders), checks the file is a sound database and migrates;
  // check ok() / error(). When not ok the file is left untouched and closed for the session.
  explicit ChatStore(const QString& path);
  ~ChatStore();
  ChatStore(const ChatStore&) = delete;
  ChatStore& operator=(const ChatStore&) = delete;

  // $XDG_DATA_HOME/granule/granule.sqlite (~/.local/share/granule/granule.sqlite).
  static QString defaultPath();

  bool ok() const { return error_.isEmpty(); }
  QString error() const { return error_; }
  QString path() const { return path_; }
  int schemaVersion() const;

  // Conversations not deleted, most recently updated first.
  QList<StoredConversation> conversations() const;
  std::optional<qint64> createConversation(const StoredConversation& conversation);
  bool updateConversation(const StoredConversation& conversation);
  // Deletion is soft until purgeDeleted(), so the sidebar can undo it.
  bool setDeleted(qint64 conversation_id, bool deleted);
  bool purgeDeleted();

  QList<StoredMessage> messages(qint64 conversation_id) const;
  std::optional<qint64> insertMessage(const StoredMessage& message);
  bool updateMessage(const StoredMessage& message);
  // Removes the messages at `position` and after (edit-and-resend, regenerate).
  bool deleteMessagesFrom(qint64 conversation_id, qint32 position);
  // Writes several messages' text in one transaction (the save at shutdown).
  bool updateMessages(const QList<StoredMessage>& messages);

  // Conversations whose title or any message contains `text` (case-insensitive).
  QList<qint64> search(const QString& text) const;

  QString setting(const QString& key, const QString& fallback = {}) const;
  bool setSetting(const QString& key, const QString& value);

 private:
  // PRAGMA quick_check (read-only): false, with error_ set, for a file that is not a sound
  // SQLite database.
  bool checkIntegrity();
  bool migrate();
  bool exec(const QString& sql);
  QString connection_;
  QString path_;
  QString error_;
};

}  // namespace granule::app
