// The llama family's hyper-parameters and weight table, read from GGUF metadata:
// Llama 2/3 (with Llama 3 rope scaling), Mistral, SmolLM2, Qwen2 (QKV bias), Qwen3 (QK-norm),
// and the mixtures of experts: Mixtral (`llama` with experts), Qwen3 MoE (`qwen3moe`) and
// gpt-oss (`gpt-oss`: attention sinks, alternating sliding-window layers, YaRN, MXFP4 experts);
// Gemma 3 (`gemma3`: 5 sliding-window layers to 1 global, a rope base per kind, GeGLU,
// sandwich norms, scaled embeddings) and Gemma 4 (`gemma4`; both in model/gemma_config.cpp);
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

enum class RopeOrdering { Normal, NeoX };  // interleaved pairs (llama) / split halves (qwen)

struct RopeScaling {
  std::string type = "none";  // "none", "linear", "llama3", "yarn"
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

// The feed-forward activation: SwiGLU (silu(gate) * up), gpt-oss's clamped form
// (gate clamped above at 7, up to [-7, 7], gate * sigmoid(1.702 gate) * (up + 1)), or Gemma's
// GeGLU (gelu(gate) * up, gelu's tanh approximation).
enum class FfnActivation { Swiglu, SwigluClamped, GeluTanh };

struct ExpertConfig {
  int64_t n_expert = 0;       // 0: a dense model
  int64_t n_expert_used = 0;  // top-k
  int64_t n_ff_exp = 0;       // one expert's feed-forward width
  int64_t n_ff_shexp = 0;     // the shared expert's width (0: none)
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
  std::string architecture;  // general.architecture: "llama", "qwen2", "qwen3", ...
  std::string name;          // general.name when present
  int64_t n_layer = 0;
  int64_t n_embd = 0;  // hidden size
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;  // key_length (defaults to n_embd / n_head)
  int64_t n_ff = 0;
  int64_t n_vocab = 0;
  int64_t context_length = 0;  // the model's trained context
  float rms_eps = 1e-5f;
  float rope_theta = 10000.0f;
  RopeOrdering rope_ordering = RopeOrdering::Normal;
  RopeScaling rope_scaling;
  bool qkv_bias = false;         // Qwen2
  bool qk_norm = false;          // Qwen3
  bool tied_embeddings = false;  // no output.weight: the output head is token_embd
  uint32_t dominant_type = 0;    // the most common block type among 2-D weights (ggml id)
  ExpertConfig moe;              // n_expert > 0: every layer's FFN is a mixture of experts
  FfnActivation activation = FfnActivation::Swiglu;
  bool attn_sinks = false;        // gpt-oss: a learned per-head logit joins each softmax
  bool attn_output_bias = false;  // gpt-oss: attn_output.bias
  // Sliding-window attention: layers with swa_layers[i] attend to the last `sliding_window`
  // positions only (gpt-oss: every other layer, window 128); empty when no layer slides.
  int64_t sliding_window = 0;
  std::vector<bool> swa_layers;

  // The rotated dimensions of each head on global / sliding-window layers (llama.cpp's
  // rope.dimension_count[_swa]; 0: the whole head): partial rope in Qwen3.5 and Gemma 4, the
  // whole head elsewhere. Read through rope_dims_of(layer).
  int64_t rope_dims = 0;
  int64_t rope_dims_swa = 0;

  // Qwen3.5 (`qwen35`, `qwen35moe`): recurrent_layers[i] marks a Gated DeltaNet layer (no KV);
  // the others are full attention whose Q projection carries a per-head output gate
  // (attn_output_gate: Q and gate interleaved per head, the gate's sigmoid multiplies the
  // attention output), rotated over the first rope_dims of each head only, with the
  // interleaved multi-section rope (rope_sections; text positions rotate every section but a
  // fourth one). The FFN norm is post_attention_norm.
  DeltaNetConfig delta_net;
  std::vector<bool> recurrent_layers;
  bool attn_output_gate = false;
  std::array<int32_t, 4> rope_sections = {0, 0, 0, 0};

