// The CPU reference of Qwen3.5's hybrid layers (`qwen35`, `qwen35moe`; issue 37): the Gated
// DeltaNet linear-attention layer with its recurrent state, and the gated full-attention layer
// (Q with a per-head output gate, QK norms, partial multi-section rope). llama.cpp is the
// arbiter: src/models/qwen35.cpp and delta-net-base.cpp, ggml's ssm_conv and gated_delta_net
// (ggml/src/ggml-cpu/ops.cpp). The recurrence runs token by token (exact; no chunked form).
//
// A Gated DeltaNet layer, per token x (already RMS-normed):
//   mixed = W_qkv x (Q | K | V channels), z = W_z x, beta = sigmoid(W_beta x),
//   g = softplus(W_alpha x + dt_bias) * a   (a = -exp(A_log), stored so in the file)
//   conv: channel c's output is Σ_i w[c][i] · in_c[t + i] over the last conv_kernel inputs
//   (the conv state holds the previous conv_kernel - 1), then SiLU;
//   q, k = L2-normed heads (x / sqrt(Σx² + eps)); value head j reads key head j % n_k_heads;
//   per value head, with S a state_size² matrix (S[i][j], i over keys, j over values):
//     S *= exp(g); d_j = (v_j - Σ_i S[i][j] k_i) · beta; S[i][j] += k_i d_j;
//     o_j = Σ_i S[i][j] q_i / sqrt(state_size)
//   then RMSNorm(o) over each head with ssm_norm, times SiLU(z), and W_out.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "granule/model_config.h"

namespace granule::cpu {

class ThreadPool;

// A run of one sequence's tokens inside a batch.
struct SequenceSpan {
  int32_t slot = 0;
  int64_t first_token = 0;  // index of its first token in the batch
  int64_t n_tokens = 0;
  int64_t start_position = 0;
};

// One Gated DeltaNet step over a sequence's tokens, from its state, in place. The inputs are
// the projections of the n tokens: mixed [n][conv_channels], z [n][value_dim], beta and g
// [n][n_v_heads] (beta already through the sigmoid, g the log decay). conv_state holds
// (conv_kernel - 1) values per channel (channel-major), delta_state n_v_heads matrices laid
// out as llama.cpp keeps them (state[j * S + i] = S[i][j]). out gets [n][value_dim] before
// the gated norm. `conv_out` is scratch of n * conv_channels floats.
void delta_net_sequence(const DeltaNetConfig& d, const float* conv_weight, const float* mixed,
                        const float* beta, const float* g, int64_t n_tokens, float eps,
                        float* conv_state, float* delta_state, float* conv_out, float* out,
                        ThreadPool& pool);

// The multi-section rope of Qwen3.5's full-attention layers for text positions: NeoX pairs
// (i, i + rope_dims/2) over the first rope_dims of each head, pair i at frequency
// theta^(-2i/rope_dims), rotated by the position when its section (ggml's interleaved rule:
// sector = i % Σsections; sector % 3 == 0 / 1 / 2 below 3 x sections[0/1/2]) is one of the
// first three, left as is otherwise (llama.cpp gives text tokens position 0 in the fourth).
class SectionRope {
 public:
  SectionRope(const ModelConfig& config);
  void apply(float* x, int64_t n_heads, int64_t head_stride, int64_t position) const;

