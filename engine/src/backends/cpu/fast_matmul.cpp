// FastMatmul and matmul_together (see fast_matmul.h).
#include "backends/cpu/fast_matmul.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>

#include "backends/cpu/ops.h"
#include "granule/log.h"

namespace granule::cpu {
namespace {

TensorType type_of(const TensorInfo* t) { return static_cast<TensorType>(t->ggml_type); }

}  // namespace

uint64_t memory_available_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    unsigned long long kib = 0;
    if (std::sscanf(line.c_str(), "MemAvailable: %llu kB", &kib) == 1)
      return static_cast<uint64_t>(kib) << 10;
  }
  return 0;
}

uint64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

uint64_t expert_copy_budget(uint64_t available, uint64_t total, uint64_t other_copies) {
  if (available == 0) return total / 2;  // no reading: the old rule, half of the machine
  // Kept back for the KV cache, the workspace and the rest of the system.
  const uint64_t reserve = std::max<uint64_t>(uint64_t{2} << 30, total / 10);
  const uint64_t taken = reserve + other_copies;
  return available > taken ? available - taken : 0;
}

CopyPlan plan_copies(const WeightTable& weights, uint64_t available, uint64_t total) {
  CopyPlan plan;
  auto add = [&](const TensorInfo* w) {
    if (w && w->dims[1] > 0 && Int8Weights::supports(type_of(w), w->dims[0]) &&
        std::find(plan.matrices.begin(), plan.matrices.end(), w) == plan.matrices.end()) {
      plan.matrices.push_back(w);
      plan.matrix_bytes += w->size_bytes;
    }
  };
  for (const LayerWeights& l : weights.layers)
    for (const TensorInfo* w :
         {l.wq, l.wk, l.wv, l.wo, l.w_gate, l.w_up, l.w_down, l.ple_gate, l.ple_proj})
      add(w);
  add(weights.output);
  add(weights.ple_model_proj);
  for (const LayerWeights& l : weights.layers)
    for (const TensorInfo* w : {l.gate_exps, l.up_exps, l.down_exps})
      if (w && w->dims[1] > 0 && w->dims[2] > 0 && Int8Weights::supports(type_of(w), w->dims[0]) &&
          std::find(plan.experts.begin(), plan.experts.end(), w) == plan.experts.end()) {
        plan.experts.push_back(w);
        plan.expert_bytes += w->size_bytes;
      }
  // The copies take about the file's bytes; once made, the experts' pages of the mapping are
  // read no more, so the copies count against the memory available at load (which holds the
  // file's page cache), less the other matrices' copies and a reserve.
  plan.expert_budget = expert_copy_budget(available, total, plan.matrix_bytes);
  return plan;
}

FastMatmul::FastMatmul(const WeightTable& weights, ThreadPool& pool) {
  const CopyPlan plan = plan_copies(weights, memory_available_bytes(), physical_memory_bytes());
  const std::vector<const TensorInfo*>& matrices = plan.matrices;
  // The experts: (tensor, expert) pairs, expert e's matrix the e-th slab of dims[0] × dims[1].
  std::vector<std::pair<const TensorInfo*, int64_t>> slabs;
  if (plan.experts_fit()) {
    for (const TensorInfo* w : plan.experts) {
      experts_[w];
      for (int64_t e = 0; e < w->dims[2]; ++e) slabs.emplace_back(w, e);
    }
  } else {
    logger("engine.cpu")
        ->warn(
            "CPU experts: their int8 copies ({} MiB) do not fit the memory available ({} "
            "MiB after the other weights and a reserve); they run on the exact f32 path, "
            "several times slower",
            plan.expert_bytes >> 20, plan.expert_budget >> 20);
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
