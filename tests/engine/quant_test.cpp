// Block formats: decoding and encoding against goldens from the independent `gguf`
// Python package, fp16/bf16 edge cases, quantisation error bounds and dot_row.
#include "granule/quant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "granule/error.h"
#include "granule/testkit/quantize.h"

namespace granule {
namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// One record of tests/data/quant/quant_goldens.bin, written by
// tests/reference/make_quant_goldens.py with gguf.quants (see the script for the layout).
struct GoldenRecord {
  bool encode = false;  // false: bytes -> floats, true: floats -> bytes
  uint32_t type_id = 0;
  std::vector<uint8_t> bytes;
  std::vector<float> floats;
};

std::vector<GoldenRecord> load_goldens() {
  const std::string path = std::string(GRANULE_SOURCE_DIR) + "/tests/data/quant/quant_goldens.bin";
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "missing " << path;
  auto u32 = [&] {
    uint32_t v = 0;
    in.read(reinterpret_cast<char*>(&v), 4);
    return v;
  };
  char magic[4] = {};
  in.read(magic, 4);
  EXPECT_EQ(std::string(magic, 4), "GQGD");
  std::vector<GoldenRecord> records(u32());
  for (auto& r : records) {
    r.encode = u32() == 1;
    r.type_id = u32();
    r.floats.resize(u32());
    r.bytes.resize(u32());
    auto read_bytes = [&] {
      in.read(reinterpret_cast<char*>(r.bytes.data()),
              static_cast<std::streamsize>(r.bytes.size()));
    };
    auto read_floats = [&] {
      in.read(reinterpret_cast<char*>(r.floats.data()),
              static_cast<std::streamsize>(r.floats.size() * 4));
    };
    if (r.encode) {
      read_floats();
      read_bytes();
    } else {
      read_bytes();
      read_floats();
    }
  }
  EXPECT_TRUE(in) << path << " is truncated";
  return records;
}

std::string type_name(uint32_t id) { return tensor_type_name(id); }

TEST(QuantGolden, DecodingMatchesGgufPythonBitForBit) {
  const auto records = load_goldens();
  int decoded_types = 0;
  for (const auto& r : records) {
    if (r.encode) continue;
    ++decoded_types;
    const auto type = static_cast<TensorType>(r.type_id);
    const auto n = static_cast<int64_t>(r.floats.size());
    ASSERT_EQ(row_bytes(type, n), r.bytes.size()) << type_name(r.type_id);
    std::vector<float> out(r.floats.size());
    dequantize_row(type, r.bytes.data(), out.data(), n);
    int mismatches = 0;
    double max_abs_diff = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      if (bits_of(out[i]) != bits_of(r.floats[i])) {
        if (std::isfinite(out[i]) && std::isfinite(r.floats[i]))
          max_abs_diff = std::max(max_abs_diff, std::fabs(double(out[i]) - r.floats[i]));
        if (++mismatches <= 5)
          ADD_FAILURE() << type_name(r.type_id) << " element " << i << ": got " << out[i]
                        << " expected " << r.floats[i];
      }
    }
    RecordProperty(type_name(r.type_id) + "_" + std::to_string(decoded_types) + "_max_abs_diff",
                   std::to_string(max_abs_diff) + " over " + std::to_string(out.size()) +
                       " values, " + std::to_string(mismatches) + " differing bits");
  }
  // Q4_0 Q4_1 Q8_0 Q4_K Q5_K Q6_K F16 BF16, then Q5_0 Q5_1 Q2_K Q3_K IQ4_NL IQ4_XS MXFP4 and
  // MXFP4 again with every E8M0 exponent.
  EXPECT_EQ(decoded_types, 16);
}

