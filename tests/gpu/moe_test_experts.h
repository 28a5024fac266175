// What the MoE kernel tests share (moe_kernels_test, moe_mma_kernels_test): experts on the
// device and in mapped host memory behind a pointer table, activations rounded through int8
// blocks as the kernels read them, and the activation in double.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "backends/cpu/gemma_ops.h"
#include "backends/cpu/ops.h"
#include "gpu_test_support.h"
#include "granule/tensor_type.h"
#include "kernel_test_inputs.h"
#include "model/weight_split.h"
#include "moe.cuh"

namespace granule::gpu_test {

// Mapped pinned host memory holding a copy of some bytes (experts "in host memory").
struct HostMapped {
  void* host = nullptr;
  const uint8_t* device = nullptr;
  explicit HostMapped(const std::vector<uint8_t>& bytes) {
    if (cudaHostAlloc(&host, bytes.size(), cudaHostAllocMapped) != cudaSuccess)
      throw std::runtime_error("cudaHostAlloc failed");
    std::memcpy(host, bytes.data(), bytes.size());
    void* d = nullptr;
    if (cudaHostGetDevicePointer(&d, host, 0) != cudaSuccess)
      throw std::runtime_error("cudaHostGetDevicePointer failed");
    device = static_cast<const uint8_t*>(d);
  }
  ~HostMapped() { cudaFreeHost(host); }
  HostMapped(const HostMapped&) = delete;
  HostMapped& operator=(const HostMapped&) = delete;
};

// `rows` GGUF rows of `cols` elements (enc.bytes) as CudaMoe lays experts out for the kernels
// (write_expert_rows: the split layout for Q4_0, Q8_0, IQ4_NL and MXFP4), expert_row_bytes
// apart, with 16 bytes of slack after them (as CudaMoe keeps).
inline std::vector<uint8_t> expert_layout(TensorType type, const Encoded& enc, int64_t rows,
                                          int64_t cols) {
  const auto t = static_cast<uint32_t>(type);
  std::vector<uint8_t> out(static_cast<size_t>(rows * expert_row_bytes(t, cols)) + 16, 0xEE);
  write_expert_rows(t, enc.bytes.data(), rows, cols, out.data());
  return out;
}

// One matrix of every expert (n_expert slabs of rows x cols), laid out as CudaMoe lays it out, on
// the device and in mapped host memory, with a pointer table whose odd experts point into the
// host copy.
struct ExpertMatrix {
  TensorType type;
  Encoded enc;
  int64_t rows = 0, cols = 0;
  int64_t row_bytes = 0;  // as the kernels read them
  std::vector<uint8_t> laid_out;
  DeviceArray<uint8_t> device;
  HostMapped host;
  DeviceArray<const void*> table;
  DeviceArray<const void*> device_table;  // every expert on the device
  std::vector<float> bias;                // [n_expert][rows], empty: none
  DeviceArray<float> bias_device;
  ExpertMatrix(TensorType type_, int n_expert, int64_t rows_, int64_t cols_, bool with_bias,
               std::mt19937& rng)
      : type(type_),
        enc(encode(type_, n_expert * rows_, cols_, rng)),
        rows(rows_),
        cols(cols_),
        row_bytes(expert_row_bytes(static_cast<uint32_t>(type_), cols_)),
        laid_out(expert_layout(type_, enc, n_expert * rows_, cols_)),
        device(laid_out),
        host(laid_out),
        table(static_cast<size_t>(n_expert)),
        device_table(static_cast<size_t>(n_expert)),
        bias(with_bias ? random_floats(static_cast<size_t>(n_expert * rows_), rng, 0.3f)
                       : std::vector<float>{}),
        bias_device(bias.empty() ? std::vector<float>{0.0f} : bias) {
    std::vector<const void*> t(static_cast<size_t>(n_expert));
    const int64_t slab = rows * row_bytes;
    for (int e = 0; e < n_expert; ++e)
      t[static_cast<size_t>(e)] = (e % 2 ? host.device : device.get()) + e * slab;
    table.upload(t);
    for (int e = 0; e < n_expert; ++e) t[static_cast<size_t>(e)] = device.get() + e * slab;
    device_table.upload(t);
  }
  // host_odd: the odd experts read from mapped host memory; else every one from the device.
  kernels::MoeMatrix view(bool host_odd = true) const {
    return {.table = host_odd ? table.get() : device_table.get(),
            .type = static_cast<uint32_t>(type),
            .row_bytes = row_bytes,
            .bias = bias.empty() ? nullptr : bias_device.get()};
  }
  // Row o of expert e, decoded, and its bias (0 without).
  const float* row(int e, int64_t o) const { return enc.decoded.data() + (e * rows + o) * cols; }
  double bias_of(int e, int64_t o) const {
    return bias.empty() ? 0.0 : bias[static_cast<size_t>(e * rows + o)];
  }
};

// x rounded through int8 blocks of 32 by `rule`, as qs/ds the kernels read, and its values.
struct Q8Host {
  std::vector<int8_t> qs;
  std::vector<float2> ds;
  std::vector<float> values;
};
inline Q8Host quantize_host(const std::vector<float>& x, cpu::Q8Rounding rule) {
  Q8Host q;
  q.qs.resize(x.size());
  q.values = x;
  cpu::round_through_q8(q.values.data(), static_cast<int64_t>(x.size()), rule);
  for (size_t b = 0; b < x.size() / 32; ++b) {
    float amax = 0.0f;
    for (size_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
    const float d = amax / 127.0f;
    int sum = 0;
    for (size_t i = 0; i < 32; ++i) {
      const int v = amax == 0.0f ? 0 : static_cast<int>(std::lrint(q.values[b * 32 + i] / d));
      q.qs[b * 32 + i] = static_cast<int8_t>(v);
      sum += v;
    }
    q.ds.push_back(make_float2(d, d * static_cast<float>(sum)));
  }
  return q;
}

// The gate/up epilogue in double; GeGLU as the CPU reference's (gelu_tanh_ggml: ggml's f16
// table entry of g rounded to f16) over g rounded to f32.
inline double moe_activate(kernels::MoeActivation act, double g, double u) {
  if (act == kernels::MoeActivation::Geglu) {
    const auto gf = static_cast<float>(g);
    return static_cast<double>(gf >= 10.0f ? gf : cpu::gelu_tanh_ggml(gf)) * u;
  }
  if (act == kernels::MoeActivation::SwigluClamped) {
    g = std::min(g, 7.0);
    u = std::clamp(u, -7.0, 7.0);
    return g / (1.0 + std::exp(-1.702 * g)) * (u + 1.0);
  }
  return g / (1.0 + std::exp(-g)) * u;
}

// What the activation's own rounding adds to a gate/up bound where g differs from the reference's
// by a rounding: GeGLU rounds g and gelu(g) to f16, so a g on either side of an f16 rounding
// boundary moves gelu by up to one f16 step of g times its slope (at most 1.13) and one f16 step
// of gelu(g), each 2^-10 relative at most; 0 for the SwiGLUs (no rounding step).
inline double moe_activation_slack(kernels::MoeActivation act, double g, double u) {
  if (act != kernels::MoeActivation::Geglu) return 0.0;
  const double gelu = std::fabs(moe_activate(act, g, 1.0));
  return std::fabs(u) * std::ldexp(1.13 * std::fabs(g) + gelu, -10) + 1e-6;
}

}  // namespace granule::gpu_test
