// RMSNorm over rows: y = x / sqrt(mean(x²) + eps) * weight, written as f32, f16 and/or int8
// blocks (any output may be null) so the next matrix product reads it directly.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "activation_q8.cuh"

namespace granule::kernels {

struct RmsNormOutputs {
  float* f32 = nullptr;   // [rows][n]
  __half* f16 = nullptr;  // [rows][n]
  ActivationQ8 q8;        // needs n % 32 == 0
  // Gemma's sandwich norms: residual[row][i] += y (the normed block output joins the residual
  // stream); [rows][n].
  float* residual = nullptr;
};

// Output row r normalises input row source_rows[r] (or r when source_rows is null), so the
// output head can normalise only the rows whose logits are wanted. n must be a multiple of
// 4 (of 32 for int8 output) and at most 16384.
cudaError_t launch_rms_norm(const float* x, const float* weight, int rows, int n, float eps,
                            RmsNormOutputs out, const KernelConfig& config, cudaStream_t stream,
                            const int32_t* source_rows = nullptr);

}  // namespace granule::kernels
