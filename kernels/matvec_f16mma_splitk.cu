// Batched products of split-layout Q4_0, Q8_0, Q4_K, Q5_K and Q6_K weights with 17-64 f16
// activation columns on f16 tensor cores (mma.sync m16n8k16, f32 accumulation), shaped for HBM
// rather than for one warp.
//
// Why another shape: f16mma_matvec_kernel gives each warp a private ring over 32 (or 64) weight
// rows and the activations of its own sub-blocks, so at 32 columns every weight byte from HBM
// drags 3.6 activation bytes from L2 through shared memory (64 bytes of f16 per k against 18
// bytes of Q4_0 per 32 rows), and a 4,096-row product has only 128 such blocks for 132 SMs,
// each streaming its 8 stages at 8-20 % achieved occupancy (kernels/README.md: 13-27 % of DRAM).
//
// Here a block of 4 warps owns a tile of 128 weight rows (32 per warp, two m-tiles) and every
// column (NT n-tiles of 8: 32 or 64 columns), so one copy of a stage's activations in shared
// memory serves 128 rows (0.9 activation bytes per weight byte). Stages of kKs sub-blocks (the
// 128 rows' quantised values and scales, and the activations) move through a block-wide ring
// of ~100 KB filled by cp.async, two blocks per SM: 60-70 KB of weights in flight per SM. The
// K range of a tile is split over `splits` blocks so that tiles x splits fills every SM slot
// once (4,096 rows: 32 tiles x 8 splits); each split's partial sums go to the workspace, and
// the last block of a tile to arrive (a ticket counter that it resets) adds them in split
// order — from registers for its own — and runs the epilogue (accumulate, SwiGLU, f16
// result), so the bits never depend on which block finished last.
//
// SwiGLU: a tile's 128 weight rows are 64 gate and 64 up rows; warp w owns gate rows 16w..16w+15
// (its m-tile 0) and the same up rows (m-tile 1), so silu(gate) * up meets in registers.
//
// The fragments, k permutation and numerics are f16mma_matvec_kernel's (matvec_f16mma.cu):
// each weight rounded to f16 once, f16((q - 8) d), times the f16 activation exactly, f32
// accumulation in the tensor core, then the splits' sums in f32 in split order.
#include "granule/split_layout.h"
#include "matvec_f16mma_splitk.cuh"
#include "mma_tiles.cuh"

