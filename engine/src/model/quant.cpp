// The GGUF block formats: fp16/bf16 decoding and per-type decode (bit-exact with
// ggml-quants.c and gguf-py's gguf.quants) and dot product. Encoding is the testkit's
// (granule/testkit/quantize.h).
#include "granule/quant.h"

#include <array>
#include <bit>
#include <cstring>
#include <string>

#include "granule/error.h"

namespace granule {

// ---------------------------------------------------------------------------------------
// fp16 and bf16 to f32

namespace {

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

float bf16_to_f32(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

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

// Q5_0/Q5_1: the fifth bit of element j is bit j of qh, a little-endian u32.
uint32_t q5_high_bits(const uint8_t* qh) {
  return static_cast<uint32_t>(qh[0]) | static_cast<uint32_t>(qh[1]) << 8 |
         static_cast<uint32_t>(qh[2]) << 16 | static_cast<uint32_t>(qh[3]) << 24;
}

void unpack_q5(const uint8_t* packed, const uint8_t* qh, uint8_t* q) {
  unpack_nibbles(packed, q);
  const uint32_t high = q5_high_bits(qh);
  for (int j = 0; j < kQK; ++j) q[j] = static_cast<uint8_t>(q[j] | (((high >> j) & 1u) << 4));
}

void decode_block(const BlockQ5_0& b, float* y) {
  const float d = half_to_float(b.d);
  uint8_t q[kQK];
  unpack_q5(b.qs, b.qh, q);
  for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(q[j] - 16) * d;
}

void decode_block(const BlockQ5_1& b, float* y) {
  const float d = half_to_float(b.d);
  const float m = half_to_float(b.m);
  uint8_t q[kQK];
  unpack_q5(b.qs, b.qh, q);
  for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(q[j]) * d + m;
}

void decode_block(const BlockIQ4_NL& b, float* y) {
  const float d = half_to_float(b.d);
  uint8_t q[kQK];
  unpack_nibbles(b.qs, q);
  for (int j = 0; j < kQK; ++j) y[j] = d * static_cast<float>(kIq4nlValues[q[j]]);
}

// E8M0 exponent to 2^(e - 127) / 2 as ggml_e8m0_to_fp32_half builds it (e 0 and 1 give
// the subnormals 2^-128 and 2^-127).
float e8m0_to_float_half(uint8_t e) {
  return bits_float(e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23);
}

void decode_block(const BlockMXFP4& b, float* y) {
  const float d = e8m0_to_float_half(b.e);
  uint8_t q[kQK];
  unpack_nibbles(b.qs, q);
  for (int j = 0; j < kQK; ++j) y[j] = d * static_cast<float>(kMxfp4Values[q[j]]);
}

void decode_block(const BlockQ8_0& b, float* y) {
  const float d = half_to_float(b.d);
  for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(b.qs[j]) * d;
}

void decode_block(const BlockQ2_K& b, float* y) {
  const float d = half_to_float(b.d);
  const float dmin = half_to_float(b.dmin);
  // Each half (128 values) reads 32 bytes of qs four times, two bits deeper each time;
  // each pass of 32 covers two sub-blocks of 16, one scale/min byte each.
  const uint8_t* q = b.qs;
  int is = 0;
  for (int half = 0; half < 2; ++half) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int part = 0; part < 2; ++part) {
        const uint8_t sc = b.scales[is++];
        const float dl = d * static_cast<float>(sc & 0xF);
        const float ml = dmin * static_cast<float>(sc >> 4);
        for (int l = 0; l < 16; ++l)
          *y++ = dl * static_cast<float>((q[16 * part + l] >> shift) & 3) - ml;
      }
    }
    q += 32;
  }
}

// Q3_K's sixteen 6-bit scales: low 4 bits in the nibbles of bytes 0-7 (scale j < 8 in the
// low nibble of byte j, j >= 8 in the high nibble of byte j - 8), high 2 bits in bytes
// 8-11 (scale j at bits 2 * (j / 4) of byte 8 + j % 4). Biased by 32.
int q3_k_scale(const uint8_t* scales, int j) {
  const int low = (scales[j % 8] >> (4 * (j / 8))) & 0xF;
  const int high = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (low | (high << 4)) - 32;
}

void decode_block(const BlockQ3_K& b, float* y) {
  const float d = half_to_float(b.d);
  const uint8_t* q = b.qs;
  // As Q2_K's order; the third bit of element 32k + l (k = 0..7) is bit k of hmask[l],
  // and a clear bit subtracts 4.
  int is = 0, bit = 0;
  for (int half = 0; half < 2; ++half) {
    for (int shift = 0; shift < 8; shift += 2, ++bit) {
      for (int part = 0; part < 2; ++part) {
        const float dl = d * static_cast<float>(q3_k_scale(b.scales, is++));
        for (int l = 16 * part; l < 16 * part + 16; ++l) {
          const int low = (q[l] >> shift) & 3;
          const int value = low - ((b.hmask[l] >> bit) & 1 ? 0 : 4);
          *y++ = dl * static_cast<float>(value);
        }
      }
    }
    q += 32;
  }
}

