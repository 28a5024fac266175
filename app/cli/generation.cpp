// Streaming a reply from the engine to the terminal, for `run` and `chat`.
#include "generation.h"

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <optional>
#include <string_view>

#include "granule/error.h"
#include "granule/reasoning.h"

namespace granule::cli {
namespace {

using Clock = std::chrono::steady_clock;

volatile std::sig_atomic_t g_interrupted = 0;

extern "C" void on_sigint(int) { g_interrupted = 1; }

// Installs the SIGINT handler for its lifetime; outside a reply Ctrl-C ends the process as
// usual. No SA_RESTART, so a read waiting at the chat prompt returns too.
class InterruptScope {
 public:
  InterruptScope() {
    g_interrupted = 0;
    struct sigaction action {};
    action.sa_handler = on_sigint;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, &previous_);
  }
  ~InterruptScope() { sigaction(SIGINT, &previous_, nullptr); }
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;

 private:
  struct sigaction previous_ {};
};

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

DeviceKind device_kind(const std::string& name) {
  if (name == "cpu") return DeviceKind::Cpu;
  if (name == "cuda") return DeviceKind::Cuda;
  return DeviceKind::Auto;
}

// Bounds for counts of tokens given on the command line (1 Mi: far past any context).
constexpr int32_t kMaxTokens = 1 << 20;

}  // namespace

void add_generation_options(CLI::App& app, GenerationOptions& options) {
  app.add_option("model", options.model, "GGUF model file")->required();
  app.add_option("-n,--max-tokens", options.max_tokens, "Most tokens to generate per reply")
      ->check(integer_in(kSamplingRanges.max_tokens.min, kSamplingRanges.max_tokens.max))
      ->capture_default_str();
  add_sampling_options(app, options.sampling);
  app.add_option("-c,--ctx-size,--ctx", options.context, "Context length per sequence")
      ->check(integer_in(1, kMaxTokens))
      ->capture_default_str();
  app.add_option("-t,--threads", options.threads, "CPU threads (0 = all cores)")
      ->check(integer_in(0, 4096));
  app.add_option("--host-experts", options.host_expert_share,
                 "A mixture of experts on the GPU whose experts do not all fit: the 256ths of a "
                 "decode step's missed experts the CPU computes while PCIe carries the rest "
                 "(-1: all of them when 8 or more chats decode together, 160/256 when fewer do; 0: none)")
      ->check(integer_in(-1, 256))
      ->capture_default_str();
  app.add_option("--host-rows", options.host_row_share,
                 "A dense model on the GPU whose layers do not all fit: the 256ths of each "
                 "streamed layer's rows the CPU computes in small decode batches while PCIe "
                 "carries the rest (-1: measured at load, 0: none)")
      ->check(integer_in(-1, 256))
      ->capture_default_str();
  app.add_option("--device", options.device, "Where to run: cpu, cuda or auto")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
      ->capture_default_str();
  app.add_option("--template", options.template_name,
                 "Chat template to use instead of the model's (chatml, llama3, llama2, mistral, "
                 "gemma, phi3)")
      ->check(CLI::IsMember(ChatTemplate::family_names()));
  app.add_option("--system", options.system, "System prompt");
  app.add_flag("--no-stats", options.quiet_stats, "Do not print the speeds after each reply");
  app.add_option("--reasoning", options.reasoning,
                 "A reasoning model's thinking (Qwen3 <think>, gpt-oss analysis): show it (dimmed "
                 "on a terminal, between <think> lines otherwise), hide it, or turn it off")
      ->check(CLI::IsMember({"show", "hide", "off"}))
      ->capture_default_str();
  app.add_option("--reasoning-effort", options.reasoning_effort,
                 "How much a gpt-oss-style model reasons: low, medium or high (its template's "
                 "default: medium)")
      ->check(CLI::IsMember({"low", "medium", "high"}));
  app.add_option("--telemetry-out", options.telemetry_out,
                 "Record the engine's telemetry to FILE as JSON lines (a frame after each step, "
                 "at most 10 a second, and one at the end of each reply)");
}

std::unique_ptr<Engine> open_engine(const GenerationOptions& options) {
  EngineOptions engine_options;
  engine_options.device = device_kind(options.device);
  engine_options.context_length = options.context;
  engine_options.max_sequences = 1;  // one conversation at a time
  engine_options.cpu_threads = options.threads;
  engine_options.host_expert_share = options.host_expert_share;
  engine_options.host_row_share = options.host_row_share;
  engine_options.vram_budget_bytes = options.vram_budget_bytes;
  engine_options.chat_template_override = options.template_name;
  engine_options.kv_reuse = options.kv_reuse;
  return Engine::open(options.model, engine_options);
}

std::unique_ptr<TelemetryRecorder> open_telemetry(const GenerationOptions& options) {
  if (options.telemetry_out.empty()) return nullptr;
  return std::make_unique<TelemetryRecorder>(options.telemetry_out);
}

SamplingParams sampling_from(const GenerationOptions& options) {
  SamplingParams params = sampling_params(options.sampling);
  params.max_tokens = options.max_tokens;
  return params;
}

ChatOptions chat_options_from(const GenerationOptions& options) {
  ChatOptions chat;
  if (options.reasoning == "off") chat.enable_thinking = false;
  chat.reasoning_effort = options.reasoning_effort;
  return chat;
}

const ChatTemplate& require_chat_template(const Engine& engine, const GenerationOptions& options) {
  const ChatTemplate* tmpl = engine.chat_template();
  if (tmpl == nullptr) {
    throw UnsupportedError(options.model.string() +
                           ": no chat template recognised in the file; pass --template NAME "
                           "(chatml, llama3, llama2, mistral, gemma, phi3) or --raw");
  }
  return *tmpl;
}

