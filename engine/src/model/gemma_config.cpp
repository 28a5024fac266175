// Gemma 3 as llama.cpp reads it (src/models/gemma3.cpp, llama-model.cpp, llama-hparams.cpp):
//   - NeoX rotation; sliding-window layers (attention.sliding_window, when present and
//     positive) in a pattern of attention.sliding_window_pattern — one bool per layer, or a
//     period n (default 6) where layer i slides when i % n < n - 1 — rotating with
//     rope.freq_base_swa (llama.cpp's default 10000 when absent) and no rope scaling; the
//     global layers take rope.freq_base and the file's rope scaling (linear 8 in the 4B-27B).
//   - QK norms, sandwich norms, GeGLU, embeddings times sqrt(n_embd), an optional final logit
//     soft-cap, and the attention scale 1/sqrt(head_dim) — 1/sqrt(n_embd / n_head) for the
//     62-layer 27B (llama.cpp keys it on the layer count; the file has no key for it).
// The converter stores Gemma 3's norm weights as 1 + w (Gemma 4's as they are), so every norm
// is a plain RMSNorm here.
// Gemma 4 (src/models/gemma4.cpp) adds: head sizes, KV heads and rotated dimensions per layer
// kind (attention.key_length[_swa], head_count_kv as a per-layer array, rope.dimension_count
// [_swa]); the global layers' "proportional" rope as frequency divisors in rope_freqs.weight
// (1e30 for the unrotated pairs); V RMS-normed without a weight (and V = K when attn_v is
// absent); attention scale 1; per-layer FFN widths; the last attention.shared_kv_layers layers
// reading the KV of the last earlier layer of their kind; per-layer embeddings; a per-layer
// output scale; in the mixture-of-experts form (26B-A4B) experts beside the dense FFN, each
// with its own norms (fused gate/up experts are refused).
#include "model/gemma_config.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "granule/error.h"

