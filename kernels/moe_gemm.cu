// The grouped expert products as tiled int8 tensor-core kernels (moe.cuh: launch_moe_gate_up_gemm,
// launch_moe_down_gemm). A block owns one tile of launch_moe_group (up to 8 · WN · NT pairs routed
// to one expert) and 64 output rows of each matrix (gate/up: 64 of gate and 64 of up). The input
// length runs through a ring of kStages shared-memory stages filled by cp.async, one chunk of the
// weight type (a K-quant super-block, or 4 blocks of 32) per stage:
//   - the weights: each of the 64 rows' bytes of the chunk as a "mini row" of the chunk's
//     sub-blocks in the type's layout (moe_gemm_stage.h), read ONCE for all the tile's pairs;
//   - the activations: each pair column's int8 bytes and (d, d · Σ q) scales of the chunk,
//     gathered through groups.order (a pair past the tile's count repeats its last pair).
// An input of fewer chunks than stages asks only the shared memory of its chunks (the down
// product of the 30B shape, 768 wide: three Q6_K super-blocks, so a fourth block an SM).
// 4 · WN warps: warp (wm, wn) builds the mma fragments of rows 16 wm .. 16 wm + 15 of its
// matrices (moe_mma_frag.cuh over the staged bytes) and meets the NT n-tiles of 8 pair columns of
// wn. WN is 1 in both tiles there are (8 pairs: NT 1, 32: NT 4); tiles of 64 (WN 2) lost to 32 at
// every run length on an H100 and were removed. Each thread's weight copies of a stage are the same
// for the whole input: it works them out once, before the first stage. Per sub-block and n-tile one
// mma.sync m16n8k32 (Q6_K: two m16n8k16), its exact integer result scaled and added in f32 in
// sub-block order with moe_mma.cu's roundings, term for term: a pair's result has the bits of
// launch_moe_*_mma, whatever the tile. Bias, activation and the scatter to each pair's output row
// close the block.
//
// cp.async reads the weights, so the expert matrices must sit in device memory (CudaMoe stages
// streamed experts into VRAM first, moe_stage.cu; the tests also run these kernels over mapped
// pinned host memory, which cp.async reads on the devices measured so far).
#include "async_copy.cuh"
#include "mma_tiles.cuh"
#include "moe.cuh"
#include "moe_gemm_stage.h"
#include "moe_mma_frag.cuh"
#include "moe_product.cuh"
#include "quant_blocks.cuh"

