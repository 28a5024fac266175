// The synthetic models' named shapes (SyntheticModelSpec::preset): toy sizes for exact tests
// and the real shapes of downloaded models (Llama 3 8B, Qwen3-30B-A3B, gpt-oss-20b, Gemma 3 12B,
// Gemma 4 E4B, Qwen3.5 9B, ...) with llama-quantize-like block-type mixes.
#include <string>
#include <string_view>
#include <vector>

#include "granule/error.h"
#include "granule/testkit/synthetic_model.h"

namespace granule {
namespace {
// llama-quantize's Q4_K_M for a mixture of experts: Q4_K everywhere, Q6_K for the output head
// and, in the layers its use_more_bits() picks (the first and last eighth, and every third
// between), for attn_v and ffn_down_exps; the router stays F32.
void q4_k_m_like(SyntheticModelSpec& s) {
  s.weight_type = TensorType::Q4_K;
  s.expert_type = TensorType::Q4_K;
  s.embedding_type = TensorType::Q4_K;
  s.output_type = TensorType::Q6_K;
  s.router_type = TensorType::F32;
  const int64_t n = s.n_layer;
  for (int64_t i = 0; i < n; ++i) {
    if (i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2) {
      const std::string p = "blk." + std::to_string(i) + ".";
      s.tensor_types.push_back({p + "attn_v.weight", TensorType::Q6_K});
      s.tensor_types.push_back({p + "ffn_down_exps.weight", TensorType::Q6_K});
    }
  }
}

// gpt-oss's attention and norms as its converter writes them: QKV and output biases, sinks,
// sliding windows on alternate layers, YaRN 32 (rope_original_context set by the caller), rope
// base 150000; its mixture of experts has router and expert biases.
void gpt_oss_attention(SyntheticModelSpec& s) {
  s.architecture = "gpt-oss";
  s.qkv_bias = true;
  s.attn_sinks = true;
  s.attn_output_bias = true;
  s.yarn_rope_scaling = true;
  s.rope_scaling_factor = 32.0f;
  s.rope_theta = 150000.0f;
  s.expert_biases = true;
}

// Gemma 3's layers as its converter writes them: QK norms, sandwich norms, 5 sliding layers
// to 1 global, rope bases 1e6 (global, linear 8) and 1e4 (local), tied embeddings.
void gemma3_layers(SyntheticModelSpec& s) {
  s.architecture = "gemma3";
  s.qk_norm = true;
  s.tied_embeddings = true;
  s.sliding_window_pattern = 6;
  s.rope_theta = 1000000.0f;
  s.rope_theta_swa = 10000.0f;
  s.linear_rope_scaling = true;
  s.rope_scaling_factor = 8.0f;
  s.rms_eps = 1e-6f;
}

}  // namespace

SyntheticModelSpec SyntheticModelSpec::preset(std::string_view name) {
  SyntheticModelSpec s;
  s.name = std::string(name);
  if (name == "tiny") return s;
  if (name == "tiny-gemma3") {
    gemma3_layers(s);
    s.n_layer = 6;
    s.n_head = 4;
    s.n_head_kv = 2;
    s.head_dim = 32;  // q width 128 over a hidden size of 64, as Gemma's 4096 over 3840
    s.sliding_window = 8;
    s.context_length = 1024;
    s.seed = 41;
    return s;
  }
  if (name == "small-gemma3") {
    // A Gemma 3 shape the CPU runs in seconds whose KV still spans many granules (f32 KV: 160
    // KiB a token in the 10 sliding layers, 32 KiB in the 2 global ones; a window of 256): the
    // KV panel's recording of global KV growing beside window KV staying flat.
    gemma3_layers(s);
    s.n_layer = 12;
    s.n_head = 8;
    s.n_head_kv = 8;
    s.head_dim = 256;
    s.n_embd = 256;
    s.n_ff = 512;
    s.sliding_window = 256;
    s.context_length = 8192;
    s.seed = 43;
    return s;
  }
  if (name == "tiny-gemma4" || name == "tiny-gemma4-moe") {
    s.architecture = "gemma4";
    s.qk_norm = true;
    s.tied_embeddings = true;
    s.n_layer = 8;
    s.n_head = 4;
    s.n_head_kv = 1;  // global
    s.head_dim = 64;
    s.n_head_kv_swa = 2;
    s.head_dim_swa = 32;
    s.rope_dims_swa = 16;
    s.global_rope_fraction = 0.25f;
    s.global_v_is_k = true;
    s.sliding_window = 8;
    s.sliding_window_pattern = 6;
    s.shared_kv_layers = 2;
    s.n_ff_shared = 256;
    s.n_embd_per_layer = 16;
    s.rope_theta = 1000000.0f;
    s.rope_theta_swa = 10000.0f;
    s.final_logit_softcap = 30.0f;
    s.rms_eps = 1e-6f;
    s.context_length = 1024;
    s.seed = 51;
    if (name == "tiny-gemma4-moe") {  // the 26B-A4B form: experts, no shared KV, no PLE
      s.shared_kv_layers = 0;
      s.n_ff_shared = 0;
      s.n_embd_per_layer = 0;
      s.n_expert = 4;
      s.n_expert_used = 2;
      s.n_ff_exp = 32;
      s.seed = 52;
    }
    return s;
  }
  if (name == "gemma3-12b") {
    gemma3_layers(s);
    s.n_layer = 48;
    s.n_embd = 3840;
    s.n_head = 16;
    s.n_head_kv = 8;
    s.head_dim = 256;
    s.n_ff = 15360;
    s.n_vocab = 262144;
    s.sliding_window = 1024;
    s.context_length = 131072;
    s.weight_type = TensorType::Q4_K;
    s.embedding_type = TensorType::Q6_K;
    for (int64_t i = 0; i < s.n_layer; ++i) {
      const int64_t n = s.n_layer;
      if (i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2) {
        const std::string p = "blk." + std::to_string(i) + ".";
        s.tensor_types.push_back({p + "attn_v.weight", TensorType::Q6_K});
        s.tensor_types.push_back({p + "ffn_down.weight", TensorType::Q6_K});
      }
    }
    return s;
  }
  if (name == "gemma4-e4b") {
    // Gemma 4 E4B's text decoder (llama.cpp's gemma4 loader names 42 layers E4B): 42 layers of
    // 2,560, 8 query heads; 5 sliding layers (heads of 256 over 2 KV heads, fully rotated, rope
    // base 1e4, window 512) to 1 global (heads of 512 over 2 KV heads, V = K, a quarter of each
    // head rotated through rope_freqs' proportional divisors, base 1e6), 7 times; the last 18
    // layers read the KV of the last earlier layer of their kind; FFN 10,240 in every layer (no
    // double-wide FFN on the shared layers: the converter widens only where use_double_wide_mlp
    // is set); per-layer embeddings of 256 (a table of 262,144 x 10,752); vocabulary 262,144,
    // tied embeddings, soft-cap 30, 128K context. Types Q4_K_M-like, as gemma3-12b: Q4_K layers,
    // Q6_K embeddings (the per-layer table too: the writer's embedding type) and attn_v /
    // ffn_down in use_more_bits() layers.
    s.architecture = "gemma4";
    s.qk_norm = true;
    s.tied_embeddings = true;
    s.n_layer = 42;
    s.n_embd = 2560;
    s.n_head = 8;
    s.n_head_kv = 2;  // global
    s.head_dim = 512;
    s.n_head_kv_swa = 2;
    s.head_dim_swa = 256;
    s.rope_dims_swa = 0;  // all
    s.global_rope_fraction = 0.25f;
    s.global_v_is_k = true;
    s.sliding_window = 512;
    s.sliding_window_pattern = 6;
    s.shared_kv_layers = 18;
    s.n_ff = 10240;
    s.n_embd_per_layer = 256;
    s.n_vocab = 262144;
    s.rope_theta = 1000000.0f;
    s.rope_theta_swa = 10000.0f;
    s.final_logit_softcap = 30.0f;
    s.rms_eps = 1e-6f;
    s.context_length = 131072;
    s.weight_type = TensorType::Q4_K;
    s.embedding_type = TensorType::Q6_K;
    s.seed = 53;
    const int64_t n = s.n_layer;
    for (int64_t i = 0; i < n; ++i) {
      if (i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2) {
        const std::string p = "blk." + std::to_string(i) + ".";
        s.tensor_types.push_back({p + "attn_v.weight", TensorType::Q6_K});
        s.tensor_types.push_back({p + "ffn_down.weight", TensorType::Q6_K});
      }
    }
    return s;
  }
  if (name == "tiny-gpt-oss" || name == "tiny-gpt-oss-mxfp4") {
    gpt_oss_attention(s);
    s.n_layer = 3;  // sliding, full, sliding
    s.n_head = 4;
    s.n_head_kv = 2;
    s.head_dim = 32;  // q width 128 over a hidden size of 64, as gpt-oss's 4096 over 2880
    s.sliding_window = 8;
    s.rope_original_context = 128;
    s.context_length = 128 * 32;
    s.n_expert = 8;
    s.n_expert_used = 4;
    s.n_ff_exp = 64;
    s.n_ff = 64;
    if (name == "tiny-gpt-oss-mxfp4") s.expert_type = TensorType::MXFP4;
    s.seed = 31;
    return s;
  }
  if (name == "gpt-oss-20b") {
    gpt_oss_attention(s);
    s.n_layer = 24;
    s.n_embd = 2880;
    s.n_head = 64;
    s.n_head_kv = 8;
    s.head_dim = 64;
    s.n_ff = 2880;
    s.n_vocab = 201088;
    s.context_length = 131072;
    s.sliding_window = 128;
    s.rope_original_context = 4096;
    s.n_expert = 32;
    s.n_expert_used = 4;
    s.n_ff_exp = 2880;
    s.weight_type = TensorType::Q8_0;
    s.embedding_type = TensorType::Q8_0;
    s.output_type = TensorType::Q8_0;
    s.expert_type = TensorType::MXFP4;
    s.router_type = TensorType::F32;
    return s;
  }
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
  if (name == "tiny-qwen3moe") {
    s.architecture = "qwen3moe";
    s.qk_norm = true;
    s.head_dim = 32;
    s.rope_theta = 1000000.0f;
    s.rms_eps = 1e-6f;
    s.n_expert = 8;
    s.n_expert_used = 2;
    s.n_ff_exp = 32;
    s.seed = 21;
    return s;
  }
  if (name == "tiny-mixtral") {
    s.n_expert = 4;
    s.n_expert_used = 2;
    s.rope_theta = 1000000.0f;
    s.seed = 22;
    return s;
  }
  if (name == "qwen3-30b-a3b") {
    s.architecture = "qwen3moe";
    s.n_layer = 48;
    s.n_embd = 2048;
    s.n_head = 32;
    s.n_head_kv = 4;
    s.head_dim = 128;
    s.n_ff = 6144;
    s.n_vocab = 151936;
    s.context_length = 40960;
    s.rope_theta = 1000000.0f;
    s.rms_eps = 1e-6f;
    s.qk_norm = true;
    s.n_expert = 128;
    s.n_expert_used = 8;
    s.n_ff_exp = 768;
    q4_k_m_like(s);
    return s;
  }
  if (name == "mixtral-8x7b") {
    s.n_layer = 32;
    s.n_embd = 4096;
    s.n_head = 32;
    s.n_head_kv = 8;
    s.n_ff = 14336;
    s.n_vocab = 32000;
    s.context_length = 32768;
    s.rope_theta = 1000000.0f;
    s.n_expert = 8;
    s.n_expert_used = 2;
    q4_k_m_like(s);
    return s;
  }
  if (name == "tiny-qwen35" || name == "tiny-qwen35moe") {
    s.architecture = name == "tiny-qwen35" ? "qwen35" : "qwen35moe";
    s.n_layer = 5;  // delta, delta, delta, attention, delta
    s.head_dim = 32;
    s.rope_dims = 16;
    s.rope_sections = {3, 3, 2, 0};
    s.rope_theta = 10000000.0f;
    s.rms_eps = 1e-6f;
    if (name == "tiny-qwen35moe") {
      s.n_expert = 8;
      s.n_expert_used = 2;
      s.n_ff_exp = 32;
      s.n_ff_shexp = 48;
    }
    s.seed = name == "tiny-qwen35" ? 35 : 36;
    return s;
  }
  if (name == "qwen35-9b") {
    // Qwen3.5-9B's text model as llama.cpp's loader reads it (qwen35.cpp: 32 layers and a
    // width other than 2560 make the 9B), with the sizes its GGUF carries: 4096 wide, ff 12288,
    // 16/4 heads of 256, rope over 64 dimensions in sections 11/11/10/0, base 1e7, DeltaNet
    // state 128, conv 4, 32 value heads (time_step_rank) over 16 key heads (group_count),
    // full attention every 4th layer, vocab 248320, context 262144, eps 1e-6.
    s.architecture = "qwen35";
    s.n_layer = 32;
    s.n_embd = 4096;
    s.n_head = 16;
    s.n_head_kv = 4;
    s.head_dim = 256;
    s.n_ff = 12288;
    s.n_vocab = 248320;
    s.context_length = 262144;
    s.rope_theta = 10000000.0f;
    s.rms_eps = 1e-6f;
    s.rope_dims = 64;
    s.rope_sections = {11, 11, 10, 0};
    s.ssm_state_size = 128;
    s.ssm_n_k_heads = 16;
    s.ssm_n_v_heads = 32;
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
  return {"tiny",          "tiny-gqa",           "tiny-qwen2",     "tiny-qwen3",
          "kv-wide",       "small-256",          "smollm2-135m",   "llama3-8b",
          "tiny-qwen3moe", "tiny-mixtral",       "qwen3-30b-a3b",  "mixtral-8x7b",
          "tiny-gpt-oss",  "tiny-gpt-oss-mxfp4", "gpt-oss-20b",    "tiny-gemma3",
          "small-gemma3",  "gemma3-12b",         "tiny-gemma4",    "tiny-gemma4-moe",
          "gemma4-e4b",    "tiny-qwen35",        "tiny-qwen35moe", "qwen35-9b"};
}

}  // namespace granule
