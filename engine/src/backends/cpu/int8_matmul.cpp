// The int8 matmul kernels (see int8_matmul.h). Each weight type unpacks a sub-block of 32 into
// 32 bytes (signed values, or unsigned values with a minimum) and its f32 scale; one product
// routine multiplies them with an activation block: maddubs (u8 × s8 pairs to i16), madd to
// eight i32 lanes, converted and scaled by d_w·d_x into an f32 accumulator. Signed weights use
// the sign trick (|w| × sign(x, w)). A tile of R rows × T tokens unpacks each weight sub-block
// once for T tokens.
#include "backends/cpu/int8_matmul.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "granule/block_formats.h"
#include "granule/quant.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define GRANULE_INT8_X86 1
#endif

namespace granule::cpu {

namespace {

// Portable quantiser: the AVX2 one rounds the same way (x · (1/d) to nearest, ties to even).
void quantize_portable(const float* x, int64_t n, ActivationBlock* out) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* v = x + 32 * b;
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(v[i]));
    const float d = amax / 127.0f;
    const float inverse = amax == 0.0f ? 0.0f : 1.0f / d;
    int sum = 0;
    for (int i = 0; i < 32; ++i) {
      const int q = static_cast<int>(std::nearbyint(v[i] * inverse));
      out[b].qs[i] = static_cast<int8_t>(q);
      sum += q;
    }
    out[b].d = d;
    out[b].sum = d * static_cast<float>(sum);
    out[b].qsum = sum;
  }
}

}  // namespace

#ifdef GRANULE_INT8_X86
namespace {

#define GRANULE_AVX2 __attribute__((target("avx2,fma,f16c")))

const bool kHaveAvx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                       __builtin_cpu_supports("f16c");

GRANULE_AVX2 inline float half(uint16_t h) { return _cvtsh_ss(h); }

GRANULE_AVX2 inline float hsum(__m256 v) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

GRANULE_AVX2 void quantize_avx2(const float* x, int64_t n, ActivationBlock* out) {
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* v = x + 32 * b;
    __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + 8);
    __m256 v2 = _mm256_loadu_ps(v + 16), v3 = _mm256_loadu_ps(v + 24);
    __m256 m = _mm256_max_ps(
        _mm256_max_ps(_mm256_andnot_ps(sign_bit, v0), _mm256_andnot_ps(sign_bit, v1)),
        _mm256_max_ps(_mm256_andnot_ps(sign_bit, v2), _mm256_andnot_ps(sign_bit, v3)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    const float amax = _mm_cvtss_f32(m4);
    const float d = amax / 127.0f;
    const __m256 inverse = _mm256_set1_ps(amax == 0.0f ? 0.0f : 1.0f / d);
    // cvtps rounds in the current mode: to nearest, ties to even.
    __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, inverse));
    __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, inverse));
    __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, inverse));
    __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, inverse));
    const __m256i s = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
    const int sum = _mm_cvtsi128_si32(s4);
    // i32 to i8 in element order: the packs interleave 128-bit lanes, the permute undoes it.
    i0 = _mm256_packs_epi32(i0, i1);
    i2 = _mm256_packs_epi32(i2, i3);
    i0 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(i0, i2), order);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[b].qs), i0);
    out[b].d = d;
    out[b].sum = d * static_cast<float>(sum);
    out[b].qsum = sum;
  }
}

// How a weight sub-block's bytes meet the activation's.
enum class Kind {
  Signed,          // int8 weights: |w| × sign(x, w)
  Unsigned,        // uint8 weights (and a minimum)
  SignedScaled16,  // int8 weights, an int16 scale per 16 (Q6_K): madd with the scales
};

// One weight sub-block of 32, ready for the product.
struct Sub {
  __m256i q;
  __m256i scales;  // SignedScaled16 only
  float d;         // (a minimum, the value of q = 0, is K::row_minimums')
};

// 16 bytes of nibbles to 32 values: low nibbles are elements 0-15, high nibbles 16-31.
GRANULE_AVX2 inline __m256i nibbles(const uint8_t* qs) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(v, 4), v);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// 32 bits (bit j for element j) to bytes of 0x10 where set.
GRANULE_AVX2 inline __m256i fifth_bits(const uint8_t* qh) {
  uint32_t bits;
  std::memcpy(&bits, qh, sizeof bits);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
  // Byte k of each 8 keeps bit k: OR with every other bit set, then compare with all ones.
  const __m256i others = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
  const __m256i set = _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi64x(-1));
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

struct NoState {};

