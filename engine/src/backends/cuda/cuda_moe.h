// A mixture-of-experts model's feed-forward layers on the GPU (issue 36): the routers, the
// experts' weights and where each expert lives, and the kernel sequence of one MoE layer
// (kernels/moe.cuh). Every expert matrix is reached through a device pointer table per layer
// ([3][n_expert]: gate, up, down), so the captured decode graph never changes when experts
// move:
// A layer's shared expert (qwen35moe: every token, scaled by sigmoid(gate · x) where the layer
// has that gate) is resident, read through a one-pointer table by the same kernels as a routed
// expert with one choice per row, and added into the residual after the routed experts.
//   - all experts fit the budget: they are uploaded once to VRAM (charged as resident weights)
//     and the tables point there;
//   - otherwise every expert's bytes are copied once into mapped pinned host memory, and the
//     device holds a cache of as many expert slots as the budget allows (also charged as
//     resident weights, in chunks that release_cache() gives back when the KV needs room);
//     an expert's table entry points at its cache slot or at its host-mapped address. apply()
//     changes which experts are cached, between steps, by copying the newly cached ones into
//     free slots and rewriting the tables on the model's stream. In forward(), after the
//     router, one launch (kernels/moe_stage.cuh, cuda_moe_stage.cpp) copies the experts the
//     step chose that are not cached into a VRAM staging area (charged as staging weights, out
//     of the experts' budget) and writes a step table the products read: they read only VRAM,
//     and an expert several rows chose crosses PCIe once a step.
// Routing counts accumulate on the device ([n_layer][n_expert] int32, inside the graph);
// collect() reads and clears them between steps.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/device_memory.h"
#include "granule/model_config.h"
#include "kernel_config.h"
#include "memory/host_expert_share.h"
#include "moe.cuh"

namespace granule::cpu {
class ThreadPool;
}
namespace granule::kernels {
struct MoeStage;
}

namespace granule::cuda {

// The expert counts since the last collect(), in the shape of the contract's ExpertTelemetry
// (engine/include/granule/telemetry.h once the expert-plan helper lands it).
struct MoeStats {
  int32_t n_layer = 0, n_expert = 0;
  std::vector<uint8_t> resident;   // [layer * n_expert + e]: in VRAM (a cache slot or uploaded)
  std::vector<uint32_t> routed;    // (token, expert) choices
  std::vector<uint32_t> streamed;  // of those, served from host memory
  uint64_t hits = 0, misses = 0;   // choices served from VRAM / from host memory
  // Expert bytes copied over PCIe: gate, up and down of each distinct expert a step's rows chose
  // that was not cached (the staging launch's device count), once per layer and step.
  uint64_t bytes_streamed = 0;
  uint64_t tokens = 0;  // rows routed (choices / n_expert_used)
  // Choices of streamed experts the host's CPU computed instead (host_share()), and the expert
  // bytes it read for them (each distinct expert once per layer and step).
  uint64_t host_choices = 0, host_bytes = 0;
};

class CudaMoe {
 public:
  // What the expert kernels do not cover in this model, or empty: expert block types, gate and
  // up of different types, shapes (also of a shared expert).
  static std::string refusal(const ModelConfig& config, const WeightTable& weights);

  // Uploads the routers, expert biases and shared experts (resident), then the experts: all to VRAM
  // where `expert_budget` bytes hold them, else to mapped pinned host memory with a device cache of
  // as many slots as the budget holds, filled by default_placement(). Sizes the workspace for
  // runs of up to max_rows rows. Throws DeviceError for what refusal() names.
  // host_experts: the host compute of streamed experts (host_share()): -1 the default rule, 0
  // none, 1..256 that share; host_threads its threads (0: the hardware's).
  CudaMoe(const ModelConfig& config, const WeightTable& weights, MemoryManager& memory,
          int max_rows, uint64_t expert_budget, cudaStream_t stream, int host_experts = 0,
          int32_t host_threads = 0);
  CudaMoe(const CudaMoe&) = delete;
  CudaMoe& operator=(const CudaMoe&) = delete;

