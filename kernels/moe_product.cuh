// What the expert product kernels share (moe.cu's dp4a family, moe_mma.cu's tensor-core one):
// one launch's parameters and the gate/up epilogue's activation.
#pragma once
#include <cuda_fp16.h>

#include "moe.cuh"
#include "moe_unpack.cuh"
#include "quant_blocks.cuh"

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

// The grouped tensor-core products (moe_mma.cu, moe_gemm.cu) share their epilogue and the checks
// of their arguments.
//
// The value moe_store_grouped stores (row < n_out).
template <bool GATE_UP>
__device__ __forceinline__ float moe_grouped_value(const MoeProduct& P, const MoeTile& tile,
                                                   int row, float a, float b) {
  const int64_t bias_at = static_cast<int64_t>(tile.expert) * P.n_out + row;
  float v = a;
  if (P.a.bias) v = __fadd_rn(v, P.a.bias[bias_at]);
  if constexpr (GATE_UP) {
    if (P.b.bias) b = __fadd_rn(b, P.b.bias[bias_at]);
    v = moe_activate(P.act, v, b);
  }
  return v;
}
// Column `column` of `tile` (one pair) at output row `row`: a's sum plus its bias, for gate/up
// through the activation with b's (up's sum), stored at the pair's row. Columns past the tile and
// rows past n_out store nothing.
template <bool GATE_UP>
__device__ __forceinline__ void moe_store_grouped(const MoeProduct& P, const MoeTile& tile,
                                                  int column, int row, float a, float b) {
  if (column >= tile.count || row >= P.n_out) return;
  const int pair = P.in.groups.order[tile.first + column];
  P.out[static_cast<int64_t>(pair) * P.n_out + row] =
      moe_grouped_value<GATE_UP>(P, tile, row, a, b);
}

// Whether a grouped tensor-core launch's arguments are ones its kernels take (each launcher adds
// its own tile sizes): the weight types, whole input blocks, quantised activations, the grouping
// and a grid of at most 65,535 tiles.
inline bool moe_grouped_args_ok(const MoeProduct& P, bool gate_up) {
  const MoeInput& in = P.in;
  if (!moe_mma_supports(P.a.type) ||
      (gate_up && (P.b.type != P.a.type || P.b.row_bytes != P.a.row_bytes)))
    return false;
  if (in.n_in <= 0 || in.n_in % kQ8Block != 0 || in.n_in % block_elems(P.a.type) != 0 ||
      in.n_used <= 0 || !in.xq.qs || !in.xq.ds)
    return false;
  const MoeGroups& groups = in.groups;
  if (!groups.tiles || !groups.order || !groups.n_tiles || in.n_expert <= 0 ||
      in.n_expert > kMoeMaxExperts || groups.tile_pairs < 1)
    return false;
  return moe_max_tiles(in.pairs, in.n_expert, groups.tile_pairs) <= 65535;
}

}  // namespace granule::kernels
