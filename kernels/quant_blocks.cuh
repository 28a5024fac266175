// The GGUF block formats on the device: ggml's type ids, block layouts byte for byte, and
// a decoder of 8 consecutive elements of a row that every kernel reading weights shares.
#pragma once
#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "granule/block_formats.h"

namespace granule::kernels {

// ggml type ids (the same numbers as granule::TensorType).
enum WeightType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kIQ4_NL = 20,
  kIQ4_XS = 23,
  kBF16 = 30,
  kMXFP4 = 39,
};

// The block structs (BlockQ4_0 ... BlockQ6_K) and kQK / kQK_K are the host's own, from
// granule/block_formats.h: one table for both sides.
using granule::BlockIQ4_NL;
using granule::BlockIQ4_XS;
using granule::BlockMXFP4;
using granule::BlockQ2_K;
using granule::BlockQ3_K;
using granule::BlockQ4_0;
using granule::BlockQ4_1;
using granule::BlockQ4_K;
using granule::BlockQ5_0;
using granule::BlockQ5_1;
using granule::BlockQ5_K;
using granule::BlockQ6_K;
using granule::BlockQ8_0;
using granule::kQK;
using granule::kQK_K;

// Elements per block and bytes per block; 0 for an unknown id.
__host__ __device__ constexpr int block_elems(uint32_t type) {
  switch (type) {
    case kF32:
    case kF16:
    case kBF16:
      return 1;
    case kQ4_0:
    case kQ4_1:
    case kQ5_0:
    case kQ5_1:
    case kQ8_0:
    case kIQ4_NL:
    case kMXFP4:
      return kQK;
    case kQ2_K:
    case kQ3_K:
    case kQ4_K:
    case kQ5_K:
    case kQ6_K:
    case kIQ4_XS:
      return kQK_K;
    default:
      return 0;
  }
}
__host__ __device__ constexpr int block_bytes(uint32_t type) {
  switch (type) {
    case kF32:
      return 4;
    case kF16:
    case kBF16:
      return 2;
    case kQ4_0:
      return sizeof(BlockQ4_0);
    case kQ4_1:
      return sizeof(BlockQ4_1);
    case kQ5_0:
      return sizeof(BlockQ5_0);
    case kQ5_1:
      return sizeof(BlockQ5_1);
    case kQ8_0:
      return sizeof(BlockQ8_0);
    case kQ2_K:
      return sizeof(BlockQ2_K);
    case kQ3_K:
      return sizeof(BlockQ3_K);
    case kQ4_K:
      return sizeof(BlockQ4_K);
    case kQ5_K:
      return sizeof(BlockQ5_K);
    case kQ6_K:
      return sizeof(BlockQ6_K);
    case kIQ4_NL:
      return sizeof(BlockIQ4_NL);
    case kIQ4_XS:
      return sizeof(BlockIQ4_XS);
    case kMXFP4:
      return sizeof(BlockMXFP4);
    default:
      return 0;
  }
}
inline bool is_supported_weight_type(uint32_t type) { return block_bytes(type) != 0; }

#ifdef __CUDACC__
// The 6-bit scale and min of sub-block `sub` (0..7) of a Q4_K / Q5_K super-block.
__device__ __forceinline__ void k_quant_scale_min(const uint8_t* scales, int sub, int& scale,
                                                  int& min) {
  if (sub < 4) {
    scale = scales[sub] & 63;
    min = scales[sub + 4] & 63;
  } else {
    scale = (scales[sub + 4] & 0x0F) | ((scales[sub - 4] >> 6) << 4);
    min = (scales[sub + 4] >> 4) | ((scales[sub] >> 6) << 4);
  }
}

