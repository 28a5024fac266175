// Gemma 4's dense layers on the GPU, as the CPU reference's Gemma 4 block (cpu_backend.cpp)
// runs them: each layer's own head size and KV heads, Q and K RMS-normed with their weights and V
// without one (V = K where the layer has no attn_v), the first rope_dims of a head rotated (the
// global layers' proportional rope is the rope_freqs divisors in the table), attention scale 1; a
// shared-KV layer projects Q only and reads its source layer's KV (attach_kv() points it there);
// the FFN of the layer's own width, and in the mixture-of-experts form (26B-A4B) the experts
// beside it (CudaMoe's kernels with GeGLU, after the dense FFN); then the per-layer embedding
// (gate, gelu times the layer's input, projection, RMSNorm into the residual) and the layer's
// output scale.
#include "backends/cuda/cuda_gemma4.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <utility>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_moe.h"
#include "dequantize.cuh"
#include "gemma_ops.cuh"
#include "granule/error.h"
#include "granule/quant.h"
#include "granule/tensor_type.h"
#include "matvec.cuh"
#include "memory/weight_layout.h"
#include "model/weight_split.h"
#include "quantize_activations.cuh"
#include "rms_norm.cuh"

namespace granule::cuda {
namespace {

namespace k = granule::kernels;

}  // namespace

MappedHostBuffer::MappedHostBuffer(MemoryManager& memory, size_t bytes) {
  if (bytes == 0) return;
  memory.charge(MemoryCategory::HostPinned, bytes);
  memory_ = &memory;
  try {
    host_ = PinnedBuffer(bytes);
    void* device = nullptr;
    // Pinned allocations are mapped under unified addressing; ask for the device's address
    // rather than assume it equals the host's.
    check_cuda(cudaHostGetDevicePointer(&device, host_.as<void>(), 0),
               "mapping pinned host memory for the device");
    device_ = static_cast<const uint8_t*>(device);
  } catch (...) {
    host_.reset();
    memory.release(MemoryCategory::HostPinned, bytes);
    memory_ = nullptr;
    throw;
  }
}

MappedHostBuffer& MappedHostBuffer::operator=(MappedHostBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    memory_ = std::exchange(other.memory_, nullptr);
    host_ = std::move(other.host_);
    device_ = std::exchange(other.device_, nullptr);
  }
  return *this;
}

void MappedHostBuffer::reset() {
  const size_t bytes = host_.bytes();
  host_.reset();
  if (memory_) memory_->release(MemoryCategory::HostPinned, bytes);
  memory_ = nullptr;
  device_ = nullptr;
}

