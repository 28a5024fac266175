// Split attention in one launch (flash-decoding). Each (split, kv head, row) block takes the
// query heads of that KV head (GQA: K and V are read once for the whole group); its 4 warps
// take tiles of T tokens in turn, each with its own online softmax, and merge in shared
// memory; the last split block of a (row, kv head) to finish merges the splits.
//
// Split size, chosen on the device per row (the grid is fixed, lengths change every step):
// at least split_tokens (the host's), larger when the grid would have more blocks than
// target_splits per (row, kv head) (kBlocksPerSm per SM), capped at
// max(split_tokens, kMaxSplitTokens). The grid has the most splits that rule can give; blocks past
// the row's own split count return at once.
//
// Per tile, a warp computes the T x GP scores (GP: the group padded to 1, 2, 4 or 8) as
// per-lane partial dot products, then sums all of them at once with a reduce-scatter over
// the lanes (31 shuffles for 32 scores instead of 5 per score): lane `lane` ends with score
// number lane >> SH. One max / exp / sum per tile and head, the probabilities go through
// shared memory, and P·V is accumulated with lanes owning head dimensions. The next tile's K
// and V are loaded before the current one is used (software prefetch).
//
// The merge of the splits reads each split's (m, l) once into shared memory as weights,
// then every thread sums 4 head dimensions over the splits with independent 16-byte loads.
// Partial workspace: [row][head][max_splits][head_dim] accumulators, then
// [row][head][max_splits][2] (m, l): attention_workspace_floats() floats as before.
//
// A sliding-window layer (args.window > 0) splits only the row's window [length - window,
// length), so no block reads KV behind it. Sinks (gpt-oss) join the normaliser where the
// output is written (output_scale): once per head, whatever the split count.
#include <cfloat>

#include "attention.cuh"
#include "common.cuh"

namespace granule::kernels {
namespace {

constexpr int kMaxGroup = 8;
// Splits grow past the host's split_tokens up to this many tokens (prefill keeps its 1024).
constexpr int kMaxSplitTokens = 1024;
constexpr unsigned kFullMask = 0xffffffffu;
// Splits a sequence's length until its blocks fill every SM this many times over: more splits,
// shorter chains per block for short sequences, and a merge pass per (row, KV head).
constexpr int kBlocksPerSm = 3;

constexpr int log2_of(int n) { return n <= 1 ? 0 : 1 + log2_of(n / 2); }

struct SplitPlan {
  int tokens, count;
};

// The same for every block of a row: tokens per split (a multiple of 16) and split count.
__device__ __forceinline__ SplitPlan plan_splits(int length, int split_tokens, int max_splits,
                                                 int target_splits) {
  int tokens = max(split_tokens, (length + target_splits - 1) / target_splits);
  tokens = min(tokens, max(split_tokens, kMaxSplitTokens));
  tokens = (tokens + 15) / 16 * 16;
  int count = (length + tokens - 1) / tokens;
  if (count > max_splits) {  // never with the host's max_splits; kept safe all the same
    count = max_splits;
    tokens = (length + count - 1) / count;
  }
  return {tokens, count};
}

template <int EPL>
__device__ __forceinline__ void load_raw(const __half* p, uint32_t (&w)[EPL / 2]) {
  if constexpr (EPL == 2) {
    w[0] = *reinterpret_cast<const uint32_t*>(p);
  } else if constexpr (EPL == 4) {
    const uint2 r = *reinterpret_cast<const uint2*>(p);
    w[0] = r.x;
    w[1] = r.y;
  } else {
    const uint4 r = *reinterpret_cast<const uint4*>(p);
    w[0] = r.x;
    w[1] = r.y;
    w[2] = r.z;
    w[3] = r.w;
  }
}

__device__ __forceinline__ float2 half2_bits(uint32_t w) {
  return __half22float2(*reinterpret_cast<const __half2*>(&w));
}

// A lane's W words of one token's K or V as 2W floats.
template <int W>
__device__ __forceinline__ void unpack_halves(const uint32_t (&w)[W], float (&f)[2 * W]) {
#pragma unroll
  for (int i = 0; i < W; ++i) {
    const float2 h = half2_bits(w[i]);
    f[2 * i] = h.x;
    f[2 * i + 1] = h.y;
  }
}

// Writes 4 consecutive output elements at `column` of `row` (and their f16 or int8 copy). Every
// lane of the warp calls it (inactive lanes with active = false): 8 lanes hold one 32-element int8
// block (columns are multiples of 4 within a head, heads multiples of 32).
__device__ __forceinline__ void write_output4(const AttentionArgs& a, int row, int column, float4 v,
                                              bool active) {
  const int64_t at = static_cast<int64_t>(row) * a.out_stride + column;
  if (active) *reinterpret_cast<float4*>(a.out + at) = v;
  if (active && a.out_f16) {
    const __half2 lo = __floats2half2_rn(v.x, v.y), hi = __floats2half2_rn(v.z, v.w);
    uint2 bits;
    bits.x = *reinterpret_cast<const uint32_t*>(&lo);
    bits.y = *reinterpret_cast<const uint32_t*>(&hi);
    *reinterpret_cast<uint2*>(a.out_f16 + at) = bits;
  }
  if (!a.out_q8.qs) return;
  float amax = active ? fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))) : 0.0f;
