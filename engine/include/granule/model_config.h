// The llama family's hyper-parameters and weight table, read from GGUF metadata:
// Llama 2/3 (with Llama 3 rope scaling), Mistral, SmolLM2, Qwen2 (QKV bias), Qwen3 (QK-norm).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "granule/gguf.h"

namespace granule {

enum class RopeOrdering { Normal, NeoX };   // interleaved pairs (llama) / split halves (qwen)

struct RopeScaling {
  std::string type = "none";   // "none", "linear", "llama3"
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int64_t original_context = 8192;
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

  // Bytes of K+V per token over all layers at the given element size (2 for fp16).
  int64_t kv_bytes_per_token(int64_t elem_bytes) const {
    return n_layer * 2 * n_head_kv * head_dim * elem_bytes;
  }

  // Reads and checks the config; throws UnsupportedError for an architecture outside the
  // llama family and FormatError for missing or inconsistent keys.
  static ModelConfig from_gguf(const ModelFile& file);
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
