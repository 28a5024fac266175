// weight_layout: the one table of where every weight sits on the device, and how it is written.
#include "memory/weight_layout.h"

#include <algorithm>
#include <cstring>

#include "granule/tensor_type.h"
#include "model/weight_split.h"

namespace granule {
namespace {

MatrixLayout matrix_layout(const TensorInfo* t, bool split_weights, uint64_t offset) {
  MatrixLayout m;
  m.tensor = t;
  m.offset = offset;
  if (!t) return m;  // absent (a mixture-of-experts layer's dense FFN): no bytes
  m.cols = t->dims[0];
  m.rows = t->rows();
  m.gguf_row_bytes = static_cast<int64_t>(row_bytes(static_cast<TensorType>(t->ggml_type), m.cols));
  m.split = split_weights && split_layout_fits(t->ggml_type, m.cols);
  m.row_bytes = m.split ? split_row_stride(t->ggml_type, m.cols) : m.gguf_row_bytes;
  m.bytes = m.split ? static_cast<uint64_t>(m.row_bytes * m.rows) : t->size_bytes;
  m.padded_bytes = WeightLayout::align_up(m.bytes + WeightLayout::kTensorSlackBytes);
  return m;
}

}  // namespace

void MatrixLayout::write(uint8_t* dst) const {
  if (!tensor) return;
  if (split)
    split_rows(tensor->ggml_type, tensor->data, rows, cols, dst);
  else
    std::memcpy(dst, tensor->data, tensor->size_bytes);
}

void LayerWeightLayout::write(uint8_t* dst) const {
  for (const MatrixLayout& m : matrices) m.write(dst + m.offset);
}

DeviceWeightSizes WeightLayout::sizes() const {
  DeviceWeightSizes s;
  s.fixed_bytes = fixed_bytes();
  for (const LayerWeightLayout& l : layers) s.layer_bytes.push_back(l.bytes);
  return s;
}

WeightLayout weight_layout(const ModelConfig& config, const WeightTable& w, bool split_weights) {
  WeightLayout out;
  std::vector<const TensorInfo*> fixed = {w.token_embd};
  if (w.output && w.output != w.token_embd) fixed.push_back(w.output);
  for (const TensorInfo* t : fixed) {
    out.fixed.push_back(matrix_layout(t, split_weights, out.fixed_matrix_bytes));
    out.fixed_matrix_bytes += out.fixed.back().padded_bytes;
  }
  // Norms and biases, each from an aligned offset in one f32 buffer.
  auto add_vector = [&](const TensorInfo* t) -> int64_t {
    if (!t) return -1;
    const auto at = static_cast<int64_t>(out.vector_floats);
    out.vector_floats +=
        WeightLayout::align_up(static_cast<uint64_t>(t->elements()) * sizeof(float)) /
        sizeof(float);
    return at;
  };
  for (const LayerWeights& l : w.layers) {
    LayerWeightLayout layer;
    const TensorInfo* mats[LayerWeightLayout::kMatrices] = {
        l.wq,     l.wk,     l.wv,    l.wo,       l.w_gate,    l.w_up,
        l.w_down, l.ssm_in, l.ssm_z, l.ssm_beta, l.ssm_alpha, l.ssm_out};
    for (int m = 0; m < LayerWeightLayout::kMatrices; ++m) {
      MatrixLayout& at = layer.matrices[static_cast<size_t>(m)];
      at = matrix_layout(mats[m], split_weights, layer.bytes);
      // A Gated DeltaNet layer's input projections (ssm_in, ssm_z, ssm_beta, ssm_alpha: one
      // input) lie back to back, without slack or alignment between them, where they are split
      // rows of one type and width: a one-row step reads them as one matrix (cuda_hybrid.cpp).
      // Split rows are 16-byte aligned; a 16-byte read past a row lands in the next matrix.
      constexpr int kSsmIn = 7, kSsmAlpha = 10;
      MatrixLayout* before = m > kSsmIn && m <= kSsmAlpha ? &at - 1 : nullptr;
      if (before && before->tensor && at.tensor && before->split && at.split &&
          before->tensor->ggml_type == at.tensor->ggml_type && before->cols == at.cols &&
          before->row_bytes == at.row_bytes && at.row_bytes % 16 == 0) {
        before->padded_bytes = before->bytes;
        at.offset = before->offset + before->bytes;
        at.padded_bytes =
            WeightLayout::align_up(at.offset + at.bytes + WeightLayout::kTensorSlackBytes) -
            at.offset;
        layer.bytes = at.offset;
      }
      layer.bytes += at.padded_bytes;
      if (mats[m])
        out.largest_layer_matrix_elements =
            std::max(out.largest_layer_matrix_elements, mats[m]->elements());
    }
    layer.vectors = {add_vector(l.attn_norm),
                     add_vector(l.ffn_norm),
                     add_vector(l.bq),
                     add_vector(l.bk),
                     add_vector(l.bv),
                     add_vector(l.q_norm),
                     add_vector(l.k_norm),
                     add_vector(l.bo),
                     add_vector(l.attn_sinks),
                     add_vector(l.attn_post_norm),
                     add_vector(l.ffn_post_norm),
                     add_vector(l.ssm_conv1d),
                     add_vector(l.ssm_dt),
                     add_vector(l.ssm_a),
                     add_vector(l.ssm_norm)};
    out.layers.push_back(layer);
  }
  out.output_norm_vector = add_vector(w.output_norm);
  // Gemma 4's per-layer embeddings: the products take the layers' row layout (int8 activations
  // where the CPU oracle rounds them); the table's rows are gathered whole, as stored.
  if (config.architecture == "gemma4" && config.n_embd_per_layer > 0 && w.ple_token_embd) {
    std::vector<const TensorInfo*> mats = {w.ple_model_proj};
    for (const LayerWeights& l : w.layers) {
      mats.push_back(l.ple_gate);
      mats.push_back(l.ple_proj);
    }
    for (const TensorInfo* t : mats) {
      out.per_layer.push_back(matrix_layout(t, split_weights, out.per_layer_matrix_bytes));
      out.per_layer_matrix_bytes += out.per_layer.back().padded_bytes;
    }
    out.per_layer_vector_bytes =
        static_cast<uint64_t>(config.n_embd_per_layer + config.n_layer * config.n_embd) *
        sizeof(float);
    out.per_layer_table = matrix_layout(w.ple_token_embd, false, 0);
    out.per_layer_table_bytes = out.per_layer_table.padded_bytes;
  }
  const uint64_t tables = config.rope_theta_swa > 0.0f ? 2 : 1;
  out.rope_bytes = tables * static_cast<uint64_t>(config.head_dim / 2) * sizeof(double);
  if (config.is_hybrid())
    out.section_rope_bytes =
        static_cast<uint64_t>(std::max<int64_t>(config.rope_dims_of(0) / 2, 1)) * sizeof(double);
  return out;
}

}  // namespace granule
