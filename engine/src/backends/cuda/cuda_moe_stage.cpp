// CudaMoe's staging of streamed experts (issue 36): when part of the experts sit in mapped
// pinned host memory, each layer's step copies the experts its rows chose that are not cached
// into a VRAM staging area (kernels/moe_stage.cuh, one launch after the router), and the expert
// products read them there through a step table. The area holds min(n_expert, max_rows x
// n_used) expert slots: every distinct expert a run of max_rows rows can choose in one layer.
// One area serves every layer (the layers run in order on one stream: the staging launch of
// layer l + 1 waits for layer l's products, which read the area last). It cannot start sooner:
// layer l + 1's choices are known only after its router, which reads layer l's output.
#include <algorithm>
#include <cstring>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_moe.h"
#include "granule/log.h"
#include "moe_stage.cuh"

namespace granule::cuda {

namespace k = granule::kernels;

uint64_t CudaMoe::allocate_staging() {
  if (all_resident_) return 0;
  staging_slots_ = std::min<int64_t>(n_expert_, static_cast<int64_t>(max_rows_) * n_used_);
  staging_ = DeviceBuffer(memory_, MemoryCategory::WeightsStaging,
                          static_cast<size_t>(staging_slots_) * slot_bytes_);
  step_table_ = DeviceBuffer(memory_, MemoryCategory::Workspace,
                             static_cast<size_t>(3 * n_expert_) * sizeof(void*));
  staged_counter_ = DeviceBuffer(memory_, MemoryCategory::Workspace, sizeof(uint64_t));
  check_cuda(cudaMemset(staged_counter_.get(), 0, sizeof(uint64_t)), "cudaMemset");
  staged_pinned_ = PinnedBuffer(sizeof(uint64_t));
  std::memset(staged_pinned_.as<uint64_t>(), 0, sizeof(uint64_t));
  logger("engine.cuda")
      ->info("CUDA experts: {} staging slots ({} MiB) for the step's streamed experts",
             staging_slots_, staging_.bytes() >> 20);
  return staging_.bytes();
}

void CudaMoe::stage(int layer, int n_rows, const float* x_f32, ExpertRun& run,
                    const k::KernelConfig& config, cudaStream_t stream, uint64_t* launches) {
  if (all_resident_) return;
  const Layer& d = layers_[static_cast<size_t>(layer)];
  k::MoeStage s;
  s.table = d.gate.table;  // the layer's [3][n_expert] (write_tables)
  s.step = step_table_.as<const void*>();
  s.host_begin = host_.device;
  s.host_end = host_.device + host_.bytes;
  s.staging = staging_.as<uint8_t>();
  s.slot_bytes = slot_bytes_;
  s.capacity = static_cast<int>(staging_slots_);
  for (int m = 0; m < 3; ++m) s.offsets[m] = d.offsets[m];
  // Through down's last byte, in whole 16-byte loads: within the expert's stride (each matrix
  // keeps kTensorSlackBytes after it), so within the host image and the slot.
  s.copy_bytes = (d.offsets[2] + d.slab[2] + 15) / 16 * 16;
  s.expert_bytes = expert_bytes_[static_cast<size_t>(layer)];
  s.copied = staged_counter_.as<unsigned long long>();
  const int pairs = n_rows * static_cast<int>(n_used_), n_expert = static_cast<int>(n_expert_);
  const LaunchCheck check{launches};
  if (host_runs(n_rows)) {
    // The plan leaves the host's experts to it and posts their request (cuda_moe_host.cpp) before
    // the copy starts, so that the host's products run while PCIe carries the rest.
    host_stage(layer, n_rows, x_f32, s, run);
    check(k::launch_moe_stage_plan(run.ids, pairs, n_expert, s, config, stream), "moe_stage_plan");
    check(k::launch_moe_stage_copy(s, config, stream), "moe_stage_copy");
  } else {
    check(k::launch_moe_stage(run.ids, pairs, n_expert, s, config, stream), "moe_stage");
  }
  const auto* step = step_table_.as<const void*>();
  run.gate.table = step;
  run.up.table = step + n_expert_;
  run.down.table = step + 2 * n_expert_;
}

void CudaMoe::queue_staged_bytes(cudaStream_t stream) {
  if (all_resident_) return;
  check_cuda(cudaMemcpyAsync(staged_pinned_.as<uint64_t>(), staged_counter_.get(), sizeof(uint64_t),
                             cudaMemcpyDeviceToHost, stream),
             "downloading the staged expert bytes");
  check_cuda(cudaMemsetAsync(staged_counter_.get(), 0, sizeof(uint64_t), stream),
             "cudaMemsetAsync");
}

uint64_t CudaMoe::staged_bytes() const {
  return all_resident_ ? 0 : *staged_pinned_.as<const uint64_t>();
}

}  // namespace granule::cuda
