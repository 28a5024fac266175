// Batched products of split-layout Q4_0/Q4_1 weights (split_layout.h) with f16 activations on
// f16 tensor cores: mma.sync m16n8k16 with f32 accumulation. The Q4 weights are dequantised to
// f16 in registers, their scale applied there (one f16 rounding per weight), so the mma
// accumulates straight into f32 with no per-sub-block epilogue — the Marlin idea. The int8
// kernel (matvec_mma.cu) instead scales every sub-block's int32 result by its weight and
// activation scales: ~12 FP instructions per mma, which makes it issue-bound at 16-64 columns.
//
// The pipeline is matvec_mma.cu's version 2: a block's W warps own the same weight rows
// (MT 16-row m-tiles: 32 or 64 rows; SwiGLU: half gate, half up) and split the sub-blocks
// (warp w takes stages w, w + W, ... of kKs sub-blocks); every warp streams its stages through
// a private shared-memory ring filled by its own cp.async copies (weights, weight scales and
// the f16 activations of those sub-blocks for all 8 * NT columns of the block's column tile),
// waits with cp.async.wait_group + __syncwarp only, and the W partial sums meet once at the end
// in a fixed order (deterministic). Column tiles of the same rows are adjacent in blockIdx.x,
// so the second tile of 64 columns finds the weights in L2.
//
// k permutation: inside one mma the k order is free as long as A and B agree. Lane (g, t)
// gets word t (bytes 4t..4t+3) of rows g and g + 8 of a sub-block from ldmatrix; byte i holds
// element i (low nibble) and i + 16 (high). k-step 0 of the sub-block takes the low nibbles:
// logical k 2t, 2t + 1 -> elements 4t, 4t + 1 (a0, a1), logical 2t + 8, 2t + 9 -> elements
// 4t + 2, 4t + 3 (a2, a3); k-step 1 the high nibbles, elements 16 + 4t ... The matching B
// fragment of column g is one 8-byte shared load of elements 4t..4t + 3 (b0, b1) — and
// 16 + 4t.. for k-step 1.
//
// Thread-block clusters (sm_90): plain products at 9-64 columns with fewer than two 64-row
// blocks per SM (an 8B model's wo, down and QKV) give each tile of 64 rows to a cluster of 2
// or 4 blocks that split its sub-blocks; the ranks' sums meet in rank 0's shared memory
// (distributed shared memory, two cluster barriers) and are added in rank order. Each block
// reads 1/C of the tile's activations: the activation bytes per weight byte of 64 rows at the
// block count of 32 (wo/down at 32 columns were bound by those L2 -> SM bytes).
//
// Shared-activation shapes (f16mma_shared_kernel, KernelConfig::f16_mma_shared_*; 17-64
// columns): a block's warps split the rows instead of the sub-blocks, in WK groups that split
// the sub-blocks, and each group reads one copy of a stage's activations (filled by all its
// threads, a named barrier per stage), so more warps fit an SM and each activation byte from L2
// serves WR warps' rows. The SwiGLU product of an 8B model takes shape 5 (H200, 32 columns:
// 49.6 us against round 1's 57.9); products of 4,096 rows keep round 1 (too few row tiles).
// Shapes 7-9 also split a tile over a thread-block cluster (measured slower; PERF_NOTES).
//
// Numerics: w16 = f16_rn((q - 8) d) (Q4_0) or f16_rn(q d + m) (Q4_1), one rounding each (the
// integer parts are exact in f16), times the f16 activation (exact in the mma), accumulated in
// f32 by the tensor core and then across warps (and cluster ranks) in f32, in a fixed order.
//
// The cp.async and ldmatrix wrappers are async_copy.cuh's, shared with matvec_mma.cu.
#include <cooperative_groups.h>

#include <cstring>

#include "async_copy.cuh"
#include "granule/split_layout.h"
#include "matvec_f16mma.cuh"
#include "quant_blocks.cuh"

