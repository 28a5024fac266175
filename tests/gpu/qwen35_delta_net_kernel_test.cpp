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
// decode step from those states. Then the kernels launched early (programmatic dependent launch)
// against the same kernels launched plainly, bit for bit, with every input an earlier kernel
// writes copied in late by a writer that lets them start at once (what they request before their
// wait must be the weights, the step inputs and the state only).
#include <cmath>
#include <cstring>
#include <iostream>
#include <random>
#include <tuple>
#include <vector>

#include "backends/cpu/delta_net.h"
#include "backends/cpu/ops.h"
#include "backends/cpu/thread_pool.h"
#include "delta_net.cuh"
#include "gpu_test_support.h"
#include "quantize_activations.cuh"
#include "sync_probe.cuh"

namespace granule {
namespace {

using gpu_test::DeviceArray;

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
float softplus(float x) { return x > 20.0f ? x : std::log(1.0f + std::exp(x)); }
float silu(float x) { return x / (1.0f + std::exp(-x)); }

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }
bool same_bits(float2 a, float2 b) { return same_bits(a.x, b.x) && same_bits(a.y, b.y); }
template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

struct SeqRun {
  int seq;  // index into the test's sequences
  int tokens;
  bool restart = false;  // from position 0 again
};

// A Gated DeltaNet layer for the kernels: 4 taps, 2 key heads and `n_v_heads` value heads of
// `state_size`, its random weights (the convolution's at `conv_scale`) on the host and the
// device.
struct DeltaNetLayer {
  DeltaNetConfig d;
  std::vector<float> conv_weight, dt_bias, a, norm_weight;
  DeviceArray<float> d_conv_weight, d_dt, d_a, d_norm;

  DeltaNetLayer(int state_size, int n_v_heads, std::mt19937& rng, float conv_scale)
      : d(config(state_size, n_v_heads)),
        conv_weight(gpu_test::random_floats(static_cast<size_t>(d.conv_channels() * d.conv_kernel),
                                            rng, conv_scale)),
        dt_bias(gpu_test::random_floats(static_cast<size_t>(n_v_heads), rng, 1.0f)),
        a(minus_exp(gpu_test::random_floats(static_cast<size_t>(n_v_heads), rng, 0.5f))),
        norm_weight(plus_one(gpu_test::random_floats(static_cast<size_t>(state_size), rng, 0.2f))),
        d_conv_weight(conv_weight),
        d_dt(dt_bias),
        d_a(a),
        d_norm(norm_weight) {}

  int64_t slot_floats() const { return d.conv_state_floats() + d.delta_state_floats(); }

 private:
  static DeltaNetConfig config(int state_size, int n_v_heads) {
    DeltaNetConfig d;
    d.conv_kernel = 4;
    d.state_size = state_size;
    d.n_k_heads = 2;
    d.n_v_heads = n_v_heads;
    d.inner_size = d.n_v_heads * d.state_size;
    return d;
  }
  static std::vector<float> minus_exp(std::vector<float> v) {
    for (float& x : v) x = -std::exp(x);
    return v;
  }
  static std::vector<float> plus_one(std::vector<float> v) {
    for (float& x : v) x += 1.0f;
    return v;
  }
};

// One step of `layer` on the device: the rows' positions and slots, the kernels' inputs, their
// outputs and the chunked form's scratch (none poisoned).
struct DeltaNetStep {
  int64_t rows;
  DeviceArray<int32_t> positions, slots;
  DeviceArray<float> mixed, z, beta, alpha, conv_out, out, chunk_scratch, chunk_w;

  DeltaNetStep(const DeltaNetLayer& layer, const std::vector<int32_t>& row_positions,
               const std::vector<int32_t>& row_slots, const std::vector<float>& mixed_in,
               const std::vector<float>& z_in, const std::vector<float>& beta_in,
               const std::vector<float>& alpha_in)
      : rows(static_cast<int64_t>(row_positions.size())),
        positions(row_positions),
        slots(row_slots),
        mixed(mixed_in),
        z(z_in),
        beta(beta_in),
        alpha(alpha_in),
        conv_out(static_cast<size_t>(rows * layer.d.conv_channels())),
        out(static_cast<size_t>(rows * layer.d.value_dim())),
        chunk_scratch(
            static_cast<size_t>(kernels::delta_net_chunk_scratch_floats(rows, layer.d.n_v_heads))),
        chunk_w(static_cast<size_t>(rows * layer.d.value_dim())) {}

