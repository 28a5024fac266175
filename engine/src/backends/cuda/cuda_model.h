// The llama family's forward pass on the GPU over "token rows": each row is one token of
// some sequence (its slot, its position), so decode (one row per sequence), prefill (many
// rows of one sequence) and mixed batches run the same code. Weights stay in their GGUF
// block types on the device. A run reads every per-row input from fixed device buffers and
// allocates nothing, so a decode step can be captured as a CUDA graph and replayed.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "attention_prefill.cuh"
#include "backends/backend.h"
#include "backends/cuda/cublas_library.h"
#include "backends/cuda/cuda_moe.h"
#include "backends/cuda/device_memory.h"
#include "backends/cuda/weight_streamer.h"
#include "kernel_config.h"
#include "matvec.cuh"
#include "memory/placement.h"
#include "memory/weight_layout.h"
#include "memory/workspace_layout.h"
#include "sampling.cuh"

namespace granule::cuda {

struct Gemma4Device;  // cuda_gemma4.h
class HostRows;       // host_rows.h

// A 2-D weight on the device: rows of `cols` encoded elements.
struct DeviceMatrix {
  const void* data = nullptr;
  uint32_t type = 0;
  int64_t rows = 0, cols = 0;
  int64_t row_bytes = 0;       // from one row to the next on the device
  int64_t gguf_row_bytes = 0;  // the row's bytes as stored (what a decode step reads)
  bool split = false;          // rows in engine/include/granule/split_layout.h's layout
};
// A matrix of the weight layout as the kernels take it, at `data` (cuda_weights.cpp).
DeviceMatrix device_matrix(const MatrixLayout& m, const uint8_t* data);

struct DeviceLayer {
  DeviceMatrix wq, wk, wv, wo, w_gate, w_up, w_down;
  const float* attn_norm = nullptr;
  const float* ffn_norm = nullptr;
  const float* bq = nullptr;
  const float* bk = nullptr;
  const float* bv = nullptr;
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  const float* bo = nullptr;          // gpt-oss: the attention output bias
  const float* attn_sinks = nullptr;  // gpt-oss: per-head sink logits
  // Gemma's sandwich norms: the attention and FFN outputs RMS-normed before the residual adds.
  const float* attn_post_norm = nullptr;
  const float* ffn_post_norm = nullptr;
  // Qwen3.5's Gated DeltaNet layers (cuda_hybrid.cpp): the projections, the convolution's taps,
  // dt bias, decay rate a and the gated norm; recurrent_index: the layer's place among the
  // recurrent ones (its part of a slot's state), -1 for an attention layer.
  DeviceMatrix ssm_in, ssm_z, ssm_beta, ssm_alpha, ssm_out;
  const float* ssm_conv1d = nullptr;
  const float* ssm_dt = nullptr;
  const float* ssm_a = nullptr;
  const float* ssm_norm = nullptr;
  int64_t recurrent_index = -1;
};

// Inputs of one run, in host order; copied to the fixed device buffers by upload().
struct RowInputs {
  std::vector<int32_t> tokens, positions, slots;
  std::vector<int32_t> logit_rows;  // rows whose logits are wanted, in output order
};

class CudaModel {
 public:
  // Reads the kernel configuration (defaults with the GRANULE_* environment overrides,
  // fitted to the device), uploads the weights (charged as WeightsResident) in the layout it
  // names and sizes the workspace for runs of up to max_rows token rows. Throws DeviceError
  // for a shape the kernels do not cover (head size other than 64/128/256, ...), so that
  // Device Auto falls back to the CPU.
  CudaModel(const BackendInit& init, int max_rows);
  ~CudaModel();

  int max_rows() const { return max_rows_; }
  // Staging slots of the ring when layers stream (placement.h).
  static constexpr int kStagingSlots = 2;
  // Rows at most this many take the quantised matrix-vector kernels (capturable); more take
  // dequantise + cuBLAS GEMM.
  static constexpr int kMatvecMaxRows = static_cast<int>(workspace::kMatvecMaxRows);
  // Logit rows computed per head pass (logits buffer rows).
  static constexpr int kLogitRowsPerPass = static_cast<int>(workspace::kLogitRows);

