// Qwen3.5's Gated DeltaNet and gated attention kernels (delta_net.cuh). The recurrent delta rule
// runs token by token within each run of a sequence's rows (the CPU reference's order): a block
// owns 32 columns of one value head's state (16 for heads of 16), four threads per column each
// keep a quarter of its rows in registers, the column's dot products are summed over those four
// lanes, and the next token's inputs load while this token computes. Long runs take the chunked
// form instead (delta_net_chunked.cu).
#include "common.cuh"
#include "delta_net.cuh"
#include "delta_net_rows.cuh"
#include "rope_kv.cuh"  // rope_rotation

namespace granule::kernels {
namespace {

using namespace delta_net_rows;

// Taps of the convolution whose weight and state input are requested before the PDL wait
// (Qwen3.5's 4 and up to 8; taps beyond are read after it, in the same order).
constexpr int kEarlyTaps = 8;
// Channels (threads) of a conv_state_kernel block.
constexpr int kConvStateChannels = 256;

// Block (row, S channels), max(S, 32) threads: convolution over [conv state | the run's earlier
// rows | this row], SiLU, and the L2 norm when the channels are a Q or K head. The weights and
// the conv state's inputs (written by earlier steps only: this step's conv_state_kernel runs
// after this one) are requested before the wait; the step's rows (`mixed`) after it.
__global__ void conv_kernel(DeltaNetArgs a) {
  __shared__ float scratch[32];
  const int r = blockIdx.x;
  const int slot = a.slots[r];
  if (slot < 0) {
    wait_for_previous_kernel();
    return;
  }
  const int S = a.state_size;
  const int channels = channels_of(a);
  const int kept = a.conv_kernel - 1;
  const int p = a.positions[r];
  // Rows of this run before r, counted up to kept: inputs further back come from the state.
  int back = 0;
  while (back < kept && r - back - 1 >= 0 && a.slots[r - back - 1] == slot &&
         a.positions[r - back - 1] == p - back - 1)
    ++back;
  const int run_start = p - back;  // exact whenever back < kept
  const bool active = static_cast<int>(threadIdx.x) < S;
  const int ch = blockIdx.y * S + threadIdx.x;
  const float* w = a.conv_weight + static_cast<int64_t>(ch) * a.conv_kernel;
  const float* cs = a.state + static_cast<int64_t>(slot) * a.slot_stride;
  // Tap i reads the row d = kept - i back: one of the run's (after the wait), else the state's.
  auto state_input = [&](int d) {
    return run_start == 0 ? 0.0f  // a new sequence: nothing before position 0
                          : cs[static_cast<int64_t>(kept - (run_start - (p - d))) * channels + ch];
  };
  float w_early[kEarlyTaps], x_early[kEarlyTaps];
  if (active) {
#pragma unroll
    for (int i = 0; i < kEarlyTaps; ++i) {
      if (i < a.conv_kernel) {
        w_early[i] = w[i];
        x_early[i] = kept - i <= back ? 0.0f : state_input(kept - i);
      }
    }
  }
  wait_for_previous_kernel();
  allow_next_kernel();
  float y = 0.0f;
  if (active) {
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kEarlyTaps; ++i) {
      if (i < a.conv_kernel) {
        const int d = kept - i;
        const float x =
            d <= back ? a.mixed[static_cast<int64_t>(r - d) * channels + ch] : x_early[i];
        sum += x * w_early[i];
      }
    }
    for (int i = kEarlyTaps; i < a.conv_kernel; ++i) {
      const int d = kept - i;
      const float x =
          d <= back ? a.mixed[static_cast<int64_t>(r - d) * channels + ch] : state_input(d);
      sum += x * w[i];
    }
    y = silu_exact(sum);
  }
  if (static_cast<int>(blockIdx.y) < 2 * a.n_k_heads) {  // a Q or K head: x / sqrt(Σx² + eps)
    const float ss = block_sum(y * y, scratch);
    const float mean = ss / static_cast<float>(S);
    y *= 1.0f / sqrtf(mean + a.eps / static_cast<float>(S)) / sqrtf(static_cast<float>(S));
  }
  if (active) a.conv_out[static_cast<int64_t>(r) * channels + ch] = y;
}

// Block (row, kConvStateChannels channels), a thread per channel: at each run's first row, the
// conv state becomes the last kept inputs of [state | the run's rows] (a run from position 0 reads
// a zero state). Everything after the wait: conv_kernel, the kernel before, reads the state this
// one overwrites. (One block per row looping over the channels took 24 us a layer at batch 1 on
// Qwen3.5-9B's 8,192 channels: a chain of dependent loads; a thread per channel takes a few.)
__global__ void conv_state_kernel(DeltaNetArgs a) {
  const int r = blockIdx.x;
  wait_for_previous_kernel();
  allow_next_kernel();
  if (!run_starts(a, r)) return;
  const int n = run_length(a, r);
  const bool fresh = a.positions[r] == 0;
  const int channels = channels_of(a);
  const int kept = a.conv_kernel - 1;
  float* cs = a.state + static_cast<int64_t>(a.slots[r]) * a.slot_stride;
  const int ch = static_cast<int>(blockIdx.y * blockDim.x + threadIdx.x);
  if (ch >= channels) return;
  // Ascending i reads index n + i > i of the old state before anything overwrites it.
  for (int i = 0; i < kept; ++i) {
    const int at = n + i;  // in [old state (kept) | the run's inputs (n)]
    float v;
    if (at >= kept)
      v = a.mixed[static_cast<int64_t>(r + at - kept) * channels + ch];
    else
      v = fresh ? 0.0f : cs[static_cast<int64_t>(at) * channels + ch];
    cs[static_cast<int64_t>(i) * channels + ch] = v;
  }
}

constexpr int kParts = 4;  // threads per state column

// Block (row, value head, column group): kCols columns x kParts threads. Only a run's first row
// works, unless the run is the chunked form's: it walks the run's tokens in order with the state
// in registers, then stores it back. The state (written by earlier steps only, when no chunked
// kernel of this step ran before) and the gates' weights are requested before the PDL wait.
// Each token's Q and K head sit in shared memory, double-buffered: the next token's loads are
// issued before this token's arithmetic, so their latency hides behind it (one barrier a token).
template <int S>
__global__ void __launch_bounds__((S < 32 ? S : 32) * kParts) rule_kernel(DeltaNetArgs a) {
  constexpr int kCols = S < 32 ? S : 32;
  constexpr int kThreads = kCols * kParts;
  constexpr int kRows = S / kParts;  // state rows per thread: i = ii * kParts + part
  constexpr int kLoads = (S + kThreads - 1) / kThreads;  // Q and K elements a thread stages
  __shared__ float qs[2][S], ks[2][S];
  const int r = blockIdx.x;
  const int head = blockIdx.y;
  const int part = threadIdx.x % kParts;
  const int col = blockIdx.z * kCols + threadIdx.x / kParts;
  const int value_dim = a.n_v_heads * S;
  const int slot = a.slots[r];
  const bool starts = slot >= 0 && run_starts(a, r);
  const bool planned = chunk_planned(a);  // then the lengths and state wait for its kernels
  const int key_dim = a.n_k_heads * S;
  const int channels = 2 * key_dim + value_dim;
  const int kh = head % a.n_k_heads;
  const int64_t conv_floats = static_cast<int64_t>(a.conv_kernel - 1) * channels;
  float* M = a.state + static_cast<int64_t>(slot) * a.slot_stride + conv_floats +
             static_cast<int64_t>(head) * S * S;
  const bool fresh = a.positions[r] == 0;
  float m[kRows];
  auto load_state = [&] {
#pragma unroll
    for (int ii = 0; ii < kRows; ++ii) m[ii] = fresh ? 0.0f : M[(ii * kParts + part) * S + col];
  };
  int n = 0;
  if (starts && !planned) {
    n = run_length(a, r);
    load_state();
  }
  const float dt = a.dt_bias[head], decay_rate = a.a[head];
  wait_for_previous_kernel();
  allow_next_kernel();
  if (slot < 0) {  // padding: a zero output for the gated norm to read
    if (part == 0) a.out[static_cast<int64_t>(r) * value_dim + head * S + col] = 0.0f;
    return;
  }
  if (!starts) return;
  if (planned) {  // the plan (launch_delta_net_chunked, before this) has the lengths
    n = chunk_plan_of(a).row_run_len[r];
    if (n >= kDeltaNetChunkedMinRows) return;
    load_state();
  }
  const float scale = 1.0f / sqrtf(static_cast<float>(S));

  // The next token's inputs, loaded ahead.
  float q_next[kLoads], k_next[kLoads], v_next = 0.0f, beta_next = 0.0f, alpha_next = 0.0f;
  auto fetch = [&](int t) {
    const int64_t row = r + t;
    const float* x = a.conv_out + row * channels;
#pragma unroll
    for (int l = 0; l < kLoads; ++l) {
      const int i = threadIdx.x + l * kThreads;
      if (i < S) {
        q_next[l] = x[kh * S + i];
        k_next[l] = x[key_dim + kh * S + i];
      }
    }
    v_next = x[2 * key_dim + head * S + col];
    beta_next = a.beta[row * a.n_v_heads + head];
    alpha_next = a.alpha[row * a.n_v_heads + head];
  };
  auto stage = [&](int buffer) {
#pragma unroll
    for (int l = 0; l < kLoads; ++l) {
      const int i = threadIdx.x + l * kThreads;
      if (i < S) {
        qs[buffer][i] = q_next[l];
        ks[buffer][i] = k_next[l];
      }
    }
  };
  fetch(0);
  stage(0);
  float v = v_next, beta_raw = beta_next, alpha_raw = alpha_next;
  __syncthreads();
  for (int t = 0; t < n; ++t) {
    const int buffer = t & 1;
    if (t + 1 < n) fetch(t + 1);
    const float* q = qs[buffer];
    const float* k = ks[buffer];
    const float b = sigmoid_exact(beta_raw);
    const float decay = expf(softplus(alpha_raw + dt) * decay_rate);
    float sum = 0.0f;
#pragma unroll
    for (int ii = 0; ii < kRows; ++ii) {
      m[ii] *= decay;
      sum += m[ii] * k[ii * kParts + part];
    }
#pragma unroll
    for (int offset = 1; offset < kParts; offset <<= 1)
      sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    const float d = (v - sum) * b;
    float o = 0.0f;
#pragma unroll
    for (int ii = 0; ii < kRows; ++ii) {
      m[ii] += k[ii * kParts + part] * d;
      o += m[ii] * q[ii * kParts + part];
    }
#pragma unroll
    for (int offset = 1; offset < kParts; offset <<= 1)
      o += __shfl_xor_sync(0xffffffffu, o, offset);
    if (part == 0) a.out[(r + static_cast<int64_t>(t)) * value_dim + head * S + col] = o * scale;
    if (t + 1 < n) {
      // The other buffer was last read in token t - 1, before the barrier that ended it.
      stage(buffer ^ 1);
      v = v_next;
      beta_raw = beta_next;
      alpha_raw = alpha_next;
    }
    __syncthreads();
  }
#pragma unroll
  for (int ii = 0; ii < kRows; ++ii) M[(ii * kParts + part) * S + col] = m[ii];
}

// Block (row, value head), max(S, 32) threads: out = RMSNorm(out) · norm_weight · SiLU(z), and
// the same values as int8 blocks into out_q8 when given (S a multiple of 32: a warp's 32 values
// are one block, quantised as launch_quantize_q8 does). The norm weight is requested before the
// PDL wait.
__global__ void gated_norm_kernel(DeltaNetArgs a) {
  __shared__ float scratch[32];
  const int r = blockIdx.x, head = blockIdx.y;
  const int S = a.state_size;
  const bool active = static_cast<int>(threadIdx.x) < S;
  const float weight = active ? a.norm_weight[threadIdx.x] : 0.0f;
  wait_for_previous_kernel();
  allow_next_kernel();
  const int64_t at = static_cast<int64_t>(r) * a.n_v_heads * S + head * S + threadIdx.x;
  const float o = active ? a.out[at] : 0.0f;
  const float ss = block_sum(o * o, scratch);
  const float scale = 1.0f / sqrtf(ss / static_cast<float>(S) + a.eps);
  if (!active) return;  // S < 32: the one warp's upper half (no int8 blocks then)
  const float y = o * scale * weight * silu_exact(a.z[at]);
  a.out[at] = y;
  if (a.out_q8.qs) {
    const int64_t first = at - threadIdx.x % kWarpSize;  // the warp's block starts here
    quantize_block_of_warp(y, a.out_q8.qs + first, a.out_q8.ds + first / kQ8Block);
  }
}

template <int S>
cudaError_t launch_rule(const DeltaNetArgs& a, const KernelConfig& config, cudaStream_t stream) {
  constexpr int kCols = S < 32 ? S : 32;
  const dim3 grid(static_cast<unsigned>(a.rows), static_cast<unsigned>(a.n_v_heads), S / kCols);
  return launch_status(launch_early(rule_kernel<S>, grid, dim3(kCols * kParts), config, stream, a));
}

// Block (row, head of Q then of K), head_dim threads. The norm weight, the rotation's sine and
// cosine (of the position, a step input) and the slot's KV base (set at attach) are formed
// before the PDL wait; Q, K and V after it.
__global__ void gated_attention_prep_kernel(GatedAttentionArgs a) {
  __shared__ float xs[256];
  __shared__ float scratch[32];
  const int r = blockIdx.x, h = blockIdx.y, e = threadIdx.x, hd = a.head_dim;
  const int slot = a.slots[r];
  if (slot < 0) {
    wait_for_previous_kernel();
    return;
  }
  const int pos = a.positions[r];
  const bool is_q = h < a.n_head;
  const int kh = h - a.n_head;
  const float weight = (is_q ? a.q_norm : a.k_norm)[e];
  const int half = a.rope_dims / 2;
  float s = 0.0f, c = 1.0f;
  if (e < a.rope_dims) rope_rotation(pos, a.frequencies[e < half ? e : e - half], &s, &c);
  __half* const token =
      is_q ? nullptr : a.slot_base[slot] + a.kv_offset + static_cast<int64_t>(pos) * a.token_stride;
  wait_for_previous_kernel();
  allow_next_kernel();
  const float* src = is_q ? a.q_gate + static_cast<int64_t>(r) * a.n_head * 2 * hd + h * 2 * hd
                          : a.k + static_cast<int64_t>(r) * a.n_kv * hd + kh * hd;
  const float x = src[e];
  const float ss = block_sum(x * x, scratch);
  const float scale = 1.0f / sqrtf(ss / static_cast<float>(hd) + a.eps);
  xs[e] = x * scale * weight;
  __syncthreads();
  float y = xs[e];
  if (e < a.rope_dims) {
    const int i = e < half ? e : e - half;
    const float x0 = xs[i], x1 = xs[i + half];
    y = e < half ? x0 * c - x1 * s : x0 * s + x1 * c;
  }
  if (is_q) {
    a.q[static_cast<int64_t>(r) * a.n_head * hd + h * hd + e] = y;
    return;
  }
  a.k[static_cast<int64_t>(r) * a.n_kv * hd + kh * hd + e] = y;
  token[kh * hd + e] = __float2half(y);
  token[(a.n_kv + kh) * hd + e] =
      __float2half(a.v[static_cast<int64_t>(r) * a.n_kv * hd + kh * hd + e]);
}

// out[i] *= sigmoid(gate), and the result as int8 blocks into out_q8 when given (count a
// multiple of 32: whole warps leave together, a warp's 32 values are one block).
__global__ void output_gate_kernel(float* out, const float* q_gate, int64_t count, int n_head,
                                   int head_dim, ActivationQ8 out_q8) {
  wait_for_previous_kernel();
  allow_next_kernel();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const int64_t q_dim = static_cast<int64_t>(n_head) * head_dim;
  const int64_t row = i / q_dim, within = i % q_dim;
  const int64_t h = within / head_dim, e = within % head_dim;
  const float y = out[i] * sigmoid_exact(q_gate[row * 2 * q_dim + h * 2 * head_dim + head_dim + e]);
  out[i] = y;
  if (out_q8.qs) {
    const int64_t first = i - threadIdx.x % kWarpSize;
    quantize_block_of_warp(y, out_q8.qs + first, out_q8.ds + first / kQ8Block);
  }
}

int threads_for(int state_size) { return state_size < 32 ? 32 : state_size; }

}  // namespace

