// Inputs the GPU kernel tests share: random weights quantised to a type, in GGUF blocks and in
// the split layout the kernels read (encode), and the attention kernels' arguments over KV in
// the engine's layout with the split kernel's workspace (attention_args, SplitAttention).
#pragma once
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "attention.cuh"
#include "gpu_test_support.h"
#include "granule/quant.h"
#include "granule/tensor_type.h"
#include "granule/testkit/quantize.h"
#include "model/weight_split.h"

namespace granule::gpu_test {

// rows x cols random weights (|x| up to ~0.5) quantised to `type`, with what the kernels must
// see after decoding them.
struct Encoded {
  std::vector<uint8_t> bytes;
  std::vector<float> decoded;  // what the kernel must see
  int64_t row_bytes = 0;
  std::vector<uint8_t> device_bytes;  // bytes (or, split, the split rows) + 16 bytes of slack
  int64_t device_row_bytes = 0;
};

inline Encoded encode(TensorType type, int64_t rows, int64_t cols, std::mt19937& rng,
                      bool split = false) {
  Encoded e;
  e.row_bytes = static_cast<int64_t>(row_bytes(type, cols));
  // 16 bytes of slack: the kernels copy rows in 16-byte vectors (the model keeps the same).
  e.bytes.resize(static_cast<size_t>(rows * e.row_bytes) + 16);
  e.decoded.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float> values = gpu_test::random_floats(static_cast<size_t>(cols), rng, 0.5f);
    quantize_row(type, values.data(), e.bytes.data() + r * e.row_bytes, cols);
    dequantize_row(type, e.bytes.data() + r * e.row_bytes, e.decoded.data() + r * cols, cols);
  }
  if (split) {
    e.device_row_bytes = split_row_stride(static_cast<uint32_t>(type), cols);
    e.device_bytes.assign(static_cast<size_t>(rows * e.device_row_bytes) + 16, 0xEE);
    split_rows(static_cast<uint32_t>(type), e.bytes.data(), rows, cols, e.device_bytes.data());
  } else {
    e.device_row_bytes = e.row_bytes;
    e.device_bytes = e.bytes;
  }
  return e;
}

// An f16 NaN: KV outside what a kernel may touch is poisoned with it.
constexpr uint16_t kPoisonHalf = 0xFFFF;

// The engine's KV layout: per slot, max_tokens tokens of all layers' K then V (n_kv heads of
// head_dim halves each); at() is the first half of one head.
struct KvLayout {
  int n_layer, n_kv, head_dim, max_tokens, slots;
  int64_t token_stride() const { return static_cast<int64_t>(n_layer) * 2 * n_kv * head_dim; }
  int64_t slot_halves() const { return token_stride() * max_tokens; }
  int64_t at(int slot, int token, int layer, int kv, int head) const {
    return slot * slot_halves() + token * token_stride() +
           (static_cast<int64_t>(layer) * 2 + kv) * n_kv * head_dim + head * head_dim;
  }
};

// The attention kernels' arguments for `rows` rows of q ([rows][n_head * head_dim]) into out
// (the same layout) over KV in the engine's layout (token_stride halves per token, `layer` of
// them), scaled by 1/sqrt(head_dim). The split size, workspace and extra outputs are left to
// the caller (SplitAttention).
inline kernels::AttentionArgs attention_args(const float* q, float* out, int rows, int n_head,
                                             int n_kv, int head_dim, const int32_t* lengths,
                                             const int32_t* slots, __half* const* slot_base,
                                             int64_t token_stride, int layer) {
  kernels::AttentionArgs a;
  a.q = q;
  a.q_stride = static_cast<int64_t>(n_head) * head_dim;
  a.out = out;
  a.out_stride = a.q_stride;
  a.rows = rows;
  a.n_head = n_head;
  a.n_kv = n_kv;
  a.head_dim = head_dim;
  a.lengths = lengths;
  a.slots = slots;
  a.slot_base = slot_base;
  a.token_stride = token_stride;
  a.layer = layer;
  a.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  return a;
}

// `base` at `split_tokens` per split for rows of up to `capacity` tokens, with the split
// kernel's workspace: the partials and the (row, KV head) counters, which start at zero.
struct SplitAttention {
  kernels::AttentionArgs args;
  DeviceArray<float> partial;
  DeviceArray<int> counters;
  SplitAttention(const kernels::AttentionArgs& base, int split_tokens, int capacity)
      : args(with_splits(base, split_tokens, capacity)),
        partial(kernels::attention_workspace_floats(base.rows, base.n_head, args.max_splits,
                                                    base.head_dim)),
        counters(std::vector<int>(static_cast<size_t>(base.rows * base.n_kv), 0)) {
    args.partial = partial.get();
    args.split_counters = counters.get();
  }

 private:
  static kernels::AttentionArgs with_splits(kernels::AttentionArgs a, int split_tokens,
                                            int capacity) {
    a.split_tokens = split_tokens;
    a.max_splits = (capacity + split_tokens - 1) / split_tokens;
    return a;
  }
};

}  // namespace granule::gpu_test
