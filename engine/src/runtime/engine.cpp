// Engine: opens a model (file, config, weights, tokenizer, template), picks the backend,
// builds the KvSpace on it, and runs continuous batching: each step decodes every running
// sequence, prefills prompt chunks, samples, detokenises and streams text to the sinks.
#include "granule/engine.h"

#include <algorithm>
#include <chrono>
#include <span>

#include "backends/backend.h"
#include "granule/error.h"
#include "granule/log.h"
#include "memory/kv_space.h"
#include "runtime/constrained_step.h"
#include "runtime/logprobs.h"
#include "runtime/runtime.h"
#include "runtime/scheduler.h"
#include "runtime/sequence.h"
#include "runtime/stop_check.h"

namespace granule {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::None:
      return "none";
    case FinishReason::Eos:
      return "eos";
    case FinishReason::StopString:
      return "stop";
    case FinishReason::MaxTokens:
      return "length";
    case FinishReason::Cancelled:
      return "cancelled";
    case FinishReason::Error:
      return "error";
  }
  return "unknown";
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::string mib_text(uint64_t bytes) { return std::to_string((bytes + (1u << 19)) >> 20) + " MiB"; }

}  // namespace

struct Engine::Impl {
  EngineOptions options;
  std::unique_ptr<ModelFile> file;
  ModelConfig config;
  WeightTable weights;
  std::unique_ptr<Tokenizer> tokenizer;
  std::optional<ChatTemplate> chat_template;
  Runtime runtime;  // ledger, backend, KV space
  std::unique_ptr<MemoryManager>& memory = runtime.memory;
  std::unique_ptr<Backend>& backend = runtime.backend;
  std::unique_ptr<KvSpace>& kv = runtime.kv;
  std::unique_ptr<Scheduler> scheduler;  // owns every Sequence
  SequenceId next_id = 1;
  bool in_step = false;
  // Set when the device failed for good (DeviceLostError): every conversation has ended with
  // it and new ones are refused until the engine is destroyed (which resets the device).
  std::string device_lost;

  // The step being run: what the backend reads until wait() returns, reused across steps.
  std::vector<BatchSequence> batch;
  std::vector<SamplingParams> params;
  std::vector<std::vector<int32_t>> history;
  std::vector<uint64_t> draw_index;
  std::vector<float> logits;
  // KV coming back from host memory (StepPlan::swap_ins): its copies are queued on the device
  // ahead of the step, so the buffers live until the step has been waited for.
  std::vector<std::vector<uint8_t>> swap_in_buffers;
  // Structured output: constraints, token masks and the checks of constrained tokens.
  std::unique_ptr<ConstrainedSteps> constrained;

  // throughput
  uint64_t steps = 0;
  uint64_t decode_steps = 0, decode_step_sequences = 0, batched_decode_steps = 0;
  int32_t last_decode_sequences = 0;
  double prompt_seconds = 0, decode_seconds = 0;
  uint64_t prompt_tokens_done = 0, decode_tokens_done = 0;
  // The last step's host phases (ThroughputTelemetry::last_*_us).
  double plan_us = 0, launch_us = 0, overlap_us = 0, wait_us = 0, results_us = 0;
  // Expert counts summed over every collect_expert_telemetry() so far (a snapshot is taken
  // through a const engine; the sum only grows, whoever asks).
  mutable ExpertTelemetry expert_totals;

  std::shared_ptr<spdlog::logger> log = logger("engine");

  // Sinks run inside a step; a cancel they ask for waits until the step is over.
  struct StepScope {
    Impl& m;
    explicit StepScope(Impl& impl) : m(impl) { m.in_step = true; }
    ~StepScope();
  };

  std::vector<TokenId> render_messages(const std::vector<ChatMessage>& messages,
                                       const ChatOptions& options) const;
  // The conversation's prompt, its oldest messages dropped as the request's overflow policy
  // says until it fits the context; `dropped` counts them.
  std::vector<TokenId> fit_conversation(const Request& request, int32_t& dropped) const;
  void report_prompts(const StepPlan& plan);
  void finish(SequenceId id, FinishReason reason, const std::string& error = {});
  void finish_sequence(std::unique_ptr<Sequence> seq, FinishReason reason,
                       const std::string& error);
  void process_cancellations();
  void lose_device(const std::string& reason);
  void check_device() const {
    if (!device_lost.empty()) throw DeviceLostError(device_lost);
  }
  // The steps of Engine::step().
  bool plan(StepPlan& plan);
  void queue_swap_ins(StepPlan& plan);
  bool idle_step(const StepPlan& plan);
  StepRequest step_request(const StepPlan& plan);
  // request_masks: the step was launched with token_masks; the backend waits for them.
  void prepare_next_step(const StepPlan& plan, bool request_masks);
  void take_results(const StepPlan& plan, const StepResult& result, Clock::time_point start);
  void take_token(Sequence& seq, int32_t token);
  // Whether a step must bring its logits back to the host (a sequence asks for log-probs, or
  // is constrained where the backend's sampler takes no masks).
  bool step_needs_logits(const StepPlan& plan) const;
};