namespace granule::kernels {
namespace {

constexpr int kKs = 2;                       // 32-element sub-blocks per pipeline stage
constexpr int kWarpBudget = 26 * 1024;       // ring bytes per warp (as matvec_mma.cu's v2)
constexpr int kMaxBlockShared = 227 * 1024;  // opt-in shared memory per block, H100/H200

struct F16Tasks {
  MatvecTask t[kMaxMatvecTasks];
};

// Shared-memory layout of one stage of a warp's ring, and the block's shape.
template <uint32_t TYPE, int NT, int MT, bool GATE_UP>
struct Plan {
  static constexpr int kMatrices = GATE_UP ? 2 : 1;
  static constexpr int kWeightRows = 16 * MT;                // per warp (and block)
  static constexpr int kRows = kWeightRows / kMatrices;      // output rows per block
  static constexpr int kTilesPerMatrix = MT / kMatrices;     // m-tiles of gate (or of W)
  static constexpr int kColumns = 8 * NT;                    // per column tile
  static constexpr int kScaleBytes = TYPE == kQ4_1 ? 4 : 2;  // f16 d (and f16 m)
  // Weight rows padded by 16 bytes: ldmatrix's 8 row addresses (stride 48) land in 8
  // different 16-byte bank groups.
  static constexpr int kWeightRow = kKs * 16 + 16;
  static constexpr int kScaleRow = kKs * kScaleBytes;  // 4 or 8 bytes: one cp.async
  static constexpr int kScaleWords = kScaleRow / 4;
  // Activation rows (one per column, kKs * 32 f16) padded by 32 bytes: stride = 32 mod 128,
  // so the 8-byte B loads of 4 columns x 4 lanes (a half warp) cover 32 distinct banks.
  static constexpr int kActRow = kKs * 64 + 32;
  static constexpr int kScaleOffset = kWeightRows * kWeightRow;
  static constexpr int kActOffset = kScaleOffset + kWeightRows * kScaleRow;
  static constexpr int kStageBytes = kActOffset + kColumns * kActRow;
  static constexpr int kStagesFit = kWarpBudget / kStageBytes;
  static constexpr int kStages = kStagesFit > 6 ? 6 : kStagesFit < 3 ? 3 : kStagesFit;
  static constexpr int kWarpBytes = kStages * kStageBytes;
  static constexpr int kAccumulators = MT * NT * 4;
  // Per lane and stage: 16-byte weight chunks (kKs per row), scale copies (one row each),
  // 16-byte activation chunks (4 kKs per column).
  static constexpr int kWeightCopies = kWeightRows * kKs / kWarpSize;
  static constexpr int kScaleCopies = kWeightRows / kWarpSize;
  static constexpr int kActChunksPerColumn = kKs * 4;
  static constexpr int kActCopies = kColumns * kActChunksPerColumn / kWarpSize;
  static_assert(MT == 2 || MT == 4, "one ldmatrix.x4 reads 32 weight rows");
  static_assert(kScaleOffset % 16 == 0 && kActOffset % 16 == 0 && kStageBytes % 16 == 0 &&
                    kWeightRow % 16 == 0 && kActRow % 16 == 0,
                "cp.async and ldmatrix want 16-byte aligned rows");
  static_assert(kActRow % 128 == 32, "conflict-free 8-byte activation loads");
  static_assert(kWeightCopies * kWarpSize == kWeightRows * kKs && kScaleCopies >= 1 &&
                    kActCopies >= 1 && kActCopies * kWarpSize == kColumns * kActChunksPerColumn,
                "every lane copies the same number of chunks");
  static_assert(kKs == 2 && (kScaleRow == 4 || kScaleRow == 8),
                "a stage's scales of a row are one 4- or 8-byte copy (alignment)");
};

template <uint32_t TYPE, int NT, int MT, bool GATE_UP, int W, int C = 1>
constexpr int kSharedBytes = [] {
  using P = Plan<TYPE, NT, MT, GATE_UP>;
  constexpr int ring = W * P::kWarpBytes;
  constexpr int reduce = (W - 1) * P::kAccumulators * kWarpSize * 4;
  constexpr int remote = (C - 1) * P::kAccumulators * kWarpSize * 4;  // rank 0's, per cluster
  static_assert(reduce <= ring && remote <= ring, "the partial sums reuse the rings");
  static_assert(ring <= kMaxBlockShared, "the block's rings fit an H100/H200 block");
  return ring;
}();

// c += a (16x16 f16, row-major fragment) x b (16x8 f16, column-major fragment), f32.
__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();    // matvec_f16mma_fits_device() refuses devices below compute capability 8.0
#endif
}

__device__ __forceinline__ __half2 as_half2(uint32_t bits) {
  __half2 h;
  static_assert(sizeof(h) == sizeof(bits));
  memcpy(&h, &bits, sizeof(h));
  return h;
}
__device__ __forceinline__ uint32_t as_bits(__half2 h) {
  uint32_t bits;
  memcpy(&bits, &h, sizeof(bits));
  return bits;
}

// The four f16 pairs of one 4-byte word of a Q4 sub-block row (bytes b0..b3 = elements
// e..e+3 in the low nibbles, e+16..e+19 in the high), biased so the integer is exact:
// o[0] = (1024 + q(e), 1024 + q(e+1)), o[1] = the same for e+2, e+3;
// o[2] = (1024 + 16 q(e+16), 1024 + 16 q(e+17)), o[3] for e+18, e+19.
// (0x6400 is f16 1024, whose ulp is 1: OR-ing a value below 1024 into the mantissa adds it.)
__device__ __forceinline__ void unpack_nibbles(uint32_t w, uint32_t (&o)[4]) {
  const uint32_t p = __byte_perm(w, 0, 0x3120);  // bytes b0 b2 b1 b3
  const uint32_t s = p >> 8;                     // bytes b2 b1 b3 0
  o[0] = (p & 0x000F000Fu) | 0x64006400u;        // f16 1024 in both halves
  o[1] = (s & 0x000F000Fu) | 0x64006400u;
  o[2] = (p & 0x00F000F0u) | 0x64006400u;
  o[3] = (s & 0x00F000F0u) | 0x64006400u;
}

// f16x2 constants as bits (a conversion at run time would be an instruction each).
constexpr uint32_t kHalf2_1024 = 0x64006400u, kHalf2_1032 = 0x64086408u;
constexpr uint32_t kHalf2_Sixteenth = 0x2C002C00u;  // 1/16
constexpr uint32_t kHalf2_Minus64 = 0xD400D400u, kHalf2_Minus72 = 0xD480D480u;

// The weights of one word, dequantised: lo[0..1] the low-nibble pairs (k-step 0), hi[0..1]
// the high-nibble pairs (k-step 1), each rounded to f16 once. d = (d, d); m = (m, m) (Q4_1).
template <uint32_t TYPE>
__device__ __forceinline__ void dequantise(uint32_t w, __half2 d, __half2 m, uint32_t (&lo)[2],
                                           uint32_t (&hi)[2]) {
  uint32_t o[4];
  unpack_nibbles(w, o);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if constexpr (TYPE == kQ4_0) {
      // (1024 + q) - 1032 = q - 8 and (1024 + 16 q) / 16 - 72 = q - 8, both exact; then one
      // rounding: (q - 8) * d.
      const __half2 ql = __hsub2_rn(as_half2(o[i]), as_half2(kHalf2_1032));
      const __half2 qh =
          __hfma2(as_half2(o[2 + i]), as_half2(kHalf2_Sixteenth), as_half2(kHalf2_Minus72));
      lo[i] = as_bits(__hmul2_rn(ql, d));
      hi[i] = as_bits(__hmul2_rn(qh, d));
    } else {
      // q exact, then one rounding: q * d + m (fused).
      const __half2 ql = __hsub2_rn(as_half2(o[i]), as_half2(kHalf2_1024));
      const __half2 qh =
          __hfma2(as_half2(o[2 + i]), as_half2(kHalf2_Sixteenth), as_half2(kHalf2_Minus64));
      lo[i] = as_bits(__hfma2(ql, d, m));
      hi[i] = as_bits(__hfma2(qh, d, m));
    }
  }
}

// Row r (0..kWeightRows - 1) of the warp's weight rows: matrix r / kRows, row row0 + r % kRows
// (rows past the matrix's end repeat its last row; they are read, never written).
template <class P>
__device__ __forceinline__ const uint8_t* weight_row(const MatvecTask& task, int row0, int r) {
  const int row = min(row0 + r % P::kRows, task.n_out - 1);
  const void* matrix = P::kMatrices == 2 && r >= P::kRows ? task.weight_up : task.weight;
  return static_cast<const uint8_t*>(matrix) + static_cast<int64_t>(row) * task.row_bytes;
}

// One pipeline stage of one warp: kKs sub-blocks (from `first`, of n per row) of the warp's
// kWeightRows weight rows (at `weights`, kWeightRow bytes apart; their scales at `scales`,
// kScaleRow apart) times the column tile's activations (at `act`, kActRow apart), into acc.
template <class P, uint32_t TYPE, int NT, int MT>
__device__ __forceinline__ void multiply_stage(float (&acc)[MT][NT][4], const uint8_t* weights,
                                               const uint8_t* scales, const uint8_t* act,
                                               int first, int n, int lane) {
  const int g = lane / 4, t = lane % 4;  // the mma fragments' group and thread in group
  // The stage's scales of rows m * 16 + g + 8 h: both sub-blocks' d (and m) in one load.
  uint32_t scale[MT][2][P::kScaleWords];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint8_t* p = scales + (m * 16 + g + 8 * h) * P::kScaleRow;
      if constexpr (TYPE == kQ4_1) {
        const uint2 v = *reinterpret_cast<const uint2*>(p);
        scale[m][h][0] = v.x;
        scale[m][h][1] = v.y;
      } else {
        scale[m][h][0] = *reinterpret_cast<const uint32_t*>(p);
      }
    }
