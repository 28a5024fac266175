// Matrix-vector kernels: one warp per output row, lanes striding over the row's blocks.
// Q4_0/Q4_1/Q8_0 use 4-way int8 dot products against int8 activations (a weight nibble
// costs well under one instruction, so decode stays bound by memory); the other types
// decode 8 elements at a time to f32.
#include "matvec.cuh"

#include "quant_blocks.cuh"

namespace granule::kernels {
namespace {

constexpr int kWarpsPerBlock = 4;

struct MatvecTasks {
  MatvecTask t[kMaxMatvecTasks];
};

__device__ __forceinline__ int low_nibbles(int v) { return v & 0x0F0F0F0F; }
__device__ __forceinline__ int high_nibbles(int v) { return (v >> 4) & 0x0F0F0F0F; }

// Dot of int8 weight block `ib` of row w with int8 activation block of one column.
template <uint32_t TYPE>
__device__ __forceinline__ float dot_block_q8(const uint8_t* w, int ib, const int4* xq_block, float2 xds) {
  const int4 xa = xq_block[0], xb = xq_block[1];
  const int x[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
  if constexpr (TYPE == kQ4_0 || TYPE == kQ4_1) {
    using Block = std::conditional_t<TYPE == kQ4_0, BlockQ4_0, BlockQ4_1>;
    const Block* b = reinterpret_cast<const Block*>(w) + ib;
    int sumi = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int q = load_int_aligned2(b->qs + 4 * j);
      sumi = __dp4a(low_nibbles(q), x[j], sumi);        // elements 4j..4j+3
      sumi = __dp4a(high_nibbles(q), x[j + 4], sumi);   // elements 16+4j..
    }
    if constexpr (TYPE == kQ4_0)
      return half_bits_to_float(b->d) * (xds.x * sumi - 8.0f * xds.y);
    else
      return half_bits_to_float(b->d) * xds.x * sumi + half_bits_to_float(b->m) * xds.y;
  } else {
    const BlockQ8_0* b = reinterpret_cast<const BlockQ8_0*>(w) + ib;
    int sumi = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) sumi = __dp4a(load_int_aligned2(reinterpret_cast<const uint8_t*>(b->qs) + 4 * j), x[j], sumi);
    return half_bits_to_float(b->d) * xds.x * sumi;
  }
}

template <uint32_t TYPE, int NB, bool GATE_UP>
__global__ void __launch_bounds__(kWarpsPerBlock * kWarpSize)
matvec_kernel(MatvecTasks tasks, MatvecInput in, int first_column) {
  const MatvecTask& task = tasks.t[blockIdx.y];
  const int lane = threadIdx.x % kWarpSize;
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (row >= task.n_out) return;
  const uint8_t* w = static_cast<const uint8_t*>(task.weight) + row * task.row_bytes;
  const uint8_t* w_up = GATE_UP ? static_cast<const uint8_t*>(task.weight_up) + row * task.row_bytes : nullptr;

  float acc[NB], acc_up[NB];
#pragma unroll
  for (int b = 0; b < NB; ++b) acc[b] = acc_up[b] = 0.0f;

  constexpr bool kQ8 = TYPE == kQ4_0 || TYPE == kQ4_1 || TYPE == kQ8_0;
  if constexpr (kQ8) {
    const int n_blocks = in.n_in / kQ8Block;
    const int8_t* xq = in.xq.qs + static_cast<int64_t>(first_column) * in.n_in;
    const float2* xds = in.xq.ds + static_cast<int64_t>(first_column) * n_blocks;
#pragma unroll 2
    for (int ib = lane; ib < n_blocks; ib += kWarpSize) {
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        const int4* xb = reinterpret_cast<const int4*>(xq + static_cast<int64_t>(b) * in.n_in + ib * kQ8Block);
        const float2 ds = xds[static_cast<int64_t>(b) * n_blocks + ib];
        acc[b] += dot_block_q8<TYPE>(w, ib, xb, ds);
        if constexpr (GATE_UP) acc_up[b] += dot_block_q8<TYPE>(w_up, ib, xb, ds);
      }
    }
  } else {
    const int n_chunks = in.n_in / 8;
    const float* x = in.x + static_cast<int64_t>(first_column) * in.n_in;
#pragma unroll 2
    for (int c = lane; c < n_chunks; c += kWarpSize) {
      float wv[8], uv[8];
      dequantize8<TYPE>(w, c, wv);
      if constexpr (GATE_UP) dequantize8<TYPE>(w_up, c, uv);
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        const float4* xp = reinterpret_cast<const float4*>(x + static_cast<int64_t>(b) * in.n_in) + 2 * c;
        const float4 x0 = xp[0], x1 = xp[1];
        const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          acc[b] = fmaf(wv[i], xv[i], acc[b]);
          if constexpr (GATE_UP) acc_up[b] = fmaf(uv[i], xv[i], acc_up[b]);
        }
      }
    }
  }

