// Gemma's elementwise operators on the GPU (the CPU's backends/cpu/gemma_ops.h beside them):
// GeGLU with gelu's tanh form as ggml's CPU rounds it, the embedding scale and the final logit
// soft-cap.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernel_config.h"

namespace granule::kernels {

// out[i] = gelu(gate[i]) * up[i], gelu as ggml's CPU takes it (its f16 table: the input rounded
// to f16, the result rounded to f16; x <= -10 gives 0, x >= 10 gives x). out may alias gate.
cudaError_t launch_geglu_f32(const float* gate, const float* up, int64_t count, float* out,
                             const KernelConfig& config, cudaStream_t stream);
// The same written as f16 for the down projection's GEMM (prefill).
cudaError_t launch_geglu_to_f16(const float* gate, const float* up, int64_t count, __half* out,
                                cudaStream_t stream);
// x[i] *= factor (Gemma's embeddings times sqrt(n_embd)).
cudaError_t launch_scale(float* x, int64_t count, float factor, const KernelConfig& config,
                         cudaStream_t stream);
// x[i] = cap * tanh(x[i] / cap), in ggml's order (times 1/cap, tanh, times cap).
cudaError_t launch_soft_cap(float* x, int64_t count, float cap, const KernelConfig& config,
                            cudaStream_t stream);

}  // namespace granule::kernels
