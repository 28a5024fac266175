// HostLayers: the CUDA backend's host layers. Under a VRAM budget below the weights, the plan
// (memory/placement.h choose_host_layers) leaves some streamed layers to the host's threads in
// small-batch passes, so that host memory bandwidth adds to PCIe's: the decode step stays one
// captured graph, in which a host node (cudaLaunchHostFunc) runs the CPU backend's own layer code
// (cpu_backend.h forward_layers, on its int8 copies of those layers) on the hidden state, copied
// to pinned host memory and back by copy nodes around it, between the GPU kernels of the layers
// before and after. Prefill and large batches still stream those layers to the GPU, where one
// copy serves many rows.
//
// KV: a host layer's KV lives in two places. A host pass writes it to the CPU backend's own
// KvSpace (host memory, f32), a device pass to the engine's (device, f16). Per slot, each side
// knows through which token it holds every host layer's KV; before a pass, the side that runs it
// is filled from the other where it lags (f16 ↔ f32 through a pinned staging buffer), so a chat
// may prefill on the GPU, decode on the host and prefill again (its next turn) on the GPU.
// Host KV and pinned buffers are charged to the device ledger's HostPinned (not to the budget).
#pragma once
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "backends/backend.h"
#include "backends/cuda/device_memory.h"

namespace granule::cpu {
class CpuBackend;
}

namespace granule::cuda {

// Weight bytes per second the host's `threads` read: the best of a few passes summing a
// 256 MiB buffer, measured once per process (the plan's host bandwidth; 0 when unmeasurable).
double host_read_bandwidth(int32_t threads);

class HostLayers {
 public:
  // Passes of at most this many rows compute the host layers on the host; larger ones stream
  // them (a batch of 16 reads each weight once for 16 rows: the copy wins).
  static constexpr int kMaxRows = 8;
  // What a run of host layers costs a pass beyond their work, for the plan (an estimate, not
  // measured here: a host node's launch, the hidden rows' two copies, the threads waking).
  static constexpr double kNodeSeconds = 50e-6;

  // The host threads computing the layers: the options' CPU threads, else one per core but one.
  static int32_t threads(const BackendOptions& options);

  // Why this model's layers cannot be host layers (empty when they can): the llama family's
  // dense layers with one KV part (no experts, recurrent layers, sliding windows, Gemma).
  static std::string refusal(const ModelConfig& config);

  // `init`'s file, config and weights outlive this; `ledger` is the device's (HostPinned).
  // No layers until set_layers().
  HostLayers(const BackendInit& init, MemoryManager& ledger);
  ~HostLayers();
  HostLayers(const HostLayers&) = delete;
  HostLayers& operator=(const HostLayers&) = delete;

  // The layers the host computes (n_layer entries, a subset of the streamed ones), between
  // steps: the CPU backend is rebuilt with int8 copies of exactly those layers, and every slot's
  // host KV counts as empty (filled from the device KV at the next host pass). Call
  // flush_to_device() first when layers the host held KV for may leave the set.
  void set_layers(const std::vector<bool>& layers);
  bool any() const { return count_ > 0; }
  bool layer(size_t i) const { return i < layers_.size() && layers_[i]; }
  int32_t count() const { return count_; }
  bool attached() const { return host_kv_ != nullptr; }

  // The device KV (the engine's KvSpace on the GPU, one part) and its stream; builds the host
  // KV of the same slots and context. Once, before any pass.
  void attach_kv(KvSpace& device_kv, cudaStream_t stream);

  // The host's measured speed through its layers: seconds per weight byte of one layer's pass
  // over 1, 2, 4 and 8 rows (index log2 rows), the median of a few passes on slot 0 (whose host
  // KV it leaves empty). Between steps, after attach_kv(); all 0 without layers.
  struct Speed {
    double seconds_per_byte[4] = {0, 0, 0, 0};
    double bytes_per_second(int rows) const;  // the smallest row count of at least `rows`
  };
  Speed measure();

