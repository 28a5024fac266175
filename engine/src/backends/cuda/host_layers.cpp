// HostLayers: the host node around the CPU backend's layer code, and the host layers' KV kept on
// both sides (see host_layers.h).
#include "backends/cuda/host_layers.h"

#include <cuda_fp16.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <thread>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/thread_pool.h"
#include "backends/cuda/cuda_check.h"
#include "backends/measured_once.h"
#include "granule/error.h"
#include "granule/log.h"

namespace granule::cuda {
namespace {

// Tokens of host-layer KV one staging round trip carries (an 8B model's 16 host layers: 64 KiB
// per token in f16, 16 MiB of staging).
constexpr int64_t kStagingTokens = 256;

MeasuredOnce& host_bandwidth_cache() {
  static MeasuredOnce cache;
  return cache;
}

}  // namespace

double host_read_bandwidth(int32_t threads) {
  return host_bandwidth_cache().get([threads] {
    constexpr size_t kBytes = size_t{256} << 20;
    const size_t words = kBytes / sizeof(uint64_t);
    std::vector<uint64_t> buffer(words, 1);  // written once: every page backed
    cpu::ThreadPool pool(std::max(1, threads));
    std::vector<uint64_t> sums(static_cast<size_t>(pool.threads()), 0);
    double best = 0;
    for (int round = 0; round < 4; ++round) {
      const auto start = std::chrono::steady_clock::now();
      pool.parallel_for(pool.threads(), [&](int64_t begin, int64_t end, int32_t thread) {
        for (int64_t part = begin; part < end; ++part) {
          const size_t lo = words * static_cast<size_t>(part) / static_cast<size_t>(pool.threads());
          const size_t hi =
              words * static_cast<size_t>(part + 1) / static_cast<size_t>(pool.threads());
          uint64_t sum = 0;
          for (size_t i = lo; i < hi; ++i) sum += buffer[i];
          sums[static_cast<size_t>(thread)] += sum;
        }
      });
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (round > 0 && seconds > 0) best = std::max(best, static_cast<double>(kBytes) / seconds);
    }
    uint64_t total = 0;
    for (uint64_t s : sums) total += s;
    return total == 0 ? 0.0 : best;  // (the sums keep the reads from being optimised away)
  });
}

int32_t HostLayers::threads(const BackendOptions& options) {
  if (options.cpu_threads > 0) return options.cpu_threads;
  // One core left to the engine thread, which waits for the step on the GPU (spinning, by the
  // driver's default) while the host node's threads compute: a thread of a parallel loop
  // pre-empted by it would hold up the whole loop.
  const auto cores = static_cast<int32_t>(std::thread::hardware_concurrency());
  return std::max(1, cores - 1);
}

std::string HostLayers::refusal(const ModelConfig& config) {
  if (config.is_moe()) return "its layers have experts";
  if (config.is_hybrid()) return "it has recurrent layers";
  if (config.n_embd_per_layer > 0) return "it has per-layer embeddings";
  if (kv_parts(config, kCpuKvElementBytes).size() > 1) return "it has sliding-window layers";
  return {};
}

HostLayers::HostLayers(const BackendInit& init, MemoryManager& ledger)
    : file_(init.file),
      config_(init.config),
      weights_(init.weights),
      options_(init.options),
      ledger_(ledger),
      // The CPU backend's own ledger: its weights are the file mapping's and its KV is host
      // memory, reported to the device ledger as HostPinned (charge_host_kv), never its budget.
      host_ledger_(std::make_unique<MemoryManager>(std::numeric_limits<uint64_t>::max() / 4)) {
  // The fast path's int8 products: the host layers are a speed path, the GPU's int8 kernels
  // their counterpart (not the oracle's exact or emulating numerics).
  options_.cpu_emulate_device_numerics = false;
  options_.cpu_exact_numerics = false;
  options_.cpu_threads = threads(init.options);
  layers_.assign(static_cast<size_t>(config_.n_layer), false);
  const size_t rows_bytes =
      static_cast<size_t>(kMaxRows) *
      (static_cast<size_t>(config_.n_embd) * sizeof(float) + 2 * sizeof(int32_t));
  rows_ = PinnedBuffer(rows_bytes);
  ledger_.charge(MemoryCategory::HostPinned, rows_bytes);
  charged_pinned_ = rows_bytes;
}

HostLayers::~HostLayers() {
  // A queued host node reads this object: it runs (or the context is lost) before it goes.
  if (stream_) {
    cudaStreamSynchronize(stream_);
    cudaGetLastError();
  }
  ledger_.release(MemoryCategory::HostPinned, charged_pinned_ + charged_kv_);
}

void HostLayers::set_layers(const std::vector<bool>& layers) {
  if (layers.size() != static_cast<size_t>(config_.n_layer))
    throw UsageError("host layers: a set of " + std::to_string(layers.size()) + " entries for " +
                     std::to_string(config_.n_layer) + " layers");
  layers_ = layers;
  count_ = static_cast<int32_t>(std::count(layers_.begin(), layers_.end(), true));
  runs_.clear();
  run_elements_ = 0;
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (!layers_[i]) continue;
    const auto l = static_cast<int64_t>(i);
    const int64_t first = config_.kv_offset_elements(l), elements = 2 * config_.kv_dim_of(l);
    if (!runs_.empty() && runs_.back().first_element + runs_.back().elements == first)
      runs_.back().elements += elements;
    else
      runs_.push_back({first, elements});
    run_elements_ += elements;
  }
  cpu_.reset();
  if (count_ > 0) {
    // Its KV rounded as the device KV is: copies between the two sides lose nothing.
    cpu_ = std::make_unique<cpu::CpuBackend>(
        BackendInit{file_, config_, weights_, *host_ledger_, options_}, layers_, true);
    if (host_kv_) cpu_->attach_kv(*host_kv_);
  }
  std::fill(host_valid_.begin(), host_valid_.end(), 0);
  // The staging for KV round trips, sized to these layers.
  const uint64_t staging_bytes =
      count_ > 0 ? static_cast<uint64_t>(kStagingTokens * run_elements_) * sizeof(__half) : 0;
  if (staging_.bytes() != staging_bytes) {
    ledger_.release(MemoryCategory::HostPinned, staging_.bytes());
    charged_pinned_ -= staging_.bytes();
    staging_ = PinnedBuffer(staging_bytes);
    ledger_.charge(MemoryCategory::HostPinned, staging_bytes);
    charged_pinned_ += staging_bytes;
  }
  staging_tokens_ = count_ > 0 ? kStagingTokens : 0;
  if (count_ > 0)
    logger("engine.cuda")
        ->info("host layers: {} of {} layers computed by the {} at batches up to {}", count_,
               config_.n_layer, cpu_->name(), kMaxRows);
}

