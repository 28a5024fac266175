// The CUDA backend: the Backend interface over CudaModel, with each decode step (every
// running sequence one token) captured once per batch size as a CUDA graph and replayed,
// and sampling on the device so that only token ids cross to the host.
#pragma once
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/cuda/cuda_model.h"
#include "backends/cuda/device_memory.h"
#include "backends/cuda/graph_cache.h"
#include "backends/cuda/token_masks.h"
#include "memory/expert_placement.h"

namespace granule::cuda {

// True when a CUDA device this build can run on is present; otherwise false and, when why
// is not null, a one-line reason ("no CUDA driver", "no GPU", "compute capability 7.5 ...").
bool cuda_available(std::string* why);

class CudaBackend final : public Backend {
 public:
  // Throws DeviceError when no usable GPU is present (see cuda_available).
  explicit CudaBackend(const BackendInit& init);
  ~CudaBackend() override;

  std::string name() const override;
  bool is_gpu() const override { return true; }
  uint64_t device_total_bytes() const override { return device_total_bytes_; }
  int64_t kv_bytes_per_token() const override;
  std::unique_ptr<VirtualMemory> make_kv_virtual_memory() override;
  void attach_kv(KvSpace& kv) override;
  void fill_telemetry(TelemetrySnapshot& snapshot) const override;
  // A mixture of experts: the placement now and the routing counts since the previous call.
  void collect_expert_telemetry(ExpertTelemetry& out) override;
  uint64_t make_room(uint64_t bytes, const std::string& reason) override;
  void rebalance(const std::string& reason, uint64_t kv_growth_bytes) override;

  // Sampling on the device: one token per sequence (after its last token) comes back. The
  // penalties see the last 256 tokens of each history; top-k keeps at most 256 candidates
  // (top_k = 0 keeps the 256 most likely before top-p and min-p).
  bool samples_on_device() const override { return true; }
  // Token masks: a masked step's graph waits after its head for set_token_masks(), then copies
  // the masks from pinned memory to the device (token_masks.h); its own graph per bucket
  // (Masked* heads), so unmasked steps run as before.
  bool samples_with_masks() const override { return true; }
  void set_token_masks(std::span<const uint32_t* const> masks) override;
  // launch() queues a decode step as one graph replay (captured on first use per batch size
  // and head), or a prefill's first chunk of layers; wait() runs the rest of a prefill and
  // downloads the tokens or logits.
  void launch(const StepRequest& step) override;
  StepResult wait() override;
  // Idle KV to and from host memory: a copy on the model's stream (where every kernel that
  // touches KV runs, so it follows them), then a wait for it.
  bool copy_kv_to_host(int32_t slot, int64_t tokens, void* host) override;
  bool copy_kv_from_host(int32_t slot, const void* host, int64_t tokens) override;
  // Qwen3.5's recurrent state slots (CudaModel::recurrent_state), copied on the model's stream as
  // the KV is; launch() checks that each sequence continues its slot's state (or starts at 0).
  uint64_t recurrent_state_bytes() const override { return model_->recurrent_state_bytes(); }
  bool copy_state_to_host(int32_t slot, void* host) override;
  bool copy_state_from_host(int32_t slot, const void* host, int64_t tokens) override;

  CudaModel& model() { return *model_; }
  // Bytes of weights one decode step reads (the roofline numerator).
  uint64_t decode_weight_bytes() const { return model_->decode_weight_bytes(); }
  // The device's own time per decode step for `rows` sequences: the greedy decode graph of
  // that batch's bucket, captured by an earlier step, replayed `replays` times back to back
  // (the last step's inputs again: the same KV writes) between two events, in seconds per
  // replay. What a step costs beyond it is the host's: upload, replay call, download, wait.
  // -1 where no such graph is captured. Benchmarks only.
  double replay_seconds(int rows, int replays);

