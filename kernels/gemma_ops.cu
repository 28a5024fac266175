// Gemma's elementwise operators, grid-stride, and Gemma 4's per-head attention inputs and
// per-layer embedding inputs, a block per head / per (row, layer) (gemma_ops.cuh).
#include "common.cuh"
#include "gemma_ops.cuh"
#include "rope_kv.cuh"  // rope_rotation

namespace granule::kernels {
namespace {

// ggml's GGML_GELU_FP16 table entry for x: gelu of x rounded to f16, rounded to f16; the tails
// as ggml's CPU takes them (backends/cpu/gemma_ops.cpp is the reference).
__device__ __forceinline__ float geglu_one(float g, float up) {
  if (g >= 10.0f) return g * up;
  if (g <= -10.0f) return 0.0f * up;
  constexpr float kCoefA = 0.044715f;
  constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
  const float h = __half2float(__float2half_rn(g));
  const float inner =
      __fmul_rn(__fmul_rn(kSqrt2OverPi, h), __fadd_rn(1.0f, __fmul_rn(__fmul_rn(kCoefA, h), h)));
  const float gelu = __fmul_rn(__fmul_rn(0.5f, h), __fadd_rn(1.0f, tanhf(inner)));
  return __half2float(__float2half_rn(gelu)) * up;
}

__global__ void geglu_f32_kernel(const float* gate, const float* __restrict__ up, int64_t count,
                                 float* out) {
  wait_for_previous_kernel();
  allow_next_kernel();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = geglu_one(gate[i], up[i]);
}

__global__ void geglu_to_f16_kernel(const float* __restrict__ gate, const float* __restrict__ up,
                                    int64_t count, __half* __restrict__ out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __float2half_rn(geglu_one(gate[i], up[i]));
}

__global__ void scale_kernel(float* x, int64_t count, float factor) {
  wait_for_previous_kernel();
  allow_next_kernel();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = __fmul_rn(x[i], factor);
}

__global__ void zero_kernel(float* x, int64_t count) {
  wait_for_previous_kernel();
  allow_next_kernel();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = 0.0f;
}

__global__ void soft_cap_kernel(float* x, int64_t count, float cap, float inverse) {
  wait_for_previous_kernel();
  allow_next_kernel();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = __fmul_rn(tanhf(__fmul_rn(x[i], inverse)), cap);
}

constexpr int kMaxGemma4HeadDim = 512;
constexpr int kHeadThreads = 128;

// One block per (row, head): heads of Q, then K, then V. Each thread owns dimensions e, e + 128,
// ...; the normed head goes through shared memory so that a thread reads its NeoX partner.
__global__ void __launch_bounds__(kHeadThreads) gemma4_qkv_kernel(Gemma4QkvArgs a) {
  __shared__ float xs[kMaxGemma4HeadDim];
  __shared__ float scratch[32];
  const int r = blockIdx.x, head = blockIdx.y, hd = a.head_dim;
  int kind = 0, h = head;  // 0 = Q, 1 = K, 2 = V
  if (head >= a.n_head + a.n_kv) {
    kind = 2;
    h = head - a.n_head - a.n_kv;
  } else if (head >= a.n_head) {
    kind = 1;
    h = head - a.n_head;
  }
  const int slot = a.slots[r];
  // K and V blocks of a shared-KV layer or a padding row have nothing to do (block (0, 0) is a
  // Q block: it always waits, so the grid never completes before the kernel it follows).
  if (kind != 0 && (!a.write_kv || slot < 0)) return;
  wait_for_previous_kernel();
  allow_next_kernel();
  const int64_t kv_width = static_cast<int64_t>(a.n_kv) * hd;
  const float* src = kind == 0   ? a.q + r * static_cast<int64_t>(a.n_head) * hd + h * hd
                     : kind == 1 ? a.k + r * kv_width + h * hd
                                 : a.v + r * kv_width + h * hd;
  float ss = 0.0f;
  for (int e = threadIdx.x; e < hd; e += blockDim.x) {
    const float x = src[e];
    xs[e] = x;
    ss += x * x;
  }
  const float scale = rsqrtf(block_sum(ss, scratch) / hd + a.eps);
  const float* weight = kind == 0 ? a.q_norm : kind == 1 ? a.k_norm : nullptr;
  for (int e = threadIdx.x; e < hd; e += blockDim.x)
    xs[e] = weight ? xs[e] * scale * weight[e] : xs[e] * scale;
  __syncthreads();
  const int32_t position = a.positions[r];
  const int half = a.rope_dims / 2;
  __half* kv = nullptr;
  if (kind != 0)
    kv = a.slot_base[slot] + a.kv_offset + static_cast<int64_t>(position) * a.token_stride +
         (kind == 2 ? kv_width : 0) + h * hd;
  for (int e = threadIdx.x; e < hd; e += blockDim.x) {
    float y = xs[e];
    if (kind != 2 && e < a.rope_dims) {
      const int i = e < half ? e : e - half;
      float s, c;
      rope_rotation(position, a.frequencies[i], &s, &c);
      y = e < half ? xs[e] * c - xs[e + half] * s : xs[e - half] * s + xs[e] * c;
    }
    if (kind == 0)
      a.q[r * static_cast<int64_t>(a.n_head) * hd + h * hd + e] = y;
    else
      kv[e] = __float2half_rn(y);
  }
}

__global__ void __launch_bounds__(kHeadThreads)
    gemma4_ple_inputs_kernel(float* projected, const float* __restrict__ table,
                             const float* __restrict__ norm, int n_layer, int n_pl, float eps,
                             float projection_scale, float table_scale, float input_scale) {
  __shared__ float scratch[32];
  wait_for_previous_kernel();
  allow_next_kernel();
  const int64_t at = (static_cast<int64_t>(blockIdx.x) * n_layer + blockIdx.y) * n_pl;
  float* p = projected + at;
  float ss = 0.0f;
  for (int e = threadIdx.x; e < n_pl; e += blockDim.x) {
    const float x = p[e] * projection_scale;
    ss += x * x;
  }
  const float scale = rsqrtf(block_sum(ss, scratch) / n_pl + eps);
  for (int e = threadIdx.x; e < n_pl; e += blockDim.x)
    p[e] = (p[e] * projection_scale * scale * norm[e] + table[at + e] * table_scale) * input_scale;
}

__global__ void gelu_times_kernel(const float* gate, const float* __restrict__ inputs,
                                  int64_t input_stride, int64_t count, int n, float* out) {
  wait_for_previous_kernel();
  allow_next_kernel();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = geglu_one(gate[i], inputs[(i / n) * input_stride + i % n]);
}

__global__ void gemma4_table_rows_kernel(const int32_t* __restrict__ tokens, int64_t count,
                                         int n_layer, int64_t n_vocab, int32_t* __restrict__ rows) {
  wait_for_previous_kernel();
  allow_next_kernel();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t token = tokens[i / n_layer];
    rows[i] =
        token >= 0 && token < n_vocab ? token * n_layer + static_cast<int32_t>(i % n_layer) : -1;
  }
}

constexpr int kWideWarps = 8;

template <int EPL>
__global__ void __launch_bounds__(kWideWarps* kWarpSize) attention_wide_kernel(AttentionArgs a) {
  constexpr int kHeadDim = EPL * kWarpSize;
  __shared__ float sm_acc[kWideWarps][kHeadDim];
  __shared__ float sm_m[kWideWarps], sm_l[kWideWarps];
  wait_for_previous_kernel();
  allow_next_kernel();
  const int row = blockIdx.x, h = blockIdx.y;
  const int length = a.lengths[row];
  if (length <= 0) return;  // padding: no output
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int first = a.window > 0 ? max(0, length - a.window) : 0;
  const int kv_head = h / (a.n_head / a.n_kv);
  const __half* base = a.slot_base[a.slots[row]] + a.kv_offset +
                       static_cast<int64_t>(a.layer) * 2 * a.n_kv * kHeadDim + kv_head * kHeadDim +
                       lane * EPL;
  const int64_t v_offset = static_cast<int64_t>(a.n_kv) * kHeadDim;
  float q[EPL], acc[EPL];
  const float* q_row = a.q + row * a.q_stride + h * kHeadDim + lane * EPL;
#pragma unroll
  for (int j = 0; j < EPL; ++j) {
    q[j] = q_row[j] * a.scale;
    acc[j] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int t = first + warp; t < length; t += kWideWarps) {
    const __half2* kp =
        reinterpret_cast<const __half2*>(base + static_cast<int64_t>(t) * a.token_stride);
    const __half2* vp = reinterpret_cast<const __half2*>(
        base + static_cast<int64_t>(t) * a.token_stride + v_offset);
    float dot = 0.0f;
#pragma unroll
    for (int j = 0; j < EPL / 2; ++j) {
      const float2 k2 = __half22float2(kp[j]);
      dot += q[2 * j] * k2.x + q[2 * j + 1] * k2.y;
    }
    dot = warp_sum(dot);
    const float m_new = fmaxf(m, dot);
    const float correction = expf(m - m_new), p = expf(dot - m_new);
    l = l * correction + p;
#pragma unroll
    for (int j = 0; j < EPL / 2; ++j) {
      const float2 v2 = __half22float2(vp[j]);
      acc[2 * j] = acc[2 * j] * correction + p * v2.x;
      acc[2 * j + 1] = acc[2 * j + 1] * correction + p * v2.y;
    }
    m = m_new;
  }
#pragma unroll
  for (int j = 0; j < EPL; ++j) sm_acc[warp][lane * EPL + j] = acc[j];
  if (lane == 0) {
    sm_m[warp] = m;
    sm_l[warp] = l;
  }
  __syncthreads();
  float m_all = -INFINITY;
  for (int w = 0; w < kWideWarps; ++w) m_all = fmaxf(m_all, sm_m[w]);
  float weight[kWideWarps], l_all = 0.0f;
  for (int w = 0; w < kWideWarps; ++w) {
    weight[w] = sm_m[w] == -INFINITY ? 0.0f : expf(sm_m[w] - m_all);
    l_all += sm_l[w] * weight[w];
  }
  if (a.sinks) l_all += expf(a.sinks[h] - m_all);
  const float inverse = 1.0f / l_all;
  for (int d = threadIdx.x; d < kHeadDim; d += blockDim.x) {
    float sum = 0.0f;
    for (int w = 0; w < kWideWarps; ++w) sum += sm_acc[w][d] * weight[w];
    const float y = sum * inverse;
    a.out[row * a.out_stride + h * kHeadDim + d] = y;
    if (a.out_f16) a.out_f16[row * a.out_stride + h * kHeadDim + d] = __float2half_rn(y);
  }
}

constexpr int kThreads = 256;

int grid_for(int64_t count) {
  return static_cast<int>(std::min<int64_t>(ceil_div(count, kThreads), 65536));
}

}  // namespace

