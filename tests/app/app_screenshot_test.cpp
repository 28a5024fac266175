// Renders the main window offscreen — two chats generating at once, the memory panels
// moving, light and dark, the empty state and the fit preview — and saves PNGs under
// the build directory (GRANULE_SCREENSHOT_DIR) as test artifacts. With
// GRANULE_SCREENSHOT_MODEL=<gguf> the real engine runs that model instead of the script.
// The replay case plays a recorded weight-streaming session (written here in the engine's
// JSON-lines format) into the panels, as `granule --replay` does, and saves the dock too.
#include <QtQml/qqmlextensionplugin.h>

#include <QDir>
#include <QFile>
#include <QQmlApplicationEngine>
#include <QQuickItem>
#include <QQuickStyle>
#include <QQuickWindow>
#include <QTemporaryDir>
#include <QtTest>
#include <set>

#include "application.h"
#include "expert_recording.h"
#include "fake_inference_engine.h"
#include "granule/testkit/synthetic_model.h"
#include "telemetry_json_writer.h"
#include "window_screenshot.h"

Q_IMPORT_QML_PLUGIN(GranulePlugin)

using namespace granule::app;

namespace {

// A reply with prose, a list and a code block, streamed word by word.
std::vector<std::string> replyWords() {
  const std::string text =
      "The **KV cache** keeps each layer's keys and values for the tokens seen so far, so a "
      "new token attends to them without recomputing.\n\n- one entry per token and layer\n"
      "- grows as the chat grows\n\n```cpp\nstruct KvSlot {\n  uint8_t* base;   // never moves\n"
      "  size_t committed_bytes;\n};\n```\nGranule maps memory under each slot in 2 MiB granules. ";
  std::vector<std::string> words;
  std::string word;
  for (char c : text) {
    word += c;
    if (c == ' ' || c == '\n') {
      words.push_back(word);
      word.clear();
    }
  }
  if (!word.empty()) words.push_back(word);
  return words;
}

// The first visible item named `name` under `root` (delegates of a ListView included; a
// view keeps hidden ones for reuse), or null.
QQuickItem* findItem(QQuickItem* root, const QString& name) {
  if (root->objectName() == name && root->isVisible()) return root;
  for (QQuickItem* child : root->childItems())
    if (QQuickItem* found = findItem(child, name)) return found;
  return nullptr;
}

QString screenshotDir() {
  QDir().mkpath(QStringLiteral(GRANULE_SCREENSHOT_DIR));
  return QStringLiteral(GRANULE_SCREENSHOT_DIR);
}

// Distinct colours in a coarse sample: a blank or single-colour grab has very few.
int distinctColours(const QImage& image) {
  std::set<QRgb> colours;
  for (int y = 0; y < image.height(); y += 7)
    for (int x = 0; x < image.width(); x += 7) colours.insert(image.pixel(x, y));
  return static_cast<int>(colours.size());
}

// Two finished chats; returns the id of the empty one ("Trip plan: Kyoto").
qint64 seedChats(ChatStore& store) {
  const qint64 recipes =
      store.createConversation({0, "Recipes for a rainy day", "", {}, 1000, 1000}).value();
  store.insertMessage({0, recipes, 0, "user", "Something warm with lentils?", 0, "", 1000});
  store.insertMessage({0, recipes, 1, "assistant",
                       "Try a **red lentil soup**:\n\n1. Soften onion and garlic.\n2. Add lentils, "
                       "stock and cumin.\n3. Simmer 20 minutes, then blend.",
                       38.2, "eos", 1000});
  return store.createConversation({0, "Trip plan: Kyoto", "", {}, 2000, 2000}).value();
}

}  // namespace

class ScreenshotTest : public QObject {
  Q_OBJECT

 private:
  struct Session {
    explicit Session(EngineFactory factory, const QString& db) : app(std::move(factory), db) {}
    Application app;
    QQmlApplicationEngine qml;
    QQuickWindow* window = nullptr;
    qint64 trip_chat = 0;
  };

