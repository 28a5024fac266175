// Everything a local chat does, on an endpoint: the window (Application, Main.qml) with a chat on
// the model of a `granule-cli serve` that wants an API key, the key coming from Settings →
// Endpoints. JSON output travels as response_format and the server enforces the schema; the
// MCP test server's tools (tests/mcp/mcp_test_server.py) travel as tools, a named tool_choice
// makes the server constrain the reply to a call (the tiny model would not call a tool on its
// own), and its streamed tool_calls become the same card as a local call: asked, allowed, run,
// its result sent back as a tool message, then the answer — also against llama-server, with a
// tool-call template for the default model. The model bar names the endpoint
// and model; the Server panel draws the server's batching counters; Models → Server opens the
// endpoint's model with the endpoint's key; a vLLM-style reasoning stream with two calls
// (canned_server.py) shows its Thinking block and two cards. PNGs under GRANULE_SCREENSHOT_DIR.
// Skips without the default model, xgrammar or the mcp Python package.
#include <QtQml/qqmlextensionplugin.h>

#include <QDir>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QProcess>
#include <QQmlApplicationEngine>
#include <QQuickItem>
#include <QQuickStyle>
#include <QQuickWindow>
#include <QScopeGuard>
#include <QTemporaryDir>
#include <QtTest>

#include "application.h"
#include "granule/constraint.h"
#include "remote/openai_client.h"
#include "remote_inference_engine.h"
#include "remote_test_support.h"
#include "window_test_support.h"

Q_IMPORT_QML_PLUGIN(GranulePlugin)

using namespace granule::app;
using namespace granule::app::test;

namespace {

constexpr const char* kApiKey = "sk-remote-tools-test";

}  // namespace

class RemoteToolsTest : public QObject {
  Q_OBJECT

  QTemporaryDir dir_;
  Child server_;
  QString modelId_;
  QString ref_;
  std::shared_ptr<EndpointAccessLookup> keys_ = std::make_shared<EndpointAccessLookup>();
  std::unique_ptr<Application> app_;
  std::unique_ptr<QQmlApplicationEngine> qml_;
  QQuickWindow* window_ = nullptr;

  ChatController* chats() { return app_->chats(); }
  MessageModel* shown() { return chats()->messages(); }

  void save(const QString& name) { saveScreenshot(window_, name, 300); }

  QString state(int row) { return toolOf(shown()->message(row)).value("state").toString(); }

  // A call forced by a named tool_choice on the chat's endpoint `ref`, asked with `question`:
  // the card asks, runs once allowed, its result goes back as a tool message (tool_call_id),
  // and the model answers in a new message; PNGs `shots`-asking.png and `shots`-result.png.
  void toolRoundTrip(const QString& ref, const QString& question, const QString& shots) {
    if (!forceToolCall(chats(), QStringLiteral("weather"), question, ref))
      QFAIL(qPrintable(QStringLiteral("the reply made no tool call; banner: ") +
                       app_->errors()->message()));
    const StoredMessage call = shown()->message(1);
    qInfo("the endpoint's model wrote \"%s\" and called %s", qPrintable(call.content),
          qPrintable(call.tool));
    QCOMPARE(toolOf(call).value("calls").toArray().size(), 1);
    const QJsonObject first = toolOf(call).value("calls").toArray()[0].toObject();
    QCOMPARE(first.value("name").toString(), QStringLiteral("weather"));
    QVERIFY(!first.value("id").toString().isEmpty());
    QVERIFY(QJsonDocument::fromJson(first.value("arguments").toString().toUtf8()).isObject());
    const int row = 2;
    QCOMPARE(toolOf(shown()->message(row)).value("name").toString(), QStringLiteral("weather"));
    QCOMPARE(toolOf(shown()->message(row)).value("id").toString(), first.value("id").toString());
    QCOMPARE(state(row), QStringLiteral("asking"));
    QTRY_VERIFY_WITH_TIMEOUT(
        findItem(window_->contentItem(), QStringLiteral("toolAllowOnce")) != nullptr, 5000);
    save(shots + QStringLiteral("-asking.png"));
    chats()->answerToolCall(row, QStringLiteral("once"));
    QTRY_COMPARE_WITH_TIMEOUT(state(row), QStringLiteral("done"), 30000);
    QVERIFY(shown()->message(row).content.contains(QStringLiteral("21 °C")));
    // The result went back to the endpoint's model, which answers in a new message.
    QTRY_VERIFY_WITH_TIMEOUT(shown()->count() == 4 && chats()->generatingCount() == 0, 180000);
    QVERIFY2(!app_->errors()->active(), qPrintable(app_->errors()->message()));
    QCOMPARE(shown()->message(3).role, QStringLiteral("assistant"));
    QVERIFY(shown()->message(3).finish_reason != QLatin1String("error"));
    QVERIFY(!shown()->message(3).content.trimmed().isEmpty());
    qInfo("the answer after the tool: %s", qPrintable(shown()->message(3).content));
    save(shots + QStringLiteral("-result.png"));
    const QList<StoredMessage> stored = app_->store().messages(chats()->currentChatId());
    QCOMPARE(stored.size(), 4);
    QCOMPARE(stored[1].finish_reason, QStringLiteral("tool_calls"));
    QCOMPARE(toolOf(stored[2]).value("state").toString(), QStringLiteral("done"));
  }