// Entry i (0..15) of a table of 16 int8 levels packed little-endian into four words, by
// selects rather than an indexed array (which would live in local memory).
__device__ __forceinline__ int level16(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3, int i) {
  const uint32_t low = (i & 4) ? w1 : w0, high = (i & 4) ? w3 : w2;
  const uint32_t word = (i & 8) ? high : low;
  return static_cast<int8_t>(word >> (8 * (i & 3)));
}
// granule::kIq4nlValues and granule::kMxfp4Values (block_formats.h), packed.
__device__ __forceinline__ int iq4nl_level(int i) {
  return level16(0xbfad9881u, 0xf6eaddcfu, 0x26190d01u, 0x71594535u, i);
}
__device__ __forceinline__ int mxfp4_level(int i) {
  return level16(0x03020100u, 0x0c080604u, 0xfdfeff00u, 0xf4f8fafcu, i);
}
// MXFP4's E8M0 scale halved, as ggml_e8m0_to_fp32_half (e 0 and 1 are subnormal).
__device__ __forceinline__ float e8m0_to_float_half(uint32_t e) {
  return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

// Q3_K's six-bit scale j (0..15), biased by 32 (layout in block_formats.h).
__device__ __forceinline__ int q3_k_scale(const uint8_t* scales, int j) {
  const int low = (scales[j % 8] >> (4 * (j / 8))) & 0xF;
  const int high = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (low | (high << 4)) - 32;
}

// Decodes elements [8 * chunk, 8 * chunk + 8) of a row starting at `row` into out.
template <uint32_t TYPE>
__device__ __forceinline__ void dequantize8(const uint8_t* row, int64_t chunk, float out[8]) {
  if constexpr (TYPE == kF32) {
    const float4* p = reinterpret_cast<const float4*>(row) + 2 * chunk;
    const float4 a = p[0], b = p[1];
    out[0] = a.x;
    out[1] = a.y;
    out[2] = a.z;
    out[3] = a.w;
    out[4] = b.x;
    out[5] = b.y;
    out[6] = b.z;
    out[7] = b.w;
  } else if constexpr (TYPE == kF16 || TYPE == kBF16) {
    const uint4 v = reinterpret_cast<const uint4*>(row)[chunk];
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (TYPE == kF16) {
        out[2 * i] = half_bits_to_float(w[i] & 0xFFFF);
        out[2 * i + 1] = half_bits_to_float(w[i] >> 16);
      } else {
        out[2 * i] = bf16_bits_to_float(w[i] & 0xFFFF);
        out[2 * i + 1] = bf16_bits_to_float(w[i] >> 16);
      }
    }
  } else if constexpr (TYPE == kQ4_0 || TYPE == kQ4_1) {
    // Low nibbles hold elements 0..15 of the block, high nibbles 16..31.
    const int64_t block = chunk / 4;
    const int part = chunk % 4;
    const int shift = part >= 2 ? 4 : 0;
    const int first = (part % 2) * 8;
    if constexpr (TYPE == kQ4_0) {
      const BlockQ4_0* b = reinterpret_cast<const BlockQ4_0*>(row) + block;
      const float d = half_bits_to_float(b->d);
#pragma unroll
      for (int i = 0; i < 8; ++i) out[i] = d * (((b->qs[first + i] >> shift) & 0xF) - 8);
    } else {
      const BlockQ4_1* b = reinterpret_cast<const BlockQ4_1*>(row) + block;
      const float d = half_bits_to_float(b->d), m = half_bits_to_float(b->m);
#pragma unroll
      for (int i = 0; i < 8; ++i) out[i] = d * ((b->qs[first + i] >> shift) & 0xF) + m;
    }
  } else if constexpr (TYPE == kQ5_0 || TYPE == kQ5_1) {
    // Q4_0/Q4_1's nibbles plus a fifth bit per element: bit e of qh (2-byte aligned).
    using Block = std::conditional_t<TYPE == kQ5_0, BlockQ5_0, BlockQ5_1>;
    const Block* b = reinterpret_cast<const Block*>(row) + chunk / 4;
    const int e0 = 8 * static_cast<int>(chunk % 4);
    const int shift = e0 >= 16 ? 4 : 0, first = e0 % 16;
    const uint32_t qh = static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(b->qh)[0]) |
                        static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(b->qh)[1]) << 16;
    const float d = half_bits_to_float(b->d);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int q = ((b->qs[first + i] >> shift) & 0xF) | (((qh >> (e0 + i)) & 1) << 4);
      if constexpr (TYPE == kQ5_0)
        out[i] = d * (q - 16);
      else
        out[i] = d * q + half_bits_to_float(b->m);
    }
  } else if constexpr (TYPE == kIQ4_NL || TYPE == kMXFP4) {
    // Q4_0's nibble order, each nibble a level of a 16-entry table.
    using Block = std::conditional_t<TYPE == kIQ4_NL, BlockIQ4_NL, BlockMXFP4>;
    const Block* b = reinterpret_cast<const Block*>(row) + chunk / 4;
    const int e0 = 8 * static_cast<int>(chunk % 4);
    const int shift = e0 >= 16 ? 4 : 0, first = e0 % 16;
    float d;
    if constexpr (TYPE == kIQ4_NL)
      d = half_bits_to_float(b->d);
    else
      d = e8m0_to_float_half(b->e);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int q = (b->qs[first + i] >> shift) & 0xF;
      out[i] = d * (TYPE == kIQ4_NL ? iq4nl_level(q) : mxfp4_level(q));
    }
  } else if constexpr (TYPE == kQ2_K || TYPE == kQ3_K) {
    // Each half of 128 elements reads 32 bytes of qs four times, two bits deeper each time;
    // 16 sub-blocks of 16 with their own scale. Q3_K's third bit: bit (e / 32) of hmask[e % 32].
    using Block = std::conditional_t<TYPE == kQ2_K, BlockQ2_K, BlockQ3_K>;
    const Block* b = reinterpret_cast<const Block*>(row) + chunk / 32;
    const int e0 = (chunk % 32) * 8;
    const int half = e0 / 128, pass = (e0 % 128) / 32, l0 = e0 % 32;
    const int sub = 8 * half + 2 * pass + l0 / 16;
    const uint8_t* qs = b->qs + 32 * half + l0;
    if constexpr (TYPE == kQ2_K) {
      const uint8_t sc = b->scales[sub];
      const float dl = half_bits_to_float(b->d) * (sc & 0xF);
      const float ml = half_bits_to_float(b->dmin) * (sc >> 4);
#pragma unroll
      for (int i = 0; i < 8; ++i) out[i] = dl * ((qs[i] >> (2 * pass)) & 3) - ml;
    } else {
      const float dl = half_bits_to_float(b->d) * q3_k_scale(b->scales, sub);
      const int bit = 4 * half + pass;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int low = (qs[i] >> (2 * pass)) & 3;
        out[i] = dl * (low - (((b->hmask[l0 + i] >> bit) & 1) ? 0 : 4));
      }
    }
  } else if constexpr (TYPE == kIQ4_XS) {
    // 8 sub-blocks of 32, each 16 bytes of qs in IQ4_NL's nibble order.
    const BlockIQ4_XS* b = reinterpret_cast<const BlockIQ4_XS*>(row) + chunk / 32;
    const int e0 = (chunk % 32) * 8;
    const int sub = e0 / 32, l0 = e0 % 32;
    const int ls =
        ((b->scales_l[sub / 2] >> (4 * (sub % 2))) & 0xF) | (((b->scales_h >> (2 * sub)) & 3) << 4);
    const float dl = half_bits_to_float(b->d) * (ls - 32);
    const uint8_t* qs = b->qs + 16 * sub + l0 % 16;
    const int shift = l0 >= 16 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = dl * iq4nl_level((qs[i] >> shift) & 0xF);
  } else if constexpr (TYPE == kQ8_0) {
    const BlockQ8_0* b = reinterpret_cast<const BlockQ8_0*>(row) + chunk / 4;
    const float d = half_bits_to_float(b->d);
    const int first = (chunk % 4) * 8;
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = d * b->qs[first + i];
  } else if constexpr (TYPE == kQ4_K || TYPE == kQ5_K) {
    // 8 sub-blocks of 32; sub-blocks 2j and 2j+1 share qs[32j..32j+32) (low / high nibble).
    // Blocks are 144 / 176 bytes, so the 8 bytes read here are 8-byte aligned.
    using Block = std::conditional_t<TYPE == kQ4_K, BlockQ4_K, BlockQ5_K>;
    const Block* b = reinterpret_cast<const Block*>(row) + chunk / 32;
    const int e0 = (chunk % 32) * 8;
    const int sub = e0 / 32, l0 = e0 % 32;
    int scale, min;
    k_quant_scale_min(b->scales, sub, scale, min);
    const float d = half_bits_to_float(b->d) * scale, m = half_bits_to_float(b->dmin) * min;
    const uint2 qs = *reinterpret_cast<const uint2*>(b->qs + 32 * (sub / 2) + l0);
    const int shift = (sub % 2) * 4;
    uint2 qh = make_uint2(0, 0);
    if constexpr (TYPE == kQ5_K) qh = *reinterpret_cast<const uint2*>(b->qh + l0);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t word = i < 4 ? qs.x : qs.y;
      int q = (word >> (8 * (i % 4) + shift)) & 0xF;
      if constexpr (TYPE == kQ5_K) q |= (((i < 4 ? qh.x : qh.y) >> (8 * (i % 4) + sub)) & 1) << 4;
      out[i] = d * q - m;
    }
  } else if constexpr (TYPE == kQ6_K) {
    // Two halves of 128; in each, four quarters of 32 take 4 low bits from ql and 2 high
    // bits from qh; one int8 scale per 16 elements. Blocks are 210 bytes: 2-byte loads.
    const BlockQ6_K* b = reinterpret_cast<const BlockQ6_K*>(row) + chunk / 32;
    const int e0 = (chunk % 32) * 8;
    const int half = e0 / 128, r = e0 % 128, quarter = r / 32, l0 = r % 32;
    const uint8_t* ql = b->ql + 64 * half + (quarter % 2) * 32 + l0;
    const uint8_t* qh = b->qh + 32 * half + l0;
    const uint32_t ql_words[2] = {static_cast<uint32_t>(load_int_aligned2(ql)),
                                  static_cast<uint32_t>(load_int_aligned2(ql + 4))};
    const uint32_t qh_words[2] = {static_cast<uint32_t>(load_int_aligned2(qh)),
                                  static_cast<uint32_t>(load_int_aligned2(qh + 4))};
    const int ql_shift = quarter >= 2 ? 4 : 0, qh_shift = 2 * quarter;
    const float d = half_bits_to_float(b->d) * b->scales[8 * half + l0 / 16 + 2 * quarter];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int lo = (ql_words[i / 4] >> (8 * (i % 4) + ql_shift)) & 0xF;
      const int hi = (qh_words[i / 4] >> (8 * (i % 4) + qh_shift)) & 3;
      out[i] = d * ((lo | (hi << 4)) - 32);
    }
  }
}
#endif  // __CUDACC__