Engine::Impl::StepScope::~StepScope() {
  m.in_step = false;
  try {
    m.process_cancellations();
  } catch (const std::exception& e) {  // a sink threw while unwinding: keep the engine alive
    m.log->error("a token sink threw during cancellation: {}", e.what());
  }
}

Engine::Engine() : impl_(std::make_unique<Impl>()) {}
Engine::~Engine() = default;

std::unique_ptr<Engine> Engine::open(const std::filesystem::path& model_path,
                                     const EngineOptions& options) {
  std::unique_ptr<Engine> engine(new Engine());
  Impl& m = *engine->impl_;
  m.options = options;
  if (m.options.max_sequences <= 0) throw UsageError("max_sequences must be at least 1");
  m.file = ModelFile::open(model_path);
  m.config = ModelConfig::from_gguf(*m.file);
  m.weights = WeightTable::from_gguf(*m.file, m.config);
  m.tokenizer = Tokenizer::from_gguf(*m.file);
  m.constrained = std::make_unique<ConstrainedSteps>(*m.tokenizer, m.config.n_vocab);

  if (!m.options.chat_template_override.empty()) {
    m.chat_template = ChatTemplate::from_name(m.options.chat_template_override);
  } else if (auto source = m.file->get_string("tokenizer.chat_template")) {
    try {
      m.chat_template = ChatTemplate::detect(*source);
    } catch (const UnsupportedError& e) {
      // Raw-token prompts still work; chat submissions say why they cannot.
      m.log->warn("{}: {}", model_path.filename().string(), e.what());
    }
  }
  if (m.chat_template) {
    if (auto eos = m.tokenizer->eos()) m.chat_template->set_eos_text(m.tokenizer->token_text(*eos));
  }

  const int64_t model_context = m.config.context_length;
  if (m.options.context_length <= 0 || m.options.context_length > model_context) {
    m.options.context_length = model_context;
  }
  if (m.options.prefill_chunk_tokens <= 0) m.options.prefill_chunk_tokens = 512;
  m.runtime = make_runtime(*m.file, m.config, m.weights, RuntimeOptions::from(m.options));
  m.scheduler = std::make_unique<Scheduler>(*m.kv, m.options.prefill_chunk_tokens);
  if (m.options.kv_reuse) {
    KvCopier copier;
    copier.to_host = [impl = &m](int32_t slot, int64_t tokens, uint64_t, void* host) {
      return impl->backend->copy_kv_to_host(slot, tokens, host);
    };
    if (const uint64_t state = m.backend->recurrent_state_bytes(); state > 0) {
      copier.state_bytes = state;
      copier.state_to_host = [impl = &m](int32_t slot, void* host) {
        return impl->backend->copy_state_to_host(slot, host);
      };
    }
    m.scheduler->set_kv_reuse(true, m.options.kv_host_cache_bytes, std::move(copier));
    m.scheduler->set_recurrent_state(m.config.is_hybrid());
  }
  m.scheduler->set_pressure_relief([impl = &m](uint64_t bytes) {
    return impl->backend->make_room(
        bytes, "KV needed " + std::to_string((bytes + (1u << 20) - 1) >> 20) + " MiB more");
  });
  m.log->info("opened {} ({} layers, {} wide) on {}; context {} × {} slots",
              model_path.filename().string(), m.config.n_layer, m.config.n_embd, m.backend->name(),
              m.options.context_length, m.options.max_sequences);
  return engine;
}

const ModelConfig& Engine::config() const { return impl_->config; }
const Tokenizer& Engine::tokenizer() const { return *impl_->tokenizer; }
const ChatTemplate* Engine::chat_template() const {
  return impl_->chat_template ? &*impl_->chat_template : nullptr;
}
std::string Engine::device_name() const { return impl_->backend->name(); }
const EngineOptions& Engine::options() const { return impl_->options; }

std::vector<TokenId> Engine::Impl::render_messages(const std::vector<ChatMessage>& messages,
                                                   const ChatOptions& options) const {
  if (messages.empty()) throw UsageError("a request needs messages or prompt tokens");
  if (!chat_template) {
    throw UnsupportedError(
        "this model's chat template is not recognised; choose a template family in the "
        "settings or send raw prompt tokens");
  }
  std::string bos_text;
  if (auto bos = tokenizer->bos()) bos_text = tokenizer->token_text(*bos);
  const std::string text =
      chat_template->render(messages, true, bos_text, options) + options.reply_prefix;
  return tokenizer->encode(text, /*add_bos=*/false, /*parse_special=*/true);
}