struct KQ4_0 {
  using Block = BlockQ4_0;
  static constexpr int kSubs = 1;
  static constexpr Kind kKind = Kind::Signed;
  static constexpr bool kMin = false;
  static constexpr int kDecodeRows = 4;
  using State = NoState;
  GRANULE_AVX2 static State prepare(const Block&) { return {}; }
  GRANULE_AVX2 static void unpack(const Block& b, const State&, int, Sub& s) {
    s.q = _mm256_sub_epi8(nibbles(b.qs), _mm256_set1_epi8(8));
    s.d = half(b.d);
  }
};

// Σ_b m_b · sums[b] over a row of blocks with an fp16 minimum m, eight blocks a step (their
// minimums gathered and converted together), in one fixed order.
template <class Block>
GRANULE_AVX2 inline float block_minimum_dot(const Block* row, int64_t n, const float* sums) {
  __m256 acc = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 8 <= n; b += 8) {
    const Block* r = row + b;
    const __m128i m16 = _mm_setr_epi16(static_cast<int16_t>(r[0].m), static_cast<int16_t>(r[1].m),
                                       static_cast<int16_t>(r[2].m), static_cast<int16_t>(r[3].m),
                                       static_cast<int16_t>(r[4].m), static_cast<int16_t>(r[5].m),
                                       static_cast<int16_t>(r[6].m), static_cast<int16_t>(r[7].m));
    acc = _mm256_fmadd_ps(_mm256_cvtph_ps(m16), _mm256_loadu_ps(sums + b), acc);
  }
  float sum = hsum(acc);
  for (; b < n; ++b) sum = std::fma(half(row[b].m), sums[b], sum);
  return sum;
}

struct KQ4_1 {
  using Block = BlockQ4_1;
  static constexpr int kSubs = 1;
  static constexpr Kind kKind = Kind::Unsigned;
  static constexpr bool kMin = true;
  static constexpr int kDecodeRows = 4;
  using State = NoState;
  GRANULE_AVX2 static float minimum_dot(const Block* row, int64_t n, const float* sums) {
    return block_minimum_dot(row, n, sums);
  }
  GRANULE_AVX2 static State prepare(const Block&) { return {}; }
  GRANULE_AVX2 static void unpack(const Block& b, const State&, int, Sub& s) {
    s.q = nibbles(b.qs);
    s.d = half(b.d);
  }
};

struct KQ5_0 {
  using Block = BlockQ5_0;
  static constexpr int kSubs = 1;
  static constexpr Kind kKind = Kind::Signed;
  static constexpr bool kMin = false;
  static constexpr int kDecodeRows = 4;
  using State = NoState;
  GRANULE_AVX2 static State prepare(const Block&) { return {}; }
  GRANULE_AVX2 static void unpack(const Block& b, const State&, int, Sub& s) {
    s.q = _mm256_sub_epi8(_mm256_or_si256(nibbles(b.qs), fifth_bits(b.qh)), _mm256_set1_epi8(16));
    s.d = half(b.d);
  }
};

struct KQ5_1 {
  using Block = BlockQ5_1;
  static constexpr int kSubs = 1;
  static constexpr Kind kKind = Kind::Unsigned;
  static constexpr bool kMin = true;
  static constexpr int kDecodeRows = 4;
  using State = NoState;
  GRANULE_AVX2 static float minimum_dot(const Block* row, int64_t n, const float* sums) {
    return block_minimum_dot(row, n, sums);
  }
  GRANULE_AVX2 static State prepare(const Block&) { return {}; }
  GRANULE_AVX2 static void unpack(const Block& b, const State&, int, Sub& s) {
    s.q = _mm256_or_si256(nibbles(b.qs), fifth_bits(b.qh));
    s.d = half(b.d);
  }
};

struct KQ8_0 {
  using Block = BlockQ8_0;
  static constexpr int kSubs = 1;
  static constexpr Kind kKind = Kind::Signed;
  static constexpr bool kMin = false;
  static constexpr int kDecodeRows = 1;
  using State = NoState;
  GRANULE_AVX2 static State prepare(const Block&) { return {}; }
  GRANULE_AVX2 static void unpack(const Block& b, const State&, int, Sub& s) {
    s.q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs));
    s.d = half(b.d);
  }
};

struct KIQ4_NL {
  using Block = BlockIQ4_NL;
  static constexpr int kSubs = 1;
  static constexpr Kind kKind = Kind::Signed;
  static constexpr bool kMin = false;
  static constexpr int kDecodeRows = 4;
  using State = NoState;
  GRANULE_AVX2 static State prepare(const Block&) { return {}; }
  GRANULE_AVX2 static void unpack(const Block& b, const State&, int, Sub& s) {
    const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues));
    s.q = _mm256_shuffle_epi8(_mm256_set_m128i(table, table), nibbles(b.qs));
    s.d = half(b.d);
  }
};

