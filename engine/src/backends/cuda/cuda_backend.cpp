// CudaBackend: batches flattened to token rows, chunked to the workspace, decode steps as
// replayed graphs, and the factory the engine calls.
#include "backends/cuda/cuda_backend.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <limits>
#include <mutex>
#include <string>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_vmm.h"
#include "backends/cuda/h2d_bandwidth.h"
#include "backends/cuda/host_rows.h"
#include "granule/error.h"
#include "granule/log.h"
#include "memory/expert_placement.h"
#include "memory/placement.h"

namespace granule::cuda {
namespace {

constexpr uint64_t kMinBudgetMarginBytes = 512ull << 20;

// Default budget: what is free now, less a margin for the driver, cuBLAS and the display.
uint64_t default_budget(size_t free_bytes, size_t total_bytes) {
  const uint64_t margin = std::max<uint64_t>(kMinBudgetMarginBytes, total_bytes / 20);
  return free_bytes > margin ? free_bytes - margin : 0;
}

// The head's parts: whether it draws greedily, with the sampling parameters, or under masks.
bool greedy_head(StepHead h) { return h == StepHead::Greedy || h == StepHead::MaskedGreedy; }
bool sample_head(StepHead h) { return h == StepHead::Sample || h == StepHead::MaskedSample; }
bool masked_head(StepHead h) { return h == StepHead::MaskedGreedy || h == StepHead::MaskedSample; }

bool is_greedy(const SamplingParams& p) {
  return p.temperature <= 0.0f && p.repetition_penalty == 1.0f && p.frequency_penalty == 0.0f &&
         p.presence_penalty == 0.0f;
}

// A sticky error seen anywhere in this process, until a probe finds the device usable again.
std::mutex lost_mutex;
std::string lost_reason;

}  // namespace

void note_device_lost(const std::string& reason) noexcept {
  try {
    std::lock_guard lock(lost_mutex);
    if (lost_reason.empty()) lost_reason = reason;
  } catch (...) {  // a lock or a copy failing must not turn an error report into a crash
  }
}

bool cuda_available(std::string* why) {
  {
    std::lock_guard lock(lost_mutex);
    if (!lost_reason.empty()) {
      // CUDA documents a sticky error as the end of CUDA in the process; the backend that saw
      // it reset the device on the way out, which some drivers accept. Probe once more.
      cudaGetLastError();
      if (cudaSetDevice(0) == cudaSuccess && cudaFree(nullptr) == cudaSuccess) {
        logger("engine.cuda")->info("the GPU works again after the reset");
        lost_reason.clear();
      } else {
        cudaGetLastError();
        if (why)
          *why = "the GPU failed earlier in this process (" + lost_reason +
                 ") and CUDA cannot use it again until Granule is restarted";
        return false;
      }
    }
  }
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    if (why)
      *why = std::string("no usable CUDA driver or GPU (") + cudaGetErrorString(status) + ")";
    return false;
  }
  if (count == 0) {
    if (why) *why = "no CUDA GPU found";
    return false;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    cudaGetLastError();
    if (why) *why = "cannot read the GPU's properties";
    return false;
  }
  if (prop.major < 8) {
    if (why)
      *why = std::string(prop.name) + " has compute capability " + std::to_string(prop.major) +
             "." + std::to_string(prop.minor) + "; Granule's CUDA backend needs 8.0 or newer";
    return false;
  }
  return true;
}

CudaBackend::CudaBackend(const BackendInit& init) : config_(init.config), options_(init.options) {
  std::string why;
  if (!cuda_available(&why)) throw DeviceError(why);
  check_cuda(cudaSetDevice(device_), "cudaSetDevice");
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, device_), "cudaGetDeviceProperties");
  device_name_ = prop.name;
  size_t free_bytes = 0, total_bytes = 0;
  check_cuda(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  device_total_bytes_ = total_bytes;
  if (init.options.vram_budget_bytes == 0)
    init.memory.set_budget_bytes(default_budget(free_bytes, total_bytes));
  h2d_bandwidth_ = h2d_bandwidth(init.memory);  // the first engine measures; later ones reuse it
  const int max_rows = static_cast<int>(
      std::max<int64_t>(CudaModel::kMatvecMaxRows, init.options.max_tokens_per_pass));
  model_ = std::make_unique<CudaModel>(init, max_rows);
  memory_ = &init.memory;
  logger("engine.cuda")
      ->info("CUDA backend on {} ({} MiB), budget {} MiB, host-to-device {:.1f} GB/s", device_name_,
             total_bytes >> 20, init.memory.budget_bytes() >> 20, h2d_bandwidth_ / 1e9);
}

