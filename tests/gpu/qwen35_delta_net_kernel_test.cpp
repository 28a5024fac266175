// The Gated DeltaNet kernels (kernels/delta_net.cuh) against the CPU reference
// (backends/cpu/delta_net.h: cpu::delta_net_sequence, then the gated norm) on random inputs:
// three sequences in non-consecutive state slots, stepped together in batches that mix a prefill
// of 300 tokens with single tokens and runs of 17..130, in changing row order, a padding row,
// and a sequence started over at position 0 (its stale state must not leak in). The state is
// the kernels' own between steps; every step's outputs are compared.
#include <cmath>
#include <random>
#include <vector>

#include "backends/cpu/delta_net.h"
#include "backends/cpu/ops.h"
#include "backends/cpu/thread_pool.h"
#include "delta_net.cuh"
#include "gpu_test_support.h"

namespace granule {
namespace {

using gpu_test::DeviceArray;

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
float softplus(float x) { return x > 20.0f ? x : std::log(1.0f + std::exp(x)); }
float silu(float x) { return x / (1.0f + std::exp(-x)); }

struct SeqRun {
  int seq;  // index into the test's sequences
  int tokens;
  bool restart = false;  // from position 0 again
};

class DeltaNetKernel : public ::testing::TestWithParam<int> {};

TEST_P(DeltaNetKernel, MatchesTheCpuReferenceOverMixedSteps) {
  GRANULE_REQUIRE_GPU();
  DeltaNetConfig d;
  d.conv_kernel = 4;
  d.state_size = GetParam();
  d.n_k_heads = 2;
  d.n_v_heads = 4;
  d.inner_size = d.n_v_heads * d.state_size;
  const int64_t C = d.conv_channels(), V = d.value_dim(), nv = d.n_v_heads, S = d.state_size;
  const float eps = 1e-6f;
  std::mt19937 rng(11 + GetParam());
  const std::vector<float> conv_weight =
      gpu_test::random_floats(static_cast<size_t>(C * 4), rng, 0.5f);
  const std::vector<float> dt_bias = gpu_test::random_floats(static_cast<size_t>(nv), rng, 1.0f);
  std::vector<float> a = gpu_test::random_floats(static_cast<size_t>(nv), rng, 0.5f);
  for (float& x : a) x = -std::exp(x);
  std::vector<float> norm_weight = gpu_test::random_floats(static_cast<size_t>(S), rng, 0.2f);
  for (float& x : norm_weight) x += 1.0f;

  const int32_t slots[3] = {2, 0, 3};  // the sequences' state slots (of 4)
  const int64_t slot_floats = d.conv_state_floats() + d.delta_state_floats();
  DeviceArray<float> state(static_cast<size_t>(4 * slot_floats));
  state.poison();  // a run from position 0 must never read it
  std::vector<std::vector<float>> cpu_conv(3), cpu_delta(3);
  int64_t length[3] = {0, 0, 0};
  DeviceArray<float> d_conv_weight(conv_weight), d_dt(dt_bias), d_a(a), d_norm(norm_weight);
  cpu::ThreadPool pool(2);

  const std::vector<std::vector<SeqRun>> steps = {
      {{0, 300, true}, {1, 1, true}, {2, 37, true}},
      {{0, 1}, {1, 1}, {2, 1}},
      {{1, 130}, {0, 17}},
      {{2, 64}},
      {{0, 1}, {1, 1}, {2, 1}, {-1, 1}},  // and a padding row
      {{1, 5, true}, {0, 2}},
  };
  double worst = 0;
  for (size_t step = 0; step < steps.size(); ++step) {
    std::vector<int32_t> positions, row_slots;
    for (const SeqRun& r : steps[step]) {
      if (r.seq < 0) {
        positions.push_back(0);
        row_slots.push_back(-1);
        continue;
      }
      const int64_t start = r.restart ? 0 : length[r.seq];
      for (int t = 0; t < r.tokens; ++t) {
        positions.push_back(static_cast<int32_t>(start + t));
        row_slots.push_back(slots[r.seq]);
      }
    }
    const auto rows = static_cast<int64_t>(positions.size());
    const std::vector<float> mixed = gpu_test::random_floats(static_cast<size_t>(rows * C), rng);
    const std::vector<float> z = gpu_test::random_floats(static_cast<size_t>(rows * V), rng);
    const std::vector<float> beta = gpu_test::random_floats(static_cast<size_t>(rows * nv), rng);
    const std::vector<float> alpha = gpu_test::random_floats(static_cast<size_t>(rows * nv), rng);

    // The CPU reference, sequence by sequence.
    std::vector<float> expected(static_cast<size_t>(rows * V), 0.0f);
    std::vector<float> conv_out(static_cast<size_t>(rows * C));
    int64_t first = 0;
    for (const SeqRun& r : steps[step]) {
      if (r.seq < 0) {
        first += 1;
        continue;
      }
      if (r.restart) {
        cpu_conv[r.seq].assign(static_cast<size_t>(d.conv_state_floats()), 0.0f);
        cpu_delta[r.seq].assign(static_cast<size_t>(d.delta_state_floats()), 0.0f);
      }
      std::vector<float> b(static_cast<size_t>(r.tokens * nv)), g(b.size());
      for (int t = 0; t < r.tokens; ++t)
        for (int64_t j = 0; j < nv; ++j) {
          const size_t at = static_cast<size_t>((first + t) * nv + j);
          b[static_cast<size_t>(t * nv + j)] = sigmoid(beta[at]);
          g[static_cast<size_t>(t * nv + j)] = softplus(alpha[at] + dt_bias[j]) * a[j];
        }
      cpu::delta_net_sequence(d, conv_weight.data(), mixed.data() + first * C, b.data(), g.data(),
                              r.tokens, eps, cpu_conv[r.seq].data(), cpu_delta[r.seq].data(),
                              conv_out.data() + first * C, expected.data() + first * V, pool);
      for (int t = 0; t < r.tokens; ++t)
        for (int64_t j = 0; j < nv; ++j) {
          float* o = expected.data() + (first + t) * V + j * S;
          const float* zz = z.data() + (first + t) * V + j * S;
          cpu::rms_norm(o, norm_weight.data(), o, S, eps);
          for (int64_t e = 0; e < S; ++e) o[e] *= silu(zz[e]);
        }
      length[r.seq] = (r.restart ? 0 : length[r.seq]) + r.tokens;
      first += r.tokens;
    }

    DeviceArray<int32_t> d_positions(positions), d_slots(row_slots);
    DeviceArray<float> d_mixed(mixed), d_z(z), d_beta(beta), d_alpha(alpha);
    DeviceArray<float> d_conv_out(static_cast<size_t>(rows * C)),
        d_out(static_cast<size_t>(rows * V));
    d_out.poison();
    kernels::DeltaNetArgs args;
    args.rows = static_cast<int>(rows);
    args.positions = d_positions.get();
    args.slots = d_slots.get();
    args.conv_kernel = static_cast<int>(d.conv_kernel);
    args.state_size = static_cast<int>(S);
    args.n_k_heads = static_cast<int>(d.n_k_heads);
    args.n_v_heads = static_cast<int>(nv);
    args.eps = eps;
    args.conv_weight = d_conv_weight.get();
    args.dt_bias = d_dt.get();
    args.a = d_a.get();
    args.norm_weight = d_norm.get();
    args.state = state.get();
    args.slot_stride = slot_floats;
    args.mixed = d_mixed.get();
    args.conv_out = d_conv_out.get();
    args.beta = d_beta.get();
    args.alpha = d_alpha.get();
    args.z = d_z.get();
    args.out = d_out.get();
    CUDA_OK(kernels::launch_delta_net_conv(args, nullptr));
    CUDA_OK(kernels::launch_delta_net_rule(args, nullptr));
    const std::vector<float> out = d_out.download();
    double step_worst = 0;
    for (int64_t r = 0; r < rows; ++r) {
      if (row_slots[static_cast<size_t>(r)] < 0) {
        for (int64_t e = 0; e < V; ++e) ASSERT_EQ(out[static_cast<size_t>(r * V + e)], 0.0f);
        continue;
      }
      for (int64_t e = 0; e < V; ++e) {
        const size_t i = static_cast<size_t>(r * V + e);
        const double err = std::fabs(out[i] - expected[i]) / (1.0 + std::fabs(expected[i]));
        ASSERT_TRUE(std::isfinite(out[i])) << "step " << step << " row " << r;
        step_worst = std::max(step_worst, err);
      }
    }
    worst = std::max(worst, step_worst);
    EXPECT_LT(step_worst, 1e-3) << "state " << S << ", step " << step << " (" << rows << " rows)";
  }
  std::cout << "[delta-net-kernel] state " << S << ": worst |gpu - cpu| / (1 + |cpu|) " << worst
            << "\n";
}

INSTANTIATE_TEST_SUITE_P(StateSizes, DeltaNetKernel, ::testing::Values(16, 32, 64, 128));

}  // namespace
}  // namespace granule
