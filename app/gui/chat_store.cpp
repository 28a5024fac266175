// SQLite persistence for chats. Every schema change is one numbered migration applied in
// a transaction; PRAGMA user_version records the last one applied.
#include "chat_store.h"

#include <QDateTime>
#include <QDir>
#include <QFileInfo>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QSqlDatabase>
#include <QSqlError>
#include <QSqlQuery>
#include <QUuid>
#include <QVariant>
#include <map>

#include "granule/log.h"
#include "sampling_presets.h"

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
      // 3: versions and branches (regenerate and edit keep the old turn), and per-reply
      // figures. Existing chats become one branch: each message's parent is the one before.
      {3,
       {QStringLiteral("ALTER TABLE messages ADD COLUMN parent_id INTEGER"),
        QStringLiteral("ALTER TABLE messages ADD COLUMN active INTEGER NOT NULL DEFAULT 1"),
        QStringLiteral("ALTER TABLE messages ADD COLUMN ttft_ms REAL NOT NULL DEFAULT 0"),
        QStringLiteral("ALTER TABLE messages ADD COLUMN token_count INTEGER NOT NULL DEFAULT 0"),
        QStringLiteral("ALTER TABLE messages ADD COLUMN prompt_tokens INTEGER NOT NULL DEFAULT 0"),
        QStringLiteral("UPDATE messages SET parent_id = (SELECT p.id FROM messages p WHERE "
                       "p.conversation_id = messages.conversation_id AND "
                       "p.position = messages.position - 1 ORDER BY p.id DESC LIMIT 1)"),
        QStringLiteral("CREATE INDEX messages_by_parent ON messages(conversation_id, parent_id)")}},
      // 4: seed 0 is a seed like any other (the engine's rule); chats saved when 0 meant "a
      // new seed per reply" keep meaning that.
      {4,
       {QStringLiteral("UPDATE conversations SET sampling_json = "
                       "replace(sampling_json, '\"seed\":\"0\"', '\"seed\":\"random\"')")}},
      // 5: a reasoning model's reasoning beside its answer (the Thinking block), and how long
      // it took.
      {5,
       {QStringLiteral("ALTER TABLE messages ADD COLUMN reasoning TEXT NOT NULL DEFAULT ''"),
        QStringLiteral("ALTER TABLE messages ADD COLUMN reasoning_ms REAL NOT NULL DEFAULT 0")}},
      // 6: tool use — an assistant message's calls, and a tool message's card (the call, the
      // user's answer, its state), as JSON (StoredMessage::tool).
      {6, {QStringLiteral("ALTER TABLE messages ADD COLUMN tool TEXT NOT NULL DEFAULT ''")}},
      // 7: where the chat runs: '' the local engine, "URL#model" a model on an endpoint.
      {7, {QStringLiteral("ALTER TABLE conversations ADD COLUMN engine TEXT NOT NULL DEFAULT ''")}},
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
                      // Text: JSON numbers lose 64-bit seeds. "random" for kRandomSeed.
                      {"seed", seedText(s.seed)},
                      {"reasoning", s.reasoning},
                      {"json_output", s.json_output},
                      {"json_schema", s.json_schema}};
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
  s.seed = seedFromText(o.value("seed").toString()).value_or(kRandomSeed);
  s.reasoning = o.value("reasoning").toString();
  s.json_output = o.value("json_output").toString();
  s.json_schema = o.value("json_schema").toString();
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
  m.parent_id = q.value(8).toLongLong();
  m.active = q.value(9).toInt() != 0;
  m.time_to_first_token_ms = q.value(10).toDouble();
  m.token_count = q.value(11).toInt();
  m.prompt_tokens = q.value(12).toInt();
  m.reasoning = q.value(13).toString();
  m.reasoning_ms = q.value(14).toDouble();
  m.tool = q.value(15).toString();
  return m;
}