CudaBackend::~CudaBackend() {
  // Free everything first (teardown errors are logged), then, when a sticky error has lost
  // the context, reset the device so the next engine in this process gets a fresh one. The
  // engine destroys the KvSpace, and with it the KV's virtual memory, before the backend.
  // A step left waiting for its token masks is let go first, or the synchronisation below
  // would wait for the mask kernel's time-out.
  if (token_masks_) token_masks_->release_unpublished();
  graphs_.clear();
  model_.reset();
  cudaGetLastError();
  const cudaError_t status = cudaDeviceSynchronize();
  if (is_sticky_error(status)) {
    logger("engine.cuda")
        ->warn("resetting the GPU after a lost context ({})", cudaGetErrorString(status));
    const cudaError_t reset = cudaDeviceReset();
    if (reset != cudaSuccess)
      logger("engine.cuda")->error("cudaDeviceReset failed: {}", cudaGetErrorString(reset));
  }
}

std::string CudaBackend::name() const { return "CUDA " + device_name_; }

int64_t CudaBackend::kv_bytes_per_token() const {
  static_assert(kCudaKvElementBytes == sizeof(__half));
  return config_.kv_bytes_per_token(kCudaKvElementBytes);
}

std::unique_ptr<VirtualMemory> CudaBackend::make_kv_virtual_memory() {
  // Every kernel and copy that touches the KV runs on the model's stream: fences go there.
  return make_cuda_virtual_memory(device_, {model_->stream()});
}

void CudaBackend::attach_kv(KvSpace& kv) {
  kv_ = &kv;
  std::vector<uint8_t*> bases;
  for (int32_t s = 0; s < kv.geometry().slots; ++s) bases.push_back(kv.slot_base(s));
  const std::vector<KvPartGeometry> expected = kv_parts(config_, kCudaKvElementBytes);
  if (static_cast<size_t>(kv.parts()) != std::max<size_t>(expected.size(), 1))
    throw UsageError("CUDA backend: the KV space's parts differ from the model's layer kinds");
  std::vector<uint64_t> offsets;
  for (int p = 0; p < kv.parts(); ++p) offsets.push_back(kv.part_offset_bytes(p));
  model_->attach_kv(bases, kv.geometry().max_tokens, offsets);
  state_lengths_.assign(config_.is_hybrid() ? static_cast<size_t>(kv.geometry().slots) : 0, 0);
}

bool CudaBackend::copy_state_to_host(int32_t slot, void* host) {
  if (!config_.is_hybrid()) return false;
  check_cuda(cudaSetDevice(device_), "cudaSetDevice");
  check_cuda(cudaMemcpyAsync(host, model_->recurrent_state(slot), model_->recurrent_state_bytes(),
                             cudaMemcpyDeviceToHost, model_->stream()),
             "copying a recurrent state to host memory");
  check_cuda(cudaStreamSynchronize(model_->stream()), "copying a recurrent state to host memory");
  return true;
}

bool CudaBackend::copy_state_from_host(int32_t slot, const void* host, int64_t tokens) {
  if (!config_.is_hybrid()) return false;
  if (slot < 0 || static_cast<size_t>(slot) >= state_lengths_.size())
    throw UsageError("CUDA backend: slot " + std::to_string(slot) + " does not exist");
  check_cuda(cudaSetDevice(device_), "cudaSetDevice");
  // Queued ahead of the next step, which reads it (the engine keeps `host` until then).
  check_cuda(cudaMemcpyAsync(model_->recurrent_state(slot), host, model_->recurrent_state_bytes(),
                             cudaMemcpyHostToDevice, model_->stream()),
             "copying a recurrent state back from host memory");
  state_lengths_[static_cast<size_t>(slot)] = tokens;
  return true;
}

