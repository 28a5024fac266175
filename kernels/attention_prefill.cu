// Flash-attention prefill: one block per (query head, tile of <= 64 rows of one sequence).
// Warp w owns tile rows [16w, 16w + 16). Per KV tile of 64 tokens (cp.async, two stages):
//   S (16 x 64 per warp, f32) = Q_f16 · K_f16ᵀ   (mma.m16n8k16, Q pre-scaled by scale·log2 e)
//   mask tokens >= the row's length (and, on a sliding layer, tokens before its window) to
//   -inf, online softmax in base 2 (running max m, sum l; with a sink logit s the row starts
//   at m = s, l = 1: the sink joins the normaliser and carries no value)
//   O (16 x D per warp, f32) = O · exp2(m_old - m_new) + P_f16 · V_f16
// and at the end O / l is written for rows of the tile with a length > 0. The KV walk starts at
// the earliest token some row of the tile sees: 0, or on a sliding layer the window start of
// its shortest row (so KV behind every row's window is never read).
//
// Fragment layouts (PTX ISA, mma.m16n8k16 .f16, g = lane / 4, t = lane % 4):
//   A 16x16 row-major: a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
//   B 16x8 (k x n):    b0 (k 2t..2t+1, n g), b1 (k 2t+8..2t+9, n g)
//   C 16x8 f32:        c0,c1 (g, 2t..2t+1), c2,c3 (g+8, 2t..2t+1)
// S = Q·Kᵀ takes B[k = d][n = token] = K[token][d]: K rows as stored (ldmatrix, no transpose).
// O += P·V takes B[k = token][n = d] = V[token][d]: ldmatrix.trans of V rows. P's A fragment is
// two adjacent S C-fragments (tokens 16kk..16kk+7 and 16kk+8..16kk+15), rounded to f16.
#include <cfloat>
#include <climits>

#include "async_copy.cuh"
#include "attention_prefill.cuh"
#include "common.cuh"

namespace granule::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kTileRows = kPrefillTileRows;  // query rows per block
constexpr int kKvTile = 64;                  // tokens per KV tile
constexpr int kMaxGroup = 8;

// Shared memory rows are padded by 8 halves (16 bytes): a row is 2D + 16 bytes, so the 8 rows
// one ldmatrix matrix reads fall in 8 different 16-byte bank groups (no conflicts).
template <int D>
struct Layout {
  static constexpr int kStride = D + 8;                  // halves per shared row
  static constexpr int kTileHalves = kKvTile * kStride;  // one 64-row tile
  static constexpr int kQHalves = kTileRows * kStride;   // the Q tile
  static constexpr size_t kBytes = (kQHalves + 4 * kTileHalves) * sizeof(__half);  // Q, K x2, V x2
};

// The device helpers exist for sm_80+ only (the kernel's body is empty below that).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
// cp.async copies and shared_address: async_copy.cuh. ldmatrix here takes precomputed shared
// addresses (offsets are added to them in the loops).
__device__ __forceinline__ void ldmatrix_x4(uint32_t address, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t address, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address)
               : "memory");
}

// c (16x8 f32) += a (16x16 f16) · b (16x8 f16).
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);  // lo in the low 16 bits: the lower column
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Reductions over the 4 lanes of a quad (the lanes holding one row of a C fragment).
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

#endif  // !__CUDA_ARCH__ || __CUDA_ARCH__ >= 800

template <int D>
__global__ void __launch_bounds__(kThreads)
    attention_prefill_kernel(AttentionArgs a, const PrefillTile* tiles, int n_tiles) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  // No f16 mma.m16n8k16 / cp.async before sm_80: attention_prefill_fits_device() is false.
  __trap();
