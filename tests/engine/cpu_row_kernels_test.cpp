// Tests of the CPU backend's row kernels: the vector decoders give exactly quant.h's
// dequantize_row bits for every block type, and the fast dot exactly the portable one's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cpu/row_kernels.h"
#include "granule/quant.h"
#include "granule/testkit/quantize.h"

namespace granule::cpu {
namespace {

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

TEST(CpuRowKernels, DecodeRowIsBitIdenticalToDequantizeRow) {
  const int64_t n = 1024;
  for (TensorType type :
       {TensorType::F32, TensorType::F16, TensorType::BF16, TensorType::Q8_0, TensorType::Q4_0,
        TensorType::Q4_1, TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K, TensorType::Q5_0,
        TensorType::Q5_1, TensorType::Q2_K, TensorType::Q3_K, TensorType::IQ4_NL,
        TensorType::IQ4_XS, TensorType::MXFP4}) {
    auto values = random_values(n, 1);
    std::vector<uint8_t> row(row_bytes(type, n));
    quantize_row(type, values.data(), row.data(), n);
    std::vector<float> expected(n), got(n);
    dequantize_row(type, row.data(), expected.data(), n);
    decode_row(type, row.data(), got.data(), n);
    EXPECT_EQ(std::memcmp(expected.data(), got.data(), n * sizeof(float)), 0)
        << tensor_type_info(type).name;
  }
}

TEST(CpuRowKernels, FastDotIsBitIdenticalToPortableDot) {
  for (int64_t n : {0, 1, 5, 31, 32, 33, 64, 100, 576, 1536, 4099}) {
    auto a = random_values(static_cast<size_t>(n), 2);
    auto b = random_values(static_cast<size_t>(n), 3);
    const float portable = dot_f32_portable(a.data(), b.data(), n);
    const float fast = dot_f32_fast(a.data(), b.data(), n);
    EXPECT_EQ(std::memcmp(&portable, &fast, sizeof(float)), 0) << "n=" << n;
    double exact = 0;
    for (int64_t i = 0; i < n; ++i) exact += double(a[i]) * b[i];
    EXPECT_NEAR(portable, exact, 1e-5 * (1 + std::abs(exact)) * std::sqrt(double(n) + 1))
        << "n=" << n;
  }
  RecordProperty("avx2", row_kernels_use_avx2() ? "yes" : "no");
}

TEST(CpuRowKernels, FusedDotIsBitIdenticalToDecodeThenDot) {
  const int64_t n = 576;
  auto x = random_values(n, 4);
  for (TensorType type : {TensorType::Q4_0, TensorType::Q4_1, TensorType::Q8_0, TensorType::Q6_K,
                          TensorType::F16, TensorType::Q5_0, TensorType::Q5_1, TensorType::Q2_K,
                          TensorType::IQ4_NL, TensorType::MXFP4}) {
    const int64_t cols = tensor_type_info(type).block_elems == 256 ? 512 : n;
    auto values = random_values(cols, 5);
    std::vector<uint8_t> row(row_bytes(type, cols));
    quantize_row(type, values.data(), row.data(), cols);
    std::vector<float> decoded(cols);
    decode_row(type, row.data(), decoded.data(), cols);
    const float expected = dot_f32_fast(decoded.data(), x.data(), cols);
    float fused = 12345.0f;
    const bool handled = dot_row_fused(type, row.data(), x.data(), cols, &fused);
    if (!handled) {
      EXPECT_EQ(fused, 12345.0f) << tensor_type_info(type).name;  // untouched
      continue;
    }
    EXPECT_TRUE(type == TensorType::Q4_0 || type == TensorType::Q4_1 || type == TensorType::Q8_0);
    EXPECT_EQ(std::memcmp(&expected, &fused, sizeof(float)), 0) << tensor_type_info(type).name;
  }
}

TEST(CpuRowKernels, ManyQueriesGiveEachQueryItsOwnAttentionBits) {
  if (!row_kernels_use_avx2()) GTEST_SKIP() << "no AVX2 here";
  // Keys past several 64-key blocks, lengths not multiples of 4, a sink on some queries, and
  // K/V rows strided as in the KV record.
  for (int64_t head_dim : {64, 128}) {
    SCOPED_TRACE(head_dim);
    const int64_t keys = 203, stride = 3 * head_dim;
    const std::vector<float> k = random_values(static_cast<size_t>(keys * stride), 5);
    const std::vector<float> v = random_values(static_cast<size_t>(keys * stride), 6);
    const std::vector<float> q = random_values(static_cast<size_t>(9 * head_dim), 7);
    const float sink = 0.75f;
    const int64_t lengths[] = {1, 3, 4, 64, 65, 130, 131, 200, 203};
    std::vector<float> many(q.size(), -1.0f), alone(q.size(), -2.0f);
    std::vector<AttentionQuery> queries;
    for (int64_t i = 0; i < 9; ++i)
      queries.push_back({q.data() + i * head_dim, many.data() + i * head_dim, lengths[i],
                         i % 3 == 1 ? &sink : nullptr});
    ASSERT_TRUE(attention_many_avx2(queries.data(), 9, k.data() + head_dim, v.data() + head_dim,
                                    stride, head_dim, 0.0f));
    std::vector<float> scores(keys);
    for (int64_t i = 0; i < 9; ++i)
      ASSERT_TRUE(attention_head_avx2(q.data() + i * head_dim, k.data() + head_dim,
                                      v.data() + head_dim, stride, lengths[i], head_dim,
                                      scores.data(), alone.data() + i * head_dim,
                                      queries[static_cast<size_t>(i)].sink, 0.0f));
    EXPECT_EQ(std::memcmp(many.data(), alone.data(), many.size() * sizeof(float)), 0);
  }
}

}  // namespace
}  // namespace granule::cpu