bool CudaBackend::copy_kv_to_host(int32_t slot, int64_t tokens, void* host) {
  if (!kv_) throw UsageError("CUDA backend: copy_kv_to_host() before attach_kv()");
  const std::vector<KvSpace::Range> ranges = kv_->live_ranges(tokens);
  if (ranges.empty()) return true;
  check_cuda(cudaSetDevice(device_), "cudaSetDevice");
  auto* out = static_cast<uint8_t*>(host);
  for (const KvSpace::Range& r : ranges) {
    check_cuda(cudaMemcpyAsync(out, kv_->slot_base(slot) + r.offset, r.bytes,
                               cudaMemcpyDeviceToHost, model_->stream()),
               "copying idle KV to host memory");
    out += r.bytes;
  }
  check_cuda(cudaStreamSynchronize(model_->stream()), "copying idle KV to host memory");
  return true;
}

bool CudaBackend::copy_kv_from_host(int32_t slot, const void* host, int64_t tokens) {
  if (!kv_) throw UsageError("CUDA backend: copy_kv_from_host() before attach_kv()");
  const std::vector<KvSpace::Range> ranges = kv_->live_ranges(tokens);
  if (ranges.empty()) return true;
  check_cuda(cudaSetDevice(device_), "cudaSetDevice");
  // Queued on the stream the step runs on, so it lands before the step reads the KV; the
  // engine keeps `host` until that step has been waited for.
  const auto* in = static_cast<const uint8_t*>(host);
  for (const KvSpace::Range& r : ranges) {
    check_cuda(cudaMemcpyAsync(kv_->slot_base(slot) + r.offset, in, r.bytes, cudaMemcpyHostToDevice,
                               model_->stream()),
               "copying idle KV back from host memory");
    in += r.bytes;
  }
  return true;
}

RowInputs CudaBackend::flatten(std::span<const BatchSequence> batch, size_t first_token,
                               size_t count,
                               std::vector<std::pair<size_t, size_t>>* token_index) const {
  // token_index: the (sequence, token) of every flattened token; filled once by the caller.
  RowInputs in;
  for (size_t t = first_token; t < first_token + count; ++t) {
    const auto [s, i] = (*token_index)[t];
    const BatchSequence& seq = batch[s];
    in.tokens.push_back(seq.tokens[i]);
    in.positions.push_back(static_cast<int32_t>(seq.start_position + static_cast<int64_t>(i)));
    in.slots.push_back(seq.slot);
    if (seq.all_logits || i + 1 == seq.tokens.size())
      in.logit_rows.push_back(static_cast<int32_t>(t - first_token));
  }
  return in;
}

int CudaBackend::bucket_of(int n) {
  int b = 1;
  while (b < n) b *= 2;
  return std::min(b, std::max(n, CudaModel::kMatvecMaxRows));
}

void CudaBackend::placement_changed(const std::string& reason) {
  graphs_.invalidate(reason);
  ++replans_;
  last_replan_reason_ = reason;
  logger("engine.cuda")
      ->info("weight placement: {} resident, {} streamed ({})",
             model_->streamer().resident_layers(), model_->streamer().streamed_layers(), reason);
}

uint64_t CudaBackend::run_step(int n_rows, bool decode, Head head) {
  CudaModel& m = *model_;
  // A decode graph with a token head copies its own inputs and tokens (launch() leaves
  // them to it, wait() only reads the tokens).
  const bool graph_io = graph_carries_io(decode, head);
  auto enqueue = [&] {
    if (graph_io) m.queue_step_inputs(n_rows, sample_head(head));
    m.run_layers(n_rows);
    m.run_head(0, n_rows);
    if (masked_head(head)) mask_logits(n_rows, 0);
    if (head != Head::Logits) m.sample(n_rows, greedy_head(head));
    if (graph_io) m.queue_token_download(n_rows);
  };
  if (!decode || !options_.cuda_graphs) {
    if (decode) graphs_.count_eager("graphs disabled by the options");
    m.reset_host_operations();
    enqueue();
    return m.host_operations();
  }
  const GraphCache::Key key{n_rows, head};
  if (!graphs_.find(key)) graphs_.capture(key, m.stream(), enqueue);
  graphs_.replay(key, m.stream());
  if (graph_io) m.mark_inputs_sent();
  return 1;
}

