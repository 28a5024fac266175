// The fused batch-1 Q/K/V product and attention (qkv_attention.cuh). One block of 32 warps per
// KV head h:
// - before the PDL wait: cp.async of the block's weight rows (its group's Q rows, its K and V
//   rows: three contiguous ranges) and of the K and V of tokens [0, length - 1), which earlier
//   steps wrote, into shared memory; the rotations of the warp's row pairs;
// - after it: the int8 activations and the norm's sums (one round trip), each warp's rows
//   (rows / 32 of them, lanes on sub-blocks as split_matvec_kernel takes a one-step row: the
//   same sums, scale, bias and rotation, so the same q, k and v), the new token's K and V into
//   the cache and into shared memory;
// - attention over [0, length) from shared memory: a thread per token for the group's scores,
//   block-wide max and sum per head, P·V by (token range, head, dimension), the output and its
//   int8 blocks written as launch_attention writes them.
#include <cfloat>

#include "async_copy.cuh"
#include "common.cuh"
#include "qkv_attention.cuh"
#include "quant_blocks.cuh"
#include "rope_kv.cuh"
#include "split_dot.cuh"

namespace granule::kernels {
namespace {

constexpr int kHeadDim = 64;
constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / kWarpSize;
constexpr int kMaxGroup = 4;
constexpr int kMaxRowsPerWarp = (kMaxGroup + 2) * kHeadDim / kWarps;  // 12
// A token's K then V (f16) and 16 bytes of padding: 272 bytes, 17 x 16, so consecutive tokens'
// 16-byte reads fall in different banks.
constexpr int kTokenHalves = 2 * kHeadDim + 8;
constexpr int kMaxSubBlocks = kWarpSize;  // rows of at most 1,024: one sub-block per lane

constexpr int padded_group(int group) { return group <= 1 ? 1 : group <= 2 ? 2 : 4; }

// Shared memory, byte offsets: weight rows, tokens' K/V, q [GP][64], scores and probabilities
// [GP][max_tokens], reduction scratch [2][GP][32] and the heads' max and sum [2][GP], P·V parts
// [kThreads].
struct Layout {
  int64_t kv, q, p, red, ml, part, total;
};

__host__ __device__ inline Layout layout_of(int rows, int64_t row_bytes, int max_tokens, int gp) {
  Layout l;
  l.kv = rows * row_bytes;
  l.q = l.kv + static_cast<int64_t>(max_tokens) * kTokenHalves * 2;
  l.p = l.q + gp * kHeadDim * 4;
  l.red = l.p + static_cast<int64_t>(gp) * max_tokens * 4;
  l.ml = l.red + 2 * gp * kWarpSize * 4;
  l.part = l.ml + 2 * gp * 4;
  l.total = l.part + kThreads * 4;
  return l;
}

// A sub-block of a split-layout Q4_0/Q4_1 row held in shared memory (load_payload's fields).
template <uint32_t TYPE>
__device__ __forceinline__ split_dot::Payload shared_payload(const uint8_t* row, int n, int j) {
  split_dot::Payload p;
  p.q = *reinterpret_cast<const uint4*>(row + 16 * j);
  if constexpr (TYPE == kQ4_0)
    p.s = *reinterpret_cast<const unsigned short*>(row + 16 * n + 2 * j);
  else
    p.s = *reinterpret_cast<const unsigned int*>(row + 16 * n + 4 * j);
  return p;
}

// The block-wide max (MAX) or sum of each head's value v[g] over the threads, g < group, into
// out[g]. Every thread calls it.
template <int GP, bool MAX>
__device__ __forceinline__ void block_reduce_heads(const float (&v)[GP], int group, float* red,
                                                   float* out) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
#pragma unroll
  for (int g = 0; g < GP; ++g) {
    const float r = MAX ? warp_max(v[g]) : warp_sum(v[g]);
    if (lane == 0) red[g * kWarpSize + warp] = r;
  }
  __syncthreads();
  if (warp < group) {
    const float x = red[warp * kWarpSize + lane];
    const float r = MAX ? warp_max(x) : warp_sum(x);
    if (lane == 0) out[warp] = r;
  }
  __syncthreads();
}

template <uint32_t TYPE, int GP>
__global__ void __launch_bounds__(kThreads, 1)
    qkv_attention_kernel(QkvAttentionArgs a, int max_tokens) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int group = a.n_head / a.n_kv;
  const int h = static_cast<int>(blockIdx.x);
  const int q_rows = group * kHeadDim, rows = q_rows + 2 * kHeadDim;
  const int per_warp = rows / kWarps;  // even: rows is a multiple of 64
  const int n = a.in.n_in / kQ8Block;
  const Layout lay = layout_of(rows, a.row_bytes, max_tokens, GP);
  uint8_t* s_w = smem;
  __half* s_kv = reinterpret_cast<__half*>(smem + lay.kv);
  float* s_q = reinterpret_cast<float*>(smem + lay.q);
  float* s_p = reinterpret_cast<float*>(smem + lay.p);
  float* s_red = reinterpret_cast<float*>(smem + lay.red);
  float* s_max = reinterpret_cast<float*>(smem + lay.ml);
  float* s_sum = s_max + GP;
  float* s_part = reinterpret_cast<float*>(smem + lay.part);
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % kWarpSize, warp = tid / kWarpSize;