// Q4_K and Q5_K: eight sub-blocks of 32 with 6-bit scales and minimums (the 12 packed bytes).
struct KScalesMins {
  float d[8];
  float m[8];
};
GRANULE_AVX2 inline KScalesMins k_scales_mins(uint16_t d16, uint16_t dmin16, const uint8_t* q) {
  KScalesMins s;
  const float d = half(d16), dmin = half(dmin16);
  for (int j = 0; j < 8; ++j) {
    int sc, mn;
    if (j < 4) {
      sc = q[j] & 63;
      mn = q[j + 4] & 63;
    } else {
      sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
      mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
    // The decoder's d·sc·q - dmin·m: the same two products.
    s.d[j] = d * static_cast<float>(sc);
    s.m[j] = -(dmin * static_cast<float>(mn));
  }
  return s;
}

// Σ over a K-quant row's sub-blocks of minimum · sums[sub], one super-block (8) a step.
template <class Block>
GRANULE_AVX2 inline float k_minimum_dot(const Block* row, int64_t n, const float* sums) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n; ++b) {
    const KScalesMins st = k_scales_mins(row[b].d, row[b].dmin, row[b].scales);
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(st.m), _mm256_loadu_ps(sums + 8 * b), acc);
  }
  return hsum(acc);
}

// Sub-block `sub` of a K quant's 128 bytes of nibbles: 32 bytes per pair, low nibbles first.
GRANULE_AVX2 inline __m256i k_nibbles(const uint8_t* qs, int sub) {
  const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * (sub / 2)));
  const __m256i shifted = (sub & 1) ? _mm256_srli_epi16(bytes, 4) : bytes;
  return _mm256_and_si256(shifted, _mm256_set1_epi8(0x0F));
}

struct KQ4_K {
  using Block = BlockQ4_K;
  static constexpr int kSubs = 8;
  static constexpr Kind kKind = Kind::Unsigned;
  static constexpr bool kMin = true;
  static constexpr int kDecodeRows = 4;
  using State = KScalesMins;
  GRANULE_AVX2 static float minimum_dot(const Block* row, int64_t n, const float* sums) {
    return k_minimum_dot(row, n, sums);
  }
  GRANULE_AVX2 static State prepare(const Block& b) { return k_scales_mins(b.d, b.dmin, b.scales); }
  GRANULE_AVX2 static void unpack(const Block& b, const State& st, int sub, Sub& s) {
    s.q = k_nibbles(b.qs, sub);
    s.d = st.d[sub];
  }
};

struct KQ5_K {
  using Block = BlockQ5_K;
  static constexpr int kSubs = 8;
  static constexpr Kind kKind = Kind::Unsigned;
  static constexpr bool kMin = true;
  static constexpr int kDecodeRows = 4;
  using State = KScalesMins;
  GRANULE_AVX2 static float minimum_dot(const Block* row, int64_t n, const float* sums) {
    return k_minimum_dot(row, n, sums);
  }
  GRANULE_AVX2 static State prepare(const Block& b) { return k_scales_mins(b.d, b.dmin, b.scales); }
  GRANULE_AVX2 static void unpack(const Block& b, const State& st, int sub, Sub& s) {
    // The fifth bit of sub-block `sub` is bit `sub` of qh[l].
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh));
    const __m256i bit =
        _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(sub)), _mm256_set1_epi8(1));
    s.q = _mm256_or_si256(k_nibbles(b.qs, sub), _mm256_slli_epi16(bit, 4));
    s.d = st.d[sub];
  }
};

// Q6_K: sub-block k = 4h + i of half h: low 4 bits from ql[64h + 32(i & 1) + l] (low nibble
// for i < 2, high for i >= 2), high 2 bits from qh[32h + l] >> 2i, minus 32; scale per 16.
struct KQ6_K {
  using Block = BlockQ6_K;
  static constexpr int kSubs = 8;
  static constexpr Kind kKind = Kind::SignedScaled16;
  static constexpr bool kMin = false;
  static constexpr int kDecodeRows = 1;
  struct State {
    float d;
  };
  GRANULE_AVX2 static State prepare(const Block& b) { return {half(b.d)}; }
  GRANULE_AVX2 static void unpack(const Block& b, const State& st, int sub, Sub& s) {
    const int h = sub / 4, i = sub % 4;
    const __m256i ql =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * h + 32 * (i & 1)));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + 32 * h));
    const __m256i low =
        _mm256_and_si256(i < 2 ? ql : _mm256_srli_epi16(ql, 4), _mm256_set1_epi8(0x0F));
    const __m256i high =
        _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * i)), _mm256_set1_epi8(3));
    s.q = _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(high, 4)), _mm256_set1_epi8(32));
    const int8_t* sc = b.scales + 8 * h + 2 * i;
    s.scales = _mm256_set_m128i(_mm_set1_epi16(sc[1]), _mm_set1_epi16(sc[0]));
    s.d = st.d;
  }
};

