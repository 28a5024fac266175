// The grouped tensor-core expert products' view of a GGUF weight row (moe_mma.cu): for one lane
// t (0..3) of an mma quad, one 32-element sub-block of a row as two words of four int8 values
// (the k slots 4t..4t+3 and 16+4t..16+4t+3 of an m16n8k32 A fragment) and the sub-block's affine
// map, element = d · q + m (Q6_K: d · s · q, s the int8 scale of elements 0-15 or 16-31).
// Which elements of the sub-block the slots hold is the type's layout: Standard (slot 4t + j is
// element 4t + j, 16 + 4t + j is 16 + 4t + j: the nibble types, whose byte i holds elements i
// and i + 16) or Contiguous (slot 4t + j is element 8t + j, slot 16 + 4t + j is 8t + 4 + j: the
// K-quants' and Q8_0's bytes, one 8-byte load per lane). The dot product does not care which,
// as long as the activation fragment follows the same layout.
//
// Each type reads its rows in chunks of kSubs sub-blocks (a K-quant super-block, or 4 blocks
// of 32) with plain loads into registers (Raw), so the expert may sit in VRAM or in mapped
// pinned host memory; sub() then builds each sub-block's words from the registers. The K-quants
// and Q4_1 are read from the GGUF bytes, Q4_0, Q8_0, IQ4_NL and MXFP4 from the split layout
// (moe_unpack::split_rows: per row the values of all blocks, then the scales), whose values are
// aligned words. Plain C++ as well as CUDA, so a host test holds every type to dequantize_row.
#pragma once
#include <cstdint>
#include <cstring>

#include "granule/block_formats.h"
#include "moe_unpack.cuh"

#if defined(__CUDACC__)
#define GRANULE_MMA_HD __host__ __device__ __forceinline__
#else
#define GRANULE_MMA_HD inline
#endif

namespace granule::kernels::moe_mma {

using moe_unpack::half_to_float;

// One sub-block of one row as lane t meets it.
struct Sub {
  uint32_t lo = 0, hi = 0;  // int8 x4: k slots 4t..4t+3 and 16+4t..16+4t+3
  float d = 0.0f, m = 0.0f;
  int s_lo = 0, s_hi = 0;  // kSplit16: the int scales of elements 0-15 and 16-31
};

// ---- loads (device: one instruction per aligned word; host: memcpy) ----

GRANULE_MMA_HD uint32_t ld_u16(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const uint16_t*>(p);
#else
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
#endif
}
GRANULE_MMA_HD uint32_t ld_u32(const uint8_t* p) {  // 4-byte aligned
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const uint32_t*>(p);
#else
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
#endif
}
GRANULE_MMA_HD uint32_t ld_u32_a2(const uint8_t* p) {  // 2-byte aligned
  return ld_u16(p) | (ld_u16(p + 2) << 16);
}
GRANULE_MMA_HD void ld_u64(const uint8_t* p, uint32_t& a, uint32_t& b) {  // 8-byte aligned
#if defined(__CUDA_ARCH__)
  const uint2 v = *reinterpret_cast<const uint2*>(p);
  a = v.x;
  b = v.y;
#else
  a = ld_u32(p);
  b = ld_u32(p + 4);
#endif
}
GRANULE_MMA_HD void ld_u128(const uint8_t* p, uint32_t (&w)[4]) {  // 16-byte aligned
#if defined(__CUDA_ARCH__)
  const uint4 v = *reinterpret_cast<const uint4*>(p);
  w[0] = v.x;
  w[1] = v.y;
  w[2] = v.z;
  w[3] = v.w;
#else
  for (int i = 0; i < 4; ++i) w[i] = ld_u32(p + 4 * i);
#endif
}

GRANULE_MMA_HD uint32_t byte_of(uint32_t w, int i) { return (w >> (8 * i)) & 0xFFu; }

// Byte i (0..3) of w as f32, exactly: on the device one byte permute into the bits of 2^23 + b
// and one f32 subtraction.
GRANULE_MMA_HD float byte_to_float(uint32_t w, int i) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(__uint_as_float(__byte_perm(w, 0x4B000000u, 0x7540u | i)), 8388608.0f);
#else
  return static_cast<float>(byte_of(w, i));
#endif
}

// An int of magnitude below 2^22 as f32, exactly. On the device one f32 subtraction from the
// bits of 1.5 · 2^23 + v: an int-to-float conversion runs at an eighth of the FP32 rate.
GRANULE_MMA_HD float small_int_to_float(int v) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(__int_as_float(0x4B400000 + v), 12582912.0f);
#else
  return static_cast<float>(v);