 private Q_SLOTS:
  void initTestCase() {
    QQuickStyle::setStyle(QStringLiteral("Fusion"));
    const QString model = defaultModel();
    if (model.isEmpty()) QSKIP("the default model is absent (bash packaging/setup.sh model)");
    if (!granule::structured_output_available())
      QSKIP("this build has no structured output (xgrammar): its server cannot force a call");
    if (!mcpSdkPresent())
      QSKIP("the official mcp Python package is missing: bash packaging/setup.sh pydeps");

    QVERIFY(
        server_.serve(model, 4096, 2, {QStringLiteral("--api-key"), QString::fromLatin1(kApiKey)}));
    modelId_ = QFileInfo(model).completeBaseName();
    const QString url = QStringLiteral("http://127.0.0.1:%1/v1").arg(server_.port);
    ref_ = url + QLatin1Char('#') + modelId_;
    // Without the key the server refuses: whatever works below sent it.
    const auto refused =
        granule::remote::OpenAiClient({url.toStdString(), ""}).list_models().fault.kind;
    QCOMPARE(refused, granule::remote::FaultKind::Unauthorized);

    // As main.cpp wires it: Models → Server reads the endpoints' keys on the engine thread.
    app_ = std::make_unique<Application>(
        remoteAwareEngineFactory(granuleEngineFactory(),
                                 [keys = keys_](const std::string& base_url) {
                                   return *keys ? (*keys)(base_url) : EndpointAccess{};
                                 }),
        dir_.filePath(QStringLiteral("granule.sqlite")));
    app_->setRemoteEngineFactory(remoteEngineFactory());
    *keys_ = app_->endpoints()->accessLookup();
    qml_ = std::make_unique<QQmlApplicationEngine>();
    QVERIFY((window_ = openMainWindow(*app_, *qml_)) != nullptr);

    McpController* mcp = app_->mcp();
    QVERIFY(mcp->available());
    QVERIFY(addMcpTestServer(mcp));

    // The endpoint with its key (no Secret Service here: kept for the session).
    EndpointsController* endpoints = app_->endpoints();
    endpoints->add(QStringLiteral("granule-box"), url, QString::fromLatin1(kApiKey));
    QTRY_VERIFY_WITH_TIMEOUT(endpoints->engineChoices().size() == 1, 30000);
    QCOMPARE(endpoints->engineChoices()[0].toMap()[QStringLiteral("ref")].toString(), ref_);
    // The local default model loads too: the model bar must name the chat's engine, not it.
    app_->start(model);
    QTRY_VERIFY_WITH_TIMEOUT(app_->model()->ready(), 120000);
  }

  void cleanupTestCase() {
    if (window_) window_->close();
    if (app_) app_->shutdown();
  }