  // The kernels' arguments for this step over `state` (slots of layer.slot_floats()); with
  // `chunked`, the chunked form's scratch (else every run token by token).
  kernels::DeltaNetArgs args(const DeltaNetLayer& layer, float* state, bool chunked) const {
    kernels::DeltaNetArgs args;
    args.rows = static_cast<int>(rows);
    args.positions = positions.get();
    args.slots = slots.get();
    args.conv_kernel = static_cast<int>(layer.d.conv_kernel);
    args.state_size = static_cast<int>(layer.d.state_size);
    args.n_k_heads = static_cast<int>(layer.d.n_k_heads);
    args.n_v_heads = static_cast<int>(layer.d.n_v_heads);
    args.conv_weight = layer.d_conv_weight.get();
    args.dt_bias = layer.d_dt.get();
    args.a = layer.d_a.get();
    args.norm_weight = layer.d_norm.get();
    args.state = state;
    args.slot_stride = layer.slot_floats();
    args.mixed = mixed.get();
    args.conv_out = conv_out.get();
    args.beta = beta.get();
    args.alpha = alpha.get();
    args.z = z.get();
    args.out = out.get();
    if (chunked) {
      args.chunk_scratch = chunk_scratch.get();
      args.chunk_w = chunk_w.get();
    }
    return args;
  }
};

class DeltaNetKernel : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(DeltaNetKernel, MatchesTheCpuReferenceOverMixedSteps) {
  GRANULE_REQUIRE_GPU();
  const auto [state_size, chunked] = GetParam();
  std::mt19937 rng(11 + state_size);
  const DeltaNetLayer layer(state_size, 4, rng, 0.5f);
  const DeltaNetConfig& d = layer.d;
  const int64_t C = d.conv_channels(), V = d.value_dim(), nv = d.n_v_heads, S = d.state_size;
  const float eps = 1e-6f;  // DeltaNetArgs' default