#endif
}
constexpr uint32_t kNibbles = 0x0F0F0F0Fu;

template <uint32_t TYPE>
struct Frag;  // the types the grouped tensor-core products read (moe_mma_supports)

// Sub-block `first + j` of a row of n_sub, or sub-block 0 past the end (a last chunk of 32-element
// blocks: loaded, never used).
GRANULE_MMA_HD int64_t sub_or_first(int first, int j, int n_sub) {
  return first + j < n_sub ? first + j : 0;
}

// Q4_0 (split: 16 nibble bytes per sub-block, then an f16 d per sub-block); q - 8 signed.
template <>
struct Frag<2> {
  static constexpr int kSubs = 4;
  static constexpr bool kContiguous = false, kOffset = false, kSplit16 = false;
  // Split rows: per sub-block kValueBytes of values from the row's start, and kScaleBytes of
  // scale from byte kValueBytes · n_sub (what a kernel staging a chunk must copy).
  static constexpr int kValueBytes = 16, kScaleBytes = 2;
  struct Raw {
    uint32_t q[kSubs];
    uint32_t d[kSubs];
  };
  GRANULE_MMA_HD static void load(Raw& r, const uint8_t* row, int first, int n_sub, int t) {
    for (int j = 0; j < kSubs; ++j) {
      const int64_t sub = sub_or_first(first, j, n_sub);
      r.q[j] = ld_u32(row + kValueBytes * sub + 4 * t);
      r.d[j] = ld_u16(row + kValueBytes * static_cast<int64_t>(n_sub) + kScaleBytes * sub);
    }
  }
  GRANULE_MMA_HD static Sub sub(const Raw& r, int j) {
    Sub s;
    s.lo = moe_unpack::minus8(r.q[j] & kNibbles);
    s.hi = moe_unpack::minus8((r.q[j] >> 4) & kNibbles);
    s.d = half_to_float(static_cast<uint16_t>(r.d[j]));
    return s;
  }
};

// Q4_1: 20-byte blocks (4-byte aligned); q unsigned, + m.
template <>
struct Frag<3> {
  static constexpr int kSubs = 4;
  static constexpr bool kContiguous = false, kOffset = true, kSplit16 = false;
  struct Raw {
    uint32_t q[kSubs];
    uint32_t dm[kSubs];
  };
  GRANULE_MMA_HD static void load(Raw& r, const uint8_t* row, int first, int n_sub, int t) {
    for (int j = 0; j < kSubs; ++j) {
      const uint8_t* b = row + static_cast<int64_t>(first + j < n_sub ? first + j : 0) * 20;
      r.q[j] = ld_u32(b + 4 + 4 * t);
      r.dm[j] = ld_u32(b);
    }
  }
  GRANULE_MMA_HD static Sub sub(const Raw& r, int j) {
    Sub s;
    s.lo = r.q[j] & kNibbles;
    s.hi = (r.q[j] >> 4) & kNibbles;
    s.d = half_to_float(static_cast<uint16_t>(r.dm[j] & 0xFFFFu));
    s.m = half_to_float(static_cast<uint16_t>(r.dm[j] >> 16));
    return s;
  }
};

// Q8_0 (split: 32 bytes per sub-block, then an f16 d per sub-block); Contiguous.
template <>
struct Frag<8> {
  static constexpr int kSubs = 4;
  static constexpr bool kContiguous = true, kOffset = false, kSplit16 = false;
  static constexpr int kValueBytes = 32, kScaleBytes = 2;  // split rows, as Frag<2>
  struct Raw {
    uint32_t q[kSubs][2];
    uint32_t d[kSubs];
  };
  GRANULE_MMA_HD static void load(Raw& r, const uint8_t* row, int first, int n_sub, int t) {
    for (int j = 0; j < kSubs; ++j) {
      const int64_t sub = sub_or_first(first, j, n_sub);
      ld_u64(row + kValueBytes * sub + 8 * t, r.q[j][0], r.q[j][1]);
      r.d[j] = ld_u16(row + kValueBytes * static_cast<int64_t>(n_sub) + kScaleBytes * sub);
    }
  }
  GRANULE_MMA_HD static Sub sub(const Raw& r, int j) {
    Sub s;
    s.lo = r.q[j][0];
    s.hi = r.q[j][1];
    s.d = half_to_float(static_cast<uint16_t>(r.d[j]));
    return s;
  }
};