TEST(QuantGolden, EncodingMatchesGgufPythonBitForBit) {
  // gguf.quants' encoders for these types are written to match ggml's reference
  // quantisers exactly; F16 is numpy's round-to-nearest-even conversion.
  const auto records = load_goldens();
  int encoded_types = 0;
  for (const auto& r : records) {
    if (!r.encode) continue;
    ++encoded_types;
    const auto type = static_cast<TensorType>(r.type_id);
    const auto n = static_cast<int64_t>(r.floats.size());
    std::vector<uint8_t> out(row_bytes(type, n));
    ASSERT_EQ(out.size(), r.bytes.size()) << type_name(r.type_id);
    quantize_row(type, r.floats.data(), out.data(), n);
    for (size_t i = 0; i < out.size(); ++i) {
      if (out[i] != r.bytes[i]) {
        ADD_FAILURE() << type_name(r.type_id) << " byte " << i << ": got " << int(out[i])
                      << " expected " << int(r.bytes[i]);
        break;
      }
    }
  }
  EXPECT_EQ(encoded_types, 8);  // F16 BF16 Q4_0 Q4_1 Q8_0 Q5_0 Q5_1 MXFP4
}

TEST(Fp16, EveryHalfSurvivesTheRoundTripAndNanStaysNan) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = fp16_to_f32(static_cast<uint16_t>(h));
    const bool is_nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
    if (is_nan) {
      ASSERT_TRUE(std::isnan(f)) << h;
      ASSERT_TRUE(std::isnan(fp16_to_f32(f32_to_fp16(f)))) << h;
    } else {
      ASSERT_EQ(f32_to_fp16(f), h) << "half 0x" << std::hex << h;
    }
  }
}

