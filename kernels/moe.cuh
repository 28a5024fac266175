// Mixture-of-experts feed-forward kernels (issue 36): the router's logits, gating and top-k
// with the routing counts, the grouping of (row, k) pairs by expert, the experts' gate/up
// product with the activation, the down product, and the weighted sum into the residual. The
// expert products come in three families: dp4a (moe.cu; any run, every type), warp-per-row dp4a
// for small runs (moe_decode.cu; the same bits) and, for grouped runs of many pairs, int8 tensor
// cores (moe_mma.cu).
// Every expert matrix is read through a device pointer table (one pointer per expert), so an
// expert may sit in VRAM or in mapped pinned host memory, and moves between steps by
// rewriting the table: nothing here depends on where an expert is, and a captured graph stays
// valid. The same kernels run at every row count (the CPU oracle's device-numerics emulation
// relies on it): a (row, k) pair's result does not depend on which other pairs share its launch.
//
// Rounding (the contract of issue 36): the router reads f32 x; gate/up of a quantised expert
// (any type but F32/F16/BF16) read x through int8 blocks of 32 (the RMSNorm kernel's
// MultiplyByInverse rounding), down reads the activation through int8 blocks with
// quantize_q8's Divide rounding; F32/F16/BF16 experts read f32. A quantised weight chunk of 8
// is unpacked to int8 with one scale and offset (moe_unpack.cuh) and meets the int8 activations
// in dp4a; float weights are decoded to f32 (dequantize8) and meet f32 activations in fused
// multiply-adds.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "activation_q8.cuh"

