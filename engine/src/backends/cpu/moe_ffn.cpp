// MoeFfn: route each token, group the (token, expert) choices by expert, run every chosen
// expert's gate/up rows in one parallel loop and its down rows in a second, then sum each
// token's weighted expert outputs in top-k order (llama.cpp's build_moe_ffn order).
#include "backends/cpu/moe_ffn.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cpu/fast_matmul.h"
#include "backends/cpu/gemma_ops.h"
#include "backends/cpu/ops.h"
#include "backends/cpu/thread_pool.h"
#include "granule/error.h"
#include "granule/quant.h"

namespace granule::cpu {
namespace {

TensorType type_of(const TensorInfo* t) { return static_cast<TensorType>(t->ggml_type); }

// Whether the CUDA expert kernels read int8 activations for this block type: every type but
// the float ones (contract of issue 36: experts never take the f16 path).
bool reads_q8(const TensorInfo* t) {
  const TensorType type = type_of(t);
  return type != TensorType::F32 && type != TensorType::F16 && type != TensorType::BF16;
}

std::vector<float> to_f32(const TensorInfo* t) {
  if (!t) return {};
  std::vector<float> out(static_cast<size_t>(t->elements()));
  dequantize_row(type_of(t), t->data, out.data(), t->elements());
  return out;
}

// Expert e's matrix: the e-th contiguous slab of a 3-D tensor.
const uint8_t* slab(const TensorInfo* t, int64_t expert, int64_t n_expert) {
  return t->data + t->size_bytes / static_cast<uint64_t>(n_expert) * static_cast<uint64_t>(expert);
}

// Tokens per pass through the experts: bounds the per-choice scratch (a long prompt would need
// n_tokens × top-k rows of every activation), and a row is still decoded once per 64 tokens.
constexpr int64_t kChunkTokens = 64;

}  // namespace

void route_token(const ExpertConfig& moe, float* logits, int32_t* experts, float* weights) {
  const int64_t n = moe.n_expert, k = moe.n_expert_used;
  switch (moe.gating) {
    case ExpertGating::Softmax:
      softmax(logits, n);
      break;
    case ExpertGating::Sigmoid:
      for (int64_t i = 0; i < n; ++i) logits[i] = 1.0f / (1.0f + std::exp(-logits[i]));
      break;
    case ExpertGating::SoftmaxOfTopK:
      break;
  }
  top_k(logits, n, k, experts);
  for (int64_t i = 0; i < k; ++i) weights[i] = logits[experts[i]];
  if (moe.gating == ExpertGating::SoftmaxOfTopK) softmax(weights, k);
  if (moe.normalize_weights) {
    double sum = 0.0;  // ggml_sum_rows sums in double
    for (int64_t i = 0; i < k; ++i) sum += static_cast<double>(weights[i]);
    // llama.cpp clamps the sum to the smallest normal f16 before dividing.
    const float divisor = std::max(static_cast<float>(sum), 6.103515625e-5f);
    for (int64_t i = 0; i < k; ++i) weights[i] /= divisor;
  }
  if (moe.weights_scale != 1.0f && moe.weights_scale != 0.0f) {
    for (int64_t i = 0; i < k; ++i) weights[i] *= moe.weights_scale;
  }
}

void expert_activation(FfnActivation activation, float* gate, float* up, const float* gate_bias,
                       const float* up_bias, float* out, int64_t n) {
  if (gate_bias) add_in_place(gate, gate_bias, n);
  if (up_bias) add_in_place(up, up_bias, n);
  if (activation == FfnActivation::SwigluClamped)
    swiglu_clamped(gate, up, out, n);
  else if (activation == FfnActivation::GeluTanh)
    geglu(gate, up, out, n);
  else
    swiglu(gate, up, out, n);
}

MoeFfn::MoeFfn(const ModelConfig& config, const LayerWeights& layer)
    : config_(config),
      layer_(layer),
      router_bias_(to_f32(layer.router_bias)),
      gate_bias_(to_f32(layer.gate_exps_bias)),
      up_bias_(to_f32(layer.up_exps_bias)),
      down_bias_(to_f32(layer.down_exps_bias)),
      shexp_gate_(to_f32(layer.shexp_gate)),
      down_scale_(to_f32(layer.down_exps_scale)) {
  if (!layer.router || !layer.gate_exps || !layer.up_exps || !layer.down_exps)
    throw UsageError("CPU backend: a mixture-of-experts layer without its router or experts");
}

void MoeFfn::run(const float* xn, int64_t n_tokens, float* out, ThreadPool& pool,
                 const MoeFfnOptions& options, uint32_t* routed_counts) {
  const int64_t d = config_.n_embd;
  for (int64_t first = 0; first < n_tokens; first += kChunkTokens) {
    const int64_t count = std::min(kChunkTokens, n_tokens - first);
    MoeFfnOptions chunk = options;
    if (options.router_input) chunk.router_input = options.router_input + first * d;
    run_chunk(xn + first * d, count, out + first * d, pool, chunk, routed_counts);
  }
}

void MoeFfn::run_chunk(const float* xn, int64_t n_tokens, float* out, ThreadPool& pool,
                       const MoeFfnOptions& options, uint32_t* routed_counts) {
  const ExpertConfig& m = config_.moe;
  const LayerWeights& l = layer_;
  const int64_t n_expert = m.n_expert, k = m.n_expert_used, d = config_.n_embd, f = m.n_ff_exp;
  const int64_t pairs = n_tokens * k;
  const auto sz = [](int64_t n) { return static_cast<size_t>(n); };

  // Router logits in f32 from the unrounded input, then each token's choices.
  logits_.resize(sz(n_tokens * n_expert));
  matmul(type_of(l.router), l.router->data, n_expert, d,
         options.router_input ? options.router_input : xn, n_tokens, logits_.data(), &pool);
  chosen_.resize(sz(pairs));
  chosen_weight_.resize(sz(pairs));
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* row = logits_.data() + t * n_expert;
    if (!router_bias_.empty()) add_in_place(row, router_bias_.data(), n_expert);
    route_token(m, row, chosen_.data() + t * k, chosen_weight_.data() + t * k);
  }

