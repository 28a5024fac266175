// granule-bench chats: N concurrent greedy chats through the Engine (scheduler, KV, device
// sampling, whichever backend), for each N in a list: prefill and decode throughput, peak
// committed KV, preemptions, and what mapping KV granules cost the steps.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace granule {

struct ChatsBenchOptions {
  std::string model_path;  // a GGUF file, or
  std::string synthetic;   // PRESET[:TYPE], e.g. smollm2-135m:Q4_1
  std::vector<int32_t> chats = {1, 8, 32};
  int64_t prompt_tokens = 512;    // per chat (random token ids, seeded per chat)
  int32_t generate_tokens = 128;  // per chat, EOS ignored
  std::string device = "auto";    // auto, cpu or cuda
  int64_t prefill_chunk_tokens = 512;
  uint64_t budget_mib = 0;  // 0 = the engine's default (the device's free memory)
  std::string vram_budget;  // --vram-budget SIZE (granule-cli's reader); wins over budget_mib
  int32_t cpu_threads = 0;
  uint64_t seed = 1;
  int64_t kv_pool_granules = -1;  // the engine's KV pool: -1 sized by the engine, 0 off
  bool kv_map_ahead = true;       // map the next step's KV while a step runs
  std::string telemetry_out;      // record the engine's telemetry here as JSON lines ("" = off)
  std::string steps_out;          // one CSV line per step here ("" = off)
  std::string json_schema;        // every chat constrained by this JSON Schema file ("" = none)
  bool json = false;
};

// Adds the options above to `command` (granule-bench's `chats` subcommand).
void add_chats_bench_options(CLI::App& command, ChatsBenchOptions& options);

// Prints the table (or JSON) to stdout; returns the process exit code. Errors a user can
// cause (no model, a missing file, no GPU for device cuda) are one line on stderr, exit 1.
int run_chats_benchmark(const ChatsBenchOptions& options);

}  // namespace granule
