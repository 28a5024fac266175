// Endpoints and per-chat engines against `granule-cli serve` on loopback: Settings' endpoint
// list (models from /v1/models; 401 and an unreachable host in one line each, through
// fault_proxy.py), a chat's engine saved with it, one worker running a local chat and a chat
// on the endpoint at once, and two windows (two workers, the window's code path) on one
// Granule server decoding in the same engine steps, read from its /metrics; an endpoint's stall
// timeout from its settings, and a key still read from the keychain at start-up waited for.
// Skips without the default model.
#include <QTemporaryDir>
#include <future>

#include "chat_controller.h"
#include "chat_store.h"
#include "endpoints_controller.h"
#include "error_reporter.h"
#include "remote/openai_client.h"
#include "remote/prometheus_text.h"
#include "remote_inference_engine.h"
#include "remote_test_support.h"

using namespace granule::app;
using namespace granule::app::test;

namespace {

// The server's counters now (its /metrics, parsed).
std::map<std::string, double> scrape(int port) {
  granule::remote::OpenAiClient client(
      granule::remote::Endpoint{"http://127.0.0.1:" + std::to_string(port), ""});
  const auto text = client.fetch_metrics();
  std::map<std::string, double> out;
  if (text.fault) return out;
  for (const auto& s : granule::remote::parse_prometheus_text(text.text).samples)
    out[s.name] += s.value;
  return out;
}

const EndpointEntry* entryOf(EndpointsController& c, const QString& id) {
  for (const EndpointEntry& e : c.list()->endpoints())
    if (e.id == id) return &e;
  return nullptr;
}

bool settled(EndpointsController& c, const QString& id) {
  const EndpointEntry* e = entryOf(c, id);
  return e && e->state != EndpointEntry::State::Checking &&
         e->state != EndpointEntry::State::Unchecked;
}

}  // namespace

class EndpointsTest : public QObject {
  Q_OBJECT

 private:
  QString model_;
  Child server_;
  QString modelId_;
  QTemporaryDir dir_;

  QString url(int port) const { return QStringLiteral("http://127.0.0.1:%1/v1").arg(port); }
  QString ref(int port) const { return url(port) + QLatin1Char('#') + modelId_; }

 private Q_SLOTS:
  void initTestCase() {
    model_ = defaultModel();
    if (model_.isEmpty()) QSKIP("the default model is absent (bash packaging/setup.sh model)");
    // Four chats at once: the two windows' requests share its batch.
    QVERIFY(server_.serve(model_, 1024, 4));
    modelId_ = QFileInfo(model_).completeBaseName();
  }

  void anEndpointListsItsModelsAndIsSaved() {
    ChatStore store(dir_.filePath(QStringLiteral("a.sqlite")));
    QString id;
    {
      EndpointsController endpoints(store);
      id = endpoints.add(QStringLiteral("box"), url(server_.port) + QStringLiteral("/"), {});
      QVERIFY(!id.isEmpty());
      QTRY_VERIFY_WITH_TIMEOUT(settled(endpoints, id), 20000);
      const EndpointEntry* e = entryOf(endpoints, id);
      QCOMPARE(e->base_url, url(server_.port));  // the trailing slash gone
      QVERIFY2(e->state == EndpointEntry::State::Reachable, qPrintable(e->status));
      QCOMPARE(e->models, QStringList{modelId_});
      QVERIFY2(e->status.contains(QStringLiteral("Granule")), qPrintable(e->status));
      QCOMPARE(endpoints.engineChoices().size(), 1);
      QCOMPARE(endpoints.engineChoices()[0].toMap()[QStringLiteral("ref")].toString(),
               ref(server_.port));
      QCOMPARE(endpoints.engineLabel(ref(server_.port)), QStringLiteral("box · %1").arg(modelId_));
      QCOMPARE(endpoints.engineLabel({}), QStringLiteral("Loaded model"));
    }
    // Read back at the next start (its name and URL; the key lives in the keychain).
    EndpointsController again(store);
    QCOMPARE(again.list()->count(), 1);
    QCOMPARE(again.list()->endpoints()[0].name, QStringLiteral("box"));
    QTRY_VERIFY_WITH_TIMEOUT(settled(again, id), 20000);
    QCOMPARE(again.list()->endpoints()[0].models, QStringList{modelId_});
    again.remove(id);
    QCOMPARE(again.list()->count(), 0);
    EndpointsController removed(store);
    QCOMPARE(removed.list()->count(), 0);
  }

