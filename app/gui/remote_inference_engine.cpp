// The remote engine's threads: one per streaming request and one metrics poller. They only
// push events under the mutex; the sinks run in step(), on the worker's thread.
#include "remote_inference_engine.h"

#include <chrono>

#include "granule/error.h"

namespace granule::app {
namespace {

using Clock = std::chrono::steady_clock;

FinishReason finishReasonOf(const std::string& reason) {
  if (reason == "length") return FinishReason::MaxTokens;
  if (reason == "stop" || reason == "eos") return FinishReason::Eos;
  return FinishReason::Eos;  // tool_calls, content_filter: the server ended the answer
}

remote::RemoteSampling samplingOf(const SamplingParams& s) {
  remote::RemoteSampling out;
  out.temperature = s.temperature;
  out.top_p = s.top_p;
  out.top_k = s.top_k;
  out.min_p = s.min_p;
  out.repeat_penalty = s.repetition_penalty;
  if (s.seed != kRandomSeed) out.seed = s.seed;
  out.max_tokens = s.max_tokens;
  out.stop = s.stop_strings;
  return out;
}

}  // namespace

std::optional<RemoteModelRef> parseRemoteModelRef(const std::string& path) {
  if (path.rfind("http://", 0) != 0 && path.rfind("https://", 0) != 0) return std::nullopt;
  const size_t hash = path.find('#');
  if (hash == std::string::npos || hash + 1 >= path.size()) return std::nullopt;
  return RemoteModelRef{path.substr(0, hash), path.substr(hash + 1)};
}

std::string remoteModelRefText(const RemoteModelRef& ref) { return ref.base_url + "#" + ref.model; }

RemoteInferenceEngine::RemoteInferenceEngine(const RemoteModelRef& ref, const std::string& api_key,
                                             bool poll_metrics, SequenceId first_id,
                                             int32_t stall_timeout_seconds)
    : client_(remote::Endpoint{ref.base_url, api_key, 10, stall_timeout_seconds}),
      model_(ref.model),
      next_id_(first_id) {
  const remote::ModelList models = client_.list_models();
  if (models.fault) {
    // An unreachable host's message names the URL already.
    throw Error(models.fault.kind == remote::FaultKind::Unreachable
                    ? models.fault.message
                    : client_.api_base() + ": " + models.fault.message);
  }
  const remote::RemoteModel* found = nullptr;
  std::string names;
  for (const remote::RemoteModel& m : models.models) {
    names += (names.empty() ? "" : ", ") + m.id;
    if (m.id == ref.model) found = &m;
  }
  if (found == nullptr) {
    throw Error(client_.api_base() + " has no model " + ref.model +
                "; it serves: " + (names.empty() ? "no models" : names));
  }
  server_ = remote::server_kind(found->owned_by);
  info_.path = QString::fromStdString(remoteModelRefText(ref));
  info_.name = QString::fromStdString(ref.model);
  info_.architecture = QStringLiteral("remote");
  info_.device = QStringLiteral("%1 at %2")
                     .arg(QString::fromUtf8(remote::server_kind_name(server_)),
                          QString::fromStdString(client_.server_root()));
  info_.chat_template = QStringLiteral("the server's");
  info_.trained_context = found->context_tokens.value_or(0);
  info_.engine_context = found->context_tokens.value_or(0);
  // reasoning_content arrives apart from the answer; it is handed to the worker's parser
  // between <think> tags, which it takes out again.
  info_.reasoning_format = QStringLiteral("think");
  if (poll_metrics) poller_ = std::thread([this] { pollMetrics(); });
}

RemoteInferenceEngine::~RemoteInferenceEngine() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& [id, r] : running_) r.cancel->store(true);
  for (auto& [id, r] : running_) {
    if (r.thread.joinable()) r.thread.join();
  }
  if (poller_.joinable()) poller_.join();
}

