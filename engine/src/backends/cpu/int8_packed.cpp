// The 8-row layout and its kernels (see int8_packed.h). A packed matrix is its groups of 8 rows
// one after another; a group is its tiles, one per block of 32 columns, in column order; a
// tile is
//   qs    the 8 rows' values, 4 bytes of each row per 32 bytes: chunk c's 32-bit lane r holds
//         row r's elements 4c..4c+3. Q8_0: 8 chunks of bytes. The 4-bit types: 4 chunks of
//         the file's nibble bytes (byte 4c + i of a row holds element 4c + i in its low nibble
//         and 16 + 4c + i in its high one), so a chunk's low nibbles are elements 4c.. and its
//         high nibbles elements 16 + 4c..
//   qh    Q5_0/Q5_1: 32 bytes, lane r's byte i holds in bit c the fifth bit of element 4c + i
//   d     8 fp16 scales, then (Q4_1, Q5_1) 8 fp16 minimums; MXFP4: 8 E8M0 bytes
// A tile's product with an activation block: per chunk, maddubs of the (unsigned, or for Q8_0,
// IQ4_NL and MXFP4 sign-tricked) values with the block's 4 bytes broadcast, i16 sums while they
// cannot overflow, madd to i32; an offset type (Q4_0 q - 8, Q5_0 q - 16) subtracts offset·Σq_x
// in integers; then one f32 conversion and one FMA with d_w·d_x for the 8 rows, and for the
// minimum types one FMA with m·d_x·Σq_x. Each lane runs the same sequence for every tile shape,
// so every row and token gets the same bits however the work is cut. The 256-element types have
// their own tiles (KPacked, Q6Packed, Low2Packed, IQ4XSPacked below), one a super-block.
#include "backends/cpu/int8_packed.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "granule/block_formats.h"
#include "granule/quant.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define GRANULE_PACKED_X86 1
#endif