void CudaModel::upload_gemma4(const WeightTable& w, bool table_on_device) {
  const ModelConfig& c = config_;
  auto g = std::make_unique<Gemma4Device>();
  for (const LayerWeights& l : w.layers) {
    float scale = 1.0f;
    if (l.out_scale)
      dequantize_row(static_cast<TensorType>(l.out_scale->ggml_type), l.out_scale->data, &scale, 1);
    g->out_scale.push_back(scale);
  }
  const int64_t n_pl = c.n_embd_per_layer;
  if (n_pl > 0) {
    if (layout_.per_layer_table_bytes == 0 || layout_.per_layer.size() != 1 + 2 * w.layers.size())
      throw UsageError("the weight layout has no per-layer embeddings for this Gemma 4 model");
    // The matrices where the layout places them (the layers' row layout, so that the products
    // read int8 activations exactly where the CPU oracle rounds them).
    g->matrices =
        DeviceBuffer(memory_, MemoryCategory::WeightsResident, layout_.per_layer_matrix_bytes);
    std::vector<DeviceMatrix> mats;
    for (const MatrixLayout& m : layout_.per_layer) {
      PinnedBuffer blob(m.bytes);
      m.write(blob.as<uint8_t>());
      uint8_t* at = g->matrices.as<uint8_t>() + m.offset;
      check_cuda(cudaMemcpy(at, blob.as<uint8_t>(), blob.bytes(), cudaMemcpyHostToDevice),
                 "uploading per-layer embeddings");
      mats.push_back(device_matrix(m, at));
    }
    g->model_proj = mats[0];
    for (size_t i = 0; i < w.layers.size(); ++i) {
      g->gate.push_back(mats[1 + 2 * i]);
      g->proj.push_back(mats[2 + 2 * i]);
    }
    // The token table's rows are gathered whole (GGUF blocks), from pinned host memory the
    // device maps: written once here, read in place by the gather (captured graphs included).
    const MatrixLayout& t = layout_.per_layer_table;
    if (table_on_device) {
      g->table_on_device =
          DeviceBuffer(memory_, MemoryCategory::WeightsResident, layout_.per_layer_table_bytes);
      PinnedBuffer blob(t.bytes);
      t.write(blob.as<uint8_t>());
      check_cuda(cudaMemcpy(g->table_on_device.get(), blob.as<uint8_t>(), blob.bytes(),
                            cudaMemcpyHostToDevice),
                 "uploading the per-layer token table");
      g->token_table = device_matrix(t, g->table_on_device.as<uint8_t>());
    } else {
      g->table_host = MappedHostBuffer(memory_, layout_.per_layer_table_bytes);
      std::fill_n(g->table_host.host(), g->table_host.bytes(), uint8_t{0});
      t.write(g->table_host.host());
      g->token_table = device_matrix(t, g->table_host.device());
    }
    // Slices of one layer's n_pl values where whole blocks make them (GGUF rows are blocks in
    // order), so that a pass gathers every slice at once.
    const auto type = static_cast<TensorType>(t.tensor->ggml_type);
    if (!t.split && n_pl % tensor_type_info(type).block_elems == 0 &&
        c.n_vocab * c.n_layer <= INT32_MAX)
      g->slice_row_bytes = static_cast<int64_t>(row_bytes(type, n_pl));
    // Read by every step from device memory: the projection, the gates and projections (the
    // table's rows come over PCIe, a row per token).
    decode_weight_bytes_ +=
        static_cast<uint64_t>(g->model_proj.rows * g->model_proj.gguf_row_bytes);
    for (size_t i = 0; i < w.layers.size(); ++i)
      decode_weight_bytes_ += static_cast<uint64_t>(g->gate[i].rows * g->gate[i].gguf_row_bytes +
                                                    g->proj[i].rows * g->proj[i].gguf_row_bytes);

    std::vector<float> vectors(static_cast<size_t>(n_pl + c.n_layer * c.n_embd));
    if (vectors.size() * sizeof(float) != layout_.per_layer_vector_bytes)
      throw UsageError("the per-layer embedding norms' size differs from the weight layout's");
    dequantize_row(static_cast<TensorType>(w.ple_proj_norm->ggml_type), w.ple_proj_norm->data,
                   vectors.data(), n_pl);
    for (size_t i = 0; i < w.layers.size(); ++i) {
      const TensorInfo* norm = w.layers[i].ple_norm;
      dequantize_row(static_cast<TensorType>(norm->ggml_type), norm->data,
                     vectors.data() + n_pl + static_cast<int64_t>(i) * c.n_embd, c.n_embd);
    }
    g->vectors =
        DeviceBuffer(memory_, MemoryCategory::WeightsResident, vectors.size() * sizeof(float));
    check_cuda(cudaMemcpy(g->vectors.get(), vectors.data(), vectors.size() * sizeof(float),
                          cudaMemcpyHostToDevice),
               "uploading per-layer embedding norms");
    g->proj_norm = g->vectors.as<float>();
    for (int64_t i = 0; i < c.n_layer; ++i)
      g->post_norm.push_back(g->vectors.as<float>() + n_pl + i * c.n_embd);
    // Its workspace ("ple_inputs", "ple_scratch") comes with the list's (allocate_workspace()).
  }
  gemma4_ = std::move(g);
}