namespace granule::kernels {
namespace {

constexpr int kWarpsM = 4;                   // warps along the output rows
constexpr int kRowsPerBlock = kWarpsM * 16;  // 64 rows of each matrix
constexpr uint32_t kMagicBits = 0x4B400000u;
constexpr float kMagic = 12582912.0f;
__device__ __forceinline__ float unmagic(int c) { return __fsub_rn(__int_as_float(c), kMagic); }

// A stage's copy (moe_gemm_stage.h): one cp.async, or none.
__device__ __forceinline__ void stage_copy(uint8_t* slot, const moe_gemm::Copy& c) {
  if (c.bytes == 16)
    copy_async<16>(slot + c.to, c.src, true);
  else if (c.bytes == 8)
    copy_async<8>(slot + c.to, c.src, true);
  else if (c.bytes == 4)
    copy_async<4>(slot + c.to, c.src, true);
}

// A kernel's block: WN · NT n-tiles of 8 pair columns, 64 rows of each matrix.
template <uint32_t TYPE, bool GATE_UP, int WN, int NT>
struct Shape {
  using S = moe_gemm::Staged<TYPE>;
  static constexpr int kActRowBytes = S::kSubs * 32 + 16;  // a pair column's int8 (+ padding)
  static constexpr int M = GATE_UP ? 2 : 1;                // matrices
  static constexpr int kWarps = kWarpsM * WN;
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kColumns = WN * NT * 8;
  static constexpr int kWeightBytes = M * kRowsPerBlock * S::kSlotBytes;
  static constexpr int kActBytes = kColumns * kActRowBytes;
  static constexpr int kScaleBytes = kColumns * S::kSubs * static_cast<int>(sizeof(float2));
  static constexpr int kStageBytes = kWeightBytes + kActBytes + kScaleBytes;
  static constexpr int kHeadBytes = kColumns * 4;  // each column's input row, before the stages
  // Blocks an SM holds by shared memory with `stages` stages.
  static constexpr int blocks_with(int stages) {
    return mma::kSmShared / (kHeadBytes + stages * kStageBytes + mma::kBlockReserve);
  }
  // 4 stages up to 32 KiB a stage, else 3; and for tiles of 8 pairs (decode batches, where a
  // chunk is little work a warp), 3 where 4 leave an SM at most 2 blocks and 3 let one more in:
  // the 30B shape's Q4_K gate/up (25 KiB stages, 3 blocks instead of 2: 12 warps an SM, the same
  // bytes in flight), Q5_K's (29 KiB: 2 instead of 1). __launch_bounds__ then asks the registers
  // of those blocks too (Q4_K's gate/up 190 -> 162, no spills).
  static constexpr bool kMoreBlocks = NT == 1 && kStageBytes <= 32 * 1024 &&
                                      blocks_with(4) <= 2 && blocks_with(3) > blocks_with(4);
  static constexpr int kStages = kStageBytes > 32 * 1024 || kMoreBlocks ? 3 : 4;
  static constexpr int kMinBlocks = kMoreBlocks ? blocks_with(3) : 1;
  // The most a launch asks (an input of fewer chunks than stages takes one stage a chunk).
  static constexpr int kSharedBytes = kHeadBytes + kStages * kStageBytes;
  // The weight copies of a stage, and each thread's share of them.
  static constexpr int kWeightCopies = M * kRowsPerBlock * S::kSegments;
  static constexpr int kCopiesPerThread = (kWeightCopies + kThreads - 1) / kThreads;
  // Gate/up with hq: the block's values, a pair column's rows kValueStride floats apart.
  static constexpr int kValueStride = kRowsPerBlock + 4;
  static_assert(!GATE_UP || kColumns * kValueStride * 4 <= kStageBytes, "the values fit a stage");
  static_assert(kHeadBytes % 16 == 0 && kStageBytes % 16 == 0, "16-byte aligned stages");
  static_assert(S::kSegments < 256, "a copy's segment in 8 bits");
  static int shared_bytes(int n_chunks) {
    return kHeadBytes + (n_chunks < kStages ? n_chunks : kStages) * kStageBytes;
  }
};

// At least one block an SM (the register cap: IQ4_NL and Q4_0 spilled under the default one),
// kMinBlocks where a tile of 8 pairs takes a block more (Shape).
template <uint32_t TYPE, bool GATE_UP, int WN, int NT>
__global__ void __launch_bounds__(Shape<TYPE, GATE_UP, WN, NT>::kThreads,
                                  Shape<TYPE, GATE_UP, WN, NT>::kMinBlocks)
    moe_gemm_kernel(MoeProduct P, ActivationQ8 hq) {
  using Sh = Shape<TYPE, GATE_UP, WN, NT>;
  using S = moe_gemm::Staged<TYPE>;
  using F = moe_mma::Frag<TYPE>;
  using Raw = typename F::Raw;
  constexpr int M = Sh::M, KS = S::kSubs, kColumns = Sh::kColumns;
  constexpr int kThreads = Sh::kThreads;
  extern __shared__ __align__(16) uint8_t shared[];
  int* column_row = reinterpret_cast<int*>(shared);
  uint8_t* stages = shared + Sh::kHeadBytes;

  wait_for_previous_kernel();  // the tiles, order and activations are the step's
  allow_next_kernel();
  const MoeInput& in = P.in;
  if (static_cast<int>(blockIdx.y) >= *in.groups.n_tiles) return;  // the whole block
  const MoeTile tile = in.groups.tiles[blockIdx.y];
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  // Warp (wm, wn): rows 16 wm .. 16 wm + 15 of its matrices, the NT n-tiles of wn.
  // (wn as warp / kWarpsM - WN * past, not % WN: where WN is 1 a wn the compiler knows to be 0
  // let ptxas hoist every sub-block's activation loads and then rematerialise constants, 17 % more
  // instructions a chunk in the gate/up kernel of tiles of 8. `past`, 1 for a warp past the
  // block's 4 · WN (none), and the epilogue's test of it are the measured kernels' code: without
  // them ptxas allocates and schedules every kernel differently, the same bits but other SASS.)
  const int past = warp >= kWarpsM * WN ? 1 : 0;
  const int wm = warp % kWarpsM, wn = warp / kWarpsM - WN * past;
  const int g = lane / 4, t = lane % 4;
  const int block_row0 = static_cast<int>(blockIdx.x) * kRowsPerBlock;
  const int n_in = in.n_in, n_sub = n_in / kQ8Block, n_out = P.n_out;
  const int n_chunks = (n_sub + KS - 1) / KS;
  const int tiles_here = (tile.count + 7) / 8;  // n-tiles with pairs (block-uniform)
  const int columns_here = min(kColumns, tiles_here * 8);

  // Each pair column's input row; columns past the tile's pairs repeat its last pair.
  for (int c = threadIdx.x; c < kColumns; c += kThreads) {
    const int pair = in.groups.order[tile.first + min(c, tile.count - 1)];
    column_row[c] = in.per_pair_input ? pair : pair / in.n_used;
  }

  const int row_bytes = static_cast<int>(P.a.row_bytes);  // the launcher checks n_out rows fit
  const auto* gate_base = static_cast<const uint8_t*>(P.a.table[tile.expert]);
  const auto* up_base = GATE_UP ? static_cast<const uint8_t*>(P.b.table[tile.expert]) : gate_base;
  auto matrix = [&](int m) { return m == 0 ? gate_base : up_base; };
  // Row r (0..63 of the block) as a byte offset from its matrix's start (rows past the end repeat
  // the last one).
  auto row_offset = [&](int r) { return min(block_row0 + r, n_out - 1) * row_bytes; };
  // The weight copies of a stage: copy i is segment i % kSegments of row (i / kSegments) % 64 of
  // matrix i / (64 kSegments), so consecutive threads take consecutive 16-byte segments of a row
  // (coalesced). Each thread works its share out once for the input, a word a copy (the
  // segment | the row << 8 | the matrix << 14, or -1: none).
  int copies[Sh::kCopiesPerThread];
#pragma unroll
  for (int k = 0; k < Sh::kCopiesPerThread; ++k) {
    const int i = static_cast<int>(threadIdx.x) + k * kThreads;
    const int seg = i % S::kSegments, r = (i / S::kSegments) % kRowsPerBlock;
    const int m = i / (S::kSegments * kRowsPerBlock);
    copies[k] = i < Sh::kWeightCopies ? seg | (r << 8) | (m << 14) : -1;
  }
  __syncthreads();  // column_row

  auto issue = [&](int chunk) {
    uint8_t* stage = stages + (chunk % Sh::kStages) * Sh::kStageBytes;
    const int first = chunk * KS, subs = min(KS, n_sub - first);
#pragma unroll
    for (int k = 0; k < Sh::kCopiesPerThread; ++k) {
      const int copy = copies[k];
      if ((k + 1) * kThreads > Sh::kWeightCopies && copy < 0) continue;  // the last share
      const int slot = (copy >> 8) & (2 * kRowsPerBlock - 1);            // m · 64 + r
      const uint8_t* base = M > 1 && slot >= kRowsPerBlock ? up_base : gate_base;
      stage_copy(stage + slot * S::kSlotBytes, S::segment(base + row_offset(slot % kRowsPerBlock),
                                                          first, subs, n_sub, copy & 0xFF));
    }
    // Activations: int8 bytes in 16-byte segments, then the scales.
    uint8_t* act = stage + Sh::kWeightBytes;
    constexpr int kActSegments = KS * 2;
    for (int i = threadIdx.x; i < columns_here * kActSegments; i += kThreads) {
      const int seg = i % kActSegments, c = i / kActSegments;
      if (seg >= subs * 2) continue;
      const int8_t* src = in.xq.qs + static_cast<int64_t>(column_row[c]) * n_in + first * 32;
      copy_async<16>(act + c * Sh::kActRowBytes + seg * 16, src + seg * 16, true);
    }
    float2* scales = reinterpret_cast<float2*>(act + Sh::kActBytes);
    for (int i = threadIdx.x; i < columns_here * KS; i += kThreads) {
      const int j = i % KS, c = i / KS;
      if (j >= subs) continue;
      copy_async<8>(scales + c * KS + j,
                    in.xq.ds + static_cast<int64_t>(column_row[c]) * n_sub + first + j, true);
    }
  };

  float acc[M][NT][4];
#pragma unroll
  for (int w = 0; w < M; ++w)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[w][nt][i] = 0.0f;

#pragma unroll
  for (int s = 0; s < Sh::kStages - 1; ++s) {
    if (s < n_chunks) issue(s);
    commit_copies();
  }
  const int warp_tiles = min(NT, tiles_here - wn * NT);  // this warp's n-tiles with pairs
#pragma unroll 1
  for (int chunk = 0; chunk < n_chunks; ++chunk) {
    wait_copies<Sh::kStages - 2>();
    __syncthreads();  // the chunk's bytes are in; every warp is done with the stage refilled next
    if (chunk + Sh::kStages - 1 < n_chunks) issue(chunk + Sh::kStages - 1);
    commit_copies();
    if (warp_tiles <= 0) continue;  // warp-uniform: no pairs in this warp's columns

    const uint8_t* stage = stages + (chunk % Sh::kStages) * Sh::kStageBytes;
    const int first = chunk * KS, subs = min(KS, n_sub - first);
    Raw raw[M][2];
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = wm * 16 + g + 8 * h;
        const uint8_t* slot = stage + (m * kRowsPerBlock + r) * S::kSlotBytes;
        F::load(raw[m][h], slot + S::mini_row(matrix(m) + row_offset(r), first), 0, subs, t);
      }
    const int8_t* act = reinterpret_cast<const int8_t*>(stage + Sh::kWeightBytes);
    const float2* scales =
        reinterpret_cast<const float2*>(stage + Sh::kWeightBytes + Sh::kActBytes);
#pragma unroll
    for (int j = 0; j < KS; ++j) {
      if (j >= subs) break;  // block-uniform: a last chunk of 32-element blocks
      moe_mma::Sub s[M][2];
      float scale_lo[M][2], scale_hi[M][2];
#pragma unroll
      for (int w = 0; w < M; ++w)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          s[w][h] = F::sub(raw[w][h], j);
          scale_lo[w][h] = moe_mma::small_int_to_float(s[w][h].s_lo);
          scale_hi[w][h] = moe_mma::small_int_to_float(s[w][h].s_hi);
        }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        if (nt >= warp_tiles) break;
        const int column0 = (wn * NT + nt) * 8;
        const int8_t* x = act + (column0 + g) * Sh::kActRowBytes + j * 32;
        uint32_t b0, b1;
        if constexpr (F::kContiguous) {
          const uint2 v = *reinterpret_cast<const uint2*>(x + 8 * t);
          b0 = v.x;
          b1 = v.y;
        } else {
          b0 = *reinterpret_cast<const uint32_t*>(x + 4 * t);
          b1 = *reinterpret_cast<const uint32_t*>(x + 16 + 4 * t);
        }
        const float2 d0 = scales[(column0 + 2 * t) * KS + j];
        const float2 d1 = scales[(column0 + 2 * t + 1) * KS + j];
#pragma unroll
        for (int w = 0; w < M; ++w) {
          float c[4];  // the sub-block's integer dot products, exact in f32
          if constexpr (F::kSplit16) {
            int lo[4], hi[4];
            mma::mma_s8_k16(lo, s[w][0].lo, s[w][1].lo, b0, kMagicBits);
            mma::mma_s8_k16(hi, s[w][0].hi, s[w][1].hi, b1, kMagicBits);
#pragma unroll
            for (int i = 0; i < 4; ++i)
              c[i] = __fmaf_rn(scale_hi[w][i / 2], unmagic(hi[i]),
                               __fmul_rn(scale_lo[w][i / 2], unmagic(lo[i])));
          } else {
            const uint32_t a[4] = {s[w][0].lo, s[w][1].lo, s[w][0].hi, s[w][1].hi};
            int bits[4];
            mma::mma_s8(bits, a, b0, b1, kMagicBits);
#pragma unroll
            for (int i = 0; i < 4; ++i) c[i] = unmagic(bits[i]);
          }
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float2 dx = (i & 1) ? d1 : d0;
            float v = __fmaf_rn(s[w][i / 2].d, __fmul_rn(dx.x, c[i]), acc[w][nt][i]);
            if constexpr (F::kOffset) v = __fmaf_rn(s[w][i / 2].m, dx.y, v);
            acc[w][nt][i] = v;
          }
        }
      }
    }
  }
  wait_copies<0>();  // no copy outlives the block

  // hq set (gate/up): all warps take part in the epilogue's barriers.
  const bool quantize = GATE_UP && hq.qs != nullptr;  // block-uniform

  // c[0], c[1]: row g, columns 2t, 2t + 1; c[2], c[3]: row g + 8.
  if (!quantize) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      if (nt >= warp_tiles) break;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int column = (wn * NT + nt) * 8 + 2 * t + (i & 1);
        const int row = block_row0 + wm * 16 + g + 8 * (i / 2);
        moe_store_grouped<GATE_UP>(P, tile, column, row, acc[0][nt][i], acc[M - 1][nt][i]);
      }
    }
    return;
  }
  // Gate/up with hq: the values through shared memory ([column][row], rows kValueStride apart so
  // a quad's four columns fall in different banks), then a warp per 32 rows of a pair column
  // stores them (128 bytes at once) and their int8 block as launch_quantize_q8 makes it from h.
  if constexpr (GATE_UP) {
    float* values = reinterpret_cast<float*>(stages);
    __syncthreads();  // every warp is done with the stages
    if (past == 0) {  // always (see wn)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        if (nt >= warp_tiles) break;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int column = (wn * NT + nt) * 8 + 2 * t + (i & 1);
          const int r = wm * 16 + g + 8 * (i / 2);
          if (block_row0 + r < n_out)
            values[column * Sh::kValueStride + r] = moe_grouped_value<GATE_UP>(
                P, tile, block_row0 + r, acc[0][nt][i], acc[M - 1][nt][i]);
        }
      }
    }
    __syncthreads();
    constexpr int kBlocks = kRowsPerBlock / kQ8Block;  // int8 blocks of a pair column
    for (int item = warp; item < tile.count * kBlocks; item += Sh::kWarps) {
      const int column = item / kBlocks, b = item % kBlocks;
      if (column >= kColumns || block_row0 + b * kQ8Block >= n_out) continue;  // warp-uniform
      const float v = values[column * Sh::kValueStride + b * kQ8Block + lane];
      const int pair = in.groups.order[tile.first + column];
      const int64_t at = static_cast<int64_t>(pair) * n_out + block_row0 + b * kQ8Block;
      P.out[at + lane] = v;
      quantize_block_of_warp(v, hq.qs + at, hq.ds + at / kQ8Block);
    }
  }
}

