// The int8 matmul's activation quantiser and the types it runs (see int8_matmul.h; the
// kernels are int8_packed.cpp's).
#include "backends/cpu/int8_matmul.h"

#include <algorithm>
#include <cmath>

#include "granule/block_formats.h"
#include "granule/quant.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define GRANULE_INT8_X86 1
#endif

namespace granule::cpu {

namespace {

// Portable quantiser: the AVX2 one rounds the same way (x · (1/d), or x / d, to nearest, ties
// to even).
void quantize_portable(const float* x, int64_t n, ActivationBlock* out, bool divide) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* v = x + 32 * b;
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(v[i]));
    const float d = amax / 127.0f;
    const float inverse = amax == 0.0f ? 0.0f : 1.0f / d;
    int half[2] = {0, 0};
    for (int i = 0; i < 32; ++i) {
      const int q = static_cast<int>(
          std::nearbyint(divide ? (amax == 0.0f ? 0.0f : v[i] / d) : v[i] * inverse));
      out[b].qs[i] = static_cast<int8_t>(q);
      half[i / 16] += q;
    }
    const int sum = half[0] + half[1];
    out[b].half_sum[0] = static_cast<int16_t>(half[0]);
    out[b].half_sum[1] = static_cast<int16_t>(half[1]);
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

template <bool kDivide>
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
    if constexpr (kDivide) {
      // A block of zeros divides by 1: zeros, as the inverse's 0 gives.
      const __m256 divisor = _mm256_set1_ps(amax == 0.0f ? 1.0f : d);
      v0 = _mm256_div_ps(v0, divisor);
      v1 = _mm256_div_ps(v1, divisor);
      v2 = _mm256_div_ps(v2, divisor);
      v3 = _mm256_div_ps(v3, divisor);
    } else {
      const __m256 inverse = _mm256_set1_ps(amax == 0.0f ? 0.0f : 1.0f / d);
      v0 = _mm256_mul_ps(v0, inverse);
      v1 = _mm256_mul_ps(v1, inverse);
      v2 = _mm256_mul_ps(v2, inverse);
      v3 = _mm256_mul_ps(v3, inverse);
    }
    // cvtps rounds in the current mode: to nearest, ties to even.
    __m256i i0 = _mm256_cvtps_epi32(v0);
    __m256i i1 = _mm256_cvtps_epi32(v1);
    __m256i i2 = _mm256_cvtps_epi32(v2);
    __m256i i3 = _mm256_cvtps_epi32(v3);
    // The two halves' sums: elements 0..15 are i0 and i1, 16..31 i2 and i3.
    const __m256i s01 = _mm256_add_epi32(i0, i1), s23 = _mm256_add_epi32(i2, i3);
    __m128i s4 = _mm_hadd_epi32(
        _mm_add_epi32(_mm256_castsi256_si128(s01), _mm256_extracti128_si256(s01, 1)),
        _mm_add_epi32(_mm256_castsi256_si128(s23), _mm256_extracti128_si256(s23, 1)));
    s4 = _mm_hadd_epi32(s4, s4);  // lane 0: elements 0..15, lane 1: 16..31
    const int half0 = _mm_cvtsi128_si32(s4), half1 = _mm_extract_epi32(s4, 1);
    const int sum = half0 + half1;
    out[b].half_sum[0] = static_cast<int16_t>(half0);
    out[b].half_sum[1] = static_cast<int16_t>(half1);
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
    case TensorType::MXFP4:
      return n_cols % kQK == 0;
    case TensorType::Q2_K:
    case TensorType::Q3_K:
    case TensorType::IQ4_XS:
    case TensorType::Q4_K:
    case TensorType::Q5_K:
    case TensorType::Q6_K:
      return n_cols % kQK_K == 0;
    default:
      return false;
  }
}

void quantize_activations(const float* x, int64_t n, ActivationBlock* out, bool divide) {
  if (!kHaveAvx2)
    quantize_portable(x, n, out, divide);
  else if (divide)
    quantize_avx2<true>(x, n, out);
  else
    quantize_avx2<false>(x, n, out);
}

#else  // not x86: no int8 kernels; the exact path runs everything

bool int8_matmul_supports(TensorType, int64_t) { return false; }
void quantize_activations(const float* x, int64_t n, ActivationBlock* out, bool divide) {
  quantize_portable(x, n, out, divide);
}

#endif

}  // namespace granule::cpu