std::vector<TokenId> Engine::Impl::fit_conversation(const Request& request,
                                                    int32_t& dropped) const {
  dropped = 0;
  const int64_t context = options.context_length;
  std::vector<TokenId> prompt = render_messages(request.messages, request.chat_options);
  const auto too_long = [context](const std::vector<TokenId>& p) {
    // The prompt and at least one generated token must fit the context.
    return static_cast<int64_t>(p.size()) + 1 > context;
  };
  if (request.context_overflow == ContextOverflow::Stop) {
    if (too_long(prompt)) {
      throw CapacityError("the conversation has " + std::to_string(prompt.size()) +
                          " tokens, more than the context of " + std::to_string(context) +
                          " allows; shorten the conversation or start a new one");
    }
    return prompt;
  }
  // Room kept for the reply: what the request may generate, at most a quarter of the context.
  int64_t reserve = request.reply_reserve_tokens;
  if (reserve < 0)
    reserve = std::min<int64_t>(std::max(request.sampling.max_tokens, 1), context / 4);
  reserve = std::clamp<int64_t>(reserve, 1, std::max<int64_t>(context - 1, 1));
  const auto fits = [&](const std::vector<TokenId>& p) {
    return static_cast<int64_t>(p.size()) + reserve <= context;
  };
  if (fits(prompt)) return prompt;
  // The system messages at the start stay; the oldest turns after them go, a whole turn at a
  // time (a conversation's first message after the system ones stays a user's), and never
  // the last message.
  size_t system = 0;
  while (system < request.messages.size() && request.messages[system].role == "system") ++system;
  std::vector<ChatMessage> kept = request.messages;
  while (!fits(prompt) && kept.size() - system > 1) {
    do {
      kept.erase(kept.begin() + static_cast<std::ptrdiff_t>(system));
      ++dropped;
    } while (kept.size() - system > 1 && kept[system].role != "user");
    prompt = render_messages(kept, request.chat_options);
  }
  if (too_long(prompt)) {
    // One message (a one-shot prompt) is a prompt to the user; more, a conversation whose
    // last message is too long on its own.
    const bool one_shot = request.messages.size() - system <= 1;
    const std::string what =
        one_shot ? std::string("the prompt")
                 : std::string("the last message") + (system > 0 ? " with the system prompt" : "");
    throw CapacityError(
        what + " has " + std::to_string(prompt.size()) + " tokens, more than the context of " +
        std::to_string(context) + " allows; " +
        (one_shot ? "use a shorter prompt or a longer context"
                  : "shorten the message or start a new chat with a longer context"));
  }
  if (dropped > 0) {
    log->info(
        "left out the {} oldest messages: the conversation fits the context of {} in {} "
        "tokens, {} kept for the reply",
        dropped, context, prompt.size(), reserve);
  }
  return prompt;
}

SequenceId Engine::submit(Request request) {
  Impl& m = *impl_;
  m.check_device();
  int32_t dropped = 0;
  std::vector<TokenId> prompt =
      request.prompt_tokens ? *request.prompt_tokens : m.fit_conversation(request, dropped);
  if (prompt.empty()) throw UsageError("the prompt is empty");
  if (request.top_logprobs < -1 || request.top_logprobs > kMaxTopLogprobs) {
    throw UsageError("top_logprobs must be between 0 and " + std::to_string(kMaxTopLogprobs) +
                     " (or -1 for none), not " + std::to_string(request.top_logprobs));
  }
  for (TokenId t : prompt) {
    if (t < 0 || t >= m.config.n_vocab) {
      throw UsageError("prompt token " + std::to_string(t) + " is outside the vocabulary of " +
                       std::to_string(m.config.n_vocab));
    }
  }
  // The prompt and at least one generated token must fit the context (a conversation was
  // fitted above).
  if (static_cast<int64_t>(prompt.size()) + 1 > m.options.context_length) {
    throw CapacityError("the prompt has " + std::to_string(prompt.size()) +
                        " tokens, more than the context of " +
                        std::to_string(m.options.context_length) +
                        " allows; use a shorter prompt or a longer context");
  }
  // kRandomSeed asks for a fresh seed; drawn once here, so a preempted and re-prefilled
  // sequence keeps its draws.
  request.sampling.seed = resolve_seed(request.sampling.seed);
  auto seq = std::make_unique<Sequence>(m.next_id++, std::move(prompt), request.sampling);
  seq->session = std::move(request.session);
  seq->dropped_messages = dropped;
  seq->detokenizer.emplace(*m.tokenizer);
  seq->sink = std::move(request.sink);
  seq->top_logprobs = request.top_logprobs;
  seq->constraint = m.constrained->compile(request.constraint);
  seq->stop_strings = request.sampling.stop_strings;
  if (!request.prompt_tokens && m.chat_template) {
    for (auto& s : m.chat_template->stop_strings()) seq->stop_strings.push_back(s);
    if (m.chat_template->reasoning_format() == ReasoningFormat::Think) {
      // Whether the template opened <think> at the end: its last few tokens tell.
      constexpr size_t kTailTokens = 8;
      const size_t n = seq->tokens.size();
      const std::vector<TokenId> tail(
          seq->tokens.begin() + static_cast<std::ptrdiff_t>(n - std::min(n, kTailTokens)),
          seq->tokens.end());
      seq->reasoning_opened = m.chat_template->prompt_opens_reasoning(
          m.tokenizer->decode(tail, /*render_special=*/true));
    }
  }
  seq->submitted = Clock::now();
  return m.scheduler->add(std::move(seq)).id;
}

