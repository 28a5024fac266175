// Tests of the CPU backend's int8 matmul (the fast path): per block type, each output equals
// the f32 dot of the dequantised row with the int8-rounded activation up to f32 summation
// order, and stays within the activation rounding's bound of the exact f32 path; every tile
// shape and row/token split gives the same numbers; AVX512-VNNI's sums give AVX2's bits.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <random>
#include <vector>

#include "backends/cpu/fast_matmul.h"
#include "backends/cpu/int8_matmul.h"
#include "backends/cpu/int8_packed.h"
#include "backends/cpu/ops.h"
#include "granule/block_formats.h"
#include "granule/quant.h"
#include "granule/testkit/quantize.h"

namespace granule::cpu {
namespace {

std::vector<float> random_values(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

const TensorType kTypes[] = {
    TensorType::Q4_0,   TensorType::Q4_1,  TensorType::Q5_0,  TensorType::Q5_1, TensorType::Q8_0,
    TensorType::IQ4_NL, TensorType::MXFP4, TensorType::Q2_K,  TensorType::Q3_K, TensorType::Q4_K,
    TensorType::Q5_K,   TensorType::Q6_K,  TensorType::IQ4_XS};

struct Case {
  std::vector<uint8_t> w;
  std::vector<float> w_f32;  // the dequantised rows
  std::vector<float> x;
  std::vector<ActivationBlock> xq;
  std::vector<float> x_rounded;  // q·d of every activation
};

Case make_case(TensorType type, int64_t rows, int64_t cols, int64_t tokens, uint32_t seed) {
  Case c;
  const auto values = random_values(static_cast<size_t>(rows * cols), seed, 0.05f);
  const size_t stride = row_bytes(type, cols);
  c.w.resize(stride * static_cast<size_t>(rows));
  c.w_f32.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    quantize_row(type, values.data() + r * cols, c.w.data() + r * stride, cols);
    dequantize_row(type, c.w.data() + r * stride, c.w_f32.data() + r * cols, cols);
  }
  c.x = random_values(static_cast<size_t>(tokens * cols), seed + 1, 1.5f);
  c.x[3] = 0.0f;  // a zero, and below a whole block of zeros
  for (int64_t i = 32; i < 64 && i < cols; ++i) c.x[static_cast<size_t>(i)] = 0.0f;
  c.xq.resize(static_cast<size_t>(tokens * cols / 32));
  quantize_activations(c.x.data(), tokens * cols, c.xq.data());
  c.x_rounded.resize(c.x.size());
  for (size_t b = 0; b < c.xq.size(); ++b)
    for (int i = 0; i < 32; ++i)
      c.x_rounded[b * 32 + i] = static_cast<float>(c.xq[b].qs[i]) * c.xq[b].d;
  return c;
}

TEST(CpuInt8Matmul, ActivationRoundingIsRoundThroughQ8) {
  // The same rule as the oracle's MultiplyByInverse rounding (ops.h round_through_q8).
  auto x = random_values(4096, 7, 3.0f);
  std::vector<ActivationBlock> q(x.size() / 32);
  quantize_activations(x.data(), static_cast<int64_t>(x.size()), q.data());
  std::vector<float> expected = x;
  round_through_q8(expected.data(), static_cast<int64_t>(expected.size()),
                   Q8Rounding::MultiplyByInverse);
  for (size_t b = 0; b < q.size(); ++b) {
    int half[2] = {0, 0};
    for (int i = 0; i < 32; ++i) {
      ASSERT_EQ(static_cast<float>(q[b].qs[i]) * q[b].d, expected[b * 32 + i]) << b << " " << i;
      half[i / 16] += q[b].qs[i];
    }
    const int sum = half[0] + half[1];
    EXPECT_EQ(q[b].sum, q[b].d * static_cast<float>(sum));
    EXPECT_EQ(q[b].qsum, sum);
    EXPECT_EQ(q[b].half_sum[0], half[0]);
    EXPECT_EQ(q[b].half_sum[1], half[1]);
  }
}

TEST(CpuInt8Matmul, DividingRoundingIsRoundThroughQ8sDivide) {
  // The CUDA attention output's and quantize_q8's rule (the host rows' O and down inputs):
  // random values, a block of zeros, and values at the rounding boundaries, where x / d and
  // x · (1/d) part.
  auto x = random_values(8192, 11, 3.0f);
  for (size_t i = 0; i < 32; ++i) x[64 + i] = 0.0f;
  // Blocks past the first hundred: amax first, then values at the halves between two int8
  // steps (k + 1/2)·d, a few ulps either side, where the two rules round apart.
  std::mt19937 rng(5);
  for (size_t b = 100; b < x.size() / 32; ++b) {
    float* v = x.data() + b * 32;
    const float amax = std::uniform_real_distribution<float>(0.01f, 8.0f)(rng);
    const float d = amax / 127.0f;
    v[0] = amax;
    for (int i = 1; i < 32; ++i) {
      const int k = static_cast<int>(rng() % 126);
      float h = (static_cast<float>(k) + 0.5f) * d;
      for (int u = static_cast<int>(rng() % 5); u > 0; --u) h = std::nextafter(h, 0.0f);
      for (int u = static_cast<int>(rng() % 5); u > 0; --u) h = std::nextafter(h, amax);
      v[i] = (rng() & 1) ? h : -h;
    }
  }
  std::vector<ActivationBlock> q(x.size() / 32);
  quantize_activations(x.data(), static_cast<int64_t>(x.size()), q.data(), true);
  std::vector<float> divided = x, multiplied = x;
  round_through_q8(divided.data(), static_cast<int64_t>(divided.size()), Q8Rounding::Divide);
  round_through_q8(multiplied.data(), static_cast<int64_t>(multiplied.size()),
                   Q8Rounding::MultiplyByInverse);
  int differ = 0;
  for (size_t b = 0; b < q.size(); ++b) {
    int sum = 0;
    for (int i = 0; i < 32; ++i) {
      ASSERT_EQ(static_cast<float>(q[b].qs[i]) * q[b].d, divided[b * 32 + i]) << b << " " << i;
      differ += divided[b * 32 + i] != multiplied[b * 32 + i];
      sum += q[b].qs[i];
    }
    EXPECT_EQ(q[b].qsum, sum);
  }
  for (int i = 0; i < 32; ++i) EXPECT_EQ(q[2].qs[i], 0);
  EXPECT_GT(differ, 0) << "no value where the two rules part: the test checks nothing";
  std::cout << "x / d and x * (1/d) give other int8 values for " << differ << " of " << x.size()
            << " activations\n";
}

TEST(CpuInt8Matmul, EachTypeIsTheDotWithTheRoundedActivationAndWithinItsBoundOfExact) {
  if (!int8_matmul_supports(TensorType::Q4_0, 256)) GTEST_SKIP() << "no AVX2 here";
  const int64_t rows = 7, cols = 512, tokens = 6;
  for (TensorType type : kTypes) {
    SCOPED_TRACE(tensor_type_info(type).name);
    ASSERT_TRUE(int8_matmul_supports(type, cols));
    Case c = make_case(type, rows, cols, tokens, 11);
    std::vector<float> fast(static_cast<size_t>(rows * tokens));
    Int8Weights(type, c.w.data(), rows, cols)
        .matmul_rows(0, rows, c.xq.data(), tokens, fast.data(), rows);
    std::vector<float> exact(fast.size());
    matmul(type, c.w.data(), rows, cols, c.x.data(), tokens, exact.data(), nullptr);
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t r = 0; r < rows; ++r) {
        const float* w = c.w_f32.data() + r * cols;
        const float* xr = c.x_rounded.data() + t * cols;
        const float* x = c.x.data() + t * cols;
        double rounded_dot = 0, magnitude = 0, bound = 0;
        for (int64_t i = 0; i < cols; ++i) {
          rounded_dot += double(w[i]) * xr[i];
          magnitude += std::fabs(double(w[i]) * xr[i]);
        }
        // |x - q·d| <= d / 2 for every element of a block.
        for (int64_t b = 0; b < cols / 32; ++b) {
          const float half_step = c.xq[static_cast<size_t>((t * cols) / 32 + b)].d / 2;
          for (int64_t i = 32 * b; i < 32 * b + 32; ++i) bound += std::fabs(w[i]) * half_step;
        }
        const float got = fast[static_cast<size_t>(t * rows + r)];
        EXPECT_NEAR(got, rounded_dot, 2e-6 * magnitude + 1e-9) << "row " << r << " token " << t;
        double exact_dot = 0;
        for (int64_t i = 0; i < cols; ++i) exact_dot += double(w[i]) * x[i];
        EXPECT_NEAR(exact[static_cast<size_t>(t * rows + r)], exact_dot, 1e-5 * magnitude + 1e-9);
        EXPECT_NEAR(got, exact_dot, bound + 4e-6 * magnitude + 1e-9)
            << "row " << r << " token " << t;
      }
    }
  }
}