// Σ w·x of one sub-block as eight f32 lanes (exact integers; the scales apply outside).
template <Kind kKind>
GRANULE_AVX2 inline __m256 product(const Sub& w, __m256i x) {
  __m256i pairs;
  if constexpr (kKind == Kind::Unsigned) {
    pairs = _mm256_maddubs_epi16(w.q, x);
  } else {
    pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(w.q, w.q), _mm256_sign_epi8(x, w.q));
  }
  const __m256i factors = kKind == Kind::SignedScaled16 ? w.scales : _mm256_set1_epi16(1);
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, factors));
}

// R rows from r0 times T tokens from t0, the minimums left out (run() adds them).
template <class K, int R, int T>
GRANULE_AVX2 void tile(const uint8_t* w, size_t stride, int64_t r0, const ActivationBlock* xq,
                       int64_t x_blocks, int64_t t0, int64_t n_blocks, float* y, int64_t y_stride) {
  using Block = typename K::Block;
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  const Block* rows[R];
  for (int r = 0; r < R; ++r)
    rows[r] = reinterpret_cast<const Block*>(w + static_cast<size_t>(r0 + r) * stride);
  const ActivationBlock* xs[T];
  for (int t = 0; t < T; ++t) xs[t] = xq + (t0 + t) * x_blocks;
  for (int64_t b = 0; b < n_blocks; ++b) {
    typename K::State state[R];
    for (int r = 0; r < R; ++r) state[r] = K::prepare(rows[r][b]);
    for (int sub = 0; sub < K::kSubs; ++sub) {
      Sub ws[R];
      for (int r = 0; r < R; ++r) K::unpack(rows[r][b], state[r], sub, ws[r]);
      for (int t = 0; t < T; ++t) {
        const ActivationBlock& xb = xs[t][b * K::kSubs + sub];
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.qs));
        for (int r = 0; r < R; ++r) {
          acc[r][t] = _mm256_fmadd_ps(product<K::kKind>(ws[r], xv), _mm256_set1_ps(ws[r].d * xb.d),
                                      acc[r][t]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) y[(t0 + t) * y_stride + r0 + r] = hsum(acc[r][t]);
}

// Tokens in chunks that stay in L1/L2 while the rows pass over them; rows in pairs (one
// token: in fours) and tokens in fours inside a chunk.
template <class K>
GRANULE_AVX2 void run_tiles(const uint8_t* base, size_t stride, int64_t row_begin, int64_t row_end,
                            const ActivationBlock* xq, int64_t x_blocks, int64_t n_tokens,
                            int64_t n_blocks, float* y, int64_t y_stride) {
  if (n_tokens == 1) {
    int64_t r = row_begin;
    // Four rows share each activation load, except where one row at a time streams the
    // matrix faster from memory (Q8_0: 30 MB head 1.8 against 3.7 ms; Q6_K).
    if constexpr (K::kDecodeRows == 4)
      for (; r + 4 <= row_end; r += 4)
        tile<K, 4, 1>(base, stride, r, xq, x_blocks, 0, n_blocks, y, y_stride);
    for (; r < row_end; ++r) tile<K, 1, 1>(base, stride, r, xq, x_blocks, 0, n_blocks, y, y_stride);
    return;
  }
  constexpr int64_t kTokenChunk = 64;
  for (int64_t t0 = 0; t0 < n_tokens; t0 += kTokenChunk) {
    const int64_t t1 = std::min(n_tokens, t0 + kTokenChunk);
    int64_t r = row_begin;
    for (; r + 2 <= row_end; r += 2) {
      int64_t t = t0;
      for (; t + 4 <= t1; t += 4)
        tile<K, 2, 4>(base, stride, r, xq, x_blocks, t, n_blocks, y, y_stride);
      for (; t < t1; ++t) tile<K, 2, 1>(base, stride, r, xq, x_blocks, t, n_blocks, y, y_stride);
    }
    for (; r < row_end; ++r) {
      int64_t t = t0;
      for (; t + 4 <= t1; t += 4)
        tile<K, 1, 4>(base, stride, r, xq, x_blocks, t, n_blocks, y, y_stride);
      for (; t < t1; ++t) tile<K, 1, 1>(base, stride, r, xq, x_blocks, t, n_blocks, y, y_stride);
    }
  }
}

template <class K>
GRANULE_AVX2 void run(const void* w, int64_t row_begin, int64_t row_end, int64_t n_cols,
                      const ActivationBlock* xq, int64_t n_tokens, float* y, int64_t y_stride) {
  const auto* base = static_cast<const uint8_t*>(w);
  const size_t stride = sizeof(typename K::Block) * static_cast<size_t>(n_cols / (32 * K::kSubs));
  const int64_t n_blocks = n_cols / (32 * K::kSubs);
  const int64_t x_blocks = n_cols / 32;
  run_tiles<K>(base, stride, row_begin, row_end, xq, x_blocks, n_tokens, n_blocks, y, y_stride);
  if constexpr (K::kMin) {
    // The weight blocks' minimums times the activation sums, Σ_b m_b · sum_b per row and
    // token: 1/32 of the work, as f32 dots over the blocks (the tiles leave it out: a scalar
    // term per block and pair cost more than the integer products).
    thread_local std::vector<float> sums;
    sums.resize(static_cast<size_t>(n_tokens * x_blocks));
    for (int64_t i = 0; i < n_tokens * x_blocks; ++i) sums[static_cast<size_t>(i)] = xq[i].sum;
    for (int64_t r = row_begin; r < row_end; ++r) {
      const auto* row =
          reinterpret_cast<const typename K::Block*>(base + static_cast<size_t>(r) * stride);
      for (int64_t t = 0; t < n_tokens; ++t)
        y[t * y_stride + r] += K::minimum_dot(row, n_blocks, sums.data() + t * x_blocks);
    }
  }
}

}  // namespace

bool int8_matmul_supports(TensorType type, int64_t n_cols) {
  if (!kHaveAvx2 || n_cols <= 0) return false;
  switch (type) {
    case TensorType::Q4_0:
    case TensorType::Q4_1:
    case TensorType::Q5_0:
    case TensorType::Q5_1:
    case TensorType::Q8_0:
    case TensorType::IQ4_NL:
      return n_cols % kQK == 0;
    case TensorType::Q4_K:
    case TensorType::Q5_K:
    case TensorType::Q6_K:
      return n_cols % kQK_K == 0;
    default:
      return false;
  }
}

void quantize_activations(const float* x, int64_t n, ActivationBlock* out) {
  if (kHaveAvx2)
    quantize_avx2(x, n, out);
  else
    quantize_portable(x, n, out);
}

void int8_matmul_rows(TensorType type, const void* w, int64_t row_begin, int64_t row_end,
                      int64_t n_cols, const ActivationBlock* xq, int64_t n_tokens, float* y,
                      int64_t y_stride) {
  switch (type) {
    case TensorType::Q4_0:
      return run<KQ4_0>(w, row_begin, row_end, n_cols, xq, n_tokens, y, y_stride);
    case TensorType::Q4_1:
      return run<KQ4_1>(w, row_begin, row_end, n_cols, xq, n_tokens, y, y_stride);
    case TensorType::Q5_0:
      return run<KQ5_0>(w, row_begin, row_end, n_cols, xq, n_tokens, y, y_stride);
    case TensorType::Q5_1:
      return run<KQ5_1>(w, row_begin, row_end, n_cols, xq, n_tokens, y, y_stride);
    case TensorType::Q8_0:
      return run<KQ8_0>(w, row_begin, row_end, n_cols, xq, n_tokens, y, y_stride);
    case TensorType::IQ4_NL:
      return run<KIQ4_NL>(w, row_begin, row_end, n_cols, xq, n_tokens, y, y_stride);
    case TensorType::Q4_K:
      return run<KQ4_K>(w, row_begin, row_end, n_cols, xq, n_tokens, y, y_stride);
    case TensorType::Q5_K:
      return run<KQ5_K>(w, row_begin, row_end, n_cols, xq, n_tokens, y, y_stride);
    case TensorType::Q6_K:
      return run<KQ6_K>(w, row_begin, row_end, n_cols, xq, n_tokens, y, y_stride);
    default:
      return;
  }
}

#else  // not x86: no int8 kernels; the exact path runs everything

bool int8_matmul_supports(TensorType, int64_t) { return false; }
void quantize_activations(const float* x, int64_t n, ActivationBlock* out) {
  quantize_portable(x, n, out);
}
void int8_matmul_rows(TensorType, const void*, int64_t, int64_t, int64_t, const ActivationBlock*,
                      int64_t, float*, int64_t) {}

#endif

}  // namespace granule::cpu
