// HostRows: the host's int8 copies of the streamed layers' last rows, the share (a timed
// product against the measured PCIe bandwidth, or the option's), the ranges the streamer still
// copies, and the jobs the host's channel runs: per round, the round's input rows quantised as
// the CPU backend does, then each part's rows on the pool (the server thread takes part).
#include "backends/cuda/host_rows.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <new>
#include <thread>

#include "backends/cpu/ops.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device_memory.h"
#include "granule/error.h"
#include "granule/log.h"
#include "granule/tensor_type.h"
#include "memory/host_row_split.h"

namespace granule::cuda {
namespace {

using Clock = std::chrono::steady_clock;

// Row chunks a pool thread takes at a time (whole 8-row groups of the copy).
constexpr int64_t kChunkRows = 64;

// The probe of the measured share reads at least this much, more than a server's last-level
// cache (an H100 host's Xeon has up to ~100 MiB), so that it times host memory, as the split
// passes read it, not the cache.
constexpr uint64_t kProbeBytes = 256ull << 20;

// One matrix copy to build: `rows` rows of `t` from row `first`.
struct CopyTask {
  const TensorInfo* t = nullptr;
  int64_t first = 0, rows = 0;
  std::unique_ptr<cpu::Int8Weights>* out = nullptr;
};

// Builds the copies on the pool (repacking is single-threaded per matrix; a split model has a
// hundred or more). An allocation failure is rethrown here.
void build_copies(std::vector<CopyTask>& tasks, cpu::ThreadPool& pool) {
  std::atomic<bool> failed{false};
  pool.parallel_for(static_cast<int64_t>(tasks.size()), [&](int64_t begin, int64_t end, int32_t) {
    for (int64_t i = begin; i < end; ++i) {
      CopyTask& task = tasks[static_cast<size_t>(i)];
      const auto type = static_cast<TensorType>(task.t->ggml_type);
      const int64_t cols = task.t->dims[0];
      // GGUF rows are contiguous: rows from `first` on are a sub-tensor.
      const uint8_t* from = task.t->data + task.first * static_cast<int64_t>(row_bytes(type, cols));
      try {
        *task.out = std::make_unique<cpu::Int8Weights>(type, from, task.rows, cols);
      } catch (...) {  // (parallel_for's functions must not throw)
        failed = true;
      }
    }
  });
  if (failed) throw std::bad_alloc();
}

// Pinned-to-device copies, back to back on a stream of their own, while the probe's products
// run: in a split pass the DMA engine reads host memory beside the host's products, and the two
// share its bandwidth (H200, 8B Q4_0 half streamed: the share measured alone, 168/256, left the
// step waiting on the host, 38.6 t/s, where 128/256 gave 39.5).
class CopyLoad {
 public:
  // Small enough to fit a loaded plan's free KV reserve, large enough that the copies' setup
  // costs little of the link.
  static constexpr size_t kBytes = size_t{8} << 20;
  explicit CopyLoad(MemoryManager& memory)
      : device_(memory, MemoryCategory::Workspace, kBytes), host_(kBytes) {
    std::memset(host_.as<uint8_t>(), 1, kBytes);
  }
  ~CopyLoad() { cudaStreamSynchronize(stream_.get()); }  // before the buffers go (errors: none)
  CopyLoad(const CopyLoad&) = delete;
  CopyLoad& operator=(const CopyLoad&) = delete;
  // Copies that keep the link busy for about `seconds` at `bytes_per_second`.
  void start(double seconds, double bytes_per_second) {
    const auto n = static_cast<int>(std::clamp(seconds * bytes_per_second / kBytes, 1.0, 4096.0));
    for (int i = 0; i < n; ++i)
      check_cuda(cudaMemcpyAsync(device_.get(), host_.as<uint8_t>(), kBytes, cudaMemcpyHostToDevice,
                                 stream_.get()),
                 "host rows: copies beside the probe");
  }
  void finish() {
    check_cuda(cudaStreamSynchronize(stream_.get()), "host rows: the probe's copies");
  }

