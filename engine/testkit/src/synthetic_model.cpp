// Synthetic llama-family GGUF models: seeded uniform weights scaled by 1/sqrt(fan_in) so
// activations stay near unit size at any depth, and a small byte-level BPE vocabulary
// (specials, the 256 GPT-2 byte symbols, letter-pair merges, reserved fillers).
#include "granule/testkit/synthetic_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <tuple>

#include "granule/error.h"
#include "granule/testkit/byte_level.h"
#include "granule/testkit/quantize.h"
#include "model/rope.h"

namespace granule {
namespace {

constexpr const char* kChatMlTemplate =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}";

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t hash_name(std::string_view name, uint64_t seed) {
  uint64_t h = 1469598103934665603ull ^ seed;  // FNV-1a
  for (char ch : name) h = (h ^ static_cast<uint8_t>(ch)) * 1099511628211ull;
  return h;
}

// How one tensor's values are drawn: mean + uniform(-1, 1) * spread.
struct Distribution {
  float mean = 0.0f;
  float spread = 1.0f;
};

// Fills rows [begin, end) of a tensor; every row has its own stream, so the values do not
// depend on how rows are split among threads.
void fill_rows(std::string_view name, uint64_t seed, Distribution dist, int64_t cols, int64_t begin,
               int64_t end, float* out) {
  const uint64_t tensor_key = hash_name(name, seed);
  for (int64_t r = begin; r < end; ++r) {
    uint64_t state = tensor_key ^ (static_cast<uint64_t>(r) * 0xD6E8FEB86659FD93ull);
    float* row = out + (r - begin) * cols;
    for (int64_t c = 0; c < cols; ++c) {
      const double unit = static_cast<double>(splitmix64(state) >> 11) * 0x1.0p-53;  // [0, 1)
      row[c] = dist.mean + dist.spread * static_cast<float>(2.0 * unit - 1.0);
    }
  }
}

// Encodes rows [first, first + count) of a tensor of `cols` columns from its seeded values,
// row r multiplied by row_scale[r] when row_scale is not empty.
void encode_rows(std::string_view name, uint64_t seed, Distribution dist, int64_t cols,
                 TensorType type, int64_t first, int64_t count, uint8_t* out,
                 const std::vector<float>& row_scale = {}) {
  const size_t stride = row_bytes(type, cols);
  std::vector<float> values(static_cast<size_t>(cols));
  for (int64_t r = first; r < first + count; ++r) {
    fill_rows(name, seed, dist, cols, r, r + 1, values.data());
    if (!row_scale.empty()) {
      for (float& v : values) v *= row_scale[static_cast<size_t>(r)];
    }
    uint8_t* dst = out + static_cast<size_t>(r - first) * stride;
    if (type == TensorType::F32) {
      std::memcpy(dst, values.data(), stride);
    } else {
      quantize_row(type, values.data(), dst, cols);
    }
  }
}

// random_blocks: a pool of encoded pieces of rows (`piece_elems` elements, whole blocks, a
// divisor of the row) quantised once from a distribution; every piece of every row of a
// tensor is then a pool entry picked by a hash of (tensor, row, piece). Valid blocks of the
// right magnitude at memory speed, independent of how rows are sliced. Tensors of one block
// type, row length and distribution share a pool (the real shapes have a few dozen such
// tensors per kind: quantising a pool is the slow part).
struct BlockPool {
  static constexpr int64_t kEntries = 2048;
  int64_t piece_elems = 0;
  size_t piece_bytes = 0;
  std::vector<uint8_t> bytes;

  BlockPool(uint64_t seed, Distribution dist, int64_t cols, TensorType type) {
    const int64_t block = tensor_type_info(type).block_elems;
    piece_elems = block;
    for (int64_t m = block; m <= 512 && m <= cols; m += block)
      if (cols % m == 0) piece_elems = m;
    piece_bytes = row_bytes(type, piece_elems);
    bytes.resize(static_cast<size_t>(kEntries) * piece_bytes);
    const std::string name = "block pool " + std::to_string(static_cast<int>(type)) + " " +
                             std::to_string(cols) + " " + std::to_string(dist.mean) + " " +
                             std::to_string(dist.spread);
    encode_rows(name, seed, dist, piece_elems, type, 0, kEntries, bytes.data());
  }