  // One MoE feed-forward block for rows [0, n_rows): x_f32 / xq are the FFN norm's output (f32
  // and int8 blocks rounded as the RMSNorm kernel rounds), slots the rows' KV slots (padding
  // rows, slot < 0, are not counted), hidden gets the experts' weighted sum added. router_x: the
  // router's own f32 input rows (Gemma 4), or null for x_f32. A layer with expert output scales
  // (Gemma 4's ffn_down_exps.scale) folds each into its choice's weight (moe.cuh).
  // Graph-capturable: every launch reads fixed buffers.
  void forward(int layer, int n_rows, const float* x_f32, kernels::ActivationQ8 xq,
               const int32_t* slots, float* hidden, const kernels::KernelConfig& config,
               cudaStream_t stream, uint64_t* launches, const float* router_x = nullptr);

  // Gemma 4's experts beside the dense FFN (cuda_gemma4.cpp runs the layer): each layer's norm
  // weights as f32 on the device, and workspace of max_rows rows of n_embd f32 each, allocated
  // with the rest of this class's (out of the experts' budget). Null for other models.
  struct Gemma4Layer {
    const float* router_norm = nullptr;  // ffn_gate_inp.scale / sqrt(n_embd): the router's norm
    const float* pre_norm = nullptr;     // pre_ffw_norm_2: the experts' input norm
    const float* post_norm_1 = nullptr;  // post_ffw_norm_1: the dense FFN's output norm
    const float* post_norm_2 = nullptr;  // post_ffw_norm_2: the experts' output norm
  };
  struct Gemma4Workspace {
    float* router_in = nullptr;    // the router's input rows
    float* expert_in = nullptr;    // the experts' input rows (f32; int8 blocks in the model's q8)
    float* dense_out = nullptr;    // the dense FFN's normed output, then the two outputs' sum
    float* experts_out = nullptr;  // the experts' weighted sum (zeroed before each layer)
  };
  const Gemma4Layer& gemma4_layer(int64_t layer) const {
    return gemma4_layers_[static_cast<size_t>(layer)];
  }
  const Gemma4Workspace& gemma4_workspace() const { return gemma4_workspace_; }

  int64_t n_layer() const { return n_layer_; }
  int64_t n_expert() const { return n_expert_; }
  bool all_resident() const { return all_resident_; }
  // Device expert slots (0 when every expert is uploaded).
  int64_t cache_slots() const { return slots_; }
  // One expert's gate + up + down bytes in `layer` (biases excluded: always resident).
  uint64_t expert_bytes(int64_t layer) const { return expert_bytes_[static_cast<size_t>(layer)]; }
  // [layer * n_expert + e]: whether the expert is read from VRAM.
  const std::vector<uint8_t>& resident() const { return resident_; }
  // A placement of up to cache_slots() experts spread evenly over the layers (the lowest
  // indices of each), for the start and until a policy decides.
  std::vector<uint8_t> default_placement() const;
  // Makes exactly the experts marked in `resident` ([n_layer * n_expert]) cached: frees the
  // slots of those no longer marked, copies the newly marked ones into free slots and rewrites
  // the tables, all queued on `stream` after the work already there (call between steps;
  // captured graphs stay valid). Throws UsageError for a wrong size, more experts than slots,
  // or any change when all are resident. Returns the experts copied.
  int apply(const std::vector<uint8_t>& resident, cudaStream_t stream);
  // Gives back whole chunks of the device cache (from the last) until `bytes` are freed or none
  // is left: their experts are read from host memory from then on. Waits for the stream, then
  // rewrites the tables (call between steps; captured graphs stay valid). Returns the bytes
  // freed (0 when every expert is resident: the packed image is not split).
  uint64_t release_cache(uint64_t bytes, cudaStream_t stream);
  // Adds the routing counts since the last collect() to `out` (sized on first use), then clears
  // them on the device. Synchronises the stream.
  void collect(MoeStats& out, cudaStream_t stream);
  // The counts the last collect() read ([n_layer][n_expert]).
  const std::vector<int32_t>& last_counts() const { return counts_host_; }
  // Experts copied into / released from device slots by apply() since construction.
  uint64_t promotions() const { return promotions_; }
  uint64_t demotions() const { return demotions_; }
  // The largest expert_bytes() of any layer.
  uint64_t max_expert_bytes() const;
  // Whether the shared experts' grouped runs take the tiled products (moe_gemm.cu, the default
  // where they cover the types) or, off, launch_moe_*_mma: the same bits per pair, so tests hold
  // the two to each other on the shared experts' own buffers. Call between steps.
  void set_tiled_shared(bool on) { tiled_shared_ = on; }
  bool tiled_shared() const { return tiled_shared_; }

