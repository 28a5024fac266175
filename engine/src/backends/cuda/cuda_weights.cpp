// CudaModel's memory: the weights uploaded in the layout memory/weight_layout.h names, the
// workspace memory/workspace_layout.h lists, the placement of the layers (resident or streamed)
// and the KV binding. The kernel sequences that read them are in cuda_model.cpp.
#include <cuda_fp16.h>

#include <algorithm>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_gemma4.h"  // Gemma4Device (gemma4_'s type)
#include "backends/cuda/cuda_model.h"
#include "delta_net.cuh"  // delta_net_supports
#include "granule/error.h"
#include "granule/log.h"
#include "granule/quant.h"
#include "memory/placement.h"
#include "model/rope.h"
#include "quant_blocks.cuh"  // is_supported_weight_type

namespace granule::cuda {
namespace {

namespace k = granule::kernels;

// workspace_layout.h sizes these without CUDA's headers.
static_assert(sizeof(k::DeviceSamplingParams) == workspace::kSamplingParamsBytes);
static_assert(k::kQ8Block == workspace::kQ8Block);
static_assert(sizeof(float2) == 2 * sizeof(float) && sizeof(__half) == 2);

std::vector<float> to_f32(const TensorInfo* t) {
  std::vector<float> out(static_cast<size_t>(t->elements()));
  dequantize_row(static_cast<TensorType>(t->ggml_type), t->data, out.data(), t->elements());
  return out;
}

std::string type_refusal(const MatrixLayout& m) {
  if (!m.tensor || k::is_supported_weight_type(m.tensor->ggml_type)) return {};
  return "the CUDA backend cannot run tensor " + m.tensor->name + " of type " +
         tensor_type_name(m.tensor->ggml_type);
}

void check_type(const MatrixLayout& m) {
  if (const std::string why = type_refusal(m); !why.empty()) throw DeviceError(why);
}

// What the kernels do not cover in the model's shapes, or empty.
std::string shape_refusal(const ModelConfig& c, const WeightTable& w) {
  if (c.is_hybrid()) {
    const DeltaNetConfig& d = c.delta_net;
    if (!k::delta_net_supports(static_cast<int>(d.state_size)))
      return "the CUDA backend runs Gated DeltaNet heads of 16, 32, 64 or 128, not " +
             std::to_string(d.state_size);
    if (d.n_k_heads <= 0 || d.n_v_heads % d.n_k_heads != 0 || d.conv_kernel < 1 ||
        d.value_dim() != d.n_v_heads * d.state_size)
      return "the CUDA backend does not run this Gated DeltaNet shape";
    if (d.value_dim() % 32 != 0)
      return "the CUDA backend needs a Gated DeltaNet value width that is a multiple of 32";
  }
  const bool gemma4 = c.architecture == "gemma4";
  // Gemma 4's experts sit beside its dense FFN, each with its own norms (cuda_gemma4.cpp, the
  // experts' GeGLU in the MoE kernels); a file without those norms is not that form.
  if (gemma4 && c.is_moe())
    for (const LayerWeights& l : w.layers)
      if (!l.ffn_pre_norm_2 || !l.ffn_post_norm_1 || !l.ffn_post_norm_2 || !l.router_in_scale)
        return "the CUDA backend runs Gemma 4's experts only beside the dense FFN with their own "
               "norms and router scale (the 26B-A4B form)";
  // Per layer: Gemma 4's sliding and global layers differ in head size, KV heads and FFN width.
  for (int64_t l = 0; l < c.n_layer; ++l) {
    if (c.layer_recurrent(l)) continue;
    const int64_t head_dim = c.head_dim_of(l), n_kv = c.n_head_kv_of(l);
    // Gemma 4's global layers have heads of 512 (attention_wide, gemma_ops.cuh).
    const bool wide = gemma4 && head_dim == 512;
    if (head_dim != 64 && head_dim != 128 && head_dim != 256 && !wide)
      return "the CUDA backend supports head sizes 64, 128 and 256 (and 512 on Gemma 4), not " +
             std::to_string(head_dim) +
             (c.head_dim_swa > 0 ? " (layer " + std::to_string(l) + ")" : "");
    if (n_kv <= 0 || c.n_head % n_kv != 0 || c.n_head / n_kv > 8)
      return "the CUDA backend supports up to 8 query heads per KV head";
    if (c.n_ff_of(l) % 32 != 0)
      return "the CUDA backend needs feed-forward sizes that are multiples of 32";
  }
  if (c.n_embd % 32 != 0 || c.n_ff % 32 != 0)
    return "the CUDA backend needs hidden and feed-forward sizes that are multiples of 32";
  if (!gemma4 && (c.head_dim_swa > 0 || c.n_head_kv_swa > 0 || !c.kv_layer.empty() ||
                  !c.layer_n_ff.empty() || c.value_norm || c.n_embd_per_layer > 0))
    return "the CUDA backend does not run " + c.architecture +
           "'s layers (per-kind head sizes, shared KV, V norms, per-layer FFN widths or "
           "per-layer embeddings)";
  if (gemma4) {
    if (c.n_embd_per_layer % 32 != 0)
      return "the CUDA backend needs Gemma 4's per-layer embedding width to be a multiple of 32, "
             "not " +
             std::to_string(c.n_embd_per_layer);
    // Both rope tables are head_dim / 2 long (weight_layout.cpp): the sliding layers' rotated
    // pairs must fit.
    for (int64_t l = 0; l < c.n_layer; ++l)
      if (c.rope_dims_of(l) > c.head_dim)
        return "the CUDA backend rotates at most " + std::to_string(c.head_dim) +
               " dimensions of a Gemma 4 head, not " + std::to_string(c.rope_dims_of(l));
  }
  // GeGLU experts run (moe.cuh's MoeActivation::Geglu); a shared expert is SwiGLU only.
  if (c.is_moe() && c.activation == FfnActivation::GeluTanh)
    for (const LayerWeights& l : w.layers)
      if (l.gate_shexp)
        return "the CUDA backend does not run a GeGLU shared expert (" + c.architecture + ") yet";
  // Qwen3.5's attention rotates the first rope_dims of a head (delta_net.cuh), Gemma 4's too
  // (gemma_ops.cuh); others whole heads.
  for (int64_t l = 0; l < c.n_layer && !c.is_hybrid() && !gemma4; ++l)
    if (c.rope_dims_of(l) != c.head_dim)
      return "the CUDA backend rotates whole heads only, not the first " +
             std::to_string(c.rope_dims_of(l)) + " of " + std::to_string(c.head_dim) +
             " dimensions";
  // gpt-oss's attention (sinks, sliding windows, YaRN, the output bias) runs: attention.cuh,
  // rope_kv.cuh.
  return {};
}

}  // namespace

DeviceMatrix device_matrix(const MatrixLayout& m, const uint8_t* data) {
  return {.data = data,
          .type = m.tensor ? m.tensor->ggml_type : 0,
          .rows = m.rows,
          .cols = m.cols,
          .row_bytes = m.row_bytes,
          .gguf_row_bytes = m.gguf_row_bytes,
          .split = m.split};
}

void CudaModel::load(const BackendInit& init) {
  const ModelConfig& c = config_;
  const WeightTable& w = init.weights;
  if (const std::string why = shape_refusal(c, w); !why.empty()) throw DeviceError(why);
  if (c.is_moe())
    if (const std::string why = CudaMoe::refusal(c, w); !why.empty()) throw DeviceError(why);

  // Q4_0/Q4_1/Q8_0/Q6_K re-laid out per row (granule/split_layout.h: same bytes, values
  // first, so decode loads are 16-byte vectors), everything else byte for byte;
  // KernelConfig::split_weights off keeps GGUF blocks (GRANULE_SPLIT_WEIGHTS=0).
  layout_ = weight_layout(c, w, kernel_config_.split_weights);
  workspace_ = cuda_workspace(c, layout_, max_rows_, init.options.context_length, 0);
  kv_reserve_bytes_ = static_cast<uint64_t>(std::max<int64_t>(init.options.kv_reserve_tokens, 0) *
                                            c.kv_bytes_per_token(sizeof(__half)));

  // The minimum working set, before anything is allocated: a budget that cannot hold the
  // embeddings, the head, a staging ring, the workspace and the KV reserve is one clear error.
  {
    PlacementInput in;
    in.budget_bytes = memory_.budget_bytes();
    in.weights = layout_.sizes();
    in.workspace_bytes = workspace_.total();
    in.kv_reserve_bytes = kv_reserve_bytes_;
    in.staging_slots = kStagingSlots;
    const PlacementPlan plan = plan_placement(in);
    if (!plan.loads) throw CapacityError(describe_shortfall(in, plan));
  }
  upload_weights(w);
  if (c.architecture == "gemma4") upload_gemma4(w, init.options.cuda_ple_table_on_device);
  allocate_workspace();
  // Charged now, so that the plan sees them: the attention scratch and the recurrent state
  // slots attach_kv() allocates.
  attention_scratch_bytes_ = workspace_.attention_bytes();
  recurrent_state_planned_bytes_ =
      recurrent_state_bytes() * static_cast<uint64_t>(std::max(init.options.sequence_slots, 0));
  add_prefill_overlap();

  // Placement: the layers that fit stay resident, the rest stream. Each layer's seven
  // matrices are one blob (the layout's LayerWeightLayout) that the WeightStreamer keeps
  // resident or streams.
  streamer_ = std::make_unique<WeightStreamer>(memory_, layout_);
  const PlacementInput input = placement_input(memory_.budget_bytes(), -1, kv_reserve_bytes_);
  const PlacementPlan plan = plan_placement(input);
  if (!plan.loads) throw CapacityError(describe_shortfall(input, plan));
  streamer_->apply(plan, stream_.get());
  bind_layers();
  setup_host_rows(init);  // dense models: the host's part of the streamed layers (host_rows.h)
  if (c.is_moe()) {
    // The experts take what the layers, the attention scratch attach_kv() allocates and the KV
    // reserve leave: all of them in VRAM where that holds them, else a device cache of what fits
    // (cuda_moe.h). Their workspace comes out of it first.
    const uint64_t keep =
        kv_reserve_bytes_ + attention_scratch_bytes_ + recurrent_state_planned_bytes_;
    const uint64_t left = memory_.available_bytes();
    moe_ = std::make_unique<CudaMoe>(c, w, memory_, max_rows_, left > keep ? left - keep : 0,
                                     stream_.get(), init.options.cuda_host_experts,
                                     init.options.cpu_threads);
    decode_weight_bytes_ += moe_->row_read_bytes();  // a batch-1 step's routers and experts
  }
  logger("engine.cuda")
      ->info(
          "CUDA model: {} layers ({} resident, {} streamed through {} staging slots), weights "
          "{} MiB on the device, {} MiB streamed per pass, {} rows per run",
          c.n_layer, streamer_->resident_layers(), streamer_->streamed_layers(),
          streamer_->staging_slots(),
          (layout_.fixed_matrix_bytes + streamer_->resident_bytes()) >> 20,
          streamer_->streamed_bytes_per_pass() >> 20, max_rows_);
}

// The embeddings and the head in one resident buffer, then the norms, biases and rope
// frequencies as f32 / f64; each layer's matrices are described here and bound to their blob
// by bind_layers().
void CudaModel::upload_weights(const WeightTable& w) {
  for (const MatrixLayout& m : layout_.fixed) check_type(m);
  for (const LayerWeightLayout& l : layout_.layers)
    for (const MatrixLayout& m : l.matrices) check_type(m);
  weights_ = DeviceBuffer(memory_, MemoryCategory::WeightsResident, layout_.fixed_matrix_bytes);
  for (const MatrixLayout& m : layout_.fixed) {
    PinnedBuffer blob(m.bytes);
    m.write(blob.as<uint8_t>());
    check_cuda(cudaMemcpy(weights_.as<uint8_t>() + m.offset, blob.as<uint8_t>(), blob.bytes(),
                          cudaMemcpyHostToDevice),
               "uploading weights");
  }

  std::vector<float> vectors(layout_.vector_floats, 0.0f);
  auto add_vector = [&](const TensorInfo* t, int64_t at) {
    if (!t) return;
    const std::vector<float> v = to_f32(t);
    std::copy(v.begin(), v.end(), vectors.begin() + at);
  };
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& l = w.layers[i];
    const auto& at = layout_.layers[i].vectors;
    const TensorInfo* tensors[] = {
        l.attn_norm,     l.ffn_norm,   l.bq,     l.bk,         l.bv,
        l.q_norm,        l.k_norm,     l.bo,     l.attn_sinks, l.attn_post_norm,
        l.ffn_post_norm, l.ssm_conv1d, l.ssm_dt, l.ssm_a,      l.ssm_norm};
    static_assert(std::size(tensors) == LayerWeightLayout::kVectors);
    for (size_t v = 0; v < at.size(); ++v) add_vector(tensors[v], at[v]);
  }
  add_vector(w.output_norm, layout_.output_norm_vector);
  std::vector<float> freq_factors = w.rope_freqs ? to_f32(w.rope_freqs) : std::vector<float>{};
  std::vector<double> frequencies =
      rope_frequencies(config_.head_dim, config_.rope_theta, config_.rope_scaling,
                       freq_factors.empty() ? nullptr : freq_factors.data());
  const size_t table = frequencies.size();
  if (config_.rope_theta_swa > 0.0f) {  // Gemma's sliding layers: their base, no scaling
    // Over the dimensions they rotate (Gemma 4's sliding layers turn part of a smaller head, as
    // the CPU reference's table), padded to the table's length.
    int64_t swa_dims = config_.head_dim;
    for (int64_t l = 0; l < config_.n_layer; ++l)
      if (config_.layer_slides(l)) swa_dims = config_.rope_dims_of(l);
    std::vector<double> swa =
        rope_frequencies(swa_dims, config_.rope_theta_swa, RopeScaling{}, nullptr);
    swa.resize(table, 0.0);
    frequencies.insert(frequencies.end(), swa.begin(), swa.end());
  }
  if (frequencies.size() * sizeof(double) != layout_.rope_bytes)
    throw UsageError("the rope table's size differs from the weight layout's");
  rope_frequencies_buffer_ =
      DeviceBuffer(memory_, MemoryCategory::WeightsResident, layout_.rope_bytes);
  check_cuda(cudaMemcpy(rope_frequencies_buffer_.get(), frequencies.data(), layout_.rope_bytes,
                        cudaMemcpyHostToDevice),
             "uploading rope frequencies");
  vectors_ = DeviceBuffer(memory_, MemoryCategory::WeightsResident, vectors.size() * sizeof(float));
  check_cuda(cudaMemcpy(vectors_.get(), vectors.data(), vectors.size() * sizeof(float),
                        cudaMemcpyHostToDevice),
             "uploading norms");
  const float* vbase = vectors_.as<float>();
  auto vec = [&](int64_t at) { return at < 0 ? nullptr : vbase + at; };

