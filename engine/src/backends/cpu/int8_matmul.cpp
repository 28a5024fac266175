// The activation quantiser and the Q6_K kernel of the int8 matmul (see int8_matmul.h; the
// other types' kernels run on their repacked copies, int8_packed.cpp). A Q6_K sub-block of 32
// is unpacked to 32 signed bytes and multiplied with an activation block by maddubs (the sign
// trick, |w| × sign(x, w)) and madd with its scales of 16, converted and scaled by d_w·d_x into
// an f32 accumulator; a tile of R rows × T tokens unpacks each sub-block once for T tokens.
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

// One Q6_K sub-block of 32, ready for the product: sub-block k = 4h + i of half h: low 4 bits
// from ql[64h + 32(i & 1) + l] (low nibble for i < 2, high for i >= 2), high 2 bits from
// qh[32h + l] >> 2i, minus 32; an int8 scale per 16 (as i16 for madd).
struct Q6Sub {
  __m256i q;
  __m256i scales;
};
GRANULE_AVX2 inline Q6Sub q6_k_sub(const BlockQ6_K& b, int sub) {
  const int h = sub / 4, i = sub % 4;
  const __m256i ql =
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * h + 32 * (i & 1)));
  const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + 32 * h));
  const __m256i low =
      _mm256_and_si256(i < 2 ? ql : _mm256_srli_epi16(ql, 4), _mm256_set1_epi8(0x0F));
  const __m256i high =
      _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * i)), _mm256_set1_epi8(3));
  const int8_t* sc = b.scales + 8 * h + 2 * i;
  return {_mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(high, 4)), _mm256_set1_epi8(32)),
          _mm256_set_m128i(_mm_set1_epi16(sc[1]), _mm_set1_epi16(sc[0]))};
}

// Σ w·x·scale of one sub-block as eight f32 lanes (exact integers: |w| × sign(x, w) pairs,
// madd with the scales of 16; d_w·d_x applies outside).
GRANULE_AVX2 inline __m256 q6_k_product(const Q6Sub& w, __m256i x) {
  const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(w.q, w.q), _mm256_sign_epi8(x, w.q));
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, w.scales));
}

// R rows from r0 times T tokens from t0: each Q6_K sub-block unpacked once for T tokens.
template <int R, int T>
GRANULE_AVX2 void q6_k_tile(const uint8_t* w, size_t stride, int64_t r0, const ActivationBlock* xq,
                            int64_t x_blocks, int64_t t0, int64_t n_blocks, float* y,
                            int64_t y_stride) {
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  const BlockQ6_K* rows[R];
  for (int r = 0; r < R; ++r)
    rows[r] = reinterpret_cast<const BlockQ6_K*>(w + static_cast<size_t>(r0 + r) * stride);
  const ActivationBlock* xs[T];
  for (int t = 0; t < T; ++t) xs[t] = xq + (t0 + t) * x_blocks;
  for (int64_t b = 0; b < n_blocks; ++b) {
    float d[R];
    for (int r = 0; r < R; ++r) d[r] = half(rows[r][b].d);
    for (int sub = 0; sub < 8; ++sub) {
      Q6Sub ws[R];
      for (int r = 0; r < R; ++r) ws[r] = q6_k_sub(rows[r][b], sub);
      for (int t = 0; t < T; ++t) {
        const ActivationBlock& xb = xs[t][b * 8 + sub];
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.qs));
        for (int r = 0; r < R; ++r) {
          acc[r][t] =
              _mm256_fmadd_ps(q6_k_product(ws[r], xv), _mm256_set1_ps(d[r] * xb.d), acc[r][t]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) y[(t0 + t) * y_stride + r0 + r] = hsum(acc[r][t]);
}

// One token: a row at a time (which streams the matrix fastest). Several: tokens in chunks
// that stay in L1/L2 while the rows pass over them, rows in pairs and tokens in fours inside
// a chunk.
GRANULE_AVX2 void q6_k_rows(const void* w, int64_t row_begin, int64_t row_end, int64_t n_cols,
                            const ActivationBlock* xq, int64_t n_tokens, float* y,
                            int64_t y_stride) {
  const auto* base = static_cast<const uint8_t*>(w);
  const int64_t n_blocks = n_cols / kQK_K, x_blocks = n_cols / 32;
  const size_t stride = sizeof(BlockQ6_K) * static_cast<size_t>(n_blocks);
  if (n_tokens == 1) {
    for (int64_t r = row_begin; r < row_end; ++r)
      q6_k_tile<1, 1>(base, stride, r, xq, x_blocks, 0, n_blocks, y, y_stride);
    return;
  }
  constexpr int64_t kTokenChunk = 64;
  for (int64_t t0 = 0; t0 < n_tokens; t0 += kTokenChunk) {
    const int64_t t1 = std::min(n_tokens, t0 + kTokenChunk);
    int64_t r = row_begin;
    for (; r + 2 <= row_end; r += 2) {
      int64_t t = t0;
      for (; t + 4 <= t1; t += 4)
        q6_k_tile<2, 4>(base, stride, r, xq, x_blocks, t, n_blocks, y, y_stride);
      for (; t < t1; ++t) q6_k_tile<2, 1>(base, stride, r, xq, x_blocks, t, n_blocks, y, y_stride);
    }
    for (; r < row_end; ++r) {
      int64_t t = t0;
      for (; t + 4 <= t1; t += 4)
        q6_k_tile<1, 4>(base, stride, r, xq, x_blocks, t, n_blocks, y, y_stride);
      for (; t < t1; ++t) q6_k_tile<1, 1>(base, stride, r, xq, x_blocks, t, n_blocks, y, y_stride);
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

void q6_k_matmul_rows(const void* w, int64_t row_begin, int64_t row_end, int64_t n_cols,
                      const ActivationBlock* xq, int64_t n_tokens, float* y, int64_t y_stride) {
  q6_k_rows(w, row_begin, row_end, n_cols, xq, n_tokens, y, y_stride);
}

#else  // not x86: no int8 kernels; the exact path runs everything

bool int8_matmul_supports(TensorType, int64_t) { return false; }
void quantize_activations(const float* x, int64_t n, ActivationBlock* out) {
  quantize_portable(x, n, out);
}
void q6_k_matmul_rows(const void*, int64_t, int64_t, int64_t, const ActivationBlock*, int64_t,
                      float*, int64_t) {}

#endif

}  // namespace granule::cpu