  // Before the wait: weights, the step's inputs, and the K/V of the tokens earlier steps wrote
  // (at batch 1 every token but the newest).
  const int length = min(a.lengths[0], max_tokens);
  const int32_t position = a.rope.positions[0];
  const int32_t slot = a.rope.slots[0];
  __half* kv_base = slot >= 0 ? a.rope.slot_base[slot] : nullptr;
  {
    const int64_t chunks = a.row_bytes / 16;
    for (int64_t i = tid; i < rows * chunks; i += kThreads) {
      const int r = static_cast<int>(i / chunks);
      const int64_t c = i % chunks;
      const uint8_t* row;
      if (r < q_rows)
        row = static_cast<const uint8_t*>(a.wq) +
              (static_cast<int64_t>(h) * q_rows + r) * a.row_bytes;
      else if (r < q_rows + kHeadDim)
        row = static_cast<const uint8_t*>(a.wk) +
              (static_cast<int64_t>(h) * kHeadDim + r - q_rows) * a.row_bytes;
      else
        row = static_cast<const uint8_t*>(a.wv) +
              (static_cast<int64_t>(h) * kHeadDim + r - q_rows - kHeadDim) * a.row_bytes;
      copy_async<16>(s_w + r * a.row_bytes + c * 16, row + c * 16, true);
    }
  }
  const int64_t k_offset = static_cast<int64_t>(a.rope.layer) * 2 * a.rope.n_kv * kHeadDim +
                           static_cast<int64_t>(h) * kHeadDim;
  const int64_t v_offset = static_cast<int64_t>(a.rope.n_kv) * kHeadDim;
  const int settled = kv_base ? max(length - 1, 0) : 0;
  for (int i = tid; i < settled * 16; i += kThreads) {  // 8 chunks of K, 8 of V per token
    const int t = i / 16, c = i % 16;
    const __half* src = kv_base + static_cast<int64_t>(t) * a.rope.token_stride + k_offset +
                        (c < 8 ? 0 : v_offset) + (c % 8) * 8;
    copy_async<16>(s_kv + t * kTokenHalves + c * 8, src, true);
  }
  commit_copies();
  // The warp's rows warp * per_warp + k: their biases, and their pairs' rotations (Q and K).
  float bias[kMaxRowsPerWarp], sn[kMaxRowsPerWarp / 2], cs[kMaxRowsPerWarp / 2];
#pragma unroll
  for (int k = 0; k < kMaxRowsPerWarp; ++k) {
    bias[k] = 0.0f;
    const int c = warp * per_warp + k;
    if (k >= per_warp) continue;
    const float* b = c < q_rows ? a.bq : c < q_rows + kHeadDim ? a.bk : a.bv;
    const int row = c < q_rows ? h * q_rows + c : h * kHeadDim + (c - q_rows) % kHeadDim;
    if (b) bias[k] = b[row];
  }
#pragma unroll
  for (int i = 0; i < kMaxRowsPerWarp / 2; ++i) {
    sn[i] = 0.0f;
    cs[i] = 1.0f;
    const int c = warp * per_warp + 2 * i;
    if (2 * i < per_warp && c < q_rows + kHeadDim)
      rope_rotation(position, a.rope.frequencies[(c % kHeadDim) / 2], &sn[i], &cs[i]);
  }

  wait_for_previous_kernel();  // the activations, the norm's sums: the kernel before
  allow_next_kernel();
  int4 xa = make_int4(0, 0, 0, 0), xb = xa;
  float2 ds = make_float2(0.0f, 0.0f);
  if (lane < n) {
    const int4* xp = reinterpret_cast<const int4*>(a.in.xq.qs) + 2 * lane;
    xa = xp[0];
    xb = xp[1];
    ds = a.in.xq.ds[lane];
  }
  const float norm_part = a.in.norm_sum_squares && lane < n ? a.in.norm_sum_squares[lane] : 0.0f;
  wait_copies<0>();
  __syncthreads();
  if (length <= 0) return;  // a padding row: nothing to attend (the whole block leaves)

