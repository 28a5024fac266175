// Batch-1 decode of a small model at short context: the Q/K/V product (with RoPE and the K/V
// write) and attention in one kernel, one block per KV head, instead of the Q/K/V product and
// the split attention kernel (two launches, a grid-wide dependency between them). Attention of
// KV head h needs only that head's (group + 2) x head_dim rows of Q/K/V, so a block can compute
// them and attend without waiting for any other block. Before its PDL wait the block copies its
// weight rows and the K/V of the tokens earlier steps wrote into shared memory; after it, one
// round trip brings the int8 activations and the rest runs from shared memory.
//
// Not wired into the engine yet (experimental; kernels/PERF_NOTES.md, session 11): its test
// compares it with the two kernels it would replace.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "activation_q8.cuh"
#include "kernel_config.h"
#include "matvec.cuh"

namespace granule::kernels {

struct QkvAttentionArgs {
  // Split-layout rows of one type (Q4_0 or Q4_1), row_bytes apart (a multiple of 16): Q has
  // n_head * head_dim rows, K and V n_kv * head_dim; biases optional (Qwen2).
  const void* wq = nullptr;
  const void* wk = nullptr;
  const void* wv = nullptr;
  int64_t row_bytes = 0;
  const float* bq = nullptr;
  const float* bk = nullptr;
  const float* bv = nullptr;
  // The one row's int8 activations, with the handed-over norm where norm_sum_squares is set;
  // in.batch must be 1.
  MatvecInput in;
  // RoPE on adjacent pairs (not NeoX) at rope.positions[0]; the new token's K and V go to
  // rope.slot_base[rope.slots[0]] (no write where the slot is < 0) at that position.
  RowRope rope;
  const int32_t* lengths = nullptr;  // [1]: tokens [0, length) attended, the last one new
  float scale = 1.0f;                // 1 / sqrt(head_dim)
  int n_head = 0, n_kv = 0, head_dim = 0;
  float* out = nullptr;  // [n_head * head_dim], as launch_attention writes it
  ActivationQ8 out_q8;   // optional: the output as int8 blocks, as launch_attention writes them
};

// The longest row (tokens) launch_qkv_attention takes for these shapes on this device, or 0
// where it cannot run them (type other than Q4_0/Q4_1, head_dim other than 64, a group of more
// than 4, rows wider than 1,024, or weight rows that leave shared memory too little room). Its
// first call for a type and group also lets that kernel use all of a block's shared memory:
// make it before capturing a launch into a graph.
int qkv_attention_max_tokens(uint32_t weight_type, int n_in, int64_t row_bytes, int n_head,
                             int n_kv, int head_dim);

// Launches the fused kernel (one block per KV head, launch_early); cudaErrorInvalidValue where
// qkv_attention_max_tokens() is 0 or below max_tokens. Rows longer than max_tokens must not be
// passed (the K/V staging is sized for max_tokens).
cudaError_t launch_qkv_attention(uint32_t weight_type, const QkvAttentionArgs& args, int max_tokens,
                                 const KernelConfig& config, cudaStream_t stream);

}  // namespace granule::kernels