  // Rows [first, first + count) of a tensor of `cols` columns keyed by `key`.
  void rows(uint64_t key, int64_t cols, int64_t first, int64_t count, uint8_t* out) const {
    const int64_t pieces = cols / piece_elems;
    for (int64_t r = first; r < first + count; ++r) {
      uint64_t state = key ^ (static_cast<uint64_t>(r) * 0xD6E8FEB86659FD93ull);
      for (int64_t p = 0; p < pieces; ++p) {
        const uint64_t pick = splitmix64(state) % kEntries;
        std::memcpy(out, bytes.data() + pick * piece_bytes, piece_bytes);
        out += piece_bytes;
      }
    }
  }
};

struct Vocabulary {
  std::vector<std::string> tokens;
  std::vector<int64_t> types;
  std::vector<std::string> merges;
};

Vocabulary make_vocabulary(int64_t n_vocab) {
  Vocabulary v;
  auto add = [&](std::string text, int64_t type) {
    v.tokens.push_back(std::move(text));
    v.types.push_back(type);
  };
  add("<|endoftext|>", 3);
  add("<|im_start|>", 3);
  add("<|im_end|>", 3);
  for (int b = 0; b < 256; ++b) add(gpt2_byte_symbol(b), 1);
  // Merges: "Ġ" + letter (a space before a word), then letter pairs.
  const std::string space = gpt2_byte_symbol(' ');
  std::vector<std::pair<std::string, std::string>> pairs;
  for (char a = 'a'; a <= 'z'; ++a) pairs.emplace_back(space, std::string(1, a));
  for (char a = 'a'; a <= 'z'; ++a) {
    for (char b = 'a'; b <= 'z'; ++b) pairs.emplace_back(std::string(1, a), std::string(1, b));
  }
  for (const auto& [left, right] : pairs) {
    if (static_cast<int64_t>(v.tokens.size()) >= n_vocab) break;
    v.merges.push_back(left + " " + right);
    add(left + right, 1);
  }
  for (int64_t i = 0; static_cast<int64_t>(v.tokens.size()) < n_vocab; ++i) {
    add("<|reserved_" + std::to_string(i) + "|>", 5);
  }
  return v;
}

// router_skew: router row e scaled by (1 + rank(e))^(-skew / 2), rank a per-layer permutation
// of the experts (seeded by the layer's name). On typical hidden states a row's logits are
// about Gaussian with a spread in proportion to its scale, so top-k picks the wide rows more
// often: popularity falls with rank like a power law (tests/engine/cpu_gptoss_test.cpp
// measures it). Empty (no scaling) when the skew is 0.
std::vector<float> router_row_scales(const SyntheticModelSpec& spec, const std::string& layer) {
  if (spec.router_skew <= 0.0f) return {};
  const auto n = static_cast<size_t>(spec.n_expert);
  std::vector<size_t> by_rank(n);
  for (size_t i = 0; i < n; ++i) by_rank[i] = i;
  uint64_t state = hash_name(layer + "router_rank", spec.seed);
  for (size_t i = n - 1; i > 0; --i) {  // Fisher-Yates
    std::swap(by_rank[i], by_rank[splitmix64(state) % (i + 1)]);
  }
  std::vector<float> scales(n);
  for (size_t rank = 0; rank < n; ++rank) {
    scales[by_rank[rank]] = std::pow(1.0f + static_cast<float>(rank), -0.5f * spec.router_skew);
  }
  return scales;
}

// One MoE layer's FFN tensors, through the writer's `tensor(name, dims, type, distribution)`.
template <typename AddTensor>
void add_expert_tensors(const SyntheticModelSpec& spec, const std::string& p, int64_t n_ff_exp,
                        AddTensor&& tensor) {
  auto fan_in = [](int64_t n, float scale = 1.0f) {
    return Distribution{0.0f, scale * std::sqrt(3.0f / static_cast<float>(n))};
  };
  const int64_t d = spec.n_embd, e = spec.n_expert;
  const bool gpt_oss = spec.architecture == "gpt-oss";
  const bool post_norm = gpt_oss || spec.architecture == "qwen35moe";
  tensor(p + (post_norm ? "post_attention_norm.weight" : "ffn_norm.weight"), {d}, TensorType::F32,
         Distribution{1.0f, 0.1f});
  tensor(p + "ffn_gate_inp.weight", {d, e}, spec.router_type, fan_in(d, spec.router_scale),
         router_row_scales(spec, p));
  const TensorType t = spec.expert_type;
  tensor(p + "ffn_gate_exps.weight", {d, n_ff_exp, e}, t, fan_in(d));
  tensor(p + "ffn_up_exps.weight", {d, n_ff_exp, e}, t, fan_in(d));
  tensor(p + "ffn_down_exps.weight", {n_ff_exp, d, e}, t, fan_in(n_ff_exp));
  if (spec.expert_biases) {
    const Distribution bias{0.0f, 0.5f};
    // Small beside the logits' unit spread: a router bias decides popularity, and
    // router_skew 0 should route about uniformly.
    tensor(p + "ffn_gate_inp.bias", {e}, TensorType::F32, Distribution{0.0f, 0.1f});
    tensor(p + "ffn_gate_exps.bias", {n_ff_exp, e}, TensorType::F32, bias);
    tensor(p + "ffn_up_exps.bias", {n_ff_exp, e}, TensorType::F32, bias);
    tensor(p + "ffn_down_exps.bias", {d, e}, TensorType::F32, bias);
  }
  if (spec.n_ff_shexp > 0) {
    tensor(p + "ffn_gate_shexp.weight", {d, spec.n_ff_shexp}, spec.weight_type, fan_in(d));
    tensor(p + "ffn_up_shexp.weight", {d, spec.n_ff_shexp}, spec.weight_type, fan_in(d));
    tensor(p + "ffn_down_shexp.weight", {spec.n_ff_shexp, d}, spec.weight_type,
           fan_in(spec.n_ff_shexp));
    if (spec.architecture == "qwen35moe")  // the shared expert's sigmoid gate
      tensor(p + "ffn_gate_inp_shexp.weight", {d}, TensorType::F32, fan_in(d));
  }
}

// Gemma 4's tensors beyond the embeddings and head: per-layer shapes by kind, the global rope
// divisors, shared-KV layers without K/V, per-layer embeddings, output scales.
template <typename Slides, typename Width, typename AddTensor>
void add_gemma4_tensors(const SyntheticModelSpec& spec, Slides&& slides, Width&& layer_n_ff,
                        AddTensor&& tensor, GgufWriter& w) {
  auto fan_in = [](int64_t n, float scale = 1.0f) {
    return Distribution{0.0f, scale * std::sqrt(3.0f / static_cast<float>(n))};
  };
  const Distribution norm{1.0f, 0.1f};
  const Distribution qk_norm{spec.gemma4_qk_norm, 0.1f * spec.gemma4_qk_norm};
  const int64_t d = spec.n_embd, n_pl = spec.n_embd_per_layer, L = spec.n_layer;
  const int64_t head_global = spec.head_dim > 0 ? spec.head_dim : d / spec.n_head;
  const int64_t first_shared = L - spec.shared_kv_layers;
  const TensorType t = spec.weight_type;
  {  // proportional rope: the first fraction of the pairs rotate, the rest (1e30) do not
    const int64_t pairs = head_global / 2;
    const auto rotated =
        static_cast<int64_t>(static_cast<float>(pairs) * spec.global_rope_fraction);
    std::vector<float> factors(static_cast<size_t>(pairs), 1e30f);
    std::fill_n(factors.begin(), rotated, 1.0f);
    w.add_tensor("rope_freqs.weight", {pairs}, TensorType::F32, factors);
  }
  if (n_pl > 0) {
    tensor("per_layer_token_embd.weight", {n_pl * L, spec.n_vocab}, spec.embedding_type,
           Distribution{0.0f, std::sqrt(3.0f / static_cast<float>(n_pl))});
    tensor("per_layer_model_proj.weight", {d, n_pl * L}, t, fan_in(d));
    tensor("per_layer_proj_norm.weight", {n_pl}, TensorType::F32, norm);
  }
  for (int64_t i = 0; i < L; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    const bool swa = slides(i);
    const int64_t hd = swa && spec.head_dim_swa > 0 ? spec.head_dim_swa : head_global;
    const int64_t kv = (swa && spec.n_head_kv_swa > 0 ? spec.n_head_kv_swa : spec.n_head_kv) * hd;
    const int64_t q = spec.n_head * hd, ff = layer_n_ff(i);
    tensor(p + "attn_norm.weight", {d}, TensorType::F32, norm);
    tensor(p + "attn_q.weight", {d, q}, t, fan_in(d));
    if (i < first_shared) {
      tensor(p + "attn_k.weight", {d, kv}, t, fan_in(d));
      if (swa || !spec.global_v_is_k) tensor(p + "attn_v.weight", {d, kv}, t, fan_in(d));
      tensor(p + "attn_k_norm.weight", {hd}, TensorType::F32, qk_norm);
    }
    tensor(p + "attn_q_norm.weight", {hd}, TensorType::F32, qk_norm);
    tensor(p + "attn_output.weight", {q, d}, t, fan_in(q));
    tensor(p + "post_attention_norm.weight", {d}, TensorType::F32, norm);
    tensor(p + "ffn_norm.weight", {d}, TensorType::F32, norm);
    tensor(p + "ffn_gate.weight", {d, ff}, t, fan_in(d));
    tensor(p + "ffn_up.weight", {d, ff}, t, fan_in(d));
    tensor(p + "ffn_down.weight", {ff, d}, t, fan_in(ff));
    tensor(p + "post_ffw_norm.weight", {d}, TensorType::F32, norm);
    if (spec.n_expert > 0) {  // experts beside the dense FFN, with their own norms
      const int64_t e = spec.n_expert, fe = spec.n_ff_exp > 0 ? spec.n_ff_exp : spec.n_ff;
      tensor(p + "ffn_gate_inp.weight", {d, e}, spec.router_type, fan_in(d, spec.router_scale));
      tensor(p + "ffn_gate_inp.scale", {d}, TensorType::F32, Distribution{4.0f, 1.0f});
      tensor(p + "ffn_gate_exps.weight", {d, fe, e}, spec.expert_type, fan_in(d));
      tensor(p + "ffn_up_exps.weight", {d, fe, e}, spec.expert_type, fan_in(d));
      tensor(p + "ffn_down_exps.weight", {fe, d, e}, spec.expert_type, fan_in(fe));
      tensor(p + "ffn_down_exps.scale", {e}, TensorType::F32, Distribution{1.0f, 0.3f});
      tensor(p + "pre_ffw_norm_2.weight", {d}, TensorType::F32, norm);
      tensor(p + "post_ffw_norm_1.weight", {d}, TensorType::F32, norm);
      tensor(p + "post_ffw_norm_2.weight", {d}, TensorType::F32, norm);
    }
    if (n_pl > 0) {
      tensor(p + "inp_gate.weight", {d, n_pl}, t, fan_in(d));
      tensor(p + "proj.weight", {n_pl, d}, t, fan_in(n_pl));
      tensor(p + "post_norm.weight", {d}, TensorType::F32, norm);
    }
    tensor(p + "layer_output_scale.weight", {1}, TensorType::F32, Distribution{0.8f, 0.15f});
  }
}

}  // namespace

