// The llama family's hyper-parameters and weight table, read from GGUF metadata:
// Llama 2/3 (with Llama 3 rope scaling), Mistral, SmolLM2, Qwen2 (QKV bias), Qwen3 (QK-norm),
// and the mixtures of experts: Mixtral (`llama` with experts), Qwen3 MoE (`qwen3moe`) and
// gpt-oss (`gpt-oss`: attention sinks, alternating sliding-window layers, YaRN, MXFP4 experts);
// and the Qwen3.5 hybrids (`qwen35`, `qwen35moe`): Gated DeltaNet linear-attention layers with a
// recurrent state among gated full-attention layers.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "granule/gguf.h"

namespace granule {

enum class RopeOrdering { Normal, NeoX };   // interleaved pairs (llama) / split halves (qwen)

struct RopeScaling {
  std::string type = "none";   // "none", "linear", "llama3", "yarn"
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int64_t original_context = 8192;
  // YaRN (gpt-oss): ramp between beta_fast and beta_slow rotations, magnitude scale.
  float yarn_beta_fast = 32.0f;
  float yarn_beta_slow = 1.0f;
  // rope.scaling.attn_factor: a further multiplier of the rotated Q and K (llama.cpp's
  // rope_attn_factor; 1 in every file seen so far).
  float attn_factor = 1.0f;
};

// How the router's logits become the chosen experts' weights (llama.cpp's
// expert_gating_func: 1 softmax, 2 sigmoid, 3 softmax over the chosen k only).
enum class ExpertGating { Softmax, Sigmoid, SoftmaxOfTopK };

// The feed-forward activation: SwiGLU (silu(gate) * up), or gpt-oss's clamped form
// (gate clamped above at 7, up to [-7, 7], gate * sigmoid(1.702 gate) * (up + 1)).
enum class FfnActivation { Swiglu, SwigluClamped };

struct ExpertConfig {
  int64_t n_expert = 0;        // 0: a dense model
  int64_t n_expert_used = 0;   // top-k
  int64_t n_ff_exp = 0;        // one expert's feed-forward width
  int64_t n_ff_shexp = 0;      // the shared expert's width (0: none)
  ExpertGating gating = ExpertGating::Softmax;
  bool normalize_weights = false;  // the chosen k weights divided by their sum
  float weights_scale = 1.0f;      // then multiplied by this
};

// Qwen3.5's Gated DeltaNet (linear attention) layers, as llama.cpp reads them
// (src/models/qwen35.cpp, delta-net-base.cpp): an input projection to conv_channels() (Q, K, V
// side by side), a causal depthwise convolution of conv_kernel taps over time (its last
// conv_kernel - 1 inputs are the conv state), SiLU, L2-normed Q and K, and per value head the
// gated delta rule over a state_size x state_size matrix (the delta state).
struct DeltaNetConfig {
  int64_t conv_kernel = 0;  // ssm.conv_kernel (d_conv)
  int64_t state_size = 0;   // ssm.state_size: a head's key (and value) width
  int64_t n_k_heads = 0;    // ssm.group_count
  int64_t n_v_heads = 0;    // ssm.time_step_rank
  int64_t inner_size = 0;   // ssm.inner_size: n_v_heads * state_size

  int64_t key_dim() const { return n_k_heads * state_size; }
  int64_t value_dim() const { return inner_size; }
  int64_t conv_channels() const { return 2 * key_dim() + value_dim(); }
  // Floats of one layer's recurrent state for one sequence.
  int64_t conv_state_floats() const { return (conv_kernel - 1) * conv_channels(); }
  int64_t delta_state_floats() const { return n_v_heads * state_size * state_size; }
};

struct ModelConfig {
  std::string architecture;   // general.architecture: "llama", "qwen2", "qwen3", ...
  std::string name;           // general.name when present
  int64_t n_layer = 0;
  int64_t n_embd = 0;         // hidden size
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;       // key_length (defaults to n_embd / n_head)
  int64_t n_ff = 0;
  int64_t n_vocab = 0;
  int64_t context_length = 0; // the model's trained context
  float rms_eps = 1e-5f;
  float rope_theta = 10000.0f;
  RopeOrdering rope_ordering = RopeOrdering::Normal;
  RopeScaling rope_scaling;
  bool qkv_bias = false;      // Qwen2
  bool qk_norm = false;       // Qwen3
  bool tied_embeddings = false;  // no output.weight: the output head is token_embd
  uint32_t dominant_type = 0;    // the most common block type among 2-D weights (ggml id)
  ExpertConfig moe;              // n_expert > 0: every layer's FFN is a mixture of experts
  FfnActivation activation = FfnActivation::Swiglu;
  bool attn_sinks = false;       // gpt-oss: a learned per-head logit joins each softmax
  bool attn_output_bias = false; // gpt-oss: attn_output.bias
  // Sliding-window attention: layers with swa_layers[i] attend to the last `sliding_window`
  // positions only (gpt-oss: every other layer, window 128); empty when no layer slides.
  int64_t sliding_window = 0;
  std::vector<bool> swa_layers;

  // Qwen3.5 (`qwen35`, `qwen35moe`): recurrent_layers[i] marks a Gated DeltaNet layer (no KV);
  // the others are full attention whose Q projection carries a per-head output gate
  // (attn_output_gate: Q and gate interleaved per head, the gate's sigmoid multiplies the
  // attention output), rotated over the first rope_dims of each head only, with the
  // interleaved multi-section rope (rope_sections; text positions rotate every section but a
  // fourth one). The FFN norm is post_attention_norm.
  DeltaNetConfig delta_net;
  std::vector<bool> recurrent_layers;
  bool attn_output_gate = false;
  int64_t rope_dims = 0;  // rope.dimension_count (0: head_dim)
  std::array<int32_t, 4> rope_sections = {0, 0, 0, 0};