 private:
  using Head = StepHead;
  // Runs the layers and the head for the uploaded rows: a graph replay for decode steps
  // (captured on first use per bucket and head), else eagerly. Returns the host-issued
  // operations (1 for a replay).
  uint64_t run_step(int n_rows, bool decode, Head head);
  // Whether that step's graph copies its own inputs and tokens: a captured decode step with a
  // token head (the logits head downloads its logits after the replay).
  bool graph_carries_io(bool decode, Head head) const {
    return decode && options_.cuda_graphs && head != Head::Logits;
  }
  // Token masks: the table sized for a step of `rows` sequences (made or grown here), and the
  // wait-and-mask kernels for `rows` logit rows of the head, from mask row first_mask_row.
  void prepare_token_masks(size_t rows);
  void mask_logits(int rows, int first_mask_row);
  // Records the finished step's time, copies and host-issued operations.
  struct PendingStep;
  void finish_step(const PendingStep& p);
  // A placement change: every graph holds old weight addresses.
  void placement_changed(const std::string& reason);
  // Mixture of experts, between steps: drain_expert_counts() reads the device's routing counts
  // into the telemetry interval and the decayed counts; replan_experts() (from launch(), at
  // most every kExpertReplanSeconds, where experts live in host memory) re-plans the device
  // cache from the decayed counts (plan_expert_placement, sticky) and moves the experts: a
  // table rewrite, so no graph is re-captured.
  void drain_expert_counts();
  void replan_experts();
  // The batch-size bucket a decode step of n sequences is captured for: the next power of two.
  static int bucket_of(int n);
  RowInputs flatten(std::span<const BatchSequence> batch, size_t first_token, size_t count,
                    std::vector<std::pair<size_t, size_t>>* token_index) const;
  // The pending step's sampling parameters and histories of sequences [first, first + count).
  std::vector<kernels::DeviceSamplingParams> device_params(size_t first, size_t count) const;
  std::vector<std::vector<int32_t>> histories(size_t first, size_t count) const;

  // The step between launch() and wait().
  struct PendingStep {
    bool active = false;
    StepRequest step;
    bool decode = false;
    Head head = Head::Logits;
    std::vector<std::pair<size_t, size_t>> token_index;  // (sequence, token) per row
    RowInputs first_chunk;  // a prefill's first chunk, whose layers launch() queued
    StepResult result;
    int bucket = 0;                // decode: the rows the graph runs (padding after batch)
    uint64_t host_operations = 0;  // decode: uploads, launches or replays, downloads
    uint64_t h2d_bytes = 0;
    std::chrono::steady_clock::time_point started;
  };

  const ModelConfig& config_;
  const BackendOptions
      options_;  // a copy: the options the runtime was built from are gone after make_runtime
  int device_ = 0;
  std::string device_name_;
  uint64_t device_total_bytes_ = 0;
  std::unique_ptr<CudaModel> model_;
  KvSpace* kv_ = nullptr;
  MemoryManager* memory_ = nullptr;
  GraphCache graphs_;
  int32_t last_segments_ = 0;
  // Streaming.
  double h2d_bandwidth_ = 0;  // measured once per process (h2d_bandwidth.h)
  uint64_t h2d_bytes_ = 0, replans_ = 0;
  std::string last_replan_reason_;
  double last_step_seconds_ = 0;
  uint64_t last_step_h2d_bytes_ = 0, last_step_tokens_ = 0;
  PendingStep pending_;
  // Hybrid models: the tokens each slot's recurrent state covers once the queued steps ran.
  std::vector<int64_t> state_lengths_;
  // Mixture of experts (cuda_moe.h).
  MoeStats expert_interval_;              // counts since the last collect_expert_telemetry()
  std::vector<uint64_t> expert_decayed_;  // decayed routing counts (expert_placement.h)
  uint64_t expert_promotions_reported_ = 0, expert_demotions_reported_ = 0;
  std::chrono::steady_clock::time_point expert_drained_, expert_replanned_;
  // Structured output: made at the first masked step; graphs hold its addresses, so it only
  // grows (dropping the graphs) when a step has more rows than it.
  std::unique_ptr<TokenMasks> token_masks_;
};

}  // namespace granule::cuda
