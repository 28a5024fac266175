// The CPU reference operators of the llama family, as plain functions over pointers and
// sizes: the CPU backend composes them, and the CUDA kernel tests compare against them.
// Everything accumulates in f32.
#pragma once
#include <cstdint>
#include <vector>

#include "granule/model_config.h"
#include "granule/tensor_type.h"

namespace granule::cpu {

class ThreadPool;

// Dot product of two f32 vectors, in one fixed summation order (row_kernels.h), so a
// result never depends on how a batch was split or on the CPU's vector extensions.
float dot_f32(const float* a, const float* b, int64_t n);

// out[i] = x[i] / sqrt(mean(x²) + eps) * weight[i]. out may alias x.
void rms_norm(const float* x, const float* weight, float* out, int64_t n, float eps);

// Rotates n_heads vectors of head_dim (laid out one after another) in place at `position`.
// Normal: pairs (x[2i], x[2i+1]) (ggml mode 0, llama); NeoX: pairs (x[i], x[i + head_dim/2]).
// magnitude multiplies cos and sin (YaRN's rope_magnitude(); 1 otherwise).
void rope(float* x, int64_t n_heads, int64_t head_dim, int64_t position, const double* frequencies,
          RopeOrdering ordering, float magnitude = 1.0f);
// rope() in two parts, for a caller that rotates several vectors at one position: the
// angles' cosines and sines (times magnitude) for i < half, then the rotation with them.
void rope_angles(int64_t position, const double* frequencies, int64_t half, float magnitude,
                 float* cosines, float* sines);
void rope_rotate(float* x, int64_t n_heads, int64_t head_dim, const float* cosines,
                 const float* sines, RopeOrdering ordering);

// Rows [row_begin, row_end) of matmul() below, on the calling thread: the piece a caller
// running several matmuls in one parallel loop hands each thread.
void matmul_rows(TensorType type, const void* w, int64_t row_begin, int64_t row_end, int64_t n_rows,
                 int64_t n_cols, const float* x, int64_t n_tokens, float* y,
                 bool f16_weights = false);

// Y = X · Wᵀ for a weight matrix of n_rows rows of n_cols encoded elements (row r at
// w + r * row_bytes(type, n_cols)) and n_tokens input vectors x[t * n_cols ...]:
// y[t * n_rows + r] = dot(row r, x_t). Each row is decoded once (dequantize_row) and dotted
// with every token (dot_f32); threads split the rows. pool may be null (one thread).
// f16_weights: each decoded weight is rounded to f16 first (the CUDA prefill path's
// dequantise-to-f16 before cuBLAS; the CPU oracle only).
void matmul(TensorType type, const void* w, int64_t n_rows, int64_t n_cols, const float* x,
            int64_t n_tokens, float* y, ThreadPool* pool, bool f16_weights = false);

// One head of causal attention for one query: softmax(q·Kᵀ / sqrt(head_dim)) · V over
// tokens [0, length). K of token t is at k + t * token_stride (floats), V likewise.
// scores must hold `length` floats. out gets head_dim floats.
// sink (gpt-oss), when not null: one more logit, unscaled, in the softmax's normaliser only —
// it takes probability mass and contributes no value (ggml_soft_max_ext's sinks).
// A sliding window is the caller's: k and v start at the window's first token.
// scale > 0 replaces 1 / sqrt(head_dim) (Gemma's query_pre_attn_scalar).
// approximate_exp (the CPU backend's fast path): the softmax's exponentials vectorised
// (row_kernels.h exp_shifted_sum), a little off std::exp.
void attention_head(const float* q, const float* k, const float* v, int64_t token_stride,
                    int64_t length, int64_t head_dim, float* scores, float* out,
                    const float* sink = nullptr, float scale = 0.0f, bool approximate_exp = false);

// out[i] = silu(gate[i]) * up[i]. out may alias gate.
void swiglu(const float* gate, const float* up, float* out, int64_t n);

// gpt-oss's clamped SwiGLU (llama.cpp's swiglu_oai, alpha 1.702, limit 7):
// g = min(gate, limit), u = clamp(up, -limit, limit), out = g * sigmoid(alpha g) * (u + 1).
// out may alias gate.
void swiglu_clamped(const float* gate, const float* up, float* out, int64_t n, float alpha = 1.702f,
                    float limit = 7.0f);

// The indices of the k largest of values[0, n), largest first; equal values in ascending index
// order (the lower index wins a tie). NaN never wins over a number. k <= n.
void top_k(const float* values, int64_t n, int64_t k, int32_t* indices);

// In place over n values: exp(x - max) / sum (llama.cpp's soft_max: f32 exponentials, a
// double sum, scaled by its f32 inverse).
void softmax(float* x, int64_t n);

// Decodes row `token` of an embedding table of n_embd-wide rows into out.
void embedding_row(TensorType type, const void* table, int64_t n_embd, int64_t token, float* out);

// x[i] += y[i].
void add_in_place(float* x, const float* y, int64_t n);

// --- Rounding as the CUDA backend rounds (the CPU oracle of BackendOptions::
// cpu_emulate_device_numerics). Each replaces values by what the GPU's kernels compute with.

// f32 to the nearest f16 (ties to even; overflow to infinity, subnormals kept), back to f32:
// __float2half_rn.
float round_to_f16(float x);
void round_through_f16(float* x, int64_t n);

// How a kernel turns an activation into its int8 value q, with d = amax / 127 in f32 over
// the 32-element block (amax = max |x|; q = 0 for a block of zeros) and rounding to nearest,
// ties to even (__float2int_rn):
//   MultiplyByInverse  q = rint(x * (1 / d))   the RMSNorm kernel's int8 output (rms_norm.cu)
//   Divide             q = rint(x / d)         quantize_block_of_warp (activation_q8.cuh):
//                                              the attention output and quantize_q8 (SwiGLU)
enum class Q8Rounding { MultiplyByInverse, Divide };
// Replaces each 32-element block of x (n a multiple of 32) by q * d, the value the int8
// matvec kernels multiply with: dot(dequant(w), round_through_q8(a)) is their
// d_w·d_a·Σ q_w·q_a (+ m_w·d_a·Σ q_a with a block minimum) up to f32 summation order.
void round_through_q8(float* x, int64_t n, Q8Rounding rounding);

}  // namespace granule::cpu
