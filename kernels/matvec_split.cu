// Decode matrix-vector products over split-layout rows (split_layout.h). A warp owns R
// rows; its lanes take consecutive 32-element sub-blocks, so each weight load is one
// coalesced 16-byte vector per lane; every lane loads U sub-blocks per row at once and the
// next U are in flight while these are consumed, which keeps enough bytes moving per SM for
// HBM without staging through shared memory. Activations are int8 blocks (ActivationQ8)
// and meet the weights in 4-way int8 dot products. The weight loads of the first
// sub-blocks are issued before waiting for the previous kernel (launch_early).
#include "granule/split_layout.h"
#include "matvec.cuh"
#include "quant_blocks.cuh"
#include "rope_kv.cuh"
#include "split_dot.cuh"

namespace granule::kernels {
namespace {

using split_dot::dot_payload;
using split_dot::load_payload;
using split_dot::Payload;

constexpr int kWarps = 4;
// Batch-1 launches whose results also leave as int8 blocks (MatvecTask::y_q8) take blocks of
// 32 warps of one row each, so that a block holds a whole 32-row block of the result.
constexpr int kRowBlockWarps = kQ8Block;

// A launch's tasks share one row of blocks: task i takes blocks [first_block[i],
// first_block[i + 1]), so no block is launched past a shorter task's rows (K and V beside Q).
struct SplitTasks {
  MatvecTask t[kMaxMatvecTasks];
  int first_block[kMaxMatvecTasks + 1] = {};
  int n_tasks = 0;
};

// The activations (and y) belong to earlier kernels; the next kernel may start once this
// one's wait is over. (Letting it start before the wait, so that it requests its weights
// during this one, was measured slower: kernels/README.md, "Tried and rejected".)
__device__ __forceinline__ void wait_then_allow_next() {
  wait_for_previous_kernel();
  allow_next_kernel();
}

// The task that unit i (a block, or a row where first_block counts rows) belongs to.
__device__ __forceinline__ int task_of(const SplitTasks& tasks, int i) {
  int ti = 0;
  while (ti + 1 < tasks.n_tasks && i >= tasks.first_block[ti + 1]) ++ti;
  return ti;
}

// The types whose owner blocks (split_owned_kernel) keep within 64 registers without spilling.
constexpr bool owns_row_blocks(uint32_t type) { return type == kQ4_0 || type == kQ4_1; }

// The RMSNorm scale 1/rms of a batch-1 input whose int8 blocks hold y·w without it
// (MatvecInput::norm_sum_squares), else 1. Every lane of the warp gets the same value.
__device__ __forceinline__ float input_norm_scale(const MatvecInput& in) {
  if (!in.norm_sum_squares) return 1.0f;
  const int lane = threadIdx.x % kWarpSize;
  float sum = 0.0f;
  for (int i = lane; i < in.n_in / kQ8Block; i += kWarpSize) sum += in.norm_sum_squares[i];
  return split_dot::norm_scale(in, warp_sum(sum));
}

// The late norm (split_matvec_kernel's LATE_NORM): a lane's first K sums of squares of the input's
// blocks, requested right after the wait, before the activations and beside them, and only added
// once the products are done (norm_lane_sum, reduced with the rows' sums): input_norm_scale() above
// reduces them before the products start, and its warp sum is a wall the compiler does not
// move the activation loads above (two L2 round trips one after the other on the chain instead
// of one).
template <int K>
struct NormPart {
  float v[K];
};

template <int K>
__device__ __forceinline__ NormPart<K> request_norm_part(const MatvecInput& in) {
  NormPart<K> p;
  const int lane = threadIdx.x % kWarpSize, blocks = in.n_in / kQ8Block;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int i = lane + k * kWarpSize;
    p.v[k] = in.norm_sum_squares && i < blocks ? in.norm_sum_squares[i] : 0.0f;
  }
  return p;
}

// The lane's sum of squares of input_norm_scale(in), from the part requested before: the same
// sum in the same order (the input has a norm to apply).
// The parts past a lane's blocks hold +0, which adds nothing to sums of squares (never -0), and
// 0 + x is x, so no condition and no add is needed for the first: an add on the first part
// right after its load (where the compiler put `0 + part` when it was conditional) stalls the
// warp for the load before it requests its activations (ptxas sm_90).
template <int K>
__device__ __forceinline__ float norm_lane_sum(const MatvecInput& in, const NormPart<K>& p) {
  const int lane = threadIdx.x % kWarpSize, blocks = in.n_in / kQ8Block;
  float sum = p.v[0];
#pragma unroll
  for (int k = 1; k < K; ++k) sum += p.v[k];
  for (int i = lane + K * kWarpSize; i < blocks; i += kWarpSize) sum += in.norm_sum_squares[i];
  return sum;
}

// The next RMSNorm's weight of row block * 32 + lane where the task hands a norm over (a
// weight: the kernels read it before waiting for the previous kernel), else 1.
__device__ __forceinline__ float result_norm_weight(const MatvecTask& task, int block) {
  return task.norm_weight ? task.norm_weight[block * kQ8Block + threadIdx.x % kWarpSize] : 1.0f;
}

// A warp's 32 results of the task's 32-row block `block` (y of row block * 32 + lane on each
// lane, after accumulate and SwiGLU) as one int8 block of task.y_q8, of y·norm_weight where
// there is one (`w`, result_norm_weight()), with Σ y² of the block in task.sum_squares.
__device__ __forceinline__ void quantize_result_block(const MatvecTask& task, int block, float v,
                                                      float w) {
  const int lane = threadIdx.x % kWarpSize;
  const int o = block * kQ8Block + lane;
  // Σ y² first: its shuffles do not wait for the quantisation's reductions.
  const float sum = task.sum_squares ? warp_sum(v * v) : 0.0f;
  quantize_block_of_warp(task.norm_weight ? v * w : v, task.y_q8.qs + o - lane,
                         task.y_q8.ds + block);
  if (task.sum_squares && lane == 0) task.sum_squares[block] = sum;
}

// Block of kRowBlockWarps one-row warps, batch 1: its 32 results y (the row's on lane 0 of
// its warp) meet in shared memory and warp 0 quantises them (w: warp 0's lanes'
// result_norm_weight()). Called by every thread.
__device__ __forceinline__ void quantize_row_block(const MatvecTask& task, int block, float y,
                                                   float w) {
  __shared__ float block_y[kRowBlockWarps];
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  if (lane == 0) block_y[warp] = y;
  __syncthreads();
  if (warp != 0) return;
  quantize_result_block(task, block, block_y[lane], w);
}

// What thread i of a RoPE epilogue (rope_rows) needs besides the two results, for the pair of
// rows first_row + 2i, first_row + 2i + 1 of its task: the rotation at the row's position, the
// pair's bias, and for K and V the pair's place in the row's KV (null: a padding row, no
// write). None depends on an earlier kernel (frequencies and biases are weights; the position,
// the slot and the slots' KV bases are step inputs the host wrote before the step's first
// kernel), so the kernel forms it before waiting for the previous one, off the step's chain.
struct PairRotation {
  float sn = 0.0f, cs = 1.0f, b0 = 0.0f, b1 = 0.0f;
  __half* kv = nullptr;
};

template <int ROWS>
__device__ __forceinline__ PairRotation pair_rotation(const MatvecTask& task, const RowRope& rope,
                                                      int first_row) {
  PairRotation p;
  const int i = threadIdx.x;
  if (!task.rope_part || i >= ROWS / 2) return p;
  const int row = first_row + 2 * i;
  if (task.bias) {
    p.b0 = task.bias[row];
    p.b1 = task.bias[row + 1];
  }
  const int32_t pos = rope.positions[0];
  if (task.rope_part != 3)
    rope_rotation(pos, rope.frequencies[(row % rope.head_dim) / 2], &p.sn, &p.cs);
  if (task.rope_part != 1 && rope.slots[0] >= 0)
    p.kv = rope.slot_base[rope.slots[0]] + rope.kv_offset + pos * rope.token_stride +
           (static_cast<int64_t>(rope.layer) * 2 + (task.rope_part - 2)) * rope.n_kv *
               rope.head_dim +
           row;
  return p;
}

// RowRope in the epilogue of a batch-1 block of W * R rows of one Q/K/V task (whole blocks of
// rows: head sizes are multiples of it), `y` each row's result on the lane that wrote it: the
// rows meet in shared memory and thread i takes the pair of rows 2i, 2i + 1 with its
// pair_rotation(), as rope_kv_kernel would (same rotation, same roundings). Called by every
// thread of the block.
template <int ROWS>
__device__ __forceinline__ void rope_rows(const MatvecTask& task, int first_row, int index,
                                          bool holds, float y, const PairRotation& p) {
  __shared__ float block_y[ROWS];
  if (holds) block_y[index] = y;
  __syncthreads();
  const int i = threadIdx.x;
  if (i >= ROWS / 2) return;
  const int row = first_row + 2 * i;
  float x0 = block_y[2 * i], x1 = block_y[2 * i + 1];
  if (task.bias) {
    x0 += p.b0;
    x1 += p.b1;
  }
  if (task.rope_part != 3) {
    const float r0 = x0 * p.cs - x1 * p.sn, r1 = x0 * p.sn + x1 * p.cs;
    x0 = r0;
    x1 = r1;
  }
  if (task.rope_part == 1) {
    task.y[row] = x0;
    task.y[row + 1] = x1;
    return;
  }
  if (!p.kv) return;
  p.kv[0] = __float2half_rn(x0);
  p.kv[1] = __float2half_rn(x1);
}

// LATE_NORM (batch 1, an input with a norm to apply): the input norm's sums requested beside
// the activations and reduced after the products (request_norm_part); the same bits as
// input_norm_scale() before them, one L2 round trip fewer on the step's chain.
template <uint32_t TYPE, int NB, int R, int U, bool GATE_UP, int W, bool LATE_NORM = false>
__global__ void __launch_bounds__(W * kWarpSize)
    split_matvec_kernel(SplitTasks tasks, MatvecInput in, int first_column) {
  constexpr int M = GATE_UP ? 2 : 1;
  constexpr bool kRowBlocks = W == kRowBlockWarps && R == 1 && NB == 1;
  constexpr int kNormPart = kRowBlocks ? 1 : 4;  // registers (request_norm_part)
  static_assert(!LATE_NORM || NB == 1, "a batch has no input norm to apply");
  const int ti = task_of(tasks, static_cast<int>(blockIdx.x));
  const MatvecTask& task = tasks.t[ti];
  const int block = static_cast<int>(blockIdx.x) - tasks.first_block[ti];  // within the task
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int row0 = (block * W + warp) * R;
  // Whole warps leave; only quantize_row_block synchronises the block, and its launches
  // have whole blocks of rows (n_out a multiple of 32), so there whole blocks leave.
  if (row0 >= task.n_out) return;
  const int n = in.n_in / kQ8Block;

  const uint8_t* rows[M * R];
#pragma unroll
  for (int mr = 0; mr < M * R; ++mr) {
    const int r = min(row0 + mr % R, task.n_out - 1);  // rows past the end repeat the last
    rows[mr] = static_cast<const uint8_t*>(mr < R ? task.weight : task.weight_up) +
               static_cast<int64_t>(r) * task.row_bytes;
  }
  constexpr int kPerStep = U * kWarpSize;
  const int steps = (n + kPerStep - 1) / kPerStep;

  Payload cur[M * R][U], next[M * R][U];
#pragma unroll
  for (int mr = 0; mr < M * R; ++mr)
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = u * kWarpSize + lane;
      if (j < n) load_payload<TYPE>(rows[mr], n, j, cur[mr][u]);
    }
  // RoPE epilogues: plain one-column products in small blocks (launches with int8 results,
  // the 32-warp blocks, never carry RoPE: launch_matvec_split refuses them).
  constexpr bool kRopeEpilogue = NB == 1 && !GATE_UP && !kRowBlocks && W * R <= kWarpSize * 2;
  PairRotation rotation;
  if constexpr (kRopeEpilogue) rotation = pair_rotation<W * R>(task, in.rope, block * W * R);
  // Plain products with int8 results (the output and down projections' hand-over): warp 0's
  // lanes' next-norm weights, requested now. (The SwiGLU kernels keep their registers: they
  // read it in the epilogue, as they have no norm to hand over in the fused step.)
  float norm_w = 1.0f;
  if constexpr (kRowBlocks && !GATE_UP)
    if (warp == 0 && task.y_q8.qs) norm_w = result_norm_weight(task, block);
  wait_then_allow_next();
  // One row, one column: the residual this row adds to is requested now, so its round trip
  // overlaps the row's sums instead of following them.
  constexpr bool kEarlyResidual = NB == 1 && R == 1 && !GATE_UP;
  float residual = 0.0f;
  if constexpr (kEarlyResidual)
    if (task.accumulate && lane == 0)
      residual = task.y[static_cast<int64_t>(first_column) * task.y_stride + row0];
  float scale = 1.0f;
  NormPart<kNormPart> norm_part;
  if constexpr (LATE_NORM)
    norm_part = request_norm_part<kNormPart>(in);
  else
    scale = input_norm_scale(in);