#pragma unroll
  for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, o));
  const float d = amax / 127.0f;
  int q[4] = {0, 0, 0, 0};
  if (amax != 0.0f) {
    q[0] = __float2int_rn(v.x / d);
    q[1] = __float2int_rn(v.y / d);
    q[2] = __float2int_rn(v.z / d);
    q[3] = __float2int_rn(v.w / d);
  }
  int sum = active ? q[0] + q[1] + q[2] + q[3] : 0;
#pragma unroll
  for (int o = 1; o < 8; o <<= 1) sum += __shfl_xor_sync(kFullMask, sum, o);
  if (!active) return;
  char4 packed;
  packed.x = static_cast<signed char>(q[0]);
  packed.y = static_cast<signed char>(q[1]);
  packed.z = static_cast<signed char>(q[2]);
  packed.w = static_cast<signed char>(q[3]);
  *reinterpret_cast<char4*>(a.out_q8.qs + at) = packed;
  if (threadIdx.x % 8 == 0)
    a.out_q8.ds[at / kQ8Block] = make_float2(d, d * static_cast<float>(sum));
}

// What a head's merged accumulator (relative to its largest score m, with exponential sum l) is
// multiplied by to give the output: 1 / l, or with a sink logit s (gpt-oss) the normaliser
// l + exp(s - m), formed relative to max(m, s) so that neither side overflows.
__device__ __forceinline__ float output_scale(const AttentionArgs& a, int head, float m, float l) {
  if (!a.sinks) return l > 0.0f ? 1.0f / l : 0.0f;
  const float sink = a.sinks[head];
  const float top = fmaxf(m, sink);
  const float w = __expf(m - top);
  return w / fmaf(l, w, __expf(sink - top));
}

__device__ __forceinline__ float4 fma4(float w, float4 x, float4 acc) {
  return make_float4(fmaf(w, x.x, acc.x), fmaf(w, x.y, acc.y), fmaf(w, x.z, acc.z),
                     fmaf(w, x.w, acc.w));
}

// One step of the reduce-scatter over N scores per lane at lane distance O, then the next:
// each lane keeps the half its lane bit O selects and adds its partner's partial of it.
template <int N, int O, int NV>
__device__ __forceinline__ void reduce_scatter(float (&s)[NV], int lane) {
  if constexpr (N > 1) {
    const bool upper = (lane & O) != 0;
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const float send = upper ? s[i] : s[i + N / 2];
      const float keep = upper ? s[i + N / 2] : s[i];
      s[i] = keep + __shfl_xor_sync(kFullMask, send, O);
    }
    reduce_scatter<N / 2, O / 2>(s, lane);
  }
}

