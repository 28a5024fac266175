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
  // Where the chat runs: "" the window's loaded model, "URL#model" a model on an endpoint.
  // (Last, so the positional initialisers written before it stay valid.)
  QString engine;
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
  // Versions: a message's parent is the one before it on its branch (0: the chat's first).
  // Siblings (same parent) are versions of one turn: regenerated answers, edited questions.
  // `active` marks the version the chat shows; later turns hang under their own version.
  qint64 parent_id = 0;
  bool active = true;
  double time_to_first_token_ms = 0;  // from the request to the first text (assistant)
  qint32 token_count = 0;             // tokens of this reply
  qint32 prompt_tokens = 0;           // the prompt the reply was generated from
  QString reasoning;                  // the model's reasoning before its answer (assistant)
  double reasoning_ms = 0;            // how long it reasoned: first text to the answer
  // Tool use, as JSON: an assistant message's calls ({"calls": [{"id", "name", "arguments"}]}),
  // or a tool message's card ({"id", "name", "server", "arguments", "state", "error"}; its
  // content is the tool's result). "" for other messages.
  QString tool;
  // Filled by ChatStore::messages() (not columns): 1-based version among its siblings.
  qint32 version = 1;
  qint32 version_count = 1;
};

class ChatStore {
 public:
  static constexpr int kSchemaVersion = 7;

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

  // The branch the chat shows: from the first message, at each turn the active version
  // (the newest when none is marked), with version and version_count filled in.
  QList<StoredMessage> messages(qint64 conversation_id) const;
  // Every message of the chat, every version and branch, by id.
  QList<StoredMessage> allMessages(qint64 conversation_id) const;
  // Inserts; an active message makes its siblings inactive in the same transaction.
  std::optional<qint64> insertMessage(const StoredMessage& message);
  bool updateMessage(const StoredMessage& message);
  // The versions of a turn: the ids of the message's siblings (itself included), oldest first.
  QList<qint64> versionsOf(qint64 message_id) const;
  // Shows this version of its turn (and the later turns of its branch).
  bool setActiveVersion(qint64 message_id);
  // Removes one message that has no later turns (a reply that failed before any text); the
  // newest remaining version of its turn becomes the active one. False when it has children.
  bool deleteLeafMessage(qint64 message_id);
  // Removes the messages at `position` and after, on every branch.
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

// A chat as Markdown (title, system prompt, each message under a heading; the branch shown)
// and as JSON (the same messages with their figures) for export.
QString chatToMarkdown(const StoredConversation& chat, const QList<StoredMessage>& messages);
QByteArray chatToJson(const StoredConversation& chat, const QList<StoredMessage>& messages);

}  // namespace granule::app