double CudaBackend::replay_seconds(int rows, int replays) {
  const CudaGraph* graph = graphs_.find({bucket_of(rows), Head::Greedy});
  if (!graph || replays <= 0 || pending_.active) return -1;
  cudaStream_t s = model_->stream();
  CudaEvent start, stop;
  check_cuda(cudaEventRecord(start.get(), s), "cudaEventRecord");
  for (int i = 0; i < replays; ++i) graph->launch(s);
  check_cuda(cudaEventRecord(stop.get(), s), "cudaEventRecord");
  check_cuda(cudaEventSynchronize(stop.get()), "cudaEventSynchronize");
  float ms = 0;
  check_cuda(cudaEventElapsedTime(&ms, start.get(), stop.get()), "cudaEventElapsedTime");
  return static_cast<double>(ms) * 1e-3 / replays;
}

std::vector<kernels::DeviceSamplingParams> CudaBackend::device_params(size_t first,
                                                                      size_t count) const {
  const StepRequest& step = pending_.step;
  std::vector<kernels::DeviceSamplingParams> out;
  for (size_t s = first; s < first + count; ++s) {
    const SamplingParams& p = step.params[s];
    kernels::DeviceSamplingParams d;
    d.temperature = p.temperature;
    d.top_k = p.top_k;
    d.top_p = p.top_p;
    d.min_p = p.min_p;
    d.repetition_penalty = p.repetition_penalty;
    d.frequency_penalty = p.frequency_penalty;
    d.presence_penalty = p.presence_penalty;
    d.penalty_last_n = p.penalty_last_n;
    d.seed = p.seed;
    d.step = step.draw_index[s];
    out.push_back(d);
  }
  return out;
}

std::vector<std::vector<int32_t>> CudaBackend::histories(size_t first, size_t count) const {
  const StepRequest& step = pending_.step;
  std::vector<std::vector<int32_t>> out;
  for (size_t s = first; s < first + count; ++s)
    out.push_back(s < step.history.size() ? step.history[s] : std::vector<int32_t>{});
  return out;
}

void CudaBackend::mask_logits(int rows, int first_mask_row) {
  // The head's logits are the model's own buffer; masking edits them in place, as the
  // sampler's penalties do.
  token_masks_->enqueue(const_cast<float*>(model_->logits()), config_.n_vocab, rows,
                        static_cast<int>(config_.n_vocab), first_mask_row, model_->stream());
}

void CudaBackend::prepare_token_masks(size_t rows) {
  // Decode buckets up to kMatvecMaxRows, prefills up to a pass's rows: one table for either,
  // grown (its graphs dropped) only for a step of more sequences.
  const int needed = static_cast<int>(std::max<size_t>(
      rows, static_cast<size_t>(std::max(CudaModel::kMatvecMaxRows, model_->max_rows()))));
  if (token_masks_ && token_masks_->rows() >= needed) return;
  if (token_masks_) graphs_.invalidate("the token mask table grew");
  token_masks_ = std::make_unique<TokenMasks>(needed, config_.n_vocab, model_->token_mask_copy());
}

void CudaBackend::set_token_masks(std::span<const uint32_t* const> masks) {
  if (!pending_.active || !masked_head(pending_.head))
    throw UsageError("CUDA backend: token masks for a step launched without them");
  if (masks.size() > pending_.step.batch.size())
    throw UsageError("CUDA backend: token masks for more rows than the step has");
  token_masks_->publish(masks);
}

