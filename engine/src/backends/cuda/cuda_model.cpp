// CudaModel's kernel sequences: the step's inputs and the per-layer kernels of the two paths
// (quantised matvec for up to 64 rows, dequantise + cuBLAS GEMM beyond). The head and sampling
// are in cuda_head.cpp; the weights' upload, the workspace and the placement in cuda_weights.cpp.
#include "backends/cuda/cuda_model.h"

#include <algorithm>
#include <cmath>

#include "attention.cuh"
#include "attention_prefill.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_gemma4.h"  // Gemma4Device (gemma4_'s type)
#include "backends/cuda/host_rows.h"    // HostRows (host_rows_'s type)
#include "backends/kernel_config_env.h"
#include "dequantize.cuh"
#include "gemma_ops.cuh"
#include "granule/error.h"
#include "granule/log.h"
#include "matvec.cuh"
#include "matvec_f16mma.cuh"
#include "matvec_mma.cuh"
#include "quant_blocks.cuh"
#include "quantize_activations.cuh"
#include "rms_norm.cuh"
#include "rope_kv.cuh"
#include "swiglu.cuh"

namespace granule::cuda {
namespace {

namespace k = granule::kernels;

// Runs of at least this many rows of one sequence take the flash-attention prefill kernel
// (a run of 1 is a decode row: the split kernel spreads its tokens over many blocks).
constexpr int kFlashMinRunRows = 2;

// The options' configuration, else the defaults with the environment's overrides (read here,
// once per model), as the current device can run them.
k::KernelConfig device_kernel_config(const BackendOptions& options, int64_t head_dim) {
  k::KernelConfig config =
      options.kernel_config ? *options.kernel_config : kernel_config_from_environment();
  check_cuda(k::fit_to_device(config), "reading the device's compute capability");
  if (config.mma && !k::matvec_mma_fits_device()) {
    config.mma = false;
    logger("engine.cuda")->info("int8 mma off: needs compute capability 8.0 and code built for it");
  } else if (config.mma && k::matvec_mma_device_kernel() == 1) {
    logger("engine.cuda")
        ->info(
            "int8 mma: the block-staged kernel (the warp-pipelined one needs ~208 KB of shared "
            "memory per block)");
  }
  if (config.f16_mma_min_rows > 0 && !k::matvec_f16mma_fits_device()) {
    config.f16_mma_min_rows = 0;
    logger("engine.cuda")->info("f16 mma off: needs compute capability 8.0 and code built for it");
  }
  if (config.flash_prefill && !k::attention_prefill_fits_device(static_cast<int>(head_dim))) {
    config.flash_prefill = false;
    logger("engine.cuda")
        ->info(
            "flash prefill off: needs compute capability 8.0, code built for it and {} bytes "
            "of shared memory per block for head size {}",
            k::attention_prefill_shared_bytes(static_cast<int>(head_dim)), head_dim);
  }
  logger("engine.cuda")
      ->info("kernel configuration: {}; {}; {}", describe(config), describe_mma(config),
             describe_attention(config));
  return config;
}

// The widest head the flash prefill kernel must hold (Gemma 4's kinds differ; its global heads
// of 512 take attention_wide instead, gemma_ops.cuh).
int64_t widest_head(const ModelConfig& c) {
  int64_t widest = 0;
  for (int64_t l = 0; l < c.n_layer; ++l)
    if (c.head_dim_of(l) <= 256) widest = std::max(widest, c.head_dim_of(l));
  return widest > 0 ? widest : c.head_dim;
}

// The model's stream: at the device's greatest priority for the prefill overlap, so that when a
// GEMM and the next matrix's dequantisation (on a stream of the default, least priority) become
// ready together, the block scheduler places the GEMM's blocks first and the dequantisation
// fills the SMs they leave (a small GEMM's, a wave's tail) instead of delaying the GEMM.
int model_stream_priority() {
  int least = 0, greatest = 0;
  check_cuda(cudaDeviceGetStreamPriorityRange(&least, &greatest),
             "cudaDeviceGetStreamPriorityRange");
  return greatest;
}

// A product's kernel: int8 tensor cores (matvec_mma.cu) for runs of mma_min_rows rows or more
// where the type and layout allow, else launch_matvec's dp4a / f32 kernels.
cudaError_t launch_product(uint32_t type, const k::MatvecTask* tasks, int n_tasks,
                           const k::MatvecInput& in, const k::KernelConfig& config,
                           cudaStream_t stream) {
  if (config.mma && in.batch >= config.mma_min_rows &&
      k::matvec_mma_supports(type, tasks[0].split_layout))
    return k::launch_matvec_mma(type, tasks, n_tasks, in, config, stream);
  return k::launch_matvec(type, tasks, n_tasks, in, config, stream);
}

// The tasks of one launch: matrices i.. of one type and layout (at most kMaxMatvecTasks, as Q,
// K and V usually are), each writing outs[m]. Returns the first matrix past them.
int gather_tasks(const DeviceMatrix* mats, float* const* outs, int count, int i, bool accumulate,
                 k::MatvecTask (&tasks)[k::kMaxMatvecTasks]) {
  int j = i;
  while (j < count && j - i < k::kMaxMatvecTasks && mats[j].type == mats[i].type &&
         mats[j].split == mats[i].split) {
    k::MatvecTask& t = tasks[j - i];
    t.weight = mats[j].data;
    t.row_bytes = mats[j].row_bytes;
    t.n_out = static_cast<int>(mats[j].rows);
    t.y = outs[j];
    t.y_stride = mats[j].rows;
    t.accumulate = accumulate;
    t.split_layout = mats[j].split;
    ++j;
  }
  return j;
}

// The fused gate/up product with SwiGLU (gate and up of one type and layout); the caller
// says where its result goes (y, or y_f16 on the f16 path).
k::MatvecTask swiglu_task(const DeviceLayer& l) {
  k::MatvecTask t;
  t.weight = l.w_gate.data;
  t.weight_up = l.w_up.data;
  t.row_bytes = l.w_gate.row_bytes;
  t.split_layout = l.w_gate.split;
  t.n_out = static_cast<int>(l.w_gate.rows);
  t.y_stride = l.w_gate.rows;
  return t;
}

}  // namespace

CudaModel::CudaModel(const BackendInit& init, int max_rows)
    : config_(init.config),
      kernel_config_(device_kernel_config(init.options, widest_head(init.config))),
      memory_(init.memory),
      max_rows_(std::max(max_rows, kLogitRowsPerPass)),
      stream_(model_stream_priority()) {
  load(init);
}

CudaModel::~CudaModel() {
  // A step may still be waiting on the device for the host's rows: it ends before the host's
  // server stops.
  if (host_rows_) {
    cudaStreamSynchronize(stream_.get());
    cudaGetLastError();
  }
}

void CudaModel::check_launch(cudaError_t status, const char* kernel) {
  check_cuda(status, kernel);
  ++launches_;
}

void CudaModel::upload(const RowInputs& in) {
  const size_t n = in.tokens.size();
  if (n > static_cast<size_t>(max_rows_) || in.logit_rows.size() > n)
    throw UsageError("CUDA backend: a run of " + std::to_string(n) + " rows exceeds the workspace");
  if (dirty_end_ == 0) wait_for_inputs_sent();
  auto* host = inputs_host_.as<int32_t>();
  const size_t R = static_cast<size_t>(max_rows_);
  std::copy(in.tokens.begin(), in.tokens.end(), host + kTokens * R);
  std::copy(in.positions.begin(), in.positions.end(), host + kPositions * R);
  std::copy(in.slots.begin(), in.slots.end(), host + kSlots * R);
  // A padding row (slot < 0) sees no KV: attention skips it, rope_kv writes nothing.
  for (size_t i = 0; i < n; ++i) host[kLengths * R + i] = in.slots[i] < 0 ? 0 : in.positions[i] + 1;
  std::copy(in.logit_rows.begin(), in.logit_rows.end(), host + kLogitRows * R);
  // Flash-attention tiles for a run of more than kMatvecMaxRows rows (never graph-captured):
  // each run of one sequence's rows in tiles of up to 64 rows; the other rows (decode rows of
  // a mixed step) keep their lengths in kOtherLengths for the split kernel, tile rows get 0.
  flash_rows_ = -1;
  flash_tiles_ = flash_other_rows_ = 0;
  if (kernel_config_.flash_prefill && n > static_cast<size_t>(kMatvecMaxRows)) {
    const int rows = static_cast<int>(n);
    const int32_t* lengths = host + kLengths * R;
    k::plan_prefill_tiles(in.slots.data(), lengths, rows, kFlashMinRunRows, tile_plan_,
                          other_rows_);
    std::copy(tile_plan_.begin(), tile_plan_.end(),
              reinterpret_cast<k::PrefillTile*>(host + kTiles * R));
    int32_t* other = host + kOtherLengths * R;
    std::fill(other, other + rows, 0);
    for (const int32_t r : other_rows_) other[r] = lengths[r];
    flash_rows_ = rows;
    flash_tiles_ = static_cast<int>(tile_plan_.size());
    flash_other_rows_ = static_cast<int>(other_rows_.size());
  }
  dirty_end_ = std::max(dirty_end_, kInputArrays * R * sizeof(int32_t));
}

int CudaModel::flush_inputs() {
  if (dirty_end_ == 0) return 0;
  check_cuda(cudaMemcpyAsync(inputs_.get(), inputs_host_.as<uint8_t>(), dirty_end_,
                             cudaMemcpyHostToDevice, stream_.get()),
             "uploading step inputs");
  mark_inputs_sent();
  return 1;
}

void CudaModel::queue_step_inputs(int rows, bool sampling) {
  // The arrays a decode step reads (tokens through logit rows; no flash-attention plan) as
  // one strided copy of their first `rows` entries.
  const size_t pitch = static_cast<size_t>(max_rows_) * sizeof(int32_t);
  const size_t width = static_cast<size_t>(rows) * sizeof(int32_t);
  check_cuda(cudaMemcpy2DAsync(inputs_.get(), pitch, inputs_host_.as<uint8_t>(), pitch, width,
                               kOtherLengths, cudaMemcpyHostToDevice, stream_.get()),
             "queueing the step's inputs");
  if (!sampling) return;
  auto copy = [&](size_t offset, size_t bytes) {
    auto* device = inputs_.as<uint8_t>() + offset;
    check_cuda(cudaMemcpyAsync(device, inputs_host_.as<uint8_t>() + offset, bytes,
                               cudaMemcpyHostToDevice, stream_.get()),
               "queueing the step's sampling inputs");
  };
  copy(params_offset_, static_cast<size_t>(rows) * sizeof(k::DeviceSamplingParams));
  copy(lengths_offset_, width);
  copy(history_offset_, static_cast<size_t>(rows) * history_capacity_ * sizeof(int32_t));
}

void CudaModel::queue_token_download(int rows) const {
  check_cuda(cudaMemcpyAsync(tokens_host_.as<int32_t>(), tokens_out_.get(),
                             static_cast<size_t>(rows) * sizeof(int32_t), cudaMemcpyDeviceToHost,
                             stream_.get()),
             "downloading tokens");
}

void CudaModel::mark_inputs_sent() {
  check_cuda(cudaEventRecord(inputs_sent_.get(), stream_.get()), "cudaEventRecord");
  dirty_end_ = 0;
}

void CudaModel::read_tokens(int count, int32_t* host) const {
  stream_.synchronize();
  std::copy_n(tokens_host_.as<int32_t>(), count, host);
}

void CudaModel::wait_for_inputs_sent() {
  // The pinned mirror is rewritten only once the copy that reads it ran (a prefill of several
  // chunks writes the next chunk's inputs while the last one may still be queued).
  check_cuda(cudaEventSynchronize(inputs_sent_.get()), "cudaEventSynchronize");
}

void CudaModel::norm_for(const DeviceMatrix& w, const float* x, const float* weight, int n_rows,
                         bool f16) {
  k::RmsNormOutputs out;
  if (f16)
    out.f16 = normed_f16_.as<__half>();
  else if (k::matvec_reads_q8(w.type, w.split))
    out.q8 = {q8_qs_.as<int8_t>(), q8_ds_.as<float2>()};
  else
    out.f32 = normed_.as<float>();
  check_launch(k::launch_rms_norm(x, weight, n_rows, static_cast<int>(config_.n_embd),
                                  config_.rms_eps, out, kernel_config_, stream_.get()),
               "rms_norm");
}

void CudaModel::matvec(const DeviceMatrix* mats, float* const* outs, int count, int n_rows,
                       bool accumulate, const float* x_f32, bool normed_input,
                       const DeviceLayer* rope_layer, const int64_t* y_strides) {
  // One launch per run of consecutive matrices of the same type (Q, K, V usually share one).
  int i = 0;
  while (i < count) {
    k::MatvecTask tasks[k::kMaxMatvecTasks];
    const int j = gather_tasks(mats, outs, count, i, accumulate, tasks);
    if (y_strides)
      for (int m = i; m < j; ++m) tasks[m - i].y_stride = y_strides[m];
    k::MatvecInput in;
    if (rope_layer) {  // mats are Q, K, V: rope_kv's work in the epilogue
      const int64_t R = max_rows_;
      const int32_t* inputs = inputs_.as<int32_t>();
      in.rope.positions = inputs + kPositions * R;
      in.rope.slots = inputs + kSlots * R;
      in.rope.slot_base = slot_bases_.as<__half* const>();
      in.rope.frequencies = rope_frequencies_;
      const auto layer = static_cast<size_t>(rope_layer - layers_.data());
      in.rope.token_stride = layer_token_stride_[layer];
      in.rope.kv_offset = layer_kv_offset_[layer];
      in.rope.layer = 0;
      in.rope.n_kv = static_cast<int>(config_.n_head_kv);
      in.rope.head_dim = static_cast<int>(config_.head_dim);
      const float* biases[3] = {rope_layer->bq, rope_layer->bk, rope_layer->bv};
      for (int m = i; m < j; ++m) {
        tasks[m - i].rope_part = m + 1;
        tasks[m - i].bias = biases[m];
      }
    }
    in.n_in = static_cast<int>(mats[i].cols);
    in.batch = n_rows;
    in.x = x_f32;
    in.xq = {q8_qs_.as<int8_t>(), q8_ds_.as<float2>()};
    if (normed_input) read_handed_over_norm(in);
    check_launch(launch_product(mats[i].type, tasks, j - i, in, kernel_config_, stream_.get()),
                 "matvec");
    i = j;
  }
}

bool CudaModel::fusion_fits() const {
  const k::KernelConfig& kc = kernel_config_;
  // Gemma's sandwich norms sit between the products the fusion joins, and its embeddings are
  // scaled after the gather: its layers take the unfused kernels.
  if (gemma_layers()) return false;
  if (config_.is_hybrid()) return hybrid_fusion_fits();  // cuda_hybrid.cpp
  for (const DeviceLayer& l : layers_) {
    if (takes_f16mma(l, 1) || l.w_gate.type != l.w_up.type || l.w_gate.split != l.w_up.split)
      return false;
    for (const DeviceMatrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      // One row must take the split kernels (launch_product), which read int8 blocks.
      if (!m->split) return false;
      if (kc.mma && kc.mma_min_rows <= 1 && k::matvec_mma_supports(m->type, m->split)) return false;
    }
  }
  return true;
}

bool CudaModel::head_takes_hand_over() const {
  const k::KernelConfig& kc = kernel_config_;
  return output_.split && k::matvec_reads_q8(output_.type, output_.split) &&
         !(kc.mma && kc.mma_min_rows <= 1 && k::matvec_mma_supports(output_.type, output_.split));
}

k::ActivationQ8 CudaModel::fusion_q8() const {
  return {q8_qs_.as<int8_t>() + widest_, q8_ds_.as<float2>() + widest_ / k::kQ8Block};
}

float* CudaModel::fusion_sums() const {
  return reinterpret_cast<float*>(q8_ds_.as<float2>() + 2 * (widest_ / k::kQ8Block));
}

void CudaModel::read_handed_over_norm(k::MatvecInput& in) const {
  in.xq = fusion_q8();
  in.norm_sum_squares = fusion_sums();
  in.norm_eps = config_.rms_eps;
}

void CudaModel::matvec_normed_out(const DeviceMatrix& w, float* y, const float* norm_weight) {
  k::MatvecTask tasks[k::kMaxMatvecTasks];
  float* const outs[1] = {y};
  gather_tasks(&w, outs, 1, 0, true, tasks);
  tasks[0].y_q8 = fusion_q8();
  tasks[0].norm_weight = norm_weight;
  tasks[0].sum_squares = fusion_sums();
  k::MatvecInput in;
  in.n_in = static_cast<int>(w.cols);
  in.batch = 1;
  in.xq = {q8_qs_.as<int8_t>(), q8_ds_.as<float2>()};
  check_launch(launch_product(w.type, tasks, 1, in, kernel_config_, stream_.get()),
               "matvec_normed_out");
}

void CudaModel::gemm(const DeviceMatrix& w, const DeviceMatrix* next, const __half* x, int n_rows,
                     float* y, bool accumulate) {
  if (!cublas_) {
    cublas_ = std::make_unique<Cublas>(stream_.get());
    logger("engine.cuda")->info("cuBLAS loaded from {}", Cublas::library_path());
  }
  auto dequantize = [&](const DeviceMatrix& m, int buffer, cudaStream_t stream) {
    check_launch(k::launch_dequantize_to_f16(m.type, m.data, m.rows, m.cols, m.row_bytes,
                                             weight_f16_[buffer].as<__half>(), stream, m.split),
                 "dequantize_to_f16");
  };
  int buffer = 0;
  if (!overlap_pass_) {
    dequantize(w, buffer, stream_.get());
  } else {
    // w was dequantised ahead into weight_f16_[f16_current_] (or, should another matrix have
    // been, it is overwritten once that finished); else it is dequantised here, in order.
    buffer = f16_current_;
    if (staged_)
      check_cuda(cudaStreamWaitEvent(stream_.get(), dequant_done_->get(), 0),
                 "cudaStreamWaitEvent");
    if (staged_ != &w) dequantize(w, buffer, stream_.get());
    staged_ = nullptr;
    f16_current_ = 1 - buffer;
    if (next) {
      check_cuda(cudaEventRecord(gemm_ready_->get(), stream_.get()), "cudaEventRecord");
      check_cuda(cudaStreamWaitEvent(dequant_stream_->get(), gemm_ready_->get(), 0),
                 "cudaStreamWaitEvent");
      dequantize(*next, f16_current_, dequant_stream_->get());
      check_cuda(cudaEventRecord(dequant_done_->get(), dequant_stream_->get()), "cudaEventRecord");
      staged_ = next;
    }
  }
  // Row-major Y[n_rows][w.rows] = X · Wᵀ, i.e. column-major Y (w.rows × n_rows) = Wᵀ(cm) · X(cm).
  cublas_->gemm_f16_f32(CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(w.rows), n_rows,
                        static_cast<int>(w.cols), 1.0f, weight_f16_[buffer].get(),
                        static_cast<int>(w.cols), x, static_cast<int>(w.cols),
                        accumulate ? 1.0f : 0.0f, y, static_cast<int>(w.rows));
}

void CudaModel::attention(int layer, int n_rows, __half* f16_out, bool roped) {
  const ModelConfig& c = config_;
  const int32_t* in = inputs_.as<int32_t>();
  const int64_t R = max_rows_;
  // Gemma 4's layer kinds differ in head size and KV heads (the same for every layer elsewhere).
  const int64_t head_dim = c.head_dim_of(layer), n_head_kv = c.n_head_kv_of(layer);
  k::RopeKvArgs r;
  r.q = q_.as<float>();
  r.q_stride = c.n_head * head_dim;
  r.k = k_.as<float>();
  r.k_stride = n_head_kv * head_dim;
  r.v = v_.as<float>();
  r.v_stride = n_head_kv * head_dim;
  const DeviceLayer& l = layers_[static_cast<size_t>(layer)];
  r.q_bias = l.bq;
  r.k_bias = l.bk;
  r.v_bias = l.bv;
  r.q_norm = l.q_norm;
  r.k_norm = l.k_norm;
  r.norm_eps = c.rms_eps;
  // Gemma's sliding layers rotate with their own base and no scaling (magnitude 1).
  const bool own_base = rope_frequencies_swa_ && c.layer_slides(layer);
  r.frequencies = own_base ? rope_frequencies_swa_ : rope_frequencies_;
  r.neox = c.rope_ordering == RopeOrdering::NeoX;
  r.magnitude = own_base ? 1.0f : rope_magnitude_;
  r.n_head = static_cast<int>(c.n_head);
  r.n_kv = static_cast<int>(n_head_kv);
  r.head_dim = static_cast<int>(head_dim);
  r.rows = n_rows;
  r.positions = in + kPositions * R;
  r.slots = in + kSlots * R;
  r.slot_base = slot_bases_.as<__half* const>();
  r.token_stride = layer_token_stride_[static_cast<size_t>(layer)];
  r.kv_offset = layer_kv_offset_[static_cast<size_t>(layer)];
  r.layer = 0;
  if (l.bo) {  // gpt-oss: the output bias joins the residual the output projection adds to
    if (roped) throw UsageError("CUDA backend: the fused Q/K/V rotation adds no output bias");
    r.residual = hidden_.as<float>();
    r.residual_bias = l.bo;
    r.residual_width = static_cast<int>(c.n_embd);
    r.residual_stride = c.n_embd;
  }
  if (!roped) check_launch(k::launch_rope_kv(r, kernel_config_, stream_.get()), "rope_kv");

  k::AttentionArgs a;
  a.q = q_.as<float>();
  a.q_stride = r.q_stride;
  a.out = attn_.as<float>();
  a.out_stride = r.q_stride;
  a.rows = n_rows;
  a.n_head = r.n_head;
  a.n_kv = r.n_kv;
  a.head_dim = r.head_dim;
  a.lengths = in + kLengths * R;
  a.slots = r.slots;
  a.slot_base = r.slot_base;
  a.token_stride = r.token_stride;
  a.kv_offset = r.kv_offset;
  a.layer = 0;
  a.scale =
      c.attention_scale > 0.0f ? c.attention_scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
  a.sinks = l.attn_sinks;
  // A sliding layer reads each row's window only (its start formed on the device from the row's
  // length), so the window bounds its splits.
  a.window = c.layer_slides(layer) ? static_cast<int>(c.sliding_window) : 0;
  a.split_tokens = n_rows <= kMatvecMaxRows ? kDecodeSplitTokens : kPrefillSplitTokens;
  a.max_splits = k::ceil_div(a.window > 0 ? std::min<int64_t>(max_tokens_, a.window) : max_tokens_,
                             a.split_tokens);
  a.partial = attention_partial_.as<float>();
  a.split_counters = attention_counters_.as<int>();
  a.out_f16 = f16_out;
  // The output projection reads int8 blocks when its kernel does (it reads the f16 copy
  // instead where there is one): the merge writes them.
  const DeviceMatrix& wo = layers_[static_cast<size_t>(layer)].wo;
  // (Qwen3.5's output gate comes between: its caller quantises after it.)
  const bool out_q8 = !f16_out && n_rows <= kMatvecMaxRows &&
                      k::matvec_reads_q8(wo.type, wo.split) && !c.attn_output_gate;
  if (head_dim > 256) {  // Gemma 4's global heads of 512: their own kernel, int8 copy after it
    check_launch(k::launch_attention_wide(a, kernel_config_, stream_.get()), "attention_wide");
    if (out_q8)
      check_launch(k::launch_quantize_q8(a.out, n_rows, static_cast<int>(a.out_stride),
                                         {q8_qs_.as<int8_t>(), q8_ds_.as<float2>()}, kernel_config_,
                                         stream_.get()),
                   "quantize_q8");
    return;
  }
  if (out_q8) a.out_q8 = {q8_qs_.as<int8_t>(), q8_ds_.as<float2>()};
  // Prefill: the flash kernel for the planned tiles (it writes no int8 copy: with out_q8 the
  // split kernel takes every row), then the split kernel for the other rows only.
  if (flash_tiles_ > 0 && n_rows == flash_rows_ && !a.out_q8.qs && !a.out_f16 &&
      !stream_capturing()) {
    check_launch(
        k::launch_attention_prefill(a, reinterpret_cast<const k::PrefillTile*>(in + kTiles * R),
                                    flash_tiles_, kernel_config_, stream_.get()),
        "attention_prefill");
    if (flash_other_rows_ == 0) return;
    a.lengths = in + kOtherLengths * R;
  }
  check_launch(k::launch_attention(a, kernel_config_, stream_.get()), "attention");
}

bool CudaModel::stream_capturing() const {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(stream_.get(), &status), "cudaStreamIsCapturing");
  return status != cudaStreamCaptureStatusNone;
}

