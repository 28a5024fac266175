// Application: the window's services wired together — the chat store, the controllers
// and models on the GUI thread, and the EngineWorker on its own thread — with the fixed
// shutdown order: save chats, stop and join the worker (which frees the engine), then Qt.
#pragma once
#include <QObject>
#include <QThread>
#include <QVariantMap>

#include "chat_controller.h"
#include "chat_store.h"
#include "engine_worker.h"
#include "error_reporter.h"
#include "inference_engine.h"
#include "model_controller.h"
#include "telemetry_model.h"
#include "window_settings.h"

namespace granule::app {

class Application : public QObject {
  Q_OBJECT

 public:
  Application(EngineFactory factory, const QString& database_path, QObject* parent = nullptr);
  ~Application() override;

  // Starts the engine thread, reads the chats and, when `model_path` (or else the last
  // model, or else the default model) exists, loads it.
  void start(const QString& model_path = {});
  // Idempotent; after it no worker signal arrives and the engine is gone.
  void shutdown();

  ChatStore& store() { return store_; }
  ErrorReporter* errors() { return &errors_; }
  ChatController* chats() { return &chats_; }
  ModelController* model() { return &model_; }
  TelemetryModel* telemetry() { return &telemetry_; }
  WindowSettings* windowSettings() { return &window_settings_; }
  // Main.qml's required properties.
  QVariantMap windowProperties();

 private:
  void connectWorker();

  ChatStore store_;
  ErrorReporter errors_;
  ChatController chats_;
  ModelController model_;
  TelemetryModel telemetry_;
  WindowSettings window_settings_;
  QThread engine_thread_;
  EngineWorker* worker_;  // lives on engine_thread_; deleted after the thread ends
};

}  // namespace granule::app
