// Device helpers shared by every kernel family: warp reductions, half/bf16 loads, the
// launch-check helper the launchers return through, early launch, and small integer helpers.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "kernel_config.h"

namespace granule::kernels {

constexpr int kWarpSize = 32;

inline int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// Launchers return this: the error of the launch call itself (`launched`, what
// cudaLaunchKernelEx returned), else the error a <<<...>>> launch left behind, which only
// cudaGetLastError() reports. Reading it also clears it, so a failed launch is reported once,
// by the launcher that made it, and never surfaces in a later launcher's status. Kernels
// never abort.
inline cudaError_t launch_status(cudaError_t launched = cudaSuccess) {
  const cudaError_t last = cudaGetLastError();
  return launched != cudaSuccess ? launched : last;
}

// Splits `columns` batch columns into groups of 16, 8, 4, 2 and 1, largest first, and calls
// launch(first_column, std::integral_constant<int, N>{}) for each group in order (one launch
// reads the weights once for all its N columns). Stops at the first error and returns it.
template <typename Launch>
cudaError_t for_each_column_group(int columns, Launch&& launch) {
  int column = 0;
  auto group = [&](auto size) {
    const cudaError_t status = launch(column, size);
    column += decltype(size)::value;
    return status;
  };
  while (column < columns) {
    const int left = columns - column;
    const cudaError_t status = left >= 16  ? group(std::integral_constant<int, 16>{})
                               : left >= 8 ? group(std::integral_constant<int, 8>{})
                               : left >= 4 ? group(std::integral_constant<int, 4>{})
                               : left >= 2 ? group(std::integral_constant<int, 2>{})
                                           : group(std::integral_constant<int, 1>{});
    if (status != cudaSuccess) return status;
  }
  return cudaSuccess;
}

#ifdef __CUDACC__
// v combined over the warp by op in butterflies of lane distance 16, 8, 4, 2, 1: every lane gets
// the result.
template <typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  return warp_reduce(v, [](float a, float b) { return a + b; });
}

// warp_sum() of N values at once: the same butterflies, interleaved, so the same bits for each
// and one chain of five shuffle latencies instead of N.
template <int N>
__device__ __forceinline__ void warp_sums(float (&v)[N]) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] += __shfl_xor_sync(0xffffffffu, v[i], offset);
}

__device__ __forceinline__ float warp_max(float v) {
  return warp_reduce(v, [](float a, float b) { return fmaxf(a, b); });
}
__device__ __forceinline__ int warp_sum_int(int v) {
  return warp_reduce(v, [](int a, int b) { return a + b; });
}
__device__ __forceinline__ int warp_max_int(int v) {
  return warp_reduce(v, [](int a, int b) { return max(a, b); });
}
__device__ __forceinline__ int warp_min_int(int v) {
  return warp_reduce(v, [](int a, int b) { return min(a, b); });
}

// Sums v over a whole block (blockDim.x a multiple of 32, at most 1024); every thread
// gets the total. `scratch` needs 32 floats of shared memory.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int n_warps = blockDim.x / kWarpSize;
  v = lane < n_warps ? scratch[lane] : 0.0f;
  return warp_sum(v);
}

__device__ __forceinline__ float half_bits_to_float(uint16_t bits) {
  return __half2float(__ushort_as_half(bits));
}

__device__ __forceinline__ float bf16_bits_to_float(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}

// Reads 4 bytes at a 2-byte aligned address (GGUF blocks are only 2-byte aligned).
__device__ __forceinline__ int load_int_aligned2(const uint8_t* p) {
  const uint16_t* p16 = reinterpret_cast<const uint16_t*>(p);
  return static_cast<int>(static_cast<uint32_t>(p16[0]) | (static_cast<uint32_t>(p16[1]) << 16));
}

__device__ __forceinline__ int load_int_aligned4(const uint8_t* p) {
  return *reinterpret_cast<const int*>(p);
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + __expf(-x)); }

// Programmatic dependent launch (sm_90+; no-ops elsewhere). A kernel launched with
// launch_early() may start while the kernel before it still runs; it must call
// wait_for_previous_kernel() before touching anything that kernel (or any earlier one)
// writes or reads — before that it may only read data no kernel of the step writes: weights,
// and the step's inputs the host copied in before the step's first kernel (positions,
// lengths, slots) or at attach (the slots' KV bases).
// allow_next_kernel() lets such a dependent start as soon as every block of this kernel
// has called it (it never weakens the dependent's wait).
__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_next_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
#endif  // __CUDACC__

// Turns config.early_launch off unless the current device has compute capability 9.0 or
// later (programmatic dependent launch needs it). Returns the device query's error, leaving
// the config as it was and no error behind for cudaGetLastError().
cudaError_t fit_to_device(KernelConfig& config);

// The current device's multiprocessor count, queried once per process (132, an H100/H200's,
// if the query fails; the error is not left for a later launch's status).
int multiprocessors();

// Launches kernel<<<grid, block, shared_bytes, stream>>>(args...) so that it may start before
// the previous kernel in the stream has finished (see wait_for_previous_kernel) when
// config.early_launch is on; an ordinary launch otherwise. Stream capture records it as a
// programmatic edge. Returns cudaLaunchKernelEx's status.
template <typename... Params, typename... Args>
cudaError_t launch_early_shared(void (*kernel)(Params...), dim3 grid, dim3 block,
                                size_t shared_bytes, const KernelConfig& config,
                                cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t launch{};
  launch.gridDim = grid;
  launch.blockDim = block;
  launch.dynamicSmemBytes = shared_bytes;
  launch.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = config.early_launch ? 1 : 0;
  launch.attrs = attribute;
  launch.numAttrs = 1;
  return cudaLaunchKernelEx(&launch, kernel, std::forward<Args>(args)...);
}

// launch_early_shared() without dynamic shared memory.
template <typename... Params, typename... Args>
cudaError_t launch_early(void (*kernel)(Params...), dim3 grid, dim3 block,
                         const KernelConfig& config, cudaStream_t stream, Args&&... args) {
  return launch_early_shared(kernel, grid, block, 0, config, stream, std::forward<Args>(args)...);
}

}  // namespace granule::kernels
