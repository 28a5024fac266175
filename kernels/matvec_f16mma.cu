// Batched products of split-layout Q4_0/Q4_1/Q8_0/Q2_K/Q3_K/Q4_K/Q5_K/Q6_K/IQ4_NL/IQ4_XS/MXFP4
// weights (split_layout.h) with
// f16 activations on f16 tensor cores: mma.sync m16n8k16 with f32 accumulation. The weights are
// dequantised to f16 in registers, their scale applied there (one f16 rounding per weight), so the
// mma accumulates straight into f32 with no per-sub-block epilogue — the Marlin idea. The int8
// kernel (matvec_mma.cu) instead scales every sub-block's int32 result by its weight and
// activation scales: ~12 FP instructions per mma, which makes it issue-bound at 16-64 columns.
//
// The pipeline is matvec_mma.cu's warp-pipelined kernel (mma_tiles.cuh): a block's W warps own
// the same weight rows (MT 16-row m-tiles: 32 or 64 rows; SwiGLU: half gate, half up) and split
// the sub-blocks (warp w takes stages w, w + W, ... of kKs sub-blocks); every warp streams its
// stages through a private ring (weights, weight scales and the f16 activations of those
// sub-blocks for all 8 * NT columns of the block's column tile), waits with cp.async.wait_group +
// __syncwarp only, and the W partial sums meet once at the end in a fixed order. Column tiles of
// the same rows are adjacent in blockIdx.x, so the second tile of 64 columns finds the weights
// in L2.
//
// The SwiGLU gate+up product at 17-64 columns takes the shared-activation shape
// (f16mma_gate_up_kernel): the block's warps form WK groups of WR warps; the WR warps of a group
// own different rows and read one copy of each stage's activations, which the whole group fills
// (a named barrier per stage), so an activation byte from L2 serves WR warps' rows (H200, 8B
// Q4_0, 32 columns: 49.6 us against 57.9 for the one-warp rings). The plain products of an 8B
// model (4,096 rows) have too few row blocks to share activations (kernels/README.md).
//
// k permutation: inside one mma the k order is free as long as A and B agree. Lane (g, t)
// gets word t (bytes 4t..4t+3) of rows g and g + 8 of a sub-block from ldmatrix; byte i holds
// element i (low nibble) and i + 16 (high). k-step 0 of the sub-block takes the low nibbles:
// logical k 2t, 2t + 1 -> elements 4t, 4t + 1 (a0, a1), logical 2t + 8, 2t + 9 -> elements
// 4t + 2, 4t + 3 (a2, a3); k-step 1 the high nibbles, elements 16 + 4t ... The matching B
// fragment of column g is one 8-byte shared load of elements 4t..4t + 3 (b0, b1) — and
// 16 + 4t.. for k-step 1. Q4_K, Q5_K and Q6_K keep Q4's nibble order (their fifth, or fifth and
// sixth, bits come from their own region, one word per row and sub-block). Q8_0's 32-byte
// sub-block rows are two 16-byte halves: one ldmatrix.x4 per m-tile gives word t of both halves
// of rows g and g + 8, elements 4t..4t + 3 and 16 + 4t.., so the k order and the B fragments
// are Q4's.
// Q2_K and Q3_K keep the same element -> register map with 8 bytes per sub-block: element e's
// two bits sit in byte e % 8 at bit 2 (e / 8), so word t % 2 of the sub-block shifted right by
// 2 (t / 2) holds elements 4t..4t + 3 in bits 0-1 of its bytes and 16 + 4t.. in bits 4-5 — the
// low and high "nibbles" of Q4's word t (Q6_K's high bits are laid out alike and read alike).
// Q3_K's third bits of those elements are bits 0 and 4 of its qh word shifted right by t. So
// k-step 0 holds elements 0..15 (the first 16-element scale), k-step 1 16..31 (the second), as
// Q6_K's dlo and dhi, and the B fragments are Q4's.
//
// Numerics: each weight is rounded to f16 once, w16 = f16_rn((q - 8) d) (Q4_0), f16_rn(q d + m)
// (Q4_1), f16_rn(q d) (Q8_0), f16_rn(level[q] d) (IQ4_NL, MXFP4: the nibble's int8 level, exact;
// MXFP4's d = 2^(e - 128) as an f16 power of two, exact for e 104..143, 0 below: real scales lie
// far inside); the K types' and IQ4_XS's scales are rounded to f16 first (their products with
// the f16 super-block scales): f16_rn((q - 32) f16(d sc)) (Q6_K), f16_rn(q f16(d sc) -
// f16(dmin m)) (Q4_K, Q5_K, and Q2_K with its 4-bit sc and m of each 16 elements),
// f16_rn((q - 4) f16(d sc)) (Q3_K, q 0..7, sc -32..31), f16_rn(level[q] f16(d sc)) (IQ4_XS) —
// the integer parts are exact in f16. Then times the f16 activation (exact in the mma),
// accumulated in f32 by the tensor core and then across warps in f32, in a fixed order. Range:
// |q d| <= 128 |d| overflows f16 only when |d| > 511 (Q8_0, IQ4_NL; a weight past 65,504),
// |(q - 32) d sc| only past 65,504 too; real weights are far below.
#include "granule/block_formats.h"
#include "granule/split_layout.h"
#include "matvec_f16mma.cuh"
#include "mma_tiles.cuh"

