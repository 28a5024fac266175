// Activations quantised to int8 blocks of 32 (ggml's Q8_1 idea, in two plain arrays) so the
// quantised matrix-vector kernels can use 4-way int8 dot products: qs[row][i] int8, and per
// block ds = (d, d * sum of the block's qs).
#pragma once
#include <cstdint>

#include "common.cuh"

namespace granule::kernels {

constexpr int kQ8Block = 32;

struct ActivationQ8 {
  int8_t* qs = nullptr;  // [rows][n]
  float2* ds = nullptr;  // [rows][n / 32]
};

#ifdef __CUDACC__
// Each lane of a warp holds one element of a 32-element block; lane 0 writes the scales.
// Both reductions are one redux.sync each (sm_80 and later) instead of five shuffles: the
// largest |v| is the largest bit pattern of the non-negative floats, so the scale is
// warp_max's to the bit, and the sum of the int8 values is exact either way.
__device__ __forceinline__ void quantize_block_of_warp(float v, int8_t* qs_out, float2* ds_out) {
  const int lane = threadIdx.x % kWarpSize;
  const float amax = __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(fabsf(v))));
  const float d = amax / 127.0f;
  const int q = amax == 0.0f ? 0 : __float2int_rn(v / d);
  const int sum = __reduce_add_sync(0xffffffffu, q);
  qs_out[lane] = static_cast<int8_t>(q);
  if (lane == 0) *ds_out = make_float2(d, d * static_cast<float>(sum));
}
#endif  // __CUDACC__

}  // namespace granule::kernels
