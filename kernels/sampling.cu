// One block per row. The k-th largest logit is found by a radix select over order-preserving
// 32-bit keys (four passes of 8-bit histograms), the candidates are gathered and sorted in
// shared memory, and one thread walks them for temperature, top-p, min-p and the draw. Token
// masks: one thread polls the host's epoch in mapped memory, a copy brings the rows to device
// memory, then blocks of each masked row write -inf where a bit is clear.
#include <cfloat>

#include "common.cuh"
#include "sampling.cuh"

namespace granule::kernels {
namespace {

constexpr int kThreads = 1024;

__device__ __forceinline__ uint32_t order_key(float v) {
  const uint32_t u = __float_as_uint(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The warp's largest (v, idx), the lowest index among equal values, on every lane.
__device__ __forceinline__ void warp_argmax(float& v, int& idx) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, off);
    const int oi = __shfl_xor_sync(0xffffffffu, idx, off);
    if (ov > v || (ov == v && oi < idx)) {
      v = ov;
      idx = oi;
    }
  }
}

// Block-wide argmax with the lowest index winning ties. scratch: 32 floats + 32 ints.
__device__ void block_argmax(const float* x, int n, float* s_val, int* s_idx, float& best_val,
                             int& best_idx) {
  float v = -FLT_MAX;
  int idx = n;
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    if (x[i] > v) {
      v = x[i];
      idx = i;
    }  // strided: first hit per thread is its lowest index
  warp_argmax(v, idx);
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  __syncthreads();
  if (lane == 0) {
    s_val[warp] = v;
    s_idx[warp] = idx;
  }
  __syncthreads();
  if (warp == 0) {
    const int n_warps = blockDim.x / kWarpSize;
    v = lane < n_warps ? s_val[lane] : -FLT_MAX;
    idx = lane < n_warps ? s_idx[lane] : n;
    warp_argmax(v, idx);
    if (lane == 0) {
      s_val[0] = v;
      s_idx[0] = idx;
    }
  }
  __syncthreads();
  best_val = s_val[0];
  best_idx = s_idx[0];
}

constexpr int kArgmaxThreads = 256;
// 2 elements per thread: a 128k vocabulary spreads over ~250 blocks (at 16 per thread, 32
// blocks took 10 us on the H200; the pass is latency-bound, not bandwidth-bound).
constexpr int kArgmaxChunk = kArgmaxThreads * 2;

// One chunk of a row: the block's best (value, lowest index) as one 64-bit key that
// atomicMax can order (value bits high, inverted index low); the last block publishes it.
__global__ void __launch_bounds__(kArgmaxThreads)
    argmax_chunk_kernel(const float* logits, int64_t stride, int n_vocab, int32_t* tokens,
                        ArgmaxWorkspace ws) {
  wait_for_previous_kernel();
  allow_next_kernel();
  __shared__ float s_val[32];
  __shared__ int s_idx[32];
  __shared__ bool is_last;
  const int row = blockIdx.y;
  const int begin = blockIdx.x * kArgmaxChunk;
  const int count = min(kArgmaxChunk, n_vocab - begin);
  float v;
  int idx;
  block_argmax(logits + row * stride + begin, count, s_val, s_idx, v, idx);
  if (threadIdx.x == 0) {
    const unsigned long long key = (static_cast<unsigned long long>(order_key(v)) << 32) |
                                   (0xFFFFFFFFu - static_cast<uint32_t>(begin + idx));
    atomicMax(ws.best + row, key);
    __threadfence();
    is_last = atomicAdd(ws.counters + row, 1) == static_cast<int>(gridDim.x) - 1;
  }
  __syncthreads();
  if (is_last && threadIdx.x == 0) {
    const unsigned long long best = atomicExch(ws.best + row, 0ull);
    tokens[row] = static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(best & 0xFFFFFFFFu));
    ws.counters[row] = 0;
  }
}