namespace granule::cpu {

#ifdef GRANULE_PACKED_X86
namespace {

#define GRANULE_AVX2 __attribute__((target("avx2,fma,f16c")))

const bool kHaveAvx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                       __builtin_cpu_supports("f16c");
// vpdpbusd sums a lane's 4 byte products into its i32 in one instruction, where AVX2 takes
// maddubs (i16 pairs), i16 adds and madd: AVX512-VNNI with 256-bit vectors (AVX512VL; server
// CPUs), or AVX-VNNI, its VEX form (client CPUs without AVX-512). The sums are exact either way,
// so every form gives the same bits (cpu_int8_matmul_test compares them).
const bool kHaveVnni512 =
    kHaveAvx2 && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
const bool kHaveAvxVnni = kHaveAvx2 && __builtin_cpu_supports("avxvnni");

// Which integer dot products a kernel instance uses (Int8Weights::DotForm).
using Dot = Int8Weights::DotForm;
bool runs(Dot d) {
  return d == Dot::Avx2 ? kHaveAvx2 : d == Dot::Avx512Vnni ? kHaveVnni512 : kHaveAvxVnni;
}
Dot best_dot() { return kHaveVnni512 ? Dot::Avx512Vnni : kHaveAvxVnni ? Dot::AvxVnni : Dot::Avx2; }
std::atomic<Dot> g_dot{best_dot()};

// How a packed type's tiles are laid out and multiplied.
enum class Layout { Blocks, KQuant, Q6K, Low2, IQ4XS };

// How a packed tile holds its values.
enum class Values {
  Nibbles,   // 4-bit unsigned
  FifthBit,  // 4-bit unsigned and the qh bit: 5-bit unsigned
  Table,     // 4-bit indices into kIq4nlValues (signed)
  Fp4,       // 4-bit indices into kMxfp4Values (signed), an E8M0 scale byte a row
  Bytes,     // int8 (signed)
};

// One traits struct per packed type: the file's block, the tile's parts, the value range.
template <class B, Values V, int kOffsetValue, bool kMinimum>
struct Packed {
  using Block = B;
  static constexpr Values kValues = V;
  static constexpr int kOffset = kOffsetValue;  // value = q - kOffset
  static constexpr bool kMin = kMinimum;        // value = d·q + m
  static constexpr int kQsBytes = V == Values::Bytes ? 256 : 128;
  static constexpr int kQhBytes = V == Values::FifthBit ? 32 : 0;
  static constexpr int kScaleOffset = kQsBytes + kQhBytes;
  static constexpr int kTileBytes =
      kScaleOffset + (V == Values::Fp4 ? 8 : 16) + (kMinimum ? 16 : 0);
  static constexpr int kBlockCols = 32;
  static constexpr Layout kLayout = Layout::Blocks;
  static constexpr int kTileTokens = 4;
};

// Q4_K and Q5_K: a tile is a super-block of 256 columns, its 8 sub-blocks' 6-bit scales and
// minimums unpacked to bytes (so the 8 rows' d·sc are one conversion and one product):
//   qs    4 pairs of sub-blocks, each 8 chunks: pair j's chunk k lane r holds row r's bytes
//         32j + 4k.. (low nibbles: sub-block 2j elements 4k.., high: sub-block 2j + 1)
//   qh    Q5_K: 8 chunks, chunk k lane r holds row r's qh bytes 4k.. (bit s: sub-block s)
//   sc    8 × 8 bytes, sub-block s's scale of row r at 8s + r; then mn, the minimums
//   d     8 fp16, then dmin 8 fp16
template <class B, bool kFifthBit>
struct KPacked {
  using Block = B;
  static constexpr bool kFifth = kFifthBit;
  static constexpr int kQhOffset = 1024;
  static constexpr int kScOffset = kQhOffset + (kFifthBit ? 256 : 0);
  static constexpr int kMnOffset = kScOffset + 64;
  static constexpr int kDOffset = kMnOffset + 64;
  static constexpr int kTileBytes = kDOffset + 32;
  static constexpr int kBlockCols = 256;
  static constexpr Layout kLayout = Layout::KQuant;
  static constexpr int kTileTokens = 4;
};

// Q6_K: a tile is a super-block of 8 rows (the file's 210 bytes a row):
//   ql    2 halves h × 2 × 8 chunks: chunk (h, j, k) lane r holds row r's ql bytes 64h + 32j + 4k..
//   qh    2 halves × 8 chunks: chunk (h, k) lane r holds row r's qh bytes 32h + 4k..
//   sc    16 × 8 int8, scale q (of elements 16q..) of row r at 8q + r
//   d     8 fp16
// Sub-block s = 4h + i: low 4 bits from ql chunk (h, i & 1) (low nibbles for i < 2, high for
// i >= 2), high 2 bits from qh chunk (h, k) >> 2i, minus 32: signed values (|w| × sign(x, w),
// at most 2·32·127 a pair, so a half's 4 chunks fit i16), madd with the half's scales.
struct Q6Packed {
  using Block = BlockQ6_K;
  static constexpr int kQhOffset = 1024;
  static constexpr int kScOffset = kQhOffset + 512;
  static constexpr int kDOffset = kScOffset + 128;
  static constexpr int kTileBytes = kDOffset + 16;
  static constexpr int kBlockCols = 256;
  static constexpr Layout kLayout = Layout::Q6K;
  static constexpr int kTileTokens = 3;  // 3 × (i16 sums, i32 sums, accumulators) fit 16 ymm
};
// Q2_K and Q3_K: a tile is a super-block of 8 rows; each 32-element activation block a = 4h + j
// takes bits 2j..2j+1 of the qs bytes 32h.. of its half h, elements 0..15 one sub-block (2a)
// and 16..31 the next (2a + 1):
//   qs    2 halves × 8 chunks: chunk (h, k) lane r holds row r's qs bytes 32h + 4k..
//   hm    Q3_K: 8 chunks, chunk k lane r holds row r's hmask bytes 4k.. (bit a: block a)
//   sc    16 × 8 bytes, sub-block q of row r at 8q + r: Q2_K the file's byte (scale in the low
//         nibble, minimum in the high one), Q3_K the signed 6-bit scale
//   d     8 fp16, then Q2_K's dmin 8 fp16
// Values are unsigned (Q2_K 0..3, Q3_K 0..7 = the file's value + 4); a sub-block's 4 chunks'
// products fit i16 and madd with its scale; Q2_K's minimums and Q3_K's offset 4 are
// the sub-blocks' activation sums (half_sum) times the minimums or scales, in integers.
template <class B, bool kHighBit>
struct Low2Packed {
  using Block = B;
  static constexpr bool kQ3 = kHighBit;
  static constexpr int kHmOffset = 512;
  static constexpr int kScOffset = kHmOffset + (kHighBit ? 256 : 0);
  static constexpr int kDOffset = kScOffset + 128;
  static constexpr int kTileBytes = kDOffset + (kHighBit ? 16 : 32);
  static constexpr int kBlockCols = 256;
  static constexpr Layout kLayout = Layout::Low2;
  static constexpr int kTileTokens = 4;
};

// IQ4_XS: a tile is a super-block of 8 rows, each 32-element sub-block as IQ4_NL's tile:
//   qs    8 sub-blocks × 4 chunks: sub-block s chunk c lane r holds row r's bytes 16s + 4c..
//   sc    8 × 8 int8, the signed 6-bit scale of sub-block s of row r at 8s + r
//   d     8 fp16
struct IQ4XSPacked {
  using Block = BlockIQ4_XS;
  static constexpr int kScOffset = 1024;
  static constexpr int kDOffset = kScOffset + 64;
  static constexpr int kTileBytes = kDOffset + 16;
  static constexpr int kBlockCols = 256;
  static constexpr Layout kLayout = Layout::IQ4XS;
  static constexpr int kTileTokens = 4;
};

using PQ4_0 = Packed<BlockQ4_0, Values::Nibbles, 8, false>;
using PQ4_1 = Packed<BlockQ4_1, Values::Nibbles, 0, true>;
using PQ5_0 = Packed<BlockQ5_0, Values::FifthBit, 16, false>;
using PQ5_1 = Packed<BlockQ5_1, Values::FifthBit, 0, true>;
using PIQ4_NL = Packed<BlockIQ4_NL, Values::Table, 0, false>;
using PQ8_0 = Packed<BlockQ8_0, Values::Bytes, 0, false>;
using PMXFP4 = Packed<BlockMXFP4, Values::Fp4, 0, false>;
using PQ2_K = Low2Packed<BlockQ2_K, false>;
using PQ3_K = Low2Packed<BlockQ3_K, true>;
using PIQ4_XS = IQ4XSPacked;
using PQ4_K = KPacked<BlockQ4_K, false>;
using PQ5_K = KPacked<BlockQ5_K, true>;
using PQ6_K = Q6Packed;

// Calls f(P{}) with the traits of a packed type; false where the type does not pack.
template <class F>
bool with_packed(TensorType type, F&& f) {
  switch (type) {
    case TensorType::Q4_0:
      f(PQ4_0{});
      return true;
    case TensorType::Q4_1:
      f(PQ4_1{});
      return true;
    case TensorType::Q5_0:
      f(PQ5_0{});
      return true;
    case TensorType::Q5_1:
      f(PQ5_1{});
      return true;
    case TensorType::IQ4_NL:
      f(PIQ4_NL{});
      return true;
    case TensorType::Q8_0:
      f(PQ8_0{});
      return true;
    case TensorType::Q4_K:
      f(PQ4_K{});
      return true;
    case TensorType::Q5_K:
      f(PQ5_K{});
      return true;
    case TensorType::Q6_K:
      f(PQ6_K{});
      return true;
    case TensorType::MXFP4:
      f(PMXFP4{});
      return true;
    case TensorType::Q2_K:
      f(PQ2_K{});
      return true;
    case TensorType::Q3_K:
      f(PQ3_K{});
      return true;
    case TensorType::IQ4_XS:
      f(PIQ4_XS{});
      return true;
    default:
      return false;
  }
}

// Every tile of the packed matrix, zeroed (a missing row: zero scales and values), then
// f(tile, block, r) for each row r of its group that is present: group g's tile b holds block b
// of rows 8g..8g + 7.
template <class P, class F>
void pack_tiles(const uint8_t* w, int64_t rows, int64_t n_blocks, uint8_t* out, F&& f) {
  using Block = typename P::Block;
  const int64_t groups = (rows + 7) / 8;
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t b = 0; b < n_blocks; ++b) {
      uint8_t* tile = out + static_cast<size_t>(g * n_blocks + b) * P::kTileBytes;
      std::memset(tile, 0, P::kTileBytes);
      for (int r = 0; r < 8 && g * 8 + r < rows; ++r)
        f(tile,
          reinterpret_cast<const Block*>(w + static_cast<size_t>(g * 8 + r) * n_blocks *
                                                 sizeof(Block))[b],
          r);
    }
  }
}