  // Host compute of streamed experts (cuda_moe_host.cpp): when experts stream and their int8
  // copies fit the host's memory, decode runs leave host_share() / 256 of each layer's missed
  // experts that few rows chose to the CPU, which computes them from its own copies while PCIe
  // carries the rest: the staging plan decides which and writes the host's inputs into mapped
  // memory with a request (moe_stage.cuh); a server thread of the host computes them and posts
  // the request back, and a join kernel waits for that before it adds the host's sum into the
  // residual (a spin channel in mapped memory: no host node, no second stream). The setting at
  // load: 0 none (every missed expert is staged: the same bits as all resident); 1..256 that
  // share in runs of up to kHostMaxRows rows; -1 every candidate in runs of kHostAutoMinRows to
  // kHostMaxRows rows, kHostAutoSmallShare of them in smaller runs (memory/host_expert_share.h).
  // host_share() is the share of the larger runs, host_share_at() a run's.
  int host_share() const;
  int host_share_at(int n_rows) const;
  // Whether the host holds the experts' copies (streaming, and they fit its memory).
  bool host_experts() const { return host_compute_ != nullptr; }
  // Throws DeviceError when the host's part of a step failed or a join gave up waiting for it
  // (host_channel.h); the backend checks after every step.
  void check_host() const;
  static constexpr int kHostMaxRows = kHostExpertMaxRows;  // memory/host_expert_share.h
  static constexpr int kHostAutoMinRows = kHostExpertAutoMinRows;
  static constexpr int kHostAutoSmallShare = kHostExpertAutoSmallShare;
  // A missed expert that more pairs chose is staged: one copy serves all its rows, and the
  // device's products take more rows at little more cost, where the host's work grows with them.
  static constexpr int kHostMaxPairs = 4;
  struct HostCompute;  // cuda_moe_host.cpp
  struct HostComputeDelete {
    void operator()(HostCompute* h) const;
  };

  // The staging area's expert slots (cuda_moe_stage.cpp): min(n_expert, max_rows * n_used)
  // when experts stream, else 0; its bytes are staging_slots() * slot_bytes().
  int64_t staging_slots() const { return staging_slots_; }

  // Device bytes of weights this holds (routers, biases, experts or the cache).
  uint64_t device_weight_bytes() const;
  // Bytes of every expert of every layer as laid out here (each matrix 256-byte aligned), and
  // of one cache slot (the largest expert of any layer).
  uint64_t expert_image_bytes() const;
  uint64_t slot_bytes() const { return slot_bytes_; }
  // Weight bytes one row reads per step: every router, n_expert_used experts and the shared
  // expert (where there is one) per layer.
  uint64_t row_read_bytes() const;