cudaError_t launch_geglu_f32(const float* gate, const float* up, int64_t count, float* out,
                             const KernelConfig& config, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  return launch_status(launch_early(geglu_f32_kernel, dim3(grid_for(count)), dim3(kThreads), config,
                                    stream, gate, up, count, out));
}

cudaError_t launch_geglu_to_f16(const float* gate, const float* up, int64_t count, __half* out,
                                cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  geglu_to_f16_kernel<<<grid_for(count), kThreads, 0, stream>>>(gate, up, count, out);
  return launch_status();
}

cudaError_t launch_scale(float* x, int64_t count, float factor, const KernelConfig& config,
                         cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  return launch_status(launch_early(scale_kernel, dim3(grid_for(count)), dim3(kThreads), config,
                                    stream, x, count, factor));
}

cudaError_t launch_zero(float* x, int64_t count, const KernelConfig& config, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  return launch_status(
      launch_early(zero_kernel, dim3(grid_for(count)), dim3(kThreads), config, stream, x, count));
}

cudaError_t launch_soft_cap(float* x, int64_t count, float cap, const KernelConfig& config,
                            cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (!(cap > 0.0f)) return cudaErrorInvalidValue;
  return launch_status(launch_early(soft_cap_kernel, dim3(grid_for(count)), dim3(kThreads), config,
                                    stream, x, count, cap, 1.0f / cap));
}

