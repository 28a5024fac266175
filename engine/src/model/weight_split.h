// Host side of the split weight layout (engine/include/granule/split_layout.h): re-laying GGUF rows
// out for the device's decode kernels, and decoding a split row back (the layout's own check).
#pragma once
#include <cstdint>

namespace granule {

// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS and MXFP4 have a
// split layout; other types (F32, F16, BF16) are uploaded as stored.
bool split_layout_supported(uint32_t ggml_type);
// Whether rows of `cols` elements of this type can be split: a supported type and whole
// blocks per row (256 elements for the K types and IQ4_XS, 32 for the others). split_rows
// needs it.
bool split_layout_fits(uint32_t ggml_type, int64_t cols);
// Bytes from one split row to the next (GGUF's row size, plus 4 per 256 elements for Q3_K, Q4_K
// and Q5_K and 2 for IQ4_XS, rounded up to 16).
int64_t split_row_stride(uint32_t ggml_type, int64_t cols);
// Re-lays out `rows` consecutive GGUF rows of `cols` elements into dst, which holds
// rows * split_row_stride bytes (padding bytes are zeroed).
void split_rows(uint32_t ggml_type, const uint8_t* gguf_rows, int64_t rows, int64_t cols,
                uint8_t* dst);
// Decodes one split row to f32: equal, element for element, to dequantize_row of the GGUF row.
void dequantize_split_row(uint32_t ggml_type, const uint8_t* row, int64_t cols, float* out);

// The expert matrices of mixture-of-experts layers as the CUDA MoE kernels read them
// (kernels/moe_unpack.cuh, whose split_rows must name the same types): Q4_0, Q8_0, IQ4_NL and
// MXFP4 rows in the split layout, whose GGUF blocks (18, 34, 18 and 17 bytes) would leave the
// kernels' loads unaligned; other types as stored.
constexpr bool expert_rows_split(uint32_t ggml_type) {
  return ggml_type == 2 || ggml_type == 8 || ggml_type == 20 || ggml_type == 39;
}
// Bytes from one expert row to the next (split_row_stride, or GGUF's row size).
int64_t expert_row_bytes(uint32_t ggml_type, int64_t cols);
// Writes `rows` GGUF rows of `cols` elements as the expert kernels read them into dst, which
// holds rows * expert_row_bytes bytes.
void write_expert_rows(uint32_t ggml_type, const uint8_t* gguf_rows, int64_t rows, int64_t cols,
                       uint8_t* dst);

}  // namespace granule