  // Binds the KV slots (device addresses from the KvSpace) and sizes the attention workspace
  // for contexts of max_tokens.
  // part_offset_bytes: where each KV part (ModelConfig::kv_part) starts in a slot.
  void attach_kv(const std::vector<uint8_t*>& slot_bases, int64_t max_tokens,
                 const std::vector<uint64_t>& part_offset_bytes);

  // Writes one run's inputs (upload) and sampling parameters (upload_sampling) to the pinned
  // mirror of the fixed device buffers; flush_inputs() sends what was written in one async
  // copy on the stream (returns the copies issued: 0 or 1). The caller flushes before the
  // work that reads them, outside any capture.
  void upload(const RowInputs& in);
  int flush_inputs();
  // The layers for rows [0, n_rows) of the uploaded inputs; then the head for logit rows
  // [first, first + count) (count <= kLogitRowsPerPass) into logits(). Graph-capturable
  // when n_rows <= kMatvecMaxRows.
  void run_layers(int n_rows);
  void run_head(int first_logit_row, int count);
  // Picks a token per logit row of the last head pass (greedy when params is null), into
  // the device token buffer; download with copy_tokens().
  void sample(int count, bool greedy);
  void upload_sampling(const std::vector<kernels::DeviceSamplingParams>& params,
                       const std::vector<std::vector<int32_t>>& histories);

  const float* logits() const { return logits_.as<float>(); }
  // Structured output's device copy of the token masks (workspace "token_masks"; the backend's
  // TokenMasks lays it out).
  const DeviceBuffer& token_mask_copy() const { return token_masks_; }
  int64_t n_vocab() const { return config_.n_vocab; }
  void copy_logits(int count, float* host) const;    // synchronises
  void copy_tokens(int count, int32_t* host) const;  // synchronises
  // For a decode step's graph with a token head: queue_step_inputs() copies the first
  // `rows` of each input array (and of the sampling parameters and histories when `sampling`)
  // from the pinned mirror, in place of flush_inputs(); queue_token_download() copies `rows`
  // sampled tokens to the pinned token buffer. Both are captured with the step. After the
  // replay, mark_inputs_sent() marks the mirror sent (rewritable once what is queued ran; the
  // end of flush_inputs() too) and read_tokens() waits for the step and reads the tokens
  // (copy_tokens() is the download and the read).
  void queue_step_inputs(int rows, bool sampling);
  void queue_token_download(int rows) const;
  void mark_inputs_sent();
  void read_tokens(int count, int32_t* host) const;  // synchronises

  cudaStream_t stream() const { return stream_.get(); }
  // What every launch of this model runs with; set at construction, never changed.
  const kernels::KernelConfig& kernel_config() const { return kernel_config_; }
  uint64_t weight_bytes() const {
    return weights_.bytes() + streamer_->resident_bytes() +
           (moe_ ? moe_->device_weight_bytes() : 0);
  }
  // A mixture-of-experts model's routers and experts (cuda_moe.h); null for a dense model.
  CudaMoe* moe() const { return moe_.get(); }
  const WeightStreamer& streamer() const { return *streamer_; }
  // The host's part of the streamed layers at small decode batches (host_rows.h); null when
  // the host computes none.
  const HostRows* host_rows() const { return host_rows_.get(); }
  // Host-to-device bytes a run of n_rows copies (a split pass copies less, host_rows.h).
  uint64_t streamed_bytes_for(int n_rows) const;