#pragma unroll
  for (int u = 0; u < kKs; ++u) {
    if (first + u >= n) break;  // warp-uniform: past the row's end
    // Activation fragments of every n-tile: column g, elements 4t..4t + 3 (k-step 0) and
    // 16 + 4t.. (k-step 1) of sub-block u.
    uint32_t b[NT][2][2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const uint8_t* x = act + (nt * 8 + g) * P::kActRow + u * 64 + 8 * t;
      const uint2 k0 = *reinterpret_cast<const uint2*>(x);
      const uint2 k1 = *reinterpret_cast<const uint2*>(x + 32);
      b[nt][0][0] = k0.x;
      b[nt][0][1] = k0.y;
      b[nt][1][0] = k1.x;
      b[nt][1][1] = k1.y;
    }
    // Weight words: ldmatrix.x4 over 32 rows gives rows g, g + 8 of two m-tiles.
    uint32_t words[MT][2];
#pragma unroll
    for (int half = 0; half < MT / 2; ++half) {
      uint32_t r[4];
      load_matrix_x4(r, weights + (half * 32 + lane) * P::kWeightRow + u * 16);
      words[2 * half][0] = r[0];
      words[2 * half][1] = r[1];
      words[2 * half + 1][0] = r[2];
      words[2 * half + 1][1] = r[3];
    }
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      uint32_t lo[2][2], hi[2][2];  // [row g, g + 8][pair]
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        __half2 d, mn;
        if constexpr (TYPE == kQ4_1) {
          const __half2 dm = as_half2(scale[m][h][u]);  // (d, m) of sub-block u
          d = __low2half2(dm);
          mn = __high2half2(dm);
        } else {
          const __half2 dd = as_half2(scale[m][h][0]);  // (d of sub-block 0, of 1)
          d = u == 0 ? __low2half2(dd) : __high2half2(dd);
          mn = d;  // unused
        }
        dequantise<TYPE>(words[m][h], d, mn, lo[h], hi[h]);
      }
      const uint32_t a0[4] = {lo[0][0], lo[1][0], lo[0][1], lo[1][1]};
      const uint32_t a1[4] = {hi[0][0], hi[1][0], hi[0][1], hi[1][1]};
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        mma_f16(acc[m][nt], a0, b[nt][0][0], b[nt][0][1]);
        mma_f16(acc[m][nt], a1, b[nt][1][0], b[nt][1][1]);
      }
    }
  }
}

// A warp's sums to / from a buffer of partial sums (shared memory, or another block's through
// distributed shared memory): accumulator i of lane l at [(first + i) * 32 + l].
template <int MT, int NT>
__device__ __forceinline__ void put_sums(float* buffer, const float (&acc)[MT][NT][4], int first,
                                         int lane) {
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        buffer[(first + (m * NT + nt) * 4 + i) * kWarpSize + lane] = acc[m][nt][i];
}
template <int MT, int NT>
__device__ __forceinline__ void add_sums(float (&acc)[MT][NT][4], const float* buffer, int first,
                                         int lane) {
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        acc[m][nt][i] += buffer[(first + (m * NT + nt) * 4 + i) * kWarpSize + lane];
}

// The N warps (or groups) of a block that split the sub-blocks add their sums: index 0 ends
// with the total, adding 1..N-1 in order (deterministic). Index j > 0 keeps its sums at the
// first accumulator slot(j) of the (reused) ring.
template <int N, int MT, int NT, class Slot>
__device__ __forceinline__ void gather_block_sums(float (&acc)[MT][NT][4], uint8_t* shared,
                                                  int index, Slot slot, int lane) {
  wait_copies<0>();
  __syncthreads();  // every warp is done with its ring; the memory is reused
  float* partial = reinterpret_cast<float*>(shared);
  if (index > 0) put_sums(partial, acc, slot(index), lane);
  __syncthreads();
  if (index == 0)
    for (int j = 1; j < N; ++j) add_sums(acc, partial, slot(j), lane);
}

// The C blocks of a cluster that split a tile's sub-blocks add their sums: the `holder` warps
// of ranks 1..C-1 store theirs into rank 0's shared memory (distributed shared memory, from
// accumulator slot(rank)) and rank 0's holders add them in rank order (the same bits every
// run). Every thread of every block of the cluster calls it (both barriers). True for the
// threads that hold the tile's total (rank 0's holders).
template <int C, int MT, int NT, class Slot>
__device__ __forceinline__ bool gather_cluster_sums(float (&acc)[MT][NT][4], uint8_t* shared,
                                                    int rank, bool holder, Slot slot, int lane) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  // 1: every block is past its main loop and its own sum (the holders keep it in registers),
  // so rank 0's ring and partial sums are free.
  cluster.sync();
  float* tiles = cluster.map_shared_rank(reinterpret_cast<float*>(shared), 0);
  if (rank > 0 && holder) put_sums(tiles, acc, slot(rank), lane);
  cluster.sync();  // 2: the sums landed in rank 0 (release/acquire at the barrier)
  if (rank > 0 || !holder) return false;
  const float* local = reinterpret_cast<const float*>(shared);
  for (int q = 1; q < C; ++q) add_sums(acc, local, slot(q), lane);
  return true;
#else
  __trap();  // the launchers run clusters on compute capability 9.0 and later only
  return false;
#endif
}

// The epilogue: the tile's sums (rows row0.., columns first_column..) to y (or y_f16); SwiGLU
// takes silu(gate) * up from the first and second halves of the m-tiles.
template <class P, int NT, int MT, bool GATE_UP>
__device__ __forceinline__ void store_tile(const float (&acc)[MT][NT][4], const MatvecTask& task,
                                           int row0, int first_column, int batch, int lane) {
  const int g = lane / 4, t = lane % 4;
  // c[0], c[1]: row g, columns 2t, 2t + 1; c[2], c[3]: row g + 8.
#pragma unroll
  for (int m = 0; m < P::kTilesPerMatrix; ++m)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = row0 + m * 16 + g + (i / 2) * 8;
        const int column = first_column + nt * 8 + 2 * t + (i & 1);
        if (row >= task.n_out || column >= batch) continue;
        float v = acc[m][nt][i];
        if constexpr (GATE_UP) v = silu(v) * acc[P::kTilesPerMatrix + m][nt][i];
        const int64_t at = static_cast<int64_t>(column) * task.y_stride + row;
        if (task.y_f16 != nullptr) {
          task.y_f16[at] = __float2half_rn(v);  // never with accumulate (refused)
        } else {
          float* y = task.y + at;
          *y = task.accumulate ? *y + v : v;
        }
      }
}

