// Batched products of split-layout Q4_0/Q4_1 weights (split_layout.h) with f16 activations on
// f16 tensor cores: mma.sync m16n8k16 with f32 accumulation. The Q4 weights are dequantised to
// f16 in registers, their scale applied there (one f16 rounding per weight), so the mma
// accumulates straight into f32 with no per-sub-block epilogue — the Marlin idea. The int8
// kernel (matvec_mma.cu) instead scales every sub-block's int32 result by its weight and
// activation scales: ~12 FP instructions per mma, which makes it issue-bound at 16-64 columns.
//
// The pipeline is matvec_mma.cu's warp-pipelined kernel (mma_tiles.cuh): a block's W warps own
// the same weight rows (MT 16-row m-tiles: 32 or 64 rows; SwiGLU: half gate, half up) and split
// the sub-blocks (warp w takes stages w, w + W, ... of kKs sub-blocks); every warp streams its
// stages through a private ring (weights, weight scales and the f16 activations of those
// sub-blocks for all 8 * NT columns of the block's column tile), waits with cp.async.wait_group +
// __syncwarp only, and the W partial sums meet once at the end in a fixed order. Column tiles of
// the same rows are adjacent in blockIdx.x, so the second tile of 64 columns finds the weights
// in L2.
//
// The SwiGLU gate+up product at 17-64 columns takes the shared-activation shape
// (f16mma_gate_up_kernel): the block's warps form WK groups of WR warps; the WR warps of a group
// own different rows and read one copy of each stage's activations, which the whole group fills
// (a named barrier per stage), so an activation byte from L2 serves WR warps' rows (H200, 8B
// Q4_0, 32 columns: 49.6 us against 57.9 for the one-warp rings). The plain products of an 8B
// model (4,096 rows) have too few row blocks to share activations (kernels/README.md).
//
// k permutation: inside one mma the k order is free as long as A and B agree. Lane (g, t)
// gets word t (bytes 4t..4t+3) of rows g and g + 8 of a sub-block from ldmatrix; byte i holds
// element i (low nibble) and i + 16 (high). k-step 0 of the sub-block takes the low nibbles:
// logical k 2t, 2t + 1 -> elements 4t, 4t + 1 (a0, a1), logical 2t + 8, 2t + 9 -> elements
// 4t + 2, 4t + 3 (a2, a3); k-step 1 the high nibbles, elements 16 + 4t ... The matching B
// fragment of column g is one 8-byte shared load of elements 4t..4t + 3 (b0, b1) — and
// 16 + 4t.. for k-step 1.
//
// Numerics: w16 = f16_rn((q - 8) d) (Q4_0) or f16_rn(q d + m) (Q4_1), one rounding each (the
// integer parts are exact in f16), times the f16 activation (exact in the mma), accumulated in
// f32 by the tensor core and then across warps in f32, in a fixed order.
#include "granule/split_layout.h"
#include "matvec_f16mma.cuh"
#include "mma_tiles.cuh"

namespace granule::kernels {
namespace {

using mma::Tasks;

constexpr int kKs = 2;                  // 32-element sub-blocks per pipeline stage
constexpr int kWarpBudget = 26 * 1024;  // ring bytes per warp (as matvec_mma.cu's)

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

template <uint32_t TYPE, int NT, int MT, bool GATE_UP, int W>
constexpr int kSharedBytes = [] {
  using P = Plan<TYPE, NT, MT, GATE_UP>;
  constexpr int ring = W * P::kWarpBytes;
  constexpr int reduce = (W - 1) * P::kAccumulators * kWarpSize * 4;
  static_assert(reduce <= ring, "the partial sums reuse the rings");
  static_assert(ring <= mma::kMaxBlockShared, "the block's rings fit an H100/H200 block");
  return ring;
}();

// One pipeline stage of one warp: kKs sub-blocks (from `first`, of n per row) of the warp's
// kWeightRows weight rows (at `weights`, kWeightRow bytes apart; their scales at `scales`,
// kScaleRow apart) times the column tile's activations (at `act`, kActRow apart), into acc.
template <class P, uint32_t TYPE, int NT, int MT>
__device__ __forceinline__ void multiply_stage(float (&acc)[MT][NT][4], const uint8_t* weights,
                                               const uint8_t* scales, const uint8_t* act, int first,
                                               int n, int lane) {
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
          const __half2 dm = mma::as_half2(scale[m][h][u]);  // (d, m) of sub-block u
          d = __low2half2(dm);
          mn = __high2half2(dm);
        } else {
          const __half2 dd = mma::as_half2(scale[m][h][0]);  // (d of sub-block 0, of 1)
          d = u == 0 ? __low2half2(dd) : __high2half2(dd);
          mn = d;  // unused
        }
        mma::q4_f16_pairs<TYPE>(words[m][h], d, mn, lo[h], hi[h]);
      }
      const uint32_t a0[4] = {lo[0][0], lo[1][0], lo[0][1], lo[1][1]};
      const uint32_t a1[4] = {hi[0][0], hi[1][0], hi[0][1], hi[1][1]};
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        mma::mma_f16(acc[m][nt], a0, b[nt][0][0], b[nt][0][1]);
        mma::mma_f16(acc[m][nt], a1, b[nt][1][0], b[nt][1][1]);
      }
    }
  }
}