TEST(CpuInt8Matmul, RepackedCopiesHoldTheFilesBytes) {
  if (!int8_matmul_supports(TensorType::Q4_0, 256)) GTEST_SKIP() << "no AVX2 here";
  // 13 rows: a group of 8 and a group of 5 padded with zero rows.
  const int64_t rows = 13, cols = 512;
  for (TensorType type : kTypes) {
    SCOPED_TRACE(tensor_type_info(type).name);
    Case c = make_case(type, rows, cols, 1, 31);
    const Int8Weights weights(type, c.w.data(), rows, cols);
    EXPECT_TRUE(Int8Weights::packs(type));
    // Two groups of 8 rows: the file's bytes (unpacked scales: Q4_K/Q5_K 3 % more, IQ4_XS
    // 1.5 %, Q3_K 3.6 %).
    const size_t file_bytes = 2 * 8 * c.w.size() / rows;
    EXPECT_GE(weights.packed_bytes(), file_bytes);
    EXPECT_LE(weights.packed_bytes(), file_bytes * (type == TensorType::Q3_K ? 104 : 103) / 100);
  }
}

TEST(CpuInt8Matmul, EveryTileAndSplitGivesTheSameNumbers) {
  if (!int8_matmul_supports(TensorType::Q4_0, 256)) GTEST_SKIP() << "no AVX2 here";
  const int64_t rows = 21, cols = 768, tokens = 70;  // remainders in rows and tokens
  for (TensorType type : kTypes) {
    SCOPED_TRACE(tensor_type_info(type).name);
    Case c = make_case(type, rows, cols, tokens, 41);
    const Int8Weights weights(type, c.w.data(), rows, cols);
    std::vector<float> whole(static_cast<size_t>(rows * tokens));
    weights.matmul_rows(0, rows, c.xq.data(), tokens, whole.data(), rows);
    std::vector<float> pieces(whole.size()), single(whole.size()), odd(whole.size());
    for (int64_t r = 0; r < rows; r += 3)
      weights.matmul_rows(r, std::min(rows, r + 3), c.xq.data(), tokens, pieces.data(), rows);
    for (int64_t t = 0; t < tokens; ++t)
      weights.matmul_rows(0, rows, c.xq.data() + t * cols / 32, 1, single.data() + t * rows, rows);
    // Token runs that are not multiples of the 4-token tile.
    for (int64_t t = 0; t < tokens; t += 7) {
      const int64_t n = std::min<int64_t>(7, tokens - t);
      weights.matmul_rows(0, rows, c.xq.data() + t * cols / 32, n, odd.data() + t * rows, rows);
    }
    EXPECT_EQ(whole, pieces);
    EXPECT_EQ(whole, single);
    EXPECT_EQ(whole, odd);
  }
}