  std::unique_ptr<Session> open(EngineFactory factory, const QString& db, const QString& model_path,
                                const QString& replay_path = {}) {
    auto s = std::make_unique<Session>(std::move(factory), db);
    s->trip_chat = seedChats(s->app.store());
    s->qml.addImportPath(QStringLiteral("qrc:/qt/qml"));
    s->qml.setInitialProperties(s->app.windowProperties());
    s->qml.load(QUrl(QStringLiteral("qrc:/qt/qml/Granule/Main.qml")));
    if (s->qml.rootObjects().isEmpty()) return nullptr;
    s->window = qobject_cast<QQuickWindow*>(s->qml.rootObjects().first());
    if (replay_path.isEmpty())
      s->app.start(model_path);
    else if (!s->app.startReplay(replay_path, 10.0, false))
      return nullptr;
    return s;
  }
  // open() on an empty model file in `dir` (the scripted engine reads nothing), once the
  // model is ready; nullptr when the window does not load or the model is not ready in time.
  std::unique_ptr<Session> openOnFakeModel(const QTemporaryDir& dir, EngineFactory factory,
                                           int ready_within_ms = 10000) {
    const QString model_path = dir.filePath("fake.gguf");
    QFile(model_path).open(QIODevice::WriteOnly);
    auto s = open(std::move(factory), dir.filePath("granule.sqlite"), model_path);
    if (!s || !QTest::qWaitFor([&] { return s->app.model()->ready(); }, ready_within_ms))
      return nullptr;
    return s;
  }

  // The two chats both window tests show: the seeded trip chat asked again, and a new chat
  // about the KV cache (returned). Both answers may run 2000 tokens.
  qint64 askTwoChats(Session& s) {
    ChatController* chats = s.app.chats();
    chats->selectChat(s.trip_chat);
    chats->samplingEditor()->setMaxTokens(2000);
    chats->send(QStringLiteral("Plan three days in Kyoto, with one rainy-day option."));
    const qint64 kv_chat = chats->newChat();
    chats->samplingEditor()->setMaxTokens(2000);
    chats->send(QStringLiteral("Explain the KV cache, with a small code example."));
    return kv_chat;
  }

  void setTheme(Session& s, const QString& preference) {
    s.app.windowSettings()->setTheme(preference);
    QCOMPARE(s.app.windowSettings()->theme(), preference);
  }

  void save(QQuickWindow* window, const QString& name, bool dock_only = false) {
    QTest::qWait(150);  // let the scene graph catch up with the last changes
    QImage image = window->grabWindow();
    if (dock_only) {
      const QRect dock = memoryDockRect(window);
      QVERIFY(!dock.isEmpty());
      image = image.copy(dock);
      QVERIFY(!image.isNull());
      QVERIFY2(distinctColours(image) > 40, qPrintable(name + " looks blank"));
      QVERIFY(image.save(screenshotDir() + QLatin1Char('/') + name));
      qInfo("saved %s", qPrintable(screenshotDir() + QLatin1Char('/') + name));
      return;
    }
    QVERIFY(!image.isNull());
    QCOMPARE(image.size(), window->size() * window->devicePixelRatio());
    QVERIFY2(distinctColours(image) > 40, qPrintable(name + " looks blank"));
    const QString path = screenshotDir() + QLatin1Char('/') + name;
    QVERIFY(image.save(path));
    qInfo("saved %s", qPrintable(path));
  }
  // One panel of the dock, scrolled into view first when the dock's ScrollView hides it.
  void savePanel(QQuickWindow* window, QQuickItem* panel, const QString& name) {
    for (QQuickItem* p = panel->parentItem(); p; p = p->parentItem()) {
      if (p->inherits("QQuickFlickable")) {
        const double top =
            panel->mapToItem(p->property("contentItem").value<QQuickItem*>(), QPointF(0, 0)).y();
        const double room = p->height() - panel->height();
        p->setProperty("contentY", std::max(0.0, top - std::max(0.0, room)));
        break;
      }
    }
    QTest::qWait(200);
    const QRectF rect = panel->mapRectToScene(QRectF(0, 0, panel->width(), panel->height()));
    const QImage image = window->grabWindow().copy(rect.toAlignedRect().adjusted(-4, -4, 4, 4));
    QVERIFY(!image.isNull());
    QVERIFY2(distinctColours(image) > 20, qPrintable(name + " looks blank"));
    QVERIFY(image.save(screenshotDir() + QLatin1Char('/') + name));
    qInfo("saved %s", qPrintable(screenshotDir() + QLatin1Char('/') + name));
  }

 private Q_SLOTS:
  void initTestCase() { QQuickStyle::setStyle(QStringLiteral("Fusion")); }

