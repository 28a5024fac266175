// Mixture-of-experts kernels (moe.cuh). The dp4a expert products are one kernel family: a block
// of 4 warps owns R output rows of one expert and a tile of up to NB pairs routed to it (a larger
// tile in runs of NB), splits the input length over its 128 threads in chunks of 8 elements,
// decodes each weight chunk once (int8 + scale for dp4a, or f32) for all the run's pairs, and sums
// each pair's products in the same order whatever else shares the tile: the per-pair launch
// (NB = 1, small batches) and the grouped launch (NB = kMoeTilePairs, pairs sorted by expert) give
// the same bits for every pair. The tensor-core family for grouped runs is moe_mma.cu.
#include <cmath>
#include <type_traits>

#include "moe.cuh"
#include "moe_product.cuh"
#include "moe_unpack.cuh"
#include "quant_blocks.cuh"

namespace granule::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kRouterRows = 8;  // token rows per router block (one weight read serves them)
constexpr int kGroupThreads = 1024;

template <uint32_t TYPE>
constexpr bool kReadsQ8 = TYPE != kF32&& TYPE != kF16&& TYPE != kBF16;

// ---- router ----

// Logits of router row e for token rows r0 .. r0 + kRouterRows - 1 (those below rows), by TEAM
// warps of the block: thread t of the team takes the chunks c ≡ t (mod 32 · TEAM) in order, each
// warp reduces its sums by butterflies, and (TEAM > 1) the warps' sums meet in shared memory and
// are added in warp order. TEAM 1 (runs of more than one row group, where a block's warps share
// the group's activation rows in L1) leaves each lane 8 chunks of qwen3-30b-a3b's 2,048-wide row
// in two rounds of loads; a block per expert (TEAM kWarps, runs of one group: decode) takes them
// in one, with four times the blocks. The two sum in different orders, so a run's logits depend on
// which it takes (both within the CPU oracle's bound); every launch of a run takes the same one.
// Writes the logits (+ bias); TEAM kWarps: called by every thread of the block.
template <uint32_t TYPE, int TEAM>
__device__ __forceinline__ void router_team(const uint8_t* __restrict__ router, int64_t row_bytes,
                                            int e, int n_expert, int n_in,
                                            const float* __restrict__ x, int r0, int rows,
                                            const float* __restrict__ bias,
                                            float* __restrict__ logits) {
  constexpr int kTeamThreads = TEAM * kWarpSize;
  const int lane = threadIdx.x % kWarpSize, t = threadIdx.x % kTeamThreads;
  const uint8_t* row = router + static_cast<int64_t>(e) * row_bytes;
  float acc[kRouterRows];
#pragma unroll
  for (int b = 0; b < kRouterRows; ++b) acc[b] = 0.0f;
  const int n_chunks = n_in / 8;
  // A chunk's products for the group's rows. A full group (every run but its last group) takes
  // the loop with no condition, so that the rows' activation loads issue together: under the
  // per-row exit ptxas issued them one after another, a round trip each (a 32-row step's route
  // launch took 38.7 µs on an H100, against 11.4 for one row). Each row's sum keeps its order.
  auto chunk = [&](int c, auto full) {
    float wv[8];
    dequantize8<TYPE>(row, c, wv);
#pragma unroll
    for (int b = 0; b < kRouterRows; ++b) {
      if (!decltype(full)::value && r0 + b >= rows) break;
      const float4* xp =
          reinterpret_cast<const float4*>(x + static_cast<int64_t>(r0 + b) * n_in) + 2 * c;
      const float4 x0 = xp[0], x1 = xp[1];
      const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[b] = fmaf(wv[i], xv[i], acc[b]);
    }
  };
  if (rows - r0 >= kRouterRows) {
#pragma unroll 2  // loads of several chunks in flight; each thread still sums its chunks in order
    for (int c = t; c < n_chunks; c += kTeamThreads) chunk(c, std::true_type{});
  } else {
#pragma unroll 4
    for (int c = t; c < n_chunks; c += kTeamThreads) chunk(c, std::false_type{});
  }
  // Only the rows the group has: a decode step's one row takes 5 shuffles rather than 40.
  if (rows - r0 >= kRouterRows) {
    warp_sums(acc);
  } else {
#pragma unroll
    for (int b = 0; b < kRouterRows; ++b)
      if (r0 + b < rows) acc[b] = warp_sum(acc[b]);
  }
  const float add = bias ? bias[e] : 0.0f;
  if constexpr (TEAM == 1) {
    if (lane != 0) return;
#pragma unroll
    for (int b = 0; b < kRouterRows; ++b)
      if (r0 + b < rows) logits[static_cast<int64_t>(r0 + b) * n_expert + e] = acc[b] + add;
  } else {
    static_assert(TEAM == kWarps, "a team is a warp or the whole block");
    __shared__ float warp_part[kWarps][kRouterRows];
    if (lane == 0) {
#pragma unroll
      for (int b = 0; b < kRouterRows; ++b) warp_part[threadIdx.x / kWarpSize][b] = acc[b];
    }
    __syncthreads();
    const int b = threadIdx.x;
    if (b < kRouterRows && r0 + b < rows) {
      float v = warp_part[0][b];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) v += warp_part[w][b];
      logits[static_cast<int64_t>(r0 + b) * n_expert + e] = v + add;
    }
  }
}