  // The chat's JSON output with a schema on an endpoint chat: sent as response_format, the
  // server constrains the reply, which parses with the schema's fields.
  void jsonOutputOnAnEndpointChat() {
    chats()->newChat();
    chats()->setCurrentEngine(ref_);
    SamplingEditor* sampling = chats()->samplingEditor();
    sampling->setTemperature(0);
    sampling->setMaxTokens(160);
    QCOMPARE(
        sampling->setJsonSchema(R"({"type": "object", "properties": {"city": {"type": "string"}, )"
                                R"("sunny": {"type": "boolean"}}, "required": ["city", "sunny"]})"),
        QString());
    chats()->send(QStringLiteral("Is it sunny in Lisbon? Answer in JSON."));
    QTRY_VERIFY_WITH_TIMEOUT(shown()->count() == 2 && chats()->generatingCount() == 0, 180000);
    QVERIFY2(!app_->errors()->active(), qPrintable(app_->errors()->message()));
    const StoredMessage reply = shown()->message(1);
    qInfo("JSON output from the endpoint: %s (%s)", qPrintable(reply.content),
          qPrintable(reply.finish_reason));
    QJsonParseError error;
    const QJsonDocument doc = QJsonDocument::fromJson(reply.content.toUtf8(), &error);
    QVERIFY2(doc.isObject(), qPrintable(error.errorString() + ": " + reply.content));
    QVERIFY(doc.object().value("city").isString());
    QVERIFY(doc.object().value("sunny").isBool());
    // The model bar names the chat's engine, not the loaded model.
    QQuickItem* name = findItem(window_->contentItem(), QStringLiteral("modelName"));
    QVERIFY(name);
    QTRY_COMPARE_WITH_TIMEOUT(name->property("text").toString(),
                              QStringLiteral("granule-box · %1").arg(modelId_), 5000);
    QQuickItem* facts = findItem(window_->contentItem(), QStringLiteral("modelFacts"));
    QVERIFY(facts);
    QVERIFY2(facts->property("text").toString().startsWith(QStringLiteral("Granule  ·  http://")),
             qPrintable(facts->property("text").toString()));
    save(QStringLiteral("remote-json-output.png"));
  }

  // The Granule server constrains a forced call to its model's format and streams it as
  // tool_calls.
  void aToolCallRoundTripsThroughTheEndpoint() {
    toolRoundTrip(ref_, QStringLiteral("What is the weather in Paris?"),
                  QStringLiteral("remote-tool-card"));
  }

  // The same round trip against llama.cpp's llama-server (when built). SmolLM2's own template
  // has no tool calls, so llama-server finds no call format in it and offers no tools; it gets
  // tests/remote/data/chatml-json-tools.jinja (ChatML, a call as a bare JSON object), which its
  // --jinja parser recognises. A forced call ("required" there: it takes no named choice) is a
  // grammar that still lets the model write text before the call, and the 135M model writes
  // prose up to the token limit unless the question asks for JSON: then the first "{" starts
  // the call and the grammar holds it to the tool's schema.
  void aToolCallRoundTripsThroughLlamaServer() {
    const QString bin = llamaServerBinary();
    if (bin.isEmpty()) QSKIP("llama-server is not built (bash packaging/setup.sh llamaserver)");
    QProcess llama;
    llama.setProcessChannelMode(QProcess::ForwardedErrorChannel);
    const int port = freePort();
    llama.start(
        bin,
        {QStringLiteral("-m"), defaultModel(), QStringLiteral("--host"),
         QStringLiteral("127.0.0.1"), QStringLiteral("--port"), QString::number(port),
         QStringLiteral("-c"), QStringLiteral("4096"), QStringLiteral("-np"), QStringLiteral("2"),
         QStringLiteral("-t"), QStringLiteral("2"), QStringLiteral("--metrics"),
         QStringLiteral("--no-webui"), QStringLiteral("--alias"), QStringLiteral("SmolLM2-135M"),
         QStringLiteral("--jinja"), QStringLiteral("--chat-template-file"),
         QStringLiteral(GRANULE_SOURCE_DIR "/tests/remote/data/chatml-json-tools.jinja")});
    QVERIFY(llama.waitForStarted(10000));
    const auto stop = qScopeGuard([&] {
      llama.terminate();
      if (!llama.waitForFinished(10000)) llama.kill();
    });
    QVERIFY(waitHealthy(QStringLiteral("http://127.0.0.1:%1/health").arg(port), 120000));
    EndpointsController* endpoints = app_->endpoints();
    const QString url = QStringLiteral("http://127.0.0.1:%1/v1").arg(port);
    const QString id = endpoints->add(QStringLiteral("llama-box"), url, {});
    const QString ref = url + QStringLiteral("#SmolLM2-135M");
    QTRY_VERIFY_WITH_TIMEOUT(
        endpoints->engineLabel(ref) == QStringLiteral("llama-box · SmolLM2-135M") &&
            endpoints->engineChoices().size() == 2,
        30000);
    toolRoundTrip(ref,
                  QStringLiteral("What is the weather in Paris? Reply with only a JSON object."),
                  QStringLiteral("remote-llama-server-tool-card"));
    // Streaming, stop and regenerate in the window on llama-server: the stopped answer keeps
    // what arrived, marked cancelled; Regenerate answers as version 2 beside it.
    const qint64 chat = chats()->newChat();
    chats()->setCurrentEngine(ref);
    chats()->samplingEditor()->setTemperature(0);
    chats()->samplingEditor()->setMaxTokens(400);
    chats()->send(QStringLiteral("Write a long story about a lighthouse keeper."));
    QTRY_VERIFY_WITH_TIMEOUT(shown()->count() == 2 && shown()->message(1).content.size() > 40,
                             60000);
    QVERIFY(chats()->generatingCount() == 1);
    chats()->stop();
    QTRY_VERIFY_WITH_TIMEOUT(chats()->generatingCount() == 0, 30000);
    QVERIFY2(!app_->errors()->active(), qPrintable(app_->errors()->message()));
    const StoredMessage stopped = app_->store().messages(chat).last();
    qInfo("stopped after %lld characters", static_cast<long long>(stopped.content.size()));
    QCOMPARE(stopped.finish_reason, QStringLiteral("cancelled"));
    QVERIFY(stopped.content.size() > 40);
    chats()->samplingEditor()->setMaxTokens(48);
    chats()->regenerate(1);
    QTRY_VERIFY_WITH_TIMEOUT(chats()->generatingCount() == 0, 120000);
    QVERIFY2(!app_->errors()->active(), qPrintable(app_->errors()->message()));
    const QList<StoredMessage> after = app_->store().messages(chat);
    QCOMPARE(after.size(), 2);
    QCOMPARE(after.last().version, 2);
    QCOMPARE(after.last().version_count, 2);
    QVERIFY(after.last().content.size() > 10);
    QCOMPARE(app_->store().versionsOf(after.last().id).size(), 2);
    chats()->newChat();
    chats()->setCurrentEngine({});
    endpoints->remove(id);
  }

