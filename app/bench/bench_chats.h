// The chats the engine benchmarks (chats, stream) submit: random greedy prompts with EOS
// ignored, counted by one progress record, and the --device names.
#pragma once
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "granule/engine.h"

namespace granule {

// What the sinks saw, for all chats of one run.
struct ChatsProgress {
  int32_t started = 0;  // chats with their first token
  int32_t finished = 0;
  int64_t generated = 0;  // tokens, all chats
  int32_t errors = 0;
  std::string first_error;
};

// "auto", "cpu" or "cuda"; throws UsageError for another name.
DeviceKind device_kind(const std::string& name);

// Random prompt ids above the first three (the specials of the synthetic vocabulary).
std::vector<TokenId> random_prompt(int64_t tokens, int64_t vocab, std::mt19937_64& random);

// Submits `chats` greedy chats of `prompt_tokens` random tokens (drawn from `random`, chat by
// chat), each generating `generate_tokens` with EOS ignored and under `constraint` (none by
// default), their sinks counting into `progress` (which must outlive them).
void submit_random_chats(Engine& engine, int32_t chats, int64_t prompt_tokens,
                         int32_t generate_tokens, std::mt19937_64& random, ChatsProgress& progress,
                         const Constraint& constraint = {});

}  // namespace granule