  // Throws DeviceError when the host's part of a step (a split pass's rows, or a mixture's
  // streamed experts) failed: a device-side wait gave up, or a host job threw; that step's
  // results are wrong. Call after a step completed.
  void check_host_rows() const;
  // The placement input for a budget, with the ledger's workspace and `kv_bytes` of KV kept
  // free, at most max_resident layers resident (-1: no cap).
  PlacementInput placement_input(uint64_t budget, int32_t max_resident, uint64_t kv_bytes) const;
  uint64_t kv_reserve_bytes() const { return kv_reserve_bytes_; }
  // Moves layers to a new plan (waits for the stream); true when any moved, which makes every
  // captured graph stale.
  bool replan(const PlacementPlan& plan);
  // Host-issued operations since the last reset: eager kernel launches and weight copies
  // (a launch while the stream is being captured counts too; callers reset around it).
  uint64_t host_operations() const { return launches_ + copies_; }
  void reset_host_operations() { launches_ = copies_ = 0; }
  // Bytes of weights one decode step reads (every layer matrix + the output head; with experts,
  // the routers and one row's n_expert_used experts per layer).
  uint64_t decode_weight_bytes() const { return decode_weight_bytes_; }
  // Whether the GEMM path dequantises the next matrix on a second stream while the current
  // one's GEMM runs (the budget held the second scratch).
  bool prefill_overlap() const { return dequant_stream_ != nullptr; }

  // Qwen3.5's recurrent state (cuda_hybrid.cpp): one slot per KV slot, allocated by attach_kv()
  // and charged as RecurrentState; a slot's bytes are every recurrent layer's conv state then
  // delta state (ModelConfig::recurrent_state_bytes). Null / 0 for other models.
  uint64_t recurrent_state_bytes() const;
  uint8_t* recurrent_state(int32_t slot) const;