namespace granule::kernels {
namespace {

using mma::Tasks;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kSmShared = 228 * 1024, kBlockReserve = 1024;  // H100/H200 per SM
constexpr int kMinStagesPerSplit = 2;

// One stage of the block's ring (Q4_0 or Q8_0), and the block's shape, for NT n-tiles of 8
// columns.
template <uint32_t TYPE, int NT>
struct Plan {
  static constexpr int MT = 2;                          // m-tiles per warp
  static constexpr int kWeightRows = kWarps * 16 * MT;  // 128 per block
  static constexpr int kColumns = 8 * NT;
  static constexpr int kKs = NT <= 4 ? 4 : 2;                   // sub-blocks per stage
  static constexpr int kQuantBytes = TYPE == kQ8_0 ? 32 : 16;   // per sub-block
  static constexpr int kChunksPerRow = kKs * kQuantBytes / 16;  // 16-byte copies per stage row
  // Weight rows padded by 16 bytes (strides 80, 48 and 144: ldmatrix's 8 row addresses land in
  // 8 different 16-byte bank groups); scales one f16 d per sub-block; activation rows (one per
  // column, kKs x 32 f16) padded to 32 mod 128 bytes (conflict-free 8-byte B loads).
  static constexpr int kWeightRow = kKs * kQuantBytes + 16;
  // Q4_K/Q5_K: the stage's (sc, m) bytes at 0 and the super-block's (d, dmin) at 8 (16 bytes);
  // Q5_K's fifth bits, a u32 per sub-block, in a region of their own.
  // Q6_K: its int8 scales (two per sub-block) at 0 and the aligned f16 pair of d holding the
  // stage's super-block at 8; its high bits, 8 bytes per sub-block, in their own region.
  static constexpr bool kKType = TYPE == kQ4_K || TYPE == kQ5_K || TYPE == kQ6_K;
  static constexpr int kScaleRow = kKType ? 16 : kKs * 2;
  static constexpr int kHighRow = TYPE == kQ5_K ? kKs * 4 : TYPE == kQ6_K ? kKs * 8 : 0;
  static constexpr int kActRow = kKs * 64 + 32;
  static constexpr int kScaleOffset = kWeightRows * kWeightRow;
  static constexpr int kHighOffset = kScaleOffset + kWeightRows * kScaleRow;
  static constexpr int kActOffset = kHighOffset + kWeightRows * kHighRow;
  static constexpr int kStageBytes = kActOffset + kColumns * kActRow;
  // As many stages as let two blocks share an SM.
  static constexpr int kStages = (kSmShared / 2 - kBlockReserve) / kStageBytes;
  static constexpr int kShared = kStages * kStageBytes;
  static constexpr int kAccumulators = MT * NT * 4;
  static constexpr int kPartialFloats = kThreads * kAccumulators;  // per block
  // Per thread and stage: kWeightCopies 16-byte weight chunks, one scale copy, kActCopies
  // activation chunks (4 per sub-block and column).
  static constexpr int kWeightCopies = kWeightRows * kChunksPerRow / kThreads;
  static constexpr int kActChunksPerColumn = kKs * 4;
  static constexpr int kActCopies = kColumns * kActChunksPerColumn / kThreads;
  static_assert(kWeightRows == kThreads, "one scale copy per thread");
  static_assert(kWeightCopies * kThreads == kWeightRows * kChunksPerRow &&
                kThreads % kChunksPerRow == 0);
  static_assert(kActCopies * kThreads == kColumns * kActChunksPerColumn &&
                kThreads % kActChunksPerColumn == 0);
  static_assert(kScaleOffset % 16 == 0 && kHighOffset % 16 == 0 && kActOffset % 16 == 0 &&
                    kStageBytes % 16 == 0 && kWeightRow % 16 == 0 && kActRow % 16 == 0,
                "cp.async and ldmatrix want 16-byte aligned rows");
  static_assert(kActRow % 128 == 32, "conflict-free 8-byte activation loads");
  static_assert(kStages >= 3 && kShared <= mma::kMaxBlockShared, "a ring of 3 stages or more");
};

// Q8_0: bytes 0, 1 and 2, 3 of v (int8 values q) as f16 pairs f16(q d), each rounded once
// (matvec_f16mma.cu's scaled_pairs over q + 128 as the f16 integers 1152 + q, exact).
__device__ __forceinline__ void q8_f16_pairs(uint32_t v, __half2 d, uint32_t (&o)[2]) {
  constexpr uint32_t kHalf2_1152 = 0x64806480u;  // 1024 + 128
  const uint32_t u = v ^ 0x80808080u;            // q + 128, unsigned
  o[0] = mma::as_bits(__hmul2_rn(
      __hsub2_rn(mma::as_half2(__byte_perm(u, 0x64646464u, 0x4140)), mma::as_half2(kHalf2_1152)),
      d));
  o[1] = mma::as_bits(__hmul2_rn(
      __hsub2_rn(mma::as_half2(__byte_perm(u, 0x64646464u, 0x4342)), mma::as_half2(kHalf2_1152)),
      d));
}

// Q5_K (matvec_f16mma.cu's q5_f16_pairs): Q4_1's form f16(q ds + mn), ds = f16(d sc), mn =
// -f16(dmin m), with q = nibble | fifth bit << 4 (0..31, exact); h = the sub-block's qh word >>
// 4t: bits 0-3 the fifth bits of the low elements e..e+3, bits 16-19 those of the high ones.
__device__ __forceinline__ void q5_f16_pairs(uint32_t w, uint32_t h, __half2 d, __half2 mn,
                                             uint32_t (&lo)[2], uint32_t (&hi)[2]) {
  uint32_t o[4];
  mma::unpack_nibbles(w, o);  // (1024 + q) pairs (e, e+1), (e+2, e+3); (1024 + 16 q) high
  o[0] |= ((h << 4) & 0x10u) | ((h << 19) & 0x100000u);    // bits 0, 1: + 16
  o[1] |= ((h << 2) & 0x10u) | ((h << 17) & 0x100000u);    // bits 2, 3
  o[2] |= ((h >> 8) & 0x100u) | ((h << 7) & 0x1000000u);   // bits 16, 17: + 256 (16 x 16)
  o[3] |= ((h >> 10) & 0x100u) | ((h << 5) & 0x1000000u);  // bits 18, 19
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const __half2 ql = __hsub2_rn(mma::as_half2(o[i]), mma::as_half2(mma::kHalf2_1024));
    const __half2 qh = __hfma2(mma::as_half2(o[2 + i]), mma::as_half2(mma::kHalf2_Sixteenth),
                               mma::as_half2(mma::kHalf2_Minus64));
    lo[i] = mma::as_bits(__hfma2(ql, d, mn));
    hi[i] = mma::as_bits(__hfma2(qh, d, mn));
  }
}

// Q4_K/Q5_K: the (sc, m) bytes of two sub-blocks (word v) times the super-block's (d, dmin):
// o[u] = (f16(d sc), -f16(dmin m)) of sub-block u (matvec_f16mma.cu's scale pairs).
__device__ __forceinline__ void k_scale_pairs(uint32_t v, uint32_t d_dmin, uint32_t (&o)[2]) {
  const __half2 dm = mma::as_half2(d_dmin ^ 0x80000000u);  // (d, -dmin)
  o[0] = mma::as_bits(__hmul2_rn(__hsub2_rn(mma::as_half2(__byte_perm(v, 0x64646464u, 0x4140)),
                                            mma::as_half2(mma::kHalf2_1024)),
                                 dm));
  o[1] = mma::as_bits(__hmul2_rn(__hsub2_rn(mma::as_half2(__byte_perm(v, 0x64646464u, 0x4342)),
                                            mma::as_half2(mma::kHalf2_1024)),
                                 dm));
}

// The f16 pairs of bytes 0, 1 and 2, 3 of v minus BIAS (exact f16 integers), times d (one
// rounding each; matvec_f16mma.cu's scaled_pairs).
template <uint32_t BIAS>
__device__ __forceinline__ void biased_scaled_pairs(uint32_t v, __half2 d, uint32_t (&o)[2]) {
  o[0] = mma::as_bits(__hmul2_rn(
      __hsub2_rn(mma::as_half2(__byte_perm(v, 0x64646464u, 0x4140)), mma::as_half2(BIAS)), d));
  o[1] = mma::as_bits(__hmul2_rn(
      __hsub2_rn(mma::as_half2(__byte_perm(v, 0x64646464u, 0x4342)), mma::as_half2(BIAS)), d));
}

// Q6_K (matvec_f16mma.cu's q6_f16_pairs): one ql word (nibbles as Q4's) and the row's qh word
// shifted so that the low elements' two high bits are bits 0-1 of each byte and the high
// elements' bits 4-5: f16((q - 32) ds), dlo for the low elements, dhi for the high ones.
__device__ __forceinline__ void q6_f16_pairs(uint32_t w, uint32_t h, __half2 dlo, __half2 dhi,
                                             uint32_t (&lo)[2], uint32_t (&hi)[2]) {
  constexpr uint32_t kHalf2_1056 = 0x64206420u;  // 1024 + 32
  const uint32_t ql = (w & 0x0F0F0F0Fu) | ((h << 4) & 0x30303030u);
  const uint32_t qh = ((w >> 4) & 0x0F0F0F0Fu) | (h & 0x30303030u);
  biased_scaled_pairs<kHalf2_1056>(ql, dlo, lo);
  biased_scaled_pairs<kHalf2_1056>(qh, dhi, hi);
}

// The launch's split of the K range and its workspace (kernel parameter).
struct Split {
  float* partials = nullptr;  // [tile][split][kPartialFloats]
  int* counters = nullptr;    // [tile]
  int splits = 1;
};

// Tile `tile` of the launch (tiles of kRows output rows, task after task): its task and first
// output row; false past the last tile.
template <int ROWS>
__device__ __forceinline__ bool find_tile(const Tasks& tasks, int n_tasks, int tile, int& task,
                                          int& row0) {
  for (int i = 0; i < n_tasks; ++i) {
    const int tiles = (tasks.t[i].n_out + ROWS - 1) / ROWS;
    if (tile < tiles) {
      task = i;
      row0 = tile * ROWS;
      return true;
    }
    tile -= tiles;
  }
  return false;
}

// Stage row r's source row (gate/up: warp r / 32's m-tile (r / 16) % 2 is gate or up, its rows
// the tile's 16 (r / 32) + r % 16; else row0 + r). Rows past the matrix repeat its last row:
// read, never stored.
template <bool GATE_UP>
__device__ __forceinline__ const uint8_t* stage_row(const MatvecTask& task, int row0, int r) {
  const int out = GATE_UP ? row0 + r / 32 * 16 + r % 16 : row0 + r;
  const int row = min(out, task.n_out - 1);
  const void* matrix = GATE_UP && (r / 16) % 2 == 1 ? task.weight_up : task.weight;
  return static_cast<const uint8_t*>(matrix) + static_cast<int64_t>(row) * task.row_bytes;
}

template <uint32_t TYPE, int NT, bool GATE_UP>
__global__ void __launch_bounds__(kThreads, 2)
    f16mma_splitk_kernel(Tasks tasks, MatvecInputF16 in, Split split, int n_tasks) {
  using P = Plan<TYPE, NT>;
  constexpr int S = P::kStages, KS = P::kKs, MT = P::MT;
  constexpr int kRows = GATE_UP ? P::kWeightRows / 2 : P::kWeightRows;  // output rows per tile
  extern __shared__ __align__(16) uint8_t shared[];
  __shared__ int last_block;

  const int tile = static_cast<int>(blockIdx.x) / split.splits;
  const int part = static_cast<int>(blockIdx.x) % split.splits;
  int task_index = 0, row0 = 0;
  if (!find_tile<kRows>(tasks, n_tasks, tile, task_index, row0)) {
    wait_for_previous_kernel();  // every block waits (the next kernel relies on the whole grid)
    return;
  }
  const MatvecTask& task = tasks.t[task_index];
  const int n = in.n_in / 32;  // sub-blocks per row
  const int all_stages = (n + KS - 1) / KS;
  const int stage0 = static_cast<int>(static_cast<int64_t>(all_stages) * part / split.splits);
  const int stages =
      static_cast<int>(static_cast<int64_t>(all_stages) * (part + 1) / split.splits) - stage0;
  const int thread = threadIdx.x, warp = thread / kWarpSize, lane = thread % kWarpSize;

  // This thread's copies: weight chunk thread % CPR of stage rows thread / CPR + i (kThreads /
  // CPR), CPR = kChunksPerRow; the scales of stage row `thread`; activation chunk part
  // thread % (4 KS) of columns thread / (4 KS) + i (kThreads / (4 KS)).
  constexpr int CPR = P::kChunksPerRow, kChunksPerBlock = P::kQuantBytes / 16;
  const int chunk = thread % CPR;
  const uint8_t* rows[P::kWeightCopies];
#pragma unroll
  for (int i = 0; i < P::kWeightCopies; ++i)
    rows[i] = stage_row<GATE_UP>(task, row0, thread / CPR + i * (kThreads / CPR)) + chunk * 16;
  const uint8_t* scale_row = stage_row<GATE_UP>(task, row0, thread) + split::scales_offset(TYPE, n);
  constexpr int ACP = P::kActChunksPerColumn;
  const int act_part = thread % ACP;
  const __half* act_source = in.x + static_cast<int64_t>(thread / ACP) * in.n_in + act_part * 8;

  auto slot = [&](int s) { return shared + (s % S) * P::kStageBytes; };
  auto first_block = [&](int s) { return (stage0 + s) * KS; };
  auto load_weights = [&](int s) {
    uint8_t* stage = slot(s);
    const int first = first_block(s);
    const bool valid = first + chunk / kChunksPerBlock < n;
#pragma unroll
    for (int i = 0; i < P::kWeightCopies; ++i)
      copy_async<16>(stage + (thread / CPR + i * (kThreads / CPR)) * P::kWeightRow + chunk * 16,
                     valid ? rows[i] + static_cast<int64_t>(first) * P::kQuantBytes : rows[i],
                     valid);
    if constexpr (P::kKType) {
      // Whole super-blocks (n % 8 == 0): a stage lies inside one. Its (sc, m) bytes at first * 2
      // from the scales, the super-block's (d, dmin) 2 n bytes after them, Q5_K's fifth bits
      // 4 n bytes before them.
      // Q6_K: its int8 scales at first * 2, the 4-byte aligned pair of d that holds super-block
      // first / 8's 2 n bytes after them, its high bits 8 n bytes before them.
      uint8_t* to = stage + P::kScaleOffset + thread * P::kScaleRow;
      copy_async<KS * 2>(to, scale_row + static_cast<int64_t>(first) * 2, true);
      copy_async<4>(
          to + 8,
          scale_row + 2 * static_cast<int64_t>(n) + (TYPE == kQ6_K ? first / 16 : first / 8) * 4,
          true);
      constexpr int kHighPerBlock = P::kHighRow / KS;  // 4 (Q5_K) or 8 (Q6_K) bytes
      if constexpr (P::kHighRow > 0) {
        const uint8_t* from = scale_row + static_cast<int64_t>(first - n) * kHighPerBlock;
        uint8_t* high = stage + P::kHighOffset + thread * P::kHighRow;
        constexpr int kCopy = P::kHighRow > 16 ? 16 : P::kHighRow;
#pragma unroll
        for (int c = 0; c < P::kHighRow / kCopy; ++c)
          copy_async<kCopy>(high + c * kCopy, from + c * kCopy, true);
      }
    } else {
      // The stage's scales of the row in one copy; past the row's last sub-block it reads at
      // most 6 bytes into the row's 16-byte stride padding (never used: those sub-blocks are
      // skipped).
      copy_async<P::kScaleRow>(stage + P::kScaleOffset + thread * P::kScaleRow,
                               scale_row + static_cast<int64_t>(first) * 2, true);
    }
  };
  auto load_activations = [&](int s) {
    uint8_t* stage = slot(s);
    const int first = first_block(s);
#pragma unroll
    for (int i = 0; i < P::kActCopies; ++i) {
      const int column = thread / ACP + i * (kThreads / ACP);
      const bool valid = column < in.batch && first + act_part / 4 < n;
      const __half* src = valid
                              ? act_source + static_cast<int64_t>(i) * (kThreads / ACP) * in.n_in +
                                    static_cast<int64_t>(first) * 32
                              : in.x;
      copy_async<16>(stage + P::kActOffset + column * P::kActRow + act_part * 16, src, valid);
    }
  };

  mma::start_ring<S>(stages, load_weights, load_activations);
  float acc[MT][NT][4];
  mma::zero(acc);
  const int g = lane / 4, t = lane % 4;
  for (int s = 0; s < stages; ++s) {
    mma::advance_ring<S>(
        s, stages, [] { __syncthreads(); }, load_weights, load_activations);
    const uint8_t* stage = slot(s);
    const int first = first_block(s);
    // The scales of rows 32 warp + 16 m + g + 8 h, all kKs sub-blocks: Q4_0/Q8_0 f16 d pairs
    // (sub-blocks 2i, 2i + 1 in word i); Q4_K/Q5_K (f16(d sc), -f16(dmin m)) of sub-block u in
    // word u.
    uint32_t d_words[MT][2][P::kKType ? KS : KS / 2];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint8_t* p =
            stage + P::kScaleOffset + (warp * 32 + m * 16 + g + 8 * h) * P::kScaleRow;
        if constexpr (TYPE == kQ6_K) {
          // v.x, v.y: the int8 scales of sub-blocks 0-1, 2-3; v.z: the f16 d of super-blocks
          // 2i, 2i + 1 with the stage's (first / 8) among them. Pairs (f16(d sc_lo), f16(d sc_hi)).
          const uint4 v = *reinterpret_cast<const uint4*>(p);
          const __half2 dd = mma::as_half2(v.z);
          const __half2 d = (first / 8) % 2 == 0 ? __low2half2(dd) : __high2half2(dd);
          constexpr uint32_t kHalf2_1152 = 0x64806480u;  // 1024 + 128: an int8 made unsigned
          uint32_t pair[2];
          biased_scaled_pairs<kHalf2_1152>(v.x ^ 0x80808080u, d, pair);
          d_words[m][h][0] = pair[0];
          d_words[m][h][1] = pair[1];
          if constexpr (KS == 4) {
            biased_scaled_pairs<kHalf2_1152>(v.y ^ 0x80808080u, d, pair);
            d_words[m][h][2] = pair[0];
            d_words[m][h][3] = pair[1];
          }
        } else if constexpr (P::kKType) {
          const uint4 v = *reinterpret_cast<const uint4*>(p);  // (sc, m) x KS, (d, dmin) at 8
          uint32_t pair[2];
          k_scale_pairs(v.x, v.z, pair);
          d_words[m][h][0] = pair[0];
          d_words[m][h][1] = pair[1];
          if constexpr (KS == 4) {
            k_scale_pairs(v.y, v.z, pair);
            d_words[m][h][2] = pair[0];
            d_words[m][h][3] = pair[1];
          }
        } else if constexpr (KS == 4) {
          const uint2 v = *reinterpret_cast<const uint2*>(p);
          d_words[m][h][0] = v.x;
          d_words[m][h][1] = v.y;
        } else {
          d_words[m][h][0] = *reinterpret_cast<const uint32_t*>(p);
        }
      }
#pragma unroll
    for (int u = 0; u < KS; ++u) {
      if (first + u >= n) break;  // block-uniform: past the row's end
      // Q4_0: word t of rows g, g + 8 of both m-tiles (ldmatrix.x4 over the warp's 32 rows):
      // r[0][0..1] m-tile 0, r[0][2..3] m-tile 1. Q8_0: per m-tile, word t of rows g, g + 8 of
      // the sub-block's two 16-byte halves: r[m][0..1] elements 4t.., r[m][2..3] 16 + 4t...
      uint32_t r[TYPE == kQ8_0 ? MT : 1][4];
      if constexpr (TYPE == kQ8_0) {
#pragma unroll
        for (int m = 0; m < MT; ++m)
          load_matrix_x4(r[m], stage + (warp * 32 + m * 16 + lane % 16) * P::kWeightRow + u * 32 +
                                   lane / 16 * 16);
      } else {
        load_matrix_x4(r[0], stage + (warp * 32 + lane) * P::kWeightRow + u * 16);
      }
      // Activation fragments: column 8 nt + g, elements 4t.. (k-step 0) and 16 + 4t.. (k-step 1).
      uint32_t b[NT][2][2];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint8_t* x = stage + P::kActOffset + (nt * 8 + g) * P::kActRow + u * 64 + 8 * t;
        const uint2 k0 = *reinterpret_cast<const uint2*>(x);
        const uint2 k1 = *reinterpret_cast<const uint2*>(x + 32);
        b[nt][0][0] = k0.x;
        b[nt][0][1] = k0.y;
        b[nt][1][0] = k1.x;
        b[nt][1][1] = k1.y;
      }
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        uint32_t lo[2][2], hi[2][2];  // [row g, g + 8][pair]
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if constexpr (P::kKType) {
            const __half2 dm = mma::as_half2(d_words[m][h][u]);
            if constexpr (TYPE == kQ6_K) {
              const uint32_t bits = *reinterpret_cast<const uint32_t*>(
                  stage + P::kHighOffset + (warp * 32 + m * 16 + g + 8 * h) * P::kHighRow + u * 8 +
                  (t % 2) * 4);
              q6_f16_pairs(r[0][2 * m + h], bits >> (2 * (t / 2)), __low2half2(dm),
                           __high2half2(dm), lo[h], hi[h]);
            } else if constexpr (TYPE == kQ5_K) {
              const uint32_t bits = *reinterpret_cast<const uint32_t*>(
                  stage + P::kHighOffset + (warp * 32 + m * 16 + g + 8 * h) * P::kHighRow + u * 4);
              q5_f16_pairs(r[0][2 * m + h], bits >> (4 * t), __low2half2(dm), __high2half2(dm),
                           lo[h], hi[h]);
            } else {
              mma::q4_f16_pairs<kQ4_1>(r[0][2 * m + h], __low2half2(dm), __high2half2(dm), lo[h],
                                       hi[h]);
            }
            continue;
          }
          const __half2 dd = mma::as_half2(d_words[m][h][u / 2]);
          const __half2 d = u % 2 == 0 ? __low2half2(dd) : __high2half2(dd);
          if constexpr (TYPE == kQ8_0) {
            q8_f16_pairs(r[m][h], d, lo[h]);
            q8_f16_pairs(r[m][2 + h], d, hi[h]);
          } else {
            mma::q4_f16_pairs<kQ4_0>(r[0][2 * m + h], d, d, lo[h], hi[h]);
          }
        }
        const uint32_t a0[4] = {lo[0][0], lo[1][0], lo[0][1], lo[1][1]};
        const uint32_t a1[4] = {hi[0][0], hi[1][0], hi[0][1], hi[1][1]};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          if (nt * 8 >= in.batch) break;  // uniform: n-tiles wholly past the batch stay zero
          mma::mma_f16(acc[m][nt], a0, b[nt][0][0], b[nt][0][1]);
          mma::mma_f16(acc[m][nt], a1, b[nt][1][0], b[nt][1][1]);
        }
      }
    }
  }
  wait_copies<0>();

  // The warp's output rows: gate/up 16 from the tile's 16 warp (m-tile 1 the up rows), else 32.
  const int warp_row0 = row0 + warp * (GATE_UP ? 16 : 32);
  constexpr int kTiles = GATE_UP ? 1 : MT;
  if (split.splits > 1) {
    // This split's sums to the workspace; the tile's last block to arrive adds every split's
    // in split order (its own from registers) and stores.
    float* const tile_partials =
        split.partials + static_cast<int64_t>(tile) * split.splits * P::kPartialFloats;
    auto at = [&](int j, int i) {
      return tile_partials + static_cast<int64_t>(j) * P::kPartialFloats + i * kThreads + thread;
    };
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) __stcg(at(part, (m * NT + nt) * 4 + i), acc[m][nt][i]);
    __threadfence();
    __syncthreads();
    if (thread == 0) {
      const int arrived = atomicAdd(&split.counters[tile], 1);
      last_block = arrived == split.splits - 1;
      if (last_block) split.counters[tile] = 0;  // ready for the next launch
    }
    __syncthreads();
    if (!last_block) return;
    __threadfence();
    float sum[MT][NT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i)
          sum[m][nt][i] = part == 0 ? acc[m][nt][i] : __ldcg(at(0, (m * NT + nt) * 4 + i));
      }
    }
    // Unrolled so that several splits' loads are in flight at once (each an L2 round trip).
