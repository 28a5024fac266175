// The split layout's int8 words (kernels/split_unpack.h) on the host, no GPU needed: for Q2_K,
// Q3_K, Q4_K, Q5_K, IQ4_NL, IQ4_XS and MXFP4 rows (quantiser output and random blocks) re-laid out
// by split_rows, every element that the dp4a / mma kernels build from the split bytes, times the
// sub-block's scale (and minus its min), is exactly the host's decoding of the row
// (dequantize_split_row, itself dequantize_row's to the bit: weight_split_test). Then each
// sub-block's product with int8 activations as split_dot.cuh's dot_payload forms it (integer
// sums per word, then the scales) against the f64 sum over the decoded weights.
#include "split_unpack.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "granule/block_formats.h"
#include "granule/quant.h"
#include "granule/split_layout.h"
#include "granule/tensor_type.h"
#include "granule/testkit/quantize.h"
#include "model/weight_split.h"

namespace granule {
namespace {

namespace split = kernels::split;
namespace su = kernels::split_unpack;

uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
int8_t byte_of(uint32_t word, int k) { return static_cast<int8_t>((word >> (8 * k)) & 0xFF); }
float e8m0_half(uint32_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : (e - 1) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// One sub-block of a split row as the kernels see it: the eight int8 words and, per element,
// the affine map (scale, offset) that turns the word's byte into the weight.
struct SubBlock {
  uint32_t words[8];
  float scale[32], offset[32];
};

SubBlock unpack(TensorType type, const uint8_t* row, int64_t n, int64_t j) {
  const uint32_t id = static_cast<uint32_t>(type);
  SubBlock b{};
  const uint8_t* scales = row + split::scales_offset(id, n);
  if (type == TensorType::Q2_K || type == TensorType::Q3_K) {
    const uint32_t w[2] = {load_u32(row + 8 * j), load_u32(row + 8 * j + 4)};
    if (type == TensorType::Q2_K) {
      const uint8_t* dm = row + split::q2k_d_offset(n) + 4 * (j / 8);
      const float d = fp16_to_f32(load_u16(dm)), dmin = fp16_to_f32(load_u16(dm + 2));
      for (int m = 0; m < 8; ++m) b.words[m] = su::two_bit_word(w, m);
      for (int e = 0; e < 32; ++e) {
        const uint8_t sc = scales[2 * j + e / 16];
        b.scale[e] = d * static_cast<float>(sc & 0xF);
        b.offset[e] = -(dmin * static_cast<float>(sc >> 4));
      }
    } else {
      const uint32_t qh = load_u32(row + split::q3k_qh_offset(n) + 4 * j);
      const float d = fp16_to_f32(load_u16(row + split::q3k_d_offset(n) + 2 * (j / 8)));
      for (int m = 0; m < 8; ++m) b.words[m] = su::q3_k_word(w, qh, m);
      for (int e = 0; e < 32; ++e)
        b.scale[e] = d * static_cast<float>(static_cast<int8_t>(scales[2 * j + e / 16]));
    }
    return b;
  }
  const uint32_t q[4] = {load_u32(row + 16 * j), load_u32(row + 16 * j + 4),
                         load_u32(row + 16 * j + 8), load_u32(row + 16 * j + 12)};
  if (type == TensorType::Q4_K || type == TensorType::Q5_K) {
    // The mma kernel's bytes: the nibbles (Q5_K: with the fifth bits); d * sc and dmin * m.
    const uint8_t* dm = row + split::kquant_d_offset(id, n) + 4 * (j / 8);
    const float d = fp16_to_f32(load_u16(dm)), dmin = fp16_to_f32(load_u16(dm + 2));
    const bool five = type == TensorType::Q5_K;
    const uint32_t qh = five ? load_u32(row + split::q5k_qh_offset(n) + 4 * j) : 0;
    for (int m = 0; m < 8; ++m) b.words[m] = five ? su::q5_k_word(q, qh, m) : su::nibble_word(q, m);
    for (int e = 0; e < 32; ++e) {
      b.scale[e] = d * static_cast<float>(scales[2 * j]);
      b.offset[e] = -(dmin * static_cast<float>(scales[2 * j + 1]));
    }
    return b;
  }
  float d;
  if (type == TensorType::IQ4_NL)
    d = fp16_to_f32(load_u16(scales + 2 * j));
  else if (type == TensorType::IQ4_XS)
    d = fp16_to_f32(load_u16(row + split::iq4xs_d_offset(n) + 2 * (j / 8))) *
        static_cast<float>(static_cast<int8_t>(scales[j]));
  else
    d = e8m0_half(scales[j]);
  for (int m = 0; m < 8; ++m)
    b.words[m] = type == TensorType::MXFP4 ? su::nibble_levels_word<true>(q, m)
                                           : su::nibble_levels_word<false>(q, m);
  for (float& s : b.scale) s = d;
  return b;
}

// dot_payload's form for the sub-block against int8 activations xq with block scale d_x:
// integer sums per word, the scales after.
double kernel_dot(TensorType type, const uint8_t* row, int64_t n, int64_t j, const int8_t* xq,
                  float d_x) {
  const SubBlock b = unpack(type, row, n, j);
  int sum_half[2] = {0, 0}, sum_x[2] = {0, 0};
  for (int m = 0; m < 8; ++m)
    for (int k = 0; k < 4; ++k) {
      sum_half[m / 4] += byte_of(b.words[m], k) * xq[4 * m + k];
      sum_x[m / 4] += xq[4 * m + k];
    }
  double s = 0;
  for (int h = 0; h < 2; ++h)  // the scale and offset are constant over each 16-element half
    s += static_cast<double>(b.scale[16 * h]) * sum_half[h] +
         static_cast<double>(b.offset[16 * h]) * sum_x[h];
  return s * d_x;
}

constexpr TensorType kTypes[] = {TensorType::Q2_K, TensorType::Q3_K,   TensorType::Q4_K,
                                 TensorType::Q5_K, TensorType::IQ4_NL, TensorType::IQ4_XS,
                                 TensorType::MXFP4};

std::vector<uint8_t> quantised_rows(TensorType type, int64_t rows, int64_t cols, bool random_bytes,
                                    std::mt19937& rng) {
  const int64_t gguf_row = static_cast<int64_t>(row_bytes(type, cols));
  std::vector<uint8_t> gguf(static_cast<size_t>(rows * gguf_row));
  if (random_bytes) {
    for (uint8_t& v : gguf) v = static_cast<uint8_t>(rng());
    // The f16 scales finite: (block bytes, offsets of its f16 fields).
    const auto fix = [&](size_t block, std::initializer_list<size_t> offsets) {
      for (size_t k = 0; k < gguf.size(); k += block)
        for (size_t o : offsets) {
          const uint16_t bits = static_cast<uint16_t>(((rng() & 1) << 15) |
                                                      ((7 + rng() % 8) << 10) | (rng() & 0x3FF));
          std::memcpy(&gguf[k + o], &bits, 2);
        }
    };
    if (type == TensorType::Q2_K) fix(84, {80, 82});
    if (type == TensorType::Q3_K) fix(110, {108});
    if (type == TensorType::Q4_K) fix(144, {0, 2});
    if (type == TensorType::Q5_K) fix(176, {0, 2});
    if (type == TensorType::IQ4_NL) fix(18, {0});
    if (type == TensorType::IQ4_XS) fix(136, {0});
    return gguf;
  }
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (float& v : values) v = normal(rng) * static_cast<float>(r + 1) * 0.3f;
    quantize_row(type, values.data(), gguf.data() + r * gguf_row, cols);
  }
  return gguf;
}

TEST(SplitUnpack, KernelWordsTimesScalesAreTheDecodedWeights) {
  std::mt19937 rng(41);
  for (TensorType type : kTypes) {
    for (bool random_bytes : {false, true}) {
      const uint32_t id = static_cast<uint32_t>(type);
      const int64_t rows = 3, cols = 1024, n = cols / 32;
      const std::vector<uint8_t> gguf = quantised_rows(type, rows, cols, random_bytes, rng);
      const int64_t stride = split_row_stride(id, cols);
      std::vector<uint8_t> rows_split(static_cast<size_t>(rows * stride));
      split_rows(id, gguf.data(), rows, cols, rows_split.data());
      for (int64_t r = 0; r < rows; ++r) {
        const uint8_t* row = rows_split.data() + r * stride;
        std::vector<float> decoded(static_cast<size_t>(cols));
        dequantize_split_row(id, row, cols, decoded.data());
        for (int64_t j = 0; j < n; ++j) {
          const SubBlock b = unpack(type, row, n, j);
          for (int e = 0; e < 32; ++e) {
            const float w =
                b.scale[e] * static_cast<float>(byte_of(b.words[e / 4], e % 4)) + b.offset[e];
            ASSERT_EQ(w, decoded[32 * j + e])
                << tensor_type_info(type).name << (random_bytes ? " random" : " quantised")
                << " row " << r << " sub-block " << j << " element " << e;
          }
        }
      }
    }
  }
}

TEST(SplitUnpack, SubBlockDotsMatchTheDecodedWeights) {
  std::mt19937 rng(43);
  std::uniform_int_distribution<int> q8(-127, 127);
  for (TensorType type : kTypes) {
    const uint32_t id = static_cast<uint32_t>(type);
    const int64_t cols = 512, n = cols / 32;
    const std::vector<uint8_t> gguf = quantised_rows(type, 1, cols, false, rng);
    std::vector<uint8_t> row(static_cast<size_t>(split_row_stride(id, cols)));
    split_rows(id, gguf.data(), 1, cols, row.data());
    std::vector<float> w(static_cast<size_t>(cols));
    dequantize_row(type, gguf.data(), w.data(), cols);
    for (int64_t j = 0; j < n; ++j) {
      int8_t xq[32];
      for (int8_t& v : xq) v = static_cast<int8_t>(q8(rng));
      const float d_x = 0.013f;
      double expected = 0, magnitude = 0;
      for (int e = 0; e < 32; ++e) {
        expected += static_cast<double>(w[32 * j + e]) * xq[e] * d_x;
        magnitude += std::fabs(static_cast<double>(w[32 * j + e]) * xq[e] * d_x);
      }
      const double got = kernel_dot(type, row.data(), n, j, xq, d_x);
      EXPECT_NEAR(got, expected, 1e-6 * magnitude + 1e-12)
          << tensor_type_info(type).name << " sub-block " << j;
    }
  }
}

// levels4 against the tables it packs, for every index in every byte position.
TEST(SplitUnpack, LevelTablesMatchTheHostTables) {
  for (uint32_t i = 0; i < 16; ++i)
    for (int k = 0; k < 4; ++k) {
      const uint32_t idx = (i << (8 * k)) | (((i + 5) % 16) << (8 * ((k + 1) % 4)));
      EXPECT_EQ(byte_of(su::table_levels4<false>(idx), k), kIq4nlValues[i]);
      EXPECT_EQ(byte_of(su::table_levels4<true>(idx), k), kMxfp4Values[i]);
    }
}

}  // namespace
}  // namespace granule
