// CudaMoe's staging of streamed experts (issue 36): when part of the experts sit in mapped
// pinned host memory, each layer's step copies the experts its rows chose that are not cached
// into a VRAM staging area (kernels/moe_stage.cuh, one launch after the router), and the expert
// products read them there through a step table. The area holds min(n_expert, max_rows x
// n_used) expert slots: every distinct expert a run of max_rows rows can choose in one layer.
// One area serves every layer (the layers run in order on one stream: the staging launch of
// layer l + 1 waits for layer l's products, which read the area last). It cannot start sooner:
// layer l + 1's choices are known only after its router, which reads layer l's output.
// Prefill is the exception (cuda_moe.h, kPrefetchChoices): a long run's rows choose nearly every
// expert of every layer, so every uncached expert is copied, by DMA on a stream of its own,
// ahead of its layer and while the layers before it compute.
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
  const size_t tables = static_cast<size_t>(3 * n_layer_ * n_expert_) * sizeof(void*);
  prefetch_tables_ = DeviceBuffer(memory_, MemoryCategory::Workspace, tables);
  prefetch_tables_host_ = PinnedBuffer(tables);
  staged_counter_ = DeviceBuffer(memory_, MemoryCategory::Workspace, sizeof(uint64_t));
  check_cuda(cudaMemset(staged_counter_.get(), 0, sizeof(uint64_t)), "cudaMemset");
  staged_pinned_ = PinnedBuffer(sizeof(uint64_t));
  std::memset(staged_pinned_.as<uint64_t>(), 0, sizeof(uint64_t));
  logger("engine.cuda")
      ->info("CUDA experts: {} staging slots ({} MiB) for the step's streamed experts",
             staging_slots_, staging_.bytes() >> 20);
  return staging_.bytes();
}

void CudaMoe::plan_prefetch(cudaStream_t stream) {
  prefetch_.clear();
  if (all_resident_ || staging_slots_ <= 0) return;
  std::vector<PrefetchLayer> plan(static_cast<size_t>(n_layer_));
  int64_t at = 0;
  for (int64_t l = 0; l < n_layer_; ++l) {
    PrefetchLayer& p = plan[static_cast<size_t>(l)];
    for (int64_t e = 0; e < n_expert_; ++e)
      if (!resident_[static_cast<size_t>(l * n_expert_ + e)])
        p.experts.push_back(static_cast<int32_t>(e));
    if (static_cast<int64_t>(p.experts.size()) > staging_slots_) return;  // off: no room
    p.first_slot = at;
    at = (at + static_cast<int64_t>(p.experts.size())) % staging_slots_;
  }
  if (!copy_stream_) {
    copy_stream_ = std::make_unique<CudaStream>();
    pass_start_ = std::make_unique<CudaEvent>();
    copies_end_ = std::make_unique<CudaEvent>();
    for (int64_t l = 0; l < n_layer_; ++l) {
      copies_ready_.push_back(std::make_unique<CudaEvent>());
      products_done_.push_back(std::make_unique<CudaEvent>());
    }
  }
  // The routed tables, with each uncached expert at its ring position (the pinned mirror is
  // rewritten only once its last copy ran: write_tables()' callers synchronise first).
  const auto* routed = tables_host_.as<const void*>();
  auto* host = prefetch_tables_host_.as<const void*>();
  std::copy(routed, routed + 3 * n_layer_ * n_expert_, host);
  for (int64_t l = 0; l < n_layer_; ++l) {
    const PrefetchLayer& p = plan[static_cast<size_t>(l)];
    const Layer& d = layers_[static_cast<size_t>(l)];
    for (size_t j = 0; j < p.experts.size(); ++j) {
      const int64_t slot = (p.first_slot + static_cast<int64_t>(j)) % staging_slots_;
      for (int m = 0; m < 3; ++m)
        host[static_cast<size_t>((l * 3 + m) * n_expert_ + p.experts[j])] =
            staging_.as<uint8_t>() + static_cast<uint64_t>(slot) * slot_bytes_ + d.offsets[m];
    }
  }
  check_cuda(cudaMemcpyAsync(prefetch_tables_.get(), host, prefetch_tables_.bytes(),
                             cudaMemcpyHostToDevice, stream),
             "uploading the prefetch tables");
  prefetch_ = std::move(plan);
}

int64_t CudaMoe::prefetch_first_part(int layer) const {
  // Ring positions past the previous layer's range (that layer may still be reading its own).
  const auto n = static_cast<int64_t>(prefetch_[static_cast<size_t>(layer)].experts.size());
  const auto before =
      static_cast<int64_t>(prefetch_[static_cast<size_t>(layer - 1)].experts.size());
  return std::min(n, staging_slots_ - before);
}

