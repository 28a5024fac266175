// Gemma 3 as llama.cpp reads it (src/models/gemma3.cpp, llama-model.cpp, llama-hparams.cpp):
//   - NeoX rotation; sliding-window layers (attention.sliding_window, when present and
//     positive) in a pattern of attention.sliding_window_pattern — one bool per layer, or a
//     period n (default 6) where layer i slides when i % n < n - 1 — rotating with
//     rope.freq_base_swa (llama.cpp's default 10000 when absent) and no rope scaling; the
//     global layers take rope.freq_base and the file's rope scaling (linear 8 in the 4B-27B).
//   - QK norms, sandwich norms, GeGLU, embeddings times sqrt(n_embd), an optional final logit
//     soft-cap, and the attention scale 1/sqrt(head_dim) — 1/sqrt(n_embd / n_head) for the
//     62-layer 27B (llama.cpp keys it on the layer count; the file has no key for it).
// The converter stores Gemma's norm weights as 1 + w, so every norm is a plain RMSNorm here.
#include "model/gemma_config.h"

#include <cmath>

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

}  // namespace

bool is_gemma_architecture(std::string_view architecture) {
  return architecture == "gemma3" || architecture == "gemma4";
}

void read_gemma_config(const ModelFile& file, ModelConfig& c) {
  const std::string a = c.architecture + ".";
  if (c.architecture == "gemma4") {
    throw UnsupportedError(file_label(file) +
                           ": architecture 'gemma4' is not supported yet (Gemma 3 is)");
  }
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
