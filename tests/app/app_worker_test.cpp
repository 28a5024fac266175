// QtTest for the EngineWorker on its own thread and for Application's wiring: signals,
// ~60 Hz coalescing, two chats batched at once, cancel, engine errors, shutdown during
// generation, and the chats' persistence across a restart. A scripted engine stands in
// for the model; the last cases run the real engine on a synthetic model and on the
// default model when present.
#include <QElapsedTimer>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QSignalSpy>
#include <QTemporaryDir>
#include <QThread>
#include <QtTest>
#include <map>
#include <optional>

#include "application.h"
#include "engine_worker.h"
#include "fake_inference_engine.h"
#include "granule/testkit/synthetic_model.h"
#include "model_controller.h"

using namespace granule::app;
using granule::app::testing::fakeEngineFactory;
using granule::app::testing::FakeEngineLog;
using granule::app::testing::FakeEngineScript;

// QSignalSpy records on the emitting (engine) thread, so a signal can land before a
// spy.wait() starts; the tests poll the spies' counts instead.
namespace {

GenerationRequest request(qint64 chat, int max_tokens) {
  GenerationRequest r;
  r.chat_id = chat;
  r.messages = {{"user", "hello"}};
  r.sampling.max_tokens = max_tokens;
  return r;
}

// A worker on its own thread, joined the way Application does it.
struct ThreadedWorker {
  explicit ThreadedWorker(EngineFactory factory) : worker(new EngineWorker(std::move(factory))) {
    worker->moveToThread(&thread);
    thread.start();
    QMetaObject::invokeMethod(worker, &EngineWorker::start, Qt::QueuedConnection);
  }
  ~ThreadedWorker() {
    QMetaObject::invokeMethod(worker, &EngineWorker::shutdown, Qt::BlockingQueuedConnection);
    thread.quit();
    thread.wait();
    delete worker;
  }
  template <typename F>
  void call(F f) {
    QMetaObject::invokeMethod(worker, std::move(f), Qt::QueuedConnection);
  }
  // Loads `path` and waits until it loads or fails: "" when it loaded (its facts in `info`),
  // else the load error ("timed out" when neither came within `within_ms`).
  QString loadFile(const QString& path, qint64 context, qint32 chats, int within_ms,
                   ModelInfo* info = nullptr) {
    QSignalSpy loaded(worker, &EngineWorker::modelLoaded);
    QSignalSpy failed(worker, &EngineWorker::loadFailed);
    call([w = worker, path, context, chats] { w->loadModel(path, context, chats); });
    if (!QTest::qWaitFor([&] { return loaded.count() + failed.count() > 0; }, within_ms))
      return QStringLiteral("timed out");
    if (!failed.isEmpty()) return failed[0][1].toString();
    if (info) *info = loaded[0][0].value<ModelInfo>();
    return {};
  }
  // The scripted engine's model.
  void load() { QCOMPARE(loadFile("/models/fake.gguf", 4096, 8, 5000), QString()); }
  // Submits request(chat, max_tokens) for each pair, in one call on the worker's thread.
  void submit(QList<std::pair<qint64, int>> chats) {
    call([wk = worker, chats] {
      for (const auto& [chat, max_tokens] : chats) wk->submit(request(chat, max_tokens));
    });
  }
  QThread thread;
  EngineWorker* worker;
  // What the tests watch, recording from the start.
  struct Spies {
    QSignalSpy tokens;
    QSignalSpy finished;
    QSignalSpy errors;
  } spies{{worker, &EngineWorker::tokensArrived},
          {worker, &EngineWorker::generationFinished},
          {worker, &EngineWorker::engineError}};
};

// The results a finished spy holds, in order, and by chat.
QList<GenerationResult> results(const QSignalSpy& finished) {
  QList<GenerationResult> all;
  for (const QList<QVariant>& args : finished) all.append(args[0].value<GenerationResult>());
  return all;
}
std::map<qint64, GenerationResult> resultsByChat(const QSignalSpy& finished) {
  std::map<qint64, GenerationResult> by_chat;
  for (const GenerationResult& r : results(finished)) by_chat[r.chat_id] = r;
  return by_chat;
}

// Every token chunk the spy saw, in order.
QList<TokenChunk> chunks(const QSignalSpy& tokens) {
  QList<TokenChunk> all;
  for (const QList<QVariant>& args : tokens) all.append(args[0].value<QList<TokenChunk>>());
  return all;
}

QString joinedText(const QSignalSpy& spy, qint64 chat) {
  QString text;
  for (const TokenChunk& c : chunks(spy))
    if (c.chat_id == chat) text += c.text;
  return text;
}

// A synthetic "tiny" model for the real engine, written into `dir`.
QString writeTinyModel(const QTemporaryDir& dir) {
  const QString path = dir.filePath("tiny.gguf");
  granule::write_synthetic_model(granule::SyntheticModelSpec::preset("tiny"), path.toStdString());
  return path;
}

QString expectedText(int tokens) {
  QString s;
  for (int i = 0; i < tokens; ++i) s += QStringLiteral("w%1 ").arg(i);
  return s;
}

// Application::start loads only an existing file; the scripted engine ignores its content.
QString fakeModelFile(const QTemporaryDir& dir) {
  const QString path = dir.filePath(QStringLiteral("fake.gguf"));
  QFile file(path);
  file.open(QIODevice::WriteOnly);
  return path;
}

// Starts the application on an existing (empty) model file and waits until it is ready.
void startWithFakeModel(Application& app, const QTemporaryDir& dir) {
  app.start(fakeModelFile(dir));
  QTRY_VERIFY_WITH_TIMEOUT(app.model()->ready(), 5000);
}

// Does `action` on the chats, with replies of max_tokens (kept when 0), and waits until
// nothing generates.
template <class Action>
void replyTo(ChatController* chats, int max_tokens, Action action) {
  if (max_tokens > 0) chats->samplingEditor()->setMaxTokens(max_tokens);
  action();
  QTRY_COMPARE_WITH_TIMEOUT(chats->generatingCount(), 0, 5000);
}

QString defaultModelPath() {
  const QString path = ModelController::findDefaultModelPath();
  return QFileInfo(path).isFile() ? path : QString();
}

}  // namespace

class WorkerTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void initTestCase() { registerWorkerTypes(); }

  void generationStreamsEveryTokenThenFinishes() {
    FakeEngineLog log;
    ThreadedWorker w(fakeEngineFactory({}, &log));
    w.load();
    auto& [tokens, finished, errors] = w.spies;
    QSignalSpy started(w.worker, &EngineWorker::generationStarted);
    w.submit({{7, 40}});
    QTRY_VERIFY_WITH_TIMEOUT(finished.count() > 0, 5000);
    QCOMPARE(started.count(), 1);
    QCOMPARE(started[0][0].toLongLong(), 7);
    // All text arrives, in order, before the finish.
    QCOMPARE(joinedText(tokens, 7), expectedText(40));
    const auto result = finished[0][0].value<GenerationResult>();
    QCOMPARE(result.chat_id, 7);
    QCOMPARE(result.end, GenerationEnd::Finished);
    QCOMPARE(result.reason, QStringLiteral("length"));  // granule::finish_reason_name(MaxTokens)
  }

  void tokensAreCoalescedToAboutSixtyHertz() {
    // 400 tokens at ~1 ms per step take ~0.4 s: unbatched that is 400 signals; at ~60 Hz
    // it is about 25. Allow a wide margin for a loaded machine, but far below one per token.
    ThreadedWorker w(fakeEngineFactory({.step_delay_ms = 1}));
    w.load();
    auto& [tokens, finished, errors] = w.spies;
    QElapsedTimer timer;
    timer.start();
    w.submit({{1, 400}});
    QTRY_VERIFY_WITH_TIMEOUT(finished.count() > 0, 20000);
    const double seconds = timer.elapsed() / 1000.0;
    QCOMPARE(joinedText(tokens, 1), expectedText(400));
    QVERIFY2(tokens.count() <= 400 / 4, qPrintable(QString("%1 batches").arg(tokens.count())));
    QVERIFY2(tokens.count() <= seconds * 60 * 1.5 + 3,
             qPrintable(QString("%1 batches in %2 s").arg(tokens.count()).arg(seconds)));
  }

  void twoChatsGenerateInTheSameSteps() {
    FakeEngineLog log;
    ThreadedWorker w(fakeEngineFactory({.step_delay_ms = 2}, &log));
    w.load();
    auto& [tokens, finished, errors] = w.spies;
    w.submit({{1, 30}, {2, 30}});
    QTRY_COMPARE_WITH_TIMEOUT(finished.count(), 2, 10000);
    QCOMPARE(log.max_batch.load(), 2);  // both advanced in one step
    QVERIFY(log.steps.load() <= 31);    // not 60: they shared the steps
    QCOMPARE(joinedText(tokens, 1), expectedText(30));
    QCOMPARE(joinedText(tokens, 2), expectedText(30));
  }

  void cancelStopsAChatAndLeavesTheOther() {
    ThreadedWorker w(fakeEngineFactory({.step_delay_ms = 5}));
    w.load();
    auto& [tokens, finished, errors] = w.spies;
    w.submit({{1, 100000}, {2, 20}});
    QTRY_VERIFY_WITH_TIMEOUT(tokens.count() > 0, 5000);
    w.call([wk = w.worker] { wk->cancel(1); });
    QTRY_COMPARE_WITH_TIMEOUT(finished.count(), 2, 10000);
    auto by_chat = resultsByChat(finished);
    QCOMPARE(by_chat[1].end, GenerationEnd::Stopped);
    QCOMPARE(by_chat[1].reason, QStringLiteral("cancelled"));
    QCOMPARE(by_chat[2].end, GenerationEnd::Finished);
    QVERIFY(joinedText(tokens, 1).size() > 0);
  }

  void submitWithoutAModelFailsWithAMessage() {
    ThreadedWorker w(fakeEngineFactory());
    auto& [tokens, finished, errors] = w.spies;
    w.submit({{3, 5}});
    QTRY_VERIFY_WITH_TIMEOUT(finished.count() > 0, 5000);
    const auto r = finished[0][0].value<GenerationResult>();
    QCOMPARE(r.end, GenerationEnd::Failed);
    QVERIFY(r.error.contains(QStringLiteral("No model")));
  }

  void refusedSubmitFailsThatChatOnly() {
    ThreadedWorker w(fakeEngineFactory({.refuse_submit = true}));
    w.load();
    auto& [tokens, finished, errors] = w.spies;
    w.submit({{4, 5}});
    QTRY_VERIFY_WITH_TIMEOUT(finished.count() > 0, 5000);
    const auto r = finished[0][0].value<GenerationResult>();
    QCOMPARE(r.end, GenerationEnd::Failed);
    QVERIFY(r.error.contains(QStringLiteral("exceeds the context")));
    QCOMPARE(errors.count(), 0);
  }

  void badModelFileReportsLoadFailed() {
    ThreadedWorker w(fakeEngineFactory());
    QSignalSpy failed(w.worker, &EngineWorker::loadFailed);
    QSignalSpy progress(w.worker, &EngineWorker::loadProgress);
    w.call([wk = w.worker] { wk->loadModel("/models/broken.gguf", 4096, 8); });
    QTRY_VERIFY_WITH_TIMEOUT(failed.count() > 0, 5000);
    QCOMPARE(failed[0][0].toString(), QStringLiteral("/models/broken.gguf"));
    QVERIFY(failed[0][1].toString().contains(QStringLiteral("bad magic")));
    QVERIFY(progress.count() >= 1);
  }

  void failingStepReportsAnEngineErrorAndEndsTheChats() {
    ThreadedWorker w(fakeEngineFactory({.fail_at_step = 3}));
    w.load();
    auto& [tokens, finished, errors] = w.spies;
    w.submit({{1, 50}, {2, 50}});
    QTRY_VERIFY_WITH_TIMEOUT(errors.count() > 0, 5000);
    QTRY_COMPARE_WITH_TIMEOUT(finished.count(), 2, 5000);
    for (const GenerationResult& r : results(finished)) {
      QCOMPARE(r.end, GenerationEnd::Failed);
      QVERIFY(r.error.contains(QStringLiteral("illegal memory access")));
    }
    // The worker stays usable: the next request runs (the fake fails only step 3).
    w.submit({{5, 3}});
    QTRY_COMPARE_WITH_TIMEOUT(finished.count(), 3, 5000);
    QCOMPARE(finished[2][0].value<GenerationResult>().end, GenerationEnd::Finished);
  }

  // The engine's own route for a failed step (a forward pass or sampler error): the affected
  // chat ends with on_finish(Error) and step() goes on. Only that chat fails, with the
  // engine's message; the other finishes all its tokens; no engine-wide error is raised.
  void engineReportedErrorFailsOnlyTheAffectedChat() {
    FakeEngineScript script;
    script.error_at_step = 2;
    script.error_only_nth = 1;
    ThreadedWorker w(fakeEngineFactory(script));
    w.load();
    auto& [tokens, finished, errors] = w.spies;
    w.submit({{1, 10}, {2, 10}});
    QTRY_COMPARE_WITH_TIMEOUT(finished.count(), 2, 5000);
    auto by_chat = resultsByChat(finished);
    QCOMPARE(by_chat[1].end, GenerationEnd::Failed);
    QCOMPARE(by_chat[1].error, QString::fromStdString(script.error_message));
    QCOMPARE(by_chat[2].end, GenerationEnd::Finished);
    QCOMPARE(joinedText(tokens, 1), expectedText(2));  // steps 0 and 1, then the failure
    QCOMPARE(joinedText(tokens, 2), expectedText(10));
    QCOMPARE(errors.count(), 0);
  }

  // The same route through the window: a reply that failed before its first token leaves the
  // chat (the model's row and its empty row in SQLite are removed) and the banner shows the
  // engine's message; one that failed after some text keeps that text, marked "error", in the
  // model and in SQLite.
  void failedReplyShowsInTheWindowAndAnEmptyOneLeavesSqlite() {
    QTemporaryDir dir;
    FakeEngineScript script;
    script.error_at_step = 0;
    {
      Application app(fakeEngineFactory(script), dir.filePath("empty.sqlite"));
      startWithFakeModel(app, dir);
      ChatController* chats = app.chats();
      const qint64 chat = chats->newChat();
      chats->send(QStringLiteral("hello"));
      QCOMPARE(chats->messages()->count(), 2);  // the user's and the reply being written
      QCOMPARE(app.store().messages(chat).size(), 2);
      QTRY_COMPARE_WITH_TIMEOUT(chats->generatingCount(), 0, 5000);
      QCOMPARE(chats->messages()->count(), 1);
      QCOMPARE(chats->messages()->message(0).role, QStringLiteral("user"));
      const auto stored = app.store().messages(chat);
      QCOMPARE(stored.size(), 1);
      QCOMPARE(stored[0].content, QStringLiteral("hello"));
      QVERIFY(app.errors()->active());
      QCOMPARE(app.errors()->message(), QString::fromStdString(script.error_message));
      QCOMPARE(app.errors()->hint(),
               QStringLiteral("The chat is kept; fix the cause and regenerate."));
      app.shutdown();
    }
    script.error_at_step = 3;
    Application app(fakeEngineFactory(script), dir.filePath("partial.sqlite"));
    startWithFakeModel(app, dir);
    ChatController* chats = app.chats();
    const qint64 chat = chats->newChat();
    replyTo(chats, 0, [&] { chats->send(QStringLiteral("hello")); });
    QCOMPARE(chats->messages()->count(), 2);
    QCOMPARE(chats->messages()->message(1).content, expectedText(3));
    QCOMPARE(chats->messages()->message(1).finish_reason, QStringLiteral("error"));
    const auto stored = app.store().messages(chat);
    QCOMPARE(stored.size(), 2);
    QCOMPARE(stored[1].content, expectedText(3));
    QCOMPARE(stored[1].finish_reason, QStringLiteral("error"));
    QCOMPARE(app.errors()->message(), QString::fromStdString(script.error_message));
    app.shutdown();
  }

  void lostDeviceEndsEveryChatTellsTheWindowOnceAndAReloadWorks() {
    ThreadedWorker w(fakeEngineFactory({.lose_device_at_step = 2}));
    w.load();
    auto& [tokens, finished, errors] = w.spies;
    w.submit({{1, 50}, {2, 50}});
    QTRY_COMPARE_WITH_TIMEOUT(finished.count(), 2, 5000);
    for (const GenerationResult& r : results(finished)) {
      QCOMPARE(r.end, GenerationEnd::Failed);
      QVERIFY(r.error.contains(QStringLiteral("reload the model")));
    }
    QTRY_COMPARE_WITH_TIMEOUT(errors.count(), 1, 5000);
    QVERIFY(errors[0][0].toString().contains(QStringLiteral("GPU stopped working")));
    // New work is refused with the reason until the model is loaded again...
    w.submit({{3, 5}});
    QTRY_COMPARE_WITH_TIMEOUT(finished.count(), 3, 5000);
    QVERIFY(finished[2][0].value<GenerationResult>().error.contains(QStringLiteral("reload")));
    QCOMPARE(errors.count(), 1);  // told once
    // ...and after a reload (a fresh engine: the real one resets the device) chats run again.
    w.load();
    w.submit({{4, 2}});
    QTRY_COMPARE_WITH_TIMEOUT(finished.count(), 4, 5000);
    QCOMPARE(finished[3][0].value<GenerationResult>().end, GenerationEnd::Finished);
  }

  void telemetryArrivesAtAboutTenHertzWithTheLedger() {
    ThreadedWorker w(fakeEngineFactory({.step_delay_ms = 5}));
    w.load();
    QSignalSpy telemetry(w.worker, &EngineWorker::telemetryUpdated);
    w.submit({{9, 100000}});
    // An event wait, then the rate on the frames' own clock (the worker's), so a loaded machine
    // that delays the test thread cannot skew it: at most ~10 a second (a coarse 100 ms timer
    // may fire 5% early), and not starved by the steps running between frames.
    QTRY_VERIFY_WITH_TIMEOUT(telemetry.count() >= 11, 20000);
    const qsizetype frames = telemetry.count();
    const double span = telemetry.last()[0].value<TelemetryFrame>().time_s -
                        telemetry.first()[0].value<TelemetryFrame>().time_s;
    const double hz = static_cast<double>(frames - 1) / span;
    QVERIFY2(span > 0 && hz <= 11.0 && hz >= 2.0,
             qPrintable(QString("%1 frames in %2 s: %3 Hz").arg(frames).arg(span).arg(hz)));
    const auto last = telemetry.last()[0].value<TelemetryFrame>();
    QVERIFY(last.has_engine);
    const granule::DeviceTelemetry& device = last.engine.device;
    using granule::MemoryCategory;
    QCOMPARE(device.ledger_bytes(MemoryCategory::WeightsResident), 100ull << 20);
    QVERIFY(device.ledger_bytes(MemoryCategory::KvCommitted) > 0);  // kv grows with tokens
    // The pool's granules have a category of their own, not "other".
    QCOMPARE(device.ledger_bytes(MemoryCategory::KvPool), last.engine.kv.pool_bytes);
    QVERIFY(last.engine.kv.pool_bytes > 0);
    QCOMPARE(device.ledger_bytes(MemoryCategory::Other), 0ull);
    QVERIFY(last.engine.kv.granules_mapped > 0);  // 64 KiB a token in 2 MiB granules
    QCOMPARE(device.ledger_bytes(MemoryCategory::KvReservedVa), 256ull << 20);
    QCOMPARE(last.chats.size(), 1);
    QCOMPARE(last.chats[0].chat_id, 9);  // mapped back to the chat
    QCOMPARE(last.chats[0].sequence.id, last.engine.sequences.at(0).id);
    QVERIFY(last.host.process_resident_bytes > 0);
    QVERIFY(last.time_s > telemetry.first()[0].value<TelemetryFrame>().time_s);
  }

  void shutdownDuringGenerationIsQuickAndFreesTheEngine() {
    FakeEngineLog log;
    auto* worker = new EngineWorker(fakeEngineFactory({.step_delay_ms = 20}, &log));
    QThread thread;
    worker->moveToThread(&thread);
    thread.start();
    QSignalSpy tokens(worker, &EngineWorker::tokensArrived);
    QMetaObject::invokeMethod(worker, [worker] {
      worker->start();
      worker->loadModel("/models/fake.gguf", 4096, 8);
      worker->submit(request(1, 100000));
      worker->submit(request(2, 100000));
    });
    QTRY_VERIFY_WITH_TIMEOUT(tokens.count() > 0, 5000);
    // Quick means it gets in between steps rather than waiting for 100000 tokens: counted in
    // steps, not milliseconds (a loaded machine stretches both). At most the step running and
    // the one queued (the worker queues one at a time) run after it is asked.
    const int steps_before = log.steps.load();
    QElapsedTimer timer;
    timer.start();
    QMetaObject::invokeMethod(worker, &EngineWorker::shutdown, Qt::BlockingQueuedConnection);
    const int steps_after = log.steps.load();
    QCOMPARE(log.destroyed.load(), 1);  // the engine is gone when shutdown() returns
    thread.quit();
    QVERIFY(thread.wait(30000));
    QVERIFY2(
        steps_after - steps_before <= 2,
        qPrintable(QString("%1 steps after shutdown was asked").arg(steps_after - steps_before)));
    qInfo("shutdown took %lld ms", static_cast<long long>(timer.elapsed()));
    delete worker;
  }

  // Engine::set_vram_budget through the worker: a smaller budget re-plans (layers stream),
  // one below the working set comes back as the engine's reason and changes nothing.
  void vramBudgetIsAppliedOrRefusedWithTheEnginesReason() {
    FakeEngineLog log;
    ThreadedWorker w(fakeEngineFactory({}, &log));
    w.load();
    auto& [tokens, finished, errors] = w.spies;
    QSignalSpy telemetry(w.worker, &EngineWorker::telemetryUpdated);
    QSignalSpy applied(w.worker, &EngineWorker::budgetApplied);
    QSignalSpy refused(w.worker, &EngineWorker::budgetRefused);
    w.call([wk = w.worker] { wk->setVramBudget(64ull << 20); });
    QTRY_COMPARE_WITH_TIMEOUT(applied.count(), 1, 5000);
    QCOMPARE(applied[0][0].toULongLong(), 64ull << 20);
    QCOMPARE(log.budget_changes.load(), 1);
    const int frames_before = static_cast<int>(telemetry.count());
    QTRY_VERIFY_WITH_TIMEOUT(telemetry.count() > frames_before, 2000);
    const auto frame = telemetry.last()[0].value<TelemetryFrame>();
    QCOMPARE(frame.engine.device.budget_bytes, 64ull << 20);
    QVERIFY(frame.engine.streaming.layers_streamed > 0);
    QCOMPARE(frame.engine.streaming.replans, 1u);
    w.call([wk = w.worker] { wk->setVramBudget(16ull << 20); });
    QTRY_COMPARE_WITH_TIMEOUT(refused.count(), 1, 5000);
    QCOMPARE(refused[0][0].toULongLong(), 16ull << 20);
    const QString reason = refused[0][1].toString();
    QVERIFY2(reason.contains(QStringLiteral("minimum working set")), qPrintable(reason));
    QVERIFY(!reason.contains(QLatin1Char('\n')));
    QCOMPARE(log.budget_changes.load(), 1);
    // The engine still generates.
    w.submit({{3, 5}});
    QTRY_COMPARE_WITH_TIMEOUT(finished.count(), 1, 5000);
    QCOMPARE(finished[0][0].value<GenerationResult>().end, GenerationEnd::Finished);
  }

  // The budget setting: remembered across starts, passed as EngineOptions.vram_budget_bytes
  // to the next load, applied to a loaded model at once; a refused one is the banner's line
  // and the setting goes back to the budget in force.
  void vramBudgetSettingPersistsReachesTheEngineAndRefusalsShowInTheBanner() {
    QTemporaryDir dir;
    const QString db = dir.filePath("granule.sqlite");
    {
      Application app(fakeEngineFactory(), db);
      QCOMPARE(app.model()->vramBudgetBytes(), 0.0);  // automatic by default
      app.model()->setVramBudgetBytes(512.0 * (1 << 20));
    }
    FakeEngineLog log;
    Application app(fakeEngineFactory({}, &log), db);
    QCOMPARE(app.model()->vramBudgetBytes(), 512.0 * (1 << 20));
    startWithFakeModel(app, dir);
    QCOMPARE(log.budget_at_open.load(), 512ull << 20);
    app.model()->setVramBudgetBytes(64.0 * (1 << 20));
    QTRY_COMPARE_WITH_TIMEOUT(log.budget_changes.load(), 1, 5000);
    QTRY_VERIFY_WITH_TIMEOUT(app.telemetry()->latest().engine.streaming.layers_streamed > 0, 5000);
    app.model()->setVramBudgetBytes(16.0 * (1 << 20));
    QTRY_VERIFY_WITH_TIMEOUT(app.errors()->active(), 5000);
    QVERIFY(app.errors()->message().contains(QStringLiteral("minimum working set")));
    QCOMPARE(app.errors()->hint(), QStringLiteral("The budget stays at 64.0 MiB."));
    QCOMPARE(app.model()->vramBudgetBytes(), 64.0 * (1 << 20));
    QVERIFY(app.model()->ready());
    QCOMPARE(app.store().setting(QStringLiteral("engine/vram_budget_bytes")),
             QString::number(64ull << 20));
    app.shutdown();
  }

  void applicationSavesStreamingChatsAtShutdownAndRestoresThem() {
    QTemporaryDir dir;
    const QString db = dir.filePath("granule.sqlite");
    qint64 first = 0, second = 0;
    {
      FakeEngineLog log;
      Application app(fakeEngineFactory({.step_delay_ms = 10}, &log), db);
      startWithFakeModel(app, dir);
      ChatController* chats = app.chats();
      first = chats->newChat();
      chats->send(QStringLiteral("Explain the KV cache"));
      second = chats->newChat();
      chats->setSystemPrompt(QStringLiteral("Answer in French."));
      chats->samplingEditor()->setTemperature(0.2);
      chats->send(QStringLiteral("Plan a trip"));
      QCOMPARE(chats->generatingCount(), 2);
      QTRY_VERIFY_WITH_TIMEOUT(chats->messagesOf(first)->message(1).content.size() > 10, 5000);
      QTRY_VERIFY_WITH_TIMEOUT(chats->messagesOf(second)->message(1).content.size() > 10, 5000);
      // Quick: the engine is released between steps, not after the replies (counted in steps,
      // as above; the worker queues one step at a time; one more may finish on a loaded machine
      // while this thread is descheduled between reading the count and shutdown()).
      const int steps_before = log.steps.load();
      app.shutdown();
      QCOMPARE(log.destroyed.load(), 1);
      QVERIFY2(log.steps.load() - steps_before <= 3,
               qPrintable(QString("%1 steps after shutdown").arg(log.steps.load() - steps_before)));
    }
    Application app(fakeEngineFactory(), db);
    app.chats()->loadFromStore();
    ChatController* chats = app.chats();
    QCOMPARE(chats->conversations()->count(), 2);
    for (qint64 id : {first, second}) {
      MessageModel* messages = chats->messagesOf(id);
      QCOMPARE(messages->count(), 2);
      QCOMPARE(messages->message(0).role, QStringLiteral("user"));
      QVERIFY(messages->message(1).content.startsWith(QStringLiteral("w0 w1 ")));
      QCOMPARE(messages->message(1).finish_reason, QStringLiteral("interrupted"));
    }
    chats->selectChat(second);
    QCOMPARE(chats->systemPrompt(), QStringLiteral("Answer in French."));
    QCOMPARE(chats->samplingEditor()->temperature(), 0.2);
    QCOMPARE(chats->currentTitle(), QStringLiteral("Plan a trip"));
  }

  // A chat database that is not one (text where SQLite expects its header): the app starts,
  // the banner says so in one line naming the file with the hint that chats are not saved,
  // the model loads, and at the end the file is byte for byte as it was (nothing migrated,
  // written or truncated).
  void corruptChatDatabaseAtStartIsOneLineAndTheFileIsKept() {
    QTemporaryDir dir;
    const QString db = dir.filePath("granule.sqlite");
    QByteArray junk;
    for (int i = 0; i < 256; ++i) junk += "my chats, but not a database\n";
    {
      QFile f(db);
      QVERIFY(f.open(QIODevice::WriteOnly));
      f.write(junk);
    }
    {
      Application app(fakeEngineFactory(), db);
      app.start(fakeModelFile(dir));
      QVERIFY(app.errors()->active());
      const QString message = app.errors()->message();
      QVERIFY2(message.contains(db) && !message.contains(QLatin1Char('\n')), qPrintable(message));
      QCOMPARE(app.errors()->hint(), QStringLiteral("Chats will not be saved this session."));
      QTRY_VERIFY_WITH_TIMEOUT(app.model()->ready(), 5000);
      ChatController* chats = app.chats();
      chats->newChat();
      replyTo(chats, 3, [&] { chats->send(QStringLiteral("hello")); });
      // Known gap (ChatController, not the store): without a database a new chat cannot be
      // created ("Could not save a new chat."), so nothing replies although the hint says the
      // chats only go unsaved. XPASS once chats live in memory without a store.
      QEXPECT_FAIL("", "ChatController needs the store to create a chat", Continue);
      QCOMPARE(chats->messages()->count(), 2);
      app.shutdown();
    }
    QFile f(db);
    QVERIFY(f.open(QIODevice::ReadOnly));
    QVERIFY(f.readAll() == junk);
  }

  // Regenerate and edit add versions instead of deleting: ‹ › switches between them, and each
  // version keeps its own later turns; the store holds every message.
  void regenerateAndEditKeepVersionsWithTheirBranches() {
    QTemporaryDir dir;
    Application app(fakeEngineFactory(), dir.filePath("granule.sqlite"));
    startWithFakeModel(app, dir);
    ChatController* chats = app.chats();
    const qint64 chat = chats->newChat();
    replyTo(chats, 4, [&] { chats->send(QStringLiteral("first")); });
    replyTo(chats, 0, [&] { chats->send(QStringLiteral("follow-up")); });
    MessageModel* messages = chats->messages();
    QCOMPARE(messages->count(), 4);
    const qint64 first_answer = messages->message(1).id;

    replyTo(chats, 2, [&] { chats->regenerate(1); });  // the follow-up turn stays with version 1
    QCOMPARE(messages->count(), 2);
    QCOMPARE(messages->message(1).content, expectedText(2));
    QCOMPARE(messages->data(messages->index(1), MessageModel::VersionRole).toInt(), 2);
    QCOMPARE(messages->data(messages->index(1), MessageModel::VersionCountRole).toInt(), 2);
    replyTo(chats, 3, [&] { chats->regenerate(1); });
    QCOMPARE(messages->message(1).version, 3);
    QCOMPARE(messages->message(1).version_count, 3);

    chats->switchVersion(1, -1);
    QCOMPARE(messages->message(1).content, expectedText(2));
    chats->switchVersion(1, -1);
    QCOMPARE(messages->message(1).id, first_answer);
    QCOMPARE(messages->count(), 4);  // version 1's later turns are back
    QCOMPARE(messages->message(2).content, QStringLiteral("follow-up"));
    chats->switchVersion(1, -1);  // no version 0
    QCOMPARE(messages->message(1).id, first_answer);

    replyTo(chats, 4, [&] { chats->editAndResend(0, QStringLiteral("second")); });
    QCOMPARE(messages->count(), 2);
    QCOMPARE(messages->message(0).content, QStringLiteral("second"));
    QCOMPARE(messages->message(0).version_count, 2);
    QCOMPARE(messages->message(1).version_count, 1);
    chats->switchVersion(0, -1);
    QCOMPARE(messages->message(0).content, QStringLiteral("first"));
    QCOMPARE(messages->count(), 4);
    QCOMPARE(messages->message(1).version, 1);
    QCOMPARE(messages->message(1).version_count, 3);
    // Every message is still in the store: 2 questions, 3+1 answers, the follow-up and its answer.
    QCOMPARE(app.store().allMessages(chat).size(), 8);
    app.shutdown();

    // After a restart the chat opens on the version last shown.
    Application again(fakeEngineFactory(), dir.filePath("granule.sqlite"));
    again.chats()->loadFromStore();
    MessageModel* reopened = again.chats()->messagesOf(chat);
    QCOMPARE(reopened->count(), 4);
    QCOMPARE(reopened->message(0).content, QStringLiteral("first"));
    QCOMPARE(reopened->message(1).id, first_answer);
  }

  // A reply cut at the length limit says so, and Continue writes on in the same message.
  void continueExtendsAReplyCutAtTheLengthLimit() {
    QTemporaryDir dir;
    Application app(fakeEngineFactory(), dir.filePath("granule.sqlite"));
    startWithFakeModel(app, dir);
    ChatController* chats = app.chats();
    const qint64 chat = chats->newChat();
    replyTo(chats, 3, [&] { chats->send(QStringLiteral("tell me a story")); });
    MessageModel* messages = chats->messages();
    QCOMPARE(messages->message(1).finish_reason, QStringLiteral("length"));
    const qint64 id = messages->message(1).id;
    const int prompt = messages->message(1).prompt_tokens;
    QCOMPARE(prompt, 4 + 4);  // the fake's count: four words and four per message
    QCOMPARE(messages->contextTokens(), prompt + 3);
    chats->continueReply(0);  // not an assistant message: ignored
    QCOMPARE(chats->generatingCount(), 0);
    chats->continueReply(1);
    QCOMPARE(chats->generatingCount(), 1);
    QTRY_COMPARE_WITH_TIMEOUT(chats->generatingCount(), 0, 5000);
    QCOMPARE(messages->count(), 2);
    QCOMPARE(messages->message(1).id, id);
    QCOMPARE(messages->message(1).content, expectedText(3) + expectedText(3));
    QCOMPARE(messages->message(1).token_count, 6);
    // The continuation's prompt is the history and the reply so far (3 words).
    QCOMPARE(messages->message(1).prompt_tokens, prompt + 3);
    const auto stored = app.store().messages(chat);
    QCOMPARE(stored.size(), 2);
    QCOMPARE(stored[1].content, expectedText(3) + expectedText(3));
    QCOMPARE(stored[1].token_count, 6);
    app.shutdown();
  }

  // Tokens, prompt size and time to first token are stored with each reply and read back
  // after a restart; a chat export writes the same figures.
  void replyFiguresSurviveARestartAndExport() {
    QTemporaryDir dir;
    const QString db = dir.filePath("granule.sqlite");
    qint64 chat = 0;
    {
      Application app(fakeEngineFactory({.step_delay_ms = 5}), db);
      startWithFakeModel(app, dir);
      chat = app.chats()->newChat();
      app.chats()->samplingEditor()->setMaxTokens(5);
      app.chats()->send(QStringLiteral("# Hello **there**"));
      QTRY_COMPARE_WITH_TIMEOUT(app.chats()->generatingCount(), 0, 5000);
      QCOMPARE(app.chats()->currentTitle(), QStringLiteral("Hello there"));
      QVERIFY(app.chats()->exportChat(QUrl::fromLocalFile(dir.filePath("chat.md")), "markdown"));
      QVERIFY(app.chats()->exportChat(QUrl::fromLocalFile(dir.filePath("chat.json")), "json"));
      QVERIFY(!app.chats()->exportChat(QUrl::fromLocalFile(dir.filePath("no/such/dir/x.md")),
                                       "markdown"));
      QVERIFY(app.errors()->message().contains(QStringLiteral("Could not export")));
      app.shutdown();
    }
    Application app(fakeEngineFactory(), db);
    app.chats()->loadFromStore();
    const StoredMessage reply = app.chats()->messagesOf(chat)->message(1);
    QCOMPARE(reply.token_count, 5);
    QCOMPARE(reply.prompt_tokens, 4 + 3);  // "#", "Hello", "**there**"
    QVERIFY(reply.time_to_first_token_ms > 0);
    QCOMPARE(app.chats()
                 ->messagesOf(chat)
                 ->data(app.chats()->messagesOf(chat)->index(1), MessageModel::TokenCountRole)
                 .toInt(),
             5);
    QFile md(dir.filePath("chat.md"));
    QVERIFY(md.open(QIODevice::ReadOnly));
    const QString text = QString::fromUtf8(md.readAll());
    QVERIFY2(text.contains(QStringLiteral("## You\n\n# Hello **there**")), qPrintable(text));
    QVERIFY(text.contains(expectedText(5).trimmed()));
    QFile json(dir.filePath("chat.json"));
    QVERIFY(json.open(QIODevice::ReadOnly));
    const QJsonObject root = QJsonDocument::fromJson(json.readAll()).object();
    QCOMPARE(root.value("messages").toArray().size(), 2);
    QCOMPARE(root.value("messages").toArray()[1].toObject().value("tokens").toInt(), 5);
  }

  // Ctrl+N on an empty "New chat" selects it instead of adding another.
  void newChatReusesAnEmptyOne() {
    QTemporaryDir dir;
    Application app(fakeEngineFactory(), dir.filePath("granule.sqlite"));
    startWithFakeModel(app, dir);
    ChatController* chats = app.chats();
    const qint64 a = chats->newChat();
    QCOMPARE(chats->newChat(), a);
    QCOMPARE(chats->newChat(), a);
    QCOMPARE(chats->conversations()->count(), 1);
    chats->samplingEditor()->setMaxTokens(2);
    chats->send(QStringLiteral("hi"));
    const qint64 b = chats->newChat();  // a has a message now
    QVERIFY(b != a);
    chats->selectChat(a);
    QCOMPARE(chats->newChat(), b);
    QCOMPARE(chats->conversations()->count(), 2);
    QTRY_COMPARE_WITH_TIMEOUT(chats->generatingCount(), 0, 5000);
    app.shutdown();
  }

  // The worker counts the tokens it receives: the recent tokens/s follows a generation and
  // is 0 once it is over.
  void recentThroughputFollowsGenerationAndIsZeroWhenIdle() {
    QTemporaryDir dir;
    Application app(fakeEngineFactory({.step_delay_ms = 10}), dir.filePath("granule.sqlite"));
    startWithFakeModel(app, dir);
    ChatController* chats = app.chats();
    chats->newChat();
    chats->samplingEditor()->setMaxTokens(60);
    chats->send(QStringLiteral("one"));
    TelemetryModel* telemetry = app.telemetry();
    QTRY_VERIFY_WITH_TIMEOUT(telemetry->recentTokensPerSecond() > 5, 5000);
    QTRY_COMPARE_WITH_TIMEOUT(chats->generatingCount(), 0, 10000);
    QTRY_COMPARE_WITH_TIMEOUT(telemetry->recentTokensPerSecond(), 0.0, 6000);
    app.shutdown();
  }

  // A chat held back while every slot is taken waits for a slot; one held back with a slot
  // free waits for memory.
  void waitingChatsSayWhetherForASlotOrForMemory() {
    for (const int slot_count : {1, 8}) {
      ThreadedWorker w(fakeEngineFactory({.step_delay_ms = 10, .max_running = 1}));
      QSignalSpy loaded(w.worker, &EngineWorker::modelLoaded);
      w.call([wk = w.worker, slot_count] { wk->loadModel("/models/fake.gguf", 4096, slot_count); });
      QTRY_VERIFY_WITH_TIMEOUT(loaded.count() > 0, 5000);
      // Frames land on this (the GUI) thread, as the window gets them.
      std::optional<TelemetryFrame> latest;
      QObject context;
      connect(
          w.worker, &EngineWorker::telemetryUpdated, &context,
          [&latest](const TelemetryFrame& f) { latest = f; }, Qt::QueuedConnection);
      w.call([wk = w.worker] {
        wk->submit(request(1, 50));
        wk->submit(request(2, 50));
      });
      auto waiting = [&](qint64 chat) -> std::optional<bool> {
        if (!latest) return std::nullopt;
        for (const ChatTelemetry& c : latest->chats)
          if (c.chat_id == chat && c.sequence.waiting) return c.waiting_for_slot;
        return std::nullopt;
      };
      QTRY_VERIFY_WITH_TIMEOUT(waiting(2).has_value(), 5000);
      QCOMPARE(*waiting(2), slot_count == 1);
      QVERIFY(!waiting(1).has_value());
    }
  }

  void deleteCanBeUndoneAndSearchFilters() {
    QTemporaryDir dir;
    Application app(fakeEngineFactory(), dir.filePath("granule.sqlite"));
    startWithFakeModel(app, dir);
    ChatController* chats = app.chats();
    const qint64 a = chats->newChat();
    chats->renameChat(a, QStringLiteral("Recipes"));
    const qint64 b = chats->newChat();
    chats->renameChat(b, QStringLiteral("KV cache"));
    chats->setSearchText(QStringLiteral("recip"));
    QCOMPARE(chats->conversations()->count(), 1);
    QCOMPARE(chats->conversations()->idAt(0), a);
    chats->setSearchText({});
    chats->deleteChat(a);
    QCOMPARE(chats->conversations()->count(), 1);
    QCOMPARE(chats->deletedTitle(), QStringLiteral("Recipes"));
    chats->undoDelete();
    QCOMPARE(chats->conversations()->count(), 2);
    QCOMPARE(chats->currentChatId(), a);
    QCOMPARE(app.store().conversations().size(), 2);
    app.shutdown();
  }

  void realEngineGeneratesOnASyntheticModel() {
    QTemporaryDir dir;
    ThreadedWorker w(granuleEngineFactory());
    auto& [tokens, finished, errors] = w.spies;
    ModelInfo info;
    QCOMPARE(w.loadFile(writeTinyModel(dir), 256, 2, 20000, &info), QString());
    QCOMPARE(info.layers, 2);
    w.call([wk = w.worker] {
      GenerationRequest r = request(1, 8);
      r.sampling.seed = 42;
      wk->submit(r);
      r.chat_id = 2;
      wk->submit(r);
    });
    QTRY_COMPARE_WITH_TIMEOUT(finished.count(), 2, 30000);
    for (const GenerationResult& r : results(finished)) {
      QVERIFY2(r.end == GenerationEnd::Finished, qPrintable(r.error));
    }
    int token_count = 0;
    for (const TokenChunk& c : chunks(tokens)) token_count += c.tokens;
    qInfo("synthetic model: %d tokens over two chats", token_count);
    QVERIFY(token_count > 0 && token_count <= 16);
  }

  // A chat keeps its KV between turns on the real engine: the worker names the chat as the
  // request's session, so the second turn reads the first turn's prompt from the kept KV.
  void realEngineKeepsAChatsKvBetweenTurns() {
    QTemporaryDir dir;
    ThreadedWorker w(granuleEngineFactory());
    auto& [tokens, finished, errors] = w.spies;
    QCOMPARE(w.loadFile(writeTinyModel(dir), 256, 2, 20000), QString());
    GenerationRequest turn = request(5, 6);
    turn.sampling.seed = 3;
    w.call([wk = w.worker, turn] { wk->submit(turn); });
    QTRY_COMPARE_WITH_TIMEOUT(finished.count(), 1, 30000);
    QString reply;
    qint32 first_reused = -1;
    for (const TokenChunk& c : chunks(tokens)) {
      reply += c.text;
      if (first_reused < 0) first_reused = c.reused_tokens;
    }
    QCOMPARE(first_reused, 0);
    tokens.clear();
    turn.messages.append(PromptMessage{"assistant", reply});
    turn.messages.append(PromptMessage{"user", "and then?"});
    w.call([wk = w.worker, turn] { wk->submit(turn); });
    QTRY_COMPARE_WITH_TIMEOUT(finished.count(), 2, 30000);
    qint32 reused = -1, prompt = 0;
    for (const TokenChunk& c : chunks(tokens))
      if (reused < 0) {
        reused = c.reused_tokens;
        prompt = c.prompt_tokens;
      }
    qInfo("second turn: %d prompt tokens, %d reused", prompt, reused);
    QVERIFY2(reused > 0 && reused < prompt,
             qPrintable(QString("%1 of %2").arg(reused).arg(prompt)));
  }

  // Continue on the real engine: the prompt is the history with the assistant header and the
  // reply so far (longer than the history alone), and the model writes on.
  void realEngineContinuesAReply() {
    QTemporaryDir dir;
    ThreadedWorker w(granuleEngineFactory());
    auto& [tokens, finished, errors] = w.spies;
    QCOMPARE(w.loadFile(writeTinyModel(dir), 256, 2, 20000), QString());
    w.call([wk = w.worker] {
      GenerationRequest fresh = request(1, 4);
      fresh.sampling.seed = 7;
      wk->submit(fresh);
      GenerationRequest more = fresh;
      more.chat_id = 2;
      more.messages.append(PromptMessage{"assistant", "Once upon a time there was"});
      more.continue_last = true;
      wk->submit(more);
    });
    QTRY_COMPARE_WITH_TIMEOUT(finished.count(), 2, 30000);
    auto by_chat = resultsByChat(finished);
    QVERIFY2(by_chat[2].end == GenerationEnd::Finished, qPrintable(by_chat[2].error));
    QVERIFY(by_chat[1].prompt_tokens > 0);
    // The partial reply's tokens follow the same history and assistant header.
    QVERIFY2(by_chat[2].prompt_tokens > by_chat[1].prompt_tokens,
             qPrintable(
                 QString("%1 vs %2").arg(by_chat[2].prompt_tokens).arg(by_chat[1].prompt_tokens)));
  }

  void realEngineOnTheDefaultModel() {
    const QString path = defaultModelPath();
    if (path.isEmpty()) QSKIP("default model not present (SmolLM2-135M-Instruct.Q4_1.gguf)");
    ThreadedWorker w(granuleEngineFactory());
    auto& [tokens, finished, errors] = w.spies;
    ModelInfo info;
    QCOMPARE(w.loadFile(path, 1024, 2, 60000, &info), QString());
    QCOMPARE(info.layers, 30);
    QCOMPARE(info.block_type, QStringLiteral("Q4_1"));
    w.call([wk = w.worker] {
      GenerationRequest r;
      r.chat_id = 1;
      r.messages = {{"user", "What is the capital of France?"}};
      r.sampling.temperature = 0;
      r.sampling.max_tokens = 12;
      wk->submit(r);
    });
    QTRY_COMPARE_WITH_TIMEOUT(finished.count(), 1, 120000);
    QCOMPARE(finished[0][0].value<GenerationResult>().end, GenerationEnd::Finished);
    QVERIFY(joinedText(tokens, 1).contains(QStringLiteral("Paris")));
  }
};

QTEST_GUILESS_MAIN(WorkerTest)
#include "app_worker_test.moc"