// Experts a block of the router kernels takes: one a warp, or one (a block row of one group).
template <int TEAM>
constexpr int experts_per_block() {
  return kWarps / TEAM;
}
// The team size for a run of `rows` rows (router_team).
inline int router_team_warps(int rows) { return rows <= kRouterRows ? kWarps : 1; }

template <uint32_t TYPE, int TEAM>
__global__ void __launch_bounds__(kThreads)
    moe_router_kernel(const uint8_t* __restrict__ router, int64_t row_bytes, int n_expert, int n_in,
                      const float* __restrict__ x, int rows, const float* __restrict__ bias,
                      float* __restrict__ logits) {
  wait_for_previous_kernel();
  allow_next_kernel();
  const int e = blockIdx.x * experts_per_block<TEAM>() + threadIdx.x / (TEAM * kWarpSize);
  if (TEAM == 1 && e >= n_expert) return;  // whole warps; no block-wide barrier follows
  router_team<TYPE, TEAM>(router, row_bytes, e, n_expert, n_in, x, blockIdx.y * kRouterRows, rows,
                          bias, logits);
}

// ---- gating and top-k: one warp per row ----

// (value, index) ordering of the top-k: larger value first, ties to the lower index; an index
// of n (none yet) loses to everything.
__device__ __forceinline__ bool better(float v, int e, float bv, int be, int n) {
  if (e >= n) return false;
  if (be >= n) return true;
  return v > bv || (v == bv && e < be);
}

// Up to this many experts a lane keeps the gate values of experts lane + 32 i in registers and the
// top-k takes a choice per two warp reductions (topk_choices_in_registers); more go through shared
// memory and shuffles.
constexpr int kTopkRegs = 8;

// A float's order as an unsigned key (larger value, larger key; -0 as +0, so that the two tie as
// `better` has them; NaN below every value), for the warp's redux.sync max.
__device__ __forceinline__ unsigned order_key(float v) {
  if (v != v) return 0u;
  const unsigned bits = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
}

