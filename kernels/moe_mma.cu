// The grouped expert products on int8 tensor cores (moe.cuh: launch_moe_gate_up_mma,
// launch_moe_down_mma). A block of 4 warps takes one tile of launch_moe_group (up to 8 · NT
// pairs routed to one expert) and 64 output rows; each warp owns 16 of them (gate/up: 16 rows
// of each matrix) and runs the whole input length alone, so no barrier is needed and the warps
// of an SM overlap each other's loads:
//   - the weights: chunks of a few sub-blocks (a K-quant super-block, or 4 blocks of 32) loaded
//     from the GGUF bytes with plain loads into registers one chunk ahead of their use
//     (moe_mma_frag.cuh), so experts in mapped pinned host memory are read as those in VRAM
//     (no cp.async from host memory);
//   - the activations: each n-tile's int8 rows gathered through groups.order (L1/L2 hits: the
//     4 warps of a block read the same rows), in the weight type's k layout;
//   - per sub-block and n-tile one mma.sync m16n8k32 (Q6_K: two m16n8k16, one per 16-element
//     scale, combined exactly), its integer result (exact in f32) scaled by the weight's and the
//     activation's scales and added in f32 (explicit roundings, so every instantiation gives
//     the same bits for a pair: tile size and neighbours do not matter).
// Bias, activation (SwiGLU, gpt-oss's clamped one or Gemma 4's GeGLU) and the scatter to each
// pair's output row close the tile.
#include "mma_tiles.cuh"
#include "moe.cuh"
#include "moe_mma_frag.cuh"
#include "moe_product.cuh"
#include "quant_blocks.cuh"

namespace granule::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kRowsPerWarp = 16;
constexpr int kRowsPerBlock = kWarps * kRowsPerWarp;
// The mma results start from 1.5 · 2^23 (these bits as int32): the f32 whose bits the int32
// result holds is then 1.5 · 2^23 + a·b exactly (|a·b| <= 32 · 128 · 128 < 2^22), and one f32
// subtraction gives a·b, where an int-to-float conversion would run at an eighth of the FP32
// rate (matvec_mma.cu does the same).
constexpr uint32_t kMagicBits = 0x4B400000u;
constexpr float kMagic = 12582912.0f;
__device__ __forceinline__ float unmagic(int c) { return __fsub_rn(__int_as_float(c), kMagic); }

template <uint32_t TYPE, bool GATE_UP, int NT>
__global__ void __launch_bounds__(kThreads) moe_mma_kernel(MoeProduct P) {
  using F = moe_mma::Frag<TYPE>;
  using Raw = typename F::Raw;
  constexpr int M = GATE_UP ? 2 : 1;
  constexpr int KS = F::kSubs;
  wait_for_previous_kernel();  // the tiles, order and activations are the step's
  allow_next_kernel();
  const MoeInput& in = P.in;
  if (static_cast<int>(blockIdx.y) >= *in.groups.n_tiles) return;
  const MoeTile tile = in.groups.tiles[blockIdx.y];
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, t = lane % 4;  // the mma fragments' group and thread in group
  const int row0 = static_cast<int>(blockIdx.x) * kRowsPerBlock + warp * kRowsPerWarp;
  if (row0 >= P.n_out) return;  // whole warps; no barrier follows
  const int n_in = in.n_in, n_sub = n_in / kQ8Block, n_out = P.n_out;
  const int tiles_here = (tile.count + 7) / 8;  // n-tiles with pairs (warp-uniform)

  // Each n-tile's activation row of column g (element offset into xq.qs) and of columns 2t,
  // 2t + 1 (block offsets into xq.ds); columns past the tile's pairs repeat its last pair
  // (computed in their own mma columns, never stored).
  int x_col[NT], ds_col[NT][2];
  auto x_row = [&](int column) {
    const int pair = in.groups.order[tile.first + min(column, tile.count - 1)];
    return in.per_pair_input ? pair : pair / in.n_used;
  };
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    x_col[nt] = x_row(nt * 8 + g) * n_in;
    ds_col[nt][0] = x_row(nt * 8 + 2 * t) * n_sub;
    ds_col[nt][1] = x_row(nt * 8 + 2 * t + 1) * n_sub;
  }

  // This lane's weight rows g and g + 8 of each matrix; rows past the end repeat the last one.
  const int64_t row_bytes = P.a.row_bytes;
  const uint8_t* rows[M][2];
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const auto* base = static_cast<const uint8_t*>((m == 0 ? P.a.table : P.b.table)[tile.expert]);
#pragma unroll
    for (int h = 0; h < 2; ++h)
      rows[m][h] = base + static_cast<int64_t>(min(row0 + g + 8 * h, n_out - 1)) * row_bytes;
  }

  float acc[M][NT][4];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[m][nt][i] = 0.0f;

  const int n_chunks = (n_sub + KS - 1) / KS;
  Raw cur[M][2], next[M][2];
  auto load = [&](Raw(&raw)[M][2], int chunk) {
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) F::load(raw[m][h], rows[m][h], chunk * KS, n_sub, t);
  };
  load(cur, 0);
