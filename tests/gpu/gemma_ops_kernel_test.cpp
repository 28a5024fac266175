// Gemma's elementwise kernels (kernels/gemma_ops.cuh) and the RMSNorm kernel's residual output
// (Gemma's sandwich norms) against the CPU reference (backends/cpu/gemma_ops.h, cpu/ops.h) on
// random inputs, the tails of gelu's table (|x| >= 10) included: GeGLU in f32 and f16 (equal up
// to the rare input whose f16 rounding of gelu flips, one f16 step), the soft-cap and the scale;
// and Gemma 4's kernels against the same reference as its CPU block (cpu_backend.cpp) computes
// them: the Q/K/V norms with partial rope and the KV write (own KV, V = K, a shared layer that
// writes none, a padding row), the per-layer embedding inputs, gelu times the layer's input, and
// the attention for heads of 512 (whole range and window).
#include <cuda_fp16.h>

#include <cmath>
#include <random>

#include "backends/cpu/gemma_ops.h"
#include "backends/cpu/ops.h"
#include "gemma_ops.cuh"
#include "gpu_test_support.h"
#include "model/rope.h"
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

// Gemma 4's attention inputs: 3 rows (the last a padding row, slot -1) of 4 query heads over 2 KV
// heads, the first rope_dims of each head rotated, K and V written into a KV record of 3 tokens'
// stride at an offset (another layer's room around them). Q against rms_norm · q_norm then rope;
// K and V to f16 rounding; V = K when v is k; nothing written by a shared layer or a padding row.
TEST(GemmaOpsKernel, Gemma4QkvNormsRotatesAndWritesTheKv) {
  GRANULE_REQUIRE_GPU();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  std::mt19937 rng(10);
  for (const int hd : {128, 256, 512}) {
    for (const int mode : {0, 1, 2}) {  // 0: own K and V, 1: V = K, 2: shared (no KV write)
      const int rows = 3, n_head = 4, n_kv = 2, rope_dims = hd / 2;
      const int64_t kv_width = static_cast<int64_t>(n_kv) * hd;
      const int64_t token_stride = 2 * kv_width + 64, kv_offset = 32, tokens = 16;
      const std::vector<int32_t> positions = {5, 11, 0}, slots = {0, 0, -1};
      std::vector<float> q =
          gpu_test::random_floats(static_cast<size_t>(rows * n_head * hd), rng, 3);
      const std::vector<float> k =
          gpu_test::random_floats(static_cast<size_t>(rows * kv_width), rng, 3);
      const std::vector<float> v =
          gpu_test::random_floats(static_cast<size_t>(rows * kv_width), rng, 3);
      std::vector<float> q_norm = gpu_test::random_floats(static_cast<size_t>(hd), rng, 0.3f);
      std::vector<float> k_norm = gpu_test::random_floats(static_cast<size_t>(hd), rng, 0.3f);
      const std::vector<double> frequencies =
          rope_frequencies(rope_dims, 10000.0f, RopeScaling{}, nullptr);
      DeviceArray<float> d_q(q), d_k(k), d_v(v), d_qn(q_norm), d_kn(k_norm);
      DeviceArray<double> d_f(frequencies);
      DeviceArray<int32_t> d_pos(positions), d_slots(slots);
      DeviceArray<__half> d_kv(static_cast<size_t>(kv_offset + tokens * token_stride));
      d_kv.poison();
      DeviceArray<__half*> d_base(std::vector<__half*>{d_kv.get()});
      kernels::Gemma4QkvArgs a;
      a.rows = rows;
      a.positions = d_pos.get();
      a.slots = d_slots.get();
      a.q = d_q.get();
      a.k = d_k.get();
      a.v = mode == 1 ? d_k.get() : d_v.get();
      a.q_norm = d_qn.get();
      a.k_norm = d_kn.get();
      a.eps = 1e-6f;
      a.frequencies = d_f.get();
      a.rope_dims = rope_dims;
      a.n_head = n_head;
      a.n_kv = n_kv;
      a.head_dim = hd;
      a.write_kv = mode != 2;
      a.slot_base = d_base.get();
      a.token_stride = token_stride;
      a.kv_offset = kv_offset;
      CUDA_OK(kernels::launch_gemma4_qkv(a, config, nullptr));
      const std::vector<float> q_gpu = d_q.download();
      const std::vector<__half> kv = d_kv.download();
      const std::vector<float> ones(static_cast<size_t>(hd), 1.0f);
      auto expected_head = [&](const float* x, const float* weight, bool rotate, int32_t position) {
        std::vector<float> y(static_cast<size_t>(hd));
        cpu::rms_norm(x, weight, y.data(), hd, 1e-6f);
        if (rotate)
          cpu::rope(y.data(), 1, rope_dims, position, frequencies.data(), RopeOrdering::NeoX, 1.0f);
        return y;
      };
      for (int r = 0; r < rows; ++r) {
        for (int h = 0; h < n_head; ++h) {
          const std::vector<float> want =
              expected_head(q.data() + (r * n_head + h) * hd, q_norm.data(), true,
                            positions[static_cast<size_t>(r)]);
          for (int e = 0; e < hd; ++e)
            ASSERT_NEAR(q_gpu[static_cast<size_t>((r * n_head + h) * hd + e)],
                        want[static_cast<size_t>(e)],
                        2e-5 + 2e-5 * std::fabs(want[static_cast<size_t>(e)]))
                << "head size " << hd << " row " << r << " Q head " << h << " at " << e;
        }
      }
      size_t written = 0;
      for (const __half x : kv) written += __half_as_ushort(x) != 0xFFFF ? 1 : 0;
      if (mode == 2) {
        EXPECT_EQ(written, 0u) << "a shared layer wrote KV";
        continue;
      }
      EXPECT_EQ(written, static_cast<size_t>(2 * 2 * kv_width)) << "only rows 0 and 1 write KV";
      for (int r = 0; r < 2; ++r) {
        const int32_t position = positions[static_cast<size_t>(r)];
        for (int h = 0; h < n_kv; ++h) {
          const float* k_in = k.data() + r * kv_width + h * hd;
          const float* v_in = (mode == 1 ? k.data() : v.data()) + r * kv_width + h * hd;
          const std::vector<float> want_k = expected_head(k_in, k_norm.data(), true, position);
          const std::vector<float> want_v = expected_head(v_in, ones.data(), false, position);
          const __half* record = kv.data() + kv_offset + position * token_stride;
          for (int e = 0; e < hd; ++e) {
            const float gk = __half2float(record[h * hd + e]);
            const float gv = __half2float(record[kv_width + h * hd + e]);
            const float wk = want_k[static_cast<size_t>(e)], wv = want_v[static_cast<size_t>(e)];
            ASSERT_NEAR(gk, wk, 1e-3f * std::fabs(wk) + 1e-5f) << "K head " << h << " at " << e;
            ASSERT_NEAR(gv, wv, 1e-3f * std::fabs(wv) + 1e-5f) << "V head " << h << " at " << e;
          }
        }
      }
    }
  }
}