void pack_q6_k(const uint8_t* w, int64_t rows, int64_t n_blocks, uint8_t* out) {
  using P = Q6Packed;
  pack_tiles<P>(w, rows, n_blocks, out, [](uint8_t* tile, const BlockQ6_K& block, int r) {
    for (int h = 0; h < 2; ++h) {
      for (int k = 0; k < 8; ++k) {
        for (int j = 0; j < 2; ++j)
          std::memcpy(tile + 512 * h + 256 * j + 32 * k + 4 * r, block.ql + 64 * h + 32 * j + 4 * k,
                      4);
        std::memcpy(tile + P::kQhOffset + 256 * h + 32 * k + 4 * r, block.qh + 32 * h + 4 * k, 4);
      }
    }
    for (int q = 0; q < 16; ++q)
      tile[P::kScOffset + 8 * q + r] = static_cast<uint8_t>(block.scales[q]);
    std::memcpy(tile + P::kDOffset + 2 * r, &block.d, 2);
  });
}

// Q3_K's sixteen 6-bit scales (low 4 bits in the nibbles of bytes 0-7, high 2 bits in bytes
// 8-11), minus their bias of 32.
int q3_scale(const uint8_t* scales, int j) {
  const int low = (scales[j % 8] >> (4 * (j / 8))) & 0xF;
  const int high = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (low | (high << 4)) - 32;
}

template <class P>
void pack_low2(const uint8_t* w, int64_t rows, int64_t n_blocks, uint8_t* out) {
  pack_tiles<P>(w, rows, n_blocks, out, [](uint8_t* tile, const typename P::Block& block, int r) {
    for (int h = 0; h < 2; ++h)
      for (int k = 0; k < 8; ++k)
        std::memcpy(tile + 256 * h + 32 * k + 4 * r, block.qs + 32 * h + 4 * k, 4);
    if constexpr (P::kQ3) {
      for (int k = 0; k < 8; ++k)
        std::memcpy(tile + P::kHmOffset + 32 * k + 4 * r, block.hmask + 4 * k, 4);
      for (int q = 0; q < 16; ++q)
        tile[P::kScOffset + 8 * q + r] = static_cast<uint8_t>(q3_scale(block.scales, q));
      std::memcpy(tile + P::kDOffset + 2 * r, &block.d, 2);
    } else {
      for (int q = 0; q < 16; ++q) tile[P::kScOffset + 8 * q + r] = block.scales[q];
      std::memcpy(tile + P::kDOffset + 2 * r, &block.d, 2);
      std::memcpy(tile + P::kDOffset + 16 + 2 * r, &block.dmin, 2);
    }
  });
}

void pack_iq4_xs(const uint8_t* w, int64_t rows, int64_t n_blocks, uint8_t* out) {
  using P = IQ4XSPacked;
  pack_tiles<P>(w, rows, n_blocks, out, [](uint8_t* tile, const BlockIQ4_XS& block, int r) {
    for (int s = 0; s < 8; ++s) {
      for (int c = 0; c < 4; ++c)
        std::memcpy(tile + 128 * s + 32 * c + 4 * r, block.qs + 16 * s + 4 * c, 4);
      const int low = (block.scales_l[s / 2] >> (4 * (s % 2))) & 0xF;
      const int high = (block.scales_h >> (2 * s)) & 3;
      tile[P::kScOffset + 8 * s + r] = static_cast<uint8_t>((low | (high << 4)) - 32);
    }
    std::memcpy(tile + P::kDOffset + 2 * r, &block.d, 2);
  });
}

template <class P>
void pack_k(const uint8_t* w, int64_t rows, int64_t n_blocks, uint8_t* out) {
  pack_tiles<P>(w, rows, n_blocks, out, [](uint8_t* tile, const typename P::Block& block, int r) {
    for (int j = 0; j < 4; ++j)
      for (int k = 0; k < 8; ++k)
        std::memcpy(tile + 256 * j + 32 * k + 4 * r, block.qs + 32 * j + 4 * k, 4);
    if constexpr (P::kFifth)
      for (int k = 0; k < 8; ++k)
        std::memcpy(tile + P::kQhOffset + 32 * k + 4 * r, block.qh + 4 * k, 4);
    const uint8_t* q = block.scales;  // the 12 bytes of 6-bit scales and minimums
    for (int s = 0; s < 8; ++s) {
      const int sc = s < 4 ? q[s] & 63 : (q[s + 4] & 0xF) | ((q[s - 4] >> 6) << 4);
      const int mn = s < 4 ? q[s + 4] & 63 : (q[s + 4] >> 4) | ((q[s] >> 6) << 4);
      tile[P::kScOffset + 8 * s + r] = static_cast<uint8_t>(sc);
      tile[P::kMnOffset + 8 * s + r] = static_cast<uint8_t>(mn);
    }
    std::memcpy(tile + P::kDOffset + 2 * r, &block.d, 2);
    std::memcpy(tile + P::kDOffset + 16 + 2 * r, &block.dmin, 2);
  });
}

