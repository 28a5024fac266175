// CudaMoe's host compute of streamed experts (issue 36; cuda_moe.h's host_share()): the CPU
// computes part of a decode step's missed experts from its own int8 copies
// (cpu/host_experts.h) while PCIe carries the rest, so that a step's missed experts cost the
// time of the slower of the two rather than of the link alone. Inside the captured graph: after
// a layer's staging launch (which chose the host's experts, moe_stage.cuh) the model's stream
// forks to a second one that downloads the choices, the host's mask and the input rows, runs the
// host's products in a host node, uploads their sum and records an event; the model's stream
// runs the device's products meanwhile, waits for the event and adds the sum into the residual.
// One set of buffers serves every layer: a layer's fork comes after the previous layer's join.
#include <algorithm>
#include <atomic>
#include <deque>
#include <map>
#include <thread>

#include "backends/cpu/fast_matmul.h"
#include "backends/cpu/host_experts.h"
#include "backends/cpu/thread_pool.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_moe.h"
#include "granule/log.h"
#include "moe_stage.cuh"

namespace granule::cuda {

namespace k = granule::kernels;

struct CudaMoe::HostCompute {
  std::unique_ptr<cpu::ThreadPool> pool;
  std::unique_ptr<cpu::HostExperts> experts;
  int share = 0;     // of 256
  int min_rows = 1;  // runs of fewer rows stage every miss
  DeviceBuffer zero, gpu_weights, mask, y, ones, plan;
  PinnedBuffer ids_h, weights_h, mask_h, x_h, y_h;
  CudaStream side;
  CudaEvent fork, join;
  struct Task {
    HostCompute* self = nullptr;
    int layer = 0, n_rows = 0;
  };
  std::deque<Task> tasks;  // the host nodes' arguments: addresses stable while graphs hold them
  std::map<std::pair<int, int>, Task*> task_of;
  std::atomic<uint64_t> choices{0}, bytes{0};
  std::atomic<bool> failed{false};