// The per-layer embedding inputs and gelu times the layer's input.
TEST(GemmaOpsKernel, Gemma4PerLayerInputsAndGelu) {
  GRANULE_REQUIRE_GPU();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  std::mt19937 rng(11);
  const int rows = 5, n_layer = 6, n_pl = 64;
  const size_t n = static_cast<size_t>(rows * n_layer * n_pl);
  const std::vector<float> projected = gpu_test::random_floats(n, rng, 20.0f);
  const std::vector<float> table = gpu_test::random_floats(n, rng, 0.2f);
  const std::vector<float> norm = gpu_test::random_floats(static_cast<size_t>(n_pl), rng, 1.0f);
  const float ps = 1.0f / std::sqrt(256.0f), ts = std::sqrt(64.0f), is = 1.0f / std::sqrt(2.0f);
  std::vector<float> expected = projected;
  for (size_t b = 0; b < n; b += n_pl) {
    float* p = expected.data() + b;
    for (int i = 0; i < n_pl; ++i) p[i] *= ps;
    cpu::rms_norm(p, norm.data(), p, n_pl, 1e-6f);
    for (int i = 0; i < n_pl; ++i) p[i] = (p[i] + table[b + static_cast<size_t>(i)] * ts) * is;
  }
  DeviceArray<float> d_p(projected), d_t(table), d_n(norm);
  CUDA_OK(kernels::launch_gemma4_ple_inputs(d_p.get(), d_t.get(), d_n.get(), rows, n_layer, n_pl,
                                            1e-6f, ps, ts, is, config, nullptr));
  const std::vector<float> got = d_p.download();
  for (size_t i = 0; i < n; ++i)
    ASSERT_NEAR(got[i], expected[i], 1e-5 + 1e-5 * std::fabs(expected[i])) << "at " << i;

  // gelu(gate) * the inputs of layer 3 (a row's inputs n_layer * n_pl apart).
  const std::vector<float> gate = gpu_test::random_floats(static_cast<size_t>(rows * n_pl), rng, 4);
  std::vector<float> want(gate.size());
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < n_pl; ++i) {
      const size_t at = static_cast<size_t>(r * n_pl + i);
      want[at] =
          cpu::gelu_tanh_ggml(gate[at]) * got[static_cast<size_t>((r * n_layer + 3) * n_pl + i)];
    }
  DeviceArray<float> d_g(gate);
  CUDA_OK(kernels::launch_gelu_times(d_g.get(), d_p.get() + 3 * n_pl, n_layer * n_pl, rows, n_pl,
                                     d_g.get(), config, nullptr));
  const std::vector<float> g = d_g.download();
  for (size_t i = 0; i < g.size(); ++i)
    ASSERT_NEAR(g[i], want[i], 2e-3f * std::fabs(want[i]) + 1e-6f) << "gate " << gate[i];
}

