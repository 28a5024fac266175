// The matmul's inner loops: decode one encoded row to f32 and dot two f32 vectors. AVX2
// versions are picked at run time; they give the same bits as the portable ones (and the
// decoders the same bits as quant.h's dequantize_row), so results never depend on the CPU.
#pragma once
#include <cstdint>

#include "granule/tensor_type.h"

namespace granule::cpu {

// True when this CPU runs the AVX2 kernels (AVX2, FMA and F16C; and they are compiled in).
bool row_kernels_use_avx2();

// Same as dequantize_row; Q4_0, Q4_1, Q8_0, F16 and BF16 have vector fast paths.
void decode_row(TensorType type, const void* row, float* out, int64_t n);

// Σ a[i]·b[i] in 32 interleaved f32 partial sums (lane j takes i ≡ j mod 32, each step a
// fused multiply-add), combined by halving (lanes j and j+16, then j+8, ...), plus the tail
// summed in order: the one order both implementations follow.
float dot_f32_portable(const float* a, const float* b, int64_t n);
float dot_f32_fast(const float* a, const float* b, int64_t n);  // AVX2 when available

// out[i] = out[i] + p * v[i] (a product, then a sum: no fused multiply-add), AVX2 when
// available; the same bits either way.
void add_scaled(float* out, const float* v, float p, int64_t n);

// The fast path's approximations (never the exact path's: they differ from std::exp by an
// ulp or two): x[i] = exp(x[i] - shift) for every i, returning their sum (any order).
float exp_shifted_sum(float* x, int64_t n, float shift);
// out[i] = silu(gate[i]) * up[i] with the same exponential. out may alias gate.
void swiglu_approx(const float* gate, const float* up, float* out, int64_t n);

// ops.h attention_head with approximate_exp, for head_dim 64 or 128 on AVX2 (the query and
// the output held in registers, four keys a step); false, leaving out alone, otherwise.
bool attention_head_avx2(const float* q, const float* k, const float* v, int64_t token_stride,
                         int64_t length, int64_t head_dim, float* scores, float* out,
                         const float* sink, float scale);

// One query of attention_many_avx2: its keys are [0, length) of the shared K and V.
struct AttentionQuery {
  const float* q;
  float* out;
  int64_t length;
  const float* sink;  // nullable
};
// attention_head_avx2 for every query (each out the same bits as attention_head_avx2 gives it
// alone), the queries sharing one KV head: keys in blocks of 64 that every query passes over
// while they are in L1, instead of each query streaming the whole KV (a prefill's tokens, a
// GQA group's heads). False, leaving the outputs alone, where attention_head_avx2 would be.
bool attention_many_avx2(const AttentionQuery* queries, int64_t n, const float* k, const float* v,
                         int64_t token_stride, int64_t head_dim, float scale);

// dot_f32_fast(decode_row(row), x) without the decoded row in memory, for Q4_0, Q4_1 and
// Q8_0 on AVX2 (same bits); returns false, leaving result alone, for everything else.
bool dot_row_fused(TensorType type, const void* row, const float* x, int64_t n, float* result);

}  // namespace granule::cpu