template <class P>
void pack(const uint8_t* w, int64_t rows, int64_t n_blocks, uint8_t* out) {
  pack_tiles<P>(w, rows, n_blocks, out, [](uint8_t* tile, const typename P::Block& block, int r) {
    const auto* qs = reinterpret_cast<const uint8_t*>(block.qs);
    for (int c = 0; c < P::kQsBytes / 32; ++c) std::memcpy(tile + 32 * c + 4 * r, qs + 4 * c, 4);
    if constexpr (P::kValues == Values::FifthBit) {
      uint32_t qh;
      std::memcpy(&qh, block.qh, sizeof qh);
      for (int i = 0; i < 4; ++i) {
        uint8_t bits = 0;
        for (int c = 0; c < 8; ++c) bits |= static_cast<uint8_t>(((qh >> (4 * c + i)) & 1) << c);
        tile[P::kQsBytes + 4 * r + i] = bits;
      }
    }
    if constexpr (P::kValues == Values::Fp4)
      tile[P::kScaleOffset + r] = block.e;
    else
      std::memcpy(tile + P::kScaleOffset + 2 * r, &block.d, 2);
    if constexpr (P::kMin) std::memcpy(tile + P::kScaleOffset + 16 + 2 * r, &block.m, 2);
  });
}

GRANULE_AVX2 inline __m256i load(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// The 8 rows' fp16 values at p (their scales or minimums) as floats.
GRANULE_AVX2 inline __m256 f16x8(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// The 8 rows' bytes at p, unsigned (u8x8) or signed (i8x8), one a 32-bit lane.
GRANULE_AVX2 inline __m256i u8x8(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
GRANULE_AVX2 inline __m256i i8x8(const uint8_t* p) {
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

// The 4 activation bytes of elements 4k..4k+3, in every lane.
GRANULE_AVX2 inline __m256i broadcast4(const ActivationBlock* x, int k) {
  int32_t v;
  std::memcpy(&v, x->qs + 4 * k, sizeof v);
  return _mm256_set1_epi32(v);
}

// The fifth bits of chunk k (bit k of each qh byte) as 0x10.
GRANULE_AVX2 inline __m256i fifth_bit(__m256i qh, int k) {
  const __m256i bit = _mm256_and_si256(qh, _mm256_set1_epi8(static_cast<char>(1 << k)));
  return k <= 4 ? _mm256_sll_epi16(bit, _mm_cvtsi32_si128(4 - k))
                : _mm256_srl_epi16(bit, _mm_cvtsi32_si128(k - 4));
}

// The 8 rows' E8M0 bytes at e as 2^(e - 127) / 2, MXFP4's scale of its doubled values (e 0 and
// 1 give the subnormals 2^-128 and 2^-127, as the exact path's decode).
GRANULE_AVX2 inline __m256 e8m0_half(const uint8_t* e) {
  const __m256i ei = u8x8(e);
  const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(ei, _mm256_set1_epi32(1)), 23);
  const __m256i subnormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), ei);
  const __m256i small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), ei);
  return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, subnormal, small));
}

// The 8 rows' scale bytes at p (unsigned, or signed with kSigned) in both i16 of each lane,
// for madd with i16 pairs.
template <bool kSigned>
GRANULE_AVX2 inline __m256i scale_pairs(const uint8_t* p, __m256i mask) {
  const __m256i v = _mm256_and_si256(kSigned ? i8x8(p) : u8x8(p), mask);
  return _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(v, 16));
}

// acc + each lane's 4 products of unsigned bytes u and signed bytes s, in i32: vpdpbusd, EVEX
// (AVX512-VNNI + VL) or VEX (AVX-VNNI). An asm statement, so the AVX2 functions that hold it need
// no other target; only the instances of that form run it, where runs() said the CPU and OS
// have it.
template <Dot D>
GRANULE_AVX2 inline __m256i dpbusd(__m256i acc, __m256i u, __m256i s) {
  static_assert(D != Dot::Avx2);
  if constexpr (D == Dot::Avx512Vnni)
    asm("%{evex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u), "x"(s));
  else
    asm("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u), "x"(s));
  return acc;
}

// Signed values w of chunk k: |w| × sign(x, w), at most 2·128·127 a pair, so i32 after each.
template <int T, Dot D>
GRANULE_AVX2 inline void signed_chunk(__m256i w, const ActivationBlock* const* xb, int k,
                                      __m256i* isum) {
  const __m256i magnitude = _mm256_sign_epi8(w, w);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int t = 0; t < T; ++t) {
    const __m256i x = _mm256_sign_epi8(broadcast4(xb[t], k), w);
    if constexpr (D != Dot::Avx2) {
      isum[t] = dpbusd<D>(isum[t], magnitude, x);
    } else {
      const __m256i p = _mm256_maddubs_epi16(magnitude, x);
      isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(p, ones));
    }
  }
}

// Requests into the caches the tile about 2 KiB past `tile` (at least two tiles on): at one
// token a group streams its tiles from memory once, and the hardware prefetcher alone left the
// 30B MoE shape's batch 1 at 5.5 t/s against 6.8 with this (2-core development machine). The
// tiles of a group and the groups are contiguous, so past a group's last tile this reaches the
// next group's first; a prefetch past the buffer's end does not fault.
template <int kTileBytes>
GRANULE_AVX2 inline void prefetch_ahead(const uint8_t* tile) {
  constexpr int kTilesAhead = std::max(2, (2048 + kTileBytes - 1) / kTileBytes);
  for (int at = 0; at < kTileBytes; at += 64)
    _mm_prefetch(reinterpret_cast<const char*>(tile + kTilesAhead * kTileBytes + at), _MM_HINT_T0);
}

