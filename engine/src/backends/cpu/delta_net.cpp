// Qwen3.5's hybrid layers on the CPU: the Gated DeltaNet recurrence token by token and the gated
// full attention with partial multi-section rope (delta_net.h has the math).
#include "backends/cpu/delta_net.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "backends/cpu/ops.h"
#include "backends/cpu/thread_pool.h"
#include "granule/error.h"
#include "granule/quant.h"

namespace granule::cpu {
namespace {

std::vector<float> to_f32(const TensorInfo* t) {
  if (!t) return {};
  std::vector<float> out(static_cast<size_t>(t->elements()));
  dequantize_row(static_cast<TensorType>(t->ggml_type), t->data, out.data(), t->elements());
  return out;
}

size_t sz(int64_t n) { return static_cast<size_t>(n); }

float silu(float x) { return x / (1.0f + std::exp(-x)); }
float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
// ggml_softplus: x above 20 as is, else log(1 + e^x).
float softplus(float x) { return x > 20.0f ? x : std::log(1.0f + std::exp(x)); }

// x / sqrt(Σx² + eps) (llama.cpp's build_gdn_l2_norm: rms_norm with eps / n, then 1 / sqrt(n)).
void l2_norm(float* x, int64_t n, float eps) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  const float scale =
      1.0f / std::sqrt(mean + eps / static_cast<float>(n)) / std::sqrt(static_cast<float>(n));
  for (int64_t i = 0; i < n; ++i) x[i] *= scale;
}

}  // namespace

void delta_net_sequence(const DeltaNetConfig& d, const float* conv_weight, const float* mixed,
                        const float* beta, const float* g, int64_t n_tokens, float eps,
                        float* conv_state, float* delta_state, float* conv_out, float* out,
                        ThreadPool& pool) {
  const int64_t channels = d.conv_channels();
  const int64_t taps = d.conv_kernel;
  const int64_t kept = taps - 1;
  // The causal convolution per channel over [state | the new inputs], then SiLU; the state
  // becomes the last `kept` inputs.
  pool.parallel_for(channels, [&](int64_t begin, int64_t end, int32_t) {
    thread_local std::vector<float> window;
    window.resize(sz(kept + n_tokens));
    for (int64_t c = begin; c < end; ++c) {
      float* s = conv_state + c * kept;
      std::copy_n(s, kept, window.data());
      for (int64_t t = 0; t < n_tokens; ++t) window[sz(kept + t)] = mixed[t * channels + c];
      const float* w = conv_weight + c * taps;
      for (int64_t t = 0; t < n_tokens; ++t) {
        float sum = 0.0f;
        for (int64_t i = 0; i < taps; ++i) sum += window[sz(t + i)] * w[i];
        conv_out[t * channels + c] = silu(sum);
      }
      std::copy_n(window.data() + n_tokens, kept, s);
    }
  });
  // L2-normed Q and K heads.
  const int64_t S = d.state_size;
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* row = conv_out + t * channels;
    for (int64_t h = 0; h < 2 * d.n_k_heads; ++h) l2_norm(row + h * S, S, eps);
  }
  // The delta rule, each value head on its own over the tokens in order.
  const float scale = 1.0f / std::sqrt(static_cast<float>(S));
  const int64_t key_dim = d.key_dim();
  const int64_t value_dim = d.value_dim();
  pool.parallel_for(d.n_v_heads, [&](int64_t begin, int64_t end, int32_t) {
    thread_local std::vector<float> delta;
    delta.resize(sz(S));
    for (int64_t j = begin; j < end; ++j) {
      float* M = delta_state + j * S * S;  // M[col * S + i] = S[i][col]
      const int64_t kh = j % d.n_k_heads;
      for (int64_t t = 0; t < n_tokens; ++t) {
        const float* row = conv_out + t * channels;
        const float* q = row + kh * S;
        const float* k = row + key_dim + kh * S;
        const float* v = row + 2 * key_dim + j * S;
        const float b = beta[t * d.n_v_heads + j];
        const float decay = std::exp(g[t * d.n_v_heads + j]);
        for (int64_t e = 0; e < S * S; ++e) M[e] *= decay;
        for (int64_t col = 0; col < S; ++col) {
          float sum = 0.0f;
          const float* m = M + col * S;
          for (int64_t i = 0; i < S; ++i) sum += m[i] * k[i];
          delta[sz(col)] = (v[col] - sum) * b;
        }
        float* o = out + t * value_dim + j * S;
        for (int64_t col = 0; col < S; ++col) {
          float* m = M + col * S;
          const float dc = delta[sz(col)];
          float sum = 0.0f;
          for (int64_t i = 0; i < S; ++i) {
            m[i] += k[i] * dc;
            sum += m[i] * q[i];
          }
          o[col] = sum * scale;
        }
      }
    }
  });
}