  void twoChatsGeneratingWithPanels() {
    QTemporaryDir dir;
    QString model_path = qEnvironmentVariable("GRANULE_SCREENSHOT_MODEL");
    const bool real = !model_path.isEmpty();
    if (!real) {
      model_path = dir.filePath("fake.gguf");
      QFile(model_path).open(QIODevice::WriteOnly);
    }
    testing::FakeEngineScript script;
    script.step_delay_ms = 45;
    script.reply_words = replyWords();
    testing::FakeEngineLog log;
    auto s = open(real ? granuleEngineFactory() : testing::fakeEngineFactory(script, &log),
                  dir.filePath("granule.sqlite"), model_path);
    QVERIFY(s);
    QTRY_VERIFY_WITH_TIMEOUT(s->app.model()->ready(), 60000);
    ChatController* chats = s->app.chats();
    const qint64 kv_chat = askTwoChats(*s);
    QCOMPARE(chats->generatingCount(), 2);
    // Long enough for several telemetry frames and a code block to stream in.
    QTRY_VERIFY_WITH_TIMEOUT(
        chats->messagesOf(kv_chat)->message(1).content.contains(QStringLiteral("```")) || real,
        20000);
    // Several telemetry frames (10 Hz from the engine thread between steps), waited for as an
    // event: a real model's CPU prefill steps can take seconds on a loaded machine, and frames
    // wait for them.
    QTRY_VERIFY_WITH_TIMEOUT(s->app.telemetry()->history().size() >= (real ? 3u : 10u),
                             real ? 120000 : 30000);
    QCOMPARE(chats->generatingCount(), 2);
    QVERIFY(s->app.telemetry()->rowCount() == 2);
    // The granule line has a pool.
    QVERIFY(real || s->app.telemetry()->latest().engine.kv.pool_bytes > 0);
    save(s->window,
         real ? QStringLiteral("main-real-light.png") : QStringLiteral("main-light.png"));
    setTheme(*s, QStringLiteral("dark"));
    QTest::qWait(500);
    save(s->window, real ? QStringLiteral("main-real-dark.png") : QStringLiteral("main-dark.png"));

    // Closing during generation: saved and joined between engine steps, not after the replies
    // (counted in steps, which a loaded machine does not stretch; the worker queues one step at
    // a time). The time is printed.
    QElapsedTimer timer;
    timer.start();
    const int steps_before = log.steps.load();
    s->window->close();
    s->app.shutdown();
    qInfo("closed during generation in %lld ms", static_cast<long long>(timer.elapsed()));
    if (!real) {
      QCOMPARE(log.destroyed.load(), 1);
      QVERIFY2(log.steps.load() - steps_before <= 2,
               qPrintable(QString("%1 steps after closing").arg(log.steps.load() - steps_before)));
    }
    const auto stored = s->app.store().messages(kv_chat);
    QCOMPARE(stored.size(), 2);
    QVERIFY(!stored[1].content.isEmpty());
  }

