// Matrix-vector kernels: each thread block (4 warps) owns a few output rows and splits their
// length over its 128 threads; the activations a thread loads are reused for all the rows
// (activation traffic otherwise rivals weight traffic), and there are enough blocks in
// flight to keep the memory system busy. Q4_0/Q4_1/Q8_0: four threads share one 32-element
// block (8 weights each), so a block's loads cover 32 consecutive GGUF blocks per row, and
// 4-way int8 dot products against int8 activations keep a weight nibble under one
// instruction. Other types: each thread decodes 8 consecutive elements to f32.
#include "matvec.cuh"
#include "quant_blocks.cuh"
#include "granule/split_layout.h"

namespace granule::kernels {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kThreads = kWarpsPerBlock * kWarpSize;
constexpr int kLanesPerQ8Block = 4;
constexpr int kQ8BlocksPerStep = kThreads / kLanesPerQ8Block;

struct MatvecTasks {
  MatvecTask t[kMaxMatvecTasks];
};

// Rows per thread block: more rows share each activation load; fewer when many columns
// already take the registers.
__host__ __device__ constexpr int rows_per_block(int nb) { return nb <= 2 ? 4 : nb <= 8 ? 2 : 1; }

__device__ __forceinline__ int low_nibbles(int v) { return v & 0x0F0F0F0F; }
__device__ __forceinline__ int high_nibbles(int v) { return (v >> 4) & 0x0F0F0F0F; }

// This lane's share of the activations of one int8 block: the two ints its 8 weights meet.
struct XPart {
  int a, b;
  float2 ds;
};

template <uint32_t TYPE>
__device__ __forceinline__ XPart load_x_part(const int8_t* block_qs, const float2* block_ds,
                                             int part) {
  XPart x;
  if constexpr (TYPE == kQ8_0) {
    const int2 v = *reinterpret_cast<const int2*>(block_qs + 8 * part);  // elements 8p..8p+7
    x.a = v.x;
    x.b = v.y;
  } else {
    x.a = *reinterpret_cast<const int*>(block_qs + 4 * part);       // elements 4p..4p+3
    x.b = *reinterpret_cast<const int*>(block_qs + 16 + 4 * part);  // elements 16+4p..
  }
  x.ds = *block_ds;
  return x;
}

// This lane's 8 weights of block ib of a row, dotted with its activation part. The
// block-wide offset terms (Q4_0's -8, Q4_1's min) are split evenly over the four lanes.
template <uint32_t TYPE>
__device__ __forceinline__ float dot_part_q8(const uint8_t* row, int ib, int part, const XPart& x) {
  if constexpr (TYPE == kQ4_0 || TYPE == kQ4_1) {
    using Block = std::conditional_t<TYPE == kQ4_0, BlockQ4_0, BlockQ4_1>;
    const Block* b = reinterpret_cast<const Block*>(row) + ib;
    const int q = load_int_aligned2(b->qs + 4 * part);
    const int sumi = __dp4a(high_nibbles(q), x.b, __dp4a(low_nibbles(q), x.a, 0));
    if constexpr (TYPE == kQ4_0)
      return half_bits_to_float(b->d) * (x.ds.x * sumi - 2.0f * x.ds.y);  // 8 * s / 4 lanes
    else
      return half_bits_to_float(b->d) * x.ds.x * sumi + 0.25f * half_bits_to_float(b->m) * x.ds.y;
  } else {
    const BlockQ8_0* b = reinterpret_cast<const BlockQ8_0*>(row) + ib;
    const uint8_t* qs = reinterpret_cast<const uint8_t*>(b->qs) + 8 * part;
    const int sumi = __dp4a(load_int_aligned2(qs + 4), x.b, __dp4a(load_int_aligned2(qs), x.a, 0));
    return half_bits_to_float(b->d) * x.ds.x * sumi;
  }
}

// Batch 1 of Q4_0/Q4_1 takes 2 rows per block (H200, 8B-shaped Q4_0, ms per decode step: 2
// rows 3.06 against 3.26 for 4; kernels/README.md); everything else rows_per_block().
template <uint32_t TYPE, int NB>
constexpr int kRows = NB == 1 && (TYPE == kQ4_0 || TYPE == kQ4_1) ? 2 : rows_per_block(NB);

template <uint32_t TYPE, int NB, bool GATE_UP>
__global__ void __launch_bounds__(kThreads)
    matvec_kernel(MatvecTasks tasks, MatvecInput in, int first_column) {
  wait_for_previous_kernel();
  allow_next_kernel();
  constexpr int R = kRows<TYPE, NB>;
  const MatvecTask& task = tasks.t[blockIdx.y];
  const int first_row = blockIdx.x * R;
  if (first_row >= task.n_out) return;  // the whole block leaves together
  const int rows_here = min(R, task.n_out - first_row);
  const uint8_t* w = static_cast<const uint8_t*>(task.weight) + first_row * task.row_bytes;
  const uint8_t* w_up =
      GATE_UP ? static_cast<const uint8_t*>(task.weight_up) + first_row * task.row_bytes : nullptr;

  float acc[R][NB], acc_up[R][NB];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int b = 0; b < NB; ++b) acc[r][b] = acc_up[r][b] = 0.0f;

