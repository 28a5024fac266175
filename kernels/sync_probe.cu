// granule-bench sync's kernels (sync_probe.cuh): the same dependent step as a kernel per step
// or as phases of one kernel separated by grid barriers; and a writer that finishes late, for
// the tests of what kernels read before their PDL wait.
#include "common.cuh"
#include "grid_sync.cuh"
#include "sync_probe.cuh"

namespace granule::kernels {
namespace {

__device__ __forceinline__ uint64_t global_nanoseconds() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Block i's value of the step: block (7i + 1) mod blocks's value of the step before, plus 1.
__device__ __forceinline__ void probe_step(const float* from, float* to) {
  if (threadIdx.x == 0) {
    const unsigned source = (blockIdx.x * 7u + 1u) % gridDim.x;
    to[blockIdx.x] = __ldcg(from + source) + 1.0f;
  }
}

__global__ void chain_step_kernel(const float* from, float* to) {
  wait_for_previous_kernel();
  allow_next_kernel();
  probe_step(from, to);
}

template <bool BACKOFF>
__global__ void barrier_steps_kernel(float* a, float* b, unsigned long long* counter,
                                     int phases) {
  wait_for_previous_kernel();
  for (int p = 0; p < phases; ++p) {
    if (p > 0) grid_barrier<BACKOFF>(counter);
    probe_step(p % 2 ? b : a, p % 2 ? a : b);
  }
}

__global__ void late_copy_kernel(uint32_t* dst, const uint32_t* src, size_t words,
                                 unsigned delay_ns) {
  allow_next_kernel();
  wait_for_previous_kernel();
  if (threadIdx.x == 0) {
    const uint64_t start = global_nanoseconds();
    while (global_nanoseconds() - start < delay_ns) {
    }
  }
  __syncthreads();
  for (size_t i = threadIdx.x; i < words; i += blockDim.x) dst[i] = src[i];
}

}  // namespace

cudaError_t launch_late_copy(void* dst, const void* src, size_t bytes, unsigned delay_ns,
                             const KernelConfig& config, cudaStream_t stream) {
  if (bytes % 4 != 0 || reinterpret_cast<uintptr_t>(dst) % 4 != 0 ||
      reinterpret_cast<uintptr_t>(src) % 4 != 0)
    return cudaErrorInvalidValue;
  return launch_early(late_copy_kernel, dim3(1), dim3(256), config, stream,
                      static_cast<uint32_t*>(dst), static_cast<const uint32_t*>(src), bytes / 4,
                      delay_ns);
}

int sync_probe_resident_blocks(int threads) {
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, barrier_steps_kernel<false>, threads,
                                                    0) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return per_sm * multiprocessors();
}

cudaError_t launch_sync_probe(SyncProbe kind, int blocks, int threads, int phases,
                              const SyncProbeBuffers& buffers, const KernelConfig& config,
                              cudaStream_t stream) {
  if (blocks <= 0 || phases <= 0) return cudaErrorInvalidValue;
  if (kind == SyncProbe::kChain) {
    for (int p = 0; p < phases; ++p) {
      const cudaError_t status =
          launch_early(chain_step_kernel, dim3(blocks), dim3(threads), config, stream,
                       static_cast<const float*>(p % 2 ? buffers.b : buffers.a),
                       p % 2 ? buffers.a : buffers.b);
      if (status != cudaSuccess) return status;
    }
    return cudaSuccess;
  }
  if (blocks > sync_probe_resident_blocks(threads)) return cudaErrorInvalidValue;
  auto kernel = kind == SyncProbe::kBarrier ? barrier_steps_kernel<false>
                                            : barrier_steps_kernel<true>;
  return launch_early(kernel, dim3(blocks), dim3(threads), config, stream, buffers.a, buffers.b,
                      buffers.counter, phases);
}

}  // namespace granule::kernels