// The VNNI sums (vpdpbusd: a lane's 4 byte products into i32 at once; the AVX512-VNNI and the
// AVX-VNNI forms) against AVX2's (maddubs, i16 sums, madd): all sum exact integers, so every type
// gives the same bits, at 1 and 4-token tiles, whole and cut. Forms the CPU lacks are skipped.
TEST(CpuInt8Matmul, VnniAndAvx2SumsGiveTheSameBits) {
  if (!int8_matmul_supports(TensorType::Q4_0, 256)) GTEST_SKIP() << "no AVX2 here";
  using Form = Int8Weights::DotForm;
  const int64_t rows = 21, cols = 1024, tokens = 9;
  int forms_run = 0;
  for (const Form form : {Form::Avx512Vnni, Form::AvxVnni}) {
    if (!Int8Weights::use_dot_for_testing(form)) continue;
    ++forms_run;
    for (TensorType type : kTypes) {
      SCOPED_TRACE(std::string(tensor_type_info(type).name) +
                   (form == Form::AvxVnni ? " AVX-VNNI" : " AVX512-VNNI"));
      Case c = make_case(type, rows, cols, tokens, 57);
      const Int8Weights weights(type, c.w.data(), rows, cols);
      std::vector<float> vnni(static_cast<size_t>(rows * tokens)), avx2(vnni.size());
      ASSERT_TRUE(Int8Weights::use_dot_for_testing(form));
      weights.matmul_rows(0, rows, c.xq.data(), tokens, vnni.data(), rows);
      std::vector<float> one(static_cast<size_t>(rows));  // one token, a cut group
      weights.matmul_rows(3, 17, c.xq.data() + 5 * cols / 32, 1, one.data(), rows);
      ASSERT_TRUE(Int8Weights::use_dot_for_testing(Form::Avx2));
      weights.matmul_rows(0, rows, c.xq.data(), tokens, avx2.data(), rows);
      EXPECT_EQ(vnni, avx2);
      for (int64_t r = 3; r < 17; ++r)
        EXPECT_EQ(one[static_cast<size_t>(r)], avx2[static_cast<size_t>(5 * rows + r)]) << r;
    }
  }
  Int8Weights::use_best_dot();
  if (forms_run == 0) std::cout << "(no VNNI here: nothing to compare)\n";
  EXPECT_EQ(forms_run > 0, Int8Weights::has_vnni());
}

