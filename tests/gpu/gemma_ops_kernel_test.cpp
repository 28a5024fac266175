// Gemma's elementwise kernels (kernels/gemma_ops.cuh) and the RMSNorm kernel's residual output
// (Gemma's sandwich norms) against the CPU reference (backends/cpu/gemma_ops.h, cpu/ops.h) on
// random inputs, the tails of gelu's table (|x| >= 10) included: GeGLU in f32 and f16 (equal up
// to the rare input whose f16 rounding of gelu flips, one f16 step), the soft-cap and the scale.
#include <cuda_fp16.h>

#include <cmath>
#include <random>

#include "backends/cpu/gemma_ops.h"
#include "backends/cpu/ops.h"
#include "gemma_ops.cuh"
#include "gpu_test_support.h"
#include "rms_norm.cuh"

namespace granule {
namespace {

using gpu_test::DeviceArray;

// One f16 step of gelu's output at x (ggml's table is f16): the largest disagreement allowed.
float f16_step(float x) {
  const float a = std::fabs(x);
  return a < 6.1e-5f ? 6e-8f : std::ldexp(1.0f, static_cast<int>(std::floor(std::log2(a))) - 10);
}

TEST(GemmaOpsKernel, GegluMatchesGgmlsTable) {
  GRANULE_REQUIRE_GPU();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  std::mt19937 rng(7);
  const size_t n = 1 << 16;
  std::vector<float> gate = gpu_test::random_floats(n, rng, 6.0f);
  const std::vector<float> up = gpu_test::random_floats(n, rng, 2.0f);
  for (float tail : {-12.0f, -10.0f, 10.0f, 11.5f}) gate.push_back(tail);
  std::vector<float> up_all = up;
  up_all.resize(gate.size(), 1.5f);
  std::vector<float> expected(gate.size());
  cpu::geglu(gate.data(), up_all.data(), expected.data(), static_cast<int64_t>(gate.size()));
  DeviceArray<float> d_gate(gate), d_up(up_all), d_out(gate.size());
  DeviceArray<__half> d_h(gate.size());
  d_out.poison();
  d_h.poison();
  const auto count = static_cast<int64_t>(gate.size());
  CUDA_OK(kernels::launch_geglu_f32(d_gate.get(), d_up.get(), count, d_out.get(), config, nullptr));
  CUDA_OK(kernels::launch_geglu_to_f16(d_gate.get(), d_up.get(), count, d_h.get(), nullptr));
  const std::vector<float> out = d_out.download();
  const std::vector<__half> h = d_h.download();
  size_t exact = 0;
  for (size_t i = 0; i < gate.size(); ++i) {
    const float bound =
        f16_step(expected[i] / (up_all[i] == 0 ? 1 : up_all[i])) * std::fabs(up_all[i]) * 1.01f;
    ASSERT_NEAR(out[i], expected[i], bound) << "gate " << gate[i] << " up " << up_all[i];
    exact += out[i] == expected[i] ? 1 : 0;
    ASSERT_NEAR(__half2float(h[i]), expected[i], bound + f16_step(expected[i]) + 1e-7f)
        << "f16, gate " << gate[i];
  }
  // Rounding flips are rare: nearly every value is ggml's to the bit.
  EXPECT_GE(exact, gate.size() * 999 / 1000);
}

TEST(GemmaOpsKernel, SoftCapAndScale) {
  GRANULE_REQUIRE_GPU();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  std::mt19937 rng(8);
  const std::vector<float> x = gpu_test::random_floats(100000, rng, 80.0f);
  std::vector<float> capped = x;
  cpu::soft_cap(capped.data(), static_cast<int64_t>(capped.size()), 30.0f);
  DeviceArray<float> d_x(x);
  CUDA_OK(
      kernels::launch_soft_cap(d_x.get(), static_cast<int64_t>(x.size()), 30.0f, config, nullptr));
  const std::vector<float> y = d_x.download();
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(y[i], capped[i], 2e-6f * 30.0f) << "x " << x[i];
  EXPECT_EQ(kernels::launch_soft_cap(d_x.get(), 1, 0.0f, config, nullptr), cudaErrorInvalidValue);

  DeviceArray<float> d_s(x);
  CUDA_OK(
      kernels::launch_scale(d_s.get(), static_cast<int64_t>(x.size()), 61.9677f, config, nullptr));
  const std::vector<float> s = d_s.download();
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(s[i], x[i] * 61.9677f);
}

// The sandwich norm: residual += RMSNorm(x) · w, in the kernel that writes the norm.
TEST(GemmaOpsKernel, RmsNormJoinsTheResidual) {
  GRANULE_REQUIRE_GPU();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  std::mt19937 rng(9);
  for (int n : {256, 1152, 3840, 5376}) {
    const int rows = 5;
    const std::vector<float> x = gpu_test::random_floats(static_cast<size_t>(rows * n), rng, 4.0f);
    const std::vector<float> w = gpu_test::random_floats(static_cast<size_t>(n), rng);
    const std::vector<float> residual =
        gpu_test::random_floats(static_cast<size_t>(rows * n), rng, 2.0f);
    std::vector<float> expected = residual, normed(static_cast<size_t>(n));
    for (int r = 0; r < rows; ++r) {
      cpu::rms_norm(x.data() + r * n, w.data(), normed.data(), n, 1e-6f);
      for (int i = 0; i < n; ++i)
        expected[static_cast<size_t>(r * n + i)] += normed[static_cast<size_t>(i)];
    }
    DeviceArray<float> d_x(x), d_w(w), d_r(residual);
    kernels::RmsNormOutputs out;
    out.residual = d_r.get();
    CUDA_OK(kernels::launch_rms_norm(d_x.get(), d_w.get(), rows, n, 1e-6f, out, config, nullptr));
    const std::vector<float> y = d_r.download();
    for (size_t i = 0; i < y.size(); ++i)
      ASSERT_NEAR(y[i], expected[i], 1e-5 + 1e-5 * std::fabs(expected[i]))
          << "n " << n << " at " << i;
  }
}

}  // namespace
}  // namespace granule