namespace granule {
namespace {

std::string file_label(const ModelFile& file) { return file.path().filename().string(); }

void read_swa_pattern(const ModelFile& file, ModelConfig& c, int64_t default_period) {
  const std::string key = c.architecture + ".attention.sliding_window_pattern";
  c.swa_layers.assign(static_cast<size_t>(c.n_layer), false);
  const GgufValue* pattern = file.find(key);
  if (pattern && pattern->type == GgufType::ARRAY) {
    if (pattern->array_size() != static_cast<size_t>(c.n_layer) ||
        pattern->ints.size() != pattern->array_size()) {
      throw FormatError(file_label(file) + ": " + key + " must hold one bool per layer");
    }
    for (size_t i = 0; i < c.swa_layers.size(); ++i) c.swa_layers[i] = pattern->ints[i] != 0;
    return;
  }
  const int64_t period = pattern ? pattern->as_int() : default_period;
  if (period < 0) throw FormatError(file_label(file) + ": " + key + " must not be negative");
  for (int64_t i = 0; i < c.n_layer; ++i)
    c.swa_layers[static_cast<size_t>(i)] = period == 0 || i % period < period - 1;
}

// A key that is one integer or an array of one integer per layer (llama.cpp's
// get_key_or_arr); empty when absent.
std::vector<int64_t> per_layer_ints(const ModelFile& file, const std::string& key,
                                    int64_t n_layer) {
  const GgufValue* value = file.find(key);
  if (!value) return {};
  if (value->type != GgufType::ARRAY)
    return std::vector<int64_t>(static_cast<size_t>(n_layer), value->as_int());
  if (value->array_size() != static_cast<size_t>(n_layer) ||
      value->ints.size() != value->array_size())
    throw FormatError(file_label(file) + ": " + key + " must hold one integer per layer");
  return value->ints;
}

int64_t positive(const ModelFile& file, const std::string& key, std::optional<int64_t> value) {
  if (!value) throw FormatError(file_label(file) + ": missing metadata key " + key);
  if (*value <= 0)
    throw FormatError(file_label(file) + ": metadata key " + key + " must be positive");
  return *value;
}

}  // namespace

void refuse_gemma4_tensor(const ModelFile& file, const std::string& name) {
  throw UnsupportedError(file_label(file) + ": tensor " + name +
                         " is not supported for gemma4 (fused QKV or gate/up experts, or experts "
                         "on some layers only, are not run yet)");
}

void read_gemma4_config(const ModelFile& file, ModelConfig& c) {
  const std::string a = "gemma4.";
  auto required = [&](const std::string& key) {
    return positive(file, a + key, file.get_int(a + key));
  };
  c.n_layer = required("block_count");
  c.n_embd = required("embedding_length");
  c.n_head = required("attention.head_count");
  c.context_length = file.get_int(a + "context_length").value_or(2048);
  if (file.get_int(a + "expert_count").value_or(0) > 0) {
    // llama.cpp's graph: softmax over all experts, the top k renormalised, scale 1, GeGLU
    // experts; the router reads its own normed input (cpu_backend.cpp's Gemma 4 block).
    ExpertConfig& m = c.moe;
    m.n_expert = required("expert_count");
    m.n_expert_used = required("expert_used_count");
    m.n_ff_exp = required("expert_feed_forward_length");
    if (m.n_expert_used > m.n_expert)
      throw FormatError(file_label(file) + ": expert_used_count is more than expert_count");
    m.gating = ExpertGating::Softmax;
    m.normalize_weights = true;
    m.weights_scale = 1.0f;
  }
  if (static_cast<uint64_t>(c.n_layer) > file.tensors().size()) {
    throw FormatError(file_label(file) + ": block_count " + std::to_string(c.n_layer) +
                      " is more than the file's tensors");
  }
  c.sliding_window = required("attention.sliding_window");
  const GgufValue* pattern = file.find(a + "attention.sliding_window_pattern");
  if (!pattern || pattern->type != GgufType::ARRAY)
    throw FormatError(file_label(file) + ": " + a +
                      "attention.sliding_window_pattern must be a per-layer bool array");
  read_swa_pattern(file, c, 0);

  c.head_dim = required("attention.key_length");
  c.head_dim_swa = required("attention.key_length_swa");
  if (file.get_int(a + "attention.value_length").value_or(c.head_dim) != c.head_dim ||
      file.get_int(a + "attention.value_length_swa").value_or(c.head_dim_swa) != c.head_dim_swa)
    throw FormatError(file_label(file) + ": Gemma 4 needs value_length == key_length");
  c.rope_dims = file.get_int(a + "rope.dimension_count").value_or(c.head_dim);
  c.rope_dims_swa = file.get_int(a + "rope.dimension_count_swa").value_or(c.rope_dims);
  if (c.rope_dims <= 0 || c.rope_dims > c.head_dim || c.rope_dims % 2 != 0 ||
      c.rope_dims_swa <= 0 || c.rope_dims_swa > c.head_dim_swa || c.rope_dims_swa % 2 != 0 ||
      c.head_dim % 2 != 0 || c.head_dim_swa % 2 != 0)
    throw FormatError(file_label(file) +
                      ": rope.dimension_count[_swa] must be even and at most the head size");

  // KV heads: one per kind (the converter writes the swa and global counts per layer).
  std::vector<int64_t> kv_heads = per_layer_ints(file, a + "attention.head_count_kv", c.n_layer);
  if (kv_heads.empty()) kv_heads.assign(static_cast<size_t>(c.n_layer), c.n_head);
  c.n_head_kv = c.n_head_kv_swa = 0;
  for (int64_t i = 0; i < c.n_layer; ++i) {
    int64_t& kind = c.layer_slides(i) ? c.n_head_kv_swa : c.n_head_kv;
    const int64_t n = kv_heads[static_cast<size_t>(i)];
    if (n <= 0 || c.n_head % n != 0)
      throw FormatError(file_label(file) + ": head_count " + std::to_string(c.n_head) +
                        " is not a multiple of layer " + std::to_string(i) + "'s head_count_kv");
    if (kind != 0 && kind != n)
      throw UnsupportedError(file_label(file) +
                             ": KV head counts that differ within a layer kind are not supported");
    kind = n;
  }
  if (c.n_head_kv == 0) c.n_head_kv = c.n_head_kv_swa;  // no global layer
  if (c.n_head_kv_swa == 0) c.n_head_kv_swa = c.n_head_kv;

  c.layer_n_ff = per_layer_ints(file, a + "feed_forward_length", c.n_layer);
  if (c.layer_n_ff.empty())
    throw FormatError(file_label(file) + ": missing metadata key " + a + "feed_forward_length");
  for (int64_t n : c.layer_n_ff)
    if (n <= 0) throw FormatError(file_label(file) + ": feed_forward_length must be positive");
  c.n_ff = *std::max_element(c.layer_n_ff.begin(), c.layer_n_ff.end());

  c.rms_eps =
      static_cast<float>(file.get_float(a + "attention.layer_norm_rms_epsilon").value_or(1e-6));
  c.rope_theta = static_cast<float>(file.get_float(a + "rope.freq_base").value_or(10000.0));
  c.rope_theta_swa = static_cast<float>(file.get_float(a + "rope.freq_base_swa").value_or(10000.0));
  c.rope_scaling.factor =
      static_cast<float>(file.get_float(a + "rope.scaling.factor").value_or(1.0));
  const std::string scaling = file.get_string(a + "rope.scaling.type").value_or("linear");
  if (scaling != "linear" && scaling != "none")
    throw UnsupportedError(file_label(file) + ": rope scaling '" + scaling +
                           "' is not supported for Gemma 4");
  // Gemma 4's global layers take their "proportional" rope from rope_freqs.weight; a linear
  // factor on top of it is not written by the converter and not run here.
  if (scaling == "linear" && c.rope_scaling.factor != 1.0f && c.rope_scaling.factor > 0.0f)
    throw UnsupportedError(file_label(file) + ": rope scaling on Gemma 4 is not supported");

  const int64_t shared = file.get_int(a + "attention.shared_kv_layers").value_or(0);
  const int64_t first_shared = c.n_layer - shared;
  if (shared < 0 || first_shared < 2)
    throw FormatError(file_label(file) +
                      ": attention.shared_kv_layers leaves fewer than 2 layers with KV");
  if (shared > 0) {
    // llama.cpp: a shared layer reads layer first_shared - 2 when it slides, else
    // first_shared - 1; those two must be of those kinds.
    if (!c.layer_slides(first_shared - 2) || c.layer_slides(first_shared - 1))
      throw UnsupportedError(file_label(file) +
                             ": shared KV layers need a sliding then a global layer before them");
    c.kv_layer.resize(static_cast<size_t>(c.n_layer));
    for (int64_t i = 0; i < c.n_layer; ++i)
      c.kv_layer[static_cast<size_t>(i)] =
          i < first_shared ? i : first_shared - (c.layer_slides(i) ? 2 : 1);
  }
  c.n_embd_per_layer = file.get_int(a + "embedding_length_per_layer_input").value_or(0);
  if (c.n_embd_per_layer < 0)
    throw FormatError(file_label(file) + ": negative embedding_length_per_layer_input");

  c.rope_ordering = RopeOrdering::NeoX;
  c.activation = FfnActivation::GeluTanh;
  c.sandwich_norms = true;
  c.qk_norm = true;
  c.value_norm = true;
  c.embedding_scale = std::sqrt(static_cast<float>(c.n_embd));
  c.attention_scale = 1.0f;
  c.final_logit_softcap =
      static_cast<float>(file.get_float(a + "final_logit_softcapping").value_or(0.0));
  if (c.final_logit_softcap < 0)
    throw FormatError(file_label(file) + ": negative final_logit_softcapping");

  c.tied_embeddings = file.find_tensor("output.weight") == nullptr;
  const TensorInfo* embd = file.find_tensor("token_embd.weight");
  if (!embd) throw FormatError(file_label(file) + ": missing tensor token_embd.weight");
  if (embd->dims.size() != 2 || embd->dims[0] != c.n_embd)
    throw FormatError(file_label(file) +
                      ": token_embd.weight has the wrong shape for embedding_length");
  c.n_vocab = embd->dims[1];
  std::map<uint32_t, int64_t> type_counts;
  for (const auto& t : file.tensors())
    if (t.dims.size() >= 2) ++type_counts[t.ggml_type];
  int64_t best = -1;
  for (auto [type, count] : type_counts) {
    if (count > best) {
      best = count;
      c.dominant_type = type;
    }
  }
}

bool is_gemma_architecture(std::string_view architecture) {
  return architecture == "gemma3" || architecture == "gemma4";
}

void read_gemma_config(const ModelFile& file, ModelConfig& c) {
  const std::string a = c.architecture + ".";
  c.rope_ordering = RopeOrdering::NeoX;
  c.activation = FfnActivation::GeluTanh;
  c.sandwich_norms = true;
  c.qk_norm = true;  // required tensors (llama.cpp's loader has no optional form)
  c.embedding_scale = std::sqrt(static_cast<float>(c.n_embd));
  if (auto cap = file.get_float(a + "final_logit_softcapping")) {
    c.final_logit_softcap = static_cast<float>(*cap);
    if (c.final_logit_softcap < 0) {
      throw FormatError(file_label(file) + ": " + a + "final_logit_softcapping is negative");
    }
  }
  c.attention_scale = c.n_layer == 62 ? 1.0f / std::sqrt(static_cast<float>(c.n_embd / c.n_head))
                                      : 1.0f / std::sqrt(static_cast<float>(c.head_dim));

  // llama.cpp's rope scaling type defaults to linear: a factor without a type still applies.
  if (c.rope_scaling.type == "none" && !file.get_string(a + "rope.scaling.type") &&
      c.rope_scaling.factor != 1.0f && c.rope_scaling.factor > 0.0f) {
    c.rope_scaling.type = "linear";
  }
  if (c.rope_scaling.type != "none" && c.rope_scaling.type != "linear") {
    throw UnsupportedError(file_label(file) + ": rope scaling '" + c.rope_scaling.type +
                           "' is not supported for Gemma (linear is)");
  }

  const int64_t window = file.get_int(a + "attention.sliding_window").value_or(0);
  if (window <= 0) return;  // every layer global, rope.freq_base for all
  c.sliding_window = window;
  read_swa_pattern(file, c, 6);
  c.rope_theta_swa = 10000.0f;
  if (auto base = file.get_float(a + "rope.freq_base_swa"))
    c.rope_theta_swa = static_cast<float>(*base);
  if (c.rope_theta_swa <= 0) {
    throw FormatError(file_label(file) + ": " + a + "rope.freq_base_swa must be positive");
  }
}

}  // namespace granule
