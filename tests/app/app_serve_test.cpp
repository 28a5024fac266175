// QtTest for the window's OpenAI server: the Application serving from the engine its worker
// runs, on an ephemeral loopback port, with the real engine on a synthetic model on the CPU.
// Covers: an HTTP completion answered correctly while a window chat generates, both in the
// same engine steps; the request listed (sidebar model, KV rows) while it runs and gone
// after; switching off closes the port and frees the request's KV; quitting mid-request
// neither hangs nor crashes; a port in use is one line in the window, which keeps working;
// the API key; the settings' persistence and defaults; an engine that cannot serve.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <QElapsedTimer>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QTemporaryDir>
#include <QUrl>
#include <QtTest>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <future>
#include <map>
#include <thread>

#include "application.h"
#include "fake_inference_engine.h"
#include "granule/chat_template.h"
#include "granule/testkit/synthetic_model.h"
#include "openai_request.h"

using namespace granule::app;

namespace {

// What the paced engine saw, step by step.
struct StepLog {
  std::atomic<int> steps{0};
  // Steps in which two or more sequences each decoded one token: they shared the step.
  std::atomic<int> shared_decode_steps{0};
  std::atomic<int> max_decoded_together{0};
};

// The real engine, each step preceded by a short sleep so that the worker's ~10 Hz telemetry
// frames catch a tiny model's requests while they run; every call goes to the real engine.
class PacedEngine final : public InferenceEngine {
 public:
  PacedEngine(std::unique_ptr<InferenceEngine> inner, int step_ms, StepLog* log)
      : inner_(std::move(inner)), step_ms_(step_ms), log_(log) {}
  ModelInfo info() const override { return inner_->info(); }
  granule::SequenceId submit(granule::Request r) override { return inner_->submit(std::move(r)); }
  void cancel(granule::SequenceId id) override { inner_->cancel(id); }
  bool step() override {
    std::this_thread::sleep_for(std::chrono::milliseconds(step_ms_));
    std::map<int64_t, int64_t> before;
    for (const granule::SequenceTelemetry& s : inner_->telemetry().sequences)
      if (!s.waiting) before[s.id] = s.tokens;
    const bool more = inner_->step();
    int decoded = 0;
    for (const granule::SequenceTelemetry& s : inner_->telemetry().sequences) {
      const auto it = before.find(s.id);
      if (it != before.end() && s.tokens == it->second + 1) ++decoded;
    }
    if (log_) {
      ++log_->steps;
      if (decoded >= 2) ++log_->shared_decode_steps;
      if (decoded > log_->max_decoded_together) log_->max_decoded_together = decoded;
    }
    return more;
  }
  bool idle() const override { return inner_->idle(); }
  granule::TelemetrySnapshot telemetry() const override { return inner_->telemetry(); }
  std::string device_lost_reason() const override { return inner_->device_lost_reason(); }
  void set_vram_budget(uint64_t bytes) override { inner_->set_vram_budget(bytes); }
  void prepare_continuation(granule::Request& request, const std::string& partial) const override {
    inner_->prepare_continuation(request, partial);
  }
  granule::Engine* granuleEngine() override { return inner_->granuleEngine(); }