// The row's gate values: softmax (max, exp, a sum in double in lane order then butterflies, a
// multiply by the f32 inverse), sigmoid or the logits themselves, for experts lane + 32 i < n
// (value(i, v) receives them), as the CPU reference computes them.
template <class Store>
__device__ __forceinline__ void gate_values(const float* __restrict__ l, int n, MoeGating gating,
                                            Store&& store) {
  const int lane = threadIdx.x % kWarpSize;
  if (gating == MoeGating::Softmax) {
    float mx = -INFINITY;
    for (int e = lane; e < n; e += kWarpSize) mx = fmaxf(mx, __ldcg(l + e));
    mx = warp_max(mx);
    double sum = 0.0;  // in double, then a multiply by the f32 inverse: the CPU's softmax
    for (int e = lane; e < n; e += kWarpSize) {
      const float v = expf(__ldcg(l + e) - mx);
      store(e / kWarpSize, v);
      sum += v;
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
      sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    const float inverse = static_cast<float>(1.0 / sum);
    store(-1, inverse);  // every value times the inverse
  } else if (gating == MoeGating::Sigmoid) {
    for (int e = lane; e < n; e += kWarpSize)
      store(e / kWarpSize, 1.0f / (1.0f + expf(-__ldcg(l + e))));
  } else {
    for (int e = lane; e < n; e += kWarpSize) store(e / kWarpSize, __ldcg(l + e));
  }
}

// The top-k of n <= 32 * kTopkRegs gate values held in registers (lane's value i: expert
// lane + 32 i): choice j on lane j (mine_v, mine_e), as `better` orders them (larger first, ties
// to the lower index). Per choice each lane takes its best untaken value, the warp the largest
// key (redux.sync max) and among the lanes holding it the lowest expert (redux.sync min): two
// reductions a choice where the shuffle butterfly took ten shuffles in five dependent rounds.
__device__ __forceinline__ void topk_choices_in_registers(const float (&pv)[kTopkRegs], int n,
                                                          int k, float& mine_v, int& mine_e) {
  const int lane = threadIdx.x % kWarpSize;
  unsigned taken = 0;
  for (int j = 0; j < k; ++j) {
    unsigned key = 0;
    int e_best = n;
    float v_best = 0.0f;
#pragma unroll
    for (int i = 0; i < kTopkRegs; ++i) {
      const int e = lane + i * kWarpSize;
      if (e >= n || (taken >> i) & 1u) continue;
      const unsigned ki = order_key(pv[i]);
      if (e_best == n || ki > key) {  // e grows with i: a tie keeps the lower index
        key = ki;
        e_best = e;
        v_best = pv[i];
      }
    }
    const unsigned top = __reduce_max_sync(0xffffffffu, key);
    const int be = static_cast<int>(
        __reduce_min_sync(0xffffffffu, key == top ? static_cast<unsigned>(e_best) : 0xffffffffu));
    const float bv = __shfl_sync(0xffffffffu, v_best, be % kWarpSize);
    if (lane == be % kWarpSize) taken |= 1u << (be / kWarpSize);
    if (lane == j) {
      mine_v = bv;
      mine_e = be;
    }
  }
}

// Gating and top-k of one row by one warp; p and taken: the warp's n_expert floats and bytes of
// shared memory (used only past 32 * kTopkRegs experts). The logits are read from L2 (__ldcg):
// launch_moe_route's last block reads what other blocks wrote.
__device__ __forceinline__ void topk_row(const float* __restrict__ logits, int row,
                                         const MoeRouting& routing, int32_t* __restrict__ ids,
                                         float* __restrict__ weights, int32_t* __restrict__ counts,
                                         const int32_t* __restrict__ slots, float* p,
                                         uint8_t* taken) {
  const int lane = threadIdx.x % kWarpSize;
  const int n = routing.n_expert, k = routing.n_used;
  const float* l = logits + static_cast<int64_t>(row) * n;
  // Lane j keeps choice j.
  float mine_v = 0.0f;
  int mine_e = 0;
  if (n <= kWarpSize * kTopkRegs) {
    float pv[kTopkRegs];
#pragma unroll
    for (int i = 0; i < kTopkRegs; ++i) pv[i] = 0.0f;
    gate_values(l, n, routing.gating, [&](int i, float v) {
#pragma unroll
      for (int r = 0; r < kTopkRegs; ++r) {
        if (i < 0)
          pv[r] *= v;
        else if (r == i)
          pv[r] = v;
      }
    });
    topk_choices_in_registers(pv, n, k, mine_v, mine_e);
  } else {
    gate_values(l, n, routing.gating, [&](int i, float v) {
      if (i < 0) {
        for (int e = lane; e < n; e += kWarpSize) p[e] *= v;
      } else {
        p[lane + i * kWarpSize] = v;
      }
    });
    for (int e = lane; e < n; e += kWarpSize) taken[e] = 0;
    __syncwarp();
    for (int j = 0; j < k; ++j) {
      float bv = -INFINITY;
      int be = n;
      for (int e = lane; e < n; e += kWarpSize)
        if (!taken[e] && better(p[e], e, bv, be, n)) {
          bv = p[e];
          be = e;
        }
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, offset);
        const int oe = __shfl_xor_sync(0xffffffffu, be, offset);
        if (better(ov, oe, bv, be, n)) {
          bv = ov;
          be = oe;
        }
      }
      if (lane == j) {
        mine_v = bv;
        mine_e = be;
      }
      if (lane == 0) taken[be] = 1;
      __syncwarp();
    }
  }
  // The weights as the CPU reference computes them: sums in double in top-k order, softmax as a
  // multiply by the f32 inverse, the normalising sum clamped to the smallest normal f16
  // (llama.cpp), a scale of 0 meaning none.
  float w = mine_v;
  auto ordered_sum = [&](float v) {
    double s = 0.0;
    for (int j = 0; j < k; ++j) s += static_cast<double>(__shfl_sync(0xffffffffu, v, j));
    return s;
  };
  if (routing.gating == MoeGating::SoftmaxOfTopK) {
    const float top = __shfl_sync(0xffffffffu, mine_v, 0);
    const float ev = lane < k ? expf(mine_v - top) : 0.0f;
    w = ev * static_cast<float>(1.0 / ordered_sum(ev));
  }
  if (routing.normalize)
    w = w / fmaxf(static_cast<float>(ordered_sum(lane < k ? w : 0.0f)), 6.103515625e-5f);
  if (routing.scale != 0.0f) w *= routing.scale;
  if (routing.expert_scale && lane < k) w *= routing.expert_scale[mine_e];
  if (lane < k) {
    ids[static_cast<int64_t>(row) * k + lane] = mine_e;
    weights[static_cast<int64_t>(row) * k + lane] = w;
    if (counts && (!slots || slots[row] >= 0)) atomicAdd(counts + mine_e, 1);
  }
  __syncwarp();  // p and taken are rewritten by the warp's next row
}

__global__ void __launch_bounds__(kThreads)
    moe_topk_kernel(const float* __restrict__ logits, int rows, MoeRouting routing,
                    int32_t* __restrict__ ids, float* __restrict__ weights,
                    int32_t* __restrict__ counts, const int32_t* __restrict__ slots) {
  __shared__ float p_all[kWarps][kMoeMaxExperts];
  __shared__ uint8_t taken_all[kWarps][kMoeMaxExperts];
  wait_for_previous_kernel();
  allow_next_kernel();
  const int warp = threadIdx.x / kWarpSize;
  const int row = blockIdx.x * kWarps + warp;
  if (row >= rows) return;
  topk_row(logits, row, routing, ids, weights, counts, slots, p_all[warp], taken_all[warp]);
}

// ---- router, gating and top-k in one launch ----

