// The Gated DeltaNet kernels (kernels/delta_net.cuh) against the CPU reference
// (backends/cpu/delta_net.h: cpu::delta_net_sequence, then the gated norm) on random inputs:
// three sequences in non-consecutive state slots, stepped together in batches that mix a prefill
// of 300 tokens with single tokens and runs of 17..130, in changing row order, a padding row,
// and a sequence started over at position 0 (its stale state must not leak in). The state is
// the kernels' own between steps; every step's outputs are compared. Each state size runs twice:
// token by token only, and with the chunked form's scratch (runs of 64 rows and more chunked).
// Then the chunked form against the recurrent one on the GPU, from a previous turn's state, over
// runs of 1, 63, 64, 65, 500 and 4100 tokens and a fresh one of 130 in one step, in four regimes
// of the gates (decay and beta near 1, near 0, mixed): outputs, the state each leaves, and a
// decode step from those states.
#include <cmath>
#include <iostream>
#include <random>
#include <tuple>
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

class DeltaNetKernel : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(DeltaNetKernel, MatchesTheCpuReferenceOverMixedSteps) {
  GRANULE_REQUIRE_GPU();
  const auto [state_size, chunked] = GetParam();
  DeltaNetConfig d;
  d.conv_kernel = 4;
  d.state_size = state_size;
  d.n_k_heads = 2;
  d.n_v_heads = 4;
  d.inner_size = d.n_v_heads * d.state_size;
  const int64_t C = d.conv_channels(), V = d.value_dim(), nv = d.n_v_heads, S = d.state_size;
  const float eps = 1e-6f;
  std::mt19937 rng(11 + state_size);
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
    DeviceArray<float> d_chunk_scratch(
        static_cast<size_t>(kernels::delta_net_chunk_scratch_floats(rows, nv))),
        d_chunk_w(static_cast<size_t>(rows * V));
    d_chunk_scratch.poison();
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
    if (chunked) {
      args.chunk_scratch = d_chunk_scratch.get();
      args.chunk_w = d_chunk_w.get();
    }
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
    EXPECT_LT(step_worst, 1e-3) << "state " << S << (chunked ? " chunked" : "") << ", step " << step
                                << " (" << rows << " rows)";
  }
  std::cout << "[delta-net-kernel] state " << S << (chunked ? " (chunked runs)" : "")
            << ": worst |gpu - cpu| / (1 + |cpu|) " << worst << "\n";
}

INSTANTIATE_TEST_SUITE_P(StateSizes, DeltaNetKernel,
                         ::testing::Combine(::testing::Values(16, 32, 64, 128), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<int, bool>>& i) {
                           return "S" + std::to_string(std::get<0>(i.param)) +
                                  (std::get<1>(i.param) ? "_chunked" : "_recurrent");
                         });

// The gates of a regime: alpha and beta (before softplus and the sigmoid) shifted.
struct GateRegime {
  const char* name;
  float alpha_shift;  // -10: decay exp(g) near 1; +10: near 0
  float beta_shift;   // +8: beta near 1; -8: near 0
};

class DeltaNetChunked : public ::testing::TestWithParam<std::tuple<int, GateRegime>> {};

