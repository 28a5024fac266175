// Batched products of split-layout Q4_0/Q4_1/Q8_0 weights (split_layout.h) with int8
// activation blocks (ActivationQ8) on int8 tensor cores: mma.sync m16n8k32, so one mma is
// 16 weight rows x 8 batch columns x one 32-element sub-block, and its int32 result is
// scaled by the sub-block's weight and activation scales and accumulated in f32 — the
// split dp4a kernel's numerics per sub-block, in another summation order.
//
// A thread block owns 16 * WM weight rows and 8 * NT batch columns; its WM x WK warps split
// the rows (16 each) and the sub-blocks of each pipeline stage (WK ways; their partial sums
// meet in shared memory at the end). Weights and activations move through a ring of
// shared-memory stages filled by cp.async, kStageBlocks sub-blocks per stage, so the bytes
// in flight cost no registers. Batch columns past the batch are zero-filled, never read;
// rows past a matrix's end repeat its last row and are never written. More than 64
// columns (prefill) take further column tiles in grid z.
#include "async_copy.cuh"
#include "granule/split_layout.h"
#include "matvec_mma.cuh"
#include "quant_blocks.cuh"

namespace granule::kernels {
namespace {

constexpr int kStageBlocks = 8;  // 32-element sub-blocks per pipeline stage
constexpr int kRowPad = 16;      // bytes after each shared-memory row: conflict-free fragments

struct MmaTasks {
  MatvecTask t[kMaxMatvecTasks];
};

// Shared-memory layout of one stage, and the block's shape.
template <uint32_t TYPE, int NT, int WM, int WK, bool GATE_UP>
struct Tile {
  static constexpr int kMatrices = GATE_UP ? 2 : 1;
  static constexpr int kQuantBytes = TYPE == kQ8_0 ? 32 : 16;  // per sub-block and row
  static constexpr int kScaleBytes = TYPE == kQ4_1 ? 4 : 2;    // f16 d (and f16 m)
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

// c = a (16x32 int8, row-major fragment) x b (32x8 int8, column-major fragment).
__device__ __forceinline__ void mma_s8(int (&c)[4], const uint32_t (&a)[4],
                                       const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%10, %10, %10, %10};\n"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(0));
#else
  __trap();  // the launcher refuses devices below compute capability 8.0
#endif
}

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
    mma_matvec_kernel(MmaTasks tasks, MatvecInput in) {
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

    // Weights first: they do not depend on the previous kernel.
#pragma unroll
  for (int s = 0; s < S - 1; ++s)
    if (s < stages)
      load_weight_stage<T>(shared + s * T::kStageBytes, weights, task.row_bytes, row0, task.n_out,
                           n, s * kStageBlocks);
  wait_for_previous_kernel();  // the activations (and y) belong to earlier kernels
  allow_next_kernel();
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < stages)
      load_activation_stage<T>(shared + s * T::kStageBytes, in, first_column, n, s * kStageBlocks);
    commit_copies();
  }

  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int wm = warp % WM, wk = warp / WM;
  const int g = lane / 4, t = lane % 4;  // the mma fragments' group and thread in group
  float acc[M][NT][4];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[m][nt][i] = 0.0f;

  for (int s = 0; s < stages; ++s) {
    wait_copies<S - 2>();
    __syncthreads();  // stage s landed for every thread; stage s - 1 is free again
    const int refill = s + S - 1;
    if (refill < stages) {
      uint8_t* stage = shared + (refill % S) * T::kStageBytes;
      load_weight_stage<T>(stage, weights, task.row_bytes, row0, task.n_out, n,
                           refill * kStageBlocks);
      load_activation_stage<T>(stage, in, first_column, n, refill * kStageBlocks);
    }
    commit_copies();

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
          // Byte i of a Q4 sub-block: element i (low nibble) and i + 16 (high), unsigned.
          const uint32_t lo = *reinterpret_cast<const uint32_t*>(q);
          const uint32_t hi = *reinterpret_cast<const uint32_t*>(q + 8 * T::kQuantRow);
          a[m][0] = lo & 0x0F0F0F0Fu;
          a[m][1] = hi & 0x0F0F0F0Fu;
          a[m][2] = (lo >> 4) & 0x0F0F0F0Fu;
          a[m][3] = (hi >> 4) & 0x0F0F0F0Fu;
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint8_t* p = sc + h * 8 * T::kScaleRow;
          d[m][h] = half_bits_to_float(*reinterpret_cast<const uint16_t*>(p));
          // Q4_0 values are q - 8 (q unsigned here): -8 d per unit of the activation sum;
          // Q4_1 adds m; Q8_0 has none.
          dm[m][h] = TYPE == kQ4_1   ? half_bits_to_float(*reinterpret_cast<const uint16_t*>(p + 2))
                     : TYPE == kQ4_0 ? -8.0f * d[m][h]
                                     : 0.0f;
        }
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint8_t* x =
            stage + T::kActOffset + (nt * 8 + g) * T::kActRow + sub * kQ8Block + 4 * t;
        const uint32_t b[2] = {*reinterpret_cast<const uint32_t*>(x),
                               *reinterpret_cast<const uint32_t*>(x + 16)};
        // (d, d * sum) of columns 2t and 2t + 1 of this n-tile.
        const float4 ds = *reinterpret_cast<const float4*>(
            stage + T::kDsOffset + (sub * T::kColumns + nt * 8 + 2 * t) * 8);
#pragma unroll
        for (int m = 0; m < M; ++m) {
          int c[4];
          mma_s8(c, a[m], b);
          // c[0], c[1]: row g, columns 2t, 2t + 1; c[2], c[3]: row g + 8.
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
    wait_copies<0>();
    __syncthreads();  // every warp is done with the stages; their memory is reused
    float* partial = reinterpret_cast<float*>(shared);
    auto slot = [&](int k, int i) {
      return ((((k - 1) * WM + wm) * T::kAccumulators) + i) * kWarpSize + lane;
    };
    if (wk > 0) {
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i) partial[slot(wk, (m * NT + nt) * 4 + i)] = acc[m][nt][i];
    }
    __syncthreads();
    if (wk > 0) return;
#pragma unroll
    for (int k = 1; k < WK; ++k)
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[m][nt][i] += partial[slot(k, (m * NT + nt) * 4 + i)];
  }

