// granule-bench stream: decode and prompt throughput through the Engine as the VRAM budget
// shrinks below the model's weights (the layers that no longer fit are streamed from pinned
// host memory every pass), each figure beside the PCIe bound for its shape.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace granule {

struct StreamBenchOptions {
  std::string model_path;  // a GGUF file, or
  std::string synthetic;   // PRESET[:TYPE]; with neither, llama3-8b:Q4_0
  // Budgets as percentages of the model's weight bytes; each gets the workspace and the KV
  // reserve the engine needs on top.
  std::vector<int32_t> budgets = {100, 75, 50, 25};
  int32_t tokens = 64;          // generated per chat in the decode tests
  int32_t batch = 16;           // chats of the batched decode test
  int64_t short_prompt = 16;    // prompt tokens per chat in the decode tests
  int64_t prompt_tokens = 512;  // the prompt test's prompt (pp512)
  std::string device = "cuda";  // auto, cpu or cuda
  int64_t prefill_chunk_tokens = 512;
  int32_t cpu_threads = 0;
  int32_t host_expert_share = -1;  // EngineOptions::host_expert_share
  int32_t host_row_share = -1;     // EngineOptions::host_row_share
  uint64_t seed = 1;
  std::string telemetry_out;  // record the engine's telemetry here as JSON lines ("" = off)
  bool json = false;
};

// Adds the options above to `command` (granule-bench's `stream` subcommand).
void add_stream_bench_options(CLI::App& command, StreamBenchOptions& options);

// Prints the table (or JSON) to stdout; returns the process exit code. A budget the engine
// cannot open prints its one-line error in its row and the others still run; errors a
// user can cause before that (no model, bad options) are one line on stderr, exit 1.
int run_stream_benchmark(const StreamBenchOptions& options);

}  // namespace granule