// C > 1: the C blocks of a thread-block cluster (adjacent in blockIdx.x, rank blockIdx.x % C)
// share one tile of rows and columns and split its sub-blocks: warp w of rank r takes stages
// r W + w, r W + w + C W, ...; each block adds its warps' sums as for C = 1, ranks 1..C-1 then
// store theirs into rank 0's shared memory (distributed shared memory) and rank 0 adds them in
// rank order and writes y. Half (C = 2) or a quarter of the activations per block, so a tile
// of 64 rows (MT = 4) costs no more blocks than 32 rows did.
template <uint32_t TYPE, int NT, int MT, bool GATE_UP, int W, int C = 1>
__global__ void __launch_bounds__(kWarpSize* W, 1)
    f16mma_matvec_kernel(F16Tasks tasks, MatvecInputF16 in) {
  using P = Plan<TYPE, NT, MT, GATE_UP>;
  constexpr int S = P::kStages;
  static_assert(C == 1 || C == 2 || C == 4, "clusters of 1, 2 or 4 blocks");
  extern __shared__ __align__(16) uint8_t shared[];

  const MatvecTask& task = tasks.t[blockIdx.y];
  const int column_tiles = (in.batch + P::kColumns - 1) / P::kColumns;
  const int tile = static_cast<int>(blockIdx.x) / C;  // the cluster's tile
  const int rank = static_cast<int>(blockIdx.x) % C;  // = the block's rank in its cluster
  const int row0 = tile / column_tiles * P::kRows;
  if (row0 >= task.n_out) {      // the whole cluster leaves before any barrier
    wait_for_previous_kernel();  // every block waits (the next kernel relies on the whole grid)
    return;
  }
  const int first_column = tile % column_tiles * P::kColumns;
  const int n = in.n_in / 32;  // sub-blocks per row
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int all_stages = (n + kKs - 1) / kKs;
  const int k_warp = rank * W + warp;  // this warp's place among the cluster's C W warps
  const int stages = k_warp < all_stages ? (all_stages - k_warp + C * W - 1) / (C * W) : 0;
  uint8_t* const ring = shared + warp * P::kWarpBytes;
  auto first_block = [&](int s) { return (k_warp + C * W * s) * kKs; };

  // This lane's copies: chunk lane % kKs of weight rows lane / kKs + i * (32 / kKs), and the
  // scales of rows lane + 32 i.
  const uint8_t* rows[P::kWeightCopies];
#pragma unroll
  for (int i = 0; i < P::kWeightCopies; ++i)
    rows[i] = weight_row<P>(task, row0, lane / kKs + i * (kWarpSize / kKs));
  const uint8_t* scale_rows[P::kScaleCopies];
#pragma unroll
  for (int i = 0; i < P::kScaleCopies; ++i)
    scale_rows[i] = weight_row<P>(task, row0, lane + i * kWarpSize) + static_cast<int64_t>(n) * 16;
  const int chunk = lane % kKs;

  auto load_weights = [&](int s) {
    uint8_t* stage = ring + (s % S) * P::kStageBytes;
    const int first = first_block(s);
    const bool valid = first + chunk < n;
#pragma unroll
    for (int i = 0; i < P::kWeightCopies; ++i)
      copy_async<16>(stage + (lane / kKs + i * (kWarpSize / kKs)) * P::kWeightRow + chunk * 16,
                     valid ? rows[i] + static_cast<int64_t>(first + chunk) * 16 : rows[i], valid);
    // The stage's scales of a row in one copy: when only its first sub-block lies inside the
    // row, the copy reads at most 2 (Q4_0) or 4 (Q4_1) bytes past the scales, inside the row's
    // 16-byte stride padding (the payload is 18 n or 20 n bytes with n odd then).
    const bool ok = first < n;
#pragma unroll
    for (int i = 0; i < P::kScaleCopies; ++i)
      copy_async<P::kScaleRow>(
          stage + P::kScaleOffset + (lane + i * kWarpSize) * P::kScaleRow,
          ok ? scale_rows[i] + static_cast<int64_t>(first) * P::kScaleBytes : scale_rows[i], ok);
  };
  auto load_activations = [&](int s) {
    uint8_t* stage = ring + (s % S) * P::kStageBytes;
    const int first = first_block(s);
    constexpr int ACP = P::kActChunksPerColumn;
#pragma unroll
    for (int i = 0; i < P::kActCopies; ++i) {
      const int column = lane / ACP + i * (kWarpSize / ACP), part = lane % ACP;
      const bool valid = first_column + column < in.batch && first + part / 4 < n;
      const __half* src = valid ? in.x + static_cast<int64_t>(first_column + column) * in.n_in +
                                      static_cast<int64_t>(first) * 32 + part * 8
                                : in.x;
      copy_async<16>(stage + P::kActOffset + column * P::kActRow + part * 16, src, valid);
    }
  };

  // Weights first: they do not depend on the previous kernel.
#pragma unroll
  for (int s = 0; s < S - 1; ++s)
    if (s < stages) load_weights(s);
  wait_for_previous_kernel();  // the activations (and y) belong to earlier kernels
  allow_next_kernel();
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < stages) load_activations(s);
    commit_copies();
  }

  float acc[MT][NT][4];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[m][nt][i] = 0.0f;

  for (int s = 0; s < stages; ++s) {
    wait_copies<S - 2>();  // stage s landed (this lane's copies) ...
    __syncwarp();          // ... for every lane; and every lane is done with stage s - 1
    if (s + S - 1 < stages) {
      load_weights(s + S - 1);  // into stage s - 1's slot
      load_activations(s + S - 1);
    }
    commit_copies();

    const uint8_t* stage = ring + (s % S) * P::kStageBytes;
    multiply_stage<P, TYPE, NT, MT>(acc, stage, stage + P::kScaleOffset, stage + P::kActOffset,
                                    first_block(s), n, lane);
  }

  // The W warps of the block add their partial sums (in a fixed order), then the C blocks.
  auto slot = [](int j) { return (j - 1) * P::kAccumulators; };
  if constexpr (W > 1) gather_block_sums<W>(acc, shared, warp, slot, lane);
  if constexpr (C > 1) {
    if (!gather_cluster_sums<C>(acc, shared, rank, warp == 0, slot, lane)) return;
  } else if (warp > 0) {
    return;
  }

  store_tile<P, NT, MT, GATE_UP>(acc, task, row0, first_column, in.batch, lane);
}

// Shared-activation shapes (KernelConfig::f16_mma_shared; 17-64 columns, NT = 4). A block's
// warps form WK groups of WR warps; warp (r, k) owns weight rows r (MT m-tiles each, the block
// WR * kRows output rows) and group k takes stages k, k + WK, ... of the sub-blocks. The WR
// warps of a group read one copy of each stage's activations from shared memory, which the
// whole group fills (cp.async) and meets on a named barrier per stage, so a stage's activation
// bytes from L2 serve WR times the weight rows of the one-warp ring above (round 1 brings 1.8
// activation bytes per weight byte at 64 rows x 32 columns; WR = 2 halves that), and the
// activations' share of the shared memory, which limited round 1 to 8 warps per SM, shrinks.
// The WK groups' sums meet at the end as round 1's warps do (group order: deterministic).
template <uint32_t TYPE, int NT, int MT, bool GATE_UP, int WR, int WK, int S = 4, int C = 1>
struct SharedPlan {
  using P = Plan<TYPE, NT, MT, GATE_UP>;
  static constexpr int kStages = S;
  static constexpr int kActStage = P::kColumns * P::kActRow;  // one per group and stage
  static constexpr int kWarpStage = P::kActOffset;            // weights + scales of one warp
  static constexpr int kStageBytes = kActStage + WR * kWarpStage;
  static constexpr int kGroupBytes = kStages * kStageBytes;
  static constexpr int kRing = WK * kGroupBytes;
  static constexpr int kReduce = (WK - 1) * WR * P::kAccumulators * kWarpSize * 4;
  static constexpr int kRemote = (C - 1) * WR * P::kAccumulators * kWarpSize * 4;  // rank 0's
  static constexpr int kLargest = kReduce > kRemote ? kReduce : kRemote;
  static constexpr int kShared = kRing > kLargest ? kRing : kLargest;
  static constexpr int kGroupThreads = WR * kWarpSize;
  static constexpr int kActChunks = P::kColumns * P::kActChunksPerColumn;  // 16 B each
  static constexpr int kActCopies = (kActChunks + kGroupThreads - 1) / kGroupThreads;
  static_assert(kActStage % 16 == 0 && kWarpStage % 16 == 0, "16-byte aligned stages");
  static_assert(kShared <= kMaxBlockShared, "the block's rings fit an H100/H200 block");
  static_assert(WK <= 15, "named barriers 1..15");
  static_assert(S >= 3 && (C == 1 || C == 2 || C == 4 || C == 8), "3+ stages, clusters of 1-8");
};