  float acc[M * R][NB];
#pragma unroll
  for (int mr = 0; mr < M * R; ++mr)
#pragma unroll
    for (int b = 0; b < NB; ++b) acc[mr][b] = 0.0f;
  const int8_t* xq = in.xq.qs + static_cast<int64_t>(first_column) * in.n_in;
  const float2* xds = in.xq.ds + static_cast<int64_t>(first_column) * n;

  for (int s = 0; s < steps; ++s) {
    const int base = s * kPerStep;
    if (s + 1 < steps) {
#pragma unroll
      for (int mr = 0; mr < M * R; ++mr)
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int j = base + kPerStep + u * kWarpSize + lane;
          if (j < n) load_payload<TYPE>(rows[mr], n, j, next[mr][u]);
        }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = base + u * kWarpSize + lane;
      if (j >= n) break;
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        const int4* xp =
            reinterpret_cast<const int4*>(xq + static_cast<int64_t>(b) * in.n_in) + 2 * j;
        const int4 xa = xp[0], xb = xp[1];
        const float2 ds = xds[static_cast<int64_t>(b) * n + j];
#pragma unroll
        for (int mr = 0; mr < M * R; ++mr) acc[mr][b] += dot_payload<TYPE>(cur[mr][u], xa, xb, ds);
      }
    }