// EPL: head dimensions per lane (head_dim / 32). GP: the GQA group padded to a power of 2.
// NW: warps per block (launch_for). 8-warp blocks hold one tile of K and V per warp (no second
// tile in flight) so that two of them fit an SM's registers: 16 warps per SM where a grid of
// one split per (row, KV head) gives each SM about two blocks.
template <int EPL, int GP, int NW>
__global__ void __launch_bounds__(NW* kWarpSize, NW == 8 ? 2 : 1)
    attention_split_kernel(AttentionArgs a, int target_splits) {
  constexpr int kWarps = NW;
  constexpr int kThreads = NW * kWarpSize;
  constexpr int kHeadDim = EPL * kWarpSize;
  constexpr int W = EPL / 2;                   // 32-bit words of K (or V) per lane per token
  constexpr int T = GP == 8 ? 4 : 8;           // tokens per tile
  constexpr int NV = T * GP;                   // scores per tile: 8, 16 or 32
  constexpr int SH = 5 - log2_of(NV);          // lane >> SH: the score a lane ends with
  constexpr int kTokenBit = SH + log2_of(GP);  // lanes of one head differ from this bit up
  constexpr bool kPrefetch = NW == 4 && EPL * GP <= 32;  // registers allow a second tile
  constexpr int kVecs = GP * kHeadDim / 4;               // float4 outputs of the group
  constexpr int kChunk = 2 * kHeadDim;                   // splits merged per pass
  constexpr int kQuickMerge = 8;  // splits the last block merges in one round trip
  constexpr int kVecsPerThread = (kVecs + kThreads - 1) / kThreads;  // in the last block's merge
  static_assert(2 * GP * kChunk <= kWarps * GP * kHeadDim, "merge weights reuse sm_acc");

  __shared__ __align__(16) float sm_acc[kWarps][GP][kHeadDim];
  __shared__ __align__(16) float sm_p[kWarps][NV];
  __shared__ float sm_c[kWarps][GP];
  __shared__ float sm_m[kWarps][GP], sm_l[kWarps][GP];
  __shared__ float sm_mall[GP];
  __shared__ bool is_last;

  // The row's length and slot are step inputs the host wrote before the step's first kernel,
  // and the slots' KV bases are set at attach: the plan and the KV address are formed before
  // waiting for the previous kernel (which writes q and this token's K and V). Blocks with no
  // tokens leave at once, but block 0 of the grid always waits, so that the grid never
  // completes before the kernel it follows (a later kernel's wait covers both only through
  // this one's).
  const int split = blockIdx.x, kv_head = blockIdx.y, row = blockIdx.z;
  const int length = a.lengths[row];
  // The tokens this row reads: [first, length), the window's on a sliding layer.
  const int first = a.window > 0 ? max(0, length - a.window) : 0;
  const SplitPlan plan =
      length > 0 ? plan_splits(length - first, a.split_tokens, a.max_splits, target_splits)
                 : SplitPlan{0, 0};
  if (split >= plan.count) {
    if ((split | kv_head | row) != 0) return;
    wait_for_previous_kernel();
    return;
  }
  const __half* slot_kv = a.slot_base[a.slots[row]];
  const int start = first + split * plan.tokens;
  const int end = min(length, start + plan.tokens);
  const int group = a.n_head / a.n_kv;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int d0 = lane * EPL;

  const __half* base = slot_kv + a.kv_offset +
                       static_cast<int64_t>(a.layer) * 2 * a.n_kv * kHeadDim + kv_head * kHeadDim +
                       d0;
  const int64_t v_offset = static_cast<int64_t>(a.n_kv) * kHeadDim;
  auto load_token = [&](int token, uint32_t(&kr)[W], uint32_t(&vr)[W]) {
    const __half* kp = base + static_cast<int64_t>(token) * a.token_stride;
    load_raw<EPL>(kp, kr);
    load_raw<EPL>(kp + v_offset, vr);
  };
  // Tokens t0 .. t0 + T - 1 below `limit` (the split's end, or `settled` below), zeros past it.
  auto load_tile = [&](int t0, uint32_t(&kr)[T][W], uint32_t(&vr)[T][W], int limit) {
#pragma unroll
    for (int t = 0; t < T; ++t) {
      if (t0 + t < limit) {
        load_token(t0 + t, kr[t], vr[t]);
      } else {
#pragma unroll
        for (int w = 0; w < W; ++w) kr[t][w] = vr[t][w] = 0u;  // never read past the length
      }
    }
  };

  // A warp's first tile: the tokens below `settled` before the wait, the rest after it. A
  // row's new tokens in this step (written by the kernels before this one) are at most the
  // launch's rows and end its length, so tokens below length - rows were written by earlier
  // steps, whose kernels have all completed.
  const int n_tiles = (end - start + T - 1) / T;
  const int settled = max(start, min(end, length - a.rows));
  const int first_t0 = start + warp * T;
  uint32_t kn[T][W], vn[T][W];
  if (warp < n_tiles) load_tile(first_t0, kn, vn, settled);
  wait_for_previous_kernel();
  allow_next_kernel();

  float q[GP][EPL], acc[GP][EPL];
#pragma unroll
  for (int g = 0; g < GP; ++g) {
#pragma unroll
    for (int j = 0; j < EPL; ++j) {
      acc[g][j] = 0.0f;
      q[g][j] = g < group
                    ? a.q[row * a.q_stride + (kv_head * group + g) * kHeadDim + d0 + j] * a.scale
                    : 0.0f;
    }
  }
  if (warp < n_tiles) {
#pragma unroll
    for (int t = 0; t < T; ++t)
      if (first_t0 + t >= settled && first_t0 + t < end) load_token(first_t0 + t, kn[t], vn[t]);
  }
  // This lane's score in a tile: token my_t, head my_g; it keeps that head's running max and
  // sum (every lane of a head holds the same values).
  const int my_i = lane >> SH, my_t = my_i / GP, my_g = my_i % GP;
  float m_own = -FLT_MAX, l_own = 0.0f;

  for (int tile = warp; tile < n_tiles; tile += kWarps) {
    const int t0 = start + tile * T;
    uint32_t kc[T][W], vc[T][W];
    auto take_loaded = [&] {  // the tile in kn, vn becomes the current one
#pragma unroll
      for (int t = 0; t < T; ++t)
#pragma unroll
        for (int w = 0; w < W; ++w) {
          kc[t][w] = kn[t][w];
          vc[t][w] = vn[t][w];
        }
    };
    if constexpr (kPrefetch) {
      take_loaded();
      if (tile + kWarps < n_tiles) load_tile(t0 + kWarps * T, kn, vn, end);
    } else {
      if (tile != warp) load_tile(t0, kn, vn, end);
      take_loaded();
    }

    // Partial dot products of this lane's head dimensions, score index t * GP + g.
    float s[NV];
#pragma unroll
    for (int t = 0; t < T; ++t) {
      float kf[EPL];
      unpack_halves<W>(kc[t], kf);
#pragma unroll
      for (int g = 0; g < GP; ++g) {
        float x = 0.0f;
#pragma unroll
        for (int j = 0; j < EPL; ++j) x = fmaf(q[g][j], kf[j], x);
        s[t * GP + g] = x;
      }
    }
    // Reduce-scatter, then plain butterflies over the lanes that hold the same score.
    reduce_scatter<NV, 16>(s, lane);
#pragma unroll
    for (int o = (1 << SH) / 2; o > 0; o >>= 1) s[0] += __shfl_xor_sync(kFullMask, s[0], o);
    const float score = t0 + my_t < end ? s[0] : -INFINITY;

    // Online softmax per head over the tile: lanes of one head differ in bits >= kTokenBit.
    float tile_max = score;
#pragma unroll
    for (int o = 16; o >= (1 << kTokenBit); o >>= 1)
      tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, o));
    const float m_new = fmaxf(m_own, tile_max);  // finite: a tile has a token in range
    const float correction = __expf(m_own - m_new);
    const float p = __expf(score - m_new);
    float p_sum = p;
