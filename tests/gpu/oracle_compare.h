// The GPU model tests' comparison with the CPU oracle (the CPU backend rounding as the GPU does:
// cpu_emulate_device_numerics) and the plain f32 CPU reference, one rule for every model test
// that uses it (moe_model_gpu_test.cpp, gptoss_gpu_test.cpp), printed one way:
//   - each row within its bound: 1e-3 of the oracle's logit spread plus twice the oracle's own
//     distance from the f32 reference (model_gpu_test.cpp derives it; centred logits, so a
//     constant shift is no error);
//   - `rerouted` rows may be past it: where the experts (or attention's f16 GEMM operands) read
//     int8-rounded activations, an int8 rounding flip (a summation-order difference moving a
//     value across a rounding boundary) moves the next layer's router logits by ~1e-3 of their
//     spread, and a token whose k-th and (k+1)-th experts are that close takes another expert on
//     one side: its row, and a little the rows after it through the KV, then differ by a share of
//     an expert's output, not by rounding. With such inputs up to 1 row in 16 (at least 1) may
//     be past the bound; else none;
//   - the greedy token equal to the oracle's except at near-ties (the oracle's top-two margin
//     within twice the row's bound), at most 4 per 64 rows, rows past the bound excused.
// The line printed names the rows past the bound, so a GPU log tells isolated reroutes (one row,
// or one row and the later rows of its sequence) from a defect (many rows from the start).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "gpu_test_support.h"

namespace granule::gpu_test {

constexpr double kSummationTolerance = 1e-3;
constexpr double kFlipFactor = 2.0;

struct LogitSpread {
  double mean = 0, std = 0;
};
inline LogitSpread spread_of(const float* row, int64_t n) {
  double sum = 0, sum_sq = 0;
  for (int64_t i = 0; i < n; ++i) sum += row[i];
  const double mean = sum / static_cast<double>(n);
  for (int64_t i = 0; i < n; ++i) sum_sq += (row[i] - mean) * (row[i] - mean);
  return {mean, std::sqrt(sum_sq / static_cast<double>(n))};
}
// The largest difference of the centred rows, over `scale`; NaN anywhere is infinite.
inline double centred_error(const float* a, const float* b, int64_t n, double scale) {
  const LogitSpread sa = spread_of(a, n), sb = spread_of(b, n);
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double e = std::fabs((a[i] - sa.mean) - (b[i] - sb.mean));
    worst = std::isnan(e) ? INFINITY : std::max(worst, e);
  }
  return worst / scale;
}

// A row's bound, over the oracle's logit spread: kSummationTolerance plus kFlipFactor times the
// oracle's own (centred) distance from the f32 reference `ref`.
inline double row_bound(const float* oracle, const float* ref, int64_t n, double spread) {
  return kSummationTolerance + kFlipFactor * centred_error(oracle, ref, n, spread);
}

// `gpu` against `oracle` row by row (rows of n_vocab logits), the bound from `ref`; `reroutable`:
// the inputs may reroute tokens (int8-reading experts or f16 GEMM operands), see above.
inline void expect_close_to_oracle(const std::vector<float>& ref, const std::vector<float>& oracle,
                                   const std::vector<float>& gpu, int64_t n_vocab,
                                   const std::string& what, bool reroutable) {
  ASSERT_EQ(gpu.size(), oracle.size()) << what;
  ASSERT_EQ(ref.size(), oracle.size()) << what;
  const int rows = static_cast<int>(oracle.size() / static_cast<size_t>(n_vocab));
  const int rerouted = reroutable ? std::max(1, rows / 16) : 0;
  double worst = 0, worst_ratio = 0;
  int near_ties = 0, mismatches = 0, past_bound = 0;
  std::string past_rows;
  for (int r = 0; r < rows; ++r) {
    const float* o = oracle.data() + static_cast<int64_t>(r) * n_vocab;
    const float* f = ref.data() + static_cast<int64_t>(r) * n_vocab;
    const float* g = gpu.data() + static_cast<int64_t>(r) * n_vocab;
    const double spread = spread_of(o, n_vocab).std;
    const double err = centred_error(g, o, n_vocab, spread);
    const double bound = row_bound(o, f, n_vocab, spread);
    worst = std::max(worst, err);
    worst_ratio = std::max(worst_ratio, err / bound);
    const bool past = !(err <= bound);
    if (past) {
      ++past_bound;
      if (past_bound <= 24) past_rows += " " + std::to_string(r);
    }
    const TopTwo top = top_two({o, static_cast<size_t>(n_vocab)});
    if (top_two({g, static_cast<size_t>(n_vocab)}).best != top.best && !past) {
      if (top.margin <= 2 * bound * spread)
        ++near_ties;
      else
        ++mismatches;
    }
  }
  std::cout << "[gpu-vs-oracle] " << what << ": rows " << rows << ", max |err|/spread " << worst
            << ", worst err/bound " << worst_ratio << ", rows past the bound " << past_bound
            << " (allowed " << rerouted << ")"
            << (past_bound > 0 ? " at" + past_rows + (past_bound > 24 ? " ..." : "") : "")
            << ", greedy mismatches " << mismatches << ", near-ties " << near_ties << "\n";
  EXPECT_LE(past_bound, rerouted) << what << ": logits outside the bound against the oracle";
  EXPECT_EQ(mismatches, 0) << what << ": greedy token differs where the oracle's margin is clear";
  EXPECT_LE(near_ties, (rows + 63) / 64 * 4) << what << ": too many near-ties";
}

}  // namespace granule::gpu_test