namespace granule::kernels {
namespace {

using mma::Tasks;

constexpr int kKs = 2;                  // 32-element sub-blocks per pipeline stage
// Shared memory is sized to leave the L1 room: the scale (and Q5_K/Q6_K high-bit) copies are 4-
// to 8-byte cp.async reads of 32 rows whose sectors the next 4-16 stages read again, and they hit
// in L1 only while it keeps them. Two blocks past 196 KiB take the 228 KiB carveout, which leaves
// L1 about 28 KiB: ncu on an H100 put Q5_K's gate+up L1 hit rate at 6 % there against Q4_K's 34 %
// at 196 KiB, and its 32-column product at 126 us against 63. So a warp's ring gets 25 KiB (Q5_K's
// 64-row rings: 3 stages, not 4) and the gate+up rings fit two blocks in 196 KiB (Q5_K and Q6_K:
// 3 stages, not 4): Q5_K's 8B gate+up at 16 and 32 columns 96.5 and 117.5 us -> 66.7 and 78.6,
// Q6_K's at 32 89.9 -> 68.5, the other types within 1 us (H100, one call).
constexpr int kWarpBudget = 25 * 1024;  // ring bytes per warp
constexpr int kSmSharedKeepingL1 = 196 * 1024;  // per SM: the carveout below 228 KiB

// The types whose stage scales are two 4-byte copies per row (the sub-blocks' scales, and the
// super-block's f16 pair: Q2_K/Q4_K/Q5_K (d, dmin); Q3_K/Q6_K the aligned pair of d holding the
// stage's).
template <uint32_t TYPE>
constexpr bool kKType =
    TYPE == kQ2_K || TYPE == kQ3_K || TYPE == kQ4_K || TYPE == kQ5_K || TYPE == kQ6_K;
// The types of 2-bit values, 8 bytes per sub-block (Q3_K's third bits in a region of their own).
template <uint32_t TYPE>
constexpr bool kTwoBit = TYPE == kQ2_K || TYPE == kQ3_K;

// Shared-memory layout of one stage of a warp's ring, and the block's shape.
template <uint32_t TYPE, int NT, int MT, bool GATE_UP>
struct Plan {
  static constexpr int kMatrices = GATE_UP ? 2 : 1;
  static constexpr int kWeightRows = 16 * MT;                   // per warp (and block)
  static constexpr int kRows = kWeightRows / kMatrices;         // output rows per block
  static constexpr int kTilesPerMatrix = MT / kMatrices;        // m-tiles of gate (or of W)
  static constexpr int kColumns = 8 * NT;                       // per column tile
  // Per sub-block (Q6_K: ql; Q2_K/Q3_K: the 2-bit values, a stage row one 16-byte copy).
  static constexpr int kQuantBytes = TYPE == kQ8_0 ? 32 : kTwoBit<TYPE> ? 8 : 16;
  static constexpr int kChunksPerRow = kKs * kQuantBytes / 16;  // 16-byte copies per stage row
  static constexpr int kScaleBytes = TYPE == kQ4_1 ? 4 : TYPE == kMXFP4 ? 1 : 2;  // d (and m), e
  // per sub-block; K: sc
  // Weight rows padded by 16 bytes: ldmatrix's 8 row addresses (stride 48 or 80) land in 8
  // different 16-byte bank groups. Q2_K/Q3_K's 16-byte rows stay unpadded: their lanes read
  // 4-byte words (no ldmatrix), lane (g, t) word 2u + t % 2 of row g (+ 8 h, + 16 m), so one
  // load's 8 rows are 8 x 16 contiguous bytes, banks 4g + 2u + t % 2: 16 distinct words in 16
  // distinct banks (lanes t and t + 2 share theirs, a broadcast); a stride of 32 would put rows
  // g and g + 4 in the same banks.
  static constexpr int kWeightRow = kTwoBit<TYPE> ? kKs * kQuantBytes : kKs * kQuantBytes + 16;
  // 4 or 8 bytes; MXFP4: the 4-byte aligned word holding the stage's two e bytes; IQ4_XS: that
  // of its two int8 sc, then the aligned pair of super-block d holding the stage's
  static constexpr int kScaleRow = kKType<TYPE> || TYPE == kIQ4_XS ? 8
                                   : TYPE == kMXFP4                ? 4
                                                                   : kKs * kScaleBytes;
  // The fifth (Q5_K: a u32 per sub-block), fifth and sixth (Q6_K: 8 bytes) or third (Q3_K: a
  // u32 per sub-block) bits.
  static constexpr int kHighRow = TYPE == kQ6_K                    ? kKs * 8
                                  : TYPE == kQ5_K || TYPE == kQ3_K ? kKs * 4
                                                                   : 0;
  // Activation rows (one per column, kKs * 32 f16) padded by 32 bytes: stride = 32 mod 128,
  // so the 8-byte B loads of 4 columns x 4 lanes (a half warp) cover 32 distinct banks.
  static constexpr int kActRow = kKs * 64 + 32;
  static constexpr int kScaleOffset = kWeightRows * kWeightRow;
  static constexpr int kHighOffset = kScaleOffset + kWeightRows * kScaleRow;
  static constexpr int kActOffset = kHighOffset + kWeightRows * kHighRow;
  static constexpr int kStageBytes = kActOffset + kColumns * kActRow;
  static constexpr int kStagesFit = kWarpBudget / kStageBytes;
  static constexpr int kStages = kStagesFit > 6 ? 6 : kStagesFit < 3 ? 3 : kStagesFit;
  static constexpr int kWarpBytes = kStages * kStageBytes;
  static constexpr int kAccumulators = MT * NT * 4;
  // Per lane and stage: 16-byte weight chunks (kChunksPerRow per row), scale (and high-bit)
  // copies (one row each), 16-byte activation chunks (4 kKs per column).
  static constexpr int kWeightCopies = kWeightRows * kChunksPerRow / kWarpSize;
  static constexpr int kScaleCopies = kWeightRows / kWarpSize;
  static constexpr int kActChunksPerColumn = kKs * 4;
  static constexpr int kActCopies = kColumns * kActChunksPerColumn / kWarpSize;
  static_assert(MT == 2 || MT == 4, "one ldmatrix.x4 reads 32 weight rows");
  static_assert(kScaleOffset % 16 == 0 && kHighOffset % 16 == 0 && kActOffset % 16 == 0 &&
                    kStageBytes % 16 == 0 && kWeightRow % 16 == 0 && kActRow % 16 == 0,
                "cp.async and ldmatrix want 16-byte aligned rows");
  static_assert(kActRow % 128 == 32, "conflict-free 8-byte activation loads");
  static_assert(kWeightCopies * kWarpSize == kWeightRows * kChunksPerRow && kScaleCopies >= 1 &&
                    kActCopies >= 1 && kActCopies * kWarpSize == kColumns * kActChunksPerColumn,
                "every lane copies the same number of chunks");
  static_assert(kKs == 2 && (kScaleRow == 4 || kScaleRow == 8),
                "a stage's scales of a row are one 4- or 8-byte copy (K types: two 4-byte)");
};

template <uint32_t TYPE, int NT, int MT, bool GATE_UP, int W>
constexpr int kSharedBytes = [] {
  using P = Plan<TYPE, NT, MT, GATE_UP>;
  constexpr int ring = W * P::kWarpBytes;
  constexpr int reduce = (W - 1) * P::kAccumulators * kWarpSize * 4;
  static_assert(reduce <= ring, "the partial sums reuse the rings");
  static_assert(ring <= mma::kMaxBlockShared, "the block's rings fit an H100/H200 block");
  return ring;
}();

// ---------------------------------------------------------------------------------------------
// Dequantisation of the types past Q4_0/Q4_1 (mma_tiles.cuh has those), each weight rounded to
// f16 once from exact f16 integers and f16 scales.

constexpr uint32_t kHalf2_1024 = mma::kHalf2_1024;
constexpr uint32_t kHalf2_1056 = 0x64206420u;  // 1024 + 32: Q6_K's q - 32
constexpr uint32_t kHalf2_1152 = 0x64806480u;  // 1024 + 128: an int8 made unsigned
constexpr uint32_t kHalf2_1028 = 0x64046404u;  // 1024 + 4: Q3_K's q - 4
constexpr uint32_t kHalf2_Minus68 = 0xD440D440u;  // -64 - 4: the same from 1024 + 16 q
constexpr uint32_t kSignHigh = 0x80000000u;    // the high half's sign

// Bytes 0, 1 (SEL 0x4140) or 2, 3 (SEL 0x4342) of v as the f16 pair (1024 + b, 1024 + b'), exact
// (0x64 is f16 1024's high byte, whose ulp is 1).
template <uint32_t SEL>
__device__ __forceinline__ __half2 biased_pair(uint32_t v) {
  return mma::as_half2(__byte_perm(v, 0x64646464u, SEL));
}
// The pairs of bytes 0, 1 and 2, 3 of v minus BIAS (exact: f16 integers), times d (one rounding).
template <uint32_t BIAS>
__device__ __forceinline__ void scaled_pairs(uint32_t v, __half2 d, uint32_t (&o)[2]) {
  o[0] = mma::as_bits(__hmul2_rn(__hsub2_rn(biased_pair<0x4140>(v), mma::as_half2(BIAS)), d));
  o[1] = mma::as_bits(__hmul2_rn(__hsub2_rn(biased_pair<0x4342>(v), mma::as_half2(BIAS)), d));
}

// Q6_K: one ql word (nibbles as Q4's: elements e..e+3 low, 16 + e.. high) and the row's qh word
// shifted so that the low elements' two high bits are bits 0-1 of each byte and the high
// elements' bits 4-5: f16((q - 32) ds) with ds = f16(d sc), dlo for the low elements (k-step
// 0), dhi for the high ones.
__device__ __forceinline__ void q6_f16_pairs(uint32_t w, uint32_t h, __half2 dlo, __half2 dhi,
                                             uint32_t (&lo)[2], uint32_t (&hi)[2]) {
  const uint32_t ql = (w & 0x0F0F0F0Fu) | ((h << 4) & 0x30303030u);
  const uint32_t qh = ((w >> 4) & 0x0F0F0F0Fu) | (h & 0x30303030u);
  scaled_pairs<kHalf2_1056>(ql, dlo, lo);
  scaled_pairs<kHalf2_1056>(qh, dhi, hi);
}

// Q5_K: Q4_1's form, f16(q ds + mn) (ds = f16(d sc), mn = -f16(dmin m)), with q = nibble |
// fifth bit << 4 (0..31, exact); h = the sub-block's qh word >> 4t: bits 0-3 the fifth bits of
// the low elements e..e+3, bits 16-19 those of the high ones.
__device__ __forceinline__ void q5_f16_pairs(uint32_t w, uint32_t h, __half2 d, __half2 mn,
                                             uint32_t (&lo)[2], uint32_t (&hi)[2]) {
  // Each pair's two fifth bits by one multiply: bit b of the 2-bit field lands at b + each of
  // the constant's two shifts (products of distinct bits never overlap: no carries), and the
  // mask keeps bit 0's low place and bit 1's high one; then the f16 1024s in the same LOP3.
  using mma::and_or;
  constexpr uint32_t one = mma::kHalf2_1024;
  const uint32_t hh = h >> 16;
  const uint32_t base[4] = {
      and_or<0x100010u>((h & 0x3u) * 0x80010u, one),     // bits 0, 1 to 4, 20: + 16
      and_or<0x100010u>((h & 0xCu) * 0x20004u, one),     // bits 2, 3
      and_or<0x1000100u>((hh & 0x3u) * 0x800100u, one),  // bits 16, 17 to 8, 24: + 256 (16 x 16)
      and_or<0x1000100u>((hh & 0xCu) * 0x200040u, one)}; // bits 18, 19
  uint32_t o[4];
  mma::unpack_nibbles(w, o, base);  // (1024 + q) pairs (e, e+1), (e+2, e+3); (1024 + 16 q) high
  mma::min_f16_pairs(o, d, mn, d, mn, lo, hi);
}

// Q2_K: w = the sub-block's word t % 2 >> 2 (t / 2) (bits 0-1 of byte i: element 4t + i's q,
// bits 4-5: element 16 + 4t + i's; the other bits belong to lanes t ^ 2); f16(q ds + mn) with
// (ds, mn) = (f16(d sc), -f16(dmin m)) of elements 0-15 (dm_lo, k-step 0) and 16-31 (dm_hi).
// unpack_nibbles' pairs with 2-bit masks: (1024 + q) and (1024 + 16 q), exact.
__device__ __forceinline__ void q2_f16_pairs(uint32_t w, __half2 dm_lo, __half2 dm_hi,
                                             uint32_t (&lo)[2], uint32_t (&hi)[2]) {
  uint32_t o[4];
  mma::unpack_nibbles<0x00030003u>(w, o);
  mma::min_f16_pairs(o, __low2half2(dm_lo), __high2half2(dm_lo), __low2half2(dm_hi),
                     __high2half2(dm_hi), lo, hi);
}

// Q3_K: w as Q2_K's, h = the sub-block's qh word >> t (bit 0 of byte i: element 4t + i's third
// bit, bit 4: element 16 + 4t + i's): q = low | third << 2 (0..7) in Q4's nibble places, then
// Q4_0's form with 4 for 8: f16((q - 4) ds), dlo for elements 0-15 (k-step 0), dhi for 16-31.
__device__ __forceinline__ void q3_f16_pairs(uint32_t w, uint32_t h, __half2 dlo, __half2 dhi,
                                             uint32_t (&lo)[2], uint32_t (&hi)[2]) {
  uint32_t o[4];
  mma::unpack_nibbles((w & 0x33333333u) | ((h << 2) & 0x44444444u), o);
  mma::offset_f16_pairs<kHalf2_1028, kHalf2_Minus68>(o, dlo, dhi, lo, hi);  // q - 4
}

// IQ4_NL / IQ4_XS / MXFP4: word w of a sub-block (Q4_0's nibble order: nibbles 2k and 2k + 1 are
// elements 4t + k and 4t + 16 + k) through the 16-entry table of levels, f16(level d). The table
// holds level + 128 (split_unpack.h's int8 levels made unsigned, as Q8_0's bytes are biased), so
// the pairs are exact f16 integers 1024 + level + 128 before the one rounding. Four nibbles at a
// time, bit 3 cleared, are their own byte-permute selectors, in the order they lie in w: entries
// 0-7 and 8-15 through one permute each; then each byte comes from the second table where its
// nibble has bit 3, by a mask that a fourth permute makes in prmt's sign mode (selector bit 3:
// the selected byte's top bit in all 8) from w and w << 4, whose bytes' top bits are the
// nibbles' bits 3 — one shift a word and one select a half, where a third permute with
// 0x3210 | (s >> 1 & 0x4444) as its selector took a shift and two masks a half. The bytes come
// out as (4t + k, 4t + 16 + k, 4t + k + 1, 4t + 16 + k + 1), so the pairs take bytes 0, 2
// (k-step 0) and 1, 3 (k-step 1): no shifts and masks to gather the elements first (14
// instructions a word fewer than a table lookup per element order).
template <bool MXFP4>
constexpr uint32_t biased_levels(int k) {  // entries 4k..4k + 3 + 128, little-endian
  const int8_t* levels = MXFP4 ? kMxfp4Values : kIq4nlValues;
  uint32_t word = 0;
  for (int b = 0; b < 4; ++b)
    word |= static_cast<uint32_t>(static_cast<uint8_t>(levels[4 * k + b] + 128)) << (8 * b);
  return word;
}
template <bool MXFP4>
__device__ __forceinline__ void level_f16_pairs(uint32_t w, __half2 d, uint32_t (&lo)[2],
                                                uint32_t (&hi)[2]) {
  constexpr uint32_t t0 = biased_levels<MXFP4>(0), t1 = biased_levels<MXFP4>(1),
                     t2 = biased_levels<MXFP4>(2), t3 = biased_levels<MXFP4>(3);
  const uint32_t index = w & 0x77777777u, w4 = w << 4;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    // Nibbles 4i..4i + 3: elements 4t + 2i, + 16, 4t + 2i + 1, + 16.
    const uint32_t s = index >> (16 * i);
    const uint32_t low = mma::prmt(t0, t1, s), high = mma::prmt(t2, t3, s);
    // Byte j 0xFF where nibble 4i + j has bit 3: the top bit of byte 2i + j / 2 of w4 (j even)
    // or of w (j odd).
    const uint32_t second = mma::prmt(w, w4, i == 0 ? 0x9D8Cu : 0xBFAEu);
    const uint32_t u = (low & ~second) | (high & second);
    lo[i] = mma::as_bits(__hmul2_rn(__hsub2_rn(biased_pair<0x4240>(u), mma::as_half2(kHalf2_1152)), d));
    hi[i] = mma::as_bits(__hmul2_rn(__hsub2_rn(biased_pair<0x4341>(u), mma::as_half2(kHalf2_1152)), d));
  }
}

// MXFP4's scale 2^(e - 128) (ggml_e8m0_to_fp32_half) as f16 bits: a normal power of two for
// e 114..143, a subnormal one for 104..113, 0 below, infinity above.
__device__ __forceinline__ uint32_t e8m0_half_f16(uint32_t e) {
  const int k = static_cast<int>(e) - 128;
  return k > 15     ? 0x7C00u
         : k >= -14 ? static_cast<uint32_t>(k + 15) << 10
         : k >= -24 ? 1u << (k + 24)
                    : 0u;
}

// One pipeline stage of one warp: kKs sub-blocks (from `first`, of n per row) of the warp's
// kWeightRows weight rows (at `weights`, kWeightRow bytes apart; their scales at `scales`,
// kScaleRow apart; Q3_K/Q5_K/Q6_K's high bits at `high`, kHighRow apart) times the column
// tile's activations (at `act`, kActRow apart), into acc.
template <class P, uint32_t TYPE, int NT, int MT>
__device__ __forceinline__ void multiply_stage(float (&acc)[MT][NT][4], const uint8_t* weights,
                                               const uint8_t* scales, const uint8_t* high,
                                               const uint8_t* act, int first, int n, int lane) {
  const int g = lane / 4, t = lane % 4;  // the mma fragments' group and thread in group
  // The stage's scales of rows m * 16 + g + 8 h, as f16 pairs: Q4_0/Q8_0 [0] = (d of sub-block
  // 0, of 1); Q4_1 [u] = (d, m) of sub-block u; Q4_K/Q5_K [u] = (f16(d sc), -f16(dmin m)) of
  // sub-block u (Q4_1's form); Q6_K/Q3_K [u] = f16(d sc) of sub-block u's elements 0-15, 16-31;
  // Q2_K [2u + k] = (f16(d sc), -f16(dmin m)) of sub-block u's elements 16k..16k + 15.
  constexpr int kScaleWords = TYPE == kQ2_K ? 4 : 2;
  uint32_t scale[MT][2][kScaleWords];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint8_t* p = scales + (m * 16 + g + 8 * h) * P::kScaleRow;
      if constexpr (TYPE == kQ4_1) {
        const uint2 v = *reinterpret_cast<const uint2*>(p);
        scale[m][h][0] = v.x;
        scale[m][h][1] = v.y;
      } else if constexpr (TYPE == kQ4_0 || TYPE == kQ8_0 || TYPE == kIQ4_NL) {
        scale[m][h][0] = *reinterpret_cast<const uint32_t*>(p);
        scale[m][h][1] = 0;  // unused
      } else if constexpr (TYPE == kIQ4_XS) {
        // v.x: the aligned word of int8 sc holding sub-blocks first, first + 1 (first is even);
        // v.y: the f16 d of super-blocks 2i, 2i + 1 with the stage's (first / 8) among them. As
        // Q4_0's pair: (f16(d sc) of sub-block 0, of 1).
        const uint2 v = *reinterpret_cast<const uint2*>(p);
        const __half2 dd = mma::as_half2(v.y);
        const __half2 d = (first / 8) % 2 == 0 ? __low2half2(dd) : __high2half2(dd);
        uint32_t ds[2];
        scaled_pairs<kHalf2_1152>((v.x >> (8 * (first % 4))) ^ 0x80808080u, d, ds);
        scale[m][h][0] = ds[0];
        scale[m][h][1] = 0;  // unused
      } else if constexpr (TYPE == kMXFP4) {
        // The aligned word of e bytes holding sub-blocks first, first + 1 (first is even): as
        // Q4_0's pair, (d of sub-block 0, of 1) in f16.
        const uint32_t e = *reinterpret_cast<const uint32_t*>(p) >> (8 * (first % 4));
        scale[m][h][0] = e8m0_half_f16(e & 0xFFu) | e8m0_half_f16((e >> 8) & 0xFFu) << 16;
        scale[m][h][1] = 0;  // unused
      } else if constexpr (TYPE == kQ6_K || TYPE == kQ3_K) {
        // v.x: the int8 scales of sub-blocks first, first + 1 (two each); v.y: the f16 d of
        // super-blocks 2i, 2i + 1 with the stage's (first / 8) among them.
        const uint2 v = *reinterpret_cast<const uint2*>(p);
        const __half2 dd = mma::as_half2(v.y);
        const __half2 d = (first / 8) % 2 == 0 ? __low2half2(dd) : __high2half2(dd);
        uint32_t ds[2];
        scaled_pairs<kHalf2_1152>(v.x ^ 0x80808080u, d, ds);  // sc + 128 - 128, times d
        scale[m][h][0] = ds[0];
        scale[m][h][1] = ds[1];
      } else if constexpr (TYPE == kQ2_K) {
        // v.x: GGUF's bytes of sub-blocks first, first + 1 (elements 0-15, 16-31 each; sc in
        // the low nibble, m in the high); v.y: the super-block's (d, dmin). The nibbles
        // interleaved as Q4_K's (sc, m) byte pairs, then Q4_K's (f16(d sc), -f16(dmin m)).
        const uint2 v = *reinterpret_cast<const uint2*>(p);
        const uint32_t sc = v.x & 0x0F0F0F0Fu, mn = (v.x >> 4) & 0x0F0F0F0Fu;
        const __half2 d = mma::as_half2(v.y ^ kSignHigh);  // (d, -dmin)
        uint32_t dm[2];
        scaled_pairs<kHalf2_1024>(__byte_perm(sc, mn, 0x5140), d, dm);  // bytes 0, 1
        scale[m][h][0] = dm[0];
        scale[m][h][1] = dm[1];
        scaled_pairs<kHalf2_1024>(__byte_perm(sc, mn, 0x7362), d, dm);  // bytes 2, 3
        scale[m][h][2] = dm[0];
        scale[m][h][3] = dm[1];
      } else {  // Q4_K, Q5_K: v.x (sc, m) of sub-blocks first, first + 1; v.y (d, dmin)
        const uint2 v = *reinterpret_cast<const uint2*>(p);
        uint32_t dm[2];
        scaled_pairs<kHalf2_1024>(v.x, mma::as_half2(v.y ^ kSignHigh), dm);
        scale[m][h][0] = dm[0];
        scale[m][h][1] = dm[1];
      }
    }
#pragma unroll
  for (int u = 0; u < kKs; ++u) {
    if (first + u >= n) break;  // warp-uniform: past the row's end
    // Activation fragments of every n-tile: column g, elements 4t..4t + 3 (k-step 0) and
    // 16 + 4t.. (k-step 1) of sub-block u.
    uint32_t b[NT][2][2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const uint8_t* x = act + (nt * 8 + g) * P::kActRow + u * 64 + 8 * t;
      const uint2 k0 = *reinterpret_cast<const uint2*>(x);
      const uint2 k1 = *reinterpret_cast<const uint2*>(x + 32);
      b[nt][0][0] = k0.x;
      b[nt][0][1] = k0.y;
      b[nt][1][0] = k1.x;
      b[nt][1][1] = k1.y;
    }
    // Weight words. Nibble types: ldmatrix.x4 over 32 rows gives word t of rows g, g + 8 of two
    // m-tiles. Q8_0: one ldmatrix.x4 per m-tile over its 16 rows' two 16-byte halves of the
    // sub-block: words[m][0..1] elements 4t.. of rows g, g + 8; words[m][2..3] 16 + 4t...
    // Q2_K/Q3_K: none here (each row's word below).
    constexpr int kWords = TYPE == kQ8_0 ? 4 : 2;
    uint32_t words[MT][kWords];
    if constexpr (kTwoBit<TYPE>) {
    } else if constexpr (TYPE == kQ8_0) {
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        uint32_t r[4];
        load_matrix_x4(r, weights + (m * 16 + lane % 16) * P::kWeightRow + u * 32 + lane / 16 * 16);
#pragma unroll
        for (int i = 0; i < 4; ++i) words[m][i] = r[i];
      }
    } else {
#pragma unroll
      for (int half = 0; half < MT / 2; ++half) {
        uint32_t r[4];
        load_matrix_x4(r, weights + (half * 32 + lane) * P::kWeightRow + u * 16);
        words[2 * half][0] = r[0];
        words[2 * half][1] = r[1];
        words[2 * half + 1][0] = r[2];
        words[2 * half + 1][1] = r[3];
      }
    }
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      uint32_t lo[2][2], hi[2][2];  // [row g, g + 8][pair]
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m * 16 + g + 8 * h;
        if constexpr (TYPE == kQ4_0 || TYPE == kQ8_0 || TYPE == kIQ4_NL || TYPE == kIQ4_XS ||
                      TYPE == kMXFP4) {
          const __half2 dd = mma::as_half2(scale[m][h][0]);  // (d of sub-block 0, of 1)
          const __half2 d = u == 0 ? __low2half2(dd) : __high2half2(dd);
          if constexpr (TYPE == kQ4_0) {
            mma::q4_f16_pairs<TYPE>(words[m][h], d, d, lo[h], hi[h]);  // (m unused)
          } else if constexpr (TYPE == kIQ4_NL || TYPE == kIQ4_XS || TYPE == kMXFP4) {
            level_f16_pairs<TYPE == kMXFP4>(words[m][h], d, lo[h], hi[h]);
          } else {
            scaled_pairs<kHalf2_1152>(words[m][h] ^ 0x80808080u, d, lo[h]);  // q + 128 - 128
            scaled_pairs<kHalf2_1152>(words[m][2 + h] ^ 0x80808080u, d, hi[h]);
          }
        } else if constexpr (kTwoBit<TYPE>) {
          // Word t % 2 of sub-block u, shifted so that elements 4t.. are bits 0-1 of its
          // bytes and 16 + 4t.. bits 4-5 (Q6_K's high bits below are read alike).
          const uint32_t w = *reinterpret_cast<const uint32_t*>(weights + row * P::kWeightRow +
                                                                u * 8 + (t % 2) * 4) >>
                             (2 * (t / 2));
          if constexpr (TYPE == kQ2_K) {
            q2_f16_pairs(w, mma::as_half2(scale[m][h][2 * u]),
                         mma::as_half2(scale[m][h][2 * u + 1]), lo[h], hi[h]);
          } else {
            const uint32_t bits =
                *reinterpret_cast<const uint32_t*>(high + row * P::kHighRow + u * 4);
            const __half2 ds = mma::as_half2(scale[m][h][u]);
            q3_f16_pairs(w, bits >> t, __low2half2(ds), __high2half2(ds), lo[h], hi[h]);
          }
        } else if constexpr (TYPE == kQ6_K) {
          const uint32_t bits =
              *reinterpret_cast<const uint32_t*>(high + row * P::kHighRow + u * 8 + (t % 2) * 4);
          const __half2 ds = mma::as_half2(scale[m][h][u]);
          q6_f16_pairs(words[m][h], bits >> (2 * (t / 2)), __low2half2(ds), __high2half2(ds), lo[h],
                       hi[h]);
        } else {  // Q4_1, Q4_K, Q5_K: (d, m) of sub-block u
          const __half2 dm = mma::as_half2(scale[m][h][u]);
          if constexpr (TYPE == kQ5_K) {
            const uint32_t bits =
                *reinterpret_cast<const uint32_t*>(high + row * P::kHighRow + u * 4);
            q5_f16_pairs(words[m][h], bits >> (4 * t), __low2half2(dm), __high2half2(dm), lo[h],
                         hi[h]);
          } else {
            mma::q4_f16_pairs<kQ4_1>(words[m][h], __low2half2(dm), __high2half2(dm), lo[h], hi[h]);
          }
        }
      }
      const uint32_t a0[4] = {lo[0][0], lo[1][0], lo[0][1], lo[1][1]};
      const uint32_t a1[4] = {hi[0][0], hi[1][0], hi[0][1], hi[1][1]};
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        mma::mma_f16(acc[m][nt], a0, b[nt][0][0], b[nt][0][1]);
        mma::mma_f16(acc[m][nt], a1, b[nt][1][0], b[nt][1][1]);
      }
    }
  }
}

