// What a phase boundary costs on the device, for granule-bench sync: `phases` steps in which
// every block reads a value another block wrote in the step before (so each step waits for
// the whole previous one), either as a chain of kernels (one launch per step, with or without
// programmatic dependent launch) or as one kernel with a grid barrier between steps
// (grid_sync.cuh). Captured into a graph by the caller, replays time the boundaries alone.
#pragma once
#include <cuda_runtime.h>

#include "kernel_config.h"

namespace granule::kernels {

enum class SyncProbe { kChain, kBarrier, kBarrierBackoff };

struct SyncProbeBuffers {
  float* a = nullptr;  // `blocks` floats each
  float* b = nullptr;
  unsigned long long* counter = nullptr;  // zero before the first launch
};

// The blocks of `threads` threads the device holds at once for the barrier kernel.
int sync_probe_resident_blocks(int threads);

// Launches the probe's `phases` steps over `blocks` blocks into `stream`: kChain as `phases`
// kernels (launch_early per config.early_launch), the barrier kinds as one kernel (blocks
// must not exceed sync_probe_resident_blocks, else cudaErrorInvalidValue).
cudaError_t launch_sync_probe(SyncProbe kind, int blocks, int threads, int phases,
                              const SyncProbeBuffers& buffers, const KernelConfig& config,
                              cudaStream_t stream);

// A writer that finishes late, for tests of what a kernel launched early reads before its PDL
// wait: it lets the next kernel start at once, waits for the kernel before it, spins for
// `delay_ns` of the device's clock, and only then copies `bytes` (a multiple of 4, both
// pointers 4-byte aligned) from src to dst. One block; launched as launch_early launches.
cudaError_t launch_late_copy(void* dst, const void* src, size_t bytes, unsigned delay_ns,
                             const KernelConfig& config, cudaStream_t stream);

}  // namespace granule::kernels
