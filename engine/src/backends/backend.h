// The Backend interface every compute device implements (CPU reference in cpu/, CUDA in
// cuda/): a batched forward pass over sequence slots whose KV lives in the engine's KvSpace.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "granule/gguf.h"
#include "granule/model_config.h"
#include "granule/sampling.h"
#include "granule/telemetry.h"
#include "kernel_config.h"
#include "memory/kv_space.h"
#include "memory/memory_manager.h"

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

// What a backend is told by whoever assembles the runtime (engine/src/runtime/runtime.h): the
// engine's options that reach the device, and nothing of the engine's own.
struct BackendOptions {
  uint64_t vram_budget_bytes = 0;  // 0: the device's free memory minus a margin
  // KV tokens the weight placement leaves room for at load (placement.h's
  // default_kv_reserve_tokens of the engine's context); 0: none.
  int64_t kv_reserve_tokens = 0;
  int64_t context_length = 4096;  // tokens per sequence slot (sizes the attention scratch)
  // The KV's sequence slots (make_runtime sets them): a hybrid model's recurrent state slots,
  // which the weight placement leaves room for; 0: not known, none planned.
  int32_t sequence_slots = 0;
  bool cuda_graphs = true;  // capture and replay decode steps
  int32_t cpu_threads = 0;  // 0: hardware concurrency
  // CUDA backend, a mixture whose experts stream: the share of a decode step's missed experts
  // the host's CPU computes (EngineOptions::host_expert_share).
  int32_t cuda_host_experts = -1;
  // CUDA backend, a dense model whose layers stream: the share of a streamed layer's rows the
  // host's CPU computes at small decode batches (EngineOptions::host_row_share).
  int32_t cuda_host_rows = -1;
  int64_t max_tokens_per_pass = 512;  // the most tokens one forward pass carries
  // The kernels' tuning; unset: the defaults with the GRANULE_* environment overrides
  // (engine/src/backends/kernel_config_env.cpp, listed in kernels/README.md). Tests and benchmarks
  // pin one.
  std::optional<kernels::KernelConfig> kernel_config;
  // Test-only, CPU backend: round where the CUDA backend rounds (cpu_backend.h), so the CPU is
  // an oracle for the GPU's numbers up to f32 summation order. Read with kernel_config (its
  // split_weights decides which types read int8 activations) and max_tokens_per_pass (the
  // GPU's chunking). Off: plain f32, the quality reference.
  bool cpu_emulate_device_numerics = false;
  // Test-only, CPU backend: every matmul on the exact f32 path (decode each row, f32 dots in one
  // fixed order), the quality reference; off: int8 activations where the weight type has
  // kernels (cpu_backend.h). Emulating implies it.
  bool cpu_exact_numerics = false;
  // Test-only, CUDA backend: Gemma 4's per-layer token table in device memory (charged as
  // resident weights) instead of pinned, mapped host memory; the gather reads the same bytes
  // either way (gemma4_gpu_test compares the two).
  bool cuda_ple_table_on_device = false;
};

// What a backend needs to build itself. file, config, weights and memory outlive the backend;
// options lives only through the constructor (make_runtime builds it from the engine options):
// a backend that needs it later keeps a copy.
struct BackendInit {
  const ModelFile& file;
  const ModelConfig& config;
  const WeightTable& weights;
  MemoryManager& memory;  // charge every byte held on the device
  const BackendOptions& options;
};

// One step asked of a backend. Every span (and `logits`) stays valid until wait() returns.
struct StepRequest {
  std::span<const BatchSequence> batch;
  // Device sampling (samples_on_device()): one token per sequence after its last token, with
  // params[i], history[i] (recent tokens, oldest first, for the penalties) and draw_index[i]
  // (the seeded draw: tokens generated so far, as the host Sampler counts them) for batch[i].
  bool sample = false;
  std::span<const SamplingParams> params;
  std::span<const std::vector<int32_t>> history;
  std::span<const uint64_t> draw_index;
  // Device sampling under token masks (samples_with_masks(), structured output): the step's
  // tokens are drawn only once set_token_masks() gave the masks, between launch() and wait().
  bool token_masks = false;
  // Without sampling: resized to rows × n_vocab, rows in batch order: one per sequence (after
  // its last token), or tokens.size() rows for a sequence with all_logits.
  std::vector<float>* logits = nullptr;
};

struct StepResult {
  std::vector<int32_t> tokens;  // with sampling: one per sequence
  int64_t logit_rows = 0;       // without: rows written to the request's logits
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
  // The address space the KvSpace is built on (host VM or CUDA VMM), its fences on the
  // streams the backend's work runs on.
  virtual std::unique_ptr<VirtualMemory> make_kv_virtual_memory() = 0;
  // Called once, after the KvSpace is created, before any launch().
  virtual void attach_kv(KvSpace& kv) = 0;

  // Whether the backend picks tokens where the logits are (the GPU): the engine then asks
  // for sampled steps and downloads only token ids. The engine ignores the token of a
  // sequence whose prompt is not yet complete.
  virtual bool samples_on_device() const { return false; }
  // Whether that sampler also applies token masks (structured output): a step launched with
  // token_masks waits on the device, after its forward pass, for set_token_masks(), which the
  // engine calls between launch() and wait() once the host has computed the masks; each
  // masked row's disallowed logits are -inf before penalties, top-k, top-p and the draw.
  virtual bool samples_with_masks() const { return false; }
  // masks[i]: the bitmask of batch row i (ceil(n_vocab / 32) words, bit set: allowed), or null
  // for a row drawn unmasked. Once per step launched with token_masks; a step waited for
  // without it draws every row unmasked.
  virtual void set_token_masks(std::span<const uint32_t* const> /*masks*/) {}

