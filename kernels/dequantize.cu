// One thread per 8 elements: decode with the shared dequantize8 and store 16 or 32 bytes.
#include "dequantize.cuh"
#include "quant_blocks.cuh"

namespace granule::kernels {
namespace {

constexpr int kThreads = 256;

template <uint32_t TYPE>
__global__ void dequantize_to_f16_kernel(const uint8_t* __restrict__ weight, int64_t rows,
                                         int64_t chunks_per_row, int64_t row_bytes,
                                         __half* __restrict__ out) {
  const int64_t total = rows * chunks_per_row;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / chunks_per_row, chunk = i % chunks_per_row;
    float v[8];
    dequantize8<TYPE>(weight + row * row_bytes, chunk, v);
    __align__(16) __half h[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) h[k] = __float2half_rn(v[k]);
    reinterpret_cast<uint4*>(out)[i] = *reinterpret_cast<const uint4*>(h);
  }
}

template <uint32_t TYPE>
__global__ void embedding_gather_kernel(const uint8_t* __restrict__ table, int64_t row_bytes,
                                        int n_embd, int64_t n_vocab,
                                        const int32_t* __restrict__ tokens,
                                        float* __restrict__ out) {
  const int t = blockIdx.x;
  const int32_t token = tokens[t];
  float* dst = out + static_cast<int64_t>(t) * n_embd;
  for (int chunk = threadIdx.x; chunk < n_embd / 8; chunk += blockDim.x) {
    float v[8] = {};
    if (token >= 0 && token < n_vocab) dequantize8<TYPE>(table + token * row_bytes, chunk, v);
    float4* d = reinterpret_cast<float4*>(dst) + 2 * chunk;
    d[0] = make_float4(v[0], v[1], v[2], v[3]);
    d[1] = make_float4(v[4], v[5], v[6], v[7]);
  }
}

}  // namespace

cudaError_t launch_dequantize_to_f16(uint32_t weight_type, const void* weight, int64_t rows,
                                     int64_t n_cols, int64_t row_bytes, __half* out,
                                     cudaStream_t stream) {
  if (n_cols % 8 != 0 || block_elems(weight_type) == 0 || n_cols % block_elems(weight_type) != 0)
    return cudaErrorInvalidValue;
  const int64_t chunks_per_row = n_cols / 8;
  const int64_t total = rows * chunks_per_row;
  if (total == 0) return cudaSuccess;
  const int blocks = static_cast<int>(std::min<int64_t>(ceil_div(total, kThreads), 132 * 32));
  const bool ok = dispatch_weight_type(weight_type, [&](auto type_tag) {
    constexpr uint32_t TYPE = decltype(type_tag)::value;
    dequantize_to_f16_kernel<TYPE><<<blocks, kThreads, 0, stream>>>(
        static_cast<const uint8_t*>(weight), rows, chunks_per_row, row_bytes, out);
  });
  return ok ? launch_status() : cudaErrorInvalidValue;
}

cudaError_t launch_embedding_gather(uint32_t weight_type, const void* table, int64_t row_bytes,
                                    int n_embd, int64_t n_vocab, const int32_t* tokens,
                                    int n_tokens, float* out, cudaStream_t stream) {
  if (n_embd % 8 != 0 || block_elems(weight_type) == 0 || n_embd % block_elems(weight_type) != 0)
    return cudaErrorInvalidValue;
  if (n_tokens == 0) return cudaSuccess;
  const bool ok = dispatch_weight_type(weight_type, [&](auto type_tag) {
    constexpr uint32_t TYPE = decltype(type_tag)::value;
    embedding_gather_kernel<TYPE><<<n_tokens, 128, 0, stream>>>(
        static_cast<const uint8_t*>(table), row_bytes, n_embd, n_vocab, tokens, out);
  });
  return ok ? launch_status() : cudaErrorInvalidValue;
}

}  // namespace granule::kernels
