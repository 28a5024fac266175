// The GGUF block formats: fp16/bf16 conversion and per-type decode (bit-exact with
// ggml-quants.c), encode (ggml's reference quantisers) and dot product.
#include "granule/quant.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>

#include "granule/error.h"

namespace granule {

// ---------------------------------------------------------------------------------------
// fp16 and bf16

namespace {

uint32_t float_bits(float f) { return std::bit_cast<uint32_t>(f); }
float bits_float(uint32_t u) { return std::bit_cast<float>(u); }

// Exact IEEE half -> single: normals and inf/nan re-biased bit by bit (a nan payload
// moves to the top of the single mantissa, as hardware converts it); zero and
// subnormals are mantissa * 2^-24, which float arithmetic computes exactly.
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) return bits_float(sign | 0x7f800000u | (mantissa << 13));
  return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// All 65,536 halves decoded once: F16 rows convert element by element.
const float* fp16_table() {
  static const std::array<float, 65536> table = [] {
    std::array<float, 65536> t{};
    for (uint32_t h = 0; h < 65536; ++h) t[h] = half_to_float(static_cast<uint16_t>(h));
    return t;
  }();
  return table.data();
}

}  // namespace

float fp16_to_f32(uint16_t h) { return half_to_float(h); }

uint16_t f32_to_fp16(float f) {
  const uint32_t bits = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) {
    // NaN: keep the top payload bits and force it quiet so it cannot turn into inf.
    return static_cast<uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
  }
  // 65520 and above round to infinity (65504 is the largest half; 65520 is the tie,
  // and the even neighbour is the overflow).
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (magnitude < 0x38800000u) {
    // Below the smallest normal half (2^-14): the result is a subnormal count of 2^-24
    // steps. Scaling by 2^24 is exact, and rint rounds to nearest even; 1024 (the
    // smallest normal's bit pattern) comes out right for values that round up to it.
    const float steps = std::rint(bits_float(magnitude) * 16777216.0f);
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(steps));
  }
  // Normal: re-bias the exponent (127 -> 15) and round the 13 dropped mantissa bits to
  // nearest even; a carry out of the mantissa correctly bumps the exponent.
  const uint32_t rebiased = magnitude - (112u << 23);
  const uint32_t rounded = (rebiased + 0xfffu + ((rebiased >> 13) & 1u)) >> 13;
  return static_cast<uint16_t>(sign | rounded);
}