template <class F>
cudaError_t for_gemm_type(uint32_t type, F&& f) {
  return mma::for_type<kQ4_0, kQ4_1, kQ8_0, kQ4_K, kQ5_K, kQ6_K, kIQ4_NL, kIQ4_XS, kMXFP4>(
      type, std::forward<F>(f));
}

// f(integral_constant WN, integral_constant NT) for a tile of `tile_pairs` pairs.
template <class F>
cudaError_t for_tile(int tile_pairs, F&& f) {
  using std::integral_constant;
  switch (tile_pairs) {
    case 8:
      return f(integral_constant<int, 1>{}, integral_constant<int, 1>{});
    case 32:
      return f(integral_constant<int, 1>{}, integral_constant<int, 4>{});
    default:
      return cudaErrorInvalidValue;
  }
}

// The kernel's shared-memory allowance, asked once per instantiation (moe_gemm_prepare makes the
// first call, before any stream capture).
template <uint32_t TYPE, bool GATE_UP, int WN, int NT>
cudaError_t allow_shared() {
  using Sh = Shape<TYPE, GATE_UP, WN, NT>;
  static_assert(Sh::kSharedBytes <= mma::kMaxBlockShared, "stages past the shared memory");
  static const cudaError_t status =
      cudaFuncSetAttribute(moe_gemm_kernel<TYPE, GATE_UP, WN, NT>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, Sh::kSharedBytes);
  return status;
}