  token_embd_ = device_matrix(layout_.fixed[0], weights_.as<uint8_t>() + layout_.fixed[0].offset);
  output_ = layout_.fixed.size() > 1
                ? device_matrix(layout_.fixed[1], weights_.as<uint8_t>() + layout_.fixed[1].offset)
                : token_embd_;
  output_norm_ = vec(layout_.output_norm_vector);
  rope_frequencies_ = rope_frequencies_buffer_.as<double>();
  rope_frequencies_swa_ = config_.rope_theta_swa > 0.0f ? rope_frequencies_ + table : nullptr;
  rope_magnitude_ = rope_magnitude(config_.rope_scaling);
  decode_weight_bytes_ = static_cast<uint64_t>(output_.rows * output_.gguf_row_bytes);
  for (const LayerWeightLayout& l : layout_.layers) {
    DeviceLayer d;
    DeviceMatrix* mats[LayerWeightLayout::kMatrices] = {
        &d.wq,     &d.wk,     &d.wv,    &d.wo,       &d.w_gate,    &d.w_up,
        &d.w_down, &d.ssm_in, &d.ssm_z, &d.ssm_beta, &d.ssm_alpha, &d.ssm_out};
    for (int m = 0; m < LayerWeightLayout::kMatrices; ++m) {
      *mats[m] = device_matrix(l.matrices[static_cast<size_t>(m)], nullptr);  // data: bind_layers()
      decode_weight_bytes_ += static_cast<uint64_t>(mats[m]->rows * mats[m]->gguf_row_bytes);
    }
    d.attn_norm = vec(l.vectors[0]);
    d.ffn_norm = vec(l.vectors[1]);
    d.bq = vec(l.vectors[2]);
    d.bk = vec(l.vectors[3]);
    d.bv = vec(l.vectors[4]);
    d.q_norm = vec(l.vectors[5]);
    d.k_norm = vec(l.vectors[6]);
    d.bo = vec(l.vectors[7]);
    d.attn_sinks = vec(l.vectors[8]);
    d.attn_post_norm = vec(l.vectors[9]);
    d.ffn_post_norm = vec(l.vectors[10]);
    d.ssm_conv1d = vec(l.vectors[11]);
    d.ssm_dt = vec(l.vectors[12]);
    d.ssm_a = vec(l.vectors[13]);
    d.ssm_norm = vec(l.vectors[14]);
    if (config_.layer_recurrent(static_cast<int64_t>(layers_.size())))
      d.recurrent_index = recurrent_layers_++;
    layers_.push_back(d);
  }
  if (config_.is_hybrid()) upload_hybrid(w);
}