  // Between steps, before a pass over these sequences: a host pass maps the host KV through
  // each sequence's end and fills it from the device KV where only the device holds it; a
  // device pass fills the device KV from the host KV where only the host holds it (copies on
  // the stream, waited for). Then records which side the pass writes.
  struct Rows {
    int32_t slot = 0;
    int64_t start = 0, count = 0;
  };
  void before_pass(std::span<const Rows> sequences, bool host_pass);

  // Queues on `stream` (eagerly or into a capture): rows [0, n_rows) of `hidden` (device, n_embd
  // floats per row) and the step's positions and slots (device, `positions` then the slots
  // `row_stride` entries later) to pinned host memory, the host node that runs layers
  // [first, last) on the rows with a slot (padding rows pass untouched), and the rows back.
  // n_rows <= kMaxRows. Returns the operations queued. No allocation: capturable.
  int enqueue(size_t first, size_t last, int n_rows, float* hidden, const int32_t* positions,
              int64_t row_stride, cudaStream_t stream);
  // Throws the error a host node met since the last call (a node cannot throw into CUDA).
  void check();

  // Swapping idle KV: before the device KV of `slot` is copied out, it is completed through
  // `tokens` from the host KV; once copied back in, only the device holds it.
  void complete_device_kv(int32_t slot, int64_t tokens);
  void device_kv_restored(int32_t slot, int64_t tokens);
  // Every slot's device KV completed from the host KV (before the layer set changes).
  void flush_to_device();

  // Telemetry: host passes run and KV tokens copied each way since the start.
  uint64_t passes() const { return passes_.load(std::memory_order_relaxed); }
  uint64_t kv_tokens_to_host() const { return kv_tokens_to_host_; }
  uint64_t kv_tokens_to_device() const { return kv_tokens_to_device_; }

 private:
  struct Call {  // one host node's arguments, at a stable address for the graphs that hold it
    HostLayers* self = nullptr;
    size_t first = 0, last = 0;
    int rows = 0;
  };
  static void CUDART_CB run_node(void* call);
  void run(const Call& call) noexcept;
  // Copies host layers' KV of tokens [first, end) of a slot between the two sides.
  void device_to_host(int32_t slot, int64_t first, int64_t end);
  void host_to_device(int32_t slot, int64_t first, int64_t end);
  void charge_host_kv();

  const ModelFile& file_;
  const ModelConfig& config_;
  const WeightTable& weights_;
  BackendOptions options_;
  MemoryManager& ledger_;                       // the device's: HostPinned
  std::unique_ptr<MemoryManager> host_ledger_;  // the CPU backend's and the host KV's own
  std::unique_ptr<cpu::CpuBackend> cpu_;
  std::unique_ptr<KvSpace> host_kv_;
  KvSpace* device_kv_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::vector<bool> layers_;
  int32_t count_ = 0;
  // Runs of consecutive host layers: their K|V elements are contiguous in a token's record
  // ([first_element, first_element + elements)), and packed back to back in the staging.
  struct Run {
    int64_t first_element = 0, elements = 0;
  };
  std::vector<Run> runs_;
  int64_t run_elements_ = 0;  // Σ elements: one token's host-layer KV
  // Per slot: tokens through which each side holds every host layer's KV.
  std::vector<int64_t> host_valid_, device_valid_;
  // The pinned hidden rows and step rows (positions, slots) the nodes read, and the KV staging.
  PinnedBuffer rows_, staging_;
  int64_t row_stride_ = 0;
  int64_t staging_tokens_ = 0;
  uint64_t charged_pinned_ = 0, charged_kv_ = 0;
  std::map<std::tuple<size_t, size_t, int>, Call> calls_;
  // The node's scratch: the rows with a slot, gathered.
  std::vector<float> gathered_;
  std::vector<int32_t> gathered_slots_, gathered_positions_;
  std::mutex error_mutex_;
  std::string error_;
  std::atomic<uint64_t> passes_{0};
  uint64_t kv_tokens_to_host_ = 0, kv_tokens_to_device_ = 0;
};

}  // namespace granule::cuda
