// Batched products of split-layout Q4_0/Q4_1/Q8_0/Q4_K/Q5_K/Q6_K/Q2_K/Q3_K/IQ4_NL/IQ4_XS/MXFP4
// weights (split_layout.h) with int8 activation blocks (ActivationQ8) on int8 tensor cores:
// mma.sync m16n8k32 (Q4_K: Q4_1's unsigned nibbles, with the sub-block's d * sc and dmin * m;
// Q5_K: the same with the fifth bit in bit 4 of each byte, split_unpack.h; Q6_K and Q3_K: two
// m16n8k16, one per 16-element scale; Q2_K: a second m16n8k32 for its mins; IQ4_NL/IQ4_XS/MXFP4:
// the nibbles' int8 levels, split_unpack.h), so one mma is 16 weight rows x 8 batch columns x one
// 32-element sub-block, and its int32 result is scaled by the sub-block's weight and activation
// scales and accumulated in f32 — the split dp4a kernel's numerics per sub-block, in another
// summation order. Batch columns past the batch are zero-filled, never read; rows past a matrix's end
// repeat its last row and are never written. More than 64 columns take further column tiles in
// grid z. Two kernels (mma_tiles.cuh has the pieces they share with matvec_f16mma.cu):
//
// Warp-pipelined (what a device with ~208 KB of shared memory per block runs: H100/H200). Every
// warp streams its own sub-blocks through a private shared-memory ring filled by cp.async
// (weights and the activations of those sub-blocks), waits with cp.async.wait_group + __syncwarp
// only, and loads its fragments with ldmatrix; the block's warps split the sub-blocks of the
// same 32 weight rows (stage i of warp w covers sub-blocks (w + W i) * KS ..) and meet once, at
// the end, in a fixed-order reduction. No block barrier runs in the main loop.
//
// Block-staged (every other device with int8 mma: the consumer GPUs' 100 KB per block). A
// block owns 16 * WM weight rows and 8 * NT columns; its WM x WK warps split the rows (16 each)
// and the sub-blocks of each stage (WK ways); the stages are the block's, kStageBlocks
// sub-blocks each, behind a __syncthreads. Q4_K, Q5_K, Q6_K, Q2_K, Q3_K and the 16-level types
// (IQ4_NL, IQ4_XS, MXFP4: their nibbles are indices into a table of int8 levels) take the dp4a
// kernel there (the K types' super-block scales are not in its stages).
#include "granule/split_layout.h"
#include "matvec_mma.cuh"
#include "mma_tiles.cuh"
#include "split_unpack.h"