  void refusedAndUnreachableEndpointsSayWhyInOneLine() {
    Child proxy;
    QVERIFY(proxy.start(
        QStringLiteral("python3"),
        {QStringLiteral(GRANULE_FAULT_PROXY), QStringLiteral("127.0.0.1:%1").arg(server_.port),
         QStringLiteral("--idle"), QStringLiteral("60")}));
    ChatStore store(dir_.filePath(QStringLiteral("b.sqlite")));
    EndpointsController endpoints(store);
    QVERIFY(queueFault(proxy.port, QStringLiteral("status:401")));
    const QString id = endpoints.add(QStringLiteral("proxy"), url(proxy.port), {});
    QTRY_VERIFY_WITH_TIMEOUT(settled(endpoints, id), 20000);
    const EndpointEntry* e = entryOf(endpoints, id);
    QVERIFY2(e->state == EndpointEntry::State::Unauthorized, qPrintable(e->status));
    QVERIFY2(e->status.startsWith(QStringLiteral("401")), qPrintable(e->status));
    QVERIFY(!e->status.contains(QLatin1Char('\n')));
    // Refresh: the proxy passes this one.
    endpoints.refresh(id);
    QTRY_VERIFY_WITH_TIMEOUT(settled(endpoints, id), 20000);
    QVERIFY2(entryOf(endpoints, id)->state == EndpointEntry::State::Reachable,
             qPrintable(entryOf(endpoints, id)->status));

    const QString gone =
        endpoints.add(QStringLiteral("gone"), QStringLiteral("http://127.0.0.1:1"), {});
    QTRY_VERIFY_WITH_TIMEOUT(settled(endpoints, gone), 20000);
    e = entryOf(endpoints, gone);
    QVERIFY2(e->state == EndpointEntry::State::Unreachable, qPrintable(e->status));
    QVERIFY2(e->status.contains(QStringLiteral("cannot reach")), qPrintable(e->status));
  }

  void aChatsEngineIsSavedWithItAndSentWithItsKey() {
    const QString path = dir_.filePath(QStringLiteral("c.sqlite"));
    {
      ChatStore store(path);
      ErrorReporter errors;
      ChatController chats(store, errors);
      chats.setEndpointAccess([](const QString& base, QObject*,
                                 const std::function<void(const EndpointAccess&)>& ready) {
        ready(base == QStringLiteral("http://h:8000/v1")
                  ? EndpointAccess{QStringLiteral("sk-1"), 7, {}}
                  : EndpointAccess{});
      });
      QSignalSpy requests(&chats, &ChatController::generationRequested);
      chats.newChat();
      QCOMPARE(chats.currentEngine(), QString());
      chats.setCurrentEngine(QStringLiteral("http://h:8000/v1#m"));
      // No local model is loaded: a chat on an endpoint sends anyway.
      chats.send(QStringLiteral("hello"));
      QCOMPARE(requests.count(), 1);
      const auto r = requests[0][0].value<GenerationRequest>();
      QCOMPARE(r.engine, QStringLiteral("http://h:8000/v1#m"));
      QCOMPARE(r.api_key, QStringLiteral("sk-1"));
      QCOMPARE(r.stall_timeout_seconds, 7);
      QVERIFY(!errors.active());
    }
    ChatStore store(path);
    QCOMPARE(store.schemaVersion(), ChatStore::kSchemaVersion);
    QCOMPARE(store.conversations().size(), 1);
    QCOMPARE(store.conversations()[0].engine, QStringLiteral("http://h:8000/v1#m"));
    // New chats start on the engine chosen last.
    ErrorReporter errors;
    ChatController chats(store, errors);
    chats.loadFromStore();
    chats.newChat();
    chats.newChat();
    QCOMPARE(chats.currentEngine(), QStringLiteral("http://h:8000/v1#m"));
  }

