// RemoteInferenceEngine: the InferenceEngine of a model served by an OpenAI-compatible server
// (vLLM, SGLang, llama-server, a Granule server), so the window's worker runs a remote chat
// as it runs a local one. Each request streams on its own thread; step() hands what arrived
// to the sinks on the worker's thread. Telemetry comes from the server's /metrics, polled
// once a second; what the server does not expose stays unavailable.
#pragma once
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "inference_engine.h"
#include "remote/engine_metrics.h"
#include "remote/openai_client.h"

namespace granule::app {

// A model on an endpoint, as the window names it: "URL#model", e.g.
// "http://gpu-box:8000/v1#meta-llama/Llama-3.1-8B-Instruct".
struct RemoteModelRef {
  std::string base_url;
  std::string model;
};
// Nothing when `path` is not an http(s) URL with a "#model".
std::optional<RemoteModelRef> parseRemoteModelRef(const std::string& path);
std::string remoteModelRefText(const RemoteModelRef& ref);

// What a panel shows of a remote engine beyond TelemetrySnapshot's fields (which stay 0 where
// the server has no series, so these say what is available).
struct RemoteMetricsView {
  remote::MetricsDialect dialect = remote::MetricsDialect::None;
  remote::EngineMetrics metrics;
  remote::EngineRates rates;
  std::string error;  // why there are no metrics ("" when the last poll worked)
};

class RemoteInferenceEngine final : public InferenceEngine {
 public:
  // Opens the endpoint: lists its models and checks `ref.model` is one (throws granule::Error
  // with the fault's one line otherwise). `poll_metrics` false: no /metrics polling (tests).
  // Sequence ids start at `first_id`: the window's worker keeps one id space over its engines.
  // A stream that sends nothing for `stall_timeout_seconds` ends as stalled.
  RemoteInferenceEngine(const RemoteModelRef& ref, const std::string& api_key,
                        bool poll_metrics = true, SequenceId first_id = 1,
                        int32_t stall_timeout_seconds = kDefaultStallTimeoutSeconds);
  ~RemoteInferenceEngine() override;

  ModelInfo info() const override { return info_; }
  SequenceId submit(Request request) override;
  bool server_parses_tool_calls() const override { return true; }
  SequenceId submit_with_tools(Request request, const std::string& tool_choice,
                               ToolCallSink on_tool_call) override;
  void cancel(SequenceId id) override;
  bool step() override;
  bool idle() const override;
  TelemetrySnapshot telemetry() const override;
  void set_vram_budget(uint64_t bytes) override;
  RemoteMetricsView metricsView() const;
  QVariantMap remoteMetrics() const override;
  std::vector<std::string> settings_not_applied(const Request& request) const override;
  void set_step_wait_ms(int ms) override { step_wait_ms_ = ms; }

 private:
  struct Event {
    SequenceId id = 0;
    enum class Kind { Text, Prompt, ToolCall, Finish } kind = Kind::Text;
    std::string text;
    remote::RemoteToolCall call;
    PromptInfo prompt;
    FinishReason reason = FinishReason::None;
  };
  struct Running {
    TokenSink sink;
    ToolCallSink on_tool_call;
    std::shared_ptr<std::atomic<bool>> cancel;
    std::thread thread;
  };

  void stream(SequenceId id, remote::ChatRequest request,
              std::shared_ptr<std::atomic<bool>> cancel);
  void pollMetrics();
  remote::ChatRequest chatRequest(const Request& request,
                                  const std::string& tool_choice = {}) const;

  remote::OpenAiClient client_;
  remote::ServerKind server_ = remote::ServerKind::Unknown;
  std::string model_;
  ModelInfo info_;
  SequenceId next_id_ = 1;
  int step_wait_ms_ = 10;
  std::map<SequenceId, Running> running_;  // the worker's thread only
  mutable std::mutex mutex_;               // guards events_, metrics_ and stopping_
  std::condition_variable wake_;
  std::deque<Event> events_;
  RemoteMetricsView metrics_;
  uint64_t generated_tokens_ = 0;  // text deltas received, for the decode rate
  bool stopping_ = false;
  std::thread poller_;
};

// The settings of the endpoint at a base URL, for any thread (EndpointsController::accessLookup:
// it waits, bounded, for a key the keychain is still reading).
using EndpointAccessLookup = std::function<EndpointAccess(const std::string& base_url)>;

// The factory the application uses: a "URL#model" path opens a RemoteInferenceEngine (its API
// key and stall timeout from `access_for(base_url)`; its error fails the load), anything else
// goes to `local`.
EngineFactory remoteAwareEngineFactory(EngineFactory local, EndpointAccessLookup access_for);
// The worker's factory of chats' endpoint engines (RemoteInferenceEngine, metrics polled), each
// opened with its endpoint's key and stall timeout.
RemoteEngineFactory remoteEngineFactory();

}  // namespace granule::app