// The WR warps of group k: every thread of the group arrives (named barrier 1 + k).
template <int WR, int WK>
__device__ __forceinline__ void group_barrier(int k) {
  if constexpr (WK == 1) {
    __syncthreads();
  } else {
    asm volatile("bar.sync %0, %1;\n" ::"r"(1 + k), "r"(WR * kWarpSize) : "memory");
  }
}

// C > 1: the C blocks of a thread-block cluster (adjacent in blockIdx.x) share one tile and
// split its stages (group k of rank q takes stages q WK + k, q WK + k + C WK, ...); after the
// groups' sums meet in each block, ranks 1..C-1 store theirs into rank 0's shared memory and
// rank 0 adds them in rank order (round 1's cluster scheme). More blocks for the same tiles:
// products of few rows get C times the warps.
template <uint32_t TYPE, int NT, int MT, bool GATE_UP, int WR, int WK, int S = 4, int C = 1>
__global__ void __launch_bounds__(kWarpSize* WR* WK, 1)
    f16mma_shared_kernel(F16Tasks tasks, MatvecInputF16 in) {
  using P = Plan<TYPE, NT, MT, GATE_UP>;
  using SP = SharedPlan<TYPE, NT, MT, GATE_UP, WR, WK, S, C>;
  extern __shared__ __align__(16) uint8_t shared[];

  const MatvecTask& task = tasks.t[blockIdx.y];
  const int column_tiles = (in.batch + P::kColumns - 1) / P::kColumns;
  const int tile = static_cast<int>(blockIdx.x) / C;  // the cluster's tile
  const int rank = static_cast<int>(blockIdx.x) % C;  // = the block's rank in its cluster
  const int block_row0 = tile / column_tiles * (WR * P::kRows);
  if (block_row0 >= task.n_out) {  // uniform over the cluster: it leaves before any barrier
    wait_for_previous_kernel();    // every block waits (the next kernel relies on the grid)
    return;
  }
  const int first_column = tile % column_tiles * P::kColumns;
  const int n = in.n_in / 32;  // sub-blocks per row
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int r = warp % WR, k = warp / WR;  // rows r, stages k, k + WK, ...
  const int row0 = block_row0 + r * P::kRows;  // may lie past n_out: read clamped, not stored
  const int group_thread = r * kWarpSize + lane;
  const int all_stages = (n + kKs - 1) / kKs;
  const int k_place = rank * WK + k;  // the group's place among the cluster's C WK groups
  const int stages =                  // uniform in the group
      k_place < all_stages ? (all_stages - k_place + C * WK - 1) / (C * WK) : 0;
  uint8_t* const ring = shared + k * SP::kGroupBytes;
  auto stage_at = [&](int s) { return ring + (s % S) * SP::kStageBytes; };
  auto warp_at = [&](int s) { return stage_at(s) + SP::kActStage + r * SP::kWarpStage; };
  auto first_block = [&](int s) { return (k_place + C * WK * s) * kKs; };

  const uint8_t* rows[P::kWeightCopies];
#pragma unroll
  for (int i = 0; i < P::kWeightCopies; ++i)
    rows[i] = weight_row<P>(task, row0, lane / kKs + i * (kWarpSize / kKs));
  const uint8_t* scale_rows[P::kScaleCopies];
#pragma unroll
  for (int i = 0; i < P::kScaleCopies; ++i)
    scale_rows[i] = weight_row<P>(task, row0, lane + i * kWarpSize) + static_cast<int64_t>(n) * 16;
  const int chunk = lane % kKs;

  auto load_weights = [&](int s) {  // this warp's rows, as round 1's ring
    uint8_t* stage = warp_at(s);
    const int first = first_block(s);
    const bool valid = first + chunk < n;
#pragma unroll
    for (int i = 0; i < P::kWeightCopies; ++i)
      copy_async<16>(stage + (lane / kKs + i * (kWarpSize / kKs)) * P::kWeightRow + chunk * 16,
                     valid ? rows[i] + static_cast<int64_t>(first + chunk) * 16 : rows[i], valid);
    const bool ok = first < n;  // the scale overread stays in the row padding (round 1)
#pragma unroll
    for (int i = 0; i < P::kScaleCopies; ++i)
      copy_async<P::kScaleRow>(
          stage + P::kScaleOffset + (lane + i * kWarpSize) * P::kScaleRow,
          ok ? scale_rows[i] + static_cast<int64_t>(first) * P::kScaleBytes : scale_rows[i], ok);
  };
  auto load_activations = [&](int s) {  // the group's one copy, spread over its threads
    uint8_t* stage = stage_at(s);
    const int first = first_block(s);
    constexpr int ACP = P::kActChunksPerColumn;
#pragma unroll
    for (int i = 0; i < SP::kActCopies; ++i) {
      const int c = group_thread + i * SP::kGroupThreads;
      if (SP::kActChunks % SP::kGroupThreads != 0 && c >= SP::kActChunks) break;
      const int column = c / ACP, part = c % ACP;
      const bool valid = first_column + column < in.batch && first + part / 4 < n;
      const __half* src = valid ? in.x + static_cast<int64_t>(first_column + column) * in.n_in +
                                      static_cast<int64_t>(first) * 32 + part * 8
                                : in.x;
      copy_async<16>(stage + column * P::kActRow + part * 16, src, valid);
    }
  };

#pragma unroll
  for (int s = 0; s < S - 1; ++s)
    if (s < stages) load_weights(s);
  wait_for_previous_kernel();
  allow_next_kernel();
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < stages) load_activations(s);
    commit_copies();
  }

  float acc[MT][NT][4];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[m][nt][i] = 0.0f;

  for (int s = 0; s < stages; ++s) {
    wait_copies<S - 2>();   // stage s landed (this thread's copies) ...
    group_barrier<WR, WK>(k);  // ... for the group; and the group is done with stage s - 1
    if (s + S - 1 < stages) {
      load_weights(s + S - 1);  // into stage s - 1's slot
      load_activations(s + S - 1);
    }
    commit_copies();
    const uint8_t* w = warp_at(s);
    multiply_stage<P, TYPE, NT, MT>(acc, w, w + P::kScaleOffset, stage_at(s), first_block(s), n,
                                    lane);
  }

  // The WK groups' sums, added in group order by group 0's warps; then the C blocks'. Warp
  // (r, k) keeps its sums from accumulator ((k - 1) WR + r) on (k: group, or cluster rank).
  auto slot = [&](int j) { return ((j - 1) * WR + r) * P::kAccumulators; };
  if constexpr (WK > 1) gather_block_sums<WK>(acc, shared, k, slot, lane);
  if constexpr (C > 1) {
    if constexpr (WK == 1) wait_copies<0>();
    if (!gather_cluster_sums<C>(acc, shared, rank, k == 0, slot, lane)) return;
  } else if constexpr (WK > 1) {
    if (k > 0) return;
  }
  store_tile<P, NT, MT, GATE_UP>(acc, task, row0, first_column, in.batch, lane);
}