void CudaBackend::launch(const StepRequest& step) {
  if (!kv_) throw UsageError("CUDA backend: launch() before attach_kv()");
  // A step abandoned between launch() and wait() may have left the device waiting for masks.
  if (token_masks_ && token_masks_->release_unpublished())
    logger("engine.cuda")->warn("a step's token masks never came: its tokens were drawn unmasked");
  replan_experts();  // between steps: the last one is over
  pending_ = PendingStep{};
  PendingStep& p = pending_;
  if (step.sample) {
    if (step.params.size() != step.batch.size() || step.draw_index.size() != step.batch.size())
      throw UsageError("CUDA backend: a sampled step needs parameters for every sequence");
  } else if (!step.logits) {
    throw UsageError("CUDA backend: a step without sampling needs logits");
  }
  p.decode = step.batch.size() <= static_cast<size_t>(CudaModel::kMatvecMaxRows);
  bool greedy = true;
  int64_t n_out = 0;
  for (size_t s = 0; s < step.batch.size(); ++s) {
    const BatchSequence& seq = step.batch[s];
    if (seq.tokens.empty()) throw UsageError("CUDA backend: a batch sequence has no tokens");
    if (step.sample && seq.all_logits)
      throw UsageError("CUDA backend: a sampled step takes no sequence with all_logits");
    for (size_t i = 0; i < seq.tokens.size(); ++i) {
      if (seq.tokens[i] < 0 || seq.tokens[i] >= config_.n_vocab)
        throw UsageError("token id " + std::to_string(seq.tokens[i]) +
                         " is outside the vocabulary of " + std::to_string(config_.n_vocab));
      p.token_index.emplace_back(s, i);
    }
    n_out += seq.all_logits ? static_cast<int64_t>(seq.tokens.size()) : 1;
    p.decode = p.decode && seq.tokens.size() == 1;
    if (step.sample) greedy = greedy && is_greedy(step.params[s]);
  }
  if (!state_lengths_.empty()) {
    // A recurrent state is continued or started over, never skipped: a step from any other
    // position is refused before anything is queued (cpu::HybridLayers::begin_step's rule).
    for (const BatchSequence& seq : step.batch) {
      if (seq.slot < 0 || static_cast<size_t>(seq.slot) >= state_lengths_.size())
        throw UsageError("CUDA backend: slot " + std::to_string(seq.slot) + " does not exist");
      const int64_t covered = state_lengths_[static_cast<size_t>(seq.slot)];
      if (seq.start_position != 0 && seq.start_position != covered)
        throw UsageError("recurrent state: slot " + std::to_string(seq.slot) + " covers " +
                         std::to_string(covered) + " tokens, the step continues at position " +
                         std::to_string(seq.start_position));
    }
    for (const BatchSequence& seq : step.batch)
      state_lengths_[static_cast<size_t>(seq.slot)] =
          seq.start_position + static_cast<int64_t>(seq.tokens.size());
  }
  p.step = step;
  const bool masked = step.sample && step.token_masks;
  p.head = !step.sample ? Head::Logits
           : greedy     ? (masked ? Head::MaskedGreedy : Head::Greedy)
                        : (masked ? Head::MaskedSample : Head::Sample);
  if (masked) {
    prepare_token_masks(step.batch.size());
    token_masks_->arm();  // before anything that reads the epoch is queued
  }
  if (step.sample) {
    p.result.tokens.resize(step.batch.size());
  } else {
    step.logits->resize(static_cast<size_t>(n_out * config_.n_vocab));
    p.result.logit_rows = n_out;
  }
  p.active = true;
  CudaModel& m = *model_;
  const auto n = step.batch.size();
  p.started = std::chrono::steady_clock::now();
  if (p.decode) {
    // A decode step: one upload, one graph replay for the batch's bucket (padding rows have
    // no slot: they write no KV and read none), queued; wait() downloads the batch's tokens
    // or logits.
    p.bucket = bucket_of(static_cast<int>(n));
    RowInputs in = flatten(step.batch, 0, p.token_index.size(), &p.token_index);
    for (int r = static_cast<int>(n); r < p.bucket; ++r) {
      in.tokens.push_back(0);
      in.positions.push_back(0);
      in.slots.push_back(-1);
      in.logit_rows.push_back(r);
    }
    m.upload(in);
    if (sample_head(p.head)) {
      std::vector<kernels::DeviceSamplingParams> params = device_params(0, n);
      std::vector<std::vector<int32_t>> history = histories(0, n);
      params.resize(static_cast<size_t>(p.bucket));  // padding rows: defaults, no history
      history.resize(static_cast<size_t>(p.bucket));
      m.upload_sampling(params, history);
    }
    p.host_operations =
        graph_carries_io(true, p.head) ? 0 : static_cast<uint64_t>(m.flush_inputs());
    p.host_operations += run_step(p.bucket, true, p.head);
    p.h2d_bytes = m.streamed_bytes_for(p.bucket);
    return;
  }
  // Chunked prefill: the first chunk's layers are queued here, the rest in wait().
  p.first_chunk =
      flatten(step.batch, 0, std::min(p.token_index.size(), static_cast<size_t>(m.max_rows())),
              &p.token_index);
  m.upload(p.first_chunk);
  m.flush_inputs();
  m.run_layers(static_cast<int>(p.first_chunk.tokens.size()));
  p.h2d_bytes = m.streamed_bytes_for(static_cast<int>(p.first_chunk.tokens.size()));
}