template <bool GATE_UP>
cudaError_t launch_gemm(const MoeProduct& P, ActivationQ8 hq, const KernelConfig& config,
                        cudaStream_t stream) {
  const MoeInput& in = P.in;
  if (in.pairs <= 0 || P.n_out <= 0) return cudaSuccess;
  if (!moe_grouped_args_ok(P, GATE_UP)) return cudaErrorInvalidValue;
  if (hq.qs && (!hq.ds || P.n_out % kQ8Block != 0)) return cudaErrorInvalidValue;
  // A weight row's offset from its matrix's start is an int (n_out rows of row_bytes).
  if (static_cast<int64_t>(P.n_out) * P.a.row_bytes > INT32_MAX) return cudaErrorInvalidValue;
  const MoeGroups& groups = in.groups;
  const int tiles = moe_max_tiles(in.pairs, in.n_expert, groups.tile_pairs);
  const dim3 grid(ceil_div(P.n_out, kRowsPerBlock), tiles);
  const int n_sub = in.n_in / kQ8Block;
  return for_gemm_type(P.a.type, [&](auto type_tag) {
    constexpr uint32_t TYPE = decltype(type_tag)::value;
    return for_tile(groups.tile_pairs, [&](auto wn_tag, auto nt_tag) {
      constexpr int WN = decltype(wn_tag)::value, NT = decltype(nt_tag)::value;
      using Sh = Shape<TYPE, GATE_UP, WN, NT>;
      const cudaError_t attribute = allow_shared<TYPE, GATE_UP, WN, NT>();
      if (attribute != cudaSuccess) return attribute;
      const int n_chunks = ceil_div(n_sub, Sh::S::kSubs);
      return launch_early_shared(moe_gemm_kernel<TYPE, GATE_UP, WN, NT>, grid, dim3(Sh::kThreads),
                                 Sh::shared_bytes(n_chunks), config, stream, P, hq);
    });
  });
}

}  // namespace

