// Portable and AVX2 row kernels (see row_kernels.h). Dot products accumulate with fused
// multiply-add (std::fma in the portable code), decoders multiply and add separately as
// ggml's reference does, so every rounding step matches between the two.
#include "backends/cpu/row_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "granule/quant.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define GRANULE_CPU_X86 1
#endif

namespace granule::cpu {

float dot_f32_portable(const float* a, const float* b, int64_t n) {
  constexpr int kLanes = 32;
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] = std::fma(a[i + j], b[i + j], acc[j]);
  }
  for (int width = kLanes / 2; width > 0; width /= 2) {
    for (int j = 0; j < width; ++j) acc[j] += acc[j + width];
  }
  float tail = 0.0f;
  for (; i < n; ++i) tail = std::fma(a[i], b[i], tail);
  return acc[0] + tail;
}

#ifdef GRANULE_CPU_X86
namespace {

__attribute__((target("avx2,fma,f16c"))) float horizontal_halving_sum(__m256 v) {
  // lanes j += j+4, then j += j+2, then j += j+1: the portable halving order.
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  __m128 s4 = _mm_add_ps(lo, hi);
  __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
  return _mm_cvtss_f32(s1);
}

__attribute__((target("avx2,fma,f16c"))) float dot_f32_avx2(const float* a, const float* b,
                                                            int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), acc2);
    acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), acc3);
  }
  // Lanes 0-15 += lanes 16-31, then 0-7 += 8-15, then within the register.
  const __m256 s16a = _mm256_add_ps(acc0, acc2);
  const __m256 s16b = _mm256_add_ps(acc1, acc3);
  const float total = horizontal_halving_sum(_mm256_add_ps(s16a, s16b));
  float tail = 0.0f;
  for (; i < n; ++i) tail = std::fma(a[i], b[i], tail);
  return total + tail;
}

// One fp16 scale to f32 in a register (exact, as fp16_to_f32, without the call).
__attribute__((target("avx2,fma,f16c"))) inline __m256 broadcast_fp16(uint16_t h) {
  return _mm256_set1_ps(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h))));
}

// Eight unsigned bytes to eight floats.
__attribute__((target("avx2,fma,f16c"))) inline __m256 u8x8_to_ps(__m128i bytes) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
}

__attribute__((target("avx2,fma,f16c"))) void decode_q4_1_avx2(const BlockQ4_1* blocks, float* out,
                                                               int64_t n) {
  const __m128i low_mask = _mm_set1_epi8(0x0F);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const __m256 d = broadcast_fp16(blocks[b].d);
    const __m256 m = broadcast_fp16(blocks[b].m);
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks[b].qs));
    const __m128i lo = _mm_and_si128(q, low_mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), low_mask);
    float* y = out + b * kQK;
    _mm256_storeu_ps(y, _mm256_add_ps(_mm256_mul_ps(u8x8_to_ps(lo), d), m));
    _mm256_storeu_ps(y + 8, _mm256_add_ps(_mm256_mul_ps(u8x8_to_ps(_mm_srli_si128(lo, 8)), d), m));
    _mm256_storeu_ps(y + 16, _mm256_add_ps(_mm256_mul_ps(u8x8_to_ps(hi), d), m));
    _mm256_storeu_ps(y + 24, _mm256_add_ps(_mm256_mul_ps(u8x8_to_ps(_mm_srli_si128(hi, 8)), d), m));
  }
}

// Eight 4-bit values to (q - 8) · d, as ggml decodes Q4_0.
__attribute__((target("avx2,fma,f16c"))) inline __m256 q4_0x8_to_ps(__m128i bytes, __m256 d) {
  const __m256i centred = _mm256_sub_epi32(_mm256_cvtepu8_epi32(bytes), _mm256_set1_epi32(8));
  return _mm256_mul_ps(_mm256_cvtepi32_ps(centred), d);
}