  // Gemma (model/gemma_config.cpp); the defaults leave the other families as they are.
  float embedding_scale = 1.0f;   // the token embedding times this (Gemma: sqrt(n_embd))
  float attention_scale = 0.0f;   // softmax scale of Q·K; 0: 1 / sqrt(head_dim)
  bool sandwich_norms = false;    // RMSNorm of the attention and FFN outputs before each residual
  float final_logit_softcap = 0;  // > 0: logits = cap · tanh(logits / cap)
  // > 0: sliding-window layers rotate with this base and no rope scaling (the global layers
  // keep rope_theta and rope_scaling); 0: every layer rotates alike.
  float rope_theta_swa = 0.0f;
  // Gemma 4: the sliding layers' own shapes (0: as the global layers), per-layer FFN widths
  // (empty: n_ff), V RMS-normed without a weight, per-layer embeddings of this width (0: none),
  // and shared KV: layer i attends to the KV of kv_layer[i] (itself, or for the last
  // attention.shared_kv_layers layers the last earlier layer of its kind); empty: own.
  int64_t head_dim_swa = 0;
  int64_t n_head_kv_swa = 0;
  std::vector<int64_t> layer_n_ff;
  bool value_norm = false;
  int64_t n_embd_per_layer = 0;
  std::vector<int64_t> kv_layer;

  bool is_moe() const { return moe.n_expert > 0; }
  bool is_hybrid() const { return !recurrent_layers.empty(); }
  bool layer_recurrent(int64_t layer) const {
    return static_cast<size_t>(layer) < recurrent_layers.size() &&
           recurrent_layers[static_cast<size_t>(layer)];
  }
  // Bytes of one sequence's recurrent state over all recurrent layers (conv + delta, f32).
  int64_t recurrent_state_bytes() const;
  bool layer_slides(int64_t layer) const {
    return sliding_window > 0 && static_cast<size_t>(layer) < swa_layers.size() &&
           swa_layers[static_cast<size_t>(layer)];
  }

  int64_t head_dim_of(int64_t layer) const {
    return head_dim_swa > 0 && layer_slides(layer) ? head_dim_swa : head_dim;
  }
  int64_t n_head_kv_of(int64_t layer) const {
    return n_head_kv_swa > 0 && layer_slides(layer) ? n_head_kv_swa : n_head_kv;
  }
  int64_t kv_dim_of(int64_t layer) const { return n_head_kv_of(layer) * head_dim_of(layer); }
  int64_t n_ff_of(int64_t layer) const {
    return layer_n_ff.empty() ? n_ff : layer_n_ff[static_cast<size_t>(layer)];
  }
  int64_t rope_dims_of(int64_t layer) const {
    const int64_t dims = layer_slides(layer) ? rope_dims_swa : rope_dims;
    return dims > 0 ? dims : head_dim_of(layer);
  }
  // The layer whose KV this layer writes and reads (itself unless the KV is shared).
  int64_t kv_source(int64_t layer) const {
    return kv_layer.empty() ? layer : kv_layer[static_cast<size_t>(layer)];
  }
  // The one notion of a layer's KV: the elements (K then V) it adds to each token's KV record.
  // 0 for a layer that stores none: a recurrent (Gated DeltaNet) layer, or a layer that reads
  // another layer's KV (Gemma 4's shared layers). Everything sized by the KV (its bytes per
  // token, the record's offsets, the fit estimate) sums this.
  int64_t kv_layer_elements(int64_t layer) const {
    if (layer_recurrent(layer) || kv_source(layer) != layer) return 0;
    return 2 * kv_dim_of(layer);
  }
  // KV by layer kind: each slot keeps the layers that see every token (part 0) apart from the
  // sliding-window layers (part 1), each part token-major in its own granule-aligned range, so
  // that the window part's granules behind the window are a contiguous run that can be unmapped
  // as the window slides (memory/kv_space.h). A shared layer is in its source's part.
  static constexpr int kKvParts = 2;
  static constexpr int kKvPartAll = 0;
  static constexpr int kKvPartWindow = 1;
  int kv_part(int64_t layer) const {
    return layer_slides(kv_source(layer)) ? kKvPartWindow : kKvPartAll;
  }
  // Elements of one token's record in a part (0: the part is empty).
  int64_t kv_part_elements(int part) const {
    int64_t elements = 0;
    for (int64_t l = 0; l < n_layer; ++l)
      if (kv_part(l) == part) elements += kv_layer_elements(l);
    return elements;
  }
  // Elements before layer's K in its part's token record (its V follows its K); a shared
  // layer's are its source's.
  int64_t kv_offset_elements(int64_t layer) const {
    const int64_t source = kv_source(layer);
    const int part = kv_part(source);
    int64_t offset = 0;
    for (int64_t l = 0; l < source; ++l)
      if (kv_part(l) == part) offset += kv_layer_elements(l);
    return offset;
  }

