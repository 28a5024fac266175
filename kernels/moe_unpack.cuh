// The expert kernels' view of a quantised weight row: chunk c (elements 8c .. 8c + 7) as eight
// signed 8-bit integers q_i and one affine map, element i = scale · q_i + offset, so a chunk
// meets int8 activations in two 4-way integer dot products (dp4a): with x_i = d_x · x_q,i,
//   Σ_i w_i x_i = d_x · (scale · Σ q_i x_q,i + offset · Σ x_q,i).
// Every GGUF block type but F32/F16/BF16 has this form per chunk of 8 (each chunk lies in one
// sub-block with one scale and one minimum). The indexing mirrors dequantize8
// (quant_blocks.cuh) line by line; plain C++ as well as CUDA, so a host test holds each type's
// unpacking to the CPU's dequantize_row.
// The expert rows of the types whose GGUF blocks are not 4-byte multiples (Q4_0 and IQ4_NL 18
// bytes, Q8_0 34, MXFP4 17) are read in the split layout (split_layout.h: per row the values of
// every block, 16-byte aligned, then the scales; split_rows makes it at upload), so a chunk's 8
// bytes are one aligned 8-byte load where GGUF's blocks took two-byte or single-byte loads.
#pragma once
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "granule/block_formats.h"
#include "split_unpack.h"

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#define GRANULE_MOE_HD __host__ __device__ __forceinline__
#else
#define GRANULE_MOE_HD inline
#endif