  Task* task(int layer, int n_rows) {
    Task*& t = task_of[{layer, n_rows}];
    if (!t) t = &tasks.emplace_back(Task{this, layer, n_rows});
    return t;
  }
};

namespace {

// The host node: the layer's host choices from the downloaded ids, weights and mask. Runs on the
// CUDA driver's thread; makes no CUDA call and throws nothing.
void CUDART_CB run_host_task(void* data) {
  auto* t = static_cast<CudaMoe::HostCompute::Task*>(data);
  CudaMoe::HostCompute& h = *t->self;
  try {
    const cpu::HostExperts::Work w =
        h.experts->run(t->layer, t->n_rows, h.x_h.as<float>(), h.ids_h.as<int32_t>(),
                       h.weights_h.as<float>(), h.mask_h.as<uint8_t>(), h.y_h.as<float>(), *h.pool);
    h.choices += static_cast<uint64_t>(w.pairs);
    h.bytes += static_cast<uint64_t>(w.experts) * h.experts->expert_bytes(t->layer);
  } catch (...) {
    h.failed = true;
  }
}

}  // namespace

void CudaMoe::HostComputeDelete::operator()(HostCompute* h) const { delete h; }

int CudaMoe::host_share() const { return host_compute_ ? host_compute_->share : 0; }

bool CudaMoe::host_runs(int n_rows) const {
  // (host_compute_ exists only where experts stream)
  return host_compute_ && host_compute_->share > 0 && n_rows >= host_compute_->min_rows &&
         n_rows <= kHostMaxRows;
}

uint64_t CudaMoe::setup_host(const ModelConfig& c, const WeightTable& w, int setting,
                             int32_t threads) {
  auto log = logger("engine.cuda");
  if (all_resident_ || setting == 0) return 0;
  if (const std::string why = cpu::HostExperts::refusal(c, w); !why.empty()) {
    log->info("CUDA experts: the host does not compute streamed experts: {}", why);
    return 0;
  }
  // The copies (about the expert tensors' bytes, as the CPU backend's) come out of the memory left
  // once the pinned image is allocated.
  const uint64_t copies = cpu::plan_copies(w, 0, 0).expert_bytes;
  const uint64_t budget =
      cpu::expert_copy_budget(cpu::memory_available_bytes(), cpu::physical_memory_bytes(), 0);
  if (copies > budget) {
    log->warn(
        "CUDA experts: the host does not compute streamed experts: their int8 copies ({} MiB) "
        "do not fit the memory available ({} MiB after a reserve); every missed expert crosses "
        "PCIe",
        copies >> 20, budget >> 20);
    return 0;
  }
  std::unique_ptr<HostCompute, HostComputeDelete> h(new HostCompute);
  const int32_t n_threads =
      threads > 0 ? threads
                  : static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
  h->pool = std::make_unique<cpu::ThreadPool>(n_threads);
  h->experts = std::make_unique<cpu::HostExperts>(c, w, *h->pool);
  const size_t rows = static_cast<size_t>(std::min(max_rows_, kHostMaxRows));
  const size_t pairs = rows * static_cast<size_t>(n_used_);
  const size_t embd = static_cast<size_t>(n_embd_);
  auto ws = [&](size_t bytes) { return DeviceBuffer(memory_, MemoryCategory::Workspace, bytes); };
  // A slot of zero bytes the host's experts point at in the step table (every block type decodes
  // zero bytes to zeros): the device's products read it, weighted by 0.
  h->zero = DeviceBuffer(memory_, MemoryCategory::WeightsStaging, slot_bytes_);
  check_cuda(cudaMemset(h->zero.get(), 0, slot_bytes_), "cudaMemset");
  h->gpu_weights = ws(pairs * sizeof(float));
  h->mask = ws(static_cast<size_t>(n_expert_));
  h->plan = ws((1 + static_cast<size_t>(k::kMoeMaxExperts)) * sizeof(int));
  h->y = ws(rows * embd * sizeof(float));
  h->ones = ws(rows * sizeof(float));
  const std::vector<float> ones(rows, 1.0f);
  check_cuda(cudaMemcpy(h->ones.get(), ones.data(), h->ones.bytes(), cudaMemcpyHostToDevice),
             "uploading the host experts' weights");
  h->ids_h = PinnedBuffer(pairs * sizeof(int32_t));
  h->weights_h = PinnedBuffer(pairs * sizeof(float));
  h->mask_h = PinnedBuffer(static_cast<size_t>(n_expert_));
  h->x_h = PinnedBuffer(rows * embd * sizeof(float));
  h->y_h = PinnedBuffer(rows * embd * sizeof(float));

  // Given: that share at every run size. Else every candidate, in runs of kHostAutoMinRows rows
  // or more (H100, qwen3-30b-a3b shape at a 52 % budget: at 16 chats the host computing 78 % of
  // the misses gave 150.1 t/s against 124.6 with every miss staged; at batch 1, 53.2 against 71.2).
  h->share = setting > 0 ? std::min(setting, 256) : 256;
  h->min_rows = setting > 0 ? 1 : kHostAutoMinRows;
  log->info(
      "CUDA experts: {} MiB of int8 expert copies on the host, {} threads; it computes {}/256 of "
      "the missed experts in runs of {} to {} rows",
      h->experts->packed_bytes() >> 20, n_threads, h->share, h->min_rows, kHostMaxRows);
  const uint64_t device = h->zero.bytes() + h->gpu_weights.bytes() + h->mask.bytes() +
                          h->y.bytes() + h->ones.bytes() + h->plan.bytes();
  host_compute_ = std::move(h);
  return device;
}

void CudaMoe::host_fork(int layer, int n_rows, const float* x_f32, cudaStream_t stream) {
  HostCompute& h = *host_compute_;
  if (h.failed) throw DeviceError("CUDA experts: the host's expert products failed");
  const cudaStream_t side = h.side.get();
  const size_t pairs = static_cast<size_t>(n_rows) * static_cast<size_t>(n_used_);
  const size_t row_bytes = static_cast<size_t>(n_embd_) * sizeof(float);
  check_cuda(cudaEventRecord(h.fork.get(), stream), "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(side, h.fork.get(), 0), "cudaStreamWaitEvent");
  check_cuda(cudaMemcpyAsync(h.ids_h.as<int32_t>(), ids_.get(), pairs * sizeof(int32_t),
                             cudaMemcpyDeviceToHost, side),
             "downloading the expert choices");
  check_cuda(cudaMemcpyAsync(h.weights_h.as<float>(), weights_.get(), pairs * sizeof(float),
                             cudaMemcpyDeviceToHost, side),
             "downloading the expert weights");
  check_cuda(cudaMemcpyAsync(h.mask_h.as<uint8_t>(), h.mask.get(), static_cast<size_t>(n_expert_),
                             cudaMemcpyDeviceToHost, side),
             "downloading the host's experts");
  check_cuda(cudaMemcpyAsync(h.x_h.as<float>(), x_f32, static_cast<size_t>(n_rows) * row_bytes,
                             cudaMemcpyDeviceToHost, side),
             "downloading the experts' input");
  check_cuda(cudaLaunchHostFunc(side, run_host_task, h.task(layer, n_rows)),
             "cudaLaunchHostFunc (the host's experts)");
  check_cuda(cudaMemcpyAsync(h.y.get(), h.y_h.as<float>(), static_cast<size_t>(n_rows) * row_bytes,
                             cudaMemcpyHostToDevice, side),
             "uploading the host's expert sum");
  check_cuda(cudaEventRecord(h.join.get(), side), "cudaEventRecord");
}

void CudaMoe::host_join(int n_rows, float* hidden, const k::KernelConfig& config,
                        cudaStream_t stream, uint64_t* launches) {
  HostCompute& h = *host_compute_;
  check_cuda(cudaStreamWaitEvent(stream, h.join.get(), 0), "cudaStreamWaitEvent");
  // hidden += the host's sum: a combine of one choice per row, weight 1; launched plainly (its
  // dependencies include the upload, not only the kernel before it).
  k::KernelConfig plain = config;
  plain.early_launch = false;
  LaunchCheck{launches}(k::launch_moe_combine(h.y.as<float>(), h.ones.as<float>(), n_rows, 1,
                                              static_cast<int>(n_embd_), hidden, plain, stream),
                        "moe_combine (host experts)");
}

void CudaMoe::collect_host(MoeStats& out) {
  if (!host_compute_) return;
  out.host_choices += host_compute_->choices.exchange(0);
  out.host_bytes += host_compute_->bytes.exchange(0);
}

void CudaMoe::host_stage(k::MoeStage& s, ExpertRun& run) {
  HostCompute& h = *host_compute_;
  s.host_share = h.share;
  s.host_max_pairs = kHostMaxPairs;
  s.zero = h.zero.as<uint8_t>();
  s.host_mask = h.mask.as<uint8_t>();
  s.weights = run.weights;
  s.gpu_weights = h.gpu_weights.as<float>();
  s.plan = h.plan.as<int>();
  run.weights = s.gpu_weights;  // the host's pairs weighted 0 on the device
}

}  // namespace granule::cuda
