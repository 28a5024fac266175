// Split attention in one launch: each (split, kv head, row) block takes the query heads of
// that KV head (GQA: K and V are read once for the whole group); its 4 warps take tokens in
// turn with an online softmax each and merge; the last split block of a (row, kv head) to
// finish merges the splits.
#include <cfloat>

#include "attention.cuh"
#include "common.cuh"

namespace granule::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxGroup = 8;

__device__ __forceinline__ void load_half_run(const __half* p, float* out, int n) {
  // n is 2, 4 or 8 consecutive halves at an aligned address.
  if (n == 2) {
    const float2 v = __half22float2(*reinterpret_cast<const __half2*>(p));
    out[0] = v.x;
    out[1] = v.y;
  } else if (n == 4) {
    const uint2 raw = *reinterpret_cast<const uint2*>(p);
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&raw.x));
    const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&raw.y));
    out[0] = a.x;
    out[1] = a.y;
    out[2] = b.x;
    out[3] = b.y;
  } else {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  }
}

// Writes one output element (and its int8 block: head_dim is a multiple of 32 and whole
// warps walk the elements, so a warp holds exactly one block).
__device__ __forceinline__ void write_output(const AttentionArgs& a, int row, int column, int d,
                                             float value) {
  const int64_t at = row * a.out_stride + column;
  a.out[at] = value;
  if (a.out_q8.qs)
    quantize_block_of_warp(value, a.out_q8.qs + (at - d % kWarpSize), a.out_q8.ds + at / kQ8Block);
}

template <int EPL>
__global__ void __launch_bounds__(kWarps* kWarpSize) attention_split_kernel(AttentionArgs a) {
  constexpr int kHeadDim = EPL * kWarpSize;
  __shared__ float sm_m[kWarps][kMaxGroup], sm_l[kWarps][kMaxGroup];
  __shared__ float sm_acc[kWarps][kMaxGroup][kHeadDim];

  wait_for_previous_kernel();
  allow_next_kernel();
  const int split = blockIdx.x, kv_head = blockIdx.y, row = blockIdx.z;
  const int length = a.lengths[row];
  const int start = split * a.split_tokens;
  if (start >= length) return;
  const int end = min(length, start + a.split_tokens);
  const int group = a.n_head / a.n_kv;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int d0 = lane * EPL;

  float q[kMaxGroup][EPL], acc[kMaxGroup][EPL], m[kMaxGroup], l[kMaxGroup];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    m[g] = -FLT_MAX;
    l[g] = 0.0f;
#pragma unroll
    for (int j = 0; j < EPL; ++j) {
      acc[g][j] = 0.0f;
      q[g][j] = g < group
                    ? a.q[row * a.q_stride + (kv_head * group + g) * kHeadDim + d0 + j] * a.scale
                    : 0.0f;
    }
  }

  const __half* base = a.slot_base[a.slots[row]] +
                       static_cast<int64_t>(a.layer) * 2 * a.n_kv * kHeadDim + kv_head * kHeadDim +
                       d0;
  const int64_t v_offset = static_cast<int64_t>(a.n_kv) * kHeadDim;
  // Tokens go to the warps in turn, kTokensInFlight at a time: their K and V loads are all
  // issued before the first is used, so memory latency overlaps.
  constexpr int kTokensInFlight = 4;
  for (int t0 = start + warp * kTokensInFlight; t0 < end; t0 += kWarps * kTokensInFlight) {
    float k[kTokensInFlight][EPL], v[kTokensInFlight][EPL];
#pragma unroll
    for (int u = 0; u < kTokensInFlight; ++u) {
      if (t0 + u < end) {
        const __half* kp = base + (t0 + u) * a.token_stride;
        load_half_run(kp, k[u], EPL);
        load_half_run(kp + v_offset, v[u], EPL);
      }
    }
#pragma unroll
    for (int u = 0; u < kTokensInFlight; ++u) {
      if (t0 + u >= end) break;
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g >= group) break;
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < EPL; ++j) s = fmaf(q[g][j], k[u][j], s);
        s = warp_sum(s);
        const float m_new = fmaxf(m[g], s);
        const float correction = __expf(m[g] - m_new);
        const float p = __expf(s - m_new);
        l[g] = l[g] * correction + p;
#pragma unroll
        for (int j = 0; j < EPL; ++j) acc[g][j] = acc[g][j] * correction + p * v[u][j];
        m[g] = m_new;
      }
    }
  }