SectionRope::SectionRope(const ModelConfig& c)
    // No Qwen3.5 layer slides: every attention layer rotates rope_dims_of(0) dimensions.
    : rope_dims_(c.rope_dims_of(0)) {
  const int64_t half = rope_dims_ / 2;
  frequencies_.assign(sz(half), 0.0);
  const auto& s = c.rope_sections;
  const int64_t total = s[0] + s[1] + s[2] + s[3];
  for (int64_t i = 0; i < half; ++i) {
    bool rotates = true;
    if (total > 0) {
      const int64_t sector = i % total;
      rotates = (sector % 3 == 0 && sector < 3 * s[0]) || (sector % 3 == 1 && sector < 3 * s[1]) ||
                (sector % 3 == 2 && sector < 3 * s[2]);
    }
    if (rotates) {
      frequencies_[sz(i)] =
          std::pow(static_cast<double>(c.rope_theta),
                   -2.0 * static_cast<double>(i) / static_cast<double>(rope_dims_));
    }
  }
}

void SectionRope::apply(float* x, int64_t n_heads, int64_t head_stride, int64_t position) const {
  const int64_t half = rope_dims_ / 2;
  thread_local std::vector<float> cosines, sines;
  cosines.resize(sz(half));
  sines.resize(sz(half));
  for (int64_t i = 0; i < half; ++i) {
    const double angle = static_cast<double>(position) * frequencies_[sz(i)];
    cosines[sz(i)] = static_cast<float>(std::cos(angle));
    sines[sz(i)] = static_cast<float>(std::sin(angle));
  }
  for (int64_t h = 0; h < n_heads; ++h) {
    float* v = x + h * head_stride;
    for (int64_t i = 0; i < half; ++i) {
      const float x0 = v[i], x1 = v[i + half];
      v[i] = x0 * cosines[sz(i)] - x1 * sines[sz(i)];
      v[i + half] = x0 * sines[sz(i)] + x1 * cosines[sz(i)];
    }
  }
}

HybridLayers::HybridLayers(const ModelConfig& config, const WeightTable& weights,
                           MixerNumerics numerics)
    : config_(config), weights_(weights), numerics_(std::move(numerics)), rope_(config) {
  int64_t recurrent = 0;
  for (int64_t i = 0; i < config.n_layer; ++i) {
    const LayerWeights& l = weights.layers[sz(i)];
    LayerVectors v;
    if (config.layer_recurrent(i)) {
      recurrent_index_.push_back(recurrent++);
      v.conv = to_f32(l.ssm_conv1d);
      v.dt_bias = to_f32(l.ssm_dt);
      v.a = to_f32(l.ssm_a);
      v.ssm_norm = to_f32(l.ssm_norm);
    } else {
      recurrent_index_.push_back(-1);
      v.q_norm = to_f32(l.q_norm);
      v.k_norm = to_f32(l.k_norm);
    }
    layers_.push_back(std::move(v));
  }
  const DeltaNetConfig& d = config.delta_net;
  slot_floats_ = recurrent * (d.conv_state_floats() + d.delta_state_floats());
}

void HybridLayers::resize(int32_t slots) {
  state_.assign(sz(slots) * sz(slot_floats_), 0.0f);
  lengths_.assign(sz(slots), 0);
}

const float* HybridLayers::state(int32_t slot) const {
  return state_.data() + sz(slot) * sz(slot_floats_);
}

void HybridLayers::restore(int32_t slot, const float* state, int64_t length) {
  std::copy_n(state, slot_floats_, state_.data() + sz(slot) * sz(slot_floats_));
  lengths_.at(sz(slot)) = length;
}

void HybridLayers::reset(int32_t slot) {
  std::fill_n(state_.data() + sz(slot) * sz(slot_floats_), slot_floats_, 0.0f);
  lengths_.at(sz(slot)) = 0;
}