 private:
  DeviceBuffer device_;
  PinnedBuffer host_;
  CudaStream stream_;
};

// Bytes/s the host's int8 products read: the best of a few timed one-token passes over the
// probes (one after the other, each on the whole pool, as a round runs), with `load` (when
// given) copying at `pcie_bytes_per_second` throughout each timed pass.
double time_host_products(const std::vector<std::unique_ptr<cpu::Int8Weights>>& probes,
                          int64_t widest_cols, cpu::ThreadPool& pool, CopyLoad* load = nullptr,
                          double pcie_bytes_per_second = 0) {
  std::vector<float> x(static_cast<size_t>(widest_cols));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 7919) % 200) / 100.0f - 1;
  std::vector<cpu::ActivationBlock> xq(static_cast<size_t>(widest_cols / 32));
  cpu::quantize_activations(x.data(), widest_cols, xq.data());
  int64_t most_rows = 0;
  uint64_t bytes = 0;
  for (const auto& p : probes) {
    most_rows = std::max(most_rows, p->rows());
    bytes += p->packed_bytes();
  }
  std::vector<float> y(static_cast<size_t>(most_rows));
  double best = 0, first = 0;
  for (int rep = 0; rep < 4; ++rep) {  // the first one wakes the pool up
    // Copies for three times the first pass's time: slower beside them, the pass still ends
    // before they do.
    if (load && rep > 0) load->start(3 * first, pcie_bytes_per_second);
    const auto start = Clock::now();
    for (const auto& p : probes) {
      const int64_t chunks = (p->rows() + kChunkRows - 1) / kChunkRows;
      pool.parallel_for(chunks, [&](int64_t begin, int64_t end, int32_t) {
        p->matmul_rows(begin * kChunkRows, std::min(p->rows(), end * kChunkRows), xq.data(), 1,
                       y.data(), p->rows());
      });
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (load && rep > 0) load->finish();
    if (rep == 0) first = seconds;
    if (rep > 0 && seconds > 0) best = std::max(best, static_cast<double>(bytes) / seconds);
  }
  return best;
}

}  // namespace

std::string HostRows::refusal(const ModelConfig& c, const WeightTable& w) {
  return host_rows_refusal(c, w);
}