#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g >= group) break;
    if (lane == 0) {
      sm_m[warp][g] = m[g];
      sm_l[warp][g] = l[g];
    }
#pragma unroll
    for (int j = 0; j < EPL; ++j) sm_acc[warp][g][d0 + j] = acc[g][j];
  }
  __syncthreads();

  // Merge the warps: thread i takes elements i, i + 128, ... of the group's heads. With a
  // single split (a short sequence) this is the final result; else it is this split's part.
  const int n_splits_max = a.max_splits;
  const int n_splits = min(n_splits_max, (length + a.split_tokens - 1) / a.split_tokens);
  for (int i = threadIdx.x; i < group * kHeadDim; i += blockDim.x) {
    const int g = i / kHeadDim, d = i % kHeadDim;
    float m_all = -FLT_MAX;
    for (int w = 0; w < kWarps; ++w) m_all = fmaxf(m_all, sm_m[w][g]);
    float sum_acc = 0.0f, sum_l = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      const float f = sm_l[w][g] > 0.0f ? __expf(sm_m[w][g] - m_all) : 0.0f;
      sum_acc += f * sm_acc[w][g][d];
      sum_l += f * sm_l[w][g];
    }
    const int head = kv_head * group + g;
    if (n_splits == 1) {
      write_output(a, row, head * kHeadDim + d, d, sum_l > 0.0f ? sum_acc / sum_l : 0.0f);
      continue;
    }
    float* p = a.partial + ((static_cast<int64_t>(row) * a.n_head + head) * n_splits_max + split) *
                               (kHeadDim + 2);
    p[d] = sum_acc;
    if (d == 0) {
      p[kHeadDim] = m_all;
      p[kHeadDim + 1] = sum_l;
    }
  }
  if (n_splits == 1) return;

  // The last block to finish among this (row, kv head)'s splits merges them (no second
  // launch): publish the partial, take a ticket, and the final ticket holder reads all.
  __shared__ bool is_last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    int* counter = a.split_counters + row * a.n_kv + kv_head;
    is_last = atomicAdd(counter, 1) == n_splits - 1;
    if (is_last) *counter = 0;  // ready for the next launch
  }
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  for (int i = threadIdx.x; i < group * kHeadDim; i += blockDim.x) {
    const int g = i / kHeadDim, d = i % kHeadDim;
    const int head = kv_head * group + g;
    const float* p =
        a.partial + (static_cast<int64_t>(row) * a.n_head + head) * n_splits_max * (kHeadDim + 2);
    float m_all = -FLT_MAX;
    for (int sp = 0; sp < n_splits; ++sp)
      m_all = fmaxf(m_all, __ldcg(p + sp * (kHeadDim + 2) + kHeadDim));
    float sum_acc = 0.0f, sum_l = 0.0f;
    for (int sp = 0; sp < n_splits; ++sp) {
      const float* ps = p + sp * (kHeadDim + 2);
      const float f = __expf(__ldcg(ps + kHeadDim) - m_all);
      sum_acc += f * __ldcg(ps + d);
      sum_l += f * __ldcg(ps + kHeadDim + 1);
    }
    write_output(a, row, head * kHeadDim + d, d, sum_l > 0.0f ? sum_acc / sum_l : 0.0f);
  }
}

}  // namespace

size_t attention_workspace_floats(int rows, int n_head, int max_splits, int head_dim) {
  return static_cast<size_t>(rows) * n_head * max_splits * (head_dim + 2);
}

cudaError_t launch_attention(const AttentionArgs& args, const KernelConfig& config,
                             cudaStream_t stream) {
  if (args.rows == 0) return cudaSuccess;
  if (args.n_kv <= 0 || args.n_head % args.n_kv != 0 || args.n_head / args.n_kv > kMaxGroup ||
      args.split_tokens <= 0 || args.max_splits <= 0 || !args.split_counters)
    return cudaErrorInvalidValue;
  const dim3 grid(args.max_splits, args.n_kv, args.rows);
  const int threads = kWarps * kWarpSize;
  cudaError_t status;
  switch (args.head_dim) {
    case 64:
      status = launch_early(attention_split_kernel<2>, grid, dim3(threads), config, stream, args);
      break;
    case 128:
      status = launch_early(attention_split_kernel<4>, grid, dim3(threads), config, stream, args);
      break;
    case 256:
      status = launch_early(attention_split_kernel<8>, grid, dim3(threads), config, stream, args);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return launch_status(status);
}

}  // namespace granule::kernels