const QString kMessageColumns = QStringLiteral(
    "id, conversation_id, position, role, content, tokens_per_second, finish_reason, "
    "created_at, parent_id, active, ttft_ms, token_count, prompt_tokens, reasoning, "
    "reasoning_ms, tool");

QVariant parentValue(qint64 parent_id) {
  return parent_id ? QVariant(parent_id) : QVariant(QMetaType::fromType<qint64>());
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
      "SELECT id, title, system_prompt, sampling_json, created_at, updated_at, engine "
      "FROM conversations WHERE deleted_at IS NULL ORDER BY updated_at DESC, id DESC"));
  while (q.next()) {
    StoredConversation c;
    c.id = q.value(0).toLongLong();
    c.title = q.value(1).toString();
    c.system_prompt = q.value(2).toString();
    c.sampling = samplingFromJson(q.value(3).toString());
    c.created_ms = q.value(4).toLongLong();
    c.updated_ms = q.value(5).toLongLong();
    c.engine = q.value(6).toString();
    result.append(c);
  }
  return result;
}

std::optional<qint64> ChatStore::createConversation(const StoredConversation& c) {
  QSqlQuery q(QSqlDatabase::database(connection_));
  q.prepare(
      QStringLiteral("INSERT INTO conversations (title, system_prompt, sampling_json, created_at, "
                     "updated_at, engine) VALUES (?, ?, ?, ?, ?, ?)"));
  const qint64 created = c.created_ms ? c.created_ms : nowMs();
  q.addBindValue(text(c.title));
  q.addBindValue(text(c.system_prompt));
  q.addBindValue(samplingToJson(c.sampling));
  q.addBindValue(created);
  q.addBindValue(c.updated_ms ? c.updated_ms : created);
  q.addBindValue(text(c.engine));
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
                     "updated_at = ?, engine = ? WHERE id = ?"));
  q.addBindValue(text(c.title));
  q.addBindValue(text(c.system_prompt));
  q.addBindValue(samplingToJson(c.sampling));
  q.addBindValue(c.updated_ms ? c.updated_ms : nowMs());
  q.addBindValue(text(c.engine));
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

QList<StoredMessage> ChatStore::allMessages(qint64 conversation_id) const {
  QList<StoredMessage> result;
  QSqlQuery q(QSqlDatabase::database(connection_));
  q.prepare(QStringLiteral("SELECT %1 FROM messages WHERE conversation_id = ? ORDER BY id")
                .arg(kMessageColumns));
  q.addBindValue(conversation_id);
  q.exec();
  while (q.next()) result.append(messageFrom(q));
  return result;
}

QList<StoredMessage> ChatStore::messages(qint64 conversation_id) const {
  const QList<StoredMessage> all = allMessages(conversation_id);
  std::map<qint64, QList<const StoredMessage*>> children;  // by parent id, oldest first
  for (const StoredMessage& m : all) children[m.parent_id].append(&m);
  QList<StoredMessage> path;
  qint64 parent = 0;
  while (true) {
    const auto it = children.find(parent);
    if (it == children.end() || it->second.isEmpty()) break;
    const QList<const StoredMessage*>& versions = it->second;
    qsizetype chosen = versions.size() - 1;
    for (qsizetype i = versions.size() - 1; i >= 0; --i)
      if (versions[i]->active) {
        chosen = i;
        break;
      }
    StoredMessage m = *versions[chosen];
    m.version = static_cast<qint32>(chosen + 1);
    m.version_count = static_cast<qint32>(versions.size());
    parent = m.id;
    path.append(m);
  }
  return path;
}

QList<qint64> ChatStore::versionsOf(qint64 message_id) const {
  QList<qint64> ids;
  QSqlQuery q(QSqlDatabase::database(connection_));
  q.prepare(QStringLiteral(
      "SELECT s.id FROM messages s, messages m WHERE m.id = ? AND s.conversation_id = "
      "m.conversation_id AND s.parent_id IS m.parent_id ORDER BY s.id"));
  q.addBindValue(message_id);
  q.exec();
  while (q.next()) ids.append(q.value(0).toLongLong());
  return ids;
}