__device__ void apply_penalties(float* x, const DeviceSamplingParams& p, const int32_t* history,
                                int length, int n_vocab) {
  if (p.repetition_penalty == 1.0f && p.frequency_penalty == 0.0f && p.presence_penalty == 0.0f)
    return;
  const int window =
      p.penalty_last_n < 0 ? length : min(length, p.penalty_last_n);  // < 0: all of it
  const int32_t* h = history + (length - window);
  for (int j = threadIdx.x; j < window; j += blockDim.x) {
    const int32_t token = h[j];
    if (token < 0 || token >= n_vocab) continue;
    bool first = true;
    int count = 0;
    for (int k = 0; k < window; ++k) {
      if (h[k] == token) {
        if (k < j) first = false;
        ++count;
      }
    }
    if (!first)
      continue;  // each distinct token is penalised once, by its first occurrence's thread
    float v = x[token];
    v = v > 0.0f ? v / p.repetition_penalty : v * p.repetition_penalty;
    v -= count * p.frequency_penalty + p.presence_penalty;
    x[token] = v;
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads) sampling_kernel(SamplingArgs a) {
  __shared__ float s_val[32];
  __shared__ int s_idx[32];
  __shared__ uint32_t s_hist[256];
  __shared__ uint32_t s_prefix, s_remaining, s_count, s_ties;
  __shared__ float c_val[kMaxSamplingCandidates];
  __shared__ int c_idx[kMaxSamplingCandidates];

  const int row = blockIdx.x;
  const DeviceSamplingParams p = a.params[row];
  float* x = a.logits + row * a.logits_stride;
  const int n = a.n_vocab;
  apply_penalties(x, p, a.history + static_cast<int64_t>(row) * a.history_stride,
                  a.history_length[row], n);

  if (p.temperature <= 0.0f || p.top_k == 1) {
    float v;
    int idx;
    block_argmax(x, n, s_val, s_idx, v, idx);
    if (threadIdx.x == 0) a.tokens[row] = idx < n ? idx : 0;
    return;
  }

  const int k = min(n, p.top_k > 0 ? min(p.top_k, kMaxSamplingCandidates) : kMaxSamplingCandidates);
  // Radix select: the key of the k-th largest logit, 8 bits per pass from the top.
  if (threadIdx.x == 0) {
    s_prefix = 0;
    s_remaining = k;
  }
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) s_hist[i] = 0;
    __syncthreads();
    const uint32_t prefix = s_prefix;
    const uint32_t high_mask = shift == 24 ? 0u : (0xFFFFFFFFu << (shift + 8));
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const uint32_t key = order_key(x[i]);
      if ((key & high_mask) == (prefix & high_mask)) atomicAdd(&s_hist[(key >> shift) & 0xFF], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      uint32_t remaining = s_remaining;
      int bin = 255;
      for (; bin > 0 && s_hist[bin] < remaining; --bin) remaining -= s_hist[bin];
      s_prefix = prefix | (static_cast<uint32_t>(bin) << shift);
      s_remaining = remaining;  // how many keys equal to the final threshold to take
    }
    __syncthreads();
  }
  const uint32_t threshold = s_prefix;
  if (threadIdx.x == 0) {
    s_count = 0;
    s_ties = 0;
  }
  for (int i = threadIdx.x; i < kMaxSamplingCandidates; i += blockDim.x) {
    c_val[i] = -FLT_MAX;
    c_idx[i] = INT32_MAX;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const uint32_t key = order_key(x[i]);
    bool take = key > threshold;
    if (key == threshold) take = atomicAdd(&s_ties, 1u) < s_remaining;
    if (take) {
      const uint32_t slot = atomicAdd(&s_count, 1u);
      if (slot < kMaxSamplingCandidates) {
        c_val[slot] = x[i];
        c_idx[slot] = i;
      }
    }
  }
  __syncthreads();

  // Bitonic sort of the candidates: larger logit first, lower id first on ties.
  for (int size = 2; size <= kMaxSamplingCandidates; size <<= 1) {
    for (int stride = size / 2; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < kMaxSamplingCandidates; i += blockDim.x) {
        const int j = i ^ stride;
        if (j > i) {
          const bool descending = (i & size) == 0;
          const bool i_first = c_val[i] > c_val[j] || (c_val[i] == c_val[j] && c_idx[i] < c_idx[j]);
          if (i_first != descending) {
            const float tv = c_val[i];
            c_val[i] = c_val[j];
            c_val[j] = tv;
            const int ti = c_idx[i];
            c_idx[i] = c_idx[j];
            c_idx[j] = ti;
          }
        }
      }
      __syncthreads();
    }
  }

  if (threadIdx.x == 0) {
    const int count = min(k, static_cast<int>(s_count));
    // Temperature softmax (unnormalised, relative to the best), then top-p and min-p cuts.
    const float best = c_val[0];
    float total = 0.0f;
    for (int i = 0; i < count; ++i) {
      c_val[i] = __expf((c_val[i] - best) / p.temperature);
      total += c_val[i];
    }
    int kept = count;
    if (p.top_p < 1.0f) {
      float cumulative = 0.0f;
      for (int i = 0; i < count; ++i) {
        cumulative += c_val[i];
        if (cumulative >= p.top_p * total) {
          kept = i + 1;
          break;
        }
      }
    }
    if (p.min_p > 0.0f) {
      int i = 1;
      while (i < kept && c_val[i] >= p.min_p * c_val[0]) ++i;
      kept = i;
    }
    float kept_total = 0.0f;
    for (int i = 0; i < kept; ++i) kept_total += c_val[i];
    const float target = sampling_uniform(p.seed, p.step) * kept_total;
    int chosen = kept - 1;
    float cumulative = 0.0f;
    for (int i = 0; i < kept; ++i) {
      cumulative += c_val[i];
      if (target < cumulative) {
        chosen = i;
        break;
      }
    }
    a.tokens[row] = c_idx[chosen];
  }
}

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// One thread: holds the stream until the host's masks are there, and says whether they came.
// __ldcv reads mapped host memory again on every poll (no cached line is trusted).
__global__ void token_mask_wait_kernel(TokenMaskArgs m) {
  const uint32_t wanted = __ldcv(m.wanted);
  const uint64_t start = global_timer_ns();
  uint32_t published = 1;
  while (__ldcv(m.ready) != wanted) {
    if (global_timer_ns() - start > kTokenMaskWaitNs) {
      *reinterpret_cast<volatile uint32_t*>(m.timed_out) = 1u;
      published = 0;
      break;
    }
    __nanosleep(500);
  }
  *m.published = published;
}