#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = row0 + wm * 16 + g + (i / 2) * 8;
      const int column = first_column + nt * 8 + 2 * t + (i & 1);
      if (row >= task.n_out || column >= in.batch) continue;
      float v = acc[0][nt][i];
      if constexpr (GATE_UP) v = silu(v) * acc[M - 1][nt][i];
      float* y = task.y + static_cast<int64_t>(column) * task.y_stride + row;
      *y = task.accumulate ? *y + v : v;
    }
}

// Warps along rows x along sub-blocks per n-tile count: few columns want many blocks (rows
// are the only parallelism), many columns want more rows per block so each activation
// byte staged serves more weights.
template <int NT>
struct Shape {
  static constexpr int kWm = NT <= 2 ? 1 : NT <= 4 ? 2 : 4;
  static constexpr int kWk = NT <= 4 ? 4 : 2;
};

// Lets the kernel use its shared memory (beyond 48 KB needs asking), once per process: the
// first call comes from matvec_mma_fits_device() at backend start, so no launch made during
// graph capture makes it. (One device: the attribute is not re-applied on a second one.)
template <uint32_t TYPE, int NT, bool GATE_UP>
cudaError_t allow_shared_bytes() {
  constexpr int WM = Shape<NT>::kWm, WK = Shape<NT>::kWk;
  static const cudaError_t status = cudaFuncSetAttribute(
      mma_matvec_kernel<TYPE, NT, WM, WK, GATE_UP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
      Tile<TYPE, NT, WM, WK, GATE_UP>::kSharedBytes);
  return status;
}

template <uint32_t TYPE, bool GATE_UP>
cudaError_t allow_shared_bytes_all_tiles() {
  for (const cudaError_t status :
       {allow_shared_bytes<TYPE, 1, GATE_UP>(), allow_shared_bytes<TYPE, 2, GATE_UP>(),
        allow_shared_bytes<TYPE, 4, GATE_UP>(), allow_shared_bytes<TYPE, 8, GATE_UP>()})
    if (status != cudaSuccess) return status;
  return cudaSuccess;
}

