// The GGUF block formats, bit-exact: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K.
// Block structs match ggml's layouts byte for byte; dequantisation is the reference the
// CUDA kernels are checked against. Encoding (f32 to these formats) is test-only and lives
// in the testkit: granule/testkit/quantize.h.
#pragma once
#include <cstdint>
#include <span>

#include "granule/tensor_type.h"

namespace granule {

float fp16_to_f32(uint16_t h);
float bf16_to_f32(uint16_t h);

constexpr int kQK = 32;      // elements per block of Q4_0, Q4_1, Q8_0
constexpr int kQK_K = 256;   // elements per super-block of the K quants
constexpr int kScaleBytesK = 12;

struct BlockQ4_0 { uint16_t d; uint8_t qs[kQK / 2]; };
struct BlockQ4_1 { uint16_t d; uint16_t m; uint8_t qs[kQK / 2]; };
struct BlockQ8_0 { uint16_t d; int8_t qs[kQK]; };
struct BlockQ4_K { uint16_t d; uint16_t dmin; uint8_t scales[kScaleBytesK]; uint8_t qs[kQK_K / 2]; };
struct BlockQ5_K { uint16_t d; uint16_t dmin; uint8_t scales[kScaleBytesK]; uint8_t qh[kQK_K / 8]; uint8_t qs[kQK_K / 2]; };
struct BlockQ6_K { uint8_t ql[kQK_K / 2]; uint8_t qh[kQK_K / 4]; int8_t scales[kQK_K / 16]; uint16_t d; };
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);

// Rows are read in place (from the mapped file): src/row must be 2-byte aligned, 4-byte
// for F32, which GGUF's tensor alignment (32 by default) guarantees.
// Decodes n elements (a multiple of the block size) starting at src into dst.
void dequantize_row(TensorType type, const void* src, float* dst, int64_t n);
// Dot product of one encoded row with an f32 vector, accumulated in f32 (no decode buffer).
float dot_row(TensorType type, const void* row, const float* x, int64_t n);

}  // namespace granule
