// Converts f32 activations for the next matrix product: to int8 blocks (decode's
// quantised matrix-vector kernels) or to f16 (prefill's cuBLAS GEMMs).
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "activation_q8.cuh"

namespace granule::kernels {

// x: [rows][n] with n % 32 == 0.
cudaError_t launch_quantize_q8(const float* x, int rows, int n, ActivationQ8 out,
                               const KernelConfig& config, cudaStream_t stream);
// count elements, f32 -> f16 (round to nearest).
cudaError_t launch_convert_f32_to_f16(const float* x, int64_t count, __half* out,
                                      cudaStream_t stream);

}  // namespace granule::kernels