// A warp's copies of one stage's weight rows, from sub-block `first` of n: chunk `chunk` (of
// kChunksPerRow) of rows lane / kChunksPerRow + i * 32 / kChunksPerRow (from rows[i]); then
// their scales and high bits (rows lane + 32 i, from scale_rows[i], which points at the row's
// scales): to `stage` (weights at 0, scales at kScaleOffset, high bits at kHighOffset).
template <class P, uint32_t TYPE>
__device__ __forceinline__ void copy_weight_stage(uint8_t* stage, const uint8_t* const* rows,
                                                  const uint8_t* const* scale_rows, int first,
                                                  int n, int lane, int chunk) {
  // Q2_K/Q3_K: one chunk holds the stage's two sub-blocks (chunk 0), both inside the row when
  // the first is (whole super-blocks: n % 8 == 0, first even).
  constexpr int kChunksPerBlock = P::kQuantBytes >= 16 ? P::kQuantBytes / 16 : 1;
  const bool valid = first + chunk / kChunksPerBlock < n;
#pragma unroll
  for (int i = 0; i < P::kWeightCopies; ++i)
    copy_async<16>(
        stage + (lane / P::kChunksPerRow + i * (kWarpSize / P::kChunksPerRow)) * P::kWeightRow +
            chunk * 16,
        valid ? rows[i] + static_cast<int64_t>(first) * P::kQuantBytes + chunk * 16 : rows[i],
        valid);
  const bool ok = first < n;
  if constexpr (kKType<TYPE>) {
    // Whole super-blocks (n % 8 == 0), so a stage lies inside the row. The sub-blocks' scales
    // (2 bytes each) at first * 2; the super-blocks' f16 pairs 2 n bytes after the scales (Q6_K,
    // Q3_K: the 4-byte aligned pair of d that holds super-block first / 8's, which reads 2 bytes
    // past the payload when n / 8 is odd: into the row's stride padding, as both types'
    // payloads (210 and 114 bytes per super-block, 2 mod 16) then end 2, 6, 10 or 14 bytes into
    // a 16-byte line); the high bits before the scales (Q6_K 8 n bytes, Q5_K 4 n, Q3_K 4 n).
    constexpr bool kDPairs = TYPE == kQ6_K || TYPE == kQ3_K;
    const int64_t pair = 2 * static_cast<int64_t>(n) + (kDPairs ? first / 16 : first / 8) * 4;
#pragma unroll
    for (int i = 0; i < P::kScaleCopies; ++i) {
      const int row = lane + i * kWarpSize;
      uint8_t* to = stage + P::kScaleOffset + row * P::kScaleRow;
      copy_async<4>(to, ok ? scale_rows[i] + static_cast<int64_t>(first) * 2 : scale_rows[i], ok);
      copy_async<4>(to + 4, ok ? scale_rows[i] + pair : scale_rows[i], ok);
      if constexpr (P::kHighRow > 0) {
        constexpr int kPerBlock = P::kHighRow / kKs;  // 8 or 4 bytes per sub-block
        const int64_t from =
            static_cast<int64_t>(first - n) * kPerBlock;  // the high bits' n x kPerBlock
        copy_async<P::kHighRow>(stage + P::kHighOffset + row * P::kHighRow,
                                ok ? scale_rows[i] + from : scale_rows[i], ok);
      }
    }
  } else if constexpr (TYPE == kIQ4_XS) {
    // Whole super-blocks (n % 8 == 0): the 4-byte aligned word of int8 sc holding the stage's
    // two (first is even), and the aligned pair of f16 d holding super-block first / 8's, n
    // bytes after the sc.
#pragma unroll
    for (int i = 0; i < P::kScaleCopies; ++i) {
      uint8_t* to = stage + P::kScaleOffset + (lane + i * kWarpSize) * P::kScaleRow;
      copy_async<4>(to, ok ? scale_rows[i] + (first & ~3) : scale_rows[i], ok);
      copy_async<4>(to + 4, ok ? scale_rows[i] + n + first / 16 * 4 : scale_rows[i], ok);
    }
  } else if constexpr (TYPE == kMXFP4) {
    // The 4-byte aligned word of e bytes holding the stage's two (first is even): it reads at
    // most 3 bytes past a row's n, the next row's bytes or the 16 bytes of slack after the last.
#pragma unroll
    for (int i = 0; i < P::kScaleCopies; ++i)
      copy_async<4>(stage + P::kScaleOffset + (lane + i * kWarpSize) * P::kScaleRow,
                    ok ? scale_rows[i] + (first & ~3) : scale_rows[i], ok);
  } else {
    // The stage's scales of a row in one copy: when only its first sub-block lies inside the
    // row, the copy reads at most 2 (Q4_0, Q8_0) or 4 (Q4_1) bytes past the scales, inside the
    // row's 16-byte stride padding (the payload is 18 n, 34 n or 20 n bytes with n odd then).
#pragma unroll
    for (int i = 0; i < P::kScaleCopies; ++i)
      copy_async<P::kScaleRow>(
          stage + P::kScaleOffset + (lane + i * kWarpSize) * P::kScaleRow,
          ok ? scale_rows[i] + static_cast<int64_t>(first) * P::kScaleBytes : scale_rows[i], ok);
  }
}