GgufWriter build_synthetic_model(const SyntheticModelSpec& spec) {
  if (spec.n_vocab < kSyntheticMinVocab) {
    throw UsageError("synthetic model vocabulary must hold at least " +
                     std::to_string(kSyntheticMinVocab) + " tokens");
  }
  if ((spec.architecture == "qwen35" || spec.architecture == "qwen35moe") &&
      (spec.full_attention_interval <= 0 || spec.ssm_n_k_heads <= 0 ||
       spec.ssm_n_v_heads % spec.ssm_n_k_heads != 0)) {
    throw UsageError(
        "synthetic model: a Qwen3.5 spec needs a positive full_attention_interval "
        "and value heads a multiple of key heads");
  }
  if (spec.n_head <= 0 || spec.n_head_kv <= 0 || spec.n_head % spec.n_head_kv != 0) {
    throw UsageError("synthetic model: n_head must be a positive multiple of n_head_kv");
  }
  const int64_t head_dim = spec.head_dim > 0 ? spec.head_dim : spec.n_embd / spec.n_head;
  const int64_t q_dim = spec.n_head * head_dim;
  const int64_t kv_dim = spec.n_head_kv * head_dim;
  const std::string a = spec.architecture + ".";

  GgufWriter w;
  w.set("general.architecture", GgufValue::string(spec.architecture));
  w.set("general.name", GgufValue::string(spec.name));
  w.set(a + "block_count", GgufValue::u32(static_cast<uint32_t>(spec.n_layer)));
  w.set(a + "context_length", GgufValue::u32(static_cast<uint32_t>(spec.context_length)));
  w.set(a + "embedding_length", GgufValue::u32(static_cast<uint32_t>(spec.n_embd)));
  w.set(a + "feed_forward_length", GgufValue::u32(static_cast<uint32_t>(spec.n_ff)));
  w.set(a + "attention.head_count", GgufValue::u32(static_cast<uint32_t>(spec.n_head)));
  w.set(a + "attention.head_count_kv", GgufValue::u32(static_cast<uint32_t>(spec.n_head_kv)));
  w.set(a + "attention.layer_norm_rms_epsilon", GgufValue::f32(spec.rms_eps));
  w.set(a + "rope.freq_base", GgufValue::f32(spec.rope_theta));
  if (spec.sliding_window > 0) {
    w.set(a + "attention.sliding_window",
          GgufValue::u32(static_cast<uint32_t>(spec.sliding_window)));
  }
  if (spec.sliding_window_pattern > 0) {
    w.set(a + "attention.sliding_window_pattern",
          GgufValue::u32(static_cast<uint32_t>(spec.sliding_window_pattern)));
  }
  if (spec.rope_theta_swa > 0.0f)
    w.set(a + "rope.freq_base_swa", GgufValue::f32(spec.rope_theta_swa));
  if (spec.final_logit_softcap > 0.0f) {
    w.set(a + "final_logit_softcapping", GgufValue::f32(spec.final_logit_softcap));
  }
  if (spec.linear_rope_scaling) {
    w.set(a + "rope.scaling.type", GgufValue::string("linear"));
    w.set(a + "rope.scaling.factor", GgufValue::f32(spec.rope_scaling_factor));
  }
  if (spec.yarn_rope_scaling) {
    w.set(a + "rope.scaling.type", GgufValue::string("yarn"));
    w.set(a + "rope.scaling.factor", GgufValue::f32(spec.rope_scaling_factor));
    w.set(a + "rope.scaling.original_context_length",
          GgufValue::u32(static_cast<uint32_t>(spec.rope_original_context)));
  }
  const bool qwen35 = spec.architecture == "qwen35" || spec.architecture == "qwen35moe";
  const int64_t rope_dims = spec.rope_dims > 0 ? spec.rope_dims : head_dim;
  w.set(a + "rope.dimension_count", GgufValue::u32(static_cast<uint32_t>(rope_dims)));
  const int64_t ssm_key_dim = spec.ssm_n_k_heads * spec.ssm_state_size;
  const int64_t ssm_value_dim = spec.ssm_n_v_heads * spec.ssm_state_size;
  const int64_t ssm_channels = 2 * ssm_key_dim + ssm_value_dim;
  if (qwen35) {
    w.set(a + "ssm.conv_kernel", GgufValue::u32(static_cast<uint32_t>(spec.ssm_conv_kernel)));
    w.set(a + "ssm.state_size", GgufValue::u32(static_cast<uint32_t>(spec.ssm_state_size)));
    w.set(a + "ssm.group_count", GgufValue::u32(static_cast<uint32_t>(spec.ssm_n_k_heads)));
    w.set(a + "ssm.time_step_rank", GgufValue::u32(static_cast<uint32_t>(spec.ssm_n_v_heads)));
    w.set(a + "ssm.inner_size", GgufValue::u32(static_cast<uint32_t>(ssm_value_dim)));
    w.set(a + "full_attention_interval",
          GgufValue::u32(static_cast<uint32_t>(spec.full_attention_interval)));
    std::vector<int64_t> sections = spec.rope_sections;
    sections.resize(4, 0);
    w.set(a + "rope.dimension_sections", GgufValue::int_array(GgufType::INT32, sections));
  }
  if (head_dim * spec.n_head != spec.n_embd || qwen35) {
    w.set(a + "attention.key_length", GgufValue::u32(static_cast<uint32_t>(head_dim)));
    w.set(a + "attention.value_length", GgufValue::u32(static_cast<uint32_t>(head_dim)));
  }
  w.set(a + "vocab_size", GgufValue::u32(static_cast<uint32_t>(spec.n_vocab)));
  const bool moe = spec.n_expert > 0;
  const int64_t n_ff_exp = spec.n_ff_exp > 0 ? spec.n_ff_exp : spec.n_ff;
  if (moe) {
    if (spec.n_expert_used <= 0 || spec.n_expert_used > spec.n_expert)
      throw UsageError("synthetic model: n_expert_used must be in [1, n_expert]");
    if (spec.architecture == "llama" && n_ff_exp != spec.n_ff)
      throw UsageError("synthetic model: Mixtral-style experts are n_ff wide");
    w.set(a + "expert_count", GgufValue::u32(static_cast<uint32_t>(spec.n_expert)));
    w.set(a + "expert_used_count", GgufValue::u32(static_cast<uint32_t>(spec.n_expert_used)));
    if (spec.architecture != "llama")
      w.set(a + "expert_feed_forward_length", GgufValue::u32(static_cast<uint32_t>(n_ff_exp)));
    if (spec.n_ff_shexp > 0)
      w.set(a + "expert_shared_feed_forward_length",
            GgufValue::u32(static_cast<uint32_t>(spec.n_ff_shexp)));
    if (spec.expert_gating_func >= 0)
      w.set(a + "expert_gating_func",
            GgufValue::u32(static_cast<uint32_t>(spec.expert_gating_func)));
    if (spec.expert_weights_norm >= 0)
      w.set(a + "expert_weights_norm", GgufValue::boolean_value(spec.expert_weights_norm != 0));
    if (spec.expert_weights_scale >= 0.0f)
      w.set(a + "expert_weights_scale", GgufValue::f32(spec.expert_weights_scale));
  }
  if (spec.llama3_rope_scaling) {
    // As llama.cpp's converter writes Llama 3.1: the divisors in rope_freqs.weight (below), no
    // rope.scaling.type or .factor (llama.cpp knows no "llama3" type and would apply a factor
    // on top of rope_freqs); the other keys are kept for readers that derive the divisors.
    w.set(a + "rope.scaling.low_freq_factor", GgufValue::f32(spec.rope_low_freq_factor));
    w.set(a + "rope.scaling.high_freq_factor", GgufValue::f32(spec.rope_high_freq_factor));
    w.set(a + "rope.scaling.original_context_length",
          GgufValue::u32(static_cast<uint32_t>(spec.rope_original_context)));
  }

  const bool gemma4 = spec.architecture == "gemma4";
  const int64_t period = spec.sliding_window_pattern > 0 ? spec.sliding_window_pattern : 6;
  auto slides = [&](int64_t i) { return i % period < period - 1; };
  const int64_t first_shared = spec.n_layer - spec.shared_kv_layers;
  auto layer_n_ff = [&](int64_t i) {
    return spec.n_ff_shared > 0 && i >= first_shared ? spec.n_ff_shared : spec.n_ff;
  };
  if (gemma4) {  // per-layer keys as Gemma 4's converter writes them
    std::vector<int64_t> pattern, kv_heads, widths;
    for (int64_t i = 0; i < spec.n_layer; ++i) {
      pattern.push_back(slides(i));
      kv_heads.push_back(slides(i) && spec.n_head_kv_swa > 0 ? spec.n_head_kv_swa : spec.n_head_kv);
      widths.push_back(layer_n_ff(i));
    }
    const int64_t swa_head = spec.head_dim_swa > 0 ? spec.head_dim_swa : head_dim;
    w.set(a + "attention.sliding_window_pattern",
          GgufValue::int_array(GgufType::BOOL, std::move(pattern)));
    w.set(a + "attention.head_count_kv",
          GgufValue::int_array(GgufType::UINT32, std::move(kv_heads)));
    w.set(a + "feed_forward_length", GgufValue::int_array(GgufType::UINT32, std::move(widths)));
    w.set(a + "attention.key_length", GgufValue::u32(static_cast<uint32_t>(head_dim)));
    w.set(a + "attention.value_length", GgufValue::u32(static_cast<uint32_t>(head_dim)));
    w.set(a + "attention.key_length_swa", GgufValue::u32(static_cast<uint32_t>(swa_head)));
    w.set(a + "attention.value_length_swa", GgufValue::u32(static_cast<uint32_t>(swa_head)));
    w.set(a + "rope.dimension_count_swa",
          GgufValue::u32(
              static_cast<uint32_t>(spec.rope_dims_swa > 0 ? spec.rope_dims_swa : swa_head)));
    w.set(a + "attention.shared_kv_layers",
          GgufValue::u32(static_cast<uint32_t>(spec.shared_kv_layers)));
    w.set(a + "embedding_length_per_layer_input",
          GgufValue::u32(static_cast<uint32_t>(spec.n_embd_per_layer)));
  }

  Vocabulary vocab = make_vocabulary(spec.n_vocab);
  w.set("tokenizer.ggml.model", GgufValue::string("gpt2"));
  w.set("tokenizer.ggml.pre", GgufValue::string("smollm"));
  w.set("tokenizer.ggml.tokens", GgufValue::string_array(std::move(vocab.tokens)));
  w.set("tokenizer.ggml.token_type", GgufValue::int_array(GgufType::INT32, std::move(vocab.types)));
  w.set("tokenizer.ggml.merges", GgufValue::string_array(std::move(vocab.merges)));
  w.set("tokenizer.ggml.bos_token_id", GgufValue::u32(kSyntheticImStart));
  w.set("tokenizer.ggml.eos_token_id", GgufValue::u32(kSyntheticImEnd));
  w.set("tokenizer.ggml.padding_token_id", GgufValue::u32(kSyntheticEndOfText));
  w.set("tokenizer.ggml.add_bos_token", GgufValue::boolean_value(false));
  w.set("tokenizer.chat_template",
        GgufValue::string(spec.chat_template.empty() ? kChatMlTemplate : spec.chat_template));

  // Tensors are made when the file is written (GgufWriter::add_generated_tensor), so a model
  // larger than memory can be written; random_blocks draws the large ones from a block pool.
  constexpr uint64_t kRandomBlocksMinBytes = 64ull << 10;
  std::map<std::tuple<int, int64_t, float, float>, std::shared_ptr<const BlockPool>> pools;
  auto tensor = [&](const std::string& name, std::vector<int64_t> dims, TensorType type,
                    Distribution dist, std::vector<float> row_scale = {}) {
    for (const auto& o : spec.tensor_types) {
      if (name.ends_with(o.suffix)) {
        type = o.type;
        break;
      }
    }
    if (spec.zero_data) {
      w.add_zero_tensor(name, std::move(dims), static_cast<uint32_t>(type));
      return;
    }
    const int64_t cols = dims[0];
    int64_t rows = 1;
    for (size_t i = 1; i < dims.size(); ++i) rows *= dims[i];
    const uint64_t seed = spec.seed;
    GgufWriter::RowGenerator generate;
    // Scaled rows (a skewed router) keep their structure: always from seeded values.
    if (spec.random_blocks && row_scale.empty() &&
        row_bytes(type, cols) * static_cast<uint64_t>(rows) >= kRandomBlocksMinBytes) {
      auto& pool = pools[{static_cast<int>(type), cols, dist.mean, dist.spread}];
      if (!pool) pool = std::make_shared<const BlockPool>(seed, dist, cols, type);
      const uint64_t key = hash_name(name, seed ^ 0x5EEDB10Cull);
      generate = [pool, key, cols](int64_t first, int64_t count, uint8_t* out) {
        pool->rows(key, cols, first, count, out);
      };
    } else {
      generate = [name, seed, dist, cols, type, row_scale = std::move(row_scale)](
                     int64_t first, int64_t count, uint8_t* out) {
        encode_rows(name, seed, dist, cols, type, first, count, out, row_scale);
      };
    }
    w.add_generated_tensor(name, std::move(dims), static_cast<uint32_t>(type), std::move(generate));
  };
  // Uniform(-s, s) has standard deviation s / sqrt(3): s = sqrt(3 / fan_in) gives unit-size
  // outputs for unit-size inputs.
  auto fan_in = [](int64_t n) {
    return Distribution{0.0f, std::sqrt(3.0f / static_cast<float>(n))};
  };
  const Distribution norm{1.0f, 0.1f};
  // Embeddings at 2/sqrt(n_embd): a normed hidden state then gives logits of size ~2.
  const Distribution embedding{0.0f, 2.0f * std::sqrt(3.0f / static_cast<float>(spec.n_embd))};

  tensor("token_embd.weight", {spec.n_embd, spec.n_vocab}, spec.embedding_type, embedding);
  tensor("output_norm.weight", {spec.n_embd}, TensorType::F32, norm);
  if (!spec.tied_embeddings) {
    tensor("output.weight", {spec.n_embd, spec.n_vocab}, spec.output_type, embedding);
  }
  if (spec.llama3_rope_scaling) {
    RopeScaling scaling;
    scaling.type = "llama3";
    scaling.factor = spec.rope_scaling_factor;
    scaling.low_freq_factor = spec.rope_low_freq_factor;
    scaling.high_freq_factor = spec.rope_high_freq_factor;
    scaling.original_context = spec.rope_original_context;
    // The per-frequency divisors llama.cpp's converter writes for Llama 3.1.
    std::vector<float> factors(static_cast<size_t>(head_dim / 2));
    for (int64_t i = 0; i < head_dim / 2; ++i) {
      const double freq = std::pow(static_cast<double>(spec.rope_theta),
                                   -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
      factors[static_cast<size_t>(i)] = static_cast<float>(llama3_frequency_divisor(freq, scaling));
    }
    w.add_tensor("rope_freqs.weight", {head_dim / 2}, TensorType::F32, factors);
  }

  if (gemma4) {
    add_gemma4_tensors(spec, slides, layer_n_ff, tensor, w);
    return w;
  }
  for (int64_t i = 0; i < spec.n_layer; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    const TensorType t = spec.weight_type;
    tensor(p + "attn_norm.weight", {spec.n_embd}, TensorType::F32, norm);
    if (qwen35) {
      if ((i + 1) % spec.full_attention_interval != 0) {  // Gated DeltaNet
        const int64_t nv = spec.ssm_n_v_heads;
        tensor(p + "attn_qkv.weight", {spec.n_embd, ssm_channels}, t, fan_in(spec.n_embd));
        tensor(p + "attn_gate.weight", {spec.n_embd, ssm_value_dim}, t, fan_in(spec.n_embd));
        tensor(p + "ssm_conv1d.weight", {spec.ssm_conv_kernel, ssm_channels}, TensorType::F32,
               fan_in(spec.ssm_conv_kernel));
        tensor(p + "ssm_dt.bias", {nv}, TensorType::F32, Distribution{0.0f, 1.0f});
        // a = -exp(A_log): decays exp(softplus(.) * a) spread over (0, 1).
        tensor(p + "ssm_a", {nv}, TensorType::F32, Distribution{-1.0f, 0.6f});
        tensor(p + "ssm_beta.weight", {spec.n_embd, nv}, t, fan_in(spec.n_embd));
        tensor(p + "ssm_alpha.weight", {spec.n_embd, nv}, t, fan_in(spec.n_embd));
        tensor(p + "ssm_norm.weight", {spec.ssm_state_size}, TensorType::F32, norm);
        tensor(p + "ssm_out.weight", {ssm_value_dim, spec.n_embd}, t, fan_in(ssm_value_dim));
      } else {  // full attention: Q and its output gate per head, QK norms
        tensor(p + "attn_q.weight", {spec.n_embd, 2 * q_dim}, t, fan_in(spec.n_embd));
        tensor(p + "attn_k.weight", {spec.n_embd, kv_dim}, t, fan_in(spec.n_embd));
        tensor(p + "attn_v.weight", {spec.n_embd, kv_dim}, t, fan_in(spec.n_embd));
        tensor(p + "attn_output.weight", {q_dim, spec.n_embd}, t, fan_in(q_dim));
        tensor(p + "attn_q_norm.weight", {head_dim}, TensorType::F32, norm);
        tensor(p + "attn_k_norm.weight", {head_dim}, TensorType::F32, norm);
      }
      if (moe) {
        add_expert_tensors(spec, p, n_ff_exp, tensor);
      } else {
        tensor(p + "post_attention_norm.weight", {spec.n_embd}, TensorType::F32, norm);
        tensor(p + "ffn_gate.weight", {spec.n_embd, spec.n_ff}, t, fan_in(spec.n_embd));
        tensor(p + "ffn_up.weight", {spec.n_embd, spec.n_ff}, t, fan_in(spec.n_embd));
        tensor(p + "ffn_down.weight", {spec.n_ff, spec.n_embd}, t, fan_in(spec.n_ff));
      }
      continue;
    }
    tensor(p + "attn_q.weight", {spec.n_embd, q_dim}, t, fan_in(spec.n_embd));
    tensor(p + "attn_k.weight", {spec.n_embd, kv_dim}, t, fan_in(spec.n_embd));
    tensor(p + "attn_v.weight", {spec.n_embd, kv_dim}, t, fan_in(spec.n_embd));
    tensor(p + "attn_output.weight", {q_dim, spec.n_embd}, t, fan_in(q_dim));
    if (spec.attn_output_bias) {
      tensor(p + "attn_output.bias", {spec.n_embd}, TensorType::F32, Distribution{0.0f, 0.5f});
    }
    if (spec.attn_sinks) {  // sink logits of the size of the scores, so they take real mass
      tensor(p + "attn_sinks.weight", {spec.n_head}, TensorType::F32, Distribution{0.0f, 2.0f});
    }
    if (spec.qkv_bias) {
      const Distribution bias{0.0f, 0.5f};
      tensor(p + "attn_q.bias", {q_dim}, TensorType::F32, bias);
      tensor(p + "attn_k.bias", {kv_dim}, TensorType::F32, bias);
      tensor(p + "attn_v.bias", {kv_dim}, TensorType::F32, bias);
    }
    if (spec.qk_norm) {
      tensor(p + "attn_q_norm.weight", {head_dim}, TensorType::F32, norm);
      tensor(p + "attn_k_norm.weight", {head_dim}, TensorType::F32, norm);
    }
    if (spec.architecture == "gemma3") {  // sandwich norms
      tensor(p + "post_attention_norm.weight", {spec.n_embd}, TensorType::F32, norm);
      tensor(p + "post_ffw_norm.weight", {spec.n_embd}, TensorType::F32, norm);
    }
    if (moe) {
      add_expert_tensors(spec, p, n_ff_exp, tensor);
      continue;
    }
    tensor(p + "ffn_norm.weight", {spec.n_embd}, TensorType::F32, norm);
    tensor(p + "ffn_gate.weight", {spec.n_embd, spec.n_ff}, t, fan_in(spec.n_embd));
    tensor(p + "ffn_up.weight", {spec.n_embd, spec.n_ff}, t, fan_in(spec.n_embd));
    tensor(p + "ffn_down.weight", {spec.n_ff, spec.n_embd}, t, fan_in(spec.n_ff));
  }
  return w;
}

void write_synthetic_model(const SyntheticModelSpec& spec, const std::filesystem::path& path) {
  build_synthetic_model(spec).write(path);
}

}  // namespace granule