  // The Server panel draws the Granule server's batching counters: two chats of this window on
  // the endpoint decode in the same server steps, and the panel's mean batch and share of
  // batched steps say so (figures, not "unavailable").
  void theServerPanelDrawsTheBatchingCounters() {
    const qint64 first = chats()->newChat();
    chats()->setCurrentEngine(ref_);
    chats()->samplingEditor()->setMaxTokens(300);
    chats()->send(QStringLiteral("Write a long story about a cat."));
    const qint64 second = chats()->newChat();
    QVERIFY(second != first);
    chats()->setCurrentEngine(ref_);
    chats()->samplingEditor()->setMaxTokens(300);
    chats()->send(QStringLiteral("Write a long story about a dog."));
    QTRY_VERIFY_WITH_TIMEOUT(chats()->generatingCount() == 2, 10000);
    // A scrape over an interval where both decoded (the panel polls once a second).
    const auto batch = [this] {
      return app_->telemetry()->latest().remote.value(QStringLiteral("meanDecodeBatch")).toDouble();
    };
    QTRY_VERIFY_WITH_TIMEOUT(batch() > 1.5 || chats()->generatingCount() < 2, 60000);
    const QVariantMap remote = app_->telemetry()->latest().remote;
    qInfo("Server panel: mean decode batch %.2f, batched steps %.0f %%", batch(),
          remote.value(QStringLiteral("batchedStepFraction")).toDouble() * 100);
    QVERIFY2(batch() > 1.5, "the two chats never decoded in the same steps");
    QVERIFY(remote.value(QStringLiteral("batchedStepFraction")).toDouble() > 0.5);
    QQuickItem* row = nullptr;
    QTRY_VERIFY_WITH_TIMEOUT(
        (row = findItem(window_->contentItem(), QStringLiteral("remoteMeanBatch"))) != nullptr,
        10000);
    QVERIFY2(row->property("value").toString().endsWith(QStringLiteral("sequences")),
             qPrintable(row->property("value").toString()));
    QQuickItem* batched = findItem(window_->contentItem(), QStringLiteral("remoteBatchedSteps"));
    QVERIFY(batched);
    QVERIFY2(batched->property("value").toString().endsWith(QStringLiteral("%")),
             qPrintable(batched->property("value").toString()));
    save(QStringLiteral("remote-server-panel-batching.png"));
    QTRY_VERIFY_WITH_TIMEOUT(chats()->generatingCount() == 0, 180000);
  }