// Activation chunks thread + i * THREADS (of the tile's kColumns x kActChunksPerColumn 16-byte
// chunks) of the stage from sub-block `first`, to `stage` + OFFSET (kActRow bytes per column).
// (A warp's
// copies index by lane and pass, a group's by chunk: the same chunks; each form keeps the
// instruction stream its kernel was measured with, where ptxas allocates otherwise.)
template <class P, int THREADS, int OFFSET>
__device__ __forceinline__ void load_activation_stage(uint8_t* stage, const MatvecInputF16& in,
                                                      int first_column, int first, int n,
                                                      int thread) {
  constexpr int ACP = P::kActChunksPerColumn, kChunks = P::kColumns * ACP;
  static_assert(THREADS % ACP == 0 && kChunks % THREADS == 0, "whole columns per pass");
#pragma unroll
  for (int i = 0; i < kChunks / THREADS; ++i) {
    const int c = thread + i * THREADS;
    const int column = THREADS == kWarpSize ? thread / ACP + i * (THREADS / ACP) : c / ACP;
    const int part = THREADS == kWarpSize ? thread % ACP : c % ACP;
    const bool valid = first_column + column < in.batch && first + part / 4 < n;
    const __half* src = valid ? in.x + static_cast<int64_t>(first_column + column) * in.n_in +
                                    static_cast<int64_t>(first) * 32 + part * 8
                              : in.x;
    copy_async<16>(stage + OFFSET + column * P::kActRow + part * 16, src, valid);
  }
}

