// Elementwise SwiGLU, grid-stride.
#include "common.cuh"
#include "swiglu.cuh"

namespace granule::kernels {
namespace {

__global__ void swiglu_to_f16_kernel(const float* __restrict__ gate, const float* __restrict__ up,
                                     int64_t count, __half* __restrict__ out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __float2half_rn(silu(gate[i]) * up[i]);
}

__global__ void swiglu_f32_kernel(const float* __restrict__ gate, const float* __restrict__ up,
                                  int64_t count, float* __restrict__ out) {
  wait_for_previous_kernel();
  allow_next_kernel();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = silu(gate[i]) * up[i];
}

constexpr int kThreads = 256;

int grid_for(int64_t count) {
  return static_cast<int>(std::min<int64_t>(ceil_div(count, kThreads), 65536));
}

}  // namespace

cudaError_t launch_swiglu_to_f16(const float* gate, const float* up, int64_t count, __half* out,
                                 cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  swiglu_to_f16_kernel<<<grid_for(count), kThreads, 0, stream>>>(gate, up, count, out);
  return launch_status();
}

cudaError_t launch_swiglu_f32(const float* gate, const float* up, int64_t count, float* out,
                              const KernelConfig& config, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  return launch_status(launch_early(swiglu_f32_kernel, dim3(grid_for(count)), dim3(kThreads),
                                    config, stream, gate, up, count, out));
}

}  // namespace granule::kernels