template <uint32_t TYPE, int NT, bool GATE_UP>
cudaError_t launch_tile(const MmaTasks& tasks, int n_tasks, int max_rows, const MatvecInput& in,
                        const KernelConfig& config, cudaStream_t stream) {
  constexpr int WM = Shape<NT>::kWm, WK = Shape<NT>::kWk;
  using T = Tile<TYPE, NT, WM, WK, GATE_UP>;
  auto* kernel = mma_matvec_kernel<TYPE, NT, WM, WK, GATE_UP>;
  const cudaError_t attribute = allow_shared_bytes<TYPE, NT, GATE_UP>();
  if (attribute != cudaSuccess) return attribute;
  cudaLaunchConfig_t launch{};
  launch.gridDim = dim3(ceil_div(max_rows, T::kRows), n_tasks, ceil_div(in.batch, T::kColumns));
  launch.blockDim = dim3(T::kThreads);
  launch.dynamicSmemBytes = T::kSharedBytes;
  launch.stream = stream;
  cudaLaunchAttribute early[1];
  early[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  early[0].val.programmaticStreamSerializationAllowed = config.early_launch ? 1 : 0;
  launch.attrs = early;
  launch.numAttrs = 1;
  return cudaLaunchKernelEx(&launch, kernel, tasks, in);
}

template <uint32_t TYPE, bool GATE_UP>
cudaError_t launch_type(const MmaTasks& tasks, int n_tasks, int max_rows, const MatvecInput& in,
                        const KernelConfig& config, cudaStream_t stream) {
  if (in.batch <= 8)
    return launch_tile<TYPE, 1, GATE_UP>(tasks, n_tasks, max_rows, in, config, stream);
  if (in.batch <= 16)
    return launch_tile<TYPE, 2, GATE_UP>(tasks, n_tasks, max_rows, in, config, stream);
  if (in.batch <= 32)
    return launch_tile<TYPE, 4, GATE_UP>(tasks, n_tasks, max_rows, in, config, stream);
  return launch_tile<TYPE, 8, GATE_UP>(tasks, n_tasks, max_rows, in, config, stream);
}

// ---------------------------------------------------------------------------------------
// Version 2 (GRANULE_MMA=2): warp-pipelined. Every warp streams its own sub-blocks through a
// private shared-memory ring filled by cp.async (weights and the activations of those
// sub-blocks), waits with cp.async.wait_group + __syncwarp only, and loads its fragments with
// ldmatrix; the block's warps split the sub-blocks of the same rows (stage i of warp w covers
// sub-blocks (w + W i) * KS ..) and meet once, at the end, in a fixed-order shared-memory
// reduction. No block barrier runs in the main loop. PERF_NOTES.md ("Version 2") has the
// reasoning behind the sizes.
namespace v2 {

constexpr uint32_t kMagicBits = 0x4B400000u;  // 1.5 * 2^23 as f32 bits: ulp 1 in [2^23, 2^24)
constexpr float kMagic = 12582912.0f;
constexpr int kWeightTiles = 2;              // 16-row weight tiles per warp (over gate and up)
constexpr int kMaxBlockShared = 227 * 1024;  // opt-in shared memory per block, H100/H200

// Occupancy variants (KernelConfig::mma_occupancy; PERF_NOTES.md "Occupancy variants"): the
// ring bytes per warp, the 4-warp blocks per SM the registers are capped for, and the warps
// of a block where a launch has no more blocks than SMs. 0 is the kernel as measured: a 26 KB
// ring (4 warps = 104 KB, 2 blocks per SM), no register cap, 8 warps. 1: 3 blocks of 4 warps
// per SM (3 x (4 x 18.75 KB + 1 KB reserved) <= 228 KB; registers <= 168), 12 warps; 2: 4
// blocks (4 x (4 x 14 KB + 1 KB) = 228 KB; registers <= 128), 16 warps. A ring holds at
// least 3 stages: where 3 stages exceed the budget (Q4_1, Q8_0, Q6_K at 32 columns) fewer
// blocks fit.
template <int OCC>
struct Occupancy {
  static constexpr int kWarpBudget = OCC == 0 ? 26 * 1024 : OCC == 1 ? 19200 : 14 * 1024;
  static constexpr int kBlocksPerSm = OCC == 0 ? 1 : OCC == 1 ? 3 : 4;
  static constexpr int kWideWarps = OCC == 1 ? 12 : 16;
};

template <uint32_t TYPE, int NT, bool GATE_UP, int OCC = 0>
struct Plan {
  static constexpr int kMatrices = GATE_UP ? 2 : 1;
  static constexpr int kRowTiles = kWeightTiles / kMatrices;  // per matrix
  static constexpr int kRows = 16 * kRowTiles;                // output rows per block
  static constexpr int kWeightRows = 16 * kWeightTiles;       // 32: one row per lane
  static constexpr int kColumns = 8 * NT;
  // 32-element sub-blocks per stage (the variants' smaller rings want smaller stages).
  static constexpr int kKs = NT == 1 || (NT == 2 && OCC == 0) ? 4 : 2;
  static constexpr int kQuantBytes = TYPE == kQ8_0 ? 32 : 16;
  static constexpr int kScaleBytes = TYPE == kQ4_1 ? 4 : 2;
  // Shared rows padded by 16 bytes: ldmatrix's 8 row addresses land in 8 different 16-byte
  // bank groups (strides 48, 80, 144, 272 are all 16 mod 32 or odd multiples of 16 mod 128).
  static constexpr int kWeightRow = kKs * kQuantBytes + 16;
  static constexpr int kScaleRow = kKs * kScaleBytes;  // 4, 8, 16 bytes
  static constexpr int kScaleCopy = kScaleRow < 16 ? kScaleRow : 16;
  static constexpr int kActRow = kKs * kQ8Block + 16;
  static constexpr int kScaleOffset = kWeightRows * kWeightRow;
  // Q6_K (split_layout.h): the quantised bytes above are ql; the scale region holds the two
  // int8 scales per sub-block; then qh (8 bytes per sub-block) and the super-block's f16 d
  // (4 bytes: the aligned pair of d values holding it; a stage never crosses a super-block).
  static constexpr bool kQ6 = TYPE == kQ6_K;
  static constexpr int kQhRow = kQ6 ? kKs * 8 : 0;
  static constexpr int kQhOffset = kScaleOffset + kWeightRows * kScaleRow;
  static constexpr int kD6Offset = kQhOffset + kWeightRows * kQhRow;
  static constexpr int kActOffset = kD6Offset + (kQ6 ? kWeightRows * 4 : 0);
  static constexpr int kDsOffset = kActOffset + kColumns * kActRow;  // float2 [column][kKs]
  static constexpr int kStageBytes = kDsOffset + kColumns * kKs * 8;
  static constexpr int kStagesFit = Occupancy<OCC>::kWarpBudget / kStageBytes;
  static constexpr int kStagesFloor = OCC > 0 ? 3 : 0;  // variants: 3 even over the budget
  static constexpr int kStages = kStagesFit > 6              ? 6
                                 : kStagesFit < kStagesFloor ? kStagesFloor
                                                             : kStagesFit;
  static constexpr int kWarpBytes = kStages * kStageBytes;
  static constexpr int kAccumulators = kWeightTiles * NT * 4;
  // Per lane and stage: 16-byte weight chunks (one row each), activation chunks, scales.
  static constexpr int kChunksPerRow = kKs * kQuantBytes / 16;     // 2, 4 or 8
  static constexpr int kActChunksPerColumn = kKs * kQ8Block / 16;  // 4 or 8
  static constexpr int kActChunks = kColumns * kActChunksPerColumn / kWarpSize;
  static constexpr int kDsCopies = kColumns * kKs / kWarpSize;
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
};

// Warps per block: 4 (two blocks per SM, so one block's ring fills while the other's
// drains) when there are more blocks than SMs, else 8 (one block per SM, twice the bytes in
// flight for the few blocks of a short matrix). SwiGLU's matrices always have many rows.
// The variants: 12 or 16 warps (one block per SM), as many as the block's shared memory holds.
template <uint32_t TYPE, int NT, bool GATE_UP, int OCC = 0>
constexpr int kWideWarps = [] {
  if (GATE_UP) return 4;
  if (OCC == 0) return 8;
  constexpr int fit = kMaxBlockShared / Plan<TYPE, NT, GATE_UP, OCC>::kWarpBytes;
  return fit < Occupancy<OCC>::kWideWarps ? fit : Occupancy<OCC>::kWideWarps;
}();

// The blocks per SM a kernel's registers are capped for (__launch_bounds__): for the
// variants' 4-warp blocks, Occupancy::kBlocksPerSm or as many as the SM's shared memory holds
// (228 KB, 1 KB reserved per block), whichever is fewer; 1 (no cap beyond the block's own
// size) for the variants' wide blocks; 0 for variant 0, which emits no .minnctapersm at all
// (1 would: ptxas then allocates registers differently, up to 40 more, for 27 of its 48).
constexpr int kSmShared = 228 * 1024;
template <uint32_t TYPE, int NT, bool GATE_UP, int W, int OCC>
constexpr int kMinBlocks = [] {
  if (OCC == 0) return 0;
  if (W != 4) return 1;
  constexpr int fit = kSmShared / (W * Plan<TYPE, NT, GATE_UP, OCC>::kWarpBytes + 1024);
  return fit < Occupancy<OCC>::kBlocksPerSm ? fit : Occupancy<OCC>::kBlocksPerSm;
}();

// The same for k = 16 (Q6_K: each 16-element half of a sub-block has its own scale).
__device__ __forceinline__ void mma_s8_k16_magic(int (&c)[4], uint32_t a0, uint32_t a1,
                                                 uint32_t b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
      "{%7, %7, %7, %7};\n"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a0), "r"(a1), "r"(b), "r"(kMagicBits));
#else
  __trap();
#endif
}