namespace granule::kernels {
namespace {

using mma::Tasks;

constexpr int kRowPad = 16;         // bytes after each shared-memory row: conflict-free fragments
constexpr float kQ4_0Bias = -8.0f;  // Q4_0 values are q - 8, q unsigned in the fragments

// Per sub-block and row (Q6_K: ql; Q2_K/Q3_K: the 2-bit values).
template <uint32_t TYPE>
constexpr int kQuantBytes = TYPE == kQ8_0 ? 32 : TYPE == kQ2_K || TYPE == kQ3_K ? 8 : 16;
// f16 d (and m); Q6_K/Q3_K: two int8 scales; Q2_K: two scale/min bytes; Q4_K/Q5_K: the
// unpacked 6-bit scale and min bytes; IQ4_XS: one int8 scale; MXFP4: one E8M0 byte.
template <uint32_t TYPE>
constexpr int kScaleBytes = TYPE == kQ4_1 ? 4 : TYPE == kIQ4_XS || TYPE == kMXFP4 ? 1 : 2;
// The 16-level types (nibbles through a table of int8 levels: split_unpack.h), which only the
// warp-pipelined kernel runs (the block-staged one hands them to the dp4a kernel, as Q6_K).
constexpr bool is_level_type(uint32_t type) {
  return type == kIQ4_NL || type == kIQ4_XS || type == kMXFP4;
}
// Q4_K and Q5_K: unsigned q (0..15, 0..31) with a per-sub-block scale d * sc and min dmin * m
// from the super-block's (d, dmin) and the sub-block's unpacked (sc, m) bytes.
constexpr bool is_min_k_type(uint32_t type) { return type == kQ4_K || type == kQ5_K; }
// The types only the warp-pipelined kernel runs.
constexpr bool piped_only(uint32_t type) {
  return type == kQ6_K || type == kQ2_K || type == kQ3_K || is_min_k_type(type) ||
         is_level_type(type);
}

// ---------------------------------------------------------------------------------------------
// Block-staged.
namespace staged {

constexpr int kStageBlocks = 8;  // 32-element sub-blocks per pipeline stage

// Shared-memory layout of one stage, and the block's shape.
template <uint32_t TYPE, int NT, int WM, int WK, bool GATE_UP>
struct Tile {
  static constexpr int kMatrices = GATE_UP ? 2 : 1;
  static constexpr int kQuantBytes = kernels::kQuantBytes<TYPE>;
  static constexpr int kScaleBytes = kernels::kScaleBytes<TYPE>;
  static constexpr int kRows = 16 * WM;
  static constexpr int kColumns = 8 * NT;
  static constexpr int kThreads = kWarpSize * WM * WK;
  static constexpr int kQuantRow = kStageBlocks * kQuantBytes + kRowPad;
  static constexpr int kScaleRow = kStageBlocks * kScaleBytes;
  static constexpr int kActRow = kStageBlocks * kQ8Block + kRowPad;
  static constexpr int kScaleOffset = kMatrices * kRows * kQuantRow;
  static constexpr int kActOffset = kScaleOffset + kMatrices * kRows * kScaleRow;
  static constexpr int kDsOffset = kActOffset + kColumns * kActRow;  // [sub-block][column]
  static constexpr int kStageBytes = kDsOffset + kStageBlocks * kColumns * 8;
  static constexpr int kStages = 4 * kStageBytes <= 112 * 1024 ? 4 : 3;
  static constexpr int kAccumulators = kMatrices * NT * 4;
  static constexpr int kReduceBytes = (WK - 1) * WM * kWarpSize * kAccumulators * 4;
  static constexpr int kSharedBytes =
      kStages * kStageBytes > kReduceBytes ? kStages* kStageBytes : kReduceBytes;
  static_assert(kQuantRow % 16 == 0 && kActRow % 16 == 0 && kScaleRow % 16 == 0 &&
                    kActOffset % 16 == 0 && kDsOffset % 16 == 0 && kStageBytes % 16 == 0,
                "cp.async writes 16-byte chunks");
  static_assert(kStageBlocks % WK == 0, "each warp takes whole sub-blocks of a stage");
};

// The weights of one stage (sub-blocks first_block ..): quantised values and scales of the
// block's rows of each matrix. Sub-blocks past the row's end are not read (their shared
// bytes are never used); a scale chunk that starts inside the row stays inside its stride.
template <class T>
__device__ __forceinline__ void load_weight_stage(uint8_t* stage, const uint8_t* const* weights,
                                                  int64_t row_bytes, int row0, int n_out, int n,
                                                  int first_block) {
  constexpr int kQuantChunks = kStageBlocks * T::kQuantBytes / 16;  // per row
  constexpr int kScaleChunks = T::kScaleRow / 16;
  constexpr int kAll = T::kMatrices * T::kRows * kQuantChunks;
  constexpr int kAllScales = T::kMatrices * T::kRows * kScaleChunks;
#pragma unroll
  for (int c = threadIdx.x; c < kAll; c += T::kThreads) {
    const int mr = c / kQuantChunks, chunk = c % kQuantChunks;
    const int row = min(row0 + mr % T::kRows, n_out - 1);
    const bool valid = first_block + chunk * 16 / T::kQuantBytes < n;
    const uint8_t* src =
        (mr < T::kRows ? weights[0] : weights[T::kMatrices - 1]) + row * row_bytes +
        (valid ? static_cast<int64_t>(first_block) * T::kQuantBytes + chunk * 16 : 0);
    copy_async<16>(stage + mr * T::kQuantRow + chunk * 16, src, valid);
  }
#pragma unroll
  for (int c = threadIdx.x; c < kAllScales; c += T::kThreads) {
    const int mr = c / kScaleChunks, chunk = c % kScaleChunks;
    const int row = min(row0 + mr % T::kRows, n_out - 1);
    const bool valid = first_block + chunk * 16 / T::kScaleBytes < n;
    const uint8_t* src =
        (mr < T::kRows ? weights[0] : weights[T::kMatrices - 1]) + row * row_bytes +
        (valid ? static_cast<int64_t>(n) * T::kQuantBytes +
                     static_cast<int64_t>(first_block) * T::kScaleBytes + chunk * 16
               : 0);
    copy_async<16>(stage + T::kScaleOffset + mr * T::kScaleRow + chunk * 16, src, valid);
  }
}

// The activations of one stage: int8 values and (d, d * sum) of the block's columns.
template <class T>
__device__ __forceinline__ void load_activation_stage(uint8_t* stage, const MatvecInput& in,
                                                      int first_column, int n, int first_block) {
  constexpr int kChunks = kQ8Block / 16 * kStageBlocks;  // per column
#pragma unroll
  for (int c = threadIdx.x; c < T::kColumns * kChunks; c += T::kThreads) {
    const int column = c / kChunks, chunk = c % kChunks;
    const int block = first_block + chunk / 2;
    const bool valid = first_column + column < in.batch && block < n;
    const int8_t* src = valid ? in.xq.qs + static_cast<int64_t>(first_column + column) * in.n_in +
                                    static_cast<int64_t>(first_block) * kQ8Block + chunk * 16
                              : in.xq.qs;
    copy_async<16>(stage + T::kActOffset + column * T::kActRow + chunk * 16, src, valid);
  }
#pragma unroll
  for (int c = threadIdx.x; c < T::kColumns * kStageBlocks; c += T::kThreads) {
    const int column = c % T::kColumns, sub = c / T::kColumns;
    const bool valid = first_column + column < in.batch && first_block + sub < n;
    const float2* src =
        valid ? in.xq.ds + static_cast<int64_t>(first_column + column) * n + first_block + sub
              : in.xq.ds;
    copy_async<8>(stage + T::kDsOffset + (sub * T::kColumns + column) * 8, src, valid);
  }
}

template <uint32_t TYPE, int NT, int WM, int WK, bool GATE_UP>
__global__ void __launch_bounds__(kWarpSize* WM* WK)
    mma_staged_kernel(Tasks tasks, MatvecInput in) {
  using T = Tile<TYPE, NT, WM, WK, GATE_UP>;
  constexpr int M = T::kMatrices;
  constexpr int S = T::kStages;
  extern __shared__ __align__(16) uint8_t shared[];

  const MatvecTask& task = tasks.t[blockIdx.y];
  const int row0 = static_cast<int>(blockIdx.x) * T::kRows;
  if (row0 >= task.n_out) return;  // the whole block leaves before any barrier
  const int first_column = static_cast<int>(blockIdx.z) * T::kColumns;
  const int n = in.n_in / kQ8Block;
  const int stages = (n + kStageBlocks - 1) / kStageBlocks;
  const uint8_t* weights[M];
  weights[0] = static_cast<const uint8_t*>(task.weight);
  if constexpr (GATE_UP) weights[1] = static_cast<const uint8_t*>(task.weight_up);
  auto load_weights = [&](int s) {
    load_weight_stage<T>(shared + (s % S) * T::kStageBytes, weights, task.row_bytes, row0,
                         task.n_out, n, s * kStageBlocks);
  };
  auto load_activations = [&](int s) {
    load_activation_stage<T>(shared + (s % S) * T::kStageBytes, in, first_column, n,
                             s * kStageBlocks);
  };

  mma::start_ring<S>(stages, load_weights, load_activations);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int wm = warp % WM, wk = warp / WM;
  const int g = lane / 4, t = lane % 4;  // the mma fragments' group and thread in group
  float acc[M][NT][4];
  mma::zero(acc);

  for (int s = 0; s < stages; ++s) {
    // The block's barrier: stage s landed for every thread; stage s - 1 is free again.
    mma::advance_ring<S>(
        s, stages, [] { __syncthreads(); }, load_weights, load_activations);
    const uint8_t* stage = shared + (s % S) * T::kStageBytes;
#pragma unroll
    for (int sub = wk; sub < kStageBlocks; sub += WK) {
      if (s * kStageBlocks + sub >= n) break;  // warp-uniform: past the row's end
      uint32_t a[M][4];
      float d[M][2], dm[M][2];  // per row g, g + 8: the weight scale and the min term
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const uint8_t* q =
            stage + (m * T::kRows + wm * 16 + g) * T::kQuantRow + sub * T::kQuantBytes + 4 * t;
        const uint8_t* sc = stage + T::kScaleOffset + (m * T::kRows + wm * 16 + g) * T::kScaleRow +
                            sub * T::kScaleBytes;
        if constexpr (TYPE == kQ8_0) {
          a[m][0] = *reinterpret_cast<const uint32_t*>(q);
          a[m][1] = *reinterpret_cast<const uint32_t*>(q + 8 * T::kQuantRow);
          a[m][2] = *reinterpret_cast<const uint32_t*>(q + 16);
          a[m][3] = *reinterpret_cast<const uint32_t*>(q + 8 * T::kQuantRow + 16);
        } else {
          mma::q4_int8_fragment(a[m], *reinterpret_cast<const uint32_t*>(q),
                                *reinterpret_cast<const uint32_t*>(q + 8 * T::kQuantRow));
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint8_t* p = sc + h * 8 * T::kScaleRow;
          d[m][h] = half_bits_to_float(*reinterpret_cast<const uint16_t*>(p));
          // Q4_0 values are q - 8 (q unsigned here): -8 d per unit of the activation sum;
          // Q4_1 adds m; Q8_0 has none.
          dm[m][h] = TYPE == kQ4_1   ? half_bits_to_float(*reinterpret_cast<const uint16_t*>(p + 2))
                     : TYPE == kQ4_0 ? kQ4_0Bias * d[m][h]
                                     : 0.0f;
        }
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint8_t* x =
            stage + T::kActOffset + (nt * 8 + g) * T::kActRow + sub * kQ8Block + 4 * t;
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(x);
        const uint32_t b1 = *reinterpret_cast<const uint32_t*>(x + 16);
        // (d, d * sum) of columns 2t and 2t + 1 of this n-tile.
        const float4 ds = *reinterpret_cast<const float4*>(
            stage + T::kDsOffset + (sub * T::kColumns + nt * 8 + 2 * t) * 8);
#pragma unroll
        for (int m = 0; m < M; ++m) {
          int c[4];
          mma::mma_s8(c, a[m], b0, b1, 0);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float da = (i & 1) ? ds.z : ds.x;
            float v = d[m][i / 2] * (da * static_cast<float>(c[i]));
            if constexpr (TYPE != kQ8_0) v = fmaf(dm[m][i / 2], (i & 1) ? ds.w : ds.y, v);
            acc[m][nt][i] += v;
          }
        }
      }
    }
  }