remote::ChatRequest RemoteInferenceEngine::chatRequest(const Request& request,
                                                       const std::string& tool_choice) const {
  remote::ChatRequest chat;
  chat.model = model_;
  chat.server = server_;
  chat.sampling = samplingOf(request.sampling);
  // Sent unchanged, turn after turn, so the server's prefix cache finds the conversation.
  for (const ChatMessage& m : request.messages)
    chat.messages.push_back({m.role, m.content, m.tool_calls_json, m.tool_call_id, m.name});
  chat.tools_json = request.chat_options.tools_json;
  if (!chat.tools_json.empty()) chat.tool_choice = tool_choice;
  // The chat's JSON output: the server enforces it (OpenAI's response_format).
  if (request.constraint.kind == ConstraintKind::JsonObject) {
    chat.response_format = remote::ResponseFormat::JsonObject;
  } else if (request.constraint.kind == ConstraintKind::JsonSchema) {
    chat.response_format = remote::ResponseFormat::JsonSchema;
    chat.json_schema = request.constraint.source;
  }
  chat.enable_thinking = request.chat_options.enable_thinking;
  chat.reasoning_effort = request.chat_options.reasoning_effort;
  return chat;
}

std::vector<std::string> RemoteInferenceEngine::settings_not_applied(const Request& request) const {
  return remote::chat_request_body(chatRequest(request)).not_sent;
}

SequenceId RemoteInferenceEngine::submit(Request request) {
  return submit_with_tools(std::move(request), {}, {});
}

SequenceId RemoteInferenceEngine::submit_with_tools(Request request, const std::string& tool_choice,
                                                    ToolCallSink on_tool_call) {
  if (request.prompt_tokens) {
    throw UnsupportedError("a remote engine takes messages, not a raw prompt");
  }
  // JSON output travels as response_format; the OpenAI API has no grammar or expression, so
  // those are refused rather than ignored.
  if (request.constraint.active() && request.constraint.kind != ConstraintKind::JsonObject &&
      request.constraint.kind != ConstraintKind::JsonSchema) {
    throw UnsupportedError(std::string("a ") + constraint_kind_name(request.constraint.kind) +
                           " constraint cannot be sent to an endpoint (the OpenAI API takes JSON "
                           "output and tool calls only)");
  }
  remote::ChatRequest chat = chatRequest(request, tool_choice);
  const SequenceId id = next_id_++;
  Running& r = running_[id];
  r.sink = std::move(request.sink);
  r.on_tool_call = std::move(on_tool_call);
  r.cancel = std::make_shared<std::atomic<bool>>(false);
  r.thread = std::thread([this, id, chat = std::move(chat), cancel = r.cancel]() mutable {
    stream(id, std::move(chat), std::move(cancel));
  });
  return id;
}

void RemoteInferenceEngine::stream(SequenceId id, remote::ChatRequest request,
                                   std::shared_ptr<std::atomic<bool>> cancel) {
  bool in_reasoning = false;
  auto push = [&](std::string text) {
    std::lock_guard lock(mutex_);
    Event e;
    e.id = id;
    e.text = std::move(text);
    events_.push_back(std::move(e));
    wake_.notify_all();
  };
  remote::StreamCallbacks callbacks;
  callbacks.on_reasoning = [&](std::string_view text) {
    push((in_reasoning ? "" : "<think>") + std::string(text));
    in_reasoning = true;
  };
  callbacks.on_content = [&](std::string_view text) {
    push((in_reasoning ? "</think>" : "") + std::string(text));
    in_reasoning = false;
  };
  const remote::ChatResult result = client_.stream_chat(request, callbacks, cancel.get());
  if (in_reasoning) push("</think>");
  std::lock_guard lock(mutex_);
  // Whole calls, before the end: the worker hands them to the chat with the reply.
  for (size_t n = 0; n < result.tool_calls.size(); ++n) {
    Event e;
    e.id = id;
    e.kind = Event::Kind::ToolCall;
    e.call = result.tool_calls[n];
    // A server that names no call: the tool message must still say which call it answers.
    if (e.call.id.empty()) e.call.id = "call_" + std::to_string(id) + "_" + std::to_string(n);
    events_.push_back(std::move(e));
  }
  if (result.usage) {
    Event e;
    e.id = id;
    e.kind = Event::Kind::Prompt;
    e.prompt.prompt_tokens = result.usage->prompt_tokens;
    e.prompt.reused_tokens = std::max<int64_t>(0, result.usage->cached_prompt_tokens);
    e.prompt.computed_tokens = e.prompt.prompt_tokens - e.prompt.reused_tokens;
    events_.push_back(e);
  }
  Event end;
  end.id = id;
  end.kind = Event::Kind::Finish;
  if (result.cancelled) {
    end.reason = FinishReason::Cancelled;
  } else if (result.fault) {
    end.reason = FinishReason::Error;
    const bool partial = !result.content.empty() || !result.reasoning.empty();
    end.text = result.fault.message + (partial ? " — the answer is cut where it stopped" : "") +
               (result.fault.retryable() ? "; regenerate to retry" : "");
  } else {
    end.reason = finishReasonOf(result.finish_reason);
  }
  events_.push_back(std::move(end));
  wake_.notify_all();
}

