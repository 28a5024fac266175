// MCP servers in the window: the list in the settings table ("mcp/servers", JSON), one thread
// per connected server where its client blocks, and results back as queued signals.
#include "mcp_controller.h"

#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QThread>
#include <QUrl>

#include "chat_store.h"
#include "granule/log.h"

#ifdef GRANULE_HAVE_MCP
#include "mcp/mcp_client.h"
#endif

namespace granule::app {
namespace {

std::shared_ptr<spdlog::logger> log() { return granule::logger("app.mcp"); }

const QString kSettingKey = QStringLiteral("mcp/servers");

}  // namespace

QStringList splitCommandLine(const QString& line, QString* error) {
  QStringList words;
  QString word;
  bool in_word = false;
  QChar quote;
  for (qsizetype i = 0; i < line.size(); ++i) {
    const QChar c = line[i];
    if (!quote.isNull()) {
      if (c == quote) {
        quote = QChar();
      } else if (c == QLatin1Char('\\') && quote == QLatin1Char('"') && i + 1 < line.size() &&
                 (line[i + 1] == QLatin1Char('"') || line[i + 1] == QLatin1Char('\\'))) {
        word += line[++i];
      } else {
        word += c;
      }
    } else if (c == QLatin1Char('\'') || c == QLatin1Char('"')) {
      quote = c;
      in_word = true;
    } else if (c == QLatin1Char('\\') && i + 1 < line.size()) {
      word += line[++i];
      in_word = true;
    } else if (c.isSpace()) {
      if (in_word) words << word;
      word.clear();
      in_word = false;
    } else {
      word += c;
      in_word = true;
    }
  }
  if (!quote.isNull()) {
    if (error) *error = QStringLiteral("The command has an unclosed %1 quote.").arg(quote);
    return {};
  }
  if (in_word) words << word;
  return words;
}

// Lives on its server's thread: the blocking client calls happen there.
class McpConnection : public QObject {
  Q_OBJECT
 public:
#ifdef GRANULE_HAVE_MCP
  void open(const mcp::ServerConfig& config, int request_ms, int call_ms) {
    try {
      client_ = std::make_unique<mcp::Client>(
          mcp::open_transport(config),
          mcp::Timeouts{std::chrono::milliseconds(request_ms), std::chrono::milliseconds(call_ms)});
      client_->initialize("granule", "1");
      QJsonArray tools;
      for (const mcp::Tool& t : client_->list_tools()) {
        tools.append(QJsonObject{
            {"name", QString::fromStdString(t.name)},
            {"description",
             QString::fromStdString(t.description.empty() ? t.title : t.description)},
            { "parameters",
              QJsonDocument::fromJson(QByteArray::fromStdString(t.input_schema.dump())).object()
            }});
      }
      Q_EMIT opened(QString::fromUtf8(QJsonDocument(tools).toJson(QJsonDocument::Compact)));
    } catch (const std::exception& e) {
      client_.reset();
      Q_EMIT failed(QString::fromUtf8(e.what()));
    }
  }
  void call(qint64 key, const QString& tool, const QString& arguments_json) {
    if (!client_) {
      Q_EMIT called(key, false, QStringLiteral("the server is not connected"));
      return;
    }
    try {
      const auto args =
          nlohmann::json::parse(arguments_json.toStdString(), nullptr, /*allow_exceptions=*/false);
      const mcp::CallResult result = client_->call_tool(tool.toStdString(), args);
      Q_EMIT called(key, !result.is_error, QString::fromStdString(result.text));
    } catch (const std::exception& e) {
      Q_EMIT called(key, false, QString::fromUtf8(e.what()));
    }
  }
  void close() { client_.reset(); }

