// RMSNorm: one block per row, each thread holding up to four float4s of it in registers
// (one load, no dependent re-reads); the normalised values leave in every format asked
// for, int8 blocks quantised by groups of 8 threads (32 elements).
#include "rms_norm.cuh"

namespace granule::kernels {
namespace {

constexpr int kMaxVectorsPerThread = 4;
constexpr int kMaxThreads = 1024;

__global__ void __launch_bounds__(kMaxThreads)
    rms_norm_kernel(const float* __restrict__ x, const float* __restrict__ weight, int n, float eps,
                    RmsNormOutputs out, const int32_t* __restrict__ source_rows) {
  __shared__ float scratch[32];
  wait_for_previous_kernel();
  allow_next_kernel();
  const int64_t row = blockIdx.x;
  const int64_t source = source_rows ? source_rows[row] : row;
  const int n4 = n / 4;
  const float4* xr = reinterpret_cast<const float4*>(x + source * n);
  const float4* w4 = reinterpret_cast<const float4*>(weight);
  float4 v[kMaxVectorsPerThread];
  float sum_sq = 0.0f;
#pragma unroll
  for (int k = 0; k < kMaxVectorsPerThread; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    v[k] = i < n4 ? xr[i] : make_float4(0, 0, 0, 0);
    sum_sq += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
  }
  const float scale = rsqrtf(block_sum(sum_sq, scratch) / n + eps);
#pragma unroll
  for (int k = 0; k < kMaxVectorsPerThread; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (k * blockDim.x >= n4) break;  // uniform over the block
    const bool valid = i < n4;
    float4 y = make_float4(0, 0, 0, 0);
    if (valid) {
      const float4 wv = w4[i];
      y = make_float4(v[k].x * scale * wv.x, v[k].y * scale * wv.y, v[k].z * scale * wv.z,
                      v[k].w * scale * wv.w);
      if (out.f32) reinterpret_cast<float4*>(out.f32 + row * n)[i] = y;
      if (out.residual) {
        float4& r = reinterpret_cast<float4*>(out.residual + row * n)[i];
        r = make_float4(r.x + y.x, r.y + y.y, r.z + y.z, r.w + y.w);
      }
      if (out.f16) {
        const __half2 lo = __floats2half2_rn(y.x, y.y), hi = __floats2half2_rn(y.z, y.w);
        uint2 packed;
        packed.x = *reinterpret_cast<const uint32_t*>(&lo);
        packed.y = *reinterpret_cast<const uint32_t*>(&hi);
        reinterpret_cast<uint2*>(out.f16 + row * n)[i] = packed;
      }
    }
    if (out.q8.qs) {
      // 8 consecutive threads hold one 32-element block: all valid or all past the end.
      float amax = fmaxf(fmaxf(fabsf(y.x), fabsf(y.y)), fmaxf(fabsf(y.z), fabsf(y.w)));
#pragma unroll
      for (int off = 1; off < 8; off <<= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
      const float d = amax / 127.0f;
      const float inv = amax == 0.0f ? 0.0f : 1.0f / d;
      const int q0 = __float2int_rn(y.x * inv), q1 = __float2int_rn(y.y * inv),
                q2 = __float2int_rn(y.z * inv), q3 = __float2int_rn(y.w * inv);
      int sum = q0 + q1 + q2 + q3;
#pragma unroll
      for (int off = 1; off < 8; off <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      if (valid) {
        const int64_t at = row * n + 4 * static_cast<int64_t>(i);
        const uint32_t packed =
            (static_cast<uint32_t>(q0) & 0xFF) | ((static_cast<uint32_t>(q1) & 0xFF) << 8) |
            ((static_cast<uint32_t>(q2) & 0xFF) << 16) | (static_cast<uint32_t>(q3) << 24);
        *reinterpret_cast<uint32_t*>(out.q8.qs + at) = packed;
        if (threadIdx.x % 8 == 0)
          out.q8.ds[at / kQ8Block] = make_float2(d, d * static_cast<float>(sum));
      }
    }
  }
}

}  // namespace

cudaError_t launch_rms_norm(const float* x, const float* weight, int rows, int n, float eps,
                            RmsNormOutputs out, const KernelConfig& config, cudaStream_t stream,
                            const int32_t* source_rows) {
  if (rows <= 0) return cudaSuccess;
  const int n4 = n / 4;
  if (n % 4 != 0 || (out.q8.qs && n % kQ8Block != 0)) return cudaErrorInvalidValue;
  const int threads =
      std::min(kMaxThreads, std::max(kWarpSize, (n4 + kWarpSize - 1) / kWarpSize * kWarpSize));
  if (n4 > threads * kMaxVectorsPerThread) return cudaErrorInvalidValue;
  return launch_status(launch_early(rms_norm_kernel, dim3(rows), dim3(threads), config, stream, x,
                                    weight, n, eps, out, source_rows));
}

}  // namespace granule::kernels