void RemoteInferenceEngine::cancel(SequenceId id) {
  const auto it = running_.find(id);
  if (it != running_.end()) it->second.cancel->store(true);
}

bool RemoteInferenceEngine::step() {
  std::deque<Event> events;
  {
    std::unique_lock lock(mutex_);
    // The worker steps while a request runs: wait a little for data rather than spin.
    if (events_.empty() && step_wait_ms_ > 0)
      wake_.wait_for(lock, std::chrono::milliseconds(step_wait_ms_));
    events.swap(events_);
  }
  for (Event& e : events) {
    const auto it = running_.find(e.id);
    if (it == running_.end()) continue;
    TokenSink& sink = it->second.sink;
    switch (e.kind) {
      case Event::Kind::Text:
        ++generated_tokens_;
        // A delta is not a token; each counts as one for the worker's rate (servers send a
        // token or a few per delta).
        if (sink.on_token) sink.on_token(e.id, e.text, 0);
        break;
      case Event::Kind::Prompt:
        if (sink.on_prompt) sink.on_prompt(e.id, e.prompt);
        break;
      case Event::Kind::ToolCall:
        if (it->second.on_tool_call)
          it->second.on_tool_call(
              e.id, {QString::fromStdString(e.call.id), QString::fromStdString(e.call.name),
                     QString::fromStdString(e.call.arguments)});
        break;
      case Event::Kind::Finish:
        if (sink.on_finish) sink.on_finish(e.id, e.reason, e.text);
        if (it->second.thread.joinable()) it->second.thread.join();
        running_.erase(it);
        break;
    }
  }
  return !events.empty();
}

bool RemoteInferenceEngine::idle() const {
  if (!running_.empty()) return false;
  std::lock_guard lock(mutex_);
  return events_.empty();
}

void RemoteInferenceEngine::set_vram_budget(uint64_t) {
  throw UnsupportedError("a remote engine's memory is the server's: its budget is set there");
}

void RemoteInferenceEngine::pollMetrics() {
  std::optional<remote::EngineMetrics> before;
  Clock::time_point before_at;
  while (true) {
    const remote::OpenAiClient::MetricsText text = client_.fetch_metrics();
    const Clock::time_point now = Clock::now();
    {
      std::unique_lock lock(mutex_);
      if (text.fault) {
        metrics_ = {};
        metrics_.error = text.fault.message;
      } else {
        const remote::EngineMetrics m = remote::read_engine_metrics(text.text);
        metrics_.dialect = m.dialect;
        metrics_.metrics = m;
        metrics_.rates =
            before ? remote::engine_rates(*before, m,
                                          std::chrono::duration<double>(now - before_at).count())
                   : remote::EngineRates{};
        metrics_.error = m.dialect == remote::MetricsDialect::None
                             ? "the server's /metrics has no series this window reads"
                             : "";
        before = m;
        before_at = now;
      }
      // A modest rate: one scrape a second (a server's /metrics is cheap, but not free).
      if (wake_.wait_for(lock, std::chrono::seconds(1), [this] { return stopping_; })) return;
    }
  }
}