float bf16_to_f32(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

uint16_t f32_to_bf16(float f) {
  const uint32_t bits = float_bits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);  // quiet NaN
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// ---------------------------------------------------------------------------------------
// Block decoding (ggml-quants.c dequantize_row_*): one block into 32 or 256 floats.

namespace {

// The K quants pack eight 6-bit scales and eight 6-bit mins into 12 bytes: sub-blocks
// 0-3 keep theirs in the low 6 bits of bytes 0-3 (scales) and 4-7 (mins); sub-blocks
// 4-7 put their low 4 bits in bytes 8-11 and their top 2 bits in the spare top bits of
// bytes 0-7.
void scale_min_k4(int j, const uint8_t* q, uint8_t& scale, uint8_t& min) {
  if (j < 4) {
    scale = q[j] & 63;
    min = q[j + 4] & 63;
  } else {
    scale = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    min = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Q4_0/Q4_1 keep elements 0-15 in the low nibbles and 16-31 in the high ones. Unpacking
// first leaves one 32-wide conversion loop, which the compiler vectorises (it fully
// unrolls 16-wide loops into scalar code instead).
void unpack_nibbles(const uint8_t* packed, uint8_t* q) {
  for (int j = 0; j < kQK / 2; ++j) {
    q[j] = packed[j] & 0x0F;
    q[j + kQK / 2] = packed[j] >> 4;
  }
}

void decode_block(const BlockQ4_0& b, float* y) {
  const float d = half_to_float(b.d);
  uint8_t q[kQK];
  unpack_nibbles(b.qs, q);
  for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(q[j] - 8) * d;
}

void decode_block(const BlockQ4_1& b, float* y) {
  const float d = half_to_float(b.d);
  const float m = half_to_float(b.m);
  uint8_t q[kQK];
  unpack_nibbles(b.qs, q);
  for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(q[j]) * d + m;
}

void decode_block(const BlockQ8_0& b, float* y) {
  const float d = half_to_float(b.d);
  for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(b.qs[j]) * d;
}

void decode_block(const BlockQ4_K& b, float* y) {
  const float d = half_to_float(b.d);
  const float dmin = half_to_float(b.dmin);
  const uint8_t* q = b.qs;
  // Each 32 bytes of qs hold two sub-blocks of 32: low nibbles, then high nibbles.
  for (int sub = 0; sub < 8; sub += 2) {
    uint8_t sc, m;
    scale_min_k4(sub, b.scales, sc, m);
    const float d1 = d * sc, m1 = dmin * m;
    scale_min_k4(sub + 1, b.scales, sc, m);
    const float d2 = d * sc, m2 = dmin * m;
    for (int l = 0; l < 32; ++l) y[l] = d1 * static_cast<float>(q[l] & 0xF) - m1;
    for (int l = 0; l < 32; ++l) y[l + 32] = d2 * static_cast<float>(q[l] >> 4) - m2;
    q += 32;
    y += 64;
  }
}

void decode_block(const BlockQ5_K& b, float* y) {
  const float d = half_to_float(b.d);
  const float dmin = half_to_float(b.dmin);
  const uint8_t* ql = b.qs;
  // The fifth bit of sub-block s is bit s of qh[l].
  for (int sub = 0; sub < 8; sub += 2) {
    uint8_t sc, m;
    scale_min_k4(sub, b.scales, sc, m);
    const float d1 = d * sc, m1 = dmin * m;
    scale_min_k4(sub + 1, b.scales, sc, m);
    const float d2 = d * sc, m2 = dmin * m;
    const uint8_t bit1 = static_cast<uint8_t>(1u << sub), bit2 = static_cast<uint8_t>(2u << sub);
    for (int l = 0; l < 32; ++l)
      y[l] = d1 * static_cast<float>((ql[l] & 0xF) + ((b.qh[l] & bit1) ? 16 : 0)) - m1;
    for (int l = 0; l < 32; ++l)
      y[l + 32] = d2 * static_cast<float>((ql[l] >> 4) + ((b.qh[l] & bit2) ? 16 : 0)) - m2;
    ql += 32;
    y += 64;
  }
}

void decode_block(const BlockQ6_K& b, float* y) {
  const float d = half_to_float(b.d);
  const uint8_t* ql = b.ql;
  const uint8_t* qh = b.qh;
  const int8_t* sc = b.scales;
  // Each half (128 values) uses 64 bytes of ql (low 4 bits), 32 of qh (2 high bits,
  // four values per byte) and 8 scales of 16 values each: value l of quarter k
  // (l < 32) takes scale l / 16 + 2k. Split by l / 16 so each inner loop has fixed scales.
  for (int half = 0; half < 2; ++half) {
    for (int group = 0; group < 2; ++group) {
      const float s1 = d * static_cast<float>(sc[group]), s2 = d * static_cast<float>(sc[group + 2]);
      const float s3 = d * static_cast<float>(sc[group + 4]), s4 = d * static_cast<float>(sc[group + 6]);
      for (int l = 16 * group; l < 16 * group + 16; ++l) {
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = s1 * static_cast<float>(q1);
        y[l + 32] = s2 * static_cast<float>(q2);
        y[l + 64] = s3 * static_cast<float>(q3);
        y[l + 96] = s4 * static_cast<float>(q4);
      }
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

// ---------------------------------------------------------------------------------------
// Block encoding (ggml-quants.c quantize_row_*_ref).

// Round half to even, as the float trick in ggml's nearest_int does.
int nearest_int(float v) { return static_cast<int>(std::lrintf(v)); }

void encode_block(const float* x, BlockQ4_0& b) {
  // The signed value of largest magnitude maps to -8, so the grid uses all 16 levels.
  float amax = 0, max = 0;
  for (int j = 0; j < kQK; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float d = max / -8;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  b.d = f32_to_fp16(d);
  for (int j = 0; j < kQK / 2; ++j) {
    const int lo = std::min(15, static_cast<int>(x[j] * id + 8.5f));
    const int hi = std::min(15, static_cast<int>(x[j + kQK / 2] * id + 8.5f));
    b.qs[j] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

void encode_block(const float* x, BlockQ4_1& b) {
  float min = x[0], max = x[0];
  for (int j = 1; j < kQK; ++j) {
    min = std::min(min, x[j]);
    max = std::max(max, x[j]);
  }
  const float d = (max - min) / 15;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  b.d = f32_to_fp16(d);
  b.m = f32_to_fp16(min);
  for (int j = 0; j < kQK / 2; ++j) {
    const int lo = std::min(15, static_cast<int>((x[j] - min) * id + 0.5f));
    const int hi =
        std::min(15, static_cast<int>((x[j + kQK / 2] - min) * id + 0.5f));
    b.qs[j] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

void encode_block(const float* x, BlockQ8_0& b) {
  float amax = 0;
  for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  b.d = f32_to_fp16(d);
  for (int j = 0; j < kQK; ++j) b.qs[j] = static_cast<int8_t>(std::roundf(x[j] * id));
}

// Fits x ≈ scale * L - min with L in [0, nmax] by weighted least squares, trying a few
// grid stretches around the plain min/max fit (ggml's make_qkx2_quants). Returns the
// scale and stores the (non-negative) min.
float fit_scale_min(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                    float& the_min, float rmin, float rdelta, int nstep) {
  float min = x[0], max = x[0];
  float sum_w = 0, sum_x = 0;
  for (int i = 0; i < n; ++i) {
    min = std::min(min, x[i]);
    max = std::max(max, x[i]);
    sum_w += weights[i];
    sum_x += weights[i] * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    std::fill(L, L + n, uint8_t{0});
    the_min = -min;
    return 0;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    L[i] = static_cast<uint8_t>(std::clamp(nearest_int(iscale * (x[i] - min)), 0, nmax));
    const float diff = scale * L[i] + min - x[i];
    best_error += weights[i] * (diff * diff);
  }
  uint8_t trial[32];
  for (int step = 0; step <= nstep; ++step) {
    iscale = (rmin + rdelta * step + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest_int(iscale * (x[i] - min)), 0, nmax);
      trial[i] = static_cast<uint8_t>(l);
      sum_l += weights[i] * l;
      sum_l2 += weights[i] * l * l;
      sum_xl += weights[i] * l * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (det <= 0) continue;
    float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
    float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
    if (this_min > 0) {
      this_min = 0;
      this_scale = sum_xl / sum_l2;
    }
    float error = 0;
    for (int i = 0; i < n; ++i) {
      const float diff = this_scale * trial[i] + this_min - x[i];
      error += weights[i] * (diff * diff);
    }
    if (error < best_error) {
      std::copy(trial, trial + n, L);
      best_error = error;
      scale = this_scale;
      min = this_min;
    }
  }
  the_min = -min;
  return scale;
}

// Packs six-bit scale/min pairs as scale_min_k4 reads them.
void pack_scales_k4(const uint8_t* ls, const uint8_t* lm, uint8_t* q) {
  std::memset(q, 0, kScaleBytesK);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      q[j] = ls[j];
      q[j + 4] = lm[j];
    } else {
      q[j + 4] = static_cast<uint8_t>((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
      q[j - 4] |= static_cast<uint8_t>((ls[j] >> 4) << 6);
      q[j] |= static_cast<uint8_t>((lm[j] >> 4) << 6);
    }
  }
}

// The shared part of the Q4_K and Q5_K encoders: fits each sub-block of 32, quantises
// the sub-block scales and mins to 6 bits against two fp16 super-scales, then re-derives
// every level from the scales as the decoder will see them. Fills L[256] in [0, nmax].
void encode_k_scales(const float* x, int nmax, float rmin, int nstep, uint16_t& d_out,
                     uint16_t& dmin_out, uint8_t* scales_out, uint8_t* L) {
  float weights[32], scales[8], mins[8];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    // Weight each value by the sub-block's RMS plus its own magnitude: large values,
    // which matter most to a matmul, are fitted more closely.
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = fit_scale_min(32, nmax, x + 32 * j, weights, L + 32 * j, mins[j], rmin, 0.1f, nstep);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  uint8_t ls[8], lm[8];
  for (int j = 0; j < 8; ++j) {
    ls[j] = static_cast<uint8_t>(std::min(63, nearest_int(inv_scale * scales[j])));
    lm[j] = static_cast<uint8_t>(std::min(63, nearest_int(inv_min * mins[j])));
  }
  pack_scales_k4(ls, lm, scales_out);
  d_out = f32_to_fp16(max_scale / 63.f);
  dmin_out = f32_to_fp16(max_min / 63.f);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    scale_min_k4(j, scales_out, sc, m);
    const float d = fp16_to_f32(d_out) * sc;
    if (d == 0) continue;
    const float dm = fp16_to_f32(dmin_out) * m;
    for (int ii = 0; ii < 32; ++ii)
      L[32 * j + ii] = static_cast<uint8_t>(std::clamp(nearest_int((x[32 * j + ii] + dm) / d), 0, nmax));
  }
}

void encode_block(const float* x, BlockQ4_K& b) {
  uint8_t L[kQK_K];
  encode_k_scales(x, 15, -1.f, 20, b.d, b.dmin, b.scales, L);
  uint8_t* q = b.qs;
  for (int j = 0; j < kQK_K; j += 64) {
    for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
    q += 32;
  }
}

void encode_block(const float* x, BlockQ5_K& b) {
  uint8_t L[kQK_K];
  encode_k_scales(x, 31, -0.5f, 15, b.d, b.dmin, b.scales, L);
  std::memset(b.qh, 0, sizeof b.qh);
  uint8_t* ql = b.qs;
  uint8_t bit1 = 1, bit2 = 2;
  for (int n = 0; n < kQK_K; n += 64) {
    for (int j = 0; j < 32; ++j) {
      int l1 = L[n + j], l2 = L[n + j + 32];
      if (l1 > 15) {
        l1 -= 16;
        b.qh[j] |= bit1;
      }
      if (l2 > 15) {
        l2 -= 16;
        b.qh[j] |= bit2;
      }
      ql[j] = static_cast<uint8_t>(l1 | (l2 << 4));
    }
    bit1 = static_cast<uint8_t>(bit1 << 2);
    bit2 = static_cast<uint8_t>(bit2 << 2);
    ql += 32;
  }
}

constexpr float kGroupMaxEps = 1e-15f;

// Symmetric fit x ≈ scale * (L - nmax) with L in [0, 2*nmax), weighted by x², trying
// 18 stretches of the grid around the plain max fit (ggml's make_qx_quants, rmse_type 1).
float fit_symmetric_scale(int n, int nmax, const float* x, uint8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    std::fill(L, L + n, uint8_t{0});
    return 0;
  }
  auto level = [&](float iscale, float v) {
    return std::clamp(nearest_int(iscale * v), -nmax, nmax - 1);
  };
  float iscale = -nmax / max;
  float sum_lx = 0, sum_l2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = level(iscale, x[i]);
    L[i] = static_cast<uint8_t>(l + nmax);
    const float w = x[i] * x[i];
    sum_lx += w * x[i] * l;
    sum_l2 += w * l * l;
  }
  float scale = sum_l2 != 0 ? sum_lx / sum_l2 : 0.0f;
  float best = scale * sum_lx;
  for (int step = -9; step <= 9; ++step) {
    if (step == 0) continue;
    iscale = -(nmax + 0.1f * step) / max;
    sum_lx = sum_l2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = level(iscale, x[i]);
      const float w = x[i] * x[i];
      sum_lx += w * x[i] * l;
      sum_l2 += w * l * l;
    }
    if (sum_l2 > 0 && sum_lx * sum_lx > best * sum_l2) {
      for (int i = 0; i < n; ++i) L[i] = static_cast<uint8_t>(nmax + level(iscale, x[i]));
      scale = sum_lx / sum_l2;
      best = scale * sum_lx;
    }
  }
  return scale;
}

void encode_block(const float* x, BlockQ6_K& b) {
  uint8_t L[kQK_K];
  float scales[kQK_K / 16];
  float max_scale = 0, max_abs_scale = 0;
  for (int ib = 0; ib < kQK_K / 16; ++ib) {
    scales[ib] = fit_symmetric_scale(16, 32, x + 16 * ib, L + 16 * ib);
    if (std::fabs(scales[ib]) > max_abs_scale) {
      max_abs_scale = std::fabs(scales[ib]);
      max_scale = scales[ib];
    }
  }
  if (max_abs_scale < kGroupMaxEps) {
    std::memset(&b, 0, sizeof b);
    return;
  }
  const float iscale = -128.f / max_scale;
  b.d = f32_to_fp16(1 / iscale);
  for (int ib = 0; ib < kQK_K / 16; ++ib)
    b.scales[ib] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[ib])));
  for (int j = 0; j < kQK_K / 16; ++j) {
    const float d = half_to_float(b.d) * b.scales[j];
    if (d == 0) continue;
    for (int ii = 0; ii < 16; ++ii)
      L[16 * j + ii] = static_cast<uint8_t>(std::clamp(nearest_int(x[16 * j + ii] / d), -32, 31) + 32);
  }
  uint8_t* ql = b.ql;
  uint8_t* qh = b.qh;
  for (int j = 0; j < kQK_K; j += 128) {
    for (int l = 0; l < 32; ++l) {
      const uint8_t q1 = L[j + l], q2 = L[j + l + 32], q3 = L[j + l + 64], q4 = L[j + l + 96];
      ql[l] = static_cast<uint8_t>((q1 & 0xF) | ((q3 & 0xF) << 4));
      ql[l + 32] = static_cast<uint8_t>((q2 & 0xF) | ((q4 & 0xF) << 4));
      qh[l] = static_cast<uint8_t>((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
    }
    ql += 64;
    qh += 32;
  }
}

// ---------------------------------------------------------------------------------------
// Row drivers

// Eight independent partial sums: float addition is not associative, so the compiler
// only vectorises a reduction that is written with explicit lanes.
constexpr int kLanes = 8;

struct LaneSums {
  float lane[kLanes] = {};
  // n must be a multiple of kLanes.
  void add_products(const float* a, const float* b, int n) {
    for (int i = 0; i < n; i += kLanes)
      for (int k = 0; k < kLanes; ++k) lane[k] += a[i + k] * b[i + k];
  }
  float total() const {
    float s = 0;
    for (float v : lane) s += v;
    return s;
  }
};

template <typename Block, int kElems>
void dequantize_blocks(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const Block*>(src);
  for (int64_t i = 0; i < n / kElems; ++i) decode_block(blocks[i], dst + i * kElems);
}

template <typename Block, int kElems>
void quantize_blocks(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<Block*>(dst);
  for (int64_t i = 0; i < n / kElems; ++i) encode_block(src + i * kElems, blocks[i]);
}

// Decodes one block at a time into a buffer that stays in L1, then multiplies.
template <typename Block, int kElems>
float dot_blocks(const void* row, const float* x, int64_t n) {
  const auto* blocks = static_cast<const Block*>(row);
  float decoded[kElems];
  LaneSums sums;
  for (int64_t i = 0; i < n / kElems; ++i) {
    decode_block(blocks[i], decoded);
    sums.add_products(decoded, x + i * kElems, kElems);
  }
  return sums.total();
}

// F32, F16 and BF16 rows have no blocks: convert eight elements at a time into the
// lanes, then the tail (any length is valid).
template <typename Convert>
float dot_elements(const void* row, const float* x, int64_t n, Convert convert) {
  const int64_t even = n - n % kLanes;
  LaneSums sums;
  for (int64_t i = 0; i < even; i += kLanes) {
    float converted[kLanes];
    for (int k = 0; k < kLanes; ++k) converted[k] = convert(row, i + k);
    sums.add_products(converted, x + i, kLanes);
  }
  float tail = 0;
  for (int64_t i = even; i < n; ++i) tail += convert(row, i) * x[i];
  return sums.total() + tail;
}

void check_row_length(TensorType type, int64_t n) {
  if (n < 0) throw UsageError("negative row length " + std::to_string(n));
  (void)row_bytes(type, n);  // throws when n is not a multiple of the block size
}

}  // namespace

void dequantize_row(TensorType type, const void* src, float* dst, int64_t n) {
  check_row_length(type, n);
  switch (type) {
    case TensorType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case TensorType::F16: {
      const float* table = fp16_table();
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = table[h[i]];
      return;
    }
    case TensorType::BF16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(h[i]);
      return;
    }
    case TensorType::Q4_0: return dequantize_blocks<BlockQ4_0, kQK>(src, dst, n);
    case TensorType::Q4_1: return dequantize_blocks<BlockQ4_1, kQK>(src, dst, n);
    case TensorType::Q8_0: return dequantize_blocks<BlockQ8_0, kQK>(src, dst, n);
    case TensorType::Q4_K: return dequantize_blocks<BlockQ4_K, kQK_K>(src, dst, n);
    case TensorType::Q5_K: return dequantize_blocks<BlockQ5_K, kQK_K>(src, dst, n);
    case TensorType::Q6_K: return dequantize_blocks<BlockQ6_K, kQK_K>(src, dst, n);
  }
  throw UnsupportedError("cannot decode tensor type " + tensor_type_name(static_cast<uint32_t>(type)));
}

void quantize_row(TensorType type, const float* src, void* dst, int64_t n) {
  check_row_length(type, n);
  switch (type) {
    case TensorType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case TensorType::F16: {
      auto* h = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) h[i] = f32_to_fp16(src[i]);
      return;
    }
    case TensorType::BF16: {
      auto* h = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) h[i] = f32_to_bf16(src[i]);
      return;
    }
    case TensorType::Q4_0: return quantize_blocks<BlockQ4_0, kQK>(src, dst, n);
    case TensorType::Q4_1: return quantize_blocks<BlockQ4_1, kQK>(src, dst, n);
    case TensorType::Q8_0: return quantize_blocks<BlockQ8_0, kQK>(src, dst, n);
    case TensorType::Q4_K: return quantize_blocks<BlockQ4_K, kQK_K>(src, dst, n);
    case TensorType::Q5_K: return quantize_blocks<BlockQ5_K, kQK_K>(src, dst, n);
    case TensorType::Q6_K: return quantize_blocks<BlockQ6_K, kQK_K>(src, dst, n);
  }
  throw UnsupportedError("cannot encode tensor type " + tensor_type_name(static_cast<uint32_t>(type)));
}

float dot_row(TensorType type, const void* row, const float* x, int64_t n) {
  check_row_length(type, n);
  switch (type) {
    case TensorType::F32:
      return dot_elements(row, x, n, [](const void* r, int64_t i) {
        return static_cast<const float*>(r)[i];
      });
    case TensorType::F16: {
      const float* table = fp16_table();
      return dot_elements(row, x, n, [table](const void* r, int64_t i) {
        return table[static_cast<const uint16_t*>(r)[i]];
      });
    }
    case TensorType::BF16:
      return dot_elements(row, x, n, [](const void* r, int64_t i) {
        return bits_float(static_cast<uint32_t>(static_cast<const uint16_t*>(r)[i]) << 16);
      });
    case TensorType::Q4_0: return dot_blocks<BlockQ4_0, kQK>(row, x, n);
    case TensorType::Q4_1: return dot_blocks<BlockQ4_1, kQK>(row, x, n);
    case TensorType::Q8_0: return dot_blocks<BlockQ8_0, kQK>(row, x, n);
    case TensorType::Q4_K: return dot_blocks<BlockQ4_K, kQK_K>(row, x, n);
    case TensorType::Q5_K: return dot_blocks<BlockQ5_K, kQK_K>(row, x, n);
    case TensorType::Q6_K: return dot_blocks<BlockQ6_K, kQK_K>(row, x, n);
  }
  throw UnsupportedError("cannot multiply tensor type " + tensor_type_name(static_cast<uint32_t>(type)));
}

}  // namespace granule
