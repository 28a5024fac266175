// The split weight layout's host repacker: for every type it supports, GGUF rows re-laid
// out and decoded back give exactly dequantize_row's values (the layout loses nothing and
// puts every value where the kernels look), on row lengths with and without padding; the K
// types also on rows of random bytes, so every scale, min and fifth bit takes both values.
#include "model/weight_split.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "granule/error.h"
#include "granule/quant.h"
#include "granule/split_layout.h"
#include "granule/tensor_type.h"
#include "granule/testkit/quantize.h"

namespace granule {
namespace {

struct Case {
  TensorType type;
  int64_t cols;
};

class WeightSplit : public ::testing::TestWithParam<Case> {};

// Re-lays out the kRows GGUF rows in `gguf` and checks every decoded value and the padding.
void expect_split_decodes_exactly(TensorType type, int64_t cols, const std::vector<uint8_t>& gguf,
                                  int64_t rows) {
  const uint32_t id = static_cast<uint32_t>(type);
  const int64_t gguf_row = static_cast<int64_t>(row_bytes(type, cols));
  // Q4_K/Q5_K keep their scales and mins unpacked, Q3_K its scales: 4 bytes more per 256
  // elements; IQ4_XS its scales: 2 more.
  const int64_t extra =
      type == TensorType::Q4_K || type == TensorType::Q5_K || type == TensorType::Q3_K
          ? cols / 256 * 4
      : type == TensorType::IQ4_XS ? cols / 256 * 2
                                   : 0;
  const int64_t payload = gguf_row + extra;
  EXPECT_EQ(kernels::split::row_payload_bytes(id, cols), payload);
  const int64_t stride = split_row_stride(id, cols);
  EXPECT_EQ(stride % 16, 0);
  EXPECT_GE(stride, payload);
  EXPECT_LT(stride - payload, 16);
  std::vector<uint8_t> split(static_cast<size_t>(rows * stride), 0xAB);
  split_rows(id, gguf.data(), rows, cols, split.data());
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<float> expected(static_cast<size_t>(cols)), got(static_cast<size_t>(cols));
    dequantize_row(type, gguf.data() + r * gguf_row, expected.data(), cols);
    dequantize_split_row(id, split.data() + r * stride, cols, got.data());
    for (int64_t i = 0; i < cols; ++i)
      ASSERT_EQ(got[i], expected[i]) << "row " << r << " element " << i;
    for (int64_t pad = payload; pad < stride; ++pad)
      EXPECT_EQ(split[r * stride + pad], 0) << "padding is zeroed";
  }
}

TEST_P(WeightSplit, DecodesToTheSameValuesAsTheGgufRow) {
  const auto [type, cols] = GetParam();
  const uint32_t id = static_cast<uint32_t>(type);
  constexpr int64_t kRows = 5;
  std::mt19937 rng(static_cast<uint32_t>(cols) * 31 + id);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t gguf_row = static_cast<int64_t>(row_bytes(type, cols));
  std::vector<uint8_t> gguf(static_cast<size_t>(kRows * gguf_row));
  for (int64_t r = 0; r < kRows; ++r) {
    std::vector<float> values(static_cast<size_t>(cols));
    for (float& v : values) v = normal(rng) * (r + 1) * 0.3f;
    quantize_row(type, values.data(), gguf.data() + r * gguf_row, cols);
  }
  expect_split_decodes_exactly(type, cols, gguf, kRows);
}

// Blocks of random bytes (the f16 scales kept finite): every 6-bit scale and min, nibble,
// fifth and third bit takes arbitrary values, which a quantiser's output need not show.
class WeightSplitRandomBytes : public ::testing::TestWithParam<Case> {};

// Where a block of the type keeps its f16 scales (d, dmin): block bytes and offsets.
struct HalfFields {
  size_t block;
  std::vector<size_t> offsets;
};
HalfFields half_fields(TensorType type) {
  switch (type) {
    case TensorType::Q4_K:
      return {144, {0, 2}};
    case TensorType::Q5_K:
      return {176, {0, 2}};
    case TensorType::Q2_K:
      return {84, {80, 82}};
    case TensorType::Q3_K:
      return {110, {108}};
    case TensorType::IQ4_NL:
      return {18, {0}};
    case TensorType::IQ4_XS:
      return {136, {0}};
    default:  // MXFP4: every E8M0 byte is a finite scale
      return {17, {}};
  }
}

TEST_P(WeightSplitRandomBytes, RowsOfRandomBlocksDecodeExactly) {
  const auto [type, cols] = GetParam();
  constexpr int64_t kRows = 3;
  std::mt19937 rng(static_cast<uint32_t>(cols) * 7 + 1);
  const int64_t gguf_row = static_cast<int64_t>(row_bytes(type, cols));
  const HalfFields fields = half_fields(type);
  std::vector<uint8_t> gguf(static_cast<size_t>(kRows * gguf_row));
  for (uint8_t& b : gguf) b = static_cast<uint8_t>(rng());
  for (size_t k = 0; k < gguf.size(); k += fields.block) {
    for (size_t offset : fields.offsets) {  // sign, exponent 2^-8..2^-1, random mantissa
      const uint16_t bits =
          static_cast<uint16_t>(((rng() & 1) << 15) | ((7 + rng() % 8) << 10) | (rng() & 0x3FF));
      std::memcpy(&gguf[k + offset], &bits, 2);
    }
  }
  expect_split_decodes_exactly(type, cols, gguf, kRows);
}

// How gtest shows a case (--gtest_list_tests, failure messages), not as raw bytes.
void PrintTo(const Case& c, std::ostream* os) {
  *os << tensor_type_info(c.type).name << ", " << c.cols << " columns";
}

INSTANTIATE_TEST_SUITE_P(
    Types, WeightSplit,
    ::testing::Values(
        Case{TensorType::Q4_0, 576}, Case{TensorType::Q4_0, 4096}, Case{TensorType::Q4_1, 576},
        Case{TensorType::Q4_1, 1536}, Case{TensorType::Q8_0, 64}, Case{TensorType::Q8_0, 576},
        Case{TensorType::Q6_K, 256}, Case{TensorType::Q6_K, 4096}, Case{TensorType::Q5_0, 576},
        Case{TensorType::Q5_0, 4096}, Case{TensorType::Q5_0, 96}, Case{TensorType::Q5_1, 576},
        Case{TensorType::Q5_1, 1536}, Case{TensorType::Q5_1, 32}, Case{TensorType::Q4_K, 256},
        Case{TensorType::Q4_K, 768}, Case{TensorType::Q4_K, 4096}, Case{TensorType::Q4_K, 2816},
        Case{TensorType::Q5_K, 256}, Case{TensorType::Q5_K, 1280}, Case{TensorType::Q5_K, 4096},
        Case{TensorType::Q5_K, 14336}, Case{TensorType::Q2_K, 256}, Case{TensorType::Q2_K, 4096},
        Case{TensorType::Q2_K, 2816}, Case{TensorType::Q3_K, 256}, Case{TensorType::Q3_K, 768},
        Case{TensorType::Q3_K, 14336}, Case{TensorType::IQ4_NL, 32}, Case{TensorType::IQ4_NL, 576},
        Case{TensorType::IQ4_NL, 4096}, Case{TensorType::IQ4_XS, 256},
        Case{TensorType::IQ4_XS, 1280}, Case{TensorType::IQ4_XS, 4096}, Case{TensorType::MXFP4, 64},
        Case{TensorType::MXFP4, 2880}, Case{TensorType::MXFP4, 4096}),
    [](const auto& info) {
      return std::string(tensor_type_name(static_cast<uint32_t>(info.param.type))) + "_" +
             std::to_string(info.param.cols);
    });

INSTANTIATE_TEST_SUITE_P(
    KTypes, WeightSplitRandomBytes,
    ::testing::Values(Case{TensorType::Q4_K, 256}, Case{TensorType::Q4_K, 2816},
                      Case{TensorType::Q5_K, 768}, Case{TensorType::Q5_K, 4096},
                      Case{TensorType::Q2_K, 256}, Case{TensorType::Q2_K, 1280},
                      Case{TensorType::Q3_K, 256}, Case{TensorType::Q3_K, 2816},
                      Case{TensorType::IQ4_NL, 96}, Case{TensorType::IQ4_XS, 768},
                      Case{TensorType::MXFP4, 160}),
    [](const auto& info) {
      return std::string(tensor_type_name(static_cast<uint32_t>(info.param.type))) + "_" +
             std::to_string(info.param.cols);
    });

TEST(WeightSplitSupport, OnlyTheKernelTypesAndWholeBlocks) {
  EXPECT_TRUE(split_layout_supported(static_cast<uint32_t>(TensorType::Q6_K)));
  EXPECT_TRUE(split_layout_supported(static_cast<uint32_t>(TensorType::Q4_K)));
  EXPECT_TRUE(split_layout_supported(static_cast<uint32_t>(TensorType::Q5_K)));
  EXPECT_TRUE(split_layout_supported(static_cast<uint32_t>(TensorType::Q5_0)));
  EXPECT_TRUE(split_layout_supported(static_cast<uint32_t>(TensorType::Q5_1)));
  EXPECT_TRUE(split_layout_supported(static_cast<uint32_t>(TensorType::IQ4_NL)));
  EXPECT_TRUE(split_layout_supported(static_cast<uint32_t>(TensorType::IQ4_XS)));
  EXPECT_TRUE(split_layout_supported(static_cast<uint32_t>(TensorType::MXFP4)));
  EXPECT_TRUE(split_layout_supported(static_cast<uint32_t>(TensorType::Q2_K)));
  EXPECT_TRUE(split_layout_supported(static_cast<uint32_t>(TensorType::Q3_K)));
  EXPECT_FALSE(split_layout_supported(static_cast<uint32_t>(TensorType::F16)));
  EXPECT_FALSE(split_layout_supported(static_cast<uint32_t>(TensorType::BF16)));
  EXPECT_FALSE(split_layout_supported(static_cast<uint32_t>(TensorType::F32)));
  std::vector<uint8_t> dst(4096);
  EXPECT_THROW(split_rows(static_cast<uint32_t>(TensorType::F16), dst.data(), 1, 256, dst.data()),
               UsageError);
  EXPECT_THROW(split_rows(static_cast<uint32_t>(TensorType::Q3_K), dst.data(), 1, 288, dst.data()),
               UsageError);
  EXPECT_THROW(split_rows(static_cast<uint32_t>(TensorType::Q4_K), dst.data(), 1, 288, dst.data()),
               UsageError);
  EXPECT_THROW(split_rows(static_cast<uint32_t>(TensorType::Q6_K), dst.data(), 1, 288, dst.data()),
               UsageError);
}

TEST(WeightSplitSupport, FitsOnlySupportedTypesWithWholeBlocksPerRow) {
  const auto fits = [](TensorType type, int64_t cols) {
    return split_layout_fits(static_cast<uint32_t>(type), cols);
  };
  EXPECT_TRUE(fits(TensorType::Q4_0, 576));
  EXPECT_TRUE(fits(TensorType::Q4_1, 32));
  EXPECT_TRUE(fits(TensorType::Q8_0, 64));
  EXPECT_TRUE(fits(TensorType::Q6_K, 4096));
  EXPECT_FALSE(fits(TensorType::Q4_0, 48));   // not whole 32-element blocks
  EXPECT_FALSE(fits(TensorType::Q6_K, 288));  // whole 32-element blocks, not 256
  EXPECT_TRUE(fits(TensorType::Q4_K, 256));
  EXPECT_TRUE(fits(TensorType::Q5_K, 14336));
  EXPECT_FALSE(fits(TensorType::Q4_K, 96));  // whole 32-element blocks, not 256
  EXPECT_FALSE(fits(TensorType::Q5_K, 288));
  EXPECT_TRUE(fits(TensorType::Q3_K, 256));
  EXPECT_FALSE(fits(TensorType::IQ4_XS, 288));  // whole 32-element blocks, not 256
  EXPECT_TRUE(fits(TensorType::MXFP4, 2880));
  EXPECT_FALSE(fits(TensorType::BF16, 4096));  // no split layout for the type
  EXPECT_FALSE(fits(TensorType::F16, 4096));
}

}  // namespace
}  // namespace granule