  // A reasoning model's stream as vLLM sends it, from canned_server.py (the tiny model
  // cannot reason or call twice): its reasoning_content in the Thinking block, its two calls,
  // streamed in interleaved fragments, as two cards.
  void aReasoningModelsThinkingAndParallelCallsInTheWindow() {
    Child canned;
    QVERIFY(
        canned.start(QStringLiteral("python3"),
                     {QStringLiteral(GRANULE_SOURCE_DIR "/tests/remote/canned_server.py"),
                      QStringLiteral("--sse"),
                      QStringLiteral(GRANULE_SOURCE_DIR "/tests/remote/data/tool_calls_stream.sse"),
                      QStringLiteral("--model"), QStringLiteral("Qwen/Qwen3-8B"),
                      QStringLiteral("--idle"), QStringLiteral("120")}));
    EndpointsController* endpoints = app_->endpoints();
    endpoints->add(QStringLiteral("vllm-box"),
                   QStringLiteral("http://127.0.0.1:%1/v1").arg(canned.port), {});
    QTRY_VERIFY_WITH_TIMEOUT(endpoints->engineChoices().size() == 2, 30000);
    chats()->newChat();
    chats()->setCurrentEngine(
        QStringLiteral("http://127.0.0.1:%1/v1#Qwen/Qwen3-8B").arg(canned.port));
    chats()->send(QStringLiteral("Weather in Paris and Oslo?"));
    QTRY_VERIFY_WITH_TIMEOUT(shown()->count() == 4 && chats()->generatingCount() == 0, 30000);
    const StoredMessage reply = shown()->message(1);
    QCOMPARE(reply.reasoning, QStringLiteral("The user wants two cities."));
    QCOMPARE(reply.finish_reason, QStringLiteral("tool_calls"));
    QCOMPARE(toolOf(reply).value("calls").toArray().size(), 2);
    QCOMPARE(toolOf(shown()->message(2)).value("arguments").toString(),
             QStringLiteral(R"({"city": "Paris"})"));
    QCOMPARE(toolOf(shown()->message(3)).value("id").toString(), QStringLiteral("call_def"));
    QCOMPARE(state(2), QStringLiteral("asking"));
    QCOMPARE(state(3), QStringLiteral("asking"));
    QQuickItem* name = findItem(window_->contentItem(), QStringLiteral("modelName"));
    QVERIFY(name);
    QTRY_COMPARE_WITH_TIMEOUT(name->property("text").toString(),
                              QStringLiteral("vllm-box · Qwen/Qwen3-8B"), 5000);
    save(QStringLiteral("remote-reasoning-parallel-calls.png"));
    // Left unanswered: the canned server would answer the results with the same calls.
    chats()->newChat();
  }

  // Models → Server: the window's engine opened on "URL#model" lists the server's models
  // with the key of the endpoint at that URL (the server refuses without it).
  void modelsServerOpensTheEndpointWithItsKey() {
    app_->model()->load(ref_);
    QTRY_VERIFY_WITH_TIMEOUT(app_->model()->ready() && app_->model()->modelPath() == ref_, 60000);
    QVERIFY2(!app_->errors()->active(), qPrintable(app_->errors()->message()));
    QCOMPARE(app_->model()->modelName(), modelId_);
    // The URL without its /v1 finds the same endpoint.
    QCOMPARE((*keys_)("http://127.0.0.1:" + std::to_string(server_.port)).api_key,
             QString::fromLatin1(kApiKey));
    QCOMPARE((*keys_)("http://127.0.0.1:1/v1").api_key, QString());
  }
};

int main(int argc, char** argv) {
  // Each function generates one or two replies with the real model on the CPU.
  if (!qEnvironmentVariableIsSet("QTEST_FUNCTION_TIMEOUT"))
    qputenv("QTEST_FUNCTION_TIMEOUT", "900000");
  QGuiApplication app(argc, argv);
  RemoteToolsTest test;
  return QTest::qExec(&test, argc, argv);
}
#include "app_remote_tools_test.moc"