 private:
  void upload_routers(const WeightTable& weights);
  void upload_shared(const WeightTable& weights, cpu::ThreadPool& pool);
  // One set of experts of a layer in forward(): the routed ones, or the shared one as a single
  // expert every row chooses with weight 1 or its gate's sigmoid.
  struct ExpertRun {
    kernels::MoeMatrix gate, up, down;
    bool mma_gate_up = false, mma_down = false;
    bool gemm_gate_up = false, gemm_down = false;  // the tiled ones too
    int n_ff = 0, n_expert = 0, n_used = 0;
    kernels::MoeActivation activation = kernels::MoeActivation::Swiglu;
    const int32_t* ids = nullptr;
    const float* weights = nullptr;
    float* h = nullptr;
    kernels::ActivationQ8 hq;
  };
  void run_experts(const ExpertRun& run, int n_rows, const float* x_f32, kernels::ActivationQ8 xq,
                   float* hidden, const kernels::KernelConfig& config, cudaStream_t stream,
                   uint64_t* launches);
  void upload_experts(const ModelConfig& config, const WeightTable& weights, uint64_t expert_budget,
                      cpu::ThreadPool& pool, int host_experts, int32_t host_threads);
  // Staging (cuda_moe_stage.cpp): allocates the area, the step table and the copied-bytes
  // counter (streaming only); returns the area's bytes.
  uint64_t allocate_staging();
  // Queues layer's staging launch and points run's tables at the step table (streaming only);
  // with the host's share (host_runs), its plan (which posts the host's request; x_f32: the
  // experts' input) and the copy, and run's weights the device's.
  void stage(int layer, int n_rows, const float* x_f32, ExpertRun& run,
             const kernels::KernelConfig& config, cudaStream_t stream, uint64_t* launches);
  // Host compute (cuda_moe_host.cpp): sets it up once the experts are in pinned memory (streaming
  // only), returning the device bytes it took, and starts its server thread; whether a run of
  // n_rows uses it; the join that adds the host's sum into hidden; the counts collect() adds.
  uint64_t setup_host(const ModelConfig& config, const WeightTable& weights, int setting,
                      int32_t threads);
  bool host_runs(int n_rows) const;
  // The staging launches' host fields and plan buffer, and run's weights the device's (the
  // host's pairs at 0); only where host_runs.
  void host_stage(int layer, int n_rows, const float* x_f32, kernels::MoeStage& s, ExpertRun& run);
  void host_join(int n_rows, float* hidden, const kernels::KernelConfig& config,
                 cudaStream_t stream, uint64_t* launches);
  void collect_host(MoeStats& out);
  // Queues the copied-bytes counter's download and reset; staged_bytes() reads it once the
  // stream is past them.
  void queue_staged_bytes(cudaStream_t stream);
  uint64_t staged_bytes() const;
  // Matrix m (0 gate, 1 up, 2 down) of expert e of `layer` in host memory, as the host and the
  // device address it.
  const uint8_t* host_matrix(int64_t layer, int64_t e, int m) const;
  // Matrix m of expert e of `layer` in the file mapping (GGUF blocks, file_slab[m] bytes).
  const uint8_t* file_matrix(int64_t layer, int64_t e, int m) const;
  const uint8_t* host_matrix_device(int64_t layer, int64_t e, int m) const;
  void write_tables(cudaStream_t stream);
  // The device address of cache slot `slot` (not all resident).
  uint8_t* slot_address(int64_t slot);
  // Copies expert i (layer * n_expert + e) from the host image into cache slot `slot` on
  // `stream` and records it there.
  void cache_expert(size_t i, int64_t slot, cudaStream_t stream);
  // Where expert e of `layer` sits in the packed expert image (all-resident buffer or host copy).
  uint64_t image_offset(int64_t layer, int64_t e) const {
    return layer_offset_[static_cast<size_t>(layer)] +
           static_cast<uint64_t>(e) * stride_[static_cast<size_t>(layer)];
  }

  struct Layer {
    const void* router = nullptr;
    uint32_t router_type = 0;
    int64_t router_row_bytes = 0;
    const float* router_bias = nullptr;
    const float* expert_scale = nullptr;         // Gemma 4's ffn_down_exps.scale, or none
    kernels::MoeMatrix gate, up, down;           // tables filled by write_tables()
    bool mma_gate_up = false, mma_down = false;  // the tensor-core products cover the types
    // The tiled tensor-core products run them: mma types (cp.async from VRAM: the cache, the
    // all-resident image or the staging area).
    bool gemm_gate_up = false, gemm_down = false;
    uint64_t offsets[3] = {0, 0, 0};  // of gate, up, down inside an expert's image
    // The tensors in the file mapping, and one expert's bytes of each there (GGUF blocks) and
    // as the kernels read them (write_expert_rows).
    const TensorInfo* tensor[3] = {nullptr, nullptr, nullptr};
    uint64_t file_slab[3] = {0, 0, 0};
    uint64_t slab[3] = {0, 0, 0};
    struct Shared {  // the shared expert (n_ff 0: none), resident
      int n_ff = 0;
      kernels::MoeMatrix gate, up, down;  // tables of one pointer each
      bool mma_gate_up = false, mma_down = false, gemm_gate_up = false, gemm_down = false;
      const void* gate_row = nullptr;  // its sigmoid gate (ffn_gate_inp_shexp), or none
      uint32_t gate_row_type = 0;
      int64_t gate_row_bytes = 0;
      uint64_t bytes = 0;  // gate + up + down + the gate row, as read per row
    } shared;
  };