void decode_block(const BlockIQ4_XS& b, float* y) {
  const float d = half_to_float(b.d);
  for (int sub = 0; sub < 8; ++sub) {
    const int low = (b.scales_l[sub / 2] >> (4 * (sub % 2))) & 0xF;
    const int high = (b.scales_h >> (2 * sub)) & 3;
    const float dl = d * static_cast<float>((low | (high << 4)) - 32);
    const uint8_t* qs = b.qs + 16 * sub;
    for (int j = 0; j < 16; ++j) {
      y[j] = dl * static_cast<float>(kIq4nlValues[qs[j] & 0xF]);
      y[j + 16] = dl * static_cast<float>(kIq4nlValues[qs[j] >> 4]);
    }
    y += 32;
  }
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
      const float s1 = d * static_cast<float>(sc[group]),
                  s2 = d * static_cast<float>(sc[group + 2]);
      const float s3 = d * static_cast<float>(sc[group + 4]),
                  s4 = d * static_cast<float>(sc[group + 6]);
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
    case TensorType::Q4_0:
      return dequantize_blocks<BlockQ4_0, kQK>(src, dst, n);
    case TensorType::Q4_1:
      return dequantize_blocks<BlockQ4_1, kQK>(src, dst, n);
    case TensorType::Q8_0:
      return dequantize_blocks<BlockQ8_0, kQK>(src, dst, n);
    case TensorType::Q4_K:
      return dequantize_blocks<BlockQ4_K, kQK_K>(src, dst, n);
    case TensorType::Q5_K:
      return dequantize_blocks<BlockQ5_K, kQK_K>(src, dst, n);
    case TensorType::Q6_K:
      return dequantize_blocks<BlockQ6_K, kQK_K>(src, dst, n);
    case TensorType::Q5_0:
      return dequantize_blocks<BlockQ5_0, kQK>(src, dst, n);
    case TensorType::Q5_1:
      return dequantize_blocks<BlockQ5_1, kQK>(src, dst, n);
    case TensorType::Q2_K:
      return dequantize_blocks<BlockQ2_K, kQK_K>(src, dst, n);
    case TensorType::Q3_K:
      return dequantize_blocks<BlockQ3_K, kQK_K>(src, dst, n);
    case TensorType::IQ4_NL:
      return dequantize_blocks<BlockIQ4_NL, kQK>(src, dst, n);
    case TensorType::IQ4_XS:
      return dequantize_blocks<BlockIQ4_XS, kQK_K>(src, dst, n);
    case TensorType::MXFP4:
      return dequantize_blocks<BlockMXFP4, kQK>(src, dst, n);
  }
  throw UnsupportedError("cannot decode tensor type " +
                         tensor_type_name(static_cast<uint32_t>(type)));
}

float dot_row(TensorType type, const void* row, const float* x, int64_t n) {
  check_row_length(type, n);
  switch (type) {
    case TensorType::F32:
      return dot_elements(row, x, n,
                          [](const void* r, int64_t i) { return static_cast<const float*>(r)[i]; });
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
    case TensorType::Q4_0:
      return dot_blocks<BlockQ4_0, kQK>(row, x, n);
    case TensorType::Q4_1:
      return dot_blocks<BlockQ4_1, kQK>(row, x, n);
    case TensorType::Q8_0:
      return dot_blocks<BlockQ8_0, kQK>(row, x, n);
    case TensorType::Q4_K:
      return dot_blocks<BlockQ4_K, kQK_K>(row, x, n);
    case TensorType::Q5_K:
      return dot_blocks<BlockQ5_K, kQK_K>(row, x, n);
    case TensorType::Q6_K:
      return dot_blocks<BlockQ6_K, kQK_K>(row, x, n);
    case TensorType::Q5_0:
      return dot_blocks<BlockQ5_0, kQK>(row, x, n);
    case TensorType::Q5_1:
      return dot_blocks<BlockQ5_1, kQK>(row, x, n);
    case TensorType::Q2_K:
      return dot_blocks<BlockQ2_K, kQK_K>(row, x, n);
    case TensorType::Q3_K:
      return dot_blocks<BlockQ3_K, kQK_K>(row, x, n);
    case TensorType::IQ4_NL:
      return dot_blocks<BlockIQ4_NL, kQK>(row, x, n);
    case TensorType::IQ4_XS:
      return dot_blocks<BlockIQ4_XS, kQK_K>(row, x, n);
    case TensorType::MXFP4:
      return dot_blocks<BlockMXFP4, kQK>(row, x, n);
  }
  throw UnsupportedError("cannot multiply tensor type " +
                         tensor_type_name(static_cast<uint32_t>(type)));
}

}  // namespace granule
