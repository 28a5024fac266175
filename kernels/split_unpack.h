// The split layout's (split_layout.h) sub-block words as the dp4a and mma kernels meet them:
// four consecutive elements of a 32-element sub-block as four int8 bytes of one word, for the
// types whose values are not plain bytes or nibbles (Q2_K, Q3_K, Q5_K, IQ4_NL, IQ4_XS, MXFP4), and
// Q4_K's plain nibbles. Word m
// (0..7) holds elements 4m..4m+3, the order of the int8 activation words. Plain C++ as well as
// CUDA, so a host test (tests/gpu/split_unpack_test.cpp) holds the bit manipulation to the
// host's decoding of the same split rows.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define GRANULE_SPLIT_HD __host__ __device__ __forceinline__
#else
#define GRANULE_SPLIT_HD inline
#endif

namespace granule::kernels::split_unpack {

// __byte_perm(a, b, sel) for selectors without the sign-replicate bit: byte k of the result is
// byte (sel >> 4k) & 7 of the eight bytes b:a.
GRANULE_SPLIT_HD uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t sel) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(a, b, sel);
#else
  const uint64_t bytes = static_cast<uint64_t>(b) << 32 | a;
  uint32_t out = 0;
  for (int k = 0; k < 4; ++k)
    out |= static_cast<uint32_t>((bytes >> (8 * ((sel >> (4 * k)) & 7))) & 0xFF) << (8 * k);
  return out;
#endif
}

// Per byte, a - b modulo 256 (__vsub4).
GRANULE_SPLIT_HD uint32_t sub_bytes(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __vsub4(a, b);
#else
  uint32_t out = 0;
  for (int k = 0; k < 4; ++k)
    out |= ((((a >> (8 * k)) & 0xFF) - ((b >> (8 * k)) & 0xFF)) & 0xFF) << (8 * k);
  return out;
#endif
}

// Four 4-bit indices (bytes of idx, each 0..15) to four int8 levels of a 16-entry table packed
// little-endian in w0..w3: entries 0-7 and 8-15 through one byte permute each, then a select
// on bit 3 of each index.
GRANULE_SPLIT_HD uint32_t levels4(uint32_t idx, uint32_t w0, uint32_t w1, uint32_t w2,
                                  uint32_t w3) {
  const uint32_t sel =
      (idx & 0x7u) | ((idx >> 4) & 0x70u) | ((idx >> 8) & 0x700u) | ((idx >> 12) & 0x7000u);
  const uint32_t low = byte_perm(w0, w1, sel), high = byte_perm(w2, w3, sel);
  const uint32_t mask = ((idx >> 3) & 0x01010101u) * 0xFFu;
  return (low & ~mask) | (high & mask);
}

// granule::kIq4nlValues and granule::kMxfp4Values (block_formats.h), packed as
// quant_blocks.cuh's iq4nl_level / mxfp4_level pack them.
template <bool MXFP4>
GRANULE_SPLIT_HD uint32_t table_levels4(uint32_t idx) {
  if constexpr (MXFP4)
    return levels4(idx, 0x03020100u, 0x0c080604u, 0xfdfeff00u, 0xf4f8fafcu);
  else
    return levels4(idx, 0xbfad9881u, 0xf6eaddcfu, 0x26190d01u, 0x71594535u);
}

// Q4_0-order nibble bytes q[0..3] (byte i: element i low, i + 16 high): word m's nibbles as
// unsigned bytes 0..15 (Q4_K's q).
GRANULE_SPLIT_HD uint32_t nibble_word(const uint32_t (&q)[4], int m) {
  return m < 4 ? q[m] & 0x0F0F0F0Fu : (q[m - 4] >> 4) & 0x0F0F0F0Fu;
}

// IQ4_NL / IQ4_XS / MXFP4: word m of a sub-block whose 16 nibble bytes are q[0..3] (Q4_0's
// order: byte i holds element i low, i + 16 high), as int8 levels.
template <bool MXFP4>
GRANULE_SPLIT_HD uint32_t nibble_levels_word(const uint32_t (&q)[4], int m) {
  return table_levels4<MXFP4>(nibble_word(q, m));
}

// Q5_K: the fifth bits of word m's elements (bit e of the sub-block's qh is element e's) as bit
// 4 of each byte. One multiply spreads the nibble of qh, bit k to bit 8k (the shifted copies at
// 0, 7, 14 and 21 never overlap, so nothing carries): fewer live values than four shifts.
GRANULE_SPLIT_HD uint32_t fifth_bits(uint32_t qh, int m) {
  return (((qh >> (4 * m)) & 0xFu) * 0x00204081u & 0x01010101u) << 4;
}

// Q5_K: word m's unsigned 5-bit values (0..31).
GRANULE_SPLIT_HD uint32_t q5_k_word(const uint32_t (&q)[4], uint32_t qh, int m) {
  return nibble_word(q, m) | fifth_bits(qh, m);
}

// Q2_K / Q3_K: the 2-bit values (0..3) of word m from the sub-block's 8 bytes w[0], w[1]
// (element e in byte e % 8 at bit 2 * (e / 8)); `half` is w[m & 1], the only word it reads
// (the mma kernels load that one).
GRANULE_SPLIT_HD uint32_t two_bit_word_of(uint32_t half, int m) {
  return (half >> (2 * (m >> 1))) & 0x03030303u;
}
GRANULE_SPLIT_HD uint32_t two_bit_word(const uint32_t (&w)[2], int m) {
  return two_bit_word_of(w[m & 1], m);
}

// Q3_K: the signed values (-4..3) of word m: the 2-bit values with the third bits qh (element
// e in byte e % 4 at bit e / 4) as bit 2, minus 4.
GRANULE_SPLIT_HD uint32_t q3_k_word_of(uint32_t half, uint32_t qh, int m) {
  return sub_bytes(two_bit_word_of(half, m) | (((qh >> m) & 0x01010101u) << 2), 0x04040404u);
}
GRANULE_SPLIT_HD uint32_t q3_k_word(const uint32_t (&w)[2], uint32_t qh, int m) {
  return q3_k_word_of(w[m & 1], qh, m);
}

}  // namespace granule::kernels::split_unpack

#undef GRANULE_SPLIT_HD
