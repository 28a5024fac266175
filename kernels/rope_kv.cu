// One warp per head vector (Q heads, then K heads, then V heads); each lane holds
// head_dim/32 consecutive elements, so a NeoX partner is exactly 16 lanes away. Blocks past the
// heads' add the residual bias, one element per thread.
#include "common.cuh"
#include "rope_kv.cuh"

namespace granule::kernels {
namespace {

constexpr int kWarpsPerBlock = 4;

template <int EPL>
__global__ void __launch_bounds__(kWarpsPerBlock* kWarpSize) rope_kv_kernel(RopeKvArgs a) {
  wait_for_previous_kernel();
  allow_next_kernel();
  const int lane = threadIdx.x % kWarpSize;
  const int head_blocks = (a.n_head + 2 * a.n_kv + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const int row = blockIdx.y;
  if (static_cast<int>(blockIdx.x) >= head_blocks) {  // the residual bias
    const int i = (blockIdx.x - head_blocks) * blockDim.x + threadIdx.x;
    if (i < a.residual_width && a.slots[row] >= 0)
      a.residual[row * a.residual_stride + i] += a.residual_bias[i];
    return;
  }
  const int head = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (head >= a.n_head + 2 * a.n_kv) return;
  const int hd = a.head_dim;
  const int d0 = lane * EPL;

  int kind, h;  // 0 = Q, 1 = K, 2 = V
  if (head < a.n_head) {
    kind = 0;
    h = head;
  } else if (head < a.n_head + a.n_kv) {
    kind = 1;
    h = head - a.n_head;
  } else {
    kind = 2;
    h = head - a.n_head - a.n_kv;
  }
  // A padding row (a decode graph's bucket wider than the batch) writes no KV.
  if (kind != 0 && a.slots[row] < 0) return;

  const float* src = kind == 0   ? a.q + row * a.q_stride
                     : kind == 1 ? a.k + row * a.k_stride
                                 : a.v + row * a.v_stride;
  const float* bias = kind == 0 ? a.q_bias : kind == 1 ? a.k_bias : a.v_bias;
  const float* norm = kind == 0 ? a.q_norm : kind == 1 ? a.k_norm : nullptr;
  src += h * hd;

  float x[EPL];
#pragma unroll
  for (int j = 0; j < EPL; ++j) {
    x[j] = src[d0 + j];
    if (bias) x[j] += bias[h * hd + d0 + j];
  }
  if (norm) {
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < EPL; ++j) ss += x[j] * x[j];
    const float scale = rsqrtf(warp_sum(ss) / hd + a.norm_eps);
#pragma unroll
    for (int j = 0; j < EPL; ++j) x[j] = x[j] * scale * norm[d0 + j];
  }

  const int32_t pos = a.positions[row];
  if (kind != 2) {
    if (a.neox) {
      const bool first_half = lane < 16;
#pragma unroll
      for (int j = 0; j < EPL; ++j) {
        const float partner = __shfl_xor_sync(0xffffffffu, x[j], 16);
        float s, c;
        rope_rotation(pos, a.frequencies[(d0 + j) % (hd / 2)], &s, &c);
        s *= a.magnitude;
        c *= a.magnitude;
        x[j] = first_half ? x[j] * c - partner * s : partner * s + x[j] * c;
      }
    } else {
#pragma unroll
      for (int j = 0; j < EPL; j += 2) {
        float s, c;
        rope_rotation(pos, a.frequencies[(d0 + j) / 2], &s, &c);
        s *= a.magnitude;
        c *= a.magnitude;
        const float x0 = x[j], x1 = x[j + 1];
        x[j] = x0 * c - x1 * s;
        x[j + 1] = x0 * s + x1 * c;
      }
    }
  }

  if (kind == 0) {
    float* dst = a.q + row * a.q_stride + h * hd;
#pragma unroll
    for (int j = 0; j < EPL; ++j) dst[d0 + j] = x[j];
  } else {
    __half* dst = a.slot_base[a.slots[row]] + a.kv_offset + pos * a.token_stride +
                  (static_cast<int64_t>(a.layer) * 2 + (kind - 1)) * a.n_kv * hd + h * hd;
#pragma unroll
    for (int j = 0; j < EPL; ++j) dst[d0 + j] = __float2half_rn(x[j]);
  }
}

}  // namespace

cudaError_t launch_rope_kv(const RopeKvArgs& args, const KernelConfig& config,
                           cudaStream_t stream) {
  if (args.rows == 0) return cudaSuccess;
  if (args.residual_width > 0 && (!args.residual || !args.residual_bias))
    return cudaErrorInvalidValue;
  const int threads = kWarpsPerBlock * kWarpSize;
  const int bias_blocks = args.residual ? ceil_div(args.residual_width, threads) : 0;
  const dim3 grid(ceil_div(args.n_head + 2 * args.n_kv, kWarpsPerBlock) + bias_blocks, args.rows);
  cudaError_t status;
  switch (args.head_dim) {
    case 64:
      status = launch_early(rope_kv_kernel<2>, grid, dim3(threads), config, stream, args);
      break;
    case 128:
      status = launch_early(rope_kv_kernel<4>, grid, dim3(threads), config, stream, args);
      break;
    case 256:
      status = launch_early(rope_kv_kernel<8>, grid, dim3(threads), config, stream, args);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return launch_status(status);
}

}  // namespace granule::kernels
