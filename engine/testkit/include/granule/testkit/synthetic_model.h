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
  // gpt-oss's attention: learned per-head sinks (blk.N.attn_sinks.weight [n_head]), an output
  // bias (blk.N.attn_output.bias), and {arch}.attention.sliding_window when > 0 (llama.cpp
  // then slides every other layer, the even ones, for gpt-oss).
  bool attn_sinks = false;
  bool attn_output_bias = false;
  int64_t sliding_window = 0;
  // YaRN rope scaling (rope.scaling.type "yarn") with rope_scaling_factor and
  // rope_original_context below.
  bool yarn_rope_scaling = false;

  // Gemma 3 ("gemma3"): every layer has QK norms (set qk_norm) and the sandwich norms
  // blk.N.post_attention_norm / post_ffw_norm; layers slide in a period of
  // sliding_window_pattern (written when > 0; llama.cpp's Gemma 3 default is 6) with their
  // own rope base rope_theta_swa (rope.freq_base_swa, written when > 0);
  // final_logit_softcapping written when > 0; linear rope scaling (rope.scaling.type "linear",
  // factor rope_scaling_factor) when linear_rope_scaling.
  int64_t sliding_window_pattern = 0;
  float rope_theta_swa = 0.0f;
  float final_logit_softcap = 0.0f;
  bool linear_rope_scaling = false;
  // Gemma 4 ("gemma4", written as its converter writes it): the sliding layers' head size and
  // KV heads (head_dim / n_head_kv are the global layers'), a bool-array window pattern of
  // period sliding_window_pattern (default 6), the sliding layers' rotated dimensions
  // (rope_dims_swa; 0: all), the global layers' "proportional" rope as rope_freqs.weight (1 for
  // the first global_rope_fraction of the pairs, 1e30 after), the last shared_kv_layers layers
  // reading earlier KV (their FFN n_ff_shared wide when > 0), global layers without attn_v
  // (V is K) when global_v_is_k, per-layer embeddings n_embd_per_layer wide, and a
  // layer_output_scale per layer.
  int64_t head_dim_swa = 0;
  int64_t n_head_kv_swa = 0;
  int64_t rope_dims_swa = 0;
  float global_rope_fraction = 1.0f;
  int64_t shared_kv_layers = 0;
  int64_t n_ff_shared = 0;
  bool global_v_is_k = false;
  int64_t n_embd_per_layer = 0;
  // The mean of Gemma 4's attn_q_norm / attn_k_norm weights (spread a tenth of it). Its
  // attention scale is 1: trained norms keep Q·K moderate, and random ones of 1 make the scores
  // of wide heads (std ~ sqrt(head size)) pick one key almost alone, so that rounding flips them.
  float gemma4_qk_norm = 1.0f;

  // Llama 3 rope scaling, written the way llama.cpp's converter does: a rope_freqs.weight
  // tensor of per-frequency divisors (plus the rope.scaling.* keys, for readers).
  bool llama3_rope_scaling = false;
  float rope_scaling_factor = 8.0f;
  float rope_low_freq_factor = 1.0f;
  float rope_high_freq_factor = 4.0f;
  int64_t rope_original_context = 8192;

  // A mixture of experts when n_expert > 0: every layer's FFN is n_expert SwiGLU experts with
  // a router, written as llama.cpp's converter writes them (blk.N.ffn_gate_inp.weight
  // [n_embd, n_expert], blk.N.ffn_{gate,up,down}_exps.weight 3-D [cols, rows, n_expert],
  // {arch}.expert_count / expert_used_count / expert_feed_forward_length). Architectures:
  // "qwen3moe", "llama" (Mixtral: the experts' width is n_ff; n_ff_exp must be 0 or n_ff),
  // "gpt-oss" (its FFN norm is blk.N.post_attention_norm.weight).
  int64_t n_expert = 0;
  int64_t n_expert_used = 0;
  int64_t n_ff_exp = 0;    // one expert's width; 0: n_ff
  int64_t n_ff_shexp = 0;  // > 0: a shared expert blk.N.ffn_{gate,up,down}_shexp.weight
  TensorType expert_type = TensorType::F32;  // the expert matrices (tensor_types override it)
  TensorType router_type = TensorType::F32;
  // gpt-oss: blk.N.ffn_gate_inp.bias and blk.N.ffn_{gate,up,down}_exps.bias.
  bool expert_biases = false;
  // The routers' logit scale: weights uniform(-s, s) with s = router_scale * sqrt(3 / n_embd),
  // so logits have standard deviation about router_scale for unit-size inputs.
  float router_scale = 1.0f;
  // Gating keys, written only when >= 0 (llama.cpp's graphs for the architectures above fix
  // the gating in code and do not read them).
  int32_t expert_gating_func = -1;   // 1 softmax, 2 sigmoid
  int32_t expert_weights_norm = -1;  // 0 or 1
  float expert_weights_scale = -1.0f;
  // Every tensor all zeros and never generated (GgufWriter::add_zero_tensor): real headers
  // at any shape for code that reads only them (the hub tests' 8B-shaped repository).
  bool zero_data = false;

  // Qwen3.5 hybrids (architecture "qwen35" / "qwen35moe"), written as llama.cpp's converter
  // writes them: {arch}.ssm.{conv_kernel, state_size, group_count, time_step_rank, inner_size},
  // full_attention_interval (every interval-th layer is full attention, the others Gated
  // DeltaNet), rope.dimension_count = rope_dims (partial rope) and rope.dimension_sections;
  // blk.N.post_attention_norm before the FFN; qwen35moe's shared expert (n_ff_shexp) with its
  // gate blk.N.ffn_gate_inp_shexp.weight.
  int64_t ssm_conv_kernel = 4;
  int64_t ssm_state_size = 16;
  int64_t ssm_n_k_heads = 2;
  int64_t ssm_n_v_heads = 4;
  int64_t full_attention_interval = 4;
  int64_t rope_dims = 0;  // 0: head_dim
  std::vector<int64_t> rope_sections = {0, 0, 0, 0};

  uint64_t seed = 1;
  // tokenizer.chat_template; the default is a ChatML template.
  std::string chat_template;

  // Routing skew of a mixture of experts: 0 writes routers whose experts are equally popular;
  // s > 0 scales the router row of the expert of popularity rank r (a per-layer permutation)
  // by (1 + r)^(-s/2), so that on typical hidden states expert popularity falls with rank
  // like a power law (Zipf-like; its measured shape is in cpu_gptoss_test.cpp).
  float router_skew = 0.0f;
  // Tensors of 64 KiB and more are written from a pool of valid encoded pieces drawn at
  // random instead of quantising seeded values one by one: same block type and value
  // distribution, about memory speed, for the multi-GB real shapes (granule-write-model).
  // Reproducible for a seed, but different values from the seeded ones.
  bool random_blocks = false;

  // Named shapes: "tiny" (2 layers, 64 wide), "tiny-gqa", "tiny-qwen2", "tiny-qwen3",
  // "kv-wide" (4 layers, 64 wide, 8/8 heads of 128, ctx 1024: 32 KiB of f32 KV a token),
  // "small-256" (2 layers, 256 wide, 4/2 heads of 64, ff 512, vocab 1000: the smallest shapes
  // the GPU kernels run), "smollm2-135m" (30 layers, 576, 9/3 heads, ff 1536, vocab 49152,
  // tied, ctx 8192, theta 1e5),
  // "llama3-8b" (32 layers, 4096, 32/8, ff 14336, vocab 128256, theta 5e5, llama3 scaling).
  // Mixtures of experts: "tiny-qwen3moe" (2 layers, 64 wide, 8 experts of 32, top 2, QK-norm),
  // "tiny-mixtral" (`llama`, 2 layers, 64 wide, 4 experts of 128, top 2), "qwen3-30b-a3b"
  // (48 layers, 2048, 32/4 heads of 128, 128 experts of 768, top 8, vocab 151936, a
  // Q4_K_M-like mix: Q4_K with Q6_K down/V projections in llama-quantize's layers, F32 router),
  // "mixtral-8x7b" (32 layers, 4096, 32/8, 8 experts of 14336, top 2, vocab 32000, the same mix).
  // gpt-oss: "tiny-gpt-oss" (F32, 3 layers, 64 wide, 4/2 heads of 32, 8 experts of 64, top 4,
  // window 8, YaRN 32 over an original context of 128), "tiny-gpt-oss-mxfp4" (the same with
  // MXFP4 experts), "gpt-oss-20b" (24 layers, 2880, 64/8 heads of 64, 32 experts of 2880,
  // top 4, vocab 201088, window 128, YaRN 32 / 4096, theta 150000; MXFP4 experts, Q8_0
  // attention, embeddings and head, F32 router, norms, biases and sinks).
  // Qwen3.5: "tiny-qwen35" (F32, 5 layers: delta, delta, delta, attention, delta; 64 wide,
  // 4/2 heads of 32 with rope over 16 in sections 3/3/2; DeltaNet 2 key / 4 value heads of 16,
  // conv 4), "tiny-qwen35moe" (the same with 8 experts of 32, top 2, and a shared expert of
  // 48), "qwen35-9b" (32 layers, 4096, 16/4 heads of 256, rope 64 in 11/11/10, theta 1e7,
  // DeltaNet 16 key / 32 value heads of 128, ff 12288, vocab 248320; Q4_K-like mix).
  // Gemma 3: "tiny-gemma3" (F32, 6 layers: 5 sliding with window 8 then 1 global, 64 wide,
  // 4/2 heads of 32, ff 128, tied, rope bases 1e6 global (linear 8) / 1e4 local),
  // "gemma3-12b" (48 layers, 3840, 16/8 heads of 256, ff 15360, vocab 262144, window 1024,
  // 5 local : 1 global, ctx 131072, tied; a Q4_K_M-like mix: Q4_K, Q6_K embeddings and
  // attn_v / ffn_down in llama-quantize's more-bits layers).
  // Gemma 4: "tiny-gemma4" (F32, 8 layers: 5 sliding (window 8, heads of 32, 2 KV heads,
  // half of them rotated) then 1 global (heads of 64, 1 KV head, a quarter rotated, V is K),
  // twice; the last 2 layers share KV with an FFN twice as wide, per-layer embeddings of 16,
  // soft-cap 30); "tiny-gemma4-moe" (the same layers with 4 GeGLU experts of 32, top 2, beside
  // each dense FFN, as the 26B-A4B; no shared KV, no per-layer embeddings); "gemma4-e4b" (42
  // layers, 2560, 8 heads: 5 sliding (window 512, heads of 256 over 2 KV heads, fully rotated)
  // to 1 global (heads of 512 over 2 KV heads, a quarter rotated, V is K), the last 18 layers
  // sharing KV, ff 10240, per-layer embeddings of 256, vocab 262144, ctx 131072, tied,
  // soft-cap 30; a Q4_K_M-like mix as gemma3-12b's).
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
