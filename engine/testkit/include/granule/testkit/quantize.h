// The test quantisers: f32 to fp16/bf16 and to every GGUF block type of granule/quant.h,
// bit-exact with ggml's reference quantisers (F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and
// MXFP4 checked against gguf.quants), except Q2_K, Q3_K, IQ4_NL and IQ4_XS: valid, simpler
// encoders than ggml's searches. The GGUF writer, the tests and granule-bench encode with
// them; the engine itself only decodes.
#pragma once
#include <cstdint>

#include "granule/tensor_type.h"

namespace granule {

uint16_t f32_to_fp16(float f);  // round to nearest even
uint16_t f32_to_bf16(float f);  // round to nearest even

// Encodes n elements into dst (row_bytes(type, n) bytes).
// Throws UsageError when n is negative or not a multiple of the block size.
void quantize_row(TensorType type, const float* src, void* dst, int64_t n);

}  // namespace granule