void HybridLayers::project(const TensorInfo* w, const float* x, int64_t n_tokens, float* y,
                           MixerInput input, ThreadPool& pool) const {
  if (numerics_.project) {
    numerics_.project(w, x, n_tokens, y, input);
    return;
  }
  matmul(static_cast<TensorType>(w->ggml_type), w->data, w->dims[1], w->dims[0], x, n_tokens, y,
         &pool);
}

float* HybridLayers::conv_state(int32_t slot, int64_t layer) {
  const DeltaNetConfig& d = config_.delta_net;
  const int64_t r = recurrent_index_[sz(layer)];
  return state_.data() + sz(slot) * sz(slot_floats_) +
         sz(r * (d.conv_state_floats() + d.delta_state_floats()));
}

float* HybridLayers::delta_state(int32_t slot, int64_t layer) {
  return conv_state(slot, layer) + config_.delta_net.conv_state_floats();
}

void HybridLayers::begin_step(std::span<const SequenceSpan> sequences) {
  for (const SequenceSpan& s : sequences) {
    if (s.slot < 0 || s.slot >= slots()) {
      throw UsageError("recurrent state: slot " + std::to_string(s.slot) + " does not exist");
    }
    if (s.start_position != 0 && s.start_position != length(s.slot)) {
      const int64_t covered = length(s.slot);
      throw UsageError("recurrent state: slot " + std::to_string(s.slot) +
                       (covered < 0 ? std::string(" holds the state of a step that failed")
                                    : " covers " + std::to_string(covered) + " tokens") +
                       ", the step continues at position " + std::to_string(s.start_position));
    }
  }
  for (const SequenceSpan& s : sequences) {
    if (s.start_position == 0) reset(s.slot);
    lengths_[sz(s.slot)] = -1;  // in flight
  }
}

void HybridLayers::end_step(std::span<const SequenceSpan> sequences) {
  for (const SequenceSpan& s : sequences) lengths_[sz(s.slot)] = s.start_position + s.n_tokens;
}

void HybridLayers::run(int64_t layer, const float* xn, int64_t n_tokens,
                       std::span<const SequenceSpan> sequences, const int64_t* positions,
                       const int32_t* slots, const KvAddress& kv, int64_t kv_token_stride,
                       float* out, ThreadPool& pool) {
  if (config_.layer_recurrent(layer))
    delta_net(layer, xn, n_tokens, sequences, out, pool);
  else
    attention(layer, xn, n_tokens, positions, slots, kv, kv_token_stride, out, pool);
}

void HybridLayers::attention(int64_t layer, const float* xn, int64_t n_tokens,
                             const int64_t* positions, const int32_t* slots, const KvAddress& kv,
                             int64_t kv_token_stride, float* out, ThreadPool& pool) {
  const ModelConfig& c = config_;
  const LayerWeights& w = weights_.layers[sz(layer)];
  const LayerVectors& lv = layers_[sz(layer)];
  const int64_t hd = c.head_dim;
  const int64_t q_dim = c.n_head * hd;
  const int64_t kv_dim = c.n_head_kv * hd;
  qg_.resize(sz(n_tokens * 2 * q_dim));
  q_.resize(sz(n_tokens * q_dim));
  k_.resize(sz(n_tokens * kv_dim));
  v_.resize(sz(n_tokens * kv_dim));
  attn_.resize(sz(n_tokens * q_dim));
  project(w.wq, xn, n_tokens, qg_.data(), MixerInput::Norm, pool);
  project(w.wk, xn, n_tokens, k_.data(), MixerInput::Norm, pool);
  project(w.wv, xn, n_tokens, v_.data(), MixerInput::Norm, pool);

  for (int64_t t = 0; t < n_tokens; ++t) {
    // Q and its gate sit per head: [q_h | gate_h], 2 x head_dim apart.
    float* q = q_.data() + t * q_dim;
    const float* qg = qg_.data() + t * 2 * q_dim;
    for (int64_t h = 0; h < c.n_head; ++h)
      rms_norm(qg + h * 2 * hd, lv.q_norm.data(), q + h * hd, hd, c.rms_eps);
    float* k = k_.data() + t * kv_dim;
    for (int64_t h = 0; h < c.n_head_kv; ++h)
      rms_norm(k + h * hd, lv.k_norm.data(), k + h * hd, hd, c.rms_eps);
    rope_.apply(q, c.n_head, hd, positions[t]);
    rope_.apply(k, c.n_head_kv, hd, positions[t]);
    std::copy_n(k, kv_dim, kv(slots[t], positions[t], layer, false));
    std::copy_n(v_.data() + t * kv_dim, kv_dim, kv(slots[t], positions[t], layer, true));
    if (numerics_.kv_through_f16) {
      round_through_f16(kv(slots[t], positions[t], layer, false), kv_dim);
      round_through_f16(kv(slots[t], positions[t], layer, true), kv_dim);
    }
  }

  const int64_t group = c.n_head / c.n_head_kv;
  pool.parallel_for(n_tokens * c.n_head, [&](int64_t begin, int64_t end, int32_t) {
    thread_local std::vector<float> scores;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t t = i / c.n_head;
      const int64_t h = i % c.n_head;
      const int64_t length = positions[t] + 1;
      if (scores.size() < sz(length)) scores.resize(sz(length));
      const int64_t offset = (h / group) * hd;
      float* o = attn_.data() + t * q_dim + h * hd;
      attention_head(q_.data() + t * q_dim + h * hd, kv(slots[t], 0, layer, false) + offset,
                     kv(slots[t], 0, layer, true) + offset, kv_token_stride, length, hd,
                     scores.data(), o);
      const float* gate = qg_.data() + t * 2 * q_dim + h * 2 * hd + hd;
      for (int64_t e = 0; e < hd; ++e) o[e] *= sigmoid(gate[e]);
    }
  });
  project(w.wo, attn_.data(), n_tokens, out, MixerInput::Activation, pool);
}