#pragma unroll
    for (int mr = 0; mr < M * R; ++mr)
#pragma unroll
      for (int u = 0; u < U; ++u) cur[mr][u] = next[mr][u];
  }

  // LATE_NORM (NB == 1): the rows' sums and the norm's in one set of butterflies, then the
  // 1/rms as input_norm_scale() forms it; else each row's warp sum below.
  if constexpr (LATE_NORM) {
    float sums[M * R + 1];
#pragma unroll
    for (int mr = 0; mr < M * R; ++mr) sums[mr] = acc[mr][0];
    sums[M * R] = norm_lane_sum(in, norm_part);
    warp_sums(sums);
#pragma unroll
    for (int mr = 0; mr < M * R; ++mr) acc[mr][0] = sums[mr];
    scale = split_dot::norm_scale(in, sums[M * R]);
  }
  auto row_sum = [&](int mr, int b) { return LATE_NORM ? acc[mr][b] : warp_sum(acc[mr][b]); };
  float last = 0.0f;  // kRowBlocks: the row's result, on lane 0
  float mine = 0.0f;  // NB == 1: the result of row r on lane r
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      float v = row_sum(r, b) * scale;
      if constexpr (GATE_UP) v = silu(v) * (row_sum(R + r, b) * scale);
      if (lane == (r * NB + b) % kWarpSize && row0 + r < task.n_out) {
        float* y = task.y + static_cast<int64_t>(first_column + b) * task.y_stride + row0 + r;
        if constexpr (kEarlyResidual)
          last = task.accumulate ? residual + v : v;
        else
          last = task.accumulate ? *y + v : v;
        *y = last;
        mine = last;
      }
    }
  }
  if constexpr (kRowBlocks) {
    if (task.y_q8.qs) {
      if constexpr (GATE_UP) norm_w = warp == 0 ? result_norm_weight(task, block) : 1.0f;
      quantize_row_block(task, block, last, norm_w);
    }
  }
  if constexpr (kRopeEpilogue) {
    if (task.rope_part)
      rope_rows<W * R>(task, block * W * R, warp * R + lane, lane < R, mine, rotation);
  }
}

