// The expert products of small runs (decode; moe.cuh, launch_moe_*_decode): whole warps own
// weight rows and every lane keeps several weight chunks of several rows in flight, where the
// per-pair dp4a kernels of moe.cu (a block of 4 warps per 4 rows, 2 chunks per thread, one pair
// after another in the fused down) left most of the memory system idle. Gate/up writes h's int8
// blocks in its epilogue (no quantize launch), and down takes a row's pairs in parallel warps and
// adds them into the residual in top-k order. The summation order within a dot is the dp4a
// kernels' (warp_dots), so every result has their bits: the CPU oracle and the tests need no new
// bound.
#include "moe.cuh"
#include "moe_product.cuh"
#include "moe_unpack.cuh"
#include "quant_blocks.cuh"

namespace granule::kernels {
namespace {

// The dp4a kernels split a dot's chunks of 8 over 4 warps (chunk c to thread c % 128, each thread
// summing its chunks in order), reduce each warp's sums by warp_sum and add the 4 warps' results
// in warp order from 0. One warp reproduces that with kSplit partial sums per row: lane l takes
// the chunks c ≡ l (mod 32) and adds chunk c into partial (c / 32) % kSplit.
constexpr int kSplit = 4;
constexpr int kRowsPerWarp = 4;
// Gate/up: a block's 32 output rows are one int8 block of h.
constexpr int kGateUpWarps = kQ8Block / kRowsPerWarp;
constexpr int kDownWarps = 8;
// Output rows per down block, in items of (pair, 8 rows), or (pair, 4 rows) where a row's pairs
// leave warps idle (n_used <= 4: gpt-oss, Mixtral), so each warp takes one item.
constexpr int kDownRows = 8;

// Blocks of 8 warps per SM the products are compiled for: up to 128 registers a thread, where
// nvcc's own choice (80) spills and holds fewer loads in flight, and a batch-1 launch (qwen3-30b:
// 192 gate/up and 256 down blocks) still fits 132 SMs in one wave, which one block per SM (255
// registers) would not. The split-layout types (moe_unpack::split_rows) unpack a chunk from one
// 8-byte load and fit 80 registers without spilling (ptxas -v, sm_90: gate/up of MXFP4 took 87
// at 2 blocks, none spill at 3), so they take 3: gpt-oss's batch-1 launches (360 gate/up blocks of
// 90 x 4 pairs, 360 down blocks) then fit 132 SMs in one wave (396 blocks) rather than 264 and a
// tail of 96.
template <uint32_t TYPE>
constexpr int blocks_per_sm() {
  return moe_unpack::split_rows(TYPE) ? 3 : 2;
}

// Requests the bytes [p, p + bytes) into L2, one prefetch per STRIDE bytes a lane, with no
// register held for them: a warp's rows are then on their way from HBM together, whatever its
// loads wait for (the chunk loads of the GGUF-block types stay about one memory latency apart,
// ptxas sm_90). STRIDE 0: none.
template <int STRIDE>
__device__ __forceinline__ void prefetch_l2(const uint8_t* p, int64_t bytes) {
  if constexpr (STRIDE > 0) {
    const int lane = threadIdx.x % kWarpSize;
    const uintptr_t start = reinterpret_cast<uintptr_t>(p) & ~static_cast<uintptr_t>(STRIDE - 1);
    const uintptr_t end = reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes);
    for (uintptr_t a = start + static_cast<uintptr_t>(lane) * STRIDE; a < end;
         a += static_cast<uintptr_t>(kWarpSize) * STRIDE)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
  }
}

// The prefetch stride a type's decode kernels take in the product (launch_moe_*_decode's
// l2_prefetch_stride < 0): 128-byte lines for Q6_K's down launches only. Measured on an H100
// (moe_products_bench, 48-layer graphs, µs per layer): without a prefetch Q4_K down took 10.6
// (1 row) and 35.2 (4 rows) against 14.8 and 47.1 with one, gate/up 14.4-14.5 against 16.8 and
// 40.5 against 44.0, gpt-oss's MXFP4 down 24.3 / 51.2 against 25.5 / 55.0; Q6_K down 16.9 / 58.7
// against 16.8 / 50.7 (its 210-byte blocks read in 2-byte loads). Lines of 32 bytes never won.
constexpr int default_prefetch_stride(uint32_t type, bool down) {
  return down && type == kQ6_K ? 128 : 0;
}

// K consecutive chunk groups of NR rows into acc (the chunks first, first + 128, ... of lane 0;
// lane l takes chunk + l; chunks past n_chunks add nothing): every weight and activation load of
// the K x NR chunks is issued before the first product uses one, so a lane has K x NR chunk loads
// in flight rather than one (ptxas kept them one chunk at a time while the loads sat under the
// per-row and per-group conditions, ~1 memory latency a chunk). Rows i >= valid read row 0 and add
// nothing.
template <uint32_t TYPE, int NR, int K>
__device__ __forceinline__ void dot_groups(const uint8_t* const (&row)[NR], int valid,
                                           const int8_t* __restrict__ xqs,
                                           const float2* __restrict__ xds, int n_chunks, int first,
                                           float (&acc)[NR]) {
  constexpr bool kOffset = moe_unpack::has_offset(TYPE);
  const int lane = threadIdx.x % kWarpSize;
  moe_unpack::Chunk8 wc[K][NR];
  int2 q[K];
  float xd[K];
  bool in[K];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int c_lane = first + k * kSplit * kWarpSize + lane;
    in[k] = c_lane < n_chunks;
    const int c = in[k] ? c_lane : n_chunks - 1;  // a chunk that exists; its product is dropped
#pragma unroll
    for (int i = 0; i < NR; ++i) wc[k][i] = moe_unpack::unpack8<TYPE>(row[i], 8 * n_chunks, c);
    q[k] = *reinterpret_cast<const int2*>(xqs + 8 * static_cast<int64_t>(c));
    xd[k] = xds[c / 4].x;
  }
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int xs = kOffset ? __dp4a(0x01010101, q[k].y, __dp4a(0x01010101, q[k].x, 0)) : 0;
#pragma unroll
    for (int i = 0; i < NR; ++i) {
      const float v = moe_q8_fma<kOffset>(wc[k][i], q[k].x, q[k].y, xs, xd[k], acc[i]);
      if (in[k] && i < valid) acc[i] = v;
    }
  }
}