  // The WK warps of a row group add their partial sums (in a fixed order).
  if constexpr (WK > 1) {
    auto slot = [&](int k) { return ((k - 1) * WM + wm) * T::kAccumulators; };
    if (!mma::gather_sums<WK, true>(acc, shared, wk, slot, lane)) return;
  }
  mma::store_tile<1, GATE_UP, false>(acc, task, row0 + wm * 16, first_column, in.batch, lane);
}

// Warps along rows x along sub-blocks per n-tile count: few columns want many blocks (rows
// are the only parallelism), many columns want more rows per block so each activation
// byte staged serves more weights.
template <uint32_t TYPE, int NT, bool GATE_UP>
struct Shape {
  static constexpr int kWm = NT <= 2 ? 1 : NT <= 4 ? 2 : 4;
  static constexpr int kWk = NT <= 4 ? 4 : 2;
  using T = Tile<TYPE, NT, kWm, kWk, GATE_UP>;
  static constexpr auto kKernel = mma_staged_kernel<TYPE, NT, kWm, kWk, GATE_UP>;
};

template <uint32_t TYPE, bool GATE_UP>
cudaError_t allow_shared_bytes() {
  auto allow = [](auto nt) {
    using S = Shape<TYPE, decltype(nt)::value, GATE_UP>;
    return mma::allow_shared_bytes<S::kKernel, S::T::kSharedBytes>();
  };
  return mma::first_error(
      {allow(std::integral_constant<int, 1>{}), allow(std::integral_constant<int, 2>{}),
       allow(std::integral_constant<int, 4>{}), allow(std::integral_constant<int, 8>{})});
}

template <uint32_t TYPE, int NT, bool GATE_UP>
cudaError_t launch_tile(const Tasks& tasks, int n_tasks, int max_rows, const MatvecInput& in,
                        const KernelConfig& config, cudaStream_t stream) {
  using S = Shape<TYPE, NT, GATE_UP>;
  const dim3 grid(ceil_div(max_rows, S::T::kRows), n_tasks, ceil_div(in.batch, S::T::kColumns));
  return mma::launch<S::kKernel, S::T::kSharedBytes>(grid, dim3(S::T::kThreads), tasks, in, config,
                                                     stream);
}

}  // namespace staged