// This lane's weight rows and scale rows of the block's rows from row0 (copy_weight_stage).
template <class P, uint32_t TYPE>
__device__ __forceinline__ void own_rows(const MatvecTask& task, int row0, int n, int lane,
                                         const uint8_t* (&rows)[P::kWeightCopies],
                                         const uint8_t* (&scale_rows)[P::kScaleCopies]) {
#pragma unroll
  for (int i = 0; i < P::kWeightCopies; ++i)
    rows[i] = mma::weight_row<P::kRows, P::kMatrices>(
        task, row0, lane / P::kChunksPerRow + i * (kWarpSize / P::kChunksPerRow));
#pragma unroll
  for (int i = 0; i < P::kScaleCopies; ++i)
    scale_rows[i] = mma::weight_row<P::kRows, P::kMatrices>(task, row0, lane + i * kWarpSize) +
                    split::scales_offset(TYPE, n);
}

template <uint32_t TYPE, int NT, int MT, bool GATE_UP, int W>
__global__ void __launch_bounds__(kWarpSize* W, 1)
    f16mma_matvec_kernel(Tasks tasks, MatvecInputF16 in) {
  using P = Plan<TYPE, NT, MT, GATE_UP>;
  constexpr int S = P::kStages;
  extern __shared__ __align__(16) uint8_t shared[];

  const MatvecTask& task = tasks.t[blockIdx.y];
  const int column_tiles = (in.batch + P::kColumns - 1) / P::kColumns;
  const int tile = static_cast<int>(blockIdx.x);
  const int row0 = tile / column_tiles * P::kRows;
  if (row0 >= task.n_out) {      // the whole block leaves before any barrier
    wait_for_previous_kernel();  // every block waits (the next kernel relies on the whole grid)
    return;
  }
  const int first_column = tile % column_tiles * P::kColumns;
  const int n = in.n_in / 32;  // sub-blocks per row
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int all_stages = (n + kKs - 1) / kKs;
  const int stages = warp < all_stages ? (all_stages - warp + W - 1) / W : 0;
  uint8_t* const ring = shared + warp * P::kWarpBytes;
  auto first_block = [&](int s) { return (warp + W * s) * kKs; };

  const uint8_t* rows[P::kWeightCopies];
  const uint8_t* scale_rows[P::kScaleCopies];
  own_rows<P, TYPE>(task, row0, n, lane, rows, scale_rows);
  const int chunk = lane % P::kChunksPerRow;
  // Q4_0/Q4_1: copy_weight_stage's copies written out: through the helper the compiler orders
  // this kernel's instructions otherwise, and ptxas gives some shapes up to 7 registers more or
  // less.
  auto load_weights = [&](int s) {
    uint8_t* stage = ring + (s % S) * P::kStageBytes;
    const int first = first_block(s);
    if constexpr (TYPE != kQ4_0 && TYPE != kQ4_1) {
      copy_weight_stage<P, TYPE>(stage, rows, scale_rows, first, n, lane, chunk);
    } else {
      const bool valid = first + chunk < n;
#pragma unroll
      for (int i = 0; i < P::kWeightCopies; ++i)
        copy_async<16>(stage + (lane / kKs + i * (kWarpSize / kKs)) * P::kWeightRow + chunk * 16,
                       valid ? rows[i] + static_cast<int64_t>(first + chunk) * 16 : rows[i], valid);
      const bool ok = first < n;  // the scale copy's overread stays in the row padding
#pragma unroll
      for (int i = 0; i < P::kScaleCopies; ++i)
        copy_async<P::kScaleRow>(
            stage + P::kScaleOffset + (lane + i * kWarpSize) * P::kScaleRow,
            ok ? scale_rows[i] + static_cast<int64_t>(first) * P::kScaleBytes : scale_rows[i], ok);
    }
  };
  auto load_activations = [&](int s) {
    load_activation_stage<P, kWarpSize, P::kActOffset>(ring + (s % S) * P::kStageBytes, in,
                                                       first_column, first_block(s), n, lane);
  };

  mma::start_ring<S>(stages, load_weights, load_activations);
  float acc[MT][NT][4];
  mma::zero(acc);
  for (int s = 0; s < stages; ++s) {
    // mma::advance_ring's step written out, as in matvec_mma.cu's warp-pipelined kernel (the
    // compiler orders the kernel's instructions otherwise through the helper).
    wait_copies<S - 2>();  // stage s landed (this lane's copies) ...
    __syncwarp();          // ... for every lane; and every lane is done with stage s - 1
    if (s + S - 1 < stages) {
      load_weights(s + S - 1);  // into stage s - 1's slot
      load_activations(s + S - 1);
    }
    commit_copies();
    const uint8_t* stage = ring + (s % S) * P::kStageBytes;
    multiply_stage<P, TYPE, NT, MT>(acc, stage, stage + P::kScaleOffset, stage + P::kHighOffset,
                                    stage + P::kActOffset, first_block(s), n, lane);
  }

  // The W warps of the block add their partial sums (in a fixed order).
  if constexpr (W > 1) {
    auto slot = [](int j) { return (j - 1) * P::kAccumulators; };
    if (!mma::gather_sums<W>(acc, shared, warp, slot, lane)) return;
  }
  mma::store_tile<P::kTilesPerMatrix, GATE_UP, true>(acc, task, row0, first_column, in.batch, lane);
}

