// CudaModel's head: the output norm and product into the logits (the soft-cap where the model
// has one), the device sampler (greedy argmax or the sampling kernel over the uploaded
// parameters and histories), and the logits' and tokens' downloads.
#include <algorithm>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_model.h"
#include "gemma_ops.cuh"
#include "granule/error.h"
#include "matvec.cuh"
#include "rms_norm.cuh"
#include "sampling.cuh"

namespace granule::cuda {

namespace k = granule::kernels;

void CudaModel::run_head(int first_logit_row, int count) {
  const ModelConfig& c = config_;
  if (edge_norms_fused_ && first_logit_row == 0 && count == 1) {
    // The last down projection handed the output norm's input over (one row: row 0).
    float* const logits_out[1] = {logits_.as<float>()};
    matvec(&output_, logits_out, 1, 1, false, nullptr, true);
    soft_cap_logits(1);
    return;
  }
  k::RmsNormOutputs out;
  if (k::matvec_reads_q8(output_.type, output_.split))
    out.q8 = {q8_qs_.as<int8_t>(), q8_ds_.as<float2>()};
  else
    out.f32 = normed_.as<float>();
  const int32_t* rows = inputs_.as<int32_t>() + kLogitRows * max_rows_ + first_logit_row;
  check_launch(
      k::launch_rms_norm(hidden_.as<float>(), output_norm_, count, static_cast<int>(c.n_embd),
                         c.rms_eps, out, kernel_config_, stream_.get(), rows),
      "rms_norm");
  float* const logits_out[1] = {logits_.as<float>()};
  matvec(&output_, logits_out, 1, count, false, normed_.as<float>());
  soft_cap_logits(count);
}

void CudaModel::soft_cap_logits(int count) {
  if (config_.final_logit_softcap <= 0.0f) return;
  check_launch(
      k::launch_soft_cap(logits_.as<float>(), static_cast<int64_t>(count) * config_.n_vocab,
                         config_.final_logit_softcap, kernel_config_, stream_.get()),
      "soft_cap");
}

void CudaModel::upload_sampling(const std::vector<kernels::DeviceSamplingParams>& params,
                                const std::vector<std::vector<int32_t>>& histories) {
  const size_t n = params.size();
  if (n > static_cast<size_t>(max_rows_))
    throw UsageError("CUDA backend: sampling for more rows than the workspace holds");
  if (dirty_end_ == 0) wait_for_inputs_sent();
  auto* base = inputs_host_.as<uint8_t>();
  std::copy(params.begin(), params.end(),
            reinterpret_cast<kernels::DeviceSamplingParams*>(base + params_offset_));
  auto* lengths = reinterpret_cast<int32_t*>(base + lengths_offset_);
  auto* hist = reinterpret_cast<int32_t*>(base + history_offset_);
  for (size_t i = 0; i < n; ++i) {
    const std::vector<int32_t>& h = i < histories.size() ? histories[i] : std::vector<int32_t>{};
    const size_t keep = std::min(h.size(), static_cast<size_t>(history_capacity_));
    std::copy(h.end() - static_cast<std::ptrdiff_t>(keep), h.end(), hist + i * history_capacity_);
    lengths[i] = static_cast<int32_t>(keep);
  }
  dirty_end_ = std::max(dirty_end_, history_offset_ + n * history_capacity_ * sizeof(int32_t));
}

void CudaModel::sample(int count, bool greedy) {
  const int n_vocab = static_cast<int>(config_.n_vocab);
  if (greedy) {
    k::ArgmaxWorkspace scratch;
    scratch.best = argmax_scratch_.as<unsigned long long>();
    scratch.counters = reinterpret_cast<int*>(scratch.best + max_rows_);
    check_launch(
        k::launch_argmax(logits_.as<float>(), n_vocab, count, n_vocab, tokens_out_.as<int32_t>(),
                         scratch, kernel_config_, stream_.get()),
        "argmax");
    return;
  }
  k::SamplingArgs a;
  a.logits = logits_.as<float>();
  a.logits_stride = n_vocab;
  a.rows = count;
  a.n_vocab = n_vocab;
  auto* device_in = inputs_.as<uint8_t>();
  a.params = reinterpret_cast<const k::DeviceSamplingParams*>(device_in + params_offset_);
  a.history = reinterpret_cast<const int32_t*>(device_in + history_offset_);
  a.history_stride = history_capacity_;
  a.history_length = reinterpret_cast<const int32_t*>(device_in + lengths_offset_);
  a.tokens = tokens_out_.as<int32_t>();
  check_launch(k::launch_sampling(a, stream_.get()), "sampling");
}

void CudaModel::copy_logits(int count, float* host) const {
  check_cuda(cudaMemcpyAsync(host, logits_.get(),
                             static_cast<size_t>(count) * config_.n_vocab * sizeof(float),
                             cudaMemcpyDeviceToHost, stream_.get()),
             "downloading logits");
  stream_.synchronize();
}

void CudaModel::copy_tokens(int count, int32_t* host) const {
  queue_token_download(count);
  read_tokens(count, host);
}

}  // namespace granule::cuda
