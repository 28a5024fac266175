// CudaModel's side of the host rows (host_rows.h): a streamed layer split with the host runs
// the unfused products in four rounds ({Q, K, V}, {O}, {gate, up -> h}, {down}). A round posts
// its f32 input to the host (host_channel.cuh), computes the device's first rows of each matrix
// (DeviceMatrix copies with fewer rows, writing into outputs of the whole width), then joins
// the host's last rows: written for Q/K/V and h, added for O and down (which accumulate into
// the residual). Everything is a kernel on the model's stream, so a decode graph holds it.
#include <algorithm>
#include <new>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_model.h"
#include "backends/cuda/h2d_bandwidth.h"
#include "backends/cuda/host_rows.h"
#include "granule/error.h"
#include "granule/log.h"
#include "host_channel.cuh"
#include "matvec.cuh"
#include "quantize_activations.cuh"
#include "rms_norm.cuh"
#include "swiglu.cuh"

namespace granule::cuda {

namespace k = granule::kernels;

void CudaModel::setup_host_rows(const BackendInit& init) {
  const int setting = init.options.cuda_host_rows;
  if (setting == 0 || streamer_->streamed_layers() == 0 || moe_) return;
  try {
    host_rows_ = HostRows::create(config_, init.weights, layout_, *streamer_, memory_, setting,
                                  init.options.cpu_threads, h2d_bandwidth(memory_));
  } catch (const CapacityError&) {  // the channel's few device words did not fit
    logger("engine.cuda")->warn("host rows off: the budget has no room for the host's channel");
    host_rows_.reset();
  } catch (const std::bad_alloc&) {  // a speed-up, not a reason to fail the load
    logger("engine.cuda")
        ->warn(
            "host rows off: host memory refused the int8 copies; every streamed byte crosses "
            "PCIe");
    host_rows_.reset();
  }
  if (!host_rows_) return;
  for (size_t i = 0; i < layers_.size(); ++i)
    if (host_rows_->splits(i))
      streamer_->set_split_copies(i, host_rows_->device_ranges(i, layout_.layers[i]));
}

bool CudaModel::splits_now(size_t layer) const {
  return split_pass_ && streamer_->streamed(layer) && host_rows_->splits(layer);
}

uint64_t CudaModel::streamed_bytes_for(int n_rows) const {
  return host_rows_ && n_rows <= HostRows::kMaxRows ? streamer_->split_bytes_per_pass()
                                                    : streamer_->streamed_bytes_per_pass();
}

void CudaModel::check_host_rows() const {
  if (host_rows_) host_rows_->channel().check();
  if (moe_) moe_->check_host();
}

void CudaModel::host_rows_round(int layer, uint32_t round, const DeviceMatrix* mats, const int* ids,
                                float* const* outs, int count, int n_rows, bool accumulate,
                                const float* x, int64_t width) {
  HostRows& h = *host_rows_;
  HostChannel& channel = h.channel();
  const auto li = static_cast<size_t>(layer);
  bool host = false;
  for (int i = 0; i < count; ++i) host |= h.part(li, ids[i]).split();
  if (host)
    check_launch(k::launch_host_post(channel.words(), x, width, static_cast<int>(width), n_rows,
                                     channel.device_x(),
                                     HostRows::job(li, static_cast<HostRows::Round>(round)),
                                     kernel_config_, stream_.get()),
                 "host_post");
  // The device's rows: each matrix cut to its first rows, writing at the whole width's stride.
  DeviceMatrix device[k::kMaxMatvecTasks];
  float* device_outs[k::kMaxMatvecTasks];
  int64_t strides[k::kMaxMatvecTasks];
  int n_device = 0;
  for (int i = 0; i < count; ++i) {
    const HostRows::Part& p = h.part(li, ids[i]);
    if (p.first == 0) continue;  // the host computes every row
    device[n_device] = mats[i];
    device[n_device].rows = p.first;
    device_outs[n_device] = outs[i];
    strides[n_device] = mats[i].rows;
    ++n_device;
  }
  if (n_device > 0)
    matvec(device, device_outs, n_device, n_rows, accumulate, x, false, nullptr, strides);
  if (!host) return;
  k::HostRowsOut joined[k::kMaxHostRowsOuts];
  int n_joined = 0;
  for (int i = 0; i < count; ++i) {
    const HostRows::Part& p = h.part(li, ids[i]);
    if (!p.split()) continue;
    k::HostRowsOut& o = joined[n_joined++];
    o.y = outs[i];
    o.y_stride = mats[i].rows;
    o.first = static_cast<int>(p.first);
    o.cols = static_cast<int>(p.rows - p.first);
    o.offset = h.answer_offset(li, ids[i], n_rows);
    o.accumulate = accumulate;
  }
  check_launch(k::launch_host_join(channel.words(), joined, n_joined, n_rows, channel.device_y(),
                                   kernel_config_, stream_.get()),
               "host_join");
}

void CudaModel::layer_host_rows(const DeviceLayer& l, int layer, int n_rows) {
  const ModelConfig& c = config_;
  HostRows& h = *host_rows_;
  HostChannel& channel = h.channel();
  const auto li = static_cast<size_t>(layer);
  float* hidden = hidden_.as<float>();
  float* normed = normed_.as<float>();
  const k::ActivationQ8 q8{q8_qs_.as<int8_t>(), q8_ds_.as<float2>()};
  // A norm's output in f32 (what the host reads) and as int8 where a device product reads it.
  auto norm = [&](const float* weight, std::initializer_list<const DeviceMatrix*> readers) {
    k::RmsNormOutputs out;
    out.f32 = normed;
    for (const DeviceMatrix* m : readers)
      if (k::matvec_reads_q8(m->type, m->split)) out.q8 = q8;
    check_launch(k::launch_rms_norm(hidden, weight, n_rows, static_cast<int>(c.n_embd), c.rms_eps,
                                    out, kernel_config_, stream_.get()),
                 "rms_norm");
  };

  // Attention: Q/K/V (rope_kv adds their biases and applies the Q/K norms to the joined rows),
  // then the output projection into the residual.
  norm(l.attn_norm, {&l.wq, &l.wk, &l.wv});
  const DeviceMatrix qkv[3] = {l.wq, l.wk, l.wv};
  const int qkv_ids[3] = {HostRows::kQ, HostRows::kK, HostRows::kV};
  float* const qkv_out[3] = {q_.as<float>(), k_.as<float>(), v_.as<float>()};
  host_rows_round(layer, HostRows::kQkv, qkv, qkv_ids, qkv_out, 3, n_rows, false, normed, c.n_embd);
  attention(layer, n_rows);  // attn_ in f32, and int8 where the output projection reads it
  const int o_id[1] = {HostRows::kO};
  float* const hidden_out[1] = {hidden};
  host_rows_round(layer, HostRows::kOut, &l.wo, o_id, hidden_out, 1, n_rows, true,
                  attn_.as<float>(), l.wo.cols);

  // Feed-forward: gate and up on the device's rows, SwiGLU into h (the host's rows of h come
  // with the join, computed there), then the down projection into the residual.
  norm(l.ffn_norm, {&l.w_gate, &l.w_up});
  float* h_rows = gate_.as<float>();
  const HostRows::Part& gate = h.part(li, HostRows::kGate);
  if (gate.split())
    check_launch(
        k::launch_host_post(channel.words(), normed, c.n_embd, static_cast<int>(c.n_embd), n_rows,
                            channel.device_x(), HostRows::job(li, HostRows::kGateUp),
                            kernel_config_, stream_.get()),
        "host_post");
  if (gate.first > 0) {
    DeviceMatrix gu[2] = {l.w_gate, l.w_up};
    gu[0].rows = gu[1].rows = gate.first;
    float* const gu_out[2] = {gate_.as<float>(), up_.as<float>()};
    const int64_t strides[2] = {c.n_ff, c.n_ff};
    matvec(gu, gu_out, 1, n_rows, false, normed, false, nullptr, strides);
    matvec(gu + 1, gu_out + 1, 1, n_rows, false, normed, false, nullptr, strides + 1);
    // Over every row of h: the host's part is overwritten by the join below.
    check_launch(k::launch_swiglu_f32(gate_.as<float>(), up_.as<float>(), n_rows * c.n_ff, h_rows,
                                      kernel_config_, stream_.get()),
                 "swiglu");
  }
  if (gate.split()) {
    k::HostRowsOut o;
    o.y = h_rows;
    o.y_stride = c.n_ff;
    o.first = static_cast<int>(gate.first);
    o.cols = static_cast<int>(gate.rows - gate.first);
    o.offset = 0;
    check_launch(k::launch_host_join(channel.words(), &o, 1, n_rows, channel.device_y(),
                                     kernel_config_, stream_.get()),
                 "host_join");
  }
  if (k::matvec_reads_q8(l.w_down.type, l.w_down.split))
    check_launch(k::launch_quantize_q8(h_rows, n_rows, static_cast<int>(c.n_ff), q8, kernel_config_,
                                       stream_.get()),
                 "quantize_q8");
  const int down_id[1] = {HostRows::kDown};
  host_rows_round(layer, HostRows::kDownRound, &l.w_down, down_id, hidden_out, 1, n_rows, true,
                  h_rows, c.n_ff);
}

}  // namespace granule::cuda