#else
  using L = Layout<D>;
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr int kStride = L::kStride;
  constexpr int kDTiles = D / 8;   // n-tiles of O
  constexpr int kDSteps = D / 16;  // k-steps of S = Q·Kᵀ
  constexpr int kChunks = D / 8;   // 16-byte chunks per row
  extern __shared__ __align__(16) unsigned char shared_raw[];
  __half* const sq = reinterpret_cast<__half*>(shared_raw);
  __half* const sk = sq + L::kQHalves;         // [2][kKvTile][kStride]
  __half* const sv = sk + 2 * L::kTileHalves;  // [2][kKvTile][kStride]
  __shared__ int tile_max_length, tile_first;

  wait_for_previous_kernel();
  allow_next_kernel();
  const int head = blockIdx.x;
  // Tiles in reverse: a prompt's later rows see more tokens, so the longest blocks start first.
  const PrefillTile tile = tiles[n_tiles - 1 - static_cast<int>(blockIdx.y)];
  const int group = a.n_head / a.n_kv;
  const int kv_head = head / group;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int g = lane / 4, t = lane % 4;

  // This thread's two rows (tile rows warp*16 + g and + 8) and their lengths; 0 past the tile.
  const int r0 = warp * 16 + g, r1 = r0 + 8;
  const int len0 = r0 < tile.count ? a.lengths[tile.first_row + r0] : 0;
  const int len1 = r1 < tile.count ? a.lengths[tile.first_row + r1] : 0;
  const int warp_longest = warp_max_int(max(len0, len1));
  const int warp_shortest = warp_min_int(min(len0, len1));
  // The first token each row sees (its window's start on a sliding layer), and the warp's
  // earliest over its rows with tokens (INT_MAX where it has none).
  const int first0 = a.window > 0 ? max(0, len0 - a.window) : 0;
  const int first1 = a.window > 0 ? max(0, len1 - a.window) : 0;
  const int warp_first =
      warp_min_int(min(len0 > 0 ? first0 : INT_MAX, len1 > 0 ? first1 : INT_MAX));
  if (threadIdx.x == 0) {
    tile_max_length = 0;
    tile_first = INT_MAX;
  }
  __syncthreads();
  if (lane == 0) {
    atomicMax(&tile_max_length, warp_longest);
    atomicMin(&tile_first, warp_first);
  }
  __syncthreads();
  const int max_length = tile_max_length;
  if (max_length <= 0) return;      // the whole block: nothing to read, nothing to write
  const int kv_first = tile_first;  // < max_length: a row with tokens sees at least one

  const __half* const k_base = a.slot_base[a.slots[tile.first_row]] + a.kv_offset +
                               static_cast<int64_t>(a.layer) * 2 * a.n_kv * D +
                               static_cast<int64_t>(kv_head) * D;
  const __half* const v_base = k_base + static_cast<int64_t>(a.n_kv) * D;

  // K and V tokens [kv0, kv0 + 64) into stage `stage`; tokens >= max_length are zeros (never
  // read: they may lie past the slot or hold stale values). kv0 >= kv_first: nothing before
  // the tile's earliest window is requested.
  auto load_kv = [&](int stage, int kv0) {
    __half* const k_dst = sk + stage * L::kTileHalves;
    __half* const v_dst = sv + stage * L::kTileHalves;
#pragma unroll
    for (int i = threadIdx.x; i < kKvTile * kChunks; i += kThreads) {
      const int token = i / kChunks, column = (i % kChunks) * 8;
      const bool valid = kv0 + token < max_length;
      // (an invalid copy reads nothing; its address is still a token of the window: kv_first)
      const int64_t at =
          static_cast<int64_t>(valid ? kv0 + token : kv_first) * a.token_stride + column;
      copy_async<16>(k_dst + token * kStride + column, k_base + at, valid);
      copy_async<16>(v_dst + token * kStride + column, v_base + at, valid);
    }
  };
  const int n_kv_tiles = (max_length - kv_first + kKvTile - 1) / kKvTile;
  load_kv(0, kv_first);
  commit_copies();

  // Q tile: f32 -> f16 once, times scale·log2 e (the softmax runs in base 2); rows past the
  // tile's count are zeros.
  {
    const float q_scale = a.scale * kLog2e;
    const float* q_head = a.q + static_cast<int64_t>(head) * D;
    for (int i = threadIdx.x; i < kTileRows * (D / 4); i += kThreads) {
      const int row = i / (D / 4), column = (i % (D / 4)) * 4;
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (row < tile.count)
        v = *reinterpret_cast<const float4*>(
            q_head + static_cast<int64_t>(tile.first_row + row) * a.q_stride + column);
      const __half2 lo = __floats2half2_rn(v.x * q_scale, v.y * q_scale);
      const __half2 hi = __floats2half2_rn(v.z * q_scale, v.w * q_scale);
      uint2 packed;
      packed.x = *reinterpret_cast<const uint32_t*>(&lo);
      packed.y = *reinterpret_cast<const uint32_t*>(&hi);
      *reinterpret_cast<uint2*>(sq + row * kStride + column) = packed;
    }
  }

  float o[kDTiles][4];