// Calls f(std::integral_constant<uint32_t, TYPE>{}) for a runtime type id; returns false
// for an unknown id.
template <typename F>
inline bool dispatch_weight_type(uint32_t type, F&& f) {
  switch (type) {
    case kF32:
      f(std::integral_constant<uint32_t, kF32>{});
      return true;
    case kF16:
      f(std::integral_constant<uint32_t, kF16>{});
      return true;
    case kBF16:
      f(std::integral_constant<uint32_t, kBF16>{});
      return true;
    case kQ4_0:
      f(std::integral_constant<uint32_t, kQ4_0>{});
      return true;
    case kQ4_1:
      f(std::integral_constant<uint32_t, kQ4_1>{});
      return true;
    case kQ8_0:
      f(std::integral_constant<uint32_t, kQ8_0>{});
      return true;
    case kQ4_K:
      f(std::integral_constant<uint32_t, kQ4_K>{});
      return true;
    case kQ5_K:
      f(std::integral_constant<uint32_t, kQ5_K>{});
      return true;
    case kQ6_K:
      f(std::integral_constant<uint32_t, kQ6_K>{});
      return true;
    case kQ5_0:
      f(std::integral_constant<uint32_t, kQ5_0>{});
      return true;
    case kQ5_1:
      f(std::integral_constant<uint32_t, kQ5_1>{});
      return true;
    case kQ2_K:
      f(std::integral_constant<uint32_t, kQ2_K>{});
      return true;
    case kQ3_K:
      f(std::integral_constant<uint32_t, kQ3_K>{});
      return true;
    case kIQ4_NL:
      f(std::integral_constant<uint32_t, kIQ4_NL>{});
      return true;
    case kIQ4_XS:
      f(std::integral_constant<uint32_t, kIQ4_XS>{});
      return true;
    case kMXFP4:
      f(std::integral_constant<uint32_t, kMXFP4>{});
      return true;
    default:
      return false;
  }
}

}  // namespace granule::kernels
