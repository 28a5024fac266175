// Tool use in the window: the test MCP server (tests/mcp/mcp_test_server.py, the official mcp
// SDK, over stdio) added in Settings' controller, a chat with the default model whose reply is
// forced to be a call — ChatController::setToolChoice, which the engine turns into the same
// structural-tag constraint the server uses for tool_choice (the tiny model would not call a
// tool on its own) — and the card through its states: asking, allowed (running), its result
// and the model going on, a tool error, a timeout, a denial, "always" remembered. PNGs of the
// cards are saved under GRANULE_SCREENSHOT_DIR; everything is read back from the database.
#include <QtQml/qqmlextensionplugin.h>

#include <QDir>
#include <QJsonDocument>
#include <QJsonObject>
#include <QProcess>
#include <QQmlApplicationEngine>
#include <QQuickItem>
#include <QQuickStyle>
#include <QQuickWindow>
#include <QTcpServer>
#include <QTemporaryDir>
#include <QtTest>

#include "application.h"
#include "granule/constraint.h"
#include "reply_parser.h"
#include "window_test_support.h"

Q_IMPORT_QML_PLUGIN(GranulePlugin)

using namespace granule::app;
using namespace granule::app::test;

class McpWindowTest : public QObject {
  Q_OBJECT

  QTemporaryDir dir_;
  std::unique_ptr<Application> app_;
  std::unique_ptr<QQmlApplicationEngine> qml_;
  QQuickWindow* window_ = nullptr;

  ChatController* chats() { return app_->chats(); }
  MessageModel* shown() { return chats()->messages(); }

  void save(const QString& name) { saveScreenshot(window_, name, 150); }

  // A new chat whose reply must call `tool`; waits for the reply and returns the card's row.
  int askFor(const QString& tool, const QString& question) {
    if (!forceToolCall(chats(), tool, question)) {
      [] { QFAIL("the reply made no tool call"); }();
      return -1;
    }
    const StoredMessage reply = shown()->message(1);
    const QJsonObject calls = toolOf(reply);
    qInfo("the model called %s", qPrintable(QString::fromUtf8(reply.tool.toUtf8())));
    [&] {
      QCOMPARE(calls.value("calls").toArray().size(), 1);
      QCOMPARE(toolOf(shown()->message(2)).value("name").toString(), tool);
    }();
    return 2;
  }

  QString state(int row) { return toolOf(shown()->message(row)).value("state").toString(); }