#pragma unroll(NT <= 4 ? 4 : 2)
    for (int j = 1; j < split.splits; ++j)
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i)
            sum[m][nt][i] += j == part ? acc[m][nt][i] : __ldcg(at(j, (m * NT + nt) * 4 + i));
    mma::store_tile<kTiles, GATE_UP, true>(sum, task, warp_row0, 0, in.batch, lane);
    return;
  }
  mma::store_tile<kTiles, GATE_UP, true>(acc, task, warp_row0, 0, in.batch, lane);
}

template <uint32_t TYPE, int NT, bool GATE_UP>
cudaError_t allow_shared_bytes() {
  return mma::allow_shared_bytes<f16mma_splitk_kernel<TYPE, NT, GATE_UP>,
                                 Plan<TYPE, NT>::kShared>();
}

// Blocks of the kernel an SM holds at once (2 by design; asked once).
template <uint32_t TYPE, int NT, bool GATE_UP>
int blocks_per_sm() {
  static const int blocks = [] {
    int b = 0;
    if (allow_shared_bytes<TYPE, NT, GATE_UP>() != cudaSuccess ||  // occupancy counts it
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, f16mma_splitk_kernel<TYPE, NT, GATE_UP>,
                                                      kThreads,
                                                      Plan<TYPE, NT>::kShared) != cudaSuccess) {
      cudaGetLastError();
      return 1;
    }
    return b < 1 ? 1 : b;
  }();
  return blocks;
}

