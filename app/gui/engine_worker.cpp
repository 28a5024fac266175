// The engine thread's side: requests in, coalesced text and telemetry out.
#include "engine_worker.h"

#include "granule/error.h"
#include "granule/log.h"
#include "json_output.h"
#include "model_inspector.h"
#include "sampling_presets.h"

namespace granule::app {
namespace {

std::shared_ptr<spdlog::logger> log() { return granule::logger("app.worker"); }

QString finishReasonText(FinishReason reason) {
  return QString::fromUtf8(finish_reason_name(reason));
}

EngineOptions engineOptions(qint64 context_length, qint32 chats, quint64 vram_budget_bytes,
                            qint32 cpu_threads = 0) {
  EngineOptions options;
  options.cpu_threads = cpu_threads;
  options.context_length = context_length;
  options.max_sequences = chats;
  options.vram_budget_bytes = vram_budget_bytes;
  // Short prefill chunks keep every step short, so a cancel, a new chat's first token and
  // closing the window never wait behind a long prompt (CPU steps are slow).
  options.prefill_chunk_tokens = 64;
  return options;
}

ReasoningFormat reasoningFormat(const QString& name) {
  if (name == QStringLiteral("think")) return ReasoningFormat::Think;
  if (name == QStringLiteral("harmony")) return ReasoningFormat::Harmony;
  return ReasoningFormat::None;
}

// The chat's reasoning setting as the template's variables: "off" asks a Qwen3-style model
// to answer without thinking; an effort is gpt-oss's reasoning_effort.
ChatOptions chatOptions(const SamplingSettings& sampling) {
  ChatOptions options;
  if (sampling.reasoning == QStringLiteral("off")) {
    options.enable_thinking = false;
  } else if (!sampling.reasoning.isEmpty()) {
    options.reasoning_effort = sampling.reasoning.toStdString();
  }
  return options;
}

}  // namespace

EngineWorker::EngineWorker(EngineFactory factory, QObject* parent)
    : QObject(parent), factory_(std::move(factory)), api_server_([this] {
        // From a server thread: the tasks run on this worker's thread, between steps.
        QMetaObject::invokeMethod(this, &EngineWorker::runServerTasks, Qt::QueuedConnection);
      }) {
  registerWorkerTypes();
  telemetry_timer_.setParent(this);  // so it moves to the worker thread with us
  telemetry_timer_.setInterval(kTelemetryIntervalMs);
  connect(&telemetry_timer_, &QTimer::timeout, this, &EngineWorker::emitTelemetry);
}

EngineWorker::~EngineWorker() {
  // Normally shutdown() already ran on the worker thread; this covers tests that own a
  // worker without a thread. The server goes first: its threads wake this object.
  shut_down_ = true;
  api_server_.stop();
  engine_.reset();
  remotes_.clear();
}

void EngineWorker::start() {
  clock_.start();
  since_flush_.start();
  telemetry_timer_.start();
}

void EngineWorker::inspectModel(const QString& path, qint64 context_length, qint32 chats,
                                quint64 vram_budget_bytes) {
  try {
    const std::filesystem::path file(path.toStdString());
    const FitEstimate fit =
        Engine::estimate(file, engineOptions(context_length, chats, vram_budget_bytes));
    Q_EMIT modelInspected(modelInfo(file, fit), fit);
  } catch (const std::exception& e) {
    Q_EMIT inspectFailed(path, QString::fromUtf8(e.what()));
  }
}

void EngineWorker::loadModel(const QString& path, qint64 context_length, qint32 chats,
                             quint64 vram_budget_bytes) {
  if (shut_down_) return;
  const bool was_serving = api_server_.serving();
  releaseEngine();  // stops the server first
  if (was_serving) {
    // The window says so while the next model loads; it serves that one once loaded.
    serving_status_ = {
        ServingStatus::State::Waiting, serve_settings_.host, serve_settings_.port, {}};
    Q_EMIT servingChanged(serving_status_);
  }
  log()->info("loading {}", path.toStdString());
  slots_ = chats;
  try {
    engine_ = factory_(
        std::filesystem::path(path.toStdString()),
        engineOptions(context_length, chats, vram_budget_bytes, cpu_threads_),
        [this](double fraction, const QString& stage) { Q_EMIT loadProgress(fraction, stage); });
    model_id_ = std::filesystem::path(path.toStdString()).stem().string();
    Q_EMIT modelLoaded(engine_->info());
  } catch (const std::exception& e) {
    engine_.reset();
    log()->warn("loading {} failed: {}", path.toStdString(), e.what());
    Q_EMIT loadFailed(path, QString::fromUtf8(e.what()));
  }
  if (serve_settings_.enabled) applyServing();
}

void EngineWorker::setVramBudget(quint64 bytes) {
  // Queued slots run between steps (runStep is one event per step), as the engine requires.
  if (shut_down_ || !engine_ || bytes == 0) return;
  try {
    engine_->set_vram_budget(bytes);
    log()->info("VRAM budget set to {} MiB", bytes >> 20);
    Q_EMIT budgetApplied(bytes);
  } catch (const std::exception& e) {
    log()->warn("VRAM budget of {} MiB refused: {}", bytes >> 20, e.what());
    Q_EMIT budgetRefused(bytes, QString::fromUtf8(e.what()));
  }
}

void EngineWorker::submit(const GenerationRequest& request) {
  if (shut_down_) return;
  GenerationResult refused{request.chat_id, GenerationEnd::Failed, QStringLiteral("error"), {}};
  if (sequence_of_chat_.count(request.chat_id)) cancel(request.chat_id);
  InferenceEngine* const engine = engineFor(request, &refused.error);
  if (!engine) {
    Q_EMIT generationFinished(refused);
    return;
  }

  Request engine_request;
  for (const PromptMessage& m : request.messages) {
    ChatMessage message{m.role.toStdString(), m.content.toStdString()};
    message.tool_calls_json = m.tool_calls_json.toStdString();
    message.tool_call_id = m.tool_call_id.toStdString();
    message.name = m.name.toStdString();
    engine_request.messages.push_back(std::move(message));
  }
  engine_request.sampling = toSamplingParams(request.sampling);
  engine_request.chat_options = chatOptions(request.sampling);
  // The chat's JSON output: the reply is decoded under the constraint.
  engine_request.constraint = jsonOutputConstraint(request.sampling);
  // Tools (the enabled MCP servers'): the template shows them to the model; a required call
  // is constrained to the template's call format.
  const ChatTemplate* chat_template =
      engine->granuleEngine() ? engine->granuleEngine()->chat_template() : nullptr;
  const bool tools = !request.tools_json.isEmpty();
  // An endpoint's server parses the calls and applies the tool choice itself.
  const bool server_tools = engine->server_parses_tool_calls();
  if (tools) engine_request.chat_options.tools_json = request.tools_json.toStdString();
  // The chat is the session: the engine keeps its KV after the reply, and the next turn
  // computes only its new tokens.
  engine_request.session = "chat-" + std::to_string(request.chat_id);
  engine_request.sink.on_prompt = [this](SequenceId seq, const PromptInfo& info) {
    prompt_info_[seq] = info;
    // The template opened <think>: the reply starts inside the reasoning.
    if (const auto parser = reply_parsers_.find(seq);
        parser != reply_parsers_.end() && info.reasoning_opened)
      parser->second.start_in_reasoning();
    log()->debug("sequence {}: prompt {} tokens, {} reused, {} messages left out", seq,
                 info.prompt_tokens, info.reused_tokens, info.dropped_messages);
  };
  std::string partial;
  if (request.continue_last && !engine_request.messages.empty()) {
    partial = engine_request.messages.back().content;
    engine_request.messages.pop_back();
  }
  // The sink runs inside engine_->step() on this thread: it only records, and runStep()
  // turns the records into signals once the step is over.
  engine_request.sink.on_token = [this](SequenceId seq, const std::string& text, int32_t token) {
    const auto chat = chat_of_sequence_.find(seq);
    if (chat == chat_of_sequence_.end()) return;
    TokenChunk& chunk = pending_[chat->second];
    chunk.chat_id = chat->second;
    if (const auto parser = reply_parsers_.find(seq); parser != reply_parsers_.end()) {
      ReplyDelta delta = parser->second.push(text);
      chunk.reasoning += QString::fromStdString(delta.reasoning);
      chunk.text += QString::fromStdString(delta.content);
      chunk.tool_calls.append(delta.calls);
    } else {
      chunk.text += QString::fromStdString(text);
    }
    if (const auto prompt = prompt_tokens_.find(seq); prompt != prompt_tokens_.end())
      chunk.prompt_tokens = prompt->second;
    if (const auto info = prompt_info_.find(seq); info != prompt_info_.end()) {
      chunk.prompt_tokens = static_cast<qint32>(info->second.prompt_tokens);
      chunk.reused_tokens = static_cast<qint32>(info->second.reused_tokens);
      chunk.dropped_messages = info->second.dropped_messages;
    }
    // Text flushed at the end (held back for a stop string) comes without a token (-1).
    if (token >= 0) {
      chunk.tokens += 1;
      ++generated_tokens_;
    }
  };
  engine_request.sink.on_finish = [this](SequenceId seq, FinishReason reason,
                                         const std::string& error) {
    // What the parser held back (a partial tag that never completed) is text after all.
    if (const auto parser = reply_parsers_.find(seq); parser != reply_parsers_.end()) {
      ReplyDelta delta = parser->second.finish();
      if (const auto chat = chat_of_sequence_.find(seq);
          chat != chat_of_sequence_.end() &&
          (!delta.reasoning.empty() || !delta.content.empty() || !delta.calls.isEmpty())) {
        TokenChunk& chunk = pending_[chat->second];
        chunk.chat_id = chat->second;
        chunk.reasoning += QString::fromStdString(delta.reasoning);
        chunk.text += QString::fromStdString(delta.content);
        chunk.tool_calls.append(delta.calls);
      }
      reply_parsers_.erase(parser);
    }
    finished_.push_back({seq, reason, error});
  };
  try {
    if (tools && !request.tool_choice.isEmpty() && !server_tools)
      engine_request.constraint = toolChoiceConstraint(
          chat_template, request.tools_json.toStdString(), request.tool_choice.toStdString());
    if (request.continue_last) engine->prepare_continuation(engine_request, partial);
    std::string not_applied;
    for (const std::string& line : engine->settings_not_applied(engine_request))
      not_applied += (not_applied.empty() ? "" : "; ") + line;
    const SequenceId seq =
        server_tools ? engine->submit_with_tools(std::move(engine_request),
                                                 tools ? request.tool_choice.toStdString() : "",
                                                 [this](SequenceId s, const ToolCallText& call) {
                                                   const auto chat = chat_of_sequence_.find(s);
                                                   if (chat == chat_of_sequence_.end()) return;
                                                   TokenChunk& chunk = pending_[chat->second];
                                                   chunk.chat_id = chat->second;
                                                   chunk.tool_calls.append(call);
                                                 })
                     : engine->submit(std::move(engine_request));
    chat_of_sequence_[seq] = request.chat_id;
    engine_of_sequence_[seq] = engine;
    // A continued reply goes on with its answer; a new one may start with reasoning.
    const ReasoningFormat format = request.continue_last
                                       ? ReasoningFormat::None
                                       : reasoningFormat(engine->info().reasoning_format);
    const bool parse_calls = tools && !server_tools;
    if (format != ReasoningFormat::None || parse_calls)
      reply_parsers_.insert_or_assign(
          seq, ReplyParser(format, chat_template, parse_calls,
                           "call_" + std::to_string(request.chat_id) + "_" + std::to_string(seq)));
    sequence_of_chat_[request.chat_id] = seq;
    // The prompt's length as the engine tokenized it: a new sequence's tokens are its prompt.
    for (const SequenceTelemetry& t : engine->telemetry().sequences)
      if (t.id == seq) prompt_tokens_[seq] = static_cast<qint32>(t.tokens);
    if (!not_applied.empty())
      Q_EMIT settingsNotApplied(request.chat_id, request.engine,
                                QString::fromStdString(not_applied));
  } catch (const std::exception& e) {
    refused.error = QString::fromUtf8(e.what());
    Q_EMIT generationFinished(refused);
    return;
  }
  Q_EMIT generationStarted(request.chat_id);
  scheduleStep();
}

InferenceEngine* EngineWorker::engineFor(const GenerationRequest& request, QString* error) {
  if (request.engine.isEmpty()) {
    if (!engine_) *error = QStringLiteral("No model is loaded: open a model first.");
    return engine_.get();
  }
  if (!remote_factory_) {
    *error = QStringLiteral("This window cannot reach endpoints (no remote client in this build).");
    return nullptr;
  }
  auto it = remotes_.find(request.engine);
  // A key or a stall timeout changed in Settings: reopened with it once nothing streams from
  // the old one.
  if (it != remotes_.end() &&
      (it->second.api_key != request.api_key ||
       it->second.stall_timeout_seconds != request.stall_timeout_seconds) &&
      it->second.engine->idle()) {
    remotes_.erase(it);
    it = remotes_.end();
  }
  if (it != remotes_.end()) return it->second.engine.get();
  try {
    // Lists the server's models first (bounded by its connect timeout): a wrong URL, key or
    // model is the chat's one-line error.
    auto engine = remote_factory_(
        request.engine, EndpointAccess{request.api_key, request.stall_timeout_seconds, {}},
        next_remote_first_id_);
    next_remote_first_id_ += SequenceId{1} << 40;
    log()->info("chat engine opened on {} (stall timeout {} s)", request.engine.toStdString(),
                request.stall_timeout_seconds);
    it = remotes_
             .emplace(request.engine, RemoteEngine{std::move(engine), request.api_key,
                                                   request.stall_timeout_seconds})
             .first;
    return it->second.engine.get();
  } catch (const std::exception& e) {
    *error = QString::fromUtf8(e.what());
    return nullptr;
  }
}

InferenceEngine* EngineWorker::engineOfChat(qint64 chat_id) const {
  const auto seq = sequence_of_chat_.find(chat_id);
  if (seq == sequence_of_chat_.end()) return nullptr;
  const auto engine = engine_of_sequence_.find(seq->second);
  return engine == engine_of_sequence_.end() ? nullptr : engine->second;
}

void EngineWorker::forgetSequence(SequenceId seq) {
  if (const auto chat = chat_of_sequence_.find(seq); chat != chat_of_sequence_.end()) {
    const auto current = sequence_of_chat_.find(chat->second);
    if (current != sequence_of_chat_.end() && current->second == seq)
      sequence_of_chat_.erase(current);
    chat_of_sequence_.erase(chat);
  }
  prompt_tokens_.erase(seq);
  prompt_info_.erase(seq);
  reply_parsers_.erase(seq);
  engine_of_sequence_.erase(seq);
}

void EngineWorker::showEngine(const QString& ref) { shown_engine_ = ref; }

void EngineWorker::cancel(qint64 chat_id) {
  const auto seq = sequence_of_chat_.find(chat_id);
  InferenceEngine* const engine = engineOfChat(chat_id);
  if (seq == sequence_of_chat_.end() || !engine) return;
  try {
    engine->cancel(seq->second);
  } catch (const std::exception& e) {
    log()->warn("cancel of chat {} failed: {}", chat_id, e.what());
  }
  scheduleStep();  // the engine reports the cancellation from its next step
}

void EngineWorker::setServing(const ServeSettings& settings) {
  if (shut_down_) return;
  serve_settings_ = settings;
  applyServing();
}

void EngineWorker::applyServing() {
  stopServing();
  ServingStatus status;
  status.host = serve_settings_.host;
  status.port = serve_settings_.port;
  if (!serve_settings_.enabled) {
    status.state = ServingStatus::State::Off;
  } else if (!engine_) {
    status.state = ServingStatus::State::Waiting;
  } else if (!engine_->granuleEngine()) {
    status.state = ServingStatus::State::Failed;
    status.error = QStringLiteral("This engine cannot serve the API (it is not a granule engine).");
  } else {
    status = api_server_.start(serve_settings_, model_id_);
  }
  serving_status_ = status;
  Q_EMIT servingChanged(status);
}

void EngineWorker::stopServing() {
  if (!api_server_.serving()) return;
  api_server_.stop();
  if (!engine_) return;
  // Its handlers are gone, and with them whoever read these sequences: free their KV.
  try {
    for (const SequenceTelemetry& s : engine_->telemetry().sequences)
      if (!chat_of_sequence_.count(s.id)) engine_->cancel(s.id);
  } catch (const std::exception& e) {
    log()->warn("cancelling the API's requests failed: {}", e.what());
  }
  scheduleStep();
}

void EngineWorker::runServerTasks() {
  if (shut_down_ || !engine_ || !engine_->granuleEngine()) return;
  // A submit or cancel: the engine has work, chats or not.
  if (api_server_.runTasks(*engine_->granuleEngine()) > 0 && !engine_->idle()) scheduleStep();
}

void EngineWorker::shutdown() {
  shut_down_ = true;
  telemetry_timer_.stop();
  releaseEngine();
  log()->info("engine worker shut down");
}

void EngineWorker::scheduleStep() {
  if (step_queued_ || shut_down_) return;
  step_queued_ = true;
  // One step per event-loop turn, so submit/cancel/shutdown get in between steps.
  QMetaObject::invokeMethod(this, &EngineWorker::runStep, Qt::QueuedConnection);
}

void EngineWorker::runStep() {
  step_queued_ = false;
  if (!anyEngine() || shut_down_) return;
  bool more = false;
  bool local_busy = false;
  if (engine_) {
    try {
      local_busy = !engine_->idle();
      more = engine_->step();
    } catch (const std::exception& e) {
      log()->error("engine step failed: {}", e.what());
      failAll(QString::fromUtf8(e.what()), engine_.get());
      return;
    }
  }
  // The endpoints' engines hand over what their streams brought. Only one of them may wait
  // for data, and none while the local engine computes (its steps must not wait on a server).
  bool may_wait = !local_busy;
  bool remote_busy = false;
  for (auto& [ref, remote] : remotes_) {
    InferenceEngine& r = *remote.engine;
    if (r.idle()) continue;
    remote_busy = true;
    r.set_step_wait_ms(may_wait ? 10 : 0);
    may_wait = false;
    try {
      more = r.step() || more;
    } catch (const std::exception& e) {
      log()->error("{}: step failed: {}", ref.toStdString(), e.what());
      failAll(QString::fromUtf8(e.what()), &r);
      return;
    }
  }
  const bool finishing = !finished_.empty();
  if (finishing || since_flush_.elapsed() >= kTokenFlushIntervalMs) flushTokens();
  deliverFinished();
  // A lost device has ended every chat (each with the reason); the window hears it once, as
  // an engine error that asks for a reload, and stays up.
  if (const std::string lost = engine_ ? engine_->device_lost_reason() : std::string();
      !lost.empty() && !device_lost_reported_) {
    device_lost_reported_ = true;
    Q_EMIT engineError(QString::fromStdString(lost));
  }
  bool busy = remote_busy;
  for (const auto& [ref, remote] : remotes_) busy = busy || !remote.engine->idle();
  if (more || busy || (engine_ && !engine_->idle())) {
    scheduleStep();
  } else {
    flushTokens();
  }
}

void EngineWorker::flushTokens() {
  since_flush_.restart();
  if (pending_.empty()) return;
  QList<TokenChunk> chunks;
  chunks.reserve(static_cast<qsizetype>(pending_.size()));
  for (auto& [chat, chunk] : pending_) chunks.append(std::move(chunk));
  pending_.clear();
  Q_EMIT tokensArrived(chunks);
}

void EngineWorker::deliverFinished() {
  std::vector<Finished> done;
  done.swap(finished_);
  for (const Finished& f : done) {
    const auto chat = chat_of_sequence_.find(f.sequence);
    if (chat == chat_of_sequence_.end()) continue;
    GenerationResult result;
    result.chat_id = chat->second;
    result.reason = finishReasonText(f.reason);
    result.error = QString::fromStdString(f.error);
    if (const auto prompt = prompt_tokens_.find(f.sequence); prompt != prompt_tokens_.end()) {
      result.prompt_tokens = prompt->second;
      prompt_tokens_.erase(prompt);
    }
    // What the engine reported of the prompt wins: a remote engine knows it only at the end
    // (the server's usage), after every token.
    if (const auto info = prompt_info_.find(f.sequence); info != prompt_info_.end()) {
      if (info->second.prompt_tokens > 0)
        result.prompt_tokens = static_cast<qint32>(info->second.prompt_tokens);
      prompt_info_.erase(info);
    }
    result.end = f.reason == FinishReason::Cancelled ? GenerationEnd::Stopped
                 : f.reason == FinishReason::Error   ? GenerationEnd::Failed
                                                     : GenerationEnd::Finished;
    // A newer submission for the same chat may already own the chat's slot.
    const auto current = sequence_of_chat_.find(chat->second);
    const bool superseded = current == sequence_of_chat_.end() || current->second != f.sequence;
    if (!superseded) sequence_of_chat_.erase(current);
    chat_of_sequence_.erase(chat);
    engine_of_sequence_.erase(f.sequence);
    if (!superseded) Q_EMIT generationFinished(result);
  }
}

void EngineWorker::failAll(const QString& message, InferenceEngine* engine) {
  flushTokens();
  std::erase_if(finished_, [&](const Finished& f) {
    const auto e = engine_of_sequence_.find(f.sequence);
    return !engine || (e != engine_of_sequence_.end() && e->second == engine);
  });
  const auto chats = sequence_of_chat_;
  for (const auto& [chat, seq] : chats) {
    const auto e = engine_of_sequence_.find(seq);
    InferenceEngine* const on = e == engine_of_sequence_.end() ? nullptr : e->second;
    if (engine && on != engine) continue;
    try {
      if (on) on->cancel(seq);
    } catch (const std::exception&) {
      // The engine is already failing; the GUI hears about it below.
    }
    forgetSequence(seq);
    Q_EMIT generationFinished({chat, GenerationEnd::Failed, QStringLiteral("error"), message});
  }
  Q_EMIT engineError(message);
}

void EngineWorker::releaseEngine() {
  // The server before the engine: a handler must not reach an engine that is going.
  stopServing();
  // At shutdown the endpoints' engines go too; a model load replaces the local one only, and
  // chats on endpoints stream on.
  std::vector<std::unique_ptr<InferenceEngine>> going;
  if (engine_) going.push_back(std::move(engine_));
  if (shut_down_)
    for (auto& [ref, remote] : remotes_) going.push_back(std::move(remote.engine));
  if (going.empty()) return;
  const auto goes = [&](InferenceEngine* e) {
    for (const auto& g : going)
      if (g.get() == e) return true;
    return false;
  };
  std::vector<std::pair<qint64, SequenceId>> chats;
  for (const auto& [chat, seq] : sequence_of_chat_) {
    const auto e = engine_of_sequence_.find(seq);
    if (e != engine_of_sequence_.end() && goes(e->second)) chats.emplace_back(chat, seq);
  }
  for (const auto& [chat, seq] : chats) {
    try {
      engine_of_sequence_.at(seq)->cancel(seq);
    } catch (const std::exception&) {
      // Freeing the engine below releases the sequence anyway.
    }
    // Drop the sinks' targets before the engine goes, so nothing it reports while being
    // destroyed reaches the GUI.
    forgetSequence(seq);
    pending_.erase(chat);
  }
  std::erase_if(finished_, [&](const Finished& f) { return !chat_of_sequence_.count(f.sequence); });
  going.clear();
  if (shut_down_) remotes_.clear();
  device_lost_reported_ = false;
  if (!shut_down_)
    for (const auto& [chat, seq] : chats)
      Q_EMIT generationFinished({chat, GenerationEnd::Stopped, QStringLiteral("cancelled"), {}});
}

void EngineWorker::emitTelemetry() {
  if (shut_down_) return;
  Q_EMIT telemetryUpdated(makeFrame());
}

TelemetryFrame EngineWorker::makeFrame() const {
  TelemetryFrame frame;
  frame.time_s = static_cast<double>(clock_.elapsed()) / 1000.0;
  frame.host = {processResidentBytes(), hostTotalBytes(), hostAvailableBytes()};
  frame.counts_tokens = true;
  // The chats' and the API's: both are the engine's decode throughput.
  frame.generated_tokens = generated_tokens_ + api_server_.generatedTokens();
  // The panels show the open chat's engine: an endpoint's (its server's metrics), or the
  // loaded model's.
  const auto shown = remotes_.find(shown_engine_);
  InferenceEngine* const panels = shown != remotes_.end() && !shown_engine_.isEmpty()
                                      ? shown->second.engine.get()
                                      : engine_.get();
  if (!panels) return frame;
  try {
    frame.engine = panels->telemetry();
    frame.remote = panels->remoteMetrics();
    // The rows of chats on the other engines (a sequence is the chat's on any engine).
    const auto add_rows = [&](const InferenceEngine& e) {
      for (const SequenceTelemetry& s : e.telemetry().sequences) {
        const auto chat = chat_of_sequence_.find(s.id);
        if (chat != chat_of_sequence_.end()) frame.chats.append({chat->second, s, false});
      }
    };
    if (engine_ && panels != engine_.get()) add_rows(*engine_);
    for (const auto& [ref, remote] : remotes_)
      if (remote.engine.get() != panels) add_rows(*remote.engine);
  } catch (const std::exception& e) {
    log()->warn("telemetry failed: {}", e.what());
    return frame;
  }
  frame.has_engine = true;
  const bool slots_full =
      panels == engine_.get() && slots_ > 0 && frame.engine.scheduler.running >= slots_;
  for (const SequenceTelemetry& s : frame.engine.sequences) {
    const auto chat = chat_of_sequence_.find(s.id);
    if (chat != chat_of_sequence_.end())
      frame.chats.append({chat->second, s, s.waiting && slots_full});
  }
  if (api_server_.serving()) {
    frame.api_requests = api_server_.requests();
    for (ApiRequestTelemetry& request : frame.api_requests) {
      for (const SequenceTelemetry& s : frame.engine.sequences) {
        if (s.id != request.sequence.id) continue;
        request.sequence = s;
        if (s.waiting) request.state = QStringLiteral("waiting");
      }
    }
  }
  return frame;
}

}  // namespace granule::app
