// EngineWorker: the QObject that owns the inference engine on its own QThread. The GUI
// reaches it only through queued signals carrying plain values (worker_types.h); it
// batches every running chat into the engine's steps and streams text back at ~60 Hz.
// When asked, it also serves the OpenAI API from the same engine (ApiServerHost): the
// server's requests join the chats' steps and carry their own sinks. A chat that runs on an
// endpoint's model (GenerationRequest::engine) streams from a remote engine the worker opens
// beside the loaded one, on first use, and steps with it.
#pragma once
#include <QElapsedTimer>
#include <QObject>
#include <QTimer>
#include <map>
#include <memory>
#include <vector>

#include "api_server_host.h"
#include "granule/reasoning.h"
#include "inference_engine.h"
#include "reply_parser.h"
#include "worker_types.h"

namespace granule::app {

class EngineWorker : public QObject {
  Q_OBJECT

 public:
  static constexpr int kTokenFlushIntervalMs = 16;  // ~60 Hz to the GUI
  static constexpr int kTelemetryIntervalMs = 100;  // ~10 Hz

  explicit EngineWorker(EngineFactory factory, QObject* parent = nullptr);
  ~EngineWorker() override;
  // How chats' endpoint engines are opened; without it a chat on an endpoint is refused.
  // Set before the worker moves to its thread.
  void setRemoteEngineFactory(RemoteEngineFactory factory) { remote_factory_ = std::move(factory); }

 public Q_SLOTS:
  // Starts the telemetry clock; call once the worker lives in its thread.
  void start();
  // Asks the engine what the model needs (Engine::estimate); emits modelInspected or
  // inspectFailed. A budget of 0 lets the engine pick one (free memory minus a margin).
  void inspectModel(const QString& path, qint64 context_length, qint32 chats,
                    quint64 vram_budget_bytes = 0);
  // Opens the model (replacing a loaded one); emits loadProgress, then modelLoaded or loadFailed.
  void loadModel(const QString& path, qint64 context_length, qint32 chats,
                 quint64 vram_budget_bytes = 0);
  // Changes the loaded engine's VRAM budget between steps (Engine::set_vram_budget); emits
  // budgetApplied, or budgetRefused with the engine's one-line reason (the budget unchanged).
  void setVramBudget(quint64 bytes);
  // CPU threads for the next load (0: every core); a loaded engine keeps its own.
  void setCpuThreads(qint32 threads) { cpu_threads_ = threads; }
  // Queues a chat's generation; one per chat (a new one replaces a running one).
  void submit(const granule::app::GenerationRequest& request);
  void cancel(qint64 chat_id);
  // The engine the panels show: "" the loaded model's, or an endpoint's ("URL#model", the
  // open chat's) whose server metrics then fill the frames.
  void showEngine(const QString& ref);
  // Serves the OpenAI API from the loaded engine (or stops serving); emits servingChanged.
  // Kept across model loads: a new model is served once loaded, and the server is stopped
  // before an engine goes.
  void setServing(const granule::app::ServeSettings& settings);
  // Cancels everything, frees the engine and stops the timers; no signal follows it.
  // The application calls it with a blocking queued connection before quitting the thread.
  void shutdown();

 Q_SIGNALS:
  void modelInspected(const granule::app::ModelInfo& info, const granule::FitEstimate& fit);
  void inspectFailed(const QString& path, const QString& error);
  void loadProgress(double fraction, const QString& stage);
  void modelLoaded(const granule::app::ModelInfo& info);
  void loadFailed(const QString& path, const QString& error);
  void budgetApplied(quint64 bytes);
  void budgetRefused(quint64 bytes, const QString& error);
  void generationStarted(qint64 chat_id);
  void tokensArrived(const QList<granule::app::TokenChunk>& chunks);
  void generationFinished(const granule::app::GenerationResult& result);
  void telemetryUpdated(const granule::app::TelemetryFrame& frame);
  // An engine failure outside any one request (a failed step); generation stops.
  void engineError(const QString& message);
  void servingChanged(const granule::app::ServingStatus& status);
  // Settings of a chat's request that its engine does not apply (an endpoint's server takes
  // no top_k), one line; the window says so.
  void settingsNotApplied(qint64 chat_id, const QString& engine, const QString& lines);

 private:
  struct Finished {
    SequenceId sequence;
    FinishReason reason;
    std::string error;
  };

  void scheduleStep();
  void runStep();
  // Starts or stops the API server as serve_settings_ and the engine say.
  void applyServing();
  // Stops the API server and cancels the engine's sequences that were its requests.
  void stopServing();
  void runServerTasks();
  void flushTokens();
  void deliverFinished();
  // Ends the chats running on `engine` (every engine when null) with `message`.
  void failAll(const QString& message, InferenceEngine* engine = nullptr);
  void releaseEngine();
  // The engine a request runs on, opening an endpoint's on first use; null with `error` set.
  InferenceEngine* engineFor(const GenerationRequest& request, QString* error);
  InferenceEngine* engineOfChat(qint64 chat_id) const;
  // Forgets a sequence's records (the chat, prompt figures, parser, engine).
  void forgetSequence(SequenceId seq);
  bool anyEngine() const { return engine_ || !remotes_.empty(); }
  void emitTelemetry();
  TelemetryFrame makeFrame() const;

  EngineFactory factory_;
  std::unique_ptr<InferenceEngine> engine_;
  // Chats' engines on endpoints, by "URL#model", with the key and stall timeout each was opened
  // with. Their sequence ids start at 2^40 apart, so one id names one sequence across every
  // engine.
  struct RemoteEngine {
    std::unique_ptr<InferenceEngine> engine;
    QString api_key;
    qint32 stall_timeout_seconds = kDefaultStallTimeoutSeconds;
  };
  RemoteEngineFactory remote_factory_;
  std::map<QString, RemoteEngine> remotes_;
  SequenceId next_remote_first_id_ = SequenceId{1} << 40;
  std::map<SequenceId, InferenceEngine*> engine_of_sequence_;
  QString shown_engine_;
  bool device_lost_reported_ = false;  // the engine's lost device, told to the window once
  QTimer telemetry_timer_;
  QElapsedTimer clock_;
  QElapsedTimer since_flush_;
  bool step_queued_ = false;
  bool shut_down_ = false;
  qint32 cpu_threads_ = 0;
  std::map<SequenceId, qint64> chat_of_sequence_;
  std::map<qint64, SequenceId> sequence_of_chat_;
  std::map<SequenceId, qint32> prompt_tokens_;    // each running sequence's prompt length
  std::map<SequenceId, PromptInfo> prompt_info_;  // what the engine made of each prompt
  std::map<qint64, TokenChunk> pending_;          // text not yet sent, by chat
  // Each running sequence's reply parser, for a model whose template reasons or a chat that
  // offers tools.
  std::map<SequenceId, ReplyParser> reply_parsers_;
  quint64 generated_tokens_ = 0;
  qint32 slots_ = 0;  // chats the loaded engine runs at once (EngineOptions::max_sequences) //
                      // every token received, for the recent tokens/s
  std::vector<Finished> finished_;
  ServeSettings serve_settings_;
  ServingStatus serving_status_;
  std::string model_id_;  // the name the API lists: the model file's stem
  ApiServerHost api_server_;
};

}  // namespace granule::app
