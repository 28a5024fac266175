// The GGUF block formats, byte for byte as ggml lays them out: the one table of block structs
// that the host (dequantisation, the CPU backend, the test quantisers) and the device
// (kernels/quant_blocks.cuh) both include. Plain C++: fp16 scales are raw uint16_t.
#pragma once
#include <cstdint>

namespace granule {

constexpr int kQK = 32;     // elements per block of Q4_0, Q4_1, Q8_0
constexpr int kQK_K = 256;  // elements per super-block of the K quants
constexpr int kScaleBytesK = 12;

struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK / 2];
};
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[kQK / 2];
};
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK];
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
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);

}  // namespace granule