void HybridLayers::delta_net(int64_t layer, const float* xn, int64_t n_tokens,
                             std::span<const SequenceSpan> sequences, float* out,
                             ThreadPool& pool) {
  const ModelConfig& c = config_;
  const DeltaNetConfig& d = c.delta_net;
  const LayerWeights& w = weights_.layers[sz(layer)];
  const LayerVectors& lv = layers_[sz(layer)];
  const int64_t channels = d.conv_channels();
  const int64_t nv = d.n_v_heads;
  mixed_.resize(sz(n_tokens * channels));
  z_.resize(sz(n_tokens * d.value_dim()));
  beta_.resize(sz(n_tokens * nv));
  g_.resize(sz(n_tokens * nv));
  conv_out_.resize(sz(n_tokens * channels));
  core_.resize(sz(n_tokens * d.value_dim()));
  project(w.ssm_in, xn, n_tokens, mixed_.data(), MixerInput::Norm, pool);
  project(w.ssm_z, xn, n_tokens, z_.data(), MixerInput::Norm, pool);
  project(w.ssm_beta, xn, n_tokens, beta_.data(), MixerInput::Norm, pool);
  project(w.ssm_alpha, xn, n_tokens, g_.data(), MixerInput::Norm, pool);
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t j = 0; j < nv; ++j) {
      float& b = beta_[sz(t * nv + j)];
      b = sigmoid(b);
      float& g = g_[sz(t * nv + j)];
      g = softplus(g + lv.dt_bias[sz(j)]) * lv.a[sz(j)];
    }
  }
  for (const SequenceSpan& s : sequences) {
    const int64_t t0 = s.first_token;
    delta_net_sequence(d, lv.conv.data(), mixed_.data() + t0 * channels, beta_.data() + t0 * nv,
                       g_.data() + t0 * nv, s.n_tokens, c.rms_eps, conv_state(s.slot, layer),
                       delta_state(s.slot, layer), conv_out_.data() + t0 * channels,
                       core_.data() + t0 * d.value_dim(), pool);
  }
  // The gated norm: RMSNorm over each value head (ssm_norm), times SiLU(z).
  const int64_t S = d.state_size;
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t j = 0; j < nv; ++j) {
      float* o = core_.data() + t * d.value_dim() + j * S;
      const float* z = z_.data() + t * d.value_dim() + j * S;
      rms_norm(o, lv.ssm_norm.data(), o, S, c.rms_eps);
      for (int64_t e = 0; e < S; ++e) o[e] *= silu(z[e]);
    }
  }
  project(w.ssm_out, core_.data(), n_tokens, out, MixerInput::Activation, pool);
}

}  // namespace granule::cpu