// The workspace_ list's load-time buffers, in its order.
void CudaModel::allocate_workspace() {
  widest_ = workspace_.widest;
  params_offset_ = workspace_.params_offset;
  lengths_offset_ = workspace_.lengths_offset;
  history_offset_ = workspace_.history_offset;
  // Gemma 4's per-layer embedding buffers are gemma4_'s (upload_gemma4() made it); the list
  // names them only for a model that has them.
  DeviceBuffer no_ple[2];
  DeviceBuffer* ple_inputs = gemma4_ ? &gemma4_->inputs : &no_ple[0];
  DeviceBuffer* ple_scratch = gemma4_ ? &gemma4_->scratch : &no_ple[1];
  DeviceBuffer* targets[] = {&inputs_,
                             &hidden_,
                             &normed_,
                             &normed_f16_,
                             &q8_qs_,
                             &q8_ds_,
                             &q_,
                             &k_,
                             &v_,
                             &attn_,
                             &gate_,
                             &up_,
                             ple_inputs,
                             ple_scratch,
                             &hybrid_,
                             &weight_f16_[0],
                             &logits_,
                             &tokens_out_,
                             &argmax_scratch_,
                             &token_masks_};
  const std::string_view names[] = {"inputs",
                                    "hidden",
                                    "normed",
                                    "normed_f16",
                                    "q8_qs",
                                    "q8_ds",
                                    "q",
                                    "k",
                                    "v",
                                    "attn",
                                    "gate",
                                    "up",
                                    "ple_inputs",
                                    "ple_scratch",
                                    "hybrid",
                                    "weight_f16",
                                    "logits",
                                    "tokens_out",
                                    "argmax_scratch",
                                    "token_masks"};
  static_assert(std::size(targets) == std::size(names));
  size_t next = 0;
  for (const WorkspaceBuffer& b : workspace_.buffers) {
    while (next < std::size(names) && names[next] != b.name) ++next;
    if (next == std::size(names))
      throw UsageError("CUDA model: no buffer for workspace entry " + std::string(b.name));
    *targets[next++] = DeviceBuffer(memory_, MemoryCategory::Workspace, b.bytes);
  }
  inputs_host_ = PinnedBuffer(inputs_.bytes());
  check_cuda(cudaMemset(argmax_scratch_.get(), 0, argmax_scratch_.bytes()), "cudaMemset");
  tokens_host_ = PinnedBuffer(tokens_out_.bytes());
}