  // A step is launch(), then wait(). launch() queues the step on the device and returns as
  // soon as it can (a backend that computes on the host may do all the work here); what the
  // engine does before wait() (mapping the next step's KV, topping up the granule pool)
  // overlaps the device's work. wait() returns once the step's results are on the host. One
  // step at a time. Errors may come from either; after an error the step is over.
  virtual void launch(const StepRequest& step) = 0;
  virtual StepResult wait() = 0;

  // launch() + wait() for callers with nothing to overlap (tests, benchmarks, logits_for).
  int64_t forward(std::span<const BatchSequence> batch, std::vector<float>& logits) {
    StepRequest step;
    step.batch = batch;
    step.logits = &logits;
    launch(step);
    return wait().logit_rows;
  }
  std::vector<int32_t> forward_sample(std::span<const BatchSequence> batch,
                                      std::span<const SamplingParams> params,
                                      std::span<const std::vector<int32_t>> history,
                                      std::span<const uint64_t> draw_index) {
    StepRequest step;
    step.batch = batch;
    step.sample = true;
    step.params = params;
    step.history = history;
    step.draw_index = draw_index;
    launch(step);
    return wait().tokens;
  }

  // An idle chat's KV swapped to host memory and back (the engine's kept KV under pressure):
  // copies what a slot's first `tokens` tokens continue from (KvSpace::live_ranges: every
  // part's tokens, a window part's last window - 1; KvSpace::live_bytes in all) to `host`, or
  // from `host` into the slot, whose KV the engine has mapped through them. Between
  // steps only. To host: returns once the copy is complete. From host: queues the copy ahead of
  // the next launch(), which reads it, and returns without waiting for it; `host` stays valid
  // until that step's wait() has returned. Return false, copying nothing, when the backend
  // cannot copy KV (the engine then drops the KV and recomputes it when needed).
  virtual bool copy_kv_to_host(int32_t /*slot*/, int64_t /*tokens*/, void* /*host*/) {
    return false;
  }
  virtual bool copy_kv_from_host(int32_t /*slot*/, const void* /*host*/, int64_t /*tokens*/) {
    return false;
  }
  // Models with recurrent layers (Qwen3.5): the bytes of one slot's recurrent state (0 for
  // others), which goes to host memory with the slot's KV and comes back with it, as the KV
  // copies do (ordered with the steps). copy_state_from_host() also says how many tokens
  // the state covers, so that the next step continues it. False: the backend cannot copy it.
  virtual uint64_t recurrent_state_bytes() const { return 0; }
  virtual bool copy_state_to_host(int32_t /*slot*/, void* /*host*/) { return false; }
  virtual bool copy_state_from_host(int32_t /*slot*/, const void* /*host*/, int64_t /*tokens*/) {
    return false;
  }

  // Adds the backend's own numbers (graphs, streaming) to a snapshot. Default: none.
  virtual void fill_telemetry(TelemetrySnapshot& /*snapshot*/) const {}

  // A mixture-of-experts model's placement now (n_layer, n_expert, resident, expert_bytes) and
  // its counts since the previous call (routed, streamed, hits, misses, bytes_streamed,
  // tokens, promotions, demotions), into `out` (given empty); the engine adds the counts to
  // its totals (ExpertTelemetry::add_interval) each time it builds a snapshot. Between steps
  // only. Default, and for a dense model: leaves `out` empty.
  virtual void collect_expert_telemetry(ExpertTelemetry& /*out*/) {}

  // Weight placement (engine/src/memory/placement.h), between steps only. make_room() frees at
  // least `bytes` in the ledger in one re-plan, moving the fewest trailing resident layers to
  // streaming that free them (the scheduler's pressure policy asks once for a step's whole
  // demand), and returns the bytes it freed; when even streaming every layer would not free
  // `bytes` it moves nothing and returns 0 (as a backend that keeps every weight where it is
  // does). rebalance() re-plans against the ledger's budget after it changed: layers move to
  // streaming when the budget shrank, back to device memory when it grew, leaving free what the
  // KV holds now plus `kv_growth_bytes` (what the scheduler planned the running chats' KV to
  // grow by) where the budget allows, so layers that come back are not sent out again at the
  // next step. Throws CapacityError, changing nothing, when the budget cannot hold the minimum
  // working set beside what the KV holds now.
  virtual uint64_t make_room(uint64_t /*bytes*/, const std::string& /*reason*/) { return 0; }
  virtual void rebalance(const std::string& /*reason*/, uint64_t /*kv_growth_bytes*/) {}
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
  double h2d_bytes_per_second = 0;    // pinned host-to-device copies, measured (64 MiB)
};
// Throws DeviceError when no usable GPU is present (as make_cuda_backend does).
CudaDeviceInfo probe_cuda_device();
// Why the CUDA backend cannot run this model's shapes or tensor types (head size, group size,
// widths, block types), or empty when it can: the check make_cuda_backend() makes at load, so
// the fit preview for Device Auto picks what Engine::open picks.
std::string cuda_model_refusal(const ModelConfig& config, const WeightTable& weights);
#endif

}  // namespace granule