  // The warp's rows: lane j's sub-block j (split_matvec_kernel's sum for a row of one step),
  // the warp sums with the norm's in one set of butterflies.
  float sums[kMaxRowsPerWarp + 1];
#pragma unroll
  for (int k = 0; k < kMaxRowsPerWarp; ++k) {
    float acc = 0.0f;
    if (k < per_warp && lane < n)
      acc += split_dot::dot_payload<TYPE>(
          shared_payload<TYPE>(s_w + (warp * per_warp + k) * a.row_bytes, n, lane), xa, xb, ds);
    sums[k] = acc;
  }
  sums[kMaxRowsPerWarp] = norm_part;
  warp_sums(sums);
  const float scale =
      a.in.norm_sum_squares ? split_dot::norm_scale(a.in, sums[kMaxRowsPerWarp]) : 1.0f;
  const int newest = length - 1;
#pragma unroll
  for (int i = 0; i < kMaxRowsPerWarp / 2; ++i) {
    if (2 * i >= per_warp) break;
    const int c = warp * per_warp + 2 * i;
    float x0 = sums[2 * i] * scale, x1 = sums[2 * i + 1] * scale;
    x0 += bias[2 * i];
    x1 += bias[2 * i + 1];
    if (c < q_rows + kHeadDim) {  // Q and K rotate
      const float r0 = x0 * cs[i] - x1 * sn[i], r1 = x0 * sn[i] + x1 * cs[i];
      x0 = r0;
      x1 = r1;
    }
    if (lane != 0) continue;
    if (c < q_rows) {
      s_q[c] = x0 * a.scale;
      s_q[c + 1] = x1 * a.scale;
      continue;
    }
    const int which = c < q_rows + kHeadDim ? 0 : 1, d = (c - q_rows) % kHeadDim;
    const __half h0 = __float2half_rn(x0), h1 = __float2half_rn(x1);
    s_kv[newest * kTokenHalves + which * kHeadDim + d] = h0;
    s_kv[newest * kTokenHalves + which * kHeadDim + d + 1] = h1;
    if (kv_base) {
      __half* dst = kv_base + static_cast<int64_t>(position) * a.rope.token_stride + k_offset +
                    which * v_offset + d;
      dst[0] = h0;
      dst[1] = h1;
    }
  }
  __syncthreads();

  // Scores: thread t takes token t for the group's heads (q already scaled).
  float s[GP];
#pragma unroll
  for (int g = 0; g < GP; ++g) s[g] = -INFINITY;
  if (tid < length) {
#pragma unroll
    for (int g = 0; g < GP; ++g) s[g] = 0.0f;
    const __half* kt = s_kv + tid * kTokenHalves;
#pragma unroll
    for (int d8 = 0; d8 < kHeadDim; d8 += 8) {
      const uint4 raw = *reinterpret_cast<const uint4*>(kt + d8);
      const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
      float kf[8];
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&words[w]));
        kf[2 * w] = f.x;
        kf[2 * w + 1] = f.y;
      }
#pragma unroll
      for (int g = 0; g < GP; ++g) {
        if (g >= group) break;
#pragma unroll
        for (int j = 0; j < 8; ++j) s[g] = fmaf(s_q[g * kHeadDim + d8 + j], kf[j], s[g]);
      }
    }
  }
#pragma unroll
  for (int g = 0; g < GP; ++g)
    if (g >= group) s[g] = -INFINITY;
  block_reduce_heads<GP, true>(s, group, s_red, s_max);
  float p[GP];
#pragma unroll
  for (int g = 0; g < GP; ++g) {
    p[g] = tid < length && g < group ? __expf(s[g] - s_max[g]) : 0.0f;
    if (tid < length && g < group) s_p[g * max_tokens + tid] = p[g];
  }
  block_reduce_heads<GP, false>(p, group, s_red, s_sum);

  // P·V: thread (part, g, d) sums tokens part, part + parts, ...; then the parts in order.
  constexpr int kParts = kThreads / (GP * kHeadDim);
  const int part = tid / (GP * kHeadDim), gd = tid % (GP * kHeadDim);
  const int g = gd / kHeadDim, d = gd % kHeadDim;
  float o = 0.0f;
  if (g < group)
    for (int t = part; t < length; t += kParts)
      o = fmaf(s_p[g * max_tokens + t], __half2float(s_kv[t * kTokenHalves + kHeadDim + d]), o);
  s_part[tid] = o;
  __syncthreads();
  if (tid >= group * kHeadDim) return;  // whole warps: group * 64 is a multiple of 32
  float total = 0.0f;
