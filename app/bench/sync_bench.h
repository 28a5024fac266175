// granule-bench sync: what a phase boundary of a decode step costs on the device — the same
// dependent step as a chain of kernels in a CUDA graph (with and without programmatic
// dependent launch) and as phases of one kernel separated by a grid-wide barrier — for grids
// of 1, 2 and 4 blocks per SM. It decides whether a persistent batch-1 layer kernel (barriers
// instead of launches, kernels/README.md, "Tried and rejected") can win before one is written.
#pragma once
#include <cstdint>

namespace CLI {
class App;
}

namespace granule {

struct SyncBenchOptions {
  int32_t phases = 64;    // boundaries timed per graph replay
  int32_t replays = 200;  // the median replay counts
  bool json = false;
};

void add_sync_bench_options(CLI::App& command, SyncBenchOptions& options);
int run_sync_benchmark(const SyncBenchOptions& options);

}  // namespace granule