// IQ4_NL and MXFP4 (split: 16 nibble bytes per sub-block in Q4_0's order, then an f16 d or an
// E8M0 byte per sub-block): the nibbles index a table of int8 levels.
template <uint32_t TYPE>
struct LevelFrag {
  static constexpr bool kMxfp4 = TYPE == 39;
  static constexpr int kSubs = 4;
  static constexpr bool kContiguous = false, kOffset = false, kSplit16 = false;
  static constexpr int kValueBytes = 16, kScaleBytes = kMxfp4 ? 1 : 2;  // split rows, as Frag<2>
  struct Raw {
    uint32_t q[kSubs];
    uint32_t d[kSubs];
  };
  GRANULE_MMA_HD static void load(Raw& r, const uint8_t* row, int first, int n_sub, int t) {
    const uint8_t* scales = row + kValueBytes * static_cast<int64_t>(n_sub);
    for (int j = 0; j < kSubs; ++j) {
      const int64_t sub = sub_or_first(first, j, n_sub);
      r.q[j] = ld_u32(row + kValueBytes * sub + 4 * t);
      r.d[j] = kMxfp4 ? scales[sub] : ld_u16(scales + kScaleBytes * sub);
    }
  }
  GRANULE_MMA_HD static Sub sub(const Raw& r, int j) {
    Sub s;
    moe_unpack::levels8<kMxfp4>(r.q[j], s.lo, s.hi);  // low nibbles to lo, high to hi
    s.d = kMxfp4 ? moe_unpack::e8m0_half(r.d[j]) : half_to_float(static_cast<uint16_t>(r.d[j]));
    return s;
  }
};
template <>
struct Frag<20> : LevelFrag<20> {};
template <>
struct Frag<39> : LevelFrag<39> {};

// Q4_K (144-byte super-blocks, 16-byte aligned) and Q5_K (176 bytes): one super-block per
// chunk; Contiguous: lane t's 8 bytes of each 32-byte qs group hold elements 8t.. of two
// sub-blocks (low and high nibbles).
template <uint32_t TYPE>
struct KFrag {
  static constexpr bool kQ5 = TYPE == 13;
  static constexpr int kBytes = kQ5 ? 176 : 144;
  static constexpr int kQs = kQ5 ? 48 : 16;
  static constexpr int kSubs = 8;
  static constexpr bool kContiguous = true, kOffset = true, kSplit16 = false;
  struct Raw {
    uint32_t head[4];  // d, dmin, scales[12]
    uint32_t qs[8];
    uint32_t qh[kQ5 ? 2 : 1];
  };
  GRANULE_MMA_HD static void load(Raw& r, const uint8_t* row, int first, int, int t) {
    const uint8_t* b = row + static_cast<int64_t>(first / 8) * kBytes;
    ld_u128(b, r.head);
    for (int p = 0; p < 4; ++p) ld_u64(b + kQs + 32 * p + 8 * t, r.qs[2 * p], r.qs[2 * p + 1]);
    if constexpr (kQ5) ld_u64(b + 16 + 8 * t, r.qh[0], r.qh[1]);
  }
  GRANULE_MMA_HD static Sub sub(const Raw& r, int j) {
    // moe_unpack::k_scale_min over the registers, four sub-blocks' 6-bit scales (and mins) per
    // word: bytes 0-3 of scales & 63 for sub-blocks 0-3; for 4-7 the low nibbles (high, for the
    // mins) of bytes 8-11 with the top two bits of bytes 0-3 (4-7) as bits 4-5. The words are
    // the same for every j of a chunk (computed once when the chunk's sub-blocks are unrolled).
    const uint32_t scales = j < 4 ? r.head[1] & 0x3F3F3F3Fu
                                  : (r.head[3] & 0x0F0F0F0Fu) | ((r.head[1] >> 2) & 0x30303030u);
    const uint32_t mins = j < 4
                              ? r.head[2] & 0x3F3F3F3Fu
                              : ((r.head[3] >> 4) & 0x0F0F0F0Fu) | ((r.head[2] >> 2) & 0x30303030u);
    Sub s;
    const int shift = 4 * (j % 2);
    s.lo = (r.qs[2 * (j / 2)] >> shift) & kNibbles;
    s.hi = (r.qs[2 * (j / 2) + 1] >> shift) & kNibbles;
    if constexpr (kQ5) {
      s.lo |= ((r.qh[0] >> j) & 0x01010101u) << 4;
      s.hi |= ((r.qh[kQ5 ? 1 : 0] >> j) & 0x01010101u) << 4;
    }
    s.d = half_to_float(static_cast<uint16_t>(r.head[0] & 0xFFFFu)) * byte_to_float(scales, j % 4);
    s.m = -(half_to_float(static_cast<uint16_t>(r.head[0] >> 16)) * byte_to_float(mins, j % 4));
    return s;
  }
};

