// granule-bench cpu: llama-bench's tests on the CPU backend, driven as llama-bench drives
// llama.cpp (no engine, no sampling): pp (one forward pass of N prompt tokens) and tg (N
// single-token decode steps), each after a prefill of `depth` tokens, mean tokens per second
// over repetitions. Compare with `llama-bench -t THREADS -p 512 -n 128 -d 0,512`.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace granule {

struct CpuBenchOptions {
  std::string model_path;  // a GGUF file, or
  std::string synthetic;   // PRESET[:TYPE], e.g. smollm2-135m:Q4_1
  int32_t pp = 512;        // prompt tokens of the pp test (0: skip)
  int32_t tg = 128;        // generated tokens of the tg test (0: skip)
  std::vector<int32_t> depths = {0};
  int32_t repetitions = 3;
  int32_t threads = 0;  // 0: all cores
  bool exact = false;   // the exact f32 matmuls (BackendOptions::cpu_exact_numerics)
  bool json = false;
};

// Adds the options above to `command` (granule-bench's `cpu` subcommand).
void add_cpu_bench_options(CLI::App& command, CpuBenchOptions& options);

// Prints the table (or JSON) to stdout; returns the process exit code.
int run_cpu_benchmark(const CpuBenchOptions& options);

}  // namespace granule