  // Choices grouped by expert (a counting sort; tokens ascending within an expert).
  expert_count_.assign(sz(n_expert), 0);
  for (int64_t p = 0; p < pairs; ++p) ++expert_count_[sz(chosen_[sz(p)])];
  expert_first_.assign(sz(n_expert), 0);
  std::vector<int32_t>& active = active_;
  active.clear();
  for (int64_t e = 0, next = 0; e < n_expert; ++e) {
    expert_first_[sz(e)] = next;
    next += expert_count_[sz(e)];
    if (expert_count_[sz(e)] > 0) active.push_back(static_cast<int32_t>(e));
    if (routed_counts) routed_counts[e] += static_cast<uint32_t>(expert_count_[sz(e)]);
  }
  pair_token_.resize(sz(pairs));
  pair_of_choice_.resize(sz(pairs));
  {
    std::vector<int64_t>& fill = fill_;
    fill = expert_first_;
    for (int64_t t = 0; t < n_tokens; ++t) {
      for (int64_t i = 0; i < k; ++i) {
        const int64_t p = fill[sz(chosen_[sz(t * k + i)])]++;
        pair_token_[sz(p)] = static_cast<int32_t>(t);
        pair_of_choice_[sz(t * k + i)] = static_cast<int32_t>(p);
      }
    }
  }

