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
constexpr int kThreads = 256;  // the chunk and state kernels'

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
struct ChunkLayout {                  // the chunk kernel's shared memory, in floats
  static constexpr int kRow = S + 1;  // padded: column walks and row-pair dots avoid conflicts
  static constexpr int kK = 0, kX = kK + kC * kRow, kA = kX + kC * kRow, kG = kA + kC * (kC + 1),
                       kB = kG + kC, kFloats = kB + kC;
  static constexpr size_t kBytes = kFloats * sizeof(float);
};

// Block (chunk, value head), 256 threads: the chunk's γ (to the plan's gamma), P (to its p), A,
// then W (to chunk_w) and Ũ (to out) by forward substitution, one thread per column of both.
template <int S>
__global__ void __launch_bounds__(kThreads) chunk_kernel(DeltaNetArgs a) {
  using L = ChunkLayout<S>;
  constexpr int R = L::kRow;
  const ChunkPlan p = chunk_plan_of(a);
  const int c = blockIdx.x;
  if (c >= p.counts[1]) return;
  const int r0 = p.chunk_row[c], n = p.chunk_len[c];
  const int head = blockIdx.y, nv = a.n_v_heads;
  const int key_dim = a.n_k_heads * S, value_dim = nv * S, channels = 2 * key_dim + value_dim;
  const int kh = head % a.n_k_heads;
  extern __shared__ float smem[];
  float* sK = smem + L::kK;  // K, then β e^γ K, solved into W
  float* sX = smem + L::kX;  // Q, then β V, solved into Ũ
  float* sA = smem + L::kA;  // [t][s], s < t
  float* sG = smem + L::kG;  // g, then γ
  float* sB = smem + L::kB;  // β
  for (int idx = threadIdx.x; idx < n * S; idx += blockDim.x) {
    const int t = idx / S, i = idx % S;
    const float* x = a.conv_out + static_cast<int64_t>(r0 + t) * channels;
    sX[t * R + i] = x[kh * S + i];
    sK[t * R + i] = x[key_dim + kh * S + i];
  }
  if (static_cast<int>(threadIdx.x) < n) {
    const int64_t at = static_cast<int64_t>(r0 + threadIdx.x) * nv + head;
    sB[threadIdx.x] = sigmoid_exact(a.beta[at]);
    sG[threadIdx.x] = softplus(a.alpha[at] + a.dt_bias[head]) * a.a[head];
  }
  __syncthreads();
  if (threadIdx.x == 0)
    for (int t = 1; t < n; ++t) sG[t] += sG[t - 1];
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < n)
    p.gamma[static_cast<int64_t>(r0 + threadIdx.x) * nv + head] = sG[threadIdx.x];
  const float scale = 1.0f / sqrtf(static_cast<float>(S));
  // P (s <= t) and A (s < t); a warp covers 32 s of one t.
  for (int idx = threadIdx.x; idx < n * kC; idx += blockDim.x) {
    const int t = idx / kC, s = idx % kC;
    if (s > t) continue;
    float qk = 0.0f, kk = 0.0f;
#pragma unroll 8
    for (int i = 0; i < S; ++i) {
      const float ks = sK[s * R + i];
      qk += sX[t * R + i] * ks;
      kk += sK[t * R + i] * ks;
    }
    const float e = expf(sG[t] - sG[s]);
    p.p[(static_cast<int64_t>(r0 + t) * nv + head) * kC + s] = scale * e * qk;
    if (s < t) sA[t * (kC + 1) + s] = sB[t] * e * kk;
  }
  __syncthreads();
  // The right-hand sides, in place: β e^γ K and β V.
  for (int idx = threadIdx.x; idx < n * S; idx += blockDim.x) {
    const int t = idx / S, i = idx % S;
    sK[t * R + i] *= sB[t] * expf(sG[t]);
    sX[t * R + i] =
        sB[t] * a.conv_out[static_cast<int64_t>(r0 + t) * channels + 2 * key_dim + head * S + i];
  }
  __syncthreads();
  // x_t -= Σ_{s<t} A[t][s] x_s down each column (a thread's own column: no barrier).
  for (int col = threadIdx.x; col < 2 * S; col += blockDim.x) {
    float* x = col < S ? sK + col : sX + (col - S);
    float* dst = (col < S ? a.chunk_w + col : a.out + (col - S)) + head * S +
                 static_cast<int64_t>(r0) * value_dim;
    dst[0] = x[0];
    for (int t = 1; t < n; ++t) {
      const float* A = sA + t * (kC + 1);
      float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
      int s = 0;
      for (; s + 4 <= t; s += 4) {
        s0 += A[s] * x[s * R];
        s1 += A[s + 1] * x[(s + 1) * R];
        s2 += A[s + 2] * x[(s + 2) * R];
        s3 += A[s + 3] * x[(s + 3) * R];
      }
      for (; s < t; ++s) s0 += A[s] * x[s * R];
      const float v = x[t * R] - ((s0 + s1) + (s2 + s3));
      x[t * R] = v;
      dst[static_cast<int64_t>(t) * value_dim] = v;
    }
  }
}