  constexpr bool kQ8 = TYPE == kQ4_0 || TYPE == kQ4_1 || TYPE == kQ8_0;
  if constexpr (kQ8) {
    // Weights go through shared memory: each step the block copies kStepBlocks GGUF blocks
    // of each of its rows with 16-byte loads (GGUF blocks are only 2-byte aligned, so
    // per-block loads would be 2 bytes wide), the next step's copy in flight while this
    // one is consumed. The copy may read up to 15 bytes past a row's end (the model keeps
    // slack after every tensor).
    constexpr int kBlockBytes = block_bytes(TYPE);
    constexpr int kStepBlocks = 64;
    constexpr int kStageVectors = (kStepBlocks * kBlockBytes + 31) / 16 + 1;
    constexpr int kVectorsPerThread = (kStageVectors + kThreads - 1) / kThreads;
    constexpr int M = GATE_UP ? 2 : 1;
    __shared__ uint4 stage[2][M * R][kStageVectors];
    uint4 fetched[M * R][kVectorsPerThread];

    const int n_blocks = in.n_in / kQ8Block;
    const int n_steps = (n_blocks + kStepBlocks - 1) / kStepBlocks;
    const int part = threadIdx.x % kLanesPerQ8Block;
    const int8_t* xq = in.xq.qs + static_cast<int64_t>(first_column) * in.n_in;
    const float2* xds = in.xq.ds + static_cast<int64_t>(first_column) * n_blocks;
    auto row_of = [&](int mr) { return (mr < R ? w : w_up) + (mr % R) * task.row_bytes; };
    // The 16-byte vectors that cover step s of a row: first aligned address and count.
    auto span_of = [&](int mr, int s, const uint4*& first, int& count, int& skew) {
      const uint8_t* begin = row_of(mr) + static_cast<int64_t>(s) * kStepBlocks * kBlockBytes;
      const int bytes = min(kStepBlocks, n_blocks - s * kStepBlocks) * kBlockBytes;
      const uintptr_t aligned = reinterpret_cast<uintptr_t>(begin) & ~uintptr_t{15};
      first = reinterpret_cast<const uint4*>(aligned);
      skew = static_cast<int>(reinterpret_cast<uintptr_t>(begin) - aligned);
      count = (skew + bytes + 15) / 16;
    };
    // Calls f(mr, k, v, first) for each vector v of step s this thread copies (its k-th of row mr).
    auto each_vector = [&](int s, auto&& f) {
#pragma unroll
      for (int mr = 0; mr < M * R; ++mr) {
        if (mr % R >= rows_here) continue;
        const uint4* first;
        int count, skew;
        span_of(mr, s, first, count, skew);
#pragma unroll
        for (int k = 0; k < kVectorsPerThread; ++k) {
          const int v = threadIdx.x + k * kThreads;
          if (v < count) f(mr, k, v, first);
        }
      }
    };
    auto fetch = [&](int s) {
      each_vector(s, [&](int mr, int k, int v, const uint4* first) { fetched[mr][k] = first[v]; });
    };

    fetch(0);
    for (int s = 0; s < n_steps; ++s) {
      const int buf = s & 1;
      each_vector(s,
                  [&](int mr, int k, int v, const uint4*) { stage[buf][mr][v] = fetched[mr][k]; });
      __syncthreads();
      if (s + 1 < n_steps) fetch(s + 1);
      const int step_blocks = min(kStepBlocks, n_blocks - s * kStepBlocks);
#pragma unroll
      for (int h = 0; h < kStepBlocks / kQ8BlocksPerStep; ++h) {
        const int j = threadIdx.x / kLanesPerQ8Block + h * kQ8BlocksPerStep;
        if (j >= step_blocks) break;
        const int ib = s * kStepBlocks + j;
        XPart x[NB];
#pragma unroll
        for (int b = 0; b < NB; ++b)
          x[b] = load_x_part<TYPE>(xq + static_cast<int64_t>(b) * in.n_in + ib * kQ8Block,
                                   xds + static_cast<int64_t>(b) * n_blocks + ib, part);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if (r >= rows_here) break;
          const int skew = static_cast<int>(
              reinterpret_cast<uintptr_t>(row_of(r) +
                                          static_cast<int64_t>(s) * kStepBlocks * kBlockBytes) &
              15);
          const uint8_t* staged = reinterpret_cast<const uint8_t*>(stage[buf][r]) + skew;
#pragma unroll
          for (int b = 0; b < NB; ++b) acc[r][b] += dot_part_q8<TYPE>(staged, j, part, x[b]);
          if constexpr (GATE_UP) {
            const int skew_up = static_cast<int>(
                reinterpret_cast<uintptr_t>(row_of(R + r) +
                                            static_cast<int64_t>(s) * kStepBlocks * kBlockBytes) &
                15);
            const uint8_t* staged_up =
                reinterpret_cast<const uint8_t*>(stage[buf][R + r]) + skew_up;
#pragma unroll
            for (int b = 0; b < NB; ++b)
              acc_up[r][b] += dot_part_q8<TYPE>(staged_up, j, part, x[b]);
          }
        }
      }
    }
  } else {
    const int n_chunks = in.n_in / 8;
    const float* x = in.x + static_cast<int64_t>(first_column) * in.n_in;
#pragma unroll 2
    for (int c = threadIdx.x; c < n_chunks; c += kThreads) {
      float xv[NB][8];
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        const float4* xp =
            reinterpret_cast<const float4*>(x + static_cast<int64_t>(b) * in.n_in) + 2 * c;
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
        dequantize8<TYPE>(w + r * task.row_bytes, c, wv);
        if constexpr (GATE_UP) dequantize8<TYPE>(w_up + r * task.row_bytes, c, uv);
#pragma unroll
        for (int b = 0; b < NB; ++b)
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            acc[r][b] = fmaf(wv[i], xv[b][i], acc[r][b]);
            if constexpr (GATE_UP) acc_up[r][b] = fmaf(uv[i], xv[b][i], acc_up[r][b]);
          }
      }
    }
  }

  // Sum each accumulator over the warp, then over the block's warps.
  constexpr int kSlots = R * NB * (GATE_UP ? 2 : 1);
  __shared__ float partial[kWarpsPerBlock][kSlots];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
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
    if (r >= rows_here) continue;
    float v = 0.0f;