 private Q_SLOTS:
  void initTestCase() {
    QQuickStyle::setStyle(QStringLiteral("Fusion"));
    const QString model = dataHome() + QStringLiteral("/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if (!QFile::exists(model)) QSKIP("the default model is absent (bash packaging/setup.sh model)");
    if (!granule::structured_output_available())
      QSKIP("this build has no structured output (xgrammar): a call cannot be forced");
    if (!toolCallsAvailable()) QSKIP("this build parses no tool calls (no server library)");
    if (!mcpSdkPresent())
      QSKIP("the official mcp Python package is missing: bash packaging/setup.sh pydeps");

    app_ = std::make_unique<Application>(granuleEngineFactory(),
                                         dir_.filePath(QStringLiteral("granule.sqlite")));
    QVERIFY(app_->mcp()->available());
    app_->mcp()->setTimeouts(30000, 3000);  // a 3 s call timeout for the hanging tool
    qml_ = std::make_unique<QQmlApplicationEngine>();
    QVERIFY((window_ = openMainWindow(*app_, *qml_)) != nullptr);

    // Settings' form: a bad entry is refused with one line, the test server is added.
    McpController* mcp = app_->mcp();
    QVERIFY(!mcp->addServer(QStringLiteral("x"), {}, {}, {}).isEmpty());
    QCOMPARE(
        mcp->addServer(QStringLiteral("x"), QStringLiteral("a"), {}, QStringLiteral("ftp://b")),
        QStringLiteral("Give either a command (stdio) or a URL (streamable HTTP)."));
    QVERIFY(addMcpTestServer(mcp));
    QCOMPARE(mcp->servers().value(0).toMap().value(QStringLiteral("tools")).toStringList().size(),
             6);
    // The same server over streamable HTTP: ready with the same tools, then removed (the first
    // server's tools are the ones offered).
    QProcess http;
    http.setProcessEnvironment(pythonEnvironment());
    const int port = [] {
      QTcpServer s;
      s.listen(QHostAddress::LocalHost, 0);
      return static_cast<int>(s.serverPort());
    }();
    http.start(QStringLiteral("python3"),
               {QStringLiteral(GRANULE_SOURCE_DIR "/tests/mcp/mcp_test_server.py"),
                QStringLiteral("http"), QString::number(port)});
    QVERIFY(http.waitForStarted(10000));
    QCOMPARE(mcp->addServer(QStringLiteral("http tools"), {}, {},
                            QStringLiteral("http://127.0.0.1:%1/mcp").arg(port)),
             QString());
    // Until the SDK's server listens, connecting fails: reconnect until it is ready.
    const auto status = [mcp] {
      return mcp->servers().value(1).toMap().value(QStringLiteral("status")).toString();
    };
    QElapsedTimer started;
    started.start();
    while (status() != QStringLiteral("ready") && started.elapsed() < 60000) {
      QTest::qWait(500);
      if (status() == QStringLiteral("failed")) mcp->reconnect(1);
    }
    QCOMPARE(status(), QStringLiteral("ready"));
    QCOMPARE(mcp->servers().value(1).toMap().value(QStringLiteral("tools")).toStringList().size(),
             6);
    QCOMPARE(mcp->serverOf(QStringLiteral("weather")), QStringLiteral("test tools"));
    mcp->removeServer(1);
    QCOMPARE(mcp->servers().size(), 1);
    http.terminate();
    http.waitForFinished(10000);
    QVERIFY(mcp->toolsJson().contains(QStringLiteral("\"weather\"")));
    app_->start(model);
    QTRY_VERIFY_WITH_TIMEOUT(app_->model()->ready(), 120000);
  }

  // The chat's JSON output with a schema: the reply is that JSON (the engine's constraint), and
  // the chat settings show the setting.
  void jsonOutputConstrainsTheChatsReplies() {
    chats()->newChat();
    SamplingEditor* sampling = chats()->samplingEditor();
    sampling->setTemperature(0);
    sampling->setMaxTokens(160);
    QCOMPARE(
        sampling->setJsonSchema(R"({"type": "object", "properties": {"city": {"type": "string"}, )"
                                R"("sunny": {"type": "boolean"}}, "required": ["city", "sunny"]})"),
        QString());
    chats()->send(QStringLiteral("Is it sunny in Lisbon? Answer in JSON."));
    QTRY_VERIFY_WITH_TIMEOUT(shown()->count() == 2 && chats()->generatingCount() == 0, 180000);
    const StoredMessage reply = shown()->message(1);
    qInfo("JSON output: %s (%s)", qPrintable(reply.content), qPrintable(reply.finish_reason));
    QJsonParseError error;
    const QJsonDocument doc = QJsonDocument::fromJson(reply.content.toUtf8(), &error);
    QVERIFY2(doc.isObject(), qPrintable(error.errorString()));
    QVERIFY(doc.object().value("city").isString());
    QVERIFY(doc.object().value("sunny").isBool());
    QObject* drawer = window_->findChild<QObject*>(QStringLiteral("chatSettings"));
    QVERIFY(drawer);
    QVERIFY(QMetaObject::invokeMethod(drawer, "open"));
    QTest::qWait(1500);  // the drawer slides in
    save(QStringLiteral("json-output-settings.png"));
    QVERIFY(QMetaObject::invokeMethod(drawer, "close"));
    QTest::qWait(800);
  }

  // Settings' MCP section: the server, its state and tools, the form to add another.
  void theSettingsShowTheServer() {
    QObject* dialog = window_->findChild<QObject*>(QStringLiteral("settingsDialog"));
    QVERIFY(dialog);
    QMetaObject::invokeMethod(dialog, "open");
    QQuickItem* section = nullptr;
    QTRY_VERIFY_WITH_TIMEOUT((section = window_->findChild<QQuickItem*>(
                                  QStringLiteral("mcpServersSection"))) != nullptr &&
                                 section->isVisible(),
                             5000);
    // Scrolled to the end, where the section is: the Flickable of the dialog's ScrollView (once
    // the dialog has opened and laid itself out).
    QTest::qWait(500);
    for (QQuickItem* p = section->parentItem(); p; p = p->parentItem()) {
      if (p->inherits("QQuickFlickable")) {
        p->setProperty("contentY",
                       std::max(0.0, p->property("contentHeight").toDouble() - p->height()));
        break;
      }
    }
    save(QStringLiteral("mcp-settings.png"));
    QMetaObject::invokeMethod(dialog, "close");
  }

  void cleanupTestCase() {
    if (window_) window_->close();
    if (app_) app_->shutdown();
  }

  void aCallIsAskedAllowedRunAndAnswered() {
    const int row =
        askFor(QStringLiteral("weather"), QStringLiteral("What is the weather in Paris?"));
    QVERIFY(row > 0);
    QCOMPARE(state(row), QStringLiteral("asking"));
    QVERIFY(toolOf(shown()->message(row)).value("arguments").toString().contains("city"));
    // The card's buttons appear once the view has laid the new row out.
    QTRY_COMPARE_WITH_TIMEOUT(visibleCount(window_->contentItem(), QStringLiteral("toolAllowOnce")),
                              1, 5000);
    save(QStringLiteral("mcp-card-asking.png"));
    chats()->answerToolCall(row, QStringLiteral("once"));
    QCOMPARE(state(row), QStringLiteral("running"));
    save(QStringLiteral("mcp-card-allowed.png"));
    QTRY_COMPARE_WITH_TIMEOUT(state(row), QStringLiteral("done"), 30000);
    QVERIFY(shown()->message(row).content.contains(QStringLiteral("21 °C")));
    // The result went back to the model, which answers in a new assistant message.
    QTRY_VERIFY_WITH_TIMEOUT(shown()->count() == 4 && chats()->generatingCount() == 0, 180000);
    QCOMPARE(shown()->message(3).role, QStringLiteral("assistant"));
    save(QStringLiteral("mcp-card-result.png"));
    // The cards are saved with the chat.
    const QList<StoredMessage> stored = app_->store().messages(chats()->currentChatId());
    QCOMPARE(stored.size(), 4);
    QCOMPARE(toolOf(stored[2]).value("state").toString(), QStringLiteral("done"));
    QCOMPARE(stored[2].content, shown()->message(row).content);
    QCOMPARE(toolOf(stored[1]).value("calls").toArray().size(), 1);
    QCOMPARE(stored[1].finish_reason, QStringLiteral("tool_calls"));
  }

  void aFailingToolIsShownAndTheChatGoesOn() {
    const int row = askFor(QStringLiteral("fail"), QStringLiteral("Try the failing tool."));
    QVERIFY(row > 0);
    chats()->answerToolCall(row, QStringLiteral("once"));
    QTRY_COMPARE_WITH_TIMEOUT(state(row), QStringLiteral("failed"), 30000);
    QTRY_VERIFY_WITH_TIMEOUT(shown()->count() == 4 && chats()->generatingCount() == 0, 180000);
    save(QStringLiteral("mcp-card-failure.png"));
  }

  void aCallThatTimesOutIsShownAndTheChatGoesOn() {
    const int row = askFor(QStringLiteral("hang"), QStringLiteral("Call the slow tool."));
    QVERIFY(row > 0);
    chats()->answerToolCall(row, QStringLiteral("once"));
    QTRY_COMPARE_WITH_TIMEOUT(state(row), QStringLiteral("failed"), 30000);
    QCOMPARE(toolOf(shown()->message(row)).value("error").toString(),
             QStringLiteral("tools/call timed out after 3 s"));
    QTRY_VERIFY_WITH_TIMEOUT(shown()->count() == 4 && chats()->generatingCount() == 0, 180000);
    save(QStringLiteral("mcp-card-timeout.png"));
  }

  void aDeniedCallIsToldToTheModel() {
    const int row = askFor(QStringLiteral("add"), QStringLiteral("Add 2 and 3."));
    QVERIFY(row > 0);
    chats()->answerToolCall(row, QStringLiteral("deny"));
    QCOMPARE(state(row), QStringLiteral("denied"));
    QTRY_VERIFY_WITH_TIMEOUT(shown()->count() == 4 && chats()->generatingCount() == 0, 180000);
    save(QStringLiteral("mcp-card-denied.png"));
  }

  void alwaysAllowedToolsRunWithoutAsking() {
    int row = askFor(QStringLiteral("weather"), QStringLiteral("Weather in Rome?"));
    QVERIFY(row > 0);
    chats()->answerToolCall(row, QStringLiteral("always"));
    QTRY_VERIFY_WITH_TIMEOUT(shown()->count() == 4 && chats()->generatingCount() == 0, 180000);
    row = askFor(QStringLiteral("weather"), QStringLiteral("Weather in Oslo?"));
    QVERIFY(row > 0);
    QVERIFY(state(row) != QStringLiteral("asking"));
    QTRY_COMPARE_WITH_TIMEOUT(state(row), QStringLiteral("done"), 30000);
    // Remembered with the server in the settings.
    QVERIFY(app_->store()
                .setting(QStringLiteral("mcp/servers"))
                .contains(QStringLiteral("\"always_allowed\":[\"weather\"]")));
    QTRY_VERIFY_WITH_TIMEOUT(chats()->generatingCount() == 0, 180000);
  }
};

int main(int argc, char** argv) {
  // Each function generates two replies with the real model on the CPU: more than QtTest's
  // five minutes on a busy machine.
  if (!qEnvironmentVariableIsSet("QTEST_FUNCTION_TIMEOUT"))
    qputenv("QTEST_FUNCTION_TIMEOUT", "900000");
  QGuiApplication app(argc, argv);
  McpWindowTest test;
  return QTest::qExec(&test, argc, argv);
}
#include "app_mcp_test.moc"