// One group of 8 rows times T tokens over every block: out[t * out_stride + r] for the 8 rows.
// x: token 0's blocks; token t's at x + t * x_blocks.
template <class P, int T, Dot D>
GRANULE_AVX2 void group_tile(const uint8_t* tiles, int64_t n_blocks, const ActivationBlock* x,
                             int64_t x_blocks, float* out, int64_t out_stride, bool ahead) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n_blocks; ++b) {
    const uint8_t* tile = tiles + b * P::kTileBytes;
    if (ahead) prefetch_ahead<P::kTileBytes>(tile);
    const ActivationBlock* xb[T];
    for (int t = 0; t < T; ++t) xb[t] = x + t * x_blocks + b;
    __m256i isum[T];
    if constexpr (P::kValues == Values::Nibbles || P::kValues == Values::FifthBit) {
      // Unsigned values. AVX2: 8 products of 4-bit values (at most 2·15·127 each) fit i16 over
      // the block, two of 5-bit ones (2·31·127) a chunk; VNNI: i32 at once.
      constexpr bool kFifth = P::kValues == Values::FifthBit;
      const __m256i qh = kFifth ? load(tile + P::kQsBytes) : _mm256_setzero_si256();
      __m256i s16[T];
      for (int t = 0; t < T; ++t) isum[t] = s16[t] = _mm256_setzero_si256();
      for (int c = 0; c < 4; ++c) {
        const __m256i packed = load(tile + 32 * c);
        __m256i lo = _mm256_and_si256(packed, low4);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low4);
        if constexpr (kFifth) {
          lo = _mm256_or_si256(lo, fifth_bit(qh, c));
          hi = _mm256_or_si256(hi, fifth_bit(qh, c + 4));
        }
        for (int t = 0; t < T; ++t) {
          if constexpr (D != Dot::Avx2) {
            isum[t] = dpbusd<D>(dpbusd<D>(isum[t], lo, broadcast4(xb[t], c)), hi,
                                broadcast4(xb[t], c + 4));
          } else {
            const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, broadcast4(xb[t], c)),
                                               _mm256_maddubs_epi16(hi, broadcast4(xb[t], c + 4)));
            if constexpr (kFifth)
              isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(p, ones));
            else
              s16[t] = _mm256_add_epi16(s16[t], p);
          }
        }
      }
      if constexpr (!kFifth && D == Dot::Avx2)
        for (int t = 0; t < T; ++t) isum[t] = _mm256_madd_epi16(s16[t], ones);
    } else {
      for (int t = 0; t < T; ++t) isum[t] = _mm256_setzero_si256();
      if constexpr (P::kValues == Values::Bytes) {
        for (int k = 0; k < 8; ++k) signed_chunk<T, D>(load(tile + 32 * k), xb, k, isum);
      } else {
        const __m128i table128 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(
            P::kValues == Values::Fp4 ? kMxfp4Values : kIq4nlValues));
        const __m256i table = _mm256_set_m128i(table128, table128);
        for (int c = 0; c < 4; ++c) {
          const __m256i packed = load(tile + 32 * c);
          const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low4);
          signed_chunk<T, D>(_mm256_shuffle_epi8(table, _mm256_and_si256(packed, low4)), xb, c,
                             isum);
          signed_chunk<T, D>(_mm256_shuffle_epi8(table, hi), xb, c + 4, isum);
        }
      }
    }
    __m256 dw;
    if constexpr (P::kValues == Values::Fp4)
      dw = e8m0_half(tile + P::kScaleOffset);
    else
      dw = f16x8(tile + P::kScaleOffset);
    for (int t = 0; t < T; ++t) {
      __m256i sum = isum[t];
      if constexpr (P::kOffset != 0)
        sum = _mm256_sub_epi32(sum, _mm256_set1_epi32(P::kOffset * xb[t]->qsum));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(dw, _mm256_set1_ps(xb[t]->d)),
                               acc[t]);
    }
    if constexpr (P::kMin) {
      const __m256 mw = f16x8(tile + P::kScaleOffset + 16);
      for (int t = 0; t < T; ++t) acc[t] = _mm256_fmadd_ps(mw, _mm256_set1_ps(xb[t]->sum), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) _mm256_storeu_ps(out + t * out_stride, acc[t]);
}

// The K quants' group of 8 rows times T tokens (one tile a super-block): per sub-block, the
// 8 rows' d·sc and -dmin·mn from their bytes (k_scales_mins' products), the nibbles (and fifth
// bits) as for Q4_1/Q5_1.
template <class P, int T, Dot D>
GRANULE_AVX2 void group_tile_k(const uint8_t* tiles, int64_t n_tiles, const ActivationBlock* x,
                               int64_t x_blocks, float* out, int64_t out_stride, bool ahead) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n_tiles; ++b) {
    const uint8_t* tile = tiles + b * P::kTileBytes;
    if (ahead) prefetch_ahead<P::kTileBytes>(tile);
    const __m256 d = f16x8(tile + P::kDOffset);
    const __m256 dmin = f16x8(tile + P::kDOffset + 16);
    for (int s = 0; s < 8; ++s) {
      const ActivationBlock* xb[T];
      for (int t = 0; t < T; ++t) xb[t] = x + t * x_blocks + 8 * b + s;
      const uint8_t* qs = tile + 256 * (s / 2);
      __m256i isum[T];
      for (int t = 0; t < T; ++t) isum[t] = _mm256_setzero_si256();
      // AVX2: Q4_K's 8 products of at most 2·15·127 fit i16, Q5_K's 4 of 2·31·127; VNNI: i32 at
      // once.
      constexpr int kRun = P::kFifth ? 4 : 8;
      for (int k0 = 0; k0 < 8; k0 += kRun) {
        __m256i s16[T];
        for (int t = 0; t < T; ++t) s16[t] = _mm256_setzero_si256();
        for (int k = k0; k < k0 + kRun; ++k) {
          const __m256i packed = load(qs + 32 * k);
          __m256i v = _mm256_and_si256((s & 1) ? _mm256_srli_epi16(packed, 4) : packed, low4);
          if constexpr (P::kFifth)
            v = _mm256_or_si256(v, fifth_bit(load(tile + P::kQhOffset + 32 * k), s));
          for (int t = 0; t < T; ++t) {
            if constexpr (D != Dot::Avx2)
              isum[t] = dpbusd<D>(isum[t], v, broadcast4(xb[t], k));
            else
              s16[t] = _mm256_add_epi16(s16[t], _mm256_maddubs_epi16(v, broadcast4(xb[t], k)));
          }
        }
        if constexpr (D == Dot::Avx2)
          for (int t = 0; t < T; ++t)
            isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(s16[t], ones));
      }
      const __m256 dw = _mm256_mul_ps(d, _mm256_cvtepi32_ps(u8x8(tile + P::kScOffset + 8 * s)));
      const __m256 mw = _mm256_xor_ps(
          _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(u8x8(tile + P::kMnOffset + 8 * s))), sign);
      for (int t = 0; t < T; ++t) {
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]),
                                 _mm256_mul_ps(dw, _mm256_set1_ps(xb[t]->d)), acc[t]);
        acc[t] = _mm256_fmadd_ps(mw, _mm256_set1_ps(xb[t]->sum), acc[t]);
      }
    }
  }
  for (int t = 0; t < T; ++t) _mm256_storeu_ps(out + t * out_stride, acc[t]);
}