// Attention over heads of 512 (Gemma 4's global layers): 4 query heads over 1 KV head, rows of
// 1, 37 and 300 tokens and a padding row, against a double-precision softmax over the same f16
// KV; then with a window of 16 (only the last 16 tokens: the rest of the KV is NaN).
TEST(GemmaOpsKernel, AttentionWideMatchesTheReference) {
  GRANULE_REQUIRE_GPU();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  std::mt19937 rng(12);
  const int hd = 512, n_head = 4, n_kv = 1, rows = 4, tokens = 300;
  const int64_t token_stride = 2 * n_kv * hd + 128, kv_offset = 64;
  for (const int window : {0, 16}) {
    const std::vector<int32_t> lengths = {1, 37, 300, 0}, slots = {0, 1, 2, 0};
    const std::vector<float> q =
        gpu_test::random_floats(static_cast<size_t>(rows * n_head * hd), rng, 0.1f);
    std::vector<std::vector<__half>> kv_host(3);
    std::vector<DeviceArray<__half>> kv;
    std::vector<__half*> bases;
    for (int s = 0; s < 3; ++s) {
      const std::vector<float> x = gpu_test::random_floats(
          static_cast<size_t>(kv_offset + tokens * token_stride), rng, 1.0f);
      std::vector<__half>& h = kv_host[static_cast<size_t>(s)];
      for (size_t i = 0; i < x.size(); ++i) {
        const int64_t token = (static_cast<int64_t>(i) - kv_offset) / token_stride;
        const bool behind = window > 0 && static_cast<int64_t>(i) >= kv_offset &&
                            token < lengths[static_cast<size_t>(s)] - window;
        h.push_back(behind ? __ushort_as_half(0xFFFF) : __float2half_rn(x[i]));
      }
      kv.emplace_back(h);
      bases.push_back(kv.back().get());
    }
    DeviceArray<float> d_q(q), d_out(q.size());
    d_out.poison();
    DeviceArray<int32_t> d_len(lengths), d_slots(slots);
    DeviceArray<__half*> d_base(bases);
    kernels::AttentionArgs a;
    a.q = d_q.get();
    a.q_stride = n_head * hd;
    a.out = d_out.get();
    a.out_stride = n_head * hd;
    a.rows = rows;
    a.n_head = n_head;
    a.n_kv = n_kv;
    a.head_dim = hd;
    a.lengths = d_len.get();
    a.slots = d_slots.get();
    a.slot_base = d_base.get();
    a.token_stride = token_stride;
    a.kv_offset = kv_offset;
    a.scale = 1.0f;
    a.window = window;
    CUDA_OK(kernels::launch_attention_wide(a, config, nullptr));
    const std::vector<float> out = d_out.download();
    for (int r = 0; r < 3; ++r) {
      const int length = lengths[static_cast<size_t>(r)];
      const int first = window > 0 ? std::max(0, length - window) : 0;
      const std::vector<__half>& h = kv_host[static_cast<size_t>(slots[static_cast<size_t>(r)])];
      for (int head = 0; head < n_head; ++head) {
        const float* qh = q.data() + (r * n_head + head) * hd;
        std::vector<double> scores;
        double m = -INFINITY;
        for (int t = first; t < length; ++t) {
          double dot = 0;
          for (int e = 0; e < hd; ++e)
            dot += qh[e] * __half2float(h[static_cast<size_t>(kv_offset + t * token_stride + e)]);
          scores.push_back(dot);
          m = std::max(m, dot);
        }
        double sum = 0;
        for (double& sc : scores) sum += (sc = std::exp(sc - m));
        for (int e = 0; e < hd; ++e) {
          double y = 0;
          for (int t = first; t < length; ++t)
            y += scores[static_cast<size_t>(t - first)] *
                 __half2float(h[static_cast<size_t>(kv_offset + t * token_stride + n_kv * hd + e)]);
          y /= sum;
          ASSERT_NEAR(out[static_cast<size_t>((r * n_head + head) * hd + e)], y,
                      1e-4 + 1e-4 * std::fabs(y))
              << "window " << window << " row " << r << " head " << head << " at " << e;
        }
      }
    }
    // The padding row (length 0) writes nothing.
    for (int i = 0; i < n_head * hd; ++i)
      ASSERT_TRUE(std::isnan(out[static_cast<size_t>(3 * n_head * hd + i)]));
  }
}

}  // namespace
}  // namespace granule
