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

// A gate/up launch (gate and up read the token's row of the input; the activation into h) and a
// down launch (each pair reads its own activation row; into y).
inline MoeProduct gate_up_product(const MoeMatrix& gate, const MoeMatrix& up, MoeActivation act,
                                  int n_out, const MoeInput& in, float* h) {
  MoeProduct P;
  P.a = gate;
  P.b = up;
  P.act = act;
  P.n_out = n_out;
  P.in = in;
  P.in.per_pair_input = false;
  P.out = h;
  return P;
}
inline MoeProduct down_product(const MoeMatrix& down, int n_out, const MoeInput& in, float* y) {
  MoeProduct P;
  P.a = down;
  P.n_out = n_out;
  P.in = in;
  P.in.per_pair_input = true;
  P.out = y;
  return P;
}

__device__ __forceinline__ float moe_activate(MoeActivation act, float g, float u) {
  if (act == MoeActivation::SwigluClamped) {
    g = fminf(g, 7.0f);
    u = fminf(fmaxf(u, -7.0f), 7.0f);
    return g / (1.0f + expf(-1.702f * g)) * (u + 1.0f);
  }
  return g / (1.0f + expf(-g)) * u;
}

}  // namespace granule::kernels