  bool is_moe() const { return moe.n_expert > 0; }
  bool is_hybrid() const { return !recurrent_layers.empty(); }
  bool layer_recurrent(int64_t layer) const {
    return static_cast<size_t>(layer) < recurrent_layers.size() &&
           recurrent_layers[static_cast<size_t>(layer)];
  }
  // Layers that keep KV (every layer but the recurrent ones), and a layer's index among them.
  int64_t n_kv_layers() const;
  int64_t kv_layer_index(int64_t layer) const;
  // Bytes of one sequence's recurrent state over all recurrent layers (conv + delta, f32).
  int64_t recurrent_state_bytes() const;
  bool layer_slides(int64_t layer) const {
    return sliding_window > 0 && static_cast<size_t>(layer) < swa_layers.size() &&
           swa_layers[static_cast<size_t>(layer)];
  }

  // Bytes of K+V per token over all layers at the given element size (2 for fp16).
  int64_t kv_bytes_per_token(int64_t elem_bytes) const {
    return n_kv_layers() * 2 * n_head_kv * head_dim * elem_bytes;
  }

  // Reads and checks the config; throws UnsupportedError for an architecture outside the
  // llama family and FormatError for missing or inconsistent keys.
  static ModelConfig from_gguf(const ModelFile& file);
  // Whether from_gguf reads this general.architecture (the Hub's search shows it).
  static bool architecture_supported(std::string_view architecture);
};

// One layer's weight tensors (pointers into the mapped file; bias/norm members may be null).
struct LayerWeights {
  const TensorInfo* attn_norm = nullptr;
  const TensorInfo* wq = nullptr;
  const TensorInfo* wk = nullptr;
  const TensorInfo* wv = nullptr;
  const TensorInfo* wo = nullptr;
  const TensorInfo* bq = nullptr;
  const TensorInfo* bk = nullptr;
  const TensorInfo* bv = nullptr;
  const TensorInfo* q_norm = nullptr;
  const TensorInfo* k_norm = nullptr;
  const TensorInfo* ffn_norm = nullptr;
  const TensorInfo* w_gate = nullptr;
  const TensorInfo* w_up = nullptr;
  const TensorInfo* w_down = nullptr;
  // Attention extras (gpt-oss): output bias, per-head sink logits.
  const TensorInfo* bo = nullptr;
  const TensorInfo* attn_sinks = nullptr;
  // Qwen3.5 Gated DeltaNet layers (wq..wo stay null; ffn_norm is post_attention_norm).
  const TensorInfo* ssm_in = nullptr;      // attn_qkv [n_embd, conv_channels]
  const TensorInfo* ssm_z = nullptr;       // attn_gate [n_embd, value_dim]
  const TensorInfo* ssm_conv1d = nullptr;  // [conv_kernel, conv_channels]
  const TensorInfo* ssm_dt = nullptr;      // ssm_dt.bias [n_v_heads]
  const TensorInfo* ssm_a = nullptr;       // [n_v_heads]: -exp(A_log)
  const TensorInfo* ssm_beta = nullptr;    // [n_embd, n_v_heads]
  const TensorInfo* ssm_alpha = nullptr;   // [n_embd, n_v_heads]
  const TensorInfo* ssm_norm = nullptr;    // [state_size]
  const TensorInfo* ssm_out = nullptr;     // [value_dim, n_embd]
  // Mixture of experts (w_gate/w_up/w_down stay null). 3-D tensors in GGUF order:
  // gate/up [n_embd, n_ff_exp, n_expert], down [n_ff_exp, n_embd, n_expert]; expert e's
  // matrix is the e-th contiguous slab of size_bytes / n_expert.
  const TensorInfo* router = nullptr;         // ffn_gate_inp [n_embd, n_expert]
  const TensorInfo* router_bias = nullptr;    // ffn_gate_inp.bias [n_expert] (gpt-oss)
  const TensorInfo* gate_exps = nullptr;
  const TensorInfo* up_exps = nullptr;
  const TensorInfo* down_exps = nullptr;
  const TensorInfo* gate_exps_bias = nullptr;  // [n_ff_exp, n_expert] (gpt-oss)
  const TensorInfo* up_exps_bias = nullptr;    // [n_ff_exp, n_expert]
  const TensorInfo* down_exps_bias = nullptr;  // [n_embd, n_expert]
  // A shared expert every token takes (Qwen2-MoE style; absent in Qwen3 MoE and gpt-oss),
  // with its optional sigmoid gate ffn_gate_inp_shexp [n_embd].
  const TensorInfo* gate_shexp = nullptr;
  const TensorInfo* up_shexp = nullptr;
  const TensorInfo* down_shexp = nullptr;
  const TensorInfo* shexp_gate = nullptr;
};

struct WeightTable {
  const TensorInfo* token_embd = nullptr;
  const TensorInfo* output_norm = nullptr;
  const TensorInfo* output = nullptr;   // == token_embd when tied
  const TensorInfo* rope_freqs = nullptr;   // Llama 3 per-frequency divisors, when present
  std::vector<LayerWeights> layers;

  // Finds every tensor by its GGUF name (blk.N.attn_q.weight, ...), checks shapes against
  // the config and that every block type is supported; throws naming the tensor.
  static WeightTable from_gguf(const ModelFile& file, const ModelConfig& config);
  uint64_t total_bytes() const;
  uint64_t layer_bytes(size_t layer) const;
};

}  // namespace granule