void Engine::Impl::finish(SequenceId id, FinishReason reason, const std::string& error) {
  // Taken out of the scheduler first: its slot and KV are free (or kept for the chat's next
  // turn) before the sink hears of it. A reply that ended by itself keeps its KV; a cancelled
  // one frees it at once (as cancel() promises), and after an error the KV is not trusted.
  const bool ended = reason == FinishReason::Eos || reason == FinishReason::StopString ||
                     reason == FinishReason::MaxTokens;
  std::unique_ptr<Sequence> seq = ended ? scheduler->retire(id) : scheduler->remove(id);
  if (seq) finish_sequence(std::move(seq), reason, error);
}

void Engine::Impl::report_prompts(const StepPlan& plan) {
  for (SequenceId id : plan.admitted) {
    Sequence* seq = scheduler->find(id);
    if (!seq || seq->admitted_once) continue;
    seq->admitted_once = true;
    if (!seq->sink.on_prompt) continue;
    PromptInfo info;
    info.prompt_tokens = seq->prompt_tokens;
    info.reused_tokens = seq->reused_tokens;
    info.computed_tokens = seq->prompt_tokens - seq->reused_tokens;
    info.swapped_in_tokens = seq->swapped_in_tokens;
    info.dropped_messages = seq->dropped_messages;
    info.reasoning_opened = seq->reasoning_opened;
    seq->sink.on_prompt(id, info);
  }
}

void Engine::Impl::finish_sequence(std::unique_ptr<Sequence> seq, FinishReason reason,
                                   const std::string& error) {
  // What was held back for a possible stop string is real text after all.
  if (reason != FinishReason::StopString && reason != FinishReason::Cancelled &&
      reason != FinishReason::Error) {
    std::string rest = seq->unsent_text + seq->detokenizer->flush();
    if (!rest.empty() && seq->sink.on_token) seq->sink.on_token(seq->id, rest, kNoToken);
  }
  if (seq->sink.on_finish) seq->sink.on_finish(seq->id, reason, error);
}

void Engine::cancel(SequenceId id) {
  Impl& m = *impl_;
  Sequence* seq = m.scheduler->find(id);
  if (!seq) return;  // already finished: nothing to do
  if (m.in_step) {
    seq->cancel_requested = true;  // a sink cancelled: finish after this step
  } else {
    m.finish(id, FinishReason::Cancelled);
  }
}

void Engine::Impl::process_cancellations() {
  std::vector<SequenceId> cancelled;
  for (const auto& [id, seq] : scheduler->sequences()) {
    if (seq->cancel_requested) cancelled.push_back(id);
  }
  for (SequenceId id : cancelled) finish(id, FinishReason::Cancelled);
}

void Engine::Impl::lose_device(const std::string& reason) {
  if (device_lost.empty()) log->error("{}", reason);
  device_lost = reason;
  std::vector<SequenceId> ids;
  for (const auto& [id, seq] : scheduler->sequences()) ids.push_back(id);
  for (SequenceId id : ids) finish(id, FinishReason::Error, reason);
  try {
    scheduler->drop_kept({});  // nothing kept on a lost device can serve again
  } catch (const Error& e) {
    log->error("freeing kept KV on a lost device: {}", e.what());
  }
}

void Engine::Impl::take_token(Sequence& seq, int32_t token) {
  if (seq.generated == 0) seq.first_token = Clock::now();
  ++seq.generated;
  const bool end = !seq.params.ignore_eos && tokenizer->is_end_of_generation(token);
  if (!end) {
    seq.tokens.push_back(token);
    // Embedding tables padded past the vocabulary can produce ids without text.
    if (static_cast<size_t>(token) < tokenizer->vocab_size())
      seq.unsent_text += seq.detokenizer->push(token);
  }
  const StopDecision stop =
      check_stop({end, seq.unsent_text, &seq.stop_strings, seq.generated, seq.params.max_tokens,
                  static_cast<int64_t>(seq.tokens.size()), options.context_length});
  if (!end && seq.sink.on_token)
    seq.sink.on_token(seq.id, seq.unsent_text.substr(0, stop.send_bytes), token);
  seq.unsent_text.erase(
      0, stop.reason == FinishReason::StopString ? seq.unsent_text.size() : stop.send_bytes);
  if (stop.reason != FinishReason::None) finish(seq.id, stop.reason);
}

