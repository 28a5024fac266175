// What the expert product kernels share (moe.cu's dp4a family, moe_mma.cu's tensor-core one):
// one launch's parameters and the gate/up epilogue's activation.
#pragma once
#include <cuda_fp16.h>

#include "moe.cuh"
#include "moe_unpack.cuh"

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

// One int8 weight chunk of 8 (moe_unpack.cuh) against the int8 activations (xa, xb: the 8 bytes;
// xs: their sum, for types with an offset; xd: the activation block's scale), added to acc:
// acc + d_x · (scale · Σ q·x_q + offset · Σ x_q). Every dp4a expert kernel adds its chunks
// through this, so the same chunks in the same order give the same bits in every kernel.
template <bool OFFSET>
__device__ __forceinline__ float moe_q8_fma(const moe_unpack::Chunk8& w, int xa, int xb, int xs,
                                            float xd, float acc) {
  const int s = __dp4a(w.hi, xb, __dp4a(w.lo, xa, 0));
  float v = w.scale * static_cast<float>(s);
  if constexpr (OFFSET) v = fmaf(w.offset, static_cast<float>(xs), v);
  return fmaf(xd, v, acc);
}

// gelu(g) · u as gemma_ops.cu's geglu_one (the dense Gemma FFN on the GPU) computes it: gelu of g
// rounded to f16, rounded to f16 (ggml's GGML_GELU_FP16 table), g itself from 10 up, 0 from -10
// down; explicit roundings so the expert kernels give the dense kernel's bits.
__device__ __forceinline__ float moe_geglu(float g, float u) {
  if (g >= 10.0f) return g * u;
  if (g <= -10.0f) return 0.0f * u;
  constexpr float kCoefA = 0.044715f;
  constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
  const float h = __half2float(__float2half_rn(g));
  const float inner =
      __fmul_rn(__fmul_rn(kSqrt2OverPi, h), __fadd_rn(1.0f, __fmul_rn(__fmul_rn(kCoefA, h), h)));
  const float gelu = __fmul_rn(__fmul_rn(0.5f, h), __fadd_rn(1.0f, tanhf(inner)));
  return __half2float(__float2half_rn(gelu)) * u;
}

__device__ __forceinline__ float moe_activate(MoeActivation act, float g, float u) {
  if (act == MoeActivation::Geglu) return moe_geglu(g, u);
  if (act == MoeActivation::SwigluClamped) {
    g = fminf(g, 7.0f);
    u = fminf(fmaxf(u, -7.0f), 7.0f);
    return g / (1.0f + expf(-1.702f * g)) * (u + 1.0f);
  }
  return g / (1.0f + expf(-g)) * u;
}

}  // namespace granule::kernels