  // An answer with three versions (‹ 2/3 ›), and a chat whose answers stopped for each
  // reason (a caption under each; Continue on the one cut at the length limit), with the
  // "model's view begins here" marker and the tokens / context meter in the chat header.
  void versionsAndStopReasons() {
    QTemporaryDir dir;
    auto s = openOnFakeModel(dir, testing::fakeEngineFactory(), 60000);
    QVERIFY(s);
    ChatStore& store = s->app.store();
    auto add = [&](qint64 chat, qint64 parent, int position, const char* role, const QString& text,
                   const char* reason, int tokens, int prompt) {
      StoredMessage m{0, chat, position, role, text, tokens ? 31.4 : 0, reason, 3000};
      m.parent_id = parent;
      m.token_count = tokens;
      m.prompt_tokens = prompt;
      m.time_to_first_token_ms = tokens ? 180 + tokens : 0;
      return store.insertMessage(m).value();
    };
    const qint64 stops =
        store.createConversation({0, "Why answers stop", "", {}, 3000, 3000}).value();
    qint64 parent = 0;
    const std::pair<const char*, const char*> turns[] = {
        {"eos", "A haiku about rain, please."},
        {"stop", "Count to five."},
        {"cancelled", "Write a long essay on tea."},
        {"interrupted", "List every prime below 100."},
        {"error", "Summarise the book."},
        {"length", "Tell me a story about a lighthouse."}};
    int position = 0, prompt = 40;
    for (const auto& [reason, question] : turns) {
      parent = add(stops, parent, position++, "user", question, "", 0, 0);
      const QString answer =
          QString(reason) == "error" ? QString()
          : QString(reason) == "length"
              ? QStringLiteral(
                    "The keeper climbed the hundred steps each night, and the lamp "
                    "turned over a sea that had")
              : QStringLiteral(
                    "Soft rain on the roof, / the kettle hums, the window fogs, / "
                    "a slow afternoon.");
      parent = add(stops, parent, position++, "assistant", answer, reason, 24, prompt);
      prompt += 60;
    }
    const qint64 versions =
        store.createConversation({0, "Three versions", "", {}, 4000, 4000}).value();
    const qint64 q =
        add(versions, 0, 0, "user", "Name a good first programming language.", "", 0, 0);
    add(versions, q, 1, "assistant", "**Python**: readable, with batteries included.", "eos", 9,
        30);
    const qint64 second =
        add(versions, q, 1, "assistant", "**Scratch** for children; then Python or JavaScript.",
            "eos", 12, 30);
    add(versions, q, 1, "assistant", "Whichever language your friends use.", "eos", 7, 30);
    QVERIFY(store.setActiveVersion(second));

    ChatController* chats = s->app.chats();
    chats->loadFromStore();
    chats->selectChat(versions);
    QCOMPARE(chats->messages()->message(1).version, 2);
    QCOMPARE(chats->messages()->message(1).version_count, 3);
    save(s->window, QStringLiteral("versions-light.png"));
    chats->switchVersion(1, 1);
    QCOMPARE(chats->messages()->message(1).version, 3);
    chats->selectChat(stops);
    chats->messages()->setViewStartRow(2);
    QTest::qWait(300);
    save(s->window, QStringLiteral("stop-reasons-light.png"));
    // The top of the chat: end of text and stop string, and the view marker.
    auto* view = s->window->findChild<QQuickItem*>(QStringLiteral("chatView"));
    QVERIFY(view);
    QMetaObject::invokeMethod(view, "positionViewAtBeginning");
    view->setProperty("following", false);
    save(s->window, QStringLiteral("stop-reasons-top-light.png"));
    setTheme(*s, QStringLiteral("dark"));
    QTest::qWait(300);
    save(s->window, QStringLiteral("stop-reasons-dark.png"));
    s->app.shutdown();
  }

  // A KV budget that holds one of two chats back: the memory panel marks it waiting and
  // counts it, and the running chat goes on. No room for a granule pool either, so each
  // step creates the granule it maps (a granule a token here) and the panel says so.
  void aChatWaitingForMemory() {
    QTemporaryDir dir;
    testing::FakeEngineScript script;
    script.step_delay_ms = 45;
    script.reply_words = replyWords();
    script.max_running = 1;
    script.kv_pool_granules = 0;
    script.granule_bytes = script.kv_bytes_per_token;
    auto s = openOnFakeModel(dir, testing::fakeEngineFactory(script), 60000);
    QVERIFY(s);
    const qint64 second = askTwoChats(*s);
    TelemetryModel* telemetry = s->app.telemetry();
    QTRY_COMPARE_WITH_TIMEOUT(telemetry->latest().engine.scheduler.waiting, 1, 5000);
    QTRY_COMPARE_WITH_TIMEOUT(telemetry->rowCount(), 2, 5000);
    int waiting_rows = 0;
    for (const ChatTelemetry& chat : telemetry->latest().chats)
      waiting_rows += chat.sequence.waiting;
    QCOMPARE(waiting_rows, 1);
    QTRY_VERIFY_WITH_TIMEOUT(telemetry->latest().engine.kv.last_granules_created > 0, 5000);
    QTest::qWait(800);
    // It has not started.
    QVERIFY(s->app.chats()->messagesOf(second)->message(1).content.isEmpty());
    save(s->window, QStringLiteral("kv-waiting-light.png"));
    s->app.shutdown();
  }