 private:
  std::unique_ptr<mcp::Client> client_;
#endif
 Q_SIGNALS:
  void opened(const QString& tools_json);
  void failed(const QString& error);
  void called(qint64 key, bool ok, const QString& text);
};

struct McpController::Server {
  QString name;
  QString command;
  QStringList args;
  QStringList env;  // "KEY=value"
  QString url;
  bool enabled = true;
  QStringList always_allowed;
  // While connected.
  QString status = QStringLiteral("off");
  QString error;
  QJsonArray tools;  // [{"name", "description", "parameters"}]
  QThread* thread = nullptr;
  McpConnection* connection = nullptr;
  int generation = 0;  // results of an older connection are dropped
};

McpController::McpController(ChatStore& store, QObject* parent) : QObject(parent), store_(store) {
  load();
  for (auto& s : servers_)
    if (s->enabled) connectServer(*s);
}

McpController::~McpController() {
  for (auto& s : servers_) disconnectServer(*s);
}

bool McpController::available() const {
#ifdef GRANULE_HAVE_MCP
  return true;
#else
  return false;
#endif
}

QVariantList McpController::servers() const {
  QVariantList out;
  for (const auto& s : servers_) {
    QStringList tool_names;
    for (const QJsonValue& t : s->tools) tool_names << t.toObject().value("name").toString();
    QStringList command{s->command};
    command << s->args;
    out.append(QVariantMap{{"name", s->name},
                           {"command", s->command.isEmpty() ? QString() : command.join(' ')},
                           {"env", s->env.join('\n')},
                           {"url", s->url},
                           {"enabled", s->enabled},
                           {"status", s->status},
                           {"error", s->error},
                           {"tools", tool_names}});
  }
  return out;
}

void McpController::load() {
  const QJsonArray list = QJsonDocument::fromJson(store_.setting(kSettingKey).toUtf8()).array();
  for (const QJsonValue& v : list) {
    const QJsonObject o = v.toObject();
    auto s = std::make_unique<Server>();
    s->name = o.value("name").toString();
    s->command = o.value("command").toString();
    for (const QJsonValue& a : o.value("args").toArray()) s->args << a.toString();
    for (const QJsonValue& e : o.value("env").toArray()) s->env << e.toString();
    s->url = o.value("url").toString();
    s->enabled = o.value("enabled").toBool(true);
    for (const QJsonValue& t : o.value("always_allowed").toArray())
      s->always_allowed << t.toString();
    if (!s->name.isEmpty()) servers_.push_back(std::move(s));
  }
}

void McpController::save() const {
  QJsonArray list;
  for (const auto& s : servers_) {
    list.append(QJsonObject{{"name", s->name},
                            {"command", s->command},
                            {"args", QJsonArray::fromStringList(s->args)},
                            {"env", QJsonArray::fromStringList(s->env)},
                            {"url", s->url},
                            {"enabled", s->enabled},
                            {"always_allowed", QJsonArray::fromStringList(s->always_allowed)}});
  }
  store_.setSetting(kSettingKey,
                    QString::fromUtf8(QJsonDocument(list).toJson(QJsonDocument::Compact)));
}

McpController::Server* McpController::find(const QString& name) {
  for (auto& s : servers_)
    if (s->name == name) return s.get();
  return nullptr;
}

QString McpController::addServer(const QString& name, const QString& command_line,
                                 const QString& env, const QString& url) {
  if (!available()) return QStringLiteral("This build has no MCP client.");
  const QString trimmed = name.trimmed();
  if (trimmed.isEmpty()) return QStringLiteral("Give the server a name.");
  if (find(trimmed)) return QStringLiteral("A server named %1 exists already.").arg(trimmed);
  QString split_error;
  const QStringList words = splitCommandLine(command_line, &split_error);
  if (!split_error.isEmpty()) return split_error;
  const QString address = url.trimmed();
  if (words.isEmpty() == address.isEmpty())
    return QStringLiteral("Give either a command (stdio) or a URL (streamable HTTP).");
  if (!address.isEmpty()) {
    const QUrl parsed(address);
    if (!parsed.isValid() || (parsed.scheme() != "http" && parsed.scheme() != "https") ||
        parsed.host().isEmpty())
      return QStringLiteral("The URL must be http:// or https://, like http://127.0.0.1:8000/mcp.");
  }
  QStringList variables;
  for (const QString& line : env.split('\n', Qt::SkipEmptyParts)) {
    const QString v = line.trimmed();
    if (v.isEmpty()) continue;
    if (v.indexOf('=') <= 0) return QStringLiteral("'%1' is not KEY=value.").arg(v);
    variables << v;
  }
  auto s = std::make_unique<Server>();
  s->name = trimmed;
  if (!words.isEmpty()) {
    s->command = words.first();
    s->args = words.mid(1);
  }
  s->env = variables;
  s->url = address;
  Server& added = *s;
  servers_.push_back(std::move(s));
  save();
  connectServer(added);
  Q_EMIT serversChanged();
  return {};
}

void McpController::removeServer(int index) {
  if (index < 0 || index >= static_cast<int>(servers_.size())) return;
  disconnectServer(*servers_[static_cast<size_t>(index)]);
  servers_.erase(servers_.begin() + index);
  save();
  Q_EMIT serversChanged();
}

void McpController::setServerEnabled(int index, bool enabled) {
  if (index < 0 || index >= static_cast<int>(servers_.size())) return;
  Server& s = *servers_[static_cast<size_t>(index)];
  if (s.enabled == enabled) return;
  s.enabled = enabled;
  if (enabled)
    connectServer(s);
  else
    disconnectServer(s);
  save();
  Q_EMIT serversChanged();
}

void McpController::reconnect(int index) {
  if (index < 0 || index >= static_cast<int>(servers_.size())) return;
  Server& s = *servers_[static_cast<size_t>(index)];
  disconnectServer(s);
  if (s.enabled) connectServer(s);
  Q_EMIT serversChanged();
}

void McpController::setTimeouts(int request_ms, int call_ms) {
  request_ms_ = request_ms;
  call_ms_ = call_ms;
}

void McpController::connectServer(Server& s) {
#ifdef GRANULE_HAVE_MCP
  disconnectServer(s);
  s.status = QStringLiteral("connecting");
  s.error.clear();
  s.tools = {};
  s.thread = new QThread;
  s.thread->setObjectName(QStringLiteral("mcp-%1").arg(s.name));
  s.connection = new McpConnection;
  s.connection->moveToThread(s.thread);
  const int generation = ++s.generation;
  const QString name = s.name;
  connect(s.connection, &McpConnection::opened, this,
          [this, name, generation](const QString& json) {
            Server* server = find(name);
            if (!server || server->generation != generation) return;
            server->status = QStringLiteral("ready");
            server->tools = QJsonDocument::fromJson(json.toUtf8()).array();
            log()->info("MCP server {}: {} tools", name.toStdString(), server->tools.size());
            Q_EMIT serversChanged();
          });
  connect(s.connection, &McpConnection::failed, this, [this, name, generation](const QString& e) {
    Server* server = find(name);
    if (!server || server->generation != generation) return;
    server->status = QStringLiteral("failed");
    server->error = e;
    log()->warn("MCP server {}: {}", name.toStdString(), e.toStdString());
    Q_EMIT serversChanged();
  });
  connect(s.connection, &McpConnection::called, this, &McpController::callFinished);
  s.thread->start();
  mcp::ServerConfig config;
  config.command = s.command.toStdString();
  for (const QString& a : s.args) config.args.push_back(a.toStdString());
  for (const QString& e : s.env) {
    const qsizetype eq = e.indexOf('=');
    config.env.emplace_back(e.left(eq).toStdString(), e.mid(eq + 1).toStdString());
  }
  config.url = s.url.toStdString();
  McpConnection* connection = s.connection;
  const int request_ms = request_ms_, call_ms = call_ms_;
  QMetaObject::invokeMethod(
      connection,
      [connection, config, request_ms, call_ms] { connection->open(config, request_ms, call_ms); },
      Qt::QueuedConnection);
  Q_EMIT serversChanged();
#else
  s.status = QStringLiteral("failed");
  s.error = QStringLiteral("this build has no MCP client");
#endif
}

void McpController::disconnectServer(Server& s) {
  ++s.generation;
  s.status = QStringLiteral("off");
  s.tools = {};
  if (!s.thread) return;
  McpConnection* connection = s.connection;
  QThread* thread = s.thread;
  s.connection = nullptr;
  s.thread = nullptr;
  connection->disconnect(this);
#ifdef GRANULE_HAVE_MCP
  // The client closes on its own thread (a stdio server's process ends with it).
  QMetaObject::invokeMethod(
      connection, [connection] { connection->close(); }, Qt::QueuedConnection);
#endif
  thread->quit();
  // A call in progress holds the thread until its timeout: the thread and its connection are
  // left to finish then (and to the process's end), never destroyed while they run.
  if (thread->wait(3000)) {
    delete connection;
    delete thread;
  } else {
    log()->warn("MCP server {} is busy; its connection closes when the call ends",
                s.name.toStdString());
    QObject::connect(thread, &QThread::finished, thread, [connection, thread] {
      delete connection;
      thread->deleteLater();
    });
  }
}

QString McpController::toolsJson() const {
  QJsonArray tools;
  QStringList seen;
  for (const auto& s : servers_) {
    if (!s->enabled || s->status != QStringLiteral("ready")) continue;
    for (const QJsonValue& t : s->tools) {
      const QJsonObject tool = t.toObject();
      const QString name = tool.value("name").toString();
      if (seen.contains(name)) continue;  // the first server's tool of that name
      seen << name;
      QJsonObject function = tool;
      if (function.value("parameters").toObject().isEmpty())
        function.insert("parameters", QJsonObject{{"type", "object"}});
      tools.append(QJsonObject{{"type", "function"}, {"function", function}});
    }
  }
  if (tools.isEmpty()) return {};
  return QString::fromUtf8(QJsonDocument(tools).toJson(QJsonDocument::Compact));
}

QString McpController::serverOf(const QString& tool) const {
  for (const auto& s : servers_) {
    if (!s->enabled || s->status != QStringLiteral("ready")) continue;
    for (const QJsonValue& t : s->tools)
      if (t.toObject().value("name").toString() == tool) return s->name;
  }
  return {};
}

bool McpController::alwaysAllowed(const QString& tool) const {
  const QString server = serverOf(tool);
  for (const auto& s : servers_)
    if (s->name == server) return s->always_allowed.contains(tool);
  return false;
}

void McpController::allowAlways(const QString& tool) {
  Server* s = find(serverOf(tool));
  if (!s || s->always_allowed.contains(tool)) return;
  s->always_allowed << tool;
  save();
}

void McpController::startCall(qint64 key, const QString& tool, const QString& arguments_json) {
  Server* s = find(serverOf(tool));
  if (!s || !s->connection) {
    QMetaObject::invokeMethod(
        this,
        [this, key, tool] {
          Q_EMIT callFinished(
              key, false, QStringLiteral("no connected MCP server offers the tool '%1'").arg(tool));
        },
        Qt::QueuedConnection);
    return;
  }
#ifdef GRANULE_HAVE_MCP
  McpConnection* connection = s->connection;
  QMetaObject::invokeMethod(
      connection,
      [connection, key, tool, arguments_json] { connection->call(key, tool, arguments_json); },
      Qt::QueuedConnection);
#else
  (void)arguments_json;
#endif
}

}  // namespace granule::app

#include "mcp_controller.moc"
