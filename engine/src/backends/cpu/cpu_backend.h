// The CPU reference backend: the llama family's forward pass in f32 over the mapped weights,
// KV in f32 inside the engine's KvSpace, threads over rows and heads. The quality reference.
//
// Two ways to multiply by a weight matrix:
// - The fast path (the default): the input quantised once per matmul to int8 blocks of 32 and
//   multiplied in integers with each weight block (int8_matmul.h) where the type has kernels
//   here (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q4_K, Q5_K, Q6_K on AVX2), on a copy of the
//   matrix repacked at load (int8_packed.h, fast_matmul.h); f32 otherwise.
//   Mixture-of-experts FFNs and Qwen3.5's recurrent mixers keep the exact path.
// - The exact path (BackendOptions::cpu_exact_numerics, and always while emulating): every
//   row decoded to f32 and dotted in f32 in one fixed order (ops.h matmul): the oracle.
//
// With BackendOptions::cpu_emulate_device_numerics it is the oracle for the CUDA backend
// instead: it rounds exactly where cuda_model.cpp rounds, so the two differ only by f32
// summation order (and approximate intrinsics: rsqrtf, expf):
// - KV through f16 (the CUDA KV element).
// - A chunk of <= 64 rows (decode, short prefill: the matvec kernels): the input of every
//   matrix whose kernel reads int8 activations (kernels::matvec_reads_q8: Q4_0, Q4_1, Q8_0,
//   and every split-layout type, Q6_K included, unless KernelConfig::split_weights is off)
//   through int8 blocks of 32 (round_through_q8; the RMSNorm's rule before Q/K/V, gate/up
//   and the head, quantize_block_of_warp's before the output projection and the down
//   projection); other types (F32, F16, BF16, the K quants unsplit) read f32 activations.
// - A chunk of > 64 rows (the cuBLAS path): every layer matrix dequantised to f16 and its
//   input rounded to f16. The head is a matvec in both paths.
// Chunks are the GPU's: max(64, max_tokens_per_pass) tokens of the batch in order.
// - Mixture-of-experts layers (moe_ffn.h): the router in f32; a quantised expert matrix reads
//   int8 inputs at every row count (experts never take the f16 path); attention as above.
// - qwen35moe's mixers (delta_net.h, MixerNumerics): each product as above (never the f16
//   tensor-core products), K and V through f16; the DeltaNet recurrence in f32. The dense
//   qwen35 is not emulated (its FFN's batch-1 fusion rounds otherwise): the constructor throws.
#pragma once
#include <memory>
#include <optional>
#include <vector>

#include "backends/backend.h"
#include "backends/cpu/delta_net.h"
#include "backends/cpu/fast_matmul.h"
#include "backends/cpu/moe_ffn.h"
#include "backends/cpu/thread_pool.h"