  MemoryManager& memory_;
  int64_t n_layer_ = 0, n_expert_ = 0, n_used_ = 0, n_embd_ = 0, n_ff_ = 0;
  kernels::MoeRouting routing_;
  kernels::MoeActivation activation_ = kernels::MoeActivation::Swiglu;
  int max_rows_ = 0;
  std::vector<Layer> layers_;
  std::vector<uint64_t> expert_bytes_, stride_, layer_offset_;
  bool all_resident_ = true;
  int64_t slots_ = 0;
  uint64_t slot_bytes_ = 0;
  std::vector<uint8_t> resident_;
  std::vector<int64_t> slot_of_;     // [layer * n_expert + e]: its cache slot, -1 none
  std::vector<int64_t> slot_owner_;  // [slot]: layer * n_expert + e, -1 free
  uint64_t promotions_ = 0, demotions_ = 0;

  DeviceBuffer routers_, vectors_;
  std::vector<Gemma4Layer> gemma4_layers_;  // Gemma 4 only (in vectors_)
  Gemma4Workspace gemma4_workspace_;
  DeviceBuffer gemma4_scratch_;          // its four [max_rows][n_embd] f32 buffers
  DeviceBuffer shared_, shared_tables_;  // shared experts and their [n_layer][3] pointers
  int64_t n_ff_shared_ = 0;              // the widest shared expert
  bool tiled_shared_ = true;             // set_tiled_shared()
  DeviceBuffer experts_;                 // all resident: the packed expert image
  // Else the cache slots, slots_per_chunk_ to a chunk (the last may hold fewer).
  static constexpr uint64_t kCacheChunkBytes = uint64_t{64} << 20;
  std::vector<DeviceBuffer> cache_chunks_;
  int64_t slots_per_chunk_ = 1;
  struct HostImage {  // mapped pinned host memory: the packed expert image when streaming
    void* host = nullptr;
    const uint8_t* device = nullptr;
    size_t bytes = 0;
    HostImage() = default;
    HostImage(const HostImage&) = delete;
    HostImage& operator=(const HostImage&) = delete;
    ~HostImage();
  } host_;
  // Staging of streamed experts: staging_slots_ slots of slot_bytes_, the step's [3][n_expert]
  // table, the bytes copied since the last collect() (uint64) and its download.
  int64_t staging_slots_ = 0;
  DeviceBuffer staging_, step_table_, staged_counter_;
  PinnedBuffer staged_pinned_;
  std::unique_ptr<HostCompute, HostComputeDelete> host_compute_;
  DeviceBuffer tables_;  // [n_layer][3][n_expert] device pointers
  PinnedBuffer tables_host_;
  DeviceBuffer counts_;  // [n_layer][n_expert] int32
  std::vector<int32_t> counts_host_;
  PinnedBuffer counts_pinned_;  // collect()'s download, then copied into counts_host_
  // Workspace.
  DeviceBuffer logits_, ids_, weights_, h_, hq_qs_, hq_ds_, y_, order_, tiles_, n_tiles_;
  DeviceBuffer
      route_counter_;  // launch_moe_route's last-block counters (one per 8 rows), left zero
  // The shared expert's choices (expert 0 for every row), weights (ones, or its gate's sigmoid),
  // gate logits and activation.
  DeviceBuffer shared_ids_, shared_ones_, shared_weights_, shared_logits_, shared_h_, shared_hq_qs_,
      shared_hq_ds_;
};

}  // namespace granule::cuda