  const int32_t slots[3] = {2, 0, 3};  // the sequences' state slots (of 4)
  DeviceArray<float> state(static_cast<size_t>(4 * layer.slot_floats()));
  state.poison();  // a run from position 0 must never read it
  std::vector<std::vector<float>> cpu_conv(3), cpu_delta(3);
  int64_t length[3] = {0, 0, 0};
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
          g[static_cast<size_t>(t * nv + j)] = softplus(alpha[at] + layer.dt_bias[j]) * layer.a[j];
        }
      cpu::delta_net_sequence(d, layer.conv_weight.data(), mixed.data() + first * C, b.data(),
                              g.data(), r.tokens, eps, cpu_conv[r.seq].data(),
                              cpu_delta[r.seq].data(), conv_out.data() + first * C,
                              expected.data() + first * V, pool);
      for (int t = 0; t < r.tokens; ++t)
        for (int64_t j = 0; j < nv; ++j) {
          float* o = expected.data() + (first + t) * V + j * S;
          const float* zz = z.data() + (first + t) * V + j * S;
          cpu::rms_norm(o, layer.norm_weight.data(), o, S, eps);
          for (int64_t e = 0; e < S; ++e) o[e] *= silu(zz[e]);
        }
      length[r.seq] = (r.restart ? 0 : length[r.seq]) + r.tokens;
      first += r.tokens;
    }

    DeltaNetStep on_device(layer, positions, row_slots, mixed, z, beta, alpha);
    on_device.out.poison();
    on_device.chunk_scratch.poison();
    kernels::DeltaNetArgs args = on_device.args(layer, state.get(), chunked);
    // The gated norm's int8 blocks (state sizes of whole blocks), poisoned.
    const bool blocks = S % 32 == 0;
    DeviceArray<int8_t> d_qs(static_cast<size_t>(rows * V));
    DeviceArray<float2> d_ds(static_cast<size_t>(rows * V / 32));
    if (blocks) {
      d_qs.poison();
      d_ds.poison();
      args.out_q8 = {d_qs.get(), d_ds.get()};
    }
    const kernels::KernelConfig config = gpu_test::kernel_config();
    CUDA_OK(kernels::launch_delta_net_conv(args, config, nullptr));
    CUDA_OK(kernels::launch_delta_net_rule(args, config, nullptr));
    const std::vector<float> out = on_device.out.download();
    if (blocks) {  // bit for bit what launch_quantize_q8 makes of the same out
      DeviceArray<int8_t> q_qs(static_cast<size_t>(rows * V));
      DeviceArray<float2> q_ds(static_cast<size_t>(rows * V / 32));
      CUDA_OK(kernels::launch_quantize_q8(on_device.out.get(), static_cast<int>(rows),
                                          static_cast<int>(V), {q_qs.get(), q_ds.get()}, config,
                                          nullptr));
      ASSERT_EQ(d_qs.download(), q_qs.download()) << "step " << step;
      const std::vector<float2> got_ds = d_ds.download(), want_ds = q_ds.download();
      for (size_t i = 0; i < got_ds.size(); ++i)
        ASSERT_TRUE(same_bits(got_ds[i], want_ds[i])) << "step " << step << " block " << i;
    }
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
  std::mt19937 rng(101 + state_size);
  const DeltaNetLayer layer(state_size, 6, rng, 0.5f);
  const int64_t C = layer.d.conv_channels(), V = layer.d.value_dim(), nv = layer.d.n_v_heads;

  constexpr int kSlots = 8;
  const int64_t slot_floats = layer.slot_floats();
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
    const std::vector<float> mixed = gpu_test::random_floats(static_cast<size_t>(rows * C), inputs);
    const std::vector<float> z = gpu_test::random_floats(static_cast<size_t>(rows * V), inputs);
    DeltaNetStep on_device(layer, step.positions, step.slots, mixed, z, beta, alpha);
    on_device.out.poison();
    on_device.chunk_scratch.poison();
    const kernels::DeltaNetArgs args = on_device.args(layer, state.get(), chunked);
    EXPECT_EQ(kernels::launch_delta_net_conv(args, gpu_test::kernel_config(), nullptr),
              cudaSuccess);
    EXPECT_EQ(kernels::launch_delta_net_rule(args, gpu_test::kernel_config(), nullptr),
              cudaSuccess);
    return on_device.out.download();
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

// Inputs that land late: add() poisons dst and stages the values, launch() copies them all in by
// late writers (sync_probe.cuh) launched back to back, so the kernel launched next starts at once,
// long before any of them lands.
class LateInputs {
 public:
  void add(float* dst, const std::vector<float>& values) {
    staging_.emplace_back(values);
    dst_.push_back(dst);
    if (cudaMemset(dst, 0xFF, values.size() * sizeof(float)) != cudaSuccess)
      ADD_FAILURE() << "cudaMemset";
  }
  cudaError_t launch(const kernels::KernelConfig& config) {
    if (const cudaError_t status = cudaDeviceSynchronize(); status != cudaSuccess) return status;
    for (size_t i = 0; i < dst_.size(); ++i)
      if (const cudaError_t status = kernels::launch_late_copy(
              dst_[i], staging_[i].get(), staging_[i].size() * 4, 50000, config, nullptr);
          status != cudaSuccess)
        return status;
    return cudaSuccess;
  }

 private:
  std::vector<DeviceArray<float>> staging_;
  std::vector<float*> dst_;
};

class DeltaNetEarlyRequests : public ::testing::TestWithParam<std::tuple<int, bool>> {};