__attribute__((target("avx2,fma,f16c"))) void decode_q4_0_avx2(const BlockQ4_0* blocks, float* out,
                                                               int64_t n) {
  const __m128i low_mask = _mm_set1_epi8(0x0F);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const __m256 d = broadcast_fp16(blocks[b].d);
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks[b].qs));
    const __m128i lo = _mm_and_si128(q, low_mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), low_mask);
    float* y = out + b * kQK;
    _mm256_storeu_ps(y, q4_0x8_to_ps(lo, d));
    _mm256_storeu_ps(y + 8, q4_0x8_to_ps(_mm_srli_si128(lo, 8), d));
    _mm256_storeu_ps(y + 16, q4_0x8_to_ps(hi, d));
    _mm256_storeu_ps(y + 24, q4_0x8_to_ps(_mm_srli_si128(hi, 8), d));
  }
}

__attribute__((target("avx2,fma,f16c"))) void decode_q8_0_avx2(const BlockQ8_0* blocks, float* out,
                                                               int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b) {
    const __m256 d = broadcast_fp16(blocks[b].d);
    const auto* q = reinterpret_cast<const uint8_t*>(blocks[b].qs);
    float* y = out + b * kQK;
    for (int k = 0; k < kQK; k += 8) {
      const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + k));
      _mm256_storeu_ps(y + k, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)), d));
    }
  }
}

__attribute__((target("avx2,fma,f16c"))) void decode_f16_avx2(const uint16_t* h, float* out,
                                                              int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
  }
  for (; i < n; ++i) out[i] = fp16_to_f32(h[i]);
}

__attribute__((target("avx2,fma,f16c"))) void decode_bf16_avx2(const uint16_t* h, float* out,
                                                               int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i wide =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i)));
    _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16)));
  }
  for (; i < n; ++i) out[i] = bf16_to_f32(h[i]);
}

// Decode-and-dot without the f32 row in between, for one token. Each block of 32 is one
// 32-lane chunk of dot_f32_avx2 (values 0-7 in acc0, ..., 24-31 in acc3) and each value is
// decoded with the same operations, so the result has the same bits as decode + dot.
__attribute__((target("avx2,fma,f16c"))) float finish_dot(__m256 acc0, __m256 acc1, __m256 acc2,
                                                          __m256 acc3) {
  return horizontal_halving_sum(
             _mm256_add_ps(_mm256_add_ps(acc0, acc2), _mm256_add_ps(acc1, acc3))) +
         0.0f;
}

__attribute__((target("avx2,fma,f16c"))) float dot_q4_1_avx2(const BlockQ4_1* blocks,
                                                             const float* x, int64_t n) {
  const __m128i low_mask = _mm_set1_epi8(0x0F);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK; ++b) {
    const __m256 d = broadcast_fp16(blocks[b].d);
    const __m256 m = broadcast_fp16(blocks[b].m);
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks[b].qs));
    const __m128i lo = _mm_and_si128(q, low_mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), low_mask);
    const float* xb = x + b * kQK;
    const __m256 v0 = _mm256_add_ps(_mm256_mul_ps(u8x8_to_ps(lo), d), m);
    const __m256 v1 = _mm256_add_ps(_mm256_mul_ps(u8x8_to_ps(_mm_srli_si128(lo, 8)), d), m);
    const __m256 v2 = _mm256_add_ps(_mm256_mul_ps(u8x8_to_ps(hi), d), m);
    const __m256 v3 = _mm256_add_ps(_mm256_mul_ps(u8x8_to_ps(_mm_srli_si128(hi, 8)), d), m);
    acc0 = _mm256_fmadd_ps(v0, _mm256_loadu_ps(xb), acc0);
    acc1 = _mm256_fmadd_ps(v1, _mm256_loadu_ps(xb + 8), acc1);
    acc2 = _mm256_fmadd_ps(v2, _mm256_loadu_ps(xb + 16), acc2);
    acc3 = _mm256_fmadd_ps(v3, _mm256_loadu_ps(xb + 24), acc3);
  }
  return finish_dot(acc0, acc1, acc2, acc3);
}