// Lets a kernel use its shared memory (beyond 48 KB needs asking), once per process: the first
// call comes from matvec_f16mma_fits_device(), before any capture.
template <uint32_t TYPE, int NT, int MT, bool GATE_UP, int W, int C = 1>
cudaError_t allow_shared_bytes() {
  static const cudaError_t status = cudaFuncSetAttribute(
      f16mma_matvec_kernel<TYPE, NT, MT, GATE_UP, W, C>,
      cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes<TYPE, NT, MT, GATE_UP, W, C>);
  return status;
}

// The cluster shapes (64 weight rows per warp, 4-warp blocks, 9-64 columns): usable
// when the kernel was built for compute capability 9.0 or later, the device has it, and a
// cluster of C such blocks fits the device (cudaOccupancyMaxActiveClusters). Asked once per
// process, from ready() (before any capture); false leaves no error behind.
template <uint32_t TYPE, int NT, bool GATE_UP, int C>
bool cluster_fits() {
  static const bool ok = [] {
    const auto kernel = f16mma_matvec_kernel<TYPE, NT, 4, GATE_UP, 4, C>;
    int device = 0, major = 0, clusters = 0;
    cudaFuncAttributes attributes{};
    cudaLaunchConfig_t launch{};
    launch.gridDim = dim3(C * 64);
    launch.blockDim = dim3(kWarpSize * 4);
    launch.dynamicSmemBytes = kSharedBytes<TYPE, NT, 4, GATE_UP, 4, C>;
    cudaLaunchAttribute cluster[1];
    cluster[0].id = cudaLaunchAttributeClusterDimension;
    cluster[0].val.clusterDim.x = C;
    cluster[0].val.clusterDim.y = 1;
    cluster[0].val.clusterDim.z = 1;
    launch.attrs = cluster;
    launch.numAttrs = 1;
    const bool fits =
        cudaGetDevice(&device) == cudaSuccess &&
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
        major >= 9 && cudaFuncGetAttributes(&attributes, kernel) == cudaSuccess &&
        attributes.binaryVersion >= 90 && attributes.ptxVersion >= 90 &&
        allow_shared_bytes<TYPE, NT, 4, GATE_UP, 4, C>() == cudaSuccess &&
        cudaOccupancyMaxActiveClusters(&clusters, kernel, &launch) == cudaSuccess && clusters > 0;
    if (!fits) cudaGetLastError();  // a refused query leaves nothing for a later launch
    return fits;
  }();
  return ok;
}

template <uint32_t TYPE>
bool clusters_fit() {
  // Evaluated for every shape (each caches its answer); true when all fit.
  const bool fit[] = {cluster_fits<TYPE, 2, false, 2>(), cluster_fits<TYPE, 2, false, 4>(),
                      cluster_fits<TYPE, 4, false, 2>(), cluster_fits<TYPE, 4, false, 4>(),
                      cluster_fits<TYPE, 2, true, 2>(),  cluster_fits<TYPE, 2, true, 4>(),
                      cluster_fits<TYPE, 4, true, 2>(),  cluster_fits<TYPE, 4, true, 4>()};
  for (const bool f : fit)
    if (!f) return false;
  return true;
}

// The shared-activation shapes by KernelConfig::f16_mma_shared_* (1-9; 0: round 1's), as
// (MT, WR, WK, stages, cluster blocks).
template <int MT_, int WR_, int WK_, int S_, int C_>
struct SharedShape {
  static constexpr int MT = MT_, WR = WR_, WK = WK_, S = S_, C = C_;
};
constexpr int kSharedShapes = 9;

template <class F>
auto with_shared_shape(int variant, F&& f) {
  switch (variant) {
    case 1: return f(SharedShape<2, 4, 1, 4, 1>{});
    case 2: return f(SharedShape<4, 2, 1, 4, 1>{});
    case 3: return f(SharedShape<2, 2, 2, 4, 1>{});
    case 4: return f(SharedShape<4, 2, 2, 4, 1>{});
    case 5: return f(SharedShape<2, 4, 2, 4, 1>{});
    case 6: return f(SharedShape<2, 2, 4, 4, 1>{});
    case 7: return f(SharedShape<2, 2, 2, 4, 4>{});
    case 8: return f(SharedShape<2, 2, 2, 3, 4>{});
    default: return f(SharedShape<2, 2, 2, 3, 8>{});
  }
}

template <uint32_t TYPE, bool GATE_UP, class SH>
constexpr auto shared_kernel() {
  return f16mma_shared_kernel<TYPE, 4, SH::MT, GATE_UP, SH::WR, SH::WK, SH::S, SH::C>;
}
template <uint32_t TYPE, bool GATE_UP, class SH>
constexpr int shared_kernel_bytes() {
  return SharedPlan<TYPE, 4, SH::MT, GATE_UP, SH::WR, SH::WK, SH::S, SH::C>::kShared;
}

template <uint32_t TYPE, bool GATE_UP, class SH>
cudaError_t allow_shared_kernel_bytes() {
  static const cudaError_t status =
      cudaFuncSetAttribute(shared_kernel<TYPE, GATE_UP, SH>(),
                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                           shared_kernel_bytes<TYPE, GATE_UP, SH>());
  return status;
}

// A shape runs where its shared memory was granted and, for clusters, where the kernel was built
// for and runs on compute capability 9.0 or later and a cluster of its blocks fits
// (cudaOccupancyMaxActiveClusters). Asked once per shape from ready(), before any capture.
template <uint32_t TYPE, bool GATE_UP, class SH>
bool shared_shape_fits() {
  static const bool ok = [] {
    if (allow_shared_kernel_bytes<TYPE, GATE_UP, SH>() != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    if constexpr (SH::C == 1) {
      return true;
    } else {
      int device = 0, major = 0, clusters = 0;
      cudaFuncAttributes attributes{};
      cudaLaunchConfig_t launch{};
      launch.gridDim = dim3(SH::C * 64);
      launch.blockDim = dim3(kWarpSize * SH::WR * SH::WK);
      launch.dynamicSmemBytes = shared_kernel_bytes<TYPE, GATE_UP, SH>();
      cudaLaunchAttribute cluster[1];
      cluster[0].id = cudaLaunchAttributeClusterDimension;
      cluster[0].val.clusterDim.x = SH::C;
      cluster[0].val.clusterDim.y = 1;
      cluster[0].val.clusterDim.z = 1;
      launch.attrs = cluster;
      launch.numAttrs = 1;
      const auto kernel = shared_kernel<TYPE, GATE_UP, SH>();
      const bool fits =
          cudaGetDevice(&device) == cudaSuccess &&
          cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) ==
              cudaSuccess &&
          major >= 9 && cudaFuncGetAttributes(&attributes, kernel) == cudaSuccess &&
          attributes.binaryVersion >= 90 && attributes.ptxVersion >= 90 &&
          cudaOccupancyMaxActiveClusters(&clusters, kernel, &launch) == cudaSuccess &&
          clusters > 0;
      if (!fits) cudaGetLastError();
      return fits;
    }
  }();
  return ok;
}

template <uint32_t TYPE, bool GATE_UP>
bool shared_variant_fits(int variant) {
  return variant >= 1 && variant <= kSharedShapes &&
         with_shared_shape(variant, [](auto shape) {
           return shared_shape_fits<TYPE, GATE_UP, decltype(shape)>();
         });
}