// The router kernel's blocks (a warp or a block per expert, router_team; kRouterRows token rows
// per block row), then in each block row the last block to finish, found by that row group's
// atomic counter (which it resets for the next launch), takes the gating and top-k of the group's
// rows as moe_topk_kernel does: the bits of the two launches, with one launch and its dependency
// wait fewer, and the top-k of a long run spread over its row groups. The router is resident and
// no kernel writes it, so the first block row prefetches its rows into L2 while the kernel before
// this one finishes.
template <uint32_t TYPE, int TEAM>
__global__ void __launch_bounds__(kThreads)
    moe_route_kernel(const uint8_t* __restrict__ router, int64_t row_bytes, int n_in,
                     const float* __restrict__ x, int rows, const float* __restrict__ bias,
                     MoeRouting routing, float* __restrict__ logits, int32_t* __restrict__ ids,
                     float* __restrict__ weights, int32_t* __restrict__ counts,
                     const int32_t* __restrict__ slots, unsigned int* __restrict__ counters) {
  __shared__ float p_all[kWarps][kMoeMaxExperts];
  __shared__ uint8_t taken_all[kWarps][kMoeMaxExperts];
  __shared__ bool last;
  const int warp = threadIdx.x / kWarpSize;
  const int n_expert = routing.n_expert;
  const int e = blockIdx.x * experts_per_block<TEAM>() + threadIdx.x / (TEAM * kWarpSize);
  if (e < n_expert && blockIdx.y == 0) {
    const uint8_t* row = router + static_cast<int64_t>(e) * row_bytes;
    const int t = threadIdx.x % (TEAM * kWarpSize);
    for (int64_t at = static_cast<int64_t>(t) * 128; at < row_bytes; at += TEAM * kWarpSize * 128)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(row + at));
  }
  wait_for_previous_kernel();
  allow_next_kernel();
  const int r0 = static_cast<int>(blockIdx.y) * kRouterRows;
  if (TEAM > 1 || e < n_expert)  // TEAM > 1: e < n_expert, every thread to the barrier inside
    router_team<TYPE, TEAM>(router, row_bytes, e, n_expert, n_in, x, r0, rows, bias, logits);
  __threadfence();  // this block's logits before its arrival
  __syncthreads();
  unsigned int* counter = counters + blockIdx.y;
  if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();  // every block's logits after their arrivals
  const int r_end = min(rows, r0 + kRouterRows);
  for (int row = r0 + warp; row < r_end; row += kWarps)
    topk_row(logits, row, routing, ids, weights, counts, slots, p_all[warp], taken_all[warp]);
  if (threadIdx.x == 0) *counter = 0;
}

// ---- grouping: one block, a stable counting sort ----

__global__ void __launch_bounds__(kGroupThreads)
    moe_group_kernel(const int32_t* __restrict__ ids, int pairs, int n_expert, MoeGroups g) {
  __shared__ int count[kMoeMaxExperts], start[kMoeMaxExperts], tile_start[kMoeMaxExperts];
  __shared__ int cursor[kMoeMaxExperts];
  wait_for_previous_kernel();
  allow_next_kernel();
  const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
  for (int e = tid; e < n_expert; e += kGroupThreads) count[e] = 0;
  __syncthreads();
  for (int p = tid; p < pairs; p += kGroupThreads) atomicAdd(&count[ids[p]], 1);
  __syncthreads();
  // Exclusive prefix sums over the experts of the counts and of the tiles they take, thread e
  // holding expert e: scans within each warp, then over the warps' totals (exact integers, so
  // the same as a serial loop).
  static_assert(kGroupThreads == kMoeMaxExperts && kGroupThreads == kWarpSize * kWarpSize,
                "one thread per expert, one lane of warp 0 per warp");
  __shared__ int warp_pairs[kWarpSize], warp_tiles[kWarpSize];
  const int own_pairs = tid < n_expert ? count[tid] : 0;
  const int own_tiles = (own_pairs + g.tile_pairs - 1) / g.tile_pairs;
  int pairs_through = own_pairs, tiles_through = own_tiles;  // inclusive, within the warp
#pragma unroll
  for (int offset = 1; offset < kWarpSize; offset <<= 1) {
    const int p = __shfl_up_sync(0xffffffffu, pairs_through, offset);
    const int t = __shfl_up_sync(0xffffffffu, tiles_through, offset);
    if (lane >= offset) {
      pairs_through += p;
      tiles_through += t;
    }
  }
  if (lane == kWarpSize - 1) {
    warp_pairs[warp] = pairs_through;
    warp_tiles[warp] = tiles_through;
  }
  __syncthreads();
  if (warp == 0) {
    const int wp = warp_pairs[lane], wt = warp_tiles[lane];
    int wp_through = wp, wt_through = wt;
#pragma unroll
    for (int offset = 1; offset < kWarpSize; offset <<= 1) {
      const int p = __shfl_up_sync(0xffffffffu, wp_through, offset);
      const int t = __shfl_up_sync(0xffffffffu, wt_through, offset);
      if (lane >= offset) {
        wp_through += p;
        wt_through += t;
      }
    }
    warp_pairs[lane] = wp_through - wp;  // the warps before this one
    warp_tiles[lane] = wt_through - wt;
    if (lane == kWarpSize - 1) *g.n_tiles = wt_through;
  }
  __syncthreads();
  if (tid < n_expert) {
    start[tid] = warp_pairs[warp] + pairs_through - own_pairs;
    tile_start[tid] = warp_tiles[warp] + tiles_through - own_tiles;
  }
  __syncthreads();
  for (int e = tid; e < n_expert; e += kGroupThreads) {
    cursor[e] = start[e];
    for (int i = 0; i * g.tile_pairs < count[e]; ++i) {
      MoeTile tile;
      tile.expert = e;
      tile.first = start[e] + i * g.tile_pairs;
      tile.count = min(g.tile_pairs, count[e] - i * g.tile_pairs);
      g.tiles[tile_start[e] + i] = tile;
    }
  }
  __syncthreads();
  // Pairs in ascending order: chunk by chunk, warp by warp, each lane placed after the lanes
  // before it with the same expert.
  const unsigned lower = (1u << lane) - 1u;
  for (int base = 0; base < pairs; base += kGroupThreads) {
    const int p = base + tid;
    const int e = p < pairs ? ids[p] : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const int rank = __popc(peers & lower);
    const int warps_with_pairs = (min(kGroupThreads, pairs - base) + kWarpSize - 1) / kWarpSize;
    for (int w = 0; w < warps_with_pairs; ++w) {
      if (warp == w && e >= 0) {
        const int at = cursor[e] + rank;
        g.order[at] = p;
      }
      __syncwarp();
      if (warp == w && e >= 0 && rank == 0) cursor[e] += __popc(peers);
      __syncthreads();
    }
  }
}

