// What the tests of the whole window share: the data folder and the tests' Python packages,
// Main.qml loaded into a window, items by name, screenshots checked and saved under
// GRANULE_SCREENSHOT_DIR, and for tool use the MCP test server (tests/mcp/mcp_test_server.py)
// and a reply forced to call a tool.
#pragma once
#include <QDir>
#include <QElapsedTimer>
#include <QImage>
#include <QJsonDocument>
#include <QJsonObject>
#include <QProcess>
#include <QQmlApplicationEngine>
#include <QQuickItem>
#include <QQuickWindow>
#include <QtTest>
#include <set>

#include "application.h"

namespace granule::app::test {

// $XDG_DATA_HOME/granule (~/.local/share/granule by default): models/, python/, third_party/.
inline QString dataHome() {
  const QString xdg = qEnvironmentVariable("XDG_DATA_HOME");
  return (xdg.isEmpty() ? QDir::homePath() + QStringLiteral("/.local/share") : xdg) +
         QStringLiteral("/granule");
}

// The tests' Python packages (setup.sh pydeps) before whatever PYTHONPATH already holds.
inline QString pythonPath() {
  QString path = dataHome() + QStringLiteral("/python");
  const QString extra = qEnvironmentVariable("PYTHONPATH");
  if (!extra.isEmpty()) path += QLatin1Char(':') + extra;
  return path;
}

// This process's environment with PYTHONPATH = pythonPath(), for python3 children.
inline QProcessEnvironment pythonEnvironment() {
  QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
  env.insert(QStringLiteral("PYTHONPATH"), pythonPath());
  return env;
}

// Whether python3 imports the official mcp SDK (from pythonPath()).
inline bool mcpSdkPresent() {
  QProcess python;
  python.setProcessEnvironment(pythonEnvironment());
  python.start(QStringLiteral("python3"),
               {QStringLiteral("-c"), QStringLiteral("import mcp.server.mcpserver")});
  return python.waitForFinished(30000) && python.exitCode() == 0;
}

// Main.qml on `app`, shown at 1400 x 900; null when it does not load.
inline QQuickWindow* openMainWindow(Application& app, QQmlApplicationEngine& qml) {
  qml.addImportPath(QStringLiteral("qrc:/qt/qml"));
  qml.setInitialProperties(app.windowProperties());
  qml.load(QUrl(QStringLiteral("qrc:/qt/qml/Granule/Main.qml")));
  if (qml.rootObjects().isEmpty()) return nullptr;
  auto* window = qobject_cast<QQuickWindow*>(qml.rootObjects().first());
  if (!window) return nullptr;
  window->resize(1400, 900);
  window->show();
  return window;
}

// The first visible item named `name` under `root`, or null.
inline QQuickItem* findItem(QQuickItem* root, const QString& name) {
  if (root->objectName() == name && root->isVisible()) return root;
  for (QQuickItem* child : root->childItems())
    if (QQuickItem* found = findItem(child, name)) return found;
  return nullptr;
}

// How many visible items under `root` are named `name`.
inline int visibleCount(QQuickItem* root, const QString& name) {
  int n = root->objectName() == name && root->isVisible() ? 1 : 0;
  for (QQuickItem* child : root->childItems()) n += visibleCount(child, name);
  return n;
}

// Distinct colours in a coarse sample: a blank or single-colour grab has very few.
inline int distinctColours(const QImage& image) {
  std::set<QRgb> colours;
  for (int y = 0; y < image.height(); y += 7)
    for (int x = 0; x < image.width(); x += 7) colours.insert(image.pixel(x, y));
  return static_cast<int>(colours.size());
}

#ifdef GRANULE_SCREENSHOT_DIR
// Saves the window as `name` in GRANULE_SCREENSHOT_DIR after `settle_ms` (a frame for the
// bindings that just changed); fails the test when the grab is blank.
inline void saveScreenshot(QQuickWindow* window, const QString& name, int settle_ms = 0) {
  if (settle_ms > 0) QTest::qWait(settle_ms);
  const QImage image = window->grabWindow();
  QVERIFY(!image.isNull());
  QVERIFY2(distinctColours(image) > 40, qPrintable(name + " looks blank"));
  QDir().mkpath(QStringLiteral(GRANULE_SCREENSHOT_DIR));
  const QString path = QStringLiteral(GRANULE_SCREENSHOT_DIR "/") + name;
  QVERIFY(image.save(path));
  qInfo("saved %s", qPrintable(path));
}
#endif

// A message's tool JSON (a reply's calls, a card's state).
inline QJsonObject toolOf(const StoredMessage& m) {
  return QJsonDocument::fromJson(m.tool.toUtf8()).object();
}

#ifdef GRANULE_SOURCE_DIR
// Adds the MCP test server over stdio as "test tools"; whether it is ready within a minute.
inline bool addMcpTestServer(McpController* mcp) {
  const QString server = QStringLiteral(GRANULE_SOURCE_DIR "/tests/mcp/mcp_test_server.py");
  const QString error =
      mcp->addServer(QStringLiteral("test tools"), QStringLiteral("python3 '%1' stdio").arg(server),
                     QStringLiteral("PYTHONPATH=%1").arg(pythonPath()), {});
  if (!error.isEmpty()) {
    qWarning("the MCP test server was refused: %s", qPrintable(error));
    return false;
  }
  return QTest::qWaitFor(
      [mcp] {
        return mcp->servers().value(0).toMap().value(QStringLiteral("status")).toString() ==
               QStringLiteral("ready");
      },
      60000);
}
#endif

// A new chat (on `engine`, when given) asked `question` with a reply forced to call `tool`
// (greedy, room for the call: the tiny model pads the constrained JSON with blanks); whether
// the call's card (row 2) came within four minutes. Without one, the chat's rows are logged.
inline bool forceToolCall(ChatController* chats, const QString& tool, const QString& question,
                          const QString& engine = {}) {
  chats->newChat();
  if (!engine.isEmpty()) chats->setCurrentEngine(engine);
  chats->samplingEditor()->setTemperature(0);
  chats->samplingEditor()->setMaxTokens(160);
  chats->setToolChoice(tool);
  chats->send(question);
  chats->setToolChoice({});
  MessageModel* shown = chats->messages();
  const auto hasCard = [shown] {
    return shown->count() >= 3 && shown->message(2).role == QLatin1String("tool");
  };
  QElapsedTimer waited;
  waited.start();
  while (!hasCard() && waited.elapsed() < 240000) {
    QTest::qWait(200);
    // A reply that ended without a call: nothing more will come.
    if (chats->generatingCount() == 0 && shown->count() >= 2 && !hasCard()) break;
  }
  if (!hasCard()) {
    for (int row = 0; row < shown->count(); ++row)
      qWarning("row %d %s: %s %s", row, qPrintable(shown->message(row).role),
               qPrintable(shown->message(row).content), qPrintable(shown->message(row).tool));
    return false;
  }
  qInfo("the call came after %lld ms", static_cast<long long>(waited.elapsed()));
  return true;
}

}  // namespace granule::app::test