// Q6_K's 6-bit values of four elements (low nibbles `low`, high 2 bits in bits 0-1 of each
// byte of `high`) as int8 q - 32.
__device__ __forceinline__ uint32_t q6_signed(uint32_t low, uint32_t high) {
  const uint32_t v = (low & 0x0F0F0F0Fu) | ((high & 0x03030303u) << 4);  // 0..63 per byte
  return ((v | 0x80808080u) - 0x20202020u) ^ 0x80808080u;  // bytewise v - 32, no borrows
}

// c = a x b + 1.5 * 2^23 (as int32 bits): the f32 whose bits c holds is 1.5 * 2^23 + a x b
// exactly (|a x b| < 2^22 for every type here), so one f32 subtraction converts it.
__device__ __forceinline__ void mma_s8_magic(int (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%10, %10, %10, %10};\n"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(kMagicBits));
#else
  __trap();  // the launcher refuses devices below compute capability 8.0
#endif
}

// Row r (0..31) of the warp's weight rows: matrix r / kRows, row row0 + r % kRows (rows past
// the matrix's end repeat its last row; they are read, never written).
template <class P>
__device__ __forceinline__ const uint8_t* weight_row(const MatvecTask& task, int row0, int r) {
  const int row = min(row0 + r % P::kRows, task.n_out - 1);
  const void* matrix = P::kMatrices == 2 && r >= P::kRows ? task.weight_up : task.weight;
  return static_cast<const uint8_t*>(matrix) + static_cast<int64_t>(row) * task.row_bytes;
}