  // Each choice's input row: x_norm, through int8 where the device's kernel reads int8.
  const bool round_gate = options.emulate_device && reads_q8(l.gate_exps);
  const bool round_up = options.emulate_device && reads_q8(l.up_exps);
  const bool round_down = options.emulate_device && reads_q8(l.down_exps);
  const float* rounded = xn;
  if (options.emulate_device &&
      (round_gate || round_up ||
       (l.gate_shexp && (reads_q8(l.gate_shexp) || reads_q8(l.up_shexp))))) {
    rounded_norm_.assign(xn, xn + n_tokens * d);
    for (int64_t t = 0; t < n_tokens; ++t)
      round_through_q8(rounded_norm_.data() + t * d, d, Q8Rounding::MultiplyByInverse);
    rounded = rounded_norm_.data();
  }
  const float* gate_source = round_gate ? rounded : xn;
  const float* up_source = round_up ? rounded : xn;
  auto gather = [&](const float* source, std::vector<float>& into) {
    into.resize(sz(pairs * d));
    for (int64_t p = 0; p < pairs; ++p)
      std::memcpy(into.data() + p * d, source + pair_token_[sz(p)] * d, sz(d) * sizeof(float));
  };
  gather(gate_source, gathered_gate_in_);
  if (up_source != gate_source) gather(up_source, gathered_up_in_);
  const float* up_in = up_source != gate_source ? gathered_up_in_.data() : gathered_gate_in_.data();
  // The fast path's experts read the gathered rows as int8 blocks (one input: the fast path is
  // never the device emulation, whose gate and up inputs may differ).
  const FastMatmul* fast = options.emulate_device ? nullptr : options.fast;
  if (fast && (fast->find_expert(l.gate_exps, 0) || fast->find_expert(l.up_exps, 0))) {
    gate_in_q_.resize(sz(pairs * d / 32));
    quantize_activations(gathered_gate_in_.data(), pairs * d, gate_in_q_.data());
  }

  // Gate and up rows of every chosen expert, in one parallel loop: segment s is active expert
  // s / 2's gate (even) or up (odd) matrix, f rows each.
  gate_.resize(sz(pairs * f));
  up_.resize(sz(pairs * f));
  const auto n_active = static_cast<int64_t>(active.size());
  pool.parallel_for(n_active * 2 * f, [&](int64_t begin, int64_t end, int32_t) {
    for (int64_t i = begin; i < end;) {
      const int64_t segment = i / f, row = i % f;
      const int64_t row_end = std::min(end - segment * f, f);
      const int64_t e = active[sz(segment / 2)];
      const bool up = segment % 2 == 1;
      const TensorInfo* w = up ? l.up_exps : l.gate_exps;
      const int64_t first = expert_first_[sz(e)];
      if (const Int8Weights* w8 = fast ? fast->find_expert(w, e) : nullptr)
        w8->matmul_rows(row, row_end, gate_in_q_.data() + first * (d / 32), expert_count_[sz(e)],
                        (up ? up_.data() : gate_.data()) + first * f, f);
      else
        matmul_rows(type_of(w), slab(w, e, n_expert), row, row_end, f, d,
                    (up ? up_in : gathered_gate_in_.data()) + first * d, expert_count_[sz(e)],
                    (up ? up_.data() : gate_.data()) + first * f);
      i = segment * f + row_end;
    }
  });

  // Biases, the activation and the down projection's input rounding, per choice.
  hidden_.resize(sz(pairs * f));
  for (int64_t e : active) {
    for (int64_t p = expert_first_[sz(e)]; p < expert_first_[sz(e)] + expert_count_[sz(e)]; ++p) {
      float* g = gate_.data() + p * f;
      float* u = up_.data() + p * f;
      float* h = hidden_.data() + p * f;
      expert_activation(config_.activation, g, u,
                        gate_bias_.empty() ? nullptr : gate_bias_.data() + e * f,
                        up_bias_.empty() ? nullptr : up_bias_.data() + e * f, h, f);
      if (round_down) round_through_q8(h, f, Q8Rounding::Divide);
    }
  }