bool Engine::Impl::plan(StepPlan& plan) {
  try {
    plan = scheduler->next_step();
  } catch (const DeviceLostError& e) {  // the driver failed while mapping: same as a step
    lose_device(e.what());
    return false;
  }
  for (OversizedSequence& o : plan.oversized) {
    finish_sequence(std::move(o.sequence), FinishReason::Error,
                    "the memory budget holds " + mib_text(o.capacity_bytes) +
                        " of KV and this conversation needs " + mib_text(o.needed_bytes) + " for " +
                        std::to_string(o.tokens) +
                        " tokens; raise the budget or start a shorter conversation");
  }
  try {
    queue_swap_ins(plan);
  } catch (const DeviceLostError& e) {
    lose_device(e.what());
    return false;
  }
  return true;
}

void Engine::Impl::queue_swap_ins(StepPlan& plan) {
  // Between steps, after planning: each copy is queued on the device ahead of the step that
  // reads the KV, and nothing here waits for it. The previous step's buffers are free now.
  swap_in_buffers.clear();
  for (KvSwapIn& in : plan.swap_ins) {
    if (scheduler->slot_of(in.id) != in.slot) continue;  // preempted or ended while planning
    std::string error;
    try {
      const uint64_t kv_bytes = in.host.size() - in.state_bytes;
      if (!backend->copy_kv_from_host(in.slot, in.host.data(), in.tokens))
        error = "the backend cannot copy KV back from host memory";
      else if (in.state_bytes > 0 &&
               !backend->copy_state_from_host(in.slot, in.host.data() + kv_bytes, in.tokens))
        error = "the backend cannot copy the recurrent state back from host memory";
    } catch (const DeviceLostError&) {
      throw;
    } catch (const Error& e) {
      error = e.what();
    }
    if (error.empty()) {
      swap_in_buffers.push_back(std::move(in.host));
      continue;
    }
    // Its first tokens' KV is not in the slot: the chat cannot go on from it.
    std::erase_if(plan.work, [&](const ScheduledWork& w) { return w.id == in.id; });
    finish(in.id, FinishReason::Error, "copying the chat's KV back from host memory: " + error);
  }
  plan.swap_ins.clear();
}

bool Engine::Impl::idle_step(const StepPlan& plan) {
  // KV cut while device work was still queued can wait for it now, at no cost to a step,
  // rather than stay charged to chats that have ended.
  try {
    kv->reclaim(/*wait=*/true);
  } catch (const Error& e) {
    log->error("unmapping KV of ended chats: {}", e.what());
  }
  // Done, unless planning changed something the next step can build on.
  return (!plan.oversized.empty() || !plan.preempted.empty()) && !scheduler->empty();
}

bool Engine::Impl::step_needs_logits(const StepPlan& plan) const {
  const bool host_masks = !backend->samples_with_masks();
  for (const ScheduledWork& w : plan.work) {
    const Sequence* seq = scheduler->find(w.id);
    if (seq && (seq->top_logprobs >= 0 || (host_masks && seq->constraint))) return true;
  }
  return false;
}

StepRequest Engine::Impl::step_request(const StepPlan& plan) {
  // Device sampling: one token per sequence comes back instead of the logits, unless a
  // sequence of the step asks for log-probabilities.
  const bool sample = backend->samples_on_device() && !step_needs_logits(plan);
  batch.clear();
  params.clear();
  history.clear();
  draw_index.clear();
  for (const ScheduledWork& w : plan.work) {
    const Sequence& seq = *scheduler->find(w.id);
    batch.push_back({w.slot,
                     std::span<const int32_t>(seq.tokens.data() + w.start_position,
                                              static_cast<size_t>(w.count)),
                     w.start_position, false});
    if (!sample) continue;
    params.push_back(seq.params);
    const auto window = std::min<size_t>(
        seq.tokens.size(), static_cast<size_t>(std::max(seq.params.penalty_last_n, 0)));
    history.emplace_back(seq.tokens.end() - static_cast<std::ptrdiff_t>(window), seq.tokens.end());
    draw_index.push_back(static_cast<uint64_t>(seq.generated));
  }
  StepRequest request;
  request.batch = batch;
  request.sample = sample;
  request.params = params;
  request.history = history;
  request.draw_index = draw_index;
  request.token_masks = sample && constrained->draws_constrained(plan, *scheduler);
  request.logits = &logits;
  return request;
}

