// Application: the window's services wired together — the chat store, the controllers
// and models on the GUI thread, and the EngineWorker on its own thread — with the fixed
// shutdown order: save chats, stop and join the worker (which stops the API server, then
// frees the engine), then Qt.
#pragma once
#include <QObject>
#include <QThread>
#include <QVariantMap>
#include <memory>
#include <optional>

#include "api_server_controller.h"
#include "chat_controller.h"
#include "chat_store.h"
#include "endpoints_controller.h"
#include "engine_worker.h"
#include "error_reporter.h"
#include "hub_controller.h"
#include "inference_engine.h"
#include "mcp_controller.h"
#include "model_controller.h"
#include "telemetry_model.h"
#include "telemetry_replay.h"
#include "window_settings.h"

namespace granule::app {

class Application : public QObject {
  Q_OBJECT

 public:
  // `secrets`: where the endpoints' keys are kept (the system keychain when empty).
  Application(EngineFactory factory, const QString& database_path,
              std::shared_ptr<SecretStore> secrets = {}, QObject* parent = nullptr);
  ~Application() override;

  // Starts the engine thread, reads the chats and, when `model_path` (or else the last
  // model, or else the default model) exists, loads it.
  void start(const QString& model_path = {});
  // Starts without a model and plays the telemetry frames recorded in `frames_path` (JSON
  // lines) into the panels instead of the engine's; a file that cannot be read is a
  // one-line error in the banner (and the log) and the window stays up. Returns whether it
  // plays.
  bool startReplay(const QString& frames_path, double speed = 1.0, bool loop = false);
  // Idempotent; after it no worker signal arrives and the engine is gone.
  void shutdown();

  ChatStore& store() { return store_; }
  ErrorReporter* errors() { return &errors_; }
  ChatController* chats() { return &chats_; }
  ModelController* model() { return &model_; }
  TelemetryModel* telemetry() { return &telemetry_; }
  WindowSettings* windowSettings() { return &window_settings_; }
  ApiServerController* server() { return &server_; }
  HubController* hub() { return &hub_; }
  EndpointsController* endpoints() { return &endpoints_; }
  // How chats' engines on endpoints are opened (remoteEngineFactory() where the remote
  // client is built); call before start().
  void setRemoteEngineFactory(RemoteEngineFactory factory) {
    worker_->setRemoteEngineFactory(std::move(factory));
  }
  McpController* mcp() { return &mcp_; }
  TelemetryReplay* replay() { return replay_.get(); }
  // Telemetry frames not passed to the panels because they showed nothing new.
  qint64 droppedTelemetryFrames() const { return dropped_frames_; }
  // Main.qml's required properties.
  QVariantMap windowProperties();

 private:
  void connectWorker();
  // The chats, the engine thread and the worker's clock; no model.
  void startServices();
  void connectLiveTelemetry();

  ChatStore store_;
  ErrorReporter errors_;
  ChatController chats_;
  ModelController model_;
  TelemetryModel telemetry_;
  WindowSettings window_settings_;
  ApiServerController server_;
  HubController hub_;
  EndpointsController endpoints_;
  McpController mcp_;  // the MCP servers whose tools the chats offer
  std::unique_ptr<TelemetryReplay> replay_;
  QMetaObject::Connection live_telemetry_;
  std::optional<TelemetryFrame> shown_frame_;  // the last frame the panels got
  qint64 dropped_frames_ = 0;
  QThread engine_thread_;
  EngineWorker* worker_;  // lives on engine_thread_; deleted after the thread ends
};

}  // namespace granule::app
