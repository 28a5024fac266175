// The CUDA backend: the Backend interface over CudaModel, with each decode step (every
// running sequence one token) captured once per batch size as a CUDA graph and replayed,
// and sampling on the device so that only token ids cross to the host.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/cuda/cuda_model.h"
#include "backends/cuda/device_memory.h"
#include "granule/sampling.h"

namespace granule::cuda {

// True when a CUDA device this build can run on is present; otherwise false and, when why
// is not null, a one-line reason ("no CUDA driver", "no GPU", "compute capability 7.5 ...").
bool cuda_available(std::string* why);

// Pinned host-to-device copy bandwidth of the current device in bytes/s (0 when it cannot
// be measured): the PCIe bound of weight streaming.
double measure_h2d_bandwidth();

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

  // Sampling on the device: one token per sequence (after its last token) comes back. The
  // penalties see the last 256 tokens of each history; top-k keeps at most 256 candidates
  // (top_k = 0 keeps the 256 most likely before top-p and min-p).
  bool samples_on_device() const override { return true; }
  // launch() queues a decode step as one graph replay (captured on first use per batch size
  // and head), or a prefill's first chunk of layers; wait() runs the rest of a prefill and
  // downloads the tokens or logits.
  void launch(const StepRequest& step) override;
  StepResult wait() override;

  CudaModel& model() { return *model_; }
  // Bytes of weights one decode step reads (the roofline numerator).
  uint64_t decode_weight_bytes() const { return model_->decode_weight_bytes(); }

 private:
  enum class Head { Logits, Greedy, Sample };
  // Runs the layers and the head for the uploaded rows: a graph replay for decode steps
  // (captured on first use), else eagerly.
  void run_step(int n_rows, bool decode, Head head);
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
  };

  const ModelConfig& config_;
  const BackendOptions& options_;
  int device_ = 0;
  std::string device_name_;
  uint64_t device_total_bytes_ = 0;
  std::unique_ptr<CudaModel> model_;
  KvSpace* kv_ = nullptr;
  std::map<std::pair<int, Head>, CudaGraph> graphs_;
  uint64_t graph_replays_ = 0;
  std::string last_fallback_reason_;
  PendingStep pending_;
};

}  // namespace granule::cuda