void Engine::Impl::prepare_next_step(const StepPlan& plan, bool request_masks) {
  // First the token masks of constrained sequences: the tokens they depend on are known, so
  // the host computes them while the device runs the step's forward pass, whose sampler
  // waits for them when it applies them.
  constrained->fill(plan, *scheduler, request_masks ? backend.get() : nullptr);
  // While the device runs this step: map what the next step writes for every sequence this
  // step gives a token (and that goes on) or whose prompt goes on, then top the pool up.
  try {
    for (const ScheduledWork& w : plan.work) {
      if (!options.kv_map_ahead) break;
      const Sequence* seq = scheduler->find(w.id);
      if (!seq) continue;
      const int64_t next = w.start_position + w.count;  // where the next step writes
      const auto known = static_cast<int64_t>(seq->tokens.size());
      if (next < known) {
        // Prompt left: the next step computes (at most) another chunk of it. Mapping that
        // chunk's granules now keeps their map calls (~60 us each on a GPU) off its path.
        kv->map_ahead(
            w.slot, std::min({known, next + options.prefill_chunk_tokens, options.context_length}),
            next);
        continue;
      }
      if (next != known) continue;
      if (seq->generated + 1 >= seq->params.max_tokens || next + 1 > options.context_length)
        continue;  // this step's token ends it
      kv->map_ahead(w.slot, next + 1, next);
    }
    kv->refill_pool();
  } catch (const std::exception& e) {
    // The next step's own mapping tries again and reports what fails.
    log->warn("mapping KV ahead of the next step: {}", e.what());
  }
}

void Engine::Impl::take_results(const StepPlan& plan, const StepResult& result,
                                Clock::time_point start) {
  const double elapsed = seconds_between(start, Clock::now());
  int64_t prompt_tokens = 0, decode_tokens = 0;
  int32_t decode_sequences = 0;
  for (const ScheduledWork& w : plan.work) {
    (w.decode ? decode_tokens : prompt_tokens) += w.count;
    decode_sequences += w.decode ? 1 : 0;
  }
  last_decode_sequences = decode_sequences;
  if (decode_sequences > 0) {
    ++decode_steps;
    decode_step_sequences += static_cast<uint64_t>(decode_sequences);
    if (decode_sequences > 1) ++batched_decode_steps;
  }
  // A mixed step's time is shared by token count.
  const double total = static_cast<double>(prompt_tokens + decode_tokens);
  prompt_seconds += elapsed * static_cast<double>(prompt_tokens) / total;
  decode_seconds += elapsed * static_cast<double>(decode_tokens) / total;
  prompt_tokens_done += static_cast<uint64_t>(prompt_tokens);
  decode_tokens_done += static_cast<uint64_t>(decode_tokens);
  ++steps;

  scheduler->complete(plan);
  const auto n_vocab = static_cast<size_t>(config.n_vocab);
  const bool sampled_on_device = !result.tokens.empty();
  // Tokens drawn on the device: their constraints take them side by side first (the loop
  // below reads each outcome in order); a host draw is checked in the loop.
  constrained->accept_all(plan, *scheduler, result.tokens);
  for (size_t i = 0; i < plan.work.size(); ++i) {
    const ScheduledWork& w = plan.work[i];
    Sequence* seq = scheduler->find(w.id);
    if (!seq || seq->cancel_requested) continue;
    // Only the step that computed the last known token predicts a new one.
    if (seq->uncomputed_tokens() != 0) continue;
    int32_t token = 0;
    const std::span<const float> row =
        sampled_on_device ? std::span<const float>()
                          : std::span<const float>(logits.data() + i * n_vocab, n_vocab);
    std::span<const float> draw_row = row;
    std::string verdict;  // accept_all's: empty when the token was taken
    const bool accepted = seq->constraint && constrained->accepted(i, verdict);
    if (accepted) {
      if (!verdict.empty()) {
        finish(w.id, FinishReason::Error, verdict);
        continue;
      }
    } else if (seq->constraint) {
      if (std::string stuck = constrained->check_allowed(*seq); !stuck.empty()) {
        finish(w.id, FinishReason::Error, stuck);
        continue;
      }
      if (!sampled_on_device) draw_row = constrained->masked(*seq, row);
    }
    try {
      if (sampled_on_device) {
        token = result.tokens.at(i);
      } else {
        // Draw as the device would at this token, whichever sampled the earlier ones.
        seq->sampler.set_draw_index(static_cast<uint64_t>(seq->generated));
        token = seq->sampler.sample(draw_row, seq->tokens);
      }
    } catch (const Error& e) {
      finish(w.id, FinishReason::Error, e.what());
      continue;
    }
    if (seq->constraint && !accepted) {
      std::string refused =
          constrained->accept(*seq, token, tokenizer->is_end_of_generation(token));
      if (!refused.empty()) {
        finish(w.id, FinishReason::Error, refused);
        continue;
      }
    }
    const bool ends = !seq->params.ignore_eos && tokenizer->is_end_of_generation(token);
    if (seq->top_logprobs >= 0 && !ends && seq->sink.on_logprobs && !row.empty()) {
      seq->sink.on_logprobs(seq->id, token_logprobs(row, token, seq->top_logprobs, *tokenizer));
    }
    take_token(*seq, token);
  }
}

