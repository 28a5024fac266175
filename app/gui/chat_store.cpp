// SQLite persistence for chats. Every schema change is one numbered migration applied in
// a transaction; PRAGMA user_version records the last one applied.
#include "chat_store.h"

#include <QDateTime>
#include <QDir>
#include <QFileInfo>
#include <QJsonDocument>
#include <QJsonObject>
#include <QSqlDatabase>
#include <QSqlError>
#include <QSqlQuery>
#include <QUuid>
#include <QVariant>

#include "granule/log.h"

namespace granule::app {
namespace {

std::shared_ptr<spdlog::logger> log() { return granule::logger("app.store"); }

struct Migration {
  int version;
  QStringList statements;
};

// Append only: a released migration never changes, a new schema is a new entry.
const QList<Migration>& migrations() {
  static const QList<Migration> all = {
      {1,
       {QStringLiteral("CREATE TABLE conversations ("
                       " id INTEGER PRIMARY KEY AUTOINCREMENT,"
                       " title TEXT NOT NULL,"
                       " system_prompt TEXT NOT NULL DEFAULT '',"
                       " sampling_json TEXT NOT NULL DEFAULT '{}',"
                       " created_at INTEGER NOT NULL,"
                       " updated_at INTEGER NOT NULL)"),
        QStringLiteral(
            "CREATE TABLE messages ("
            " id INTEGER PRIMARY KEY AUTOINCREMENT,"
            " conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,"
            " position INTEGER NOT NULL,"
            " role TEXT NOT NULL,"
            " content TEXT NOT NULL,"
            " tokens_per_second REAL NOT NULL DEFAULT 0,"
            " finish_reason TEXT NOT NULL DEFAULT '',"
            " created_at INTEGER NOT NULL)"),
        QStringLiteral("CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL)")}},
      // 2: undoable deletion, and the index that loading a chat's messages uses.
      {2,
       {QStringLiteral("ALTER TABLE conversations ADD COLUMN deleted_at INTEGER"),
        QStringLiteral(
            "CREATE INDEX messages_by_conversation ON messages(conversation_id, position)")}},
  };
  return all;
}

QString samplingToJson(const SamplingSettings& s) {
  const QJsonObject o{{"temperature", s.temperature},
                      {"top_k", s.top_k},
                      {"top_p", s.top_p},
                      {"min_p", s.min_p},
                      {"repetition_penalty", s.repetition_penalty},
                      {"max_tokens", s.max_tokens},
                      {"seed", QString::number(s.seed)}};  // JSON numbers lose 64-bit seeds
  return QString::fromUtf8(QJsonDocument(o).toJson(QJsonDocument::Compact));
}

SamplingSettings samplingFromJson(const QString& json) {
  const QJsonObject o = QJsonDocument::fromJson(json.toUtf8()).object();
  SamplingSettings s;
  s.temperature = o.value("temperature").toDouble(s.temperature);
  s.top_k = o.value("top_k").toInt(s.top_k);
  s.top_p = o.value("top_p").toDouble(s.top_p);
  s.min_p = o.value("min_p").toDouble(s.min_p);
  s.repetition_penalty = o.value("repetition_penalty").toDouble(s.repetition_penalty);
  s.max_tokens = o.value("max_tokens").toInt(s.max_tokens);
  s.seed = o.value("seed").toString().toULongLong();
  return s;
}

qint64 nowMs() { return QDateTime::currentMSecsSinceEpoch(); }

// Qt binds a null QString as SQL NULL; the text columns are NOT NULL, so "" it is.
QString text(const QString& s) { return s.isNull() ? QStringLiteral("") : s; }

StoredMessage messageFrom(const QSqlQuery& q) {
  StoredMessage m;
  m.id = q.value(0).toLongLong();
  m.conversation_id = q.value(1).toLongLong();
  m.position = q.value(2).toInt();
  m.role = q.value(3).toString();
  m.content = q.value(4).toString();
  m.tokens_per_second = q.value(5).toDouble();
  m.finish_reason = q.value(6).toString();
  m.created_ms = q.value(7).toLongLong();
  return m;
}

}  // namespace

ChatStore::ChatStore(const QString& path)
    : connection_(QStringLiteral("granule-") + QUuid::createUuid().toString(QUuid::WithoutBraces)),
      path_(path) {
  QDir().mkpath(QFileInfo(path).absolutePath());
  QSqlDatabase db = QSqlDatabase::addDatabase(QStringLiteral("QSQLITE"), connection_);
  db.setDatabaseName(path);
  if (!db.open()) {
    error_ =
        QStringLiteral("Cannot open the chat database %1: %2").arg(path, db.lastError().text());
    log()->error("{}", error_.toStdString());
    return;
  }
  // A damaged file is refused before anything writes to it (the WAL switch, a migration), so
  // it stays as it was for the user to rescue. WAL: a crash mid-write loses at most the last
  // transaction, and reads never block.
  if (!checkIntegrity() || !exec(QStringLiteral("PRAGMA journal_mode=WAL")) ||
      !exec(QStringLiteral("PRAGMA foreign_keys=ON")) || !migrate()) {
    if (error_.isEmpty()) error_ = QStringLiteral("Cannot prepare the chat database %1").arg(path);
    // One line that names the file (exec()'s errors do not).
    if (!error_.contains(path)) {
      QString reason = error_;
      reason.remove(QStringLiteral("Chat database error: "));
      error_ = QStringLiteral("Cannot use the chat database %1: %2; the file is left as it is")
                   .arg(path, reason);
    }
    error_.replace(QLatin1Char('\n'), QLatin1Char(' '));
    log()->error("{}", error_.toStdString());
    // Closed, so nothing later in this session reads or writes the file.
    QSqlDatabase::database(connection_, false).close();
  }
}

bool ChatStore::checkIntegrity() {
  QSqlQuery q(QSqlDatabase::database(connection_));
  if (!q.exec(QStringLiteral("PRAGMA quick_check"))) {
    error_ = QStringLiteral("Chat database error: %1").arg(q.lastError().text());
    return false;
  }
  // The report is lines ("*** in database main ***", "Page 5: ..."), in one row or several.
  QStringList problems;
  while (q.next()) {
    for (const QString& line : q.value(0).toString().split(QLatin1Char('\n'))) {
      const QString trimmed = line.trimmed();
      if (!trimmed.isEmpty() && trimmed != QStringLiteral("ok") && !trimmed.startsWith("***"))
        problems << trimmed;
    }
  }
  if (problems.isEmpty()) return true;
  error_ = QStringLiteral("Chat database error: the file is damaged (%1%2)")
               .arg(problems.first(),
                    problems.size() > 1
                        ? QStringLiteral(" and %1 more problems").arg(problems.size() - 1)
                        : QString());
  return false;
}

ChatStore::~ChatStore() {
  {
    QSqlDatabase db = QSqlDatabase::database(connection_, false);
    if (db.isOpen()) db.close();
  }
  QSqlDatabase::removeDatabase(connection_);
}

QString ChatStore::defaultPath() {
  QString data = qEnvironmentVariable("XDG_DATA_HOME");
  if (data.isEmpty()) data = QDir::homePath() + QStringLiteral("/.local/share");
  return data + QStringLiteral("/granule/granule.sqlite");
}

bool ChatStore::exec(const QString& sql) {
  QSqlQuery q(QSqlDatabase::database(connection_));
  if (q.exec(sql)) return true;
  error_ = QStringLiteral("Chat database error: %1").arg(q.lastError().text());
  log()->error("{} in: {}", error_.toStdString(), sql.toStdString());
  return false;
}

int ChatStore::schemaVersion() const {
  QSqlQuery q(QSqlDatabase::database(connection_));
  if (!q.exec(QStringLiteral("PRAGMA user_version")) || !q.next()) return -1;
  return q.value(0).toInt();
}

bool ChatStore::migrate() {
  QSqlDatabase db = QSqlDatabase::database(connection_);
  const int current = schemaVersion();
  if (current > kSchemaVersion) {
    error_ = QStringLiteral(
                 "The chat database %1 is from a newer Granule (schema %2); "
                 "update Granule to open it.")
                 .arg(path_)
                 .arg(current);
    return false;
  }
  for (const Migration& m : migrations()) {
    if (m.version <= current) continue;
    db.transaction();
    bool applied = true;
    for (const QString& sql : m.statements) applied = applied && exec(sql);
    applied = applied && exec(QStringLiteral("PRAGMA user_version = %1").arg(m.version));
    if (!applied) {
      db.rollback();
      return false;
    }
    db.commit();
    log()->info("chat database migrated to schema {}", m.version);
  }
  return true;
}

QList<StoredConversation> ChatStore::conversations() const {
  QList<StoredConversation> result;
  QSqlQuery q(QSqlDatabase::database(connection_));
  q.exec(QStringLiteral(
      "SELECT id, title, system_prompt, sampling_json, created_at, updated_at "
      "FROM conversations WHERE deleted_at IS NULL ORDER BY updated_at DESC, id DESC"));
  while (q.next()) {
    StoredConversation c;
    c.id = q.value(0).toLongLong();
    c.title = q.value(1).toString();
    c.system_prompt = q.value(2).toString();
    c.sampling = samplingFromJson(q.value(3).toString());
    c.created_ms = q.value(4).toLongLong();
    c.updated_ms = q.value(5).toLongLong();
    result.append(c);
  }
  return result;
}

std::optional<qint64> ChatStore::createConversation(const StoredConversation& c) {
  QSqlQuery q(QSqlDatabase::database(connection_));
  q.prepare(
      QStringLiteral("INSERT INTO conversations (title, system_prompt, sampling_json, created_at, "
                     "updated_at) VALUES (?, ?, ?, ?, ?)"));
  const qint64 created = c.created_ms ? c.created_ms : nowMs();
  q.addBindValue(text(c.title));
  q.addBindValue(text(c.system_prompt));
  q.addBindValue(samplingToJson(c.sampling));
  q.addBindValue(created);
  q.addBindValue(c.updated_ms ? c.updated_ms : created);
  if (!q.exec()) {
    log()->error("creating a chat failed: {}", q.lastError().text().toStdString());
    return std::nullopt;
  }
  return q.lastInsertId().toLongLong();
}

bool ChatStore::updateConversation(const StoredConversation& c) {
  QSqlQuery q(QSqlDatabase::database(connection_));
  q.prepare(
      QStringLiteral("UPDATE conversations SET title = ?, system_prompt = ?, sampling_json = ?, "
                     "updated_at = ? WHERE id = ?"));
  q.addBindValue(text(c.title));
  q.addBindValue(text(c.system_prompt));
  q.addBindValue(samplingToJson(c.sampling));
  q.addBindValue(c.updated_ms ? c.updated_ms : nowMs());
  q.addBindValue(c.id);
  return q.exec();
}

bool ChatStore::setDeleted(qint64 conversation_id, bool deleted) {
  QSqlQuery q(QSqlDatabase::database(connection_));
  q.prepare(QStringLiteral("UPDATE conversations SET deleted_at = ? WHERE id = ?"));
  q.addBindValue(deleted ? QVariant(nowMs()) : QVariant(QMetaType::fromType<qint64>()));
  q.addBindValue(conversation_id);
  return q.exec();
}

bool ChatStore::purgeDeleted() {
  // Messages go with their conversation (ON DELETE CASCADE).
  return exec(QStringLiteral("DELETE FROM conversations WHERE deleted_at IS NOT NULL"));
}

QList<StoredMessage> ChatStore::messages(qint64 conversation_id) const {
  QList<StoredMessage> result;
  QSqlQuery q(QSqlDatabase::database(connection_));
  q.prepare(
      QStringLiteral("SELECT id, conversation_id, position, role, content, tokens_per_second, "
                     "finish_reason, created_at FROM messages WHERE conversation_id = ? "
                     "ORDER BY position"));
  q.addBindValue(conversation_id);
  q.exec();
  while (q.next()) result.append(messageFrom(q));
  return result;
}

std::optional<qint64> ChatStore::insertMessage(const StoredMessage& m) {
  QSqlDatabase db = QSqlDatabase::database(connection_);
  db.transaction();
  QSqlQuery q(db);
  q.prepare(
      QStringLiteral("INSERT INTO messages (conversation_id, position, role, content, "
                     "tokens_per_second, finish_reason, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)"));
  q.addBindValue(m.conversation_id);
  q.addBindValue(m.position);
  q.addBindValue(text(m.role));
  q.addBindValue(text(m.content));
  q.addBindValue(m.tokens_per_second);
  q.addBindValue(text(m.finish_reason));
  q.addBindValue(m.created_ms ? m.created_ms : nowMs());
  QSqlQuery touch(db);
  touch.prepare(QStringLiteral("UPDATE conversations SET updated_at = ? WHERE id = ?"));
  touch.addBindValue(nowMs());
  touch.addBindValue(m.conversation_id);
  if (!q.exec() || !touch.exec()) {
    log()->error("saving a message failed: {}", q.lastError().text().toStdString());
    db.rollback();
    return std::nullopt;
  }
  const qint64 id = q.lastInsertId().toLongLong();
  db.commit();
  return id;
}

bool ChatStore::updateMessage(const StoredMessage& m) { return updateMessages({m}); }

bool ChatStore::updateMessages(const QList<StoredMessage>& messages) {
  QSqlDatabase db = QSqlDatabase::database(connection_);
  db.transaction();
  QSqlQuery q(db);
  q.prepare(
      QStringLiteral("UPDATE messages SET content = ?, tokens_per_second = ?, finish_reason = ? "
                     "WHERE id = ?"));
  for (const StoredMessage& m : messages) {
    q.addBindValue(text(m.content));
    q.addBindValue(m.tokens_per_second);
    q.addBindValue(text(m.finish_reason));
    q.addBindValue(m.id);
    if (!q.exec()) {
      log()->error("saving messages failed: {}", q.lastError().text().toStdString());
      db.rollback();
      return false;
    }
  }
  return db.commit();
}

bool ChatStore::deleteMessagesFrom(qint64 conversation_id, qint32 position) {
  QSqlQuery q(QSqlDatabase::database(connection_));
  q.prepare(QStringLiteral("DELETE FROM messages WHERE conversation_id = ? AND position >= ?"));
  q.addBindValue(conversation_id);
  q.addBindValue(position);
  return q.exec();
}

QList<qint64> ChatStore::search(const QString& text) const {
  QList<qint64> ids;
  QSqlQuery q(QSqlDatabase::database(connection_));
  // LIKE is case-insensitive for ASCII in SQLite; the pattern's own % and _ are escaped.
  QString pattern = text;
  pattern.replace(QLatin1Char('\\'), QStringLiteral("\\\\"))
      .replace(QLatin1Char('%'), QStringLiteral("\\%"))
      .replace(QLatin1Char('_'), QStringLiteral("\\_"));
  pattern = QLatin1Char('%') + pattern + QLatin1Char('%');
  q.prepare(
      QStringLiteral("SELECT c.id FROM conversations c WHERE c.deleted_at IS NULL AND ("
                     "c.title LIKE ? ESCAPE '\\' OR EXISTS (SELECT 1 FROM messages m WHERE "
                     "m.conversation_id = c.id AND m.content LIKE ? ESCAPE '\\')) "
                     "ORDER BY c.updated_at DESC"));
  q.addBindValue(pattern);
  q.addBindValue(pattern);
  q.exec();
  while (q.next()) ids.append(q.value(0).toLongLong());
  return ids;
}

QString ChatStore::setting(const QString& key, const QString& fallback) const {
  QSqlQuery q(QSqlDatabase::database(connection_));
  q.prepare(QStringLiteral("SELECT value FROM settings WHERE key = ?"));
  q.addBindValue(text(key));
  if (q.exec() && q.next()) return q.value(0).toString();
  return fallback;
}

bool ChatStore::setSetting(const QString& key, const QString& value) {
  QSqlQuery q(QSqlDatabase::database(connection_));
  q.prepare(
      QStringLiteral("INSERT INTO settings (key, value) VALUES (?, ?) "
                     "ON CONFLICT(key) DO UPDATE SET value = excluded.value"));
  q.addBindValue(text(key));
  q.addBindValue(text(value));
  return q.exec();
}

}  // namespace granule::app