__attribute__((target("avx2,fma,f16c"))) float dot_q4_0_avx2(const BlockQ4_0* blocks,
                                                             const float* x, int64_t n) {
  const __m128i low_mask = _mm_set1_epi8(0x0F);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK; ++b) {
    const __m256 d = broadcast_fp16(blocks[b].d);
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks[b].qs));
    const __m128i lo = _mm_and_si128(q, low_mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), low_mask);
    const float* xb = x + b * kQK;
    acc0 = _mm256_fmadd_ps(q4_0x8_to_ps(lo, d), _mm256_loadu_ps(xb), acc0);
    acc1 = _mm256_fmadd_ps(q4_0x8_to_ps(_mm_srli_si128(lo, 8), d), _mm256_loadu_ps(xb + 8), acc1);
    acc2 = _mm256_fmadd_ps(q4_0x8_to_ps(hi, d), _mm256_loadu_ps(xb + 16), acc2);
    acc3 = _mm256_fmadd_ps(q4_0x8_to_ps(_mm_srli_si128(hi, 8), d), _mm256_loadu_ps(xb + 24), acc3);
  }
  return finish_dot(acc0, acc1, acc2, acc3);
}

__attribute__((target("avx2,fma,f16c"))) float dot_q8_0_avx2(const BlockQ8_0* blocks,
                                                             const float* x, int64_t n) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  for (int64_t b = 0; b < n / kQK; ++b) {
    const __m256 d = broadcast_fp16(blocks[b].d);
    const auto* q = reinterpret_cast<const uint8_t*>(blocks[b].qs);
    const float* xb = x + b * kQK;
    for (int k = 0; k < 4; ++k) {
      const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8 * k));
      const __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)), d);
      acc[k] = _mm256_fmadd_ps(v, _mm256_loadu_ps(xb + 8 * k), acc[k]);
    }
  }
  return finish_dot(acc[0], acc[1], acc[2], acc[3]);
}

__attribute__((target("avx2,fma,f16c"))) void add_scaled_avx2(float* out, const float* v, float p,
                                                              int64_t n) {
  const __m256 scale = _mm256_set1_ps(p);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 product = _mm256_mul_ps(scale, _mm256_loadu_ps(v + i));
    _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(out + i), product));
  }
  for (; i < n; ++i) out[i] = out[i] + p * v[i];
}

// e^x for x in about [-87, 88] (below: 0; above: clamped): x = n·ln2 + r with |r| <= ln2/2,
// e^r by its Taylor polynomial to r^6 (error about 1e-7 relative), times 2^n built in the
// exponent bits.
__attribute__((target("avx2,fma,f16c"))) inline __m256 exp_avx2(__m256 x) {
  const __m256 too_small = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
  x = _mm256_min_ps(x, _mm256_set1_ps(88.0f));
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i bits =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(too_small, _mm256_mul_ps(p, _mm256_castsi256_ps(bits)));
}

__attribute__((target("avx2,fma,f16c"))) float exp_shifted_sum_avx2(float* x, int64_t n,
                                                                    float shift) {
  const __m256 s = _mm256_set1_ps(shift);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + i), s));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  float sum = horizontal_halving_sum(acc);
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - shift);
    sum += x[i];
  }
  return sum;
}

