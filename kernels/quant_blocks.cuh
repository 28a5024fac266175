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
  kQ8_0 = 8,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kBF16 = 30,
};

// The block structs (BlockQ4_0 ... BlockQ6_K) and kQK / kQK_K are the host's own, from
// granule/block_formats.h: one table for both sides.
using granule::BlockQ4_0;
using granule::BlockQ4_1;
using granule::BlockQ4_K;
using granule::BlockQ5_K;
using granule::BlockQ6_K;
using granule::BlockQ8_0;
using granule::kQK;
using granule::kQK_K;

// Elements per block and bytes per block; 0 for an unknown id.
__host__ __device__ constexpr int block_elems(uint32_t type) {
  return type == kF32 || type == kF16 || type == kBF16     ? 1
         : type == kQ4_0 || type == kQ4_1 || type == kQ8_0 ? kQK
         : type == kQ4_K || type == kQ5_K || type == kQ6_K ? kQK_K
                                                           : 0;
}
__host__ __device__ constexpr int block_bytes(uint32_t type) {
  return type == kF32                    ? 4
         : type == kF16 || type == kBF16 ? 2
         : type == kQ4_0                 ? 18
         : type == kQ4_1                 ? 20
         : type == kQ8_0                 ? 34
         : type == kQ4_K                 ? 144
         : type == kQ5_K                 ? 176
         : type == kQ6_K                 ? 210
                                         : 0;
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
    default:
      return false;
  }
}

}  // namespace granule::kernels
