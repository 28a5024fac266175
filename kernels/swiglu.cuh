// SwiGLU for prefill, where gate and up come from separate GEMMs: out = silu(gate) * up,
// written as f16 for the down projection's GEMM (or f32). (Decode fuses this into the matvec.)
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernel_config.h"

namespace granule::kernels {

cudaError_t launch_swiglu_to_f16(const float* gate, const float* up, int64_t count, __half* out,
                                 cudaStream_t stream);
// The same with an f32 result (decode, when gate and up have different block types).
cudaError_t launch_swiglu_f32(const float* gate, const float* up, int64_t count, float* out,
                              const KernelConfig& config, cudaStream_t stream);

}  // namespace granule::kernels
