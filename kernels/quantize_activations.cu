// f32 activations to int8 blocks (one warp per block of 32) and to f16.
#include "quantize_activations.cuh"

namespace granule::kernels {
namespace {

__global__ void quantize_q8_kernel(const float* __restrict__ x, int64_t n_blocks,
                                   ActivationQ8 out) {
  wait_for_previous_kernel();
  allow_next_kernel();
  const int64_t block = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
  if (block >= n_blocks) return;  // whole warps leave together
  const float v = x[block * kQ8Block + threadIdx.x % kWarpSize];
  quantize_block_of_warp(v, out.qs + block * kQ8Block, out.ds + block);
}

__global__ void convert_f32_to_f16_kernel(const float* __restrict__ x, int64_t count,
                                          __half* __restrict__ out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __float2half_rn(x[i]);
}

}  // namespace

cudaError_t launch_quantize_q8(const float* x, int rows, int n, ActivationQ8 out,
                               const KernelConfig& config, cudaStream_t stream) {
  if (n % kQ8Block != 0) return cudaErrorInvalidValue;
  const int64_t n_blocks = static_cast<int64_t>(rows) * n / kQ8Block;
  if (n_blocks == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  return launch_status(launch_early(quantize_q8_kernel,
                                    dim3(ceil_div(n_blocks * kWarpSize, kThreads)), dim3(kThreads),
                                    config, stream, x, n_blocks, out));
}

cudaError_t launch_convert_f32_to_f16(const float* x, int64_t count, __half* out,
                                      cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>(ceil_div(count, kThreads), 65536));
  convert_f32_to_f16_kernel<<<blocks, kThreads, 0, stream>>>(x, count, out);
  return launch_status();
}

}  // namespace granule::kernels