bool Engine::step() {
  Impl& m = *impl_;
  m.process_cancellations();
  if (!m.device_lost.empty()) {  // nothing can run: whatever is left ends with the reason
    m.lose_device(m.device_lost);
    return false;
  }
  // Planning maps this step's KV (and frees that of preempted sequences): its mapping time
  // and granule counts belong to this step.
  m.kv->reset_step_stats();
  const auto planning = Clock::now();
  m.constrained->begin_step();
  StepPlan plan;
  if (!m.plan(plan)) return false;
  if (plan.work.empty()) return m.idle_step(plan);
  Impl::StepScope scope(m);
  try {
    m.report_prompts(plan);  // inside the step: a sink that cancels waits for its end
    const auto start = Clock::now();
    const StepRequest request = m.step_request(plan);
    m.backend->launch(request);
    const auto launched = Clock::now();
    m.prepare_next_step(plan, request.token_masks);  // host work while the device runs the step
    const auto waiting = Clock::now();
    const StepResult result = m.backend->wait();
    m.swap_in_buffers.clear();  // their copies ran before the step
    const auto done = Clock::now();
    m.take_results(plan, result, start);
    m.plan_us = seconds_between(planning, start) * 1e6;
    m.launch_us = seconds_between(start, launched) * 1e6;
    m.overlap_us = seconds_between(launched, waiting) * 1e6;
    m.wait_us = seconds_between(waiting, done) * 1e6;
    m.results_us = seconds_between(done, Clock::now()) * 1e6;
  } catch (const DeviceLostError& e) {
    m.lose_device(e.what());  // the device can run nothing more: every conversation ends
    return false;
  } catch (const Error& e) {
    for (const ScheduledWork& w : plan.work) m.finish(w.id, FinishReason::Error, e.what());
    return !m.scheduler->empty();
  }
  return true;  // work ran: the caller reads this step's telemetry before the next
}

bool Engine::idle() const { return impl_->scheduler->empty(); }

const std::string& Engine::device_lost_reason() const { return impl_->device_lost; }

std::vector<std::vector<float>> Engine::logits_for(const std::vector<TokenId>& tokens) {
  Impl& m = *impl_;
  m.check_device();
  if (tokens.empty()) throw UsageError("logits_for needs at least one token");
  if (static_cast<int64_t>(tokens.size()) > m.options.context_length) {
    throw CapacityError(std::to_string(tokens.size()) + " tokens do not fit the context of " +
                        std::to_string(m.options.context_length));
  }
  auto slot = m.scheduler->borrow_slot();
  if (!slot) throw CapacityError("every sequence slot is busy; wait for a conversation to finish");
  struct SlotReturn {  // frees the slot and its KV however this ends
    Impl& m;
    int32_t slot;
    ~SlotReturn() {
      m.kv->release(slot);
      m.scheduler->return_slot(slot);
    }
  } slot_return{m, *slot};

  std::vector<std::vector<float>> rows;
  const auto n_vocab = static_cast<size_t>(m.config.n_vocab);
  const auto total = static_cast<int64_t>(tokens.size());
  for (int64_t start = 0; start < total; start += m.options.prefill_chunk_tokens) {
    const int64_t count = std::min(m.options.prefill_chunk_tokens, total - start);
    if (!m.kv->map_through(*slot, start + count, start)) {
      throw CapacityError("the memory budget cannot hold the KV of " + std::to_string(total) +
                          " tokens");
    }
    const BatchSequence seq{
        *slot, std::span<const int32_t>(tokens.data() + start, static_cast<size_t>(count)), start,
        true};
    std::vector<float> chunk;
    m.backend->forward(std::span<const BatchSequence>(&seq, 1), chunk);
    for (int64_t r = 0; r < count; ++r) {
      rows.emplace_back(chunk.begin() + static_cast<std::ptrdiff_t>(r * n_vocab),
                        chunk.begin() + static_cast<std::ptrdiff_t>((r + 1) * n_vocab));
    }
  }
  return rows;
}

void Engine::set_vram_budget(uint64_t bytes) {
  Impl& m = *impl_;
  if (m.in_step) throw UsageError("set_vram_budget() inside a step");
  if (bytes == 0) throw UsageError("a VRAM budget of 0 bytes");
  const uint64_t before = m.memory->budget_bytes();
  if (bytes == before) return;
  m.memory->set_budget_bytes(bytes);
  try {
    m.backend->rebalance("the budget changed from " + std::to_string(before >> 20) + " to " +
                             std::to_string(bytes >> 20) + " MiB",
                         m.scheduler->planned_kv_growth_bytes());
  } catch (...) {
    m.memory->set_budget_bytes(before);
    throw;
  }
  m.log->info("VRAM budget now {} MiB", bytes >> 20);
}

void Engine::drop_kept_kv(const std::string& session) {
  if (impl_->in_step) throw UsageError("drop_kept_kv() inside a step");
  impl_->scheduler->drop_kept(session);
}

int64_t Engine::kept_kv_tokens() const {
  int64_t tokens = 0;
  for (const KeptKv& k : impl_->scheduler->kept())
    if (!k.swapped()) tokens += static_cast<int64_t>(k.tokens.size());
  return tokens;
}