// A decode-like step (single rows, a run of three rows, a padding row; with `chunked`, also a run
// of 70 rows and the chunked form's scratch) over random states: the convolution, then the rule
// (and the chunked form's kernels) and the gated norm, launched early after late writers of their
// inputs (mixed; conv_out, beta, alpha, z), leave the bits the plain launches leave: conv_out,
// out, the int8 blocks and the whole state.
TEST_P(DeltaNetEarlyRequests, TheStepsInputsAreReadAfterTheWait) {
  GRANULE_REQUIRE_GPU();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  if (!config.early_launch) GTEST_SKIP() << "no programmatic dependent launch on this device";
  kernels::KernelConfig plain_config = config;
  plain_config.early_launch = false;
  const auto [S, chunked] = GetParam();
  std::mt19937 rng(701 + S);
  const DeltaNetLayer layer(S, 4, rng, 1.0f);
  const int64_t C = layer.d.conv_channels(), V = layer.d.value_dim(), nv = layer.d.n_v_heads;
  const std::vector<float> state0 =
      gpu_test::random_floats(static_cast<size_t>(4 * layer.slot_floats()), rng, 0.3f);
  std::vector<int32_t> positions = {40, 17, 18, 19, 0, 5};
  std::vector<int32_t> row_slots = {2, 0, 0, 0, -1, 3};
  if (chunked)
    for (int t = 0; t < 70; ++t) {
      positions.push_back(9 + t);
      row_slots.push_back(1);
    }
  const auto rows = static_cast<int64_t>(positions.size());
  const std::vector<float> mixed = gpu_test::random_floats(static_cast<size_t>(rows * C), rng);
  const std::vector<float> z = gpu_test::random_floats(static_cast<size_t>(rows * V), rng);
  const std::vector<float> beta = gpu_test::random_floats(static_cast<size_t>(rows * nv), rng);
  const std::vector<float> alpha = gpu_test::random_floats(static_cast<size_t>(rows * nv), rng);

  DeviceArray<float> state(state0);
  DeltaNetStep step(layer, positions, row_slots, mixed, z, beta, alpha);
  DeviceArray<int8_t> d_qs(static_cast<size_t>(rows * V));
  DeviceArray<float2> d_ds(static_cast<size_t>(rows * V / 32));
  kernels::DeltaNetArgs args = step.args(layer, state.get(), chunked);
  if (S % 32 == 0) args.out_q8 = {d_qs.get(), d_ds.get()};

  // The plain launches, into outputs poisoned as the early runs' are: the convolution leaves a
  // padding row's conv_out unwritten, so its bits are the poison's in both.
  step.conv_out.poison();
  step.out.poison();
  d_qs.poison();
  d_ds.poison();
  CUDA_OK(kernels::launch_delta_net_conv(args, plain_config, nullptr));
  const std::vector<float> want_conv_out = step.conv_out.download();
  const std::vector<float> want_conv_state = state.download();
  CUDA_OK(kernels::launch_delta_net_rule(args, plain_config, nullptr));
  const std::vector<float> want_out = step.out.download();
  const std::vector<int8_t> want_qs = d_qs.download();
  const std::vector<float2> want_ds = d_ds.download();
  const std::vector<float> want_state = state.download();
  for (float x : want_out) ASSERT_TRUE(std::isfinite(x));

  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE("run " + std::to_string(run));
    state.upload(state0);
    step.conv_out.poison();
    step.out.poison();
    d_qs.poison();
    d_ds.poison();
    LateInputs conv_inputs;
    conv_inputs.add(step.mixed.get(), mixed);
    CUDA_OK(conv_inputs.launch(config));
    CUDA_OK(kernels::launch_delta_net_conv(args, config, nullptr));
    const std::vector<float> got_conv_out = step.conv_out.download();
    for (size_t i = 0; i < got_conv_out.size(); ++i)
      ASSERT_TRUE(same_bits(got_conv_out[i], want_conv_out[i]))
          << "conv_out row " << i / static_cast<size_t>(C) << " channel "
          << i % static_cast<size_t>(C) << ": " << got_conv_out[i] << " against "
          << want_conv_out[i];
    EXPECT_TRUE(same_bits(state.download(), want_conv_state));
    LateInputs rule_inputs;
    rule_inputs.add(step.conv_out.get(), want_conv_out);
    rule_inputs.add(step.z.get(), z);
    rule_inputs.add(step.beta.get(), beta);
    rule_inputs.add(step.alpha.get(), alpha);
    CUDA_OK(rule_inputs.launch(config));
    CUDA_OK(kernels::launch_delta_net_rule(args, config, nullptr));
    const std::vector<float> got_out = step.out.download();
    for (size_t i = 0; i < got_out.size(); ++i)
      ASSERT_TRUE(same_bits(got_out[i], want_out[i]))
          << "row " << i / V << " element " << i % V << ": " << got_out[i] << " against "
          << want_out[i];
    EXPECT_TRUE(same_bits(state.download(), want_state));
    if (S % 32 == 0) {
      EXPECT_EQ(d_qs.download(), want_qs);
      EXPECT_TRUE(same_bits(d_ds.download(), want_ds));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(StateSizes, DeltaNetEarlyRequests,
                         ::testing::Combine(::testing::Values(16, 64, 128), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<int, bool>>& i) {
                           return "S" + std::to_string(std::get<0>(i.param)) +
                                  (std::get<1>(i.param) ? "_chunked" : "_recurrent");
                         });

// The gated attention's prep (norms, rope, KV write) and output gate launched early after late
// writers of Q/gate, K, V and the attention's output: the bits of the plain launches (q, k, the
// KV, the gated output and its int8 blocks, which are launch_quantize_q8's).
TEST(GatedAttentionEarlyRequests, TheStepsInputsAreReadAfterTheWait) {
  GRANULE_REQUIRE_GPU();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  if (!config.early_launch) GTEST_SKIP() << "no programmatic dependent launch on this device";
  kernels::KernelConfig plain_config = config;
  plain_config.early_launch = false;
  const int hd = 128, n_head = 4, n_kv = 2, rope_dims = 64, capacity = 512;
  const std::vector<int32_t> positions = {7, 300, 0};
  const std::vector<int32_t> row_slots = {1, 0, -1};
  const auto rows = static_cast<int64_t>(positions.size());
  const int64_t q_dim = static_cast<int64_t>(n_head) * hd, kv_dim = static_cast<int64_t>(n_kv) * hd;
  const int64_t token_stride = 2 * kv_dim, slot_halves = token_stride * capacity;
  std::mt19937 rng(907);
  const std::vector<float> q_gate =
      gpu_test::random_floats(static_cast<size_t>(rows * 2 * q_dim), rng);
  const std::vector<float> k = gpu_test::random_floats(static_cast<size_t>(rows * kv_dim), rng);
  const std::vector<float> v = gpu_test::random_floats(static_cast<size_t>(rows * kv_dim), rng);
  const std::vector<float> attn = gpu_test::random_floats(static_cast<size_t>(rows * q_dim), rng);
  std::vector<float> q_norm = gpu_test::random_floats(static_cast<size_t>(hd), rng, 0.2f);
  std::vector<float> k_norm = gpu_test::random_floats(static_cast<size_t>(hd), rng, 0.2f);
  for (float& x : q_norm) x += 1.0f;
  for (float& x : k_norm) x += 1.0f;
  std::vector<double> frequencies(static_cast<size_t>(rope_dims / 2));
  for (size_t i = 0; i < frequencies.size(); ++i)
    frequencies[i] =
        i % 5 == 4 ? 0.0 : std::pow(10000.0, -2.0 * static_cast<double>(i) / rope_dims);

  DeviceArray<float> d_q_gate(q_gate), d_k(k), d_v(v), d_attn(attn), d_q_norm(q_norm),
      d_k_norm(k_norm), d_q(static_cast<size_t>(rows * q_dim));
  DeviceArray<double> d_frequencies(frequencies);
  DeviceArray<uint16_t> d_kv(static_cast<size_t>(2 * slot_halves));
  const std::vector<__half*> bases = {reinterpret_cast<__half*>(d_kv.get()),
                                      reinterpret_cast<__half*>(d_kv.get()) + slot_halves};
  DeviceArray<__half*> d_bases(bases);
  DeviceArray<int32_t> d_positions(positions), d_slots(row_slots);
  kernels::GatedAttentionArgs g;
  g.rows = static_cast<int>(rows);
  g.positions = d_positions.get();
  g.slots = d_slots.get();
  g.q_gate = d_q_gate.get();
  g.q = d_q.get();
  g.k = d_k.get();
  g.v = d_v.get();
  g.q_norm = d_q_norm.get();
  g.k_norm = d_k_norm.get();
  g.frequencies = d_frequencies.get();
  g.rope_dims = rope_dims;
  g.n_head = n_head;
  g.n_kv = n_kv;
  g.head_dim = hd;
  g.slot_base = d_bases.get();
  g.token_stride = token_stride;
  g.kv_offset = 0;
  DeviceArray<int8_t> d_qs(static_cast<size_t>(rows * q_dim));
  DeviceArray<float2> d_ds(static_cast<size_t>(rows * q_dim / 32));
  const kernels::ActivationQ8 q8 = {d_qs.get(), d_ds.get()};

  // The plain launches.
  d_q.poison();
  d_kv.poison();
  CUDA_OK(kernels::launch_gated_attention_prep(g, plain_config, nullptr));
  CUDA_OK(kernels::launch_attention_output_gate(
      d_attn.get(), d_q_gate.get(), static_cast<int>(rows), n_head, hd, q8, plain_config, nullptr));
  const std::vector<float> want_q = d_q.download(), want_k = d_k.download(),
                           want_attn = d_attn.download();
  const std::vector<uint16_t> want_kv = d_kv.download();
  const std::vector<int8_t> want_qs = d_qs.download();
  const std::vector<float2> want_ds = d_ds.download();
  for (size_t i = 0; i < want_q.size(); ++i)
    if (i / q_dim < 2) ASSERT_TRUE(std::isfinite(want_q[i])) << i;
  {  // the output gate's int8 blocks are launch_quantize_q8's of its result
    DeviceArray<int8_t> q_qs(static_cast<size_t>(rows * q_dim));
    DeviceArray<float2> q_ds(static_cast<size_t>(rows * q_dim / 32));
    CUDA_OK(kernels::launch_quantize_q8(d_attn.get(), static_cast<int>(rows),
                                        static_cast<int>(q_dim), {q_qs.get(), q_ds.get()}, config,
                                        nullptr));
    EXPECT_EQ(q_qs.download(), want_qs);
    EXPECT_TRUE(same_bits(q_ds.download(), want_ds));
  }

  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE("run " + std::to_string(run));
    d_q.poison();
    d_kv.poison();
    d_qs.poison();
    d_ds.poison();
    LateInputs prep_inputs;
    prep_inputs.add(d_q_gate.get(), q_gate);
    prep_inputs.add(d_k.get(), k);
    prep_inputs.add(d_v.get(), v);
    CUDA_OK(prep_inputs.launch(config));
    CUDA_OK(kernels::launch_gated_attention_prep(g, config, nullptr));
    EXPECT_TRUE(same_bits(d_q.download(), want_q));
    EXPECT_TRUE(same_bits(d_k.download(), want_k));
    EXPECT_EQ(d_kv.download(), want_kv);
    LateInputs gate_inputs;
    gate_inputs.add(d_attn.get(), attn);
    gate_inputs.add(d_q_gate.get(), q_gate);
    CUDA_OK(gate_inputs.launch(config));
    CUDA_OK(kernels::launch_attention_output_gate(
        d_attn.get(), d_q_gate.get(), static_cast<int>(rows), n_head, hd, q8, config, nullptr));
    EXPECT_TRUE(same_bits(d_attn.download(), want_attn));
    EXPECT_EQ(d_qs.download(), want_qs);
    EXPECT_TRUE(same_bits(d_ds.download(), want_ds));
  }
}

}  // namespace
}  // namespace granule
