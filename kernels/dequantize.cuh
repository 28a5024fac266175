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

// out[t][:] = row tokens[t] of the table (n_embd wide); ids outside [0, n_vocab) give zeros.
cudaError_t launch_embedding_gather(uint32_t weight_type, const void* table, int64_t row_bytes,
                                    int n_embd, int64_t n_vocab, const int32_t* tokens,
                                    int n_tokens, float* out, cudaStream_t stream,
                                    bool split_layout = false);

}  // namespace granule::kernels
