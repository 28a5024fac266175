// The CPU reference's mixture-of-experts feed-forward: router, top-k gating and the chosen
// experts' SwiGLU FFNs (contract of issue 36; llama.cpp's build_moe_ffn is the arbiter), plus
// the shared expert where a layer has one. Reads only the chosen experts' slabs.
#pragma once
#include <cstdint>
#include <vector>

#include "backends/cpu/int8_matmul.h"
#include "granule/model_config.h"

namespace granule::cpu {

class FastMatmul;
class ThreadPool;

// How one layer's expert FFN runs for a batch of tokens.
struct MoeFfnOptions {
  // Round as the CUDA expert kernels do (BackendOptions::cpu_emulate_device_numerics): the
  // router in f32 on unrounded input; a quantised expert matrix (anything but F32/F16/BF16)
  // reads its input through int8 blocks of 32 (gate/up: MultiplyByInverse, down: Divide).
  bool emulate_device = false;
  // The router's input rows when they differ from the experts' (Gemma 4); null: the same xn.
  const float* router_input = nullptr;
  // The fast path (not with emulate_device): the experts it holds int8 copies of multiply
  // their inputs quantised to int8 blocks (fast_matmul.h); null: every expert exact.
  const FastMatmul* fast = nullptr;
};

// One token's routing: the chosen experts in top-k order and their final weights.
struct ExpertRoute {
  std::vector<int32_t> experts;
  std::vector<float> weights;
};

// Routing of one token from its router logits (n_expert values, router bias already added):
// gating, top-k (descending, ties to the lower index), normalisation and scale of `moe`.
void route_token(const ExpertConfig& moe, float* logits, int32_t* experts, float* weights);

// One choice's hidden vector: gate and up (n values each, changed in place) get the expert's
// biases where given (null: none), then out = act(gate, up) by `activation` (SwiGLU, gpt-oss's
// clamped SwiGLU or GeGLU). MoeFfn and HostExperts both run it.
void expert_activation(FfnActivation activation, float* gate, float* up, const float* gate_bias,
                       const float* up_bias, float* out, int64_t n);

// The expert FFN of one layer: out[t] = Σ_k w_k · down_e(act(gate_e · x_t, up_e · x_t)) (+ the
// shared expert) for the n_tokens normed inputs xn[t * n_embd ...], accumulated in f32 in top-k
// order. routed_counts (n_expert entries, may be null) gains one per (token, chosen expert).
class MoeFfn {
 public:
  MoeFfn(const ModelConfig& config, const LayerWeights& layer);

  void run(const float* xn, int64_t n_tokens, float* out, ThreadPool& pool,
           const MoeFfnOptions& options, uint32_t* routed_counts);

 private:
  void run_chunk(const float* xn, int64_t n_tokens, float* out, ThreadPool& pool,
                 const MoeFfnOptions& options, uint32_t* routed_counts);

  const ModelConfig& config_;
  const LayerWeights& layer_;
  // The small tensors as f32 (empty when absent).
  std::vector<float> router_bias_, gate_bias_, up_bias_, down_bias_, shexp_gate_;
  std::vector<float> down_scale_;  // Gemma 4: each expert's output scale
  // Scratch, grown to the largest chunk.
  std::vector<float> logits_, rounded_norm_, rounded_inverse_;
  std::vector<int32_t> chosen_;
  std::vector<float> chosen_weight_;
  std::vector<int32_t> pair_token_, pair_of_choice_;
  std::vector<int64_t> expert_first_, expert_count_, fill_;
  std::vector<int32_t> active_;  // the experts chosen at least once in the chunk
  std::vector<float> gathered_gate_in_, gathered_up_in_, gate_, up_, hidden_, down_;
  std::vector<ActivationBlock> gate_in_q_, hidden_q_;  // the fast path's int8 inputs
  std::vector<float> shexp_gate_out_, shexp_up_out_, shexp_down_out_;
};

}  // namespace granule::cpu
