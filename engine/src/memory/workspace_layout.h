// The CUDA backend's workspace, described once: every buffer CudaModel allocates for runs of
// up to `rows` token rows and contexts of `context` tokens, by name and bytes, in allocation
// order. CudaModel allocates from this list and the placement plan and the fit preview sum it,
// so the two cannot disagree. Plain C++ (the fit preview runs without a GPU); the CUDA side
// checks the element sizes named here against its own types (cuda_weights.cpp).
#pragma once
#include <cstdint>
#include <string_view>
#include <vector>

#include "granule/model_config.h"

namespace granule {

struct WeightLayout;

// Split attention: a decode row spreads its tokens over splits of at least this many tokens
// (the split kernel), a prefill row over splits of this many (the GEMM path's rows).
constexpr int kDecodeSplitTokens = 64;
constexpr int kPrefillSplitTokens = 1024;

namespace workspace {
// Rows at most this many take the quantised matrix-vector kernels; more take the GEMM path.
constexpr int64_t kMatvecMaxRows = 64;
constexpr int64_t kLogitRows = 64;  // logit rows per head pass
// Per-row int32 arrays of the step inputs (cuda_model.cpp's InputArray).
constexpr int64_t kInputArrays = 8;
constexpr int64_t kHistoryTokens = 256;       // recent tokens per row the penalties see
constexpr int64_t kSamplingParamsBytes = 48;  // sizeof(kernels::DeviceSamplingParams)
constexpr int64_t kQ8Block = 32;              // int8 activation block (one float2 scale each)
// Structured output's token masks copied to the device for one masked head (token_masks.h):
// a decode bucket's rows or a head pass's, whichever is more.
constexpr int64_t kTokenMaskRows = kMatvecMaxRows > kLogitRows ? kMatvecMaxRows : kLogitRows;
// A token mask row: a 16-byte header (its first word 1 where the row is masked), then a bit
// per token in 32-bit words, rounded up to 16 bytes (the mask kernel's loads).
uint64_t token_mask_row_bytes(int64_t n_vocab);
// The "token_masks" buffer: a 16-byte status (whether the wait saw the masks), then
// kTokenMaskRows rows.
uint64_t token_mask_device_bytes(int64_t n_vocab);
}  // namespace workspace

struct WorkspaceBuffer {
  std::string_view name;
  uint64_t bytes = 0;
};

struct CudaWorkspace {
  int64_t rows = 0;    // max(rows asked, kMatvecMaxRows)
  int64_t widest = 0;  // max(n_embd, n_head * head_dim, n_ff)
  // Within the "inputs" buffer: [inputs: kInputArrays x rows int32][sampling parameters]
  // [history lengths][histories: rows x kHistoryTokens int32], each part aligned as the
  // weights are (WeightLayout::kAlignBytes).
  uint64_t params_offset = 0, lengths_offset = 0, history_offset = 0;
  // Allocated at load, in this order (charged to the ledger's Workspace category).
  std::vector<WorkspaceBuffer> buffers;
  // Allocated by attach_kv(): attention scratch for the context, and the slots' KV addresses.
  std::vector<WorkspaceBuffer> attention;
  // The prefill overlap's second f16 scratch (as large as "weight_f16"), when it is taken.
  uint64_t overlap_bytes = 0;

  // The named buffer's bytes (in either list); 0 when absent.
  uint64_t bytes(std::string_view name) const;
  uint64_t load_bytes() const;       // buffers
  uint64_t attention_bytes() const;  // attention
  uint64_t total() const { return load_bytes() + attention_bytes(); }
};

// The workspace for runs of up to `rows` token rows, contexts of `context` tokens and `slots`
// KV slots (0: not known yet; the slot addresses then count 0 bytes).
CudaWorkspace cuda_workspace(const ModelConfig& config, const WeightLayout& layout, int64_t rows,
                             int64_t context, int64_t slots);

}  // namespace granule