// ---------------------------------------------------------------------------------------------
// Warp-pipelined.
namespace piped {

constexpr uint32_t kMagicBits = 0x4B400000u;  // 1.5 * 2^23 as f32 bits: ulp 1 in [2^23, 2^24)
constexpr float kMagic = 12582912.0f;
constexpr int kWeightTiles = 2;         // 16-row weight tiles per warp (over gate and up)
constexpr int kWarpBudget = 26 * 1024;  // ring bytes per warp: 4 warps = 104 KB, 2 blocks per SM

template <uint32_t TYPE, int NT, bool GATE_UP>
struct Plan {
  static constexpr int kMatrices = GATE_UP ? 2 : 1;
  static constexpr int kRowTiles = kWeightTiles / kMatrices;  // per matrix
  static constexpr int kRows = 16 * kRowTiles;                // output rows per block
  static constexpr int kWeightRows = 16 * kWeightTiles;       // 32: one row per lane
  static constexpr int kColumns = 8 * NT;
  static constexpr int kKs = NT <= 2 ? 4 : 2;  // 32-element sub-blocks per stage
  static constexpr int kQuantBytes = kernels::kQuantBytes<TYPE>;
  static constexpr int kScaleBytes = kernels::kScaleBytes<TYPE>;
  // Shared rows padded by 16 bytes: ldmatrix's 8 row addresses land in 8 different 16-byte
  // bank groups (strides 48, 80, 144, 272 are all 16 mod 32 or odd multiples of 16 mod 128).
  static constexpr int kWeightRow = kKs * kQuantBytes + kRowPad;
  // IQ4_XS/MXFP4 (a byte per sub-block): the aligned 4 bytes holding the stage's kKs (2 or 4)
  // scales, as one 4-byte copy (cp.async copies 4, 8 or 16 bytes).
  static constexpr bool kByteScales = kScaleBytes == 1;
  static constexpr int kScaleRow = kByteScales ? 4 : kKs * kScaleBytes;  // 4, 8, 16 bytes
  static constexpr int kScaleCopy = kScaleRow < 16 ? kScaleRow : 16;
  static constexpr int kActRow = kKs * kQ8Block + kRowPad;
  static constexpr int kScaleOffset = kWeightRows * kWeightRow;
  // Q6_K (split_layout.h): the quantised bytes above are ql; the scale region holds the two
  // int8 scales per sub-block; then qh (8 bytes per sub-block) and the super-block's f16 d
  // (4 bytes: the aligned pair of d values holding it; a stage never crosses a super-block).
  // IQ4_XS and Q3_K: the super-block's f16 d as Q6_K's; Q2_K, Q4_K and Q5_K: its (d, dmin).
  // Q3_K and Q5_K: qh as Q6_K's (4 bytes per sub-block). Q4_K/Q5_K's scale region: the
  // sub-block's (sc, m) bytes.
  static constexpr bool kQ6 = TYPE == kQ6_K;
  static constexpr bool kTwoBit = TYPE == kQ2_K || TYPE == kQ3_K;
  static constexpr bool kSuperD = kQ6 || kTwoBit || TYPE == kIQ4_XS || is_min_k_type(TYPE);
  static constexpr int kQhRow = kQ6 ? kKs * 8 : TYPE == kQ3_K || TYPE == kQ5_K ? kKs * 4 : 0;
  static constexpr int kQhOffset = kScaleOffset + kWeightRows * kScaleRow;
  static constexpr int kD6Offset = kQhOffset + kWeightRows * kQhRow;
  static constexpr int kActOffset = kD6Offset + (kSuperD ? kWeightRows * 4 : 0);
  static constexpr int kDsOffset = kActOffset + kColumns * kActRow;  // float2 [column][kKs]
  static constexpr int kStageBytes = kDsOffset + kColumns * kKs * 8;
  static constexpr int kStagesFit = kWarpBudget / kStageBytes;
  static constexpr int kStages = kStagesFit > 6 ? 6 : kStagesFit;
  static constexpr int kWarpBytes = kStages * kStageBytes;
  static constexpr int kAccumulators = kWeightTiles * NT * 4;
  // Per lane and stage: 16-byte weight chunks (one row each), activation chunks, scales.
  static constexpr int kChunksPerRow = kKs * kQuantBytes / 16;     // 2, 4 or 8
  static constexpr int kActChunksPerColumn = kKs * kQ8Block / 16;  // 4 or 8
  static constexpr int kActChunks = kColumns * kActChunksPerColumn / kWarpSize;
  static constexpr int kDsCopies = kColumns * kKs / kWarpSize;
  // Warps per block: 4 (two blocks per SM, so one block's ring fills while the other's
  // drains) when there are more blocks than SMs, else 8 (one block per SM, twice the bytes in
  // flight for the few blocks of a short matrix). SwiGLU's matrices always have many rows.
  static constexpr int kWideWarps = GATE_UP ? 4 : 8;
  static_assert(kStages >= 3, "at least two stages in flight while one is read");
  static_assert(kScaleOffset % 16 == 0 && kActOffset % 16 == 0 && kDsOffset % 16 == 0 &&
                    kStageBytes % 16 == 0 && kWeightRow % 16 == 0 && kActRow % 16 == 0,
                "cp.async and ldmatrix want 16-byte aligned rows");
  static_assert(kWarpSize % kChunksPerRow == 0 && kWarpSize % kActChunksPerColumn == 0 &&
                    kWarpSize % kKs == 0 && kActChunks >= 1 && kDsCopies >= 1 &&
                    kActChunks * kWarpSize == kColumns * kActChunksPerColumn &&
                    kDsCopies * kWarpSize == kColumns * kKs,
                "every lane copies the same number of chunks");
  static_assert(kScaleRow % kScaleCopy == 0, "whole scale copies");
  static_assert(NT == 1 || NT % 2 == 0, "activation fragments load two n-tiles at a time");
  static_assert(!kQ6 || (8 % kKs == 0 && kQhRow % 16 == 0), "Q6_K stages inside a super-block");
  static_assert(kQhRow % 8 == 0, "Q3_K/Q5_K: qh in one 8- or 16-byte copy");
  static_assert(!kSuperD || 8 % kKs == 0, "a stage inside a super-block");
  static_assert(!kByteScales || 4 % kKs == 0, "a stage's scale bytes inside one aligned word");
};

template <uint32_t TYPE, int NT, bool GATE_UP, int W>
constexpr int kSharedBytes = [] {
  using P = Plan<TYPE, NT, GATE_UP>;
  constexpr int ring = W * P::kWarpBytes;
  constexpr int reduce = (W - 1) * P::kAccumulators * kWarpSize * 4;
  static_assert(reduce <= ring, "the partial sums reuse the rings");
  static_assert(ring <= mma::kMaxBlockShared, "the block's rings fit an H100/H200 block");
  return ring;
}();

// Q6_K's 6-bit values of four elements (low nibbles `low`, high 2 bits in bits 0-1 of each
// byte of `high`) as int8 q - 32.
__device__ __forceinline__ uint32_t q6_signed(uint32_t low, uint32_t high) {
  const uint32_t v = (low & 0x0F0F0F0Fu) | ((high & 0x03030303u) << 4);  // 0..63 per byte
  return ((v | 0x80808080u) - 0x20202020u) ^ 0x80808080u;  // bytewise v - 32, no borrows
}

// The mma results carry 1.5 * 2^23 (kMagicBits as the accumulator's start): the f32 whose
// bits c holds is 1.5 * 2^23 + a x b exactly (|a x b| < 2^22 for every type here), so one f32
// subtraction converts it.
__device__ __forceinline__ float unmagic(int c) { return __int_as_float(c) - kMagic; }

template <uint32_t TYPE, int NT, bool GATE_UP, int W>
__global__ void __launch_bounds__(kWarpSize* W) mma_piped_kernel(Tasks tasks, MatvecInput in) {
  using P = Plan<TYPE, NT, GATE_UP>;
  constexpr int S = P::kStages;
  constexpr int KS = P::kKs;
  constexpr int CPR = P::kChunksPerRow;
  extern __shared__ __align__(16) uint8_t shared[];

  const MatvecTask& task = tasks.t[blockIdx.y];
  const int row0 = static_cast<int>(blockIdx.x) * P::kRows;
  if (row0 >= task.n_out) return;  // the whole block leaves before any barrier
  const int first_column = static_cast<int>(blockIdx.z) * P::kColumns;
  const int n = in.n_in / kQ8Block;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int all_stages = (n + KS - 1) / KS;
  const int stages = warp < all_stages ? (all_stages - warp + W - 1) / W : 0;
  uint8_t* const ring = shared + warp * P::kWarpBytes;
  auto first_block = [&](int s) { return (warp + W * s) * KS; };

  // This lane's weight rows: chunk (lane % CPR) of rows lane / CPR + i * 32 / CPR, and the
  // scales of row `lane`.
  const uint8_t* rows[CPR];
#pragma unroll
  for (int i = 0; i < CPR; ++i)
    rows[i] =
        mma::weight_row<P::kRows, P::kMatrices>(task, row0, lane / CPR + i * (kWarpSize / CPR));
  const uint8_t* const own_row = mma::weight_row<P::kRows, P::kMatrices>(task, row0, lane);
  const uint8_t* const scale_row = own_row + split::scales_offset(TYPE, n);
  const int chunk = lane % CPR;
  const int chunk_block = chunk * 16 / P::kQuantBytes;  // the sub-block of that chunk

  auto load_weights = [&](int s) {
    uint8_t* stage = ring + (s % S) * P::kStageBytes;
    const int first = first_block(s);
    const bool valid = first + chunk_block < n;
#pragma unroll
    for (int i = 0; i < CPR; ++i)
      copy_async<16>(
          stage + (lane / CPR + i * (kWarpSize / CPR)) * P::kWeightRow + chunk * 16,
          valid ? rows[i] + static_cast<int64_t>(first) * P::kQuantBytes + chunk * 16 : rows[i],
          valid);
    if constexpr (P::kByteScales) {
      // Bytes first & ~3 .. + 3: past the row's scales only into its padding (the payload
      // ends n * 17 or later; the stride rounds it up to 16 bytes, at least 4 - n % 4 more).
      const bool ok = first < n;
      copy_async<4>(stage + P::kScaleOffset + lane * P::kScaleRow,
                    ok ? scale_row + (first & ~3) : scale_row, ok);
    } else {
#pragma unroll
      for (int k = 0; k < P::kScaleRow / P::kScaleCopy; ++k) {
        const bool ok = first + k * P::kScaleCopy / P::kScaleBytes < n;
        copy_async<P::kScaleCopy>(
            stage + P::kScaleOffset + lane * P::kScaleRow + k * P::kScaleCopy,
            ok ? scale_row + first * P::kScaleBytes + k * P::kScaleCopy : scale_row, ok);
      }
    }
    if constexpr (TYPE == kIQ4_XS || TYPE == kQ3_K) {  // d as Q6_K's below (the pair holding
      // it: past the payload only into the row's padding, as there)
      const bool ok = first < n;
      const int64_t d_offset =
          TYPE == kIQ4_XS ? split::iq4xs_d_offset(n) : split::q3k_d_offset(n);
      copy_async<4>(stage + P::kD6Offset + lane * 4,
                    ok ? own_row + d_offset + ((first / 8) & ~1) * 2 : own_row, ok);
    }
    if constexpr (TYPE == kQ2_K || is_min_k_type(TYPE)) {  // the super-block's (d, dmin)
      const bool ok = first < n;
      const int64_t d_offset =
          TYPE == kQ2_K ? split::q2k_d_offset(n) : split::kquant_d_offset(TYPE, n);
      copy_async<4>(stage + P::kD6Offset + lane * 4,
                    ok ? own_row + d_offset + (first / 8) * 4 : own_row, ok);
    }
    if constexpr (TYPE == kQ3_K || TYPE == kQ5_K) {  // qh: 4 bytes per sub-block, in one copy
      const bool ok = first < n;
      const int64_t qh_offset =
          TYPE == kQ3_K ? split::q3k_qh_offset(n) : split::q5k_qh_offset(n);
      copy_async<P::kQhRow>(stage + P::kQhOffset + lane * P::kQhRow,
                            ok ? own_row + qh_offset + first * 4 : own_row, ok);
    }
    if constexpr (P::kQ6) {
#pragma unroll
      for (int k = 0; k < P::kQhRow / 16; ++k) {  // qh: 16 bytes = 2 sub-blocks per copy
        const bool ok = first + 2 * k < n;
        copy_async<16>(stage + P::kQhOffset + lane * P::kQhRow + 16 * k,
                       ok ? own_row + split::q6k_qh_offset(n) + first * 8 + 16 * k : own_row, ok);
      }
      const bool ok = first < n;
      copy_async<4>(stage + P::kD6Offset + lane * 4,
                    ok ? own_row + split::q6k_d_offset(n) + ((first / 8) & ~1) * 2 : own_row, ok);
    }
  };
  auto load_activations = [&](int s) {
    uint8_t* stage = ring + (s % S) * P::kStageBytes;
    const int first = first_block(s);
    constexpr int ACP = P::kActChunksPerColumn;
#pragma unroll
    for (int i = 0; i < P::kActChunks; ++i) {
      const int column = lane / ACP + i * (kWarpSize / ACP), part = lane % ACP;
      const bool valid = first_column + column < in.batch && first + part / 2 < n;
      const int8_t* src = valid ? in.xq.qs + static_cast<int64_t>(first_column + column) * in.n_in +
                                      static_cast<int64_t>(first) * kQ8Block + part * 16
                                : in.xq.qs;
      copy_async<16>(stage + P::kActOffset + column * P::kActRow + part * 16, src, valid);
    }
#pragma unroll
    for (int i = 0; i < P::kDsCopies; ++i) {
      const int column = lane / KS + i * (kWarpSize / KS), sub = lane % KS;
      const bool valid = first_column + column < in.batch && first + sub < n;
      const float2* src =
          valid ? in.xq.ds + static_cast<int64_t>(first_column + column) * n + first + sub
                : in.xq.ds;
      copy_async<8>(stage + P::kDsOffset + (column * KS + sub) * 8, src, valid);
    }
  };

  mma::start_ring<S>(stages, load_weights, load_activations);
  const int g = lane / 4, t = lane % 4;  // the mma fragments' group and thread in group
  float acc[kWeightTiles][NT][4];
  mma::zero(acc);

  for (int s = 0; s < stages; ++s) {
    // mma::advance_ring's step written out: through the helper the compiler orders 19 of these
    // kernels' instructions otherwise (Q6_K at 16 columns: 2 more registers).
    wait_copies<S - 2>();  // stage s landed (this lane's copies) ...
    __syncwarp();          // ... for every lane; and every lane is done with stage s - 1
    if (s + S - 1 < stages) {
      load_weights(s + S - 1);  // into stage s - 1's slot
      load_activations(s + S - 1);
    }
    commit_copies();
    const uint8_t* stage = ring + (s % S) * P::kStageBytes;
    const int first = first_block(s);
#pragma unroll
    for (int u = 0; u < KS; ++u) {
      if (first + u >= n) break;  // warp-uniform: past the row's end
      // Activation fragments of every n-tile: b0 = bytes 4t.. and b1 = 16 + 4t.. of column
      // g's sub-block; and (d, d * sum) of columns 2t, 2t + 1.
      uint32_t b[NT][2];
      const uint8_t* act = stage + P::kActOffset + u * kQ8Block + ((lane / 8) % 2) * 16;
      if constexpr (NT == 1) {
        load_matrix_x2(b[0], act + (lane % 8) * P::kActRow);
      } else {
#pragma unroll
        for (int pair = 0; pair < NT / 2; ++pair) {
          uint32_t r[4];
          load_matrix_x4(r, act + ((2 * pair + lane / 16) * 8 + lane % 8) * P::kActRow);
          b[2 * pair][0] = r[0];
          b[2 * pair][1] = r[1];
          b[2 * pair + 1][0] = r[2];
          b[2 * pair + 1][1] = r[3];
        }
      }
      float da[NT][2], sa[NT][2];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int p = 0; p < 2; ++p) {
          const float2 ds = *reinterpret_cast<const float2*>(stage + P::kDsOffset +
                                                             ((nt * 8 + 2 * t + p) * KS + u) * 8);
          da[nt][p] = ds.x;
          sa[nt][p] = TYPE == kQ4_0 ? kQ4_0Bias * ds.y : ds.y;  // Q4_0: q - 8 with q unsigned
        }

      // Weight fragments: a0 = row g bytes 4t.., a1 = row g + 8, a2/a3 the same rows' next
      // 16 elements (Q4: the high nibbles of the same bytes, element i + 16 of byte i).
      uint32_t a[kWeightTiles][4];
      [[maybe_unused]] uint32_t ql[4];  // Q6_K: ql of tile 0 rows g, g + 8; tile 1 ...
      if constexpr (P::kQ6) {
        load_matrix_x4(ql, stage + lane * P::kWeightRow + u * P::kQuantBytes);
      } else if constexpr (P::kTwoBit) {
        // Built below from each row's word t % 2 (elements 4t.. and 16 + 4t.. alike).
      } else if constexpr (TYPE == kQ8_0) {
#pragma unroll
        for (int m = 0; m < kWeightTiles; ++m)
          load_matrix_x4(a[m], stage + (m * 16 + lane % 16) * P::kWeightRow + u * P::kQuantBytes +
                                   (lane / 16) * 16);
      } else {
        static_assert(kWeightTiles == 2, "one ldmatrix.x4 reads both weight tiles");
        uint32_t r[4];  // tile 0 rows g, g + 8; tile 1 rows g, g + 8
        load_matrix_x4(r, stage + lane * P::kWeightRow + u * P::kQuantBytes);
#pragma unroll
        for (int m = 0; m < kWeightTiles; ++m) {
          if constexpr (is_level_type(TYPE)) {  // the nibbles' levels, q4_int8_fragment's order
            constexpr bool kMx = TYPE == kMXFP4;
            a[m][0] = split_unpack::table_levels4<kMx>(r[2 * m] & 0x0F0F0F0Fu);
            a[m][1] = split_unpack::table_levels4<kMx>(r[2 * m + 1] & 0x0F0F0F0Fu);
            a[m][2] = split_unpack::table_levels4<kMx>((r[2 * m] >> 4) & 0x0F0F0F0Fu);
            a[m][3] = split_unpack::table_levels4<kMx>((r[2 * m + 1] >> 4) & 0x0F0F0F0Fu);
          } else {
            mma::q4_int8_fragment(a[m], r[2 * m], r[2 * m + 1]);
            if constexpr (TYPE == kQ5_K) {
              // Fifth bits of rows g (h 0) and g + 8: elements 4t.. (a[h]) and 16 + 4t..
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                const uint32_t qh = *reinterpret_cast<const uint32_t*>(
                    stage + P::kQhOffset + (m * 16 + g + 8 * h) * P::kQhRow + u * 4);
                a[m][h] |= split_unpack::fifth_bits(qh, t);
                a[m][2 + h] |= split_unpack::fifth_bits(qh, 4 + t);
              }
            }
          }
        }
      }
      if constexpr (TYPE == kQ2_K) {
        // Each half's 4-bit scale folded into the bytes (q * sc <= 45), one k32 mma; the mins
        // as bytes of m in a second: d * Σ (q sc) x - dmin * Σ m x, dp4a's numerics.
#pragma unroll
        for (int m = 0; m < kWeightTiles; ++m) {
          uint32_t aq[4], am[4];
          float dw[2], mw[2];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = m * 16 + g + 8 * h;
            const uint32_t half = *reinterpret_cast<const uint32_t*>(
                stage + row * P::kWeightRow + u * P::kQuantBytes + 4 * (t % 2));
            const uint8_t* sc = stage + P::kScaleOffset + row * P::kScaleRow + u * 2;
            aq[h] = split_unpack::two_bit_word_of(half, t) * (sc[0] & 0xFu);
            aq[2 + h] = split_unpack::two_bit_word_of(half, 4 + t) * (sc[1] & 0xFu);
            am[h] = (sc[0] >> 4) * 0x01010101u;
            am[2 + h] = (sc[1] >> 4) * 0x01010101u;
            const uint32_t dm = *reinterpret_cast<const uint32_t*>(stage + P::kD6Offset + row * 4);
            dw[h] = half_bits_to_float(static_cast<uint16_t>(dm));
            mw[h] = half_bits_to_float(static_cast<uint16_t>(dm >> 16));
          }
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            int cq[4], cm[4];
            mma::mma_s8(cq, aq, b[nt][0], b[nt][1], kMagicBits);
            mma::mma_s8(cm, am, b[nt][0], b[nt][1], kMagicBits);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int h = i / 2, p = i & 1;
              const float x = fmaf(dw[h], unmagic(cq[i]), -(mw[h] * unmagic(cm[i])));
              acc[m][nt][i] = fmaf(da[nt][p], x, acc[m][nt][i]);
            }
          }
        }
      } else if constexpr (P::kQ6 || TYPE == kQ3_K) {
#pragma unroll
        for (int m = 0; m < kWeightTiles; ++m) {
          float dw[2], sc0[2], sc1[2];  // per row g, g + 8
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = m * 16 + g + 8 * h;
            // a[m] = {row g, row g + 8} of elements 4t.. (k16 mma 0) and 16 + 4t.. (mma 1).
            // qh word t % 2 of the row's 8 bytes: element e's high bits at byte e % 8, bit
            // 2 * (e / 8) — 2 * (t / 2) for elements 4t.., 4 + 2 * (t / 2) for 16 + 4t..
            if constexpr (P::kQ6) {
              const uint32_t qh = *reinterpret_cast<const uint32_t*>(
                  stage + P::kQhOffset + row * P::kQhRow + u * 8 + 4 * (t % 2));
              a[m][h] = q6_signed(ql[2 * m + h], qh >> (2 * (t / 2)));
              a[m][2 + h] = q6_signed(ql[2 * m + h] >> 4, qh >> (4 + 2 * (t / 2)));
            } else {  // Q3_K: word t % 2 of the row's 2-bit values and its third bits
              const uint32_t half = *reinterpret_cast<const uint32_t*>(
                  stage + row * P::kWeightRow + u * P::kQuantBytes + 4 * (t % 2));
              const uint32_t qh = *reinterpret_cast<const uint32_t*>(
                  stage + P::kQhOffset + row * P::kQhRow + u * 4);
              a[m][h] = split_unpack::q3_k_word_of(half, qh, t);
              a[m][2 + h] = split_unpack::q3_k_word_of(half, qh, 4 + t);
            }
            const uint8_t* sc = stage + P::kScaleOffset + row * P::kScaleRow + u * 2;
            sc0[h] = static_cast<float>(static_cast<int8_t>(sc[0]));
            sc1[h] = static_cast<float>(static_cast<int8_t>(sc[1]));
            dw[h] = half_bits_to_float(*reinterpret_cast<const uint16_t*>(
                stage + P::kD6Offset + row * 4 + 2 * ((first / 8) & 1)));
          }
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            int c0[4], c1[4];
            mma::mma_s8_k16(c0, a[m][0], a[m][1], b[nt][0], kMagicBits);
            mma::mma_s8_k16(c1, a[m][2], a[m][3], b[nt][1], kMagicBits);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int h = i / 2, p = i & 1;
              // sc0 x0 + sc1 x1 is exact below 2^24 and otherwise rounded once, as the dp4a
              // kernel's float(sc0 * sum0 + sc1 * sum1).
              const float x = fmaf(sc1[h], unmagic(c1[i]), sc0[h] * unmagic(c0[i]));
              acc[m][nt][i] = fmaf(dw[h] * da[nt][p], x, acc[m][nt][i]);
            }
          }
        }
      } else {
#pragma unroll
        for (int m = 0; m < kWeightTiles; ++m) {
          float dw[2], mw[2];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = m * 16 + g + 8 * h;
            const uint8_t* sc = stage + P::kScaleOffset + row * P::kScaleRow;
            mw[h] = 0.0f;
            if constexpr (is_min_k_type(TYPE)) {
              // d * sc and -(dmin * m), each one f32 product as the dp4a kernel's k_quant_dot.
              const uint32_t dm =
                  *reinterpret_cast<const uint32_t*>(stage + P::kD6Offset + row * 4);
              sc += u * P::kScaleBytes;
              dw[h] = half_bits_to_float(static_cast<uint16_t>(dm)) * static_cast<float>(sc[0]);
              mw[h] = -(half_bits_to_float(static_cast<uint16_t>(dm >> 16)) *
                        static_cast<float>(sc[1]));
            } else if constexpr (TYPE == kMXFP4) {
              dw[h] = e8m0_to_float_half(sc[(first & 3) + u]);
            } else if constexpr (TYPE == kIQ4_XS) {
              dw[h] = half_bits_to_float(*reinterpret_cast<const uint16_t*>(
                          stage + P::kD6Offset + row * 4 + 2 * ((first / 8) & 1))) *
                      static_cast<float>(static_cast<int8_t>(sc[(first & 3) + u]));
            } else {
              sc += u * P::kScaleBytes;
              dw[h] = half_bits_to_float(*reinterpret_cast<const uint16_t*>(sc));
              if constexpr (TYPE == kQ4_1)
                mw[h] = half_bits_to_float(*reinterpret_cast<const uint16_t*>(sc + 2));
            }
          }
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            int c[4];
            mma::mma_s8(c, a[m], b[nt][0], b[nt][1], kMagicBits);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const float x = unmagic(c[i]);  // exact: the integer dot product
              const int h = i / 2, p = i & 1;
              if constexpr (TYPE == kQ4_0) {
                acc[m][nt][i] = fmaf(dw[h], fmaf(da[nt][p], x, sa[nt][p]), acc[m][nt][i]);
              } else if constexpr (TYPE == kQ4_1 || is_min_k_type(TYPE)) {
                acc[m][nt][i] = fmaf(mw[h], sa[nt][p], fmaf(dw[h], da[nt][p] * x, acc[m][nt][i]));
              } else {
                acc[m][nt][i] = fmaf(dw[h], da[nt][p] * x, acc[m][nt][i]);
              }
            }
          }
        }
      }
    }
  }

  // The W warps of the block add their partial sums (in a fixed order).
  auto slot = [](int k) { return (k - 1) * P::kAccumulators; };
  if (!mma::gather_sums<W>(acc, shared, warp, slot, lane)) return;
  mma::store_tile<P::kRowTiles, GATE_UP, false>(acc, task, row0, first_column, in.batch, lane);
}

