// granule-bench turns: one chat of several turns through the Engine, each turn's prompt the whole
// conversation so far plus a new user message, with KV reuse across turns on (the kept KV, and a
// recurrent model's state snapshot, continue the chat) and off (every turn recomputes its whole
// prompt): the time to first token of each turn, side by side.
#pragma once
#include <cstdint>
#include <string>

namespace CLI {
class App;
}

namespace granule {

struct TurnsBenchOptions {
  std::string model_path;  // a GGUF file, or
  std::string synthetic;   // PRESET[:TYPE], e.g. qwen35-9b:Q4_0
  int32_t turns = 5;
  int64_t first_prompt_tokens = 2048;  // the first turn's prompt
  int64_t message_tokens = 256;        // each later turn's new user message
  int32_t reply_tokens = 64;           // per turn, EOS ignored
  std::string device = "auto";         // auto, cpu or cuda
  uint64_t seed = 1;
  bool json = false;
};

// Adds the options above to `command` (granule-bench's `turns` subcommand).
void add_turns_bench_options(CLI::App& command, TurnsBenchOptions& options);

// Prints the table (or JSON) to stdout; returns the process exit code (errors: one line on
// stderr, exit 1).
int run_turns_benchmark(const TurnsBenchOptions& options);

}  // namespace granule
