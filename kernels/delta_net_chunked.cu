// The chunked form of the gated delta rule (delta_net.cuh), for the long runs of a prefill. Per
// value head, with the state M (S x S, M[i][j]: i over keys, j over values) before a chunk of n
// tokens, g_t the log decays, γ_t = g_0 + ... + g_t, β_t the sigmoid gates and scale 1/sqrt(S),
// the recurrence (M ← e^g M; u = β (v − Mᵀk); M ← M + k uᵀ; o = scale · Mᵀq) unrolls to
//   u_t + Σ_{s<t} A[t][s] u_s = β_t v_t − β_t e^{γ_t} Mᵀ k_t,   A[t][s] = β_t e^{γ_t−γ_s} k_t·k_s,
// so with the forward substitutions Ũ = (I + A)⁻¹ (β v) and W = (I + A)⁻¹ (β e^γ k):
//   u_t = Ũ_t − Mᵀ W_t
//   o_t = scale e^{γ_t} Mᵀ q_t + Σ_{s<=t} P[t][s] u_s,   P[t][s] = scale e^{γ_t−γ_s} q_t·k_s
//   M  ← e^{γ_{n−1}} M + Σ_t e^{γ_{n−1}−γ_t} k_t u_tᵀ
// (the WY/UT representation of the Gated DeltaNet and flash-linear-attention papers; llama.cpp's
// build_delta_net_chunking). Every exponent is a difference γ_t − γ_s with t >= s, at most 0.
// Three launches: the plan (which runs are long enough, their chunks), the chunks (A, P, Ũ, W
// per chunk and head, all chunks at once) and the state (per run, head and group of value
// columns, chunk after chunk: a column's u, o and next state read only that column of M).
#include "common.cuh"
#include "delta_net.cuh"
#include "delta_net_rows.cuh"