bool moe_gemm_prepare(uint32_t type) {
  if (!moe_mma_supports(type)) return false;
  const cudaError_t status = for_gemm_type(type, [](auto type_tag) {
    constexpr uint32_t TYPE = decltype(type_tag)::value;
    cudaError_t first = cudaSuccess;
    for (const int tile_pairs : kMoeGemmTilePairs)
      for (const bool gate_up : {false, true}) {
        const cudaError_t status = for_tile(tile_pairs, [&](auto wn_tag, auto nt_tag) {
          constexpr int WN = decltype(wn_tag)::value, NT = decltype(nt_tag)::value;
          return gate_up ? allow_shared<TYPE, true, WN, NT>() : allow_shared<TYPE, false, WN, NT>();
        });
        if (first == cudaSuccess) first = status;
      }
    return first;
  });
  if (status != cudaSuccess) {
    cudaGetLastError();  // not left for a later launch's status
    return false;
  }
  return true;
}

cudaError_t launch_moe_gate_up_gemm(const MoeMatrix& gate, const MoeMatrix& up, MoeActivation act,
                                    int n_out, const MoeInput& in, float* h, ActivationQ8 hq,
                                    const KernelConfig& config, cudaStream_t stream) {
  return launch_gemm<true>(gate_up_product(gate, up, act, n_out, in, h), hq, config, stream);
}

cudaError_t launch_moe_down_gemm(const MoeMatrix& down, int n_out, const MoeInput& in, float* y,
                                 const KernelConfig& config, cudaStream_t stream) {
  return launch_gemm<false>(down_product(down, n_out, in, y), {}, config, stream);
}

}  // namespace granule::kernels