  void oneWindowRunsALocalChatAndAnEndpointChatTogether() {
    ThreadedWorker w(granuleEngineFactory(), remoteEngineFactory());
    QCOMPARE(w.load(model_), QString());
    GenerationRequest local = turn(1, QStringLiteral("Write a story about a cat."), 32);
    GenerationRequest remote = turn(2, QStringLiteral("Write a story about a dog."), 32);
    remote.engine = ref(server_.port);
    QSignalSpy notes(w.worker, &EngineWorker::settingsNotApplied);
    w.call([wk = w.worker, local, remote] {
      wk->submit(local);
      wk->submit(remote);
      wk->showEngine(remote.engine);
    });
    QTRY_VERIFY_WITH_TIMEOUT(finishedChat(w.finished, 1) && finishedChat(w.finished, 2), 90000);
    for (qint64 chat : {1, 2}) {
      const GenerationResult r = resultOf(w.finished, chat);
      QVERIFY2(r.end == GenerationEnd::Finished, qPrintable(r.error));
      QVERIFY2(textOf(w.tokens, chat).size() > 5, qPrintable(textOf(w.tokens, chat)));
      QVERIFY(r.prompt_tokens > 0);
    }
    // A Granule server takes every setting the window has.
    QCOMPARE(notes.count(), 0);
    // Stop works on the endpoint's chat while the local engine is loaded.
    GenerationRequest longer = turn(3, QStringLiteral("Write a long story about a cat."), 400);
    longer.engine = ref(server_.port);
    w.call([wk = w.worker, longer] { wk->submit(longer); });
    QTRY_VERIFY_WITH_TIMEOUT(!textOf(w.tokens, 3).isEmpty(), 60000);
    w.call([wk = w.worker] { wk->cancel(3); });
    QTRY_VERIFY_WITH_TIMEOUT(finishedChat(w.finished, 3), 30000);
    QCOMPARE(resultOf(w.finished, 3).reason, QStringLiteral("cancelled"));
    // The panels showed the endpoint's server (its /metrics) while it was the one shown.
    QSignalSpy frames(w.worker, &EngineWorker::telemetryUpdated);
    QTRY_VERIFY_WITH_TIMEOUT(frames.count() > 0, 5000);
    const auto frame = frames.last()[0].value<TelemetryFrame>();
    QCOMPARE(frame.remote.value(QStringLiteral("server")).toString(), QStringLiteral("Granule"));
    // An unreachable endpoint fails that chat in one line; the local chat is not touched.
    GenerationRequest nowhere = turn(4, QStringLiteral("hi"), 8);
    nowhere.engine = QStringLiteral("http://127.0.0.1:1/v1#m");
    w.call([wk = w.worker, nowhere] { wk->submit(nowhere); });
    QTRY_VERIFY_WITH_TIMEOUT(finishedChat(w.finished, 4), 30000);
    QVERIFY(resultOf(w.finished, 4).error.contains(QStringLiteral("cannot reach")));
  }

