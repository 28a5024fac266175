// Decoding packed GGUF rows on the device: whole matrices to f16 (the workspace prefill's
// cuBLAS GEMMs read) and embedding rows picked by token id to f32. Rows are GGUF blocks, or
// split_layout.h's layout when split_layout is set (row_bytes is then the split stride).
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace granule::kernels {

// out[r][c] for rows × n_cols (n_cols a multiple of 8 and of the type's block).
cudaError_t launch_dequantize_to_f16(uint32_t weight_type, const void* weight, int64_t rows,
                                     int64_t n_cols, int64_t row_bytes, __half* out,
                                     cudaStream_t stream, bool split_layout = false);

// The first RMSNorm's input handed over by the embedding gather of a one-row step, as the
// batch-1 fusion's products hand theirs over (matvec.cuh, MatvecTask::norm_weight): int8
// blocks of y·weight in qs/ds and Σ y² of each 32-element block in sums; the next product
// applies the 1/rms.
struct NormHandOver {
  const float* weight = nullptr;
  int8_t* qs = nullptr;
  float2* ds = nullptr;
  float* sums = nullptr;
};

// out[t][:] = row tokens[t] of the table (n_embd wide); ids outside [0, n_vocab) give zeros.
// With hand_over (one token only, n_embd a multiple of 32) the row also leaves as the next
// norm's hand-over.
cudaError_t launch_embedding_gather(uint32_t weight_type, const void* table, int64_t row_bytes,
                                    int n_embd, int64_t n_vocab, const int32_t* tokens,
                                    int n_tokens, float* out, cudaStream_t stream,
                                    bool split_layout = false,
                                    const NormHandOver* hand_over = nullptr);

}  // namespace granule::kernels