namespace granule::kernels {
namespace {

using namespace delta_net_rows;

constexpr int kC = kDeltaNetChunkTokens;
constexpr int kThreads = 256;  // the chunk kernel's

// Inclusive max over the block's threads in order (blockDim.x a multiple of 32); `totals` is 32
// ints of shared memory.
__device__ int block_max_scan(int v, int* totals) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
#pragma unroll
  for (int offset = 1; offset < kWarpSize; offset <<= 1) {
    const int other = __shfl_up_sync(0xffffffffu, v, offset);
    if (lane >= offset) v = max(v, other);
  }
  __syncthreads();  // totals may still be read by a previous call
  if (lane == kWarpSize - 1) totals[warp] = v;
  __syncthreads();
  for (int w = 0; w < warp; ++w) v = max(v, totals[w]);
  return v;
}

// One block of 1024 threads: each row's run (its first row, by a max-scan of the run starts),
// each run's length at its first row, and the chunked runs and their chunks as lists (in any
// order: every chunk and run is computed alone).
__global__ void __launch_bounds__(1024) plan_kernel(DeltaNetArgs a) {
  __shared__ int totals[32];
  __shared__ int carry, n_runs, n_chunks;
  wait_for_previous_kernel();
  allow_next_kernel();
  const ChunkPlan p = chunk_plan_of(a);
  if (threadIdx.x == 0) {
    carry = -1;
    n_runs = 0;
    n_chunks = 0;
  }
  __syncthreads();
  for (int base = 0; base < a.rows; base += blockDim.x) {
    const int r = base + static_cast<int>(threadIdx.x);
    int first = -1;
    if (r < a.rows && (a.slots[r] < 0 || run_starts(a, r))) first = r;  // padding: its own run
    first = max(block_max_scan(first, totals), carry);
    if (r < a.rows) p.run_first[r] = first;
    __syncthreads();  // every thread has read carry
    if (threadIdx.x == blockDim.x - 1) carry = first;
    __syncthreads();
  }
  for (int r = threadIdx.x; r < a.rows; r += blockDim.x) {
    const int first = p.run_first[r];
    if (r + 1 < a.rows && p.run_first[r + 1] == first) continue;  // not the run's last row
    const int len = r - first + 1;
    p.row_run_len[first] = len;
    if (a.slots[first] < 0 || len < kDeltaNetChunkedMinRows) continue;
    const int run = atomicAdd(&n_runs, 1);
    p.run_row[run] = first;
    p.run_len[run] = len;
    const int chunks = (len + kC - 1) / kC;
    const int c0 = atomicAdd(&n_chunks, chunks);
    for (int c = 0; c < chunks; ++c) {
      p.chunk_row[c0 + c] = first + c * kC;
      p.chunk_len[c0 + c] = min(kC, len - c * kC);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    p.counts[0] = n_runs;
    p.counts[1] = n_chunks;
  }
}

template <int S>
struct ChunkLayout {  // the chunk kernel's shared memory, in floats
  // Rows of S + 4: 16-byte aligned, and 8 consecutive rows start in 8 different bank quads (a
  // quarter warp's float4 loads of 8 rows do not conflict).
  static constexpr int kRow = S + 4, kARow = kC + 4;
  static constexpr int kQ = 0, kK = kQ + kC * kRow, kA = kK + kC * kRow, kG = kA + kC * kARow,
                       kB = kG + kC, kFloats = kB + kC;
  static constexpr size_t kBytes = kFloats * sizeof(float);
};

__device__ __forceinline__ float4 load4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}
__device__ __forceinline__ float dot4(float4 x, float4 y, float acc) {
  return fmaf(x.w, y.w, fmaf(x.z, y.z, fmaf(x.y, y.y, fmaf(x.x, y.x, acc))));
}

// Block (chunk, value head), 256 threads: the chunk's γ (to the plan's gamma); P (to its p) and
// A from 4 x 4 tiles of the Q Kᵀ and K Kᵀ products (rows t = 4 tr + a, columns s = sc + 16 b);
// then W (to chunk_w) and Ũ (to out) by forward substitution, one thread per column of both, the
// column in registers (the loops unrolled over the 64 rows; A is 0 from s >= t and past n).
template <int S>
__global__ void __launch_bounds__(kThreads) chunk_kernel(DeltaNetArgs a) {
  using L = ChunkLayout<S>;
  constexpr int R = L::kRow, RA = L::kARow;
  wait_for_previous_kernel();
  allow_next_kernel();
  const ChunkPlan p = chunk_plan_of(a);
  const int c = blockIdx.x;
  if (c >= p.counts[1]) return;
  const int r0 = p.chunk_row[c], n = p.chunk_len[c];
  const int head = blockIdx.y, nv = a.n_v_heads;
  const int key_dim = a.n_k_heads * S, value_dim = nv * S, channels = 2 * key_dim + value_dim;
  const int kh = head % a.n_k_heads;
  const int tid = threadIdx.x;
  extern __shared__ __align__(16) float smem[];
  float* sQ = smem + L::kQ;  // [t][i], 0 past n
  float* sK = smem + L::kK;
  float* sA = smem + L::kA;  // [t][s]
  float* sG = smem + L::kG;  // g, then γ
  float* sB = smem + L::kB;  // β
  for (int idx = tid; idx < kC * S / 4; idx += kThreads) {
    const int t = idx / (S / 4), i = idx % (S / 4) * 4;
    float4 q = make_float4(0.0f, 0.0f, 0.0f, 0.0f), k = q;
    if (t < n) {
      const float* x = a.conv_out + static_cast<int64_t>(r0 + t) * channels;
      q = load4(x + kh * S + i);
      k = load4(x + key_dim + kh * S + i);
    }
    *reinterpret_cast<float4*>(sQ + t * R + i) = q;
    *reinterpret_cast<float4*>(sK + t * R + i) = k;
  }
  if (tid < kC) {
    float b = 0.0f, g = 0.0f;
    if (tid < n) {
      const int64_t at = static_cast<int64_t>(r0 + tid) * nv + head;
      b = sigmoid_exact(a.beta[at]);
      g = softplus(a.alpha[at] + a.dt_bias[head]) * a.a[head];
    }
    sB[tid] = b;
    sG[tid] = g;
  }
  __syncthreads();
  if (tid < kWarpSize) {  // γ: the inclusive sum of g over the chunk's 64 rows, by one warp
    float lo = sG[tid], hi = sG[tid + kWarpSize];
#pragma unroll
    for (int offset = 1; offset < kWarpSize; offset <<= 1) {
      const float lo_up = __shfl_up_sync(0xffffffffu, lo, offset);
      const float hi_up = __shfl_up_sync(0xffffffffu, hi, offset);
      if (tid >= offset) {
        lo += lo_up;
        hi += hi_up;
      }
    }
    sG[tid] = lo;
    sG[tid + kWarpSize] = hi + __shfl_sync(0xffffffffu, lo, kWarpSize - 1);
  }
  __syncthreads();
  if (tid < n) p.gamma[static_cast<int64_t>(r0 + tid) * nv + head] = sG[tid];
  const float scale = 1.0f / sqrtf(static_cast<float>(S));
  {
    const int tr = tid / 16, sc = tid % 16;
    float qk[4][4] = {}, kk[4][4] = {};
#pragma unroll 2
    for (int i = 0; i < S; i += 4) {
      float4 qt[4], kt[4], ks[4];
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        qt[x] = load4(sQ + (4 * tr + x) * R + i);
        kt[x] = load4(sK + (4 * tr + x) * R + i);
        ks[x] = load4(sK + (sc + 16 * x) * R + i);
      }
#pragma unroll
      for (int x = 0; x < 4; ++x)
#pragma unroll
        for (int y = 0; y < 4; ++y) {
          qk[x][y] = dot4(qt[x], ks[y], qk[x][y]);
          kk[x][y] = dot4(kt[x], ks[y], kk[x][y]);
        }
    }
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const int t = 4 * tr + x;
#pragma unroll
      for (int y = 0; y < 4; ++y) {
        const int s = sc + 16 * y;
        float av = 0.0f;
        if (t < n && s <= t) {
          const float e = expf(sG[t] - sG[s]);
          p.p[(static_cast<int64_t>(r0 + t) * nv + head) * kC + s] = scale * e * qk[x][y];
          if (s < t) av = sB[t] * e * kk[x][y];
        }
        sA[t * RA + s] = av;
      }
    }
  }
  __syncthreads();
  if (tid >= 2 * S) return;
  // x_t -= Σ_{s<t} A[t][s] x_s down column `col` of β e^γ K (then W) or of β V (then Ũ).
  const int col = tid;
  float x[kC];