#pragma unroll
    for (int o = 16; o >= (1 << kTokenBit); o >>= 1) p_sum += __shfl_xor_sync(kFullMask, p_sum, o);
    l_own = l_own * correction + p_sum;
    m_own = m_new;
    if ((lane & ((1 << SH) - 1)) == 0) {
      sm_p[warp][my_i] = p;
      if (my_t == 0) sm_c[warp][my_g] = correction;
    }
    __syncwarp();
#pragma unroll
    for (int g = 0; g < GP; ++g) {
      const float c = sm_c[warp][g];
#pragma unroll
      for (int j = 0; j < EPL; ++j) acc[g][j] *= c;
    }
#pragma unroll
    for (int t = 0; t < T; ++t) {
      float vf[EPL];
      unpack_halves<W>(vc[t], vf);
#pragma unroll
      for (int g = 0; g < GP; ++g) {
        const float pt = sm_p[warp][t * GP + g];
#pragma unroll
        for (int j = 0; j < EPL; ++j) acc[g][j] = fmaf(pt, vf[j], acc[g][j]);
      }
    }
    __syncwarp();  // sm_p and sm_c are rewritten by the next tile
  }

  // Merge the warps: each thread takes 4 consecutive elements of one head of the group.
  if ((lane & ((1 << SH) - 1)) == 0 && my_t == 0) {
    sm_m[warp][my_g] = m_own;
    sm_l[warp][my_g] = l_own;
  }