// The shared-activation shape of the SwiGLU gate+up product at 17-64 columns (NT = 4): a
// block's warps form WK groups of WR warps; warp (r, k) owns weight rows r (MT m-tiles each, the
// block WR * kRows output rows) and group k takes stages k, k + WK, ... of the sub-blocks. The
// WR warps of a group read one copy of each stage's activations from shared memory, which the
// whole group fills (cp.async) and meets on a named barrier per stage, so a stage's activation
// bytes from L2 serve WR times the weight rows of the one-warp ring, and the activations' share
// of the shared memory, which limits the one-warp rings to 8 warps per SM, shrinks. The WK
// groups' sums meet at the end as the warps of f16mma_matvec_kernel do (group order).
struct GateUpShape {
  static constexpr int NT = 4, MT = 2, WR = 4, WK = 2, S = 4;
};
template <uint32_t TYPE>
struct GateUpPlan {
  using G = GateUpShape;
  using P = Plan<TYPE, G::NT, G::MT, true>;
  static constexpr int kActStage = P::kColumns * P::kActRow;  // one per group and stage
  static constexpr int kWarpStage = P::kActOffset;            // weights + scales of one warp
  static constexpr int kStageBytes = kActStage + G::WR * kWarpStage;
  // G::S stages where two blocks fit kSmSharedKeepingL1 (Q4_0/Q4_1/Q4_K and the level types),
  // else one fewer (Q8_0, Q5_K, Q6_K: their larger stages hold as much in flight in 3).
  static constexpr int S =
      2 * (G::WK * G::S * kStageBytes + mma::kBlockReserve) <= kSmSharedKeepingL1 ? G::S : G::S - 1;
  static constexpr int kGroupBytes = S * kStageBytes;
  static constexpr int kRing = G::WK * kGroupBytes;
  static constexpr int kReduce = (G::WK - 1) * G::WR * P::kAccumulators * kWarpSize * 4;
  static constexpr int kShared = kRing > kReduce ? kRing : kReduce;
  static constexpr int kGroupThreads = G::WR * kWarpSize;
  static_assert(kActStage % 16 == 0 && kWarpStage % 16 == 0, "16-byte aligned stages");
  static_assert(kShared <= mma::kMaxBlockShared, "the block's rings fit an H100/H200 block");
  static_assert(G::WK <= 15, "named barriers 1..15");
};

