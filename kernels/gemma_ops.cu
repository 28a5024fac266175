// Gemma's elementwise operators, grid-stride (gemma_ops.cuh).
#include "common.cuh"
#include "gemma_ops.cuh"

namespace granule::kernels {
namespace {

// ggml's GGML_GELU_FP16 table entry for x: gelu of x rounded to f16, rounded to f16; the tails
// as ggml's CPU takes them (backends/cpu/gemma_ops.cpp is the reference).
__device__ __forceinline__ float geglu_one(float g, float up) {
  if (g >= 10.0f) return g * up;
  if (g <= -10.0f) return 0.0f * up;
  constexpr float kCoefA = 0.044715f;
  constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
  const float h = __half2float(__float2half_rn(g));
  const float inner =
      __fmul_rn(__fmul_rn(kSqrt2OverPi, h), __fadd_rn(1.0f, __fmul_rn(__fmul_rn(kCoefA, h), h)));
  const float gelu = __fmul_rn(__fmul_rn(0.5f, h), __fadd_rn(1.0f, tanhf(inner)));
  return __half2float(__float2half_rn(gelu)) * up;
}

__global__ void geglu_f32_kernel(const float* gate, const float* __restrict__ up, int64_t count,
                                 float* out) {
  wait_for_previous_kernel();
  allow_next_kernel();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = geglu_one(gate[i], up[i]);
}

__global__ void geglu_to_f16_kernel(const float* __restrict__ gate, const float* __restrict__ up,
                                    int64_t count, __half* __restrict__ out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __float2half_rn(geglu_one(gate[i], up[i]));
}

__global__ void scale_kernel(float* x, int64_t count, float factor) {
  wait_for_previous_kernel();
  allow_next_kernel();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = __fmul_rn(x[i], factor);
}

__global__ void soft_cap_kernel(float* x, int64_t count, float cap, float inverse) {
  wait_for_previous_kernel();
  allow_next_kernel();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = __fmul_rn(tanhf(__fmul_rn(x[i], inverse)), cap);
}

constexpr int kThreads = 256;

int grid_for(int64_t count) {
  return static_cast<int>(std::min<int64_t>(ceil_div(count, kThreads), 65536));
}

}  // namespace

cudaError_t launch_geglu_f32(const float* gate, const float* up, int64_t count, float* out,
                             const KernelConfig& config, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  return launch_status(launch_early(geglu_f32_kernel, dim3(grid_for(count)), dim3(kThreads), config,
                                    stream, gate, up, count, out));
}

cudaError_t launch_geglu_to_f16(const float* gate, const float* up, int64_t count, __half* out,
                                cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  geglu_to_f16_kernel<<<grid_for(count), kThreads, 0, stream>>>(gate, up, count, out);
  return launch_status();
}

cudaError_t launch_scale(float* x, int64_t count, float factor, const KernelConfig& config,
                         cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  return launch_status(launch_early(scale_kernel, dim3(grid_for(count)), dim3(kThreads), config,
                                    stream, x, count, factor));
}

cudaError_t launch_soft_cap(float* x, int64_t count, float cap, const KernelConfig& config,
                            cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (!(cap > 0.0f)) return cudaErrorInvalidValue;
  return launch_status(launch_early(soft_cap_kernel, dim3(grid_for(count)), dim3(kThreads), config,
                                    stream, x, count, cap, 1.0f / cap));
}

}  // namespace granule::kernels