// The warps-that-stay kernels' weight requests: row `row` of the launch's rows (its tasks'
// rows laid end to end, SplitTasks::first_block counting rows), sub-blocks of step s.
template <uint32_t TYPE, int U, int M>
__device__ __forceinline__ void load_row_step(const SplitTasks& tasks, int n, int row, int s,
                                              Payload (&p)[M][U]) {
  constexpr int kPerStep = U * kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int ti = task_of(tasks, row);
  const MatvecTask& t = tasks.t[ti];
  const int64_t offset = static_cast<int64_t>(row - tasks.first_block[ti]) * t.row_bytes;
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const uint8_t* base = static_cast<const uint8_t*>(m == 0 ? t.weight : t.weight_up) + offset;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = s * kPerStep + u * kWarpSize + lane;
      if (j < n) load_payload<TYPE>(base, n, j, p[m][u]);
    }
  }
}

// One row's per-lane sums acc[M] (one row of batch 1): `cur` holds the row's first step,
// already requested; the rest of the row is requested a step ahead, and after its last step
// next_row's first (where next_row >= 0) is requested into `cur` for the next call. A lane
// adds its sub-blocks in the order split_matvec_kernel does, whatever U.
template <uint32_t TYPE, int U, int M>
__device__ __forceinline__ void row_sums(const SplitTasks& tasks, const MatvecInput& in, int row,
                                         int next_row, Payload (&cur)[M][U], float (&acc)[M]) {
  constexpr int kPerStep = U * kWarpSize;
  const int lane = threadIdx.x % kWarpSize, n = in.n_in / kQ8Block;
  const int steps = (n + kPerStep - 1) / kPerStep;
  Payload next[M][U];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0f;
  for (int s = 0; s < steps; ++s) {
    if (s + 1 < steps)
      load_row_step<TYPE, U, M>(tasks, n, row, s + 1, next);
    else if (next_row >= 0)
      load_row_step<TYPE, U, M>(tasks, n, next_row, 0, next);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = s * kPerStep + u * kWarpSize + lane;
      if (j >= n) break;
      const int4* xp = reinterpret_cast<const int4*>(in.xq.qs) + 2 * j;
      const int4 xa = xp[0], xb = xp[1];
      const float2 ds = in.xq.ds[j];
#pragma unroll
      for (int m = 0; m < M; ++m) acc[m] += dot_payload<TYPE>(cur[m][u], xa, xb, ds);
    }
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int u = 0; u < U; ++u) cur[m][u] = next[m][u];
  }
}

