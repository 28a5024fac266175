// HostRows (issue 41): at small decode batches the host's CPU computes the last rows of each
// matrix of a streamed dense layer from its own int8 copy (cpu::Int8Weights) while PCIe carries
// only the first rows, so a step costs the slower of the two instead of the link alone. This
// file holds the copies, the share (measured at load or given), the rows the streamer still
// copies, and the host's jobs; CudaModel (cuda_host_rows.cpp) runs the device's side of a
// layer's four rounds through a HostChannel.
#pragma once
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "backends/cpu/int8_packed.h"
#include "backends/cpu/thread_pool.h"
#include "backends/cuda/host_channel.h"
#include "backends/cuda/weight_streamer.h"
#include "granule/model_config.h"
#include "memory/weight_layout.h"

namespace granule::cuda {

class HostRows {
 public:
  // Runs of at most this many rows split their streamed layers (decode batches; more rows
  // amortise a full copy over the batch and take the ordinary path).
  static constexpr int kMaxRows = 8;
  // A layer's seven products in the weight layout's order (LayerWeightLayout::matrices).
  static constexpr int kMatrices = kDenseMatrices;
  enum Matrix { kQ = 0, kK, kV, kO, kGate, kUp, kDown };
  // The four rounds of a split layer, each one post and one join: Q/K/V from the attention
  // norm, O from attention, gate/up (the host answers SwiGLU's h) from the FFN norm, down
  // from h.
  enum Round : uint32_t { kQkv = 0, kOut, kGateUp, kDownRound, kRounds };

  // One matrix of a split layer: the host computes rows [first, rows) from `copy`; first ==
  // rows (no copy) where the host takes no part of it.
  struct Part {
    int64_t rows = 0, cols = 0, first = 0;
    std::unique_ptr<cpu::Int8Weights> copy;
    bool split() const { return copy != nullptr; }
  };

  // Why a model's layers are never split ("" where they may be): mixtures of experts, Qwen3.5,
  // Gemma's layers, other activations than SwiGLU, an output bias.
  static std::string refusal(const ModelConfig& config, const WeightTable& weights);

  // Copies for the layers `streamer` streams now, at `setting` (EngineOptions::host_row_share:
  // -1 measured from pcie_bytes_per_second and a timed product, 1..256 given). Null where
  // nothing is split (setting 0, a refusal, no layer streamed, no matrix the CPU's int8
  // kernels take). threads: the host's pool including its server thread (0: all cores but one,
  // which the engine's thread keeps).
  static std::unique_ptr<HostRows> create(const ModelConfig& config, const WeightTable& weights,
                                          const WeightLayout& layout,
                                          const WeightStreamer& streamer, MemoryManager& memory,
                                          int setting, int32_t threads,
                                          double pcie_bytes_per_second);
  ~HostRows();

  int share() const { return share_; }
  bool splits(size_t layer) const { return layer < layers_.size() && layers_[layer].any; }
  const Part& part(size_t layer, int matrix) const {
    return layers_[layer].parts[static_cast<size_t>(matrix)];
  }
  // The parts of a layer's blob (laid out as `layout`) the streamer copies on a split pass: each
  // matrix's first rows (the whole matrix where the host takes none of it).
  std::vector<BlobRange> device_ranges(size_t layer, const LayerWeightLayout& layout) const;
  // Where a matrix's answer starts in a round's result rows (floats), for `rows` rows.
  int64_t answer_offset(size_t layer, int matrix, int rows) const;
  HostChannel& channel() { return *channel_; }
  // The job a round's post carries.
  static uint32_t job(size_t layer, Round round) {
    return static_cast<uint32_t>(layer) * kRounds + round;
  }
  // Bytes of the host's int8 copies, and the weight bytes the host reads in place of PCIe on
  // one split pass (the streamed layers' rows it computes, as the device lays them out).
  uint64_t copy_bytes() const { return copy_bytes_; }
  uint64_t host_bytes_per_pass() const { return host_bytes_per_pass_; }
  // Rounds the host has answered since load.
  uint64_t rounds() const { return channel_->jobs(); }

 private:
  struct Layer {
    std::array<Part, kMatrices> parts;
    std::array<uint64_t, kMatrices> device_row_bytes{};  // per matrix: bytes of one device row
    bool any = false;
  };
  HostRows() = default;
  void run(uint32_t job, int rows, const float* x, float* y);
  // Products of `count` parts over the quantised rows in xq_, each into its answer (y + offsets).
  void products(const Layer& l, const int* matrices, int count, int rows, float* y,
                const int64_t* offsets);

  int64_t n_embd_ = 0, q_dim_ = 0, n_ff_ = 0;
  std::vector<Layer> layers_;
  int share_ = 0;
  uint64_t copy_bytes_ = 0, host_bytes_per_pass_ = 0;
  std::unique_ptr<cpu::ThreadPool> pool_;
  std::vector<cpu::ActivationBlock> xq_;
  // A gate/up round's gate rows, then (kMaxRows * n_ff_ floats in) its up rows.
  std::vector<float> gate_up_;
  std::unique_ptr<HostChannel> channel_;  // last: its server thread runs run() until it stops
};

}  // namespace granule::cuda