// The prefill overlap's second f16 scratch (as large as the first), its stream and events. The
// scratch is workspace, charged before the layers are placed, and taken only when the plan
// keeps as many layers resident with it as without it (placement.h's overlap_scratch_fits).
// Otherwise, or when the allocation is refused, the GEMM path keeps its one scratch.
void CudaModel::add_prefill_overlap() {
  if (!weight_f16_[0].get()) return;
  const uint64_t extra = workspace_.overlap_bytes;
  const PlacementInput in = placement_input(memory_.budget_bytes(), -1, kv_reserve_bytes_);
  if (!plan_placement(in).loads) return;  // the constructor reports the shortfall
  const auto log = logger("engine.cuda");
  if (!overlap_scratch_fits(in, extra)) {
    log->info(
        "prefill dequantisation overlap off: its second f16 scratch ({} MiB) does not fit the "
        "budget beside the resident layers",
        extra >> 20);
    return;
  }
  try {
    weight_f16_[1] = DeviceBuffer(memory_, MemoryCategory::Workspace, extra);
    dequant_stream_ = std::make_unique<CudaStream>();
    gemm_ready_ = std::make_unique<CudaEvent>();
    dequant_done_ = std::make_unique<CudaEvent>();
  } catch (const DeviceLostError&) {
    throw;
  } catch (const Error& e) {  // the ledger or cudaMalloc refused: run with one scratch
    weight_f16_[1].reset();
    dequant_stream_.reset();
    gemm_ready_.reset();
    dequant_done_.reset();
    static_cast<void>(cudaGetLastError());  // not left for the next launch's check
    log->info("prefill dequantisation overlap off: {}", e.what());
    return;
  }
  log->info("prefill dequantisation overlap on: a second f16 scratch of {} MiB", extra >> 20);
}