template <uint32_t TYPE, int NT, bool GATE_UP, int W, int OCC>
__global__ void __launch_bounds__(kWarpSize* W, (kMinBlocks<TYPE, NT, GATE_UP, W, OCC>))
    mma_matvec_kernel(MmaTasks tasks, MatvecInput in) {
  using P = Plan<TYPE, NT, GATE_UP, OCC>;
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
    rows[i] = weight_row<P>(task, row0, lane / CPR + i * (kWarpSize / CPR));
  const uint8_t* const own_row = weight_row<P>(task, row0, lane);
  const uint8_t* const scale_row = own_row + (P::kQ6 ? split::scales_offset(kQ6_K, n)
                                                     : static_cast<int64_t>(n) * P::kQuantBytes);
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
#pragma unroll
    for (int k = 0; k < P::kScaleRow / P::kScaleCopy; ++k) {
      const bool ok = first + k * P::kScaleCopy / P::kScaleBytes < n;
      copy_async<P::kScaleCopy>(
          stage + P::kScaleOffset + lane * P::kScaleRow + k * P::kScaleCopy,
          ok ? scale_row + first * P::kScaleBytes + k * P::kScaleCopy : scale_row, ok);
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

  const int g = lane / 4, t = lane % 4;  // the mma fragments' group and thread in group
  float acc[kWeightTiles][NT][4];
#pragma unroll
  for (int m = 0; m < kWeightTiles; ++m)
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
          sa[nt][p] = TYPE == kQ4_0 ? -8.0f * ds.y : ds.y;  // Q4_0: q - 8 with q unsigned
        }

      // Weight fragments: a0 = row g bytes 4t.., a1 = row g + 8, a2/a3 the same rows' next
      // 16 elements (Q4: the high nibbles of the same bytes, element i + 16 of byte i).
      uint32_t a[kWeightTiles][4];
      [[maybe_unused]] uint32_t ql[4];  // Q6_K: ql of tile 0 rows g, g + 8; tile 1 ...
      if constexpr (P::kQ6) {
        load_matrix_x4(ql, stage + lane * P::kWeightRow + u * P::kQuantBytes);
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
          const uint32_t lo = r[2 * m], hi = r[2 * m + 1];
          a[m][0] = lo & 0x0F0F0F0Fu;
          a[m][1] = hi & 0x0F0F0F0Fu;
          a[m][2] = (lo >> 4) & 0x0F0F0F0Fu;
          a[m][3] = (hi >> 4) & 0x0F0F0F0Fu;
        }
      }
      if constexpr (P::kQ6) {
#pragma unroll
        for (int m = 0; m < kWeightTiles; ++m) {
          float dw[2], sc0[2], sc1[2];  // per row g, g + 8
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = m * 16 + g + 8 * h;
            // a[m] = {row g, row g + 8} of elements 4t.. (k16 mma 0) and 16 + 4t.. (mma 1).
            // qh word t % 2 of the row's 8 bytes: element e's high bits at byte e % 8, bit
            // 2 * (e / 8) — 2 * (t / 2) for elements 4t.., 4 + 2 * (t / 2) for 16 + 4t..
            const uint32_t qh = *reinterpret_cast<const uint32_t*>(
                stage + P::kQhOffset + row * P::kQhRow + u * 8 + 4 * (t % 2));
            a[m][h] = q6_signed(ql[2 * m + h], qh >> (2 * (t / 2)));
            a[m][2 + h] = q6_signed(ql[2 * m + h] >> 4, qh >> (4 + 2 * (t / 2)));
            const uint8_t* sc = stage + P::kScaleOffset + row * P::kScaleRow + u * 2;
            sc0[h] = static_cast<float>(static_cast<int8_t>(sc[0]));
            sc1[h] = static_cast<float>(static_cast<int8_t>(sc[1]));
            dw[h] = half_bits_to_float(*reinterpret_cast<const uint16_t*>(
                stage + P::kD6Offset + row * 4 + 2 * ((first / 8) & 1)));
          }
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            int c0[4], c1[4];
            mma_s8_k16_magic(c0, a[m][0], a[m][1], b[nt][0]);
            mma_s8_k16_magic(c1, a[m][2], a[m][3], b[nt][1]);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int h = i / 2, p = i & 1;
              // sc0 x0 + sc1 x1 is exact below 2^24 and otherwise rounded once, as the dp4a
              // kernel's float(sc0 * sum0 + sc1 * sum1).
              const float x = fmaf(sc1[h], __int_as_float(c1[i]) - kMagic,
                                   sc0[h] * (__int_as_float(c0[i]) - kMagic));
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
            const uint8_t* sc =
                stage + P::kScaleOffset + (m * 16 + g + 8 * h) * P::kScaleRow + u * P::kScaleBytes;
            dw[h] = half_bits_to_float(*reinterpret_cast<const uint16_t*>(sc));
            mw[h] = TYPE == kQ4_1 ? half_bits_to_float(*reinterpret_cast<const uint16_t*>(sc + 2))
                                  : 0.0f;
          }
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            int c[4];
            mma_s8_magic(c, a[m], b[nt][0], b[nt][1]);
            // c[0], c[1]: row g, columns 2t, 2t + 1; c[2], c[3]: row g + 8.
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const float x = __int_as_float(c[i]) - kMagic;  // exact: the integer dot product
              const int h = i / 2, p = i & 1;
              if constexpr (TYPE == kQ4_0) {
                acc[m][nt][i] = fmaf(dw[h], fmaf(da[nt][p], x, sa[nt][p]), acc[m][nt][i]);
              } else if constexpr (TYPE == kQ4_1) {
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
  wait_copies<0>();
  __syncthreads();  // every warp is done with its ring; the memory is reused
  float* partial = reinterpret_cast<float*>(shared);
  auto slot = [&](int k, int i) { return ((k - 1) * P::kAccumulators + i) * kWarpSize + lane; };
  if (warp > 0) {
#pragma unroll
    for (int m = 0; m < kWeightTiles; ++m)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) partial[slot(warp, (m * NT + nt) * 4 + i)] = acc[m][nt][i];
  }
  __syncthreads();
  if (warp > 0) return;
  for (int k = 1; k < W; ++k)
