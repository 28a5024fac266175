// Gemma's elementwise operators on the GPU (the CPU's backends/cpu/gemma_ops.h beside them):
// GeGLU with gelu's tanh form as ggml's CPU rounds it, the embedding scale and the final logit
// soft-cap; and Gemma 4's attention inputs (Q/K/V norms, partial rope, the KV write) and
// per-layer embedding inputs (the CPU's Gemma 4 block in cpu_backend.cpp is the reference).
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attention.cuh"  // AttentionArgs
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
// x[i] = 0: Gemma 4's experts' sum before a layer's experts add into it, as a kernel of the
// layer's early-launch chain (it waits for the kernel before it like every other), not a memset
// node between two early-launched kernels of a captured decode graph.
cudaError_t launch_zero(float* x, int64_t count, const KernelConfig& config, cudaStream_t stream);
// x[i] = cap * tanh(x[i] / cap), in ggml's order (times 1/cap, tanh, times cap).
cudaError_t launch_soft_cap(float* x, int64_t count, float cap, const KernelConfig& config,
                            cudaStream_t stream);

// Gemma 4's attention inputs of one layer: per head Q RMS-normed with q_norm, and on a layer that
// keeps its own KV (write_kv) K with k_norm and V without a weight (v may be k: V = K when the
// layer has no attn_v); Q and K rotated over their first rope_dims (NeoX pairs
// (i, i + rope_dims / 2) at frequencies[i]), Q in place, K and V written as f16 into the KV
// as rope_kv does. A padding row (slot < 0) writes no KV.
struct Gemma4QkvArgs {
  int rows = 0;
  const int32_t* positions = nullptr;
  const int32_t* slots = nullptr;
  float* q = nullptr;        // [rows][n_head * head_dim]
  const float* k = nullptr;  // [rows][n_kv * head_dim]
  const float* v = nullptr;  // [rows][n_kv * head_dim]
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  float eps = 1e-6f;
  const double* frequencies = nullptr;  // rope_dims / 2
  int rope_dims = 0;
  int n_head = 0, n_kv = 0, head_dim = 0;
  bool write_kv = false;
  __half* const* slot_base = nullptr;
  int64_t token_stride = 0;  // halves per token of the layer's KV part
  int64_t kv_offset = 0;     // halves from a slot's base to the layer's K
};
// head_dim a multiple of 32, at most 512.
cudaError_t launch_gemma4_qkv(const Gemma4QkvArgs& args, const KernelConfig& config,
                              cudaStream_t stream);

// Gemma 4's per-layer embedding inputs, per row and layer l (n_pl values each, in place in
// `projected` [rows][n_layer][n_pl]): RMSNorm(projected · projection_scale) · norm, plus the
// token's row of the per-layer table (`table` [rows][n_layer][n_pl]) times table_scale, the sum
// times input_scale.
cudaError_t launch_gemma4_ple_inputs(float* projected, const float* table, const float* norm,
                                     int rows, int n_layer, int n_pl, float eps,
                                     float projection_scale, float table_scale, float input_scale,
                                     const KernelConfig& config, cudaStream_t stream);

// Attention for heads wider than attention.cuh's kernels take (Gemma 4's global layers: 512):
// one block per (row, query head), its 8 warps taking every 8th token of the row's range (the
// window's on a sliding layer) with an online softmax, merged in shared memory. Reads args as
// launch_attention does; ignores the split fields, out_q8 (the caller quantises) and
// out_f16 is written when set. head_dim 512 only.
cudaError_t launch_attention_wide(const AttentionArgs& args, const KernelConfig& config,
                                  cudaStream_t stream);

// Gemma 4's per-layer token table (n_vocab rows of n_layer * n_pl values) as n_vocab * n_layer
// rows of one layer's n_pl: out[r][l] = tokens[r] * n_layer + l, or -1 where the token is outside
// [0, n_vocab) (the embedding gather writes zeros for it). Gathering those rows puts every
// layer's slice of a pass's tokens in flight at once: the table sits in pinned host memory the
// device maps, where each read waits on PCIe. n_vocab * n_layer below 2^31.
cudaError_t launch_gemma4_table_rows(const int32_t* tokens, int rows, int n_layer, int64_t n_vocab,
                                     int32_t* out, const KernelConfig& config, cudaStream_t stream);

// out[r][i] = gelu(gate[r][i]) * inputs[r * input_stride + i] for i < n (gelu as GeGLU's);
// out may alias gate.
cudaError_t launch_gelu_times(const float* gate, const float* inputs, int64_t input_stride,
                              int rows, int n, float* out, const KernelConfig& config,
                              cudaStream_t stream);

}  // namespace granule::kernels