// NR weight rows (w[i], i < valid) dotted with one int8 activation row (xqs, xds) of n_chunks
// chunks by one warp; sum[i] is exact on lane 0 only (the dp4a kernels' lane-0 butterfly).
// Partial s (the chunks c with (c / 32) % kSplit == s) is summed over its chunks in order, two
// groups of NR chunks at a time (dot_groups), reduced across the warp and added to the row's sum
// in partial order: the sums, butterflies and order of the dp4a kernels, one partial at a time so
// that 8 accumulators a row rather than 32 leave registers for the loads in flight.
template <uint32_t TYPE, int NR, int K>
__device__ __forceinline__ void warp_dots(const uint8_t* const (&w)[NR], int valid,
                                          const int8_t* __restrict__ xqs,
                                          const float2* __restrict__ xds, int n_chunks,
                                          float (&sum)[NR]) {
  const uint8_t* row[NR];
#pragma unroll
  for (int i = 0; i < NR; ++i) {
    row[i] = i < valid ? w[i] : w[0];
    sum[i] = 0.0f;
  }
  constexpr int kStride = kSplit * kWarpSize;
#pragma unroll
  for (int s = 0; s < kSplit; ++s) {
    // A partial without chunks (n_in < 1024) adds +0 after its shuffles, which changes no sum (a
    // sum that starts at +0 and adds products is never -0): skip them.
    if (s * kWarpSize >= n_chunks) break;
    float acc[NR];
#pragma unroll
    for (int i = 0; i < NR; ++i) acc[i] = 0.0f;
    int first = s * kWarpSize;
#pragma unroll 1
    for (; first + (K - 1) * kStride < n_chunks; first += K * kStride)
      dot_groups<TYPE, NR, K>(row, valid, xqs, xds, n_chunks, first, acc);
    if constexpr (K > 1) {
#pragma unroll 1
      for (; first < n_chunks; first += kStride)
        dot_groups<TYPE, NR, 1>(row, valid, xqs, xds, n_chunks, first, acc);
    }
    warp_sums(acc);
#pragma unroll
    for (int i = 0; i < NR; ++i) sum[i] += acc[i];
  }
}

// Passes of its 8 rows a gate/up warp loads at once: two, or one for the types with which two
// spill (ptxas -v, sm_90: Q2_K 12 bytes, Q3_K 28, Q6_K 112, IQ4_NL 28, IQ4_XS 8).
template <uint32_t TYPE>
constexpr int gate_up_passes() {
  return TYPE == kQ2_K || TYPE == kQ3_K || TYPE == kQ6_K || TYPE == kIQ4_NL || TYPE == kIQ4_XS ? 1
                                                                                               : 2;
}