  // Down rows of every chosen expert: segment s is active expert s's down matrix, d rows.
  down_.resize(sz(pairs * d));
  const bool down_fast = fast && fast->find_expert(l.down_exps, 0);
  if (down_fast) {
    hidden_q_.resize(sz(pairs * f / 32));
    quantize_activations(hidden_.data(), pairs * f, hidden_q_.data());
  }
  pool.parallel_for(n_active * d, [&](int64_t begin, int64_t end, int32_t) {
    for (int64_t i = begin; i < end;) {
      const int64_t segment = i / d, row = i % d;
      const int64_t row_end = std::min(end - segment * d, d);
      const int64_t e = active[sz(segment)];
      const int64_t first = expert_first_[sz(e)];
      if (down_fast)
        fast->find_expert(l.down_exps, e)
            ->matmul_rows(row, row_end, hidden_q_.data() + first * (f / 32), expert_count_[sz(e)],
                          down_.data() + first * d, d);
      else
        matmul_rows(type_of(l.down_exps), slab(l.down_exps, e, n_expert), row, row_end, d, f,
                    hidden_.data() + first * f, expert_count_[sz(e)], down_.data() + first * d);
      i = segment * d + row_end;
    }
  });

  // out_t = (y_0 + b) w_0 + (y_1 + b) w_1 + ..., left to right in top-k order.
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* o = out + t * d;
    for (int64_t i = 0; i < k; ++i) {
      const int64_t e = chosen_[sz(t * k + i)];
      const float w = chosen_weight_[sz(t * k + i)];
      const float* y = down_.data() + pair_of_choice_[sz(t * k + i)] * d;
      const float* b = down_bias_.empty() ? nullptr : down_bias_.data() + e * d;
      if (!down_scale_.empty()) {  // Gemma 4: (y · s_e) · w, in llama.cpp's order
        const float s = down_scale_[sz(e)];
        // The device folds the scale into the routing weight (moe.cuh's expert_scale): y · (w · s).
        const float ws = w * s;
        for (int64_t j = 0; j < d; ++j) {
          const float v = options.emulate_device ? y[j] * ws : y[j] * s * w;
          o[j] = i == 0 ? v : o[j] + v;
        }
        continue;
      }
      for (int64_t j = 0; j < d; ++j) {
        const float v = (b ? y[j] + b[j] : y[j]) * w;
        o[j] = i == 0 ? v : o[j] + v;
      }
    }
  }

  // The shared expert, every token, optionally gated by sigmoid(shexp_gate · x_norm).
  if (l.gate_shexp) {
    const int64_t fs = l.gate_shexp->dims[1];
    shexp_gate_out_.resize(sz(n_tokens * fs));
    shexp_up_out_.resize(sz(n_tokens * fs));
    shexp_down_out_.resize(sz(n_tokens * d));
    const bool emulate = options.emulate_device;
    matmul(type_of(l.gate_shexp), l.gate_shexp->data, fs, d,
           emulate && reads_q8(l.gate_shexp) ? rounded : xn, n_tokens, shexp_gate_out_.data(),
           &pool);
    matmul(type_of(l.up_shexp), l.up_shexp->data, fs, d,
           emulate && reads_q8(l.up_shexp) ? rounded : xn, n_tokens, shexp_up_out_.data(), &pool);
    swiglu(shexp_gate_out_.data(), shexp_up_out_.data(), shexp_gate_out_.data(), n_tokens * fs);
    if (emulate && reads_q8(l.down_shexp)) {
      for (int64_t t = 0; t < n_tokens; ++t)
        round_through_q8(shexp_gate_out_.data() + t * fs, fs, Q8Rounding::Divide);
    }
    matmul(type_of(l.down_shexp), l.down_shexp->data, d, fs, shexp_gate_out_.data(), n_tokens,
           shexp_down_out_.data(), &pool);
    for (int64_t t = 0; t < n_tokens; ++t) {
      float scale = 1.0f;
      if (!shexp_gate_.empty()) {
        const float g = dot_f32(shexp_gate_.data(), xn + t * d, d);
        scale = 1.0f / (1.0f + std::exp(-g));
      }
      const float* y = shexp_down_out_.data() + t * d;
      float* o = out + t * d;
      for (int64_t j = 0; j < d; ++j) o[j] += y[j] * scale;
    }
  }
}

}  // namespace granule::cpu
