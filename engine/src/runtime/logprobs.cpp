// token_logprobs: log-softmax in double over the row, then a partial sort for the top ones.
#include "runtime/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace granule {

TokenLogprobs token_logprobs(std::span<const float> row, int32_t token, int32_t top,
                             const Tokenizer& tokenizer) {
  // log p_i = x_i - max - log(sum exp(x_j - max)).
  float max = -std::numeric_limits<float>::infinity();
  for (float x : row) max = std::max(max, x);
  double sum = 0;
  for (float x : row) sum += std::exp(static_cast<double>(x) - max);
  const double log_sum = std::log(sum) + max;
  auto entry = [&](int32_t id) {
    return TokenLogprob{
        id, tokenizer.token_to_piece(id, /*render_special=*/true),
        static_cast<float>(static_cast<double>(row[static_cast<size_t>(id)]) - log_sum)};
  };
  TokenLogprobs out;
  out.chosen = entry(token);
  if (top > 0) {
    std::vector<int32_t> ids(row.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
    const auto n = std::min<size_t>(static_cast<size_t>(top), ids.size());
    // Most likely first; equal logits in id order, as the greedy sampler breaks ties.
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n), ids.end(),
                      [&](int32_t a, int32_t b) {
                        const float xa = row[static_cast<size_t>(a)],
                                    xb = row[static_cast<size_t>(b)];
                        return xa > xb || (xa == xb && a < b);
                      });
    for (size_t i = 0; i < n; ++i) out.top.push_back(entry(ids[i]));
  }
  return out;
}

}  // namespace granule