  // A recorded streaming session (30 s at 10 Hz, a re-plan to a smaller budget at 18 s)
  // replayed ten times faster: the three panels with layers streamed, the host-to-device
  // rate under the PCIe line, graph re-captures; then the budget control in the settings.
  void replayOfAStreamingSession() {
    QTemporaryDir dir;
    const QString frames = screenshotDir() + QStringLiteral("/streaming_session.jsonl");
    {
      QFile file(frames);
      QVERIFY(file.open(QIODevice::WriteOnly));
      file.write(testing::streamingSessionJsonl(30.0, 10.0, 18.0));
    }
    qputenv("GRANULE_DEFAULT_MODEL", dir.filePath("absent.gguf").toUtf8());
    auto s = open(testing::fakeEngineFactory(), dir.filePath("granule.sqlite"), {}, frames);
    QVERIFY(s);
    QTRY_VERIFY_WITH_TIMEOUT(s->app.replay()->finished(), 10000);
    TelemetryModel* telemetry = s->app.telemetry();
    QCOMPARE(telemetry->latest().engine.streaming.layers_streamed, 14);
    QCOMPARE(telemetry->latest().engine.graphs.recaptures, 2u);
    QVERIFY(telemetry->history().size() >= 300u);
    QVERIFY(!s->app.model()->ready());
    save(s->window, QStringLiteral("replay-light.png"));
    save(s->window, QStringLiteral("replay-dock-light.png"), true);
    setTheme(*s, QStringLiteral("dark"));
    QTest::qWait(300);
    save(s->window, QStringLiteral("replay-dark.png"));
    save(s->window, QStringLiteral("replay-dock-dark.png"), true);
    QObject* settings = s->window->findChild<QObject*>(QStringLiteral("settingsDialog"));
    QVERIFY(settings);
    QVERIFY(QMetaObject::invokeMethod(settings, "open"));
    QTest::qWait(500);
    save(s->window, QStringLiteral("settings-budget-dark.png"));
    s->app.shutdown();
    qunsetenv("GRANULE_DEFAULT_MODEL");
  }

  // A mixture of experts under a budget holding half its experts (48 layers × 128, top-8,
  // Zipf routing; tests/app/expert_recording.h), replayed: the expert panel's grid with the
  // hot experts moving into VRAM, its hit rate and PCIe figures, light and dark. The
  // recording stays beside the PNGs for replay_screenshot.sh.
  void replayOfAnExpertSession() {
    QTemporaryDir dir;
    const QString frames = screenshotDir() + QStringLiteral("/expert_session.jsonl");
    {
      QFile file(frames);
      QVERIFY(file.open(QIODevice::WriteOnly));
      testing::ExpertSessionSpec spec;
      spec.host_share = 0.5;  // half of the missed experts computed by the CPU
      file.write(testing::expertSessionJsonl(spec));
    }
    qputenv("GRANULE_DEFAULT_MODEL", dir.filePath("absent.gguf").toUtf8());
    auto s = open(testing::fakeEngineFactory(), dir.filePath("granule.sqlite"), {}, frames);
    QVERIFY(s);
    QTRY_VERIFY_WITH_TIMEOUT(s->app.replay()->finished(), 10000);
    QCOMPARE(s->app.telemetry()->latest().engine.experts.n_expert, 128);
    auto* panel = s->window->findChild<QQuickItem*>(QStringLiteral("expertPanel"));
    QVERIFY(panel);
    QTRY_VERIFY(panel->isVisible());
    save(s->window, QStringLiteral("experts-light.png"));
    save(s->window, QStringLiteral("experts-dock-light.png"), true);
    savePanel(s->window, panel, QStringLiteral("experts-panel-light.png"));
    setTheme(*s, QStringLiteral("dark"));
    QTest::qWait(300);
    save(s->window, QStringLiteral("experts-dark.png"));
    save(s->window, QStringLiteral("experts-dock-dark.png"), true);
    savePanel(s->window, panel, QStringLiteral("experts-panel-dark.png"));
    s->app.shutdown();
    qunsetenv("GRANULE_DEFAULT_MODEL");
  }

  void emptyStateWithoutAModel() {
    QTemporaryDir dir;
    qputenv("GRANULE_DEFAULT_MODEL", dir.filePath("absent.gguf").toUtf8());
    auto s = open(testing::fakeEngineFactory(), dir.filePath("granule.sqlite"), {});
    QVERIFY(s);
    s->app.chats()->deleteChat(s->app.chats()->conversations()->idAt(0));  // show "no messages"
    QTest::qWait(400);
    QVERIFY(!s->app.model()->ready());
    save(s->window, QStringLiteral("empty-light.png"));
    s->app.shutdown();
    qunsetenv("GRANULE_DEFAULT_MODEL");
  }