template <uint32_t TYPE>
__global__ void __launch_bounds__(kWarpSize* GateUpShape::WR* GateUpShape::WK, 1)
    f16mma_gate_up_kernel(Tasks tasks, MatvecInputF16 in) {
  using G = GateUpShape;
  using SP = GateUpPlan<TYPE>;
  using P = typename SP::P;
  constexpr int S = SP::S, WR = G::WR, WK = G::WK, NT = G::NT, MT = G::MT;
  extern __shared__ __align__(16) uint8_t shared[];

  const MatvecTask& task = tasks.t[blockIdx.y];
  const int column_tiles = (in.batch + P::kColumns - 1) / P::kColumns;
  const int tile = static_cast<int>(blockIdx.x);
  const int block_row0 = tile / column_tiles * (WR * P::kRows);
  if (block_row0 >= task.n_out) {  // the whole block leaves before any barrier
    wait_for_previous_kernel();    // every block waits (the next kernel relies on the grid)
    return;
  }
  const int first_column = tile % column_tiles * P::kColumns;
  const int n = in.n_in / 32;  // sub-blocks per row
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int r = warp % WR, k = warp / WR;      // rows r, stages k, k + WK, ...
  const int row0 = block_row0 + r * P::kRows;  // may lie past n_out: read clamped, not stored
  const int group_thread = r * kWarpSize + lane;
  const int all_stages = (n + kKs - 1) / kKs;
  const int stages = k < all_stages ? (all_stages - k + WK - 1) / WK : 0;  // uniform in the group
  uint8_t* const ring = shared + k * SP::kGroupBytes;
  auto stage_at = [&](int s) { return ring + (s % S) * SP::kStageBytes; };
  auto warp_at = [&](int s) { return stage_at(s) + SP::kActStage + r * SP::kWarpStage; };
  auto first_block = [&](int s) { return (k + WK * s) * kKs; };

  const uint8_t* rows[P::kWeightCopies];
  const uint8_t* scale_rows[P::kScaleCopies];
  own_rows<P, TYPE>(task, row0, n, lane, rows, scale_rows);
  const int chunk = lane % P::kChunksPerRow;
  auto load_weights = [&](int s) {  // this warp's rows, as f16mma_matvec_kernel's ring
    copy_weight_stage<P, TYPE>(warp_at(s), rows, scale_rows, first_block(s), n, lane, chunk);
  };
  auto load_activations = [&](int s) {  // the group's one copy, spread over its threads
    load_activation_stage<P, SP::kGroupThreads, 0>(stage_at(s), in, first_column, first_block(s), n,
                                                   group_thread);
  };
  auto group_barrier = [&] {  // every thread of group k arrives (named barrier 1 + k)
    asm volatile("bar.sync %0, %1;\n" ::"r"(1 + k), "r"(WR * kWarpSize) : "memory");
  };

  mma::start_ring<S>(stages, load_weights, load_activations);
  float acc[MT][NT][4];
  mma::zero(acc);
  for (int s = 0; s < stages; ++s) {
    mma::advance_ring<S>(s, stages, group_barrier, load_weights, load_activations);
    const uint8_t* w = warp_at(s);
    multiply_stage<P, TYPE, NT, MT>(acc, w, w + P::kScaleOffset, w + P::kHighOffset, stage_at(s),
                                    first_block(s), n, lane);
  }

  // The WK groups' sums, added in group order by group 0's warps: warp (r, k) keeps its sums
  // from accumulator ((k - 1) WR + r) on.
  auto slot = [&](int j) { return ((j - 1) * WR + r) * P::kAccumulators; };
  if (!mma::gather_sums<WK>(acc, shared, k, slot, lane)) return;
  mma::store_tile<P::kTilesPerMatrix, true, true>(acc, task, row0, first_column, in.batch, lane);
}

template <uint32_t TYPE, int NT, int MT, bool GATE_UP, int W>
cudaError_t allow_shared_bytes() {
  return mma::allow_shared_bytes<f16mma_matvec_kernel<TYPE, NT, MT, GATE_UP, W>,
                                 kSharedBytes<TYPE, NT, MT, GATE_UP, W>>();
}

template <uint32_t TYPE>
cudaError_t allow_gate_up_bytes() {
  return mma::allow_shared_bytes<f16mma_gate_up_kernel<TYPE>, GateUpPlan<TYPE>::kShared>();
}