// Q6_K's group of 8 rows times T tokens (see Q6Packed).
template <int T, Dot D>
GRANULE_AVX2 void group_tile_q6(const uint8_t* tiles, int64_t n_tiles, const ActivationBlock* x,
                                int64_t x_blocks, float* out, int64_t out_stride, bool ahead) {
  using P = Q6Packed;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i three = _mm256_set1_epi8(3);
  const __m256i offset = _mm256_set1_epi8(32);
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n_tiles; ++b) {
    const uint8_t* tile = tiles + b * P::kTileBytes;
    if (ahead) prefetch_ahead<P::kTileBytes>(tile);
    const __m256 d = f16x8(tile + P::kDOffset);
    for (int s = 0; s < 8; ++s) {
      const int h = s / 4, i = s % 4;
      const ActivationBlock* xb[T];
      for (int t = 0; t < T; ++t) xb[t] = x + t * x_blocks + 8 * b + s;
      const uint8_t* ql = tile + 512 * h + 256 * (i & 1);
      const uint8_t* qh = tile + P::kQhOffset + 256 * h;
      __m256i isum[T];
      for (int t = 0; t < T; ++t) isum[t] = _mm256_setzero_si256();
      for (int half = 0; half < 2; ++half) {
        // AVX2: w = q - 32 by the sign trick, a half's 4 products in i16 pairs, madd with the
        // rows' scales. VNNI: the unsigned q (0..63) straight into i32, Σ (q - 32)·x = Σ q·x -
        // 32·Σx (the block's half sum), then times the scales: the same integers.
        __m256i sums[T];
        for (int t = 0; t < T; ++t) sums[t] = _mm256_setzero_si256();
        for (int k = 4 * half; k < 4 * half + 4; ++k) {
          const __m256i lbits = load(ql + 32 * k);
          const __m256i low = _mm256_and_si256(i < 2 ? lbits : _mm256_srli_epi16(lbits, 4), low4);
          const __m256i high = _mm256_and_si256(
              _mm256_srl_epi16(load(qh + 32 * k), _mm_cvtsi32_si128(2 * i)), three);
          const __m256i q = _mm256_or_si256(low, _mm256_slli_epi16(high, 4));
          if constexpr (D != Dot::Avx2) {
            for (int t = 0; t < T; ++t) sums[t] = dpbusd<D>(sums[t], q, broadcast4(xb[t], k));
          } else {
            const __m256i w = _mm256_sub_epi8(q, offset);
            const __m256i magnitude = _mm256_sign_epi8(w, w);
            for (int t = 0; t < T; ++t)
              sums[t] = _mm256_add_epi16(
                  sums[t],
                  _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(broadcast4(xb[t], k), w)));
          }
        }
        // The 8 rows' scale of these 16 elements: an i32 a lane (VNNI), or in both i16 of it.
        const uint8_t* sc = tile + P::kScOffset + 8 * (2 * s + half);
        const __m256i scales =
            D != Dot::Avx2 ? i8x8(sc) : scale_pairs<true>(sc, _mm256_set1_epi32(-1));
        for (int t = 0; t < T; ++t) {
          if constexpr (D != Dot::Avx2) {
            const __m256i centred =
                _mm256_sub_epi32(sums[t], _mm256_set1_epi32(32 * xb[t]->half_sum[half]));
            isum[t] = _mm256_add_epi32(isum[t], _mm256_mullo_epi32(centred, scales));
          } else {
            isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(sums[t], scales));
          }
        }
      }
      for (int t = 0; t < T; ++t)
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]),
                                 _mm256_mul_ps(d, _mm256_set1_ps(xb[t]->d)), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) _mm256_storeu_ps(out + t * out_stride, acc[t]);
}

