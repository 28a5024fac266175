// Wiring between the GUI-thread objects and the engine thread, start-up and shutdown.
#include "application.h"

#include <QFileInfo>

#include "granule/log.h"
#include "telemetry_idle_filter.h"

namespace granule::app {

Application::Application(EngineFactory factory, const QString& database_path,
                         std::shared_ptr<SecretStore> secrets, QObject* parent)
    : QObject(parent),
      store_(database_path),
      chats_(store_, errors_),
      model_(errors_),
      window_settings_(store_),
      server_(store_, errors_),
      hub_(model_, errors_),
      endpoints_(store_, std::move(secrets)),
      mcp_(store_),
      worker_(new EngineWorker(std::move(factory))) {
  chats_.setTools(&mcp_);
  registerWorkerTypes();
  engine_thread_.setObjectName(QStringLiteral("granule-engine"));
  worker_->moveToThread(&engine_thread_);
  connectWorker();
  telemetry_.setTitleLookup([this](qint64 chat_id) {
    const StoredConversation* c = chats_.conversations()->find(chat_id);
    return c ? c->title : QStringLiteral("chat %1").arg(chat_id);
  });
  connect(&model_, &ModelController::statusChanged, this,
          [this] { chats_.setModelReady(model_.ready()); });
  connect(&model_, &ModelController::modelLoadedFrom, this, [this](const QString& path) {
    store_.setSetting(QStringLiteral("model/last_path"), path);
  });
  const int context =
      store_.setting(QStringLiteral("engine/context_length"), QStringLiteral("4096")).toInt();
  const int max_chats =
      store_.setting(QStringLiteral("engine/max_chats"), QStringLiteral("8")).toInt();
  const double vram_budget =
      store_.setting(QStringLiteral("engine/vram_budget_bytes"), QStringLiteral("0")).toDouble();
  model_.setContextLength(context);
  model_.setMaxChats(max_chats);
  model_.setVramBudgetBytes(vram_budget);
  model_.setCpuThreads(
      store_.setting(QStringLiteral("engine/cpu_threads"), QStringLiteral("0")).toInt());
  model_.setModelsFolder(store_.setting(QStringLiteral("model/folder")));
  chats_.setDefaultSampling(window_settings_.sampling());
  chats_.setEndpointAccess([this](const QString& base_url, QObject* context,
                                  std::function<void(const EndpointAccess&)> ready) {
    endpoints_.whenAccessReady(base_url, context, std::move(ready));
  });
  connect(&window_settings_, &WindowSettings::samplingChanged, this,
          [this] { chats_.setDefaultSampling(window_settings_.sampling()); });
  connect(&model_, &ModelController::optionsChanged, this, [this] {
    store_.setSetting(QStringLiteral("engine/context_length"),
                      QString::number(model_.contextLength()));
    store_.setSetting(QStringLiteral("engine/max_chats"), QString::number(model_.maxChats()));
    store_.setSetting(QStringLiteral("engine/vram_budget_bytes"),
                      QString::number(static_cast<quint64>(model_.vramBudgetBytes())));
    store_.setSetting(QStringLiteral("engine/cpu_threads"), QString::number(model_.cpuThreads()));
    store_.setSetting(QStringLiteral("model/folder"), model_.modelsFolder());
  });
}

Application::~Application() { shutdown(); }

void Application::connectWorker() {
  // Every connection crosses threads, so Qt queues it: the worker's values are copied.
  connect(&chats_, &ChatController::generationRequested, worker_, &EngineWorker::submit);
  connect(&chats_, &ChatController::cancelRequested, worker_, &EngineWorker::cancel);
  connect(&model_, &ModelController::inspectRequested, worker_, &EngineWorker::inspectModel);
  connect(&model_, &ModelController::loadRequested, worker_, &EngineWorker::loadModel);
  connect(&model_, &ModelController::vramBudgetRequested, worker_, &EngineWorker::setVramBudget);
  connect(&model_, &ModelController::cpuThreadsRequested, worker_, &EngineWorker::setCpuThreads);
  connect(worker_, &EngineWorker::budgetApplied, &model_, &ModelController::onBudgetApplied);
  connect(worker_, &EngineWorker::budgetRefused, &model_, &ModelController::onBudgetRefused);
  connect(worker_, &EngineWorker::tokensArrived, &chats_, &ChatController::onTokensArrived);
  connect(worker_, &EngineWorker::generationFinished, &chats_,
          &ChatController::onGenerationFinished);
  connect(worker_, &EngineWorker::settingsNotApplied, &chats_,
          &ChatController::onSettingsNotApplied);
  // The panels follow the open chat's engine (an endpoint's server metrics, or the local one).
  const auto show_engine = [this] {
    QMetaObject::invokeMethod(
        worker_, [w = worker_, ref = chats_.currentEngine()] { w->showEngine(ref); },
        Qt::QueuedConnection);
  };
  connect(&chats_, &ChatController::currentChatChanged, this, show_engine);
  connect(&chats_, &ChatController::settingsChanged, this, show_engine);
  connect(worker_, &EngineWorker::modelInspected, &model_, &ModelController::onModelInspected);
  connect(worker_, &EngineWorker::inspectFailed, &model_, &ModelController::onInspectFailed);
  connect(worker_, &EngineWorker::loadProgress, &model_, &ModelController::onLoadProgress);
  connect(worker_, &EngineWorker::modelLoaded, &model_, &ModelController::onModelLoaded);
  connect(worker_, &EngineWorker::loadFailed, &model_, &ModelController::onLoadFailed);
  connect(&server_, &ApiServerController::servingRequested, worker_, &EngineWorker::setServing);
  connect(worker_, &EngineWorker::servingChanged, &server_, &ApiServerController::onServingChanged);
  // Every frame, not only those the panels show: the request list follows the server.
  connect(worker_, &EngineWorker::telemetryUpdated, &server_, &ApiServerController::onTelemetry);
  connectLiveTelemetry();
  connect(worker_, &EngineWorker::engineError, &errors_, [this](const QString& message) {
    errors_.report(message, QStringLiteral("Generation stopped; the chats are kept."));
  });
}

void Application::startServices() {
  if (!store_.ok())
    errors_.report(store_.error(), QStringLiteral("Chats will not be saved this session."));
  chats_.loadFromStore();
  engine_thread_.start();
  QMetaObject::invokeMethod(worker_, &EngineWorker::start, Qt::QueuedConnection);
  // Before any model loads, so a server that was left on serves the first model.
  if (server_.enabled()) server_.apply();
}

void Application::start(const QString& model_path) {
  startServices();

  // A model on a server ("URL#model", remote_inference_engine.h) is opened like a file.
  const auto on_server = [](const QString& p) {
    return (p.startsWith(QLatin1String("http://")) || p.startsWith(QLatin1String("https://"))) &&
           p.contains(QLatin1Char('#'));
  };
  QString path = model_path;
  if (path.isEmpty()) {
    const QString last = store_.setting(QStringLiteral("model/last_path"));
    path = QFileInfo(last).isFile() || on_server(last) ? last : model_.defaultModelPath();
  }
  if (QFileInfo(path).isFile() || on_server(path)) {
    model_.load(path);
  } else if (!model_path.isEmpty()) {
    errors_.report(QStringLiteral("%1 does not exist.").arg(model_path),
                   QStringLiteral("Open a GGUF model."));
  }
}

bool Application::startReplay(const QString& frames_path, double speed, bool loop) {
  // The recording owns the panels: the worker's frames (no model, host figures) stay out.
  disconnect(live_telemetry_);
  startServices();
  ReplayFrames recorded = readTelemetryFrames(frames_path);
  if (!recorded.ok()) {
    granule::logger("app")->error("replay: {}", recorded.error.toStdString());
    errors_.report(recorded.error,
                   QStringLiteral("No telemetry to replay; the window works as usual."));
    connectLiveTelemetry();
    return false;
  }
  granule::logger("app")->info("replaying {} frames from {} at {}x{}", recorded.frames.size(),
                               frames_path.toStdString(), speed, loop ? ", looping" : "");
  telemetry_.setReplaySource(QFileInfo(frames_path).fileName());
  telemetry_.setTitleLookup(
      [](qint64 sequence) { return QStringLiteral("sequence %1").arg(sequence); });
  replay_ = std::make_unique<TelemetryReplay>(std::move(recorded.frames), &telemetry_);
  replay_->start(speed, loop ? TelemetryReplay::AtEnd::Loop : TelemetryReplay::AtEnd::Hold);
  return true;
}

void Application::connectLiveTelemetry() {
  // Only frames that change what the panels show: an idle window then repaints nothing.
  live_telemetry_ =
      connect(worker_, &EngineWorker::telemetryUpdated, this, [this](const TelemetryFrame& frame) {
        // While the recent tokens/s shown is above 0, every frame is shown, so the rate
        // decays to 0 once generation stops (it is computed from the frames themselves).
        if (shown_frame_ && telemetry_.recentTokensPerSecond() == 0.0 &&
            telemetryLooksTheSame(*shown_frame_, frame)) {
          ++dropped_frames_;
          return;
        }
        granule::logger("app")->debug("telemetry frame at {:.1f} s shown ({} dropped so far)",
                                      frame.time_s, dropped_frames_);
        shown_frame_ = frame;
        telemetry_.addFrame(frame);
      });
}

QVariantMap Application::windowProperties() {
  return {{QStringLiteral("chats"), QVariant::fromValue(&chats_)},
          {QStringLiteral("model"), QVariant::fromValue(&model_)},
          {QStringLiteral("telemetry"), QVariant::fromValue(&telemetry_)},
          {QStringLiteral("errors"), QVariant::fromValue(&errors_)},
          {QStringLiteral("settings"), QVariant::fromValue(&window_settings_)},
          {QStringLiteral("server"), QVariant::fromValue(&server_)},
          {QStringLiteral("hub"), QVariant::fromValue(&hub_)},
          {QStringLiteral("endpoints"), QVariant::fromValue(&endpoints_)}};
}

void Application::shutdown() {
  if (!worker_) return;
  if (replay_) replay_->stop();
  chats_.saveAll();
  if (engine_thread_.isRunning()) {
    // Blocking: returns once the step in progress (if any) ends and the engine is freed.
    QMetaObject::invokeMethod(worker_, &EngineWorker::shutdown, Qt::BlockingQueuedConnection);
    engine_thread_.quit();
    engine_thread_.wait();
  }
  delete worker_;
  worker_ = nullptr;
  granule::logger("app")->info("engine thread joined");
}

}  // namespace granule::app