template <uint32_t TYPE, bool GATE_UP>
void ask_shared_variants() {
  for (int v = 1; v <= kSharedShapes; ++v) shared_variant_fits<TYPE, GATE_UP>(v);
}

// The block shapes the launcher picks from (launch_shape): 64 weight rows per warp in 4-warp
// blocks, 32 rows in 4-warp or 8-warp blocks.
template <uint32_t TYPE, int NT, bool GATE_UP>
cudaError_t allow_shared_bytes_shapes() {
  for (const cudaError_t status : {allow_shared_bytes<TYPE, NT, 4, GATE_UP, 4>(),
                                   allow_shared_bytes<TYPE, NT, 2, GATE_UP, 4>(),
                                   allow_shared_bytes<TYPE, NT, 2, GATE_UP, 8>()})
    if (status != cudaSuccess) return status;
  return cudaSuccess;
}

template <uint32_t TYPE, bool GATE_UP>
cudaError_t allow_shared_bytes_tiles() {
  for (const cudaError_t status : {allow_shared_bytes_shapes<TYPE, 1, GATE_UP>(),
                                   allow_shared_bytes_shapes<TYPE, 2, GATE_UP>(),
                                   allow_shared_bytes_shapes<TYPE, 4, GATE_UP>()})
    if (status != cudaSuccess) return status;
  return cudaSuccess;
}

bool ready() {
  static const bool ok = [] {
    for (const cudaError_t status :
         {allow_shared_bytes_tiles<kQ4_0, false>(), allow_shared_bytes_tiles<kQ4_0, true>(),
          allow_shared_bytes_tiles<kQ4_1, false>(), allow_shared_bytes_tiles<kQ4_1, true>()}) {
      if (status != cudaSuccess) {
        cudaGetLastError();
        return false;
      }
    }
    clusters_fit<kQ4_0>();  // asks now, before any capture; the launches read the answers
    clusters_fit<kQ4_1>();
    ask_shared_variants<kQ4_0, false>();
    ask_shared_variants<kQ4_0, true>();
    ask_shared_variants<kQ4_1, false>();
    ask_shared_variants<kQ4_1, true>();
    return true;
  }();
  return ok;
}