void CudaBackend::finish_step(const PendingStep& p) {
  last_step_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - p.started).count();
  last_step_h2d_bytes_ = p.h2d_bytes;
  last_step_tokens_ = p.token_index.size();
  h2d_bytes_ += p.h2d_bytes;
  if (p.decode) last_segments_ = static_cast<int32_t>(p.host_operations + 1);  // + the download
}

StepResult CudaBackend::wait() {
  if (!pending_.active) throw UsageError("CUDA backend: wait() without a launched step");
  struct Over {  // the step is over however wait() ends
    PendingStep& p;
    ~Over() { p.active = false; }
  } over{pending_};
  PendingStep& p = pending_;
  CudaModel& m = *model_;
  const int64_t n_vocab = config_.n_vocab;
  const size_t n = p.step.batch.size();
  if (masked_head(p.head) && token_masks_->release_unpublished())
    logger("engine.cuda")->warn("a step was waited for without its token masks: drawn unmasked");
  struct TimeOut {  // a mask wait that gave up is said once the step is over
    TokenMasks* masks;
    ~TimeOut() {
      try {
        if (masks && masks->take_timed_out())
          logger("engine.cuda")
              ->error(
                  "the device gave up waiting for the host's token masks: a step drew "
                  "unmasked");
      } catch (...) {  // a log that fails must not end the process from a destructor
      }
    }
  } time_out{masked_head(p.head) ? token_masks_.get() : nullptr};
  if (p.decode) {
    if (p.head == Head::Logits) {
      m.copy_logits(static_cast<int>(n), p.step.logits->data());
    } else if (graph_carries_io(true, p.head)) {
      m.read_tokens(static_cast<int>(n), p.result.tokens.data());
    } else {
      m.copy_tokens(static_cast<int>(n), p.result.tokens.data());
    }
    m.check_host_rows();  // the host's part of a split pass answered in time
    finish_step(p);
    return std::move(p.result);
  }
  size_t out_row = 0;
  const auto max_rows = static_cast<size_t>(m.max_rows());
  for (size_t first = 0; first < p.token_index.size(); first += max_rows) {
    const size_t count = std::min(p.token_index.size() - first, max_rows);
    RowInputs in;
    if (first == 0) {
      in = std::move(p.first_chunk);  // its layers were queued by launch()
    } else {
      in = flatten(p.step.batch, first, count, &p.token_index);
      m.upload(in);
      m.flush_inputs();
      m.run_layers(static_cast<int>(count));
      p.h2d_bytes += m.streamed_bytes_for(static_cast<int>(count));
    }
    const int n_logit_rows = static_cast<int>(in.logit_rows.size());
    for (int g = 0; g < n_logit_rows; g += CudaModel::kLogitRowsPerPass) {
      const int group = std::min(CudaModel::kLogitRowsPerPass, n_logit_rows - g);
      m.run_head(g, group);
      if (p.head == Head::Logits) {
        m.copy_logits(group, p.step.logits->data() + static_cast<int64_t>(out_row) * n_vocab);
      } else {
        if (sample_head(p.head)) {
          m.upload_sampling(device_params(out_row, static_cast<size_t>(group)),
                            histories(out_row, static_cast<size_t>(group)));
          m.flush_inputs();
        }
        if (masked_head(p.head)) mask_logits(group, static_cast<int>(out_row));
        m.sample(group, greedy_head(p.head));
        m.copy_tokens(group, p.result.tokens.data() + out_row);
      }
      out_row += static_cast<size_t>(group);
    }
  }
  m.check_host_rows();
  finish_step(p);
  return std::move(p.result);
}