std::unique_ptr<HostRows> HostRows::create(const ModelConfig& c, const WeightTable& w,
                                           const WeightLayout& layout,
                                           const WeightStreamer& streamer, MemoryManager& memory,
                                           int setting, int32_t threads,
                                           double pcie_bytes_per_second) {
  auto log = logger("engine.cuda");
  if (setting == 0 || streamer.streamed_layers() == 0) return nullptr;
  if (const std::string why = refusal(c, w); !why.empty()) {
    log->info("host rows off: {}", why);
    return nullptr;
  }
  std::unique_ptr<HostRows> h(new HostRows);
  const int32_t n_threads =
      threads > 0 ? threads
                  : static_cast<int32_t>(std::max(2u, std::thread::hardware_concurrency()) - 1);
  h->pool_ = std::make_unique<cpu::ThreadPool>(n_threads);

  // The share: given, or where the host's time meets PCIe's (products over the streamed layers'
  // feed-forward matrices, kProbeBytes of them, against the measured link).
  int share = std::min(setting, kHostRowShareUnits);
  if (setting < 0) {
    std::vector<std::unique_ptr<cpu::Int8Weights>> probes;
    std::vector<CopyTask> tasks;
    uint64_t probe_bytes = 0;
    int64_t widest = 0;
    for (size_t i = 0; i < w.layers.size() && probe_bytes < kProbeBytes; ++i) {
      if (!streamer.streamed(i)) continue;
      for (const TensorInfo* t : {w.layers[i].w_gate, w.layers[i].w_up, w.layers[i].w_down}) {
        if (probe_bytes >= kProbeBytes) break;
        if (!cpu::Int8Weights::supports(static_cast<TensorType>(t->ggml_type), t->dims[0]))
          continue;
        tasks.push_back({t, 0, t->rows(), nullptr});
        probe_bytes += t->size_bytes;
        widest = std::max(widest, t->dims[0]);
      }
    }
    probes.resize(tasks.size());
    for (size_t i = 0; i < tasks.size(); ++i) tasks[i].out = &probes[i];
    build_copies(tasks, *h->pool_);
    if (pcie_bytes_per_second <= 0) pcie_bytes_per_second = 25e9;  // PCIe 4.0 x16, assumed
    // The products timed while pinned copies read host memory beside them, as in a split pass;
    // alone where the budget has no room for the copies' device buffer or the copies fail.
    double host_bytes_per_second = 0;
    bool contended = false;
    if (!probes.empty()) {
      try {
        CopyLoad load(memory);
        host_bytes_per_second =
            time_host_products(probes, widest, *h->pool_, &load, pcie_bytes_per_second);
        contended = true;
      } catch (const CapacityError&) {
      } catch (const DeviceLostError&) {
        throw;
      } catch (const DeviceError&) {
        cudaGetLastError();
      }
      if (!contended) host_bytes_per_second = time_host_products(probes, widest, *h->pool_);
    }
    share = host_row_share_for(pcie_bytes_per_second, host_bytes_per_second);
    log->info(
        "host rows: the host's int8 products read {:.1f} GB/s on {} threads ({}), PCIe carries "
        "{:.1f} GB/s: the host takes {}/256 of each streamed matrix's rows",
        host_bytes_per_second / 1e9, n_threads, contended ? "beside pinned copies" : "alone",
        pcie_bytes_per_second / 1e9, share);
  }
  if (share <= 0) return nullptr;
  h->share_ = share;

  h->layers_.resize(w.layers.size());
  std::vector<CopyTask> tasks;
  for (size_t i = 0; i < w.layers.size(); ++i) {
    if (!streamer.streamed(i)) continue;
    Layer& l = h->layers_[i];
    for (int m = 0; m < kMatrices; ++m) {
      const TensorInfo* t = dense_matrix(w.layers[i], m);
      const MatrixLayout& ml = layout.layers[i].matrices[static_cast<size_t>(m)];
      Part& p = l.parts[static_cast<size_t>(m)];
      p.rows = ml.rows;
      p.cols = ml.cols;
      p.first = p.rows;
      l.device_row_bytes[static_cast<size_t>(m)] = static_cast<uint64_t>(ml.row_bytes);
      const auto type = static_cast<TensorType>(t->ggml_type);
      if (!cpu::Int8Weights::supports(type, p.cols)) continue;
      p.first = host_row_begin(p.rows, share);
    }
    // Gate and up answer one h: both split at one row or neither.
    Part& gate = l.parts[kGate];
    Part& up = l.parts[kUp];
    if (gate.first != up.first) gate.first = up.first = gate.rows;
    for (int m = 0; m < kMatrices; ++m) {
      Part& p = l.parts[static_cast<size_t>(m)];
      if (p.first >= p.rows) continue;
      tasks.push_back({dense_matrix(w.layers[i], m), p.first, p.rows - p.first, &p.copy});
      h->host_bytes_per_pass_ +=
          static_cast<uint64_t>(p.rows - p.first) * l.device_row_bytes[static_cast<size_t>(m)];
      l.any = true;
    }
  }
  build_copies(tasks, *h->pool_);
  for (const Layer& l : h->layers_)
    for (const Part& p : l.parts)
      if (p.copy) h->copy_bytes_ += p.copy->packed_bytes();
  if (h->copy_bytes_ == 0) {
    log->info(
        "host rows off: at {}/256 no streamed matrix has a host part the CPU's int8 kernels take",
        share);
    return nullptr;
  }

  // The channel's buffers: the widest round input and the largest round answer, kMaxRows rows.
  h->n_embd_ = c.n_embd;
  h->q_dim_ = c.n_head * c.head_dim;
  h->n_ff_ = c.n_ff;
  const int64_t widest = std::max({c.n_embd, h->q_dim_, c.n_ff});
  int64_t answer = 0;
  for (const Layer& l : h->layers_) {
    int64_t rows = 0;
    for (const Part& p : l.parts) rows = std::max(rows, p.rows - p.first);
    answer = std::max(answer, 3 * rows);
  }
  h->xq_.resize(static_cast<size_t>(kMaxRows * widest / 32));
  h->gate_up_.resize(static_cast<size_t>(2 * kMaxRows * c.n_ff));
  HostRows* self = h.get();
  h->channel_ = std::make_unique<HostChannel>(
      memory, static_cast<size_t>(kMaxRows * widest), static_cast<size_t>(kMaxRows * answer),
      [self](uint32_t job, int rows, const float* x, float* y) { self->run(job, rows, x, y); });
  log->info(
      "host rows: {}/256 of each streamed matrix's rows on the host in runs of up to {} rows "
      "({} MiB of int8 copies, {} threads); a split pass copies {} MiB instead of {} MiB",
      share, kMaxRows, h->copy_bytes_ >> 20, n_threads,
      (streamer.streamed_bytes_per_pass() - h->host_bytes_per_pass_) >> 20,
      streamer.streamed_bytes_per_pass() >> 20);
  return h;
}

HostRows::~HostRows() { channel_.reset(); }  // stops the server before what it reads goes