template <uint32_t TYPE, int NT, bool GATE_UP, int W>
cudaError_t allow_shared_bytes() {
  return mma::allow_shared_bytes<mma_piped_kernel<TYPE, NT, GATE_UP, W>,
                                 kSharedBytes<TYPE, NT, GATE_UP, W>>();
}

template <uint32_t TYPE, bool GATE_UP>
cudaError_t allow_shared_bytes_all_tiles() {
  constexpr int kW = Plan<TYPE, 1, GATE_UP>::kWideWarps;
  return mma::first_error(
      {allow_shared_bytes<TYPE, 1, GATE_UP, 4>(), allow_shared_bytes<TYPE, 2, GATE_UP, 4>(),
       allow_shared_bytes<TYPE, 4, GATE_UP, 4>(), allow_shared_bytes<TYPE, 8, GATE_UP, 4>(),
       allow_shared_bytes<TYPE, 1, GATE_UP, kW>(), allow_shared_bytes<TYPE, 2, GATE_UP, kW>(),
       allow_shared_bytes<TYPE, 4, GATE_UP, kW>(), allow_shared_bytes<TYPE, 8, GATE_UP, kW>()});
}

// Whether every kernel got its shared memory (a device with less than ~208 KB per block
// cannot run the 8-warp shapes; the launcher then takes the block-staged kernel). The first
// call comes from matvec_mma_fits_device(), before any capture.
bool ready() {
  static const bool ok = [] {
    if (mma::first_error({allow_shared_bytes_all_tiles<kQ4_0, false>(),
                          allow_shared_bytes_all_tiles<kQ4_0, true>(),
                          allow_shared_bytes_all_tiles<kQ4_1, false>(),
                          allow_shared_bytes_all_tiles<kQ4_1, true>(),
                          allow_shared_bytes_all_tiles<kQ8_0, false>(),
                          allow_shared_bytes_all_tiles<kQ8_0, true>(),
                          allow_shared_bytes_all_tiles<kQ6_K, false>(),
                          allow_shared_bytes_all_tiles<kQ6_K, true>(),
                          allow_shared_bytes_all_tiles<kIQ4_NL, false>(),
                          allow_shared_bytes_all_tiles<kIQ4_NL, true>(),
                          allow_shared_bytes_all_tiles<kIQ4_XS, false>(),
                          allow_shared_bytes_all_tiles<kIQ4_XS, true>(),
                          allow_shared_bytes_all_tiles<kMXFP4, false>(),
                          allow_shared_bytes_all_tiles<kMXFP4, true>(),
                          allow_shared_bytes_all_tiles<kQ2_K, false>(),
                          allow_shared_bytes_all_tiles<kQ2_K, true>(),
                          allow_shared_bytes_all_tiles<kQ3_K, false>(),
                          allow_shared_bytes_all_tiles<kQ3_K, true>(),
                          allow_shared_bytes_all_tiles<kQ4_K, false>(),
                          allow_shared_bytes_all_tiles<kQ4_K, true>(),
                          allow_shared_bytes_all_tiles<kQ5_K, false>(),
                          allow_shared_bytes_all_tiles<kQ5_K, true>()}) == cudaSuccess)
      return true;
    cudaGetLastError();
    return false;
  }();
  return ok;
}

