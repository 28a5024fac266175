// One thread per 8 elements: decode with the shared dequantize8 and store 16 or 32 bytes.
#include "dequantize.cuh"

#include "activation_q8.cuh"
#include "granule/split_layout.h"
#include "quant_blocks.cuh"

namespace granule::kernels {
namespace {

constexpr int kThreads = 256;

// Elements 8c..8c+7 of a split-layout row of n_cols (split_layout.h).
template <uint32_t TYPE>
__device__ __forceinline__ void split_dequantize8(const uint8_t* row, int64_t n_cols, int64_t c,
                                                  float* v) {
  const int64_t n = n_cols / 32, j = c / 4;
  const int e0 = 8 * static_cast<int>(c % 4);
  const uint8_t* scales = row + split::scales_offset(TYPE, n);
  if constexpr (TYPE == kQ8_0) {
    const float d = half_bits_to_float(reinterpret_cast<const uint16_t*>(scales)[j]);
    const int8_t* q = reinterpret_cast<const int8_t*>(row) + 32 * j + e0;
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = d * static_cast<float>(q[i]);
  } else if constexpr (TYPE == kQ4_0 || TYPE == kQ4_1) {
    const uint8_t* q = row + 16 * j + (e0 % 16);
    const int shift = e0 < 16 ? 0 : 4;
    float d, m;
    if constexpr (TYPE == kQ4_0) {
      d = half_bits_to_float(reinterpret_cast<const uint16_t*>(scales)[j]);
      m = -8.0f * d;
    } else {
      d = half_bits_to_float(reinterpret_cast<const uint16_t*>(scales)[2 * j]);
      m = half_bits_to_float(reinterpret_cast<const uint16_t*>(scales)[2 * j + 1]);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = static_cast<float>((q[i] >> shift) & 0xF) * d + m;
  } else if constexpr (TYPE == kQ5_0 || TYPE == kQ5_1) {
    const uint8_t* q = row + 16 * j + (e0 % 16);
    const int shift = e0 < 16 ? 0 : 4;
    uint32_t qh;
    float d, m;
    if constexpr (TYPE == kQ5_0) {
      qh = reinterpret_cast<const uint32_t*>(scales)[j];
      d = half_bits_to_float(reinterpret_cast<const uint16_t*>(row + split::q5_0_d_offset(n))[j]);
      m = -16.0f * d;
    } else {
      const uint2 v = reinterpret_cast<const uint2*>(scales)[j];
      qh = v.x;
      d = half_bits_to_float(static_cast<uint16_t>(v.y));
      m = half_bits_to_float(static_cast<uint16_t>(v.y >> 16));
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int value = ((q[i] >> shift) & 0xF) | (((qh >> (e0 + i)) & 1) << 4);
      v[i] = static_cast<float>(value) * d + m;
    }
  } else if constexpr (TYPE == kQ4_K || TYPE == kQ5_K) {
    // As dequantize8's Q4_K/Q5_K: (d * sc) * q - dmin * m.
    const uint8_t* q = row + 16 * j + (e0 % 16);
    const int shift = e0 < 16 ? 0 : 4;
    const uint32_t dm =
        reinterpret_cast<const uint32_t*>(row + split::kquant_d_offset(TYPE, n))[j / 8];
    const uint16_t sm = reinterpret_cast<const uint16_t*>(scales)[j];
    const float d = half_bits_to_float(static_cast<uint16_t>(dm)) * static_cast<float>(sm & 0xFF);
    const float m =
        half_bits_to_float(static_cast<uint16_t>(dm >> 16)) * static_cast<float>(sm >> 8);
    uint32_t qh = 0;
    if constexpr (TYPE == kQ5_K)
      qh = reinterpret_cast<const uint32_t*>(row + split::q5k_qh_offset(n))[j];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int value = ((q[i] >> shift) & 0xF) | (((qh >> (e0 + i)) & 1) << 4);
      v[i] = d * static_cast<float>(value) - m;
    }
  } else if constexpr (TYPE == kQ2_K || TYPE == kQ3_K) {
    // As dequantize8 (and quant.cpp): dl * q - ml for Q2_K, dl * q for Q3_K, dl = d * scale.
    const uint8_t* q = row + 8 * j;  // element e: byte e % 8, bits 2 * (e / 8)
    const int shift = 2 * (e0 / 8);
    const uint8_t sc = scales[2 * j + e0 / 16];
    if constexpr (TYPE == kQ2_K) {
      const uint32_t dm = reinterpret_cast<const uint32_t*>(row + split::q2k_d_offset(n))[j / 8];
      const float dl = half_bits_to_float(static_cast<uint16_t>(dm)) * static_cast<float>(sc & 0xF);
      const float ml =
          half_bits_to_float(static_cast<uint16_t>(dm >> 16)) * static_cast<float>(sc >> 4);
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = dl * static_cast<float>((q[i] >> shift) & 3) - ml;
    } else {
      const uint32_t qh = reinterpret_cast<const uint32_t*>(row + split::q3k_qh_offset(n))[j];
      const float dl = half_bits_to_float(
                           reinterpret_cast<const uint16_t*>(row + split::q3k_d_offset(n))[j / 8]) *
                       static_cast<float>(static_cast<int8_t>(sc));
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int e = e0 + i;
        const int bit = (qh >> (8 * (e % 4) + e / 4)) & 1;
        v[i] = dl * static_cast<float>((((q[i] >> shift) & 3) | (bit << 2)) - 4);
      }
    }
  } else if constexpr (TYPE == kIQ4_NL || TYPE == kIQ4_XS || TYPE == kMXFP4) {
    const uint8_t* q = row + 16 * j + (e0 % 16);
    const int shift = e0 < 16 ? 0 : 4;
    float d;
    if constexpr (TYPE == kIQ4_NL)
      d = half_bits_to_float(reinterpret_cast<const uint16_t*>(scales)[j]);
    else if constexpr (TYPE == kIQ4_XS)
      d = half_bits_to_float(
              reinterpret_cast<const uint16_t*>(row + split::iq4xs_d_offset(n))[j / 8]) *
          static_cast<float>(reinterpret_cast<const int8_t*>(scales)[j]);
    else
      d = e8m0_to_float_half(scales[j]);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int level = (q[i] >> shift) & 0xF;
      v[i] = d * static_cast<float>(TYPE == kMXFP4 ? mxfp4_level(level) : iq4nl_level(level));
    }
  } else {  // Q6_K
    const uint8_t* qh = row + split::q6k_qh_offset(n) + 8 * j;
    const float d =
        half_bits_to_float(reinterpret_cast<const uint16_t*>(row + split::q6k_d_offset(n))[j / 8]);
    const float sc =
        d * static_cast<float>(reinterpret_cast<const int8_t*>(scales)[2 * j + e0 / 16]);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int e = e0 + i;
      const int low = e < 16 ? row[16 * j + e] & 0xF : row[16 * j + e - 16] >> 4;
      const int high = (qh[e % 8] >> (2 * (e / 8))) & 3;
      v[i] = sc * static_cast<float>((low | (high << 4)) - 32);
    }
  }
}