 private:
  // Per-row int32 arrays of the step inputs, R = max_rows_ each. kOtherLengths: the lengths of
  // the rows the flash-attention tiles leave to the split kernel (0 for rows in a tile);
  // kTiles: two arrays' room for up to R PrefillTiles.
  enum InputArray {
    kTokens = 0,
    kPositions,
    kSlots,
    kLengths,
    kLogitRows,
    kOtherLengths,
    kTiles,
    kInputArrays = kTiles + 2
  };
  static_assert(kInputArrays == workspace::kInputArrays);
  void layer_matvec(const DeviceLayer& l, int layer, int n_rows);
  // Gemma's sandwich norm: hidden += RMSNorm(normed_) · weight (the block's output, which the
  // projection wrote into normed_).
  void post_norm(const float* weight, int n_rows);
  // Gemma's final logit soft-cap over `count` logit rows (nothing without one).
  void soft_cap_logits(int count);
  // Gemma's layers (sandwich norms, GeGLU): the unfused int8 / GEMM paths only.
  bool gemma_layers() const {
    return config_.sandwich_norms || config_.activation == FfnActivation::GeluTanh;
  }
  // A mixture-of-experts layer's FFN block: the FFN norm (f32 and int8 outputs), then
  // CudaMoe::forward adding the experts' weighted sum to hidden.
  void moe_ffn(const DeviceLayer& l, int layer, int n_rows);
  // A decode run on the f16 tensor-core products (KernelConfig::f16_mma_min_rows): activations
  // in f16, weights dequantised to f16 in the kernels' registers.
  bool takes_f16mma(const DeviceLayer& l, int n_rows) const;
  void layer_f16mma(const DeviceLayer& l, int layer, int n_rows);
  void f16mma(const DeviceMatrix* mats, float* const* outs, int count, int n_rows, bool accumulate,
              const __half* x, int64_t n_in);
  // `next_wq`: the next layer's first matrix when it takes layer_gemm too and its weights are
  // resident (its dequantisation may start during this layer's last GEMM), else null.
  void layer_gemm(const DeviceLayer& l, int layer, int n_rows, const DeviceMatrix* next_wq);
  // `f16_out`: the output also in f16 there (the f16 tensor-core path's input to the output
  // projection); without it, the int8 copy the output projection reads where its kernel does.
  // `roped`: the Q/K/V product did rope_kv's work (batch-1 fusion), so no rope_kv launch.
  void attention(int layer, int n_rows, __half* f16_out = nullptr, bool roped = false);
  bool stream_capturing() const;
  void norm_for(const DeviceMatrix& w, const float* x, const float* weight, int n_rows, bool f16);
  // `normed_input`: the batch-1 fusion's input (read_handed_over_norm()).
  // `rope_layer`: mats are that layer's Q, K, V (in that order) and a one-row epilogue does
  // rope_kv's work (k::RowRope).
  // `y_strides`: per matrix, the row stride of its output where it is not the matrix's rows (a
  // split layer's device rows write into outputs of the whole matrix's width).
  void matvec(const DeviceMatrix* mats, float* const* outs, int count, int n_rows, bool accumulate,
              const float* x_f32, bool normed_input = false,
              const DeviceLayer* rope_layer = nullptr, const int64_t* y_strides = nullptr);
  // Batch-1 fusion (kernels/README.md): whether every layer qualifies, and where the
  // products' epilogues leave the next RMSNorm's input: int8 blocks of y·w in row 1 of the
  // int8 activation buffers and Σ y² per 32 rows in row 2 of the scales, which a one-row step
  // does not otherwise use.
  bool fusion_fits() const;
  // On a fused pass: the embedding gather hands the first norm's input over
  // and the last down projection the output norm's, where the output head takes the split
  // kernels (split layout, no mma at one row): no norm kernel left in the step.
  bool head_takes_hand_over() const;
  kernels::ActivationQ8 fusion_q8() const;
  float* fusion_sums() const;
  // `in` reads the RMSNorm input the product before handed over (fusion_q8(), 1/rms from
  // fusion_sums()).
  void read_handed_over_norm(kernels::MatvecInput& in) const;
  // One row: y += w · x (x: the int8 activations), its result also as fusion_q8() of
  // y·norm_weight, with the sums of squares in fusion_sums().
  void matvec_normed_out(const DeviceMatrix& w, float* y, const float* norm_weight);
  // Y = X · Wᵀ through an f16 copy of w. `next`: the matrix the following gemm() call takes,
  // dequantised ahead on the dequant stream during this GEMM when the pass overlaps.
  void gemm(const DeviceMatrix& w, const DeviceMatrix* next, const __half* x, int n_rows, float* y,
            bool accumulate);
  void add_prefill_overlap();
  // Qwen3.5's hybrid layers (cuda_hybrid.cpp): the mixer (Gated DeltaNet or gated attention)
  // then the FFN, on the matvec path up to kMatvecMaxRows rows, the GEMM path beyond.
  void layer_hybrid(const DeviceLayer& l, int layer, int n_rows);
  void delta_net_mixer(const DeviceLayer& l, int n_rows);
  void gated_attention_mixer(const DeviceLayer& l, int layer, int n_rows);
  void hybrid_ffn(const DeviceLayer& l, int layer, int n_rows);
  // The gate/up product with SwiGLU (gate and up of one type and layout) into h, from the FFN
  // norm's output; `fused` (a one-row pass of the batch-1 fusion): from the norm the product
  // before handed over, and the result also quantised for the down projection where
  // layer_matvec's is. Returns whether it was quantised.
  bool swiglu_matvec(const DeviceLayer& l, int n_rows, float* h, bool fused = false);
  // Gate and up as two products of the f32 norm output, then SwiGLU (or GeGLU) into h.
  void gate_up_unfused(const DeviceLayer& l, int n_rows, float* h, bool geglu);
  void ffn_norm_for_gate_up(const DeviceLayer& l, const float* hidden, int n_rows);
  // The mixer's input: RMSNorm(hidden) in every format `mats` read (f16 on the GEMM path).
  void hybrid_norm(const DeviceMatrix* mats, int count, const float* weight, int n_rows);
  // y (+)= x · Wᵀ for x of w.cols floats per row, by the path n_rows takes (x quantised or
  // converted first as the kernel reads it; the GEMM path's f16 copy in normed_f16_, `next` as
  // gemm()'s).
  void hybrid_project(const DeviceMatrix& w, const float* x, int n_rows, float* y, bool accumulate,
                      const DeviceMatrix* next = nullptr);
  // The batch-1 fusion (fusion_fits) for the hybrid layers: the mixer's output projection, gate,
  // up and down split and read as int8 blocks (takes_hand_over), gate and up of one type and
  // layout, no experts.
  bool hybrid_fusion_fits() const;
  bool takes_hand_over(const DeviceMatrix& m) const;
  // A fused one-row pass: y += x · Wᵀ (x quantised first) handing the next RMSNorm's input over
  // (matvec_normed_out).
  void hybrid_project_normed(const DeviceMatrix& w, const float* x, float* y,
                             const float* norm_weight);
  // A hybrid mixer's output projection of x into the residual (cuda_hybrid.cpp).
  void hybrid_mixer_out(const DeviceLayer& l, const DeviceMatrix& w, const float* x, int n_rows,
                        bool fused, bool quantized);
  // The GEMM path's next product after layer l's last: the next layer's first, if resident.
  const DeviceMatrix* gemm_after(const DeviceLayer& l) const;
  void upload_hybrid(const WeightTable& weights);
  void allocate_recurrent_state(int32_t slots);
  // Gemma 4's dense layers (cuda_gemma4.cpp): per-kind head sizes and KV heads, the Q/K/V norms
  // with partial rope (gemma_ops.cuh), shared KV, per-layer FFN widths, per-layer embeddings and
  // the layer output scale; the int8 / f32 products up to kMatvecMaxRows rows, the GEMM path
  // beyond. upload_gemma4() uploads the per-layer embeddings' matrices and norms (resident, as
  // layout_ places them) and their token table (pinned, mapped host memory; device memory when
  // table_on_device, a test's resident form); allocate_workspace() then allocates their
  // workspace; gemma4_inputs() computes a pass's per-layer inputs from the scaled embeddings in
  // hidden_.
  void upload_gemma4(const WeightTable& weights, bool table_on_device);
  void gemma4_inputs(int n_rows);
  void layer_gemma4(const DeviceLayer& l, int layer, int n_rows);
  // y = x · Wᵀ (x: w.cols floats per row) in runs of at most kMatvecMaxRows rows on the matvec
  // kernels, x quantised first where the kernel reads int8 (the CPU oracle's rounding).
  void gemma4_project(const DeviceMatrix& w, const float* x, int n_rows, float* y);
  // A streamed layer split with the host (cuda_host_rows.cpp): the unfused products in four
  // rounds, each posting its input to the host, computing the device's rows and joining the
  // host's. splits_now(): whether layer i runs so in this pass.
  bool splits_now(size_t layer) const;
  void layer_host_rows(const DeviceLayer& l, int layer, int n_rows);
  // One round: post x (width floats per row) when the host has rows of any of mats (ids: their
  // HostRows::Matrix), the device's rows of each into outs, then the join.
  void host_rows_round(int layer, uint32_t round, const DeviceMatrix* mats, const int* ids,
                       float* const* outs, int count, int n_rows, bool accumulate, const float* x,
                       int64_t width);
  void setup_host_rows(const BackendInit& init);
  void check_launch(cudaError_t status, const char* kernel);
  void wait_for_inputs_sent();
  // cuda_weights.cpp: the constructor's work after the kernel configuration and the stream,
  // the weights' upload, the workspace's allocation and the layers' device addresses.
  void load(const BackendInit& init);
  void upload_weights(const WeightTable& weights);
  void allocate_workspace();
  void bind_layers();