  void fitPreviewBeforeLoading() {
    QTemporaryDir dir;
    const QString model = dir.filePath("smollm2-shaped.gguf");
    granule::write_synthetic_model(granule::SyntheticModelSpec::preset("tiny"),
                                   model.toStdString());
    qputenv("GRANULE_DEFAULT_MODEL", dir.filePath("absent.gguf").toUtf8());
    auto s = open(testing::fakeEngineFactory(), dir.filePath("granule.sqlite"), {});
    QVERIFY(s);
    setTheme(*s, QStringLiteral("dark"));
    s->app.model()->previewFile(model);
    QTRY_COMPARE_WITH_TIMEOUT(s->app.model()->status(), ModelController::Status::Previewing, 10000);
    QVERIFY(s->app.model()->fits());
    QVERIFY(s->app.model()->fitSummary().startsWith(QStringLiteral("Fits")));
    QTest::qWait(400);  // the dialog's open transition
    save(s->window, QStringLiteral("fit-preview-dark.png"));
    s->app.model()->confirmLoad();
    QTRY_VERIFY_WITH_TIMEOUT(s->app.model()->ready(), 10000);
    s->app.shutdown();
    qunsetenv("GRANULE_DEFAULT_MODEL");
  }

  // The fit preview of a mixture of experts (qwen3-30b-a3b's shape on a 12 GiB budget, the
  // figures Engine::estimate gives for it): the expert plan below the layer strip. The file
  // previewed is a dense synthetic one; its estimate is replaced by the mixture's.
  void fitPreviewOfAMixtureOfExperts() {
    QTemporaryDir dir;
    const QString model = dir.filePath("qwen3-30b-a3b-shaped.gguf");
    granule::write_synthetic_model(granule::SyntheticModelSpec::preset("tiny"),
                                   model.toStdString());
    qputenv("GRANULE_DEFAULT_MODEL", dir.filePath("absent.gguf").toUtf8());
    auto s = open(testing::fakeEngineFactory(), dir.filePath("granule.sqlite"), {});
    QVERIFY(s);
    s->app.model()->previewFile(model);
    QTRY_COMPARE_WITH_TIMEOUT(s->app.model()->status(), ModelController::Status::Previewing, 10000);
    granule::FitEstimate fit;
    fit.config.name = "Qwen3 30B A3B";
    fit.config.architecture = "qwen3moe";
    fit.config.n_layer = 48;
    fit.config.context_length = 40960;
    fit.block_type = "Q4_K";
    fit.gpu = true;
    fit.device = "CUDA NVIDIA H200";
    fit.budget_bytes = 12ull << 30;
    fit.chats = 8;
    fit.context_per_chat = 4096;
    fit.kv_bytes_per_token = 98304;
    fit.workspace_bytes = (64ull << 20) + 151936 * 4;
    fit.kv_reserve_bytes = 512 * fit.kv_bytes_per_token;
    fit.loads = true;
    fit.minimum_budget_bytes = 1'004'042'240 + fit.workspace_bytes + fit.kv_reserve_bytes;
    fit.resident_layers = 48;
    fit.layer_streamed.assign(48, false);
    fit.experts.n_expert = 128;
    fit.experts.n_expert_used = 8;
    fit.experts.always_resident_bytes = 1'004'042'240;
    fit.experts.expert_bytes = 3'059'712;
    fit.experts.experts_bytes = 17'553'162'240;
    fit.weights_bytes = fit.experts.always_resident_bytes + fit.experts.experts_bytes;
    fit.experts.resident_experts = 3844;
    for (int l = 0; l < 48; ++l) fit.experts.resident_per_layer.push_back(l % 12 == 0 ? 81 : 80);
    // The host computing 160/256 of batch 1's missed experts: PCIe carries the rest.
    fit.experts.missed_bytes_per_token = 8 * 48 * (48.0 / 128) * 2.86e6;
    fit.experts.host_share = 160;
    fit.experts.pcie_bytes_per_token = fit.experts.missed_bytes_per_token * 96 / 256;
    fit.h2d_bytes_per_second = 55.4e9;
    fit.h2d_measured = true;
    fit.experts.pcie_tokens_per_second =
        fit.h2d_bytes_per_second / fit.experts.pcie_bytes_per_token;
    fit.pcie_tokens_per_second = fit.experts.pcie_tokens_per_second;
    fit.kv_capacity_tokens = 512;
    fit.max_context_per_chat = 64;
    ModelInfo info{model, "Qwen3 30B A3B", "qwen3moe", "Q4_K"};
    info.file_bytes = 18'557'204'480;
    info.parameters = 30'532'122'624;
    info.layers = 48;
    info.trained_context = 40960;
    s->app.model()->onModelInspected(info, fit);
    QCOMPARE(s->app.model()->fitExpertsPerLayer(), 128);
    QCOMPARE(s->app.model()->fitTotalExperts(), 6144);
    QCOMPARE(s->app.model()->fitFewestExpertsInALayer(), 80);
    QCOMPARE(s->app.model()->fitMostExpertsInALayer(), 81);
    QCOMPARE(s->app.model()->fitExpertHostShare(), 160);
    QTest::qWait(400);  // the dialog's open transition
    save(s->window, QStringLiteral("fit-preview-experts-light.png"));
    setTheme(*s, QStringLiteral("dark"));
    QTest::qWait(300);
    save(s->window, QStringLiteral("fit-preview-experts-dark.png"));
    // The same mixture planned for the CPU: which path its experts take there.
    fit.gpu = false;
    fit.device = "CPU";
    fit.budget_bytes = 24ull << 30;
    fit.experts.resident_experts = 6144;
    fit.experts.resident_per_layer.assign(48, 128);
    fit.experts.missed_bytes_per_token = 0;
    fit.experts.host_share = 0;
    fit.experts.pcie_bytes_per_token = 0;
    fit.experts.pcie_tokens_per_second = 0;
    fit.pcie_tokens_per_second = 0;
    fit.experts.cpu_int8_experts = false;
    fit.experts.cpu_copy_budget_bytes = 12ull << 30;
    s->app.model()->onModelInspected(info, fit);
    QVERIFY(!s->app.model()->fitGpu());
    QVERIFY(!s->app.model()->fitCpuInt8Experts());
    QTest::qWait(300);
    save(s->window, QStringLiteral("fit-preview-experts-cpu-exact-dark.png"));
    fit.experts.cpu_int8_experts = true;
    s->app.model()->onModelInspected(info, fit);
    QVERIFY(s->app.model()->fitCpuInt8Experts());
    QTest::qWait(300);
    save(s->window, QStringLiteral("fit-preview-experts-cpu-dark.png"));
    s->app.model()->cancelPreview();
    s->app.shutdown();
    qunsetenv("GRANULE_DEFAULT_MODEL");
  }