// MXFP4's E8M0 scales at their edges (the subnormal halves of e 0 and 1, e 2, 127, 200): each
// row's product is the dot of its decoded values with the rounded activation.
TEST(CpuInt8Matmul, Mxfp4ScalesAtTheirEdges) {
  if (!int8_matmul_supports(TensorType::MXFP4, 256)) GTEST_SKIP() << "no AVX2 here";
  const uint8_t exponents[] = {0, 1, 2, 100, 127, 140, 200, 3, 126};
  const int64_t rows = 9, cols = 64;
  std::vector<BlockMXFP4> w(static_cast<size_t>(rows * cols / 32));
  std::mt19937 gen(5);
  for (size_t b = 0; b < w.size(); ++b) {
    w[b].e = exponents[b / 2];
    for (uint8_t& q : w[b].qs) q = static_cast<uint8_t>(gen());
  }
  std::vector<float> w_f32(static_cast<size_t>(rows * cols));
  dequantize_row(TensorType::MXFP4, w.data(), w_f32.data(), rows * cols);
  const auto x = random_values(cols, 6);
  std::vector<ActivationBlock> xq(cols / 32);
  quantize_activations(x.data(), cols, xq.data());
  std::vector<float> got(rows);
  Int8Weights(TensorType::MXFP4, w.data(), rows, cols)
      .matmul_rows(0, rows, xq.data(), 1, got.data(), rows);
  for (int64_t r = 0; r < rows; ++r) {
    double dot = 0, magnitude = 0;
    for (int64_t i = 0; i < cols; ++i) {
      const double xi = double(xq[static_cast<size_t>(i / 32)].qs[i % 32]) * xq[i / 32].d;
      dot += w_f32[static_cast<size_t>(r * cols + i)] * xi;
      magnitude += std::fabs(w_f32[static_cast<size_t>(r * cols + i)] * xi);
    }
    EXPECT_NEAR(got[static_cast<size_t>(r)], dot, 2e-6 * magnitude) << "e " << int(exponents[r]);
    EXPECT_GT(magnitude, 0.0) << "e " << int(exponents[r]);
  }
}

TEST(CpuInt8Matmul, UnsupportedShapesAndTypesStayOnTheExactPath) {
  EXPECT_FALSE(int8_matmul_supports(TensorType::F32, 256));
  EXPECT_FALSE(int8_matmul_supports(TensorType::F16, 256));
  EXPECT_FALSE(int8_matmul_supports(TensorType::Q4_K, 576));  // not a multiple of 256
  EXPECT_FALSE(int8_matmul_supports(TensorType::Q4_0, 48));
}

// The experts' copies count against the memory available at load, not half of the machine: a
// 30B-A3B Q4_K_M file's experts (~17 GiB of copies) take the int8 path on a 24 GiB machine with
// 21 GiB available, where half of the machine (12 GiB) kept them on the exact path.
TEST(CpuInt8Matmul, ExpertCopiesFitTheMemoryAvailableLessAReserve) {
  constexpr uint64_t kGiB = uint64_t{1} << 30, kMiB = uint64_t{1} << 20;
  const uint64_t big = expert_copy_budget(21 * kGiB, 24 * kGiB, 600 * kMiB);
  EXPECT_EQ(big, 21 * kGiB - 24 * kGiB / 10 - 600 * kMiB);  // a tenth of the machine kept back
  EXPECT_GT(big, 17 * kGiB);
  EXPECT_EQ(expert_copy_budget(6 * kGiB, 8 * kGiB, 0), 4 * kGiB);   // at least 2 GiB kept back
  EXPECT_EQ(expert_copy_budget(kGiB, 8 * kGiB, 0), 0u);             // less than the reserve
  EXPECT_EQ(expert_copy_budget(3 * kGiB, 8 * kGiB, 2 * kGiB), 0u);  // the other copies first
  EXPECT_EQ(expert_copy_budget(0, 16 * kGiB, 5 * kGiB), 8 * kGiB);  // unknown: half the machine
}

}  // namespace
}  // namespace granule::cpu