std::vector<BlobRange> HostRows::device_ranges(size_t layer,
                                               const LayerWeightLayout& layout) const {
  if (!splits(layer)) return {};
  std::array<int64_t, kMatrices> first{};
  for (size_t m = 0; m < kMatrices; ++m) first[m] = layers_[layer].parts[m].first;
  return device_row_ranges(layout, first);
}

int64_t HostRows::answer_offset(size_t layer, int matrix, int rows) const {
  // A round's answer: its split parts' rows in matrix order, `rows` rows each; gate and up
  // answer one h (gate's place, up's none).
  static constexpr int kFirst[kMatrices] = {kQ, kQ, kQ, kO, kGate, kGate, kDown};
  const Layer& l = layers_[layer];
  int64_t offset = 0;
  for (int m = kFirst[matrix]; m < matrix; ++m) {
    const Part& p = l.parts[static_cast<size_t>(m)];
    if (p.split()) offset += static_cast<int64_t>(rows) * (p.rows - p.first);
  }
  return matrix == kUp ? answer_offset(layer, kGate, rows) : offset;
}

void HostRows::products(const Layer& l, const int* matrices, int count, int rows, float* y,
                        const int64_t* offsets) {
  // Chunks of kChunkRows rows over every part, on the pool.
  int64_t chunks[kMatrices + 1] = {};
  for (int i = 0; i < count; ++i) {
    const Part& p = l.parts[static_cast<size_t>(matrices[i])];
    chunks[i + 1] = chunks[i] + (p.split() ? (p.rows - p.first + kChunkRows - 1) / kChunkRows : 0);
  }
  const cpu::ActivationBlock* xq = xq_.data();
  pool_->parallel_for(chunks[count], [&](int64_t begin, int64_t end, int32_t) {
    for (int64_t c = begin; c < end; ++c) {
      int i = 0;
      while (chunks[i + 1] <= c) ++i;
      const Part& p = l.parts[static_cast<size_t>(matrices[i])];
      const int64_t host_rows = p.rows - p.first;
      const int64_t r0 = (c - chunks[i]) * kChunkRows;
      p.copy->matmul_rows(r0, std::min(host_rows, r0 + kChunkRows), xq, rows, y + offsets[i],
                          host_rows);
    }
  });
}

void HostRows::run(uint32_t job, int rows, const float* x, float* y) {
  pool_->stay_awake_until(Clock::now() + kHostPoolAwake);
  const size_t layer = job / kRounds;
  const auto round = static_cast<Round>(job % kRounds);
  if (layer >= layers_.size() || !layers_[layer].any || rows < 1 || rows > kMaxRows)
    throw DeviceError("host rows: a request for nothing the host holds");
  const Layer& l = layers_[layer];
  const int64_t width = round == kOut ? q_dim_ : round == kDownRound ? n_ff_ : n_embd_;
  // The device's int8 values of the same input: the RMSNorm kernel's rounding for Q/K/V and
  // gate/up, the attention output's and quantize_q8's (x / d) for O and down.
  const bool divide = round == kOut || round == kDownRound;
  for (int r = 0; r < rows; ++r)
    cpu::quantize_activations(x + r * width, width, xq_.data() + r * (width / 32), divide);
  if (round == kGateUp) {
    // gate and up into the host's own buffers (rows x host rows each), then h = silu(gate)·up
    // into the answer.
    const Part& gate = l.parts[kGate];
    const int64_t host_rows = gate.rows - gate.first;
    const int mats[2] = {kGate, kUp};
    const int64_t up = kMaxRows * n_ff_;
    const int64_t offsets[2] = {0, up};
    products(l, mats, 2, rows, gate_up_.data(), offsets);
    cpu::swiglu(gate_up_.data(), gate_up_.data() + up, y, rows * host_rows);
    return;
  }
  // Q/K/V, O or down: each part's rows straight into its place in the answer.
  static constexpr int kQkvMatrices[3] = {kQ, kK, kV}, kOutMatrix[1] = {kO},
                       kDownMatrix[1] = {kDown};
  const int* mats = round == kQkv ? kQkvMatrices : round == kOut ? kOutMatrix : kDownMatrix;
  const int count = round == kQkv ? 3 : 1;
  int64_t offsets[3] = {};
  for (int i = 0; i < count; ++i) offsets[i] = answer_offset(layer, mats[i], rows);
  products(l, mats, count, rows, y, offsets);
}

}  // namespace granule::cuda
