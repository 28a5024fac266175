// granule-bench kv: one seeded chat workload replayed under full-context reservation,
// power-of-two bucket growth and Granule's granules, on host memory or the GPU.
#pragma once
#include <cstdint>
#include <string>

namespace CLI {
class App;
}

namespace granule {

struct KvBenchOptions {
  int32_t chats = 32;
  int32_t max_turns = 8;
  uint64_t seed = 1;
  // A synthetic model preset ("smollm2-135m", "llama3-8b", ...) whose KV shape, in fp16,
  // gives the bytes per token; bytes_per_token > 0 overrides it.
  std::string model = "smollm2-135m";
  int64_t bytes_per_token = 0;
  int64_t context_tokens = 8192;
  int64_t prefill_chunk_tokens = 512;
  int64_t lookahead_tokens = 16;
  int64_t min_bucket_tokens = 256;
  std::string device = "host";  // "host" or "cuda"
  uint64_t host_granule_bytes = 2u << 20;
  bool touch_host_pages = true;  // fault host pages in on commit (real cost and RSS)
  bool json = false;
};

// Adds the options above to `command` (granule-bench's `kv` subcommand), bound to `options`.
void add_kv_bench_options(CLI::App& command, KvBenchOptions& options);

// Prints the table (or JSON) to stdout; returns the process exit code. Errors a user can
// cause (unknown preset, no GPU for device cuda) are one line on stderr and exit code 1.
int run_kv_benchmark(const KvBenchOptions& options);

}  // namespace granule