cudaError_t launch_gemma4_qkv(const Gemma4QkvArgs& a, const KernelConfig& config,
                              cudaStream_t stream) {
  if (a.head_dim % 32 != 0 || a.head_dim > kMaxGemma4HeadDim || a.rope_dims > a.head_dim ||
      a.rope_dims % 2 != 0 || a.n_head <= 0 || a.n_kv <= 0)
    return cudaErrorInvalidValue;
  if (a.rows <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(a.rows), static_cast<unsigned>(a.n_head + 2 * a.n_kv));
  return launch_status(
      launch_early(gemma4_qkv_kernel, grid, dim3(kHeadThreads), config, stream, a));
}

cudaError_t launch_gemma4_ple_inputs(float* projected, const float* table, const float* norm,
                                     int rows, int n_layer, int n_pl, float eps,
                                     float projection_scale, float table_scale, float input_scale,
                                     const KernelConfig& config, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (n_layer <= 0 || n_pl <= 0) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(n_layer));
  return launch_status(launch_early(gemma4_ple_inputs_kernel, grid, dim3(kHeadThreads), config,
                                    stream, projected, table, norm, n_layer, n_pl, eps,
                                    projection_scale, table_scale, input_scale));
}

cudaError_t launch_attention_wide(const AttentionArgs& a, const KernelConfig& config,
                                  cudaStream_t stream) {
  if (a.rows == 0) return cudaSuccess;
  if (a.head_dim != 512 || a.n_kv <= 0 || a.n_head % a.n_kv != 0 || a.q_stride % 2 != 0 ||
      a.token_stride % 2 != 0 || a.kv_offset % 2 != 0)
    return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(a.rows), static_cast<unsigned>(a.n_head));
  return launch_status(launch_early(attention_wide_kernel<16>, grid, dim3(kWideWarps * kWarpSize),
                                    config, stream, a));
}

cudaError_t launch_gelu_times(const float* gate, const float* inputs, int64_t input_stride,
                              int rows, int n, float* out, const KernelConfig& config,
                              cudaStream_t stream) {
  const int64_t count = static_cast<int64_t>(rows) * n;
  if (count == 0) return cudaSuccess;
  return launch_status(launch_early(gelu_times_kernel, dim3(grid_for(count)), dim3(kThreads),
                                    config, stream, gate, inputs, input_stride, count, n, out));
}

cudaError_t launch_gemma4_table_rows(const int32_t* tokens, int rows, int n_layer, int64_t n_vocab,
                                     int32_t* out, const KernelConfig& config,
                                     cudaStream_t stream) {
  if (n_layer <= 0 || n_vocab < 0 || n_vocab * n_layer > INT32_MAX) return cudaErrorInvalidValue;
  const int64_t count = static_cast<int64_t>(rows) * n_layer;
  if (count == 0) return cudaSuccess;
  return launch_status(launch_early(gemma4_table_rows_kernel, dim3(grid_for(count)), dim3(kThreads),
                                    config, stream, tokens, count, n_layer, n_vocab, out));
}

}  // namespace granule::kernels
