// What the expert product kernels share (moe.cu's dp4a family, moe_mma.cu's tensor-core one):
// one launch's parameters and the gate/up epilogue's activation.
#pragma once
#include "moe.cuh"

namespace granule::kernels {

struct MoeProduct {
  MoeMatrix a, b;  // b: up (gate/up launches only)
  MoeActivation act = MoeActivation::Swiglu;
  int n_out = 0;
  MoeInput in;
  float* out = nullptr;
};

__device__ __forceinline__ float moe_activate(MoeActivation act, float g, float u) {
  if (act == MoeActivation::SwigluClamped) {
    g = fminf(g, 7.0f);
    u = fminf(fmaxf(u, -7.0f), 7.0f);
    return g / (1.0f + expf(-1.702f * g)) * (u + 1.0f);
  }
  return g / (1.0f + expf(-g)) * u;
}

}  // namespace granule::kernels