// A warp's copies of one stage (f16mma_gate_up_kernel's; f16mma_matvec_kernel has them
// written out): its weight rows (chunk = lane % kKs of rows lane / kKs + i * 32 / kKs, from
// rows[i]) and their scales (rows lane + 32 i, from scale_rows[i]), to `stage` (weights at 0,
// scales at kScaleOffset).
template <class P>
__device__ __forceinline__ void load_weight_stage(uint8_t* stage, const uint8_t* const* rows,
                                                  const uint8_t* const* scale_rows, int first,
                                                  int n, int lane, int chunk) {
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
}

// Activation chunks thread + i * THREADS (of the tile's kColumns x kActChunksPerColumn 16-byte
// chunks) of the stage from sub-block `first`, to `stage` + OFFSET (kActRow bytes per column).
// (A warp's
// copies index by lane and pass, a group's by chunk: the same chunks; each form keeps the
// instruction stream its kernel was measured with, where ptxas allocates otherwise.)
template <class P, int THREADS, int OFFSET>
__device__ __forceinline__ void load_activation_stage(uint8_t* stage, const MatvecInputF16& in,
                                                      int first_column, int first, int n,
                                                      int thread) {
  constexpr int ACP = P::kActChunksPerColumn, kChunks = P::kColumns * ACP;
  static_assert(THREADS % ACP == 0 && kChunks % THREADS == 0, "whole columns per pass");
#pragma unroll
  for (int i = 0; i < kChunks / THREADS; ++i) {
    const int c = thread + i * THREADS;
    const int column = THREADS == kWarpSize ? thread / ACP + i * (THREADS / ACP) : c / ACP;
    const int part = THREADS == kWarpSize ? thread % ACP : c % ACP;
    const bool valid = first_column + column < in.batch && first + part / 4 < n;
    const __half* src = valid ? in.x + static_cast<int64_t>(first_column + column) * in.n_in +
                                    static_cast<int64_t>(first) * 32 + part * 8
                              : in.x;
    copy_async<16>(stage + OFFSET + column * P::kActRow + part * 16, src, valid);
  }
}

// This lane's weight rows and scale rows of the block's rows from row0 (load_weight_stage).
template <class P>
__device__ __forceinline__ void own_rows(const MatvecTask& task, int row0, int n, int lane,
                                         const uint8_t* (&rows)[P::kWeightCopies],
                                         const uint8_t* (&scale_rows)[P::kScaleCopies]) {
#pragma unroll
  for (int i = 0; i < P::kWeightCopies; ++i)
    rows[i] =
        mma::weight_row<P::kRows, P::kMatrices>(task, row0, lane / kKs + i * (kWarpSize / kKs));
#pragma unroll
  for (int i = 0; i < P::kScaleCopies; ++i)
    scale_rows[i] = mma::weight_row<P::kRows, P::kMatrices>(task, row0, lane + i * kWarpSize) +
                    static_cast<int64_t>(n) * 16;
}

