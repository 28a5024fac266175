// A mixture's experts computed on the host for (row, expert) choices made elsewhere (issue 36):
// the CUDA backend's streamed experts, when the host's memory can compute part of what a step
// would otherwise copy over PCIe. Int8 copies of every expert (the fast path's Int8Weights,
// made once at load from the file's blocks) and, for one layer and a run of rows, the weighted
// sum of the chosen experts' outputs over the choices a mask hands to the host.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backends/cpu/int8_packed.h"
#include "granule/model_config.h"

namespace granule::cpu {

class ThreadPool;

class HostExperts {
 public:
  // Why these experts cannot run here, or empty: a type or width the int8 kernels do not run
  // (Int8Weights::supports), or a layer without experts.
  static std::string refusal(const ModelConfig& config, const WeightTable& weights);

  // Whether a GPU backend's host can compute the experts it streams, given the host memory
  // `available` of `total` (CudaMoe::setup_host, and the fit preview with the host's figures):
  // refusal(), the CUDA plan kernel's 16-byte copies of the input rows (n_embd a multiple of 4),
  // and the experts' int8 copies within expert_copy_budget. `reason` is empty where it can;
  // `memory_short` says the copies are what does not fit (their bytes and the budget beside).
  struct StreamedFit {
    std::string reason;
    bool memory_short = false;
    uint64_t copy_bytes = 0, budget_bytes = 0;
  };
  static StreamedFit streamed_fit(const ModelConfig& config, const WeightTable& weights,
                                  uint64_t available, uint64_t total);

  // Repacks every expert's gate, up and down on the pool's threads. Only where refusal() is
  // empty (throws UsageError otherwise).
  HostExperts(const ModelConfig& config, const WeightTable& weights, ThreadPool& pool);

  // One layer's choices for rows [0, n_rows): ids[r * n_used + j] the j-th expert of row r,
  // weights[...] its weight as the router gave it (Gemma 4's expert scale folded in), x the rows'
  // expert input (n_embd f32 each). For every row,
  //   y[r] = Σ_j w_rj · (down_e(act(gate_e · x_r + bg_e, up_e · x_r + bu_e)) + bd_e),
  // over the j in top-k order whose expert e has host[e] set (0 where none has), each product on
  // the int8 kernels with its input quantised to int8 blocks. Returns the choices computed and
  // the distinct experts read. Does not throw.
  struct Work {
    int64_t pairs = 0, experts = 0;
  };
  Work run(int64_t layer, int64_t n_rows, const float* x, const int32_t* ids, const float* weights,
           const uint8_t* host, float* y, ThreadPool& pool);

  // One expert's gate + up + down bytes in the file (what run() reads per expert).
  uint64_t expert_bytes(int64_t layer) const { return layers_[static_cast<size_t>(layer)].bytes; }
  uint64_t packed_bytes() const { return packed_bytes_; }

 private:
  struct Layer {
    std::vector<Int8Weights> gate, up, down;           // one per expert
    std::vector<float> gate_bias, up_bias, down_bias;  // [e * n]: empty when absent
    uint64_t bytes = 0;
  };
  int64_t n_embd_ = 0, n_ff_ = 0, n_expert_ = 0, n_used_ = 0;
  FfnActivation activation_ = FfnActivation::Swiglu;
  std::vector<Layer> layers_;
  uint64_t packed_bytes_ = 0;
  // Scratch of run(), grown to the largest run.
  std::vector<int32_t> active_, pair_row_, pair_slot_;
  std::vector<int64_t> first_, count_, fill_;
  std::vector<float> gathered_, gate_, up_, hidden_, down_;
  std::vector<ActivationBlock> xq_, hq_;
};

}  // namespace granule::cpu