  // The window's whole path (ChatController, the worker, the chat database) on a chat whose
  // endpoint fails: 401, 429, 503 before any text, and a stream cut mid-answer. Each is one
  // line in the banner; the question stays, a partial answer stays marked "error", an empty
  // one goes; Retry (regenerate) then answers as a new version and the failed one is kept.
  void faultsKeepTheChatAndRetryAnswers() {
    Child proxy;
    QVERIFY(proxy.start(
        QStringLiteral("python3"),
        {QStringLiteral(GRANULE_FAULT_PROXY), QStringLiteral("127.0.0.1:%1").arg(server_.port),
         QStringLiteral("--idle"), QStringLiteral("120")}));
    const QString path = dir_.filePath(QStringLiteral("faults.sqlite"));
    ChatStore store(path);
    ErrorReporter errors;
    ChatController chats(store, errors);
    ThreadedWorker w({}, remoteEngineFactory());
    connectChats(chats, w);
    const qint64 chat = chats.newChat();
    chats.setCurrentEngine(ref(proxy.port));
    // A first turn that works (the engine opens: /v1/models passes).
    chats.send(QStringLiteral("Say hello."));
    QTRY_VERIFY_WITH_TIMEOUT(chats.generatingCount() == 0, 60000);
    QVERIFY2(!errors.active(), qPrintable(errors.message()));
    QCOMPARE(chats.messagesOf(chat)->count(), 2);

    struct Case {
      QString fault;
      QString starts;  // the banner's line
      bool partial;    // text arrived before the fault
    };
    const QList<Case> cases = {
        {QStringLiteral("status:401"), QStringLiteral("401"), false},
        {QStringLiteral("status:429"), QStringLiteral("429 Too Many Requests"), false},
        {QStringLiteral("status:503"), QStringLiteral("503"), false},
        {QStringLiteral("drop:700"), QStringLiteral("the stream ended before the answer did"),
         true},
    };
    int turns = 1;
    for (const Case& c : cases) {
      errors.dismiss();
      QVERIFY(queueFault(proxy.port, c.fault));
      chats.send(QStringLiteral("Tell me about rivers, turn %1.").arg(++turns));
      QTRY_VERIFY_WITH_TIMEOUT(chats.generatingCount() == 0, 60000);
      QVERIFY2(errors.active(), qPrintable(c.fault));
      QVERIFY2(errors.message().startsWith(c.starts), qPrintable(errors.message()));
      QVERIFY(!errors.message().contains(QLatin1Char('\n')));
      // What the database holds is what the chat shows, read back from the file.
      const QList<StoredMessage> shown = ChatStore(path).messages(chat);
      QCOMPARE(shown.last().role == QLatin1String("assistant"), c.partial);
      if (c.partial) {
        QVERIFY(!shown.last().content.isEmpty());
        QCOMPARE(shown.last().finish_reason, QStringLiteral("error"));
      } else {
        QCOMPARE(shown.last().content, QStringLiteral("Tell me about rivers, turn %1.").arg(turns));
      }
      if (c.partial) {
        // Retry: a new version of the answer; the cut one stays one version back.
        const int row = chats.messagesOf(chat)->count() - 1;
        chats.regenerate(row);
        QTRY_VERIFY_WITH_TIMEOUT(chats.generatingCount() == 0, 60000);
        const QList<StoredMessage> after = ChatStore(path).messages(chat);
        QCOMPARE(after.last().version, 2);
        QCOMPARE(after.last().version_count, 2);
        QVERIFY(after.last().finish_reason != QLatin1String("error"));
        QVERIFY(after.last().content.size() > 3);
      } else {
        // A question left unanswered: editing it resends (the worker's path is the same).
        QCOMPARE(chats.messagesOf(chat)->count(), shown.size());
      }
    }
    QCOMPARE(ChatStore(path).conversations()[0].engine, ref(proxy.port));
  }

