// The GGUF block formats, byte for byte as ggml lays them out: the one table of block structs
// that the host (dequantisation, the CPU backend, the test quantisers) and the device
// (kernels/quant_blocks.cuh) both include. Plain C++: fp16 scales are raw uint16_t.
#pragma once
#include <cstdint>

namespace granule {

constexpr int kQK = 32;     // elements per block of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4
constexpr int kQK_K = 256;  // elements per super-block of the K quants and IQ4_XS
constexpr int kScaleBytesK = 12;

// The 16 non-linear levels of IQ4_NL and IQ4_XS (ggml's kvalues_iq4nl).
inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};
// The 16 FP4 (E2M1) levels of MXFP4, doubled so they are integers (ggml's kvalues_mxfp4);
// the block's E8M0 scale is halved to match (ggml_e8m0_to_fp32_half).
inline constexpr int8_t kMxfp4Values[16] = {0, 1,  2,  3,  4,  6,  8,  12,
                                            0, -1, -2, -3, -4, -6, -8, -12};

struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK / 2];
};
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[kQK / 2];
};
// Q5_0/Q5_1: the low 4 bits as Q4_0/Q4_1 (element j low nibble, j + 16 high nibble of
// qs[j]); the fifth bit of element j is bit j of qh (read as a little-endian u32).
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK];
};
// Q2_K: 16 sub-blocks of 16, each with a 4-bit scale (low nibble) and 4-bit min (high);
// value = d * scale * q - dmin * min with q 2 bits.
struct BlockQ2_K {
  uint8_t scales[kQK_K / 16];
  uint8_t qs[kQK_K / 4];
  uint16_t d;
  uint16_t dmin;
};
// Q3_K: 16 sub-blocks of 16 with signed 6-bit scales (biased by 32) packed in 12 bytes;
// q = 2 low bits from qs minus 4 when the element's hmask bit is clear.
struct BlockQ3_K {
  uint8_t hmask[kQK_K / 8];
  uint8_t qs[kQK_K / 4];
  uint8_t scales[12];
  uint16_t d;
};
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kScaleBytesK];
  uint8_t qs[kQK_K / 2];
};
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kScaleBytesK];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];
  uint8_t qh[kQK_K / 4];
  int8_t scales[kQK_K / 16];
  uint16_t d;
};
// IQ4_NL: Q4_0's layout with the nibble indexing kIq4nlValues instead of q - 8.
struct BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[kQK / 2];
};
// IQ4_XS: 8 sub-blocks of 32 with 6-bit scales (biased by 32): low 4 bits in scales_l
// (two per byte), high 2 bits in scales_h (two bits per sub-block); qs as IQ4_NL per sub-block.
struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[kQK_K / 64];
  uint8_t qs[kQK_K / 2];
};
// MXFP4: one E8M0 exponent and 32 FP4 values (Q4_0's nibble order). 17 bytes: rows are
// only byte-aligned.
struct BlockMXFP4 {
  uint8_t e;
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockIQ4_NL) == 18);
static_assert(sizeof(BlockIQ4_XS) == 136);
static_assert(sizeof(BlockMXFP4) == 17);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);

}  // namespace granule