  const ModelConfig& config_;
  const kernels::KernelConfig kernel_config_;
  MemoryManager& memory_;
  int max_rows_;
  CudaStream stream_;
  std::unique_ptr<Cublas> cublas_;  // created on the first GEMM

  WeightLayout layout_;      // where every weight sits (before streamer_, which reads it)
  CudaWorkspace workspace_;  // the buffers below, sized for contexts of the options' length
  DeviceBuffer weights_;     // embeddings and output head, packed
  std::unique_ptr<WeightStreamer> streamer_;  // the layers' blobs
  std::unique_ptr<CudaMoe> moe_;              // the experts of a mixture-of-experts model
  std::unique_ptr<Gemma4Device> gemma4_;      // Gemma 4's per-layer embeddings; null otherwise
  std::unique_ptr<HostRows> host_rows_;       // the host's part of streamed layers, or null
  uint64_t kv_reserve_bytes_ = 0;
  size_t attention_scratch_bytes_ = 0;          // planned for until attach_kv() charges it
  uint64_t recurrent_state_planned_bytes_ = 0;  // likewise, the recurrent state slots
  uint64_t launches_ = 0, copies_ = 0;
  DeviceBuffer vectors_;  // norms and biases as f32
  DeviceBuffer rope_frequencies_buffer_;
  std::vector<DeviceLayer> layers_;
  DeviceMatrix token_embd_, output_;
  const float* output_norm_ = nullptr;
  // Qwen3.5: the section rope's rope_dims / 2 frequencies (0 for pairs that do not turn), the
  // per-row scratch of the hybrid layers, and the recurrent state slots.
  DeviceBuffer section_rope_, hybrid_, recurrent_state_;
  int64_t recurrent_layers_ = 0;
  const double* rope_frequencies_ = nullptr;
  // Gemma's sliding layers: their own base, no scaling (magnitude 1); null for one table.
  const double* rope_frequencies_swa_ = nullptr;
  float rope_magnitude_ = 1.0f;  // YaRN's factor on cos and sin (model/rope.h)
  uint64_t decode_weight_bytes_ = 0;

