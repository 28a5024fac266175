// The CPU backend's products by weight matrix: the fast path's int8 copies of the matrices
// (Int8Weights, made once at load) with their quantised-input buffer, and several matmuls on
// one input in one parallel loop, each matrix on its int8 copy or on the exact f32 path.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <unordered_map>
#include <vector>

#include "backends/cpu/int8_matmul.h"
#include "backends/cpu/int8_packed.h"
#include "backends/cpu/thread_pool.h"
#include "granule/model_config.h"

namespace granule::cpu {

class FastMatmul {
 public:
  // The int8 copies of every matrix of `weights` that the forward pass multiplies through
  // matmul_together (the layer matrices, Gemma 4's per-layer projections, the head) or MoeFfn
  // (each expert of the 3-D expert tensors, while their copies fit expert_copy_budget) and
  // that the int8 kernels run, made on the pool's threads. Any other matrix takes
  // the exact path.
  FastMatmul(const WeightTable& weights, ThreadPool& pool);

  // w's int8 copy; null where w takes the exact path.
  const Int8Weights* find(const TensorInfo* w) const;
  // The int8 copy of expert e's matrix of a 3-D expert tensor (gate/up/down_exps); null where
  // the experts take the exact path.
  const Int8Weights* find_expert(const TensorInfo* w, int64_t expert) const;
  // The repacked copies' bytes (int8_packed.h: the file's size, the K quants' 3 % more).
  uint64_t packed_bytes() const { return packed_bytes_; }
  std::vector<ActivationBlock>& input() { return input_; }

 private:
  std::unordered_map<const TensorInfo*, Int8Weights> weights_;
  std::unordered_map<const TensorInfo*, std::vector<Int8Weights>> experts_;  // one per expert
  std::vector<ActivationBlock> input_;  // a matmul's input as int8 blocks
  uint64_t packed_bytes_ = 0;
};

// The most bytes the experts' int8 copies may take (all or none): `available` (MemAvailable at
// load; 0 where unknown: half of `total`, the machine's memory) less `other_copies` (the other
// matrices' copies) and a reserve of a tenth of the machine, at least 2 GiB. Experts whose copies
// do not fit take the exact path, which reads each expert from the file mapping when chosen.
uint64_t expert_copy_budget(uint64_t available, uint64_t total, uint64_t other_copies);
// This machine's memory: /proc/meminfo's MemAvailable (free plus what the kernel reclaims
// without swapping, a model file's page cache among it; 0 where it cannot be read), and the
// physical total (0: unknown).
uint64_t memory_available_bytes();
uint64_t physical_memory_bytes();

// What FastMatmul copies: the matrices of `weights` the int8 kernels run (each once, with their
// bytes), the 3-D expert tensors they run (copied per expert slab) with theirs, and whether the
// experts' copies fit expert_copy_budget(available, total, matrix_bytes) (else the experts
// take the exact path). The fit preview asks the same (runtime/fit_estimate.cpp).
struct CopyPlan {
  std::vector<const TensorInfo*> matrices, experts;
  uint64_t matrix_bytes = 0, expert_bytes = 0;
  uint64_t expert_budget = 0;
  bool experts_fit() const { return expert_bytes <= expert_budget; }
};
CopyPlan plan_copies(const WeightTable& weights, uint64_t available, uint64_t total);

struct MatmulTarget {
  const TensorInfo* w;
  float* y;
};
// y = x · wᵀ for every target (rows = dims[1], cols = dims[0], the same cols for all): the
// threads split the targets' rows together, in groups of 8 (the packed layout's), and wait
// once. With `fast` (the fast path), a matrix it holds takes x quantised once to int8 blocks;
// the others, and every matrix without `fast`, take the exact f32 path (ops.h matmul_rows).
void matmul_together(std::initializer_list<MatmulTarget> targets, const float* x, int64_t n_tokens,
                     ThreadPool& pool, FastMatmul* fast);
inline void matmul_weight(const TensorInfo* w, const float* x, int64_t n_tokens, float* y,
                          ThreadPool& pool, FastMatmul* fast) {
  matmul_together({{w, y}}, x, n_tokens, pool, fast);
}

}  // namespace granule::cpu