// A row's result from its sums (after the warp's sums, the scale, SwiGLU), stored by lane 0
// (after accumulate), which returns it; the other lanes return 0.
template <bool GATE_UP>
__device__ __forceinline__ float finish_row(const MatvecTask& task, int r, const float* acc,
                                            float scale) {
  float v = warp_sum(acc[0]) * scale;
  if constexpr (GATE_UP) v = silu(v) * (warp_sum(acc[1]) * scale);
  if (threadIdx.x % kWarpSize != 0) return 0.0f;
  float* y = task.y + r;
  v = task.accumulate ? *y + v : v;
  *y = v;
  return v;
}

// Batch 1 in warps that stay: the grid is what the SMs hold at once and warp w of the grid
// takes rows w, w + warps, ... of the launch's rows, requesting the next row's first weights
// before finishing the current one (row_sums), so a warp's loads do not drain between rows
// and no block is launched per few rows. Each sum is
// split_matvec_kernel's to the bit. Plain tasks only: those with int8 results take
// split_owned_kernel or 32-warp blocks, those with RoPE in the epilogue (the rows of a pair
// meet in a block) split_matvec_kernel. Counting rows into their 32-row blocks through
// per-block atomic counters instead was measured slower (a __threadfence per row also waits
// for the next row's loads in flight: kernels/README.md).
template <uint32_t TYPE, int U, bool GATE_UP>
__global__ void __launch_bounds__(kWarps* kWarpSize)
    split_rows_kernel(SplitTasks tasks, MatvecInput in) {
  constexpr int M = GATE_UP ? 2 : 1;
  const int total = tasks.first_block[tasks.n_tasks];
  const int stride = static_cast<int>(gridDim.x) * kWarps;
  int g = static_cast<int>(blockIdx.x) * kWarps + static_cast<int>(threadIdx.x) / kWarpSize;
  if (g >= total) return;
  Payload cur[M][U];
  load_row_step<TYPE, U, M>(tasks, in.n_in / kQ8Block, g, 0, cur);
  wait_then_allow_next();
  const float scale = input_norm_scale(in);
  for (; g < total; g += stride) {
    float acc[M];
    row_sums<TYPE, U, M>(tasks, in, g, g + stride < total ? g + stride : -1, cur, acc);
    const int ti = task_of(tasks, g);
    finish_row<GATE_UP>(tasks.t[ti], g - tasks.first_block[ti], acc, scale);
  }
}

// split_rows_kernel for plain rows of one step (n <= U * 32 sub-blocks: the output head and the
// last down projection of a SmolLM2-sized model, 576 and 1,536 wide): a warp keeps the weights
// of D rows in flight instead of one row's (a 576-wide Q4_1 row is 360 bytes, on 18 of the 32
// lanes), and reads its lane's activations, the same for every row, once. A lane adds its
// sub-blocks in increasing order as row_sums does, so each sum is split_rows_kernel's to the bit.
template <uint32_t TYPE, int U, int D>
__global__ void __launch_bounds__(kWarps* kWarpSize)
    split_rows_short_kernel(SplitTasks tasks, MatvecInput in) {
  const int total = tasks.first_block[tasks.n_tasks];
  const int stride = static_cast<int>(gridDim.x) * kWarps;
  const int lane = threadIdx.x % kWarpSize, n = in.n_in / kQ8Block;
  int g = static_cast<int>(blockIdx.x) * kWarps + static_cast<int>(threadIdx.x) / kWarpSize;
  if (g >= total) return;
  Payload p[D][1][U];
#pragma unroll
  for (int d = 0; d < D; ++d)
    if (g + d * stride < total) load_row_step<TYPE, U, 1>(tasks, n, g + d * stride, 0, p[d]);
  wait_then_allow_next();
  int4 xa[U], xb[U];
  float2 ds[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int j = min(u * kWarpSize + lane, n - 1);  // lanes past n load a copy, never used
    const int4* xp = reinterpret_cast<const int4*>(in.xq.qs) + 2 * j;
    xa[u] = xp[0];
    xb[u] = xp[1];
    ds[u] = in.xq.ds[j];
  }
  const float scale = input_norm_scale(in);
  for (; g < total; g += D * stride) {
#pragma unroll
    for (int d = 0; d < D; ++d) {
      const int row = g + d * stride;
      if (row >= total) break;
      float acc = 0.0f;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (u * kWarpSize + lane >= n) break;
        acc += dot_payload<TYPE>(p[d][0][u], xa[u], xb[u], ds[u]);
      }
      if (row + D * stride < total) load_row_step<TYPE, U, 1>(tasks, n, row + D * stride, 0, p[d]);
      const int ti = task_of(tasks, row);
      finish_row<false>(tasks.t[ti], row - tasks.first_block[ti], &acc, scale);
    }
  }
}