  // Bytes of K+V per token over all layers at the given element size (2 for fp16).
  int64_t kv_bytes_per_token(int64_t elem_bytes) const {
    int64_t elements = 0;
    for (int64_t l = 0; l < n_layer; ++l) elements += kv_layer_elements(l);
    return elements * elem_bytes;
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
  const TensorInfo* router = nullptr;       // ffn_gate_inp [n_embd, n_expert]
  const TensorInfo* router_bias = nullptr;  // ffn_gate_inp.bias [n_expert] (gpt-oss)
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
  // Gemma's sandwich norms: the attention output and the FFN output are RMS-normed by these
  // before they join the residual stream.
  const TensorInfo* attn_post_norm = nullptr;
  const TensorInfo* ffn_post_norm = nullptr;
  // Gemma 4: the layer's output scale [1], and its per-layer embedding gate [n_embd, n_pl],
  // projection [n_pl, n_embd] and norm [n_embd].
  const TensorInfo* out_scale = nullptr;
  const TensorInfo* ple_gate = nullptr;
  const TensorInfo* ple_proj = nullptr;
  const TensorInfo* ple_norm = nullptr;
  // Gemma 4's mixture of experts beside its dense FFN (router, gate/up/down_exps above): the
  // router input's per-channel scale ffn_gate_inp.scale [n_embd], each expert's output scale
  // ffn_down_exps.scale [n_expert], the experts' input norm pre_ffw_norm_2 and the output norms
  // of the dense FFN (post_ffw_norm_1) and of the experts (post_ffw_norm_2).
  const TensorInfo* router_in_scale = nullptr;
  const TensorInfo* down_exps_scale = nullptr;
  const TensorInfo* ffn_pre_norm_2 = nullptr;
  const TensorInfo* ffn_post_norm_1 = nullptr;
  const TensorInfo* ffn_post_norm_2 = nullptr;
};

struct WeightTable {
  const TensorInfo* token_embd = nullptr;
  const TensorInfo* output_norm = nullptr;
  const TensorInfo* output = nullptr;      // == token_embd when tied
  const TensorInfo* rope_freqs = nullptr;  // Llama 3 per-frequency divisors, when present
  // Gemma 4's per-layer embeddings: the table [n_pl * n_layer, n_vocab], the projection of
  // the scaled token embedding [n_embd, n_pl * n_layer] and its norm [n_pl].
  const TensorInfo* ple_token_embd = nullptr;
  const TensorInfo* ple_model_proj = nullptr;
  const TensorInfo* ple_proj_norm = nullptr;
  std::vector<LayerWeights> layers;

  // Finds every tensor by its GGUF name (blk.N.attn_q.weight, ...), checks shapes against
  // the config and that every block type is supported; throws naming the tensor.
  static WeightTable from_gguf(const ModelFile& file, const ModelConfig& config);
  uint64_t total_bytes() const;
  uint64_t layer_bytes(size_t layer) const;
};

}  // namespace granule