__attribute__((target("avx2,fma,f16c"))) void swiglu_avx2(const float* gate, const float* up,
                                                          float* out, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = exp_avx2(_mm256_xor_ps(g, sign));
    const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

// Attention for one query over `length` keys, head_dim = 8 * kChunks.
#define GRANULE_ROW_AVX2 __attribute__((target("avx2,fma,f16c")))

// The query times the scale, in registers.
template <int kChunks>
GRANULE_ROW_AVX2 inline void scaled_query(const float* q, float scale, __m256* qv) {
  for (int c = 0; c < kChunks; ++c)
    qv[c] = _mm256_mul_ps(_mm256_loadu_ps(q + 8 * c), _mm256_set1_ps(scale));
}

// Scores of keys t..t+3 (t a multiple of 4): four 8-lane dots, summed horizontally together
// (pairs, then quads, then the two 128-bit halves).
template <int kChunks>
GRANULE_ROW_AVX2 inline void four_scores(const __m256* qv, const float* k, int64_t stride,
                                         int64_t t, float* scores) {
  __m256 acc[4];
  for (int j = 0; j < 4; ++j) {
    const float* kt = k + (t + j) * stride;
    _mm_prefetch(reinterpret_cast<const char*>(kt + 8 * stride), _MM_HINT_T0);
    acc[j] = _mm256_mul_ps(qv[0], _mm256_loadu_ps(kt));
    for (int c = 1; c < kChunks; ++c)
      acc[j] = _mm256_fmadd_ps(qv[c], _mm256_loadu_ps(kt + 8 * c), acc[j]);
  }
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  _mm_storeu_ps(scores + t, s4);
}

// The score of one key past the last multiple of 4.
template <int kChunks>
GRANULE_ROW_AVX2 inline float one_score(const __m256* qv, const float* kt) {
  __m256 acc = _mm256_mul_ps(qv[0], _mm256_loadu_ps(kt));
  for (int c = 1; c < kChunks; ++c) acc = _mm256_fmadd_ps(qv[c], _mm256_loadu_ps(kt + 8 * c), acc);
  return horizontal_halving_sum(acc);
}

// Scores of keys [lo, hi) of a query whose keys are [0, length): keys below length rounded
// down to 4 in fours, the rest one by one (lo a multiple of 4).
template <int kChunks>
GRANULE_ROW_AVX2 inline void scores_of(const __m256* qv, const float* k, int64_t stride, int64_t lo,
                                       int64_t hi, int64_t length, float* scores) {
  const int64_t fours = std::min(hi, length & ~int64_t{3});
  int64_t t = lo;
  for (; t + 4 <= fours; t += 4) four_scores<kChunks>(qv, k, stride, t, scores);
  for (; t < hi; ++t) scores[t] = one_score<kChunks>(qv, k + t * stride);
}

// exp(score - max) in place over [0, length); returns 1 / (the sum, with the sink's term).
GRANULE_ROW_AVX2 inline float softmax_in_place(float* scores, int64_t length, const float* sink) {
  float max_score = sink ? *sink : -INFINITY;
  for (int64_t i = 0; i < length; ++i) max_score = std::max(max_score, scores[i]);
  float sum = sink ? std::exp(*sink - max_score) : 0.0f;
  sum += exp_shifted_sum_avx2(scores, length, max_score);
  return 1.0f / sum;
}

// o += Σ_t p_t · v_t over keys [lo, hi), in key order.
template <int kChunks>
GRANULE_ROW_AVX2 inline void weighted_values(const float* p, const float* v, int64_t stride,
                                             int64_t lo, int64_t hi, __m256* o) {
  for (int64_t t = lo; t < hi; ++t) {
    const float* vt = v + t * stride;
    _mm_prefetch(reinterpret_cast<const char*>(vt + 8 * stride), _MM_HINT_T0);
    const __m256 pt = _mm256_set1_ps(p[t]);
    for (int c = 0; c < kChunks; ++c) o[c] = _mm256_fmadd_ps(pt, _mm256_loadu_ps(vt + 8 * c), o[c]);
  }
}

template <int kChunks>
GRANULE_ROW_AVX2 void attention_avx2(const float* q, const float* k, const float* v, int64_t stride,
                                     int64_t length, float* scores, float* out, const float* sink,
                                     float scale) {
  __m256 qv[kChunks];
  scaled_query<kChunks>(q, scale, qv);
  scores_of<kChunks>(qv, k, stride, 0, length, length, scores);
  const float inverse = softmax_in_place(scores, length, sink);
  __m256 o[kChunks];
  for (int c = 0; c < kChunks; ++c) o[c] = _mm256_setzero_ps();
  weighted_values<kChunks>(scores, v, stride, 0, length, o);
  const __m256 norm = _mm256_set1_ps(inverse);
  for (int c = 0; c < kChunks; ++c) _mm256_storeu_ps(out + 8 * c, _mm256_mul_ps(o[c], norm));
}

// attention_avx2 for n queries sharing one KV head, keys in blocks that stay in L1 while
// every query passes over them; each query's arithmetic is attention_avx2's.
template <int kChunks>
GRANULE_ROW_AVX2 void attention_many_avx2(const AttentionQuery* queries, int64_t n, const float* k,
                                          const float* v, int64_t stride, float* scores,
                                          int64_t scores_stride, float* partial, float scale) {
  constexpr int64_t kKeyBlock = 64;
  int64_t longest = 0;
  for (int64_t i = 0; i < n; ++i) longest = std::max(longest, queries[i].length);
  for (int64_t lo = 0; lo < longest; lo += kKeyBlock) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t hi = std::min(lo + kKeyBlock, queries[i].length);
      if (hi <= lo) continue;
      __m256 qv[kChunks];
      scaled_query<kChunks>(queries[i].q, scale, qv);
      scores_of<kChunks>(qv, k, stride, lo, hi, queries[i].length, scores + i * scores_stride);
    }
  }
  std::vector<float> inverse(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    inverse[static_cast<size_t>(i)] =
        softmax_in_place(scores + i * scores_stride, queries[i].length, queries[i].sink);
    std::fill_n(partial + i * 8 * kChunks, 8 * kChunks, 0.0f);
  }
  for (int64_t lo = 0; lo < longest; lo += kKeyBlock) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t hi = std::min(lo + kKeyBlock, queries[i].length);
      if (hi <= lo) continue;
      float* oi = partial + i * 8 * kChunks;
      __m256 o[kChunks];
      for (int c = 0; c < kChunks; ++c) o[c] = _mm256_loadu_ps(oi + 8 * c);
      weighted_values<kChunks>(scores + i * scores_stride, v, stride, lo, hi, o);
      for (int c = 0; c < kChunks; ++c) _mm256_storeu_ps(oi + 8 * c, o[c]);
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    const __m256 norm = _mm256_set1_ps(inverse[static_cast<size_t>(i)]);
    for (int c = 0; c < kChunks; ++c)
      _mm256_storeu_ps(queries[i].out + 8 * c,
                       _mm256_mul_ps(_mm256_loadu_ps(partial + i * 8 * kChunks + 8 * c), norm));
  }
}