  // A stream that stops sending mid-answer: the endpoint's stall timeout (set short in its
  // settings here, 60 s by default) ends it with one line in the banner, the partial answer
  // stays, marked "error", and Retry answers as version 2 — read back from the chat database.
  void aStalledStreamIsEndedKeptAndRetried() {
    Child proxy;
    QVERIFY(proxy.start(
        QStringLiteral("python3"),
        {QStringLiteral(GRANULE_FAULT_PROXY), QStringLiteral("127.0.0.1:%1").arg(server_.port),
         QStringLiteral("--idle"), QStringLiteral("120")}));
    const QString path = dir_.filePath(QStringLiteral("stall.sqlite"));
    ChatStore store(path);
    auto secrets = std::make_shared<TestSecrets>();
    // Long enough for a first token on a busy machine, short for the test.
    constexpr int kStallSeconds = 4;
    QString id;
    {
      // Settings → Endpoints: the endpoint and its stall timeout, validated and saved.
      EndpointsController settings(store, secrets);
      id = settings.add(QStringLiteral("proxy"), url(proxy.port), {});
      QCOMPARE(entryOf(settings, id)->stall_timeout_seconds, kDefaultStallTimeoutSeconds);
      QVERIFY(!settings.setStallTimeout(id, 1).isEmpty());
      QVERIFY(!settings.setStallTimeout(id, kMaxStallTimeoutSeconds + 1).isEmpty());
      QCOMPARE(settings.setStallTimeout(id, kStallSeconds), QString());
      QTRY_VERIFY_WITH_TIMEOUT(settled(settings, id), 20000);
    }
    // Read back as at the next start; its chats take the timeout from it.
    EndpointsController endpoints(store, secrets);
    QCOMPARE(entryOf(endpoints, id)->stall_timeout_seconds, kStallSeconds);
    QCOMPARE(endpoints.list()
                 ->data(endpoints.list()->index(0), EndpointListModel::StallTimeoutRole)
                 .toInt(),
             kStallSeconds);
    QTRY_VERIFY_WITH_TIMEOUT(settled(endpoints, id), 20000);  // its /v1/models check passed
    ErrorReporter errors;
    ChatController chats(store, errors);
    chats.setEndpointAccess([&endpoints](const QString& base_url, QObject* context,
                                         std::function<void(const EndpointAccess&)> ready) {
      endpoints.whenAccessReady(base_url, context, std::move(ready));
    });
    ThreadedWorker w({}, remoteEngineFactory());
    connectChats(chats, w);
    const qint64 chat = chats.newChat();
    chats.setCurrentEngine(ref(proxy.port));
    // The headers and about 700 bytes of the stream (a few deltas of text), then nothing for
    // 30 s: the client gives up after kStallSeconds. (The engine's first request, for
    // /v1/models, passes.)
    QVERIFY(queueFault(proxy.port, QStringLiteral("pass")));
    QVERIFY(queueFault(proxy.port, QStringLiteral("stall:30:700")));
    QElapsedTimer took;
    took.start();
    chats.send(QStringLiteral("Tell me about rivers."));
    QTRY_VERIFY_WITH_TIMEOUT(chats.generatingCount() == 0, 60000);
    qInfo("the stall ended the answer after %lld ms", static_cast<long long>(took.elapsed()));
    QVERIFY(took.elapsed() < 25000);  // by the client's timeout, not the proxy's close
    QVERIFY(errors.active());
    QVERIFY2(errors.message().startsWith(
                 QStringLiteral("the server sent nothing for %1 s: stalled").arg(kStallSeconds)),
             qPrintable(errors.message()));
    QVERIFY(!errors.message().contains(QLatin1Char('\n')));
    QVERIFY2(errors.message().contains(QStringLiteral("the answer is cut where it stopped")),
             qPrintable(errors.message()));
    QList<StoredMessage> shown = ChatStore(path).messages(chat);
    QCOMPARE(shown.size(), 2);
    QCOMPARE(shown.last().role, QStringLiteral("assistant"));
    QVERIFY(!shown.last().content.isEmpty());
    QCOMPARE(shown.last().finish_reason, QStringLiteral("error"));
    const QString partial = shown.last().content;
    // Retry: the proxy passes it.
    errors.dismiss();
    chats.regenerate(1);
    QTRY_VERIFY_WITH_TIMEOUT(chats.generatingCount() == 0, 60000);
    QVERIFY2(!errors.active(), qPrintable(errors.message()));
    shown = ChatStore(path).messages(chat);
    QCOMPARE(shown.size(), 2);
    QCOMPARE(shown.last().version, 2);
    QCOMPARE(shown.last().version_count, 2);
    QVERIFY(shown.last().finish_reason != QLatin1String("error"));
    QVERIFY(shown.last().content.size() > 3);
  }