bool CudaModel::takes_f16mma(const DeviceLayer& l, int n_rows) const {
  if (moe_) return false;                 // the expert kernels: one path at every row count
  if (config_.is_hybrid()) return false;  // cuda_hybrid.cpp: the int8 / f32 products
  const int least = kernel_config_.f16_mma_min_rows;
  if (least <= 0 || n_rows < least || n_rows > kMatvecMaxRows) return false;
  if (l.w_gate.type != l.w_up.type || l.w_gate.split != l.w_up.split) return false;
  for (const DeviceMatrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
    if (!k::matvec_f16mma_supports(m->type, m->split)) return false;
  return true;
}

void CudaModel::f16mma(const DeviceMatrix* mats, float* const* outs, int count, int n_rows,
                       bool accumulate, const __half* x, int64_t n_in) {
  // One launch per run of consecutive matrices of the same type, as matvec().
  int i = 0;
  while (i < count) {
    k::MatvecTask tasks[k::kMaxMatvecTasks];
    const int j = gather_tasks(mats, outs, count, i, accumulate, tasks);
    k::MatvecInputF16 in;
    in.n_in = static_cast<int>(n_in);
    in.batch = n_rows;
    in.x = x;
    check_launch(
        k::launch_matvec_f16mma(mats[i].type, tasks, j - i, in, kernel_config_, stream_.get()),
        "matvec_f16mma");
    i = j;
  }
}

// The layer of layer_matvec with f16 activations: the norms and attention write f16 copies of
// their outputs (normed_f16_), the SwiGLU product writes its result in f16 (into gate_, which
// this path does not otherwise use: x16 is still its input), and every product reads f16 on the
// tensor cores.
void CudaModel::layer_f16mma(const DeviceLayer& l, int layer, int n_rows) {
  const ModelConfig& c = config_;
  float* hidden = hidden_.as<float>();
  __half* x16 = normed_f16_.as<__half>();  // what norm_for(..., true) writes
  norm_for(l.wq, hidden, l.attn_norm, n_rows, true);
  const DeviceMatrix qkv[3] = {l.wq, l.wk, l.wv};
  float* const qkv_out[3] = {q_.as<float>(), k_.as<float>(), v_.as<float>()};
  f16mma(qkv, qkv_out, 3, n_rows, false, x16, c.n_embd);
  attention(layer, n_rows, x16);  // its output in f16 for the output projection
  const int64_t q_dim = c.n_head * c.head_dim;
  float* const hidden_out[1] = {hidden};
  // Gemma: each block's output into normed_ (unused on this path), its RMSNorm joining the
  // residual.
  float* const projected_out[1] = {normed_.as<float>()};
  const bool sandwich = l.attn_post_norm != nullptr;
  f16mma(&l.wo, sandwich ? projected_out : hidden_out, 1, n_rows, !sandwich, x16, q_dim);
  if (sandwich) post_norm(l.attn_post_norm, n_rows);

  norm_for(l.w_gate, hidden, l.ffn_norm, n_rows, true);
  if (c.activation == FfnActivation::GeluTanh) {
    // GeGLU: gate and up in f32, then their product in f16 over x16 (widest: n_ff fits), which
    // the products have read.
    const DeviceMatrix gu[2] = {l.w_gate, l.w_up};
    float* const gu_out[2] = {gate_.as<float>(), up_.as<float>()};
    f16mma(gu, gu_out, 2, n_rows, false, x16, c.n_embd);
    check_launch(k::launch_geglu_to_f16(gate_.as<float>(), up_.as<float>(), n_rows * c.n_ff, x16,
                                        stream_.get()),
                 "geglu");
    const bool post = l.ffn_post_norm != nullptr;
    f16mma(&l.w_down, post ? projected_out : hidden_out, 1, n_rows, !post, x16, c.n_ff);
    if (post) post_norm(l.ffn_post_norm, n_rows);
    return;
  }
  __half* h16 = reinterpret_cast<__half*>(gate_.as<float>());  // n_ff halves per row fit
  k::MatvecTask t = swiglu_task(l);
  t.y_f16 = h16;
  k::MatvecInputF16 in;
  in.n_in = static_cast<int>(c.n_embd);
  in.batch = n_rows;
  in.x = x16;
  check_launch(k::launch_matvec_f16mma(l.w_gate.type, &t, 1, in, kernel_config_, stream_.get()),
               "matvec_f16mma_swiglu");
  f16mma(&l.w_down, hidden_out, 1, n_rows, true, h16, c.n_ff);
}

void CudaModel::layer_matvec(const DeviceLayer& l, int layer, int n_rows) {
  if (takes_f16mma(l, n_rows)) {
    layer_f16mma(l, layer, n_rows);
    return;
  }
  const ModelConfig& c = config_;
  float* hidden = hidden_.as<float>();
  // With the batch-1 fusion the previous layer's down projection wrote this layer's first norm
  // input (layer 0's: the embedding gather, at fusion 4), and the output projection writes the
  // second one's; at fusion 4 the last down projection writes the output norm's.
  const bool fused = fused_pass_ && n_rows == 1;
  // (A layer split with the host before this one takes the unfused products: it hands nothing
  // over.)
  const bool normed_by_down =
      fused && (layer > 0 ? !splits_now(static_cast<size_t>(layer) - 1) : edge_norms_fused_);
  const bool last = static_cast<size_t>(layer) + 1 == layers_.size();
  const bool next_splits = !last && splits_now(static_cast<size_t>(layer) + 1);
  // Attention block. Norm output in every format Q/K/V need.
  if (!normed_by_down) {
    k::RmsNormOutputs out;
    for (const DeviceMatrix* m : {&l.wq, &l.wk, &l.wv}) {
      if (k::matvec_reads_q8(m->type, m->split))
        out.q8 = {q8_qs_.as<int8_t>(), q8_ds_.as<float2>()};
      else
        out.f32 = normed_.as<float>();
    }
    check_launch(k::launch_rms_norm(hidden, l.attn_norm, n_rows, static_cast<int>(c.n_embd),
                                    c.rms_eps, out, kernel_config_, stream_.get()),
                 "rms_norm");
  }
  const DeviceMatrix qkv[3] = {l.wq, l.wk, l.wv};
  float* const qkv_out[3] = {q_.as<float>(), k_.as<float>(), v_.as<float>()};
  // The Q/K/V epilogue's rotation has no YaRN magnitude and adds no output bias (rope_kv does).
  const bool rope_in_qkv = fused && config_.rope_ordering != RopeOrdering::NeoX && !l.q_norm &&
                           !l.k_norm && rope_magnitude_ == 1.0f && !l.bo;
  matvec(qkv, qkv_out, 3, n_rows, false, normed_.as<float>(), normed_by_down,
         rope_in_qkv ? &l : nullptr);
  attention(layer, n_rows, nullptr, rope_in_qkv);
  float* const hidden_out[1] = {hidden};
  // Gemma: the output projection into normed_ (its input, the attention norm's, is spent), then
  // its RMSNorm joins the residual.
  float* const projected_out[1] = {normed_.as<float>()};
  if (fused)
    matvec_normed_out(l.wo, hidden, l.ffn_norm);
  else if (l.attn_post_norm)
    matvec(&l.wo, projected_out, 1, n_rows, false, attn_.as<float>());
  else
    matvec(&l.wo, hidden_out, 1, n_rows, true, attn_.as<float>());
  if (l.attn_post_norm) post_norm(l.attn_post_norm, n_rows);

  if (moe_) {
    moe_ffn(l, layer, n_rows);
    return;
  }
  // Feed-forward block: SwiGLU fused into the gate/up product when both share a type.
  if (!fused) {
    ffn_norm_for_gate_up(l, hidden, n_rows);
  }
  float* h = gate_.as<float>();
  // The gate/up product quantises its result where its 32-row blocks of 32 warps run in one
  // wave (SmolLM2: 48 blocks); more (an 8B model's 448) leave SMs idle behind each block's
  // slowest warp, and the quantisation kernel costs less than that, unless smaller blocks
  // own the 32-row blocks (split_owned_kernel, Q4_0 and Q4_1).
  const bool quantized_by_swiglu = fused && (c.n_ff / k::kQ8Block <= k::multiprocessors() ||
                                             k::matvec_owns_row_blocks(l.w_gate.type));
  const bool geglu = c.activation == FfnActivation::GeluTanh;
  if (!geglu && l.w_gate.type == l.w_up.type && l.w_gate.split == l.w_up.split) {
    k::MatvecTask t = swiglu_task(l);
    t.y = h;
    k::MatvecInput in;
    in.n_in = static_cast<int>(c.n_embd);
    in.batch = n_rows;
    in.x = normed_.as<float>();
    in.xq = {q8_qs_.as<int8_t>(), q8_ds_.as<float2>()};
    if (fused) read_handed_over_norm(in);
    if (quantized_by_swiglu) t.y_q8 = {q8_qs_.as<int8_t>(), q8_ds_.as<float2>()};
    check_launch(launch_product(l.w_gate.type, &t, 1, in, kernel_config_, stream_.get()),
                 "matvec_swiglu");
  } else {
    gate_up_unfused(l, n_rows, h, geglu);
  }
  if (k::matvec_reads_q8(l.w_down.type, l.w_down.split) && !quantized_by_swiglu)
    check_launch(k::launch_quantize_q8(h, n_rows, static_cast<int>(c.n_ff),
                                       {q8_qs_.as<int8_t>(), q8_ds_.as<float2>()}, kernel_config_,
                                       stream_.get()),
                 "quantize_q8");
  if (fused && !last && !next_splits)
    matvec_normed_out(l.w_down, hidden, layers_[static_cast<size_t>(layer) + 1].attn_norm);
  else if (fused && last && edge_norms_fused_)
    matvec_normed_out(l.w_down, hidden, output_norm_);
  else if (l.ffn_post_norm)
    matvec(&l.w_down, projected_out, 1, n_rows, false, h);
  else
    matvec(&l.w_down, hidden_out, 1, n_rows, true, h);
  if (l.ffn_post_norm) post_norm(l.ffn_post_norm, n_rows);
}

bool CudaModel::swiglu_matvec(const DeviceLayer& l, int n_rows, float* h, bool fused) {
  k::MatvecTask t = swiglu_task(l);
  t.y = h;
  k::MatvecInput in;
  in.n_in = static_cast<int>(config_.n_embd);
  in.batch = n_rows;
  in.x = normed_.as<float>();
  in.xq = {q8_qs_.as<int8_t>(), q8_ds_.as<float2>()};
  // As layer_matvec's quantized_by_swiglu.
  const bool quantized = fused && (config_.n_ff / k::kQ8Block <= k::multiprocessors() ||
                                   k::matvec_owns_row_blocks(l.w_gate.type));
  if (fused) read_handed_over_norm(in);
  if (quantized) t.y_q8 = {q8_qs_.as<int8_t>(), q8_ds_.as<float2>()};
  check_launch(launch_product(l.w_gate.type, &t, 1, in, kernel_config_, stream_.get()),
               "matvec_swiglu");
  return quantized;
}

// The FFN norm of `hidden` into the inputs the gate and up products read: int8 blocks where one
// of them reads int8, f32 where one reads f32.
void CudaModel::ffn_norm_for_gate_up(const DeviceLayer& l, const float* hidden, int n_rows) {
  const ModelConfig& c = config_;
  k::RmsNormOutputs out;
  for (const DeviceMatrix* m : {&l.w_gate, &l.w_up}) {
    if (k::matvec_reads_q8(m->type, m->split))
      out.q8 = {q8_qs_.as<int8_t>(), q8_ds_.as<float2>()};
    else
      out.f32 = normed_.as<float>();
  }
  check_launch(k::launch_rms_norm(hidden, l.ffn_norm, n_rows, static_cast<int>(c.n_embd), c.rms_eps,
                                  out, kernel_config_, stream_.get()),
               "rms_norm");
}

void CudaModel::gate_up_unfused(const DeviceLayer& l, int n_rows, float* h, bool geglu) {
  const DeviceMatrix gu[2] = {l.w_gate, l.w_up};
  float* const gu_out[2] = {gate_.as<float>(), up_.as<float>()};
  matvec(gu, gu_out, 1, n_rows, false, normed_.as<float>());
  matvec(gu + 1, gu_out + 1, 1, n_rows, false, normed_.as<float>());
  const int64_t n = n_rows * config_.n_ff;
  if (geglu)
    check_launch(k::launch_geglu_f32(gate_.as<float>(), up_.as<float>(), n, h, kernel_config_,
                                     stream_.get()),
                 "geglu");
  else
    check_launch(k::launch_swiglu_f32(gate_.as<float>(), up_.as<float>(), n, h, kernel_config_,
                                      stream_.get()),
                 "swiglu");
}

void CudaModel::post_norm(const float* weight, int n_rows) {
  k::RmsNormOutputs out;
  out.residual = hidden_.as<float>();
  check_launch(
      k::launch_rms_norm(normed_.as<float>(), weight, n_rows, static_cast<int>(config_.n_embd),
                         config_.rms_eps, out, kernel_config_, stream_.get()),
      "rms_norm_residual");
}

void CudaModel::moe_ffn(const DeviceLayer& l, int layer, int n_rows) {
  // The router reads the norm's f32 output, quantised experts its int8 blocks (the RMSNorm
  // kernel's rounding: the contract's MultiplyByInverse).
  const k::ActivationQ8 xq{q8_qs_.as<int8_t>(), q8_ds_.as<float2>()};
  k::RmsNormOutputs out;
  out.f32 = normed_.as<float>();
  out.q8 = xq;
  check_launch(
      k::launch_rms_norm(hidden_.as<float>(), l.ffn_norm, n_rows, static_cast<int>(config_.n_embd),
                         config_.rms_eps, out, kernel_config_, stream_.get()),
      "rms_norm");
  moe_->forward(layer, n_rows, normed_.as<float>(), xq, inputs_.as<int32_t>() + kSlots * max_rows_,
                hidden_.as<float>(), kernel_config_, stream_.get(), &launches_);
}

void CudaModel::layer_gemm(const DeviceLayer& l, int layer, int n_rows,
                           const DeviceMatrix* next_wq) {
  const ModelConfig& c = config_;
  float* hidden = hidden_.as<float>();
  __half* x16 = normed_f16_.as<__half>();
  norm_for(l.wq, hidden, l.attn_norm, n_rows, true);
  gemm(l.wq, &l.wk, x16, n_rows, q_.as<float>(), false);
  gemm(l.wk, &l.wv, x16, n_rows, k_.as<float>(), false);
  gemm(l.wv, &l.wo, x16, n_rows, v_.as<float>(), false);
  attention(layer, n_rows);
  const int64_t q_dim = c.n_head * c.head_dim;
  check_launch(k::launch_convert_f32_to_f16(attn_.as<float>(), n_rows * q_dim, x16, stream_.get()),
               "convert_f16");
  // Gemma: each block's output lands in normed_ (free on this path: the norms write f16) and
  // its RMSNorm joins the residual.
  float* projected = normed_.as<float>();
  if (l.attn_post_norm) {
    gemm(l.wo, &l.w_gate, x16, n_rows, projected, false);
    post_norm(l.attn_post_norm, n_rows);
  } else {
    gemm(l.wo, moe_ ? next_wq : &l.w_gate, x16, n_rows, hidden, true);
  }
  if (moe_) {
    moe_ffn(l, layer, n_rows);
    return;
  }
  norm_for(l.w_gate, hidden, l.ffn_norm, n_rows, true);
  gemm(l.w_gate, &l.w_up, x16, n_rows, gate_.as<float>(), false);
  gemm(l.w_up, &l.w_down, x16, n_rows, up_.as<float>(), false);
  if (c.activation == FfnActivation::GeluTanh)
    check_launch(k::launch_geglu_to_f16(gate_.as<float>(), up_.as<float>(), n_rows * c.n_ff, x16,
                                        stream_.get()),
                 "geglu");
  else
    check_launch(k::launch_swiglu_to_f16(gate_.as<float>(), up_.as<float>(), n_rows * c.n_ff, x16,
                                         stream_.get()),
                 "swiglu");
  if (l.ffn_post_norm) {
    gemm(l.w_down, next_wq, x16, n_rows, projected, false);
    post_norm(l.ffn_post_norm, n_rows);
  } else {
    gemm(l.w_down, next_wq, x16, n_rows, hidden, true);
  }
}

void CudaModel::run_layers(int n_rows) {
  if (!attention_partial_.get()) throw UsageError("CUDA backend: run before attach_kv()");
  const ModelConfig& c = config_;
  const int32_t* in = inputs_.as<int32_t>();
  fused_pass_ = n_rows == 1 && fusion_fits();
  split_pass_ = host_rows_ && n_rows <= HostRows::kMaxRows;
  if (split_pass_) host_rows_->channel().check();  // an eager pass after a failed one
  // (The last layer split with the host leaves the output norm to the head.)
  edge_norms_fused_ = fused_pass_ && head_takes_hand_over() && !splits_now(layers_.size() - 1);
  k::NormHandOver first_norm;
  if (edge_norms_fused_) {
    first_norm.weight = layers_[0].attn_norm;
    first_norm.qs = fusion_q8().qs;
    first_norm.ds = fusion_q8().ds;
    first_norm.sums = fusion_sums();
  }
  check_launch(
      k::launch_embedding_gather(token_embd_.type, token_embd_.data, token_embd_.row_bytes,
                                 static_cast<int>(c.n_embd), c.n_vocab, in + kTokens * max_rows_,
                                 n_rows, hidden_.as<float>(), stream_.get(), token_embd_.split,
                                 edge_norms_fused_ ? &first_norm : nullptr),
      "embedding_gather");
  if (c.embedding_scale != 1.0f)  // Gemma: times sqrt(n_embd) (no fused pass hands a norm over)
    check_launch(k::launch_scale(hidden_.as<float>(), static_cast<int64_t>(n_rows) * c.n_embd,
                                 c.embedding_scale, kernel_config_, stream_.get()),
                 "scale");
  if (gemma4_) gemma4_inputs(n_rows);  // the per-layer embeddings' inputs, from the scaled ones
  // The prefill overlap runs eagerly only: a captured step (a decode batch of more than 64
  // rows) keeps the one-stream GEMM path. A pass that threw after a dequantisation ahead left
  // it unjoined: stream_ waits for it before anything reuses its scratch.
  if (staged_) {
    check_cuda(cudaStreamWaitEvent(stream_.get(), dequant_done_->get(), 0), "cudaStreamWaitEvent");
    staged_ = nullptr;
  }
  overlap_pass_ = dequant_stream_ && n_rows > kMatvecMaxRows && !stream_capturing();
  auto takes_gemm = [&](size_t) { return n_rows > kMatvecMaxRows; };
  copies_ += streamer_->begin_pass(stream_.get(), split_pass_);
  for (size_t i = 0; i < layers_.size(); ++i) {
    streamer_->before_layer(i, stream_.get());
    if (splits_now(i)) {
      layer_host_rows(layers_[i], static_cast<int>(i), n_rows);
    } else if (c.is_hybrid()) {
      layer_hybrid(layers_[i], static_cast<int>(i), n_rows);
    } else if (gemma4_) {
      layer_gemma4(layers_[i], static_cast<int>(i), n_rows);
    } else if (!takes_gemm(i)) {
      layer_matvec(layers_[i], static_cast<int>(i), n_rows);
    } else {
      // The next layer's first matrix is dequantised during this layer's last GEMM only when
      // its weights are resident: a streamed layer's bytes are valid once before_layer() has
      // waited for its copy, so its first dequantisation runs on stream_ after that wait.
      const size_t n = i + 1;
      const bool ahead =
          overlap_pass_ && n < layers_.size() && takes_gemm(n) && !streamer_->streamed(n);
      layer_gemm(layers_[i], static_cast<int>(i), n_rows, ahead ? &layers_[n].wq : nullptr);
    }
    copies_ += streamer_->after_layer(i, stream_.get());
  }
}

}  // namespace granule::cuda