template <uint32_t TYPE, int NT, int MT, bool GATE_UP, int W>
__global__ void __launch_bounds__(kWarpSize* W, 1)
    f16mma_matvec_kernel(Tasks tasks, MatvecInputF16 in) {
  using P = Plan<TYPE, NT, MT, GATE_UP>;
  constexpr int S = P::kStages;
  extern __shared__ __align__(16) uint8_t shared[];

  const MatvecTask& task = tasks.t[blockIdx.y];
  const int column_tiles = (in.batch + P::kColumns - 1) / P::kColumns;
  const int tile = static_cast<int>(blockIdx.x);
  const int row0 = tile / column_tiles * P::kRows;
  if (row0 >= task.n_out) {      // the whole block leaves before any barrier
    wait_for_previous_kernel();  // every block waits (the next kernel relies on the whole grid)
    return;
  }
  const int first_column = tile % column_tiles * P::kColumns;
  const int n = in.n_in / 32;  // sub-blocks per row
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int all_stages = (n + kKs - 1) / kKs;
  const int stages = warp < all_stages ? (all_stages - warp + W - 1) / W : 0;
  uint8_t* const ring = shared + warp * P::kWarpBytes;
  auto first_block = [&](int s) { return (warp + W * s) * kKs; };

  const uint8_t* rows[P::kWeightCopies];
  const uint8_t* scale_rows[P::kScaleCopies];
  own_rows<P>(task, row0, n, lane, rows, scale_rows);
  const int chunk = lane % kKs;
  // load_weight_stage's copies written out: through the helper the compiler orders this
  // kernel's instructions otherwise, and ptxas gives some shapes up to 7 registers more or less.
  auto load_weights = [&](int s) {
    uint8_t* stage = ring + (s % S) * P::kStageBytes;
    const int first = first_block(s);
    const bool valid = first + chunk < n;
#pragma unroll
    for (int i = 0; i < P::kWeightCopies; ++i)
      copy_async<16>(stage + (lane / kKs + i * (kWarpSize / kKs)) * P::kWeightRow + chunk * 16,
                     valid ? rows[i] + static_cast<int64_t>(first + chunk) * 16 : rows[i], valid);
    const bool ok = first < n;  // the scale copy's overread stays in the row padding
#pragma unroll
    for (int i = 0; i < P::kScaleCopies; ++i)
      copy_async<P::kScaleRow>(
          stage + P::kScaleOffset + (lane + i * kWarpSize) * P::kScaleRow,
          ok ? scale_rows[i] + static_cast<int64_t>(first) * P::kScaleBytes : scale_rows[i], ok);
  };
  auto load_activations = [&](int s) {
    load_activation_stage<P, kWarpSize, P::kActOffset>(ring + (s % S) * P::kStageBytes, in,
                                                       first_column, first_block(s), n, lane);
  };

  mma::start_ring<S>(stages, load_weights, load_activations);
  float acc[MT][NT][4];
  mma::zero(acc);
  for (int s = 0; s < stages; ++s) {
    // mma::advance_ring's step written out, as in matvec_mma.cu's warp-pipelined kernel (the
    // compiler orders the kernel's instructions otherwise through the helper).
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

  // The W warps of the block add their partial sums (in a fixed order).
  if constexpr (W > 1) {
    auto slot = [](int j) { return (j - 1) * P::kAccumulators; };
    if (!mma::gather_sums<W>(acc, shared, warp, slot, lane)) return;
  }
  mma::store_tile<P::kTilesPerMatrix, GATE_UP, true>(acc, task, row0, first_column, in.batch, lane);
}

// The shared-activation shape of the SwiGLU gate+up product at 17-64 columns (NT = 4): a
// block's warps form WK groups of WR warps; warp (r, k) owns weight rows r (MT m-tiles each, the
// block WR * kRows output rows) and group k takes stages k, k + WK, ... of the sub-blocks. The
// WR warps of a group read one copy of each stage's activations from shared memory, which the
// whole group fills (cp.async) and meets on a named barrier per stage, so a stage's activation
// bytes from L2 serve WR times the weight rows of the one-warp ring, and the activations' share
// of the shared memory, which limits the one-warp rings to 8 warps per SM, shrinks. The WK
// groups' sums meet at the end as the warps of f16mma_matvec_kernel do (group order).
struct GateUpShape {
  static constexpr int NT = 4, MT = 2, WR = 4, WK = 2, S = 4;
};
template <uint32_t TYPE>
struct GateUpPlan {
  using G = GateUpShape;
  using P = Plan<TYPE, G::NT, G::MT, true>;
  static constexpr int kActStage = P::kColumns * P::kActRow;  // one per group and stage
  static constexpr int kWarpStage = P::kActOffset;            // weights + scales of one warp
  static constexpr int kStageBytes = kActStage + G::WR * kWarpStage;
  static constexpr int kGroupBytes = G::S * kStageBytes;
  static constexpr int kRing = G::WK * kGroupBytes;
  static constexpr int kReduce = (G::WK - 1) * G::WR * P::kAccumulators * kWarpSize * 4;
  static constexpr int kShared = kRing > kReduce ? kRing : kReduce;
  static constexpr int kGroupThreads = G::WR * kWarpSize;
  static_assert(kActStage % 16 == 0 && kWarpStage % 16 == 0, "16-byte aligned stages");
  static_assert(kShared <= mma::kMaxBlockShared, "the block's rings fit an H100/H200 block");
  static_assert(G::WK <= 15, "named barriers 1..15");
};

template <uint32_t TYPE>
__global__ void __launch_bounds__(kWarpSize* GateUpShape::WR* GateUpShape::WK, 1)
    f16mma_gate_up_kernel(Tasks tasks, MatvecInputF16 in) {
  using G = GateUpShape;
  using SP = GateUpPlan<TYPE>;
  using P = typename SP::P;
  constexpr int S = G::S, WR = G::WR, WK = G::WK, NT = G::NT, MT = G::MT;
  extern __shared__ __align__(16) uint8_t shared[];

  const MatvecTask& task = tasks.t[blockIdx.y];
  const int column_tiles = (in.batch + P::kColumns - 1) / P::kColumns;
  const int tile = static_cast<int>(blockIdx.x);
  const int block_row0 = tile / column_tiles * (WR * P::kRows);
  if (block_row0 >= task.n_out) {  // the whole block leaves before any barrier
    wait_for_previous_kernel();    // every block waits (the next kernel relies on the grid)
    return;
  }
  const int first_column = tile % column_tiles * P::kColumns;
  const int n = in.n_in / 32;  // sub-blocks per row
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int r = warp % WR, k = warp / WR;      // rows r, stages k, k + WK, ...
  const int row0 = block_row0 + r * P::kRows;  // may lie past n_out: read clamped, not stored
  const int group_thread = r * kWarpSize + lane;
  const int all_stages = (n + kKs - 1) / kKs;
  const int stages = k < all_stages ? (all_stages - k + WK - 1) / WK : 0;  // uniform in the group
  uint8_t* const ring = shared + k * SP::kGroupBytes;
  auto stage_at = [&](int s) { return ring + (s % S) * SP::kStageBytes; };
  auto warp_at = [&](int s) { return stage_at(s) + SP::kActStage + r * SP::kWarpStage; };
  auto first_block = [&](int s) { return (k + WK * s) * kKs; };

  const uint8_t* rows[P::kWeightCopies];
  const uint8_t* scale_rows[P::kScaleCopies];
  own_rows<P>(task, row0, n, lane, rows, scale_rows);
  const int chunk = lane % kKs;
  auto load_weights = [&](int s) {  // this warp's rows, as f16mma_matvec_kernel's ring
    load_weight_stage<P>(warp_at(s), rows, scale_rows, first_block(s), n, lane, chunk);
  };
  auto load_activations = [&](int s) {  // the group's one copy, spread over its threads
    load_activation_stage<P, SP::kGroupThreads, 0>(stage_at(s), in, first_column, first_block(s), n,
                                                   group_thread);
  };
  auto group_barrier = [&] {  // every thread of group k arrives (named barrier 1 + k)
    asm volatile("bar.sync %0, %1;\n" ::"r"(1 + k), "r"(WR * kWarpSize) : "memory");
  };

  mma::start_ring<S>(stages, load_weights, load_activations);
  float acc[MT][NT][4];
  mma::zero(acc);
  for (int s = 0; s < stages; ++s) {
    mma::advance_ring<S>(s, stages, group_barrier, load_weights, load_activations);
    const uint8_t* w = warp_at(s);
    multiply_stage<P, TYPE, NT, MT>(acc, w, w + P::kScaleOffset, stage_at(s), first_block(s), n,
                                    lane);
  }

  // The WK groups' sums, added in group order by group 0's warps: warp (r, k) keeps its sums
  // from accumulator ((k - 1) WR + r) on.
  auto slot = [&](int j) { return ((j - 1) * WR + r) * P::kAccumulators; };
  if (!mma::gather_sums<WK>(acc, shared, k, slot, lane)) return;
  mma::store_tile<P::kTilesPerMatrix, true, true>(acc, task, row0, first_column, in.batch, lane);
}

template <uint32_t TYPE, int NT, int MT, bool GATE_UP, int W>
cudaError_t allow_shared_bytes() {
  return mma::allow_shared_bytes<f16mma_matvec_kernel<TYPE, NT, MT, GATE_UP, W>,
                                 kSharedBytes<TYPE, NT, MT, GATE_UP, W>>();
}

template <uint32_t TYPE>
cudaError_t allow_gate_up_bytes() {
  return mma::allow_shared_bytes<f16mma_gate_up_kernel<TYPE>, GateUpPlan<TYPE>::kShared>();
}

// The block shapes launch_tile picks from: 64 weight rows per warp in 4-warp blocks, 32 rows in
// 4-warp or 8-warp blocks, for 1, 2 and 4 n-tiles.
template <uint32_t TYPE, bool GATE_UP>
cudaError_t allow_shared_bytes_tiles() {
  return mma::first_error(
      {allow_shared_bytes<TYPE, 1, 4, GATE_UP, 4>(), allow_shared_bytes<TYPE, 1, 2, GATE_UP, 4>(),
       allow_shared_bytes<TYPE, 1, 2, GATE_UP, 8>(), allow_shared_bytes<TYPE, 2, 4, GATE_UP, 4>(),
       allow_shared_bytes<TYPE, 2, 2, GATE_UP, 4>(), allow_shared_bytes<TYPE, 2, 2, GATE_UP, 8>(),
       allow_shared_bytes<TYPE, 4, 4, GATE_UP, 4>(), allow_shared_bytes<TYPE, 4, 2, GATE_UP, 4>(),
       allow_shared_bytes<TYPE, 4, 2, GATE_UP, 8>()});
}

// Whether every kernel got its shared memory; the gate+up shape's is asked here too (before
// any capture), and where it is refused launch_tile takes the one-warp rings instead.
bool ready() {
  static const bool ok = [] {
    if (mma::first_error(
            {allow_shared_bytes_tiles<kQ4_0, false>(), allow_shared_bytes_tiles<kQ4_0, true>(),
             allow_shared_bytes_tiles<kQ4_1, false>(), allow_shared_bytes_tiles<kQ4_1, true>()}) !=
        cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    if (mma::first_error({allow_gate_up_bytes<kQ4_0>(), allow_gate_up_bytes<kQ4_1>()}) !=
        cudaSuccess)
      cudaGetLastError();
    return true;
  }();
  return ok;
}

template <uint32_t TYPE, int NT, int MT, bool GATE_UP, int W>
cudaError_t launch_shape(const Tasks& tasks, int n_tasks, int max_rows, const MatvecInputF16& in,
                         const KernelConfig& config, cudaStream_t stream) {
  using P = Plan<TYPE, NT, MT, GATE_UP>;
  const dim3 grid(ceil_div(max_rows, P::kRows) * ceil_div(in.batch, P::kColumns), n_tasks, 1);
  return mma::launch<f16mma_matvec_kernel<TYPE, NT, MT, GATE_UP, W>,
                     kSharedBytes<TYPE, NT, MT, GATE_UP, W>>(grid, dim3(kWarpSize * W), tasks, in,
                                                             config, stream);
}

// 64 rows per warp where that still gives at least two 4-warp blocks per SM (gate+up: 448
// blocks at 32 columns); else 32 rows per warp, in 4-warp blocks when there are more blocks
// than SMs (QKV), else 8-warp blocks (wo and down at up to 32 columns: 128 blocks). SwiGLU at
// 17-64 columns: the shared-activation shape, where the device gave it its shared memory.
template <uint32_t TYPE, int NT, bool GATE_UP>
cudaError_t launch_tile(const Tasks& tasks, int n_tasks, int max_rows, const MatvecInputF16& in,
                        const KernelConfig& config, cudaStream_t stream) {
  const int column_tiles = ceil_div(in.batch, 8 * NT);
  const int sms = multiprocessors();
  if constexpr (NT == GateUpShape::NT && GATE_UP) {
    if (allow_gate_up_bytes<TYPE>() == cudaSuccess) {
      using P = typename GateUpPlan<TYPE>::P;
      const dim3 grid(ceil_div(max_rows, GateUpShape::WR * P::kRows) * column_tiles, n_tasks, 1);
      return mma::launch<f16mma_gate_up_kernel<TYPE>, GateUpPlan<TYPE>::kShared>(
          grid, dim3(kWarpSize * GateUpShape::WR * GateUpShape::WK), tasks, in, config, stream);
    }
  }
  if (mma::working_blocks(tasks, n_tasks, Plan<TYPE, NT, 4, GATE_UP>::kRows, column_tiles) >=
      2 * sms)
    return launch_shape<TYPE, NT, 4, GATE_UP, 4>(tasks, n_tasks, max_rows, in, config, stream);
  if (mma::working_blocks(tasks, n_tasks, Plan<TYPE, NT, 2, GATE_UP>::kRows, column_tiles) > sms)
    return launch_shape<TYPE, NT, 2, GATE_UP, 4>(tasks, n_tasks, max_rows, in, config, stream);
  return launch_shape<TYPE, NT, 2, GATE_UP, 8>(tasks, n_tasks, max_rows, in, config, stream);
}

// 8 columns in one n-tile, 16 in two; more in 32-column tiles (64 columns: two tiles, adjacent
// in blockIdx.x so the second reads the weights from L2).
template <uint32_t TYPE, bool GATE_UP>
cudaError_t launch_type(const Tasks& tasks, int n_tasks, int max_rows, const MatvecInputF16& in,
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
  if (!mma::has_mma(f16mma_matvec_kernel<kQ4_0, 1, 2, false, 4>)) return false;
  multiprocessors();
  return ready();
}

cudaError_t launch_matvec_f16mma(uint32_t weight_type, const MatvecTask* tasks, int n_tasks,
                                 const MatvecInputF16& input, const KernelConfig& config,
                                 cudaStream_t stream) {
  if (input.n_in <= 0 || input.n_in % 32 != 0 || input.batch < 0 ||
      reinterpret_cast<uintptr_t>(input.x) % 16 != 0)
    return cudaErrorInvalidValue;
  Tasks packed{};
  int max_rows = 0;
  auto valid = [&](const MatvecTask& t) {
    return matvec_f16mma_supports(weight_type, t.split_layout) && !t.y_q8.qs &&
           !(t.y_f16 != nullptr && t.accumulate) &&
           t.row_bytes >= split::row_payload_bytes(weight_type, input.n_in) && t.n_out >= 0;
  };
  if (!mma::pack_tasks(tasks, n_tasks, valid, packed, max_rows)) return cudaErrorInvalidValue;
  if (input.batch == 0 || max_rows == 0) return cudaSuccess;
  if (!ready()) return cudaErrorInvalidValue;  // no shared memory for the kernels
  auto run = [&](auto type_tag) -> cudaError_t {
    constexpr uint32_t TYPE = decltype(type_tag)::value;
    return packed.t[0].weight_up
               ? launch_type<TYPE, true>(packed, n_tasks, max_rows, input, config, stream)
               : launch_type<TYPE, false>(packed, n_tasks, max_rows, input, config, stream);
  };
  return mma::for_type<kQ4_0, kQ4_1>(weight_type, run);
}

}  // namespace granule::kernels
