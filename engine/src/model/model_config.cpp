// ModelConfig and WeightTable for the llama family, read and checked from GGUF metadata and
// the tensor table, with errors that name the key or tensor at fault.
#include "granule/model_config.h"

#include <algorithm>
#include <array>
#include <map>

#include "granule/error.h"
#include "granule/log.h"

namespace granule {
namespace {

constexpr std::array<std::string_view, 4> kSupportedArchitectures = {"llama", "mistral", "qwen2",
                                                                     "qwen3"};

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

}  // namespace

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
  const std::string a = c.architecture + ".";

  c.n_layer = require_int(file, a + "block_count");
  c.n_embd = require_int(file, a + "embedding_length");
  c.n_ff = require_int(file, a + "feed_forward_length");
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
  if (rope_dims != c.head_dim) {
    throw UnsupportedError(file_label(file) + ": partial rotary embeddings (rope.dimension_count " +
                           std::to_string(rope_dims) + " of head dimension " +
                           std::to_string(c.head_dim) + ") are not supported");
  }
  c.rms_eps = optional_float(file, a + "attention.layer_norm_rms_epsilon", 1e-5f);
  c.rope_theta = optional_float(file, a + "rope.freq_base", 10000.0f);
  // Llama and Mistral GGUFs carry Q/K permuted by the converter into interleaved pairs;
  // Qwen keeps the Hugging Face split-halves rotation.
  c.rope_ordering = (c.architecture == "qwen2" || c.architecture == "qwen3") ? RopeOrdering::NeoX
                                                                             : RopeOrdering::Normal;

  // Rope scaling: explicit keys, and Llama 3's per-frequency factors in rope_freqs.weight.
  auto scaling_type = file.get_string(a + "rope.scaling.type");
  RopeScaling& s = c.rope_scaling;
  s.factor = optional_float(file, a + "rope.scaling.factor", 1.0f);
  s.original_context = optional_int(file, a + "rope.scaling.original_context_length", 8192);
  s.low_freq_factor = optional_float(file, a + "rope.scaling.low_freq_factor", 1.0f);
  s.high_freq_factor = optional_float(file, a + "rope.scaling.high_freq_factor", 4.0f);
  if (scaling_type && *scaling_type != "none") {
    if (*scaling_type != "linear" && *scaling_type != "llama3") {
      throw UnsupportedError(file_label(file) + ": rope scaling '" + *scaling_type +
                             "' is not supported (supported: none, linear, llama3)");
    }
    s.type = *scaling_type;
  }
  if (file.find_tensor("rope_freqs.weight")) s.type = "llama3";
  if (s.type == "linear" && s.factor <= 0) {
    throw FormatError(file_label(file) + ": rope.scaling.factor must be positive");
  }

  c.qkv_bias = file.find_tensor("blk.0.attn_q.bias") != nullptr;
  c.qk_norm = file.find_tensor("blk.0.attn_q_norm.weight") != nullptr;
  c.tied_embeddings = file.find_tensor("output.weight") == nullptr;

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
    if (t.dims.size() == 2) ++type_counts[t.ggml_type];
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

}  // namespace

WeightTable WeightTable::from_gguf(const ModelFile& file, const ModelConfig& c) {
  WeightTable w;
  const int64_t q_dim = c.n_head * c.head_dim;
  const int64_t kv_dim = c.n_head_kv * c.head_dim;
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
    l.ffn_norm = find_checked(file, p + "ffn_norm.weight", {c.n_embd}, true);
    l.w_gate = find_checked(file, p + "ffn_gate.weight", {c.n_embd, c.n_ff}, true);
    l.w_up = find_checked(file, p + "ffn_up.weight", {c.n_embd, c.n_ff}, true);
    l.w_down = find_checked(file, p + "ffn_down.weight", {c.n_ff, c.n_embd}, true);
  }
  return w;
}

uint64_t WeightTable::layer_bytes(size_t layer) const {
  const LayerWeights& l = layers.at(layer);
  uint64_t total = 0;
  for (const TensorInfo* t : {l.attn_norm, l.wq, l.wk, l.wv, l.wo, l.bq, l.bk, l.bv, l.q_norm,
                              l.k_norm, l.ffn_norm, l.w_gate, l.w_up, l.w_down}) {
    if (t) total += t->size_bytes;
  }
  return total;
}

uint64_t WeightTable::total_bytes() const {
  uint64_t total = 0;
  for (const TensorInfo* t : {token_embd, output_norm, rope_freqs}) {
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
