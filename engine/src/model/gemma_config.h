// Gemma 3's hyper-parameters and extra per-layer tensors, read from GGUF as llama.cpp reads
// them (src/models/gemma3.cpp, the shared loader in src/llama-model.cpp).
#pragma once
#include <string_view>

#include "granule/model_config.h"

namespace granule {

bool is_gemma_architecture(std::string_view architecture);

// Fills the Gemma fields of a config whose shared keys (sizes, heads, rope base, scaling)
// ModelConfig::from_gguf has read; throws FormatError for a bad sliding-window pattern and
// UnsupportedError for what is not run yet (Gemma 4).
void read_gemma_config(const ModelFile& file, ModelConfig& config);

// The sandwich norms of layer `prefix` ("blk.N."), found with the caller's checked lookup.
template <typename FindChecked>
void find_gemma_layer_tensors(const ModelConfig& c, const std::string& prefix, LayerWeights& l,
                              FindChecked&& find) {
  if (!c.sandwich_norms) return;
  l.attn_post_norm = find(prefix + "post_attention_norm.weight", {c.n_embd}, true);
  l.ffn_post_norm = find(prefix + "post_ffw_norm.weight", {c.n_embd}, true);
}

}  // namespace granule