#pragma unroll
  for (int t = 0; t < kC; ++t) {
    float v = 0.0f;
    if (t < n)
      v = col < S ? sB[t] * expf(sG[t]) * sK[t * R + col]
                  : sB[t] * a.conv_out[static_cast<int64_t>(r0 + t) * channels + 2 * key_dim +
                                       head * S + (col - S)];
    x[t] = v;
  }
#pragma unroll
  for (int t = 1; t < kC; ++t) {
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int s = 0; s < t; s += 4) {  // A[t][s] is 0 for s >= t: the last quad may pass t
      const float4 av = load4(sA + t * RA + s);
      sum[0] = fmaf(av.x, x[s], sum[0]);
      if (s + 1 < kC) sum[1] = fmaf(av.y, x[s + 1], sum[1]);
      if (s + 2 < kC) sum[2] = fmaf(av.z, x[s + 2], sum[2]);
      if (s + 3 < kC) sum[3] = fmaf(av.w, x[s + 3], sum[3]);
    }
    x[t] -= (sum[0] + sum[1]) + (sum[2] + sum[3]);
  }
  float* dst = (col < S ? a.chunk_w + col : a.out + (col - S)) + head * S +
               static_cast<int64_t>(r0) * value_dim;
#pragma unroll
  for (int t = 0; t < kC; ++t)
    if (t < n) dst[static_cast<int64_t>(t) * value_dim] = x[t];
}

template <int S>
struct StateLayout {  // the state kernel's shared memory, in floats, and its threads
  static constexpr int kJ = S < 32 ? S : 32;          // value columns per block
  static constexpr int kPairs = kJ / 2;               // a thread's columns: 2 p, 2 p + 1
  static constexpr int kThreads = kPairs * 16;        // 16 row groups
  static constexpr int kRowsC = S / 16;               // state rows per thread in M's update
  static constexpr int kRow = S + 4, kPRow = kC + 4;  // as ChunkLayout's
  static constexpr int kM = 0, kW = kM + S * kJ, kQ = kW + kC * kRow, kP = kQ + kC * kRow,
                       kU = kP + kC * kPRow, kG = kU + kC * kJ, kFloats = kG + kC;
  static constexpr size_t kBytes = kFloats * sizeof(float);
};