template <uint32_t TYPE, int NT, bool GATE_UP, int W>
cudaError_t launch_tile(const Tasks& tasks, int n_tasks, int max_rows, const MatvecInput& in,
                        const KernelConfig& config, cudaStream_t stream) {
  using P = Plan<TYPE, NT, GATE_UP>;
  const dim3 grid(ceil_div(max_rows, P::kRows), n_tasks, ceil_div(in.batch, P::kColumns));
  return mma::launch<mma_piped_kernel<TYPE, NT, GATE_UP, W>, kSharedBytes<TYPE, NT, GATE_UP, W>>(
      grid, dim3(kWarpSize * W), tasks, in, config, stream);
}

template <uint32_t TYPE, int NT, bool GATE_UP>
cudaError_t launch_warps(const Tasks& tasks, int n_tasks, int max_rows, const MatvecInput& in,
                         const KernelConfig& config, cudaStream_t stream) {
  using P = Plan<TYPE, NT, GATE_UP>;
  if (mma::working_blocks(tasks, n_tasks, P::kRows, ceil_div(in.batch, P::kColumns)) >
      multiprocessors())
    return launch_tile<TYPE, NT, GATE_UP, 4>(tasks, n_tasks, max_rows, in, config, stream);
  return launch_tile<TYPE, NT, GATE_UP, P::kWideWarps>(tasks, n_tasks, max_rows, in, config,
                                                       stream);
}

}  // namespace piped