template <uint32_t TYPE, int PREFETCH>
__global__ void __launch_bounds__(kGateUpWarps* kWarpSize, blocks_per_sm<TYPE>())
    moe_gate_up_decode_kernel(MoeProduct P, ActivationQ8 hq) {
  __shared__ float act[kQ8Block];
  wait_for_previous_kernel();
  allow_next_kernel();
  const MoeInput& in = P.in;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int pair = blockIdx.y;
  const int expert = in.ids[pair];
  const int first = blockIdx.x * kQ8Block + warp * kRowsPerWarp;
  const int64_t rb = P.a.row_bytes;
  const uint8_t* g = static_cast<const uint8_t*>(P.a.table[expert]) + first * rb;
  const uint8_t* u = static_cast<const uint8_t*>(P.b.table[expert]) + first * rb;
  const uint8_t* const w[2 * kRowsPerWarp] = {g, g + rb, g + 2 * rb, g + 3 * rb,
                                              u, u + rb, u + 2 * rb, u + 3 * rb};
  prefetch_l2<PREFETCH>(g, kRowsPerWarp * rb);
  prefetch_l2<PREFETCH>(u, kRowsPerWarp * rb);
  const int64_t x_row = pair / in.n_used;
  float sum[2 * kRowsPerWarp];
  warp_dots<TYPE, 2 * kRowsPerWarp, gate_up_passes<TYPE>()>(
      w, 2 * kRowsPerWarp, in.xq.qs + x_row * in.n_in, in.xq.ds + x_row * (in.n_in / kQ8Block),
      in.n_in / 8, sum);
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int64_t o = static_cast<int64_t>(expert) * P.n_out + first + r;
      float gv = sum[r];
      if (P.a.bias) gv += P.a.bias[o];
      float uv = sum[kRowsPerWarp + r];
      if (P.b.bias) uv += P.b.bias[o];
      act[warp * kRowsPerWarp + r] = moe_activate(P.act, gv, uv);
    }
  }
  __syncthreads();
  if (warp != 0) return;
  // The block's 32 values: h, and their int8 block as quantize_q8_kernel makes it from h.
  const float v = act[lane];
  const int64_t at = static_cast<int64_t>(pair) * P.n_out + blockIdx.x * kQ8Block;
  P.out[at + lane] = v;
  if (hq.qs) quantize_block_of_warp(v, hq.qs + at, hq.ds + at / kQ8Block);
}

// One warp's item of the down launch: rows first .. first + valid - 1 (valid <= NR) of pair p's
// expert against the pair's int8 activation row, each row's sum (+ bias) into out[r] (lane 0).
// Items of 4 rows (n_used <= 4) take two passes at once, items of 8 one (two spill at 80
// registers), so a lane has 8 chunk loads in flight either way.
template <uint32_t TYPE, int NR, int K>
__device__ __forceinline__ void down_item(const MoeMatrix& down, int n_out, const MoeInput& in,
                                          int64_t p, int first, int valid, float* out) {
  const int expert = in.ids[p];
  const int64_t rb = down.row_bytes;
  const uint8_t* w0 = static_cast<const uint8_t*>(down.table[expert]) + first * rb;
  const uint8_t* w[NR];
#pragma unroll
  for (int r = 0; r < NR; ++r) w[r] = w0 + r * rb;  // only rows < valid are read
  float sum[NR];
  warp_dots<TYPE, NR, K>(w, valid, in.xq.qs + p * in.n_in, in.xq.ds + p * (in.n_in / kQ8Block),
                         in.n_in / 8, sum);
  if (threadIdx.x % kWarpSize != 0) return;
#pragma unroll
  for (int r = 0; r < NR; ++r) {
    if (r >= valid) continue;
    float v = sum[r];
    if (down.bias) v += down.bias[static_cast<int64_t>(expert) * n_out + first + r];
    out[r] = v;
  }
}

template <uint32_t TYPE, int PREFETCH>
__global__ void __launch_bounds__(kDownWarps* kWarpSize, blocks_per_sm<TYPE>())
    moe_down_combine_decode_kernel(MoeMatrix down, int n_out, MoeInput in,
                                   const float* __restrict__ weights, float* __restrict__ hidden) {
  __shared__ float dots[kMoeMaxUsed][kDownRows];
  wait_for_previous_kernel();
  allow_next_kernel();
  const int warp = threadIdx.x / kWarpSize;
  const int row = blockIdx.y, first_row = blockIdx.x * kDownRows;
  const int rows_here = min(kDownRows, n_out - first_row);
  const int64_t rb = down.row_bytes;
  const int parts = 2 * in.n_used <= kDownWarps ? 2 : 1;  // items per pair
  const int item_rows = kDownRows / parts;
  const int items = in.n_used * parts;
  for (int item = warp; PREFETCH > 0 && item < items; item += kDownWarps) {
    const int j = item / parts, r0 = (item % parts) * item_rows;
    const int valid = min(item_rows, rows_here - r0);
    if (valid <= 0) continue;
    const int expert = in.ids[static_cast<int64_t>(row) * in.n_used + j];
    prefetch_l2<PREFETCH>(static_cast<const uint8_t*>(down.table[expert]) + (first_row + r0) * rb,
                          valid * rb);
  }
  for (int item = warp; item < items; item += kDownWarps) {
    const int j = item / parts, r0 = (item % parts) * item_rows;
    const int valid = min(item_rows, rows_here - r0);
    if (valid <= 0) continue;  // the whole warp
    const int64_t p = static_cast<int64_t>(row) * in.n_used + j;
    if (parts == 2)
      down_item<TYPE, kDownRows / 2, 2>(down, n_out, in, p, first_row + r0, valid, &dots[j][r0]);
    else
      down_item<TYPE, kDownRows, 1>(down, n_out, in, p, first_row + r0, valid, &dots[j][r0]);
  }
  __syncthreads();
  if (static_cast<int>(threadIdx.x) >= rows_here) return;
  // As moe_down_combine_kernel adds them: top-k order, then the residual.
  float out = 0.0f;
  for (int j = 0; j < in.n_used; ++j)
    out = __fadd_rn(
        out, __fmul_rn(weights[static_cast<int64_t>(row) * in.n_used + j], dots[j][threadIdx.x]));
  float* h = hidden + static_cast<int64_t>(row) * n_out + first_row + threadIdx.x;
  *h = __fadd_rn(*h, out);
}