#pragma unroll
  for (int n = 0; n < kDTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  // Running max of rows r0, r1 (base-2 scores) and this lane's part of the running sums. A
  // sink logit starts both rows at m = sink, l = exp2(0) = 1 (held by lane t = 0 of the quad).
  float m0 = -INFINITY, m1 = -INFINITY;
  float l0 = 0.0f, l1 = 0.0f;
  if (a.sinks) {
    m0 = m1 = a.sinks[head] * kLog2e;
    l0 = l1 = t == 0 ? 1.0f : 0.0f;
  }

  // ldmatrix row addresses that do not depend on the KV tile.
  const int q_row = warp * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
  const uint32_t q_address = shared_address(sq + q_row * kStride + (lane / 16) * 8);
  const int k_offset = (lane % 8) * kStride + (lane / 8) * 8;
  const int v_offset = ((lane % 8) + ((lane / 8) % 2) * 8) * kStride + (lane / 16) * 8;

  for (int it = 0; it < n_kv_tiles; ++it) {
    const int kv0 = kv_first + it * kKvTile;
    if (it + 1 < n_kv_tiles) {
      load_kv((it + 1) % 2, kv0 + kKvTile);  // the stage read by iteration it - 1
      commit_copies();
      wait_copies<1>();  // this tile's group has landed (the next may still fly)
    } else {
      wait_copies<0>();
    }
    __syncthreads();  // every thread's copies (and, the first time, the Q tile) are visible

    // Warp-uniform: some row of this warp sees a token of the tile.
    if (kv0 < warp_longest && kv0 + kKvTile > warp_first) {
      const __half* const k_tile = sk + (it % 2) * L::kTileHalves;
      const __half* const v_tile = sv + (it % 2) * L::kTileHalves;
      const uint32_t k_address = shared_address(k_tile + k_offset);
      const uint32_t v_address = shared_address(v_tile + v_offset);

      // S = Q·Kᵀ: 16 rows x 64 tokens per warp, 8 n-tiles of 8 tokens.
      float s[8][4];
#pragma unroll
      for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kDSteps; kk += 2) {
        uint32_t qa0[4], qa1[4];
        ldmatrix_x4(q_address + static_cast<uint32_t>(kk * 16 * sizeof(__half)), qa0);
        ldmatrix_x4(q_address + static_cast<uint32_t>((kk + 1) * 16 * sizeof(__half)), qa1);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          // tokens 8j..8j+7 x d 16kk..16kk+31: b0, b1 of k-step kk, then of kk + 1.
          uint32_t b[4];
          ldmatrix_x4(
              k_address + static_cast<uint32_t>((j * 8 * kStride + kk * 16) * sizeof(__half)), b);
          mma_16816(s[j], qa0, b[0], b[1]);
          mma_16816(s[j], qa1, b[2], b[3]);
        }
      }

      // Mask tokens at or past each row's length (only where some row of the warp ends) and,
      // on a sliding layer, before each row's window.
      if (kv0 + kKvTile > warp_shortest || a.window > 0) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int token = kv0 + j * 8 + 2 * t + e;
            if (token >= len0 || token < first0) s[j][e] = -INFINITY;
            if (token >= len1 || token < first1) s[j][2 + e] = -INFINITY;
          }
        }
      }

      // Online softmax. A row with nothing visible yet keeps max -inf; it subtracts 0 instead
      // so that its p and correction are exp2(-inf) = 0, never NaN.
      float max0 = m0, max1 = m1;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        max0 = fmaxf(max0, fmaxf(s[j][0], s[j][1]));
        max1 = fmaxf(max1, fmaxf(s[j][2], s[j][3]));
      }
      max0 = quad_max(max0);
      max1 = quad_max(max1);
      const float base0 = max0 == -INFINITY ? 0.0f : max0;
      const float base1 = max1 == -INFINITY ? 0.0f : max1;
      const float correction0 = exp2f(m0 - base0), correction1 = exp2f(m1 - base1);
      m0 = max0;
      m1 = max1;
      float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        s[j][0] = exp2f(s[j][0] - base0);
        s[j][1] = exp2f(s[j][1] - base0);
        s[j][2] = exp2f(s[j][2] - base1);
        s[j][3] = exp2f(s[j][3] - base1);
        sum0 += s[j][0] + s[j][1];
        sum1 += s[j][2] + s[j][3];
      }
      l0 = l0 * correction0 + sum0;
      l1 = l1 * correction1 + sum1;
#pragma unroll
      for (int n = 0; n < kDTiles; ++n) {
        o[n][0] *= correction0;
        o[n][1] *= correction0;
        o[n][2] *= correction1;
        o[n][3] *= correction1;
      }

      // O += P·V: k-steps of 16 tokens; each ldmatrix.trans gives two d n-tiles.