// 8 columns in one n-tile, 16 in two, 32 in four, more in tiles of 64 (grid z).
template <uint32_t TYPE, bool GATE_UP, bool PIPED>
cudaError_t launch_type(const Tasks& tasks, int n_tasks, int max_rows, const MatvecInput& in,
                        const KernelConfig& config, cudaStream_t stream) {
  auto tile = [&](auto nt) {
    constexpr int NT = decltype(nt)::value;
    if constexpr (PIPED)
      return piped::launch_warps<TYPE, NT, GATE_UP>(tasks, n_tasks, max_rows, in, config, stream);
    else
      return staged::launch_tile<TYPE, NT, GATE_UP>(tasks, n_tasks, max_rows, in, config, stream);
  };
  if (in.batch <= 8) return tile(std::integral_constant<int, 1>{});
  if (in.batch <= 16) return tile(std::integral_constant<int, 2>{});
  if (in.batch <= 32) return tile(std::integral_constant<int, 4>{});
  return tile(std::integral_constant<int, 8>{});
}

}  // namespace

bool matvec_mma_supports(uint32_t weight_type, bool split_layout) {
  return split_layout && (weight_type == kQ4_0 || weight_type == kQ4_1 || weight_type == kQ8_0 ||
                          piped_only(weight_type));
}