// ---- expert products ----

// This thread's share of R weight rows (w, and w_up for gate/up) dotted with up to NB inputs
// (rows x_row[b] of the input, b < count): the chunk loop every expert product runs, so the
// per-pair, grouped and fused launches sum each pair's products identically.
template <uint32_t TYPE, bool GATE_UP, int NB, int R>
__device__ __forceinline__ void accumulate(const uint8_t* w, const uint8_t* w_up, int64_t row_bytes,
                                           int rows_here, const MoeInput& in,
                                           const int64_t (&x_row)[NB], int count,
                                           float (&acc)[R][NB], float (&acc_up)[R][NB]) {
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int b = 0; b < NB; ++b) acc[r][b] = acc_up[r][b] = 0.0f;
  const int n_in = in.n_in, n_chunks = n_in / 8;
  if constexpr (kReadsQ8<TYPE>) {
    // Int8 activations meet each chunk's int8 weights in two dp4a (moe_unpack.cuh):
    // w·x = d_x · (scale · Σ q·x_q + offset · Σ x_q).
    constexpr bool kOffset = moe_unpack::has_offset(TYPE);
#pragma unroll 1
    for (int c = threadIdx.x; c < n_chunks; c += kThreads) {
      int xa[NB], xb[NB], xs[NB];
      float xd[NB];
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        if (b >= count) break;
        const int2 q = *reinterpret_cast<const int2*>(in.xq.qs + x_row[b] * n_in + 8 * c);
        xa[b] = q.x;
        xb[b] = q.y;
        xd[b] = in.xq.ds[x_row[b] * (n_in / kQ8Block) + c / 4].x;
        xs[b] = kOffset ? __dp4a(0x01010101, q.y, __dp4a(0x01010101, q.x, 0)) : 0;
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r >= rows_here) break;
        const moe_unpack::Chunk8 wg = moe_unpack::unpack8<TYPE>(w + r * row_bytes, n_in, c);
        moe_unpack::Chunk8 wu;
        if constexpr (GATE_UP) wu = moe_unpack::unpack8<TYPE>(w_up + r * row_bytes, n_in, c);
#pragma unroll
        for (int b = 0; b < NB; ++b) {
          if (b >= count) break;
          acc[r][b] = moe_q8_fma<kOffset>(wg, xa[b], xb[b], xs[b], xd[b], acc[r][b]);
          if constexpr (GATE_UP)
            acc_up[r][b] = moe_q8_fma<kOffset>(wu, xa[b], xb[b], xs[b], xd[b], acc_up[r][b]);
        }
      }
    }
  } else {
#pragma unroll 1
    for (int c = threadIdx.x; c < n_chunks; c += kThreads) {
      float xv[NB][8];
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        if (b >= count) break;
        const float4* xp = reinterpret_cast<const float4*>(in.x + x_row[b] * n_in) + 2 * c;
        const float4 x0 = xp[0], x1 = xp[1];
        xv[b][0] = x0.x;
        xv[b][1] = x0.y;
        xv[b][2] = x0.z;
        xv[b][3] = x0.w;
        xv[b][4] = x1.x;
        xv[b][5] = x1.y;
        xv[b][6] = x1.z;
        xv[b][7] = x1.w;
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r >= rows_here) break;
        float wv[8], uv[8];
        dequantize8<TYPE>(w + r * row_bytes, c, wv);
        if constexpr (GATE_UP) dequantize8<TYPE>(w_up + r * row_bytes, c, uv);
#pragma unroll
        for (int b = 0; b < NB; ++b) {
          if (b >= count) break;
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            acc[r][b] = fmaf(wv[i], xv[b][i], acc[r][b]);
            if constexpr (GATE_UP) acc_up[r][b] = fmaf(uv[i], xv[b][i], acc_up[r][b]);
          }
        }
      }
    }
  }
}