QVariantMap RemoteInferenceEngine::remoteMetrics() const {
  const RemoteMetricsView v = metricsView();
  QVariantMap out;
  out.insert(QStringLiteral("server"), QString::fromUtf8(remote::server_kind_name(server_)));
  out.insert(QStringLiteral("endpoint"), QString::fromStdString(client_.server_root()));
  out.insert(QStringLiteral("error"), QString::fromStdString(v.error));
  auto put = [&](const char* name, const std::optional<double>& value) {
    if (value) out.insert(QString::fromLatin1(name), *value);  // absent: unavailable
  };
  put("running", v.metrics.requests_running);
  put("waiting", v.metrics.requests_waiting);
  put("kvUsage", v.metrics.kv_usage_fraction);
  put("kvBytes", v.metrics.kv_used_bytes);
  put("promptTokensPerSecond", v.rates.prompt_tokens_per_second);
  put("generationTokensPerSecond", v.rates.generation_tokens_per_second);
  put("prefixCacheHits", v.rates.prefix_cache_hit_fraction);
  put("prefixReusedTokens", v.metrics.prefix_cache_hits_total);
  put("preemptions", v.metrics.preemptions_total);
  put("meanDecodeBatch", v.rates.mean_decode_batch);
  put("batchedStepFraction", v.rates.batched_step_fraction);
  return out;
}

RemoteMetricsView RemoteInferenceEngine::metricsView() const {
  std::lock_guard lock(mutex_);
  return metrics_;
}

TelemetrySnapshot RemoteInferenceEngine::telemetry() const {
  TelemetrySnapshot t;
  const RemoteMetricsView view = metricsView();
  const remote::EngineMetrics& m = view.metrics;
  t.scheduler.running = static_cast<int32_t>(m.requests_running.value_or(0));
  t.scheduler.waiting = static_cast<int32_t>(m.requests_waiting.value_or(0));
  t.scheduler.preemptions = static_cast<uint64_t>(m.preemptions_total.value_or(0));
  t.kv.committed_bytes = static_cast<uint64_t>(m.kv_used_bytes.value_or(0));
  t.throughput.prompt_tokens_per_second = view.rates.prompt_tokens_per_second.value_or(0);
  t.throughput.decode_tokens_per_second = view.rates.generation_tokens_per_second.value_or(0);
  for (const auto& [id, r] : running_) {
    SequenceTelemetry s;
    s.id = id;
    t.sequences.push_back(s);
  }
  return t;
}

EngineFactory remoteAwareEngineFactory(EngineFactory local, EndpointAccessLookup access_for) {
  return [local = std::move(local), access_for = std::move(access_for)](
             const std::filesystem::path& model, const EngineOptions& options,
             const std::function<void(double, const QString&)>& stage)
             -> std::unique_ptr<InferenceEngine> {
    const std::optional<RemoteModelRef> ref = parseRemoteModelRef(model.string());
    if (!ref) return local(model, options, stage);
    stage(0.1, QStringLiteral("Reading the endpoint's settings"));
    const EndpointAccess access = access_for ? access_for(ref->base_url) : EndpointAccess{};
    if (!access.error.isEmpty()) throw Error(access.error.toStdString());
    stage(0.2, QStringLiteral("Asking the server for its models"));
    auto engine = std::make_unique<RemoteInferenceEngine>(*ref, access.api_key.toStdString(),
                                                          /*poll_metrics=*/true, /*first_id=*/1,
                                                          access.stall_timeout_seconds);
    stage(1.0, QStringLiteral("Ready"));
    return engine;
  };
}

RemoteEngineFactory remoteEngineFactory() {
  return [](const QString& ref, const EndpointAccess& access,
            SequenceId first_id) -> std::unique_ptr<InferenceEngine> {
    const std::optional<RemoteModelRef> parsed = parseRemoteModelRef(ref.toStdString());
    if (!parsed) throw Error("not a model on an endpoint (URL#model): " + ref.toStdString());
    if (!access.error.isEmpty()) throw Error(access.error.toStdString());
    return std::make_unique<RemoteInferenceEngine>(*parsed, access.api_key.toStdString(),
                                                   /*poll_metrics=*/true, first_id,
                                                   access.stall_timeout_seconds);
  };
}

}  // namespace granule::app
