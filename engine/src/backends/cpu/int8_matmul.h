// The CPU backend's fast matmul: the activation is quantised once per matmul to int8 blocks of
// 32 (as llama.cpp's q8 activations), and each weight block is multiplied in integers (AVX2
// maddubs) with its own scales, so a weight is never decoded to f32. Results differ from the
// exact f32 path (ops.h matmul) by the activation's int8 rounding only: every weight value is
// the one dequantize_row gives, and fast = Σ w·(q·d) up to f32 summation order.
// Types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS,
// on AVX2 (picked at run time), each on a copy repacked at load (Int8Weights, int8_packed.h);
// everything else keeps the exact path.
#pragma once
#include <cstdint>

#include "granule/tensor_type.h"

namespace granule::cpu {

// 32 activations as q·d: d = max|x| / 127, q = x / d rounded to nearest (ties to even; q = 0
// for a block of zeros), sum = d·Σq (what a weight block's minimum multiplies), qsum = Σq
// (what an offset weight, Q4_0's q - 8, subtracts in integers) and half_sum the Σq of
// elements 0..15 and 16..31 (the same for the 16-element sub-blocks of Q2_K and Q3_K).
struct ActivationBlock {
  float d;
  float sum;
  int32_t qsum;
  int16_t half_sum[2];
  int8_t qs[32];
};
static_assert(sizeof(ActivationBlock) == 48);

// Whether the int8 kernels (Int8Weights) run a matrix of `type` with rows of n_cols here.
bool int8_matmul_supports(TensorType type, int64_t n_cols);

// Quantises n values of x (n a multiple of 32) into n / 32 blocks: q = rint(x · (1/d)), d =
// amax / 127 (ops.h Q8Rounding::MultiplyByInverse, the RMSNorm kernel's), or with `divide`
// q = rint(x / d) (Q8Rounding::Divide: the CUDA attention output's and quantize_q8's), so the
// host's part of a device product can read the device's int8 values. Portable code where the
// CPU has no AVX2 (the same rounding).
void quantize_activations(const float* x, int64_t n, ActivationBlock* out, bool divide = false);

}  // namespace granule::cpu