template <uint32_t TYPE, bool GATE_UP, int NB, int R>
__global__ void __launch_bounds__(kThreads) moe_product_kernel(MoeProduct P) {
  wait_for_previous_kernel();
  allow_next_kernel();
  const MoeInput& in = P.in;
  const bool grouped = in.groups.tiles != nullptr;
  int expert, tile_first, tile_count;
  if (grouped) {
    if (static_cast<int>(blockIdx.y) >= *in.groups.n_tiles) return;
    const MoeTile tile = in.groups.tiles[blockIdx.y];
    expert = tile.expert;
    tile_first = tile.first;
    tile_count = tile.count;
  } else {
    expert = in.ids[blockIdx.y];
    tile_first = blockIdx.y;
    tile_count = 1;
  }
  const int first_row = blockIdx.x * R;
  if (first_row >= P.n_out) return;  // the whole block
  const int rows_here = min(R, P.n_out - first_row);
  const int64_t row_bytes = P.a.row_bytes;
  const uint8_t* w = static_cast<const uint8_t*>(P.a.table[expert]) + first_row * row_bytes;
  const uint8_t* w_up =
      GATE_UP ? static_cast<const uint8_t*>(P.b.table[expert]) + first_row * row_bytes : nullptr;
  constexpr int kSlots = R * NB * (GATE_UP ? 2 : 1);
  __shared__ float partial[kWarps][kSlots];
  __shared__ int pair_of[NB];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;

  // A tile of more than NB pairs (the tensor-core products' tile size) in runs of NB: each
  // pair's sums do not depend on the run it is in.
  for (int run = 0; run < tile_count; run += NB) {
    const int first = tile_first + run, count = min(NB, tile_count - run);
    int pair[NB];
    int64_t x_row[NB];
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      pair[b] = b < count ? (grouped ? in.groups.order[first + b] : first + b) : 0;
      x_row[b] = in.per_pair_input ? pair[b] : pair[b] / in.n_used;
    }

    float acc[R][NB], acc_up[R][NB];
    accumulate<TYPE, GATE_UP, NB, R>(w, w_up, row_bytes, rows_here, in, x_row, count, acc, acc_up);

    if (run > 0) __syncthreads();  // the previous run's partial sums and pairs are read
    if (threadIdx.x == 0) {
#pragma unroll
      for (int b = 0; b < NB; ++b) pair_of[b] = pair[b];
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        const float v = warp_sum(acc[r][b]);
        if (lane == 0) partial[warp][r * NB + b] = v;
        if constexpr (GATE_UP) {
          const float u = warp_sum(acc_up[r][b]);
          if (lane == 0) partial[warp][R * NB + r * NB + b] = u;
        }
      }
    __syncthreads();
    for (int i = threadIdx.x; i < R * NB; i += kThreads) {
      const int r = i / NB, b = i % NB;
      if (r >= rows_here || b >= count) continue;
      const int o = first_row + r;
      float v = 0.0f;
#pragma unroll
      for (int k = 0; k < kWarps; ++k) v += partial[k][i];
      if (P.a.bias) v += P.a.bias[static_cast<int64_t>(expert) * P.n_out + o];
      if constexpr (GATE_UP) {
        float u = 0.0f;
#pragma unroll
        for (int k = 0; k < kWarps; ++k) u += partial[k][R * NB + i];
        if (P.b.bias) u += P.b.bias[static_cast<int64_t>(expert) * P.n_out + o];
        v = moe_activate(P.act, v, u);
      }
      P.out[static_cast<int64_t>(pair_of[b]) * P.n_out + o] = v;
    }
  }
}

// The per-pair down product fused with the weighted sum into the residual (small runs): a block
// owns R output rows of one token row and takes its n_used pairs in top-k order, each pair's
// dot summed as moe_product_kernel sums it (its bias included) and added as moe_combine_kernel
// adds it, so the result has the unfused launches' bits.
template <uint32_t TYPE, int R>
__global__ void __launch_bounds__(kThreads)
    moe_down_combine_kernel(MoeMatrix down, int n_out, MoeInput in,
                            const float* __restrict__ weights, float* __restrict__ hidden) {
  wait_for_previous_kernel();
  allow_next_kernel();
  const int row = blockIdx.y;
  const int first_row = blockIdx.x * R;
  if (first_row >= n_out) return;  // the whole block
  const int rows_here = min(R, n_out - first_row);
  __shared__ float partial[kWarps][R];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  float out = 0.0f;  // thread i < rows_here: output row first_row + i
  for (int j = 0; j < in.n_used; ++j) {
    const int p = row * in.n_used + j;
    const int expert = in.ids[p];
    const int64_t x_row[1] = {p};
    const uint8_t* w = static_cast<const uint8_t*>(down.table[expert]) + first_row * down.row_bytes;
    float acc[R][1], unused[R][1];
    accumulate<TYPE, false, 1, R>(w, nullptr, down.row_bytes, rows_here, in, x_row, 1, acc, unused);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float v = warp_sum(acc[r][0]);
      if (lane == 0) partial[warp][r] = v;
    }
    __syncthreads();
    if (static_cast<int>(threadIdx.x) < rows_here) {
      const int i = threadIdx.x;
      float v = 0.0f;
#pragma unroll
      for (int k = 0; k < kWarps; ++k) v += partial[k][i];
      if (down.bias) v += down.bias[static_cast<int64_t>(expert) * n_out + first_row + i];
      out = __fadd_rn(out, __fmul_rn(weights[p], v));
    }
    __syncthreads();  // partial is rewritten by the next pair
  }
  if (static_cast<int>(threadIdx.x) < rows_here) {
    float* h = hidden + static_cast<int64_t>(row) * n_out + first_row + threadIdx.x;
    *h = __fadd_rn(*h, out);
  }
}