// Rows 0..63 of a [t][i] array of the state kernel's shared memory from a global one's (0 past
// n), times `scale` and, given gammas, e^γ_t.
template <int S>
__device__ __forceinline__ void stage(float* to, const float* from, int64_t from_stride,
                                      float scale, const float* gammas, int n) {
  for (int idx = threadIdx.x; idx < kC * S / 4; idx += blockDim.x) {
    const int t = idx / (S / 4), i = idx % (S / 4) * 4;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (t < n) {
      v = load4(from + t * from_stride + i);
      const float f = gammas ? scale * expf(gammas[t]) : scale;
      v = make_float4(v.x * f, v.y * f, v.z * f, v.w * f);
    }
    *reinterpret_cast<float4*>(to + t * (S + 4) + i) = v;
  }
}

// Block (chunked run, value head, group of kJ value columns): the run's chunks in order, the
// group's columns of M in shared memory. Per chunk: U = Ũ − W M, O = Qg M + P U (over Ũ in out),
// M = e^{γ_last} M + Kᵀ (e^{γ_last − γ} U). Thread (g, pair) owns columns 2 pair and 2 pair + 1
// of rows 4 g .. 4 g + 3 of U and O, and of rows kRowsC g .. of M.
template <int S>
__global__ void __launch_bounds__(StateLayout<S>::kThreads) state_kernel(DeltaNetArgs a) {
  using L = StateLayout<S>;
  constexpr int kJ = L::kJ, R = L::kRow, RP = L::kPRow, kRowsC = L::kRowsC;
  wait_for_previous_kernel();
  allow_next_kernel();
  const ChunkPlan p = chunk_plan_of(a);
  const int run = blockIdx.x;
  if (run >= p.counts[0]) return;
  const int r0 = p.run_row[run], len = p.run_len[run];
  const int head = blockIdx.y, j0 = blockIdx.z * kJ, nv = a.n_v_heads;
  const int tid = threadIdx.x;
  const int pair = tid % L::kPairs, g = tid / L::kPairs;
  const int jj = 2 * pair;  // the thread's first column within the group
  const int key_dim = a.n_k_heads * S, value_dim = nv * S, channels = 2 * key_dim + value_dim;
  const int kh = head % a.n_k_heads;
  const int64_t conv_floats = static_cast<int64_t>(a.conv_kernel - 1) * channels;
  float* M = a.state + static_cast<int64_t>(a.slots[r0]) * a.slot_stride + conv_floats +
             static_cast<int64_t>(head) * S * S;
  const bool fresh = a.positions[r0] == 0;
  extern __shared__ __align__(16) float smem[];
  float* sM = smem + L::kM;  // [i][j]
  float* sW = smem + L::kW;  // W, then K ([t][i], 0 past n)
  float* sQ = smem + L::kQ;  // scale e^γ Q
  float* sP = smem + L::kP;  // [t][s], 0 for s > t
  float* sU = smem + L::kU;  // [t][j]: u, then e^{γ_last − γ_t} u
  float* sG = smem + L::kG;
  for (int idx = tid; idx < S * kJ; idx += L::kThreads)
    sM[idx] = fresh ? 0.0f : M[(idx / kJ) * S + j0 + idx % kJ];
  const float scale = 1.0f / sqrtf(static_cast<float>(S));
  for (int t0 = 0; t0 < len; t0 += kC) {
    const int n = min(kC, len - t0);
    const int64_t rb = r0 + t0;
    if (tid < kC) sG[tid] = tid < n ? p.gamma[(rb + tid) * nv + head] : 0.0f;
    __syncthreads();  // sG, and the previous chunk's last reads of sW and sU
    stage<S>(sW, a.chunk_w + rb * value_dim + head * S, value_dim, 1.0f, nullptr, n);
    stage<S>(sQ, a.conv_out + rb * channels + kh * S, channels, scale, sG, n);
    for (int idx = tid; idx < kC * kC / 4; idx += L::kThreads) {
      const int t = idx / (kC / 4), s = idx % (kC / 4) * 4;
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (t < n && s <= t) {
        v = load4(p.p + ((rb + t) * nv + head) * kC + s);
        if (s + 1 > t) v.y = 0.0f;
        if (s + 2 > t) v.z = 0.0f;
        if (s + 3 > t) v.w = 0.0f;
      }
      *reinterpret_cast<float4*>(sP + t * RP + s) = v;
    }
    __syncthreads();
    float2 acc[4];
    // U = Ũ − W M (rows past n: W is 0 there, and so is U).
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const int t = 4 * g + x;
      acc[x] =
          t < n
              ? *reinterpret_cast<const float2*>(a.out + (rb + t) * value_dim + head * S + j0 + jj)
              : make_float2(0.0f, 0.0f);
    }
#pragma unroll 2
    for (int i = 0; i < S; i += 4) {
      float4 w[4];
      float2 m[4];
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        w[x] = load4(sW + (4 * g + x) * R + i);
        m[x] = *reinterpret_cast<const float2*>(sM + (i + x) * kJ + jj);
      }
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        acc[x].x -= w[x].x * m[0].x + w[x].y * m[1].x + w[x].z * m[2].x + w[x].w * m[3].x;
        acc[x].y -= w[x].x * m[0].y + w[x].y * m[1].y + w[x].z * m[2].y + w[x].w * m[3].y;
      }
    }