#pragma unroll
    for (int m = 0; m < kWeightTiles; ++m)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[m][nt][i] += partial[slot(k, (m * NT + nt) * 4 + i)];

#pragma unroll
  for (int m = 0; m < P::kRowTiles; ++m)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = row0 + m * 16 + g + (i / 2) * 8;
        const int column = first_column + nt * 8 + 2 * t + (i & 1);
        if (row >= task.n_out || column >= in.batch) continue;
        float v = acc[m][nt][i];
        if constexpr (GATE_UP) v = silu(v) * acc[P::kRowTiles + m][nt][i];
        float* y = task.y + static_cast<int64_t>(column) * task.y_stride + row;
        *y = task.accumulate ? *y + v : v;
      }
}

template <uint32_t TYPE, int NT, bool GATE_UP, int W, int OCC>
constexpr int kSharedBytes = [] {
  using P = Plan<TYPE, NT, GATE_UP, OCC>;
  constexpr int ring = W * P::kWarpBytes;
  constexpr int reduce = (W - 1) * P::kAccumulators * kWarpSize * 4;
  static_assert(reduce <= ring, "the partial sums reuse the rings");
  static_assert(ring <= kMaxBlockShared, "the block's rings fit an H100/H200 block");
  return ring;
}();

template <uint32_t TYPE, int NT, bool GATE_UP, int W, int OCC>
cudaError_t allow_shared_bytes() {
  static const cudaError_t status = [] {
    auto* kernel = mma_matvec_kernel<TYPE, NT, GATE_UP, W, OCC>;
    const cudaError_t bytes =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kSharedBytes<TYPE, NT, GATE_UP, W, OCC>);
    if (OCC == 0 || bytes != cudaSuccess) return bytes;
    // The variants' 3-4 blocks per SM want all of the SM's shared memory (a hint: the
    // driver may otherwise pick a smaller carveout and fit fewer blocks).
    return cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                cudaSharedmemCarveoutMaxShared);
  }();
  return status;
}

template <uint32_t TYPE, bool GATE_UP>
cudaError_t allow_shared_bytes_all_tiles() {
  constexpr int kW = kWideWarps<TYPE, 1, GATE_UP>;
  for (const cudaError_t status :
       {allow_shared_bytes<TYPE, 1, GATE_UP, 4, 0>(), allow_shared_bytes<TYPE, 2, GATE_UP, 4, 0>(),
        allow_shared_bytes<TYPE, 4, GATE_UP, 4, 0>(), allow_shared_bytes<TYPE, 8, GATE_UP, 4, 0>(),
        allow_shared_bytes<TYPE, 1, GATE_UP, kW, 0>(),
        allow_shared_bytes<TYPE, 2, GATE_UP, kW, 0>(),
        allow_shared_bytes<TYPE, 4, GATE_UP, kW, 0>(),
        allow_shared_bytes<TYPE, 8, GATE_UP, kW, 0>()})
    if (status != cudaSuccess) return status;
  return cudaSuccess;
}

// The same for an occupancy variant's kernels (32-column tiles at most: NT 2 and 4).
template <uint32_t TYPE, bool GATE_UP, int OCC>
cudaError_t allow_shared_bytes_variant() {
  for (const cudaError_t status :
       {allow_shared_bytes<TYPE, 2, GATE_UP, 4, OCC>(),
        allow_shared_bytes<TYPE, 4, GATE_UP, 4, OCC>(),
        allow_shared_bytes<TYPE, 2, GATE_UP, kWideWarps<TYPE, 2, GATE_UP, OCC>, OCC>(),
        allow_shared_bytes<TYPE, 4, GATE_UP, kWideWarps<TYPE, 4, GATE_UP, OCC>, OCC>()})
    if (status != cudaSuccess) return status;
  return cudaSuccess;
}

// Whether every version-2 kernel got its shared memory (a device with less than ~208 KB per
// block cannot run the 8-warp shapes; the launcher then takes version 1). The first call
// comes from matvec_mma_fits_device(), before any capture.
bool ready() {
  static const bool ok = [] {
    for (const cudaError_t status :
         {allow_shared_bytes_all_tiles<kQ4_0, false>(), allow_shared_bytes_all_tiles<kQ4_0, true>(),
          allow_shared_bytes_all_tiles<kQ4_1, false>(), allow_shared_bytes_all_tiles<kQ4_1, true>(),
          allow_shared_bytes_all_tiles<kQ8_0, false>(), allow_shared_bytes_all_tiles<kQ8_0, true>(),
          allow_shared_bytes_all_tiles<kQ6_K, false>(),
          allow_shared_bytes_all_tiles<kQ6_K, true>()}) {
      if (status != cudaSuccess) {
        cudaGetLastError();
        return false;
      }
    }
    return true;
  }();
  return ok;
}

