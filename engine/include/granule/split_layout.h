// The "split" weight layout the decode kernels read: each row of a Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/
// Q2_K/Q3_K/Q4_K/Q5_K/Q6_K/IQ4_NL/IQ4_XS/MXFP4 matrix is re-laid out at upload so its quantised
// values come first, aligned and contiguous, and its scales after them. The bytes per row are
// GGUF's (plus at most 15 of padding to keep every row 16-byte aligned); only their order
// changes — except where packed scales are unpacked to bytes: Q4_K and Q5_K's twelve bytes of
// 6-bit scales and mins become eight (scale, min) byte pairs (148 / 180 bytes per 256 elements
// instead of 144 / 176), Q3_K's twelve bytes of 6-bit scales sixteen int8 (114 instead of 110),
// IQ4_XS's six bytes eight int8 (138 instead of 136): all under 4 %. GGUF blocks are
// 18/20/22/24/34/84/110/144/176/210/18/136/17 bytes, so a warp cannot read them with wide
// loads; this layout lets it.
// Plain C++ so the host repacker (engine/src/cuda/weight_split.cpp) and tests share it.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define GRANULE_HD __host__ __device__
#else
#define GRANULE_HD
#endif

namespace granule::kernels::split {

// Per row, with n = cols / 32 sub-blocks of 32 elements (and n / 8 super-blocks for the K types):
//   Q4_0  [qs: n x 16 B][d: n x f16]           qs byte i of sub-block j: element i (low
//                                              nibble), element i + 16 (high) — as GGUF
//   Q4_1  [qs: n x 16 B][d, m: n x 2 f16]
//   Q5_0  [qs: n x 16 B][qh: n x u32][d: n x f16]  qs as Q4_0; bit e of qh is element e's
//                                              fifth bit
//   Q5_1  [qs: n x 16 B][qh: u32, d: f16, m: f16 per sub-block, 8 B each]
//   Q8_0  [qs: n x 32 B][d: n x f16]
//   Q6_K  [ql: n x 16 B][qh: n x 8 B][scales: n x 2 int8][d: n / 8 x f16]
//         6-bit q of element e of sub-block j (value = d * scale[e / 16] * (q - 32)):
//         low 4 bits in ql byte e % 16 (low nibble for e < 16, high for e >= 16), high 2
//         bits in qh byte e % 8 at bit 2 * (e / 8); scales[2j + h] covers elements 16h..16h+15.
//   Q4_K  [qs: n x 16 B][sc, m: n x 2 u8][d, dmin: n / 8 x 2 f16]
//         qs as Q4_0 (GGUF keeps sub-blocks 2c and 2c + 1 in the low / high nibbles of the
//         same 32 bytes; here each sub-block has its own 16); sc and m are the decoded 6-bit
//         scale and min; value = d * sc * q - dmin * m with q the nibble (0..15).
//   Q5_K  [qs: n x 16 B][qh: n x u32][sc, m: n x 2 u8][d, dmin: n / 8 x 2 f16]
//         as Q4_K with bit e of qh the fifth bit of element e: q = nibble | bit << 4 (0..31).
//   Q2_K  [qs: n x 8 B][sc: n x 2 u8][d, dmin: n / 8 x 2 f16]
//         2-bit q of element e of sub-block j in qs byte e % 8 at bit 2 * (e / 8) (so bits
//         2k of the low / high word hold elements 8k..8k+3 / 8k+4..8k+7); sc[2j + h] is GGUF's
//         byte for elements 16h..16h+15 (scale in the low nibble, min in the high);
//         value = d * (sc & 15) * q - dmin * (sc >> 4).
//   Q3_K  [ql: n x 8 B][qh: n x 4 B][sc: n x 2 int8][d: n / 8 x f16]
//         ql as Q2_K's qs; the third bit of element e in qh byte e % 4 at bit e / 4; sc the
//         decoded scale minus 32; value = d * sc[2j + e / 16] * ((low | bit << 2) - 4).
//   IQ4_NL [qs: n x 16 B][d: n x f16]          qs as Q4_0; value = d * kIq4nlValues[nibble]
//   IQ4_XS [qs: n x 16 B][sc: n x int8][d: n / 8 x f16]
//         qs as Q4_0; sc the sub-block's 6-bit scale minus 32; value = d * sc * kIq4nlValues[q].
//   MXFP4 [qs: n x 16 B][e: n x u8]            qs as Q4_0; value = e8m0_half(e) *
//                                              kMxfp4Values[nibble]
constexpr uint32_t kTypeQ4_0 = 2, kTypeQ4_1 = 3, kTypeQ5_0 = 6, kTypeQ5_1 = 7, kTypeQ8_0 = 8,
                   kTypeQ2_K = 10, kTypeQ3_K = 11, kTypeQ4_K = 12, kTypeQ5_K = 13, kTypeQ6_K = 14,
                   kTypeIQ4_NL = 20, kTypeIQ4_XS = 23, kTypeMXFP4 = 39;

GRANULE_HD constexpr bool supports(uint32_t type) {
  return type == kTypeQ4_0 || type == kTypeQ4_1 || type == kTypeQ5_0 || type == kTypeQ5_1 ||
         type == kTypeQ8_0 || type == kTypeQ2_K || type == kTypeQ3_K || type == kTypeQ4_K ||
         type == kTypeQ5_K || type == kTypeQ6_K || type == kTypeIQ4_NL || type == kTypeIQ4_XS ||
         type == kTypeMXFP4;
}
// The types the f16 tensor-core products read (kernels/matvec_f16mma.cu is built for exactly
// these, and the CPU oracle's f16 rule asks this too): every split type but Q5_0 and Q5_1.
GRANULE_HD constexpr bool f16mma_reads(uint32_t type) {
  return supports(type) && type != kTypeQ5_0 && type != kTypeQ5_1;
}
// The types whose GGUF blocks hold 256 elements (super-blocks of 8 sub-blocks).
GRANULE_HD constexpr bool is_k_type(uint32_t type) {
  return type == kTypeQ2_K || type == kTypeQ3_K || type == kTypeQ4_K || type == kTypeQ5_K ||
         type == kTypeQ6_K || type == kTypeIQ4_XS;
}
// Elements a type's GGUF block holds (the row length must be a multiple).
GRANULE_HD constexpr int64_t block_elements(uint32_t type) { return is_k_type(type) ? 256 : 32; }
// Bytes of quantised values per 32-element sub-block, in the first region (Q2_K, Q3_K: the
// two low bits; Q3_K's third bits follow in a region of their own).
GRANULE_HD constexpr int64_t quant_bytes(uint32_t type) {
  return type == kTypeQ8_0 ? 32 : type == kTypeQ2_K || type == kTypeQ3_K ? 8 : 16;
}
// Bytes of a GGUF row of `cols` elements (the repacker's input).
GRANULE_HD constexpr int64_t gguf_row_bytes(uint32_t type, int64_t cols) {
  const int64_t n = cols / 32;
  return type == kTypeQ4_0     ? n * 18
         : type == kTypeQ4_1   ? n * 20
         : type == kTypeQ5_0   ? n * 22
         : type == kTypeQ5_1   ? n * 24
         : type == kTypeQ8_0   ? n * 34
         : type == kTypeQ4_K   ? n / 8 * 144
         : type == kTypeQ5_K   ? n / 8 * 176
         : type == kTypeQ6_K   ? n / 8 * 210
         : type == kTypeQ2_K   ? n / 8 * 84
         : type == kTypeQ3_K   ? n / 8 * 110
         : type == kTypeIQ4_NL ? n * 18
         : type == kTypeIQ4_XS ? n / 8 * 136
         : type == kTypeMXFP4  ? n * 17
                               : 0;
}
// Payload bytes of a split row of `cols` elements: GGUF's row size, plus 4 per super-block
// for Q4_K, Q5_K and Q3_K (the unpacked scales and mins) and 2 for IQ4_XS.
GRANULE_HD constexpr int64_t row_payload_bytes(uint32_t type, int64_t cols) {
  return gguf_row_bytes(type, cols) + (type == kTypeQ4_K || type == kTypeQ5_K || type == kTypeQ3_K
                                           ? cols / 256 * 4
                                       : type == kTypeIQ4_XS ? cols / 256 * 2
                                                             : 0);
}
// Distance between rows: the payload rounded up to 16 bytes.
GRANULE_HD constexpr int64_t row_stride(uint32_t type, int64_t cols) {
  return (row_payload_bytes(type, cols) + 15) / 16 * 16;
}
// Offsets within a row of n sub-blocks (Q5_0/Q5_1: where qh starts; Q4_K/Q5_K: the (sc, m)
// pairs).
// Q2_K/Q3_K/IQ4_XS/MXFP4: the per-sub-block scales; IQ4_NL: d.
GRANULE_HD constexpr int64_t scales_offset(uint32_t type, int64_t n) {
  return type == kTypeQ6_K   ? n * 24
         : type == kTypeQ5_K ? n * 20
         : type == kTypeQ3_K ? n * 12
                             : n * quant_bytes(type);
}
// Q4_K/Q5_K: where the super-blocks' (d, dmin) pairs start; Q5_K: where qh starts.
GRANULE_HD constexpr int64_t kquant_d_offset(uint32_t type, int64_t n) {
  return type == kTypeQ5_K ? n * 22 : n * 18;
}
GRANULE_HD constexpr int64_t q5k_qh_offset(int64_t n) { return n * 16; }
GRANULE_HD constexpr int64_t q6k_qh_offset(int64_t n) { return n * 16; }
GRANULE_HD constexpr int64_t q6k_d_offset(int64_t n) { return n * 26; }
GRANULE_HD constexpr int64_t q5_0_d_offset(int64_t n) { return n * 20; }
// Q2_K: the super-blocks' (d, dmin) pairs; Q3_K: the third bits and the super-blocks' d;
// IQ4_XS: the super-blocks' d.
GRANULE_HD constexpr int64_t q2k_d_offset(int64_t n) { return n * 10; }
GRANULE_HD constexpr int64_t q3k_qh_offset(int64_t n) { return n * 8; }
GRANULE_HD constexpr int64_t q3k_d_offset(int64_t n) { return n * 14; }
GRANULE_HD constexpr int64_t iq4xs_d_offset(int64_t n) { return n * 17; }

}  // namespace granule::kernels::split

#undef GRANULE_HD