__global__ void moe_combine_kernel(const float* __restrict__ y, const float* __restrict__ weights,
                                   int rows, int n_used, int n, float* __restrict__ hidden) {
  wait_for_previous_kernel();
  allow_next_kernel();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(rows) * n) return;
  const int64_t r = i / n, o = i % n;
  float acc = 0.0f;
  for (int j = 0; j < n_used; ++j) {
    const int64_t p = r * n_used + j;
    acc = __fadd_rn(acc, __fmul_rn(weights[p], y[p * n + o]));
  }
  hidden[i] = __fadd_rn(hidden[i], acc);
}

template <bool GATE_UP>
cudaError_t launch_product(const MoeProduct& P, const KernelConfig& config, cudaStream_t stream) {
  const MoeInput& in = P.in;
  if (in.pairs <= 0 || P.n_out <= 0) return cudaSuccess;
  if (!moe_supports(P.a.type) ||
      (GATE_UP && (P.b.type != P.a.type || P.b.row_bytes != P.a.row_bytes)))
    return cudaErrorInvalidValue;
  if (in.n_in % kQ8Block != 0 || in.n_in % block_elems(P.a.type) != 0 || in.n_used <= 0)
    return cudaErrorInvalidValue;
  const bool grouped = in.groups.tiles != nullptr;
  if (!grouped && !in.ids) return cudaErrorInvalidValue;
  if (moe_reads_q8(P.a.type) ? !in.xq.qs : !in.x) return cudaErrorInvalidValue;
  if (grouped && (in.n_expert <= 0 || in.n_expert > kMoeMaxExperts)) return cudaErrorInvalidValue;
  if (grouped && in.groups.tile_pairs < 1) return cudaErrorInvalidValue;
  const int tiles = grouped ? moe_max_tiles(in.pairs, in.n_expert, in.groups.tile_pairs) : in.pairs;
  if (tiles > 65535) return cudaErrorInvalidValue;
  cudaError_t status = cudaSuccess;
  dispatch_weight_type(P.a.type, [&](auto tag) {
    constexpr uint32_t TYPE = decltype(tag)::value;
    if (grouped) {
      constexpr int R = 2;
      status = launch_early(moe_product_kernel<TYPE, GATE_UP, kMoeTilePairs, R>,
                            dim3(ceil_div(P.n_out, R), tiles), dim3(kThreads), config, stream, P);
    } else {
      constexpr int R = 4;
      status = launch_early(moe_product_kernel<TYPE, GATE_UP, 1, R>,
                            dim3(ceil_div(P.n_out, R), tiles), dim3(kThreads), config, stream, P);
    }
  });
  return launch_status(status);
}

}  // namespace

bool moe_supports(uint32_t type) { return is_supported_weight_type(type); }
bool moe_reads_q8(uint32_t type) { return type != kF32 && type != kF16 && type != kBF16; }

int moe_max_tiles(int pairs, int n_expert, int tile_pairs) {
  // Σ_e ceil(c_e / P) <= Σ_e (c_e / P) + (experts with a pair), those at most min(pairs, n).
  return ceil_div(pairs, tile_pairs) + std::min(pairs, n_expert);
}

cudaError_t launch_moe_router(uint32_t type, const void* router, int64_t row_bytes, int n_expert,
                              int n_in, const float* x, int rows, const float* bias, float* logits,
                              const KernelConfig& config, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (!is_supported_weight_type(type) || n_in % kQ8Block != 0 || n_in % block_elems(type) != 0 ||
      n_expert <= 0)
    return cudaErrorInvalidValue;
  cudaError_t status = cudaSuccess;
  dispatch_weight_type(type, [&](auto tag) {
    constexpr uint32_t TYPE = decltype(tag)::value;
    const unsigned groups = static_cast<unsigned>(ceil_div(rows, kRouterRows));
    if (router_team_warps(rows) == kWarps)
      status = launch_early(moe_router_kernel<TYPE, kWarps>, dim3(n_expert, groups), dim3(kThreads),
                            config, stream, static_cast<const uint8_t*>(router), row_bytes,
                            n_expert, n_in, x, rows, bias, logits);
    else
      status = launch_early(moe_router_kernel<TYPE, 1>, dim3(ceil_div(n_expert, kWarps), groups),
                            dim3(kThreads), config, stream, static_cast<const uint8_t*>(router),
                            row_bytes, n_expert, n_in, x, rows, bias, logits);
  });
  return launch_status(status);
}