int64_t Engine::swapped_kv_tokens() const {
  int64_t tokens = 0;
  for (const KeptKv& k : impl_->scheduler->kept())
    if (k.swapped()) tokens += static_cast<int64_t>(k.tokens.size());
  return tokens;
}

TelemetrySnapshot Engine::telemetry() const {
  const Impl& m = *impl_;
  TelemetrySnapshot s;
  s.device.name = m.backend->name();
  s.device.gpu = m.backend->is_gpu();
  s.device.total_bytes = m.backend->device_total_bytes();
  s.device.budget_bytes = m.memory->budget_bytes();
  s.device.used_bytes = m.memory->used_bytes();
  s.device.ledger = m.memory->snapshot();
  s.kv = m.kv->stats();
  s.scheduler.running = static_cast<int32_t>(m.scheduler->running());
  s.scheduler.waiting = static_cast<int32_t>(m.scheduler->waiting());
  s.scheduler.preemptions = m.scheduler->preemptions();
  s.scheduler.recomputed_tokens = m.scheduler->recomputed_tokens();
  for (const KeptKv& k : m.scheduler->kept()) {
    if (k.swapped()) {
      ++s.scheduler.swapped_chats;
      s.scheduler.swapped_kv_bytes += k.host.size();
    } else {
      ++s.scheduler.kept_chats;
      s.scheduler.kept_kv_bytes += m.kv->committed_bytes(k.slot);
    }
  }
  s.scheduler.prefix_reused_tokens = m.scheduler->prefix_reused_tokens();
  s.scheduler.kv_swap_outs = m.scheduler->swap_outs();
  s.scheduler.kv_swap_out_bytes = m.scheduler->swap_out_bytes();
  s.scheduler.kv_swap_ins = m.scheduler->swap_ins();
  s.scheduler.kv_swap_in_bytes = m.scheduler->swap_in_bytes();
  s.scheduler.kept_kv_dropped = m.scheduler->kept_dropped();
  s.streaming.layers_resident = static_cast<int32_t>(m.config.n_layer);
  s.streaming.layer_streamed.assign(static_cast<size_t>(m.config.n_layer), 0);
  if (m.prompt_seconds > 0)
    s.throughput.prompt_tokens_per_second =
        static_cast<double>(m.prompt_tokens_done) / m.prompt_seconds;
  if (m.decode_seconds > 0)
    s.throughput.decode_tokens_per_second =
        static_cast<double>(m.decode_tokens_done) / m.decode_seconds;
  s.throughput.steps = m.steps;
  s.throughput.decode_steps = m.decode_steps;
  s.throughput.decode_step_sequences = m.decode_step_sequences;
  s.throughput.batched_decode_steps = m.batched_decode_steps;
  s.throughput.last_decode_sequences = m.last_decode_sequences;
  s.throughput.last_plan_us = m.plan_us;
  s.throughput.last_launch_us = m.launch_us;
  s.throughput.last_overlap_us = m.overlap_us;
  s.throughput.last_wait_us = m.wait_us;
  s.throughput.last_results_us = m.results_us;
  s.throughput.constrained_sequences = m.constrained->constrained_sequences();
  s.throughput.device_masked_sequences = m.constrained->device_masked_sequences();
  s.throughput.last_mask_us = m.constrained->mask_us();
  const auto now = Clock::now();
  for (const auto& [id, seq] : m.scheduler->sequences()) {
    SequenceTelemetry t;
    t.id = id;
    t.tokens = static_cast<int64_t>(seq->tokens.size());
    if (auto slot = m.scheduler->slot_of(id)) {
      t.kv_committed_bytes = m.kv->committed_bytes(*slot);
      if (m.kv->parts() > ModelConfig::kKvPartWindow)
        t.kv_window_committed_bytes = m.kv->committed_bytes(*slot, ModelConfig::kKvPartWindow);
      t.kv_reserved_bytes = m.kv->reserved_bytes(*slot);
    }
    t.waiting = m.scheduler->is_waiting(id);
    t.preemptions = m.scheduler->preemptions_of(id);
    if (seq->generated > 0) {
      t.time_to_first_token_ms = seconds_between(seq->submitted, seq->first_token) * 1e3;
      const double since_first = seconds_between(seq->first_token, now);
      if (since_first > 0 && seq->generated > 1) {
        t.tokens_per_second = static_cast<double>(seq->generated - 1) / since_first;
      }
    }
    s.sequences.push_back(t);
  }
  m.backend->fill_telemetry(s);
  if (m.config.is_moe() && !m.in_step) {
    ExpertTelemetry interval;
    m.backend->collect_expert_telemetry(interval);
    if (interval.n_layer > 0) m.expert_totals.add_interval(interval);
  }
  s.experts = m.expert_totals;
  return s;
}

}  // namespace granule