// The block shapes launch_tile picks from: 64 weight rows per warp in 4-warp blocks, 32 rows in
// 4-warp or 8-warp blocks, for 1, 2 and 4 n-tiles.
template <uint32_t TYPE, bool GATE_UP>
cudaError_t allow_shared_bytes_tiles() {
  return mma::first_error(
      {allow_shared_bytes<TYPE, 1, 4, GATE_UP, 4>(), allow_shared_bytes<TYPE, 1, 2, GATE_UP, 4>(),
       allow_shared_bytes<TYPE, 1, 2, GATE_UP, 8>(), allow_shared_bytes<TYPE, 2, 4, GATE_UP, 4>(),
       allow_shared_bytes<TYPE, 2, 2, GATE_UP, 4>(), allow_shared_bytes<TYPE, 2, 2, GATE_UP, 8>(),
       allow_shared_bytes<TYPE, 4, 4, GATE_UP, 4>(), allow_shared_bytes<TYPE, 4, 2, GATE_UP, 4>(),
       allow_shared_bytes<TYPE, 4, 2, GATE_UP, 8>()});
}

// Whether every kernel got its shared memory; the gate+up shape's is asked here too (before
// any capture), and where it is refused launch_tile takes the one-warp rings instead.
template <uint32_t... TYPES>
bool ready_for() {
  if (mma::first_error({allow_shared_bytes_tiles<TYPES, false>()...,
                        allow_shared_bytes_tiles<TYPES, true>()...}) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  if (mma::first_error({allow_gate_up_bytes<TYPES>()...}) != cudaSuccess) cudaGetLastError();
  return true;
}
// The types these kernels are built for: split::f16mma_reads names the same ones (checked below).
template <uint32_t... TYPES>
struct TypeList {
  static constexpr bool has(uint32_t type) { return ((type == TYPES) || ...); }
  static bool ready() { return ready_for<TYPES...>(); }
  template <class F>
  static cudaError_t dispatch(uint32_t type, F&& f) {
    return mma::for_type<TYPES...>(type, f);
  }
};
using F16Types =
    TypeList<kQ4_0, kQ4_1, kQ8_0, kQ2_K, kQ3_K, kQ4_K, kQ5_K, kQ6_K, kIQ4_NL, kIQ4_XS, kMXFP4>;
constexpr bool list_is_f16mma_reads() {
  for (uint32_t t = 0; t < 64; ++t)
    if (F16Types::has(t) != split::f16mma_reads(t)) return false;
  return true;
}
static_assert(list_is_f16mma_reads(), "F16Types and split::f16mma_reads name other types");

bool ready() {
  static const bool ok = F16Types::ready();
  return ok;
}

template <uint32_t TYPE, int NT, int MT, bool GATE_UP, int W>
cudaError_t launch_shape(const Tasks& tasks, int n_tasks, int max_rows, const MatvecInputF16& in,
                         const KernelConfig& config, cudaStream_t stream) {
  using P = Plan<TYPE, NT, MT, GATE_UP>;
  const dim3 grid(ceil_div(max_rows, P::kRows) * ceil_div(in.batch, P::kColumns), n_tasks, 1);
  return mma::launch<f16mma_matvec_kernel<TYPE, NT, MT, GATE_UP, W>,
                     kSharedBytes<TYPE, NT, MT, GATE_UP, W>>(grid, dim3(kWarpSize * W), tasks, in,
                                                             config, stream);
}

// 64 rows per warp where that still gives at least two 4-warp blocks per SM (gate+up: 448
// blocks at 32 columns); else 32 rows per warp, in 4-warp blocks when there are more blocks
// than SMs (QKV), else 8-warp blocks (wo and down at up to 32 columns: 128 blocks). SwiGLU at
// 17-64 columns: the shared-activation shape, where the device gave it its shared memory.
template <uint32_t TYPE, int NT, bool GATE_UP>
cudaError_t launch_tile(const Tasks& tasks, int n_tasks, int max_rows, const MatvecInputF16& in,
                        const KernelConfig& config, cudaStream_t stream) {
  const int column_tiles = ceil_div(in.batch, 8 * NT);
  const int sms = multiprocessors();
  if constexpr (NT == GateUpShape::NT && GATE_UP) {
    if (allow_gate_up_bytes<TYPE>() == cudaSuccess) {
      using P = typename GateUpPlan<TYPE>::P;
      const dim3 grid(ceil_div(max_rows, GateUpShape::WR * P::kRows) * column_tiles, n_tasks, 1);
      return mma::launch<f16mma_gate_up_kernel<TYPE>, GateUpPlan<TYPE>::kShared>(
          grid, dim3(kWarpSize * GateUpShape::WR * GateUpShape::WK), tasks, in, config, stream);
    }
  }
  if (mma::working_blocks(tasks, n_tasks, Plan<TYPE, NT, 4, GATE_UP>::kRows, column_tiles) >=
      2 * sms)
    return launch_shape<TYPE, NT, 4, GATE_UP, 4>(tasks, n_tasks, max_rows, in, config, stream);
  if (mma::working_blocks(tasks, n_tasks, Plan<TYPE, NT, 2, GATE_UP>::kRows, column_tiles) > sms)
    return launch_shape<TYPE, NT, 2, GATE_UP, 4>(tasks, n_tasks, max_rows, in, config, stream);
  return launch_shape<TYPE, NT, 2, GATE_UP, 8>(tasks, n_tasks, max_rows, in, config, stream);
}

// 8 columns in one n-tile, 16 in two; more in 32-column tiles (64 columns: two tiles, adjacent
// in blockIdx.x so the second reads the weights from L2).
template <uint32_t TYPE, bool GATE_UP>
cudaError_t launch_type(const Tasks& tasks, int n_tasks, int max_rows, const MatvecInputF16& in,
                        const KernelConfig& config, cudaStream_t stream) {
  if (in.batch <= 8)
    return launch_tile<TYPE, 1, GATE_UP>(tasks, n_tasks, max_rows, in, config, stream);
  if (in.batch <= 16)
    return launch_tile<TYPE, 2, GATE_UP>(tasks, n_tasks, max_rows, in, config, stream);
  return launch_tile<TYPE, 4, GATE_UP>(tasks, n_tasks, max_rows, in, config, stream);
}

}  // namespace

bool matvec_f16mma_supports(uint32_t weight_type, bool split_layout) {
  return split_layout && split::f16mma_reads(weight_type);
}

bool matvec_f16mma_fits_device() {
  if (!mma::has_mma(f16mma_matvec_kernel<kQ4_0, 1, 2, false, 4>)) return false;
  multiprocessors();
  return ready();
}

cudaError_t launch_matvec_f16mma(uint32_t weight_type, const MatvecTask* tasks, int n_tasks,
                                 const MatvecInputF16& input, const KernelConfig& config,
                                 cudaStream_t stream) {
  if (input.n_in <= 0 || input.n_in % split::block_elements(weight_type) != 0 || input.batch < 0 ||
      reinterpret_cast<uintptr_t>(input.x) % 16 != 0)
    return cudaErrorInvalidValue;
  Tasks packed{};
  int max_rows = 0;
  auto valid = [&](const MatvecTask& t) {
    return matvec_f16mma_supports(weight_type, t.split_layout) && !t.y_q8.qs &&
           !(t.y_f16 != nullptr && t.accumulate) &&
           t.row_bytes >= split::row_payload_bytes(weight_type, input.n_in) && t.n_out >= 0;
  };
  if (!mma::pack_tasks(tasks, n_tasks, valid, packed, max_rows)) return cudaErrorInvalidValue;
  if (input.batch == 0 || max_rows == 0) return cudaSuccess;
  if (!ready()) return cudaErrorInvalidValue;  // no shared memory for the kernels
  auto run = [&](auto type_tag) -> cudaError_t {
    constexpr uint32_t TYPE = decltype(type_tag)::value;
    return packed.t[0].weight_up
               ? launch_type<TYPE, true>(packed, n_tasks, max_rows, input, config, stream)
               : launch_type<TYPE, false>(packed, n_tasks, max_rows, input, config, stream);
  };
  return F16Types::dispatch(weight_type, run);
}

}  // namespace granule::kernels