 private:
  std::unique_ptr<InferenceEngine> inner_;
  int step_ms_;
  StepLog* log_;
};

EngineFactory pacedFactory(int step_ms, StepLog* log = nullptr) {
  return [step_ms, log](const std::filesystem::path& model, const granule::EngineOptions& options,
                        const std::function<void(double, const QString&)>& stage) {
    return std::unique_ptr<InferenceEngine>(
        new PacedEngine(granuleEngineFactory()(model, options, stage), step_ms, log));
  };
}

QString tinyModel(const QTemporaryDir& dir) {
  const QString path = dir.filePath(QStringLiteral("tiny.gguf"));
  granule::write_synthetic_model(granule::SyntheticModelSpec::preset("tiny"), path.toStdString());
  return path;
}

struct HttpReply {
  int status = 0;   // 0: no reply
  int error = 0;    // errno of a failed connect or read
  QByteArray body;  // the body as sent (chunked bodies are not decoded)
  QJsonObject json() const { return QJsonDocument::fromJson(body).object(); }
};

// One HTTP/1.1 exchange on a fresh loopback connection (Connection: close), blocking; run it
// with std::async so the test's event loop keeps turning.
HttpReply http(int port, const QByteArray& method, const QByteArray& path,
               const QByteArray& body = {}, const QByteArray& api_key = {}) {
  HttpReply reply;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  timeval timeout{120, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    reply.error = errno;
    close(fd);
    return reply;
  }
  QByteArray request = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  if (!api_key.isEmpty()) request += "Authorization: Bearer " + api_key + "\r\n";
  if (!body.isEmpty())
    request +=
        "Content-Type: application/json\r\nContent-Length: " + QByteArray::number(body.size()) +
        "\r\n";
  request += "Connection: close\r\n\r\n" + body;
  ::send(fd, request.constData(), static_cast<size_t>(request.size()), MSG_NOSIGNAL);
  QByteArray response;
  char buffer[4096];
  for (;;) {
    const ssize_t n = recv(fd, buffer, sizeof buffer, 0);
    if (n < 0) reply.error = errno;
    if (n <= 0) break;
    response.append(buffer, n);
  }
  close(fd);
  const qsizetype head_end = response.indexOf("\r\n\r\n");
  if (response.startsWith("HTTP/1.1 ") && head_end > 0) {
    reply.status = response.mid(9, 3).toInt();
    reply.body = response.mid(head_end + 4);
  }
  return reply;
}

QByteArray chatBody(const QString& user, int max_tokens, bool stream = false) {
  QJsonObject body{{"model", "tiny"},
                   {"messages", QJsonArray{QJsonObject{{"role", "user"}, {"content", user}}}},
                   {"temperature", 0},
                   {"max_tokens", max_tokens},
                   {"ignore_eos", true},
                   {"seed", 1},
                   {"stream", stream}};
  return QJsonDocument(body).toJson(QJsonDocument::Compact);
}

// The reply the engine gives `body` alone (a one-slot engine of its own, the request as the
// server builds it): what the server must answer while it shares the window's steps.
QString referenceReply(const QString& model, const QByteArray& body, int64_t& prompt_tokens) {
  using namespace granule;
  EngineOptions options;
  options.device = DeviceKind::Cpu;
  options.max_sequences = 1;
  options.prefill_chunk_tokens = 64;
  auto engine = Engine::open(model.toStdString(), options);
  server::ParsedRequest parsed =
      server::parse_request(server::Endpoint::ChatCompletions, body.toStdString(), {});
  Request request;
  request.messages = parsed.messages;
  request.sampling = parsed.sampling;
  for (const std::string& stop : engine->chat_template()->stop_strings())
    request.sampling.stop_strings.push_back(stop);
  std::string text;
  request.sink.on_token = [&text](SequenceId, const std::string& piece, int32_t) { text += piece; };
  request.sink.on_prompt = [&prompt_tokens](SequenceId, const PromptInfo& info) {
    prompt_tokens = info.prompt_tokens;
  };
  engine->submit(std::move(request));
  while (engine->step()) {
  }
  return QString::fromStdString(text);
}

// The port the window serves on, once it does.
int servingPort(Application& app) {
  ApiServerController* server = app.server();
  if (!QTest::qWaitFor(
          [server] {
            return server->state() != ApiServerController::State::Starting &&
                   server->state() != ApiServerController::State::Waiting;
          },
          30000))
    return -1;
  if (server->state() != ApiServerController::State::Serving) return -1;
  return QUrl(server->url()).port();
}

// An Application serving on an ephemeral loopback port with the tiny model loaded.
struct ServingApp {
  explicit ServingApp(int step_ms, StepLog* log = nullptr)
      : model(tinyModel(dir)), app(pacedFactory(step_ms, log), dir.filePath("granule.sqlite")) {
    app.server()->setPort(0);
    app.server()->setEnabled(true);
    app.start(model);
    port = servingPort(app);
  }
  // POSTs a chat completion on another thread (the GUI thread must run for the engine).
  std::future<HttpReply> postChat(const QByteArray& body, const QByteArray& api_key = {}) const {
    return std::async(std::launch::async, http, port, "POST", "/v1/chat/completions", body,
                      api_key);
  }
  QTemporaryDir dir;
  QString model;
  Application app;
  int port = -1;
};

bool running(const std::future<HttpReply>& reply) {
  return reply.wait_for(std::chrono::seconds(0)) != std::future_status::ready;
}

}  // namespace

class ServeTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void initTestCase() { registerWorkerTypes(); }

  // (a) While a window chat generates, an HTTP chat completion gets the answer the engine
  // gives that request alone, and the two decode in the same engine steps.
  void apiRequestAndWindowChatDecodeInTheSameSteps() {
    StepLog log;
    ServingApp s(10, &log);
    QVERIFY2(s.port > 0, qPrintable(s.app.server()->statusText()));
    const QByteArray body = chatBody(QStringLiteral("Tell me about the KV cache."), 40);
    int64_t reference_prompt = 0;
    const QString expected = referenceReply(s.model, body, reference_prompt);
    QVERIFY(!expected.isEmpty());

    ChatController* chats = s.app.chats();
    const qint64 chat = chats->newChat();
    // Greedy, so the chat's length does not depend on a draw (it must outlast the request).
    chats->samplingEditor()->setTemperature(0);
    chats->samplingEditor()->setMaxTokens(2000);
    chats->send(QStringLiteral("Write a long story."));
    QTRY_VERIFY_WITH_TIMEOUT(chats->messagesOf(chat)->message(1).content.size() > 0, 20000);
    auto reply = s.postChat(body);
    // Both in one frame: the engine runs two sequences, one the chat's, one the request's.
    bool seen_together = false;
    QElapsedTimer timer;
    timer.start();
    while (running(reply) && timer.elapsed() < 60000) {
      const TelemetryFrame& f = s.app.telemetry()->latest();
      if (f.chats.size() == 1 && f.api_requests.size() == 1 && f.engine.scheduler.running == 2 &&
          f.api_requests[0].completion_tokens > 0)
        seen_together = true;
      QTest::qWait(20);
    }
    QVERIFY(chats->generatingCount() == 1);  // the chat is still going
    const HttpReply r = reply.get();
    QCOMPARE(r.status, 200);
    const QJsonObject json = r.json();
    const QJsonObject choice = json["choices"].toArray().at(0).toObject();
    QCOMPARE(choice["message"].toObject()["content"].toString(), expected);
    QCOMPARE(json["usage"].toObject()["prompt_tokens"].toInteger(),
             static_cast<qint64>(reference_prompt));
    QVERIFY(json["id"].toString().startsWith(QStringLiteral("chatcmpl-")));
    QCOMPARE(json["model"].toString(), QStringLiteral("tiny"));
    QVERIFY(seen_together);
    // Steps in which the chat and the request each decoded a token: one per token of the
    // request's, give or take the first and the last (prefill, finish).
    const int tokens = json["usage"].toObject()["completion_tokens"].toInt();
    qInfo("%d tokens over HTTP; %d of %d steps decoded two sequences", tokens,
          log.shared_decode_steps.load(), log.steps.load());
    QCOMPARE(log.max_decoded_together.load(), 2);
    QVERIFY2(log.shared_decode_steps.load() >= tokens - 2,
             qPrintable(QString("%1 shared steps").arg(log.shared_decode_steps.load())));
    chats->stop();
    s.app.shutdown();
  }

  // (b) The request is listed — in the sidebar's model and in the KV rows, with its KV —
  // while it runs, and leaves both when it is answered.
  void apiRequestIsListedWhileRunningAndLeavesAfter() {
    ServingApp s(15);
    QVERIFY2(s.port > 0, qPrintable(s.app.server()->statusText()));
    auto reply = s.postChat(chatBody(QStringLiteral("Count to fifty."), 60, true));
    ApiRequestListModel* list = s.app.server()->requests();
    QTRY_VERIFY_WITH_TIMEOUT(list->count() == 1 && list->rows()[0].completion_tokens > 2, 30000);
    const ApiRequestTelemetry row = list->rows()[0];
    QVERIFY(row.request_id.startsWith(QStringLiteral("chatcmpl-")));
    QCOMPARE(row.endpoint, QStringLiteral("chat"));
    QVERIFY(row.stream);
    QVERIFY(row.prompt_tokens > 0);
    QCOMPARE(row.state, QStringLiteral("generating"));
    QVERIFY(row.sequence.kv_committed_bytes > 0);
    QVERIFY(row.sequence.tokens >= row.prompt_tokens + row.completion_tokens - 1);
    QCOMPARE(s.app.server()->runningRequests(), 1);
    QVERIFY2(s.app.server()->statusText().endsWith(QStringLiteral("— 1 request running")),
             qPrintable(s.app.server()->statusText()));
    QCOMPARE(list->data(list->index(0), ApiRequestListModel::RequestIdRole).toString(),
             row.request_id);
    // The KV panel's rows: no chat, one API row with the request's KV.
    TelemetryModel* kv = s.app.telemetry();
    QTRY_COMPARE_WITH_TIMEOUT(kv->rowCount(), 1, 5000);
    QCOMPARE(kv->data(kv->index(0), TelemetryModel::ApiRole).toBool(), true);
    QCOMPARE(kv->data(kv->index(0), TelemetryModel::TitleRole).toString(), row.request_id);
    QVERIFY(kv->data(kv->index(0), TelemetryModel::SequenceRole)
                .toMap()["kvCommittedBytes"]
                .toDouble() > 0);
    QVERIFY(reply.wait_for(std::chrono::seconds(60)) == std::future_status::ready);
    const HttpReply r = reply.get();
    QCOMPARE(r.status, 200);
    QVERIFY(r.body.contains("data: [DONE]"));
    QTRY_COMPARE_WITH_TIMEOUT(list->count(), 0, 5000);
    QTRY_COMPARE_WITH_TIMEOUT(kv->rowCount(), 0, 5000);
    // The panels' token count includes the API's: 60 generated, no chat ran.
    QTRY_COMPARE_WITH_TIMEOUT(kv->latest().generated_tokens, quint64{60}, 5000);
    QVERIFY(s.app.server()->statusText().endsWith(QStringLiteral("— idle")));
    s.app.shutdown();
  }

  // (c) Switching the server off answers the request in flight with an error, frees its KV
  // and closes the port; on again, it serves.
  void servingOffClosesThePortAndEndsTheRequest() {
    ServingApp s(15);
    QVERIFY2(s.port > 0, qPrintable(s.app.server()->statusText()));
    auto reply = s.postChat(chatBody(QStringLiteral("Go on and on."), 2000));
    QTRY_VERIFY_WITH_TIMEOUT(s.app.server()->runningRequests() == 1, 30000);
    s.app.server()->setEnabled(false);
    QCOMPARE(s.app.server()->state(), ApiServerController::State::Off);
    QVERIFY(reply.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
    const HttpReply r = reply.get();
    QCOMPARE(r.status, 503);
    QCOMPARE(r.json()["error"].toObject()["code"].toString(), QStringLiteral("shutting_down"));
    // The request's sequence is cancelled: nothing runs, no KV is committed for it.
    QTRY_VERIFY_WITH_TIMEOUT(s.app.telemetry()->latest().engine.sequences.empty(), 10000);
    QCOMPARE(s.app.server()->runningRequests(), 0);
    const HttpReply refused = http(s.port, "GET", "/health");
    QCOMPARE(refused.status, 0);
    QCOMPARE(refused.error, ECONNREFUSED);
    s.app.server()->setEnabled(true);
    const int port = servingPort(s.app);
    QVERIFY(port > 0);
    QCOMPARE(http(port, "GET", "/health").status, 200);
    s.app.shutdown();
  }

  // (c) Quitting while a request runs: shutdown returns (it does not wait for the reply), the
  // client hears an error or a closed connection, and the engine is gone.
  void quittingMidRequestDoesNotHang() {
    ServingApp s(15);
    QVERIFY2(s.port > 0, qPrintable(s.app.server()->statusText()));
    auto reply = s.postChat(chatBody(QStringLiteral("Never stop."), 2000, true));
    QTRY_VERIFY_WITH_TIMEOUT(s.app.server()->runningRequests() == 1, 30000);
    QElapsedTimer timer;
    timer.start();
    s.app.shutdown();
    qInfo("shutdown with a request in flight took %lld ms",
          static_cast<long long>(timer.elapsed()));
    // Not a speed check: a hang would wait for 2000 paced tokens (30 s and more).
    QVERIFY(timer.elapsed() < 20000);
    QVERIFY(reply.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
    const HttpReply r = reply.get();
    QCOMPARE(r.status, 200);  // a stream's status is sent first; it ends with the error
    QVERIFY(r.body.contains("shutting_down"));
    QCOMPARE(http(s.port, "GET", "/health").error, ECONNREFUSED);
  }

  // (d) A port already in use: the window says so in one line (the server's status and the
  // banner) and keeps working; a free port then serves.
  void portInUseIsOneLineAndTheWindowKeepsWorking() {
    const int taken = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    QCOMPARE(bind(taken, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    QCOMPARE(listen(taken, 1), 0);
    socklen_t length = sizeof address;
    getsockname(taken, reinterpret_cast<sockaddr*>(&address), &length);
    const int port = ntohs(address.sin_port);

    QTemporaryDir dir;
    Application app(pacedFactory(0), dir.filePath("granule.sqlite"));
    const QString model = tinyModel(dir);
    app.server()->setPort(port);
    app.server()->setEnabled(true);
    app.start(model);
    QTRY_COMPARE_WITH_TIMEOUT(app.server()->state(), ApiServerController::State::Failed, 30000);
    const QString error = app.server()->error();
    QVERIFY2(error.contains(QString::number(port)) && error.contains(QStringLiteral("in use")),
             qPrintable(error));
    QVERIFY(!error.contains(QLatin1Char('\n')));
    QCOMPARE(app.server()->statusText(), error);
    QVERIFY(app.errors()->active());
    QCOMPARE(app.errors()->message(), error);
    QVERIFY(app.model()->ready());
    // The window still chats.
    ChatController* chats = app.chats();
    const qint64 chat = chats->newChat();
    chats->send(QStringLiteral("Still there?"));
    QTRY_COMPARE_WITH_TIMEOUT(chats->generatingCount(), 0, 60000);
    QVERIFY(chats->messagesOf(chat)->message(1).content.size() > 0);
    QCOMPARE(chats->messagesOf(chat)->message(1).finish_reason.isEmpty(), false);
    QVERIFY(chats->messagesOf(chat)->message(1).finish_reason != QStringLiteral("error"));
    // Another port serves.
    app.server()->setPort(0);
    const int served = servingPort(app);
    QVERIFY(served > 0 && served != port);
    QCOMPARE(http(served, "GET", "/health").status, 200);
    // A port another server serves is in use too (servers do not share a port).
    QTemporaryDir other_dir;
    Application other(pacedFactory(0), other_dir.filePath("granule.sqlite"));
    other.server()->setPort(served);
    other.server()->setEnabled(true);
    other.start(model);
    QTRY_COMPARE_WITH_TIMEOUT(other.server()->state(), ApiServerController::State::Failed, 30000);
    QVERIFY(other.server()->error().contains(QString::number(served)));
    other.shutdown();
    QCOMPARE(http(served, "GET", "/health").status, 200);
    app.shutdown();
    close(taken);
  }

  // Loading another model stops the server first (it waits while the model loads) and then
  // serves the new one under its own name.
  void loadingAnotherModelServesIt() {
    ServingApp s(0);
    QVERIFY2(s.port > 0, qPrintable(s.app.server()->statusText()));
    QVERIFY(http(s.port, "GET", "/v1/models").body.contains("\"id\":\"tiny\""));
    const QString other = s.dir.filePath(QStringLiteral("tiny-gqa.gguf"));
    granule::write_synthetic_model(granule::SyntheticModelSpec::preset("tiny-gqa"),
                                   other.toStdString());
    QList<ApiServerController::State> states;
    connect(s.app.server(), &ApiServerController::statusChanged, this,
            [&states, &s] { states.append(s.app.server()->state()); });
    s.app.model()->load(other);
    QTRY_VERIFY_WITH_TIMEOUT(s.app.model()->ready() && s.app.model()->modelPath() == other &&
                                 s.app.server()->state() == ApiServerController::State::Serving,
                             30000);
    QVERIFY(states.contains(ApiServerController::State::Waiting));
    const int port = QUrl(s.app.server()->url()).port();
    const HttpReply models = http(port, "GET", "/v1/models");
    QCOMPARE(models.status, 200);
    QVERIFY2(models.body.contains("\"id\":\"tiny-gqa\""), models.body.constData());
    const auto reply = http(port, "POST", "/v1/chat/completions", chatBody("hi", 3));
    QCOMPARE(reply.json()["usage"].toObject()["completion_tokens"].toInt(), 3);
    s.app.shutdown();
  }

  // The API key: without it a completion is refused (401), with it answered; /health is open.
  void apiKeyIsRequiredWhenSet() {
    QTemporaryDir dir;
    Application app(pacedFactory(0), dir.filePath("granule.sqlite"));
    app.server()->setPort(0);
    app.server()->setApiKey(QStringLiteral("s3cret"));
    app.server()->setEnabled(true);
    app.start(tinyModel(dir));
    const int port = servingPort(app);
    QVERIFY(port > 0);
    const QByteArray body = chatBody(QStringLiteral("hi"), 4);
    QCOMPARE(http(port, "POST", "/v1/chat/completions", body).status, 401);
    QCOMPARE(http(port, "POST", "/v1/chat/completions", body, "wrong").status, 401);
    QCOMPARE(http(port, "GET", "/health").status, 200);
    auto reply = std::async(std::launch::async, http, port, "POST", "/v1/chat/completions", body,
                            QByteArray("s3cret"));
    QTRY_VERIFY_WITH_TIMEOUT(!running(reply), 30000);
    const HttpReply r = reply.get();
    QCOMPARE(r.status, 200);
    QCOMPARE(r.json()["usage"].toObject()["completion_tokens"].toInt(), 4);
    app.shutdown();
  }

  // Off by default on 127.0.0.1:8080 with no key; what is set is kept for the next start; a
  // host beyond loopback is flagged.
  void settingsDefaultOffAndPersist() {
    QTemporaryDir dir;
    const QString db = dir.filePath("granule.sqlite");
    {
      Application app(testing::fakeEngineFactory(), db);
      ApiServerController* server = app.server();
      QCOMPARE(server->enabled(), false);
      QCOMPARE(server->host(), QStringLiteral("127.0.0.1"));
      QCOMPARE(server->port(), 8080);
      QCOMPARE(server->apiKey(), QString());
      QCOMPARE(server->hostExposed(), false);
      QCOMPARE(server->state(), ApiServerController::State::Off);
      server->setHost(QStringLiteral(" 0.0.0.0 "));
      QCOMPARE(server->hostExposed(), true);
      server->setPort(9123);
      server->setPort(70000);  // out of range: ignored
      server->setApiKey(QStringLiteral("key"));
      server->setEnabled(true);
      QCOMPARE(app.windowProperties().value(QStringLiteral("server")).value<QObject*>(), server);
    }
    Application app(testing::fakeEngineFactory(), db);
    ApiServerController* server = app.server();
    QCOMPARE(server->enabled(), true);
    QCOMPARE(server->host(), QStringLiteral("0.0.0.0"));
    QCOMPARE(server->port(), 9123);
    // The key comes back from the system keychain; without one (a test machine with no
    // Secret Service) it was kept for that session only — never in the settings' plain text.
    QTRY_VERIFY(!server->keyLoading());
    QCOMPARE(app.store().setting(QStringLiteral("server/api_key")), QString());
    if (server->apiKey().isEmpty())
      qInfo("no system keychain here: the API key did not outlive its session, as designed");
    else
      QCOMPARE(server->apiKey(), QStringLiteral("key"));
    for (const char* loopback : {"127.0.0.1", "127.1.2.3", "localhost", "::1"}) {
      server->setHost(QString::fromLatin1(loopback));
      QVERIFY2(!server->hostExposed(), loopback);
    }
    server->setHost(QStringLiteral("192.168.1.20"));
    QVERIFY(server->hostExposed());
  }

  // Without a model the switch waits for one; the tests' scripted engine cannot serve and
  // says so instead of crashing.
  void switchWaitsForAModelAndAStandInEngineRefuses() {
    QTemporaryDir dir;
    const QString fake = dir.filePath(QStringLiteral("fake.gguf"));
    QFile(fake).open(QIODevice::WriteOnly);
    // No default model either, so the window starts without one.
    qputenv("GRANULE_DEFAULT_MODEL", dir.filePath(QStringLiteral("absent.gguf")).toUtf8());
    Application app(testing::fakeEngineFactory(), dir.filePath("granule.sqlite"));
    qunsetenv("GRANULE_DEFAULT_MODEL");
    app.server()->setPort(0);
    app.server()->setEnabled(true);
    app.start();  // no model
    QTRY_COMPARE_WITH_TIMEOUT(app.server()->state(), ApiServerController::State::Waiting, 5000);
    app.model()->load(fake);
    QTRY_COMPARE_WITH_TIMEOUT(app.server()->state(), ApiServerController::State::Failed, 5000);
    QVERIFY2(app.server()->error().contains(QStringLiteral("cannot serve")),
             qPrintable(app.server()->error()));
    app.shutdown();
  }

  // The real default model, when present: the API answers the question a window would.
  void defaultModelAnswersOverHttp() {
    const QString path = ModelController::findDefaultModelPath();
    if (!QFileInfo(path).isFile())
      QSKIP("default model not present (SmolLM2-135M-Instruct.Q4_1.gguf)");
    QTemporaryDir dir;
    Application app(granuleEngineFactory(), dir.filePath("granule.sqlite"));
    app.model()->setContextLength(1024);
    app.model()->setMaxChats(2);
    app.server()->setPort(0);
    app.server()->setEnabled(true);
    app.start(path);
    const int port = servingPort(app);
    QVERIFY(port > 0);
    const QJsonObject body{
        {"messages",
         // Greedy, the CPU's int8 path and llama.cpp both answer "The capital of France is
         // Paris." to this wording ("What is the capital of France?" gets "L'Étoile, la
         // Marseillaise," from both since the weights are repacked).
         QJsonArray{QJsonObject{{"role", "user"}, {"content", "Name the capital of France."}}}},
        {"temperature", 0},
        {"max_tokens", 12}};
    auto reply = std::async(std::launch::async, http, port, "POST", "/v1/chat/completions",
                            QJsonDocument(body).toJson(QJsonDocument::Compact), QByteArray());
    QTRY_VERIFY_WITH_TIMEOUT(!running(reply), 120000);
    const HttpReply r = reply.get();
    QCOMPARE(r.status, 200);
    const QString answer =
        r.json()["choices"].toArray().at(0).toObject()["message"].toObject()["content"].toString();
    qInfo("answer: %s", qPrintable(answer));
    QVERIFY(answer.contains(QStringLiteral("Paris")));
    QCOMPARE(r.json()["model"].toString(), QStringLiteral("SmolLM2-135M-Instruct.Q4_1"));
    app.shutdown();
  }
};

QTEST_GUILESS_MAIN(ServeTest)
#include "app_serve_test.moc"