 private:
  int64_t rope_dims_ = 0;
  std::vector<double> frequencies_;  // 0 for the pairs that do not rotate
};

// Where the KV of (slot, position, layer) is: K, or V when value (f32, kv_dim floats).
using KvAddress = std::function<float*(int32_t slot, int64_t position, int64_t layer, bool value)>;

// What a mixer's product reads: the layer's RMSNorm output (the Q/K/V and the DeltaNet input
// projections), or an activation the mixer made (the gated norm's or the output gate's result,
// read by the output projection). The CUDA backend quantises the two by different rules.
enum class MixerInput { Norm, Activation };

// How the mixers compute. Default: the exact f32 reference. The CPU backend's oracle of the
// CUDA backend (cpu_emulate_device_numerics, qwen35moe) hands in its own product, which rounds
// each input and weight where cuda_hybrid.cpp's kernels do, and K and V go through f16 as the
// CUDA KV holds them.
struct MixerNumerics {
  // y = x · Wᵀ over n_tokens rows; empty: ops.h's exact matmul.
  std::function<void(const TensorInfo* w, const float* x, int64_t n_tokens, float* y,
                     MixerInput input)>
      project;
  bool kv_through_f16 = false;
};

// The hybrid model's mixing layers and its recurrent state: one slot per sequence slot, each
// holding every recurrent layer's conv and delta state, plus the number of tokens it covers.
class HybridLayers {
 public:
  HybridLayers(const ModelConfig& config, const WeightTable& weights, MixerNumerics numerics = {});

  // Sizes the state for `slots` sequence slots (zeroed, covering 0 tokens).
  void resize(int32_t slots);
  int32_t slots() const { return static_cast<int32_t>(lengths_.size()); }
  uint64_t bytes() const { return state_.size() * sizeof(float); }
  // The tokens slot's state covers (its sequence's positions [0, length)).
  int64_t length(int32_t slot) const { return lengths_.at(static_cast<size_t>(slot)); }
  // One slot's state as bytes (state_bytes() of them), to snapshot or restore; a restored
  // state covers `length` tokens.
  uint64_t state_bytes() const { return slot_floats_ * sizeof(float); }
  const float* state(int32_t slot) const;
  void restore(int32_t slot, const float* state, int64_t length);
  void reset(int32_t slot);

  // Checks that every sequence continues its slot's state (a start at position 0 resets it);
  // throws UsageError naming the mismatch otherwise, changing nothing. Call before running a
  // step. Until end_step() the slots cover no length: a step that fails half way leaves
  // states nothing may continue (only a new start at position 0).
  void begin_step(std::span<const SequenceSpan> sequences);
  // After the step's last layer: each slot's state now covers its sequences' tokens too.
  void end_step(std::span<const SequenceSpan> sequences);

  // Layer `layer`'s mixer for the batch: xn the normed hidden states [n_tokens][n_embd], out
  // [n_tokens][n_embd] (the residual is the caller's). Full attention writes K and V at kv().
  void run(int64_t layer, const float* xn, int64_t n_tokens,
           std::span<const SequenceSpan> sequences, const int64_t* positions, const int32_t* slots,
           const KvAddress& kv, int64_t kv_token_stride, float* out, ThreadPool& pool);

 private:
  void attention(int64_t layer, const float* xn, int64_t n_tokens, const int64_t* positions,
                 const int32_t* slots, const KvAddress& kv, int64_t kv_token_stride, float* out,
                 ThreadPool& pool);
  void delta_net(int64_t layer, const float* xn, int64_t n_tokens,
                 std::span<const SequenceSpan> sequences, float* out, ThreadPool& pool);
  // y = x · Wᵀ by numerics_ (the exact product when it has none).
  void project(const TensorInfo* w, const float* x, int64_t n_tokens, float* y, MixerInput input,
               ThreadPool& pool) const;
  float* conv_state(int32_t slot, int64_t layer);
  float* delta_state(int32_t slot, int64_t layer);

  struct LayerVectors {
    std::vector<float> q_norm, k_norm;              // full attention
    std::vector<float> conv, dt_bias, a, ssm_norm;  // Gated DeltaNet
  };

  const ModelConfig& config_;
  const WeightTable& weights_;
  MixerNumerics numerics_;
  SectionRope rope_;
  std::vector<LayerVectors> layers_;
  std::vector<int64_t> recurrent_index_;  // per layer: its index among the recurrent ones, or -1
  int64_t slot_floats_ = 0;
  std::vector<float> state_;
  std::vector<int64_t> lengths_;
  // Scratch, grown to the largest batch.
  std::vector<float> qg_, q_, k_, v_, attn_, mixed_, z_, beta_, g_, conv_out_, core_;
};

}  // namespace granule::cpu