// Batch 1, one task with int8 results (MatvecTask::y_q8) of more 32-row blocks than the SMs
// hold 32-warp blocks at once (an 8B model's SwiGLU product under the fusion): a block of WB
// warps owns one 32-row block, warp w taking its rows w, w + WB, ... in turn as
// split_rows_kernel's warps do (row_sums), and the 32 results meet in shared memory for the
// quantisation. With WB = 8 (at most 64 registers: 4 blocks per SM) every block
// of an 8B model's 448 is resident at once, so no SM waits for a second wave, and the SwiGLU
// result leaves as int8 blocks without the quantisation kernel. (WB = 4, 8 rows per warp, was
// measured 10 % slower per step than the quantisation kernel: kernels/README.md.)
constexpr int kOwnerWarps = 8, kOwnerBlocksPerSm = 4;
template <uint32_t TYPE, int U, bool GATE_UP, int WB>
__global__ void __launch_bounds__(WB* kWarpSize, kOwnerBlocksPerSm)
    split_owned_kernel(SplitTasks tasks, MatvecInput in) {
  constexpr int M = GATE_UP ? 2 : 1;
  constexpr int kRowsPerWarp = kQ8Block / WB;
  __shared__ float block_y[kQ8Block];
  const MatvecTask& task = tasks.t[0];
  const int block = static_cast<int>(blockIdx.x);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int first = block * kQ8Block + warp;  // rows first, first + WB, ...
  Payload cur[M][U];
  load_row_step<TYPE, U, M>(tasks, in.n_in / kQ8Block, first, 0, cur);
  float norm_w = 1.0f;  // as in split_matvec_kernel: plain products request it now
  if constexpr (!GATE_UP)
    if (warp == 0) norm_w = result_norm_weight(task, block);
  wait_then_allow_next();
  const float scale = input_norm_scale(in);
#pragma unroll 1
  for (int k = 0; k < kRowsPerWarp; ++k) {
    const int row = first + k * WB;
    float acc[M];
    row_sums<TYPE, U, M>(tasks, in, row, k + 1 < kRowsPerWarp ? row + WB : -1, cur, acc);
    const float y = finish_row<GATE_UP>(task, row, acc, scale);
    if (lane == 0) block_y[row - block * kQ8Block] = y;
  }
  __syncthreads();
  if (warp == 0) {
    if constexpr (GATE_UP) norm_w = result_norm_weight(task, block);
    quantize_result_block(task, block, block_y[lane], norm_w);
  }
}

// Blocks of a warps-that-stay kernel the SMs hold at once (queried once per kernel).
template <auto KERNEL>
int resident_row_blocks() {
  static const int blocks = [] {
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, KERNEL, kWarps * kWarpSize, 0) !=
        cudaSuccess) {
      (void)cudaGetLastError();
      per_sm = 1;
    }
    return std::max(per_sm, 1) * multiprocessors();
  }();
  return blocks;
}