void HostLayers::attach_kv(KvSpace& device_kv, cudaStream_t stream) {
  if (device_kv.parts() != 1)
    throw UsageError("host layers: the device KV has " + std::to_string(device_kv.parts()) +
                     " parts, host layers take one");
  device_kv_ = &device_kv;
  stream_ = stream;
  KvGeometry g;
  g.bytes_per_token = config_.kv_bytes_per_token(kCpuKvElementBytes);
  g.max_tokens = device_kv.geometry().max_tokens;
  g.slots = device_kv.geometry().slots;
  g.lookahead_tokens = device_kv.geometry().lookahead_tokens;
  host_kv_ = std::make_unique<KvSpace>(make_host_virtual_memory(), g, *host_ledger_);
  if (cpu_) cpu_->attach_kv(*host_kv_);
  host_valid_.assign(static_cast<size_t>(g.slots), 0);
  device_valid_.assign(static_cast<size_t>(g.slots), 0);
}

double HostLayers::Speed::bytes_per_second(int rows) const {
  int i = 0;
  while (i < 3 && (1 << i) < rows) ++i;
  return seconds_per_byte[i] > 0 ? 1.0 / seconds_per_byte[i] : 0.0;
}

HostLayers::Speed HostLayers::measure() {
  Speed speed;
  if (!any() || !host_kv_) return speed;
  size_t layer = 0;
  while (!layers_[layer]) ++layer;
  const LayerWeights& w = weights_.layers[layer];
  uint64_t bytes = 0;
  for (const TensorInfo* t : {w.wq, w.wk, w.wv, w.wo, w.w_gate, w.w_up, w.w_down})
    if (t) bytes += t->size_bytes;
  if (bytes == 0) return speed;
  const int64_t d = config_.n_embd;
  std::vector<float> hidden(static_cast<size_t>(kMaxRows * d), 0.01f);
  if (!host_kv_->map_through(0, kMaxRows))
    throw CapacityError("host layers: no host memory to measure them");
  for (int i = 0; i < 4; ++i) {
    const int rows = 1 << i;
    const std::vector<int32_t> slots(static_cast<size_t>(rows), 0);
    std::vector<int32_t> positions;
    for (int r = 0; r < rows; ++r) positions.push_back(r);
    std::vector<double> seconds;
    for (int round = 0; round < 6; ++round) {
      const auto start = std::chrono::steady_clock::now();
      cpu_->forward_layers(static_cast<int64_t>(layer), static_cast<int64_t>(layer) + 1, slots,
                           positions, hidden.data());
      seconds.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(seconds.begin() + 1, seconds.end());  // the first warms up
    speed.seconds_per_byte[i] = seconds[3] / static_cast<double>(bytes);
  }
  host_kv_->release(0);
  host_valid_[0] = 0;
  charge_host_kv();
  logger("engine.cuda")
      ->info(
          "host layers: {:.1f} GB/s through a layer at 1 row, {:.1f} at 2, {:.1f} at 4, {:.1f} at "
          "8",
          speed.bytes_per_second(1) / 1e9, speed.bytes_per_second(2) / 1e9,
          speed.bytes_per_second(4) / 1e9, speed.bytes_per_second(8) / 1e9);
  return speed;
}

void HostLayers::charge_host_kv() {
  const uint64_t now = host_ledger_->bytes(MemoryCategory::KvCommitted) +
                       host_ledger_->bytes(MemoryCategory::KvPool);
  if (now > charged_kv_)
    ledger_.charge(MemoryCategory::HostPinned, now - charged_kv_);
  else
    ledger_.release(MemoryCategory::HostPinned, charged_kv_ - now);
  charged_kv_ = now;
}

void HostLayers::before_pass(std::span<const Rows> sequences, bool host_pass) {
  if (!any()) return;
  if (!host_kv_) throw UsageError("host layers: a pass before attach_kv()");
  for (const Rows& r : sequences) {
    const auto s = static_cast<size_t>(r.slot);
    if (r.slot < 0 || s >= host_valid_.size())
      throw UsageError("host layers: slot " + std::to_string(r.slot) + " does not exist");
    const int64_t end = r.start + r.count;
    // What a step rewrites from `start` on is no longer held by either side.
    if (r.start == 0) host_kv_->release(r.slot);  // a new sequence: the last one's memory goes
    host_valid_[s] = std::min(host_valid_[s], r.start);
    device_valid_[s] = std::min(device_valid_[s], r.start);
    if (host_pass) {
      if (!host_kv_->map_through(r.slot, end))
        throw CapacityError("host layers: no host memory for the KV of slot " +
                            std::to_string(r.slot));
      if (host_valid_[s] < r.start) {
        if (device_valid_[s] < r.start)
          throw UsageError("host layers: slot " + std::to_string(r.slot) +
                           " holds its KV through neither side's position " +
                           std::to_string(r.start));
        device_to_host(r.slot, host_valid_[s], r.start);
      }
      host_valid_[s] = end;
    } else {
      if (device_valid_[s] < r.start) {
        if (host_valid_[s] < r.start)
          throw UsageError("host layers: slot " + std::to_string(r.slot) +
                           " holds its KV through neither side's position " +
                           std::to_string(r.start));
        host_to_device(r.slot, device_valid_[s], r.start);
      }
      device_valid_[s] = end;
    }
  }
  charge_host_kv();
}

void HostLayers::device_to_host(int32_t slot, int64_t first, int64_t end) {
  const auto record16 = static_cast<size_t>(config_.kv_bytes_per_token(kCudaKvElementBytes));
  const auto record32 = static_cast<size_t>(config_.kv_bytes_per_token(kCpuKvElementBytes));
  const uint8_t* device = device_kv_->slot_base(slot);
  uint8_t* host = host_kv_->slot_base(slot);
  auto* staged = staging_.as<__half>();
  const auto pitch = static_cast<size_t>(run_elements_) * sizeof(__half);
  for (int64_t t0 = first; t0 < end; t0 += staging_tokens_) {
    const int64_t n = std::min(staging_tokens_, end - t0);
    size_t packed = 0;
    for (const Run& run : runs_) {
      check_cuda(cudaMemcpy2DAsync(staged + packed, pitch,
                                   device + static_cast<size_t>(t0) * record16 +
                                       static_cast<size_t>(run.first_element) * sizeof(__half),
                                   record16, static_cast<size_t>(run.elements) * sizeof(__half),
                                   static_cast<size_t>(n), cudaMemcpyDeviceToHost, stream_),
                 "copying host layers' KV to host memory");
      packed += static_cast<size_t>(run.elements);
    }
    check_cuda(cudaStreamSynchronize(stream_), "copying host layers' KV to host memory");
    for (int64_t t = 0; t < n; ++t) {
      const __half* in = staged + static_cast<size_t>(t * run_elements_);
      auto* out = reinterpret_cast<float*>(host + static_cast<size_t>(t0 + t) * record32);
      for (const Run& run : runs_) {
        for (int64_t e = 0; e < run.elements; ++e) out[run.first_element + e] = __half2float(in[e]);
        in += run.elements;
      }
    }
  }
  kv_tokens_to_host_ += static_cast<uint64_t>(end - first);
}

void HostLayers::host_to_device(int32_t slot, int64_t first, int64_t end) {
  const auto record16 = static_cast<size_t>(config_.kv_bytes_per_token(kCudaKvElementBytes));
  const auto record32 = static_cast<size_t>(config_.kv_bytes_per_token(kCpuKvElementBytes));
  uint8_t* device = device_kv_->slot_base(slot);
  const uint8_t* host = host_kv_->slot_base(slot);
  auto* staged = staging_.as<__half>();
  const auto pitch = static_cast<size_t>(run_elements_) * sizeof(__half);
  for (int64_t t0 = first; t0 < end; t0 += staging_tokens_) {
    const int64_t n = std::min(staging_tokens_, end - t0);
    for (int64_t t = 0; t < n; ++t) {
      const auto* in =
          reinterpret_cast<const float*>(host + static_cast<size_t>(t0 + t) * record32);
      __half* out = staged + static_cast<size_t>(t * run_elements_);
      for (const Run& run : runs_) {
        for (int64_t e = 0; e < run.elements; ++e)
          out[e] = __float2half_rn(in[run.first_element + e]);
        out += run.elements;
      }
    }
    size_t packed = 0;
    for (const Run& run : runs_) {
      check_cuda(cudaMemcpy2DAsync(device + static_cast<size_t>(t0) * record16 +
                                       static_cast<size_t>(run.first_element) * sizeof(__half),
                                   record16, staged + packed, pitch,
                                   static_cast<size_t>(run.elements) * sizeof(__half),
                                   static_cast<size_t>(n), cudaMemcpyHostToDevice, stream_),
                 "copying host layers' KV to device memory");
      packed += static_cast<size_t>(run.elements);
    }
    // The staging is rewritten by the next round: wait for these copies.
    check_cuda(cudaStreamSynchronize(stream_), "copying host layers' KV to device memory");
  }
  kv_tokens_to_device_ += static_cast<uint64_t>(end - first);
}

void HostLayers::complete_device_kv(int32_t slot, int64_t tokens) {
  if (!any() || !host_kv_) return;
  const auto s = static_cast<size_t>(slot);
  if (slot < 0 || s >= host_valid_.size()) return;
  const int64_t through = std::min(tokens, host_valid_[s]);
  if (device_valid_[s] < through) {
    host_to_device(slot, device_valid_[s], through);
    device_valid_[s] = through;
  }
}

void HostLayers::device_kv_restored(int32_t slot, int64_t tokens) {
  const auto s = static_cast<size_t>(slot);
  if (slot < 0 || s >= host_valid_.size()) return;
  device_valid_[s] = tokens;
  host_valid_[s] = 0;
}

void HostLayers::flush_to_device() {
  if (!any() || !host_kv_) return;
  for (size_t s = 0; s < host_valid_.size(); ++s) {
    const auto slot = static_cast<int32_t>(s);
    // Only what the device KV still has memory under (the engine unmaps finished chats' KV).
    const int64_t through = std::min(host_valid_[s], device_kv_->committed_tokens(slot));
    if (device_valid_[s] < through) {
      host_to_device(slot, device_valid_[s], through);
      device_valid_[s] = through;
    }
  }
}

int HostLayers::enqueue(size_t first, size_t last, int n_rows, float* hidden,
                        const int32_t* positions, int64_t row_stride, cudaStream_t stream) {
  if (!cpu_ || n_rows > kMaxRows || n_rows <= 0)
    throw UsageError("host layers: a host pass of " + std::to_string(n_rows) + " rows");
  for (size_t l = first; l < last; ++l)
    if (!layer(l)) throw UsageError("host layers: layer " + std::to_string(l) + " is not one");
  const size_t hidden_bytes =
      static_cast<size_t>(n_rows) * static_cast<size_t>(config_.n_embd) * sizeof(float);
  float* host_hidden = rows_.as<float>();
  auto* host_rows = reinterpret_cast<int32_t*>(
      rows_.as<uint8_t>() +
      static_cast<size_t>(kMaxRows) * static_cast<size_t>(config_.n_embd) * sizeof(float));
  check_cuda(cudaMemcpyAsync(host_hidden, hidden, hidden_bytes, cudaMemcpyDeviceToHost, stream),
             "copying hidden rows to the host layers");
  // Positions then slots: row n_rows of each array into [positions kMaxRows][slots kMaxRows].
  check_cuda(cudaMemcpy2DAsync(host_rows, kMaxRows * sizeof(int32_t), positions,
                               static_cast<size_t>(row_stride) * sizeof(int32_t),
                               static_cast<size_t>(n_rows) * sizeof(int32_t), 2,
                               cudaMemcpyDeviceToHost, stream),
             "copying the step's rows to the host layers");
  Call& call = calls_[{first, last, n_rows}];
  call = {this, first, last, n_rows};
  check_cuda(cudaLaunchHostFunc(stream, &HostLayers::run_node, &call), "cudaLaunchHostFunc");
  check_cuda(cudaMemcpyAsync(hidden, host_hidden, hidden_bytes, cudaMemcpyHostToDevice, stream),
             "copying hidden rows back from the host layers");
  return 4;
}

void CUDART_CB HostLayers::run_node(void* call) {
  const auto* c = static_cast<const Call*>(call);
  c->self->run(*c);
}

void HostLayers::run(const Call& call) noexcept {
  try {
    const int64_t d = config_.n_embd;
    float* hidden = rows_.as<float>();
    const auto* rows = reinterpret_cast<const int32_t*>(rows_.as<uint8_t>() +
                                                        static_cast<size_t>(kMaxRows) *
                                                            static_cast<size_t>(d) * sizeof(float));
    const int32_t* positions = rows;
    const int32_t* slots = rows + kMaxRows;
    // The rows with a slot, back to back (a decode bucket's padding rows have none).
    gathered_slots_.clear();
    gathered_positions_.clear();
    gathered_.resize(static_cast<size_t>(call.rows * d));
    for (int r = 0; r < call.rows; ++r) {
      if (slots[r] < 0) continue;
      std::memcpy(gathered_.data() + gathered_slots_.size() * static_cast<size_t>(d),
                  hidden + static_cast<size_t>(r) * static_cast<size_t>(d),
                  static_cast<size_t>(d) * sizeof(float));
      gathered_slots_.push_back(slots[r]);
      gathered_positions_.push_back(positions[r]);
    }
    if (gathered_slots_.empty()) return;
    cpu_->forward_layers(static_cast<int64_t>(call.first), static_cast<int64_t>(call.last),
                         gathered_slots_, gathered_positions_, gathered_.data());
    size_t g = 0;
    for (int r = 0; r < call.rows; ++r) {
      if (slots[r] < 0) continue;
      std::memcpy(hidden + static_cast<size_t>(r) * static_cast<size_t>(d),
                  gathered_.data() + g * static_cast<size_t>(d),
                  static_cast<size_t>(d) * sizeof(float));
      ++g;
    }
    passes_.fetch_add(1, std::memory_order_relaxed);
  } catch (const std::exception& e) {
    std::lock_guard lock(error_mutex_);
    if (error_.empty()) error_ = e.what();
  } catch (...) {
    std::lock_guard lock(error_mutex_);
    if (error_.empty()) error_ = "an unknown error";
  }
}

void HostLayers::check() {
  std::string error;
  {
    std::lock_guard lock(error_mutex_);
    error.swap(error_);
  }
  if (!error.empty()) throw DeviceError("host layers: " + error);
}

}  // namespace granule::cuda