#pragma unroll 1
  for (int chunk = 0; chunk < n_chunks; ++chunk) {
    if (chunk + 1 < n_chunks) load(next, chunk + 1);  // in flight while this chunk computes
#pragma unroll
    for (int j = 0; j < KS; ++j) {
      const int sub = chunk * KS + j;
      if (sub >= n_sub) break;  // warp-uniform: a last chunk of 32-element blocks
      moe_mma::Sub s[M][2];
      float scale_lo[M][2], scale_hi[M][2];  // kSplit16: the int8 scales as f32 (exact)
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          s[m][h] = F::sub(cur[m][h], j);
          scale_lo[m][h] = moe_mma::small_int_to_float(s[m][h].s_lo);
          scale_hi[m][h] = moe_mma::small_int_to_float(s[m][h].s_hi);
        }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        if (nt >= tiles_here) break;
        const int8_t* x = in.xq.qs + x_col[nt] + sub * kQ8Block;
        uint32_t b0, b1;
        if constexpr (F::kContiguous) {
          const uint2 v = *reinterpret_cast<const uint2*>(x + 8 * t);
          b0 = v.x;
          b1 = v.y;
        } else {
          b0 = *reinterpret_cast<const uint32_t*>(x + 4 * t);
          b1 = *reinterpret_cast<const uint32_t*>(x + 16 + 4 * t);
        }
        const float2 d0 = in.xq.ds[ds_col[nt][0] + sub], d1 = in.xq.ds[ds_col[nt][1] + sub];
#pragma unroll
        for (int m = 0; m < M; ++m) {
          float c[4];  // the sub-block's integer dot products, exact in f32
          if constexpr (F::kSplit16) {
            // Q6_K: s_lo · lo + s_hi · hi, each |product| < 2^23 and the sum < 2^24: exact.
            int lo[4], hi[4];
            mma::mma_s8_k16(lo, s[m][0].lo, s[m][1].lo, b0, kMagicBits);
            mma::mma_s8_k16(hi, s[m][0].hi, s[m][1].hi, b1, kMagicBits);
#pragma unroll
            for (int i = 0; i < 4; ++i)
              c[i] = __fmaf_rn(scale_hi[m][i / 2], unmagic(hi[i]),
                               __fmul_rn(scale_lo[m][i / 2], unmagic(lo[i])));
          } else {
            const uint32_t a[4] = {s[m][0].lo, s[m][1].lo, s[m][0].hi, s[m][1].hi};
            int bits[4];
            mma::mma_s8(bits, a, b0, b1, kMagicBits);
#pragma unroll
            for (int i = 0; i < 4; ++i) c[i] = unmagic(bits[i]);
          }
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float2 dx = (i & 1) ? d1 : d0;  // (d, d · Σ q) of column 2t + (i & 1)
            float v = __fmaf_rn(s[m][i / 2].d, __fmul_rn(dx.x, c[i]), acc[m][nt][i]);
            if constexpr (F::kOffset) v = __fmaf_rn(s[m][i / 2].m, dx.y, v);
            acc[m][nt][i] = v;
          }
        }
      }
    }
    if (chunk + 1 < n_chunks) {
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) cur[m][h] = next[m][h];
    }
  }

  // c[0], c[1]: row g, columns 2t, 2t + 1; c[2], c[3]: row g + 8.
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    if (nt >= tiles_here) break;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int column = nt * 8 + 2 * t + (i & 1);
      const int row = row0 + g + 8 * (i / 2);
      moe_store_grouped<GATE_UP>(P, tile, column, row, acc[0][nt][i], acc[M - 1][nt][i]);
    }
  }
}

template <class F>
cudaError_t for_mma_type(uint32_t type, F&& f) {
  return mma::for_type<kQ4_0, kQ4_1, kQ8_0, kQ4_K, kQ5_K, kQ6_K, kIQ4_NL, kIQ4_XS, kMXFP4>(
      type, std::forward<F>(f));
}

template <bool GATE_UP>
cudaError_t launch_mma(const MoeProduct& P, const KernelConfig& config, cudaStream_t stream) {
  const MoeInput& in = P.in;
  if (in.pairs <= 0 || P.n_out <= 0) return cudaSuccess;
  if (!moe_grouped_args_ok(P, GATE_UP)) return cudaErrorInvalidValue;
  const MoeGroups& groups = in.groups;
  if (groups.tile_pairs != 8 && groups.tile_pairs != 32) return cudaErrorInvalidValue;
  const int tiles = moe_max_tiles(in.pairs, in.n_expert, groups.tile_pairs);
  const dim3 grid(ceil_div(P.n_out, kRowsPerBlock), tiles);
  return for_mma_type(P.a.type, [&](auto tag) {
    constexpr uint32_t TYPE = decltype(tag)::value;
    return groups.tile_pairs == 8 ? launch_early(moe_mma_kernel<TYPE, GATE_UP, 1>, grid,
                                                 dim3(kThreads), config, stream, P)
                                  : launch_early(moe_mma_kernel<TYPE, GATE_UP, 4>, grid,
                                                 dim3(kThreads), config, stream, P);
  });
}

}  // namespace

bool moe_mma_supports(uint32_t type) {
  // Whether the code this device runs has mma.sync (sm_80+ in this build); asked once.
  static const bool device_has_mma = mma::has_mma(moe_mma_kernel<kQ8_0, false, 1>);
  switch (type) {
    case kQ4_0:
    case kQ4_1:
    case kQ8_0:
    case kQ4_K:
    case kQ5_K:
    case kQ6_K:
    case kIQ4_NL:
    case kIQ4_XS:
    case kMXFP4:
      return device_has_mma;
    default:
      return false;
  }
}

cudaError_t launch_moe_gate_up_mma(const MoeMatrix& gate, const MoeMatrix& up, MoeActivation act,
                                   int n_out, const MoeInput& in, float* h,
                                   const KernelConfig& config, cudaStream_t stream) {
  return launch_mma<true>(gate_up_product(gate, up, act, n_out, in, h), config, stream);
}

cudaError_t launch_moe_down_mma(const MoeMatrix& down, int n_out, const MoeInput& in, float* y,
                                const KernelConfig& config, cudaStream_t stream) {
  return launch_mma<false>(down_product(down, n_out, in, y), config, stream);
}

}  // namespace granule::kernels
