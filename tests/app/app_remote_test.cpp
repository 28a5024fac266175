// The window's worker on a remote engine (RemoteInferenceEngine): a chat against
// `granule-cli serve` on loopback — streaming, stop, a stream cut by fault_proxy.py with the
// partial answer kept and the turn failed in one line, an unreachable endpoint, and the
// server's /metrics read into the panels' values; reasoning and split tool calls from a canned
// vLLM-style stream (canned_server.py). Skips without the default model.
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QScopeGuard>
#include <QTcpServer>

#include "remote_inference_engine.h"
#include "remote_test_support.h"

using namespace granule::app;
using namespace granule::app::test;

class RemoteTest : public QObject {
  Q_OBJECT

 private:
  QString model_;
  Child server_;
  QString modelId_;

  QString ref(int port) const {
    return QStringLiteral("http://127.0.0.1:%1/v1#%2").arg(port).arg(modelId_);
  }

 private Q_SLOTS:
  void initTestCase() {
    model_ = defaultModel();
    if (model_.isEmpty()) QSKIP("the default model is absent (bash packaging/setup.sh model)");
    QVERIFY(server_.serve(model_, 1024, 4));
    modelId_ = QFileInfo(model_).completeBaseName();
  }

  void parsesModelRefs() {
    const auto r = parseRemoteModelRef("http://h:8000/v1#org/model");
    QVERIFY(r.has_value());
    QCOMPARE(QString::fromStdString(r->base_url), QStringLiteral("http://h:8000/v1"));
    QCOMPARE(QString::fromStdString(r->model), QStringLiteral("org/model"));
    QVERIFY(!parseRemoteModelRef("/models/a.gguf").has_value());
    QVERIFY(!parseRemoteModelRef("http://h:8000/v1").has_value());
  }

  void chatStreamsTwoTurnsWithTheServersTokenCounts() {
    ThreadedWorker w(remoteAwareEngineFactory({}, {}));
    ModelInfo info;
    QCOMPARE(w.load(ref(server_.port), &info), QString());
    QCOMPARE(info.name, modelId_);
    QVERIFY(info.device.startsWith(QStringLiteral("Granule at http://127.0.0.1:")));
    w.call([wk = w.worker] { wk->submit(turn(1, QStringLiteral("Say hello."), 24)); });
    QTRY_VERIFY_WITH_TIMEOUT(finishedChat(w.finished, 1), 60000);
    const GenerationResult first = resultOf(w.finished, 1);
    QVERIFY2(first.end == GenerationEnd::Finished, qPrintable(first.error));
    const QString answer = textOf(w.tokens, 1);
    QVERIFY2(answer.size() > 5, qPrintable(answer));
    QVERIFY(first.prompt_tokens > 0);
    // The second turn sends the first unchanged: the server serves its prefix from kept KV.
    GenerationRequest second = turn(2, QStringLiteral("Say hello."), 16);
    second.messages.append({QStringLiteral("assistant"), answer});
    second.messages.append({QStringLiteral("user"), QStringLiteral("And again.")});
    w.call([wk = w.worker, second] { wk->submit(second); });
    QTRY_VERIFY_WITH_TIMEOUT(finishedChat(w.finished, 2), 60000);
    const GenerationResult r2 = resultOf(w.finished, 2);
    QVERIFY(r2.end == GenerationEnd::Finished);
    // The context meter's count is the server's (usage): the longer conversation, the more.
    // (That the server's cache serves the repeated prefix is checked by tests/remote.)
    QVERIFY2(
        r2.prompt_tokens > first.prompt_tokens,
        qPrintable(QStringLiteral("%1 then %2").arg(first.prompt_tokens).arg(r2.prompt_tokens)));
  }

  void stopEndsTheReplyAndKeepsItsText() {
    ThreadedWorker w(remoteAwareEngineFactory({}, {}));
    QCOMPARE(w.load(ref(server_.port)), QString());
    w.call([wk = w.worker] {
      wk->submit(turn(3, QStringLiteral("Write a long story about a cat."), 400));
    });
    QTRY_VERIFY_WITH_TIMEOUT(!textOf(w.tokens, 3).isEmpty(), 60000);
    w.call([wk = w.worker] { wk->cancel(3); });
    QTRY_VERIFY_WITH_TIMEOUT(finishedChat(w.finished, 3), 30000);
    const GenerationResult r = resultOf(w.finished, 3);
    QCOMPARE(r.reason, QStringLiteral("cancelled"));
    QVERIFY(!textOf(w.tokens, 3).isEmpty());
  }

