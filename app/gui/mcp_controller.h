// McpController: the MCP servers of Settings — added, removed, enabled, each connected on a
// thread of its own through the Qt-free client (app/mcp) — and the tools they offer to the
// chats: their definitions for the chat template, and calls that run there and come back as
// signals. Which tools the user allowed always is remembered per server. GUI thread only.
#pragma once
#include <QtQml/qqmlregistration.h>

#include <QObject>
#include <QString>
#include <QStringList>
#include <QVariantList>
#include <memory>
#include <vector>

class QThread;

namespace granule::app {

class ChatStore;
class McpConnection;

// Splits a command line as a POSIX shell would split words: blanks apart, 'single' and
// "double" quotes (\" and \\ inside double quotes), \ before any other character. No
// variables or globs. Sets `error` for an unclosed quote.
QStringList splitCommandLine(const QString& line, QString* error = nullptr);

class McpController : public QObject {
  Q_OBJECT
  QML_ELEMENT
  QML_UNCREATABLE("Owned by the application")
  // Each server: name, command (with its arguments), env ("KEY=value" lines), url, enabled,
  // status ("off", "connecting", "ready", "failed"), error, tools (their names).
  Q_PROPERTY(QVariantList servers READ servers NOTIFY serversChanged)
  // False in a build without the MCP client (no libcurl) or without tool-call parsing.
  Q_PROPERTY(bool available READ available CONSTANT)

 public:
  McpController(ChatStore& store, QObject* parent = nullptr);
  ~McpController() override;

  QVariantList servers() const;
  bool available() const;

  // Adds a server (a command line, or an http(s) URL) and connects it; "" or the one-line
  // reason it was refused.
  Q_INVOKABLE QString addServer(const QString& name, const QString& command_line,
                                const QString& env, const QString& url);
  Q_INVOKABLE void removeServer(int index);
  Q_INVOKABLE void setServerEnabled(int index, bool enabled);
  Q_INVOKABLE void reconnect(int index);

  // The ready servers' tools as OpenAI's tools array for the chat template ("" when none).
  QString toolsJson() const;
  // The server that offers `tool` ("" when none does).
  QString serverOf(const QString& tool) const;
  bool alwaysAllowed(const QString& tool) const;
  void allowAlways(const QString& tool);
  // Runs a call on its server's thread; callFinished(key, ...) follows, also for a tool that
  // no ready server offers.
  void startCall(qint64 key, const QString& tool, const QString& arguments_json);

  // How long a call and the other requests may take (tests shorten them).
  void setTimeouts(int request_ms, int call_ms);

 Q_SIGNALS:
  void serversChanged();
  // ok false: the call failed (the tool's error, a timeout, the server gone); text says why.
  void callFinished(qint64 key, bool ok, const QString& text);

 private:
  struct Server;
  void save() const;
  void load();
  void connectServer(Server& server);
  void disconnectServer(Server& server);
  Server* find(const QString& name);

  ChatStore& store_;
  std::vector<std::unique_ptr<Server>> servers_;
  int request_ms_ = 15000;
  int call_ms_ = 60000;
};

}  // namespace granule::app