namespace granule::kernels {

// ModelConfig's ExpertGating and FfnActivation, in the same order. Geglu: gelu(gate) · up with
// gelu's tanh form as the dense Gemma path computes it on the GPU (gemma_ops.cu's geglu_one:
// ggml's f16 table entry, the tails at ±10 as ggml's CPU takes them).
enum class MoeGating : int { Softmax = 0, Sigmoid = 1, SoftmaxOfTopK = 2 };
enum class MoeActivation : int { Swiglu = 0, SwigluClamped = 1, Geglu = 2 };

constexpr int kMoeMaxExperts = 1024;
constexpr int kMoeMaxUsed = 32;
// (row, k) pairs per tile of the grouped dp4a kernels: one read of an expert's weight rows
// serves up to this many pairs routed to it (a tile of more pairs is taken in runs of this many).
constexpr int kMoeTilePairs = 8;

struct MoeRouting {
  int n_expert = 0, n_used = 0;
  MoeGating gating = MoeGating::Softmax;
  bool normalize = false;  // the k weights divided by their sum
  float scale = 1.0f;      // then multiplied by this
  // Then each choice's weight times its expert's output scale (Gemma 4's ffn_down_exps.scale,
  // [n_expert] f32), or none: y · (w · s), which the CPU oracle's device-numerics emulation
  // computes the same way (the reference takes (y · s) · w, llama.cpp's order).
  const float* expert_scale = nullptr;
};

// True for the types the expert kernels read (every GGUF block type dequantize8 decodes).
bool moe_supports(uint32_t type);
// True where the expert's input goes through int8 blocks (every type but F32/F16/BF16).
bool moe_reads_q8(uint32_t type);

// logits[r * n_expert + e] = router_e · x[r] (+ bias[e]) in f32, router rows in GGUF blocks of
// `type` (row_bytes apart); x: [rows][n_in] f32, n_in a multiple of 32.
cudaError_t launch_moe_router(uint32_t type, const void* router, int64_t row_bytes, int n_expert,
                              int n_in, const float* x, int rows, const float* bias, float* logits,
                              const KernelConfig& config, cudaStream_t stream);

// Gating and top-k per row (descending, ties to the lower expert index), then normalisation
// and scale: ids[r * n_used + j] and weights[r * n_used + j] in top-k order. counts[e] (one
// layer's row of the [n_layer][n_expert] counts) gets one per choice of a row whose slot is
// >= 0 (slots null: every row); counts null: none.
cudaError_t launch_moe_topk(const float* logits, int rows, const MoeRouting& routing, int32_t* ids,
                            float* weights, int32_t* counts, const int32_t* slots,
                            const KernelConfig& config, cudaStream_t stream);

// launch_moe_router then launch_moe_topk in one launch, for runs of any length: the same
// logits, ids, weights and counts to the bit. The rows go in groups of kMoeRouteGroupRows; in
// each group the last block to finish its logits takes the gating and top-k of the group's rows.
// It finds itself through its group's counter: `counters` holds moe_route_counters(rows) zeroed
// uint32 of device memory, which the launch leaves zero again (launches sharing counters must
// not overlap: one stream).
constexpr int kMoeRouteGroupRows = 8;
constexpr int moe_route_counters(int rows) {
  return (rows + kMoeRouteGroupRows - 1) / kMoeRouteGroupRows;
}
cudaError_t launch_moe_route(uint32_t type, const void* router, int64_t row_bytes, int n_in,
                             const float* x, int rows, const float* bias, const MoeRouting& routing,
                             float* logits, int32_t* ids, float* weights, int32_t* counts,
                             const int32_t* slots, unsigned int* counters,
                             const KernelConfig& config, cudaStream_t stream);

// A run of up to MoeGroups::tile_pairs pairs routed to one expert: order[first .. first + count).
struct MoeTile {
  int32_t expert = 0, first = 0, count = 0, pad = 0;
};
struct MoeGroups {
  int32_t* order = nullptr;    // [pairs]: pair indices grouped by expert, ascending within one
  MoeTile* tiles = nullptr;    // [moe_max_tiles(pairs, n_expert, tile_pairs)]
  int32_t* n_tiles = nullptr;  // [1]: tiles written
  int32_t tile_pairs = kMoeTilePairs;  // the most pairs of a tile
};
// The most tiles `pairs` pairs over n_expert experts can take in tiles of up to tile_pairs (the
// grid of a grouped launch).
int moe_max_tiles(int pairs, int n_expert, int tile_pairs = kMoeTilePairs);
// Counting sort of the pairs by expert (stable, so deterministic) and their tiles of up to
// groups.tile_pairs pairs.
cudaError_t launch_moe_group(const int32_t* ids, int pairs, int n_expert, MoeGroups groups,
                             const KernelConfig& config, cudaStream_t stream);

// One matrix of every expert of a layer: table[e] is expert e's matrix (rows of row_bytes in
// GGUF blocks of `type`, device or mapped host memory); bias: [n_expert][n_out] f32 or null.
struct MoeMatrix {
  const void* const* table = nullptr;
  uint32_t type = 0;
  int64_t row_bytes = 0;
  const float* bias = nullptr;
};

// What the expert products read. Without groups (groups.tiles null) a launch takes one pair
// per block column: pair p's expert is ids[p]. With groups, launch_moe_group's tiles.
struct MoeInput {
  int n_in = 0;
  int pairs = 0;  // rows * n_used
  int n_used = 0;
  int n_expert = 0;          // sizes the grouped launch's grid
  const float* x = nullptr;  // f32 input, for F32/F16/BF16 experts
  ActivationQ8 xq;           // int8 input, for the others
  // The input's row of pair p: p (the down product reads each pair's own activation) or
  // p / n_used (gate/up read the token's row).
  bool per_pair_input = false;
  const int32_t* ids = nullptr;
  MoeGroups groups;
};

// h[p * n_out + o] = act(gate_e[o] · x + bg, up_e[o] · x + bu) for each pair p, e its expert.
// gate and up must share a type and row length.
cudaError_t launch_moe_gate_up(const MoeMatrix& gate, const MoeMatrix& up, MoeActivation act,
                               int n_out, const MoeInput& in, float* h, const KernelConfig& config,
                               cudaStream_t stream);
// y[p * n_out + o] = down_e[o] · h_p + bd for each pair p.
cudaError_t launch_moe_down(const MoeMatrix& down, int n_out, const MoeInput& in, float* y,
                            const KernelConfig& config, cudaStream_t stream);
// launch_moe_down then launch_moe_combine in one launch, for the per-pair path (no groups):
// hidden[r * n_out + o] += Σ_j weights[r * n_used + j] · (down_e[o] · h_p + bd), p = r·n_used + j,
// to the bit what the two launches give.
cudaError_t launch_moe_down_combine(const MoeMatrix& down, int n_out, const MoeInput& in,
                                    const float* weights, float* hidden, const KernelConfig& config,
                                    cudaStream_t stream);
// The per-pair products of small runs (decode, moe_decode.cu), quantised experts only (not
// F32/F16/BF16), no groups: whole warps own weight rows, each lane a chunk of 8 in every 32, with
// the dp4a kernels' summation order, so the results have launch_moe_gate_up's and
// launch_moe_down_combine's bits.
// Gate/up: a block owns 32 output rows of one pair (8 warps of 4 gate and 4 up rows), which is
// one int8 block of h: h as launch_moe_gate_up writes it and, where hq.qs is set, hq as
// launch_quantize_q8 would write it from h (Divide rounding), in the same launch. n_out a
// multiple of 32.
// l2_prefetch_stride: how each warp requests its weight rows into L2 before reading them (0:
// not at all, or 128: a prefetch per that many bytes; < 0: the product's choice for the type).
// Only dev/cuda/moe_products_bench.cu passes one, to time the variants.
cudaError_t launch_moe_gate_up_decode(const MoeMatrix& gate, const MoeMatrix& up, MoeActivation act,
                                      int n_out, const MoeInput& in, float* h, ActivationQ8 hq,
                                      const KernelConfig& config, cudaStream_t stream,
                                      int l2_prefetch_stride = -1);
// Down and the weighted sum into the residual: a block owns 8 output rows of one token row, its
// warps take the row's n_used pairs in parallel, and the sums go into the residual in top-k
// order; in.xq: each pair's int8 activation row.
cudaError_t launch_moe_down_combine_decode(const MoeMatrix& down, int n_out, const MoeInput& in,
                                           const float* weights, float* hidden,
                                           const KernelConfig& config, cudaStream_t stream,
                                           int l2_prefetch_stride = -1);
// The grouped products on int8 tensor cores (moe_mma.cu), for runs of many pairs: a warp owns
// 16 output rows of one expert (gate and up: 16 of each) and a tile's pairs in n-tiles of 8,
// builds its mma.sync m16n8k32 A fragments straight from the GGUF blocks it loads (plain loads,
// so an expert in mapped pinned host memory works as one in VRAM; moe_mma_frag.cuh), gathers
// the pairs' int8 activation rows through groups.order, and adds each 32-element sub-block's
// exact int32 product, scaled by the weight and activation scales, in f32 in sub-block order.
// A pair's result therefore does not depend on which other pairs share its tile or launch, nor
// on the tile size; it differs from the dp4a kernels' only in the f32 summation (chunks of 32
// rather than 8), within the same bound against the CPU. Grouped launches only (groups set, with
// groups.tile_pairs 8 or 32); the inputs as launch_moe_gate_up / launch_moe_down read them, the
// expert matrices 16-byte aligned (CudaMoe's are 256-byte aligned).
// True where the device and this build run them for experts of `type` (Q4_0, Q4_1, Q8_0, Q4_K,
// Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4).
bool moe_mma_supports(uint32_t type);
// The tile sizes the tensor-core products take.
constexpr int kMoeMmaTilePairs[] = {8, 32};
cudaError_t launch_moe_gate_up_mma(const MoeMatrix& gate, const MoeMatrix& up, MoeActivation act,
                                   int n_out, const MoeInput& in, float* h,
                                   const KernelConfig& config, cudaStream_t stream);
cudaError_t launch_moe_down_mma(const MoeMatrix& down, int n_out, const MoeInput& in, float* y,
                                const KernelConfig& config, cudaStream_t stream);

// The grouped products as tiled kernels (moe_gemm.cu): a block owns a tile of pairs of one expert
// (up to 8 or 32: groups.tile_pairs) and 64 output rows of each matrix; the weights' and the
// pairs' activation bytes pass through a ring of shared-memory stages filled by cp.async, so each
// weight byte is read once from memory for all the tile's pairs. The same fragments, products and
// f32 roundings as launch_moe_*_mma, term for term: a pair's result has their bits, whatever the
// tile. The expert matrices must be in device memory (cp.async), 16-byte aligned, with 16 bytes
// readable past each matrix's end (CudaMoe's slack). The types of moe_mma_supports.
constexpr int kMoeGemmTilePairs[] = {8, 32};
// Asks the shared memory the tiled kernels of `type` take (once per kernel, before any stream
// capture); false where they cannot run (no mma.sync, a type they do not read, a refusal).
bool moe_gemm_prepare(uint32_t type);
// Gate/up: h as launch_moe_gate_up_mma writes it and, where hq.qs is set, hq as launch_quantize_q8
// would write it from h, in the same launch (n_out a multiple of 32).
cudaError_t launch_moe_gate_up_gemm(const MoeMatrix& gate, const MoeMatrix& up, MoeActivation act,
                                    int n_out, const MoeInput& in, float* h, ActivationQ8 hq,
                                    const KernelConfig& config, cudaStream_t stream);
cudaError_t launch_moe_down_gemm(const MoeMatrix& down, int n_out, const MoeInput& in, float* y,
                                 const KernelConfig& config, cudaStream_t stream);

// hidden[r * n + o] += Σ_j weights[r * n_used + j] · y[(r * n_used + j) * n + o], summed in
// f32 in top-k order before the residual add.
cudaError_t launch_moe_combine(const float* y, const float* weights, int rows, int n_used, int n,
                               float* hidden, const KernelConfig& config, cudaStream_t stream);

}  // namespace granule::kernels