void CudaBackend::fill_telemetry(TelemetrySnapshot& snapshot) const {
  snapshot.device.name = device_name_;
  snapshot.device.gpu = true;
  graphs_.fill_telemetry(snapshot.graphs);
  snapshot.graphs.segments_per_step = last_segments_;

  const WeightStreamer& w = model_->streamer();
  StreamingTelemetry& st = snapshot.streaming;
  st.layers_resident = w.resident_layers();
  st.layers_streamed = w.streamed_layers();
  st.layer_streamed.assign(w.layers(), 0);
  for (size_t i = 0; i < w.layers(); ++i) st.layer_streamed[i] = w.streamed(i) ? 1 : 0;
  st.resident_weight_bytes = model_->weight_bytes();
  st.streamed_bytes_per_pass = w.streamed_bytes_per_pass();
  if (const HostRows* h = model_->host_rows()) {
    st.host_row_share = h->share();
    st.split_bytes_per_pass = w.split_bytes_per_pass();
    st.host_row_copy_bytes = h->copy_bytes();
    st.host_row_rounds = h->rounds();
  }
  st.staging_slots = w.staging_slots();
  st.staging_bytes = w.staging_bytes();
  st.h2d_bytes = h2d_bytes_;
  st.h2d_bandwidth_bytes_per_second = h2d_bandwidth_;
  if (last_step_seconds_ > 0) {
    st.h2d_bytes_per_second = static_cast<double>(last_step_h2d_bytes_) / last_step_seconds_;
    if (h2d_bandwidth_ > 0)
      st.staging_occupancy = std::min(1.0, st.h2d_bytes_per_second / h2d_bandwidth_);
  }
  if (last_step_tokens_ > 0)
    st.h2d_bytes_per_token =
        static_cast<double>(last_step_h2d_bytes_) / static_cast<double>(last_step_tokens_);
  st.replans = replans_;
  st.last_replan_reason = last_replan_reason_;
}

namespace {

// The expert cache's re-plan (replan_experts): at most this often, so that the routing counts
// of a few hundred tokens decide and the copies stay a small share of the time (H200: 55 GB/s
// host-to-device, kExpertReplanCopyBytes of copies take ~1.2 ms of a 500 ms interval).
constexpr double kExpertReplanSeconds = 0.5;
// The decayed counts' half-life: the hot set follows a new conversation within seconds, not
// token by token.
constexpr double kExpertCountHalfLifeSeconds = 4.0;
// The most expert bytes one re-plan copies to the device (the plan's max_promotions).
constexpr uint64_t kExpertReplanCopyBytes = uint64_t{64} << 20;

}  // namespace

void CudaBackend::drain_expert_counts() {
  CudaMoe* moe = model_->moe();
  if (!moe) return;
  const auto now = std::chrono::steady_clock::now();
  moe->collect(expert_interval_, model_->stream());
  const double seconds = expert_drained_.time_since_epoch().count() == 0
                             ? 0.0
                             : std::chrono::duration<double>(now - expert_drained_).count();
  const std::vector<int32_t>& fresh = moe->last_counts();
  decay_routing_counts(expert_decayed_, fresh.data(), fresh.size(),
                       routing_decay_keep(seconds, kExpertCountHalfLifeSeconds));
  expert_drained_ = now;
}

void CudaBackend::replan_experts() {
  CudaMoe* moe = model_->moe();
  if (!moe || moe->all_resident() || moe->cache_slots() == 0) return;
  const auto now = std::chrono::steady_clock::now();
  if (expert_replanned_.time_since_epoch().count() == 0) expert_replanned_ = now;
  if (std::chrono::duration<double>(now - expert_replanned_).count() < kExpertReplanSeconds) return;
  expert_replanned_ = now;
  drain_expert_counts();
  ExpertPlacementInput in;
  in.n_layer = moe->n_layer();
  in.n_expert = moe->n_expert();
  in.expert_bytes = moe->slot_bytes();  // one slot per expert: the plan holds cache_slots()
  in.budget_bytes = static_cast<uint64_t>(moe->cache_slots()) * moe->slot_bytes();
  in.routing_counts = expert_decayed_;
  in.max_promotions =
      std::max<int64_t>(1, static_cast<int64_t>(kExpertReplanCopyBytes / moe->slot_bytes()));
  ExpertPlacement current;
  current.n_layer = moe->n_layer();
  current.n_expert = moe->n_expert();
  current.resident = moe->resident();
  const ExpertPlacement next = plan_expert_placement(in, &current);
  if (next.resident != current.resident) moe->apply(next.resident, model_->stream());
}

void CudaBackend::collect_expert_telemetry(ExpertTelemetry& out) {
  CudaMoe* moe = model_->moe();
  if (!moe || pending_.active) return;
  drain_expert_counts();
  MoeStats& s = expert_interval_;
  out.n_layer = static_cast<int32_t>(moe->n_layer());
  out.n_expert = static_cast<int32_t>(moe->n_expert());
  out.resident = moe->resident();
  out.routed = std::move(s.routed);
  out.streamed = std::move(s.streamed);
  out.hits = s.hits;
  out.misses = s.misses;
  out.bytes_streamed = s.bytes_streamed;
  out.host_computed = s.host_choices;
  out.bytes_host = s.host_bytes;
  out.tokens = s.tokens;
  out.expert_bytes = moe->max_expert_bytes();
  out.promotions = moe->promotions() - expert_promotions_reported_;
  out.demotions = moe->demotions() - expert_demotions_reported_;
  expert_promotions_reported_ = moe->promotions();
  expert_demotions_reported_ = moe->demotions();
  s = MoeStats{};
}

