// CudaMoe's host compute of streamed experts (issue 36; cuda_moe.h's host_share()): the CPU
// computes part of a decode step's missed experts from its own int8 copies
// (cpu/host_experts.h) while PCIe carries the rest, so that a step's missed experts cost the
// time of the slower of the two rather than of the link alone. Inside the captured graph, with
// no host node and no second stream: a layer's staging plan (moe_stage.cuh) chooses the host's
// experts, writes the choices, the host's mask and the input rows into mapped host memory and
// posts a request on a host channel (host_channel.h); its server thread, spinning while steps
// come, computes them into mapped memory and answers; the model's stream meanwhile copies the
// rest and runs the device's products, then the channel's join kernel waits for the answer and
// adds the host's sum into the residual. One set of buffers serves every layer: a layer's request
// comes after the previous layer's join.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "backends/cpu/fast_matmul.h"
#include "backends/cpu/host_experts.h"
#include "backends/cpu/thread_pool.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_moe.h"
#include "backends/cuda/host_channel.h"
#include "granule/log.h"
#include "memory/host_expert_share.h"
#include "moe_stage.cuh"

namespace granule::cuda {

namespace k = granule::kernels;

struct CudaMoe::HostCompute {
  std::unique_ptr<cpu::ThreadPool> pool;
  std::unique_ptr<cpu::HostExperts> experts;
  int setting = -1;  // EngineOptions::host_expert_share (not 0: then there is no HostCompute)

  int share_at(int n_rows) const { return host_expert_share_at(setting, n_rows); }
  DeviceBuffer zero, gpu_weights, plan;
  PinnedBuffer ids_h, weights_h, mask_h;
  std::atomic<uint64_t> choices{0}, bytes{0};
  // Last: its server thread, which runs compute(), stops before the members above go.
  std::unique_ptr<HostChannel> channel;

  // A request's job: the layer's host choices over the inputs the plan wrote (x the channel's).
  void compute(uint32_t layer, int n_rows, const float* x, float* y) {
    pool->stay_awake_until(std::chrono::steady_clock::now() + kHostPoolAwake);
    const cpu::HostExperts::Work w =
        experts->run(layer, n_rows, x, ids_h.as<int32_t>(), weights_h.as<float>(),
                     mask_h.as<uint8_t>(), y, *pool);
    choices += static_cast<uint64_t>(w.pairs);
    bytes += static_cast<uint64_t>(w.experts) * experts->expert_bytes(layer);
  }
};

void CudaMoe::HostComputeDelete::operator()(HostCompute* h) const { delete h; }

void CudaMoe::check_host() const {
  if (host_compute_) host_compute_->channel->check();
}

int CudaMoe::host_share() const {
  return host_compute_ ? host_compute_->share_at(kHostMaxRows) : 0;
}

int CudaMoe::host_share_at(int n_rows) const {
  return host_compute_ ? host_compute_->share_at(n_rows) : 0;
}

bool CudaMoe::host_runs(int n_rows) const {
  // (host_compute_ exists only where experts stream)
  return host_compute_ && host_compute_->share_at(n_rows) > 0;
}

uint64_t CudaMoe::setup_host(const ModelConfig& c, const WeightTable& w, int setting,
                             int32_t threads) {
  auto log = logger("engine.cuda");
  if (all_resident_ || setting == 0) return 0;
  // The copies (about the expert tensors' bytes, as the CPU backend's) come out of the memory left
  // once the pinned image is allocated.
  const cpu::HostExperts::StreamedFit fit = cpu::HostExperts::streamed_fit(
      c, w, cpu::memory_available_bytes(), cpu::physical_memory_bytes());
  if (fit.memory_short) {
    log->warn("CUDA experts: the host does not compute streamed experts: {}; every missed expert "
              "crosses PCIe",
              fit.reason);
    return 0;
  }
  if (!fit.reason.empty()) {
    log->info("CUDA experts: the host does not compute streamed experts: {}", fit.reason);
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
  h->plan = ws((1 + static_cast<size_t>(k::kMoeMaxExperts)) * sizeof(int));
  h->ids_h = PinnedBuffer(pairs * sizeof(int32_t));
  h->weights_h = PinnedBuffer(pairs * sizeof(float));
  h->mask_h = PinnedBuffer(static_cast<size_t>(n_expert_));
  h->channel =
      std::make_unique<HostChannel>(memory_, rows * embd, rows * embd,
                                    [p = h.get()](uint32_t layer, int n_rows, const float* x,
                                                  float* y) { p->compute(layer, n_rows, x, y); });

  // Given: that share at every run size. Else the default rule (memory/host_expert_share.h, with
  // its measurements).
  h->setting = setting;
  log->info(
      "CUDA experts: {} MiB of int8 expert copies on the host, {} threads; it computes {}/256 of "
      "the missed experts in runs of one row, {}/256 in runs of {} to {} rows",
      h->experts->packed_bytes() >> 20, n_threads, h->share_at(1), h->share_at(kHostMaxRows),
      kHostAutoMinRows, kHostMaxRows);
  const uint64_t device = h->zero.bytes() + h->gpu_weights.bytes() + h->plan.bytes();
  host_compute_ = std::move(h);
  return device;
}

void CudaMoe::host_join(int n_rows, float* hidden, const k::KernelConfig& config,
                        cudaStream_t stream, uint64_t* launches) {
  HostChannel& c = *host_compute_->channel;
  // hidden += the host's sum, every column of every row (zeros where a row chose no host expert).
  k::HostRowsOut sum;
  sum.y = hidden;
  sum.y_stride = n_embd_;
  sum.cols = static_cast<int>(n_embd_);
  sum.accumulate = true;
  LaunchCheck{launches}(
      k::launch_host_join(c.words(), &sum, 1, n_rows, c.device_y(), config, stream),
      "host_join (experts)");
}

void CudaMoe::collect_host(MoeStats& out) {
  if (!host_compute_) return;
  out.host_choices += host_compute_->choices.exchange(0);
  out.host_bytes += host_compute_->bytes.exchange(0);
}

void CudaMoe::host_stage(int layer, int n_rows, const float* x_f32, k::MoeStage& s,
                         ExpertRun& run) {
  HostCompute& h = *host_compute_;
  h.channel->check();
  s.host_words = h.channel->words();
  s.host_layer = layer;
  s.host_rows = n_rows;
  s.host_share = h.share_at(n_rows);
  s.host_max_pairs = kHostMaxPairs;
  s.zero = h.zero.as<uint8_t>();
  s.weights = run.weights;
  s.gpu_weights = h.gpu_weights.as<float>();
  s.host_mask = h.mask_h.device_as<uint8_t>();
  s.host_ids = h.ids_h.device_as<int32_t>();
  s.host_weights = h.weights_h.device_as<float>();
  s.x = x_f32;
  s.host_x = h.channel->device_x();
  s.x_floats = n_rows * static_cast<int>(n_embd_);
  s.plan = h.plan.as<int>();
  run.weights = s.gpu_weights;  // the host's pairs weighted 0 on the device
}

}  // namespace granule::cuda