// SwiGLU reads two matrices, so its warps take half the rows (registers). Launches with
// int8 results (row_blocks) take one-row warps in blocks of kRowBlockWarps.
template <uint32_t TYPE, int NB, int R, int U>
cudaError_t launch_shape(const SplitTasks& tasks, int n_tasks, bool gate_up,
                         bool row_blocks, const MatvecInput& in, int first_column,
                         const KernelConfig& config, cudaStream_t stream) {
  auto go = [&](auto kernel, int warps, int rows_per_warp) {
    const int block_rows = warps * rows_per_warp;
    SplitTasks placed = tasks;
    placed.n_tasks = n_tasks;
    for (int i = 0; i < n_tasks; ++i) {
      // RoPE in the epilogue: a rotation pair, and a head, never straddle two blocks.
      if (tasks.t[i].rope_part &&
          (tasks.t[i].n_out % block_rows != 0 || in.rope.head_dim % block_rows != 0))
        return cudaErrorInvalidValue;
      placed.first_block[i + 1] = placed.first_block[i] + ceil_div(tasks.t[i].n_out, block_rows);
    }
    return launch_early(kernel, dim3(placed.first_block[n_tasks]), dim3(warps * kWarpSize),
                        config, stream, placed, in, first_column);
  };
  if constexpr (NB == 1) {
    // The kernels of warps that stay: every task's rows end to end, first_block counting rows.
    // Runs of one row only (not the last column of a larger batch's groups).
    auto by_rows = [&] {
      SplitTasks placed = tasks;
      placed.n_tasks = n_tasks;
      for (int i = 0; i < n_tasks; ++i)
        placed.first_block[i + 1] = placed.first_block[i] + tasks.t[i].n_out;
      return placed;
    };
    bool stay = !row_blocks && in.batch == 1;
    for (int i = 0; i < n_tasks; ++i) stay = stay && !tasks.t[i].rope_part;
    if (stay) {
      auto rows = [&](auto kernel, int resident) {
        const SplitTasks placed = by_rows();
        const int blocks = std::min(ceil_div(placed.first_block[n_tasks], kWarps), resident);
        return launch_early(kernel, dim3(blocks), dim3(kWarps * kWarpSize), config, stream,
                            placed, in);
      };
      if (gate_up)
        return rows(split_rows_kernel<TYPE, U, true>,
                    resident_row_blocks<split_rows_kernel<TYPE, U, true>>());
      // Rows of at most two 32-lane steps: more rows in flight per warp.
      const int n = in.n_in / kQ8Block;
      if (n <= kWarpSize)
        return rows(split_rows_short_kernel<TYPE, 1, 4>,
                    resident_row_blocks<split_rows_short_kernel<TYPE, 1, 4>>());
      if (n <= 2 * kWarpSize)
        return rows(split_rows_short_kernel<TYPE, 2, 2>,
                    resident_row_blocks<split_rows_short_kernel<TYPE, 2, 2>>());
      return rows(split_rows_kernel<TYPE, U, false>,
                  resident_row_blocks<split_rows_kernel<TYPE, U, false>>());
    }
    // Blocks that own a 32-row block each, where 32-warp blocks would take more than a wave.
    if constexpr (owns_row_blocks(TYPE)) {
      if (row_blocks && in.batch == 1 && n_tasks == 1 &&
          tasks.t[0].n_out / kQ8Block > multiprocessors()) {
        auto owned = [&](auto kernel, int warps) {
          return launch_early(kernel, dim3(tasks.t[0].n_out / kQ8Block),
                              dim3(warps * kWarpSize), config, stream, by_rows(), in);
        };
        return gate_up ? owned(split_owned_kernel<TYPE, U, true, kOwnerWarps>, kOwnerWarps)
                       : owned(split_owned_kernel<TYPE, U, false, kOwnerWarps>, kOwnerWarps);
      }
    }
    // The late norm (LATE_NORM), where the input has a norm to apply.
    const bool late_norm = in.norm_sum_squares != nullptr;
    if (row_blocks) {
      if (gate_up)
        return late_norm
                   ? go(split_matvec_kernel<TYPE, 1, 1, U, true, kRowBlockWarps, true>,
                        kRowBlockWarps, 1)
                   : go(split_matvec_kernel<TYPE, 1, 1, U, true, kRowBlockWarps>, kRowBlockWarps, 1);
      return late_norm
                 ? go(split_matvec_kernel<TYPE, 1, 1, U, false, kRowBlockWarps, true>,
                      kRowBlockWarps, 1)
                 : go(split_matvec_kernel<TYPE, 1, 1, U, false, kRowBlockWarps>, kRowBlockWarps, 1);
    }
    if (late_norm && !gate_up)  // the Q/K/V product (RoPE in its epilogue)
      return go(split_matvec_kernel<TYPE, 1, R, U, false, kWarps, true>, kWarps, R);
  }
  if (gate_up) {
    constexpr int kGateRows = R > 1 ? R / 2 : 1;
    return go(split_matvec_kernel<TYPE, NB, kGateRows, U, true, kWarps>, kWarps, kGateRows);
  }
  return go(split_matvec_kernel<TYPE, NB, R, U, false, kWarps>, kWarps, R);
}