#pragma unroll
    for (int x = 0; x < 4; ++x) *reinterpret_cast<float2*>(sU + (4 * g + x) * kJ + jj) = acc[x];
    __syncthreads();
    // K for M's update, loaded now and stored after O's products (their time hides the loads).
    constexpr int kKLoads = kC * S / 4 / L::kThreads;
    float4 k_ahead[kKLoads];
#pragma unroll
    for (int l = 0; l < kKLoads; ++l) {
      const int idx = tid + l * L::kThreads, t = idx / (S / 4), i = idx % (S / 4) * 4;
      k_ahead[l] = t < n ? load4(a.conv_out + (rb + t) * channels + key_dim + kh * S + i)
                         : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    // O = Qg M + P U, over Ũ in out (the same thread read it above).
#pragma unroll
    for (int x = 0; x < 4; ++x) acc[x] = make_float2(0.0f, 0.0f);
#pragma unroll 2
    for (int i = 0; i < S; i += 4) {
      float4 q[4];
      float2 m[4];
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        q[x] = load4(sQ + (4 * g + x) * R + i);
        m[x] = *reinterpret_cast<const float2*>(sM + (i + x) * kJ + jj);
      }
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        acc[x].x += q[x].x * m[0].x + q[x].y * m[1].x + q[x].z * m[2].x + q[x].w * m[3].x;
        acc[x].y += q[x].x * m[0].y + q[x].y * m[1].y + q[x].z * m[2].y + q[x].w * m[3].y;
      }
    }
    for (int s = 0; s < n; s += 4) {  // P is 0 past t, U past n
      float4 pv[4];
      float2 u[4];
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        pv[x] = load4(sP + (4 * g + x) * RP + s);
        u[x] = *reinterpret_cast<const float2*>(sU + (s + x) * kJ + jj);
      }
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        acc[x].x += pv[x].x * u[0].x + pv[x].y * u[1].x + pv[x].z * u[2].x + pv[x].w * u[3].x;
        acc[x].y += pv[x].x * u[0].y + pv[x].y * u[1].y + pv[x].z * u[2].y + pv[x].w * u[3].y;
      }
    }
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const int t = 4 * g + x;
      if (t < n)
        *reinterpret_cast<float2*>(a.out + (rb + t) * value_dim + head * S + j0 + jj) = acc[x];
    }
    __syncthreads();  // every read of sW and sU above is done
    const float g_last = sG[n - 1];