#pragma unroll
  for (int g = 0; g < GP; ++g)
#pragma unroll
    for (int j = 0; j < EPL; ++j) sm_acc[warp][g][d0 + j] = acc[g][j];
  __syncthreads();

  const int n_vecs = group * kHeadDim / 4;
  const int64_t split_base =
      (static_cast<int64_t>(row) * a.n_head + kv_head * group) * a.max_splits;
  float* partial_acc = a.partial;  // [row][head][split][head_dim]
  float* partial_ml =
      a.partial + static_cast<int64_t>(a.rows) * a.n_head * a.max_splits * kHeadDim;  // [..][2]
  for (int e0 = warp * kWarpSize; e0 < n_vecs; e0 += kThreads) {
    const int e = e0 + lane;
    const bool active = e < n_vecs;
    const int g = active ? e / (kHeadDim / 4) : 0, d = (e % (kHeadDim / 4)) * 4;
    float m_all = -FLT_MAX;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m_all = fmaxf(m_all, sm_m[w][g]);
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float sum_l = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float f = sm_l[w][g] > 0.0f ? __expf(sm_m[w][g] - m_all) : 0.0f;
      sum = fma4(f, *reinterpret_cast<const float4*>(&sm_acc[w][g][d]), sum);
      sum_l = fmaf(f, sm_l[w][g], sum_l);
    }
    const int head = kv_head * group + g;
    if (plan.count == 1) {
      const float inv = output_scale(a, head, m_all, sum_l);
      write_output4(a, row, head * kHeadDim + d,
                    make_float4(sum.x * inv, sum.y * inv, sum.z * inv, sum.w * inv), active);
      continue;
    }
    if (!active) continue;
    const int64_t at = split_base + static_cast<int64_t>(g) * a.max_splits + split;
    *reinterpret_cast<float4*>(partial_acc + at * kHeadDim + d) = sum;
    if (d == 0) *reinterpret_cast<float2*>(partial_ml + at * 2) = make_float2(m_all, sum_l);
  }
  if (plan.count == 1) return;

  // The last block to finish among this (row, kv head)'s splits merges them (no second
  // launch): publish the partial, take a ticket, and the final ticket holder reads all.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    int* counter = a.split_counters + row * a.n_kv + kv_head;
    is_last = atomicAdd(counter, 1) == plan.count - 1;
    if (is_last) *counter = 0;  // ready for the next launch
  }
  __syncthreads();
  if (!is_last) return;
  __threadfence();

  const int n = plan.count;
  if (n <= kQuickMerge) {
    // Up to kQuickMerge splits (a row of up to 512 tokens at the host's 64 per split): each
    // thread requests all of its vector's partials and its head's (m, l) at once, one round
    // trip instead of three and no barrier, then merges in the order of the general path below
    // (the same m_all, the same weights, the splits in turn), so the output is the same to
    // the bit.
#pragma unroll
    for (int r = 0; r < kVecsPerThread; ++r) {
      const int e0 = warp * kWarpSize + r * kThreads;  // whole warps call write_output4
      if (e0 >= n_vecs) break;
      const int e = e0 + lane;
      const bool active = e < n_vecs;
      const int g = active ? e / (kHeadDim / 4) : 0, d = (e % (kHeadDim / 4)) * 4;
      const int64_t first = split_base + static_cast<int64_t>(g) * a.max_splits;
      float4 x[kQuickMerge];
      float2 ml[kQuickMerge];
#pragma unroll
      for (int c = 0; c < kQuickMerge; ++c) {
        if (c < n) {
          ml[c] = __ldcg(reinterpret_cast<const float2*>(partial_ml) + first + c);
          x[c] = __ldcg(reinterpret_cast<const float4*>(partial_acc + (first + c) * kHeadDim + d));
        }
      }
      float m_all = -FLT_MAX;
#pragma unroll
      for (int c = 0; c < kQuickMerge; ++c)
        if (c < n) m_all = fmaxf(m_all, ml[c].x);
      float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      float sum_l = 0.0f;
#pragma unroll
      for (int c = 0; c < kQuickMerge; ++c) {
        if (c < n) {
          const float w = __expf(ml[c].x - m_all);
          sum = fma4(w, x[c], sum);
          sum_l += __fmul_rn(w, ml[c].y);  // rounded as the general path's stored w * l
        }
      }
      const float inv = output_scale(a, kv_head * group + g, m_all, sum_l);
      write_output4(a, row, (kv_head * group + g) * kHeadDim + d,
                    make_float4(sum.x * inv, sum.y * inv, sum.z * inv, sum.w * inv), active);
    }
    return;
  }
  // The largest m of each head: warp w takes heads w, w + 4.
  for (int g = warp; g < group; g += kWarps) {
    const float2* ml = reinterpret_cast<const float2*>(partial_ml) + split_base +
                       static_cast<int64_t>(g) * a.max_splits;
    float mx = -FLT_MAX;
    for (int sp = lane; sp < n; sp += kWarpSize) mx = fmaxf(mx, __ldcg(ml + sp).x);
    mx = warp_max(mx);
    if (lane == 0) sm_mall[g] = mx;
  }
  // Per pass over kChunk splits: each split's weight exp(m - m_all) and weight * l in shared
  // memory (reusing sm_acc), then thread e sums its 4 elements over the chunk.
  float* sm_w = &sm_acc[0][0][0];     // [GP][kChunk]
  float* sm_wl = sm_w + GP * kChunk;  // [GP][kChunk]
  float4 sum[kVecsPerThread];
  float sum_l[kVecsPerThread];
