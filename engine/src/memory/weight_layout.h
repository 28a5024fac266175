// The device layout of a model's weights, written once: per matrix its offset, bytes,
// alignment and row layout (GGUF blocks or split rows) as the CUDA backend uploads it, and
// where each norm and bias sits among the f32 vectors. The placement plan, the fit preview
// (`granule-cli fit`), CudaModel's upload and the weight streamer all read this one table.
// Plain C++: the fit preview builds it without a GPU.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "granule/model_config.h"
#include "memory/placement.h"  // DeviceWeightSizes

namespace granule {

// One weight matrix in its device layout.
struct MatrixLayout {
  const TensorInfo* tensor = nullptr;
  uint64_t offset = 0;  // from the start of its blob (the fixed buffer or its layer's)
  uint64_t bytes = 0;   // as uploaded: rows x row_bytes split, else the GGUF bytes
  // bytes + kTensorSlackBytes, aligned: its share of the blob (bytes alone where the next matrix
  // follows it directly: a Gated DeltaNet layer's input projections, weight_layout.cpp)
  uint64_t padded_bytes = 0;
  bool split = false;  // rows in granule/split_layout.h's layout
  int64_t rows = 0, cols = 0;
  int64_t row_bytes = 0;       // from one row to the next on the device
  int64_t gguf_row_bytes = 0;  // the row's bytes as stored (what a decode step reads)

  // Writes the matrix in its device layout to host memory (`bytes` at dst).
  void write(uint8_t* dst) const;
};

// A layer's matrices, one blob (resident or streamed as a whole), and its vectors. A Gated
// DeltaNet layer (Qwen3.5) has no wq..wo but the five ssm_ matrices; others have none of those.
struct LayerWeightLayout {
  static constexpr int kMatrices = 12;  // wq, wk, wv, wo, w_gate, w_up, w_down, ssm_in, ssm_z,
                                        // ssm_beta, ssm_alpha, ssm_out
  static constexpr int kVectors = 15;   // attn_norm, ffn_norm, bq, bk, bv, q_norm, k_norm,
                                        // bo, attn_sinks, attn_post_norm, ffn_post_norm,
                                        // ssm_conv1d, ssm_dt, ssm_a, ssm_norm
  std::array<MatrixLayout, kMatrices> matrices;
  uint64_t bytes = 0;  // the blob: the matrices' padded bytes
  // Offsets in floats into the vector buffer, -1 where the model has none.
  std::array<int64_t, kVectors> vectors{};

  // Writes the whole blob (`bytes` at dst) to host memory.
  void write(uint8_t* dst) const;
};

struct WeightLayout {
  // Every matrix starts 256-byte aligned and keeps 16 bytes of slack after its last row: the
  // matvec kernels copy rows in 16-byte vectors and may read up to 15 bytes past a row. (A Gated
  // DeltaNet layer's input projections of one split type follow each other directly instead.)
  static constexpr uint64_t kAlignBytes = 256;
  static constexpr uint64_t kTensorSlackBytes = 16;
  static uint64_t align_up(uint64_t bytes) {
    return (bytes + kAlignBytes - 1) / kAlignBytes * kAlignBytes;
  }

  // The resident matrices in one buffer: token_embd, then the output head when untied.
  std::vector<MatrixLayout> fixed;
  uint64_t fixed_matrix_bytes = 0;
  std::vector<LayerWeightLayout> layers;
  // Norms and biases as f32, each vector aligned: every layer's (in kVectors order), then the
  // output norm.
  uint64_t vector_floats = 0;
  int64_t output_norm_vector = -1;
  // The rope frequency tables: head_dim / 2 doubles, then as many for the sliding layers' own
  // base where the model has one (ModelConfig::rope_theta_swa, Gemma).
  uint64_t rope_bytes = 0;
  // Qwen3.5's section rope table (cuda_hybrid.cpp's upload_hybrid): rope_dims / 2 doubles.
  uint64_t section_rope_bytes = 0;
  // The most elements of any layer matrix (the GEMM path's f16 scratch).
  int64_t largest_layer_matrix_elements = 0;

  // Gemma 4's per-layer embeddings (cuda_gemma4.cpp), empty for other models. Resident in one
  // buffer: per_layer_model_proj, then each layer's inp_gate and proj, in the layers' row layout
  // (offsets from the buffer's start); beside it their f32 norms, per_layer_proj_norm then each
  // layer's post_norm, packed (per_layer_vector_bytes). The token table (per_layer_token_embd,
  // GGUF blocks: its rows are gathered whole) lives in pinned, mapped host memory: a step reads
  // one row per token through PCIe, and the device budget holds none of it.
  std::vector<MatrixLayout> per_layer;
  uint64_t per_layer_matrix_bytes = 0;
  uint64_t per_layer_vector_bytes = 0;
  MatrixLayout per_layer_table;        // offset 0 in its own host buffer
  uint64_t per_layer_table_bytes = 0;  // its padded bytes; 0 when the model has none

  // Resident whatever the plan: the fixed matrices, the vectors and the rope tables (and Gemma
  // 4's per-layer embedding matrices and norms).
  uint64_t fixed_bytes() const {
    return fixed_matrix_bytes + vector_floats * sizeof(float) + rope_bytes + section_rope_bytes +
           per_layer_matrix_bytes + per_layer_vector_bytes;
  }
  // What the placement plan sizes: fixed_bytes() and each layer's blob.
  DeviceWeightSizes sizes() const;
};

// The table for these weights, with split rows where `split_weights` (KernelConfig) and the
// type and row length allow.
WeightLayout weight_layout(const ModelConfig& config, const WeightTable& weights,
                           bool split_weights);

}  // namespace granule
