// What `run` and `chat` share: the engine and sampling options, opening the engine, and
// streaming one reply to stdout with Ctrl-C cancelling it and the speeds printed after.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli.h"
#include "granule/engine.h"
#include "granule/telemetry_json.h"

namespace granule::cli {

struct GenerationOptions {
  std::filesystem::path model;
  int32_t max_tokens = kSamplingRanges.max_tokens.default_value;
  SamplingOptions sampling;  // cli.h: --preset, --temp, ..., --seed
  int64_t context = 4096;
  int32_t threads = 0;
  int32_t host_expert_share = -1;  // EngineOptions::host_expert_share
  int32_t host_row_share = -1;     // EngineOptions::host_row_share
  std::string device = "auto";
  // --vram-budget (added by run and chat); 0: the backend's default
  uint64_t vram_budget_bytes = 0;
  std::string template_name;  // "" = detect from the GGUF
  std::string system;
  bool quiet_stats = false;
  std::filesystem::path telemetry_out;  // "" = no telemetry recording
  bool kv_reuse = true;  // chat: keep a reply's KV for the next turn (--no-kv-reuse turns it off)
  // --reasoning: "show" the model's reasoning (dimmed on a terminal, between <think> lines
  // otherwise), "hide" it, or turn it "off" (the template's enable_thinking false).
  std::string reasoning = "show";
  std::string reasoning_effort;  // --reasoning-effort low|medium|high (gpt-oss); "" = default
};

// Adds the model argument and the options both commands take.
void add_generation_options(CLI::App& app, GenerationOptions& options);

std::unique_ptr<Engine> open_engine(const GenerationOptions& options);
// The recorder for --telemetry-out, or null without it. Throws Error when the file cannot
// be written (its message names the file, not the model).
std::unique_ptr<TelemetryRecorder> open_telemetry(const GenerationOptions& options);
SamplingParams sampling_from(const GenerationOptions& options);
// The chat template's variables from --reasoning and --reasoning-effort.
ChatOptions chat_options_from(const GenerationOptions& options);

// The chat template the engine uses, or a UsageError telling the user how to pick one.
const ChatTemplate& require_chat_template(const Engine& engine, const GenerationOptions& options);

struct ReplyResult {
  std::string text;       // the answer (without the reasoning, when the template has one)
  std::string reasoning;  // the model's reasoning (<think>, harmony's analysis channel)
  FinishReason finish = FinishReason::None;
  std::string error;
  int64_t generated_tokens = 0;
  double time_to_first_token_ms = 0;
  double generation_ms = 0;  // from the first token to the last
};

// Submits the request, writes the reply to stdout as it comes and steps the engine until
// it ends. Ctrl-C (SIGINT) cancels the reply instead of ending the process. With a
// recorder, a telemetry frame follows each step (throttled by the recorder) and one more
// at the reply's end.
// echo false: nothing is written to stdout (the caller prints the reply itself). A chat
// request's reasoning is split from the answer (ReasoningParser) and shown as
// show_reasoning says.
ReplyResult stream_reply(Engine& engine, Request request, TelemetryRecorder* telemetry = nullptr,
                         bool echo = true, bool show_reasoning = true);

// "prompt: 12 tokens, 3.4 ms (3529.4 tok/s) | generation: 64 tokens ..." on stderr. With the
// engine's PromptInfo (a chat turn) the prompt part counts and rates only the tokens computed:
// "prompt: 155 tokens (12 new, 143 reused), 3.4 ms (3529.4 tok/s) | ...".
void print_speeds(const ReplyResult& reply, int64_t prompt_tokens,
                  const PromptInfo* prompt = nullptr);

// The number of prompt tokens the engine sees for these messages (rendered with the
// engine's template and encoded the way Engine::submit does).
int64_t count_prompt_tokens(const Engine& engine, const std::vector<ChatMessage>& messages,
                            const ChatOptions& chat_options = {});

}  // namespace granule::cli