  void aCutStreamFailsInOneLineWithThePartialAnswerKept() {
    Child proxy;
    QVERIFY(proxy.start(
        QStringLiteral("python3"),
        {QStringLiteral(GRANULE_FAULT_PROXY), QStringLiteral("127.0.0.1:%1").arg(server_.port),
         QStringLiteral("--idle"), QStringLiteral("60")}));
    ThreadedWorker w(remoteAwareEngineFactory({}, {}));
    QCOMPARE(w.load(ref(proxy.port)), QString());  // its /v1/models passes
    const std::string url = "http://127.0.0.1:" + std::to_string(proxy.port) + "/__fault/drop:700";
    QProcess curl;
    curl.start(QStringLiteral("curl"),
               {QStringLiteral("-s"), QStringLiteral("-XPOST"), QString::fromStdString(url)});
    QVERIFY(curl.waitForFinished(10000));
    w.call([wk = w.worker] { wk->submit(turn(4, QStringLiteral("Say hello."), 48)); });
    QTRY_VERIFY_WITH_TIMEOUT(finishedChat(w.finished, 4), 60000);
    const GenerationResult r = resultOf(w.finished, 4);
    QVERIFY(r.end == GenerationEnd::Failed);
    QVERIFY2(r.error.contains(QStringLiteral("the answer is cut where it stopped")),
             qPrintable(r.error));
    QVERIFY2(!r.error.contains(QLatin1Char('\n')), qPrintable(r.error));
    QVERIFY(!textOf(w.tokens, 4).isEmpty());
  }

  void anUnreachableEndpointFailsToLoadInOneLine() {
    ThreadedWorker w(remoteAwareEngineFactory({}, {}));
    const QString error = w.load(QStringLiteral("http://127.0.0.1:1/v1#m"));
    QVERIFY2(error.contains(QStringLiteral("cannot reach http://127.0.0.1:1/v1/models")),
             qPrintable(error));
    QVERIFY(!error.contains(QLatin1Char('\n')));
  }

  // What the tiny model cannot show, from a canned vLLM-style stream (canned_server.py with
  // tests/remote/data/tool_calls_stream.sse): reasoning_content deltas become the chat's
  // reasoning (the Thinking block), and two parallel calls streamed in interleaved fragments
  // reach the window as two whole calls with the server's ids; the request carried the tools
  // and the forced choice.
  void reasoningAndSplitToolCallsFromAStreamedServer() {
    Child canned;
    QVERIFY(canned.start(
        QStringLiteral("python3"),
        {QStringLiteral(GRANULE_REMOTE_TESTS_DIR "/canned_server.py"), QStringLiteral("--sse"),
         QStringLiteral(GRANULE_REMOTE_TESTS_DIR "/data/tool_calls_stream.sse"),
         QStringLiteral("--model"), QStringLiteral("reasoner"), QStringLiteral("--idle"),
         QStringLiteral("60")}));
    ThreadedWorker w({}, remoteEngineFactory());
    GenerationRequest r = turn(5, QStringLiteral("Weather in Paris and Oslo?"), 64);
    r.engine = QStringLiteral("http://127.0.0.1:%1/v1#reasoner").arg(canned.port);
    r.tools_json = QStringLiteral(
        R"([{"type":"function","function":{"name":"weather","parameters":{"type":"object",)"
        R"("properties":{"city":{"type":"string"}},"required":["city"]}}}])");
    r.tool_choice = QStringLiteral("required");
    w.call([wk = w.worker, r] { wk->submit(r); });
    QTRY_VERIFY_WITH_TIMEOUT(finishedChat(w.finished, 5), 30000);
    const GenerationResult result = resultOf(w.finished, 5);
    QVERIFY2(result.end == GenerationEnd::Finished, qPrintable(result.error));
    QCOMPARE(result.prompt_tokens, 120);  // the server's usage
    QString reasoning;
    QList<ToolCallText> calls;
    for (const QList<QVariant>& args : w.tokens)
      for (const TokenChunk& c : args[0].value<QList<TokenChunk>>()) {
        reasoning += c.reasoning;
        calls.append(c.tool_calls);
      }
    QCOMPARE(reasoning, QStringLiteral("The user wants two cities."));
    QCOMPARE(textOf(w.tokens, 5).trimmed(), QString());
    QCOMPARE(calls.size(), 2);
    QCOMPARE(calls[0].id, QStringLiteral("call_abc"));
    QCOMPARE(calls[0].name, QStringLiteral("weather"));
    QCOMPARE(calls[0].arguments, QStringLiteral(R"({"city": "Paris"})"));
    QCOMPARE(calls[1].id, QStringLiteral("call_def"));
    QCOMPARE(calls[1].arguments, QStringLiteral(R"({"city": "Oslo"})"));
    // What was sent: the tools, the forced choice (one call), the sampling of a vLLM server.
    QProcess curl;
    curl.start(QStringLiteral("curl"),
               {QStringLiteral("-s"),
                QStringLiteral("http://127.0.0.1:%1/__last_request").arg(canned.port)});
    QVERIFY(curl.waitForFinished(10000));
    const QJsonObject sent = QJsonDocument::fromJson(curl.readAllStandardOutput()).object();
    QCOMPARE(sent.value("tools").toArray().size(), 1);
    QCOMPARE(sent.value("tool_choice").toString(), QStringLiteral("required"));
    QCOMPARE(sent.value("parallel_tool_calls").toBool(true), false);
    QCOMPARE(sent.value("top_k").toInt(), 1);
    QVERIFY(!sent.contains("response_format"));
  }

