// Synthetic llama-family GGUF models: seeded uniform weights scaled by 1/sqrt(fan_in) so
// activations stay near unit size at any depth, and a small byte-level BPE vocabulary
// (specials, the 256 GPT-2 byte symbols, letter-pair merges, reserved fillers).
#include "granule/testkit/synthetic_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

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

// Generates and encodes a tensor (dims in GGUF order) on all cores.
std::vector<uint8_t> make_tensor(std::string_view name, uint64_t seed, Distribution dist,
                                 const std::vector<int64_t>& dims, TensorType type) {
  const int64_t cols = dims[0];
  int64_t rows = 1;
  for (size_t i = 1; i < dims.size(); ++i) rows *= dims[i];
  const size_t stride = row_bytes(type, cols);
  std::vector<uint8_t> bytes(stride * static_cast<size_t>(rows));
  const int64_t threads = std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, rows);
  auto work = [&](int64_t part) {
    const int64_t begin = rows * part / threads;
    const int64_t end = rows * (part + 1) / threads;
    std::vector<float> values(static_cast<size_t>(cols));
    for (int64_t r = begin; r < end; ++r) {
      fill_rows(name, seed, dist, cols, r, r + 1, values.data());
      uint8_t* dst = bytes.data() + static_cast<size_t>(r) * stride;
      if (type == TensorType::F32) {
        std::memcpy(dst, values.data(), stride);
      } else {
        quantize_row(type, values.data(), dst, cols);
      }
    }
  };
  if (threads <= 1 || rows * cols < (1 << 16)) {
    for (int64_t p = 0; p < threads; ++p) work(p);
  } else {
    std::vector<std::thread> pool;
    for (int64_t p = 0; p < threads; ++p) pool.emplace_back(work, p);
    for (auto& t : pool) t.join();
  }
  return bytes;
}

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

}  // namespace

SyntheticModelSpec SyntheticModelSpec::preset(std::string_view name) {
  SyntheticModelSpec s;
  s.name = std::string(name);
  if (name == "tiny") return s;
  if (name == "tiny-gqa") {
    s.n_layer = 3;
    s.n_embd = 96;
    s.n_head = 6;  // over the default 2 KV heads
    s.n_ff = 160;
    s.seed = 2;
    return s;
  }
  if (name == "tiny-qwen2") {
    s.architecture = "qwen2";
    s.qkv_bias = true;
    s.tied_embeddings = true;
    s.rope_theta = 1000000.0f;
    s.rms_eps = 1e-6f;
    s.seed = 3;
    return s;
  }
  if (name == "tiny-qwen3") {
    s.architecture = "qwen3";
    s.qk_norm = true;
    s.head_dim = 32;  // q width 128 differs from the hidden size, as in Qwen3
    s.rope_theta = 1000000.0f;
    s.rms_eps = 1e-6f;
    s.seed = 4;
    return s;
  }
  if (name == "kv-wide") {  // narrow to compute, wide in KV: 32 KiB a token at f32
    s.n_layer = 4;
    s.n_head = s.n_head_kv = 8;
    s.head_dim = 128;
    s.context_length = 1024;
    s.seed = 11;
    return s;
  }
  if (name == "small-256") {  // the smallest shapes the GPU kernels run
    s.n_embd = 256;
    s.n_head = 4;
    s.n_ff = 512;
    s.n_vocab = 1000;
    return s;
  }
  if (name == "smollm2-135m") {
    s.n_layer = 30;
    s.n_embd = 576;
    s.n_head = 9;
    s.n_head_kv = 3;
    s.n_ff = 1536;
    s.n_vocab = 49152;
    s.context_length = 8192;
    s.rope_theta = 100000.0f;
    s.tied_embeddings = true;
    s.weight_type = TensorType::Q4_1;
    s.embedding_type = TensorType::Q8_0;
    return s;
  }
  if (name == "llama3-8b") {
    s.n_layer = 32;
    s.n_embd = 4096;
    s.n_head = 32;
    s.n_head_kv = 8;
    s.n_ff = 14336;
    s.n_vocab = 128256;
    s.context_length = 8192;
    s.rope_theta = 500000.0f;
    s.llama3_rope_scaling = true;
    s.weight_type = TensorType::Q4_K;
    s.embedding_type = TensorType::Q4_K;
    s.output_type = TensorType::Q6_K;
    return s;
  }
  throw UsageError("unknown synthetic model preset '" + std::string(name) + "'");
}

SyntheticModelSpec with_types(SyntheticModelSpec spec, TensorType weights, TensorType embedding,
                              TensorType output) {
  spec.weight_type = weights;
  spec.embedding_type = embedding;
  spec.output_type = output;
  return spec;
}

std::vector<std::string> SyntheticModelSpec::preset_names() {
  return {"tiny",    "tiny-gqa",  "tiny-qwen2",   "tiny-qwen3",
          "kv-wide", "small-256", "smollm2-135m", "llama3-8b"};
}

GgufWriter build_synthetic_model(const SyntheticModelSpec& spec) {
  if (spec.n_vocab < kSyntheticMinVocab) {
    throw UsageError("synthetic model vocabulary must hold at least " +
                     std::to_string(kSyntheticMinVocab) + " tokens");
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
  w.set(a + "rope.dimension_count", GgufValue::u32(static_cast<uint32_t>(head_dim)));
  if (head_dim * spec.n_head != spec.n_embd) {
    w.set(a + "attention.key_length", GgufValue::u32(static_cast<uint32_t>(head_dim)));
    w.set(a + "attention.value_length", GgufValue::u32(static_cast<uint32_t>(head_dim)));
  }
  w.set(a + "vocab_size", GgufValue::u32(static_cast<uint32_t>(spec.n_vocab)));
  if (spec.llama3_rope_scaling) {
    w.set(a + "rope.scaling.type", GgufValue::string("llama3"));
    w.set(a + "rope.scaling.factor", GgufValue::f32(spec.rope_scaling_factor));
    w.set(a + "rope.scaling.low_freq_factor", GgufValue::f32(spec.rope_low_freq_factor));
    w.set(a + "rope.scaling.high_freq_factor", GgufValue::f32(spec.rope_high_freq_factor));
    w.set(a + "rope.scaling.original_context_length",
          GgufValue::u32(static_cast<uint32_t>(spec.rope_original_context)));
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

  auto tensor = [&](const std::string& name, std::vector<int64_t> dims, TensorType type,
                    Distribution dist) {
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
    auto bytes = make_tensor(name, spec.seed, dist, dims, type);
    w.add_raw_tensor(name, std::move(dims), static_cast<uint32_t>(type), std::move(bytes));
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

  for (int64_t i = 0; i < spec.n_layer; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    const TensorType t = spec.weight_type;
    tensor(p + "attn_norm.weight", {spec.n_embd}, TensorType::F32, norm);
    tensor(p + "attn_q.weight", {spec.n_embd, q_dim}, t, fan_in(spec.n_embd));
    tensor(p + "attn_k.weight", {spec.n_embd, kv_dim}, t, fan_in(spec.n_embd));
    tensor(p + "attn_v.weight", {spec.n_embd, kv_dim}, t, fan_in(spec.n_embd));
    tensor(p + "attn_output.weight", {q_dim, spec.n_embd}, t, fan_in(q_dim));
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
