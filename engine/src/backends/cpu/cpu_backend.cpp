// CpuBackend: embedding → per layer (norm, QKV [+bias] [+QK-norm], rope, KV write, GQA
// attention over [0, position] or its sliding window [+sinks], output [+bias], norm, SwiGLU
// FFN or mixture of experts (moe_ffn.h)) → final norm → output head. Gemma 3 adds scaled
// embeddings, a rope base per layer kind, sandwich norms, GeGLU and a logit soft-cap; Gemma 4
// (its block below) shapes per layer kind, V norms, shared KV and per-layer embeddings.
#include "backends/cpu/cpu_backend.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <thread>
#include <utility>

#include "backends/cpu/fast_matmul.h"
#include "backends/cpu/gemma_ops.h"
#include "backends/cpu/ops.h"
#include "backends/cpu/row_kernels.h"
#include "backends/kernel_config_env.h"
#include "granule/error.h"
#include "granule/log.h"
#include "granule/quant.h"
#include "granule/split_layout.h"
#include "model/rope.h"
#include "model/weight_split.h"

namespace granule::cpu {
namespace {

std::vector<float> to_f32(const TensorInfo* t) {
  if (!t) return {};
  std::vector<float> out(static_cast<size_t>(t->elements()));
  dequantize_row(static_cast<TensorType>(t->ggml_type), t->data, out.data(), t->elements());
  return out;
}

TensorType type_of(const TensorInfo* t) { return static_cast<TensorType>(t->ggml_type); }

void add_bias(float* y, const std::vector<float>& bias, int64_t n_tokens) {
  if (bias.empty()) return;
  const auto n = static_cast<int64_t>(bias.size());
  for (int64_t t = 0; t < n_tokens; ++t) add_in_place(y + t * n, bias.data(), n);
}

// CudaModel::kMatvecMaxRows: the most rows the CUDA backend runs through its matvec kernels;
// a larger chunk goes through cuBLAS with f16 operands.
constexpr int64_t kGpuMatvecMaxRows = 64;

int32_t thread_count(const BackendOptions& options) {
  if (options.cpu_threads > 0) return options.cpu_threads;
  return static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace

struct CpuBackend::LayerVectors {
  std::vector<float> attn_norm, ffn_norm, bq, bk, bv, q_norm, k_norm;
  std::vector<float> bo, attn_sinks;                 // gpt-oss: output bias, per-head sink logits
  std::vector<float> attn_post_norm, ffn_post_norm;  // Gemma's sandwich norms
  std::vector<float> ple_norm;                       // Gemma 4's per-layer embedding norm
  // Gemma 4's experts: their input norm, the two output norms, the router input's scale.
  std::vector<float> moe_pre_norm, moe_post_norm_1, moe_post_norm_2, router_in_scale;
  float out_scale = 1.0f;  // Gemma 4's layer output scale
};

struct CpuBackend::Scratch {
  int64_t capacity_tokens = 0;
  std::vector<int32_t> token_slot;
  std::vector<int64_t> token_position;
  std::vector<float> x, xn, q, k, v, attn, proj, gate, up, head_in;
  std::vector<float> rounded;  // emulating: a chunk's input as the GPU rounds it
  // Each token's rope cosines then sines at its position (rope_frequencies_), [token][2][half].
  std::vector<float> rope_angles;
  // Gemma 4: each token's per-layer embedding inputs [token][layer][n_pl], and one layer's gate.
  std::vector<float> ple, ple_gate;
  std::vector<float> moe_out;  // Gemma 4: the experts' output beside the dense FFN's
  std::vector<std::pair<int64_t, int64_t>> attention_tiles;  // [first, end) tokens of a slot

  void reserve(const ModelConfig& c, int64_t tokens) {
    if (tokens <= capacity_tokens) return;
    capacity_tokens = tokens;
    const auto t = static_cast<size_t>(tokens);
    token_slot.resize(t);
    token_position.resize(t);
    x.resize(t * c.n_embd);
    xn.resize(t * c.n_embd);
    // Gemma 4's layer kinds differ in head size and KV heads: room for the widest.
    int64_t head_dim = c.head_dim, kv_dim = c.n_head_kv * c.head_dim;
    for (int64_t l = 0; l < c.n_layer; ++l) {
      head_dim = std::max(head_dim, c.head_dim_of(l));
      kv_dim = std::max(kv_dim, c.kv_dim_of(l));
    }
    q.resize(t * c.n_head * head_dim);
    k.resize(t * kv_dim);
    v.resize(t * kv_dim);
    attn.resize(t * c.n_head * head_dim);
    proj.resize(t * c.n_embd);
    // MoeFfn has its own; Gemma 4's expert layers also have a dense FFN.
    const bool dense = !c.is_moe() || c.architecture == "gemma4";
    const auto ff = static_cast<size_t>(dense ? c.n_ff : 0);
    gate.resize(t * ff);
    up.resize(t * ff);
    head_in.resize(t * c.n_embd);
    ple.resize(t * c.n_layer * c.n_embd_per_layer);
    ple_gate.resize(t * c.n_embd_per_layer);
    if (c.is_moe()) moe_out.resize(t * c.n_embd);
  }
};

CpuBackend::CpuBackend(const BackendInit& init)
    : config_(init.config),
      weights_(init.weights),
      memory_(init.memory),
      pool_(thread_count(init.options)),
      scratch_(std::make_unique<Scratch>()),
      emulate_(init.options.cpu_emulate_device_numerics),
      fast_(!init.options.cpu_emulate_device_numerics && !init.options.cpu_exact_numerics) {
  if (config_.is_hybrid()) {
    // qwen35moe: the mixers round as cuda_hybrid.cpp does (its FFN is MoeFfn's emulation). The
    // dense form's FFN (and its batch-1 fusion) has no emulation: its GPU test compares with the
    // exact path (qwen35_gpu_test.cpp).
    if (emulate_ && !config_.is_moe()) {
      throw UnsupportedError("CPU backend: the CUDA backend's rounding of " + config_.architecture +
                             " models is not defined (only of qwen35moe's)");
    }
    MixerNumerics numerics;
    if (emulate_) {
      // No f16 tensor-core products on hybrid layers (CudaModel::takes_f16mma): int8 or f32
      // inputs up to 64 rows, the cuBLAS path's f16 above.
      numerics.project = [this](const TensorInfo* w, const float* x, int64_t n_tokens, float* y,
                                MixerInput input) {
        project(w, x, n_tokens, y, input == MixerInput::Norm ? Input::Norm : Input::Attention,
                false);
      };
      numerics.kv_through_f16 = true;
    }
    hybrid_ = std::make_unique<HybridLayers>(config_, weights_, std::move(numerics));
  }
  if (emulate_) {
    const kernels::KernelConfig kernels =
        init.options.kernel_config ? *init.options.kernel_config : kernel_config_from_environment();
    split_weights_ = kernels.split_weights;
    f16_min_rows_ = kernels.f16_mma_min_rows;
    chunk_rows_ = std::max(kGpuMatvecMaxRows, init.options.max_tokens_per_pass);
    // cuda_model.cpp's takes_f16mma(): every matrix split in a type the f16 products read
    // (matvec_f16mma_supports), gate and up alike.
    auto f16_capable = [&](const TensorInfo* w) {
      return kernels::split::f16mma_reads(w->ggml_type) && split_weights_ &&
             split_layout_fits(w->ggml_type, w->dims[0]);
    };
    for (const LayerWeights& l : weights_.layers) {
      // An expert layer's attention keeps the int8/f32 rules (its FFN has no dense matrices);
      // Gemma 4's layers take the int8/f32 products only (cuda_gemma4.cpp).
      bool f16 =
          l.w_gate && type_of(l.w_gate) == type_of(l.w_up) && config_.architecture != "gemma4";
      if (!f16) {
        f16_layers_.push_back(false);
        continue;
      }
      for (const TensorInfo* w : {l.wq, l.wk, l.wv, l.wo, l.w_gate, l.w_up, l.w_down})
        f16 = f16 && f16_capable(w);
      f16_layers_.push_back(f16);
    }
  }
  // The weights stay in the file mapping; on the CPU that mapping is the "device" copy.
  charged_weight_bytes_ = weights_.total_bytes();
  memory_.charge(MemoryCategory::WeightsResident, charged_weight_bytes_);

  std::vector<float> freq_factors = to_f32(weights_.rope_freqs);
  rope_frequencies_ = rope_frequencies(config_.head_dim, config_.rope_theta, config_.rope_scaling,
                                       freq_factors.empty() ? nullptr : freq_factors.data());
  rope_magnitude_ = rope_magnitude(config_.rope_scaling);
  if (config_.rope_theta_swa > 0.0f) {
    int64_t swa_dims = config_.head_dim;
    for (int64_t l = 0; l < config_.n_layer; ++l)
      if (config_.layer_slides(l)) swa_dims = config_.rope_dims_of(l);
    rope_frequencies_swa_ =
        rope_frequencies(swa_dims, config_.rope_theta_swa, RopeScaling{}, nullptr);
  }
  for (int64_t l = 0; l < config_.n_layer; ++l)
    kv_offsets_.push_back(config_.kv_offset_elements(l));
  // KV by layer kind: each layer's part of a slot (memory/kv_space.h); attach_kv() says where.
  for (int64_t l = 0; l < config_.n_layer; ++l)
    kv_part_token_bytes_.push_back(config_.kv_part_elements(config_.kv_part(l)) *
                                   kCpuKvElementBytes);
  kv_part_offset_bytes_.assign(static_cast<size_t>(config_.n_layer), 0);
  // Summed over the layers once: kv_at asks for it on every KV read.
  kv_token_bytes_ = config_.kv_bytes_per_token(kCpuKvElementBytes);
  ple_proj_norm_ = to_f32(weights_.ple_proj_norm);
  output_norm_ = to_f32(weights_.output_norm);
  layers_.reserve(weights_.layers.size());
  for (const LayerWeights& l : weights_.layers) {
    layers_.push_back({to_f32(l.attn_norm), to_f32(l.ffn_norm), to_f32(l.bq), to_f32(l.bk),
                       to_f32(l.bv), to_f32(l.q_norm), to_f32(l.k_norm), to_f32(l.bo),
                       to_f32(l.attn_sinks), to_f32(l.attn_post_norm), to_f32(l.ffn_post_norm),
                       to_f32(l.ple_norm), to_f32(l.ffn_pre_norm_2), to_f32(l.ffn_post_norm_1),
                       to_f32(l.ffn_post_norm_2), to_f32(l.router_in_scale),
                       l.out_scale ? to_f32(l.out_scale)[0] : 1.0f});
    if (config_.is_moe()) moe_.push_back(std::make_unique<MoeFfn>(config_, l));
  }
  if (fast_) fast_matmul_ = std::make_unique<FastMatmul>(weights_, pool_);
  logger("engine.cpu")
      ->info("CPU backend: {} threads, {} layers, weights {} MiB, {} matmuls ({} MiB repacked)",
             pool_.threads(), config_.n_layer, charged_weight_bytes_ >> 20,
             fast_ ? "int8" : "exact f32", fast_ ? fast_matmul_->packed_bytes() >> 20 : 0);
}

CpuBackend::~CpuBackend() {
  memory_.release(MemoryCategory::WeightsResident, charged_weight_bytes_);
  memory_.release(MemoryCategory::RecurrentState, charged_state_bytes_);
}

void CpuBackend::attach_kv(KvSpace& kv) {
  kv_ = &kv;
  const std::vector<KvPartGeometry> expected = kv_parts(config_, kCpuKvElementBytes);
  if (static_cast<size_t>(kv.parts()) != std::max<size_t>(expected.size(), 1))
    throw UsageError("CPU backend: the KV space's parts differ from the model's layer kinds");
  for (int64_t l = 0; l < config_.n_layer; ++l)
    kv_part_offset_bytes_[static_cast<size_t>(l)] =
        static_cast<int64_t>(kv.part_offset_bytes(config_.kv_part(l)));
  if (!hybrid_) return;
  memory_.release(MemoryCategory::RecurrentState, charged_state_bytes_);
  charged_state_bytes_ = 0;
  hybrid_->resize(kv.geometry().slots);
  charged_state_bytes_ = hybrid_->bytes();
  memory_.charge(MemoryCategory::RecurrentState, charged_state_bytes_);
}

std::string CpuBackend::name() const {
  return "CPU (" + std::to_string(pool_.threads()) + " threads" +
         (emulate_ ? ", CUDA rounding)"
          : fast_  ? ")"
                   : ", exact)");
}

FastMatmul* CpuBackend::fast_matmul() { return fast_matmul_.get(); }

bool CpuBackend::reads_q8(const TensorInfo* w) const {
  const TensorType t = type_of(w);
  if (t == TensorType::Q4_0 || t == TensorType::Q4_1 || t == TensorType::Q8_0) return true;
  return split_weights_ && split_layout_fits(w->ggml_type, w->dims[0]);
}

void CpuBackend::project(const TensorInfo* w, const float* x, int64_t n_tokens, float* y,
                         Input input, bool f16_capable) {
  const int64_t cols = w->dims[0], rows = w->dims[1];
  const Q8Rounding rule = input == Input::Norm ? Q8Rounding::MultiplyByInverse : Q8Rounding::Divide;
  std::vector<float>& in = scratch_->rounded;
  for (int64_t first = 0; first < n_tokens; first += chunk_rows_) {
    const int64_t count = std::min(chunk_rows_, n_tokens - first);
    const bool gemm = count > kGpuMatvecMaxRows;
    // The cuBLAS path and the f16 tensor-core products round alike: f16 activations, each
    // decoded weight rounded to f16 ((q - 8) d and q d + m are exact in f32), f32 sums.
    const bool f16 = gemm || (f16_capable && f16_min_rows_ > 0 && count >= f16_min_rows_);
    in.assign(x + first * cols, x + (first + count) * cols);
    if (f16) {
      round_through_f16(in.data(), count * cols);
    } else if (reads_q8(w)) {
      for (int64_t t = 0; t < count; ++t) round_through_q8(in.data() + t * cols, cols, rule);
    }
    matmul(type_of(w), w->data, rows, cols, in.data(), count, y + first * rows, &pool_, f16);
  }
}

void CpuBackend::project_rows(const TensorInfo* w, const float* x, int64_t n_tokens, float* y) {
  if (!emulate_) {
    matmul_weight(w, x, n_tokens, y, pool_, fast_matmul());
    return;
  }
  const int64_t cols = w->dims[0], rows = w->dims[1];
  for (int64_t first = 0; first < n_tokens; first += kGpuMatvecMaxRows) {
    const int64_t count = std::min(kGpuMatvecMaxRows, n_tokens - first);
    project(w, x + first * cols, count, y + first * rows, Input::Swiglu, false);
  }
}

uint64_t CpuBackend::device_total_bytes() const { return host_memory_bytes(); }

int64_t CpuBackend::kv_bytes_per_token() const {
  static_assert(kCpuKvElementBytes == sizeof(float));
  return kv_token_bytes_;
}

std::unique_ptr<VirtualMemory> CpuBackend::make_kv_virtual_memory() {
  return make_host_virtual_memory();
}

float* CpuBackend::kv_at(int32_t slot, int64_t position, int64_t layer, bool value) const {
  // A layer's K then V in each token's record; Gemma 4's shared layers point at their source.
  const int64_t kv_dim = config_.kv_dim_of(layer);
  const auto l = static_cast<size_t>(layer);
  uint8_t* token =
      kv_->slot_base(slot) + kv_part_offset_bytes_[l] + position * kv_part_token_bytes_[l];
  return reinterpret_cast<float*>(token) + kv_offsets_[static_cast<size_t>(layer)] +
         (value ? kv_dim : 0);
}

void CpuBackend::attention_layer(int64_t layer, int64_t n_tokens) {
  const ModelConfig& c = config_;
  const LayerVectors& lv = layers_[static_cast<size_t>(layer)];
  Scratch& s = *scratch_;
  // Per layer: Gemma 4's sliding and global layers differ in head size and KV heads.
  const int64_t head_dim = c.head_dim_of(layer);
  const int64_t n_head_kv = c.n_head_kv_of(layer);
  const int64_t q_dim = c.n_head * head_dim;
  const int64_t kv_dim = n_head_kv * head_dim;

  for (int64_t t = 0; t < n_tokens; ++t) {
    rms_norm(s.x.data() + t * c.n_embd, lv.attn_norm.data(), s.xn.data() + t * c.n_embd, c.n_embd,
             c.rms_eps);
  }
  const LayerWeights& w = weights_.layers[static_cast<size_t>(layer)];
  const bool f16 = f16_layer(layer);
  if (c.value_norm) {
    gemma4_qkv(layer, n_tokens);
  } else if (emulate_) {
    project(w.wq, s.xn.data(), n_tokens, s.q.data(), Input::Norm, f16);
    project(w.wk, s.xn.data(), n_tokens, s.k.data(), Input::Norm, f16);
    project(w.wv, s.xn.data(), n_tokens, s.v.data(), Input::Norm, f16);
  } else {
    matmul_together({{w.wq, s.q.data()}, {w.wk, s.k.data()}, {w.wv, s.v.data()}}, s.xn.data(),
                    n_tokens, pool_, fast_matmul());
  }
  add_bias(s.q.data(), lv.bq, n_tokens);
  add_bias(s.k.data(), lv.bk, n_tokens);
  add_bias(s.v.data(), lv.bv, n_tokens);

  // Gemma 4's Q, K and V have had their norms, rotation and KV write in gemma4_qkv.
  for (int64_t t = 0; t < n_tokens && !c.value_norm; ++t) {
    float* q = s.q.data() + t * q_dim;
    float* k = s.k.data() + t * kv_dim;
    if (c.qk_norm) {  // Qwen3: per-head RMSNorm of Q and K before the rotation
      for (int64_t h = 0; h < c.n_head; ++h) {
        rms_norm(q + h * c.head_dim, lv.q_norm.data(), q + h * c.head_dim, c.head_dim, c.rms_eps);
      }
      for (int64_t h = 0; h < c.n_head_kv; ++h) {
        rms_norm(k + h * c.head_dim, lv.k_norm.data(), k + h * c.head_dim, c.head_dim, c.rms_eps);
      }
    }
    const int64_t position = s.token_position[static_cast<size_t>(t)];
    // Gemma's sliding layers rotate with their own base and no scaling (magnitude 1).
    const bool own_base = !rope_frequencies_swa_.empty() && c.layer_slides(layer);
    const double* frequencies = own_base ? rope_frequencies_swa_.data() : rope_frequencies_.data();
    const float magnitude = own_base ? 1.0f : rope_magnitude_;
    if (own_base) {
      rope(q, c.n_head, c.head_dim, position, frequencies, c.rope_ordering, magnitude);
      rope(k, c.n_head_kv, c.head_dim, position, frequencies, c.rope_ordering, magnitude);
    } else {  // the token's angles, computed once for every layer (run())
      const int64_t half = c.head_dim / 2;
      const float* cosines = s.rope_angles.data() + t * 2 * half;
      rope_rotate(q, c.n_head, c.head_dim, cosines, cosines + half, c.rope_ordering);
      rope_rotate(k, c.n_head_kv, c.head_dim, cosines, cosines + half, c.rope_ordering);
    }
    const int32_t slot = s.token_slot[static_cast<size_t>(t)];
    std::copy_n(k, kv_dim, kv_at(slot, position, layer, false));
    std::copy_n(s.v.data() + t * kv_dim, kv_dim, kv_at(slot, position, layer, true));
    if (emulate_) {  // the CUDA KV holds f16
      round_through_f16(kv_at(slot, position, layer, false), kv_dim);
      round_through_f16(kv_at(slot, position, layer, true), kv_dim);
    }
  }

  // Every (token, head) pair reads its sequence's KV over [0, position], or on a sliding
  // layer the window's last positions only (llama.cpp masks p0 when p1 - p0 >= window).
  const int64_t window = c.layer_slides(layer) ? c.sliding_window : 0;
  const int64_t group = c.n_head / n_head_kv;
  const int64_t token_stride =
      kv_part_token_bytes_[static_cast<size_t>(layer)] / static_cast<int64_t>(sizeof(float));
  if (fast_ && window == 0 && row_kernels_use_avx2() && (head_dim == 64 || head_dim == 128)) {
    // Runs of up to 16 tokens of one sequence times a KV head's query heads share each block
    // of keys (attention_many_avx2): the same numbers as one (token, head) at a time.
    constexpr int64_t kTileTokens = 16;
    std::vector<std::pair<int64_t, int64_t>>& tiles = s.attention_tiles;
    tiles.clear();
    for (int64_t t0 = 0; t0 < n_tokens;) {
      int64_t t1 = t0 + 1;
      while (t1 < n_tokens && t1 - t0 < kTileTokens &&
             s.token_slot[static_cast<size_t>(t1)] == s.token_slot[static_cast<size_t>(t0)])
        ++t1;
      tiles.emplace_back(t0, t1);
      t0 = t1;
    }
    const auto n_tiles = static_cast<int64_t>(tiles.size());
    pool_.parallel_for(n_tiles * n_head_kv, [&](int64_t begin, int64_t end, int32_t) {
      thread_local std::vector<AttentionQuery> queries;
      for (int64_t item = begin; item < end; ++item) {
        const auto [t0, t1] = tiles[static_cast<size_t>(item / n_head_kv)];
        const int64_t kv_head = item % n_head_kv;
        queries.clear();
        for (int64_t t = t0; t < t1; ++t) {
          for (int64_t h = kv_head * group; h < (kv_head + 1) * group; ++h) {
            queries.push_back({s.q.data() + t * q_dim + h * head_dim,
                               s.attn.data() + t * q_dim + h * head_dim,
                               s.token_position[static_cast<size_t>(t)] + 1,
                               lv.attn_sinks.empty() ? nullptr : lv.attn_sinks.data() + h});
          }
        }
        const int32_t slot = s.token_slot[static_cast<size_t>(t0)];
        const float* k = kv_at(slot, 0, layer, false) + kv_head * head_dim;
        const float* v = kv_at(slot, 0, layer, true) + kv_head * head_dim;
        if (attention_many_avx2(queries.data(), static_cast<int64_t>(queries.size()), k, v,
                                token_stride, head_dim, c.attention_scale))
          continue;
        thread_local std::vector<float> scores;  // (not reached: the condition above holds)
        for (const AttentionQuery& query : queries) {
          scores.resize(static_cast<size_t>(query.length));
          attention_head(query.q, k, v, token_stride, query.length, head_dim, scores.data(),
                         query.out, query.sink, c.attention_scale, fast_);
        }
      }
    });
  } else {
    pool_.parallel_for(n_tokens * c.n_head, [&](int64_t begin, int64_t end, int32_t) {
      thread_local std::vector<float> scores;
      for (int64_t i = begin; i < end; ++i) {
        const int64_t t = i / c.n_head;
        const int64_t h = i % c.n_head;
        const int64_t end_position = s.token_position[static_cast<size_t>(t)] + 1;
        const int64_t first = window > 0 ? std::max<int64_t>(0, end_position - window) : 0;
        const int64_t length = end_position - first;
        if (scores.size() < static_cast<size_t>(length)) scores.resize(static_cast<size_t>(length));
        const int32_t slot = s.token_slot[static_cast<size_t>(t)];
        const int64_t kv_head_offset = (h / group) * head_dim;
        attention_head(s.q.data() + t * q_dim + h * head_dim,
                       kv_at(slot, first, layer, false) + kv_head_offset,
                       kv_at(slot, first, layer, true) + kv_head_offset, token_stride, length,
                       head_dim, scores.data(), s.attn.data() + t * q_dim + h * head_dim,
                       lv.attn_sinks.empty() ? nullptr : lv.attn_sinks.data() + h,
                       c.attention_scale, fast_);
      }
    });
  }

  if (emulate_)
    project(w.wo, s.attn.data(), n_tokens, s.proj.data(), Input::Attention, f16);
  else
    matmul_weight(w.wo, s.attn.data(), n_tokens, s.proj.data(), pool_, fast_matmul());
  if (emulate_) {
    // The CUDA backend adds the output bias to the residual before the output projection
    // accumulates into it (rope_kv.cuh): (x + bo) + wo·a.
    add_bias(s.x.data(), lv.bo, n_tokens);
  } else {
    add_bias(s.proj.data(), lv.bo, n_tokens);
  }
  if (c.sandwich_norms) post_norm(s.proj.data(), lv.attn_post_norm, n_tokens);
  add_in_place(s.x.data(), s.proj.data(), n_tokens * c.n_embd);
}

// ---- Gemma 4 ------------------------------------------------------------------------------

// Q for every layer; K and V only on a layer that keeps its own KV (a shared layer reads its
// source's): Q and K RMS-normed per head with their weights, V without one (V is K's
// projection when the layer has no attn_v), the first rope_dims_of(layer) dimensions rotated
// (NeoX pairs) with the kind's base, K and V stored.
void CpuBackend::gemma4_qkv(int64_t layer, int64_t n_tokens) {
  const ModelConfig& c = config_;
  const LayerVectors& lv = layers_[static_cast<size_t>(layer)];
  const LayerWeights& w = weights_.layers[static_cast<size_t>(layer)];
  Scratch& s = *scratch_;
  const int64_t head_dim = c.head_dim_of(layer), n_head_kv = c.n_head_kv_of(layer);
  const int64_t q_dim = c.n_head * head_dim, kv_dim = n_head_kv * head_dim;
  const bool own_kv = c.kv_source(layer) == layer;
  if (emulate_) {  // the CUDA backend's products and rounding (cuda_gemma4.cpp)
    project(w.wq, s.xn.data(), n_tokens, s.q.data(), Input::Norm, false);
    if (own_kv) project(w.wk, s.xn.data(), n_tokens, s.k.data(), Input::Norm, false);
    if (own_kv && w.wv) project(w.wv, s.xn.data(), n_tokens, s.v.data(), Input::Norm, false);
    if (own_kv && !w.wv) std::copy_n(s.k.data(), n_tokens * kv_dim, s.v.data());
  } else if (!own_kv) {
    matmul_weight(w.wq, s.xn.data(), n_tokens, s.q.data(), pool_, fast_matmul());
  } else if (w.wv) {
    matmul_together({{w.wq, s.q.data()}, {w.wk, s.k.data()}, {w.wv, s.v.data()}}, s.xn.data(),
                    n_tokens, pool_, fast_matmul());
  } else {
    matmul_together({{w.wq, s.q.data()}, {w.wk, s.k.data()}}, s.xn.data(), n_tokens, pool_,
                    fast_matmul());
    std::copy_n(s.k.data(), n_tokens * kv_dim, s.v.data());
  }
  const bool slides = c.layer_slides(layer);
  const double* frequencies = slides && !rope_frequencies_swa_.empty()
                                  ? rope_frequencies_swa_.data()
                                  : rope_frequencies_.data();
  const int64_t rotated = c.rope_dims_of(layer);
  auto rotate = [&](float* x, int64_t heads, int64_t position) {
    for (int64_t h = 0; h < heads; ++h)
      rope(x + h * head_dim, 1, rotated, position, frequencies, RopeOrdering::NeoX, 1.0f);
  };
  const std::vector<float> ones(static_cast<size_t>(head_dim), 1.0f);
  for (int64_t t = 0; t < n_tokens; ++t) {
    const int64_t position = s.token_position[static_cast<size_t>(t)];
    float* q = s.q.data() + t * q_dim;
    for (int64_t h = 0; h < c.n_head; ++h)
      rms_norm(q + h * head_dim, lv.q_norm.data(), q + h * head_dim, head_dim, c.rms_eps);
    rotate(q, c.n_head, position);
    if (!own_kv) continue;
    float* k = s.k.data() + t * kv_dim;
    float* v = s.v.data() + t * kv_dim;
    for (int64_t h = 0; h < n_head_kv; ++h) {
      rms_norm(k + h * head_dim, lv.k_norm.data(), k + h * head_dim, head_dim, c.rms_eps);
      rms_norm(v + h * head_dim, ones.data(), v + h * head_dim, head_dim, c.rms_eps);
    }
    rotate(k, n_head_kv, position);
    const int32_t slot = s.token_slot[static_cast<size_t>(t)];
    std::copy_n(k, kv_dim, kv_at(slot, position, layer, false));
    std::copy_n(v, kv_dim, kv_at(slot, position, layer, true));
    if (emulate_) {  // the CUDA KV holds f16
      round_through_f16(kv_at(slot, position, layer, false), kv_dim);
      round_through_f16(kv_at(slot, position, layer, true), kv_dim);
    }
  }
}

// The per-layer embedding inputs of every token (llama.cpp's project_per_layer_inputs): the
// token's row of per_layer_token_embd times sqrt(n_pl), plus the scaled embedding projected by
// per_layer_model_proj times 1/sqrt(n_embd) and RMS-normed per layer, the sum times 1/sqrt(2).
void CpuBackend::gemma4_ple_inputs(std::span<const int32_t> tokens) {
  const ModelConfig& c = config_;
  Scratch& s = *scratch_;
  const int64_t n_pl = c.n_embd_per_layer, width = n_pl * c.n_layer;
  const auto n_tokens = static_cast<int64_t>(tokens.size());
  project_rows(weights_.ple_model_proj, s.x.data(), n_tokens, s.ple.data());
  const float projection_scale = 1.0f / std::sqrt(static_cast<float>(c.n_embd));
  const float table_scale = std::sqrt(static_cast<float>(n_pl));
  const float input_scale = 1.0f / std::sqrt(2.0f);
  std::vector<float> row(static_cast<size_t>(width));
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* p = s.ple.data() + t * width;
    for (int64_t i = 0; i < width; ++i) p[i] *= projection_scale;
    for (int64_t l = 0; l < c.n_layer; ++l)
      rms_norm(p + l * n_pl, ple_proj_norm_.data(), p + l * n_pl, n_pl, c.rms_eps);
    embedding_row(type_of(weights_.ple_token_embd), weights_.ple_token_embd->data, width,
                  tokens[static_cast<size_t>(t)], row.data());
    for (int64_t i = 0; i < width; ++i)
      p[i] = (p[i] + row[static_cast<size_t>(i)] * table_scale) * input_scale;
  }
}

// A layer with experts (26B-A4B), after ffn_norm into xn: the dense FFN normed by
// post_ffw_norm_1, plus the experts on pre_ffw_norm_2(x) routed from
// rms_norm(x) / sqrt(n_embd) · ffn_gate_inp.scale and normed by post_ffw_norm_2; the sum
// normed by post_ffw_norm joins the residual.
void CpuBackend::gemma4_moe_ffn(int64_t layer, int64_t n_tokens) {
  const ModelConfig& c = config_;
  const LayerVectors& lv = layers_[static_cast<size_t>(layer)];
  const LayerWeights& w = weights_.layers[static_cast<size_t>(layer)];
  Scratch& s = *scratch_;
  const int64_t d = c.n_embd;
  if (emulate_) {  // the CUDA backend's products and rounding (cuda_gemma4.cpp)
    const bool f16 = f16_layer(layer);
    project(w.w_gate, s.xn.data(), n_tokens, s.gate.data(), Input::Norm, f16);
    project(w.w_up, s.xn.data(), n_tokens, s.up.data(), Input::Norm, f16);
  } else {
    matmul_together({{w.w_gate, s.gate.data()}, {w.w_up, s.up.data()}}, s.xn.data(), n_tokens,
                    pool_, fast_matmul());
  }
  geglu(s.gate.data(), s.up.data(), s.gate.data(), n_tokens * c.n_ff_of(layer));
  if (emulate_)
    project(w.w_down, s.gate.data(), n_tokens, s.proj.data(), Input::Swiglu, f16_layer(layer));
  else
    matmul_weight(w.w_down, s.gate.data(), n_tokens, s.proj.data(), pool_, fast_matmul());
  post_norm(s.proj.data(), lv.moe_post_norm_1, n_tokens);

  const std::vector<float> ones(static_cast<size_t>(d), 1.0f);
  const float inverse_sqrt = 1.0f / std::sqrt(static_cast<float>(d));
  // Emulating: the device norms with the two factors as one weight (cuda_gemma4.cpp).
  std::vector<float> router_weight;
  if (emulate_)
    for (int64_t j = 0; j < d; ++j)
      router_weight.push_back(inverse_sqrt * lv.router_in_scale[static_cast<size_t>(j)]);
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* x = s.x.data() + t * d;
    float* router_in = s.xn.data() + t * d;
    if (emulate_) {
      rms_norm(x, router_weight.data(), router_in, d, c.rms_eps);
    } else {
      rms_norm(x, ones.data(), router_in, d, c.rms_eps);
      for (int64_t j = 0; j < d; ++j)
        router_in[j] = router_in[j] * inverse_sqrt * lv.router_in_scale[static_cast<size_t>(j)];
    }
    rms_norm(x, lv.moe_pre_norm.data(), s.head_in.data() + t * d, d, c.rms_eps);
  }
  moe_[static_cast<size_t>(layer)]->run(
      s.head_in.data(), n_tokens, s.moe_out.data(), pool_,
      {.emulate_device = emulate_, .router_input = s.xn.data(), .fast = fast_matmul()},
      routed_counts(layer));
  post_norm(s.moe_out.data(), lv.moe_post_norm_2, n_tokens);
  add_in_place(s.proj.data(), s.moe_out.data(), n_tokens * d);
  post_norm(s.proj.data(), lv.ffn_post_norm, n_tokens);
  add_in_place(s.x.data(), s.proj.data(), n_tokens * d);
}

// After the FFN's residual: x += RMSNorm(proj · (gelu(inp_gate · x) * this layer's input)),
// then x *= the layer's output scale.
void CpuBackend::gemma4_layer_end(int64_t layer, int64_t n_tokens) {
  const ModelConfig& c = config_;
  const LayerVectors& lv = layers_[static_cast<size_t>(layer)];
  const LayerWeights& w = weights_.layers[static_cast<size_t>(layer)];
  Scratch& s = *scratch_;
  const int64_t n_pl = c.n_embd_per_layer;
  if (n_pl > 0) {
    project_rows(w.ple_gate, s.x.data(), n_tokens, s.ple_gate.data());
    for (int64_t t = 0; t < n_tokens; ++t) {
      float* g = s.ple_gate.data() + t * n_pl;
      const float* input = s.ple.data() + (t * c.n_layer + layer) * n_pl;
      for (int64_t i = 0; i < n_pl; ++i) g[i] = gelu_tanh_ggml(g[i]) * input[i];
    }
    project_rows(w.ple_proj, s.ple_gate.data(), n_tokens, s.proj.data());
    post_norm(s.proj.data(), lv.ple_norm, n_tokens);
    add_in_place(s.x.data(), s.proj.data(), n_tokens * c.n_embd);
  }
  if (lv.out_scale != 1.0f)
    for (int64_t i = 0; i < n_tokens * c.n_embd; ++i) s.x[static_cast<size_t>(i)] *= lv.out_scale;
}

void CpuBackend::post_norm(float* rows, const std::vector<float>& weight, int64_t n_tokens) const {
  const int64_t n = config_.n_embd;
  for (int64_t t = 0; t < n_tokens; ++t)
    rms_norm(rows + t * n, weight.data(), rows + t * n, n, config_.rms_eps);
}

void CpuBackend::launch(const StepRequest& step) {
  if (step.sample) throw UsageError(name() + " does not sample on the device");
  if (!step.logits) throw UsageError("CPU backend: a step without sampling needs logits");
  done_.reset();
  StepResult result;
  result.logit_rows = run(step.batch, *step.logits);
  done_ = std::move(result);
}

bool CpuBackend::copy_kv_to_host(int32_t slot, int64_t tokens, void* host) {
  if (!kv_) throw UsageError("CPU backend: copy_kv_to_host() before attach_kv()");
  auto* out = static_cast<uint8_t*>(host);
  for (const KvSpace::Range& r : kv_->live_ranges(tokens)) {
    std::memcpy(out, kv_->slot_base(slot) + r.offset, r.bytes);
    out += r.bytes;
  }
  return true;
}

bool CpuBackend::copy_kv_from_host(int32_t slot, const void* host, int64_t tokens) {
  if (!kv_) throw UsageError("CPU backend: copy_kv_from_host() before attach_kv()");
  const auto* in = static_cast<const uint8_t*>(host);
  for (const KvSpace::Range& r : kv_->live_ranges(tokens)) {
    std::memcpy(kv_->slot_base(slot) + r.offset, in, r.bytes);
    in += r.bytes;
  }
  return true;
}

bool CpuBackend::copy_state_to_host(int32_t slot, void* host) {
  if (!hybrid_) return false;
  if (slot < 0 || slot >= hybrid_->slots())
    throw UsageError("CPU backend: slot " + std::to_string(slot) + " does not exist");
  std::memcpy(host, hybrid_->state(slot), hybrid_->state_bytes());
  return true;
}

bool CpuBackend::copy_state_from_host(int32_t slot, const void* host, int64_t tokens) {
  if (!hybrid_) return false;
  if (slot < 0 || slot >= hybrid_->slots())
    throw UsageError("CPU backend: slot " + std::to_string(slot) + " does not exist");
  hybrid_->restore(slot, static_cast<const float*>(host), tokens);
  return true;
}

StepResult CpuBackend::wait() {
  if (!done_) throw UsageError("CPU backend: wait() without a launched step");
  StepResult result = std::move(*done_);
  done_.reset();
  return result;
}

uint32_t* CpuBackend::routed_counts(int64_t layer) {
  const auto n_expert = static_cast<size_t>(config_.moe.n_expert);
  const size_t cells = static_cast<size_t>(config_.n_layer) * n_expert;
  if (expert_routed_.size() != cells) expert_routed_.assign(cells, 0);
  return expert_routed_.data() + static_cast<size_t>(layer) * n_expert;
}

// Every expert sits in host memory, which is this backend's device memory: all resident,
// every choice a hit, nothing streamed.
void CpuBackend::collect_expert_telemetry(ExpertTelemetry& out) {
  if (!config_.is_moe()) return;
  const size_t cells =
      static_cast<size_t>(config_.n_layer) * static_cast<size_t>(config_.moe.n_expert);
  out.n_layer = static_cast<int32_t>(config_.n_layer);
  out.n_expert = static_cast<int32_t>(config_.moe.n_expert);
  out.resident.assign(cells, 1);
  out.routed = expert_routed_;
  out.routed.resize(cells, 0);
  out.streamed.assign(cells, 0);
  out.hits = 0;
  for (uint32_t n : out.routed) out.hits += n;
  out.misses = 0;
  out.bytes_streamed = 0;
  out.tokens = expert_tokens_;
  const LayerWeights& l = weights_.layers.front();
  out.expert_bytes = 0;
  for (const TensorInfo* t :
       {l.gate_exps, l.up_exps, l.down_exps, l.gate_exps_bias, l.up_exps_bias, l.down_exps_bias})
    if (t) out.expert_bytes += t->size_bytes / static_cast<uint64_t>(config_.moe.n_expert);
  std::fill(expert_routed_.begin(), expert_routed_.end(), 0);
  expert_tokens_ = 0;
}

int64_t CpuBackend::run(std::span<const BatchSequence> batch, std::vector<float>& logits) {
  if (!kv_) throw UsageError("CPU backend: launch() before attach_kv()");
  const ModelConfig& c = config_;
  int64_t n_tokens = 0;
  int64_t n_rows = 0;
  for (const BatchSequence& seq : batch) {
    if (seq.tokens.empty()) throw UsageError("CPU backend: a batch sequence has no tokens");
    if (seq.slot < 0 || seq.slot >= kv_->geometry().slots) {
      throw UsageError("CPU backend: slot " + std::to_string(seq.slot) + " does not exist");
    }
    if (seq.start_position < 0 ||
        seq.start_position + static_cast<int64_t>(seq.tokens.size()) > kv_->geometry().max_tokens) {
      throw CapacityError("CPU backend: positions past the context of " +
                          std::to_string(kv_->geometry().max_tokens) + " tokens");
    }
    n_tokens += static_cast<int64_t>(seq.tokens.size());
    n_rows += seq.all_logits ? static_cast<int64_t>(seq.tokens.size()) : 1;
  }
  Scratch& s = *scratch_;
  s.reserve(c, n_tokens);
  if (c.is_moe()) expert_tokens_ += static_cast<uint64_t>(n_tokens);

  int64_t t = 0;
  for (const BatchSequence& seq : batch) {
    for (size_t i = 0; i < seq.tokens.size(); ++i, ++t) {
      const int32_t token = seq.tokens[i];
      if (token < 0 || token >= c.n_vocab) {
        throw UsageError("token id " + std::to_string(token) + " is outside the vocabulary of " +
                         std::to_string(c.n_vocab));
      }
      s.token_slot[static_cast<size_t>(t)] = seq.slot;
      s.token_position[static_cast<size_t>(t)] = seq.start_position + static_cast<int64_t>(i);
      embedding_row(type_of(weights_.token_embd), weights_.token_embd->data, c.n_embd, token,
                    s.x.data() + t * c.n_embd);
      if (c.embedding_scale != 1.0f) {  // Gemma: times sqrt(n_embd)
        float* row = s.x.data() + t * c.n_embd;
        for (int64_t j = 0; j < c.n_embd; ++j) row[j] *= c.embedding_scale;
      }
    }
  }

  {
    const int64_t half = c.head_dim / 2;
    s.rope_angles.resize(static_cast<size_t>(n_tokens * 2 * half));
    for (int64_t i = 0; i < n_tokens; ++i) {
      float* angles = s.rope_angles.data() + i * 2 * half;
      rope_angles(s.token_position[static_cast<size_t>(i)], rope_frequencies_.data(), half,
                  rope_magnitude_, angles, angles + half);
    }
  }

  std::vector<SequenceSpan> spans;
  if (hybrid_) {
    int64_t first = 0;
    for (const BatchSequence& seq : batch) {
      const auto count = static_cast<int64_t>(seq.tokens.size());
      spans.push_back({seq.slot, first, count, seq.start_position});
      first += count;
    }
    hybrid_->begin_step(spans);
  }
  // Hybrid attention layers find their KV like every other layer (kv_at: the recurrent layers
  // take no room in a token's record).
  const KvAddress kv_address = [&](int32_t slot, int64_t position, int64_t layer, bool value) {
    return kv_at(slot, position, layer, value);
  };
  // (Hybrid models have no sliding-window layers: one KV part, a token's whole record.)
  const int64_t kv_token_stride = kv_bytes_per_token() / static_cast<int64_t>(sizeof(float));
  if (c.n_embd_per_layer > 0) {
    std::vector<int32_t> tokens;
    for (const BatchSequence& seq : batch)
      tokens.insert(tokens.end(), seq.tokens.begin(), seq.tokens.end());
    gemma4_ple_inputs(tokens);
  }

  for (int64_t layer = 0; layer < c.n_layer; ++layer) {
    if (hybrid_) {
      const LayerVectors& lv = layers_[static_cast<size_t>(layer)];
      for (int64_t i = 0; i < n_tokens; ++i) {
        rms_norm(s.x.data() + i * c.n_embd, lv.attn_norm.data(), s.xn.data() + i * c.n_embd,
                 c.n_embd, c.rms_eps);
      }
      hybrid_->run(layer, s.xn.data(), n_tokens, spans, s.token_position.data(),
                   s.token_slot.data(), kv_address, kv_token_stride, s.proj.data(), pool_);
      add_in_place(s.x.data(), s.proj.data(), n_tokens * c.n_embd);
    } else {
      attention_layer(layer, n_tokens);
    }
    const LayerVectors& lv = layers_[static_cast<size_t>(layer)];
    const LayerWeights& w = weights_.layers[static_cast<size_t>(layer)];
    for (int64_t i = 0; i < n_tokens; ++i) {
      rms_norm(s.x.data() + i * c.n_embd, lv.ffn_norm.data(), s.xn.data() + i * c.n_embd, c.n_embd,
               c.rms_eps);
    }
    if (config_.is_moe() && c.architecture == "gemma4") {
      gemma4_moe_ffn(layer, n_tokens);
      gemma4_layer_end(layer, n_tokens);
      continue;
    }
    if (config_.is_moe()) {
      moe_[static_cast<size_t>(layer)]->run(s.xn.data(), n_tokens, s.proj.data(), pool_,
                                            {.emulate_device = emulate_, .fast = fast_matmul()},
                                            routed_counts(layer));
      add_in_place(s.x.data(), s.proj.data(), n_tokens * c.n_embd);
      continue;
    }
    const bool f16 = f16_layer(layer);
    if (emulate_) {
      project(w.w_gate, s.xn.data(), n_tokens, s.gate.data(), Input::Norm, f16);
      project(w.w_up, s.xn.data(), n_tokens, s.up.data(), Input::Norm, f16);
    } else {
      matmul_together({{w.w_gate, s.gate.data()}, {w.w_up, s.up.data()}}, s.xn.data(), n_tokens,
                      pool_, fast_matmul());
    }
    if (c.activation == FfnActivation::GeluTanh)
      geglu(s.gate.data(), s.up.data(), s.gate.data(), n_tokens * c.n_ff_of(layer));
    else if (fast_)
      swiglu_approx(s.gate.data(), s.up.data(), s.gate.data(), n_tokens * c.n_ff);
    else
      swiglu(s.gate.data(), s.up.data(), s.gate.data(), n_tokens * c.n_ff);
    if (emulate_)
      project(w.w_down, s.gate.data(), n_tokens, s.proj.data(), Input::Swiglu, f16);
    else
      matmul_weight(w.w_down, s.gate.data(), n_tokens, s.proj.data(), pool_, fast_matmul());
    if (c.sandwich_norms) post_norm(s.proj.data(), lv.ffn_post_norm, n_tokens);
    add_in_place(s.x.data(), s.proj.data(), n_tokens * c.n_embd);
    if (c.architecture == "gemma4") gemma4_layer_end(layer, n_tokens);
  }

  if (hybrid_) hybrid_->end_step(spans);

  // Final norm only for the rows whose logits are wanted, then the output head.
  int64_t row = 0;
  t = 0;
  for (const BatchSequence& seq : batch) {
    const auto count = static_cast<int64_t>(seq.tokens.size());
    for (int64_t i = 0; i < count; ++i, ++t) {
      if (!seq.all_logits && i != count - 1) continue;
      rms_norm(s.x.data() + t * c.n_embd, output_norm_.data(), s.head_in.data() + row * c.n_embd,
               c.n_embd, c.rms_eps);
      ++row;
    }
  }
  logits.resize(static_cast<size_t>(n_rows * c.n_vocab));
  // The head is a matvec on the GPU whatever the chunk: int8 input when its kernel reads it.
  if (emulate_ && reads_q8(weights_.output)) {
    for (int64_t r = 0; r < n_rows; ++r)
      round_through_q8(s.head_in.data() + r * c.n_embd, c.n_embd, Q8Rounding::MultiplyByInverse);
  }
  matmul_weight(weights_.output, s.head_in.data(), n_rows, logits.data(), pool_, fast_matmul());
  if (c.final_logit_softcap > 0.0f)
    soft_cap(logits.data(), n_rows * c.n_vocab, c.final_logit_softcap);
  return n_rows;
}

}  // namespace granule::cpu

namespace granule {

std::unique_ptr<Backend> make_cpu_backend(const BackendInit& init) {
  return std::make_unique<cpu::CpuBackend>(init);
}

uint64_t host_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  return pages > 0 && page_size > 0
             ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size)
             : 0;
}

}  // namespace granule
