// How a streamed layer's matrices are split between the device and the host's CPU at small
// decode batches (the CUDA backend's HostRows, backends/cuda/host_rows.h): the share of each
// matrix's rows the host computes, from the two bandwidths, and the row where its part begins.
// Plain C++, header only: CPU tests check it without a GPU.
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "memory/weight_layout.h"

namespace granule {

// Shares are in 256ths of a matrix's rows.
constexpr int kHostRowShareUnits = 256;
// The device keeps whole blocks of this many rows: the matvec kernels' largest row tile (a
// 64-row mma tile; the split kernels take 32) and a multiple of the host copy's 8-row groups
// (cpu::Int8Weights::kGroupRows), so the host's first row starts a group.
constexpr int64_t kHostRowGranule = 64;

// The share that makes the host's time equal PCIe's: the host reads its rows' bytes at
// host_bytes_per_second while PCIe carries the rest at pcie_bytes_per_second, so
// share / host = (1 - share) / pcie. 0 when the host cannot be measured.
inline int host_row_share_for(double pcie_bytes_per_second, double host_bytes_per_second) {
  if (!(host_bytes_per_second > 0) || !(pcie_bytes_per_second > 0)) return 0;
  const double f = host_bytes_per_second / (host_bytes_per_second + pcie_bytes_per_second);
  const long units = std::lround(f * kHostRowShareUnits);
  return static_cast<int>(std::clamp<long>(units, 0, kHostRowShareUnits));
}

// The first row the host computes of a matrix of `rows` rows at `share` 256ths: the device's
// part, (256 - share) / 256 of the rows, rounded to the nearest whole granule; `rows` (nothing
// for the host) at share 0 or where the host's part rounds away.
inline int64_t host_row_begin(int64_t rows, int share, int64_t granule = kHostRowGranule) {
  if (share <= 0 || rows <= 0) return rows;
  if (share >= kHostRowShareUnits) return 0;
  const double device = static_cast<double>(rows) * (kHostRowShareUnits - share) /
                        static_cast<double>(kHostRowShareUnits);
  const int64_t begin = std::llround(device / static_cast<double>(granule)) * granule;
  return std::clamp<int64_t>(begin, 0, rows);
}

// A layer's dense products in the weight layout's order (LayerWeightLayout::matrices): wq, wk,
// wv, wo, w_gate, w_up, w_down.
constexpr int kDenseMatrices = 7;

// Matrix m of a layer in that order, or null where the layer has none.
inline const TensorInfo* dense_matrix(const LayerWeights& l, int m) {
  const TensorInfo* mats[kDenseMatrices] = {l.wq, l.wk, l.wv, l.wo, l.w_gate, l.w_up, l.w_down};
  return m >= 0 && m < kDenseMatrices ? mats[m] : nullptr;
}

// Why the host cannot compute rows of a model's streamed layers ("" where it can): the split
// layer runs as plain SwiGLU blocks of the seven matrices (the CUDA backend's HostRows; the fit
// preview asks it too).
inline std::string host_rows_refusal(const ModelConfig& c, const WeightTable& w) {
  if (c.is_moe()) return "a mixture of experts (--host-experts covers its experts)";
  if (c.is_hybrid()) return "Qwen3.5's recurrent layers";
  if (c.architecture == "gemma4" || c.sandwich_norms) return "Gemma's layers";
  if (c.activation != FfnActivation::Swiglu) return "an activation other than SwiGLU";
  for (const LayerWeights& l : w.layers) {
    if (l.bo || l.attn_post_norm || l.ffn_post_norm) return "an output bias or post-norms";
    for (int m = 0; m < kDenseMatrices; ++m)
      if (!dense_matrix(l, m)) return "a layer without one of the seven matrices";
  }
  // The host quantises its inputs in blocks of 32 (and the post kernel copies 16 bytes at a
  // time).
  if (c.n_embd % 32 != 0 || c.n_ff % 32 != 0 || (c.n_head * c.head_dim) % 32 != 0)
    return "a width that is not a multiple of 32";
  return "";
}

// Bytes [offset, offset + bytes) of a layer's blob.
struct BlobRange {
  uint64_t offset = 0, bytes = 0;
};

// What a split pass copies of a layer: per dense matrix, its first `first[m]` rows. Rows follow
// each other in either layout (split rows or GGUF blocks), so a row prefix is one range from the
// matrix's offset.
inline std::vector<BlobRange> device_row_ranges(const LayerWeightLayout& layer,
                                                const std::array<int64_t, kDenseMatrices>& first) {
  std::vector<BlobRange> ranges;
  for (size_t m = 0; m < static_cast<size_t>(kDenseMatrices); ++m) {
    const MatrixLayout& ml = layer.matrices[m];
    const int64_t rows = std::clamp<int64_t>(first[m], 0, ml.rows);
    ranges.push_back(
        {ml.offset, static_cast<uint64_t>(rows) * static_cast<uint64_t>(ml.row_bytes)});
  }
  return ranges;
}

}  // namespace granule