  // Fixed per-run inputs: tokens, positions, slots, lengths, logit rows (max_rows each).
  DeviceBuffer inputs_;
  PinnedBuffer inputs_host_;
  DeviceBuffer slot_bases_;
  // Per layer: halves from a slot's base to its K at token 0, and per token of its KV part.
  std::vector<int64_t> layer_kv_offset_, layer_token_stride_;
  int64_t max_tokens_ = 0;

  // Activations.
  DeviceBuffer hidden_, normed_, normed_f16_, q8_qs_, q8_ds_, q_, k_, v_, attn_, gate_, up_;
  DeviceBuffer attention_partial_, attention_counters_;
  // Dequantised layer matrices for the GEMM path: [0] always (when max_rows > 64), [1] only
  // with the prefill overlap.
  DeviceBuffer weight_f16_[2];
  DeviceBuffer logits_;
  DeviceBuffer tokens_out_, argmax_scratch_;
  DeviceBuffer token_masks_;
  PinnedBuffer tokens_host_;
  size_t params_offset_ = 0, lengths_offset_ = 0, history_offset_ = 0;  // in inputs_
  size_t dirty_end_ = 0;  // host bytes of inputs_ written since the last flush
  // The flash-attention plan of the last upload(): for a run of flash_rows_ rows (-1: none),
  // flash_tiles_ tiles in inputs_ and flash_other_rows_ rows left to the split kernel.
  int flash_rows_ = -1, flash_tiles_ = 0, flash_other_rows_ = 0;
  bool fused_pass_ = false;        // run_layers: a one-row pass with the batch-1 fusion
  bool split_pass_ = false;        // run_layers: the host computes part of the split layers
  bool edge_norms_fused_ = false;  // run_layers: head_takes_hand_over() on a fused pass
  std::vector<kernels::PrefillTile> tile_plan_;  // scratch of upload()
  std::vector<int32_t> other_rows_;
  CudaEvent inputs_sent_;  // recorded behind the last flush's copy
  int history_capacity_ = static_cast<int>(workspace::kHistoryTokens);
  int64_t widest_ = 0;  // max(n_embd, q_dim, n_ff)

  // The prefill overlap (null when off). gemm() g reads weight_f16_[f16_current_]; the
  // dequantisation of matrix g+1 into the other scratch runs on dequant_stream_ after
  // gemm_ready_, recorded on stream_ just before GEMM g is issued: so it follows GEMM g-1 (the
  // last reader of that scratch) and, for a streamed layer, before_layer()'s wait for the
  // layer's copy. GEMM g+1 waits for dequant_done_, so every dequantisation is joined back into
  // stream_ within its layer (before after_layer() frees a staging slot) and within the pass.
  // stream_ then has the device's greatest priority, dequant_stream_ the least.
  std::unique_ptr<CudaStream> dequant_stream_;
  std::unique_ptr<CudaEvent> gemm_ready_, dequant_done_;
  bool overlap_pass_ = false;             // this run_layers() overlaps (eager GEMM path)
  const DeviceMatrix* staged_ = nullptr;  // dequantised ahead into weight_f16_[f16_current_]
  int f16_current_ = 0;
};

}  // namespace granule::cuda
