// HostExperts: the chosen experts' products for the choices a mask hands to the host, grouped by
// expert (one pass over an expert's rows serves every row that chose it), gate and up in one
// parallel loop over groups of 8 rows, down in a second, then each row's weighted sum in top-k
// order (the order MoeFfn sums in).
#include "backends/cpu/host_experts.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "backends/cpu/fast_matmul.h"
#include "backends/cpu/moe_ffn.h"
#include "backends/cpu/thread_pool.h"
#include "granule/error.h"
#include "granule/quant.h"

namespace granule::cpu {
namespace {

TensorType type_of(const TensorInfo* t) { return static_cast<TensorType>(t->ggml_type); }

std::vector<float> to_f32(const TensorInfo* t) {
  if (!t) return {};
  std::vector<float> out(static_cast<size_t>(t->elements()));
  dequantize_row(type_of(t), t->data, out.data(), t->elements());
  return out;
}

constexpr int64_t kGroup = Int8Weights::kGroupRows;
int64_t groups_of(int64_t rows) { return (rows + kGroup - 1) / kGroup; }
size_t sz(int64_t n) { return static_cast<size_t>(n); }

}  // namespace

std::string HostExperts::refusal(const ModelConfig& c, const WeightTable& w) {
  if (w.layers.empty()) return "no layers";
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& l = w.layers[i];
    if (!l.gate_exps || !l.up_exps || !l.down_exps)
      return "layer " + std::to_string(i) + " has no experts";
    for (const TensorInfo* t : {l.gate_exps, l.up_exps, l.down_exps}) {
      if (t->dims.size() != 3 || t->dims[2] != c.moe.n_expert)
        return "tensor " + t->name + " is not one slab per expert";
      if (!Int8Weights::supports(type_of(t), t->dims[0]))
        return "the host's int8 kernels do not run tensor " + t->name + " (" +
               tensor_type_name(t->ggml_type) + ")";
    }
  }
  return {};
}

HostExperts::StreamedFit HostExperts::streamed_fit(const ModelConfig& c, const WeightTable& w,
                                                   uint64_t available, uint64_t total) {
  StreamedFit fit;
  if (c.n_embd % 4 != 0) {
    fit.reason = "its width (" + std::to_string(c.n_embd) + ") is not a multiple of 4";
    return fit;
  }
  if (fit.reason = refusal(c, w); !fit.reason.empty()) return fit;
  fit.copy_bytes = plan_copies(w, 0, 0).expert_bytes;
  fit.budget_bytes = expert_copy_budget(available, total, 0);
  if (fit.copy_bytes > fit.budget_bytes) {
    fit.memory_short = true;
    fit.reason = "their int8 copies (" + std::to_string(fit.copy_bytes >> 20) +
                 " MiB) do not fit the memory available (" + std::to_string(fit.budget_bytes >> 20) +
                 " MiB after a reserve)";
  }
  return fit;
}

HostExperts::HostExperts(const ModelConfig& c, const WeightTable& w, ThreadPool& pool)
    : n_embd_(c.n_embd),
      n_ff_(c.moe.n_ff_exp),
      n_expert_(c.moe.n_expert),
      n_used_(c.moe.n_expert_used),
      activation_(c.activation) {
  if (const std::string why = refusal(c, w); !why.empty()) throw UsageError("host experts: " + why);
  layers_.resize(w.layers.size());
  // (layer, matrix, expert) in one parallel loop.
  const auto n_layer = static_cast<int64_t>(w.layers.size());
  const int64_t per_layer = 3 * n_expert_;
  std::vector<std::optional<Int8Weights>> made(sz(n_layer * per_layer));
  pool.parallel_for(n_layer * per_layer, [&](int64_t begin, int64_t end, int32_t) {
    for (int64_t i = begin; i < end; ++i) {
      const LayerWeights& l = w.layers[sz(i / per_layer)];
      const int64_t m = i % per_layer / n_expert_, e = i % n_expert_;
      const TensorInfo* t = m == 0 ? l.gate_exps : m == 1 ? l.up_exps : l.down_exps;
      const uint64_t slab = t->size_bytes / static_cast<uint64_t>(n_expert_);
      made[sz(i)].emplace(type_of(t), t->data + slab * static_cast<uint64_t>(e), t->dims[1],
                          t->dims[0]);
    }
  });
  for (int64_t i = 0; i < n_layer * per_layer; ++i) {
    Layer& layer = layers_[sz(i / per_layer)];
    const int64_t m = i % per_layer / n_expert_;
    packed_bytes_ += made[sz(i)]->packed_bytes();
    (m == 0 ? layer.gate : m == 1 ? layer.up : layer.down).push_back(std::move(*made[sz(i)]));
  }
  for (int64_t i = 0; i < n_layer; ++i) {
    const LayerWeights& l = w.layers[sz(i)];
    Layer& layer = layers_[sz(i)];
    layer.gate_bias = to_f32(l.gate_exps_bias);
    layer.up_bias = to_f32(l.up_exps_bias);
    layer.down_bias = to_f32(l.down_exps_bias);
    layer.bytes = (l.gate_exps->size_bytes + l.up_exps->size_bytes + l.down_exps->size_bytes) /
                  static_cast<uint64_t>(n_expert_);
  }
}

