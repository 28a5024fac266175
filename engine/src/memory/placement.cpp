// plan_placement: the resident prefix of layers that fits, the trailing layers streamed.
#include "memory/placement.h"

#include <algorithm>
#include <cstdio>
#include <initializer_list>

#include "granule/gguf.h"
#include "model/weight_split.h"

namespace granule {
namespace {

// The CUDA backend's upload layout (cuda_model.cpp): 256-byte aligned tensors with 16 bytes
// of slack for the kernels' vector loads past a row's end.
constexpr uint64_t kAlign = 256;
constexpr uint64_t kTensorSlackBytes = 16;
uint64_t align_up(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

uint64_t matrix_bytes(const TensorInfo* t, bool split_weights) {
  if (!t) return 0;
  const bool split = split_weights && split_layout_fits(t->ggml_type, t->dims[0]);
  const uint64_t bytes = split ? static_cast<uint64_t>(split_row_stride(t->ggml_type, t->dims[0]) *
                                                       t->rows())
                               : t->size_bytes;
  return align_up(bytes + kTensorSlackBytes);
}

// Norms and biases travel as f32.
uint64_t vector_bytes(const TensorInfo* t) {
  return t ? align_up(static_cast<uint64_t>(t->elements()) * sizeof(float)) : 0;
}

std::string gib(uint64_t bytes) {
  char text[32];
  if (bytes >= (1ull << 30))
    std::snprintf(text, sizeof text, "%.2f GiB", static_cast<double>(bytes) / (1ull << 30));
  else
    std::snprintf(text, sizeof text, "%.0f MiB", static_cast<double>(bytes) / (1ull << 20));
  return text;
}

}  // namespace

uint64_t DeviceWeightSizes::total() const {
  uint64_t sum = fixed_bytes;
  for (uint64_t b : layer_bytes) sum += b;
  return sum;
}

DeviceWeightSizes device_weight_sizes(const WeightTable& w, bool split_weights) {
  DeviceWeightSizes s;
  s.fixed_bytes = matrix_bytes(w.token_embd, split_weights) + vector_bytes(w.output_norm) +
                  vector_bytes(w.rope_freqs);
  if (w.output && w.output != w.token_embd) s.fixed_bytes += matrix_bytes(w.output, split_weights);
  for (const LayerWeights& l : w.layers) {
    uint64_t bytes = 0;
    for (const TensorInfo* t : {l.wq, l.wk, l.wv, l.wo, l.w_gate, l.w_up, l.w_down})
      bytes += matrix_bytes(t, split_weights);
    s.layer_bytes.push_back(bytes);
    for (const TensorInfo* t : {l.attn_norm, l.ffn_norm, l.bq, l.bk, l.bv, l.q_norm, l.k_norm})
      s.fixed_bytes += vector_bytes(t);
  }
  return s;
}

uint64_t cuda_workspace_bytes(const ModelConfig& c, const WeightTable& weights, int64_t max_rows,
                              int64_t context) {
  constexpr int64_t kMatvecRows = 64, kLogitRows = 64, kHistory = 256, kParamsBytes = 64;
  const int64_t R = std::max(max_rows, kMatvecRows);
  const int64_t q_dim = c.n_head * c.head_dim, kv_dim = c.n_head_kv * c.head_dim;
  const int64_t widest = std::max({c.n_embd, q_dim, c.n_ff});
  int64_t floats = R * (c.n_embd + widest + 2 * q_dim + 2 * kv_dim + 2 * c.n_ff);
  floats += kLogitRows * c.n_vocab;
  int64_t bytes = floats * 4 + R * widest * 2 /* f16 */ + R * widest + R * widest / 32 * 8;
  bytes += R * (8 * 4 + kParamsBytes + 4 + kHistory * 4 + 4 + 12);  // inputs, sampling, tokens
  if (R > kMatvecRows) {
    int64_t largest = 0;
    for (const LayerWeights& l : weights.layers)
      for (const TensorInfo* t : {l.wq, l.wk, l.wv, l.wo, l.w_gate, l.w_up, l.w_down})
        if (t) largest = std::max(largest, t->elements());
    bytes += largest * 2;
  }
  // Split attention: partial (max, sum, head_dim values) per row, head and split.
  const int64_t decode = kMatvecRows * c.n_head * ((context + 63) / 64) * (c.head_dim + 2);
  const int64_t prefill = R * c.n_head * ((context + 1023) / 1024) * (c.head_dim + 2);
  bytes += std::max(decode, prefill) * 4 + R * c.n_head_kv * 4;
  return static_cast<uint64_t>(bytes);
}

int64_t default_kv_reserve_tokens(int64_t context_per_chat) {
  constexpr int64_t kReserveTokens = 512;
  return std::clamp<int64_t>(context_per_chat, 0, kReserveTokens);
}

PlacementPlan plan_placement(const PlacementInput& in) {
  PlacementPlan p;
  const auto& layers = in.weights.layer_bytes;
  const auto n = static_cast<int32_t>(layers.size());
  const uint64_t largest = layers.empty() ? 0 : *std::max_element(layers.begin(), layers.end());
  const uint64_t base = in.weights.fixed_bytes + in.workspace_bytes + in.kv_reserve_bytes;
  const int32_t slots = std::max(1, in.staging_slots);
  const int32_t cap = in.max_resident_layers < 0 ? n : std::min(n, in.max_resident_layers);
  p.minimum_budget_bytes = base + (n > 0 ? static_cast<uint64_t>(std::min(slots, n)) * largest : 0);

  // The most resident layers (a prefix) whose bytes, with a ring for the rest sized to the
  // largest streamed layer, fit the budget.
  std::vector<uint64_t> prefix(static_cast<size_t>(n) + 1, 0), suffix_max(static_cast<size_t>(n) + 1, 0);
  for (int32_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + layers[static_cast<size_t>(i)];
  for (int32_t i = n - 1; i >= 0; --i)
    suffix_max[i] = std::max(suffix_max[i + 1], layers[static_cast<size_t>(i)]);
  int32_t resident = 0;
  for (int32_t r = cap; r >= 0; --r) {
    const uint64_t ring =
        static_cast<uint64_t>(std::min(slots, n - r)) * suffix_max[static_cast<size_t>(r)];
    if (base + prefix[static_cast<size_t>(r)] + ring <= in.budget_bytes) {
      resident = r;
      break;
    }
  }
  p.layer_streamed.assign(static_cast<size_t>(n), false);
  p.resident_layers = resident;
  p.streamed_layers = n - resident;
  p.resident_weight_bytes = in.weights.fixed_bytes;
  for (int32_t i = 0; i < n; ++i) {
    if (i < resident) {
      p.resident_weight_bytes += layers[static_cast<size_t>(i)];
    } else {
      p.layer_streamed[static_cast<size_t>(i)] = true;
      p.streamed_bytes_per_pass += layers[static_cast<size_t>(i)];
    }
  }
  if (p.streamed_layers > 0) {
    p.staging_slots = std::min(slots, p.streamed_layers);
    p.staging_slot_bytes = suffix_max[static_cast<size_t>(resident)];
    p.staging_bytes = static_cast<uint64_t>(p.staging_slots) * p.staging_slot_bytes;
  }
  p.loads = in.budget_bytes >= p.minimum_budget_bytes;
  const uint64_t held = p.device_bytes() + in.workspace_bytes;
  p.kv_headroom_bytes = in.budget_bytes > held ? in.budget_bytes - held : 0;
  return p;
}

std::string describe_shortfall(const PlacementInput& in, const PlacementPlan& p) {
  const int32_t ring = std::min<int32_t>(std::max(1, in.staging_slots),
                                         static_cast<int32_t>(in.weights.layer_bytes.size()));
  const uint64_t largest = in.weights.layer_bytes.empty()
                               ? 0
                               : *std::max_element(in.weights.layer_bytes.begin(),
                                                   in.weights.layer_bytes.end());
  return "the VRAM budget of " + gib(in.budget_bytes) + " is below the " +
         gib(p.minimum_budget_bytes) + " this model needs with every layer streamed (" +
         gib(in.weights.fixed_bytes) + " of embeddings, head and norms, " +
         gib(static_cast<uint64_t>(ring) * largest) + " of staging for " + std::to_string(ring) +
         " layers, " + gib(in.workspace_bytes) + " of workspace, " + gib(in.kv_reserve_bytes) +
         " of KV); raise the budget or use a shorter context";
}

}  // namespace granule