TEST(Fp16, SubnormalsInfinityAndExactValues) {
  EXPECT_EQ(fp16_to_f32(0x0001), std::ldexp(1.0f, -24));     // smallest subnormal
  EXPECT_EQ(fp16_to_f32(0x03ff), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(fp16_to_f32(0x0400), std::ldexp(1.0f, -14));     // smallest normal
  EXPECT_EQ(fp16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(fp16_to_f32(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(fp16_to_f32(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(bits_of(fp16_to_f32(0x8000)), 0x80000000u);  // negative zero
  EXPECT_EQ(fp16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(fp16_to_f32(0xc000), -2.0f);
}

TEST(Fp16, RoundsToNearestEven) {
  EXPECT_EQ(f32_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie, even is down
  EXPECT_EQ(f32_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie, even is up
  EXPECT_EQ(f32_to_fp16(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3c01);
  EXPECT_EQ(f32_to_fp16(std::ldexp(1.0f, -25)), 0x0000);                          // tie with zero
  EXPECT_EQ(f32_to_fp16(std::ldexp(3.0f, -25)), 0x0002);                          // 1.5 steps -> 2
  EXPECT_EQ(f32_to_fp16(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -26)), 0x0400);  // up to normal
  EXPECT_EQ(f32_to_fp16(65519.0f), 0x7bff);
  EXPECT_EQ(f32_to_fp16(65520.0f), 0x7c00);  // tie to infinity
  EXPECT_EQ(f32_to_fp16(-1e9f), 0xfc00);
  EXPECT_EQ(f32_to_fp16(1e-30f), 0x0000);
  EXPECT_EQ(f32_to_fp16(-1e-30f), 0x8000);
  const uint16_t nan = f32_to_fp16(float_of(0x7f800001));  // signalling NaN, tiny payload
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x03ff, 0);  // stays NaN, not inf
}

TEST(Bf16, ConversionRoundsToNearestEvenAndKeepsNan) {
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_f32(0x0001), float_of(0x00010000));  // subnormal
  EXPECT_EQ(bf16_to_f32(0xff80), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(f32_to_bf16(float_of(0x3f808000)), 0x3f80);  // tie, even down
  EXPECT_EQ(f32_to_bf16(float_of(0x3f818000)), 0x3f82);  // tie, even up
  EXPECT_EQ(f32_to_bf16(float_of(0x3f808001)), 0x3f81);  // above the tie
  EXPECT_EQ(f32_to_bf16(float_of(0x7f7fffff)), 0x7f80);  // max float -> inf
  const uint16_t nan = f32_to_bf16(float_of(0x7f800001));
  EXPECT_TRUE(std::isnan(bf16_to_f32(nan)));
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_f32(static_cast<uint16_t>(h));
    if (!std::isnan(f)) ASSERT_EQ(f32_to_bf16(f), h);
  }
}

TEST(BlockLayout, FieldOffsetsMatchGgml) {
  // ggml-common.h: the fp16 scales come first except in Q6_K, where d is last.
  EXPECT_EQ(offsetof(BlockQ4_0, qs), 2u);
  EXPECT_EQ(offsetof(BlockQ4_1, qs), 4u);
  EXPECT_EQ(offsetof(BlockQ8_0, qs), 2u);
  EXPECT_EQ(offsetof(BlockQ4_K, scales), 4u);
  EXPECT_EQ(offsetof(BlockQ4_K, qs), 16u);
  EXPECT_EQ(offsetof(BlockQ5_K, qh), 16u);
  EXPECT_EQ(offsetof(BlockQ5_K, qs), 48u);
  EXPECT_EQ(offsetof(BlockQ6_K, qh), 128u);
  EXPECT_EQ(offsetof(BlockQ6_K, scales), 192u);
  EXPECT_EQ(offsetof(BlockQ6_K, d), 208u);
  EXPECT_EQ(offsetof(BlockQ5_0, qh), 2u);
  EXPECT_EQ(offsetof(BlockQ5_0, qs), 6u);
  EXPECT_EQ(offsetof(BlockQ5_1, qh), 4u);
  EXPECT_EQ(offsetof(BlockQ5_1, qs), 8u);
  EXPECT_EQ(offsetof(BlockQ2_K, qs), 16u);
  EXPECT_EQ(offsetof(BlockQ2_K, d), 80u);
  EXPECT_EQ(offsetof(BlockQ2_K, dmin), 82u);
  EXPECT_EQ(offsetof(BlockQ3_K, qs), 32u);
  EXPECT_EQ(offsetof(BlockQ3_K, scales), 96u);
  EXPECT_EQ(offsetof(BlockQ3_K, d), 108u);
  EXPECT_EQ(offsetof(BlockIQ4_NL, qs), 2u);
  EXPECT_EQ(offsetof(BlockIQ4_XS, scales_h), 2u);
  EXPECT_EQ(offsetof(BlockIQ4_XS, scales_l), 4u);
  EXPECT_EQ(offsetof(BlockIQ4_XS, qs), 8u);
  EXPECT_EQ(offsetof(BlockMXFP4, qs), 1u);
}

TEST(TensorTypes, GeometryMatchesGgmlForEveryType) {
  // ggml.h's type ids with ggml-common.h's block sizes (gguf-py's GGML_QUANT_SIZES).
  struct Expected {
    uint32_t id;
    const char* name;
    uint32_t elems, bytes;
  };
  for (const Expected& e :
       {Expected{6, "Q5_0", 32, 22}, Expected{7, "Q5_1", 32, 24}, Expected{10, "Q2_K", 256, 84},
        Expected{11, "Q3_K", 256, 110}, Expected{20, "IQ4_NL", 32, 18},
        Expected{23, "IQ4_XS", 256, 136}, Expected{39, "MXFP4", 32, 17},
        Expected{2, "Q4_0", 32, 18}, Expected{14, "Q6_K", 256, 210}}) {
    const auto info = tensor_type_info(e.id);
    ASSERT_TRUE(info.has_value()) << e.name;
    EXPECT_EQ(info->name, e.name);
    EXPECT_EQ(static_cast<uint32_t>(info->type), e.id);
    EXPECT_EQ(info->block_elems, e.elems) << e.name;
    EXPECT_EQ(info->block_bytes, e.bytes) << e.name;
    EXPECT_EQ(row_bytes(info->type, 4096), 4096 / e.elems * e.bytes) << e.name;
  }
  EXPECT_FALSE(tensor_type_info(16).has_value());  // IQ2_XXS: still not supported
  EXPECT_EQ(tensor_type_name(16), "IQ2_XXS");
}

std::vector<float> gaussian(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// A row quantised to `type`, and such a row of `n` values decoded.
std::vector<uint8_t> encode(TensorType type, const std::vector<float>& x) {
  const auto n = static_cast<int64_t>(x.size());
  std::vector<uint8_t> encoded(row_bytes(type, n));
  quantize_row(type, x.data(), encoded.data(), n);
  return encoded;
}
std::vector<float> decode(TensorType type, const std::vector<uint8_t>& encoded, int64_t n) {
  std::vector<float> decoded(n);
  dequantize_row(type, encoded.data(), decoded.data(), n);
  return decoded;
}

// `x` quantised to `type` and decoded again: the RMS of the error relative to the RMS of x.
double round_trip_relative_rms(TensorType type, const std::vector<float>& x) {
  const auto n = static_cast<int64_t>(x.size());
  const std::vector<float> decoded = decode(type, encode(type, x), n);
  double err2 = 0, ref2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    err2 += (decoded[i] - x[i]) * double(decoded[i] - x[i]);
    ref2 += x[i] * double(x[i]);
  }
  return std::sqrt(err2 / ref2);
}

struct ErrorBound {
  TensorType type;
  double max_relative_rms;  // RMS(decoded - x) / RMS(x) on unit Gaussian data
};

class QuantRoundTrip : public ::testing::TestWithParam<ErrorBound> {};

// Bounds are ~1.3x the errors measured for these encoders on this data (F16 2.1e-4,
// BF16 1.6e-3, Q8_0 5.3e-3, Q4_0 0.085, Q4_1 0.077, Q4_K 0.070, Q5_K 0.036, Q6_K 0.018,
// Q5_0 0.042, Q5_1 0.037, Q2_K 0.28, Q3_K 0.15, IQ4_NL 0.075, IQ4_XS 0.076, MXFP4 0.11),
// in line with each grid's step size; a broken encoder lands far above them.
TEST_P(QuantRoundTrip, QuantiseThenDequantiseStaysWithinTheTypesErrorBound) {
  const auto [type, bound] = GetParam();
  const int64_t n = 256 * 24;
  const double relative_rms = round_trip_relative_rms(type, gaussian(n, 7));
  EXPECT_LE(relative_rms, bound) << tensor_type_name(static_cast<uint32_t>(type));
  RecordProperty("relative_rms", std::to_string(relative_rms));
}

// How gtest shows a case (--gtest_list_tests, failure messages), not as raw bytes.
void PrintTo(const ErrorBound& b, std::ostream* os) {
  *os << tensor_type_info(b.type).name << ", relative RMS error at most " << b.max_relative_rms;
}

INSTANTIATE_TEST_SUITE_P(
    AllTypes, QuantRoundTrip,
    ::testing::Values(ErrorBound{TensorType::F32, 0.0}, ErrorBound{TensorType::F16, 3e-4},
                      ErrorBound{TensorType::BF16, 2.2e-3}, ErrorBound{TensorType::Q8_0, 7e-3},
                      ErrorBound{TensorType::Q4_0, 0.11}, ErrorBound{TensorType::Q4_1, 0.10},
                      ErrorBound{TensorType::Q4_K, 0.09}, ErrorBound{TensorType::Q5_K, 0.046},
                      ErrorBound{TensorType::Q6_K, 0.023}, ErrorBound{TensorType::Q5_0, 0.055},
                      ErrorBound{TensorType::Q5_1, 0.049}, ErrorBound{TensorType::Q2_K, 0.37},
                      ErrorBound{TensorType::Q3_K, 0.2}, ErrorBound{TensorType::IQ4_NL, 0.098},
                      ErrorBound{TensorType::IQ4_XS, 0.099}, ErrorBound{TensorType::MXFP4, 0.15}),
    [](const auto& info) { return std::string(tensor_type_info(info.param.type).name); });

class QuantAllTypes : public ::testing::TestWithParam<TensorType> {};

TEST_P(QuantAllTypes, ZeroRowEncodesToExactZeros) {
  const TensorType type = GetParam();
  const int64_t n = 512;
  std::vector<float> zeros(n, 0.0f), decoded(n, 1.0f);
  std::vector<uint8_t> encoded(row_bytes(type, n));
  quantize_row(type, zeros.data(), encoded.data(), n);
  dequantize_row(type, encoded.data(), decoded.data(), n);
  for (float v : decoded) ASSERT_EQ(v, 0.0f);
}

TEST_P(QuantAllTypes, TinyAndLargeScalesDecodeNearTheInput) {
  // Scales far from 1 exercise the fp16 super-scales: at sigma 1e-3 the K quants'
  // super-scales are fp16 subnormals; at 1e3 the block scales are large. (Much smaller
  // data cannot be represented at all: its scales underflow fp16, in ggml as here.)
  const TensorType type = GetParam();
  for (float sigma : {1e-3f, 1e3f}) {
    const int64_t n = 512;
    // Subnormal scales carry fewer bits, hence the looser bound than above.
    EXPECT_LE(round_trip_relative_rms(type, gaussian(n, 11, sigma)), 0.3) << "sigma " << sigma;
  }
}

TEST_P(QuantAllTypes, OffsetAndConstantRowsDecodeNearTheInput) {
  // All-positive data (the K quants then fit with a zero min) and constant blocks (a
  // zero range: Q4_1 and the K quants must not divide by it).
  const TensorType type = GetParam();
  const int64_t n = 512;
  auto shifted = gaussian(n, 5);
  for (auto& v : shifted) v += 3.0f;
  const std::vector<float> constant(n, -1.25f);
  for (const std::vector<float>* x : {&std::as_const(shifted), &constant}) {
    // 0.08: Q4_0 is symmetric around zero, so data offset by 3 sigma spends half its
    // levels on values that never occur (measured 0.058; the other 4-bit and wider types
    // stay below 0.03). The 2- and 3-bit K quants have a coarser grid (shifted: Q2_K 0.126,
    // Q3_K 0.096), and MXFP4's power-of-two scale puts 1.25 halfway between two E2M1
    // levels (constant: 0.2 exactly; shifted 0.104).
    const double bound = type == TensorType::Q2_K    ? 0.16
                         : type == TensorType::Q3_K  ? 0.125
                         : type == TensorType::MXFP4 ? 0.201
                                                     : 0.08;
    EXPECT_LE(round_trip_relative_rms(type, *x), bound)
        << (x == &constant ? "constant" : "shifted");
  }
}

TEST_P(QuantAllTypes, DotRowEqualsDequantiseThenDot) {
  const TensorType type = GetParam();
  const int64_t n = 256 * 5;
  const auto w = gaussian(n, 3);
  const auto x = gaussian(n, 4);
  const std::vector<uint8_t> encoded = encode(type, w);
  const std::vector<float> decoded = decode(type, encoded, n);
  double expected = 0, magnitude = 0;
  for (int64_t i = 0; i < n; ++i) {
    expected += double(decoded[i]) * x[i];
    magnitude += std::fabs(double(decoded[i]) * x[i]);
  }
  // f32 accumulation against a double reference: error grows like eps * sum |a*x|.
  EXPECT_NEAR(dot_row(type, encoded.data(), x.data(), n), expected, 1e-5 * magnitude);
}

class QuantBlockTypes : public ::testing::TestWithParam<TensorType> {};

TEST_P(QuantBlockTypes, RowLengthThatIsNotAWholeBlockIsRejected) {
  const TensorType type = GetParam();
  const auto& info = tensor_type_info(type);
  std::vector<float> x(info.block_elems * 2);
  std::vector<uint8_t> buffer(info.block_bytes * 2);
  EXPECT_THROW(quantize_row(type, x.data(), buffer.data(), info.block_elems + 1), UsageError);
  EXPECT_THROW(dequantize_row(type, buffer.data(), x.data(), info.block_elems - 1), UsageError);
  EXPECT_THROW(dot_row(type, buffer.data(), x.data(), info.block_elems + 3), UsageError);
}

// (Element types, F32/F16/BF16, take rows of any length.)
}  // namespace

// A TensorType parameter shown by its name. In namespace granule, where gtest's
// argument-dependent lookup finds it (not in the anonymous namespace).
void PrintTo(TensorType type, std::ostream* os) { *os << tensor_type_info(type).name; }

namespace {

INSTANTIATE_TEST_SUITE_P(BlockTypes, QuantBlockTypes,
                         ::testing::Values(TensorType::Q8_0, TensorType::Q4_0, TensorType::Q4_1,
                                           TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K,
                                           TensorType::Q5_0, TensorType::Q5_1, TensorType::Q2_K,
                                           TensorType::Q3_K, TensorType::IQ4_NL, TensorType::IQ4_XS,
                                           TensorType::MXFP4),
                         [](const auto& info) {
                           return std::string(tensor_type_info(info.param).name);
                         });

INSTANTIATE_TEST_SUITE_P(
    AllTypes, QuantAllTypes,
    ::testing::Values(TensorType::F32, TensorType::F16, TensorType::BF16, TensorType::Q8_0,
                      TensorType::Q4_0, TensorType::Q4_1, TensorType::Q4_K, TensorType::Q5_K,
                      TensorType::Q6_K, TensorType::Q5_0, TensorType::Q5_1, TensorType::Q2_K,
                      TensorType::Q3_K, TensorType::IQ4_NL, TensorType::IQ4_XS, TensorType::MXFP4),
    [](const auto& info) { return std::string(tensor_type_info(info.param).name); });

TEST(DotRow, OddLengthElementRowsIncludeTheTail) {
  // F32/F16/BF16 rows have no blocks, so lengths that are not a multiple of the
  // 8 accumulation lanes must still count every element.
  for (int64_t n : {1, 7, 9, 1023, 1031}) {
    std::vector<float> w(n), x(n);
    for (int64_t i = 0; i < n; ++i) {
      w[i] = static_cast<float>(i % 5) - 2.0f;  // small integers: products and sums are exact
      x[i] = static_cast<float>(i % 3);
    }
    float expected = 0;
    for (int64_t i = 0; i < n; ++i) expected += w[i] * x[i];
    std::vector<uint16_t> halves(n), brains(n);
    quantize_row(TensorType::F16, w.data(), halves.data(), n);
    quantize_row(TensorType::BF16, w.data(), brains.data(), n);
    EXPECT_EQ(dot_row(TensorType::F32, w.data(), x.data(), n), expected) << n;
    EXPECT_EQ(dot_row(TensorType::F16, halves.data(), x.data(), n), expected) << n;
    EXPECT_EQ(dot_row(TensorType::BF16, brains.data(), x.data(), n), expected) << n;
  }
}

TEST(Q4_0, KnownBlockDecodesByHand) {
  // d = 0.5 (fp16 0x3800); byte j holds element j (low nibble) and j + 16 (high nibble),
  // each stored with an offset of 8.
  BlockQ4_0 block{};
  block.d = 0x3800;
  for (int j = 0; j < 16; ++j) block.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  float out[32];
  dequantize_row(TensorType::Q4_0, &block, out, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], (j - 8) * 0.5f);
    EXPECT_EQ(out[j + 16], (15 - j - 8) * 0.5f);
  }
}

}  // namespace
}  // namespace granule
