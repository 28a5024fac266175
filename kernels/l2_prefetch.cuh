// Weights pulled into L2 ahead of the product that reads them: a decode step at batch 1 leaves
// HBM idle while its small kernels (RoPE, attention, norms, quantisation) run, and its short
// products (Q/K/V, the output projection) are bound by the first DRAM round trip rather than
// by bandwidth. A prefetch launched in the chain before those small kernels lets their weights
// arrive in L2 meanwhile (kernels/PERF_NOTES.md, "L2 prefetch").
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernel_config.h"

namespace granule::kernels {

struct L2PrefetchArgs {
  static constexpr int kMaxRanges = 4;
  const void* data[kMaxRanges] = {};
  int64_t bytes[kMaxRanges] = {};
  int ranges = 0;
};

// Issues prefetch.global.L2 for every 128-byte line of every range and then waits for the
// kernel before it in the stream, so that under early launch a later kernel never overtakes
// the earlier ones.
// Reads nothing a kernel writes; changes no memory. A no-op for empty ranges.
cudaError_t launch_l2_prefetch(const L2PrefetchArgs& args, const KernelConfig& config,
                               cudaStream_t stream);

}  // namespace granule::kernels
