// Split layout repacking: GGUF blocks → [quantised values][scales] per row, and back to f32.
#include "model/weight_split.h"

#include <cstring>

#include "granule/block_formats.h"
#include "granule/error.h"
#include "granule/quant.h"
#include "granule/split_layout.h"
#include "granule/tensor_type.h"

namespace granule {
namespace {

namespace split = kernels::split;

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// One GGUF Q6_K block (ql[128], qh[64], scales[16], d) → the 6-bit value of each element.
void q6k_values(const uint8_t* block, uint8_t q[256]) {
  const uint8_t* ql = block;
  const uint8_t* qh = block + 128;
  for (int half = 0; half < 2; ++half) {
    for (int l = 0; l < 32; ++l) {
      const uint8_t a = ql[64 * half + l], b = ql[64 * half + l + 32], h = qh[32 * half + l];
      uint8_t* y = q + 128 * half;
      y[l] = static_cast<uint8_t>((a & 0xF) | ((h & 3) << 4));
      y[l + 32] = static_cast<uint8_t>((b & 0xF) | (((h >> 2) & 3) << 4));
      y[l + 64] = static_cast<uint8_t>((a >> 4) | (((h >> 4) & 3) << 4));
      y[l + 96] = static_cast<uint8_t>((b >> 4) | (((h >> 6) & 3) << 4));
    }
  }
}

// The 6-bit scale and min of sub-block j (0..7) from a Q4_K/Q5_K block's 12 packed bytes
// (as quant.cpp's CPU dequantiser reads them).
void k_scale_min(const uint8_t* q, int j, uint8_t& scale, uint8_t& min) {
  if (j < 4) {
    scale = q[j] & 63;
    min = q[j + 4] & 63;
  } else {
    scale = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    min = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Q3_K's six-bit scale j (0..15) minus 32 (quant.cpp's q3_k_scale: low 4 bits in the nibbles
// of bytes 0-7, high 2 bits in bytes 8-11).
int8_t q3k_scale(const uint8_t* scales, int j) {
  const int low = (scales[j % 8] >> (4 * (j / 8))) & 0xF;
  const int high = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
  return static_cast<int8_t>((low | (high << 4)) - 32);
}

// The 2-bit values q[32] of one sub-block as the split layout holds them: element e in byte
// e % 8 at bit 2 * (e / 8).
void pack_2bit(const uint8_t q[32], uint8_t* out) {
  for (int i = 0; i < 8; ++i)
    out[i] = static_cast<uint8_t>(q[i] | (q[i + 8] << 2) | (q[i + 16] << 4) | (q[i + 24] << 6));
}
int unpack_2bit(const uint8_t* in, int e) { return (in[e % 8] >> (2 * (e / 8))) & 3; }

// Q2_K/Q3_K: GGUF's two halves of 128 each read 32 bytes of qs four times, two bits deeper
// each time, so sub-block s (0..7) of a super-block is element l of qs[32 * (s / 4) + l] at
// bit 2 * (s % 4), with the scales of its two 16-element halves at 2s and 2s + 1 (and Q3_K's
// third bit of element l at bit s of hmask[l]).
void split_row_q2_q3(uint32_t type, const uint8_t* src, int64_t n, uint8_t* dst) {
  const bool three = type == split::kTypeQ3_K;
  uint8_t* scales = dst + split::scales_offset(type, n);
  for (int64_t k = 0; k < n / 8; ++k) {
    const uint8_t* b = src + k * (three ? 110 : 84);
    const uint8_t* qs = three ? b + 32 : b + 16;
    for (int s = 0; s < 8; ++s) {
      const int64_t j = 8 * k + s;
      uint8_t q[32];
      for (int l = 0; l < 32; ++l) q[l] = (qs[32 * (s / 4) + l] >> (2 * (s % 4))) & 3;
      pack_2bit(q, dst + 8 * j);
      if (three) {
        uint32_t bits = 0;  // element e at byte e % 4, bit e / 4
        for (int e = 0; e < 32; ++e)
          bits |= static_cast<uint32_t>((b[e] >> s) & 1) << (8 * (e % 4) + e / 4);
        std::memcpy(dst + split::q3k_qh_offset(n) + 4 * j, &bits, 4);
        for (int h = 0; h < 2; ++h)
          scales[2 * j + h] = static_cast<uint8_t>(q3k_scale(b + 96, 2 * s + h));
      } else {
        scales[2 * j] = b[2 * s];
        scales[2 * j + 1] = b[2 * s + 1];
      }
    }
    if (three)
      std::memcpy(dst + split::q3k_d_offset(n) + 2 * k, b + 108, 2);
    else
      std::memcpy(dst + split::q2k_d_offset(n) + 4 * k, b + 80, 4);  // d, dmin
  }
}

void split_row(uint32_t type, const uint8_t* src, int64_t cols, uint8_t* dst) {
  const int64_t n = cols / 32;
  uint8_t* scales = dst + split::scales_offset(type, n);
  if (type == split::kTypeQ2_K || type == split::kTypeQ3_K) {
    split_row_q2_q3(type, src, n, dst);
    return;
  }
  if (type == split::kTypeIQ4_XS) {
    // GGUF: d, scales_h (2 bits per sub-block), scales_l[4] (a nibble per sub-block), qs[128]
    // in IQ4_NL's order.
    for (int64_t k = 0; k < n / 8; ++k) {
      const uint8_t* b = src + k * 136;
      const uint16_t scales_h = load_u16(b + 2);
      for (int s = 0; s < 8; ++s) {
        const int64_t j = 8 * k + s;
        const int low = (b[4 + s / 2] >> (4 * (s % 2))) & 0xF, high = (scales_h >> (2 * s)) & 3;
        scales[j] = static_cast<uint8_t>(static_cast<int8_t>((low | (high << 4)) - 32));
        std::memcpy(dst + 16 * j, b + 8 + 16 * s, 16);
      }
      std::memcpy(dst + split::iq4xs_d_offset(n) + 2 * k, b, 2);
    }
    return;
  }
  if (type == split::kTypeIQ4_NL || type == split::kTypeMXFP4) {
    // GGUF: d (f16) or e (E8M0), then qs[16] in Q4_0's order.
    const int64_t scale_bytes = type == split::kTypeMXFP4 ? 1 : 2;
    for (int64_t j = 0; j < n; ++j) {
      const uint8_t* b = src + j * (16 + scale_bytes);
      std::memcpy(scales + j * scale_bytes, b, static_cast<size_t>(scale_bytes));
      std::memcpy(dst + 16 * j, b + scale_bytes, 16);
    }
    return;
  }
  if (type == split::kTypeQ4_K || type == split::kTypeQ5_K) {
    // GGUF: d, dmin, scales[12], (qh[32],) qs[128]; qs byte l of pair c holds element l of
    // sub-block 2c (low nibble) and of 2c + 1 (high); Q5_K's fifth bit of element l of
    // sub-block s is bit s of qh[l].
    const bool five = type == split::kTypeQ5_K;
    const int64_t block = five ? 176 : 144;
    uint8_t* qh_out = dst + split::q5k_qh_offset(n);
    uint8_t* d_out = dst + split::kquant_d_offset(type, n);
    for (int64_t k = 0; k < n / 8; ++k) {
      const uint8_t* b = src + k * block;
      const uint8_t* packed = b + 4;
      const uint8_t* qh = b + 16;
      const uint8_t* qs = b + (five ? 48 : 16);
      for (int s = 0; s < 8; ++s) {
        const int64_t j = 8 * k + s;
        const int shift = 4 * (s % 2);
        uint8_t q[32];
        for (int l = 0; l < 32; ++l) q[l] = (qs[32 * (s / 2) + l] >> shift) & 0xF;
        for (int i = 0; i < 16; ++i)
          dst[16 * j + i] = static_cast<uint8_t>(q[i] | (q[i + 16] << 4));
        if (five) {
          uint32_t bits = 0;
          for (int l = 0; l < 32; ++l) bits |= static_cast<uint32_t>((qh[l] >> s) & 1) << l;
          std::memcpy(qh_out + 4 * j, &bits, 4);
        }
        k_scale_min(packed, s, scales[2 * j], scales[2 * j + 1]);
      }
      std::memcpy(d_out + 4 * k, b, 4);  // d, dmin
    }
    return;
  }
  if (type == split::kTypeQ6_K) {
    uint8_t* qh = dst + split::q6k_qh_offset(n);
    uint8_t* d = dst + split::q6k_d_offset(n);
    for (int64_t k = 0; k < n / 8; ++k) {
      const uint8_t* block = src + k * 210;
      uint8_t q[256];
      q6k_values(block, q);
      for (int s = 0; s < 8; ++s) {
        const int64_t j = 8 * k + s;
        const uint8_t* e = q + 32 * s;
        for (int i = 0; i < 16; ++i)
          dst[16 * j + i] = static_cast<uint8_t>((e[i] & 0xF) | ((e[i + 16] & 0xF) << 4));
        for (int i = 0; i < 8; ++i)
          qh[8 * j + i] = static_cast<uint8_t>((e[i] >> 4) | ((e[i + 8] >> 4) << 2) |
                                               ((e[i + 16] >> 4) << 4) | ((e[i + 24] >> 4) << 6));
        scales[2 * j] = block[192 + 2 * s];
        scales[2 * j + 1] = block[192 + 2 * s + 1];
      }
      std::memcpy(d + 2 * k, block + 208, 2);
    }
    return;
  }
  if (type == split::kTypeQ5_0 || type == split::kTypeQ5_1) {
    // GGUF: d, (m,) qh[4], qs[16] → qs first; Q5_0's qh and d in two arrays, Q5_1's qh, d, m
    // together (one 8-byte load on the device).
    const bool has_min = type == split::kTypeQ5_1;
    const int64_t block = has_min ? 24 : 22, scale_bytes = has_min ? 4 : 2;
    for (int64_t j = 0; j < n; ++j) {
      const uint8_t* b = src + j * block;
      std::memcpy(dst + 16 * j, b + scale_bytes + 4, 16);
      if (has_min) {
        std::memcpy(scales + 8 * j, b + 4, 4);
        std::memcpy(scales + 8 * j + 4, b, 4);
      } else {
        std::memcpy(scales + 4 * j, b + 2, 4);
        std::memcpy(dst + split::q5_0_d_offset(n) + 2 * j, b, 2);
      }
    }
    return;
  }
  const int64_t block = type == split::kTypeQ4_0 ? 18 : type == split::kTypeQ4_1 ? 20 : 34;
  const int64_t scale_bytes = type == split::kTypeQ4_1 ? 4 : 2;
  const int64_t qbytes = split::quant_bytes(type);
  for (int64_t j = 0; j < n; ++j) {
    const uint8_t* b = src + j * block;
    std::memcpy(scales + j * scale_bytes, b, static_cast<size_t>(scale_bytes));
    std::memcpy(dst + j * qbytes, b + scale_bytes, static_cast<size_t>(qbytes));
  }
}

}  // namespace

bool split_layout_supported(uint32_t ggml_type) { return split::supports(ggml_type); }

bool split_layout_fits(uint32_t ggml_type, int64_t cols) {
  return split::supports(ggml_type) && cols % split::block_elements(ggml_type) == 0;
}

int64_t split_row_stride(uint32_t ggml_type, int64_t cols) {
  return split::row_stride(ggml_type, cols);
}

void split_rows(uint32_t ggml_type, const uint8_t* gguf_rows, int64_t rows, int64_t cols,
                uint8_t* dst) {
  if (!split_layout_fits(ggml_type, cols))
    throw UsageError("the split weight layout cannot hold this tensor type or row length");
  const int64_t src_bytes = split::gguf_row_bytes(ggml_type, cols);
  const int64_t payload = split::row_payload_bytes(ggml_type, cols);
  const int64_t stride = split::row_stride(ggml_type, cols);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* out = dst + r * stride;
    std::memset(out + payload, 0, static_cast<size_t>(stride - payload));
    split_row(ggml_type, gguf_rows + r * src_bytes, cols, out);
  }
}

void dequantize_split_row(uint32_t ggml_type, const uint8_t* row, int64_t cols, float* out) {
  const int64_t n = cols / 32;
  const uint8_t* scales = row + split::scales_offset(ggml_type, n);
  for (int64_t j = 0; j < n; ++j) {
    float* y = out + 32 * j;
    switch (ggml_type) {
      case split::kTypeQ4_0:
      case split::kTypeQ4_1: {
        const bool has_min = ggml_type == split::kTypeQ4_1;
        const float d = fp16_to_f32(load_u16(scales + j * (has_min ? 4 : 2)));
        const float m = has_min ? fp16_to_f32(load_u16(scales + j * 4 + 2)) : 0.0f;
        const float offset = has_min ? 0.0f : 8.0f;
        for (int i = 0; i < 16; ++i) {
          const uint8_t q = row[16 * j + i];
          y[i] = (static_cast<float>(q & 0xF) - offset) * d + m;
          y[i + 16] = (static_cast<float>(q >> 4) - offset) * d + m;
        }
        break;
      }
      case split::kTypeQ5_0:
      case split::kTypeQ5_1: {
        const bool has_min = ggml_type == split::kTypeQ5_1;
        uint32_t qh;
        std::memcpy(&qh, scales + j * (has_min ? 8 : 4), 4);
        const float d = fp16_to_f32(has_min ? load_u16(scales + 8 * j + 4)
                                            : load_u16(row + split::q5_0_d_offset(n) + 2 * j));
        const float m = has_min ? fp16_to_f32(load_u16(scales + 8 * j + 6)) : 0.0f;
        for (int i = 0; i < 16; ++i) {
          const uint8_t q = row[16 * j + i];
          const int q0 = (q & 0xF) | static_cast<int>(((qh >> i) & 1) << 4);
          const int q1 = (q >> 4) | static_cast<int>(((qh >> (i + 16)) & 1) << 4);
          // As dequantize_row: (q - 16) * d for Q5_0, q * d + m for Q5_1.
          y[i] = has_min ? static_cast<float>(q0) * d + m : static_cast<float>(q0 - 16) * d;
          y[i + 16] = has_min ? static_cast<float>(q1) * d + m : static_cast<float>(q1 - 16) * d;
        }
        break;
      }
      case split::kTypeQ8_0: {
        const float d = fp16_to_f32(load_u16(scales + 2 * j));
        for (int i = 0; i < 32; ++i)
          y[i] = static_cast<float>(static_cast<int8_t>(row[32 * j + i])) * d;
        break;
      }
      case split::kTypeQ4_K:
      case split::kTypeQ5_K: {
        const bool five = ggml_type == split::kTypeQ5_K;
        const uint8_t* dm = row + split::kquant_d_offset(ggml_type, n) + 4 * (j / 8);
        const float d = fp16_to_f32(load_u16(dm)), dmin = fp16_to_f32(load_u16(dm + 2));
        uint32_t qh = 0;
        if (five) std::memcpy(&qh, row + split::q5k_qh_offset(n) + 4 * j, 4);
        // As quant.cpp's decode_block: d * sc and dmin * m first, then d1 * q - m1.
        const float d1 = d * scales[2 * j], m1 = dmin * scales[2 * j + 1];
        for (int i = 0; i < 16; ++i) {
          const uint8_t q = row[16 * j + i];
          const int q0 = (q & 0xF) + (((qh >> i) & 1) ? 16 : 0);
          const int q1 = (q >> 4) + (((qh >> (i + 16)) & 1) ? 16 : 0);
          y[i] = d1 * static_cast<float>(q0) - m1;
          y[i + 16] = d1 * static_cast<float>(q1) - m1;
        }
        break;
      }
      case split::kTypeQ6_K: {
        const uint8_t* qh = row + split::q6k_qh_offset(n);
        const float d = fp16_to_f32(load_u16(row + split::q6k_d_offset(n) + 2 * (j / 8)));
        for (int e = 0; e < 32; ++e) {
          const int lo = e < 16 ? row[16 * j + e] & 0xF : row[16 * j + e - 16] >> 4;
          const int hi = (qh[8 * j + e % 8] >> (2 * (e / 8))) & 3;
          const int8_t sc = static_cast<int8_t>(scales[2 * j + e / 16]);
          y[e] = d * static_cast<float>(sc) * static_cast<float>((lo | (hi << 4)) - 32);
        }
        break;
      }
      case split::kTypeQ2_K: {
        // As quant.cpp's decode_block: dl = d * scale, ml = dmin * min, then dl * q - ml.
        const uint8_t* dm = row + split::q2k_d_offset(n) + 4 * (j / 8);
        const float d = fp16_to_f32(load_u16(dm)), dmin = fp16_to_f32(load_u16(dm + 2));
        for (int e = 0; e < 32; ++e) {
          const uint8_t sc = scales[2 * j + e / 16];
          const float dl = d * static_cast<float>(sc & 0xF);
          const float ml = dmin * static_cast<float>(sc >> 4);
          y[e] = dl * static_cast<float>(unpack_2bit(row + 8 * j, e)) - ml;
        }
        break;
      }
      case split::kTypeQ3_K: {
        const float d = fp16_to_f32(load_u16(row + split::q3k_d_offset(n) + 2 * (j / 8)));
        uint32_t qh;
        std::memcpy(&qh, row + split::q3k_qh_offset(n) + 4 * j, 4);
        for (int e = 0; e < 32; ++e) {
          const int bit = (qh >> (8 * (e % 4) + e / 4)) & 1;
          const float dl = d * static_cast<float>(static_cast<int8_t>(scales[2 * j + e / 16]));
          y[e] = dl * static_cast<float>((unpack_2bit(row + 8 * j, e) | (bit << 2)) - 4);
        }
        break;
      }
      case split::kTypeIQ4_NL:
      case split::kTypeIQ4_XS:
      case split::kTypeMXFP4: {
        float d;
        if (ggml_type == split::kTypeIQ4_NL) {
          d = fp16_to_f32(load_u16(scales + 2 * j));
        } else if (ggml_type == split::kTypeIQ4_XS) {
          // As quant.cpp: dl = d * (ls - 32), then dl * level.
          d = fp16_to_f32(load_u16(row + split::iq4xs_d_offset(n) + 2 * (j / 8))) *
              static_cast<float>(static_cast<int8_t>(scales[j]));
        } else {
          const uint32_t e = scales[j];
          const uint32_t bits = e < 2 ? 0x00200000u << e : (e - 1) << 23;
          std::memcpy(&d, &bits, 4);
        }
        const int8_t* levels = ggml_type == split::kTypeMXFP4 ? kMxfp4Values : kIq4nlValues;
        for (int i = 0; i < 16; ++i) {
          const uint8_t q = row[16 * j + i];
          y[i] = d * static_cast<float>(levels[q & 0xF]);
          y[i + 16] = d * static_cast<float>(levels[q >> 4]);
        }
        break;
      }
      default:
        throw UsageError("the split weight layout cannot hold this tensor type");
    }
  }
}

int64_t expert_row_bytes(uint32_t ggml_type, int64_t cols) {
  return expert_rows_split(ggml_type)
             ? split_row_stride(ggml_type, cols)
             : static_cast<int64_t>(row_bytes(static_cast<TensorType>(ggml_type), cols));
}

void write_expert_rows(uint32_t ggml_type, const uint8_t* gguf_rows, int64_t rows, int64_t cols,
                       uint8_t* dst) {
  if (expert_rows_split(ggml_type)) {
    split_rows(ggml_type, gguf_rows, rows, cols, dst);
  } else {
    std::memcpy(dst, gguf_rows,
                static_cast<size_t>(rows) * row_bytes(static_cast<TensorType>(ggml_type), cols));
  }
}

}  // namespace granule