// Elements 8c..8c+7 of a row in either layout.
template <uint32_t TYPE>
__device__ __forceinline__ void row_dequantize8(const uint8_t* row, int64_t n_cols, int64_t c,
                                                bool split_layout, float* v) {
  if constexpr (split::supports(TYPE)) {
    if (split_layout) {
      split_dequantize8<TYPE>(row, n_cols, c, v);
      return;
    }
  }
  dequantize8<TYPE>(row, c, v);
}

template <uint32_t TYPE>
__global__ void dequantize_to_f16_kernel(const uint8_t* __restrict__ weight, int64_t rows,
                                         int64_t chunks_per_row, int64_t row_bytes,
                                         bool split_layout, __half* __restrict__ out) {
  const int64_t total = rows * chunks_per_row;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / chunks_per_row, chunk = i % chunks_per_row;
    float v[8];
    row_dequantize8<TYPE>(weight + row * row_bytes, chunks_per_row * 8, chunk, split_layout, v);
    __align__(16) __half h[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) h[k] = __float2half_rn(v[k]);
    reinterpret_cast<uint4*>(out)[i] = *reinterpret_cast<const uint4*>(h);
  }
}

// The hand-over of one 32-element block held by 4 consecutive lanes (8 elements each, v):
// quantised as quantize_block_of_warp does (amax / 127, v·w / d rounded), Σ y² beside it.
__device__ __forceinline__ void hand_over_block(const float (&v)[8], const NormHandOver& h,
                                                int chunk) {
  const int lane = threadIdx.x % kWarpSize;
  const unsigned group = 0xFu << (lane & ~3);  // the block's 4 lanes (whole groups run)
  const float4* w4 = reinterpret_cast<const float4*>(h.weight) + 2 * chunk;
  const float4 wa = w4[0], wb = w4[1];
  const float w[8] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
  float y[8], amax = 0.0f, sum_sq = 0.0f;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    y[k] = v[k] * w[k];
    amax = fmaxf(amax, fabsf(y[k]));
    sum_sq = fmaf(v[k], v[k], sum_sq);
  }
#pragma unroll
  for (int off = 1; off < 4; off <<= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(group, amax, off));
    sum_sq += __shfl_xor_sync(group, sum_sq, off);
  }
  const float d = amax / 127.0f;
  int q[8], sum = 0;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    q[k] = amax == 0.0f ? 0 : __float2int_rn(y[k] / d);
    sum += q[k];
  }