void CudaModel::gemma4_project(const DeviceMatrix& w, const float* x, int n_rows, float* y) {
  for (int first = 0; first < n_rows; first += kMatvecMaxRows) {
    const int count = std::min(kMatvecMaxRows, n_rows - first);
    const float* xc = x + static_cast<int64_t>(first) * w.cols;
    float* const outs[1] = {y + static_cast<int64_t>(first) * w.rows};
    if (k::matvec_reads_q8(w.type, w.split))
      check_launch(k::launch_quantize_q8(xc, count, static_cast<int>(w.cols),
                                         {q8_qs_.as<int8_t>(), q8_ds_.as<float2>()}, kernel_config_,
                                         stream_.get()),
                   "quantize_q8");
    matvec(&w, outs, 1, count, false, xc);
  }
}

void CudaModel::gemma4_inputs(int n_rows) {
  const ModelConfig& c = config_;
  const Gemma4Device& g = *gemma4_;
  const int64_t n_pl = c.n_embd_per_layer;
  if (n_pl <= 0) return;
  const int64_t width = c.n_layer * n_pl;
  float* inputs = g.inputs.as<float>();
  float* table = g.scratch.as<float>();
  const DeviceMatrix& t = g.token_table;
  if (g.slice_row_bytes > 0) {
    // Each token's row as n_layer slices of n_pl, gathered by as many blocks at once (the
    // table is in host memory: one PCIe round trip for the pass, not one per chunk of a row).
    // The slices' indices go where the projection writes next.
    int32_t* slices = g.inputs.as<int32_t>();
    check_launch(
        k::launch_gemma4_table_rows(inputs_.as<int32_t>(), n_rows, static_cast<int>(c.n_layer),
                                    c.n_vocab, slices, kernel_config_, stream_.get()),
        "gemma4_table_rows");
    check_launch(k::launch_embedding_gather(t.type, t.data, g.slice_row_bytes,
                                            static_cast<int>(n_pl), c.n_vocab * c.n_layer, slices,
                                            n_rows * static_cast<int>(c.n_layer), table,
                                            stream_.get(), false),
                 "embedding_gather");
  } else {
    check_launch(
        k::launch_embedding_gather(t.type, t.data, t.row_bytes, static_cast<int>(width), c.n_vocab,
                                   inputs_.as<int32_t>(), n_rows, table, stream_.get(), t.split),
        "embedding_gather");
  }
  gemma4_project(g.model_proj, hidden_.as<float>(), n_rows, inputs);
  check_launch(
      k::launch_gemma4_ple_inputs(inputs, table, g.proj_norm, n_rows, static_cast<int>(c.n_layer),
                                  static_cast<int>(n_pl), c.rms_eps,
                                  1.0f / std::sqrt(static_cast<float>(c.n_embd)),
                                  std::sqrt(static_cast<float>(n_pl)), 1.0f / std::sqrt(2.0f),
                                  kernel_config_, stream_.get()),
      "gemma4_ple_inputs");
}