namespace granule::kernels::moe_unpack {

// Eight signed bytes (little-endian in lo, then hi) and the chunk's affine map.
struct Chunk8 {
  int lo = 0, hi = 0;
  float scale = 0.0f, offset = 0.0f;
};

GRANULE_MOE_HD float bits_to_float(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

GRANULE_MOE_HD float half_to_float(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#else
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  int exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return bits_to_float(sign | 0x7F800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return bits_to_float(sign);
    exp = 1;
    while ((mant & 0x400u) == 0) {  // normalise the subnormal
      mant <<= 1;
      --exp;
    }
    mant &= 0x3FFu;
  }
  return bits_to_float(sign | (static_cast<uint32_t>(exp + 112) << 23) | (mant << 13));
#endif
}

GRANULE_MOE_HD uint16_t load_u16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}

// Four bytes, little-endian, at a 2-byte aligned address (two 16-bit loads on the device).
GRANULE_MOE_HD uint32_t load_u32_a2(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  const uint16_t* p16 = reinterpret_cast<const uint16_t*>(p);
  return static_cast<uint32_t>(p16[0]) | (static_cast<uint32_t>(p16[1]) << 16);
#else
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
#endif
}
// Eight bytes at an 8-byte aligned address, as two little-endian words.
GRANULE_MOE_HD void load_u64_a8(const uint8_t* p, uint32_t& lo, uint32_t& hi) {
#if defined(__CUDA_ARCH__)
  const uint2 v = *reinterpret_cast<const uint2*>(p);
  lo = v.x;
  hi = v.y;
#else
  lo = load_u32_a2(p);
  hi = load_u32_a2(p + 4);
#endif
}
// Per byte of bytes in 0..15: the signed byte b - 8 (no borrow crosses bytes).
GRANULE_MOE_HD uint32_t minus8(uint32_t v) { return (v + 0x78787878u) ^ 0x80808080u; }
// Per byte of bytes in 0..63: the signed byte b - 32.
GRANULE_MOE_HD uint32_t minus32(uint32_t v) { return (v + 0x60606060u) ^ 0x80808080u; }

GRANULE_MOE_HD Chunk8 words(uint32_t lo, uint32_t hi, float scale, float offset) {
  Chunk8 c;
  c.lo = static_cast<int>(lo);
  c.hi = static_cast<int>(hi);
  c.scale = scale;
  c.offset = offset;
  return c;
}

// Eight 4-bit indices (nibble k of n, k = 0..7) to int8 levels of a 16-entry table packed
// little-endian in w0..w3, nibbles 0, 2, 4, 6 to the bytes of lo and 1, 3, 5, 7 to those of hi:
// entries 0-7 and 8-15 through one byte permute each per four nibbles (the permute reads the
// nibbles as they lie, which reads the low 16 bits of its selector; bit 3 masked off), one
// permute choosing between them by bit 3, and two sorting the bytes: about a dozen instructions
// for eight values, where split_unpack::table_levels4 takes about as many for four.
GRANULE_MOE_HD void table_levels8(uint32_t n, uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3,
                                  uint32_t& lo, uint32_t& hi) {
  using split_unpack::byte_perm;
  const uint32_t sel = n & 0x77777777u;
  const uint32_t which = 0x32103210u | ((n >> 1) & 0x44444444u);  // bytes 4-7: the high half
  const uint32_t a = byte_perm(byte_perm(w0, w1, sel), byte_perm(w2, w3, sel), which);
  const uint32_t b =
      byte_perm(byte_perm(w0, w1, sel >> 16), byte_perm(w2, w3, sel >> 16), which >> 16);
  lo = byte_perm(a, b, 0x6420u);  // a: nibbles 0-3, b: 4-7
  hi = byte_perm(a, b, 0x7531u);
}
// granule::kIq4nlValues (MXFP4 false) or granule::kMxfp4Values, as table_levels8 reads them.
template <bool MXFP4>
GRANULE_MOE_HD void levels8(uint32_t n, uint32_t& lo, uint32_t& hi) {
  if constexpr (MXFP4)
    table_levels8(n, 0x03020100u, 0x0c080604u, 0xfdfeff00u, 0xf4f8fafcu, lo, hi);
  else
    table_levels8(n, 0xbfad9881u, 0xf6eaddcfu, 0x26190d01u, 0x71594535u, lo, hi);
}

GRANULE_MOE_HD float e8m0_half(uint32_t e) {  // ggml_e8m0_to_fp32_half
  return bits_to_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

GRANULE_MOE_HD void k_scale_min(const uint8_t* scales, int sub, int& scale, int& min) {
  if (sub < 4) {
    scale = scales[sub] & 63;
    min = scales[sub + 4] & 63;
  } else {
    scale = (scales[sub + 4] & 0x0F) | ((scales[sub - 4] >> 6) << 4);
    min = (scales[sub + 4] >> 4) | ((scales[sub] >> 6) << 4);
  }
}

GRANULE_MOE_HD int q3_k_scale(const uint8_t* scales, int j) {
  const int low = (scales[j % 8] >> (4 * (j / 8))) & 0xF;
  const int high = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (low | (high << 4)) - 32;
}

GRANULE_MOE_HD Chunk8 pack(const int (&q)[8], float scale, float offset) {
  Chunk8 c;
  uint32_t lo = 0, hi = 0;
  for (int i = 0; i < 4; ++i) {
    lo |= static_cast<uint32_t>(static_cast<uint8_t>(q[i])) << (8 * i);
    hi |= static_cast<uint32_t>(static_cast<uint8_t>(q[4 + i])) << (8 * i);
  }
  c.lo = static_cast<int>(lo);
  c.hi = static_cast<int>(hi);
  c.scale = scale;
  c.offset = offset;
  return c;
}

// Whether the type's chunks carry an offset (a block minimum): the dot then needs Σ x_q.
constexpr bool has_offset(uint32_t type) {
  return type == 3 /*Q4_1*/ || type == 7 /*Q5_1*/ || type == 10 /*Q2_K*/ || type == 12 /*Q4_K*/ ||
         type == 13 /*Q5_K*/;
}

// Whether expert rows of the type are in the split layout (split_layout.h) rather than GGUF's
// blocks: Q4_0, Q8_0, IQ4_NL and MXFP4. The rows of such a matrix are split_row_stride apart
// (16-byte aligned, the matrix 16-byte aligned).
constexpr bool split_rows(uint32_t type) {
  return type == 2 /*Q4_0*/ || type == 8 /*Q8_0*/ || type == 20 /*IQ4_NL*/ || type == 39 /*MXFP4*/;
}

// Chunk c of a split row of n_sub 32-element sub-blocks (split_rows types): the 8 bytes (Q4_0's
// nibble order: chunk c takes the low or high nibbles of bytes 0-7 or 8-15 of its sub-block;
// Q8_0: bytes 8c..8c+7) in one aligned load, the sub-block's scale from the scales after the
// values. The same int8 values and scale as the GGUF block's (the arithmetic is unchanged).
template <uint32_t TYPE>
GRANULE_MOE_HD Chunk8 unpack8_split(const uint8_t* row, int64_t n_sub, int64_t c) {
  const int64_t sub = c / 4;
  uint32_t lo, hi;
  if constexpr (TYPE == 8) {
    load_u64_a8(row + 8 * c, lo, hi);
    return words(lo, hi, half_to_float(load_u16(row + 32 * n_sub + 2 * sub)), 0.0f);
  } else {
    const int part = static_cast<int>(c % 4);
    load_u64_a8(row + 16 * sub + 8 * (part % 2), lo, hi);
    const int shift = part >= 2 ? 4 : 0;
    lo = (lo >> shift) & 0x0F0F0F0Fu;  // elements 0-3 of the chunk, a nibble a byte
    hi = (hi >> shift) & 0x0F0F0F0Fu;  // elements 4-7
    const uint8_t* scales = row + 16 * n_sub;
    if constexpr (TYPE == 2) {
      return words(minus8(lo), minus8(hi), half_to_float(load_u16(scales + 2 * sub)), 0.0f);
    } else {
      static_assert(TYPE == 20 || TYPE == 39, "unpack8_split: not a split_rows type");
      // Nibble 2k: element k, nibble 2k + 1: element 4 + k.
      levels8<TYPE == 39>(lo | (hi << 4), lo, hi);
      return words(lo, hi,
                   TYPE == 39 ? e8m0_half(scales[sub]) : half_to_float(load_u16(scales + 2 * sub)),
                   0.0f);
    }
  }
}

// Chunk c of a row in GGUF blocks of TYPE (ggml type id; not F32/F16/BF16, not split_rows).
template <uint32_t TYPE>
GRANULE_MOE_HD Chunk8 unpack8_gguf(const uint8_t* row, int64_t c) {
  int q[8];
  if constexpr (TYPE == 3) {  // Q4_1: low nibbles 0..15, high 16..31
    const uint8_t* b = row + (c / 4) * sizeof(BlockQ4_1);
    const int part = static_cast<int>(c % 4);
    const int shift = part >= 2 ? 4 : 0, first = (part % 2) * 8;
    const uint8_t* qs = b + 4 + first;
    const uint32_t lo = (load_u32_a2(qs) >> shift) & 0x0F0F0F0Fu;
    const uint32_t hi = (load_u32_a2(qs + 4) >> shift) & 0x0F0F0F0Fu;
    return words(lo, hi, half_to_float(load_u16(b)), half_to_float(load_u16(b + 2)));
  } else if constexpr (TYPE == 6 || TYPE == 7) {  // Q5_0, Q5_1
    constexpr int kBytes = TYPE == 6 ? sizeof(BlockQ5_0) : sizeof(BlockQ5_1);
    constexpr int kQh = TYPE == 6 ? 2 : 4;
    const uint8_t* b = row + (c / 4) * kBytes;
    const int e0 = 8 * static_cast<int>(c % 4);
    const int shift = e0 >= 16 ? 4 : 0, first = e0 % 16;
    const uint32_t qh = static_cast<uint32_t>(load_u16(b + kQh)) |
                        static_cast<uint32_t>(load_u16(b + kQh + 2)) << 16;
    const uint8_t* qs = b + kQh + 4;
    for (int i = 0; i < 8; ++i)
      q[i] =
          (((qs[first + i] >> shift) & 0xF) | (((qh >> (e0 + i)) & 1) << 4)) - (TYPE == 6 ? 16 : 0);
    const float d = half_to_float(load_u16(b));
    return pack(q, d, TYPE == 6 ? 0.0f : half_to_float(load_u16(b + 2)));
  } else if constexpr (TYPE == 10 || TYPE == 11) {  // Q2_K, Q3_K
    using Block = std::conditional_t<TYPE == 10, BlockQ2_K, BlockQ3_K>;
    const Block* b = reinterpret_cast<const Block*>(row) + c / 32;
    const int e0 = static_cast<int>(c % 32) * 8;
    const int half = e0 / 128, pass = (e0 % 128) / 32, l0 = e0 % 32;
    const int sub = 8 * half + 2 * pass + l0 / 16;
    const uint8_t* qs = b->qs + 32 * half + l0;
    if constexpr (TYPE == 10) {
      const uint8_t sc = b->scales[sub];
      for (int i = 0; i < 8; ++i) q[i] = (qs[i] >> (2 * pass)) & 3;
      return pack(q, half_to_float(b->d) * (sc & 0xF), -(half_to_float(b->dmin) * (sc >> 4)));
    } else {
      const int bit = 4 * half + pass;
      for (int i = 0; i < 8; ++i)
        q[i] = ((qs[i] >> (2 * pass)) & 3) - (((b->hmask[l0 + i] >> bit) & 1) ? 0 : 4);
      return pack(q, half_to_float(b->d) * q3_k_scale(b->scales, sub), 0.0f);
    }
  } else if constexpr (TYPE == 23) {  // IQ4_XS
    const BlockIQ4_XS* b = reinterpret_cast<const BlockIQ4_XS*>(row) + c / 32;
    const int e0 = static_cast<int>(c % 32) * 8;
    const int sub = e0 / 32, l0 = e0 % 32;
    const int ls =
        ((b->scales_l[sub / 2] >> (4 * (sub % 2))) & 0xF) | (((b->scales_h >> (2 * sub)) & 3) << 4);
    // Blocks of 136 bytes, qs from byte 8: these 8 bytes are 8-byte aligned.
    const int shift = l0 >= 16 ? 4 : 0;
    uint32_t lo, hi;
    load_u64_a8(b->qs + 16 * sub + l0 % 16, lo, hi);
    levels8<false>(((lo >> shift) & 0x0F0F0F0Fu) | (((hi >> shift) & 0x0F0F0F0Fu) << 4), lo, hi);
    return words(lo, hi, half_to_float(b->d) * (ls - 32), 0.0f);
  } else if constexpr (TYPE == 12 || TYPE == 13) {  // Q4_K, Q5_K
    using Block = std::conditional_t<TYPE == 12, BlockQ4_K, BlockQ5_K>;
    const Block* b = reinterpret_cast<const Block*>(row) + c / 32;
    const int e0 = static_cast<int>(c % 32) * 8;
    const int sub = e0 / 32, l0 = e0 % 32;
    // Blocks of 144 / 176 bytes, 8-byte aligned: the header (d, dmin, the 12 scale bytes) as two
    // 8-byte loads and k_scale_min's bytes picked from its words (scales[j] is byte j % 4 of
    // word 1 + j / 4), where k_scale_min's byte loads took five loads a chunk with these bytes.
    uint32_t dm, s0, s1, s2;
    load_u64_a8(reinterpret_cast<const uint8_t*>(b), dm, s0);
    load_u64_a8(reinterpret_cast<const uint8_t*>(b) + 8, s1, s2);
    const int at = 8 * (sub % 4);
    const int b0 = static_cast<int>((s0 >> at) & 0xFF), b1 = static_cast<int>((s1 >> at) & 0xFF);
    const int b2 = static_cast<int>((s2 >> at) & 0xFF);
    const int scale = sub < 4 ? b0 & 63 : (b2 & 0x0F) | ((b0 >> 6) << 4);
    const int min = sub < 4 ? b1 & 63 : (b2 >> 4) | ((b1 >> 6) << 4);
    const int shift = (sub % 2) * 4;
    uint32_t lo, hi;
    load_u64_a8(b->qs + 32 * (sub / 2) + l0, lo, hi);
    lo = (lo >> shift) & 0x0F0F0F0Fu;
    hi = (hi >> shift) & 0x0F0F0F0Fu;
    if constexpr (TYPE == 13) {
      uint32_t qh_lo, qh_hi;
      load_u64_a8(b->qh + l0, qh_lo, qh_hi);
      lo |= ((qh_lo >> sub) & 0x01010101u) << 4;
      hi |= ((qh_hi >> sub) & 0x01010101u) << 4;
    }
    return words(lo, hi, half_to_float(static_cast<uint16_t>(dm & 0xFFFF)) * scale,
                 -(half_to_float(static_cast<uint16_t>(dm >> 16)) * min));
  } else if constexpr (TYPE == 14) {  // Q6_K
    const BlockQ6_K* b = reinterpret_cast<const BlockQ6_K*>(row) + c / 32;
    const int e0 = static_cast<int>(c % 32) * 8;
    const int half = e0 / 128, r = e0 % 128, quarter = r / 32, l0 = r % 32;
    const uint8_t* ql = b->ql + 64 * half + (quarter % 2) * 32 + l0;
    const uint8_t* qh = b->qh + 32 * half + l0;
    const int ql_shift = quarter >= 2 ? 4 : 0, qh_shift = 2 * quarter;
    // Blocks of 210 bytes: 2-byte loads.
    const uint32_t lo = minus32(((load_u32_a2(ql) >> ql_shift) & 0x0F0F0F0Fu) |
                                (((load_u32_a2(qh) >> qh_shift) & 0x03030303u) << 4));
    const uint32_t hi = minus32(((load_u32_a2(ql + 4) >> ql_shift) & 0x0F0F0F0Fu) |
                                (((load_u32_a2(qh + 4) >> qh_shift) & 0x03030303u) << 4));
    return words(lo, hi, half_to_float(b->d) * b->scales[8 * half + l0 / 16 + 2 * quarter], 0.0f);
  } else {
    static_assert(TYPE == 3, "unpack8_gguf: a split_rows type, or one without int8 chunks");
    return {};
  }
}

// Chunk c of an expert row of n_in elements as the expert kernels hold it: the split layout for
// the split_rows types, GGUF's blocks for the others.
template <uint32_t TYPE>
GRANULE_MOE_HD Chunk8 unpack8(const uint8_t* row, int n_in, int64_t c) {
  if constexpr (split_rows(TYPE))
    return unpack8_split<TYPE>(row, n_in / 32, c);
  else
    return unpack8_gguf<TYPE>(row, c);
}

}  // namespace granule::kernels::moe_unpack