bool input_fits(uint32_t type, const MoeInput& in) {
  return moe_supports(type) && moe_reads_q8(type) && in.n_in > 0 && in.n_in % kQ8Block == 0 &&
         in.n_in % block_elems(type) == 0 && in.n_used > 0 && in.n_used <= kMoeMaxUsed && in.ids &&
         in.xq.qs && in.xq.ds && !in.groups.tiles;
}

// f(std::integral_constant<int, STRIDE>) for a prefetch stride the kernels are compiled for (0 or
// 128 bytes; < 0: the type's default_prefetch_stride), else cudaErrorInvalidValue.
template <uint32_t TYPE, class F>
cudaError_t with_prefetch_stride(int stride, bool down, F&& f) {
  switch (stride < 0 ? default_prefetch_stride(TYPE, down) : stride) {
    case 0:
      return f(std::integral_constant<int, 0>{});
    case 128:
      return f(std::integral_constant<int, 128>{});
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t launch_moe_gate_up_decode(const MoeMatrix& gate, const MoeMatrix& up, MoeActivation act,
                                      int n_out, const MoeInput& in, float* h, ActivationQ8 hq,
                                      const KernelConfig& config, cudaStream_t stream,
                                      int l2_prefetch_stride) {
  if (in.pairs <= 0 || n_out <= 0) return cudaSuccess;
  if (!input_fits(gate.type, in) || up.type != gate.type || up.row_bytes != gate.row_bytes ||
      n_out % kQ8Block != 0 || !h || in.pairs > 65535 || n_out / kQ8Block > 65535)
    return cudaErrorInvalidValue;
  const MoeProduct P = gate_up_product(gate, up, act, n_out, in, h);
  cudaError_t status = cudaSuccess;
  dispatch_weight_type(gate.type, [&](auto tag) {
    constexpr uint32_t TYPE = decltype(tag)::value;
    if constexpr (TYPE != kF32 && TYPE != kF16 && TYPE != kBF16)
      status = with_prefetch_stride<TYPE>(l2_prefetch_stride, false, [&](auto stride) {
        return launch_early(moe_gate_up_decode_kernel<TYPE, decltype(stride)::value>,
                            dim3(n_out / kQ8Block, in.pairs), dim3(kGateUpWarps * kWarpSize),
                            config, stream, P, hq);
      });
  });
  return launch_status(status);
}

cudaError_t launch_moe_down_combine_decode(const MoeMatrix& down, int n_out, const MoeInput& in,
                                           const float* weights, float* hidden,
                                           const KernelConfig& config, cudaStream_t stream,
                                           int l2_prefetch_stride) {
  if (in.pairs <= 0 || n_out <= 0) return cudaSuccess;
  if (!input_fits(down.type, in) || in.pairs % in.n_used != 0 || !weights || !hidden)
    return cudaErrorInvalidValue;
  const int rows = in.pairs / in.n_used;
  if (rows > 65535) return cudaErrorInvalidValue;
  cudaError_t status = cudaSuccess;
  dispatch_weight_type(down.type, [&](auto tag) {
    constexpr uint32_t TYPE = decltype(tag)::value;
    if constexpr (TYPE != kF32 && TYPE != kF16 && TYPE != kBF16)
      status = with_prefetch_stride<TYPE>(l2_prefetch_stride, true, [&](auto stride) {
        return launch_early(moe_down_combine_decode_kernel<TYPE, decltype(stride)::value>,
                            dim3(ceil_div(n_out, kDownRows), rows), dim3(kDownWarps * kWarpSize),
                            config, stream, down, n_out, in, weights, hidden);
      });
  });
  return launch_status(status);
}

}  // namespace granule::kernels