// Both forms on two copies of one state: a previous turn (token by token) in six slots, then one
// step of runs of 1, 63, 64, 65, 500 and 4100 tokens continuing them, a padding row and a fresh
// run of 130 in a seventh slot (its stale state poisoned), then a decode step of every slot.
TEST_P(DeltaNetChunked, MatchesTheRecurrentForm) {
  GRANULE_REQUIRE_GPU();
  const auto [state_size, regime] = GetParam();
  DeltaNetConfig d;
  d.conv_kernel = 4;
  d.state_size = state_size;
  d.n_k_heads = 2;
  d.n_v_heads = 6;
  d.inner_size = d.n_v_heads * d.state_size;
  const int64_t C = d.conv_channels(), V = d.value_dim(), nv = d.n_v_heads;
  std::mt19937 rng(101 + state_size);
  const std::vector<float> conv_weight =
      gpu_test::random_floats(static_cast<size_t>(C * 4), rng, 0.5f);
  const std::vector<float> dt_bias = gpu_test::random_floats(static_cast<size_t>(nv), rng, 1.0f);
  std::vector<float> a = gpu_test::random_floats(static_cast<size_t>(nv), rng, 0.5f);
  for (float& x : a) x = -std::exp(x);
  std::vector<float> norm_weight =
      gpu_test::random_floats(static_cast<size_t>(d.state_size), rng, 0.2f);
  for (float& x : norm_weight) x += 1.0f;
  DeviceArray<float> d_conv_weight(conv_weight), d_dt(dt_bias), d_a(a), d_norm(norm_weight);

  constexpr int kSlots = 8;
  const int64_t slot_floats = d.conv_state_floats() + d.delta_state_floats();
  const std::vector<int> lengths = {1, 63, 64, 65, 500, 4100};  // slots 0..5; slot 6 starts anew
  const int fresh_slot = 6, fresh_tokens = 130, previous_tokens = 40;

  struct Step {
    std::vector<int32_t> positions, slots;
  };
  // One step's rows; `chunked` gives the second state the chunked form's scratch.
  auto run = [&](const Step& step, DeviceArray<float>& state, bool chunked) {
    const auto rows = static_cast<int64_t>(step.positions.size());
    std::mt19937 inputs(static_cast<uint32_t>(rows));  // the same inputs for both forms
    std::vector<float> beta = gpu_test::random_floats(static_cast<size_t>(rows * nv), inputs);
    std::vector<float> alpha = gpu_test::random_floats(static_cast<size_t>(rows * nv), inputs);
    for (float& x : beta) x += regime.beta_shift;
    for (float& x : alpha) x += regime.alpha_shift;
    DeviceArray<int32_t> d_positions(step.positions), d_slots(step.slots);
    DeviceArray<float> d_mixed(gpu_test::random_floats(static_cast<size_t>(rows * C), inputs)),
        d_z(gpu_test::random_floats(static_cast<size_t>(rows * V), inputs)), d_beta(beta),
        d_alpha(alpha), d_conv_out(static_cast<size_t>(rows * C)),
        d_out(static_cast<size_t>(rows * V)),
        d_chunk_scratch(static_cast<size_t>(kernels::delta_net_chunk_scratch_floats(rows, nv))),
        d_chunk_w(static_cast<size_t>(rows * V));
    d_out.poison();
    d_chunk_scratch.poison();
    kernels::DeltaNetArgs args;
    args.rows = static_cast<int>(rows);
    args.positions = d_positions.get();
    args.slots = d_slots.get();
    args.conv_kernel = static_cast<int>(d.conv_kernel);
    args.state_size = static_cast<int>(d.state_size);
    args.n_k_heads = static_cast<int>(d.n_k_heads);
    args.n_v_heads = static_cast<int>(nv);
    args.eps = 1e-6f;
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
    if (chunked) {
      args.chunk_scratch = d_chunk_scratch.get();
      args.chunk_w = d_chunk_w.get();
    }
    EXPECT_EQ(kernels::launch_delta_net_conv(args, nullptr), cudaSuccess);
    EXPECT_EQ(kernels::launch_delta_net_rule(args, nullptr), cudaSuccess);
    return d_out.download();
  };
  auto worst_of = [](const std::vector<float>& got, const std::vector<float>& want,
                     const std::vector<int32_t>& slots, int64_t width) {
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (slots[i / static_cast<size_t>(width)] < 0) continue;
      const double err = std::fabs(got[i] - want[i]) / (1.0 + std::fabs(want[i]));
      worst = std::isfinite(got[i]) ? std::max(worst, err) : 1e30;
    }
    return worst;
  };

  // The previous turn, token by token, then its state copied into both.
  DeviceArray<float> recurrent(static_cast<size_t>(kSlots * slot_floats)),
      chunked(static_cast<size_t>(kSlots * slot_floats));
  recurrent.poison();
  Step previous;
  for (int s = 0; s < static_cast<int>(lengths.size()); ++s)
    for (int t = 0; t < previous_tokens; ++t) {
      previous.positions.push_back(t);
      previous.slots.push_back(s);
    }
  run(previous, recurrent, false);
  chunked.upload(recurrent.download());

  Step step;
  for (int s = 0; s < static_cast<int>(lengths.size()); ++s) {
    for (int t = 0; t < lengths[static_cast<size_t>(s)]; ++t) {
      step.positions.push_back(previous_tokens + t);
      step.slots.push_back(s);
    }
    if (s == 2) {  // a padding row between runs
      step.positions.push_back(0);
      step.slots.push_back(-1);
    }
  }
  for (int t = 0; t < fresh_tokens; ++t) {
    step.positions.push_back(t);
    step.slots.push_back(fresh_slot);
  }
  const std::vector<float> want = run(step, recurrent, false);
  const std::vector<float> got = run(step, chunked, true);
  const double out_worst = worst_of(got, want, step.slots, V);
  const std::vector<float> state_want = recurrent.download(), state_got = chunked.download();
  double state_worst = 0;
  for (size_t i = 0; i < state_want.size(); ++i) {
    if (static_cast<int64_t>(i) / slot_floats == kSlots - 1) continue;  // never used
    const double err = std::fabs(state_got[i] - state_want[i]) / (1.0 + std::fabs(state_want[i]));
    state_worst = std::isfinite(state_got[i]) ? std::max(state_worst, err) : 1e30;
  }

  Step decode;
  for (int s = 0; s <= fresh_slot; ++s) {
    decode.positions.push_back(s == fresh_slot ? fresh_tokens
                                               : previous_tokens + lengths[static_cast<size_t>(s)]);
    decode.slots.push_back(s);
  }
  const double decode_worst =
      worst_of(run(decode, chunked, false), run(decode, recurrent, false), decode.slots, V);
  std::cout << "[delta-net-chunked] state " << state_size << ", " << regime.name
            << ": worst |chunked - recurrent| / (1 + |recurrent|): outputs " << out_worst
            << ", state " << state_worst << ", next decode " << decode_worst << "\n";
  EXPECT_LT(out_worst, 1e-3);
  EXPECT_LT(state_worst, 1e-3);
  EXPECT_LT(decode_worst, 1e-3);
}

INSTANTIATE_TEST_SUITE_P(
    StatesAndGates, DeltaNetChunked,
    ::testing::Combine(::testing::Values(16, 64, 128),
                       ::testing::Values(GateRegime{"mixed", 0.0f, 0.0f},
                                         GateRegime{"decay_and_beta_near_1", -10.0f, 8.0f},
                                         GateRegime{"decay_and_beta_near_0", 10.0f, -8.0f},
                                         GateRegime{"decay_near_1", -10.0f, 0.0f})),
    [](const ::testing::TestParamInfo<std::tuple<int, GateRegime>>& i) {
      return "S" + std::to_string(std::get<0>(i.param)) + "_" + std::get<1>(i.param).name;
    });

}  // namespace
}  // namespace granule