// Q2_K and Q3_K's group of 8 rows times T tokens (see Low2Packed).
template <class P, int T>
GRANULE_AVX2 void group_tile_low2(const uint8_t* tiles, int64_t n_tiles, const ActivationBlock* x,
                                  int64_t x_blocks, float* out, int64_t out_stride, bool ahead) {
  const __m256i three = _mm256_set1_epi8(3);
  const __m256i four = _mm256_set1_epi8(4);
  const __m256i all = _mm256_set1_epi32(-1), low4 = _mm256_set1_epi32(0xF);
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n_tiles; ++b) {
    const uint8_t* tile = tiles + b * P::kTileBytes;
    if (ahead) prefetch_ahead<P::kTileBytes>(tile);
    const __m256 d = f16x8(tile + P::kDOffset);
    __m256 neg_dmin = d;
    if constexpr (!P::kQ3)
      neg_dmin = _mm256_xor_ps(f16x8(tile + P::kDOffset + 16), _mm256_set1_ps(-0.0f));
    for (int a = 0; a < 8; ++a) {
      const int h = a / 4, j = a % 4;
      const ActivationBlock* xb[T];
      for (int t = 0; t < T; ++t) xb[t] = x + t * x_blocks + 8 * b + a;
      const uint8_t* qs = tile + 256 * h;
      const __m128i shift = _mm_cvtsi32_si128(2 * j);
      __m256i s16[T][2];
      for (int t = 0; t < T; ++t) s16[t][0] = s16[t][1] = _mm256_setzero_si256();
      for (int k = 0; k < 8; ++k) {
        __m256i v = _mm256_and_si256(_mm256_srl_epi16(load(qs + 32 * k), shift), three);
        if constexpr (P::kQ3) {
          // Bit a of the hmask byte to bit 2: the unsigned value 0..7.
          const __m256i hm = load(tile + P::kHmOffset + 32 * k);
          const __m256i bit = a <= 2 ? _mm256_sll_epi16(hm, _mm_cvtsi32_si128(2 - a))
                                     : _mm256_srl_epi16(hm, _mm_cvtsi32_si128(a - 2));
          v = _mm256_or_si256(v, _mm256_and_si256(bit, four));
        }
        for (int t = 0; t < T; ++t)
          s16[t][k / 4] =
              _mm256_add_epi16(s16[t][k / 4], _mm256_maddubs_epi16(v, broadcast4(xb[t], k)));
      }
      const uint8_t* sc = tile + P::kScOffset + 16 * a;  // sub-blocks 2a and 2a + 1
      const __m256i sc0 = scale_pairs<P::kQ3>(sc, P::kQ3 ? all : low4);
      const __m256i sc1 = scale_pairs<P::kQ3>(sc + 8, P::kQ3 ? all : low4);
      // The pair (sub-block 2a's, 2a + 1's) that multiplies the two halves' activation sums:
      // Q2_K's minimums, Q3_K's scales (the offset 4).
      __m256i pair;
      if constexpr (P::kQ3) {
        pair = _mm256_blend_epi16(sc0, sc1, 0xAA);
      } else {
        const __m256i m0 = _mm256_srli_epi32(u8x8(sc), 4);
        const __m256i m1 = _mm256_srli_epi32(u8x8(sc + 8), 4);
        pair = _mm256_or_si256(m0, _mm256_slli_epi32(m1, 16));
      }
      for (int t = 0; t < T; ++t) {
        int32_t halves;
        std::memcpy(&halves, xb[t]->half_sum, sizeof halves);
        __m256i isum =
            _mm256_add_epi32(_mm256_madd_epi16(s16[t][0], sc0), _mm256_madd_epi16(s16[t][1], sc1));
        const __m256i side = _mm256_madd_epi16(pair, _mm256_set1_epi32(halves));
        const __m256 xd = _mm256_set1_ps(xb[t]->d);
        if constexpr (P::kQ3) {
          isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(side, 2));
          acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d, xd), acc[t]);
        } else {
          acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d, xd), acc[t]);
          acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(side), _mm256_mul_ps(neg_dmin, xd), acc[t]);
        }
      }
    }
  }
  for (int t = 0; t < T; ++t) _mm256_storeu_ps(out + t * out_stride, acc[t]);
}

// IQ4_XS's group of 8 rows times T tokens (see IQ4XSPacked): per sub-block, IQ4_NL's product
// and one FMA with the 8 rows' d·scale.
template <int T, Dot D>
GRANULE_AVX2 void group_tile_iq4_xs(const uint8_t* tiles, int64_t n_tiles, const ActivationBlock* x,
                                    int64_t x_blocks, float* out, int64_t out_stride, bool ahead) {
  using P = IQ4XSPacked;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m128i table128 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues));
  const __m256i table = _mm256_set_m128i(table128, table128);
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n_tiles; ++b) {
    const uint8_t* tile = tiles + b * P::kTileBytes;
    if (ahead) prefetch_ahead<P::kTileBytes>(tile);
    const __m256 d = f16x8(tile + P::kDOffset);
    for (int s = 0; s < 8; ++s) {
      const ActivationBlock* xb[T];
      for (int t = 0; t < T; ++t) xb[t] = x + t * x_blocks + 8 * b + s;
      __m256i isum[T];
      for (int t = 0; t < T; ++t) isum[t] = _mm256_setzero_si256();
      for (int c = 0; c < 4; ++c) {
        const __m256i packed = load(tile + 128 * s + 32 * c);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low4);
        signed_chunk<T, D>(_mm256_shuffle_epi8(table, _mm256_and_si256(packed, low4)), xb, c, isum);
        signed_chunk<T, D>(_mm256_shuffle_epi8(table, hi), xb, c + 4, isum);
      }
      const __m256 dw = _mm256_mul_ps(d, _mm256_cvtepi32_ps(i8x8(tile + P::kScOffset + 8 * s)));
      for (int t = 0; t < T; ++t)
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]),
                                 _mm256_mul_ps(dw, _mm256_set1_ps(xb[t]->d)), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) _mm256_storeu_ps(out + t * out_stride, acc[t]);
}

template <class P, int T, Dot D>
GRANULE_AVX2 inline void any_group_tile(const uint8_t* tiles, int64_t n_tiles,
                                        const ActivationBlock* x, int64_t x_blocks, float* out,
                                        int64_t out_stride, bool ahead) {
  if constexpr (P::kLayout == Layout::Q6K)
    group_tile_q6<T, D>(tiles, n_tiles, x, x_blocks, out, out_stride, ahead);
  else if constexpr (P::kLayout == Layout::Low2)
    group_tile_low2<P, T>(tiles, n_tiles, x, x_blocks, out, out_stride, ahead);
  else if constexpr (P::kLayout == Layout::IQ4XS)
    group_tile_iq4_xs<T, D>(tiles, n_tiles, x, x_blocks, out, out_stride, ahead);
  else if constexpr (P::kLayout == Layout::KQuant)
    group_tile_k<P, T, D>(tiles, n_tiles, x, x_blocks, out, out_stride, ahead);
  else
    group_tile<P, T, D>(tiles, n_tiles, x, x_blocks, out, out_stride, ahead);
}

