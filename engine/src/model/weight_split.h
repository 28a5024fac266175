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

}  // namespace granule