HostExperts::Work HostExperts::run(int64_t layer, int64_t n_rows, const float* x,
                                   const int32_t* ids, const float* weights, const uint8_t* host,
                                   float* y, ThreadPool& pool) {
  const Layer& L = layers_[sz(layer)];
  const int64_t d = n_embd_, f = n_ff_, k = n_used_, choices = n_rows * k;
  std::memset(y, 0, sz(n_rows * d) * sizeof(float));
  // The host's choices grouped by expert (a counting sort; rows ascending within an expert).
  count_.assign(sz(n_expert_), 0);
  for (int64_t p = 0; p < choices; ++p) {
    const int32_t e = ids[p];
    if (e >= 0 && e < n_expert_ && host[e]) ++count_[sz(e)];
  }
  first_.assign(sz(n_expert_), 0);
  active_.clear();
  int64_t pairs = 0;
  for (int64_t e = 0; e < n_expert_; ++e) {
    first_[sz(e)] = pairs;
    pairs += count_[sz(e)];
    if (count_[sz(e)] > 0) active_.push_back(static_cast<int32_t>(e));
  }
  Work work{pairs, static_cast<int64_t>(active_.size())};
  if (pairs == 0) return work;
  pair_row_.resize(sz(pairs));
  pair_slot_.assign(sz(choices), -1);  // [choice]: its pair, -1 not the host's
  fill_ = first_;
  for (int64_t p = 0; p < choices; ++p) {
    const int32_t e = ids[p];
    if (e < 0 || e >= n_expert_ || !host[e]) continue;
    const int64_t at = fill_[sz(e)]++;
    pair_row_[sz(at)] = static_cast<int32_t>(p / k);
    pair_slot_[sz(p)] = static_cast<int32_t>(at);
  }
  // Each pair's input row as int8 blocks.
  gathered_.resize(sz(pairs * d));
  for (int64_t p = 0; p < pairs; ++p)
    std::memcpy(gathered_.data() + p * d, x + pair_row_[sz(p)] * d, sz(d) * sizeof(float));
  xq_.resize(sz(pairs * d / 32));
  quantize_activations(gathered_.data(), pairs * d, xq_.data());

  // Gate and up: segment s is active expert s / 2's gate (even) or up (odd), in groups of 8 rows.
  const auto n_active = static_cast<int64_t>(active_.size());
  gate_.resize(sz(pairs * f));
  up_.resize(sz(pairs * f));
  const int64_t f_groups = groups_of(f);
  pool.parallel_for(n_active * 2 * f_groups, [&](int64_t begin, int64_t end, int32_t) {
    for (int64_t i = begin; i < end;) {
      const int64_t segment = i / f_groups, group = i % f_groups;
      const int64_t group_end = std::min(end - segment * f_groups, f_groups);
      const int64_t e = active_[sz(segment / 2)];
      const bool is_up = segment % 2 == 1;
      const Int8Weights& w = (is_up ? L.up : L.gate)[sz(e)];
      w.matmul_rows(group * kGroup, std::min(f, group_end * kGroup),
                    xq_.data() + first_[sz(e)] * (d / 32), count_[sz(e)],
                    (is_up ? up_.data() : gate_.data()) + first_[sz(e)] * f, f);
      i = segment * f_groups + group_end;
    }
  });
  // Biases and the activation, per pair; then down's input as int8 blocks.
  hidden_.resize(sz(pairs * f));
  for (int64_t e : active_) {
    for (int64_t p = first_[sz(e)]; p < first_[sz(e)] + count_[sz(e)]; ++p) {
      float* g = gate_.data() + p * f;
      float* u = up_.data() + p * f;
      float* h = hidden_.data() + p * f;
      expert_activation(activation_, g, u,
                        L.gate_bias.empty() ? nullptr : L.gate_bias.data() + e * f,
                        L.up_bias.empty() ? nullptr : L.up_bias.data() + e * f, h, f);
    }
  }
  hq_.resize(sz(pairs * f / 32));
  quantize_activations(hidden_.data(), pairs * f, hq_.data());
  // Down: segment s is active expert s's down matrix, d rows in groups of 8.
  down_.resize(sz(pairs * d));
  const int64_t d_groups = groups_of(d);
  pool.parallel_for(n_active * d_groups, [&](int64_t begin, int64_t end, int32_t) {
    for (int64_t i = begin; i < end;) {
      const int64_t segment = i / d_groups, group = i % d_groups;
      const int64_t group_end = std::min(end - segment * d_groups, d_groups);
      const int64_t e = active_[sz(segment)];
      L.down[sz(e)].matmul_rows(group * kGroup, std::min(d, group_end * kGroup),
                                hq_.data() + first_[sz(e)] * (f / 32), count_[sz(e)],
                                down_.data() + first_[sz(e)] * d, d);
      i = segment * d_groups + group_end;
    }
  });
  // y_r = (y_0 + b) w_0 + (y_1 + b) w_1 + ... over the row's host choices, in top-k order.
  for (int64_t r = 0; r < n_rows; ++r) {
    float* o = y + r * d;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t at = pair_slot_[sz(r * k + j)];
      if (at < 0) continue;
      const int64_t e = ids[r * k + j];
      const float w = weights[r * k + j];
      const float* v = down_.data() + static_cast<int64_t>(at) * d;
      const float* b = L.down_bias.empty() ? nullptr : L.down_bias.data() + e * d;
      for (int64_t i = 0; i < d; ++i) o[i] += (b ? v[i] + b[i] : v[i]) * w;
    }
  }
  return work;
}

}  // namespace granule::cpu
