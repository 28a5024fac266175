// granule-bench vmm: what each KV granule operation costs on its own (create, map with
// access, unmap, destroy), on the GPU (CUDA driver VMM) or host memory, and on the GPU also
// while a long copy keeps the device busy: whether a call waits for the GPU, which decides
// whether creating pool granules during a step really overlaps it.
#pragma once
#include <cstdint>
#include <string>

namespace CLI {
class App;
}

namespace granule {

struct VmmBenchOptions {
  std::string device = "cuda";  // "cuda" or "host"
  int32_t granules = 64;        // per round: created, mapped one by one, unmapped, destroyed
  int32_t rounds = 5;
  uint64_t busy_mib = 4096;  // the GPU-busy case: a device memset of this size per call
  bool json = false;
};

void add_vmm_bench_options(CLI::App& command, VmmBenchOptions& options);
int run_vmm_benchmark(const VmmBenchOptions& options);

}  // namespace granule