#pragma unroll
  for (int b = 0; b < NB; ++b) {
    float v = warp_sum(acc[b]);
    if constexpr (GATE_UP) v = silu(v) * warp_sum(acc_up[b]);
    if (lane == 0) {
      float* y = task.y + static_cast<int64_t>(first_column + b) * task.y_stride + row;
      *y = task.accumulate ? *y + v : v;
    }
  }
}

template <uint32_t TYPE, int NB>
void launch_columns(const MatvecTasks& tasks, int n_tasks, int max_rows, bool gate_up,
                    const MatvecInput& in, int first_column, cudaStream_t stream) {
  const dim3 grid(ceil_div(max_rows, kWarpsPerBlock), n_tasks);
  const int threads = kWarpsPerBlock * kWarpSize;
  if (gate_up)
    matvec_kernel<TYPE, NB, true><<<grid, threads, 0, stream>>>(tasks, in, first_column);
  else
    matvec_kernel<TYPE, NB, false><<<grid, threads, 0, stream>>>(tasks, in, first_column);
}

}  // namespace

bool matvec_reads_q8(uint32_t weight_type) {
  return weight_type == kQ4_0 || weight_type == kQ4_1 || weight_type == kQ8_0;
}

cudaError_t launch_matvec(uint32_t weight_type, const MatvecTask* tasks, int n_tasks,
                          const MatvecInput& input, cudaStream_t stream) {
  if (n_tasks < 1 || n_tasks > kMaxMatvecTasks || input.batch < 0) return cudaErrorInvalidValue;
  if (!is_supported_weight_type(weight_type)) return cudaErrorInvalidValue;
  if (input.n_in % block_elems(weight_type) != 0 || input.n_in % kQ8Block != 0) return cudaErrorInvalidValue;
  MatvecTasks packed{};
  int max_rows = 0;
  const bool gate_up = tasks[0].weight_up != nullptr;
  for (int i = 0; i < n_tasks; ++i) {
    if ((tasks[i].weight_up != nullptr) != gate_up) return cudaErrorInvalidValue;
    packed.t[i] = tasks[i];
    max_rows = std::max(max_rows, tasks[i].n_out);
  }
  if (input.batch == 0 || max_rows == 0) return cudaSuccess;
  // Columns go in groups of 16, 8, 4, 2, 1: each group reads the weights once.
  const bool ok = dispatch_weight_type(weight_type, [&](auto type_tag) {
    constexpr uint32_t TYPE = decltype(type_tag)::value;
    int column = 0;
    while (column < input.batch) {
      const int left = input.batch - column;
      const int nb = left >= 16 ? 16 : left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
      switch (nb) {
        case 16: launch_columns<TYPE, 16>(packed, n_tasks, max_rows, gate_up, input, column, stream); break;
        case 8: launch_columns<TYPE, 8>(packed, n_tasks, max_rows, gate_up, input, column, stream); break;
        case 4: launch_columns<TYPE, 4>(packed, n_tasks, max_rows, gate_up, input, column, stream); break;
        case 2: launch_columns<TYPE, 2>(packed, n_tasks, max_rows, gate_up, input, column, stream); break;
        default: launch_columns<TYPE, 1>(packed, n_tasks, max_rows, gate_up, input, column, stream); break;
      }
      column += nb;
    }
  });
  if (!ok) return cudaErrorInvalidValue;
  return launch_status();
}

}  // namespace granule::kernels
