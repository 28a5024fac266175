// What engine tests submit and what they collect: Output (what one sequence's sink saw),
// sinks that fill one, chats and their requests, run_to_idle and the KV left after.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "granule/engine.h"

namespace granule::test {

// The CPU engine the engine tests open: 2 threads, `context_length` tokens a chat, `chats`
// slots; the rest at the engine's defaults.
// The CPU backend on its exact path (cpu_exact_numerics), two threads.
EngineOptions cpu_engine_options(int64_t context_length, int32_t chats);

// What a sink saw for one sequence.
struct Output {
  std::vector<int32_t> tokens;  // generated tokens (text released without one is not counted)
  std::string text;
  FinishReason reason = FinishReason::None;
  int finishes = 0;
  std::string error;
  int prompts = 0;         // on_prompt calls
  PromptInfo prompt_info;  // what the last one said
};
using Outputs = std::map<SequenceId, Output>;

// A sink that records into `out`, or into outputs[id] for whichever sequence it serves.
TokenSink sink_into(Output& out);
TokenSink sink_into(Outputs& outputs);

// A chat as the engine tests submit it: its prompt, how many tokens it answers (EOS ignored)
// and how it samples.
struct Chat {
  std::vector<TokenId> prompt;
  int32_t max_tokens = 0;
  SamplingParams sampling = SamplingParams::greedy();
};

// The chat's request (sampling.max_tokens and ignore_eos set), without a sink or with one.
// prompt_tokens is set even when the prompt is empty: a request of messages resets it.
Request chat_request(const Chat& chat);
Request chat_request(const Chat& chat, Output& out);
Request chat_request(const Chat& chat, Outputs& outputs);

// Each chat's tokens alone: run one after the other on one engine opened with `options`.
std::vector<std::vector<int32_t>> tokens_alone(const std::filesystem::path& model,
                                               const std::vector<Chat>& chats,
                                               const EngineOptions& options);

// The KV the engine's ledger holds committed.
uint64_t kv_committed(const Engine& engine);
// Chats that ended keep their KV for a next turn (EngineOptions::kv_reuse): once none runs,
// that is all the KV committed (checked); dropping it frees the rest. Returns what is left.
uint64_t kv_committed_after_dropping_kept(Engine& engine);

// Steps until nothing is left to do (at most max_steps); step() must never throw, and the
// engine must be idle after.
void run_to_idle(Engine& engine, int max_steps = 100000);

}  // namespace granule::test
