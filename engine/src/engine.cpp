// Engine: opens a model (file, config, weights, tokenizer, template), picks the backend,
// builds the KvSpace on it, and runs continuous batching: each step decodes every running
// sequence, prefills prompt chunks, samples, detokenises and streams text to the sinks.
#include "granule/engine.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>

#include "backend.h"
#include "granule/error.h"
#include "granule/log.h"
#include "kv_space.h"
#include "memory_manager.h"
#include "scheduler.h"

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

std::vector<int32_t> Backend::forward_sample(std::span<const BatchSequence> /*batch*/,
                                             std::span<const SamplingParams> /*params*/,
                                             const std::vector<std::vector<int32_t>>& /*history*/,
                                             std::span<const uint64_t> /*draw_index*/) {
  throw UsageError(name() + " does not sample on the device");
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::string mib_text(uint64_t bytes) { return std::to_string((bytes + (1u << 19)) >> 20) + " MiB"; }

}  // namespace

// One submitted request while it lives in the engine.
struct ActiveSequence {
  SequenceId id = 0;
  std::vector<TokenId> tokens;  // prompt, then every sampled token
  int64_t prompt_tokens = 0;
  int64_t generated = 0;
  SamplingParams params;
  std::vector<std::string> stop_strings;
  Sampler sampler;
  TokenSink sink;
  IncrementalDetokenizer detokenizer;
  std::string unsent_text;  // decoded but held back: it may begin a stop string
  Clock::time_point submitted;
  Clock::time_point first_token;
  bool cancel_requested = false;

  ActiveSequence(const SamplingParams& p, const Tokenizer& tokenizer)
      : params(p), sampler(p), detokenizer(tokenizer) {}
};

struct Engine::Impl {
  EngineOptions options;
  std::unique_ptr<ModelFile> file;
  ModelConfig config;
  WeightTable weights;
  std::unique_ptr<Tokenizer> tokenizer;
  std::optional<ChatTemplate> chat_template;
  std::unique_ptr<MemoryManager> memory;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<KvSpace> kv;
  std::unique_ptr<Scheduler> scheduler;
  std::map<SequenceId, std::unique_ptr<ActiveSequence>> sequences;
  SequenceId next_id = 1;
  bool in_step = false;
  std::vector<float> logits;  // reused across steps

  // throughput
  uint64_t steps = 0;
  double prompt_seconds = 0, decode_seconds = 0;
  uint64_t prompt_tokens_done = 0, decode_tokens_done = 0;

  std::shared_ptr<spdlog::logger> log = logger("engine");

  void open_backend();
  std::vector<TokenId> render_prompt(const Request& request) const;
  void emit(ActiveSequence& seq, const std::string& text, int32_t token);
  void finish(SequenceId id, FinishReason reason, const std::string& error = {});
  void take_token(ActiveSequence& seq, int32_t token);
  void process_cancellations();
};