#pragma unroll
      for (int kk = 0; kk < kKvTile / 16; ++kk) {
        const uint32_t pa[4] = {pack_half2(s[2 * kk][0], s[2 * kk][1]),
                                pack_half2(s[2 * kk][2], s[2 * kk][3]),
                                pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
        for (int np = 0; np < kDTiles / 2; ++np) {
          uint32_t b[4];
          ldmatrix_x4_trans(
              v_address + static_cast<uint32_t>((kk * 16 * kStride + np * 16) * sizeof(__half)), b);
          mma_16816(o[2 * np], pa, b[0], b[1]);
          mma_16816(o[2 * np + 1], pa, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // all warps are done with this stage before it is refilled
  }

  l0 = quad_sum(l0);
  l1 = quad_sum(l1);
  float* const out_head = a.out + static_cast<int64_t>(head) * D + 2 * t;
  if (len0 > 0) {
    const float inv = 1.0f / l0;
    float* const p = out_head + static_cast<int64_t>(tile.first_row + r0) * a.out_stride;
#pragma unroll
    for (int n = 0; n < kDTiles; ++n)
      *reinterpret_cast<float2*>(p + n * 8) = make_float2(o[n][0] * inv, o[n][1] * inv);
  }
  if (len1 > 0) {
    const float inv = 1.0f / l1;
    float* const p = out_head + static_cast<int64_t>(tile.first_row + r1) * a.out_stride;
#pragma unroll
    for (int n = 0; n < kDTiles; ++n)
      *reinterpret_cast<float2*>(p + n * 8) = make_float2(o[n][2] * inv, o[n][3] * inv);
  }
#endif  // __CUDA_ARCH__ >= 800
}

// Lets the kernel use its shared memory (beyond 48 KiB needs asking), once per process and
// head size: the first call comes from attention_prefill_fits_device() at backend start, so
// no launch during a graph capture makes it. (One device: not re-applied on a second one.)
template <int D>
cudaError_t allow_shared_bytes() {
  static const cudaError_t status =
      cudaFuncSetAttribute(attention_prefill_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(Layout<D>::kBytes));
  return status;
}

template <int D>
cudaError_t launch_for(const AttentionArgs& args, const PrefillTile* tiles, int n_tiles,
                       const KernelConfig& config, cudaStream_t stream) {
  auto* kernel = attention_prefill_kernel<D>;
  const size_t bytes = Layout<D>::kBytes;
  cudaError_t status = allow_shared_bytes<D>();
  if (status != cudaSuccess) return status;
  status = launch_early_shared(
      kernel, dim3(static_cast<unsigned>(args.n_head), static_cast<unsigned>(n_tiles)),
      dim3(kThreads), bytes, config, stream, args, tiles, n_tiles);
  return launch_status(status);
}

}  // namespace

void plan_prefill_tiles(const int32_t* slots, const int32_t* lengths, int rows, int min_run_rows,
                        std::vector<PrefillTile>& tiles, std::vector<int32_t>& other_rows) {
  tiles.clear();
  other_rows.clear();
  int row = 0;
  while (row < rows) {
    if (lengths[row] <= 0) {  // padding: no output
      ++row;
      continue;
    }
    int end = row + 1;
    while (end < rows && lengths[end] > 0 && slots[end] == slots[row]) ++end;
    const int run = end - row;
    if (run < std::max(min_run_rows, 1)) {
      for (int r = row; r < end; ++r) other_rows.push_back(r);
    } else {
      const int n = (run + kTileRows - 1) / kTileRows;
      for (int i = 0; i < n; ++i) {
        const int first = row + static_cast<int>(static_cast<int64_t>(run) * i / n);
        const int next = row + static_cast<int>(static_cast<int64_t>(run) * (i + 1) / n);
        tiles.push_back({first, next - first});
      }
    }
    row = end;
  }
}

namespace {
template <int D>
bool fits_device() {
  cudaFuncAttributes attributes{};
  if (cudaFuncGetAttributes(&attributes, attention_prefill_kernel<D>) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  if (attributes.binaryVersion < 80 || attributes.ptxVersion < 80) return false;
  if (allow_shared_bytes<D>() != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return true;
}
}  // namespace

bool attention_prefill_fits_device(int head_dim) {
  switch (head_dim) {
    case 64:
      return fits_device<64>();
    case 128:
      return fits_device<128>();
    case 256:
      return fits_device<256>();
    default:
      return false;
  }
}

size_t attention_prefill_shared_bytes(int head_dim) {
  switch (head_dim) {
    case 64:
      return Layout<64>::kBytes;
    case 128:
      return Layout<128>::kBytes;
    case 256:
      return Layout<256>::kBytes;
    default:
      return 0;
  }
}

cudaError_t launch_attention_prefill(const AttentionArgs& args, const PrefillTile* tiles,
                                     int n_tiles, const KernelConfig& config, cudaStream_t stream) {
  if (n_tiles == 0) return cudaSuccess;
  if (n_tiles < 0 || n_tiles > 65535 || !tiles || args.n_kv <= 0 || args.n_head <= 0 ||
      args.n_head % args.n_kv != 0 || args.n_head / args.n_kv > kMaxGroup ||
      args.q_stride % 4 != 0 || args.out_stride % 2 != 0 || args.out_q8.qs || args.out_q8.ds)
    return cudaErrorInvalidValue;
  switch (args.head_dim) {
    case 64:
      return launch_for<64>(args, tiles, n_tiles, config, stream);
    case 128:
      return launch_for<128>(args, tiles, n_tiles, config, stream);
    case 256:
      return launch_for<256>(args, tiles, n_tiles, config, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace granule::kernels
