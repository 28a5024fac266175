// The test quantisers: f32 to fp16/bf16 and to every GGUF block type, as ggml's reference
// quantisers (quantize_row_*_ref) encode them. The engine only decodes (granule/quant.h);
// encoding lives here so that tests and granule-bench can write models at any block type.
#include "granule/testkit/quantize.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "granule/error.h"
#include "granule/quant.h"

namespace granule {

// ---------------------------------------------------------------------------------------
// fp16 and bf16

namespace {

uint32_t float_bits(float f) { return std::bit_cast<uint32_t>(f); }
float bits_float(uint32_t u) { return std::bit_cast<float>(u); }

}  // namespace

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

uint16_t f32_to_bf16(float f) {
  const uint32_t bits = float_bits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((bits >> 16) | 0x40u);  // quiet NaN
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// ---------------------------------------------------------------------------------------
// Block encoding (ggml-quants.c quantize_row_*_ref).

namespace {

// Round half to even, as the float trick in ggml's nearest_int does.
int nearest_int(float v) { return static_cast<int>(std::lrintf(v)); }

// Groups whose largest magnitude is below this encode as zeros (ggml's GROUP_MAX_EPS).
constexpr float kGroupMaxEps = 1e-15f;

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
    const int hi = std::min(15, static_cast<int>((x[j + kQK / 2] - min) * id + 0.5f));
    b.qs[j] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

// Q5_0/Q5_1 as ggml's reference (and gguf.quants): Q4_0/Q4_1 with 32 levels, the fifth
// bit of element j stored as bit j of qh.
void pack_q5(const int* q, uint8_t* qs, uint8_t* qh) {
  uint32_t high = 0;
  for (int j = 0; j < kQK / 2; ++j) {
    qs[j] = static_cast<uint8_t>((q[j] & 0xF) | ((q[j + kQK / 2] & 0xF) << 4));
    high |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
    high |= static_cast<uint32_t>((q[j + kQK / 2] >> 4) & 1) << (j + kQK / 2);
  }
  for (int k = 0; k < 4; ++k) qh[k] = static_cast<uint8_t>(high >> (8 * k));
}

void encode_block(const float* x, BlockQ5_0& b) {
  float amax = 0, max = 0;
  for (int j = 0; j < kQK; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float d = max / -16;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  b.d = f32_to_fp16(d);
  int q[kQK];
  for (int j = 0; j < kQK; ++j) q[j] = std::min(31, static_cast<int>(x[j] * id + 16.5f));
  pack_q5(q, b.qs, b.qh);
}

void encode_block(const float* x, BlockQ5_1& b) {
  float min = x[0], max = x[0];
  for (int j = 1; j < kQK; ++j) {
    min = std::min(min, x[j]);
    max = std::max(max, x[j]);
  }
  const float d = (max - min) / 31;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  b.d = f32_to_fp16(d);
  b.m = f32_to_fp16(min);
  int q[kQK];
  for (int j = 0; j < kQK; ++j) q[j] = std::min(31, static_cast<int>((x[j] - min) * id + 0.5f));
  pack_q5(q, b.qs, b.qh);
}

// The index of the level nearest to v (the first on a tie), over a table of 16 levels.
int nearest_level(const int8_t* levels, float v) {
  int best = 0;
  float best_error = std::fabs(static_cast<float>(levels[0]) - v);
  for (int i = 1; i < 16; ++i) {
    const float error = std::fabs(static_cast<float>(levels[i]) - v);
    if (error < best_error) {
      best = i;
      best_error = error;
    }
  }
  return best;
}

// A scale for n values on the IQ4_NL grid: the largest value mapped to either end of the
// grid, each level then refitted by least squares; the better of the two. Fills L with
// level indices. Not ggml's search, but a valid (and close) encoding.
float fit_iq4_scale(int n, const float* x, uint8_t* L) {
  float amax = 0, max = 0;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    std::fill(L, L + n, uint8_t{8});  // level 1: decodes to d, and d is 0
    return 0;
  }
  float best_scale = 0, best_error = std::numeric_limits<float>::max();
  for (float end : {static_cast<float>(kIq4nlValues[0]), static_cast<float>(kIq4nlValues[15])}) {
    const float d = max / end;
    uint8_t trial[32];
    float sum_xv = 0, sum_v2 = 0;
    for (int i = 0; i < n; ++i) {
      trial[i] = static_cast<uint8_t>(nearest_level(kIq4nlValues, x[i] / d));
      const float v = kIq4nlValues[trial[i]];
      sum_xv += x[i] * v;
      sum_v2 += v * v;
    }
    const float scale = sum_v2 > 0 ? sum_xv / sum_v2 : d;
    float error = 0;
    for (int i = 0; i < n; ++i) {
      const float diff = scale * kIq4nlValues[trial[i]] - x[i];
      error += diff * diff;
    }
    if (error < best_error) {
      best_error = error;
      best_scale = scale;
      std::copy(trial, trial + n, L);
    }
  }
  return best_scale;
}

void encode_block(const float* x, BlockIQ4_NL& b) {
  uint8_t L[kQK];
  b.d = f32_to_fp16(fit_iq4_scale(kQK, x, L));
  // Re-pick each level against the scale the decoder sees.
  const float d = fp16_to_f32(b.d);
  if (d != 0)
    for (int j = 0; j < kQK; ++j)
      L[j] = static_cast<uint8_t>(nearest_level(kIq4nlValues, x[j] / d));
  for (int j = 0; j < kQK / 2; ++j) b.qs[j] = static_cast<uint8_t>(L[j] | (L[j + kQK / 2] << 4));
}

// MXFP4 as ggml's reference (and gguf.quants): a power-of-two scale from the largest
// magnitude, each value to the nearest of the 16 FP4 levels.
void encode_block(const float* x, BlockMXFP4& b) {
  float amax = 0;
  for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
  const int exponent = amax > 0 ? static_cast<int>(std::floor(std::log2(amax))) - 2 + 127 : 0;
  b.e = static_cast<uint8_t>(std::clamp(exponent, 0, 254));
  const float d =
      std::bit_cast<float>(b.e < 2 ? 0x00200000u << b.e : static_cast<uint32_t>(b.e - 1) << 23);
  uint8_t L[kQK];
  for (int j = 0; j < kQK; ++j) {
    int best = 0;
    float best_error = std::fabs(d * static_cast<float>(kMxfp4Values[0]) - x[j]);
    for (int i = 1; i < 16; ++i) {
      const float error = std::fabs(d * static_cast<float>(kMxfp4Values[i]) - x[j]);
      if (error < best_error) {
        best = i;
        best_error = error;
      }
    }
    L[j] = static_cast<uint8_t>(best);
  }
  for (int j = 0; j < kQK / 2; ++j) b.qs[j] = static_cast<uint8_t>(L[j] | (L[j + kQK / 2] << 4));
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

// Packs six-bit scale/min pairs as the decoder's scale_min_k4 (engine/src/model/quant.cpp) reads
// them.
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
    scales[j] =
        fit_scale_min(32, nmax, x + 32 * j, weights, L + 32 * j, mins[j], rmin, 0.1f, nstep);
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
    // What the decoder unpacks from scales_out: every value is at most 63, so the six-bit
    // packing gives ls and lm back unchanged.
    const uint8_t sc = ls[j], m = lm[j];
    const float d = fp16_to_f32(d_out) * sc;
    if (d == 0) continue;
    const float dm = fp16_to_f32(dmin_out) * m;
    for (int ii = 0; ii < 32; ++ii)
      L[32 * j + ii] =
          static_cast<uint8_t>(std::clamp(nearest_int((x[32 * j + ii] + dm) / d), 0, nmax));
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
    const float d = fp16_to_f32(b.d) * b.scales[j];
    if (d == 0) continue;
    for (int ii = 0; ii < 16; ++ii)
      L[16 * j + ii] =
          static_cast<uint8_t>(std::clamp(nearest_int(x[16 * j + ii] / d), -32, 31) + 32);
  }
  uint8_t* ql = b.ql;
  uint8_t* qh = b.qh;
  for (int j = 0; j < kQK_K; j += 128) {
    for (int l = 0; l < 32; ++l) {
      const uint8_t q1 = L[j + l], q2 = L[j + l + 32], q3 = L[j + l + 64], q4 = L[j + l + 96];
      ql[l] = static_cast<uint8_t>((q1 & 0xF) | ((q3 & 0xF) << 4));
      ql[l + 32] = static_cast<uint8_t>((q2 & 0xF) | ((q4 & 0xF) << 4));
      qh[l] =
          static_cast<uint8_t>((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
    }
    ql += 64;
    qh += 32;
  }
}

// Q2_K as ggml's reference lays it out: each sub-block of 16 fitted as scale * q - min
// (q in 0..3), the scales and mins quantised to 4 bits against two fp16 super-scales.
void encode_block(const float* x, BlockQ2_K& b) {
  uint8_t L[kQK_K];
  float scales[16], mins[16], weights[16];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 16; ++j) {
    for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
    scales[j] = fit_scale_min(16, 3, x + 16 * j, weights, L + 16 * j, mins[j], -0.5f, 0.1f, 15);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0 ? 15.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 15.f / max_min : 0.f;
  for (int j = 0; j < 16; ++j) {
    const int ls = std::min(15, nearest_int(inv_scale * scales[j]));
    const int lm = std::min(15, nearest_int(inv_min * mins[j]));
    b.scales[j] = static_cast<uint8_t>(ls | (lm << 4));
  }
  b.d = f32_to_fp16(max_scale / 15.f);
  b.dmin = f32_to_fp16(max_min / 15.f);
  for (int j = 0; j < 16; ++j) {
    const float d = fp16_to_f32(b.d) * static_cast<float>(b.scales[j] & 0xF);
    if (d == 0) continue;
    const float dm = fp16_to_f32(b.dmin) * static_cast<float>(b.scales[j] >> 4);
    for (int ii = 0; ii < 16; ++ii)
      L[16 * j + ii] =
          static_cast<uint8_t>(std::clamp(nearest_int((x[16 * j + ii] + dm) / d), 0, 3));
  }
  for (int j = 0; j < kQK_K; j += 128)
    for (int l = 0; l < 32; ++l)
      b.qs[j / 4 + l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 2) |
                                             (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

// Q3_K as ggml's reference lays it out: symmetric sub-blocks of 16 (q in -4..3), six-bit
// signed sub-scales against one fp16 super-scale, the third bit of q in hmask.
void encode_block(const float* x, BlockQ3_K& b) {
  uint8_t L[kQK_K];
  float scales[16];
  float max_scale = 0, max_abs_scale = 0;
  for (int j = 0; j < 16; ++j) {
    scales[j] = fit_symmetric_scale(16, 4, x + 16 * j, L + 16 * j);
    if (std::fabs(scales[j]) > max_abs_scale) {
      max_abs_scale = std::fabs(scales[j]);
      max_scale = scales[j];
    }
  }
  std::memset(&b, 0, sizeof b);
  if (max_abs_scale < kGroupMaxEps) {
    // All zero: d = 0 decodes every value to 0 whatever the levels.
    return;
  }
  const float iscale = -32.f / max_scale;
  b.d = f32_to_fp16(1 / iscale);
  int ls[16];
  for (int j = 0; j < 16; ++j) {
    ls[j] = std::clamp(nearest_int(iscale * scales[j]), -32, 31) + 32;
    if (j < 8)
      b.scales[j] = static_cast<uint8_t>(ls[j] & 0xF);
    else
      b.scales[j - 8] |= static_cast<uint8_t>((ls[j] & 0xF) << 4);
    b.scales[8 + j % 4] |= static_cast<uint8_t>((ls[j] >> 4) << (2 * (j / 4)));
  }
  for (int j = 0; j < 16; ++j) {
    const float d = fp16_to_f32(b.d) * static_cast<float>(ls[j] - 32);
    if (d == 0) continue;
    for (int ii = 0; ii < 16; ++ii)
      L[16 * j + ii] = static_cast<uint8_t>(std::clamp(nearest_int(x[16 * j + ii] / d), -4, 3) + 4);
  }
  // Levels 4..7 keep their third bit in hmask (element e: byte e % 32, bit e / 32).
  for (int e = 0; e < kQK_K; ++e) {
    if (L[e] > 3) {
      b.hmask[e % 32] |= static_cast<uint8_t>(1u << (e / 32));
      L[e] = static_cast<uint8_t>(L[e] - 4);
    }
  }
  for (int j = 0; j < kQK_K; j += 128)
    for (int l = 0; l < 32; ++l)
      b.qs[j / 4 + l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 2) |
                                             (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

// IQ4_XS: each sub-block of 32 fitted as IQ4_NL, the sub-scales quantised to six signed
// bits against one fp16 super-scale, then every level re-picked against the final scale.
void encode_block(const float* x, BlockIQ4_XS& b) {
  uint8_t L[kQK_K];
  float scales[8];
  float max_scale = 0, max_abs_scale = 0;
  for (int j = 0; j < 8; ++j) {
    scales[j] = fit_iq4_scale(32, x + 32 * j, L + 32 * j);
    if (std::fabs(scales[j]) > max_abs_scale) {
      max_abs_scale = std::fabs(scales[j]);
      max_scale = scales[j];
    }
  }
  std::memset(&b, 0, sizeof b);
  if (max_abs_scale < kGroupMaxEps) return;  // d = 0: every value decodes to 0
  const float d = max_scale / -32.f;
  b.d = f32_to_fp16(d);
  const float id = 1 / d;
  for (int j = 0; j < 8; ++j) {
    const int ls = std::clamp(nearest_int(id * scales[j]), -32, 31) + 32;
    b.scales_l[j / 2] |= static_cast<uint8_t>((ls & 0xF) << (4 * (j % 2)));
    b.scales_h = static_cast<uint16_t>(b.scales_h | ((ls >> 4) << (2 * j)));
    const float dl = fp16_to_f32(b.d) * static_cast<float>(ls - 32);
    uint8_t* q = b.qs + 16 * j;
    for (int l = 0; l < 32; ++l) {
      const uint8_t level =
          dl != 0 ? static_cast<uint8_t>(nearest_level(kIq4nlValues, x[32 * j + l] / dl))
                  : uint8_t{8};
      if (l < 16)
        q[l] = level;
      else
        q[l - 16] = static_cast<uint8_t>(q[l - 16] | (level << 4));
    }
  }
}

// ---------------------------------------------------------------------------------------
// Row driver

template <typename Block, int kElems>
void quantize_blocks(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<Block*>(dst);
  for (int64_t i = 0; i < n / kElems; ++i) encode_block(src + i * kElems, blocks[i]);
}

}  // namespace

void quantize_row(TensorType type, const float* src, void* dst, int64_t n) {
  if (n < 0) throw UsageError("negative row length " + std::to_string(n));
  (void)row_bytes(type, n);  // throws when n is not a multiple of the block size
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
    case TensorType::Q4_0:
      return quantize_blocks<BlockQ4_0, kQK>(src, dst, n);
    case TensorType::Q4_1:
      return quantize_blocks<BlockQ4_1, kQK>(src, dst, n);
    case TensorType::Q8_0:
      return quantize_blocks<BlockQ8_0, kQK>(src, dst, n);
    case TensorType::Q4_K:
      return quantize_blocks<BlockQ4_K, kQK_K>(src, dst, n);
    case TensorType::Q5_K:
      return quantize_blocks<BlockQ5_K, kQK_K>(src, dst, n);
    case TensorType::Q6_K:
      return quantize_blocks<BlockQ6_K, kQK_K>(src, dst, n);
    case TensorType::Q5_0:
      return quantize_blocks<BlockQ5_0, kQK>(src, dst, n);
    case TensorType::Q5_1:
      return quantize_blocks<BlockQ5_1, kQK>(src, dst, n);
    case TensorType::Q2_K:
      return quantize_blocks<BlockQ2_K, kQK_K>(src, dst, n);
    case TensorType::Q3_K:
      return quantize_blocks<BlockQ3_K, kQK_K>(src, dst, n);
    case TensorType::IQ4_NL:
      return quantize_blocks<BlockIQ4_NL, kQK>(src, dst, n);
    case TensorType::IQ4_XS:
      return quantize_blocks<BlockIQ4_XS, kQK_K>(src, dst, n);
    case TensorType::MXFP4:
      return quantize_blocks<BlockMXFP4, kQK>(src, dst, n);
  }
  throw UnsupportedError("cannot encode tensor type " +
                         tensor_type_name(static_cast<uint32_t>(type)));
}

}  // namespace granule