#pragma unroll
    for (int k = 0; k < kWarpsPerBlock; ++k) v += partial[k][i];
    if constexpr (GATE_UP) {
      float u = 0.0f;
#pragma unroll
      for (int k = 0; k < kWarpsPerBlock; ++k) u += partial[k][R * NB + i];
      v = silu(v) * u;
    }
    float* y = task.y + static_cast<int64_t>(first_column + b) * task.y_stride + first_row + r;
    *y = task.accumulate ? *y + v : v;
  }
}

template <uint32_t TYPE, int NB>
cudaError_t launch_columns(const MatvecTasks& tasks, int n_tasks, int max_rows, bool gate_up,
                           const MatvecInput& in, int first_column, const KernelConfig& config,
                           cudaStream_t stream) {
  const dim3 grid(ceil_div(max_rows, kRows<TYPE, NB>), n_tasks);
  if (gate_up)
    return launch_early(matvec_kernel<TYPE, NB, true>, grid, dim3(kThreads), config, stream, tasks,
                        in, first_column);
  return launch_early(matvec_kernel<TYPE, NB, false>, grid, dim3(kThreads), config, stream, tasks,
                      in, first_column);
}

}  // namespace

bool matvec_reads_q8(uint32_t weight_type, bool split_layout) {
  return split_layout || weight_type == kQ4_0 || weight_type == kQ4_1 || weight_type == kQ8_0;
}

cudaError_t launch_matvec(uint32_t weight_type, const MatvecTask* tasks, int n_tasks,
                          const MatvecInput& input, const KernelConfig& config,
                          cudaStream_t stream) {
  if (n_tasks < 1 || n_tasks > kMaxMatvecTasks || input.batch < 0) return cudaErrorInvalidValue;
  if (!is_supported_weight_type(weight_type)) return cudaErrorInvalidValue;
  if (input.n_in % block_elems(weight_type) != 0 || input.n_in % kQ8Block != 0)
    return cudaErrorInvalidValue;
  for (int i = 0; i < n_tasks; ++i)
    if (tasks[i].split_layout != tasks[0].split_layout) return cudaErrorInvalidValue;
  if (tasks[0].split_layout) {
    if (!split::supports(weight_type)) return cudaErrorInvalidValue;
    return launch_status(launch_matvec_split(weight_type, tasks, n_tasks, input, config, stream));
  }
  MatvecTasks packed{};
  int max_rows = 0;
  const bool gate_up = tasks[0].weight_up != nullptr;
  if (input.norm_sum_squares) return cudaErrorInvalidValue;  // the split kernels' fusion only
  for (int i = 0; i < n_tasks; ++i) {
    if ((tasks[i].weight_up != nullptr) != gate_up || tasks[i].y_q8.qs)
      return cudaErrorInvalidValue;
    packed.t[i] = tasks[i];
    max_rows = std::max(max_rows, tasks[i].n_out);
  }
  if (input.batch == 0 || max_rows == 0) return cudaSuccess;
  cudaError_t status = cudaSuccess;
  const bool ok = dispatch_weight_type(weight_type, [&](auto type_tag) {
    constexpr uint32_t TYPE = decltype(type_tag)::value;
    status = for_each_column_group(input.batch, [&](int first_column, auto columns) {
      return launch_columns<TYPE, decltype(columns)::value>(packed, n_tasks, max_rows, gate_up,
                                                            input, first_column, config, stream);
    });
  });
  if (!ok) return cudaErrorInvalidValue;
  return launch_status(status);
}

}  // namespace granule::kernels