PlacementInput CudaModel::placement_input(uint64_t budget, int32_t max_resident,
                                          uint64_t kv_bytes) const {
  PlacementInput in;
  in.budget_bytes = budget;
  in.weights.fixed_bytes = memory_.bytes(MemoryCategory::WeightsResident) -
                           (streamer_ ? streamer_->resident_bytes() : 0);
  for (const LayerWeightLayout& l : layout_.layers) in.weights.layer_bytes.push_back(l.bytes);
  in.workspace_bytes =
      memory_.bytes(MemoryCategory::Workspace) + memory_.bytes(MemoryCategory::Graphs) +
      memory_.bytes(MemoryCategory::Other) + memory_.bytes(MemoryCategory::RecurrentState) +
      (attention_partial_.get() ? 0 : attention_scratch_bytes_) +
      (recurrent_state_.get() ? 0 : recurrent_state_planned_bytes_);
  in.kv_reserve_bytes = kv_bytes;
  in.staging_slots = kStagingSlots;
  in.max_resident_layers = max_resident;
  return in;
}

void CudaModel::bind_layers() {
  for (size_t i = 0; i < layers_.size(); ++i) {
    const uint8_t* base = streamer_->layer_base(i);
    const LayerWeightLayout& layout = layout_.layers[i];
    DeviceLayer& d = layers_[i];
    DeviceMatrix* mats[LayerWeightLayout::kMatrices] = {
        &d.wq,     &d.wk,     &d.wv,    &d.wo,       &d.w_gate,    &d.w_up,
        &d.w_down, &d.ssm_in, &d.ssm_z, &d.ssm_beta, &d.ssm_alpha, &d.ssm_out};
    for (int m = 0; m < LayerWeightLayout::kMatrices; ++m)
      mats[m]->data = base + layout.matrices[static_cast<size_t>(m)].offset;
  }
}