#pragma unroll
  for (int r = 0; r < kVecsPerThread; ++r) {
    sum[r] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    sum_l[r] = 0.0f;
  }
  for (int c0 = 0; c0 < n; c0 += kChunk) {
    const int chunk = min(kChunk, n - c0);
    __syncthreads();  // sm_mall written; the previous chunk's weights consumed
    for (int i = threadIdx.x; i < group * kChunk; i += kThreads) {
      const int g = i / kChunk, c = i % kChunk;
      float w = 0.0f, wl = 0.0f;
      if (c < chunk) {
        const float2 ml = __ldcg(reinterpret_cast<const float2*>(partial_ml) + split_base +
                                 static_cast<int64_t>(g) * a.max_splits + c0 + c);
        w = __expf(ml.x - sm_mall[g]);
        wl = w * ml.y;
      }
      sm_w[g * kChunk + c] = w;
      sm_wl[g * kChunk + c] = wl;
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kVecsPerThread; ++r) {
      const int e = threadIdx.x + r * kThreads;
      if (e >= n_vecs) break;
      const int g = e / (kHeadDim / 4), d = (e % (kHeadDim / 4)) * 4;
      const float* src =
          partial_acc + (split_base + static_cast<int64_t>(g) * a.max_splits + c0) * kHeadDim + d;
      const float* w = sm_w + g * kChunk;
      const float* wl = sm_wl + g * kChunk;
      constexpr int kUnroll = 16;
      int c = 0;
      for (; c + kUnroll <= chunk; c += kUnroll) {
        float4 x[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          x[u] =
              __ldcg(reinterpret_cast<const float4*>(src + static_cast<int64_t>(c + u) * kHeadDim));
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          sum[r] = fma4(w[c + u], x[u], sum[r]);
          sum_l[r] += wl[c + u];
        }
      }
      for (; c < chunk; ++c) {
        sum[r] = fma4(
            w[c], __ldcg(reinterpret_cast<const float4*>(src + static_cast<int64_t>(c) * kHeadDim)),
            sum[r]);
        sum_l[r] += wl[c];
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kVecsPerThread; ++r) {
    // Whole warps call write_output4 (its int8 blocks span 8 lanes).
    const int e0 = warp * kWarpSize + r * kThreads;
    if (e0 >= n_vecs) break;
    const int e = e0 + lane;
    const bool active = e < n_vecs;
    const int g = active ? e / (kHeadDim / 4) : 0, d = (e % (kHeadDim / 4)) * 4;
    const float inv = output_scale(a, kv_head * group + g, sm_mall[g], sum_l[r]);
    write_output4(a, row, (kv_head * group + g) * kHeadDim + d,
                  make_float4(sum[r].x * inv, sum[r].y * inv, sum[r].z * inv, sum[r].w * inv),
                  active);
  }
}

template <int EPL, int GP>
cudaError_t launch_for(const AttentionArgs& args, const KernelConfig& config, cudaStream_t stream) {
  // Splits per (row, kv head) that give every SM kBlocksPerSm blocks (rounded
  // down); rows beyond that keep the host's split size. Past what an SM holds at once (about
  // 3 blocks) the rest wait for a second wave.
  const int64_t pairs = static_cast<int64_t>(args.rows) * args.n_kv;
  // More warps per block where the (row, KV head) pairs alone fill the SMs (no room for
  // splits): fewer tiles in turn per warp, no more blocks (H200, 8B Q4_0 at 160 tokens of
  // context, ms per step 4 warps / this: 32 rows 5.804 / 5.727). Head size 256 with groups of
  // 8 keeps 4 (8 warps' accumulators would pass 48 KB of shared memory).
  const bool eight = pairs >= multiprocessors();
  const int target_splits =
      static_cast<int>(std::max<int64_t>(1, multiprocessors() * kBlocksPerSm / pairs));
  // The grid holds the most splits plan_splits() can give a row of up to max_splits x
  // split_tokens tokens: target_splits, or more where the split size reaches its cap. The
  // rest of max_splits would be blocks that return at once (a 32-row step at an 8k context:
  // 128 x 8 x 32 blocks for 8 x 8 x 32 that can have work).
  const int64_t longest = static_cast<int64_t>(args.max_splits) * args.split_tokens;
  const int cap_tokens = std::max(args.split_tokens, kMaxSplitTokens);
  const int64_t splits = std::max<int64_t>(target_splits, (longest + cap_tokens - 1) / cap_tokens);
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(args.max_splits, splits)), args.n_kv,
                  args.rows);
  if constexpr (EPL * GP <= 32) {  // 8 warps' shared accumulators fit 48 KB
    if (eight)
      return launch_early(attention_split_kernel<EPL, GP, 8>, grid, dim3(8 * kWarpSize), config,
                          stream, args, target_splits);
  }
  return launch_early(attention_split_kernel<EPL, GP, 4>, grid, dim3(4 * kWarpSize), config, stream,
                      args, target_splits);
}

template <int EPL>
cudaError_t launch_for_group(const AttentionArgs& args, int group, const KernelConfig& config,
                             cudaStream_t stream) {
  if (group == 1) return launch_for<EPL, 1>(args, config, stream);
  if (group == 2) return launch_for<EPL, 2>(args, config, stream);
  if (group <= 4) return launch_for<EPL, 4>(args, config, stream);
  return launch_for<EPL, 8>(args, config, stream);
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
  const int group = args.n_head / args.n_kv;
  cudaError_t status;
  switch (args.head_dim) {
    case 64:
      status = launch_for_group<2>(args, group, config, stream);
      break;
    case 128:
      status = launch_for_group<4>(args, group, config, stream);
      break;
    case 256:
      status = launch_for_group<8>(args, group, config, stream);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return launch_status(status);
}

}  // namespace granule::kernels