// Whether every kernel of occupancy variant OCC got its shared memory; without it the
// launcher runs variant 0. First called from matvec_mma_fits_device(), before any capture.
template <int OCC>
bool variant_ready() {
  static const bool ok = [] {
    if (!ready()) return false;
    for (const cudaError_t status : {allow_shared_bytes_variant<kQ4_0, false, OCC>(),
                                     allow_shared_bytes_variant<kQ4_0, true, OCC>(),
                                     allow_shared_bytes_variant<kQ4_1, false, OCC>(),
                                     allow_shared_bytes_variant<kQ4_1, true, OCC>(),
                                     allow_shared_bytes_variant<kQ8_0, false, OCC>(),
                                     allow_shared_bytes_variant<kQ8_0, true, OCC>(),
                                     allow_shared_bytes_variant<kQ6_K, false, OCC>(),
                                     allow_shared_bytes_variant<kQ6_K, true, OCC>()}) {
      if (status != cudaSuccess) {
        cudaGetLastError();
        return false;
      }
    }
    return true;
  }();
  return ok;
}

// The occupancy variant the launcher runs for `config` (version 2 assumed): 0, 1 or 2.
int occupancy(const KernelConfig& config) {
  if (config.mma_occupancy <= 0) return 0;
  if (config.mma_occupancy == 1) return variant_ready<1>() ? 1 : 0;
  return variant_ready<2>() ? 2 : 0;
}

template <uint32_t TYPE, int NT, bool GATE_UP, int W, int OCC>
cudaError_t launch_tile(const MmaTasks& tasks, int n_tasks, int max_rows, const MatvecInput& in,
                        const KernelConfig& config, cudaStream_t stream) {
  using P = Plan<TYPE, NT, GATE_UP, OCC>;
  const cudaError_t attribute = allow_shared_bytes<TYPE, NT, GATE_UP, W, OCC>();
  if (attribute != cudaSuccess) return attribute;
  cudaLaunchConfig_t launch{};
  launch.gridDim = dim3(ceil_div(max_rows, P::kRows), n_tasks, ceil_div(in.batch, P::kColumns));
  launch.blockDim = dim3(kWarpSize * W);
  launch.dynamicSmemBytes = kSharedBytes<TYPE, NT, GATE_UP, W, OCC>;
  launch.stream = stream;
  cudaLaunchAttribute early[1];
  early[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  early[0].val.programmaticStreamSerializationAllowed = config.early_launch ? 1 : 0;
  launch.attrs = early;
  launch.numAttrs = 1;
  return cudaLaunchKernelEx(&launch, mma_matvec_kernel<TYPE, NT, GATE_UP, W, OCC>, tasks, in);
}

template <uint32_t TYPE, int NT, bool GATE_UP, int OCC = 0>
cudaError_t launch_warps(const MmaTasks& tasks, int n_tasks, int max_rows, const MatvecInput& in,
                         const KernelConfig& config, cudaStream_t stream) {
  using P = Plan<TYPE, NT, GATE_UP, OCC>;
  int64_t blocks = 0;  // that do any work
  for (int i = 0; i < n_tasks; ++i) blocks += ceil_div(tasks.t[i].n_out, P::kRows);
  blocks *= ceil_div(in.batch, P::kColumns);
  if (blocks > multiprocessors())
    return launch_tile<TYPE, NT, GATE_UP, 4, OCC>(tasks, n_tasks, max_rows, in, config, stream);
  return launch_tile<TYPE, NT, GATE_UP, kWideWarps<TYPE, NT, GATE_UP, OCC>, OCC>(
      tasks, n_tasks, max_rows, in, config, stream);
}

template <uint32_t TYPE, bool GATE_UP>
cudaError_t launch_type(const MmaTasks& tasks, int n_tasks, int max_rows, const MatvecInput& in,
                        const KernelConfig& config, cudaStream_t stream) {
  // An occupancy variant (9-64 columns): 16 columns in one tile, more in 32-column tiles
  // (grid z).
  if (in.batch > 8 && in.batch <= 64) {
    const int occ = occupancy(config);
    if (occ == 1)
      return in.batch <= 16
                 ? launch_warps<TYPE, 2, GATE_UP, 1>(tasks, n_tasks, max_rows, in, config, stream)
                 : launch_warps<TYPE, 4, GATE_UP, 1>(tasks, n_tasks, max_rows, in, config, stream);
    if (occ == 2)
      return in.batch <= 16
                 ? launch_warps<TYPE, 2, GATE_UP, 2>(tasks, n_tasks, max_rows, in, config, stream)
                 : launch_warps<TYPE, 4, GATE_UP, 2>(tasks, n_tasks, max_rows, in, config, stream);
  }
  if (in.batch <= 8)
    return launch_warps<TYPE, 1, GATE_UP>(tasks, n_tasks, max_rows, in, config, stream);
  if (in.batch <= 16)
    return launch_warps<TYPE, 2, GATE_UP>(tasks, n_tasks, max_rows, in, config, stream);
  if (in.batch <= 32)
    return launch_warps<TYPE, 4, GATE_UP>(tasks, n_tasks, max_rows, in, config, stream);
  return launch_warps<TYPE, 8, GATE_UP>(tasks, n_tasks, max_rows, in, config, stream);
}

}  // namespace v2

}  // namespace