// The shapes of one type: (32 or 64 columns) x (plain or SwiGLU).
template <uint32_t TYPE>
cudaError_t allow_type() {
  return mma::first_error(
      {allow_shared_bytes<TYPE, 4, false>(), allow_shared_bytes<TYPE, 4, true>(),
       allow_shared_bytes<TYPE, 8, false>(), allow_shared_bytes<TYPE, 8, true>()});
}
template <uint32_t TYPE>
int most_blocks_per_sm() {
  return std::max({blocks_per_sm<TYPE, 4, false>(), blocks_per_sm<TYPE, 4, true>(),
                   blocks_per_sm<TYPE, 8, false>(), blocks_per_sm<TYPE, 8, true>()});
}

// SM slots of the widest-occupancy shape (the workspace is sized for it).
int most_slots() {
  return std::max({most_blocks_per_sm<kQ4_0>(), most_blocks_per_sm<kQ8_0>(),
                   most_blocks_per_sm<kQ4_K>(), most_blocks_per_sm<kQ5_K>(),
                   most_blocks_per_sm<kQ6_K>()}) *
         multiprocessors();
}

bool ready() {
  static const bool ok = [] {
    if (mma::first_error({allow_type<kQ4_0>(), allow_type<kQ8_0>(), allow_type<kQ4_K>(),
                          allow_type<kQ5_K>(), allow_type<kQ6_K>()}) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    most_slots();
    return true;
  }();
  return ok;
}

template <uint32_t TYPE, int NT, bool GATE_UP>
cudaError_t launch_shape(const Tasks& tasks, int n_tasks, const MatvecInputF16& in,
                         const F16MmaSplitWorkspace& workspace, const KernelConfig& config,
                         cudaStream_t stream, int max_splits) {
  using P = Plan<TYPE, NT>;
  constexpr int kRows = GATE_UP ? P::kWeightRows / 2 : P::kWeightRows;
  int tiles = 0;
  for (int i = 0; i < n_tasks; ++i) tiles += ceil_div(tasks.t[i].n_out, kRows);
  const int all_stages = ceil_div(in.n_in / 32, P::kKs);
  // Every SM slot once: tiles x splits <= slots, each split at least kMinStagesPerSplit
  // stages, within the workspace.
  const int slots = blocks_per_sm<TYPE, NT, GATE_UP>() * multiprocessors();
  int splits = slots / tiles;
  splits = std::min(splits, all_stages / kMinStagesPerSplit);
  if (max_splits > 0) splits = std::min(splits, max_splits);
  if (workspace.partials == nullptr || workspace.counters == nullptr ||
      workspace.n_counters < tiles)
    splits = 1;
  splits = static_cast<int>(std::min<int64_t>(
      splits, workspace.partial_floats / (static_cast<int64_t>(tiles) * P::kPartialFloats)));
  splits = std::max(splits, 1);
  Split split;
  split.splits = splits;
  split.partials = workspace.partials;
  split.counters = workspace.counters;
  const dim3 grid(tiles * splits);
  return launch_early_shared(f16mma_splitk_kernel<TYPE, NT, GATE_UP>, grid, dim3(kThreads),
                             P::kShared, config, stream, tasks, in, split, n_tasks);
}

template <uint32_t TYPE>
cudaError_t launch_type(const Tasks& tasks, int n_tasks, const MatvecInputF16& in,
                        const F16MmaSplitWorkspace& workspace, const KernelConfig& config,
                        cudaStream_t stream, int max_splits) {
  const bool gate_up = tasks.t[0].weight_up != nullptr;
  if (in.batch <= Plan<TYPE, 4>::kColumns)
    return gate_up ? launch_shape<TYPE, 4, true>(tasks, n_tasks, in, workspace, config, stream,
                                                 max_splits)
                   : launch_shape<TYPE, 4, false>(tasks, n_tasks, in, workspace, config, stream,
                                                  max_splits);
  return gate_up ? launch_shape<TYPE, 8, true>(tasks, n_tasks, in, workspace, config, stream,
                                               max_splits)
                 : launch_shape<TYPE, 8, false>(tasks, n_tasks, in, workspace, config, stream,
                                                max_splits);
}

}  // namespace