bool ChatStore::setActiveVersion(qint64 message_id) {
  QSqlDatabase db = QSqlDatabase::database(connection_);
  db.transaction();
  QSqlQuery q(db);
  q.prepare(QStringLiteral(
      "UPDATE messages SET active = (id = ?) WHERE id IN (SELECT s.id FROM messages s, "
      "messages m WHERE m.id = ? AND s.conversation_id = m.conversation_id AND "
      "s.parent_id IS m.parent_id)"));
  q.addBindValue(message_id);
  q.addBindValue(message_id);
  if (!q.exec()) {
    log()->error("choosing a version failed: {}", q.lastError().text().toStdString());
    db.rollback();
    return false;
  }
  return db.commit();
}

bool ChatStore::deleteLeafMessage(qint64 message_id) {
  const QList<qint64> versions = versionsOf(message_id);
  QSqlDatabase db = QSqlDatabase::database(connection_);
  QSqlQuery q(db);
  q.prepare(QStringLiteral(
      "DELETE FROM messages WHERE id = ? AND NOT EXISTS (SELECT 1 FROM messages c WHERE "
      "c.parent_id = messages.id)"));
  q.addBindValue(message_id);
  if (!q.exec() || q.numRowsAffected() != 1) return false;
  for (qsizetype i = versions.size() - 1; i >= 0; --i)
    if (versions[i] != message_id) return setActiveVersion(versions[i]);
  return true;
}

std::optional<qint64> ChatStore::insertMessage(const StoredMessage& message) {
  StoredMessage m = message;
  // Without a parent, a later message follows the one before it on the shown branch.
  if (m.parent_id == 0 && m.position > 0) {
    const QList<StoredMessage> shown = messages(m.conversation_id);
    if (shown.size() >= m.position) m.parent_id = shown[m.position - 1].id;
  }
  QSqlDatabase db = QSqlDatabase::database(connection_);
  db.transaction();
  QSqlQuery q(db);
  q.prepare(
      QStringLiteral("INSERT INTO messages (conversation_id, position, role, content, "
                     "tokens_per_second, finish_reason, created_at, parent_id, active, ttft_ms, "
                     "token_count, prompt_tokens, reasoning, reasoning_ms, tool) VALUES (?, ?, ?, "
                     "?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"));
  q.addBindValue(m.conversation_id);
  q.addBindValue(m.position);
  q.addBindValue(text(m.role));
  q.addBindValue(text(m.content));
  q.addBindValue(m.tokens_per_second);
  q.addBindValue(text(m.finish_reason));
  q.addBindValue(m.created_ms ? m.created_ms : nowMs());
  q.addBindValue(parentValue(m.parent_id));
  q.addBindValue(m.active ? 1 : 0);
  q.addBindValue(m.time_to_first_token_ms);
  q.addBindValue(m.token_count);
  q.addBindValue(m.prompt_tokens);
  q.addBindValue(text(m.reasoning));
  q.addBindValue(m.reasoning_ms);
  q.addBindValue(text(m.tool));
  QSqlQuery siblings(db);
  siblings.prepare(
      QStringLiteral("UPDATE messages SET active = 0 WHERE conversation_id = ? AND parent_id IS ? "
                     "AND id != ?"));
  QSqlQuery touch(db);
  touch.prepare(QStringLiteral("UPDATE conversations SET updated_at = ? WHERE id = ?"));
  touch.addBindValue(nowMs());
  touch.addBindValue(m.conversation_id);
  bool ok = q.exec();
  const qint64 id = ok ? q.lastInsertId().toLongLong() : 0;
  if (ok && m.active) {
    siblings.addBindValue(m.conversation_id);
    siblings.addBindValue(parentValue(m.parent_id));
    siblings.addBindValue(id);
    ok = siblings.exec();
  }
  if (!ok || !touch.exec()) {
    log()->error("saving a message failed: {}", q.lastError().text().toStdString());
    db.rollback();
    return std::nullopt;
  }
  db.commit();
  return id;
}