const bool kHaveAvx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                       __builtin_cpu_supports("f16c");

}  // namespace

bool row_kernels_use_avx2() { return kHaveAvx2; }

float dot_f32_fast(const float* a, const float* b, int64_t n) {
  return kHaveAvx2 ? dot_f32_avx2(a, b, n) : dot_f32_portable(a, b, n);
}

float exp_shifted_sum(float* x, int64_t n, float shift) {
  if (kHaveAvx2) return exp_shifted_sum_avx2(x, n, shift);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += (x[i] = std::exp(x[i] - shift));
  return sum;
}

void swiglu_approx(const float* gate, const float* up, float* out, int64_t n) {
  if (kHaveAvx2) return swiglu_avx2(gate, up, out, n);
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

bool attention_head_avx2(const float* q, const float* k, const float* v, int64_t token_stride,
                         int64_t length, int64_t head_dim, float* scores, float* out,
                         const float* sink, float scale) {
  if (!kHaveAvx2 || length <= 0) return false;
  if (scale <= 0.0f) scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  if (head_dim == 64) {
    attention_avx2<8>(q, k, v, token_stride, length, scores, out, sink, scale);
    return true;
  }
  if (head_dim == 128) {
    attention_avx2<16>(q, k, v, token_stride, length, scores, out, sink, scale);
    return true;
  }
  return false;
}

bool attention_many_avx2(const AttentionQuery* queries, int64_t n, const float* k, const float* v,
                         int64_t token_stride, int64_t head_dim, float scale) {
  if (!kHaveAvx2 || (head_dim != 64 && head_dim != 128)) return false;
  if (scale <= 0.0f) scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  int64_t longest = 0;
  for (int64_t i = 0; i < n; ++i) longest = std::max(longest, queries[i].length);
  if (longest <= 0) return false;
  // Each query's scores, row by row, and its unnormalised output between key blocks.
  thread_local std::vector<float> scores, partial;
  const int64_t scores_stride = (longest + 15) & ~int64_t{15};
  scores.resize(static_cast<size_t>(n * scores_stride));
  partial.resize(static_cast<size_t>(n * head_dim));
  if (head_dim == 64)
    attention_many_avx2<8>(queries, n, k, v, token_stride, scores.data(), scores_stride,
                           partial.data(), scale);
  else
    attention_many_avx2<16>(queries, n, k, v, token_stride, scores.data(), scores_stride,
                            partial.data(), scale);
  return true;
}

void add_scaled(float* out, const float* v, float p, int64_t n) {
  if (kHaveAvx2) return add_scaled_avx2(out, v, p, n);
  for (int64_t i = 0; i < n; ++i) out[i] = out[i] + p * v[i];
}

bool dot_row_fused(TensorType type, const void* row, const float* x, int64_t n, float* result) {
  if (!kHaveAvx2 || n % kQK != 0) return false;
  switch (type) {
    case TensorType::Q4_0:
      *result = dot_q4_0_avx2(static_cast<const BlockQ4_0*>(row), x, n);
      return true;
    case TensorType::Q4_1:
      *result = dot_q4_1_avx2(static_cast<const BlockQ4_1*>(row), x, n);
      return true;
    case TensorType::Q8_0:
      *result = dot_q8_0_avx2(static_cast<const BlockQ8_0*>(row), x, n);
      return true;
    default:
      return false;
  }
}

void decode_row(TensorType type, const void* row, float* out, int64_t n) {
  if (kHaveAvx2 && n % kQK == 0) {
    switch (type) {
      case TensorType::Q4_0:
        return decode_q4_0_avx2(static_cast<const BlockQ4_0*>(row), out, n);
      case TensorType::Q4_1:
        return decode_q4_1_avx2(static_cast<const BlockQ4_1*>(row), out, n);
      case TensorType::Q8_0:
        return decode_q8_0_avx2(static_cast<const BlockQ8_0*>(row), out, n);
      case TensorType::F16:
        return decode_f16_avx2(static_cast<const uint16_t*>(row), out, n);
      case TensorType::BF16:
        return decode_bf16_avx2(static_cast<const uint16_t*>(row), out, n);
      default:
        break;
    }
  }
  dequantize_row(type, row, out, n);
}

#else  // not x86: the portable code only

bool row_kernels_use_avx2() { return false; }
float dot_f32_fast(const float* a, const float* b, int64_t n) { return dot_f32_portable(a, b, n); }
bool dot_row_fused(TensorType, const void*, const float*, int64_t, float*) { return false; }
void add_scaled(float* out, const float* v, float p, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = out[i] + p * v[i];
}
bool attention_head_avx2(const float*, const float*, const float*, int64_t, int64_t, int64_t,
                         float*, float*, const float*, float) {
  return false;
}
bool attention_many_avx2(const AttentionQuery*, int64_t, const float*, const float*, int64_t,
                         int64_t, float) {
  return false;
}
float exp_shifted_sum(float* x, int64_t n, float shift) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += (x[i] = std::exp(x[i] - shift));
  return sum;
}
void swiglu_approx(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}
void decode_row(TensorType type, const void* row, float* out, int64_t n) {
  dequantize_row(type, row, out, n);
}

#endif

}  // namespace granule::cpu
