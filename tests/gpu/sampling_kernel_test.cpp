// Device sampling: argmax (lowest id on ties), penalties against the host Sampler (greedy
// after penalties is deterministic, so the tokens must match exactly), and the stochastic
// path against an independent host computation of the filtered distribution: 8192 draws
// from the same logits must land only in the kept set and match its probabilities.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "gpu_test_support.h"
#include "granule/sampling.h"
#include "sampling.cuh"

namespace granule {
namespace {

using gpu_test::DeviceArray;

TEST(ArgmaxKernel, LowestIdWinsTies) {
  GRANULE_REQUIRE_GPU();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  std::mt19937 rng(1);
  const int n_vocab = 49152, rows = 4;
  std::vector<float> logits = gpu_test::random_floats(static_cast<size_t>(rows * n_vocab), rng);
  logits[0 * n_vocab + 40000] = 50.0f;
  logits[1 * n_vocab + 7] = 50.0f;
  logits[1 * n_vocab + 3] = 50.0f;  // tie: 3 wins
  logits[2 * n_vocab + n_vocab - 1] = 50.0f;
  std::fill(logits.begin() + 3 * n_vocab, logits.end(), -1.0f);  // all equal: 0 wins
  DeviceArray<float> d_logits(logits);
  DeviceArray<int32_t> d_tokens(rows);
  DeviceArray<unsigned long long> d_best(std::vector<unsigned long long>(rows, 0));
  DeviceArray<int> d_counters(std::vector<int>(rows, 0));
  for (int launch = 0; launch < 2; ++launch) {  // the scratch must be left ready for reuse
    d_tokens.poison();
    CUDA_OK(kernels::launch_argmax(d_logits.get(), n_vocab, rows, n_vocab, d_tokens.get(),
                                   {d_best.get(), d_counters.get()}, config, nullptr));
    EXPECT_EQ(d_tokens.download(), (std::vector<int32_t>{40000, 3, n_vocab - 1, 0}))
        << "launch " << launch;
  }
  EXPECT_EQ(d_counters.download(), std::vector<int>(rows, 0));
}

// launch_sampling over rows of n_vocab logits, one DeviceSamplingParams per row, and the rows'
// histories (history_stride apart; none where empty): the token of each row.
std::vector<int32_t> sample_on_gpu(const std::vector<float>& logits, int n_vocab,
                                   const std::vector<kernels::DeviceSamplingParams>& params,
                                   const std::vector<int32_t>& history = {}, int history_stride = 0,
                                   const std::vector<int32_t>& history_length = {}) {
  const int rows = static_cast<int>(params.size());
  DeviceArray<float> d_logits(logits);
  DeviceArray<kernels::DeviceSamplingParams> d_params(params);
  DeviceArray<int32_t> d_history(history.empty() ? std::vector<int32_t>(1, 0) : history);
  DeviceArray<int32_t> d_length(history_length.empty() ? std::vector<int32_t>(rows, 0)
                                                       : history_length);
  DeviceArray<int32_t> d_tokens(rows);
  d_tokens.poison();
  kernels::SamplingArgs a;
  a.logits = d_logits.get();
  a.logits_stride = n_vocab;
  a.rows = rows;
  a.n_vocab = n_vocab;
  a.params = d_params.get();
  a.history = d_history.get();
  a.history_stride = history_stride;
  a.history_length = d_length.get();
  a.tokens = d_tokens.get();
  EXPECT_EQ(kernels::launch_sampling(a, nullptr), cudaSuccess);
  return d_tokens.download();
}

TEST(SamplingKernel, GreedyWithPenaltiesMatchesHostSampler) {
  GRANULE_REQUIRE_GPU();
  std::mt19937 rng(2);
  const int n_vocab = 3000, rows = 6;
  std::vector<float> logits =
      gpu_test::random_floats(static_cast<size_t>(rows * n_vocab), rng, 2.0f);
  std::vector<std::vector<int32_t>> history(rows);
  std::vector<kernels::DeviceSamplingParams> params(rows);
  std::vector<int32_t> expected(rows);
  const int history_stride = 128;
  std::vector<int32_t> history_flat(static_cast<size_t>(rows * history_stride), 0),
      history_length(rows);
  for (int r = 0; r < rows; ++r) {
    // The history holds the current top tokens, some repeated, so the penalties change the winner.
    std::vector<int32_t> order(n_vocab);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](int a, int b) { return logits[r * n_vocab + a] > logits[r * n_vocab + b]; });
    for (int i = 0; i < 40; ++i) history[r].push_back(order[i % 12]);
    SamplingParams host = SamplingParams::greedy();
    host.repetition_penalty = 1.0f + 0.3f * r;
    host.frequency_penalty = r % 2 ? 0.2f : 0.0f;
    host.presence_penalty = r % 3 ? 0.5f : 0.0f;
    host.penalty_last_n = 16 + 8 * r;
    Sampler sampler(host);
    expected[r] =
        sampler.sample(std::span<const float>(logits.data() + r * n_vocab, n_vocab), history[r]);
    kernels::DeviceSamplingParams& p = params[r];
    p.temperature = 0.0f;
    p.repetition_penalty = host.repetition_penalty;
    p.frequency_penalty = host.frequency_penalty;
    p.presence_penalty = host.presence_penalty;
    p.penalty_last_n = host.penalty_last_n;
    std::copy(history[r].begin(), history[r].end(), history_flat.begin() + r * history_stride);
    history_length[r] = static_cast<int32_t>(history[r].size());
  }
  EXPECT_EQ(sample_on_gpu(logits, n_vocab, params, history_flat, history_stride, history_length),
            expected);
}

