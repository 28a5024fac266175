// Causal grouped-query attention over each sequence's flat token-major f16 KV, reading only
// tokens [0, length) of each row, or on a sliding-window layer only the window
// [max(0, length - window), length) (flash-decoding: the tokens are split over blocks, then the
// partial softmaxes are merged by the last block to finish). A row is one query: a decoding
// sequence, or one prompt token of a prefill (its length is its position + 1), so one kernel serves
// both. gpt-oss's attention sinks: a per-head logit that joins the softmax's normaliser and
// carries no value.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "activation_q8.cuh"

namespace granule::kernels {

struct AttentionArgs {
  const float* q = nullptr;
  int64_t q_stride = 0;  // [rows][n_head * head_dim], already rotated
  float* out = nullptr;
  int64_t out_stride = 0;  // [rows][n_head * head_dim]
  int rows = 0, n_head = 0, n_kv = 0, head_dim = 0;
  const int32_t* lengths = nullptr;  // [rows] visible tokens [0, length); 0: padding, no output
  const int32_t* slots = nullptr;    // [rows] index into slot_base
  __half* const* slot_base = nullptr;
  int64_t token_stride = 0;  // halves per token over the layers of this layer's KV part
  // Halves from the slot's base to the layer's KV part (KV by layer kind: the sliding-window
  // layers keep their own part of the slot); `layer` counts within the part.
  int64_t kv_offset = 0;
  int layer = 0;
  float scale = 1.0f;             // 1 / sqrt(head_dim)
  const float* sinks = nullptr;   // optional [n_head]: head h's softmax normaliser gains
                                  // exp(sinks[h]) (a logit on the scaled scores' scale)
  int window = 0;                 // > 0: a row reads only tokens [length - window, length) (the
                                  // start computed on the device from its length: graphs
                                  // replay); KV behind the window is never touched
  int split_tokens = 128;         // fewest tokens per split (the kernel takes more per split
                                  // when the grid has few rows; attention.cu)
  int max_splits = 1;             // ceil(longest possible length / split_tokens); on a
                                  // sliding layer the window is the longest
  float* partial = nullptr;       // attention_workspace_floats(rows, n_head, max_splits,
                                  // head_dim) floats
  int* split_counters = nullptr;  // rows * n_kv ints, zero before the first launch;
                                  // each launch leaves them zero again
  ActivationQ8 out_q8;            // optional: the output also as int8 blocks (rows of
                                  // out_stride elements), for the next matvec
  __half* out_f16 = nullptr;      // optional: the output also as f16 (rows of out_stride), for
                                  // the f16 tensor-core products (matvec_f16mma.cu)
};

size_t attention_workspace_floats(int rows, int n_head, int max_splits, int head_dim);

// head_dim 64, 128 or 256; n_head / n_kv at most 8.
cudaError_t launch_attention(const AttentionArgs& args, const KernelConfig& config,
                             cudaStream_t stream);

}  // namespace granule::kernels
