// FastMatmul and matmul_together (see fast_matmul.h).
#include "backends/cpu/fast_matmul.h"

#include <unistd.h>

#include <algorithm>
#include <optional>

#include "backends/cpu/ops.h"

namespace granule::cpu {
namespace {

TensorType type_of(const TensorInfo* t) { return static_cast<TensorType>(t->ggml_type); }

// Half of the machine's memory: the most the experts' copies may take. A mixture of experts
// larger than that keeps its experts on the exact path, which reads each expert from the
// mapping only when chosen (a file larger than memory still runs).
uint64_t expert_copy_limit() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) / 2 : 0;
}

}  // namespace

FastMatmul::FastMatmul(const WeightTable& weights, ThreadPool& pool) {
  std::vector<const TensorInfo*> matrices;
  auto add = [&](const TensorInfo* w) {
    if (w && w->dims[1] > 0 && Int8Weights::supports(type_of(w), w->dims[0]) &&
        std::find(matrices.begin(), matrices.end(), w) == matrices.end())
      matrices.push_back(w);
  };
  for (const LayerWeights& l : weights.layers)
    for (const TensorInfo* w :
         {l.wq, l.wk, l.wv, l.wo, l.w_gate, l.w_up, l.w_down, l.ple_gate, l.ple_proj})
      add(w);
  add(weights.output);
  add(weights.ple_model_proj);
  // The experts: (tensor, expert) pairs, expert e's matrix the e-th slab of dims[0] × dims[1].
  std::vector<std::pair<const TensorInfo*, int64_t>> slabs;
  uint64_t expert_bytes = 0;
  for (const LayerWeights& l : weights.layers)
    for (const TensorInfo* w : {l.gate_exps, l.up_exps, l.down_exps})
      if (w && w->dims[1] > 0 && w->dims[2] > 0 && Int8Weights::supports(type_of(w), w->dims[0]) &&
          !experts_.count(w)) {
        experts_[w];
        expert_bytes += w->size_bytes;
        for (int64_t e = 0; e < w->dims[2]; ++e) slabs.emplace_back(w, e);
      }
  if (expert_bytes > expert_copy_limit()) {
    experts_.clear();
    slabs.clear();
  }
  const auto n_matrices = static_cast<int64_t>(matrices.size());
  std::vector<std::optional<Int8Weights>> made(matrices.size() + slabs.size());
  pool.parallel_for(static_cast<int64_t>(made.size()), [&](int64_t begin, int64_t end, int32_t) {
    for (int64_t i = begin; i < end; ++i) {
      if (i < n_matrices) {
        const TensorInfo* w = matrices[static_cast<size_t>(i)];
        made[static_cast<size_t>(i)].emplace(type_of(w), w->data, w->dims[1], w->dims[0]);
      } else {
        const auto [w, e] = slabs[static_cast<size_t>(i - n_matrices)];
        const uint64_t slab_bytes = w->size_bytes / static_cast<uint64_t>(w->dims[2]);
        made[static_cast<size_t>(i)].emplace(
            type_of(w), w->data + slab_bytes * static_cast<uint64_t>(e), w->dims[1], w->dims[0]);
      }
    }
  });
  for (size_t i = 0; i < made.size(); ++i) {
    packed_bytes_ += made[i]->packed_bytes();
    if (i < matrices.size())
      weights_.emplace(matrices[i], std::move(*made[i]));
    else
      experts_[slabs[i - matrices.size()].first].push_back(std::move(*made[i]));
  }
}

const Int8Weights* FastMatmul::find_expert(const TensorInfo* w, int64_t expert) const {
  const auto it = experts_.find(w);
  return it == experts_.end() ? nullptr : &it->second[static_cast<size_t>(expert)];
}

const Int8Weights* FastMatmul::find(const TensorInfo* w) const {
  const auto it = weights_.find(w);
  return it == weights_.end() ? nullptr : &it->second;
}

void matmul_together(std::initializer_list<MatmulTarget> targets, const float* x, int64_t n_tokens,
                     ThreadPool& pool, FastMatmul* fast) {
  const int64_t cols = targets.begin()->w->dims[0];
  constexpr int64_t kGroup = Int8Weights::kGroupRows;
  int64_t total_groups = 0;
  bool any_int8 = false;
  for (const MatmulTarget& t : targets) {
    total_groups += (t.w->dims[1] + kGroup - 1) / kGroup;
    any_int8 = any_int8 || (fast && fast->find(t.w));
  }
  if (any_int8) {
    std::vector<ActivationBlock>& xq = fast->input();
    const int64_t blocks = cols / 32;
    if (xq.size() < static_cast<size_t>(n_tokens * blocks))
      xq.resize(static_cast<size_t>(n_tokens * blocks));
    ActivationBlock* out = xq.data();
    if (n_tokens >= 8) {
      pool.parallel_for(n_tokens, [&](int64_t begin, int64_t end, int32_t) {
        quantize_activations(x + begin * cols, (end - begin) * cols, out + begin * blocks);
      });
    } else {
      quantize_activations(x, n_tokens * cols, out);
    }
  }
  pool.parallel_for(total_groups, [&](int64_t begin, int64_t end, int32_t) {
    int64_t first = 0;  // global index of the current target's group 0
    for (const MatmulTarget& t : targets) {
      const int64_t rows = t.w->dims[1], groups = (rows + kGroup - 1) / kGroup;
      const int64_t lo = std::max(begin, first), hi = std::min(end, first + groups);
      if (lo < hi) {
        const int64_t row_lo = (lo - first) * kGroup;
        const int64_t row_hi = std::min(rows, (hi - first) * kGroup);
        if (const Int8Weights* w8 = any_int8 ? fast->find(t.w) : nullptr)
          w8->matmul_rows(row_lo, row_hi, fast->input().data(), n_tokens, t.y, rows);
        else
          matmul_rows(type_of(t.w), t.w->data, row_lo, row_hi, rows, cols, x, n_tokens, t.y);
      }
      first += groups;
    }
  });
}

}  // namespace granule::cpu