  void chatSettingsDrawerShowsTheChatsSettings() {
    QTemporaryDir dir;
    auto s = openOnFakeModel(dir, testing::fakeEngineFactory());
    QVERIFY(s);
    ChatController* chats = s->app.chats();
    chats->selectChat(s->trip_chat);
    chats->setSystemPrompt(
        QStringLiteral("You are a concise travel planner. Answer with a day-by-day list."));
    chats->samplingEditor()->setTemperature(0.4);
    chats->samplingEditor()->setMaxTokens(768);
    QObject* drawer = s->window->findChild<QObject*>(QStringLiteral("chatSettings"));
    QVERIFY(drawer);
    QVERIFY(QMetaObject::invokeMethod(drawer, "open"));
    QTest::qWait(1500);  // the drawer slides in
    QVERIFY(drawer->property("visible").toBool());
    save(s->window, QStringLiteral("chat-settings-light.png"));
    s->app.shutdown();
  }

  // A reasoning model's reply: the Thinking block open while it thinks, collapsed with its
  // duration once the answer starts, opened again by a click; the chat's reasoning setting
  // in the drawer, and "Off" reaching the template as enable_thinking false.
  void reasoningShowsACollapsibleThinkingBlock() {
    QTemporaryDir dir;
    testing::FakeEngineScript script;
    script.reasoning_format = "think";
    script.step_delay_ms = 40;
    script.reply_words = {"<think>", "\n",       "The ",    "user ",    "wants ",    "three ",
                          "days ",   "in ",      "Kyoto. ", "Rain ",    "is ",       "likely ",
                          "in ",     "June, ",   "so ",     "one ",     "indoor ",   "option ",
                          "each ",   "day.",     "\n",      "</think>", "\n\n",      "**Day ",
                          "1:** ",   "Fushimi ", "Inari ",  "at ",      "dawn; ",    "if ",
                          "it ",     "rains, ",  "the ",    "Kyoto ",   "National ", "Museum."};
    testing::FakeEngineLog log;
    auto s = openOnFakeModel(dir, testing::fakeEngineFactory(script, &log));
    QVERIFY(s);
    QCOMPARE(s->app.model()->reasoningFormat(), QStringLiteral("think"));
    ChatController* chats = s->app.chats();
    chats->selectChat(s->trip_chat);
    chats->samplingEditor()->setMaxTokens(36);
    chats->send(QStringLiteral("Plan three days in Kyoto, with one rainy-day option."));
    MessageModel* messages = chats->messages();
    const int row = 1;
    QTRY_VERIFY_WITH_TIMEOUT(
        messages->data(messages->index(row), MessageModel::ReasoningRole).toString().size() > 20,
        5000);
    QVERIFY(messages->data(messages->index(row), MessageModel::ThinkingRole).toBool());
    QVERIFY(messages->data(messages->index(row), MessageModel::ContentRole).toString().isEmpty());
    save(s->window, QStringLiteral("thinking-open-light.png"));

    QTRY_VERIFY_WITH_TIMEOUT(!chats->currentGenerating(), 10000);
    const QString reasoning =
        messages->data(messages->index(row), MessageModel::ReasoningRole).toString();
    QCOMPARE(reasoning,
             QStringLiteral("The user wants three days in Kyoto. Rain is likely in June, "
                            "so one indoor option each day."));
    QVERIFY(messages->data(messages->index(row), MessageModel::ContentRole)
                .toString()
                .startsWith(QStringLiteral("**Day 1:** Fushimi Inari")));
    QVERIFY(!messages->data(messages->index(row), MessageModel::ThinkingRole).toBool());
    QVERIFY(messages->data(messages->index(row), MessageModel::ReasoningMsRole).toDouble() > 0);
    save(s->window, QStringLiteral("thinking-collapsed-light.png"));

    // Stored with the message: a reloaded chat shows the same block.
    const QList<StoredMessage> stored = s->app.store().messages(s->trip_chat);
    QCOMPARE(stored.size(), 2);
    QCOMPARE(stored[1].reasoning, reasoning);

    setTheme(*s, QStringLiteral("dark"));
    QTest::qWait(200);
    QQuickItem* toggle = findItem(s->window->contentItem(), QStringLiteral("thinkingToggle"));
    QVERIFY(toggle);
    QQuickItem* block = toggle->parentItem();
    QVERIFY(block && !block->property("expanded").toBool());
    QVERIFY(QMetaObject::invokeMethod(toggle, "clicked"));
    QTRY_VERIFY(block->property("expanded").toBool());
    save(s->window, QStringLiteral("thinking-expanded-dark.png"));

    // The chat's setting: Off reaches the template as enable_thinking false.
    setTheme(*s, QStringLiteral("light"));
    QObject* drawer = s->window->findChild<QObject*>(QStringLiteral("chatSettings"));
    QVERIFY(drawer);
    QVERIFY(QMetaObject::invokeMethod(drawer, "open"));
    QTest::qWait(1500);  // the drawer slides in
    chats->samplingEditor()->setReasoning(QStringLiteral("off"));
    QTest::qWait(200);
    save(s->window, QStringLiteral("chat-settings-reasoning-light.png"));
    chats->send(QStringLiteral("And a fourth day?"));
    QTRY_COMPARE_WITH_TIMEOUT(log.last_enable_thinking.load(), 0, 5000);
    QTRY_VERIFY_WITH_TIMEOUT(!chats->currentGenerating(), 10000);
    s->app.shutdown();
  }

  void engineErrorShowsTheBanner() {
    QTemporaryDir dir;
    testing::FakeEngineScript script;
    script.fail_at_step = 2;
    auto s = openOnFakeModel(dir, testing::fakeEngineFactory(script));
    QVERIFY(s);
    s->app.chats()->newChat();
    s->app.chats()->send(QStringLiteral("Hello"));
    QTRY_VERIFY_WITH_TIMEOUT(s->app.errors()->active(), 5000);
    QVERIFY(s->app.errors()->message().contains(QStringLiteral("illegal memory access")));
    QVERIFY(s->window->isVisible());  // the window outlives the engine error
    save(s->window, QStringLiteral("error-banner-light.png"));
    s->app.shutdown();
  }
};

QTEST_MAIN(ScreenshotTest)
#include "app_screenshot_test.moc"