cudaError_t launch_moe_topk(const float* logits, int rows, const MoeRouting& routing, int32_t* ids,
                            float* weights, int32_t* counts, const int32_t* slots,
                            const KernelConfig& config, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (routing.n_expert <= 0 || routing.n_expert > kMoeMaxExperts || routing.n_used <= 0 ||
      routing.n_used > kMoeMaxUsed || routing.n_used > routing.n_expert)
    return cudaErrorInvalidValue;
  return launch_status(launch_early(moe_topk_kernel, dim3(ceil_div(rows, kWarps)), dim3(kThreads),
                                    config, stream, logits, rows, routing, ids, weights, counts,
                                    slots));
}

cudaError_t launch_moe_route(uint32_t type, const void* router, int64_t row_bytes, int n_in,
                             const float* x, int rows, const float* bias, const MoeRouting& routing,
                             float* logits, int32_t* ids, float* weights, int32_t* counts,
                             const int32_t* slots, unsigned int* counters,
                             const KernelConfig& config, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (!counters || !is_supported_weight_type(type) || n_in % kQ8Block != 0 ||
      n_in % block_elems(type) != 0)
    return cudaErrorInvalidValue;
  if (routing.n_expert <= 0 || routing.n_expert > kMoeMaxExperts || routing.n_used <= 0 ||
      routing.n_used > kMoeMaxUsed || routing.n_used > routing.n_expert)
    return cudaErrorInvalidValue;
  static_assert(kMoeRouteGroupRows == kRouterRows, "one block row of the router kernel");
  const int groups = moe_route_counters(rows);
  if (groups > 65535) return cudaErrorInvalidValue;
  cudaError_t status = cudaSuccess;
  dispatch_weight_type(type, [&](auto tag) {
    constexpr uint32_t TYPE = decltype(tag)::value;
    if (router_team_warps(rows) == kWarps)
      status = launch_early(moe_route_kernel<TYPE, kWarps>, dim3(routing.n_expert, groups),
                            dim3(kThreads), config, stream, static_cast<const uint8_t*>(router),
                            row_bytes, n_in, x, rows, bias, routing, logits, ids, weights, counts,
                            slots, counters);
    else
      status = launch_early(moe_route_kernel<TYPE, 1>,
                            dim3(ceil_div(routing.n_expert, kWarps), groups), dim3(kThreads),
                            config, stream, static_cast<const uint8_t*>(router), row_bytes, n_in, x,
                            rows, bias, routing, logits, ids, weights, counts, slots, counters);
  });
  return launch_status(status);
}

cudaError_t launch_moe_group(const int32_t* ids, int pairs, int n_expert, MoeGroups groups,
                             const KernelConfig& config, cudaStream_t stream) {
  if (pairs <= 0) return cudaSuccess;
  if (n_expert <= 0 || n_expert > kMoeMaxExperts || !groups.order || !groups.tiles ||
      !groups.n_tiles || groups.tile_pairs < 1)
    return cudaErrorInvalidValue;
  return launch_status(launch_early(moe_group_kernel, dim3(1), dim3(kGroupThreads), config, stream,
                                    ids, pairs, n_expert, groups));
}

cudaError_t launch_moe_gate_up(const MoeMatrix& gate, const MoeMatrix& up, MoeActivation act,
                               int n_out, const MoeInput& in, float* h, const KernelConfig& config,
                               cudaStream_t stream) {
  return launch_product<true>(gate_up_product(gate, up, act, n_out, in, h), config, stream);
}

cudaError_t launch_moe_down(const MoeMatrix& down, int n_out, const MoeInput& in, float* y,
                            const KernelConfig& config, cudaStream_t stream) {
  return launch_product<false>(down_product(down, n_out, in, y), config, stream);
}

cudaError_t launch_moe_down_combine(const MoeMatrix& down, int n_out, const MoeInput& in,
                                    const float* weights, float* hidden, const KernelConfig& config,
                                    cudaStream_t stream) {
  if (in.pairs <= 0 || n_out <= 0) return cudaSuccess;
  if (!moe_supports(down.type) || in.n_in % kQ8Block != 0 ||
      in.n_in % block_elems(down.type) != 0 || in.n_used <= 0 || in.pairs % in.n_used != 0 ||
      !in.ids || in.groups.tiles)
    return cudaErrorInvalidValue;
  if (moe_reads_q8(down.type) ? !in.xq.qs : !in.x) return cudaErrorInvalidValue;
  const int rows = in.pairs / in.n_used;
  if (rows > 65535) return cudaErrorInvalidValue;
  cudaError_t status = cudaSuccess;
  dispatch_weight_type(down.type, [&](auto tag) {
    constexpr uint32_t TYPE = decltype(tag)::value;
    constexpr int R = 4;
    status = launch_early(moe_down_combine_kernel<TYPE, R>, dim3(ceil_div(n_out, R), rows),
                          dim3(kThreads), config, stream, down, n_out, in, weights, hidden);
  });
  return launch_status(status);
}

cudaError_t launch_moe_combine(const float* y, const float* weights, int rows, int n_used, int n,
                               float* hidden, const KernelConfig& config, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(rows) * n;
  if (total <= 0) return cudaSuccess;
  constexpr int kCombineThreads = 256;
  return launch_status(launch_early(moe_combine_kernel, dim3(ceil_div(total, kCombineThreads)),
                                    dim3(kCombineThreads), config, stream, y, weights, rows, n_used,
                                    n, hidden));
}

}  // namespace granule::kernels
