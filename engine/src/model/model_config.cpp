// ModelConfig and WeightTable for the llama family, read and checked from GGUF metadata and
// the tensor table, with errors that name the key or tensor at fault.
#include "granule/model_config.h"

#include <algorithm>
#include <array>
#include <map>

#include "granule/error.h"
#include "granule/log.h"
#include "granule/tensor_type.h"
#include "model/gemma_config.h"

namespace granule {
namespace {

constexpr std::array<std::string_view, 10> kSupportedArchitectures = {
    "llama",   "mistral", "qwen2",  "qwen3",  "qwen3moe",
    "gpt-oss", "gemma3",  "gemma4", "qwen35", "qwen35moe"};

bool is_qwen35(const std::string& arch) { return arch == "qwen35" || arch == "qwen35moe"; }

std::string file_label(const ModelFile& file) { return file.path().filename().string(); }

int64_t require_int(const ModelFile& file, const std::string& key) {
  auto value = file.get_int(key);
  if (!value) throw FormatError(file_label(file) + ": missing metadata key " + key);
  if (*value <= 0) {
    throw FormatError(file_label(file) + ": metadata key " + key + " must be positive, is " +
                      std::to_string(*value));
  }
  return *value;
}

int64_t optional_int(const ModelFile& file, const std::string& key, int64_t fallback) {
  auto value = file.get_int(key);
  return value ? *value : fallback;
}

float optional_float(const ModelFile& file, const std::string& key, float fallback) {
  auto value = file.get_float(key);
  return value ? static_cast<float>(*value) : fallback;
}

std::string supported_list() {
  std::string out;
  for (auto a : kSupportedArchitectures) {
    if (!out.empty()) out += ", ";
    out += a;
  }
  return out;
}

// gpt-oss's attention, as llama.cpp reads it (src/models/openai-moe.cpp, llama-hparams.cpp,
// llama-context.cpp): NeoX rotation, YaRN, learned sinks, an output bias, and sliding-window
// layers — `sliding_window_pattern` as a per-layer bool array or a period n (layer i slides
// when i % n < n - 1; gpt-oss's default period 2 makes the even layers slide).
void read_attention_keys(const ModelFile& file, ModelConfig& c) {
  const std::string a = c.architecture + ".";
  const bool gpt_oss = c.architecture == "gpt-oss";

  RopeScaling& s = c.rope_scaling;
  if (s.type == "yarn") {
    // llama.cpp's default original context is the trained one; the beta keys are not read
    // for gpt-oss (its 32 / 1 defaults apply), so they are not read here either.
    s.original_context =
        optional_int(file, a + "rope.scaling.original_context_length", c.context_length);
    s.attn_factor = optional_float(file, a + "rope.scaling.attn_factor", 1.0f);
    if (s.factor <= 0 || s.original_context <= 0) {
      throw FormatError(file_label(file) +
                        ": yarn rope scaling needs a positive factor and original context length");
    }
  }

  c.attn_sinks = file.find_tensor("blk.0.attn_sinks.weight") != nullptr;
  c.attn_output_bias = file.find_tensor("blk.0.attn_output.bias") != nullptr;

  const int64_t window = optional_int(file, a + "attention.sliding_window", 0);
  if (gpt_oss && window <= 0) {
    throw FormatError(file_label(file) + ": missing or non-positive metadata key " + a +
                      "attention.sliding_window");
  }
  if (window <= 0) return;
  // Only gpt-oss is known to slide here; other families' windows (Mistral v0.1's 4096 on
  // every layer) keep today's full attention, as before.
  if (!gpt_oss) return;
  if (auto base_swa = file.get_float(a + "rope.freq_base_swa");
      base_swa && static_cast<float>(*base_swa) != c.rope_theta) {
    throw UnsupportedError(file_label(file) + ": a separate rope base for sliding-window layers (" +
                           a + "rope.freq_base_swa) is not supported");
  }
  c.sliding_window = window;
  c.swa_layers.assign(static_cast<size_t>(c.n_layer), false);
  const GgufValue* pattern = file.find(a + "attention.sliding_window_pattern");
  if (pattern && pattern->type == GgufType::ARRAY) {
    if (pattern->array_size() != static_cast<size_t>(c.n_layer) ||
        (pattern->array_type != GgufType::BOOL && pattern->ints.size() != pattern->array_size())) {
      throw FormatError(file_label(file) + ": " + a +
                        "attention.sliding_window_pattern must hold one bool per layer");
    }
    for (size_t i = 0; i < c.swa_layers.size(); ++i) c.swa_layers[i] = pattern->ints[i] != 0;
    return;
  }
  const int64_t period = pattern ? pattern->as_int() : 2;
  if (period < 0) {
    throw FormatError(file_label(file) + ": " + a +
                      "attention.sliding_window_pattern must not be negative");
  }
  for (int64_t i = 0; i < c.n_layer; ++i) {
    c.swa_layers[static_cast<size_t>(i)] = period == 0 || i % period < period - 1;
  }
}

// Rope over split halves (llama.cpp's LLAMA_ROPE_TYPE_NEOX); llama and Mistral GGUFs carry Q/K
// permuted by the converter into interleaved pairs.
bool neox_rope(const std::string& arch) {
  return arch == "qwen2" || arch == "qwen3" || arch == "qwen3moe" || arch == "gpt-oss" ||
         is_qwen35(arch);
}

// Architectures whose every layer is a mixture of experts; `llama` is one when it has experts
// (Mixtral).
bool is_moe_architecture(const ModelFile& file, const std::string& arch) {
  return arch == "qwen3moe" || arch == "gpt-oss" || arch == "qwen35moe" ||
         (arch == "llama" && optional_int(file, arch + ".expert_count", 0) > 0);
}

// The router and expert hyper-parameters, as llama.cpp's loader and graph take them
// (src/models/{llama,qwen3moe,openai-moe}.cpp, build_moe_ffn in src/llama-graph.cpp). The
// gating, the normalisation and the scale are fixed per architecture there: the files'
// expert_gating_func / expert_weights_norm / expert_weights_scale keys are not read for these
// three, so they are not read here either (a file that sets them runs as llama.cpp runs it).
//   llama (Mixtral): softmax, top-k renormalised; experts FFN width = feed_forward_length
//   qwen3moe:        softmax, top-k renormalised; expert_feed_forward_length
//                    (absent: feed_forward_length / expert_used_count)
//   gpt-oss:         softmax over the top-k logits, router and expert biases, clamped SwiGLU
void read_expert_config(const ModelFile& file, ModelConfig& c) {
  const std::string a = c.architecture + ".";
  if (!is_moe_architecture(file, c.architecture)) {
    if (optional_int(file, a + "expert_count", 0) > 0) {
      throw UnsupportedError(file_label(file) + ": architecture '" + c.architecture +
                             "' with experts is not supported");
    }
    return;
  }
  ExpertConfig& m = c.moe;
  m.n_expert = require_int(file, a + "expert_count");
  m.n_expert_used = require_int(file, a + "expert_used_count");
  if (m.n_expert_used > m.n_expert) {
    throw FormatError(file_label(file) + ": expert_used_count " + std::to_string(m.n_expert_used) +
                      " is more than expert_count " + std::to_string(m.n_expert));
  }
  if (c.architecture == "llama") {
    if (c.n_ff <= 0)
      throw FormatError(file_label(file) + ": missing metadata key " + a + "feed_forward_length");
    m.n_ff_exp = c.n_ff;
    m.gating = ExpertGating::Softmax;
    m.normalize_weights = true;
  } else if (c.architecture == "qwen3moe" || c.architecture == "qwen35moe") {
    // qwen35moe may give the experts' width per layer (llama.cpp's get_key_or_arr): one width
    // for every layer is what the FFN here runs.
    if (const GgufValue* v = file.find(a + "expert_feed_forward_length");
        v && v->type == GgufType::ARRAY) {
      if (v->ints.empty() || std::any_of(v->ints.begin(), v->ints.end(),
                                         [&](int64_t w) { return w != v->ints.front(); })) {
        throw UnsupportedError(file_label(file) + ": " + a +
                               "expert_feed_forward_length differs between layers");
      }
      m.n_ff_exp = v->ints.front();
    } else {
      m.n_ff_exp = optional_int(file, a + "expert_feed_forward_length", 0);
    }
    if (m.n_ff_exp == 0) {
      if (c.n_ff <= 0) {
        throw FormatError(file_label(file) + ": missing metadata key " + a +
                          "expert_feed_forward_length");
      }
      m.n_ff_exp = c.n_ff / m.n_expert_used;
    }
    m.gating = ExpertGating::Softmax;
    m.normalize_weights = true;
  } else {  // gpt-oss
    m.n_ff_exp = require_int(file, a + "expert_feed_forward_length");
    m.gating = ExpertGating::SoftmaxOfTopK;
    m.normalize_weights = false;
    c.activation = FfnActivation::SwigluClamped;
  }
  if (m.n_ff_exp <= 0) {
    throw FormatError(file_label(file) + ": expert feed-forward width " +
                      std::to_string(m.n_ff_exp) + " must be positive");
  }
  m.weights_scale = 1.0f;
  // Only qwen35moe has a shared expert (required there, sigmoid-gated by ffn_gate_inp_shexp):
  // expert_shared_feed_forward_length, else feed_forward_length.
  m.n_ff_shexp = 0;
  if (c.architecture == "qwen35moe") {
    m.n_ff_shexp = optional_int(file, a + "expert_shared_feed_forward_length", c.n_ff);
    if (m.n_ff_shexp <= 0) {
      throw FormatError(file_label(file) + ": missing metadata key " + a +
                        "expert_shared_feed_forward_length");
    }
  }
  // The dense width is only a hint for MoE models; the scratch of a dense FFN is not used.
  if (c.n_ff <= 0) c.n_ff = m.n_ff_exp;
}

// Qwen3.5's hybrid layout, as llama.cpp's qwen35 / qwen35moe loaders read it: the Gated
// DeltaNet sizes (ssm.*), which layers are recurrent (attention.recurrent_layers, a bool per
// layer, else every full_attention_interval-th layer (default 4) is full attention), the
// multi-section rope (rope.dimension_sections, required) over the first rope.dimension_count
// dimensions, and nextn_predict_layers: multi-token-prediction blocks after the trunk, which
// the main pass does not run (they are not read here).
void read_qwen35_keys(const ModelFile& file, ModelConfig& c) {
  const std::string a = c.architecture + ".";
  const int64_t nextn = optional_int(file, a + "nextn_predict_layers", 0);
  const int64_t n_layer_all = c.n_layer;
  if (nextn < 0 || nextn >= n_layer_all) {
    throw FormatError(file_label(file) + ": " + a + "nextn_predict_layers " +
                      std::to_string(nextn) + " leaves no trunk layers");
  }
  c.n_layer = n_layer_all - nextn;

  DeltaNetConfig& d = c.delta_net;
  d.conv_kernel = require_int(file, a + "ssm.conv_kernel");
  d.inner_size = require_int(file, a + "ssm.inner_size");
  d.state_size = require_int(file, a + "ssm.state_size");
  d.n_v_heads = require_int(file, a + "ssm.time_step_rank");
  d.n_k_heads = require_int(file, a + "ssm.group_count");
  if (d.inner_size != d.n_v_heads * d.state_size) {
    throw FormatError(file_label(file) + ": ssm.inner_size " + std::to_string(d.inner_size) +
                      " is not ssm.time_step_rank x ssm.state_size (value heads as wide as keys)");
  }
  if (d.n_v_heads % d.n_k_heads != 0) {
    throw FormatError(file_label(file) + ": ssm.time_step_rank " + std::to_string(d.n_v_heads) +
                      " is not a multiple of ssm.group_count " + std::to_string(d.n_k_heads));
  }
  if (d.conv_kernel < 2) {
    throw FormatError(file_label(file) + ": ssm.conv_kernel must be at least 2");
  }

  c.recurrent_layers.assign(static_cast<size_t>(c.n_layer), false);
  const GgufValue* pattern = file.find(a + "attention.recurrent_layers");
  if (pattern && pattern->type == GgufType::ARRAY) {
    if (pattern->array_size() != static_cast<size_t>(n_layer_all) ||
        pattern->ints.size() != pattern->array_size()) {
      throw FormatError(file_label(file) + ": " + a +
                        "attention.recurrent_layers must hold one bool per layer");
    }
    for (size_t i = 0; i < c.recurrent_layers.size(); ++i)
      c.recurrent_layers[i] = pattern->ints[i] != 0;
  } else {
    const int64_t interval = optional_int(file, a + "full_attention_interval", 4);
    if (interval <= 0) {
      throw FormatError(file_label(file) + ": " + a + "full_attention_interval must be positive");
    }
    for (int64_t i = 0; i < c.n_layer; ++i)
      c.recurrent_layers[static_cast<size_t>(i)] = (i + 1) % interval != 0;
  }

  c.attn_output_gate = true;
  const GgufValue* sections = file.find(a + "rope.dimension_sections");
  if (!sections || sections->type != GgufType::ARRAY || sections->ints.size() < 4) {
    throw FormatError(file_label(file) + ": missing metadata key " + a +
                      "rope.dimension_sections (4 integers)");
  }
  int64_t total = 0;
  for (size_t i = 0; i < 4; ++i) {
    if (sections->ints[i] < 0) {
      throw FormatError(file_label(file) + ": " + a + "rope.dimension_sections is negative");
    }
    c.rope_sections[i] = static_cast<int32_t>(sections->ints[i]);
    total += sections->ints[i];
  }
  if (c.rope_dims <= 0 || c.rope_dims > c.head_dim || c.rope_dims % 2 != 0) {
    throw FormatError(file_label(file) + ": rope.dimension_count " + std::to_string(c.rope_dims) +
                      " must be even and at most the head dimension " + std::to_string(c.head_dim));
  }
  if (total <= 0 || total > c.rope_dims / 2) {
    throw FormatError(file_label(file) + ": rope.dimension_sections must sum to between 1 and " +
                      std::to_string(c.rope_dims / 2) + " pairs");
  }
}

}  // namespace

int64_t ModelConfig::recurrent_state_bytes() const {
  const int64_t n = std::count(recurrent_layers.begin(), recurrent_layers.end(), true);
  return n * (delta_net.conv_state_floats() + delta_net.delta_state_floats()) *
         static_cast<int64_t>(sizeof(float));
}

ModelConfig ModelConfig::from_gguf(const ModelFile& file) {
  ModelConfig c;
  auto arch = file.get_string("general.architecture");
  if (!arch) throw FormatError(file_label(file) + ": missing metadata key general.architecture");
  c.architecture = *arch;
  if (std::find(kSupportedArchitectures.begin(), kSupportedArchitectures.end(), c.architecture) ==
      kSupportedArchitectures.end()) {
    throw UnsupportedError(file_label(file) + ": unsupported architecture '" + c.architecture +
                           "' (supported: " + supported_list() + ")");
  }
  c.name = file.get_string("general.name").value_or("");
  if (c.architecture == "gemma4") {  // sizes by layer kind: its own reader
    read_gemma4_config(file, c);
    return c;
  }
  const std::string a = c.architecture + ".";

  c.n_layer = require_int(file, a + "block_count");
  c.n_embd = require_int(file, a + "embedding_length");
  // A mixture of experts may leave out the dense width (llama.cpp reads it as optional).
  c.n_ff = is_moe_architecture(file, c.architecture)
               ? optional_int(file, a + "feed_forward_length", 0)
               : require_int(file, a + "feed_forward_length");
  c.n_head = require_int(file, a + "attention.head_count");
  c.n_head_kv = optional_int(file, a + "attention.head_count_kv", c.n_head);
  c.context_length = optional_int(file, a + "context_length", 2048);
  c.head_dim = optional_int(file, a + "attention.key_length", 0);
  if (c.head_dim == 0) {
    if (c.n_embd % c.n_head != 0) {
      throw FormatError(file_label(file) + ": embedding_length " + std::to_string(c.n_embd) +
                        " is not a multiple of head_count " + std::to_string(c.n_head));
    }
    c.head_dim = c.n_embd / c.n_head;
  }
  const int64_t value_length = optional_int(file, a + "attention.value_length", c.head_dim);
  if (value_length != c.head_dim) {
    throw UnsupportedError(file_label(file) + ": attention.value_length " +
                           std::to_string(value_length) + " differs from key_length " +
                           std::to_string(c.head_dim));
  }
  if (c.n_head_kv <= 0 || c.n_head % c.n_head_kv != 0) {
    throw FormatError(file_label(file) + ": head_count " + std::to_string(c.n_head) +
                      " is not a multiple of head_count_kv " + std::to_string(c.n_head_kv));
  }
  if (c.head_dim % 2 != 0) {
    throw FormatError(file_label(file) + ": head dimension " + std::to_string(c.head_dim) +
                      " is odd; rope needs pairs");
  }
  const int64_t rope_dims = optional_int(file, a + "rope.dimension_count", c.head_dim);
  c.rope_dims = rope_dims;
  if (is_qwen35(c.architecture)) {
    read_qwen35_keys(file, c);
  } else if (rope_dims != c.head_dim) {
    throw UnsupportedError(file_label(file) + ": partial rotary embeddings (rope.dimension_count " +
                           std::to_string(rope_dims) + " of head dimension " +
                           std::to_string(c.head_dim) + ") are not supported");
  }
  c.rms_eps = optional_float(file, a + "attention.layer_norm_rms_epsilon", 1e-5f);
  c.rope_theta = optional_float(file, a + "rope.freq_base", 10000.0f);
  // Llama and Mistral GGUFs carry Q/K permuted by the converter into interleaved pairs;
  // Qwen keeps the Hugging Face split-halves rotation.
  c.rope_ordering = neox_rope(c.architecture) ? RopeOrdering::NeoX : RopeOrdering::Normal;

  // Rope scaling: explicit keys, and Llama 3's per-frequency factors in rope_freqs.weight.
  auto scaling_type = file.get_string(a + "rope.scaling.type");
  RopeScaling& s = c.rope_scaling;
  s.factor = optional_float(file, a + "rope.scaling.factor", 1.0f);
  s.original_context = optional_int(file, a + "rope.scaling.original_context_length", 8192);
  s.low_freq_factor = optional_float(file, a + "rope.scaling.low_freq_factor", 1.0f);
  s.high_freq_factor = optional_float(file, a + "rope.scaling.high_freq_factor", 4.0f);
  if (scaling_type && *scaling_type != "none") {
    if (*scaling_type != "linear" && *scaling_type != "llama3" && *scaling_type != "yarn") {
      throw UnsupportedError(file_label(file) + ": rope scaling '" + *scaling_type +
                             "' is not supported (supported: none, linear, llama3, yarn)");
    }
    s.type = *scaling_type;
  }
  if (file.find_tensor("rope_freqs.weight")) s.type = "llama3";
  if (s.type == "linear" && s.factor <= 0) {
    throw FormatError(file_label(file) + ": rope.scaling.factor must be positive");
  }

  if (is_qwen35(c.architecture) && s.type != "none") {
    throw UnsupportedError(file_label(file) + ": rope scaling '" + s.type +
                           "' is not supported for " + c.architecture);
  }

  read_expert_config(file, c);

  c.qkv_bias = file.find_tensor("blk.0.attn_q.bias") != nullptr;
  c.qk_norm = file.find_tensor("blk.0.attn_q_norm.weight") != nullptr;
  c.tied_embeddings = file.find_tensor("output.weight") == nullptr;
  if (is_gemma_architecture(c.architecture))
    read_gemma_config(file, c);
  else
    read_attention_keys(file, c);

  const TensorInfo* embd = file.find_tensor("token_embd.weight");
  if (!embd) throw FormatError(file_label(file) + ": missing tensor token_embd.weight");
  if (embd->dims.size() != 2 || embd->dims[0] != c.n_embd) {
    throw FormatError(file_label(file) +
                      ": token_embd.weight has the wrong shape for embedding_length " +
                      std::to_string(c.n_embd));
  }
  c.n_vocab = embd->dims[1];

  std::map<uint32_t, int64_t> type_counts;
  for (const auto& t : file.tensors()) {
    // Matrices, the experts' 3-D tensors too (a gpt-oss file is MXFP4 for its experts).
    if (t.dims.size() >= 2) ++type_counts[t.ggml_type];
  }
  int64_t best = -1;
  for (auto [type, count] : type_counts) {
    if (count > best) {
      best = count;
      c.dominant_type = type;
    }
  }
  return c;
}

namespace {

std::string dims_text(const std::vector<int64_t>& dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + std::to_string(dims[i]);
  return out + "]";
}

// Finds a tensor, checks its shape and block type; nullptr only when optional and absent.
const TensorInfo* find_checked(const ModelFile& file, const std::string& name,
                               const std::vector<int64_t>& dims, bool required) {
  const TensorInfo* t = file.find_tensor(name);
  if (!t) {
    if (required) throw FormatError(file_label(file) + ": missing tensor " + name);
    return nullptr;
  }
  auto info = tensor_type_info(t->ggml_type);
  if (!info) {
    throw UnsupportedError(file_label(file) + ": tensor " + name + " has block type " +
                           tensor_type_name(t->ggml_type) +
                           ", which is not supported (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, "
                           "Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4)");
  }
  if (t->dims != dims) {
    throw FormatError(file_label(file) + ": tensor " + name + " has shape " + dims_text(t->dims) +
                      ", expected " + dims_text(dims));
  }
  if (dims[0] % info->block_elems != 0) {
    throw FormatError(file_label(file) + ": tensor " + name + " rows of " +
                      std::to_string(dims[0]) + " are not a multiple of the " +
                      std::string(info->name) + " block");
  }
  return t;
}

void find_dense_ffn_tensors(const ModelFile& file, const ModelConfig& c, const std::string& p,
                            LayerWeights& l) {
  l.ffn_norm = find_checked(file, p + "ffn_norm.weight", {c.n_embd}, true);
  l.w_gate = find_checked(file, p + "ffn_gate.weight", {c.n_embd, c.n_ff}, true);
  l.w_up = find_checked(file, p + "ffn_up.weight", {c.n_embd, c.n_ff}, true);
  l.w_down = find_checked(file, p + "ffn_down.weight", {c.n_ff, c.n_embd}, true);
}

// A layer's router and experts: 3-D tensors [cols, rows, n_expert], expert e the e-th slab.
// gpt-oss names its FFN norm post_attention_norm (llama.cpp's LLM_TENSOR_ATTN_POST_NORM, applied
// where the others apply ffn_norm) and has biases on the router and on every expert matrix.
void find_expert_tensors(const ModelFile& file, const ModelConfig& c, const std::string& p,
                         LayerWeights& l) {
  const ExpertConfig& m = c.moe;
  const bool gpt_oss = c.architecture == "gpt-oss";
  const bool post_norm = gpt_oss || c.architecture == "qwen35moe";
  l.ffn_norm = find_checked(
      file, p + (post_norm ? "post_attention_norm.weight" : "ffn_norm.weight"), {c.n_embd}, true);
  l.router = find_checked(file, p + "ffn_gate_inp.weight", {c.n_embd, m.n_expert}, true);
  l.gate_exps =
      find_checked(file, p + "ffn_gate_exps.weight", {c.n_embd, m.n_ff_exp, m.n_expert}, true);
  l.up_exps =
      find_checked(file, p + "ffn_up_exps.weight", {c.n_embd, m.n_ff_exp, m.n_expert}, true);
  l.down_exps =
      find_checked(file, p + "ffn_down_exps.weight", {m.n_ff_exp, c.n_embd, m.n_expert}, true);
  l.router_bias = find_checked(file, p + "ffn_gate_inp.bias", {m.n_expert}, gpt_oss);
  l.gate_exps_bias =
      find_checked(file, p + "ffn_gate_exps.bias", {m.n_ff_exp, m.n_expert}, gpt_oss);
  l.up_exps_bias = find_checked(file, p + "ffn_up_exps.bias", {m.n_ff_exp, m.n_expert}, gpt_oss);
  l.down_exps_bias = find_checked(file, p + "ffn_down_exps.bias", {c.n_embd, m.n_expert}, gpt_oss);
  if (!gpt_oss) {  // llama.cpp's llama and qwen3moe graphs take no biases: a file with them
    for (const TensorInfo* t : {l.router_bias, l.gate_exps_bias, l.up_exps_bias, l.down_exps_bias})
      if (t)
        throw UnsupportedError(file_label(file) + ": tensor " + t->name +
                               " is not supported for architecture " + c.architecture);
  }
  // The router is read in f32 on every backend; a block-quantised router is refused so that
  // routing never depends on activation rounding.
  const auto router_type = static_cast<TensorType>(l.router->ggml_type);
  if (router_type != TensorType::F32 && router_type != TensorType::F16 &&
      router_type != TensorType::BF16 && router_type != TensorType::Q8_0) {
    throw UnsupportedError(file_label(file) + ": tensor " + l.router->name + " has block type " +
                           tensor_type_name(l.router->ggml_type) +
                           "; expert routers are supported in F32, F16, BF16 and Q8_0");
  }
  for (const TensorInfo* t : {l.router_bias, l.gate_exps_bias, l.up_exps_bias, l.down_exps_bias}) {
    if (t && t->ggml_type != static_cast<uint32_t>(TensorType::F32)) {
      throw UnsupportedError(file_label(file) + ": bias " + t->name + " must be F32, is " +
                             tensor_type_name(t->ggml_type));
    }
  }
}

// A Qwen3.5 layer as llama.cpp's qwen35 / qwen35moe loaders name it: attn_norm, then either a
// Gated DeltaNet block (attn_qkv, attn_gate, ssm_*) or full attention whose attn_q holds Q and
// its gate per head (2 x n_head x head_dim) with Q/K norms; post_attention_norm before the FFN
// (held as ffn_norm), a dense SwiGLU FFN or experts with a gated shared expert.
void find_qwen35_layer(const ModelFile& file, const ModelConfig& c, int64_t layer,
                       const std::string& p, LayerWeights& l) {
  const int64_t q_dim = c.n_head * c.head_dim;
  const int64_t kv_dim = c.n_head_kv * c.head_dim;
  l.attn_norm = find_checked(file, p + "attn_norm.weight", {c.n_embd}, true);
  if (c.layer_recurrent(layer)) {
    const DeltaNetConfig& d = c.delta_net;
    l.ssm_in = find_checked(file, p + "attn_qkv.weight", {c.n_embd, d.conv_channels()}, true);
    l.ssm_z = find_checked(file, p + "attn_gate.weight", {c.n_embd, d.value_dim()}, true);
    l.ssm_conv1d =
        find_checked(file, p + "ssm_conv1d.weight", {d.conv_kernel, d.conv_channels()}, true);
    l.ssm_dt = find_checked(file, p + "ssm_dt.bias", {d.n_v_heads}, true);
    l.ssm_a = find_checked(file, p + "ssm_a", {d.n_v_heads}, true);
    l.ssm_beta = find_checked(file, p + "ssm_beta.weight", {c.n_embd, d.n_v_heads}, true);
    l.ssm_alpha = find_checked(file, p + "ssm_alpha.weight", {c.n_embd, d.n_v_heads}, true);
    l.ssm_norm = find_checked(file, p + "ssm_norm.weight", {d.state_size}, true);
    l.ssm_out = find_checked(file, p + "ssm_out.weight", {d.value_dim(), c.n_embd}, true);
  } else {
    if (file.find_tensor(p + "attn_qkv.weight")) {
      throw UnsupportedError(file_label(file) + ": tensor " + p +
                             "attn_qkv.weight (fused Q/K/V of a full-attention layer) is not "
                             "supported; separate attn_q/attn_k/attn_v are");
    }
    l.wq = find_checked(file, p + "attn_q.weight", {c.n_embd, 2 * q_dim}, true);
    l.wk = find_checked(file, p + "attn_k.weight", {c.n_embd, kv_dim}, true);
    l.wv = find_checked(file, p + "attn_v.weight", {c.n_embd, kv_dim}, true);
    l.wo = find_checked(file, p + "attn_output.weight", {q_dim, c.n_embd}, true);
    l.q_norm = find_checked(file, p + "attn_q_norm.weight", {c.head_dim}, true);
    l.k_norm = find_checked(file, p + "attn_k_norm.weight", {c.head_dim}, true);
  }
  if (!c.is_moe()) {
    l.ffn_norm = find_checked(file, p + "post_attention_norm.weight", {c.n_embd}, true);
    l.w_gate = find_checked(file, p + "ffn_gate.weight", {c.n_embd, c.n_ff}, true);
    l.w_up = find_checked(file, p + "ffn_up.weight", {c.n_embd, c.n_ff}, true);
    l.w_down = find_checked(file, p + "ffn_down.weight", {c.n_ff, c.n_embd}, true);
    return;
  }
  find_expert_tensors(file, c, p, l);
  const int64_t fs = c.moe.n_ff_shexp;
  l.gate_shexp = find_checked(file, p + "ffn_gate_shexp.weight", {c.n_embd, fs}, true);
  l.up_shexp = find_checked(file, p + "ffn_up_shexp.weight", {c.n_embd, fs}, true);
  l.down_shexp = find_checked(file, p + "ffn_down_shexp.weight", {fs, c.n_embd}, true);
  l.shexp_gate = find_checked(file, p + "ffn_gate_inp_shexp.weight", {c.n_embd}, true);
}

}  // namespace

WeightTable WeightTable::from_gguf(const ModelFile& file, const ModelConfig& c) {
  WeightTable w;
  const int64_t q_dim = c.n_head * c.head_dim;
  const int64_t kv_dim = c.n_head_kv * c.head_dim;
  if (c.architecture == "gemma4") {
    find_gemma4_tensors(file, c, w,
                        [&](const std::string& name, std::vector<int64_t> dims, bool required) {
                          return find_checked(file, name, dims, required);
                        });
    return w;
  }
  w.token_embd = find_checked(file, "token_embd.weight", {c.n_embd, c.n_vocab}, true);
  w.output_norm = find_checked(file, "output_norm.weight", {c.n_embd}, true);
  w.output = c.tied_embeddings ? w.token_embd
                               : find_checked(file, "output.weight", {c.n_embd, c.n_vocab}, true);
  w.rope_freqs = find_checked(file, "rope_freqs.weight", {c.head_dim / 2}, false);
  // Each layer has several tensors: a block_count past the tensor count is a bad file, caught
  // before sizing the layer table by it (a fuzzed 17 KB file asked for 1.8 GB here).
  if (static_cast<uint64_t>(c.n_layer) > file.tensors().size()) {
    throw FormatError(file_label(file) + ": block_count " + std::to_string(c.n_layer) +
                      " is more than the file's " + std::to_string(file.tensors().size()) +
                      " tensors");
  }
  w.layers.resize(static_cast<size_t>(c.n_layer));
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    LayerWeights& l = w.layers[static_cast<size_t>(i)];
    if (c.is_hybrid()) {
      find_qwen35_layer(file, c, i, p, l);
      continue;
    }
    l.attn_norm = find_checked(file, p + "attn_norm.weight", {c.n_embd}, true);
    l.wq = find_checked(file, p + "attn_q.weight", {c.n_embd, q_dim}, true);
    l.wk = find_checked(file, p + "attn_k.weight", {c.n_embd, kv_dim}, true);
    l.wv = find_checked(file, p + "attn_v.weight", {c.n_embd, kv_dim}, true);
    l.wo = find_checked(file, p + "attn_output.weight", {q_dim, c.n_embd}, true);
    l.bq = find_checked(file, p + "attn_q.bias", {q_dim}, c.qkv_bias);
    l.bk = find_checked(file, p + "attn_k.bias", {kv_dim}, c.qkv_bias);
    l.bv = find_checked(file, p + "attn_v.bias", {kv_dim}, c.qkv_bias);
    l.q_norm = find_checked(file, p + "attn_q_norm.weight", {c.head_dim}, c.qk_norm);
    l.k_norm = find_checked(file, p + "attn_k_norm.weight", {c.head_dim}, c.qk_norm);
    l.bo = find_checked(file, p + "attn_output.bias", {c.n_embd}, c.attn_output_bias);
    l.attn_sinks = find_checked(file, p + "attn_sinks.weight", {c.n_head}, c.attn_sinks);
    find_gemma_layer_tensors(
        c, p, l, [&](const std::string& name, std::vector<int64_t> dims, bool required) {
          return find_checked(file, name, dims, required);
        });
    if (c.is_moe())
      find_expert_tensors(file, c, p, l);
    else
      find_dense_ffn_tensors(file, c, p, l);
  }
  return w;
}