#pragma unroll
  for (int off = 1; off < 4; off <<= 1) sum += __shfl_xor_sync(group, sum, off);
  uint2 packed;
  packed.x = (static_cast<uint32_t>(q[0]) & 0xFF) | ((static_cast<uint32_t>(q[1]) & 0xFF) << 8) |
             ((static_cast<uint32_t>(q[2]) & 0xFF) << 16) | (static_cast<uint32_t>(q[3]) << 24);
  packed.y = (static_cast<uint32_t>(q[4]) & 0xFF) | ((static_cast<uint32_t>(q[5]) & 0xFF) << 8) |
             ((static_cast<uint32_t>(q[6]) & 0xFF) << 16) | (static_cast<uint32_t>(q[7]) << 24);
  reinterpret_cast<uint2*>(h.qs)[chunk] = packed;
  if (lane % 4 == 0) {
    h.ds[chunk / 4] = make_float2(d, d * static_cast<float>(sum));
    h.sums[chunk / 4] = sum_sq;
  }
}

template <uint32_t TYPE>
__global__ void embedding_gather_kernel(const uint8_t* __restrict__ table, int64_t row_bytes,
                                        int n_embd, int64_t n_vocab, bool split_layout,
                                        const int32_t* __restrict__ tokens,
                                        float* __restrict__ out, NormHandOver hand_over) {
  wait_for_previous_kernel();
  allow_next_kernel();
  const int t = blockIdx.x;
  const int32_t token = tokens[t];
  float* dst = out + static_cast<int64_t>(t) * n_embd;
  for (int chunk = threadIdx.x; chunk < n_embd / 8; chunk += blockDim.x) {
    float v[8] = {};
    if (token >= 0 && token < n_vocab)
      row_dequantize8<TYPE>(table + token * row_bytes, n_embd, chunk, split_layout, v);
    float4* d = reinterpret_cast<float4*>(dst) + 2 * chunk;
    d[0] = make_float4(v[0], v[1], v[2], v[3]);
    d[1] = make_float4(v[4], v[5], v[6], v[7]);
    if (hand_over.qs) hand_over_block(v, hand_over, chunk);
  }
}

}  // namespace

cudaError_t launch_dequantize_to_f16(uint32_t weight_type, const void* weight, int64_t rows,
                                     int64_t n_cols, int64_t row_bytes, __half* out,
                                     cudaStream_t stream, bool split_layout) {
  if (n_cols % 8 != 0 || block_elems(weight_type) == 0 || n_cols % block_elems(weight_type) != 0)
    return cudaErrorInvalidValue;
  if (split_layout && !split::supports(weight_type)) return cudaErrorInvalidValue;
  const int64_t chunks_per_row = n_cols / 8;
  const int64_t total = rows * chunks_per_row;
  if (total == 0) return cudaSuccess;
  const int blocks = static_cast<int>(std::min<int64_t>(ceil_div(total, kThreads), 132 * 32));
  const bool ok = dispatch_weight_type(weight_type, [&](auto type_tag) {
    constexpr uint32_t TYPE = decltype(type_tag)::value;
    dequantize_to_f16_kernel<TYPE><<<blocks, kThreads, 0, stream>>>(
        static_cast<const uint8_t*>(weight), rows, chunks_per_row, row_bytes, split_layout, out);
  });
  return ok ? launch_status() : cudaErrorInvalidValue;
}

cudaError_t launch_embedding_gather(uint32_t weight_type, const void* table, int64_t row_bytes,
                                    int n_embd, int64_t n_vocab, const int32_t* tokens,
                                    int n_tokens, float* out, cudaStream_t stream,
                                    bool split_layout, const NormHandOver* hand_over) {
  if (n_embd % 8 != 0 || block_elems(weight_type) == 0 || n_embd % block_elems(weight_type) != 0)
    return cudaErrorInvalidValue;
  if (hand_over && (n_tokens != 1 || n_embd % kQ8Block != 0 || !hand_over->weight ||
                    !hand_over->qs || !hand_over->ds || !hand_over->sums))
    return cudaErrorInvalidValue;
  const NormHandOver h = hand_over ? *hand_over : NormHandOver{};
  if (split_layout && !split::supports(weight_type)) return cudaErrorInvalidValue;
  if (n_tokens == 0) return cudaSuccess;
  const bool ok = dispatch_weight_type(weight_type, [&](auto type_tag) {
    constexpr uint32_t TYPE = decltype(type_tag)::value;
    embedding_gather_kernel<TYPE><<<n_tokens, 128, 0, stream>>>(
        static_cast<const uint8_t*>(table), row_bytes, n_embd, n_vocab, split_layout, tokens, out,
        h);
  });
  return ok ? launch_status() : cudaErrorInvalidValue;
}

}  // namespace granule::kernels