bool matvec_mma_supports(uint32_t weight_type, bool split_layout) {
  return split_layout && (weight_type == kQ4_0 || weight_type == kQ4_1 || weight_type == kQ8_0 ||
                          weight_type == kQ6_K);
}

bool matvec_mma_fits_device() {
  // The code the current device would run: its compute capability and this build's
  // architectures both count (a build for sm_75 only has no int8 mma).
  cudaFuncAttributes attributes{};
  if (cudaFuncGetAttributes(&attributes, mma_matvec_kernel<kQ4_0, 1, 1, 4, false>) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  if (attributes.binaryVersion < 80 || attributes.ptxVersion < 80) return false;
  v2::ready();             // version 2's shared memory; without it launches take version 1
  v2::variant_ready<1>();  // the occupancy variants'; without it launches take variant 0
  v2::variant_ready<2>();
  multiprocessors();
  for (const cudaError_t status :
       {allow_shared_bytes_all_tiles<kQ4_0, false>(), allow_shared_bytes_all_tiles<kQ4_0, true>(),
        allow_shared_bytes_all_tiles<kQ4_1, false>(), allow_shared_bytes_all_tiles<kQ4_1, true>(),
        allow_shared_bytes_all_tiles<kQ8_0, false>(),
        allow_shared_bytes_all_tiles<kQ8_0, true>()}) {
    if (status != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
  }
  return true;
}

int matvec_mma_version(const KernelConfig& config) {
  if (config.mma <= 0) return 0;
  return config.mma >= 2 && v2::ready() ? 2 : 1;
}

int matvec_mma_occupancy(const KernelConfig& config) {
  return matvec_mma_version(config) == 2 ? v2::occupancy(config) : 0;
}

cudaError_t launch_matvec_mma(uint32_t weight_type, const MatvecTask* tasks, int n_tasks,
                              const MatvecInput& input, const KernelConfig& config,
                              cudaStream_t stream) {
  if (n_tasks < 1 || n_tasks > kMaxMatvecTasks || input.n_in <= 0 || input.n_in % kQ8Block != 0 ||
      reinterpret_cast<uintptr_t>(input.xq.qs) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(input.xq.ds) % 8 != 0 ||
      (weight_type == kQ6_K && input.n_in % 256 != 0) || input.norm_sum_squares)
    return cudaErrorInvalidValue;
  for (int i = 0; i < n_tasks; ++i)
    if (tasks[i].y_q8.qs) return cudaErrorInvalidValue;  // the split kernels' batch-1 fusion only
  MmaTasks packed{};
  int max_rows = 0;
  const bool gate_up = tasks[0].weight_up != nullptr;
  for (int i = 0; i < n_tasks; ++i) {
    const MatvecTask& t = tasks[i];
    if (!matvec_mma_supports(weight_type, t.split_layout) || (t.weight_up != nullptr) != gate_up ||
        t.row_bytes % 16 != 0 || reinterpret_cast<uintptr_t>(t.weight) % 16 != 0 ||
        reinterpret_cast<uintptr_t>(t.weight_up) % 16 != 0)
      return cudaErrorInvalidValue;
    packed.t[i] = t;
    max_rows = std::max(max_rows, t.n_out);
  }
  if (input.batch == 0 || max_rows == 0) return cudaSuccess;
  const bool version2 = matvec_mma_version(config) == 2;
  if (weight_type == kQ6_K) {  // version 2 only; version 1 leaves it to the dp4a kernel
    if (!version2) return launch_matvec(weight_type, tasks, n_tasks, input, config, stream);
    return launch_status(
        gate_up ? v2::launch_type<kQ6_K, true>(packed, n_tasks, max_rows, input, config, stream)
                : v2::launch_type<kQ6_K, false>(packed, n_tasks, max_rows, input, config, stream));
  }
  auto run = [&](auto type_tag) -> cudaError_t {
    constexpr uint32_t TYPE = decltype(type_tag)::value;
    if (version2)
      return gate_up
                 ? v2::launch_type<TYPE, true>(packed, n_tasks, max_rows, input, config, stream)
                 : v2::launch_type<TYPE, false>(packed, n_tasks, max_rows, input, config, stream);
    return gate_up ? launch_type<TYPE, true>(packed, n_tasks, max_rows, input, config, stream)
                   : launch_type<TYPE, false>(packed, n_tasks, max_rows, input, config, stream);
  };
  switch (weight_type) {
    case kQ4_0:
      return launch_status(run(std::integral_constant<uint32_t, kQ4_0>{}));
    case kQ4_1:
      return launch_status(run(std::integral_constant<uint32_t, kQ4_1>{}));
    case kQ8_0:
      return launch_status(run(std::integral_constant<uint32_t, kQ8_0>{}));
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace granule::kernels