namespace {

// Bytes of a layer's router, experts (all of them, with their biases) and shared expert.
uint64_t expert_layer_bytes(const LayerWeights& l) {
  uint64_t total = 0;
  for (const TensorInfo* t :
       {l.router, l.router_bias, l.gate_exps, l.up_exps, l.down_exps, l.gate_exps_bias,
        l.up_exps_bias, l.down_exps_bias, l.gate_shexp, l.up_shexp, l.down_shexp, l.shexp_gate,
        l.router_in_scale, l.down_exps_scale, l.ffn_pre_norm_2, l.ffn_post_norm_1,
        l.ffn_post_norm_2}) {
    if (t) total += t->size_bytes;
  }
  return total;
}

}  // namespace

uint64_t WeightTable::layer_bytes(size_t layer) const {
  const LayerWeights& l = layers.at(layer);
  uint64_t total = 0;
  for (const TensorInfo* t : {l.attn_norm,
                              l.wq,
                              l.wk,
                              l.wv,
                              l.wo,
                              l.bq,
                              l.bk,
                              l.bv,
                              l.q_norm,
                              l.k_norm,
                              l.bo,
                              l.attn_sinks,
                              l.ffn_norm,
                              l.w_gate,
                              l.w_up,
                              l.w_down,
                              l.ssm_in,
                              l.ssm_z,
                              l.ssm_conv1d,
                              l.ssm_dt,
                              l.ssm_a,
                              l.ssm_beta,
                              l.ssm_alpha,
                              l.ssm_norm,
                              l.ssm_out,
                              l.attn_post_norm,
                              l.ffn_post_norm,
                              l.out_scale,
                              l.ple_gate,
                              l.ple_proj,
                              l.ple_norm}) {
    if (t) total += t->size_bytes;
  }
  total += expert_layer_bytes(l);
  return total;
}

uint64_t WeightTable::total_bytes() const {
  uint64_t total = 0;
  for (const TensorInfo* t :
       {token_embd, output_norm, rope_freqs, ple_token_embd, ple_model_proj, ple_proj_norm}) {
    if (t) total += t->size_bytes;
  }
  if (output && output != token_embd) total += output->size_bytes;
  for (size_t i = 0; i < layers.size(); ++i) total += layer_bytes(i);
  return total;
}

bool ModelConfig::architecture_supported(std::string_view architecture) {
  return std::find(kSupportedArchitectures.begin(), kSupportedArchitectures.end(), architecture) !=
         kSupportedArchitectures.end();
}

}  // namespace granule
