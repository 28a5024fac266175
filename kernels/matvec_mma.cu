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

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// Copies 16 (or 8) bytes to shared memory, or writes zeros there when !valid (no read).
__device__ __forceinline__ void copy16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)),
               "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void copy8(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(shared_address(dst)),
               "l"(src), "r"(valid ? 8 : 0)
               : "memory");
}
__device__ __forceinline__ void commit_copies() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int PENDING>
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory");
}

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
    copy16(stage + mr * T::kQuantRow + chunk * 16, src, valid);
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
    copy16(stage + T::kScaleOffset + mr * T::kScaleRow + chunk * 16, src, valid);
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
    copy16(stage + T::kActOffset + column * T::kActRow + chunk * 16, src, valid);
  }
#pragma unroll
  for (int c = threadIdx.x; c < T::kColumns * kStageBlocks; c += T::kThreads) {
    const int column = c % T::kColumns, sub = c / T::kColumns;
    const bool valid = first_column + column < in.batch && first_block + sub < n;
    const float2* src =
        valid ? in.xq.ds + static_cast<int64_t>(first_column + column) * n + first_block + sub
              : in.xq.ds;
    copy8(stage + T::kDsOffset + (sub * T::kColumns + column) * 8, src, valid);
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

}  // namespace

bool matvec_mma_supports(uint32_t weight_type, bool split_layout) {
  return split_layout && (weight_type == kQ4_0 || weight_type == kQ4_1 || weight_type == kQ8_0);
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

cudaError_t launch_matvec_mma(uint32_t weight_type, const MatvecTask* tasks, int n_tasks,
                              const MatvecInput& input, const KernelConfig& config,
                              cudaStream_t stream) {
  if (n_tasks < 1 || n_tasks > kMaxMatvecTasks || input.n_in <= 0 || input.n_in % kQ8Block != 0 ||
      reinterpret_cast<uintptr_t>(input.xq.qs) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(input.xq.ds) % 8 != 0)
    return cudaErrorInvalidValue;
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
    case kQ8_0:
      return launch_status(run(std::integral_constant<uint32_t, kQ8_0>{}));
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace granule::kernels
