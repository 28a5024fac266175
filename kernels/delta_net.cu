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

// Block (row, S channels), max(S, 32) threads: convolution over [conv state | the run's earlier
// rows | this row], SiLU, and the L2 norm when the channels are a Q or K head.
__global__ void conv_kernel(DeltaNetArgs a) {
  __shared__ float scratch[32];
  const int r = blockIdx.x;
  const int slot = a.slots[r];
  if (slot < 0) return;
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
  float y = 0.0f;
  if (active) {
    const float* w = a.conv_weight + static_cast<int64_t>(ch) * a.conv_kernel;
    const float* cs = a.state + static_cast<int64_t>(slot) * a.slot_stride;
    float sum = 0.0f;
    for (int i = 0; i < a.conv_kernel; ++i) {
      const int d = kept - i;  // rows back from r
      float x;
      if (d <= back)
        x = a.mixed[static_cast<int64_t>(r - d) * channels + ch];
      else if (run_start == 0)
        x = 0.0f;  // a new sequence: nothing before position 0
      else
        x = cs[static_cast<int64_t>(kept - (run_start - (p - d))) * channels + ch];
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

// Block per row: at each run's first row, the conv state becomes the last kept inputs of
// [state | the run's rows] (a run from position 0 reads a zero state).
__global__ void conv_state_kernel(DeltaNetArgs a) {
  const int r = blockIdx.x;
  if (!run_starts(a, r)) return;
  const int n = run_length(a, r);
  const bool fresh = a.positions[r] == 0;
  const int channels = channels_of(a);
  const int kept = a.conv_kernel - 1;
  float* cs = a.state + static_cast<int64_t>(a.slots[r]) * a.slot_stride;
  for (int ch = threadIdx.x; ch < channels; ch += blockDim.x) {
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
}

constexpr int kParts = 4;  // threads per state column

// Block (row, value head, column group): kCols columns x kParts threads. Only a run's first row
// works, unless the run is the chunked form's: it walks the run's tokens in order with the state
// in registers, then stores it back.
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
  if (slot < 0) {  // padding: a zero output for the gated norm to read
    if (part == 0) a.out[static_cast<int64_t>(r) * value_dim + head * S + col] = 0.0f;
    return;
  }
  if (!run_starts(a, r)) return;
  int n;
  if (chunk_planned(a)) {  // the plan (launch_delta_net_chunked, before this) has the lengths
    n = chunk_plan_of(a).row_run_len[r];
    if (n >= kDeltaNetChunkedMinRows) return;
  } else {
    n = run_length(a, r);
  }
  const int key_dim = a.n_k_heads * S;
  const int channels = 2 * key_dim + value_dim;
  const int kh = head % a.n_k_heads;
  const int64_t conv_floats = static_cast<int64_t>(a.conv_kernel - 1) * channels;
  float* M = a.state + static_cast<int64_t>(slot) * a.slot_stride + conv_floats +
             static_cast<int64_t>(head) * S * S;
  const bool fresh = a.positions[r] == 0;
  float m[kRows];
#pragma unroll
  for (int ii = 0; ii < kRows; ++ii) m[ii] = fresh ? 0.0f : M[(ii * kParts + part) * S + col];
  const float scale = 1.0f / sqrtf(static_cast<float>(S));
  const float dt = a.dt_bias[head], decay_rate = a.a[head];

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

// Block (row, value head), max(S, 32) threads: out = RMSNorm(out) · norm_weight · SiLU(z).
__global__ void gated_norm_kernel(DeltaNetArgs a) {
  __shared__ float scratch[32];
  const int r = blockIdx.x, head = blockIdx.y;
  const int S = a.state_size;
  const bool active = static_cast<int>(threadIdx.x) < S;
  const int64_t at = static_cast<int64_t>(r) * a.n_v_heads * S + head * S + threadIdx.x;
  const float o = active ? a.out[at] : 0.0f;
  const float ss = block_sum(o * o, scratch);
  const float scale = 1.0f / sqrtf(ss / static_cast<float>(S) + a.eps);
  if (active) a.out[at] = o * scale * a.norm_weight[threadIdx.x] * silu_exact(a.z[at]);
}

template <int S>
cudaError_t launch_rule(const DeltaNetArgs& a, cudaStream_t stream) {
  constexpr int kCols = S < 32 ? S : 32;
  const dim3 grid(static_cast<unsigned>(a.rows), static_cast<unsigned>(a.n_v_heads), S / kCols);
  rule_kernel<S><<<grid, kCols * kParts, 0, stream>>>(a);
  return launch_status();
}

// Block (row, head of Q then of K), head_dim threads.
__global__ void gated_attention_prep_kernel(GatedAttentionArgs a) {
  __shared__ float xs[256];
  __shared__ float scratch[32];
  const int r = blockIdx.x, h = blockIdx.y, e = threadIdx.x, hd = a.head_dim;
  const int slot = a.slots[r];
  if (slot < 0) return;
  const int pos = a.positions[r];
  const bool is_q = h < a.n_head;
  const int kh = h - a.n_head;
  const float* src = is_q ? a.q_gate + static_cast<int64_t>(r) * a.n_head * 2 * hd + h * 2 * hd
                          : a.k + static_cast<int64_t>(r) * a.n_kv * hd + kh * hd;
  const float x = src[e];
  const float ss = block_sum(x * x, scratch);
  const float scale = 1.0f / sqrtf(ss / static_cast<float>(hd) + a.eps);
  xs[e] = x * scale * (is_q ? a.q_norm : a.k_norm)[e];
  __syncthreads();
  float y = xs[e];
  const int half = a.rope_dims / 2;
  if (e < a.rope_dims) {
    const int i = e < half ? e : e - half;
    float s, c;
    rope_rotation(pos, a.frequencies[i], &s, &c);
    const float x0 = xs[i], x1 = xs[i + half];
    y = e < half ? x0 * c - x1 * s : x0 * s + x1 * c;
  }
  if (is_q) {
    a.q[static_cast<int64_t>(r) * a.n_head * hd + h * hd + e] = y;
    return;
  }
  a.k[static_cast<int64_t>(r) * a.n_kv * hd + kh * hd + e] = y;
  __half* token = a.slot_base[slot] + a.kv_offset + static_cast<int64_t>(pos) * a.token_stride;
  token[kh * hd + e] = __float2half(y);
  token[(a.n_kv + kh) * hd + e] =
      __float2half(a.v[static_cast<int64_t>(r) * a.n_kv * hd + kh * hd + e]);
}

__global__ void output_gate_kernel(float* out, const float* q_gate, int64_t count, int n_head,
                                   int head_dim) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const int64_t q_dim = static_cast<int64_t>(n_head) * head_dim;
  const int64_t row = i / q_dim, within = i % q_dim;
  const int64_t h = within / head_dim, e = within % head_dim;
  out[i] *= sigmoid_exact(q_gate[row * 2 * q_dim + h * 2 * head_dim + head_dim + e]);
}

int threads_for(int state_size) { return state_size < 32 ? 32 : state_size; }

}  // namespace

bool delta_net_supports(int state_size) {
  return state_size == 16 || state_size == 32 || state_size == 64 || state_size == 128;
}

cudaError_t launch_delta_net_conv(const DeltaNetArgs& a, cudaStream_t stream) {
  if (!delta_net_supports(a.state_size) || a.conv_kernel < 1) return cudaErrorInvalidValue;
  if (a.rows <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(a.rows),
                  static_cast<unsigned>(2 * a.n_k_heads + a.n_v_heads));
  conv_kernel<<<grid, threads_for(a.state_size), 0, stream>>>(a);
  if (const cudaError_t status = launch_status(); status != cudaSuccess) return status;
  if (a.conv_kernel < 2) return cudaSuccess;
  conv_state_kernel<<<a.rows, 256, 0, stream>>>(a);
  return launch_status();
}

cudaError_t launch_delta_net_rule(const DeltaNetArgs& a, cudaStream_t stream) {
  if (a.rows <= 0) return cudaSuccess;
  if (!delta_net_supports(a.state_size)) return cudaErrorInvalidValue;
  if (chunk_planned(a))
    if (const cudaError_t status = launch_delta_net_chunked(a, stream); status != cudaSuccess)
      return status;
  cudaError_t status = cudaErrorInvalidValue;
  switch (a.state_size) {
    case 16:
      status = launch_rule<16>(a, stream);
      break;
    case 32:
      status = launch_rule<32>(a, stream);
      break;
    case 64:
      status = launch_rule<64>(a, stream);
      break;
    case 128:
      status = launch_rule<128>(a, stream);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  if (status != cudaSuccess) return status;
  const dim3 grid(static_cast<unsigned>(a.rows), static_cast<unsigned>(a.n_v_heads));
  gated_norm_kernel<<<grid, threads_for(a.state_size), 0, stream>>>(a);
  return launch_status();
}

cudaError_t launch_gated_attention_prep(const GatedAttentionArgs& a, cudaStream_t stream) {
  if (a.head_dim % 32 != 0 || a.head_dim > 256 || a.rope_dims > a.head_dim || a.rope_dims % 2)
    return cudaErrorInvalidValue;
  if (a.rows <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(a.rows), static_cast<unsigned>(a.n_head + a.n_kv));
  gated_attention_prep_kernel<<<grid, a.head_dim, 0, stream>>>(a);
  return launch_status();
}

cudaError_t launch_attention_output_gate(float* out, const float* q_gate, int rows, int n_head,
                                         int head_dim, cudaStream_t stream) {
  const int64_t count = static_cast<int64_t>(rows) * n_head * head_dim;
  if (count <= 0) return cudaSuccess;
  output_gate_kernel<<<ceil_div(count, 256), 256, 0, stream>>>(out, q_gate, count, n_head,
                                                               head_dim);
  return launch_status();
}

}  // namespace granule::kernels