// The distribution after top-k, temperature, top-p and min-p, computed independently.
std::vector<double> filtered_distribution(const std::vector<float>& logits,
                                          const kernels::DeviceSamplingParams& p) {
  const int n = static_cast<int>(logits.size());
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  const int k = std::min(n, p.top_k > 0 ? std::min(p.top_k, kernels::kMaxSamplingCandidates)
                                        : kernels::kMaxSamplingCandidates);
  std::vector<double> w(k);
  double total = 0;
  for (int i = 0; i < k; ++i)
    total += w[i] = std::exp((logits[order[i]] - logits[order[0]]) / p.temperature);
  int kept = k;
  double cumulative = 0;
  for (int i = 0; i < k; ++i) {
    cumulative += w[i];
    if (cumulative >= p.top_p * total) {
      kept = i + 1;
      break;
    }
  }
  int m = 1;
  while (m < kept && w[m] >= p.min_p * w[0]) ++m;
  kept = m;
  std::vector<double> dist(n, 0.0);
  double kept_total = 0;
  for (int i = 0; i < kept; ++i) kept_total += w[i];
  for (int i = 0; i < kept; ++i) dist[order[i]] = w[i] / kept_total;
  return dist;
}

TEST(SamplingKernel, DrawsFollowTheFilteredDistribution) {
  GRANULE_REQUIRE_GPU();
  std::mt19937 rng(3);
  const int n_vocab = 5000, rows = 8192;
  const std::vector<float> base = gpu_test::random_floats(static_cast<size_t>(n_vocab), rng, 2.5f);
  for (const auto& [top_k, top_p, min_p] :
       {std::tuple{40, 0.9f, 0.05f}, std::tuple{0, 0.95f, 0.0f}, std::tuple{5, 1.0f, 0.0f}}) {
    kernels::DeviceSamplingParams p;
    p.temperature = 0.8f;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.seed = 1234;
    std::vector<float> logits;
    std::vector<kernels::DeviceSamplingParams> params(rows, p);
    for (int r = 0; r < rows; ++r) {
      logits.insert(logits.end(), base.begin(), base.end());
      params[r].step = static_cast<uint64_t>(r);
    }
    const std::vector<int32_t> tokens = sample_on_gpu(logits, n_vocab, params);
    const std::vector<double> dist = filtered_distribution(base, p);
    std::vector<int> counts(n_vocab, 0);
    for (int32_t t : tokens) {
      ASSERT_GE(t, 0);
      ASSERT_LT(t, n_vocab);
      ASSERT_GT(dist[t], 0.0) << "token " << t << " is outside the kept set (top_k " << top_k
                              << ")";
      ++counts[t];
    }
    for (int t = 0; t < n_vocab; ++t) {
      if (dist[t] == 0) continue;
      const double expected = dist[t] * rows, sigma = std::sqrt(rows * dist[t] * (1 - dist[t])) + 1;
      EXPECT_NEAR(counts[t], expected, 5 * sigma) << "token " << t << " top_k " << top_k;
    }
  }
}

TEST(SamplingKernel, SameSeedAndStepGiveTheSameToken) {
  GRANULE_REQUIRE_GPU();
  std::mt19937 rng(4);
  const int n_vocab = 1000, rows = 4;
  const std::vector<float> base = gpu_test::random_floats(static_cast<size_t>(n_vocab), rng);
  std::vector<float> logits;
  for (int r = 0; r < rows; ++r) logits.insert(logits.end(), base.begin(), base.end());
  kernels::DeviceSamplingParams p;
  p.temperature = 1.5f;
  p.top_k = 200;
  p.seed = 99;
  std::vector<kernels::DeviceSamplingParams> params(rows, p);
  params[2].step = params[3].step = 17;
  const std::vector<int32_t> t = sample_on_gpu(logits, n_vocab, params);
  EXPECT_EQ(t[0], t[1]);
  EXPECT_EQ(t[2], t[3]);
}

}  // namespace
}  // namespace granule
