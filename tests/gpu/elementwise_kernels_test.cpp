// RMSNorm (f32, f16 and int8 outputs, row selection), activation quantisation, weight
// dequantisation to f16, embedding gather and SwiGLU against the CPU reference
// (cpu/ops.h, dequantize_row) on fresh random inputs with poisoned outputs; the two weight
// readers also on the split layout (engine/include/granule/split_layout.h) of the types that have
// it.
#include <cuda_fp16.h>

#include <cmath>
#include <random>

#include "backends/cpu/ops.h"
#include "dequantize.cuh"
#include "gpu_test_support.h"
#include "granule/quant.h"
#include "kernel_test_inputs.h"
#include "quantize_activations.cuh"
#include "rms_norm.cuh"
#include "swiglu.cuh"

namespace granule {
namespace {

using gpu_test::DeviceArray;

const TensorType kAllTypes[] = {
    TensorType::F32,  TensorType::F16,    TensorType::BF16,   TensorType::Q8_0,
    TensorType::Q4_0, TensorType::Q4_1,   TensorType::Q4_K,   TensorType::Q5_K,
    TensorType::Q6_K, TensorType::Q5_0,   TensorType::Q5_1,   TensorType::Q2_K,
    TensorType::Q3_K, TensorType::IQ4_NL, TensorType::IQ4_XS, TensorType::MXFP4};

std::vector<float> halves_to_floats(const std::vector<__half>& h) {
  std::vector<float> f(h.size());
  for (size_t i = 0; i < h.size(); ++i) f[i] = __half2float(h[i]);
  return f;
}

TEST(RmsNormKernel, MatchesCpuInEveryOutputFormat) {
  GRANULE_REQUIRE_GPU();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  std::mt19937 rng(3);
  for (int n : {64, 576, 4096, 1000 /* not a multiple of 32: no int8 output */}) {
    const int rows = 7;
    const std::vector<float> x = gpu_test::random_floats(static_cast<size_t>(rows * n), rng, 3.0f);
    const std::vector<float> w = gpu_test::random_floats(static_cast<size_t>(n), rng);
    std::vector<float> expected(x.size());
    for (int r = 0; r < rows; ++r)
      cpu::rms_norm(x.data() + r * n, w.data(), expected.data() + r * n, n, 1e-5f);
    DeviceArray<float> d_x(x), d_w(w), d_y(x.size());
    DeviceArray<__half> d_h(x.size());
    DeviceArray<int8_t> d_qs(x.size());
    DeviceArray<float2> d_ds(x.size() / 32);
    d_y.poison();
    d_h.poison();
    d_qs.poison();
    kernels::RmsNormOutputs out;
    out.f32 = d_y.get();
    out.f16 = d_h.get();
    if (n % 32 == 0) out.q8 = {d_qs.get(), d_ds.get()};
    CUDA_OK(kernels::launch_rms_norm(d_x.get(), d_w.get(), rows, n, 1e-5f, out, config, nullptr));
    const std::vector<float> y = d_y.download();
    const std::vector<float> h = halves_to_floats(d_h.download());
    for (size_t i = 0; i < y.size(); ++i) {
      ASSERT_NEAR(y[i], expected[i], 1e-5 + 1e-5 * std::fabs(expected[i]))
          << "n " << n << " f32 element " << i;
      ASSERT_NEAR(h[i], expected[i], 1e-3 * std::fabs(expected[i]) + 1e-6)
          << "n " << n << " f16 element " << i;
    }
    if (n % 32 == 0) {
      const std::vector<int8_t> qs = d_qs.download();
      const std::vector<float2> ds = d_ds.download();
      for (size_t i = 0; i < y.size(); ++i) {
        const float2 s = ds[i / 32];
        ASSERT_NEAR(qs[i] * s.x, expected[i], 0.5001 * s.x + 1e-6)
            << "n " << n << " int8 element " << i;
      }
      for (size_t b = 0; b < ds.size(); ++b) {
        int sum = 0;
        for (int i = 0; i < 32; ++i) sum += qs[b * 32 + i];
        ASSERT_NEAR(ds[b].y, ds[b].x * sum, 1e-4 * std::fabs(ds[b].x * sum) + 1e-6)
            << "block sum " << b;
      }
    }
  }
}

TEST(RmsNormKernel, SelectedSourceRows) {
  GRANULE_REQUIRE_GPU();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  std::mt19937 rng(4);
  const int n = 256, rows = 9;
  const std::vector<float> x = gpu_test::random_floats(static_cast<size_t>(rows * n), rng);
  const std::vector<float> w = gpu_test::random_floats(static_cast<size_t>(n), rng);
  const std::vector<int32_t> pick = {8, 0, 3};
  DeviceArray<float> d_x(x), d_w(w), d_y(pick.size() * n);
  DeviceArray<int32_t> d_pick(pick);
  d_y.poison();
  kernels::RmsNormOutputs out;
  out.f32 = d_y.get();
  CUDA_OK(kernels::launch_rms_norm(d_x.get(), d_w.get(), 3, n, 1e-6f, out, config, nullptr,
                                   d_pick.get()));
  const std::vector<float> y = d_y.download();
  for (size_t r = 0; r < pick.size(); ++r) {
    std::vector<float> expected(n);
    cpu::rms_norm(x.data() + pick[r] * n, w.data(), expected.data(), n, 1e-6f);
    for (int i = 0; i < n; ++i)
      ASSERT_NEAR(y[r * n + i], expected[i], 1e-5 + 1e-5 * std::fabs(expected[i]));
  }
}

TEST(QuantizeActivationsKernel, Int8BlocksAndHalfConversion) {
  GRANULE_REQUIRE_GPU();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  std::mt19937 rng(5);
  const int rows = 3, n = 96;
  std::vector<float> x = gpu_test::random_floats(static_cast<size_t>(rows * n), rng, 10.0f);
  for (int i = 32; i < 64; ++i) x[i] = 0.0f;  // an all-zero block must give d = 0 and no NaN
  DeviceArray<float> d_x(x);
  DeviceArray<int8_t> d_qs(x.size());
  DeviceArray<float2> d_ds(x.size() / 32);
  DeviceArray<__half> d_h(x.size());
  d_qs.poison();
  d_h.poison();
  CUDA_OK(
      kernels::launch_quantize_q8(d_x.get(), rows, n, {d_qs.get(), d_ds.get()}, config, nullptr));
  CUDA_OK(kernels::launch_convert_f32_to_f16(d_x.get(), static_cast<int64_t>(x.size()), d_h.get(),
                                             nullptr));
  const std::vector<int8_t> qs = d_qs.download();
  const std::vector<float2> ds = d_ds.download();
  const std::vector<float> h = halves_to_floats(d_h.download());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_NEAR(qs[i] * ds[i / 32].x, x[i], 0.5001 * ds[i / 32].x + 1e-6) << i;
    ASSERT_EQ(h[i], __half2float(__float2half_rn(x[i]))) << i;
  }
  EXPECT_EQ(ds[1].x, 0.0f);
  EXPECT_EQ(
      kernels::launch_quantize_q8(d_x.get(), 1, 48, {d_qs.get(), d_ds.get()}, config, nullptr),
      cudaErrorInvalidValue);
}

TEST(DequantizeKernel, EveryTypeToHalfMatchesDequantizeRow) {
  GRANULE_REQUIRE_GPU();
  std::mt19937 rng(6);
  for (const bool split : {false, true})
    for (TensorType type : kAllTypes) {
      if (split && !split_layout_supported(static_cast<uint32_t>(type))) continue;
      const int64_t rows = 13, cols = 512;
      const gpu_test::Encoded w = gpu_test::encode(type, rows, cols, rng, split);
      const std::vector<float>& expected = w.decoded;
      DeviceArray<uint8_t> d_w(w.device_bytes);
      DeviceArray<__half> d_out(expected.size());
      d_out.poison();
      CUDA_OK(kernels::launch_dequantize_to_f16(static_cast<uint32_t>(type), d_w.get(), rows, cols,
                                                w.device_row_bytes, d_out.get(), nullptr, split));
      const std::vector<float> got = halves_to_floats(d_out.download());
      for (size_t i = 0; i < got.size(); ++i)
        // The device may fuse d * q + m into one FMA: allow one f16 rounding step.
        ASSERT_NEAR(got[i], expected[i], 1e-3 * std::fabs(expected[i]) + 1e-6)
            << tensor_type_info(type).name << (split ? " split" : "") << " element " << i;
    }
}

TEST(EmbeddingGatherKernel, EveryTypeMatchesCpuEmbeddingRow) {
  GRANULE_REQUIRE_GPU();
  std::mt19937 rng(8);
  for (const bool split : {false, true})
    for (TensorType type : kAllTypes) {
      if (split && !split_layout_supported(static_cast<uint32_t>(type))) continue;
      const int64_t vocab = 50, n_embd = 768;
      const gpu_test::Encoded table = gpu_test::encode(type, vocab, n_embd, rng, split);
      const std::vector<int32_t> tokens = {49, 0, 17, 17, 3, 50 /* out of range: zeros */};
      const int64_t stride = table.device_row_bytes;
      DeviceArray<uint8_t> d_table(table.device_bytes);
      DeviceArray<int32_t> d_tokens(tokens);
      DeviceArray<float> d_out(tokens.size() * n_embd);
      d_out.poison();
      CUDA_OK(kernels::launch_embedding_gather(
          static_cast<uint32_t>(type), d_table.get(), stride, static_cast<int>(n_embd), vocab,
          d_tokens.get(), static_cast<int>(tokens.size()), d_out.get(), nullptr, split));
      const std::vector<float> got = d_out.download();
      for (size_t t = 0; t < tokens.size(); ++t) {
        std::vector<float> expected(static_cast<size_t>(n_embd), 0.0f);
        if (tokens[t] < vocab)
          cpu::embedding_row(type, table.bytes.data(), n_embd, tokens[t], expected.data());
        for (int64_t i = 0; i < n_embd; ++i)
          ASSERT_NEAR(got[t * n_embd + i], expected[static_cast<size_t>(i)],
                      1e-6 * (std::fabs(expected[static_cast<size_t>(i)]) + 1.0f))
              << tensor_type_info(type).name << (split ? " split" : "") << " token "
              << t;  // FMA on the device: last-bit differences
      }
    }
}

TEST(SwigluKernel, MatchesCpuSwiglu) {
  GRANULE_REQUIRE_GPU();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  std::mt19937 rng(9);
  const size_t n = 10007;
  const std::vector<float> g = gpu_test::random_floats(n, rng, 4.0f),
                           u = gpu_test::random_floats(n, rng, 2.0f);
  std::vector<float> expected(n);
  cpu::swiglu(g.data(), u.data(), expected.data(), static_cast<int64_t>(n));
  DeviceArray<float> d_g(g), d_u(u), d_y(n);
  DeviceArray<__half> d_h(n);
  d_y.poison();
  d_h.poison();
  CUDA_OK(kernels::launch_swiglu_f32(d_g.get(), d_u.get(), static_cast<int64_t>(n), d_y.get(),
                                     config, nullptr));
  CUDA_OK(kernels::launch_swiglu_to_f16(d_g.get(), d_u.get(), static_cast<int64_t>(n), d_h.get(),
                                        nullptr));
  const std::vector<float> y = d_y.download();
  const std::vector<float> h = halves_to_floats(d_h.download());
  for (size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(y[i], expected[i], 1e-5 + 1e-5 * std::fabs(expected[i])) << i;
    ASSERT_NEAR(h[i], expected[i], 1e-3 * std::fabs(expected[i]) + 1e-5) << i;
  }
}

}  // namespace
}  // namespace granule
