// Synthetic llama-family GGUF models with seeded random weights at any shape, architecture
// and block type, plus a small valid byte-level BPE vocabulary, so Engine::open runs on them.
// Tests, the CUDA checks and the benchmarks make their models with this.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "granule/tensor_type.h"
#include "granule/testkit/gguf_writer.h"

namespace granule {

struct SyntheticModelSpec {
  std::string architecture = "llama";  // "llama", "qwen2", "qwen3" (anything is written as is)
  std::string name = "synthetic";
  int64_t n_layer = 2;
  int64_t n_embd = 64;
  int64_t n_head = 4;
  int64_t n_head_kv = 2;
  int64_t head_dim = 0;  // 0 = n_embd / n_head
  int64_t n_ff = 128;
  int64_t n_vocab = 384;  // at least kSyntheticMinVocab
  int64_t context_length = 2048;
  float rms_eps = 1e-5f;
  float rope_theta = 10000.0f;

  TensorType weight_type = TensorType::F32;  // the 2-D layer weights
  TensorType embedding_type = TensorType::F32;
  TensorType output_type = TensorType::F32;  // unused when tied
  bool tied_embeddings = false;
  // Per-tensor block types over the three above, for files that mix types as llama-quantize
  // writes them: a tensor whose name ends with `suffix` ("attn_q.weight",
  // "blk.1.ffn_down.weight", "output.weight") takes `type`; the first match wins.
  struct TypeOverride {
    std::string suffix;
    TensorType type;
  };
  std::vector<TypeOverride> tensor_types;
  bool qkv_bias = false;  // Qwen2: blk.N.attn_{q,k,v}.bias
  bool qk_norm = false;   // Qwen3: blk.N.attn_{q,k}_norm.weight

  // Llama 3 rope scaling, written the way llama.cpp's converter does: a rope_freqs.weight
  // tensor of per-frequency divisors (plus the rope.scaling.* keys, for readers).
  bool llama3_rope_scaling = false;
  float rope_scaling_factor = 8.0f;
  float rope_low_freq_factor = 1.0f;
  float rope_high_freq_factor = 4.0f;
  int64_t rope_original_context = 8192;

  // Every tensor all zeros and never generated (GgufWriter::add_zero_tensor): real headers
  // at any shape for code that reads only them (the hub tests' 8B-shaped repository).
  bool zero_data = false;

  uint64_t seed = 1;
  // tokenizer.chat_template; the default is a ChatML template.
  std::string chat_template;

  // Named shapes: "tiny" (2 layers, 64 wide), "tiny-gqa", "tiny-qwen2", "tiny-qwen3",
  // "kv-wide" (4 layers, 64 wide, 8/8 heads of 128, ctx 1024: 32 KiB of f32 KV a token),
  // "small-256" (2 layers, 256 wide, 4/2 heads of 64, ff 512, vocab 1000: the smallest shapes
  // the GPU kernels run), "smollm2-135m" (30 layers, 576, 9/3 heads, ff 1536, vocab 49152,
  // tied, ctx 8192, theta 1e5),
  // "llama3-8b" (32 layers, 4096, 32/8, ff 14336, vocab 128256, theta 5e5, llama3 scaling).
  // Throws UsageError for an unknown name.
  static SyntheticModelSpec preset(std::string_view name);
  static std::vector<std::string> preset_names();
};

// `spec` with its layer weights, embeddings and output head in these block types.
SyntheticModelSpec with_types(SyntheticModelSpec spec, TensorType weights, TensorType embedding,
                              TensorType output);

// Smallest vocabulary the synthetic tokenizer needs (specials + 256 bytes + merges).
constexpr int64_t kSyntheticMinVocab = 320;

// The model as a GGUF writer (metadata and tensors), ready to write or to_bytes().
GgufWriter build_synthetic_model(const SyntheticModelSpec& spec);
// Builds and writes it; throws Error on I/O failure.
void write_synthetic_model(const SyntheticModelSpec& spec, const std::filesystem::path& path);

// The synthetic vocabulary's special tokens (ids are fixed).
constexpr int32_t kSyntheticEndOfText = 0;  // "<|endoftext|>"
constexpr int32_t kSyntheticImStart = 1;    // "<|im_start|>" (BOS)
constexpr int32_t kSyntheticImEnd = 2;      // "<|im_end|>" (EOS)

}  // namespace granule