// Tokens in chunks that stay in L2 while the groups pass over them, four at a time; a group
// cut by the row range is computed whole into `part` and only its rows in range are kept.
template <class P, Dot D>
GRANULE_AVX2 void run_packed(const uint8_t* packed, int64_t n_cols, int64_t row_begin,
                             int64_t row_end, const ActivationBlock* xq, int64_t n_tokens, float* y,
                             int64_t y_stride) {
  const int64_t n_blocks = n_cols / 32, n_tiles = n_cols / P::kBlockCols;
  const size_t group_bytes = static_cast<size_t>(n_tiles) * P::kTileBytes;
  constexpr int64_t kTokenChunk = 64;
  alignas(32) float part[kTokenChunk * 8];
  for (int64_t t0 = 0; t0 < n_tokens; t0 += kTokenChunk) {
    const int64_t t1 = std::min(n_tokens, t0 + kTokenChunk);
    for (int64_t g = row_begin / 8; g * 8 < row_end; ++g) {
      const int64_t r0 = g * 8;
      const uint8_t* tiles = packed + static_cast<size_t>(g) * group_bytes;
      const bool whole = r0 >= row_begin && r0 + 8 <= row_end;
      auto out = [&](int64_t t) { return whole ? y + t * y_stride + r0 : part + (t - t0) * 8; };
      const int64_t stride = whole ? y_stride : 8;
      int64_t t = t0;
      constexpr int kT = P::kTileTokens;
      // Only the first pass over the group's tiles streams them from memory (prefetch_ahead);
      // the chunk's later tokens find them in the caches.
      for (; t + kT <= t1; t += kT)
        any_group_tile<P, kT, D>(tiles, n_tiles, xq + t * n_blocks, n_blocks, out(t), stride,
                                 t == t0);
      for (; t < t1; ++t)
        any_group_tile<P, 1, D>(tiles, n_tiles, xq + t * n_blocks, n_blocks, out(t), stride,
                                t == t0);
      if (!whole) {
        const int64_t lo = std::max(row_begin, r0), hi = std::min(row_end, r0 + 8);
        for (t = t0; t < t1; ++t)
          for (int64_t r = lo; r < hi; ++r) y[t * y_stride + r] = part[(t - t0) * 8 + r - r0];
      }
    }
  }
}

}  // namespace

bool Int8Weights::packs(TensorType type) {
  return kHaveAvx2 && with_packed(type, [](auto) {});
}

Int8Weights::Int8Weights(TensorType type, const void* w, int64_t rows, int64_t n_cols)
    : type_(type), rows_(rows), cols_(n_cols) {
  if (!packs(type)) return;  // supports() said no: nothing to run
  with_packed(type, [&](auto p) {
    using P = decltype(p);
    const int64_t n_tiles = n_cols / P::kBlockCols;
    packed_.resize(static_cast<size_t>((rows + 7) / 8 * n_tiles) * P::kTileBytes);
    if constexpr (P::kLayout == Layout::Q6K)
      pack_q6_k(static_cast<const uint8_t*>(w), rows, n_tiles, packed_.data());
    else if constexpr (P::kLayout == Layout::Low2)
      pack_low2<P>(static_cast<const uint8_t*>(w), rows, n_tiles, packed_.data());
    else if constexpr (P::kLayout == Layout::IQ4XS)
      pack_iq4_xs(static_cast<const uint8_t*>(w), rows, n_tiles, packed_.data());
    else if constexpr (P::kLayout == Layout::KQuant)
      pack_k<P>(static_cast<const uint8_t*>(w), rows, n_tiles, packed_.data());
    else
      pack<P>(static_cast<const uint8_t*>(w), rows, n_tiles, packed_.data());
  });
}

void Int8Weights::matmul_rows(int64_t row_begin, int64_t row_end, const ActivationBlock* xq,
                              int64_t n_tokens, float* y, int64_t y_stride) const {
  with_packed(type_, [&](auto p) {
    using P = decltype(p);
    switch (g_dot.load(std::memory_order_relaxed)) {
      case Dot::Avx512Vnni:
        return run_packed<P, Dot::Avx512Vnni>(packed_.data(), cols_, row_begin, row_end, xq,
                                              n_tokens, y, y_stride);
      case Dot::AvxVnni:
        return run_packed<P, Dot::AvxVnni>(packed_.data(), cols_, row_begin, row_end, xq, n_tokens,
                                           y, y_stride);
      case Dot::Avx2:
        break;
    }
    run_packed<P, Dot::Avx2>(packed_.data(), cols_, row_begin, row_end, xq, n_tokens, y, y_stride);
  });
}

bool Int8Weights::has_vnni() { return kHaveVnni512 || kHaveAvxVnni; }

bool Int8Weights::use_dot_for_testing(DotForm form) {
  if (!runs(form)) return false;
  g_dot.store(form, std::memory_order_relaxed);
  return true;
}

void Int8Weights::use_best_dot() { g_dot.store(best_dot(), std::memory_order_relaxed); }

#else  // not x86: nothing packs (supports() is false)

bool Int8Weights::packs(TensorType) { return false; }
bool Int8Weights::has_vnni() { return false; }
bool Int8Weights::use_dot_for_testing(DotForm) { return false; }
void Int8Weights::use_best_dot() {}

Int8Weights::Int8Weights(TensorType type, const void*, int64_t rows, int64_t n_cols)
    : type_(type), rows_(rows), cols_(n_cols) {}

void Int8Weights::matmul_rows(int64_t, int64_t, const ActivationBlock*, int64_t, float*,
                              int64_t) const {}

#endif

bool Int8Weights::supports(TensorType type, int64_t n_cols) {
  return int8_matmul_supports(type, n_cols);
}

}  // namespace granule::cpu