  // Start-up: a chat on an endpoint that wants a key, sent while the keychain is still reading
  // that key (the double answers 1.5 s late). The request waits for the key and goes out with
  // it (the server refuses without: 401); so does the engine thread's lookup (Models → Server).
  // A keychain that fails to read a stored key fails the reply with one line that says so; a
  // stop while waiting ends the reply and nothing is sent.
  void aKeyStillReadAtStartUpIsWaitedFor() {
    const QString key = QStringLiteral("sk-start-up");
    Child keyed;
    QVERIFY(keyed.serve(model_, 1024, 2, {QStringLiteral("--api-key"), key}));
    QCOMPARE(
        granule::remote::OpenAiClient({url(keyed.port).toStdString(), ""}).list_models().fault.kind,
        granule::remote::FaultKind::Unauthorized);
    const QString path = dir_.filePath(QStringLiteral("startup.sqlite"));
    auto secrets = std::make_shared<TestSecrets>();
    qint64 chat = 0;
    {
      // The session before: the endpoint with its key (into the keychain), a chat on its model.
      ChatStore store(path);
      ErrorReporter errors;
      EndpointsController endpoints(store, secrets);
      const QString id = endpoints.add(QStringLiteral("keyed"), url(keyed.port), key);
      QTRY_VERIFY_WITH_TIMEOUT(settled(endpoints, id), 20000);
      QVERIFY2(entryOf(endpoints, id)->state == EndpointEntry::State::Reachable,
               qPrintable(entryOf(endpoints, id)->status));
      ChatController chats(store, errors);
      chat = chats.newChat();
      chats.setCurrentEngine(ref(keyed.port));
    }
    QCOMPARE(secrets->entries.size(), size_t{1});
    // The next start, with a keychain that answers late.
    secrets->delay_ms = 1500;
    const auto startUp = [&](auto&& body) {
      ChatStore store(path);
      ErrorReporter errors;
      EndpointsController endpoints(store, secrets);
      ChatController chats(store, errors);
      chats.setEndpointAccess([&endpoints](const QString& base_url, QObject* context,
                                           std::function<void(const EndpointAccess&)> ready) {
        endpoints.whenAccessReady(base_url, context, std::move(ready));
      });
      ThreadedWorker w({}, remoteEngineFactory());
      connectChats(chats, w);
      chats.loadFromStore();
      chats.selectChat(chat);
      QCOMPARE(chats.currentEngine(), ref(keyed.port));
      body(endpoints, chats, errors);
      QTRY_VERIFY_WITH_TIMEOUT(chats.generatingCount() == 0, 60000);
    };
    startUp([&](EndpointsController& endpoints, ChatController& chats, ErrorReporter& errors) {
      QSignalSpy requests(&chats, &ChatController::generationRequested);
      // The engine thread's lookup, asked at the same moment from another thread.
      auto lookup = std::async(
          std::launch::async,
          [l = endpoints.accessLookup(), u = url(keyed.port).toStdString()] { return l(u); });
      QElapsedTimer took;
      took.start();
      chats.send(QStringLiteral("Say hello."));
      QCOMPARE(requests.count(), 0);  // the key is not read yet: the request waits
      QCOMPARE(chats.generatingCount(), 1);
      QTRY_VERIFY_WITH_TIMEOUT(requests.count() == 1, 10000);
      qInfo("the request went out %lld ms after send, with the key",
            static_cast<long long>(took.elapsed()));
      QVERIFY(took.elapsed() >= 1000);
      QCOMPARE(requests[0][0].value<GenerationRequest>().api_key, key);
      QTRY_VERIFY_WITH_TIMEOUT(chats.generatingCount() == 0, 60000);
      QVERIFY2(!errors.active(), qPrintable(errors.message()));  // no 401
      QCOMPARE(chats.messagesOf(chat)->count(), 2);
      QVERIFY(chats.messagesOf(chat)->message(1).content.size() > 3);
      QTRY_VERIFY_WITH_TIMEOUT(
          lookup.wait_for(std::chrono::seconds(0)) == std::future_status::ready, 10000);
      QCOMPARE(lookup.get().api_key, key);
    });
    // Stop while the key is read: the reply ends, nothing goes out, not even once the key came.
    startUp([&](EndpointsController&, ChatController& chats, ErrorReporter&) {
      QSignalSpy requests(&chats, &ChatController::generationRequested);
      chats.send(QStringLiteral("Say hello again."));
      QCOMPARE(chats.generatingCount(), 1);
      chats.stop();
      QCOMPARE(chats.generatingCount(), 0);
      QTest::qWait(2000);
      QCOMPARE(requests.count(), 0);
      QCOMPARE(chats.messagesOf(chat)->message(3).finish_reason, QStringLiteral("cancelled"));
    });
    // A keychain that cannot read the stored key: one line, and the question stays.
    secrets->failure = QStringLiteral("no Secret Service on this desktop");
    startUp([&](EndpointsController&, ChatController& chats, ErrorReporter& errors) {
      QSignalSpy requests(&chats, &ChatController::generationRequested);
      chats.send(QStringLiteral("Are you there?"));
      QTRY_VERIFY_WITH_TIMEOUT(chats.generatingCount() == 0, 10000);
      QCOMPARE(requests.count(), 0);
      QVERIFY(errors.active());
      qInfo("banner: %s", qPrintable(errors.message()));
      QVERIFY2(errors.message().startsWith(QStringLiteral(
                   "The API key of endpoint \"keyed\" could not be read from the system keychain "
                   "(no Secret Service on this desktop)")),
               qPrintable(errors.message()));
      QVERIFY(!errors.message().contains(QLatin1Char('\n')));
      QCOMPARE(ChatStore(path).messages(chat).last().content, QStringLiteral("Are you there?"));
    });
  }