void Engine::Impl::open_backend() {
  // The budget is the user's, or unlimited until a backend that knows its device sets it.
  memory = std::make_unique<MemoryManager>(options.vram_budget_bytes
                                               ? options.vram_budget_bytes
                                               : std::numeric_limits<uint64_t>::max() / 2);
  const BackendInit init{*file, config, weights, *memory, options};
#ifdef GRANULE_HAVE_CUDA
  if (options.device != DeviceKind::Cpu) {
    try {
      backend = make_cuda_backend(init);
    } catch (const DeviceError& e) {
      if (options.device == DeviceKind::Cuda) throw;
      // Expected on machines without an NVIDIA driver: one line at info level, so command-line
      // errors stay one line on stderr; the device name says "CPU" either way.
      log->info("no usable GPU ({}); running on the CPU", e.what());
    }
  }
#else
  if (options.device == DeviceKind::Cuda) {
    throw UnsupportedError("this build of Granule has no CUDA backend; choose the CPU device");
  }
#endif
  if (!backend) {
    backend = make_cpu_backend(init);
    if (!options.vram_budget_bytes && backend->device_total_bytes()) {
      memory->set_budget_bytes(backend->device_total_bytes());
    }
  }
  KvGeometry geometry;
  geometry.bytes_per_token = backend->kv_bytes_per_token();
  geometry.max_tokens = options.context_length;
  geometry.slots = options.max_sequences;
  kv = std::make_unique<KvSpace>(backend->make_kv_virtual_memory(), geometry, *memory);
  backend->attach_kv(*kv);
  const uint64_t pool =
      options.kv_pool_granules < 0
          ? default_kv_pool_granules(geometry, options.prefill_chunk_tokens, kv->granule_bytes())
          : static_cast<uint64_t>(options.kv_pool_granules);
  kv->set_pool_target(pool);
  const uint64_t created = kv->refill_pool();
  log->info("KV pool: {} of {} granules created ahead of need", created, pool);
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

  const int64_t model_context = m.config.context_length;
  if (m.options.context_length <= 0 || m.options.context_length > model_context) {
    m.options.context_length = model_context;
  }
  if (m.options.prefill_chunk_tokens <= 0) m.options.prefill_chunk_tokens = 512;
  m.open_backend();
  m.scheduler = std::make_unique<Scheduler>(*m.kv, m.options.prefill_chunk_tokens);
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

std::vector<TokenId> Engine::Impl::render_prompt(const Request& request) const {
  if (request.prompt_tokens) return *request.prompt_tokens;
  if (request.messages.empty()) throw UsageError("a request needs messages or prompt tokens");
  if (!chat_template) {
    throw UnsupportedError(
        "this model's chat template is not recognised; choose a template family in the "
        "settings or send raw prompt tokens");
  }
  std::string bos_text;
  if (auto bos = tokenizer->bos()) bos_text = tokenizer->token_text(*bos);
  const std::string text = chat_template->render(request.messages, true, bos_text);
  return tokenizer->encode(text, /*add_bos=*/false, /*parse_special=*/true);
}

SequenceId Engine::submit(Request request) {
  Impl& m = *impl_;
  std::vector<TokenId> prompt = m.render_prompt(request);
  if (prompt.empty()) throw UsageError("the prompt is empty");
  for (TokenId t : prompt) {
    if (t < 0 || t >= m.config.n_vocab) {
      throw UsageError("prompt token " + std::to_string(t) + " is outside the vocabulary of " +
                       std::to_string(m.config.n_vocab));
    }
  }
  // The prompt and at least one generated token must fit the context.
  if (static_cast<int64_t>(prompt.size()) + 1 > m.options.context_length) {
    throw CapacityError(
        "the prompt has " + std::to_string(prompt.size()) + " tokens, more than the context of " +
        std::to_string(m.options.context_length) + " allows; shorten the conversation");
  }
  auto seq = std::make_unique<ActiveSequence>(request.sampling, *m.tokenizer);
  seq->id = m.next_id++;
  seq->prompt_tokens = static_cast<int64_t>(prompt.size());
  seq->tokens = std::move(prompt);
  seq->sink = std::move(request.sink);
  seq->stop_strings = request.sampling.stop_strings;
  if (!request.prompt_tokens && m.chat_template) {
    for (auto& s : m.chat_template->stop_strings()) seq->stop_strings.push_back(s);
  }
  seq->submitted = Clock::now();
  m.scheduler->add(seq->id, seq->prompt_tokens);
  const SequenceId id = seq->id;
  m.sequences.emplace(id, std::move(seq));
  return id;
}

void Engine::Impl::finish(SequenceId id, FinishReason reason, const std::string& error) {
  auto it = sequences.find(id);
  if (it == sequences.end()) return;
  std::unique_ptr<ActiveSequence> seq = std::move(it->second);
  sequences.erase(it);
  scheduler->remove(id);  // frees its slot and KV
  // What was held back for a possible stop string is real text after all.
  if (reason != FinishReason::StopString && reason != FinishReason::Cancelled &&
      reason != FinishReason::Error) {
    std::string rest = seq->unsent_text + seq->detokenizer.flush();
    if (!rest.empty() && seq->sink.on_token) seq->sink.on_token(id, rest, kNoToken);
  }
  if (seq->sink.on_finish) seq->sink.on_finish(id, reason, error);
}

void Engine::cancel(SequenceId id) {
  Impl& m = *impl_;
  auto it = m.sequences.find(id);
  if (it == m.sequences.end()) return;  // already finished: nothing to do
  if (m.in_step) {
    it->second->cancel_requested = true;  // a sink cancelled: finish after this step
  } else {
    m.finish(id, FinishReason::Cancelled);
  }
}

void Engine::Impl::process_cancellations() {
  std::vector<SequenceId> cancelled;
  for (const auto& [id, seq] : sequences) {
    if (seq->cancel_requested) cancelled.push_back(id);
  }
  for (SequenceId id : cancelled) finish(id, FinishReason::Cancelled);
}

void Engine::Impl::emit(ActiveSequence& seq, const std::string& text, int32_t token) {
  if (seq.sink.on_token) seq.sink.on_token(seq.id, text, token);
}

void Engine::Impl::take_token(ActiveSequence& seq, int32_t token) {
  if (seq.generated == 0) seq.first_token = Clock::now();
  ++seq.generated;
  if (!seq.params.ignore_eos && tokenizer->is_end_of_generation(token)) {
    finish(seq.id, FinishReason::Eos);
    return;
  }
  seq.tokens.push_back(token);
  scheduler->append_token(seq.id);

  // Embedding tables padded past the vocabulary can produce ids without text.
  if (static_cast<size_t>(token) < tokenizer->vocab_size())
    seq.unsent_text += seq.detokenizer.push(token);
  const size_t stop_at = find_stop_string(seq.unsent_text, seq.stop_strings);
  if (stop_at != std::string::npos) {
    emit(seq, seq.unsent_text.substr(0, stop_at), token);
    finish(seq.id, FinishReason::StopString);
    return;
  }
  const size_t hold = stop_string_holdback(seq.unsent_text, seq.stop_strings);
  emit(seq, seq.unsent_text.substr(0, seq.unsent_text.size() - hold), token);
  seq.unsent_text.erase(0, seq.unsent_text.size() - hold);

  const bool context_full = static_cast<int64_t>(seq.tokens.size()) >= options.context_length;
  if (seq.generated >= seq.params.max_tokens || context_full) {
    finish(seq.id, FinishReason::MaxTokens);
  }
}

bool Engine::step() {
  Impl& m = *impl_;
  m.process_cancellations();
  // Planning maps this step's KV (and frees that of preempted sequences): its mapping time
  // and granule counts belong to this step.
  m.kv->reset_step_stats();
  StepPlan plan = m.scheduler->next_step();
  // Sinks run inside the step; a cancel they ask for waits until the step is over, even
  // when a sink throws.
  struct StepScope {
    Impl& m;
    explicit StepScope(Impl& impl) : m(impl) { m.in_step = true; }
    ~StepScope() {
      m.in_step = false;
      try {
        m.process_cancellations();
      } catch (const std::exception& e) {  // a sink threw while unwinding: keep the engine alive
        m.log->error("a token sink threw during cancellation: {}", e.what());
      }
    }
  } scope(m);
  for (const OversizedSequence& o : plan.oversized) {
    m.finish(o.id, FinishReason::Error,
             "the memory budget holds " + mib_text(o.capacity_bytes) +
                 " of KV and this conversation needs " + mib_text(o.needed_bytes) + " for " +
                 std::to_string(o.tokens) +
                 " tokens; raise the budget or start a shorter conversation");
  }
  const std::vector<ScheduledWork>& ran = plan.work;
  // Nothing to run: done, unless planning changed something the next step can build on.
  if (ran.empty())
    return (!plan.oversized.empty() || !plan.preempted.empty()) && !m.sequences.empty();
  std::vector<BatchSequence> batch;
  batch.reserve(ran.size());
  for (const ScheduledWork& w : ran) {
    const ActiveSequence& seq = *m.sequences.at(w.id);
    batch.push_back({w.slot,
                     std::span<const int32_t>(seq.tokens.data() + w.start_position,
                                              static_cast<size_t>(w.count)),
                     w.start_position, false});
  }

  // While the device runs this step: map what the next step writes for every sequence this
  // step gives a token (and that goes on), then top the granule pool up. A GPU backend runs
  // this once the step is launched; otherwise it runs after forward().
  m.backend->set_step_overlap([&m, &ran] {
    try {
      for (const ScheduledWork& w : ran) {
        if (!m.options.kv_map_ahead) break;
        const auto it = m.sequences.find(w.id);
        if (it == m.sequences.end()) continue;
        const ActiveSequence& seq = *it->second;
        const int64_t next = w.start_position + w.count;  // where the next step writes
        if (next != static_cast<int64_t>(seq.tokens.size())) continue;  // more prompt first
        if (seq.generated + 1 >= seq.params.max_tokens || next + 1 > m.options.context_length)
          continue;  // this step's token ends it
        m.kv->map_ahead(w.slot, next + 1);
      }
      m.kv->refill_pool();
    } catch (const std::exception& e) {
      // The next step's own mapping tries again and reports what fails.
      m.log->warn("mapping KV ahead of the next step: {}", e.what());
    }
  });
  struct OverlapScope {  // the work refers to this step: never left set past it
    Backend& backend;
    ~OverlapScope() { backend.set_step_overlap(nullptr); }
  } overlap_scope{*m.backend};

  // Device sampling: one token per sequence comes back instead of the logits.
  const bool device_sampling = m.backend->samples_on_device();
  std::vector<int32_t> device_tokens;
  const auto start = Clock::now();
  try {
    if (device_sampling) {
      std::vector<SamplingParams> params;
      std::vector<std::vector<int32_t>> history;
      std::vector<uint64_t> draw_index;
      for (const ScheduledWork& w : ran) {
        const ActiveSequence& seq = *m.sequences.at(w.id);
        params.push_back(seq.params);
        const auto window = std::min<size_t>(
            seq.tokens.size(), static_cast<size_t>(std::max(seq.params.penalty_last_n, 0)));
        history.emplace_back(seq.tokens.end() - static_cast<std::ptrdiff_t>(window),
                             seq.tokens.end());
        draw_index.push_back(static_cast<uint64_t>(seq.generated));
      }
      device_tokens = m.backend->forward_sample(batch, params, history, draw_index);
    } else {
      m.backend->forward(batch, m.logits);
    }
  } catch (const Error& e) {
    for (const ScheduledWork& w : ran) m.finish(w.id, FinishReason::Error, e.what());
    return !m.sequences.empty();
  }
  const double elapsed = seconds_between(start, Clock::now());
  m.backend->run_step_overlap();  // when the backend did not (the CPU computes in forward())
  int64_t prompt_tokens = 0, decode_tokens = 0;
  for (const ScheduledWork& w : ran) (w.decode ? decode_tokens : prompt_tokens) += w.count;
  // A mixed step's time is shared by token count.
  const double total = static_cast<double>(prompt_tokens + decode_tokens);
  m.prompt_seconds += elapsed * static_cast<double>(prompt_tokens) / total;
  m.decode_seconds += elapsed * static_cast<double>(decode_tokens) / total;
  m.prompt_tokens_done += static_cast<uint64_t>(prompt_tokens);
  m.decode_tokens_done += static_cast<uint64_t>(decode_tokens);
  ++m.steps;

  const auto n_vocab = static_cast<size_t>(m.config.n_vocab);
  for (size_t i = 0; i < ran.size(); ++i) {
    const ScheduledWork& w = ran[i];
    m.scheduler->advance(w.id, w.count);
    auto it = m.sequences.find(w.id);
    if (it == m.sequences.end()) continue;
    ActiveSequence& seq = *it->second;
    if (seq.cancel_requested) continue;
    // Only the step that fed the last known token predicts a new one.
    if (w.start_position + w.count != static_cast<int64_t>(seq.tokens.size())) continue;
    int32_t token = 0;
    try {
      token = device_sampling
                  ? device_tokens.at(i)
                  : seq.sampler.sample(
                        std::span<const float>(m.logits.data() + i * n_vocab, n_vocab), seq.tokens);
    } catch (const Error& e) {
      m.finish(w.id, FinishReason::Error, e.what());
      continue;
    }
    m.take_token(seq, token);
  }
  return true;
}

bool Engine::idle() const { return impl_->sequences.empty(); }

std::vector<std::vector<float>> Engine::logits_for(const std::vector<TokenId>& tokens) {
  Impl& m = *impl_;
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
    if (!m.kv->map_through(*slot, start + count)) {
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
  s.streaming.layers_resident = static_cast<int32_t>(m.config.n_layer);
  if (m.prompt_seconds > 0)
    s.throughput.prompt_tokens_per_second =
        static_cast<double>(m.prompt_tokens_done) / m.prompt_seconds;
  if (m.decode_seconds > 0)
    s.throughput.decode_tokens_per_second =
        static_cast<double>(m.decode_tokens_done) / m.decode_seconds;
  s.throughput.steps = m.steps;
  const auto now = Clock::now();
  for (const auto& [id, seq] : m.sequences) {
    SequenceTelemetry t;
    t.id = id;
    t.tokens = static_cast<int64_t>(seq->tokens.size());
    if (auto slot = m.scheduler->slot_of(id)) {
      t.kv_committed_bytes = m.kv->committed_bytes(*slot);
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
  return s;
}

}  // namespace granule