#pragma unroll
  for (int q = 0; q < kParts; ++q) total += s_part[q * GP * kHeadDim + tid];
  const float l = s_sum[g];
  const float y = l > 0.0f ? total * (1.0f / l) : 0.0f;
  const int64_t at = static_cast<int64_t>(h) * group * kHeadDim + tid;
  a.out[at] = y;
  if (!a.out_q8.qs) return;
  // Whole warps hold whole 32-element blocks (at is lane-aligned): the quantisation every
  // int8 hand-over uses, as attention.cu's write_output4 rounds it (d = amax / 127, y / d).
  quantize_block_of_warp(y, a.out_q8.qs + at - lane, a.out_q8.ds + at / kQ8Block);
}

int shared_memory_per_block();

// Lets the kernel use all of a block's shared memory, once per process: the first call comes
// from qkv_attention_max_tokens(), which the engine asks before it captures a step (the
// attribute is not set during a capture).
template <uint32_t TYPE, int GP>
cudaError_t allow_shared_bytes() {
  static const cudaError_t status =
      cudaFuncSetAttribute(qkv_attention_kernel<TYPE, GP>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, shared_memory_per_block());
  return status;
}

// allow_shared_bytes() for the instantiation a launch of this type and padded group takes.
cudaError_t allow_shared_bytes_for(uint32_t type, int gp) {
  if (type == kQ4_0)
    return gp == 1   ? allow_shared_bytes<kQ4_0, 1>()
           : gp == 2 ? allow_shared_bytes<kQ4_0, 2>()
                     : allow_shared_bytes<kQ4_0, 4>();
  return gp == 1   ? allow_shared_bytes<kQ4_1, 1>()
         : gp == 2 ? allow_shared_bytes<kQ4_1, 2>()
                   : allow_shared_bytes<kQ4_1, 4>();
}

template <uint32_t TYPE, int GP>
cudaError_t launch_for(const QkvAttentionArgs& args, int max_tokens, const KernelConfig& config,
                       cudaStream_t stream) {
  const cudaError_t allowed = allow_shared_bytes<TYPE, GP>();
  if (allowed != cudaSuccess) return allowed;
  const int group = args.n_head / args.n_kv;
  const Layout lay = layout_of((group + 2) * kHeadDim, args.row_bytes, max_tokens, GP);
  return launch_early_shared(qkv_attention_kernel<TYPE, GP>, dim3(args.n_kv), dim3(kThreads),
                             static_cast<size_t>(lay.total), config, stream, args, max_tokens);
}

int shared_memory_per_block() {
  static const int bytes = [] {
    int device = 0, value = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&value, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
            cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return value;
  }();
  return bytes;
}

}  // namespace

int qkv_attention_max_tokens(uint32_t weight_type, int n_in, int64_t row_bytes, int n_head,
                             int n_kv, int head_dim) {
  if ((weight_type != kQ4_0 && weight_type != kQ4_1) || head_dim != kHeadDim || n_kv <= 0 ||
      n_head % n_kv != 0 || n_head / n_kv > kMaxGroup || n_in <= 0 || n_in % kQ8Block != 0 ||
      n_in / kQ8Block > kMaxSubBlocks || row_bytes % 16 != 0 || row_bytes <= 0)
    return 0;
  const int group = n_head / n_kv, gp = padded_group(group);
  const int rows = (group + 2) * kHeadDim;
  const int64_t fixed = layout_of(rows, row_bytes, 0, gp).total;
  const int64_t per_token = kTokenHalves * 2 + gp * 4;
  const int64_t room = shared_memory_per_block() - fixed;
  if (room < 2 * per_token) return 0;
  if (allow_shared_bytes_for(weight_type, gp) != cudaSuccess) {
    cudaGetLastError();  // reported as "not taken", not in a later launch's status
    return 0;
  }
  return static_cast<int>(std::min<int64_t>(kThreads, room / per_token));
}

cudaError_t launch_qkv_attention(uint32_t weight_type, const QkvAttentionArgs& args, int max_tokens,
                                 const KernelConfig& config, cudaStream_t stream) {
  const int limit = qkv_attention_max_tokens(weight_type, args.in.n_in, args.row_bytes, args.n_head,
                                             args.n_kv, args.head_dim);
  if (limit == 0 || max_tokens <= 0 || max_tokens > limit || args.in.batch != 1)
    return cudaErrorInvalidValue;
  const int gp = padded_group(args.n_head / args.n_kv);
  auto go = [&](auto type_tag) -> cudaError_t {
    constexpr uint32_t TYPE = decltype(type_tag)::value;
    if (gp == 1) return launch_for<TYPE, 1>(args, max_tokens, config, stream);
    if (gp == 2) return launch_for<TYPE, 2>(args, max_tokens, config, stream);
    return launch_for<TYPE, 4>(args, max_tokens, config, stream);
  };
  if (weight_type == kQ4_0) return launch_status(go(std::integral_constant<uint32_t, kQ4_0>{}));
  return launch_status(go(std::integral_constant<uint32_t, kQ4_1>{}));
}

}  // namespace granule::kernels