bool matvec_mma_fits_device() {
  if (!mma::has_mma(staged::mma_staged_kernel<kQ4_0, 1, 1, 4, false>)) return false;
  piped::ready();  // the warp-pipelined kernels' shared memory; without it, the block-staged
  multiprocessors();
  if (mma::first_error(
          {staged::allow_shared_bytes<kQ4_0, false>(), staged::allow_shared_bytes<kQ4_0, true>(),
           staged::allow_shared_bytes<kQ4_1, false>(), staged::allow_shared_bytes<kQ4_1, true>(),
           staged::allow_shared_bytes<kQ8_0, false>(),
           staged::allow_shared_bytes<kQ8_0, true>()}) == cudaSuccess)
    return true;
  cudaGetLastError();
  return false;
}

int matvec_mma_device_kernel() { return piped::ready() ? 2 : 1; }

cudaError_t launch_matvec_mma(uint32_t weight_type, const MatvecTask* tasks, int n_tasks,
                              const MatvecInput& input, const KernelConfig& config,
                              cudaStream_t stream, MmaKernel kernel) {
  if (input.n_in <= 0 || input.n_in % kQ8Block != 0 ||
      reinterpret_cast<uintptr_t>(input.xq.qs) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(input.xq.ds) % 8 != 0 ||
      (split::is_k_type(weight_type) && input.n_in % 256 != 0) ||
      input.norm_sum_squares)
    return cudaErrorInvalidValue;
  Tasks packed{};
  int max_rows = 0;
  auto valid = [&](const MatvecTask& t) {
    // y_q8: the split kernels' batch-1 fusion only.
    return matvec_mma_supports(weight_type, t.split_layout) && !t.y_q8.qs;
  };
  if (!mma::pack_tasks(tasks, n_tasks, valid, packed, max_rows)) return cudaErrorInvalidValue;
  if (input.batch == 0 || max_rows == 0) return cudaSuccess;
  const bool piped = kernel == MmaKernel::kDevice && piped::ready();
  auto run = [&](auto type_tag) -> cudaError_t {
    constexpr uint32_t TYPE = decltype(type_tag)::value;
    const bool gate_up = packed.t[0].weight_up != nullptr;
    // The block-staged kernel leaves the K types and the level types to the dp4a kernel.
    if constexpr (piped_only(TYPE)) {
      if (!piped) return launch_matvec(weight_type, tasks, n_tasks, input, config, stream);
      return gate_up
                 ? launch_type<TYPE, true, true>(packed, n_tasks, max_rows, input, config, stream)
                 : launch_type<TYPE, false, true>(packed, n_tasks, max_rows, input, config, stream);
    } else if (piped) {
      return gate_up
                 ? launch_type<TYPE, true, true>(packed, n_tasks, max_rows, input, config, stream)
                 : launch_type<TYPE, false, true>(packed, n_tasks, max_rows, input, config, stream);
    } else {
      return gate_up
                 ? launch_type<TYPE, true, false>(packed, n_tasks, max_rows, input, config, stream)
                 : launch_type<TYPE, false, false>(packed, n_tasks, max_rows, input, config,
                                                   stream);
    }
  };
  return mma::for_type<kQ4_0, kQ4_1, kQ8_0, kQ4_K, kQ5_K, kQ6_K, kQ2_K, kQ3_K, kIQ4_NL, kIQ4_XS,
                       kMXFP4>(weight_type, run);
}

}  // namespace granule::kernels