template <>
struct Frag<12> : KFrag<12> {};
template <>
struct Frag<13> : KFrag<13> {};

// IQ4_XS: 136-byte super-blocks (8-byte aligned), each sub-block's 16 nibble bytes in Q4_0's
// order, one 6-bit scale per sub-block.
template <>
struct Frag<23> {
  static constexpr int kSubs = 8;
  static constexpr bool kContiguous = false, kOffset = false, kSplit16 = false;
  struct Raw {
    uint32_t head[2];  // d | scales_h << 16, scales_l[4]
    uint32_t q[8];
  };
  GRANULE_MMA_HD static void load(Raw& r, const uint8_t* row, int first, int, int t) {
    const uint8_t* b = row + static_cast<int64_t>(first / 8) * 136;
    ld_u64(b, r.head[0], r.head[1]);
    for (int j = 0; j < 8; ++j) r.q[j] = ld_u32(b + 8 + 16 * j + 4 * t);
  }
  GRANULE_MMA_HD static Sub sub(const Raw& r, int j) {
    const uint32_t scales_h = r.head[0] >> 16;
    const int ls = static_cast<int>(((byte_of(r.head[1], j / 2) >> (4 * (j % 2))) & 0xF) |
                                    (((scales_h >> (2 * j)) & 3) << 4));
    Sub s;
    moe_unpack::levels8<false>(r.q[j], s.lo, s.hi);  // low nibbles to lo, high to hi
    s.d = half_to_float(static_cast<uint16_t>(r.head[0] & 0xFFFFu)) * small_int_to_float(ls - 32);
    return s;
  }
};

// Q6_K: 210-byte super-blocks (2-byte aligned); a scale per 16 elements, so two m16n8k16
// products per sub-block (kSplit16), combined in int32 with the int8 scales.
template <>
struct Frag<14> {
  static constexpr int kSubs = 8;
  static constexpr bool kContiguous = false, kOffset = false, kSplit16 = true;
  struct Raw {
    uint32_t ql[2][2][2];  // [half][region][word t, word 4 + t]
    uint32_t qh[2][2];     // [half][word t, word 4 + t]
    uint32_t scales[4];
    uint32_t d;
  };
  GRANULE_MMA_HD static void load(Raw& r, const uint8_t* row, int first, int, int t) {
    const uint8_t* b = row + static_cast<int64_t>(first / 8) * 210;
    for (int h = 0; h < 2; ++h) {
      for (int g = 0; g < 2; ++g) {
        r.ql[h][g][0] = ld_u32_a2(b + 64 * h + 32 * g + 4 * t);
        r.ql[h][g][1] = ld_u32_a2(b + 64 * h + 32 * g + 16 + 4 * t);
      }
      r.qh[h][0] = ld_u32_a2(b + 128 + 32 * h + 4 * t);
      r.qh[h][1] = ld_u32_a2(b + 128 + 32 * h + 16 + 4 * t);
    }
    for (int i = 0; i < 4; ++i) r.scales[i] = ld_u32_a2(b + 192 + 4 * i);
    r.d = ld_u16(b + 208);
  }
  GRANULE_MMA_HD static Sub sub(const Raw& r, int j) {
    const int h = j / 4, q = j % 4;
    const int ql_shift = q >= 2 ? 4 : 0, qh_shift = 2 * q;
    auto word = [&](int w) {
      return moe_unpack::minus32(((r.ql[h][q % 2][w] >> ql_shift) & kNibbles) |
                                 (((r.qh[h][w] >> qh_shift) & 0x03030303u) << 4));
    };
    Sub s;
    s.lo = word(0);
    s.hi = word(1);
    const int i = 8 * h + 2 * q;
    s.s_lo = static_cast<int8_t>(byte_of(r.scales[i / 4], i % 4));
    s.s_hi = static_cast<int8_t>(byte_of(r.scales[(i + 1) / 4], (i + 1) % 4));
    s.d = half_to_float(static_cast<uint16_t>(r.d));
    return s;
  }
};

// The element of the sub-block that byte j (0..3) of word `hi` (0: lo, 1: hi) of lane t holds.
template <uint32_t TYPE>
constexpr int element_of(int t, int hi, int j) {
  return Frag<TYPE>::kContiguous ? 8 * t + 4 * hi + j : 16 * hi + 4 * t + j;
}

}  // namespace granule::kernels::moe_mma

#undef GRANULE_MMA_HD
