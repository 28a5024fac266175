// Gemma 3's and Gemma 4's hyper-parameters and extra tensors, read from GGUF as llama.cpp
// reads them (src/models/gemma3.cpp, gemma4.cpp, the shared loader in src/llama-model.cpp).
#pragma once
#include <string>
#include <string_view>

#include "granule/model_config.h"

namespace granule {

bool is_gemma_architecture(std::string_view architecture);

// Fills the Gemma fields of a config whose shared keys (sizes, heads, rope base, scaling)
// ModelConfig::from_gguf has read; throws FormatError for a bad sliding-window pattern and
// UnsupportedError for what is not run yet.
void read_gemma_config(const ModelFile& file, ModelConfig& config);

// Gemma 4's whole config (its sizes differ by layer kind, so the shared reader does not apply):
// everything ModelConfig::from_gguf fills, from the file. Throws FormatError / UnsupportedError
// (the mixture-of-experts 26B-A4B, a fused QKV) naming the key or tensor.
void read_gemma4_config(const ModelFile& file, ModelConfig& config);

// Gemma 4's weight table, through the caller's checked lookup
// find(name, dims, required) -> const TensorInfo*.
template <typename FindChecked>
void find_gemma4_tensors(const ModelFile& file, const ModelConfig& c, WeightTable& w,
                         FindChecked&& find);

// The sandwich norms of layer `prefix` ("blk.N."), found with the caller's checked lookup.
template <typename FindChecked>
void find_gemma_layer_tensors(const ModelConfig& c, const std::string& prefix, LayerWeights& l,
                              FindChecked&& find) {
  if (!c.sandwich_norms) return;
  l.attn_post_norm = find(prefix + "post_attention_norm.weight", {c.n_embd}, true);
  l.ffn_post_norm = find(prefix + "post_ffw_norm.weight", {c.n_embd}, true);
}

// Throws UnsupportedError naming a tensor llama.cpp's Gemma 4 graph would use that is not run here.
void refuse_gemma4_tensor(const ModelFile& file, const std::string& name);

template <typename FindChecked>
void find_gemma4_tensors(const ModelFile& file, const ModelConfig& c, WeightTable& w,
                         FindChecked&& find) {
  const int64_t n_pl = c.n_embd_per_layer;
  w.token_embd = find("token_embd.weight", {c.n_embd, c.n_vocab}, true);
  w.output_norm = find("output_norm.weight", {c.n_embd}, true);
  w.output = c.tied_embeddings ? w.token_embd : find("output.weight", {c.n_embd, c.n_vocab}, true);
  bool any_global = false;
  for (int64_t i = 0; i < c.n_layer; ++i) any_global = any_global || !c.layer_slides(i);
  w.rope_freqs = find("rope_freqs.weight", {c.head_dim / 2}, any_global);
  if (n_pl > 0) {
    w.ple_token_embd = find("per_layer_token_embd.weight", {n_pl * c.n_layer, c.n_vocab}, true);
    w.ple_model_proj = find("per_layer_model_proj.weight", {c.n_embd, n_pl * c.n_layer}, true);
    w.ple_proj_norm = find("per_layer_proj_norm.weight", {n_pl}, true);
  }
  w.layers.resize(static_cast<size_t>(c.n_layer));
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    LayerWeights& l = w.layers[static_cast<size_t>(i)];
    for (const char* name : {"attn_qkv.weight", "ffn_gate_up_exps.weight"})
      if (file.find_tensor(p + name)) refuse_gemma4_tensor(file, p + name);
    const int64_t hd = c.head_dim_of(i), q_dim = c.n_head * hd, kv_dim = c.kv_dim_of(i);
    const int64_t n_ff = c.n_ff_of(i);
    const bool own_kv = c.kv_source(i) == i;
    l.attn_norm = find(p + "attn_norm.weight", {c.n_embd}, true);
    l.wq = find(p + "attn_q.weight", {c.n_embd, q_dim}, true);
    if (own_kv) {  // a shared layer's K and V are never read
      l.wk = find(p + "attn_k.weight", {c.n_embd, kv_dim}, true);
      l.wv = find(p + "attn_v.weight", {c.n_embd, kv_dim}, false);  // absent: V is K
      l.k_norm = find(p + "attn_k_norm.weight", {hd}, true);
    }
    l.wo = find(p + "attn_output.weight", {q_dim, c.n_embd}, true);
    l.q_norm = find(p + "attn_q_norm.weight", {hd}, true);
    l.attn_post_norm = find(p + "post_attention_norm.weight", {c.n_embd}, true);
    l.out_scale = find(p + "layer_output_scale.weight", {1}, false);
    l.ffn_norm = find(p + "ffn_norm.weight", {c.n_embd}, true);
    l.w_gate = find(p + "ffn_gate.weight", {c.n_embd, n_ff}, true);
    l.w_up = find(p + "ffn_up.weight", {c.n_embd, n_ff}, true);
    l.w_down = find(p + "ffn_down.weight", {n_ff, c.n_embd}, true);
    l.ffn_post_norm = find(p + "post_ffw_norm.weight", {c.n_embd}, true);
    if (c.is_moe()) {  // experts beside the dense FFN on every layer
      const ExpertConfig& m = c.moe;
      l.router = find(p + "ffn_gate_inp.weight", {c.n_embd, m.n_expert}, true);
      l.router_in_scale = find(p + "ffn_gate_inp.scale", {c.n_embd}, true);
      l.gate_exps = find(p + "ffn_gate_exps.weight", {c.n_embd, m.n_ff_exp, m.n_expert}, true);
      l.up_exps = find(p + "ffn_up_exps.weight", {c.n_embd, m.n_ff_exp, m.n_expert}, true);
      l.down_exps = find(p + "ffn_down_exps.weight", {m.n_ff_exp, c.n_embd, m.n_expert}, true);
      l.down_exps_scale = find(p + "ffn_down_exps.scale", {m.n_expert}, false);
      l.ffn_pre_norm_2 = find(p + "pre_ffw_norm_2.weight", {c.n_embd}, true);
      l.ffn_post_norm_1 = find(p + "post_ffw_norm_1.weight", {c.n_embd}, true);
      l.ffn_post_norm_2 = find(p + "post_ffw_norm_2.weight", {c.n_embd}, true);
    } else if (file.find_tensor(p + "ffn_gate_inp.weight")) {
      refuse_gemma4_tensor(file, p + "ffn_gate_inp.weight");
    }
    if (n_pl > 0) {
      l.ple_gate = find(p + "inp_gate.weight", {c.n_embd, n_pl}, true);
      l.ple_proj = find(p + "proj.weight", {n_pl, c.n_embd}, true);
      l.ple_norm = find(p + "post_norm.weight", {c.n_embd}, true);
    }
  }
}

}  // namespace granule