template <uint32_t TYPE, int NT, int MT, bool GATE_UP, int W, int C = 1>
cudaError_t launch_shape(const F16Tasks& tasks, int n_tasks, int max_rows, const MatvecInputF16& in,
                         const KernelConfig& config, cudaStream_t stream) {
  using P = Plan<TYPE, NT, MT, GATE_UP>;
  const cudaError_t attribute = allow_shared_bytes<TYPE, NT, MT, GATE_UP, W, C>();
  if (attribute != cudaSuccess) return attribute;
  // launch_early's attribute, with dynamic shared memory (launch_early passes none), and the
  // cluster's dimension (C blocks along x; the grid's x is a multiple of C).
  cudaLaunchConfig_t launch{};
  launch.gridDim =
      dim3(ceil_div(max_rows, P::kRows) * ceil_div(in.batch, P::kColumns) * C, n_tasks, 1);
  launch.blockDim = dim3(kWarpSize * W);
  launch.dynamicSmemBytes = kSharedBytes<TYPE, NT, MT, GATE_UP, W, C>;
  launch.stream = stream;
  cudaLaunchAttribute attributes[2];
  attributes[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[0].val.programmaticStreamSerializationAllowed = config.early_launch ? 1 : 0;
  attributes[1].id = cudaLaunchAttributeClusterDimension;
  attributes[1].val.clusterDim.x = C;
  attributes[1].val.clusterDim.y = 1;
  attributes[1].val.clusterDim.z = 1;
  launch.attrs = attributes;
  launch.numAttrs = C > 1 ? 2 : 1;
  return cudaLaunchKernelEx(&launch, f16mma_matvec_kernel<TYPE, NT, MT, GATE_UP, W, C>, tasks, in);
}

template <uint32_t TYPE, bool GATE_UP, class SH>
cudaError_t launch_shared(const F16Tasks& tasks, int n_tasks, int max_rows,
                          const MatvecInputF16& in, const KernelConfig& config,
                          cudaStream_t stream) {
  using P = Plan<TYPE, 4, SH::MT, GATE_UP>;
  const cudaError_t attribute = allow_shared_kernel_bytes<TYPE, GATE_UP, SH>();
  if (attribute != cudaSuccess) return attribute;
  cudaLaunchConfig_t launch{};
  launch.gridDim = dim3(ceil_div(max_rows, SH::WR * P::kRows) * ceil_div(in.batch, P::kColumns) *
                            SH::C,
                        n_tasks, 1);
  launch.blockDim = dim3(kWarpSize * SH::WR * SH::WK);
  launch.dynamicSmemBytes = shared_kernel_bytes<TYPE, GATE_UP, SH>();
  launch.stream = stream;
  cudaLaunchAttribute attributes[2];
  attributes[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[0].val.programmaticStreamSerializationAllowed = config.early_launch ? 1 : 0;
  attributes[1].id = cudaLaunchAttributeClusterDimension;
  attributes[1].val.clusterDim.x = SH::C;
  attributes[1].val.clusterDim.y = 1;
  attributes[1].val.clusterDim.z = 1;
  launch.attrs = attributes;
  launch.numAttrs = SH::C > 1 ? 2 : 1;
  return cudaLaunchKernelEx(&launch, shared_kernel<TYPE, GATE_UP, SH>(), tasks, in);
}

template <uint32_t TYPE, bool GATE_UP>
cudaError_t launch_shared_variant(int variant, const F16Tasks& tasks, int n_tasks, int max_rows,
                                  const MatvecInputF16& in, const KernelConfig& config,
                                  cudaStream_t stream) {
  return with_shared_shape(variant, [&](auto shape) {
    return launch_shared<TYPE, GATE_UP, decltype(shape)>(tasks, n_tasks, max_rows, in, config,
                                                         stream);
  });
}

// Blocks of a launch with `rows` output rows per block that have work.
int64_t working_blocks(const F16Tasks& tasks, int n_tasks, int rows, int column_tiles) {
  int64_t blocks = 0;
  for (int i = 0; i < n_tasks; ++i) blocks += ceil_div(tasks.t[i].n_out, rows);
  return blocks * column_tiles;
}

// How many blocks (1, 2 or 4; 2 and 4 where they fit) share each of `tiles` 64-row tiles:
// the least work on the busiest SM, ceil(C tiles / SMs) / (C tiles); on a tie the larger C
// where the smaller one gives at most one 4-warp block per SM (4 warps with 2 stages in flight
// each hold ~16 KB of weights per SM in flight, about half what the DRAM bandwidth needs at
// ~1 us latency; two blocks double it), else the smaller C (longer loops per warp, less to
// add). 8B model on 132 SMs, 16-32 columns: down and wo 64 tiles -> 4 (256 blocks); QKV 96
// -> 4 (384); gate+up 448 -> 2 (896 blocks: 7 on the busiest SM against 6.8 on average, where
// 448 gives 4 against 3.4). 33-64 columns: down/wo 128 tiles -> 2, QKV 192 -> 2, gate+up 896
// -> 1.
int pick_cluster(int64_t tiles, int sms, bool fits2, bool fits4) {
  int best = 1;
  for (const int c : {2, 4}) {
    if (!(c == 2 ? fits2 : fits4)) continue;
    const int64_t busiest = (c * tiles + sms - 1) / sms;
    const int64_t best_busiest = (best * tiles + sms - 1) / sms;
    // busiest / (c tiles) against best_busiest / (best tiles), cross-multiplied.
    const int64_t cost = busiest * best, best_cost = best_busiest * c;
    if (cost < best_cost || (cost == best_cost && best * tiles <= sms)) best = c;
  }
  return best;
}

// Where the device runs clusters, 9-64 columns (two or four n-tiles): 64 weight rows per warp
// (half the activation bytes per weight byte of 32 rows) in 4-warp blocks, the tiles split
// over pick_cluster()'s C blocks. Else, and at 1-8 columns: 64 rows per warp where that still
// gives at least two 4-warp blocks per SM (gate+up: 448 blocks at 32 columns); else 32 rows per
// warp, in 4-warp blocks when there are more blocks than SMs (QKV), else 8-warp blocks (wo and
// down at up to 32 columns: 128 blocks).
template <uint32_t TYPE, int NT, bool GATE_UP>
cudaError_t launch_tile(const F16Tasks& tasks, int n_tasks, int max_rows, const MatvecInputF16& in,
                        const KernelConfig& config, cudaStream_t stream) {
  const int column_tiles = ceil_div(in.batch, 8 * NT);
  const int sms = multiprocessors();
  const int64_t tiles64 =
      working_blocks(tasks, n_tasks, Plan<TYPE, NT, 4, GATE_UP>::kRows, column_tiles);
  if constexpr (NT == 4) {
    const int variant = GATE_UP ? config.f16_mma_shared_gate_up : config.f16_mma_shared_plain;
    if (variant > 0 && shared_variant_fits<TYPE, GATE_UP>(variant))
      return launch_shared_variant<TYPE, GATE_UP>(variant, tasks, n_tasks, max_rows, in, config,
                                                  stream);
  }
  if constexpr (NT >= 2) {
    const bool fits2 = cluster_fits<TYPE, NT, GATE_UP, 2>();
    const bool fits4 = cluster_fits<TYPE, NT, GATE_UP, 4>();
    if (config.f16_mma_clusters && (fits2 || fits4)) {
      switch (pick_cluster(tiles64, sms, fits2, fits4)) {
        case 4:
          return launch_shape<TYPE, NT, 4, GATE_UP, 4, 4>(tasks, n_tasks, max_rows, in, config,
                                                          stream);
        case 2:
          return launch_shape<TYPE, NT, 4, GATE_UP, 4, 2>(tasks, n_tasks, max_rows, in, config,
                                                          stream);
        default:
          return launch_shape<TYPE, NT, 4, GATE_UP, 4>(tasks, n_tasks, max_rows, in, config,
                                                       stream);
      }
    }
  }
  if (tiles64 >= 2 * sms)
    return launch_shape<TYPE, NT, 4, GATE_UP, 4>(tasks, n_tasks, max_rows, in, config, stream);
  if (working_blocks(tasks, n_tasks, Plan<TYPE, NT, 2, GATE_UP>::kRows, column_tiles) > sms)
    return launch_shape<TYPE, NT, 2, GATE_UP, 4>(tasks, n_tasks, max_rows, in, config, stream);
  return launch_shape<TYPE, NT, 2, GATE_UP, 8>(tasks, n_tasks, max_rows, in, config, stream);
}

// 8 columns in one n-tile, 16 in two; more in 32-column tiles (64 columns: two tiles, adjacent
// in blockIdx.x so the second reads the weights from L2).
template <uint32_t TYPE, bool GATE_UP>
cudaError_t launch_type(const F16Tasks& tasks, int n_tasks, int max_rows, const MatvecInputF16& in,
                        const KernelConfig& config, cudaStream_t stream) {
  if (in.batch <= 8)
    return launch_tile<TYPE, 1, GATE_UP>(tasks, n_tasks, max_rows, in, config, stream);
  if (in.batch <= 16)
    return launch_tile<TYPE, 2, GATE_UP>(tasks, n_tasks, max_rows, in, config, stream);
  return launch_tile<TYPE, 4, GATE_UP>(tasks, n_tasks, max_rows, in, config, stream);
}

}  // namespace

bool matvec_f16mma_supports(uint32_t weight_type, bool split_layout) {
  return split_layout && (weight_type == kQ4_0 || weight_type == kQ4_1);
}

bool matvec_f16mma_fits_device() {
  // The code the current device would run: its compute capability and this build's
  // architectures both count (a build for sm_75 only has no f16 mma.sync of this shape).
  cudaFuncAttributes attributes{};
  if (cudaFuncGetAttributes(&attributes, f16mma_matvec_kernel<kQ4_0, 1, 2, false, 4>) !=
      cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  if (attributes.binaryVersion < 80 || attributes.ptxVersion < 80) return false;
  multiprocessors();
  return ready();
}

bool matvec_f16mma_clusters() { return ready() && clusters_fit<kQ4_0>() && clusters_fit<kQ4_1>(); }

cudaError_t launch_matvec_f16mma(uint32_t weight_type, const MatvecTask* tasks, int n_tasks,
                                 const MatvecInputF16& input, const KernelConfig& config,
                                 cudaStream_t stream) {
  if (n_tasks < 1 || n_tasks > kMaxMatvecTasks || input.n_in <= 0 || input.n_in % 32 != 0 ||
      input.batch < 0 || reinterpret_cast<uintptr_t>(input.x) % 16 != 0)
    return cudaErrorInvalidValue;
  F16Tasks packed{};
  int max_rows = 0;
  const bool gate_up = tasks[0].weight_up != nullptr;
  for (int i = 0; i < n_tasks; ++i) {
    const MatvecTask& t = tasks[i];
    if (!matvec_f16mma_supports(weight_type, t.split_layout) || t.y_q8.qs ||
        (t.y_f16 != nullptr && t.accumulate) || (t.weight_up != nullptr) != gate_up ||
        t.row_bytes % 16 != 0 || t.row_bytes < split::row_payload_bytes(weight_type, input.n_in) ||
        reinterpret_cast<uintptr_t>(t.weight) % 16 != 0 ||
        reinterpret_cast<uintptr_t>(t.weight_up) % 16 != 0 || t.n_out < 0)
      return cudaErrorInvalidValue;
    packed.t[i] = t;
    max_rows = std::max(max_rows, t.n_out);
  }
  if (input.batch == 0 || max_rows == 0) return cudaSuccess;
  if (!ready()) return cudaErrorInvalidValue;  // no shared memory for the kernels
  auto run = [&](auto type_tag) -> cudaError_t {
    constexpr uint32_t TYPE = decltype(type_tag)::value;
    return gate_up ? launch_type<TYPE, true>(packed, n_tasks, max_rows, input, config, stream)
                   : launch_type<TYPE, false>(packed, n_tasks, max_rows, input, config, stream);
  };
  switch (weight_type) {
    case kQ4_0:
      return launch_status(run(std::integral_constant<uint32_t, kQ4_0>{}));
    case kQ4_1:
      return launch_status(run(std::integral_constant<uint32_t, kQ4_1>{}));
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace granule::kernels