void CudaMoe::prefetch_copies(int layer, int64_t from, int64_t to) {
  const PrefetchLayer& p = prefetch_[static_cast<size_t>(layer)];
  const Layer& d = layers_[static_cast<size_t>(layer)];
  const uint64_t stride = stride_[static_cast<size_t>(layer)];
  // Through down's last byte, as the staging launch copies an expert.
  const uint64_t copy_bytes = (d.offsets[2] + d.slab[2] + 15) / 16 * 16;
  for (int64_t j = from; j < to;) {
    const int64_t slot = (p.first_slot + j) % staging_slots_;
    // A run of experts next to each other both in the host image and in the area: one copy.
    int64_t k = j + 1;
    if (stride == slot_bytes_)
      while (k < to &&
             p.experts[static_cast<size_t>(k)] == p.experts[static_cast<size_t>(k - 1)] + 1 &&
             slot + (k - j) < staging_slots_)
        ++k;
    const auto count = static_cast<uint64_t>(k - j);
    check_cuda(cudaMemcpyAsync(staging_.as<uint8_t>() + static_cast<uint64_t>(slot) * slot_bytes_,
                               host_matrix(layer, p.experts[static_cast<size_t>(j)], 0),
                               (count - 1) * stride + copy_bytes, cudaMemcpyHostToDevice,
                               copy_stream_->get()),
               "prefetching experts into the staging area");
    prefetched_bytes_ += count * expert_bytes_[static_cast<size_t>(layer)];
    j = k;
  }
}

bool CudaMoe::prefetch_layer(int layer, int n_rows, cudaStream_t stream) {
  bool wanted = !prefetch_.empty() &&
                static_cast<int64_t>(n_rows) * n_used_ >= kPrefetchChoices * n_expert_;
  if (wanted) {  // eager runs only: a captured step keeps the staging launch
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    check_cuda(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing");
    wanted = capture == cudaStreamCaptureStatusNone;
  }
  if (pass_layer_ >= 0 && (!wanted || layer != pass_layer_ + 1)) end_pass(stream);
  if (!wanted) return false;
  const cudaStream_t copy = copy_stream_->get();
  const auto at = static_cast<size_t>(layer);
  if (pass_layer_ < 0) {
    // A pass starts: the area's last readers are on `stream`; then this layer's copies and the
    // next layer's first part.
    check_cuda(cudaEventRecord(pass_start_->get(), stream), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(copy, pass_start_->get(), 0), "cudaStreamWaitEvent");
    prefetch_copies(layer, 0, static_cast<int64_t>(prefetch_[at].experts.size()));
    check_cuda(cudaEventRecord(copies_ready_[at]->get(), copy), "cudaEventRecord");
    if (layer + 1 < n_layer_) prefetch_copies(layer + 1, 0, prefetch_first_part(layer + 1));
    ++prefetch_passes_;
  }
  pass_layer_ = layer;
  check_cuda(cudaStreamWaitEvent(stream, copies_ready_[at]->get(), 0), "cudaStreamWaitEvent");
  return true;
}

void CudaMoe::prefetch_after(int layer, cudaStream_t stream) {
  const cudaStream_t copy = copy_stream_->get();
  check_cuda(cudaEventRecord(products_done_[static_cast<size_t>(layer)]->get(), stream),
             "cudaEventRecord");
  if (layer + 1 >= n_layer_) {
    pass_layer_ = -1;  // every copy of the pass was waited for by its layer
    return;
  }
  check_cuda(cudaStreamWaitEvent(copy, products_done_[static_cast<size_t>(layer)]->get(), 0),
             "cudaStreamWaitEvent");
  const auto next = static_cast<size_t>(layer + 1);
  prefetch_copies(layer + 1, prefetch_first_part(layer + 1),
                  static_cast<int64_t>(prefetch_[next].experts.size()));
  check_cuda(cudaEventRecord(copies_ready_[next]->get(), copy), "cudaEventRecord");
  if (layer + 2 < n_layer_) prefetch_copies(layer + 2, 0, prefetch_first_part(layer + 2));
}

void CudaMoe::end_pass(cudaStream_t stream) {
  if (pass_layer_ < 0) return;
  check_cuda(cudaEventRecord(copies_end_->get(), copy_stream_->get()), "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(stream, copies_end_->get(), 0), "cudaStreamWaitEvent");
  pass_layer_ = -1;
}

void CudaMoe::stage(int layer, int n_rows, ExpertRun& run, const k::KernelConfig& config,
                    cudaStream_t stream, uint64_t* launches) {
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
  LaunchCheck{launches}(k::launch_moe_stage(run.ids, n_rows * static_cast<int>(n_used_),
                                            static_cast<int>(n_expert_), s, config, stream),
                        "moe_stage");
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
