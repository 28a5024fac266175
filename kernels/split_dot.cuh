// The split-layout rows' sub-blocks (split_layout.h) as the batch-1 kernels read them: one
// 32-element sub-block of a row per lane (Payload, load_payload) and its dot product with 32
// int8 activations (dot_payload), and the handed-over RMSNorm's 1/rms (norm_scale). Used by
// matvec_split.cu.
#pragma once
#include "granule/split_layout.h"
#include "matvec.cuh"
#include "quant_blocks.cuh"
#include "split_unpack.h"

namespace granule::kernels::split_dot {

// One row's sub-block as loaded; each type uses some of the fields.
struct Payload {
  uint4 q;      // 16 bytes of quantised values (Q8_0: the first 16); Q3_K: q.x the third bits
  uint4 q2;     // Q8_0: the last 16
  uint2 h;      // Q6_K: high bits; Q5_0/Q5_1/Q5_K: h.x the fifth bits; Q2_K/Q3_K: the 2-bit q
  uint32_t s;   // f16 d (Q4_0, Q5_0, Q8_0, IQ4_NL); f16 d | f16 m << 16 (Q4_1, Q5_1); int8
                // scales (Q6_K, Q3_K; IQ4_XS: one); u8 sc | u8 m << 8 (Q4_K, Q5_K); GGUF's two
                // scale bytes (Q2_K); E8M0 (MXFP4)
  uint32_t d6;  // Q6_K, Q3_K, IQ4_XS: the super-block's f16 d; Q4_K/Q5_K/Q2_K: f16 d | f16
                // dmin << 16
};

template <uint32_t TYPE>
__device__ __forceinline__ void load_payload(const uint8_t* row, int n, int j, Payload& p) {
  if constexpr (TYPE == kQ8_0) {
    const uint4* q = reinterpret_cast<const uint4*>(row) + 2 * j;
    p.q = __ldcs(q);
    p.q2 = __ldcs(q + 1);
    p.s = __ldcs(reinterpret_cast<const unsigned short*>(row + 32 * n) + j);
  } else if constexpr (TYPE == kQ2_K || TYPE == kQ3_K) {
    p.h = __ldcs(reinterpret_cast<const uint2*>(row) + j);
    p.s = __ldcs(reinterpret_cast<const unsigned short*>(row + split::scales_offset(TYPE, n)) + j);
    if constexpr (TYPE == kQ2_K) {
      p.d6 = __ldcs(reinterpret_cast<const unsigned int*>(row + split::q2k_d_offset(n)) + j / 8);
    } else {
      p.q.x = __ldcs(reinterpret_cast<const unsigned int*>(row + split::q3k_qh_offset(n)) + j);
      p.d6 = __ldcs(reinterpret_cast<const unsigned short*>(row + split::q3k_d_offset(n)) + j / 8);
    }
  } else {
    p.q = __ldcs(reinterpret_cast<const uint4*>(row) + j);
    if constexpr (TYPE == kQ4_0 || TYPE == kIQ4_NL) {
      p.s = __ldcs(reinterpret_cast<const unsigned short*>(row + 16 * n) + j);
    } else if constexpr (TYPE == kMXFP4) {
      p.s = __ldcs(reinterpret_cast<const unsigned char*>(row + 16 * n) + j);
    } else if constexpr (TYPE == kIQ4_XS) {
      p.s = static_cast<uint32_t>(__ldcs(reinterpret_cast<const signed char*>(row + 16 * n) + j));
      p.d6 =
          __ldcs(reinterpret_cast<const unsigned short*>(row + split::iq4xs_d_offset(n)) + j / 8);
    } else if constexpr (TYPE == kQ4_1) {
      p.s = __ldcs(reinterpret_cast<const unsigned int*>(row + 16 * n) + j);
    } else if constexpr (TYPE == kQ5_0) {
      p.h.x = __ldcs(reinterpret_cast<const unsigned int*>(row + 16 * n) + j);
      p.s = __ldcs(reinterpret_cast<const unsigned short*>(row + split::q5_0_d_offset(n)) + j);
    } else if constexpr (TYPE == kQ5_1) {
      p.h = __ldcs(reinterpret_cast<const uint2*>(row + 16 * n) + j);  // qh, d | m << 16
      p.s = p.h.y;
    } else if constexpr (TYPE == kQ4_K || TYPE == kQ5_K) {
      if constexpr (TYPE == kQ5_K)
        p.h.x = __ldcs(reinterpret_cast<const unsigned int*>(row + split::q5k_qh_offset(n)) + j);
      p.s =
          __ldcs(reinterpret_cast<const unsigned short*>(row + split::scales_offset(TYPE, n)) + j);
      p.d6 = __ldcs(reinterpret_cast<const unsigned int*>(row + split::kquant_d_offset(TYPE, n)) +
                    j / 8);
    } else {  // Q6_K
      p.h = __ldcs(reinterpret_cast<const uint2*>(row + split::q6k_qh_offset(n)) + j);
      p.s =
          __ldcs(reinterpret_cast<const unsigned short*>(row + split::scales_offset(TYPE, n)) + j);
      p.d6 = __ldcs(reinterpret_cast<const unsigned short*>(row + split::q6k_d_offset(n)) + j / 8);
    }
  }
}

// Q4_K/Q5_K: a sub-block's Σ d_a·q·a = (d * sc) * d_a * Σ q·a - (dmin * m) * (d_a * Σ a), with
// sumi = Σ q·a over the unsigned q.
__device__ __forceinline__ float k_quant_dot(const Payload& p, int sumi, float2 ds) {
  const float d = half_bits_to_float(static_cast<uint16_t>(p.d6)) * static_cast<float>(p.s & 0xFF);
  const float m =
      half_bits_to_float(static_cast<uint16_t>(p.d6 >> 16)) * static_cast<float>((p.s >> 8) & 0xFF);
  return d * ds.x * static_cast<float>(sumi) - m * ds.y;
}

// The sub-block's dot product with 32 int8 activations xa (elements 0..15) and xb (16..31)
// whose block scales are ds = (d, d * sum of the int8 values).
template <uint32_t TYPE>
__device__ __forceinline__ float dot_payload(const Payload& p, const int4& xa, const int4& xb,
                                             float2 ds) {
  const int q[4] = {static_cast<int>(p.q.x), static_cast<int>(p.q.y), static_cast<int>(p.q.z),
                    static_cast<int>(p.q.w)};
  const int x[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
  if constexpr (TYPE == kQ8_0) {
    const int q2[4] = {static_cast<int>(p.q2.x), static_cast<int>(p.q2.y), static_cast<int>(p.q2.z),
                       static_cast<int>(p.q2.w)};
    int sumi = 0;
#pragma unroll
    for (int m = 0; m < 4; ++m) sumi = __dp4a(q2[m], x[m + 4], __dp4a(q[m], x[m], sumi));
    return half_bits_to_float(static_cast<uint16_t>(p.s)) * ds.x * static_cast<float>(sumi);
  } else if constexpr (TYPE == kQ4_0 || TYPE == kQ4_1) {
    int sumi = 0;
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      sumi = __dp4a(q[m] & 0x0F0F0F0F, x[m], sumi);
      sumi = __dp4a((q[m] >> 4) & 0x0F0F0F0F, x[m + 4], sumi);
    }
    const float d = half_bits_to_float(static_cast<uint16_t>(p.s));
    if constexpr (TYPE == kQ4_0) return d * (ds.x * static_cast<float>(sumi) - 8.0f * ds.y);
    return d * ds.x * static_cast<float>(sumi) +
           half_bits_to_float(static_cast<uint16_t>(p.s >> 16)) * ds.y;
  } else if constexpr (TYPE == kQ5_0 || TYPE == kQ5_1 || TYPE == kQ5_K) {
    // Q4's nibbles with bit e of qh moved to bit 4 of element e's byte: one multiply spreads
    // a nibble of qh, bit k to bit 4 of byte k (the shifted copies at k + 7i never overlap).
    // Fewer live values than four shifts and masks, with which the 16-column Q5_K SwiGLU
    // kernel spilled 4 bytes (ptxas -v, sm_90).
    const uint32_t qh = p.h.x;
    int sumi = 0;
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const uint32_t lo_bits = (qh >> (4 * m)) & 0xF, hi_bits = (qh >> (16 + 4 * m)) & 0xF;
      const int lo =
          (q[m] & 0x0F0F0F0F) | static_cast<int>(((lo_bits * 0x00204081u) & 0x01010101u) << 4);
      const int hi = ((q[m] >> 4) & 0x0F0F0F0F) |
                     static_cast<int>(((hi_bits * 0x00204081u) & 0x01010101u) << 4);
      sumi = __dp4a(lo, x[m], sumi);
      sumi = __dp4a(hi, x[m + 4], sumi);
    }
    if constexpr (TYPE == kQ5_K) return k_quant_dot(p, sumi, ds);
    const float d = half_bits_to_float(static_cast<uint16_t>(p.s));
    if constexpr (TYPE == kQ5_0) return d * (ds.x * static_cast<float>(sumi) - 16.0f * ds.y);
    return d * ds.x * static_cast<float>(sumi) +
           half_bits_to_float(static_cast<uint16_t>(p.s >> 16)) * ds.y;
  } else if constexpr (TYPE == kIQ4_NL || TYPE == kIQ4_XS || TYPE == kMXFP4) {
    // Q4_0's nibbles, each an index into the type's 16 int8 levels.
    const uint32_t qw[4] = {p.q.x, p.q.y, p.q.z, p.q.w};
    int sumi = 0;
#pragma unroll
    for (int m = 0; m < 8; ++m)
      sumi = __dp4a(static_cast<int>(split_unpack::nibble_levels_word<TYPE == kMXFP4>(qw, m)),
                    x[m], sumi);
    float d;
    if constexpr (TYPE == kIQ4_NL)
      d = half_bits_to_float(static_cast<uint16_t>(p.s));
    else if constexpr (TYPE == kIQ4_XS)
      d = half_bits_to_float(static_cast<uint16_t>(p.d6)) *
          static_cast<float>(static_cast<int>(p.s));
    else
      d = e8m0_to_float_half(p.s);
    return d * ds.x * static_cast<float>(sumi);
  } else if constexpr (TYPE == kQ2_K) {
    // Per 16-element half h: d * sc_h * Σ q·a - dmin * m_h * Σ a. q (0..3) times the 4-bit
    // scale stays below 46, so the scaled bytes go to dp4a directly; the mins meet the
    // activations as a byte vector of m_h.
    const uint32_t w[2] = {p.h.x, p.h.y};
    int sumq = 0, summ = 0;
#pragma unroll
    for (int m = 0; m < 8; ++m) {
      const uint32_t sc = (p.s >> (8 * (m / 4))) & 0xFF;
      const uint32_t v = split_unpack::two_bit_word(w, m);
      sumq = __dp4a(static_cast<int>(v * (sc & 0xF)), x[m], sumq);
      summ = __dp4a(static_cast<int>((sc >> 4) * 0x01010101u), x[m], summ);
    }
    const float d = half_bits_to_float(static_cast<uint16_t>(p.d6));
    const float dmin = half_bits_to_float(static_cast<uint16_t>(p.d6 >> 16));
    return ds.x * (d * static_cast<float>(sumq) - dmin * static_cast<float>(summ));
  } else if constexpr (TYPE == kQ3_K) {
    // (low 2 bits | third bit << 2) - 4 per byte, two 16-element halves with int8 scales.
    const uint32_t w[2] = {p.h.x, p.h.y};
    const uint32_t qh = p.q.x;
    int sum_half[2] = {0, 0};
#pragma unroll
    for (int m = 0; m < 8; ++m) {
      const int v = static_cast<int>(split_unpack::q3_k_word(w, qh, m));
      sum_half[m / 4] = __dp4a(v, x[m], sum_half[m / 4]);
    }
    const int sc0 = static_cast<int8_t>(p.s & 0xFF), sc1 = static_cast<int8_t>((p.s >> 8) & 0xFF);
    return half_bits_to_float(static_cast<uint16_t>(p.d6)) * ds.x *
           static_cast<float>(sc0 * sum_half[0] + sc1 * sum_half[1]);
  } else if constexpr (TYPE == kQ4_K) {
    int sumi = 0;
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      sumi = __dp4a(q[m] & 0x0F0F0F0F, x[m], sumi);
      sumi = __dp4a((q[m] >> 4) & 0x0F0F0F0F, x[m + 4], sumi);
    }
    return k_quant_dot(p, sumi, ds);
  } else {  // Q6_K: two 16-element halves with their own int8 scales
    const int h[2] = {static_cast<int>(p.h.x), static_cast<int>(p.h.y)};
    int sum_half[2] = {0, 0};
#pragma unroll
    for (int m = 0; m < 8; ++m) {
      const int low = (m < 4 ? q[m] : q[m - 4] >> 4) & 0x0F0F0F0F;
      const int high = (h[m & 1] >> (2 * (m >> 1))) & 0x03030303;
      const int v =
          static_cast<int>(__vsub4(static_cast<unsigned>(low | (high << 4)), 0x20202020u));
      sum_half[m / 4] = __dp4a(v, x[m], sum_half[m / 4]);
    }
    const int sc0 = static_cast<int8_t>(p.s & 0xFF), sc1 = static_cast<int8_t>((p.s >> 8) & 0xFF);
    return half_bits_to_float(static_cast<uint16_t>(p.d6)) * ds.x *
           static_cast<float>(sc0 * sum_half[0] + sc1 * sum_half[1]);
  }
}

// The 1/rms of a batch-1 input whose int8 blocks hold y·w without it (MatvecInput::
// norm_sum_squares), from Σ y² over all of it (the warp's sum of the blocks' sums): one formula
// for every kernel that applies it, so they agree to the bit.
__device__ __forceinline__ float norm_scale(const MatvecInput& in, float sum_squares) {
  return rsqrtf(sum_squares / static_cast<float>(in.n_in) + in.norm_eps);
}

}  // namespace granule::kernels::split_dot
