// What the EngineWorker needs from an inference engine. GranuleInferenceEngine wraps
// granule::Engine; the app's tests drive the worker with a scripted engine instead.
#pragma once
#include <filesystem>
#include <functional>
#include <memory>

#include "granule/engine.h"
#include "granule/error.h"
#include "worker_types.h"

namespace granule::app {

class InferenceEngine {
 public:
  virtual ~InferenceEngine() = default;
  virtual ModelInfo info() const = 0;
  // Same contracts as granule::Engine: submit throws granule::Error for a request that
  // cannot run; the sink's on_finish is called exactly once per submitted sequence.
  virtual SequenceId submit(Request request) = 0;
  virtual void cancel(SequenceId id) = 0;
  virtual bool step() = 0;
  virtual bool idle() const = 0;
  virtual TelemetrySnapshot telemetry() const = 0;
  // Why the device stopped working for good (Engine::device_lost_reason), "" while it works.
  virtual std::string device_lost_reason() const { return {}; }
  // Engine::set_vram_budget: re-plans which layers stay resident, between steps. Throws
  // granule::CapacityError (the budget unchanged) when `bytes` cannot hold the working set.
  virtual void set_vram_budget(uint64_t bytes) = 0;
  // Continue: turns `request` (its messages the history before a reply cut at the length
  // limit) into a raw prompt that ends inside that reply with `partial`, so the model goes on
  // writing it; the template's stop strings are added to the sampling. Throws granule::Error.
  virtual void prepare_continuation(Request& request, const std::string& partial) const {
    (void)request;
    (void)partial;
    throw UnsupportedError("this engine cannot continue a reply");
  }
  // A remote engine's figures for the window's Remote panel (remote_inference_engine.h):
  // "server", "endpoint", "error" and the figures its server exposes; empty for a local one.
  virtual QVariantMap remoteMetrics() const { return {}; }
  // The request's settings this engine cannot apply, one line each ("top_k is not part of the
  // OpenAI API: not sent"), so the window says so rather than drop them silently.
  virtual std::vector<std::string> settings_not_applied(const Request& request) const {
    (void)request;
    return {};
  }
  // How long step() may wait for data when it has none (a remote engine's streams arrive on
  // their own threads); the worker sets 0 while another engine has work of its own.
  virtual void set_step_wait_ms(int ms) { (void)ms; }
  // An engine whose server takes OpenAI's tools and tool_choice and answers with tool calls
  // it parsed itself (a model on an endpoint). The worker then submits through
  // submit_with_tools: the chat's tool choice goes to the server (not a constraint on the
  // template's call format, which such an engine does not have), and the calls come back
  // through `on_tool_call`, each whole, before the sequence's on_finish.
  virtual bool server_parses_tool_calls() const { return false; }
  using ToolCallSink = std::function<void(SequenceId, const ToolCallText&)>;
  // `tool_choice`: "" the server's default (auto), "required", or one tool's name.
  virtual SequenceId submit_with_tools(Request request, const std::string& tool_choice,
                                       ToolCallSink on_tool_call) {
    (void)tool_choice;
    (void)on_tool_call;
    return submit(std::move(request));
  }
  // The granule::Engine underneath, which the window's OpenAI server drives directly (on the
  // engine thread); null for an engine that is not one (the tests' scripted engine), which
  // then cannot serve the API.
  virtual Engine* granuleEngine() { return nullptr; }
};

// Opens a model (throws granule::Error); `stage` reports what loading is doing.
using EngineFactory = std::function<std::unique_ptr<InferenceEngine>(
    const std::filesystem::path& model, const EngineOptions& options,
    const std::function<void(double fraction, const QString& stage)>& stage)>;

// The factory the application uses: granule::Engine::open.
EngineFactory granuleEngineFactory();

// Opens a chat's engine on an OpenAI-compatible endpoint: `ref` is "URL#model", `access` the
// endpoint's key ("" sends none) and stall timeout; its sequence ids start at `first_id` (apart
// from every other engine's). Throws granule::Error with the endpoint's one-line fault.
using RemoteEngineFactory = std::function<std::unique_ptr<InferenceEngine>(
    const QString& ref, const EndpointAccess& access, SequenceId first_id)>;

}  // namespace granule::app
