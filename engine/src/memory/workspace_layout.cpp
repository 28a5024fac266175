// cuda_workspace: the CUDA backend's workspace buffers and their bytes, one list.
#include "memory/workspace_layout.h"

#include <algorithm>

#include "memory/weight_layout.h"

namespace granule {
namespace {

uint64_t align_up(uint64_t bytes) { return WeightLayout::align_up(bytes); }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// kernels::attention_workspace_floats: (max, sum, head_dim values) per row, head and split.
uint64_t attention_floats(int64_t rows, int64_t n_head, int64_t splits, int64_t head_dim) {
  return static_cast<uint64_t>(rows * n_head * splits * (head_dim + 2));
}

uint64_t sum(const std::vector<WorkspaceBuffer>& buffers) {
  uint64_t total = 0;
  for (const WorkspaceBuffer& b : buffers) total += b.bytes;
  return total;
}

}  // namespace

namespace workspace {

uint64_t token_mask_row_bytes(int64_t n_vocab) {
  const auto words = static_cast<uint64_t>(ceil_div(std::max<int64_t>(n_vocab, 1), 32));
  return 16 + (words * 4 + 15) / 16 * 16;
}

uint64_t token_mask_device_bytes(int64_t n_vocab) {
  return 16 + static_cast<uint64_t>(kTokenMaskRows) * token_mask_row_bytes(n_vocab);
}

}  // namespace workspace

uint64_t CudaWorkspace::bytes(std::string_view name) const {
  for (const auto* list : {&buffers, &attention})
    for (const WorkspaceBuffer& b : *list)
      if (b.name == name) return b.bytes;
  return 0;
}

uint64_t CudaWorkspace::load_bytes() const { return sum(buffers); }
uint64_t CudaWorkspace::attention_bytes() const { return sum(attention); }

CudaWorkspace cuda_workspace(const ModelConfig& c, const WeightLayout& layout, int64_t rows,
                             int64_t context, int64_t slots) {
  using namespace workspace;
  constexpr uint64_t kF32 = 4, kF16 = 2, kI32 = 4;
  CudaWorkspace w;
  const int64_t R = std::max(rows, kMatvecMaxRows);
  const auto r = static_cast<uint64_t>(R);
  // The widest layer's (Gemma 4's layer kinds differ in head size and KV heads).
  int64_t head_dim = c.head_dim, n_head_kv = c.n_head_kv, kv_dim = c.n_head_kv * c.head_dim;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    head_dim = std::max(head_dim, c.head_dim_of(l));
    n_head_kv = std::max(n_head_kv, c.n_head_kv_of(l));
    kv_dim = std::max(kv_dim, c.kv_dim_of(l));
  }
  const int64_t q_dim = c.n_head * head_dim;
  w.rows = R;
  // Qwen3.5's Gated DeltaNet layers also project from their value width (ssm_out).
  w.widest = std::max({c.n_embd, q_dim, c.n_ff, c.is_hybrid() ? c.delta_net.value_dim() : 0});
  const auto widest = static_cast<uint64_t>(w.widest);
  // One region for everything a step sends (token rows, then sampling), so a decode step
  // uploads with one copy.
  w.params_offset = align_up(kInputArrays * r * kI32);
  w.lengths_offset = align_up(w.params_offset + r * kSamplingParamsBytes);
  w.history_offset = align_up(w.lengths_offset + r * kI32);
  auto add = [&](std::string_view name, uint64_t bytes) { w.buffers.push_back({name, bytes}); };
  add("inputs", w.history_offset + r * kHistoryTokens * kI32);
  add("hidden", r * static_cast<uint64_t>(c.n_embd) * kF32);
  add("normed", r * widest * kF32);
  add("normed_f16", r * widest * kF16);
  add("q8_qs", r * widest);
  add("q8_ds", r * widest / kQ8Block * 2 * kF32);  // a float2 per block
  add("q", r * static_cast<uint64_t>(q_dim) * kF32);
  add("k", r * static_cast<uint64_t>(kv_dim) * kF32);
  add("v", r * static_cast<uint64_t>(kv_dim) * kF32);
  add("attn", r * static_cast<uint64_t>(q_dim) * kF32);
  add("gate", r * static_cast<uint64_t>(c.n_ff) * kF32);
  add("up", r * static_cast<uint64_t>(c.n_ff) * kF32);
  // Gemma 4's per-layer embeddings (cuda_gemma4.cpp): a pass's inputs [rows][n_layer][n_pl], and
  // as many floats for the gathered table rows, then each layer's gate output.
  if (layout.per_layer_table_bytes > 0) {
    const uint64_t ple = r * static_cast<uint64_t>(c.n_layer * c.n_embd_per_layer) * kF32;
    add("ple_inputs", ple);
    add("ple_scratch", ple);
  }
  // Qwen3.5 (cuda_hybrid.cpp): per row the input projection and its convolution (2 x channels),
  // the output gate and the rule's output (2 x value width), beta and alpha (2 x value heads),
  // and the gated attention's Q with its gate (2 x q_dim); then the chunked delta rule's scratch
  // (kernels' delta_net_chunk_scratch_floats: 65 x value heads + 3 per row, and 20).
  if (c.is_hybrid()) {
    const DeltaNetConfig& d = c.delta_net;
    add("hybrid", (r * static_cast<uint64_t>(2 * d.conv_channels() + 2 * d.value_dim() +
                                             2 * d.n_v_heads + 2 * q_dim + 65 * d.n_v_heads + 3) +
                   20) *
                      kF32);
  }
  // The GEMM path dequantises one layer matrix at a time to f16 (runs of more than 64 rows).
  if (R > kMatvecMaxRows)
    add("weight_f16", static_cast<uint64_t>(layout.largest_layer_matrix_elements) * kF16);
  add("logits", static_cast<uint64_t>(kLogitRows * c.n_vocab) * kF32);
  add("tokens_out", r * kI32);
  add("argmax_scratch", r * (8 + kI32));  // an unsigned long long and an int per row
  add("token_masks", token_mask_device_bytes(c.n_vocab));
  w.overlap_bytes = w.bytes("weight_f16");

  // Split attention over contexts of `context` tokens: decode rows in splits of 64 tokens,
  // prefill rows in splits of 1024, whichever needs more.
  const int64_t tokens = std::max<int64_t>(context, 1);
  const uint64_t floats =
      std::max(attention_floats(std::min(R, kMatvecMaxRows), c.n_head,
                                ceil_div(tokens, kDecodeSplitTokens), head_dim),
               attention_floats(R, c.n_head, ceil_div(tokens, kPrefillSplitTokens), head_dim));
  w.attention.push_back({"attention_partial", floats * kF32});
  w.attention.push_back({"attention_counters", r * static_cast<uint64_t>(n_head_kv) * kI32});
  w.attention.push_back({"slot_bases", static_cast<uint64_t>(std::max<int64_t>(slots, 0)) * 8});
  return w;
}

}  // namespace granule