bool ChatStore::updateMessage(const StoredMessage& m) { return updateMessages({m}); }

bool ChatStore::updateMessages(const QList<StoredMessage>& messages) {
  QSqlDatabase db = QSqlDatabase::database(connection_);
  db.transaction();
  QSqlQuery q(db);
  q.prepare(
      QStringLiteral("UPDATE messages SET content = ?, tokens_per_second = ?, finish_reason = ?, "
                     "ttft_ms = ?, token_count = ?, prompt_tokens = ?, reasoning = ?, "
                     "reasoning_ms = ?, tool = ? WHERE id = ?"));
  for (const StoredMessage& m : messages) {
    q.addBindValue(text(m.content));
    q.addBindValue(m.tokens_per_second);
    q.addBindValue(text(m.finish_reason));
    q.addBindValue(m.time_to_first_token_ms);
    q.addBindValue(m.token_count);
    q.addBindValue(m.prompt_tokens);
    q.addBindValue(text(m.reasoning));
    q.addBindValue(m.reasoning_ms);
    q.addBindValue(text(m.tool));
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

QString chatToMarkdown(const StoredConversation& chat, const QList<StoredMessage>& messages) {
  QString out = QStringLiteral("# %1\n\n").arg(chat.title);
  if (!chat.system_prompt.trimmed().isEmpty())
    out += QStringLiteral("**System:** %1\n\n").arg(chat.system_prompt.trimmed());
  for (const StoredMessage& m : messages) {
    const QString who = m.role == QLatin1String("user")        ? QStringLiteral("You")
                        : m.role == QLatin1String("assistant") ? QStringLiteral("Model")
                                                               : m.role;
    out += QStringLiteral("## %1").arg(who);
    if (m.version_count > 1)
      out += QStringLiteral(" (version %1 of %2)").arg(m.version).arg(m.version_count);
    out += QStringLiteral("\n\n");
    if (!m.reasoning.isEmpty()) {
      // The reasoning as a quote above the answer.
      for (const QString& line : m.reasoning.trimmed().split(QLatin1Char('\n')))
        out += QStringLiteral("> ") + line + QLatin1Char('\n');
      out += QLatin1Char('\n');
    }
    out += m.content.trimmed() + QStringLiteral("\n\n");
    if (m.role == QLatin1String("assistant") && !m.finish_reason.isEmpty())
      out += QStringLiteral("*%1 tokens · stop: %2*\n\n").arg(m.token_count).arg(m.finish_reason);
  }
  return out;
}

QByteArray chatToJson(const StoredConversation& chat, const QList<StoredMessage>& messages) {
  QJsonArray list;
  for (const StoredMessage& m : messages) {
    QJsonObject o{{"role", m.role},
                  {"content", m.content},
                  {"created_ms", m.created_ms},
                  {"version", m.version},
                  {"versions", m.version_count}};
    if (m.role == QLatin1String("assistant")) {
      o.insert("finish_reason", m.finish_reason);
      o.insert("tokens", m.token_count);
      o.insert("prompt_tokens", m.prompt_tokens);
      o.insert("tokens_per_second", m.tokens_per_second);
      o.insert("time_to_first_token_ms", m.time_to_first_token_ms);
      if (!m.reasoning.isEmpty()) o.insert("reasoning", m.reasoning);
    }
    list.append(o);
  }
  const QJsonObject root{
      {"title", chat.title},
      {"system_prompt", chat.system_prompt},
      {"sampling", QJsonDocument::fromJson(samplingToJson(chat.sampling).toUtf8()).object()},
      {"created_ms", chat.created_ms},
      {"messages", list}};
  return QJsonDocument(root).toJson(QJsonDocument::Indented);
}

}  // namespace granule::app