#pragma unroll
    for (int l = 0; l < kKLoads; ++l) {
      const int idx = tid + l * L::kThreads, t = idx / (S / 4), i = idx % (S / 4) * 4;
      *reinterpret_cast<float4*>(sW + t * R + i) = k_ahead[l];
    }
    for (int idx = tid; idx < kC * kJ; idx += L::kThreads) {
      const int t = idx / kJ;
      sU[idx] *= t < n ? expf(g_last - sG[t]) : 0.0f;
    }
    __syncthreads();
    // M = e^{γ_last} M + Kᵀ U: each thread reads and writes only its own elements of M here.
    const float decay = expf(g_last);
    float2 mac[kRowsC];
#pragma unroll
    for (int y = 0; y < kRowsC; ++y) {
      const float2 m = *reinterpret_cast<const float2*>(sM + (kRowsC * g + y) * kJ + jj);
      mac[y] = make_float2(m.x * decay, m.y * decay);
    }
    for (int t = 0; t < n; ++t) {
      const float2 u = *reinterpret_cast<const float2*>(sU + t * kJ + jj);
      const float* k = sW + t * R + kRowsC * g;
      if constexpr (kRowsC % 4 == 0) {
#pragma unroll
        for (int y = 0; y < kRowsC; y += 4) {
          const float4 k4 = load4(k + y);
          mac[y].x += k4.x * u.x;
          mac[y].y += k4.x * u.y;
          mac[y + 1].x += k4.y * u.x;
          mac[y + 1].y += k4.y * u.y;
          mac[y + 2].x += k4.z * u.x;
          mac[y + 2].y += k4.z * u.y;
          mac[y + 3].x += k4.w * u.x;
          mac[y + 3].y += k4.w * u.y;
        }
      } else {
#pragma unroll
        for (int y = 0; y < kRowsC; ++y) {
          mac[y].x += k[y] * u.x;
          mac[y].y += k[y] * u.y;
        }
      }
    }
#pragma unroll
    for (int y = 0; y < kRowsC; ++y)
      *reinterpret_cast<float2*>(sM + (kRowsC * g + y) * kJ + jj) = mac[y];
  }
  __syncthreads();
  for (int idx = tid; idx < S * kJ; idx += L::kThreads) M[(idx / kJ) * S + j0 + idx % kJ] = sM[idx];
}

template <int S>
cudaError_t allow_shared_bytes() {
  static const cudaError_t status = [] {
    const cudaError_t chunk =
        cudaFuncSetAttribute(chunk_kernel<S>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(ChunkLayout<S>::kBytes));
    if (chunk != cudaSuccess) return chunk;
    return cudaFuncSetAttribute(state_kernel<S>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(StateLayout<S>::kBytes));
  }();
  return status;
}

template <int S>
cudaError_t launch_chunked(const DeltaNetArgs& a, const KernelConfig& config, cudaStream_t stream) {
  if (const cudaError_t status = allow_shared_bytes<S>(); status != cudaSuccess) return status;
  const auto heads = static_cast<unsigned>(a.n_v_heads);
  const dim3 chunks(static_cast<unsigned>(max_chunks(a.rows)), heads);
  if (const cudaError_t status = launch_status(launch_early_shared(
          chunk_kernel<S>, chunks, dim3(kThreads), ChunkLayout<S>::kBytes, config, stream, a));
      status != cudaSuccess)
    return status;
  const dim3 runs(static_cast<unsigned>(max_chunked_runs(a.rows)), heads, S / StateLayout<S>::kJ);
  return launch_status(launch_early_shared(state_kernel<S>, runs, dim3(StateLayout<S>::kThreads),
                                           StateLayout<S>::kBytes, config, stream, a));
}

}  // namespace

cudaError_t launch_delta_net_chunked(const DeltaNetArgs& a, const KernelConfig& config,
                                     cudaStream_t stream) {
  if (!chunk_planned(a)) return cudaSuccess;
  if (const cudaError_t status =
          launch_status(launch_early(plan_kernel, dim3(1), dim3(1024), config, stream, a));
      status != cudaSuccess)
    return status;
  switch (a.state_size) {
    case 16:
      return launch_chunked<16>(a, config, stream);
    case 32:
      return launch_chunked<32>(a, config, stream);
    case 64:
      return launch_chunked<64>(a, config, stream);
    case 128:
      return launch_chunked<128>(a, config, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace granule::kernels
