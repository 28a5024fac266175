// CudaModel's Qwen3.5 layers (`qwen35`, `qwen35moe`; the CPU's backends/cpu/delta_net.h holds
// the math): the Gated DeltaNet mixer over its recurrent state slots, the gated full-attention
// mixer, and their FFN, on the quantised matvec path (up to 64 rows: decode steps, captured as
// graphs) or the dequantise + cuBLAS GEMM path (prefill chunks). The state's slot index is the
// row's KV slot, read on the device like the KV's, so a captured step replays for any sequences.
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_model.h"
#include "delta_net.cuh"
#include "granule/error.h"
#include "matvec_mma.cuh"
#include "quantize_activations.cuh"
#include "rms_norm.cuh"
#include "swiglu.cuh"

namespace granule::cuda {
namespace {

namespace k = granule::kernels;

// The "hybrid" workspace buffer carved per row (workspace_layout.cpp): R rows of each, then the
// chunked delta rule's scratch for R rows.
struct HybridScratch {
  float *mixed, *conv_out, *z, *out, *beta, *alpha, *q_gate, *chunk;
};

HybridScratch carve(float* base, const ModelConfig& c, int64_t R) {
  const DeltaNetConfig& d = c.delta_net;
  HybridScratch s;
  float* p = base;
  auto take = [&](int64_t width) {
    float* at = p;
    p += R * width;
    return at;
  };
  s.mixed = take(d.conv_channels());
  s.conv_out = take(d.conv_channels());
  s.z = take(d.value_dim());
  s.out = take(d.value_dim());
  s.beta = take(d.n_v_heads);
  s.alpha = take(d.n_v_heads);
  s.q_gate = take(2 * c.n_head * c.head_dim);
  // k::delta_net_chunk_scratch_floats(R, n_v_heads), 16-byte aligned (float4 loads).
  s.chunk = p + (4 - (reinterpret_cast<uintptr_t>(p) / sizeof(float)) % 4) % 4;
  return s;
}

// Whether b's rows follow a's on the device as one matrix would hold them (weight_layout.cpp lays
// a Gated DeltaNet layer's input projections back to back where they are split rows of one type
// and width): one type, layout and width.
bool follows(const DeviceMatrix& a, const DeviceMatrix& b) {
  return a.data && b.data && a.type == b.type && a.split == b.split && a.cols == b.cols &&
         a.row_bytes == b.row_bytes &&
         static_cast<const uint8_t*>(a.data) + a.rows * a.row_bytes ==
             static_cast<const uint8_t*>(b.data);
}

}  // namespace

uint64_t CudaModel::recurrent_state_bytes() const {
  return config_.is_hybrid() ? static_cast<uint64_t>(config_.recurrent_state_bytes()) : 0;
}

uint8_t* CudaModel::recurrent_state(int32_t slot) const {
  const uint64_t bytes = recurrent_state_bytes();
  if (!recurrent_state_.get() || slot < 0 ||
      static_cast<uint64_t>(slot + 1) * bytes > recurrent_state_.bytes())
    throw UsageError("CUDA backend: no recurrent state slot " + std::to_string(slot));
  return recurrent_state_.as<uint8_t>() + static_cast<uint64_t>(slot) * bytes;
}

void CudaModel::upload_hybrid(const WeightTable&) {
  // The section rope of the attention layers (cpu::SectionRope): pair i of the first rope_dims
  // turns at theta^(-2i / rope_dims) when its section is one of the first three, else not at all.
  const ModelConfig& c = config_;
  const int64_t rope_dims = c.rope_dims_of(0);
  const int64_t half = rope_dims / 2;
  std::vector<double> frequencies(static_cast<size_t>(std::max<int64_t>(half, 1)), 0.0);
  const auto& s = c.rope_sections;
  const int64_t total = s[0] + s[1] + s[2] + s[3];
  for (int64_t i = 0; i < half; ++i) {
    bool rotates = true;
    if (total > 0) {
      const int64_t sector = i % total;
      rotates = (sector % 3 == 0 && sector < 3 * s[0]) || (sector % 3 == 1 && sector < 3 * s[1]) ||
                (sector % 3 == 2 && sector < 3 * s[2]);
    }
    if (rotates)
      frequencies[static_cast<size_t>(i)] =
          std::pow(static_cast<double>(c.rope_theta),
                   -2.0 * static_cast<double>(i) / static_cast<double>(rope_dims));
  }
  const size_t bytes = frequencies.size() * sizeof(double);
  if (bytes != layout_.section_rope_bytes)
    throw UsageError("the section rope table's size differs from the weight layout's");
  section_rope_ = DeviceBuffer(memory_, MemoryCategory::WeightsResident, bytes);
  check_cuda(cudaMemcpy(section_rope_.get(), frequencies.data(), bytes, cudaMemcpyHostToDevice),
             "uploading the section rope's frequencies");
}

void CudaModel::allocate_recurrent_state(int32_t slots) {
  recurrent_state_.reset();
  const uint64_t bytes = recurrent_state_bytes() * static_cast<uint64_t>(std::max(slots, 0));
  if (bytes == 0) return;
  recurrent_state_ = DeviceBuffer(memory_, MemoryCategory::RecurrentState, bytes);
  check_cuda(cudaMemset(recurrent_state_.get(), 0, bytes), "clearing the recurrent state");
}

void CudaModel::hybrid_norm(const DeviceMatrix* mats, int count, const float* weight, int n_rows) {
  if (n_rows > kMatvecMaxRows) {
    norm_for(mats[0], hidden_.as<float>(), weight, n_rows, true);
    return;
  }
  k::RmsNormOutputs out;
  for (int m = 0; m < count; ++m) {
    if (k::matvec_reads_q8(mats[m].type, mats[m].split))
      out.q8 = {q8_qs_.as<int8_t>(), q8_ds_.as<float2>()};
    else
      out.f32 = normed_.as<float>();
  }
  check_launch(
      k::launch_rms_norm(hidden_.as<float>(), weight, n_rows, static_cast<int>(config_.n_embd),
                         config_.rms_eps, out, kernel_config_, stream_.get()),
      "rms_norm");
}

// Whether one row's product over m can read a handed-over norm: the split kernels (launch_product
// at one row), which read int8 blocks.
bool CudaModel::takes_hand_over(const DeviceMatrix& m) const {
  const k::KernelConfig& kc = kernel_config_;
  return m.data && m.split && k::matvec_reads_q8(m.type, m.split) &&
         !(kc.mma && kc.mma_min_rows <= 1 && k::matvec_mma_supports(m.type, m.split));
}

bool CudaModel::hybrid_fusion_fits() const {
  if (moe_) return false;  // the experts' kernels take no hand-over
  // The products that hand a norm over (the mixer's output projection, the down projection) and
  // the gate/up product that reads one. The mixer's input products read the attention norm's
  // hand-over where they all can, else the layer norms its own input (a file that keeps
  // ssm_beta/ssm_alpha in F32, say).
  for (const DeviceLayer& l : layers_) {
    if (l.w_gate.type != l.w_up.type || l.w_gate.split != l.w_up.split) return false;
    const DeviceMatrix& out = l.recurrent_index >= 0 ? l.ssm_out : l.wo;
    for (const DeviceMatrix* m : {&out, &l.w_gate, &l.w_up, &l.w_down})
      if (!takes_hand_over(*m)) return false;
  }
  return true;
}

void CudaModel::hybrid_project_normed(const DeviceMatrix& w, const float* x, float* y,
                                      const float* norm_weight) {
  check_launch(k::launch_quantize_q8(x, 1, static_cast<int>(w.cols),
                                     {q8_qs_.as<int8_t>(), q8_ds_.as<float2>()}, kernel_config_,
                                     stream_.get()),
               "quantize_q8");
  matvec_normed_out(w, y, norm_weight);
}

void CudaModel::hybrid_project(const DeviceMatrix& w, const float* x, int n_rows, float* y,
                               bool accumulate, const DeviceMatrix* next) {
  if (n_rows > kMatvecMaxRows) {
    __half* x16 = normed_f16_.as<__half>();
    check_launch(k::launch_convert_f32_to_f16(x, n_rows * w.cols, x16, stream_.get()),
                 "convert_f16");
    gemm(w, next, x16, n_rows, y, accumulate);
    return;
  }
  if (k::matvec_reads_q8(w.type, w.split))
    check_launch(k::launch_quantize_q8(x, n_rows, static_cast<int>(w.cols),
                                       {q8_qs_.as<int8_t>(), q8_ds_.as<float2>()}, kernel_config_,
                                       stream_.get()),
                 "quantize_q8");
  float* const outs[1] = {y};
  matvec(&w, outs, 1, n_rows, accumulate, x);
}

// A prefill pass (gemm()'s overlap) dequantises each matrix during the product before it, as
// layer_gemm does: within a layer in the order the products run, and the next layer's first
// during this layer's last when that layer is resident (a streamed layer's bytes are valid only
// after before_layer()'s wait). Every `next` names a member of layers_, the object the following
// gemm() call is given.
const DeviceMatrix* CudaModel::gemm_after(const DeviceLayer& l) const {
  const auto next = static_cast<size_t>(&l - layers_.data()) + 1;
  if (next >= layers_.size() || streamer_->streamed(next)) return nullptr;
  const DeviceLayer& n = layers_[next];
  return n.recurrent_index >= 0 ? &n.ssm_in : &n.wq;
}

void CudaModel::layer_hybrid(const DeviceLayer& l, int layer, int n_rows) {
  if (l.recurrent_index >= 0)
    delta_net_mixer(l, n_rows);
  else
    gated_attention_mixer(l, layer, n_rows);
  hybrid_ffn(l, layer, n_rows);
}

void CudaModel::delta_net_mixer(const DeviceLayer& l, int n_rows) {
  const ModelConfig& c = config_;
  const DeltaNetConfig& d = c.delta_net;
  const HybridScratch s = carve(hybrid_.as<float>(), c, max_rows_);
  const DeviceMatrix mats[4] = {l.ssm_in, l.ssm_z, l.ssm_beta, l.ssm_alpha};
  float* const outs[4] = {s.mixed, s.z, s.beta, s.alpha};
  // A fused pass (batch 1): the previous layer's down projection (layer 0's: the embedding
  // gather, where the head takes the hand-over too) wrote this layer's norm input.
  const bool fused = fused_pass_ && n_rows == 1;
  const bool normed_by_down = fused && (&l != layers_.data() || edge_norms_fused_) &&
                              takes_hand_over(mats[0]) && takes_hand_over(mats[1]) &&
                              takes_hand_over(mats[2]) && takes_hand_over(mats[3]);
  if (!normed_by_down) hybrid_norm(mats, 4, l.attn_norm, n_rows);
  // One row's four products share their input: their results back to back in `mixed`'s first
  // rows (free at one row), read from there, and matrices whose rows follow each other on the
  // device (the 9B's four) as one product, in one launch with the rest.
  float* z = s.z;
  float* beta = s.beta;
  float* alpha = s.alpha;
  const int64_t C = d.conv_channels(), V = d.value_dim(), H = d.n_v_heads;
  if (n_rows > kMatvecMaxRows) {
    const DeviceMatrix* order[5] = {&l.ssm_in, &l.ssm_z, &l.ssm_beta, &l.ssm_alpha, &l.ssm_out};
    for (int m = 0; m < 4; ++m)
      gemm(*order[m], order[m + 1], normed_f16_.as<__half>(), n_rows, outs[m], false);
  } else if (n_rows == 1 && C + V + 2 * H <= max_rows_ * C) {
    z = s.mixed + C;
    beta = z + V;
    alpha = beta + H;
    float* const at[4] = {s.mixed, z, beta, alpha};
    DeviceMatrix runs[4];
    float* runs_out[4];
    int n = 0;
    for (int m = 0; m < 4; ++m) {
      if (n > 0 && follows(runs[n - 1], mats[m])) {
        runs[n - 1].rows += mats[m].rows;
      } else {
        runs[n] = mats[m];
        runs_out[n] = at[m];
        ++n;
      }
    }
    matvec(runs, runs_out, n, n_rows, false, normed_.as<float>(), normed_by_down);
  } else {
    matvec(mats, outs, 4, n_rows, false, normed_.as<float>(), normed_by_down);
  }
  const int32_t* in = inputs_.as<int32_t>();
  k::DeltaNetArgs a;
  a.rows = n_rows;
  a.positions = in + kPositions * max_rows_;
  a.slots = in + kSlots * max_rows_;
  a.conv_kernel = static_cast<int>(d.conv_kernel);
  a.state_size = static_cast<int>(d.state_size);
  a.n_k_heads = static_cast<int>(d.n_k_heads);
  a.n_v_heads = static_cast<int>(d.n_v_heads);
  a.eps = c.rms_eps;
  a.conv_weight = l.ssm_conv1d;
  a.dt_bias = l.ssm_dt;
  a.a = l.ssm_a;
  a.norm_weight = l.ssm_norm;
  const int64_t layer_floats = d.conv_state_floats() + d.delta_state_floats();
  a.state = recurrent_state_.as<float>() + l.recurrent_index * layer_floats;
  a.slot_stride = static_cast<int64_t>(recurrent_state_bytes() / sizeof(float));
  a.mixed = s.mixed;
  a.conv_out = s.conv_out;
  a.beta = beta;
  a.alpha = alpha;
  a.z = z;
  a.out = s.out;
  // Runs of a prompt take the chunked rule (kernels/delta_net.cuh says from how many rows); its
  // W goes where the convolution's input was. A captured step is a decode step (cuda_backend.cpp
  // captures nothing else), one token a sequence: its graph needs no plan.
  if (!stream_capturing()) {
    a.chunk_scratch = s.chunk;
    a.chunk_w = s.mixed;
  }
  // The gated norm writes its result as the int8 blocks the output projection reads, where
  // hybrid_project(_normed) would quantise it (a launch fewer).
  const bool quantized = n_rows <= kMatvecMaxRows &&
                         k::matvec_reads_q8(l.ssm_out.type, l.ssm_out.split) &&
                         a.state_size % k::kQ8Block == 0;
  if (quantized) a.out_q8 = {q8_qs_.as<int8_t>(), q8_ds_.as<float2>()};
  if (!recurrent_state_.get()) throw UsageError("CUDA backend: run before attach_kv()");
  check_launch(k::launch_delta_net_conv(a, kernel_config_, stream_.get()), "delta_net_conv");
  check_launch(k::launch_delta_net_rule(a, kernel_config_, stream_.get()), "delta_net_rule");
  hybrid_mixer_out(l, l.ssm_out, s.out, n_rows, fused, quantized);
}

// The mixer's output projection (of x, the gated norm's or the output gate's result) added to the
// residual: handing the FFN norm's input over on a fused pass. `quantized`: x's int8 blocks are
// already in q8_qs_/q8_ds_.
void CudaModel::hybrid_mixer_out(const DeviceLayer& l, const DeviceMatrix& w, const float* x,
                                 int n_rows, bool fused, bool quantized) {
  float* hidden = hidden_.as<float>();
  if (fused && quantized) {  // the FFN norm's input handed over
    matvec_normed_out(w, hidden, l.ffn_norm);
  } else if (fused) {
    hybrid_project_normed(w, x, hidden, l.ffn_norm);
  } else if (quantized) {
    float* const outs[1] = {hidden};
    matvec(&w, outs, 1, n_rows, true, x);
  } else {
    hybrid_project(w, x, n_rows, hidden, true, moe_ ? gemm_after(l) : &l.w_gate);
  }
}

void CudaModel::gated_attention_mixer(const DeviceLayer& l, int layer, int n_rows) {
  const ModelConfig& c = config_;
  const HybridScratch s = carve(hybrid_.as<float>(), c, max_rows_);
  const DeviceMatrix mats[3] = {l.wq, l.wk, l.wv};
  float* const outs[3] = {s.q_gate, k_.as<float>(), v_.as<float>()};
  // A fused pass as delta_net_mixer's. The Q/K norms, the section rope and the KV write stay in
  // gated_attention_prep (the Q/K/V epilogue's rotation has no per-head norm).
  const bool fused = fused_pass_ && n_rows == 1;
  const bool normed_by_down = fused && (layer > 0 || edge_norms_fused_) && takes_hand_over(l.wq) &&
                              takes_hand_over(l.wk) && takes_hand_over(l.wv);
  if (!normed_by_down) hybrid_norm(mats, 3, l.attn_norm, n_rows);
  if (n_rows > kMatvecMaxRows) {
    const DeviceMatrix* order[4] = {&l.wq, &l.wk, &l.wv, &l.wo};
    for (int m = 0; m < 3; ++m)
      gemm(*order[m], order[m + 1], normed_f16_.as<__half>(), n_rows, outs[m], false);
  } else {
    matvec(mats, outs, 3, n_rows, false, normed_.as<float>(), normed_by_down);
  }
  const int32_t* in = inputs_.as<int32_t>();
  k::GatedAttentionArgs g;
  g.rows = n_rows;
  g.positions = in + kPositions * max_rows_;
  g.slots = in + kSlots * max_rows_;
  g.q_gate = s.q_gate;
  g.q = q_.as<float>();
  g.k = k_.as<float>();
  g.v = v_.as<float>();
  g.q_norm = l.q_norm;
  g.k_norm = l.k_norm;
  g.eps = c.rms_eps;
  g.frequencies = section_rope_.as<double>();
  g.rope_dims = static_cast<int>(c.rope_dims_of(layer));
  g.n_head = static_cast<int>(c.n_head);
  g.n_kv = static_cast<int>(c.n_head_kv);
  g.head_dim = static_cast<int>(c.head_dim);
  g.slot_base = slot_bases_.as<__half* const>();
  g.token_stride = layer_token_stride_[static_cast<size_t>(layer)];
  g.kv_offset = layer_kv_offset_[static_cast<size_t>(layer)];
  check_launch(k::launch_gated_attention_prep(g, kernel_config_, stream_.get()),
               "gated_attention_prep");
  attention(layer, n_rows, nullptr, /*roped=*/true);
  // The output gate writes the int8 blocks the output projection reads, as the gated norm does.
  const bool quantized = n_rows <= kMatvecMaxRows && k::matvec_reads_q8(l.wo.type, l.wo.split) &&
                         (c.n_head * c.head_dim) % k::kQ8Block == 0;
  k::ActivationQ8 gate_q8;
  if (quantized) gate_q8 = {q8_qs_.as<int8_t>(), q8_ds_.as<float2>()};
  check_launch(k::launch_attention_output_gate(attn_.as<float>(), s.q_gate, n_rows, g.n_head,
                                               g.head_dim, gate_q8, kernel_config_, stream_.get()),
               "attention_output_gate");
  hybrid_mixer_out(l, l.wo, attn_.as<float>(), n_rows, fused, quantized);
}

// The FFN after post_attention_norm: the experts (CudaMoe), else SwiGLU as layer_matvec's
// unfused form and layer_gemm's.
void CudaModel::hybrid_ffn(const DeviceLayer& l, int layer, int n_rows) {
  if (moe_) {
    moe_ffn(l, layer, n_rows);
    return;
  }
  const ModelConfig& c = config_;
  float* h = gate_.as<float>();
  if (fused_pass_ && n_rows == 1) {
    // The batch-1 fusion (layer_matvec's FFN): SwiGLU from the handed-over norm, quantised by its
    // product where that pays, and the down projection handing the next layer's norm over (the
    // output norm's after the last layer when the head takes it).
    if (!swiglu_matvec(l, 1, h, /*fused=*/true))
      check_launch(k::launch_quantize_q8(h, 1, static_cast<int>(c.n_ff),
                                         {q8_qs_.as<int8_t>(), q8_ds_.as<float2>()}, kernel_config_,
                                         stream_.get()),
                   "quantize_q8");
    const bool last = static_cast<size_t>(layer) + 1 == layers_.size();
    if (!last) {
      matvec_normed_out(l.w_down, hidden_.as<float>(),
                        layers_[static_cast<size_t>(layer) + 1].attn_norm);
    } else if (edge_norms_fused_) {
      matvec_normed_out(l.w_down, hidden_.as<float>(), output_norm_);
    } else {
      float* const hidden_out[1] = {hidden_.as<float>()};
      matvec(&l.w_down, hidden_out, 1, 1, true, h);
    }
    return;
  }
  const DeviceMatrix gu[2] = {l.w_gate, l.w_up};
  hybrid_norm(gu, 2, l.ffn_norm, n_rows);
  if (n_rows > kMatvecMaxRows) {
    __half* x16 = normed_f16_.as<__half>();
    gemm(l.w_gate, &l.w_up, x16, n_rows, gate_.as<float>(), false);
    gemm(l.w_up, &l.w_down, x16, n_rows, up_.as<float>(), false);
    check_launch(k::launch_swiglu_to_f16(gate_.as<float>(), up_.as<float>(), n_rows * c.n_ff, x16,
                                         stream_.get()),
                 "swiglu");
    gemm(l.w_down, gemm_after(l), x16, n_rows, hidden_.as<float>(), true);
    return;
  }
  if (l.w_gate.type == l.w_up.type && l.w_gate.split == l.w_up.split)
    swiglu_matvec(l, n_rows, h);
  else
    gate_up_unfused(l, n_rows, h, /*geglu=*/false);
  hybrid_project(l.w_down, h, n_rows, hidden_.as<float>(), true);
}

}  // namespace granule::cuda