namespace granule::cpu {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const BackendInit& init);
  ~CpuBackend() override;

  std::string name() const override;
  bool is_gpu() const override { return false; }
  uint64_t device_total_bytes() const override;
  int64_t kv_bytes_per_token() const override;
  std::unique_ptr<VirtualMemory> make_kv_virtual_memory() override;
  // Also sizes a hybrid model's recurrent state: one slot per KV slot (MemoryCategory::
  // RecurrentState).
  void attach_kv(KvSpace& kv) override;
  // Computes the whole step in launch() (the host is the device); wait() hands it over.
  void launch(const StepRequest& step) override;
  StepResult wait() override;
  // The KV is host memory already: a memcpy each way.
  bool copy_kv_to_host(int32_t slot, int64_t tokens, void* host) override;
  bool copy_kv_from_host(int32_t slot, const void* host, int64_t tokens) override;
  // A hybrid model's recurrent state: a memcpy each way (HybridLayers).
  uint64_t recurrent_state_bytes() const override { return hybrid_ ? hybrid_->state_bytes() : 0; }
  bool copy_state_to_host(int32_t slot, void* host) override;
  bool copy_state_from_host(int32_t slot, const void* host, int64_t tokens) override;
  // Routing counts since the last call; every expert is resident here.
  void collect_expert_telemetry(ExpertTelemetry& out) override;

 private:
  // The forward pass: logits rows for the batch (see StepRequest::logits).
  int64_t run(std::span<const BatchSequence> batch, std::vector<float>& logits);

  struct LayerVectors;  // a layer's norms and biases as f32
  struct Scratch;       // activations, grown to the largest batch seen

  void attention_layer(int64_t layer, int64_t n_tokens);
  // Gemma 4 (see cpu_backend.cpp): Q/K/V with their norms, rotation and KV write; the
  // per-layer embedding inputs of a batch's tokens; the per-layer embedding and output scale
  // that end a layer.
  void gemma4_qkv(int64_t layer, int64_t n_tokens);
  void gemma4_ple_inputs(std::span<const int32_t> tokens);
  void gemma4_layer_end(int64_t layer, int64_t n_tokens);
  void gemma4_moe_ffn(int64_t layer, int64_t n_tokens);
  // Gemma's sandwich norm, in place over n_tokens rows of n_embd.
  void post_norm(float* rows, const std::vector<float>& weight, int64_t n_tokens) const;

  // Where a matrix's input comes from: it decides the int8 rounding rule (ops.h Q8Rounding).
  enum class Input { Norm, Attention, Swiglu };
  // Emulating: y = x · Wᵀ with the CUDA backend's rounding of x and W for each chunk.
  // `f16_capable`: the layer's matrices can take the f16 tensor-core products (f16_layers_).
  void project(const TensorInfo* w, const float* x, int64_t n_tokens, float* y, Input input,
               bool f16_capable);
  // Emulating: y = x · Wᵀ as the CUDA backend's Gemma 4 per-layer embedding products run it,
  // always on the matvec kernels (runs of at most 64 rows; x rounded to int8 by division where
  // the kernel reads int8, cuda_gemma4.cpp's gemma4_project); else the plain product.
  void project_rows(const TensorInfo* w, const float* x, int64_t n_tokens, float* y);
  // The fast path's matrices and input buffer; null on the exact path.
  FastMatmul* fast_matmul();
  // Whether the CUDA kernel for w reads int8 activations.
  bool reads_q8(const TensorInfo* w) const;
  // Emulating, and the layer's matrices can take the f16 tensor-core products.
  bool f16_layer(int64_t layer) const {
    return emulate_ && f16_layers_[static_cast<size_t>(layer)];
  }
  float* kv_at(int32_t slot, int64_t position, int64_t layer, bool value) const;

  const ModelConfig& config_;
  const WeightTable& weights_;
  MemoryManager& memory_;
  uint64_t charged_weight_bytes_ = 0;
  ThreadPool pool_;
  KvSpace* kv_ = nullptr;
  std::optional<StepResult> done_;  // the launched step's result, until wait()
  std::vector<double> rope_frequencies_;
  float rope_magnitude_ = 1.0f;  // YaRN's factor on cos and sin (rope.h)
  // Gemma: the sliding-window layers' own base, unscaled (empty: they rotate as the others).
  std::vector<double> rope_frequencies_swa_;
  std::vector<int64_t> kv_offsets_;  // per layer: elements before its K in its part's record
  // Per layer: its KV part's bytes per token, and where that part starts in a slot.
  std::vector<int64_t> kv_part_token_bytes_, kv_part_offset_bytes_;
  int64_t kv_token_bytes_ = 0;        // a token's KV record (config_.kv_bytes_per_token)
  std::vector<float> ple_proj_norm_;  // Gemma 4's per-layer projection norm
  std::vector<float> output_norm_;
  std::vector<LayerVectors> layers_;
  std::vector<std::unique_ptr<MoeFfn>> moe_;  // per layer, for a mixture of experts
  std::unique_ptr<HybridLayers> hybrid_;      // Qwen3.5: the mixers and the recurrent state
  uint64_t charged_state_bytes_ = 0;
  // (token, expert) choices per [layer * n_expert + e] and tokens routed, since the last
  // collect_expert_telemetry().
  std::vector<uint32_t> expert_routed_;
  uint64_t expert_tokens_ = 0;
  uint32_t* routed_counts(int64_t layer);
  std::unique_ptr<Scratch> scratch_;
  // cpu_emulate_device_numerics, the split layout the CUDA backend would use, its chunk rows.
  bool emulate_ = false;
  bool fast_ = true;  // int8 matmuls (not emulating, cpu_exact_numerics off)
  // The fast path's int8 copies of the matrices, made at load. They have the file's size (the
  // K quants' 3 % more) and the ledger keeps charging the file's weights: the mapping's pages
  // of a repacked tensor are not read again (a tied embedding's rows are, by the lookup), so
  // the process holds those bytes twice only while the page cache keeps them.
  std::unique_ptr<FastMatmul> fast_matmul_;
  bool split_weights_ = true;
  int64_t chunk_rows_ = 512;
  // KernelConfig::f16_mma_min_rows (0: off): runs of that many rows up to the matvec limit on
  // layers whose seven matrices are split Q4_0/Q4_1/Q8_0/Q2_K/Q3_K/Q4_K/Q5_K/Q6_K/IQ4_NL/IQ4_XS/
  // MXFP4 (gate and up alike) take f16 activations and weights rounded to f16, as the cuBLAS path
  // does, on the GPU; per layer here.
  int64_t f16_min_rows_ = 0;
  std::vector<bool> f16_layers_;
};

}  // namespace granule::cpu