bool delta_net_supports(int state_size) {
  return state_size == 16 || state_size == 32 || state_size == 64 || state_size == 128;
}

cudaError_t launch_delta_net_conv(const DeltaNetArgs& a, const KernelConfig& config,
                                  cudaStream_t stream) {
  if (!delta_net_supports(a.state_size) || a.conv_kernel < 1) return cudaErrorInvalidValue;
  if (a.rows <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(a.rows),
                  static_cast<unsigned>(2 * a.n_k_heads + a.n_v_heads));
  if (const cudaError_t status = launch_status(
          launch_early(conv_kernel, grid, dim3(threads_for(a.state_size)), config, stream, a));
      status != cudaSuccess)
    return status;
  if (a.conv_kernel < 2) return cudaSuccess;
  const int channels = channels_of(a);
  const dim3 state_grid(
      static_cast<unsigned>(a.rows),
      static_cast<unsigned>((channels + kConvStateChannels - 1) / kConvStateChannels));
  return launch_status(
      launch_early(conv_state_kernel, state_grid, dim3(kConvStateChannels), config, stream, a));
}

cudaError_t launch_delta_net_rule(const DeltaNetArgs& a, const KernelConfig& config,
                                  cudaStream_t stream) {
  if (!delta_net_supports(a.state_size) || (a.out_q8.qs && a.state_size % kQ8Block != 0))
    return cudaErrorInvalidValue;
  if (a.rows <= 0) return cudaSuccess;
  if (chunk_planned(a))
    if (const cudaError_t status = launch_delta_net_chunked(a, config, stream);
        status != cudaSuccess)
      return status;
  cudaError_t status = cudaErrorInvalidValue;
  switch (a.state_size) {
    case 16:
      status = launch_rule<16>(a, config, stream);
      break;
    case 32:
      status = launch_rule<32>(a, config, stream);
      break;
    case 64:
      status = launch_rule<64>(a, config, stream);
      break;
    case 128:
      status = launch_rule<128>(a, config, stream);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  if (status != cudaSuccess) return status;
  const dim3 grid(static_cast<unsigned>(a.rows), static_cast<unsigned>(a.n_v_heads));
  return launch_status(
      launch_early(gated_norm_kernel, grid, dim3(threads_for(a.state_size)), config, stream, a));
}

cudaError_t launch_gated_attention_prep(const GatedAttentionArgs& a, const KernelConfig& config,
                                        cudaStream_t stream) {
  if (a.head_dim % 32 != 0 || a.head_dim > 256 || a.rope_dims > a.head_dim || a.rope_dims % 2)
    return cudaErrorInvalidValue;
  if (a.rows <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(a.rows), static_cast<unsigned>(a.n_head + a.n_kv));
  return launch_status(
      launch_early(gated_attention_prep_kernel, grid, dim3(a.head_dim), config, stream, a));
}

cudaError_t launch_attention_output_gate(float* out, const float* q_gate, int rows, int n_head,
                                         int head_dim, ActivationQ8 out_q8,
                                         const KernelConfig& config, cudaStream_t stream) {
  if (out_q8.qs && (static_cast<int64_t>(n_head) * head_dim) % kQ8Block != 0)
    return cudaErrorInvalidValue;
  const int64_t count = static_cast<int64_t>(rows) * n_head * head_dim;
  if (count <= 0) return cudaSuccess;
  return launch_status(launch_early(output_gate_kernel, dim3(ceil_div(count, 256)), dim3(256),
                                    config, stream, out, q_gate, count, n_head, head_dim, out_q8));
}

}  // namespace granule::kernels
