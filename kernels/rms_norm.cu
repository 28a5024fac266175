// RMSNorm: one block per row; the normalised values leave in every format asked for.
#include "rms_norm.cuh"

namespace granule::kernels {
namespace {

constexpr int kThreads = 256;

__global__ void rms_norm_kernel(const float* __restrict__ x, const float* __restrict__ weight,
                                int n, float eps, RmsNormOutputs out, const int32_t* __restrict__ source_rows) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const float* xr = x + (source_rows ? source_rows[row] : row) * static_cast<int64_t>(n);
  float sum_sq = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) sum_sq += xr[i] * xr[i];
  const float scale = rsqrtf(block_sum(sum_sq, scratch) / n + eps);
  // Whole warps step over 32-aligned runs, so each warp owns one int8 block per step.
  const int n_padded = (n + kWarpSize - 1) / kWarpSize * kWarpSize;
  for (int i = threadIdx.x; i < n_padded; i += blockDim.x) {
    const float y = i < n ? xr[i] * scale * weight[i] : 0.0f;
    if (i < n) {
      if (out.f32) out.f32[row * n + i] = y;
      if (out.f16) out.f16[row * n + i] = __float2half_rn(y);
    }
    if (out.q8.qs) {
      const int64_t block = (row * n + i) / kQ8Block;
      quantize_block_of_warp(y, out.q8.qs + block * kQ8Block, out.q8.ds + block);
    }
  }
}

}  // namespace

cudaError_t launch_rms_norm(const float* x, const float* weight, int rows, int n, float eps,
                            RmsNormOutputs out, cudaStream_t stream, const int32_t* source_rows) {
  if (rows <= 0) return cudaSuccess;
  if (out.q8.qs && n % kQ8Block != 0) return cudaErrorInvalidValue;
  rms_norm_kernel<<<rows, kThreads, 0, stream>>>(x, weight, n, eps, out, source_rows);
  return launch_status();
}

}  // namespace granule::kernels