  void twoWindowsOnOneServerDecodeInTheSameSteps() {
    const auto before = scrape(server_.port);
    QVERIFY2(before.count("granule_batched_decode_steps_total"),
             "the server's /metrics has no granule_batched_decode_steps_total");
    // Two windows: two workers, each with a chat on the server's model (the window's path).
    ThreadedWorker a({}, remoteEngineFactory());
    ThreadedWorker b({}, remoteEngineFactory());
    GenerationRequest ra = turn(1, QStringLiteral("Write a long story about a cat."), 64);
    GenerationRequest rb = turn(1, QStringLiteral("Write a long story about a dog."), 64);
    ra.engine = rb.engine = ref(server_.port);
    a.call([wk = a.worker, ra] { wk->submit(ra); });
    b.call([wk = b.worker, rb] { wk->submit(rb); });
    QTRY_VERIFY_WITH_TIMEOUT(finishedChat(a.finished, 1) && finishedChat(b.finished, 1), 120000);
    QVERIFY2(resultOf(a.finished, 1).end == GenerationEnd::Finished,
             qPrintable(resultOf(a.finished, 1).error));
    QVERIFY2(resultOf(b.finished, 1).end == GenerationEnd::Finished,
             qPrintable(resultOf(b.finished, 1).error));
    const auto after = scrape(server_.port);
    const auto delta = [&](const char* name) { return after.at(name) - before.at(name); };
    const double steps = delta("granule_decode_steps_total");
    const double sequences = delta("granule_decode_step_sequences_total");
    const double batched = delta("granule_batched_decode_steps_total");
    qInfo("decode steps %.0f, sequences decoded %.0f (mean batch %.2f), steps with both %.0f",
          steps, sequences, sequences / steps, batched);
    // Each answer is up to 64 tokens; they overlap for most of them (prefill is short).
    QVERIFY2(batched >= 16, qPrintable(QStringLiteral("only %1 steps decoded both").arg(batched)));
    QVERIFY(sequences / steps > 1.2);
  }
};

QTEST_GUILESS_MAIN(EndpointsTest)
#include "app_endpoints_test.moc"