// Rows per warp grow with the batch so each activation load serves more weights; the
// sub-blocks in flight per lane shrink to keep registers for the accumulators. Batch 1: one
// row per warp, two sub-blocks per lane (H200, 8B-shaped Q4_0, ms per decode step: 1x2 1.94,
// 2x4 2.00, 1x4 2.02, 1x8 2.35), four for Q6_K (and Q2_K/Q3_K, untimed).
template <uint32_t TYPE, int NB>
cudaError_t launch_columns(const SplitTasks& tasks, int n_tasks, bool gate_up,
                           bool row_blocks, const MatvecInput& in, int first_column,
                           const KernelConfig& config, cudaStream_t stream) {
  auto go = [&](auto r, auto u) {
    return launch_shape<TYPE, NB, decltype(r)::value, decltype(u)::value>(
        tasks, n_tasks, gate_up, row_blocks, in, first_column, config, stream);
  };
  using One = std::integral_constant<int, 1>;
  using Two = std::integral_constant<int, 2>;
  using Four = std::integral_constant<int, 4>;
  if constexpr (NB == 1) {
    // Q4_0/Q4_1 rows of at most 32 sub-blocks (a SmolLM2-sized model's 576-wide products) are
    // one 32-lane step at any U: U = 1 holds no payloads that are never loaded (the 32-warp
    // SwiGLU kernel spills 48 bytes at U = 2, none at 1). A lane's sub-blocks are added in the
    // same order at any U, so the sums are the same to the bit.
    if constexpr (TYPE == kQ4_0 || TYPE == kQ4_1)
      if (in.n_in / kQ8Block <= kWarpSize) return go(One{}, One{});
    // Q2_K/Q3_K load 8 bytes of values per sub-block: four in flight, as Q6_K.
    if constexpr (TYPE == kQ6_K || TYPE == kQ2_K || TYPE == kQ3_K)
      return go(One{}, Four{});
    else
      return go(One{}, Two{});
  } else if constexpr (NB <= 4) {
    return go(Two{}, Two{});
  } else {
    return go(Four{}, One{});
  }
}

}  // namespace

bool matvec_owns_row_blocks(uint32_t weight_type) { return owns_row_blocks(weight_type); }

cudaError_t launch_matvec_split(uint32_t weight_type, const MatvecTask* tasks, int n_tasks,
                                const MatvecInput& input, const KernelConfig& config,
                                cudaStream_t stream) {
  SplitTasks packed{};
  int max_rows = 0;
  const bool gate_up = tasks[0].weight_up != nullptr;
  bool row_blocks = false;
  for (int i = 0; i < n_tasks; ++i) {
    if ((tasks[i].weight_up != nullptr) != gate_up || tasks[i].row_bytes % 16 != 0)
      return cudaErrorInvalidValue;
    // int8 results: batch 1, whole 32-row blocks; norm_weight and sum_squares with them only.
    if (tasks[i].y_q8.qs && (input.batch != 1 || tasks[i].n_out % kQ8Block != 0))
      return cudaErrorInvalidValue;
    if (!tasks[i].y_q8.qs && (tasks[i].norm_weight || tasks[i].sum_squares))
      return cudaErrorInvalidValue;
    row_blocks = row_blocks || tasks[i].y_q8.qs;
    packed.t[i] = tasks[i];
    max_rows = std::max(max_rows, tasks[i].n_out);
  }
  if (input.norm_sum_squares && input.batch != 1) return cudaErrorInvalidValue;
  // RoPE in the epilogue: batch 1, plain products writing y (row_blocks launches quantise
  // instead); launch_shape checks that the blocks hold whole pairs.
  for (int i = 0; i < n_tasks; ++i) {
    const MatvecTask& t = tasks[i];
    if (t.rope_part && (!input.rope.positions || input.batch != 1 || gate_up || row_blocks ||
                        t.rope_part > 3 || t.accumulate))
      return cudaErrorInvalidValue;
  }
  if (input.batch == 0 || max_rows == 0) return cudaSuccess;
  cudaError_t status = cudaErrorInvalidValue;
  dispatch_weight_type(weight_type, [&](auto type_tag) {
    constexpr uint32_t TYPE = decltype(type_tag)::value;
    if constexpr (split::supports(TYPE)) {
      status = for_each_column_group(input.batch, [&](int first_column, auto columns) {
        return launch_columns<TYPE, decltype(columns)::value>(packed, n_tasks, gate_up, row_blocks,
                                                              input, first_column, config, stream);
      });
    }
  });
  return status;
}

}  // namespace granule::kernels
