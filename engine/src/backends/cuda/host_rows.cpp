// HostRows: the host's int8 copies of the streamed layers' last rows, the share (a timed
// product against the measured PCIe bandwidth, or the option's), the ranges the streamer still
// copies, and the jobs the host's channel runs: per round, the round's input rows quantised as
// the CPU backend does, then each part's rows on the pool (the server thread takes part).
#include "backends/cuda/host_rows.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "backends/cpu/ops.h"
#include "granule/error.h"
#include "granule/log.h"
#include "granule/tensor_type.h"
#include "memory/host_row_split.h"

namespace granule::cuda {
namespace {

using Clock = std::chrono::steady_clock;

// Row chunks a pool thread takes at a time (whole 8-row groups of the copy).
constexpr int64_t kChunkRows = 64;

const TensorInfo* layer_matrix(const LayerWeights& l, int m) {
  const TensorInfo* mats[HostRows::kMatrices] = {l.wq,     l.wk,   l.wv,    l.wo,
                                                 l.w_gate, l.w_up, l.w_down};
  return mats[m];
}

// Bytes/s the host's int8 product reads: the best of a few timed one-token products over
// `copy` on the pool.
double time_host_product(const cpu::Int8Weights& copy, int64_t cols, cpu::ThreadPool& pool) {
  std::vector<float> x(static_cast<size_t>(cols));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 7919) % 200) / 100.0f - 1;
  std::vector<cpu::ActivationBlock> xq(static_cast<size_t>(cols / 32));
  cpu::quantize_activations(x.data(), cols, xq.data());
  std::vector<float> y(static_cast<size_t>(copy.rows()));
  const int64_t chunks = (copy.rows() + kChunkRows - 1) / kChunkRows;
  double best = 0;
  for (int rep = 0; rep < 4; ++rep) {  // the first one warms the caches and the pool up
    const auto start = Clock::now();
    pool.parallel_for(chunks, [&](int64_t begin, int64_t end, int32_t) {
      copy.matmul_rows(begin * kChunkRows, std::min(copy.rows(), end * kChunkRows), xq.data(), 1,
                       y.data(), copy.rows());
    });
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (rep > 0 && seconds > 0)
      best = std::max(best, static_cast<double>(copy.packed_bytes()) / seconds);
  }
  return best;
}

}  // namespace

