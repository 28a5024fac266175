// The GGUF block formats, bit-exact: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K,
// Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS and MXFP4.
// Block structs match ggml's layouts byte for byte; dequantisation is the reference the
// CUDA kernels are checked against. Encoding (f32 to these formats) is test-only and lives
// in the testkit: granule/testkit/quantize.h.
#pragma once
#include <cstdint>
#include <span>

#include "granule/block_formats.h"
#include "granule/tensor_type.h"

namespace granule {

float fp16_to_f32(uint16_t h);
float bf16_to_f32(uint16_t h);

// The block structs and sizes: granule/block_formats.h, shared with the kernels.

// Rows are read in place (from the mapped file): src/row must be 2-byte aligned (MXFP4:
// any alignment), 4-byte for F32, which GGUF's tensor alignment (32 by default) guarantees.
// Decodes n elements (a multiple of the block size) starting at src into dst.
void dequantize_row(TensorType type, const void* src, float* dst, int64_t n);
// Dot product of one encoded row with an f32 vector, accumulated in f32 (no decode buffer).
float dot_row(TensorType type, const void* row, const float* x, int64_t n);

}  // namespace granule