ReplyResult stream_reply(Engine& engine, Request request, TelemetryRecorder* telemetry, bool echo,
                         bool show_reasoning) {
  ReplyResult result;
  bool finished = false;
  Clock::time_point first_token_at{};
  Clock::time_point last_token_at{};
  // A chat reply of a reasoning model: its reasoning apart from its answer.
  std::optional<ReasoningParser> parser;
  const ChatTemplate* tmpl = engine.chat_template();
  if (!request.prompt_tokens && tmpl != nullptr &&
      tmpl->reasoning_format() != ReasoningFormat::None)
    parser.emplace(tmpl->reasoning_format());
  // Reasoning is dimmed (SGR 2) on a terminal; piped, it sits between <think> lines.
  const bool terminal = isatty(STDOUT_FILENO) != 0;
  bool reasoning_open = false;
  auto print = [&](std::string_view text) { std::fwrite(text.data(), 1, text.size(), stdout); };
  auto release = [&](const ReasoningDelta& delta) {
    result.reasoning += delta.reasoning;
    result.text += delta.content;
    if (!echo) return;
    if (show_reasoning && !delta.reasoning.empty()) {
      if (!reasoning_open) print(terminal ? "\x1b[2m" : "<think>\n");
      reasoning_open = true;
      print(delta.reasoning);
    }
    if (!delta.content.empty()) {
      if (reasoning_open) print(terminal ? "\x1b[0m\n\n" : "\n</think>\n\n");
      reasoning_open = false;
      print(delta.content);
    }
    std::fflush(stdout);
  };
  request.sink.on_token = [&](SequenceId, const std::string& text, int32_t) {
    last_token_at = Clock::now();
    if (result.generated_tokens++ == 0) first_token_at = last_token_at;
    release(parser ? parser->push(text) : ReasoningDelta{{}, text});
  };
  auto caller_on_prompt = std::move(request.sink.on_prompt);
  request.sink.on_prompt = [&, caller_on_prompt](SequenceId id, const PromptInfo& info) {
    if (parser && info.reasoning_opened)
      parser.emplace(ReasoningFormat::Think, /*starts_in_reasoning=*/true);
    if (caller_on_prompt) caller_on_prompt(id, info);
  };
  request.sink.on_finish = [&](SequenceId, FinishReason reason, const std::string& error) {
    if (parser) release(parser->finish());
    if (echo && reasoning_open) print(terminal ? "\x1b[0m" : "\n</think>");
    reasoning_open = false;
    result.finish = reason;
    result.error = error;
    finished = true;
  };

  InterruptScope interrupt_scope;
  const Clock::time_point submitted_at = Clock::now();
  const SequenceId id = engine.submit(std::move(request));
  bool cancel_sent = false;
  while (!finished) {
    if (g_interrupted && !cancel_sent) {
      engine.cancel(id);
      cancel_sent = true;
    }
    const bool stepped = engine.step();
    // The snapshot is only taken when the recorder writes it (at most 10 a second).
    if (telemetry != nullptr && telemetry->due()) telemetry->record(engine.telemetry());
    if (!stepped && !finished) throw Error("the engine went idle before the reply finished");
  }
  if (telemetry != nullptr) telemetry->record_now(engine.telemetry());
  if (result.generated_tokens > 0) {
    result.time_to_first_token_ms = ms_between(submitted_at, first_token_at);
    result.generation_ms = ms_between(first_token_at, last_token_at);
  }
  std::fputs("\n", stdout);
  std::fflush(stdout);
  return result;
}

void print_speeds(const ReplyResult& reply, int64_t prompt_tokens, const PromptInfo* prompt) {
  // The first token's time covers the prompt's prefill; the rest are decode steps.
  const int64_t computed = prompt ? prompt->computed_tokens : prompt_tokens;
  const double prompt_rate =
      reply.time_to_first_token_ms > 0 ? computed * 1000.0 / reply.time_to_first_token_ms : 0;
  const int64_t decode_tokens = reply.generated_tokens > 1 ? reply.generated_tokens - 1 : 0;
  const double decode_rate =
      reply.generation_ms > 0 ? decode_tokens * 1000.0 / reply.generation_ms : 0;
  std::string reuse;
  if (prompt) {
    prompt_tokens = prompt->prompt_tokens;
    reuse = " (" + std::to_string(prompt->computed_tokens) + " new, " +
            std::to_string(prompt->reused_tokens) + " reused)";
  }
  std::fprintf(stderr,
               "prompt: %lld tokens%s, %.1f ms (%.1f tok/s) | generation: %lld tokens, %.1f ms "
               "(%.1f tok/s) | stop: %s\n",
               static_cast<long long>(prompt_tokens), reuse.c_str(), reply.time_to_first_token_ms,
               prompt_rate, static_cast<long long>(reply.generated_tokens), reply.generation_ms,
               decode_rate, finish_reason_name(reply.finish));
}

int64_t count_prompt_tokens(const Engine& engine, const std::vector<ChatMessage>& messages,
                            const ChatOptions& chat_options) {
  const Tokenizer& tokenizer = engine.tokenizer();
  const ChatTemplate* tmpl = engine.chat_template();
  if (tmpl == nullptr) return 0;
  // As Engine::submit does: BOS written by the template, control tokens parsed.
  const std::string bos_text = tokenizer.bos() ? tokenizer.token_text(*tokenizer.bos()) : "";
  const std::string prompt =
      tmpl->render(messages, /*add_generation_prompt=*/true, bos_text, chat_options);
  return static_cast<int64_t>(
      tokenizer.encode(prompt, /*add_bos=*/false, /*parse_special=*/true).size());
}

}  // namespace granule::cli