std::string HostRows::refusal(const ModelConfig& c, const WeightTable& w) {
  if (c.is_moe()) return "a mixture of experts (--host-experts covers its experts)";
  if (c.is_hybrid()) return "Qwen3.5's recurrent layers";
  if (c.architecture == "gemma4" || c.sandwich_norms) return "Gemma's layers";
  if (c.activation != FfnActivation::Swiglu) return "an activation other than SwiGLU";
  for (const LayerWeights& l : w.layers) {
    if (l.bo || l.attn_post_norm || l.ffn_post_norm) return "an output bias or post-norms";
    for (int m = 0; m < kMatrices; ++m)
      if (!layer_matrix(l, m)) return "a layer without one of the seven matrices";
  }
  // The host quantises its inputs in blocks of 32 (and the post kernel copies 16 bytes at a
  // time).
  if (c.n_embd % 32 != 0 || c.n_ff % 32 != 0 || (c.n_head * c.head_dim) % 32 != 0)
    return "a width that is not a multiple of 32";
  return "";
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

  // The share: given, or where the host's time meets PCIe's (a product over the first streamed
  // layer's down projection, the largest of its matrices, against the measured link).
  int share = std::min(setting, kHostRowShareUnits);
  if (setting < 0) {
    double host_bytes_per_second = 0;
    for (size_t i = 0; i < w.layers.size() && host_bytes_per_second == 0; ++i) {
      if (!streamer.streamed(i)) continue;
      const TensorInfo* t = w.layers[i].w_down;
      const auto type = static_cast<TensorType>(t->ggml_type);
      if (!cpu::Int8Weights::supports(type, t->dims[0])) break;
      const cpu::Int8Weights probe(type, t->data, t->rows(), t->dims[0]);
      host_bytes_per_second = time_host_product(probe, t->dims[0], *h->pool_);
    }
    if (pcie_bytes_per_second <= 0) pcie_bytes_per_second = 25e9;  // PCIe 4.0 x16, assumed
    share = host_row_share_for(pcie_bytes_per_second, host_bytes_per_second);
    log->info(
        "host rows: the host's int8 products read {:.1f} GB/s on {} threads, PCIe carries {:.1f} "
        "GB/s: the host takes {}/256 of each streamed matrix's rows",
        host_bytes_per_second / 1e9, n_threads, pcie_bytes_per_second / 1e9, share);
  }
  if (share <= 0) return nullptr;
  h->share_ = share;

  h->layers_.resize(w.layers.size());
  for (size_t i = 0; i < w.layers.size(); ++i) {
    if (!streamer.streamed(i)) continue;
    Layer& l = h->layers_[i];
    for (int m = 0; m < kMatrices; ++m) {
      const TensorInfo* t = layer_matrix(w.layers[i], m);
      const MatrixLayout& ml = layout.layers[i].matrices[static_cast<size_t>(m)];
      Part& p = l.parts[static_cast<size_t>(m)];
      p.rows = ml.rows;
      p.cols = ml.cols;
      p.first = p.rows;
      l.device_row_bytes[static_cast<size_t>(m)] = static_cast<uint64_t>(ml.row_bytes);
      l.offset[static_cast<size_t>(m)] = ml.offset;
      const auto type = static_cast<TensorType>(t->ggml_type);
      if (!cpu::Int8Weights::supports(type, p.cols)) continue;
      p.first = host_row_begin(p.rows, share);
      if (p.first >= p.rows) continue;
      // GGUF rows are contiguous: the host's rows are a sub-tensor.
      const int64_t gguf_row_bytes = static_cast<int64_t>(row_bytes(type, p.cols));
      p.copy = std::make_unique<cpu::Int8Weights>(type, t->data + p.first * gguf_row_bytes,
                                                  p.rows - p.first, p.cols);
      h->copy_bytes_ += p.copy->packed_bytes();
      h->host_bytes_per_pass_ += static_cast<uint64_t>(p.rows - p.first) * ml.row_bytes;
      l.any = true;
    }
    // Gate and up answer one h: both split at one row or neither.
    Part& gate = l.parts[kGate];
    Part& up = l.parts[kUp];
    if (gate.split() != up.split() || gate.first != up.first) {
      for (Part* p : {&gate, &up}) {
        if (!p->split()) continue;
        h->copy_bytes_ -= p->copy->packed_bytes();
        h->host_bytes_per_pass_ -= static_cast<uint64_t>(p->rows - p->first) *
                                   l.device_row_bytes[static_cast<size_t>(p - l.parts.data())];
        p->copy.reset();
        p->first = p->rows;
      }
    }
    l.any = false;
    for (const Part& p : l.parts) l.any |= p.split();
  }
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

std::vector<WeightStreamer::CopyRange> HostRows::device_ranges(size_t layer) const {
  std::vector<WeightStreamer::CopyRange> ranges;
  if (!splits(layer)) return ranges;
  const Layer& l = layers_[layer];
  for (size_t m = 0; m < kMatrices; ++m) {
    const Part& p = l.parts[m];
    // The device's rows are the matrix's first ones (rows follow each other in either layout);
    // the whole matrix where the host takes none.
    ranges.push_back({l.offset[m], static_cast<uint64_t>(p.first) * l.device_row_bytes[m]});
  }
  return ranges;
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
  const size_t layer = job / kRounds;
  const auto round = static_cast<Round>(job % kRounds);
  if (layer >= layers_.size() || !layers_[layer].any || rows < 1 || rows > kMaxRows)
    throw DeviceError("host rows: a request for nothing the host holds");
  const Layer& l = layers_[layer];
  const int64_t width = round == kOut ? q_dim_ : round == kDownRound ? n_ff_ : n_embd_;
  for (int r = 0; r < rows; ++r)
    cpu::quantize_activations(x + r * width, width, xq_.data() + r * (width / 32));
  switch (round) {
    case kQkv: {
      const int mats[3] = {kQ, kK, kV};
      const int64_t offsets[3] = {answer_offset(layer, kQ, rows), answer_offset(layer, kK, rows),
                                  answer_offset(layer, kV, rows)};
      products(l, mats, 3, rows, y, offsets);
      break;
    }
    case kOut: {
      const int mats[1] = {kO};
      const int64_t offsets[1] = {0};
      products(l, mats, 1, rows, y, offsets);
      break;
    }
    case kGateUp: {
      // gate and up into the host's own buffers (rows x host rows each), then h = silu(gate)·up
      // into the answer.
      const Part& gate = l.parts[kGate];
      const int64_t host_rows = gate.rows - gate.first;
      const int mats[2] = {kGate, kUp};
      const int64_t up = kMaxRows * n_ff_;
      const int64_t offsets[2] = {0, up};
      products(l, mats, 2, rows, gate_up_.data(), offsets);
      cpu::swiglu(gate_up_.data(), gate_up_.data() + up, y, rows * host_rows);
      break;
    }
    case kDownRound: {
      const int mats[1] = {kDown};
      const int64_t offsets[1] = {0};
      products(l, mats, 1, rows, y, offsets);
      break;
    }
    default:
      throw DeviceError("host rows: an unknown round");
  }
}

}  // namespace granule::cuda