uint64_t CudaBackend::make_room(uint64_t bytes, const std::string& reason) {
  if (pending_.active) throw UsageError("CUDA backend: make_room() during a step");
  // A mixture of experts gives back expert cache first: a missed expert costs its own bytes over
  // PCIe for the tokens routed to it, a streamed layer all of its matrices on every pass.
  // The tables change, not the graphs' buffers: no re-capture.
  uint64_t experts_freed = 0;
  if (CudaMoe* moe = model_->moe(); moe && !moe->all_resident()) {
    experts_freed = moe->release_cache(bytes, model_->stream());
    if (experts_freed >= bytes) return experts_freed;
    bytes -= experts_freed;
  }
  const WeightStreamer& w = model_->streamer();
  const uint64_t before = w.resident_bytes() + w.staging_bytes();
  // The fewest demotions that free `bytes`, in one re-plan: the most resident layers (from the
  // first) whose weights and staging leave them free, several layers at once for a large
  // demand. All or nothing: when no plan frees `bytes`, nothing moves.
  for (int32_t cap = w.resident_layers() - 1; cap >= 0; --cap) {
    const PlacementInput in =
        model_->placement_input(std::numeric_limits<uint64_t>::max() / 4, cap, 0);
    const PlacementPlan plan = plan_placement(in);
    const uint64_t after = plan.device_bytes() - in.weights.fixed_bytes;
    if (after + bytes > before) continue;
    if (!model_->replan(plan)) return experts_freed;
    const uint64_t now = w.resident_bytes() + w.staging_bytes();
    placement_changed(reason);
    return experts_freed + (before > now ? before - now : 0);
  }
  return experts_freed;
}

void CudaBackend::rebalance(const std::string& reason, uint64_t kv_growth_bytes) {
  if (pending_.active) throw UsageError("CUDA backend: rebalance() during a step");
  MemoryManager& memory = *memory_;
  const uint64_t kv_in_use =
      memory.bytes(MemoryCategory::KvCommitted) + memory.bytes(MemoryCategory::KvPool);
  const auto plan_for = [&](uint64_t kv_bytes) {
    const PlacementInput in = model_->placement_input(
        memory.budget_bytes(), -1, std::max(kv_bytes, model_->kv_reserve_bytes()));
    return std::make_pair(in, plan_placement(in));
  };
  // Room for the KV planned ahead where the budget allows it, else for what the KV holds now.
  auto planned = plan_for(kv_in_use + kv_growth_bytes);
  if (!planned.second.loads) planned = plan_for(kv_in_use);
  const auto& [in, plan] = planned;
  if (!plan.loads) throw CapacityError(describe_shortfall(in, plan));
  if (plan.layer_streamed == model_->streamer().plan().layer_streamed) return;
  if (model_->replan(plan)) placement_changed(reason);
}

}  // namespace granule::cuda

namespace granule {

std::unique_ptr<Backend> make_cuda_backend(const BackendInit& init) {
  return std::make_unique<cuda::CudaBackend>(init);
}

CudaDeviceInfo probe_cuda_device() {
  std::string why;
  if (!cuda::cuda_available(&why)) throw DeviceError(why);
  constexpr int kDevice = 0;  // the device CudaBackend runs on
  cudaDeviceProp prop{};
  cuda::check_cuda(cudaGetDeviceProperties(&prop, kDevice), "cudaGetDeviceProperties");
  size_t free_bytes = 0, total_bytes = 0;
  cuda::check_cuda(cudaSetDevice(kDevice), "cudaSetDevice");
  cuda::check_cuda(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  const uint64_t budget = cuda::default_budget(free_bytes, total_bytes);
  // The bandwidth an engine (or an earlier probe) measured in this process; only the first
  // probe before any engine measures, through a ledger of the default budget.
  MemoryManager ledger(budget, total_bytes);
  return {prop.name, budget, cuda::h2d_bandwidth(ledger)};
}

}  // namespace granule