template <int S>
struct StateLayout {                          // the state kernel's shared memory, in floats
  static constexpr int kJ = S < 32 ? S : 32;  // value columns per block
  static constexpr int kRow = S + 1;
  static constexpr int kM = 0, kW = kM + S * kJ, kQ = kW + kC * kRow, kP = kQ + kC * kRow,
                       kU = kP + kC * (kC + 1), kG = kU + kC * kJ, kFloats = kG + kC;
  static constexpr size_t kBytes = kFloats * sizeof(float);
};

// Block (chunked run, value head, group of kJ value columns), 256 threads: the run's chunks in
// order, the group's columns of M in shared memory. Per chunk: U = Ũ − W M, O = Qg M + P U (over
// Ũ in out), M = e^{γ_last} M + Kᵀ (e^{γ_last − γ} U). Thread (tq, j) owns column j and rows
// tq, tq + kGroups, ... of each product.
template <int S>
__global__ void __launch_bounds__(kThreads) state_kernel(DeltaNetArgs a) {
  using L = StateLayout<S>;
  constexpr int kJ = L::kJ, R = L::kRow;
  constexpr int kGroups = kThreads / kJ;
  constexpr int kT = kC / kGroups;  // chunk rows per thread
  constexpr int kI = S / kGroups;   // state rows per thread
  const ChunkPlan p = chunk_plan_of(a);
  const int run = blockIdx.x;
  if (run >= p.counts[0]) return;
  const int r0 = p.run_row[run], len = p.run_len[run];
  const int head = blockIdx.y, j0 = blockIdx.z * kJ, nv = a.n_v_heads;
  const int j = threadIdx.x % kJ, tq = threadIdx.x / kJ;
  const int key_dim = a.n_k_heads * S, value_dim = nv * S, channels = 2 * key_dim + value_dim;
  const int kh = head % a.n_k_heads;
  const int64_t conv_floats = static_cast<int64_t>(a.conv_kernel - 1) * channels;
  float* M = a.state + static_cast<int64_t>(a.slots[r0]) * a.slot_stride + conv_floats +
             static_cast<int64_t>(head) * S * S;
  const bool fresh = a.positions[r0] == 0;
  extern __shared__ float smem[];
  float* sM = smem + L::kM;  // [i][j]
  float* sW = smem + L::kW;  // W, then K
  float* sQ = smem + L::kQ;  // scale e^γ Q
  float* sP = smem + L::kP;  // [t][s], 0 for s > t
  float* sU = smem + L::kU;  // [t][j]: u, then e^{γ_last − γ_t} u
  float* sG = smem + L::kG;
  for (int idx = threadIdx.x; idx < S * kJ; idx += blockDim.x)
    sM[idx] = fresh ? 0.0f : M[(idx / kJ) * S + j0 + idx % kJ];
  const float scale = 1.0f / sqrtf(static_cast<float>(S));
  for (int t0 = 0; t0 < len; t0 += kC) {
    const int n = min(kC, len - t0);
    const int64_t rb = r0 + t0;
    if (static_cast<int>(threadIdx.x) < kC)
      sG[threadIdx.x] =
          static_cast<int>(threadIdx.x) < n ? p.gamma[(rb + threadIdx.x) * nv + head] : 0.0f;
    __syncthreads();  // sG, and the previous chunk's last reads of sW, sQ, sP
    for (int idx = threadIdx.x; idx < kC * S; idx += blockDim.x) {
      const int t = idx / S, i = idx % S;
      float w = 0.0f, q = 0.0f;
      if (t < n) {
        w = a.chunk_w[(rb + t) * value_dim + head * S + i];
        q = a.conv_out[(rb + t) * channels + kh * S + i] * (scale * expf(sG[t]));
      }
      sW[t * R + i] = w;
      sQ[t * R + i] = q;
    }
    for (int idx = threadIdx.x; idx < kC * kC; idx += blockDim.x) {
      const int t = idx / kC, s = idx % kC;
      sP[t * (kC + 1) + s] = t < n && s <= t ? p.p[((rb + t) * nv + head) * kC + s] : 0.0f;
    }
    __syncthreads();
    float acc[kT];
    // U = Ũ − W M (rows past n: W is 0 there, and so is U).
#pragma unroll
    for (int m = 0; m < kT; ++m) {
      const int t = tq + m * kGroups;
      acc[m] = t < n ? a.out[(rb + t) * value_dim + head * S + j0 + j] : 0.0f;
    }
    for (int i = 0; i < S; ++i) {
      const float mij = sM[i * kJ + j];
#pragma unroll
      for (int m = 0; m < kT; ++m) acc[m] -= sW[(tq + m * kGroups) * R + i] * mij;
    }
#pragma unroll
    for (int m = 0; m < kT; ++m) sU[(tq + m * kGroups) * kJ + j] = acc[m];
    __syncthreads();
    // O = Qg M + P U, over Ũ in out (the same thread read it above).
#pragma unroll
    for (int m = 0; m < kT; ++m) acc[m] = 0.0f;
    for (int i = 0; i < S; ++i) {
      const float mij = sM[i * kJ + j];
#pragma unroll
      for (int m = 0; m < kT; ++m) acc[m] += sQ[(tq + m * kGroups) * R + i] * mij;
    }
    for (int s = 0; s < n; ++s) {
      const float us = sU[s * kJ + j];
#pragma unroll
      for (int m = 0; m < kT; ++m) acc[m] += sP[(tq + m * kGroups) * (kC + 1) + s] * us;
    }
#pragma unroll
    for (int m = 0; m < kT; ++m) {
      const int t = tq + m * kGroups;
      if (t < n) a.out[(rb + t) * value_dim + head * S + j0 + j] = acc[m];
    }
    __syncthreads();  // every read of sW and sU above is done
    const float g_last = sG[n - 1];
    for (int idx = threadIdx.x; idx < kC * S; idx += blockDim.x) {
      const int t = idx / S, i = idx % S;
      sW[t * R + i] = t < n ? a.conv_out[(rb + t) * channels + key_dim + kh * S + i] : 0.0f;
    }
    for (int idx = threadIdx.x; idx < kC * kJ; idx += blockDim.x) {
      const int t = idx / kJ;
      sU[idx] *= t < n ? expf(g_last - sG[t]) : 0.0f;
    }
    __syncthreads();
    // M = e^{γ_last} M + Kᵀ U: each thread reads and writes only its own elements of M here.
    const float decay = expf(g_last);
    float mac[kI];
#pragma unroll
    for (int mm = 0; mm < kI; ++mm) mac[mm] = sM[(tq + mm * kGroups) * kJ + j] * decay;
    for (int t = 0; t < n; ++t) {
      const float u = sU[t * kJ + j];
#pragma unroll
      for (int mm = 0; mm < kI; ++mm) mac[mm] += sW[t * R + tq + mm * kGroups] * u;
    }
#pragma unroll
    for (int mm = 0; mm < kI; ++mm) sM[(tq + mm * kGroups) * kJ + j] = mac[mm];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < S * kJ; idx += blockDim.x)
    M[(idx / kJ) * S + j0 + idx % kJ] = sM[idx];
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
cudaError_t launch_chunked(const DeltaNetArgs& a, cudaStream_t stream) {
  if (const cudaError_t status = allow_shared_bytes<S>(); status != cudaSuccess) return status;
  const auto heads = static_cast<unsigned>(a.n_v_heads);
  const dim3 chunks(static_cast<unsigned>(max_chunks(a.rows)), heads);
  chunk_kernel<S><<<chunks, kThreads, ChunkLayout<S>::kBytes, stream>>>(a);
  if (const cudaError_t status = launch_status(); status != cudaSuccess) return status;
  const dim3 runs(static_cast<unsigned>(max_chunked_runs(a.rows)), heads, S / StateLayout<S>::kJ);
  state_kernel<S><<<runs, kThreads, StateLayout<S>::kBytes, stream>>>(a);
  return launch_status();
}

}  // namespace

cudaError_t launch_delta_net_chunked(const DeltaNetArgs& a, cudaStream_t stream) {
  if (!chunk_planned(a)) return cudaSuccess;
  plan_kernel<<<1, 1024, 0, stream>>>(a);
  if (const cudaError_t status = launch_status(); status != cudaSuccess) return status;
  switch (a.state_size) {
    case 16:
      return launch_chunked<16>(a, stream);
    case 32:
      return launch_chunked<32>(a, stream);
    case 64:
      return launch_chunked<64>(a, stream);
    case 128:
      return launch_chunked<128>(a, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace granule::kernels