bool CudaModel::replan(const PlacementPlan& plan) {
  const bool moved = streamer_->apply(plan, stream_.get());
  bind_layers();
  return moved;
}

void CudaModel::attach_kv(const std::vector<uint8_t*>& slot_bases, int64_t max_tokens,
                          const std::vector<uint64_t>& part_offset_bytes) {
  const ModelConfig& c = config_;
  // KV by layer kind: each layer's part of the slot (memory/kv_space.h), its stride and where
  // the layer's K starts in a token's record of it; the kernels address layer 0 of that.
  layer_kv_offset_.clear();
  layer_token_stride_.clear();
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const int part = c.kv_part(l);
    if (static_cast<size_t>(part) >= part_offset_bytes.size())
      throw UsageError("CUDA backend: the KV space has no part for layer " + std::to_string(l));
    layer_kv_offset_.push_back(
        static_cast<int64_t>(part_offset_bytes[static_cast<size_t>(part)] / sizeof(__half)) +
        c.kv_offset_elements(l));
    layer_token_stride_.push_back(c.kv_part_elements(part));
  }
  max_tokens_ = max_tokens;
  const CudaWorkspace ws =
      cuda_workspace(c, layout_, max_rows_, max_tokens, static_cast<int64_t>(slot_bases.size()));
  slot_bases_ = DeviceBuffer(memory_, MemoryCategory::Workspace, ws.bytes("slot_bases"));
  check_cuda(cudaMemcpy(slot_bases_.get(), slot_bases.data(), slot_bases.size() * sizeof(void*),
                        cudaMemcpyHostToDevice),
             "uploading KV slot addresses");
  attention_scratch_bytes_ = 0;  // charged from here on
  attention_partial_ =
      DeviceBuffer(memory_, MemoryCategory::Workspace, ws.bytes("attention_partial"));
  const size_t counters = ws.bytes("attention_counters");
  attention_counters_ = DeviceBuffer(memory_, MemoryCategory::Workspace, counters);
  check_cuda(cudaMemset(attention_counters_.get(), 0, counters), "cudaMemset");
  if (config_.is_hybrid()) allocate_recurrent_state(static_cast<int32_t>(slot_bases.size()));
}

}  // namespace granule::cuda

namespace granule {

std::string cuda_model_refusal(const ModelConfig& config, const WeightTable& weights) {
  if (std::string why = cuda::shape_refusal(config, weights); !why.empty()) return why;
  if (config.is_moe())
    if (std::string why = cuda::CudaMoe::refusal(config, weights); !why.empty()) return why;
  const WeightLayout layout = weight_layout(config, weights, false);
  for (const MatrixLayout& m : layout.fixed)
    if (std::string why = cuda::type_refusal(m); !why.empty()) return why;
  for (const LayerWeightLayout& l : layout.layers)
    for (const MatrixLayout& m : l.matrices)
      if (m.tensor)
        if (std::string why = cuda::type_refusal(m); !why.empty()) return why;
  return {};
}

}  // namespace granule