bool matvec_f16mma_splitk_supports(uint32_t weight_type, bool split_layout) {
  return split_layout && (weight_type == kQ4_0 || weight_type == kQ8_0 || weight_type == kQ4_K ||
                          weight_type == kQ5_K || weight_type == kQ6_K);
}

bool matvec_f16mma_splitk_fits_device() {
  if (!mma::has_mma(f16mma_splitk_kernel<kQ4_0, 4, false>)) return false;
  multiprocessors();
  return ready();
}

int64_t matvec_f16mma_splitk_partial_floats() {
  // tiles x splits <= slots whenever splits > 1; the widest partials are NT = 8's.
  return static_cast<int64_t>(most_slots()) * Plan<kQ4_0, 8>::kPartialFloats;
}

int matvec_f16mma_splitk_counters() { return most_slots(); }  // splits > 1: tiles <= slots / 2

cudaError_t launch_matvec_f16mma_splitk(uint32_t weight_type, const MatvecTask* tasks, int n_tasks,
                                        const MatvecInputF16& input,
                                        const F16MmaSplitWorkspace& workspace,
                                        const KernelConfig& config, cudaStream_t stream,
                                        int max_splits) {
  if (input.n_in <= 0 || input.n_in % split::block_elements(weight_type) != 0 || input.batch < 0 ||
      input.batch > Plan<kQ4_0, 8>::kColumns || max_splits < 0 ||
      reinterpret_cast<uintptr_t>(input.x) % 16 != 0)
    return cudaErrorInvalidValue;
  Tasks packed{};
  int max_rows = 0;
  auto valid = [&](const MatvecTask& t) {
    return matvec_f16mma_splitk_supports(weight_type, t.split_layout) && !t.y_q8.qs &&
           !(t.y_f16 != nullptr && t.accumulate) &&
           t.row_bytes >= split::row_payload_bytes(weight_type, input.n_in) && t.n_out >= 0;
  };
  if (!mma::pack_tasks(tasks, n_tasks, valid, packed, max_rows)) return cudaErrorInvalidValue;
  if (input.batch == 0 || max_rows == 0) return cudaSuccess;
  if (!ready()) return cudaErrorInvalidValue;  // no shared memory for the kernels
  // Tasks without rows would hold no tile; drop them (the kernel finds tiles task by task).
  Tasks live{};
  int n_live = 0;
  for (int i = 0; i < n_tasks; ++i)
    if (packed.t[i].n_out > 0) live.t[n_live++] = packed.t[i];
  auto run = [&](auto type_tag) -> cudaError_t {
    constexpr uint32_t TYPE = decltype(type_tag)::value;
    return launch_type<TYPE>(live, n_live, input, workspace, config, stream, max_splits);
  };
  return mma::for_type<kQ4_0, kQ8_0, kQ4_K, kQ5_K, kQ6_K>(weight_type, run);
}

}  // namespace granule::kernels