constexpr int kMaskThreads = 256;
constexpr int kMaskVectorsPerBlock = 64;  // 16-byte loads of 4 words (128 logits) each
constexpr int kMaskWordsPerBlock = kMaskVectorsPerBlock * 4;
constexpr int kMaskLogitsPerBlock = kMaskWordsPerBlock * 32;

// grid (chunks of kMaskLogitsPerBlock logits, rows), over the rows the copy brought to device
// memory: a block of a row without a mask (or of a step whose wait gave up) leaves after one
// load; else a quarter of the threads load the chunk's words into shared memory, 16 bytes
// each, and every thread writes -inf over the chunk's logits where a bit is clear.
__global__ void __launch_bounds__(kMaskThreads)
    token_mask_kernel(float* logits, int64_t stride, int n_vocab, const uint32_t* published,
                      const uint8_t* rows, int64_t row_bytes) {
  __shared__ uint4 s_words[kMaskVectorsPerBlock];
  const int row = blockIdx.y;
  const uint8_t* mask_row = rows + static_cast<int64_t>(row) * row_bytes;
  if (*published == 0 || *reinterpret_cast<const uint32_t*>(mask_row) == 0) return;
  const auto* vectors = reinterpret_cast<const uint4*>(mask_row + kTokenMaskRowHeaderBytes);
  const int row_vectors = ((n_vocab + 31) / 32 + 3) / 4;
  const int vector = blockIdx.x * kMaskVectorsPerBlock + static_cast<int>(threadIdx.x);
  if (static_cast<int>(threadIdx.x) < kMaskVectorsPerBlock && vector < row_vectors)
    s_words[threadIdx.x] = vectors[vector];
  __syncthreads();
  const auto* words = reinterpret_cast<const uint32_t*>(s_words);
  float* x = logits + row * stride;
  const int begin = blockIdx.x * kMaskLogitsPerBlock;
  const int end = min(n_vocab, begin + kMaskLogitsPerBlock);
  for (int i = begin + static_cast<int>(threadIdx.x); i < end; i += kMaskThreads) {
    const uint32_t word = words[(i - begin) >> 5];
    if (!((word >> (i & 31)) & 1u)) x[i] = __int_as_float(0xff800000);  // -inf
  }
}

}  // namespace

cudaError_t launch_token_mask(float* logits, int64_t logits_stride, int rows, int n_vocab,
                              int first_mask_row, const TokenMaskArgs& mask, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const int64_t row_words = ceil_div(n_vocab, 32);
  if (n_vocab <= 0 || rows < 0 || first_mask_row < 0 || rows > mask.device_row_count ||
      first_mask_row + rows > mask.host_row_count || mask.row_bytes % 16 != 0 ||
      mask.row_bytes < kTokenMaskRowHeaderBytes + row_words * 4 || !mask.ready || !mask.wanted ||
      !mask.timed_out || !mask.host_rows || !mask.published || !mask.device_rows)
    return cudaErrorInvalidValue;
  token_mask_wait_kernel<<<1, 1, 0, stream>>>(mask);
  if (const cudaError_t status = launch_status(); status != cudaSuccess) return status;
  // Queued after the wait: it starts once the wait saw the host's epoch, when every row the
  // host wrote before it is visible to the copy engine (pinned memory is coherent).
  if (const cudaError_t status = cudaMemcpyAsync(
          mask.device_rows, mask.host_rows + static_cast<int64_t>(first_mask_row) * mask.row_bytes,
          static_cast<size_t>(rows) * static_cast<size_t>(mask.row_bytes), cudaMemcpyHostToDevice,
          stream);
      status != cudaSuccess)
    return status;
  const dim3 grid(ceil_div(n_vocab, kMaskLogitsPerBlock), rows);
  token_mask_kernel<<<grid, kMaskThreads, 0, stream>>>(
      logits, logits_stride, n_vocab, mask.published, mask.device_rows, mask.row_bytes);
  return launch_status();
}

cudaError_t launch_sampling(const SamplingArgs& args, cudaStream_t stream) {
  if (args.rows == 0) return cudaSuccess;
  if (args.n_vocab <= 0) return cudaErrorInvalidValue;
  sampling_kernel<<<args.rows, kThreads, 0, stream>>>(args);
  return launch_status();
}

cudaError_t launch_argmax(const float* logits, int64_t logits_stride, int rows, int n_vocab,
                          int32_t* tokens, ArgmaxWorkspace workspace, const KernelConfig& config,
                          cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (n_vocab <= 0 || !workspace.best || !workspace.counters) return cudaErrorInvalidValue;
  const dim3 grid(ceil_div(n_vocab, kArgmaxChunk), rows);
  return launch_status(launch_early(argmax_chunk_kernel, grid, dim3(kArgmaxThreads), config, stream,
                                    logits, logits_stride, n_vocab, tokens, workspace));
}

}  // namespace granule::kernels