void CudaModel::layer_gemma4(const DeviceLayer& l, int layer, int n_rows) {
  const ModelConfig& c = config_;
  const Gemma4Device& g = *gemma4_;
  float* hidden = hidden_.as<float>();
  float* projected = normed_.as<float>();  // each block's output before its RMSNorm joins
  __half* x16 = normed_f16_.as<__half>();
  const bool gemm_path = n_rows > kMatvecMaxRows;
  const bool own_kv = c.kv_source(layer) == layer;
  const int64_t head_dim = c.head_dim_of(layer), n_kv = c.n_head_kv_of(layer);

  // Attention block: Q (and K, V where the layer keeps its KV) from the attention norm.
  const DeviceMatrix qkv[3] = {l.wq, l.wk, l.wv};
  float* const qkv_out[3] = {q_.as<float>(), k_.as<float>(), v_.as<float>()};
  const bool has_v =
      l.wv.rows > 0;  // (an absent matrix has no rows; its data is bound all the same)
  const int products = !own_kv ? 1 : has_v ? 3 : 2;
  if (gemm_path) {
    norm_for(l.wq, hidden, l.attn_norm, n_rows, true);
    for (int m = 0; m < products; ++m) gemm(qkv[m], nullptr, x16, n_rows, qkv_out[m], false);
  } else {
    k::RmsNormOutputs out;
    for (int m = 0; m < products; ++m) {
      if (k::matvec_reads_q8(qkv[m].type, qkv[m].split))
        out.q8 = {q8_qs_.as<int8_t>(), q8_ds_.as<float2>()};
      else
        out.f32 = normed_.as<float>();
    }
    check_launch(k::launch_rms_norm(hidden, l.attn_norm, n_rows, static_cast<int>(c.n_embd),
                                    c.rms_eps, out, kernel_config_, stream_.get()),
                 "rms_norm");
    matvec(qkv, qkv_out, products, n_rows, false, normed_.as<float>());
  }
  const int32_t* in = inputs_.as<int32_t>();
  k::Gemma4QkvArgs a;
  a.rows = n_rows;
  a.positions = in + kPositions * max_rows_;
  a.slots = in + kSlots * max_rows_;
  a.q = q_.as<float>();
  a.k = k_.as<float>();
  a.v = has_v ? v_.as<float>() : k_.as<float>();  // V = K without attn_v
  a.q_norm = l.q_norm;
  a.k_norm = l.k_norm;
  a.eps = c.rms_eps;
  const bool own_base = rope_frequencies_swa_ && c.layer_slides(layer);
  a.frequencies = own_base ? rope_frequencies_swa_ : rope_frequencies_;
  a.rope_dims = static_cast<int>(c.rope_dims_of(layer));
  a.n_head = static_cast<int>(c.n_head);
  a.n_kv = static_cast<int>(n_kv);
  a.head_dim = static_cast<int>(head_dim);
  a.write_kv = own_kv;
  a.slot_base = slot_bases_.as<__half* const>();
  a.token_stride = layer_token_stride_[static_cast<size_t>(layer)];
  a.kv_offset = layer_kv_offset_[static_cast<size_t>(layer)];
  check_launch(k::launch_gemma4_qkv(a, kernel_config_, stream_.get()), "gemma4_qkv");
  attention(layer, n_rows, nullptr, true);  // reads the source layer's KV on a shared layer
  if (gemm_path) {
    check_launch(k::launch_convert_f32_to_f16(attn_.as<float>(), n_rows * c.n_head * head_dim, x16,
                                              stream_.get()),
                 "convert_f16");
    gemm(l.wo, nullptr, x16, n_rows, projected, false);
  } else {
    float* const outs[1] = {projected};
    matvec(&l.wo, outs, 1, n_rows, false, attn_.as<float>());  // int8 input from attention
  }
  post_norm(l.attn_post_norm, n_rows);

  // FFN block of this layer's width.
  const int64_t n_ff = l.w_gate.rows;
  float* gate = gate_.as<float>();
  float* up = up_.as<float>();
  if (gemm_path) {
    norm_for(l.w_gate, hidden, l.ffn_norm, n_rows, true);
    gemm(l.w_gate, nullptr, x16, n_rows, gate, false);
    gemm(l.w_up, nullptr, x16, n_rows, up, false);
    check_launch(k::launch_geglu_to_f16(gate, up, n_rows * n_ff, x16, stream_.get()), "geglu");
    gemm(l.w_down, nullptr, x16, n_rows, projected, false);
  } else {
    ffn_norm_for_gate_up(l, hidden, n_rows);
    const DeviceMatrix gu[2] = {l.w_gate, l.w_up};
    float* const gu_out[2] = {gate, up};
    matvec(gu, gu_out, 2, n_rows, false, normed_.as<float>());
    check_launch(k::launch_geglu_f32(gate, up, n_rows * n_ff, gate, kernel_config_, stream_.get()),
                 "geglu");
    if (k::matvec_reads_q8(l.w_down.type, l.w_down.split))
      check_launch(k::launch_quantize_q8(gate, n_rows, static_cast<int>(n_ff),
                                         {q8_qs_.as<int8_t>(), q8_ds_.as<float2>()}, kernel_config_,
                                         stream_.get()),
                   "quantize_q8");
    float* const outs[1] = {projected};
    matvec(&l.w_down, outs, 1, n_rows, false, gate);
  }
  if (!moe_) {
    post_norm(l.ffn_post_norm, n_rows);
  } else {
    // The experts beside the dense FFN (the 26B-A4B form), as the CPU block (cpu_backend.cpp's
    // gemma4_moe_ffn) runs them, with the dense FFN's output in normed_: that output normed by
    // post_ffw_norm_1; the router reading rms_norm(x) / sqrt(n_embd) · ffn_gate_inp.scale (one norm
    // weight here), the experts pre_ffw_norm_2(x) (f32 and int8 blocks) of the same residual x;
    // their weighted sum normed by post_ffw_norm_2 and added to the dense output; that sum normed
    // by post_ffw_norm into the residual.
    const CudaMoe::Gemma4Layer& m = moe_->gemma4_layer(layer);
    const CudaMoe::Gemma4Workspace& ws = moe_->gemma4_workspace();
    const int n = static_cast<int>(c.n_embd);
    auto norm = [&](const float* x, const float* weight, k::RmsNormOutputs out, const char* what) {
      check_launch(
          k::launch_rms_norm(x, weight, n_rows, n, c.rms_eps, out, kernel_config_, stream_.get()),
          what);
    };
    k::RmsNormOutputs dense;
    dense.f32 = ws.dense_out;
    norm(normed_.as<float>(), m.post_norm_1, dense, "rms_norm");
    k::RmsNormOutputs router;
    router.f32 = ws.router_in;
    norm(hidden, m.router_norm, router, "rms_norm");
    // The experts' int8 input in the model's q8 buffers (the dense FFN is done with them).
    const k::ActivationQ8 xq{q8_qs_.as<int8_t>(), q8_ds_.as<float2>()};
    k::RmsNormOutputs experts;
    experts.f32 = ws.expert_in;
    experts.q8 = xq;
    norm(hidden, m.pre_norm, experts, "rms_norm");
    check_launch(k::launch_zero(ws.experts_out, static_cast<int64_t>(n_rows) * n, kernel_config_,
                                stream_.get()),
                 "zero");
    moe_->forward(layer, n_rows, ws.expert_in, xq, inputs_.as<int32_t>() + kSlots * max_rows_,
                  ws.experts_out, kernel_config_, stream_.get(), &launches_, ws.router_in);
    k::RmsNormOutputs sum;
    sum.residual = ws.dense_out;
    norm(ws.experts_out, m.post_norm_2, sum, "rms_norm_residual");
    k::RmsNormOutputs out;
    out.residual = hidden;
    norm(ws.dense_out, l.ffn_post_norm, out, "rms_norm_residual");
  }

  // Per-layer embedding: x += RMSNorm(proj · (gelu(gate · x) * the layer's input)).
  const int64_t n_pl = c.n_embd_per_layer;
  if (n_pl > 0) {
    const auto i = static_cast<size_t>(layer);
    float* gated = g.scratch.as<float>();
    gemma4_project(g.gate[i], hidden, n_rows, gated);
    check_launch(
        k::launch_gelu_times(gated, g.inputs.as<float>() + layer * n_pl, c.n_layer * n_pl, n_rows,
                             static_cast<int>(n_pl), gated, kernel_config_, stream_.get()),
        "gelu_times");
    gemma4_project(g.proj[i], gated, n_rows, projected);
    post_norm(g.post_norm[i], n_rows);
  }
  const float scale = g.out_scale[static_cast<size_t>(layer)];
  if (scale != 1.0f)
    check_launch(k::launch_scale(hidden, static_cast<int64_t>(n_rows) * c.n_embd, scale,
                                 kernel_config_, stream_.get()),
                 "scale");
}

}  // namespace granule::cuda