  // JSON output against a real third-party server: llama.cpp's llama-server (built by
  // `setup.sh llamaserver`) turns response_format's schema into its grammar; the reply parses
  // with the schema's fields. (Its tool calls need a template with a tool format, which the
  // default model's has not: llama-server answers a forced call with free text there.)
  void jsonOutputFromLlamaServer() {
    QString home = qEnvironmentVariable("XDG_DATA_HOME");
    if (home.isEmpty()) home = QDir::homePath() + QStringLiteral("/.local/share");
    const QString bin = home + QStringLiteral("/granule/third_party/llama-server/bin/llama-server");
    if (!QFile::exists(bin))
      QSKIP("llama-server is not built (bash packaging/setup.sh llamaserver)");
    const int port = [] {
      QTcpServer s;
      s.listen(QHostAddress::LocalHost, 0);
      return static_cast<int>(s.serverPort());
    }();
    QProcess server;
    server.setProcessChannelMode(QProcess::ForwardedErrorChannel);
    server.start(
        bin, {QStringLiteral("-m"), model_, QStringLiteral("--host"), QStringLiteral("127.0.0.1"),
              QStringLiteral("--port"), QString::number(port), QStringLiteral("-c"),
              QStringLiteral("1024"), QStringLiteral("-np"), QStringLiteral("1"),
              QStringLiteral("-t"), QStringLiteral("2"), QStringLiteral("--no-webui"),
              QStringLiteral("--alias"), QStringLiteral("SmolLM2-135M")});
    QVERIFY(server.waitForStarted(10000));
    const auto stop = qScopeGuard([&server] {
      server.terminate();
      if (!server.waitForFinished(10000)) server.kill();
    });
    ThreadedWorker w({}, remoteEngineFactory());
    GenerationRequest r = turn(6, QStringLiteral("Is it sunny in Lisbon? Answer in JSON."), 80);
    r.engine = QStringLiteral("http://127.0.0.1:%1/v1#SmolLM2-135M").arg(port);
    r.sampling.json_output = QStringLiteral("schema");
    r.sampling.json_schema =
        QStringLiteral(R"({"type": "object", "properties": {"city": {"type": "string"}, )"
                       R"("sunny": {"type": "boolean"}}, "required": ["city", "sunny"]})");
    // Until its model is loaded the server answers 503: the engine opens once it lists it.
    QElapsedTimer t;
    t.start();
    GenerationResult result;
    while (t.elapsed() < 120000) {
      w.finished.clear();
      w.tokens.clear();
      w.call([wk = w.worker, r] { wk->submit(r); });
      QTRY_VERIFY_WITH_TIMEOUT(finishedChat(w.finished, 6), 120000);
      result = resultOf(w.finished, 6);
      if (result.end == GenerationEnd::Finished ||
          !result.error.contains(QStringLiteral("503")) &&
              !result.error.contains(QStringLiteral("cannot reach")))
        break;
      QTest::qWait(500);
    }
    QVERIFY2(result.end == GenerationEnd::Finished, qPrintable(result.error));
    const QString reply = textOf(w.tokens, 6);
    qInfo("llama-server's JSON output: %s", qPrintable(reply));
    QJsonParseError error;
    const QJsonDocument doc = QJsonDocument::fromJson(reply.toUtf8(), &error);
    QVERIFY2(doc.isObject(), qPrintable(error.errorString() + ": " + reply));
    QVERIFY(doc.object().value("city").isString());
    QVERIFY(doc.object().value("sunny").isBool());
  }

  void metricsOfAGranuleServer() {
    const auto r = parseRemoteModelRef(ref(server_.port).toStdString());
    RemoteInferenceEngine engine(*r, "");
    QTRY_VERIFY_WITH_TIMEOUT(
        engine.metricsView().dialect == granule::remote::MetricsDialect::Granule, 5000);
    const RemoteMetricsView v = engine.metricsView();
    QVERIFY(v.metrics.requests_running.has_value());
    QVERIFY(v.metrics.generation_tokens_total.has_value());
    QVERIFY(!v.metrics.kv_usage_fraction.has_value());  // unavailable, not 0
    QVERIFY(v.error.empty());
  }
};

QTEST_GUILESS_MAIN(RemoteTest)
#include "app_remote_test.moc"
