// The split weight layout's host repacker: for every type it supports, GGUF rows re-laid
// out and decoded back give exactly dequantize_row's values (the layout loses nothing and
// puts every value where the kernels look), on row lengths with and without padding.
#include "model/weight_split.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "granule/error.h"
#include "granule/quant.h"
#include "granule/tensor_type.h"
#include "granule/testkit/quantize.h"

namespace granule {
namespace {

struct Case {
  TensorType type;
  int64_t cols;
};

class WeightSplit : public ::testing::TestWithParam<Case> {};

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
  const int64_t stride = split_row_stride(id, cols);
  EXPECT_EQ(stride % 16, 0);
  EXPECT_GE(stride, gguf_row);
  EXPECT_LT(stride - gguf_row, 16);
  std::vector<uint8_t> split(static_cast<size_t>(kRows * stride), 0xAB);
  split_rows(id, gguf.data(), kRows, cols, split.data());
  for (int64_t r = 0; r < kRows; ++r) {
    std::vector<float> expected(static_cast<size_t>(cols)), got(static_cast<size_t>(cols));
    dequantize_row(type, gguf.data() + r * gguf_row, expected.data(), cols);
    dequantize_split_row(id, split.data() + r * stride, cols, got.data());
    for (int64_t i = 0; i < cols; ++i)
      ASSERT_EQ(got[i], expected[i]) << "row " << r << " element " << i;
    for (int64_t pad = gguf_row; pad < stride; ++pad)
      EXPECT_EQ(split[r * stride + pad], 0) << "padding is zeroed";
  }
}

// How gtest shows a case (--gtest_list_tests, failure messages), not as raw bytes.
void PrintTo(const Case& c, std::ostream* os) {
  *os << tensor_type_info(c.type).name << ", " << c.cols << " columns";
}

INSTANTIATE_TEST_SUITE_P(
    Types, WeightSplit,
    ::testing::Values(Case{TensorType::Q4_0, 576}, Case{TensorType::Q4_0, 4096},
                      Case{TensorType::Q4_1, 576}, Case{TensorType::Q4_1, 1536},
                      Case{TensorType::Q8_0, 64}, Case{TensorType::Q8_0, 576},
                      Case{TensorType::Q6_K, 256}, Case{TensorType::Q6_K, 4096},
                      Case{TensorType::Q5_0, 576}, Case{TensorType::Q5_0, 4096},
                      Case{TensorType::Q5_0, 96}, Case{TensorType::Q5_1, 576},
                      Case{TensorType::Q5_1, 1536}, Case{TensorType::Q5_1, 32}),
    [](const auto& info) {
      return std::string(tensor_type_name(static_cast<uint32_t>(info.param.type))) + "_" +
             std::to_string(info.param.cols);
    });

TEST(WeightSplitSupport, OnlyTheSixKernelTypesAndWholeBlocks) {
  EXPECT_TRUE(split_layout_supported(static_cast<uint32_t>(TensorType::Q6_K)));
  EXPECT_TRUE(split_layout_supported(static_cast<uint32_t>(TensorType::Q5_0)));
  EXPECT_TRUE(split_layout_supported(static_cast<uint32_t>(TensorType::Q5_1)));
  EXPECT_FALSE(split_layout_supported(static_cast<uint32_t>(TensorType::IQ4_NL)));
  EXPECT_FALSE(split_layout_supported(static_cast<uint32_t>(TensorType::MXFP4)));
  EXPECT_FALSE(split_layout_supported(static_cast<uint32_t>(TensorType::Q4_K)));
  EXPECT_FALSE(split_layout_supported(static_cast<uint32_t>(TensorType::F16)));
  std::vector<uint8_t> dst(4096);
  EXPECT_THROW(split_rows(static_cast<uint32_t>(TensorType::Q4_K), dst.data(), 1, 256, dst.data()),
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
  EXPECT_FALSE(fits(TensorType::Q4_K, 256));  // no split layout for the type
  EXPECT_FALSE(fits(TensorType::F16, 4096));
}

}  // namespace
}  // namespace granule
