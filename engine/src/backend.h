// The Backend interface every compute device implements (CPU reference in cpu/, CUDA in
// cuda/): a batched forward pass over sequence slots whose KV lives in the engine's KvSpace.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "granule/engine.h"
#include "granule/gguf.h"
#include "granule/model_config.h"
#include "granule/sampling.h"
#include "granule/telemetry.h"
#include "kv_space.h"
#include "memory_manager.h"

namespace granule {

// One sequence's share of a forward batch: `tokens` are appended to `slot` at positions
// [start_position, start_position + tokens.size()). KV of [0, start_position) is already
// in the slot; the engine has mapped the slot's KV through the new end before forward().
struct BatchSequence {
  int32_t slot = 0;
  std::span<const int32_t> tokens;
  int64_t start_position = 0;
  bool all_logits = false;  // logits for every token (teacher forcing), not only the last
};

// What a backend needs to build itself. All references outlive the backend.
struct BackendInit {
  const ModelFile& file;
  const ModelConfig& config;
  const WeightTable& weights;
  MemoryManager& memory;  // charge every byte held on the device
  const EngineOptions& options;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "CPU (2 threads)", "CUDA NVIDIA H200".
  virtual std::string name() const = 0;
  virtual bool is_gpu() const = 0;
  // Physical memory of the device (telemetry); 0 when unknown.
  virtual uint64_t device_total_bytes() const = 0;

  // Bytes of one token's K and V over all layers, in the backend's KV element type
  // (f32 on the CPU, f16 on CUDA). Layout per token: [layer][K|V][kv_head][head_dim].
  virtual int64_t kv_bytes_per_token() const = 0;
  // The address space the engine builds its KvSpace on (host VM or CUDA VMM).
  virtual std::unique_ptr<VirtualMemory> make_kv_virtual_memory() = 0;
  // Called once, after the engine has created the KvSpace, before any forward().
  virtual void attach_kv(KvSpace& kv) = 0;

  // Runs the batch. `logits` is resized to rows × n_vocab, rows in batch order: one row per
  // sequence (after its last token), or tokens.size() rows for a sequence with all_logits.
  // Returns the number of rows.
  virtual int64_t forward(std::span<const BatchSequence> batch, std::vector<float>& logits) = 0;

  // Device sampling. A backend that picks tokens where the logits are (the GPU) returns
  // true and overrides forward_sample; the engine then calls it instead of forward() and
  // downloads only token ids. It runs the batch like forward() and returns one token per
  // sequence (after its last token): params[i], history[i] (recent tokens, oldest first,
  // for the penalties) and draw_index[i] (the seeded draw: tokens generated so far, as the
  // host Sampler counts them) belong to batch[i]. The engine ignores the token of a
  // sequence whose prompt is not yet complete.
  virtual bool samples_on_device() const { return false; }
  virtual std::vector<int32_t> forward_sample(std::span<const BatchSequence> batch,
                                              std::span<const SamplingParams> params,
                                              const std::vector<std::vector<int32_t>>& history,
                                              std::span<const uint64_t> draw_index);

  // Adds the backend's own numbers (graphs, streaming) to a snapshot. Default: none.
  virtual void fill_telemetry(TelemetrySnapshot& /*snapshot*/) const {}

  // Host work for the time a step runs on the device (mapping the next step's KV, topping
  // up the granule pool): the engine sets it before forward(). A backend that computes
  // asynchronously runs it once the step is launched (run_step_overlap()); the engine runs
  // it after forward() when the backend did not, so it runs once either way.
  void set_step_overlap(std::function<void()> work) { step_overlap_ = std::move(work); }
  // Runs the work set for this step unless it already ran; clears it.
  void run_step_overlap() {
    if (!step_overlap_) return;
    std::function<void()> work = std::move(step_overlap_);
    step_overlap_ = nullptr;
    work();
  }

 private:
  std::function<void()> step_overlap_;
};

// The KV element each backend stores (kv_bytes_per_token), also known before one is built.
inline constexpr int64_t kCpuKvElementBytes = 4;   // f32
inline constexpr int64_t kCudaKvElementBytes = 2;  // f16

// The CPU reference backend (cpu/cpu_backend.cpp).
std::unique_ptr<Backend> make_cpu_backend(const BackendInit& init);
// Physical host memory: the CPU backend's device memory, and its budget when the options
// give none. 0 when unknown.
uint64_t host_memory_bytes();

#ifdef GRANULE_HAVE_CUDA
// The CUDA backend (cuda/, provided by the CUDA backend's host side). Throws DeviceError
// when no usable GPU is present; Engine::open then falls back to the CPU for Device Auto.
std::unique_ptr<Backend> make_cuda_backend(const BackendInit& init);

// The GPU the CUDA backend would run on, before one is built.
struct CudaDeviceInfo {
  std::string name;                   // "NVIDIA H200"
  uint64_t default_budget_bytes = 0;  // the budget the backend sets when the options give none
};
// Throws DeviceError when no usable GPU is present (as make_cuda_backend does).
CudaDeviceInfo probe_cuda_device();
#endif

}  // namespace granule
