// Qwen3.5's hybrid layers on the GPU (the CPU's backends/cpu/delta_net.h holds the math): the
// Gated DeltaNet layer's short causal convolution, L2-normed Q/K, gated delta rule and gated
// output norm over a step's token rows, with one recurrent-state slot per sequence; and the
// gated full-attention layer's Q/K norms, partial multi-section rope, KV write and output gate.
// Rows are the step's token rows (CudaModel): a run of consecutive positions of one slot is one
// sequence's tokens, a row with slot < 0 is padding. A run starting at position 0 starts from a
// zero state; any other run continues its slot's state. Graph-capturable: every per-step input
// is read from device memory.
//
// The delta rule has two forms. The recurrent one walks a run token by token (decode, short
// runs). The chunked one (delta_net_chunked.cu; runs of at least kDeltaNetChunkedMinRows rows
// when DeltaNetArgs::chunk_scratch is given) cuts a run into chunks of kDeltaNetChunkTokens:
// within a chunk the WY/UT form with the cumulative gates, all chunks at once; across chunks the
// state update, one chunk after another. Both leave the same state (up to float rounding: the
// chunked form sums in another order).
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "activation_q8.cuh"
#include "kernel_config.h"

namespace granule::kernels {

struct DeltaNetArgs {
  int rows = 0;
  const int32_t* positions = nullptr;  // [rows]
  const int32_t* slots = nullptr;      // [rows]; < 0: padding
  int conv_kernel = 4;                 // taps; the conv state keeps conv_kernel - 1 inputs
  int state_size = 0;                  // S: 16, 32, 64 or 128
  int n_k_heads = 0, n_v_heads = 0;    // value head j reads key head j % n_k_heads
  float eps = 1e-6f;                   // the L2 norms' and the gated norm's
  const float* conv_weight = nullptr;  // [channels][conv_kernel]
  const float* dt_bias = nullptr;      // [n_v_heads]
  const float* a = nullptr;            // [n_v_heads]: -exp(A_log)
  const float* norm_weight = nullptr;  // [S]: ssm_norm
  // The layer's state of slot 0; slot s's at state + s * slot_stride floats: the conv state
  // [conv_kernel - 1][channels], then per value head the S x S delta state as [i][j] (i over
  // keys, j over values: S[i][j] at i * S + j).
  float* state = nullptr;
  int64_t slot_stride = 0;
  const float* mixed = nullptr;  // [rows][channels]: Q | K | V before the convolution
  float* conv_out = nullptr;     // [rows][channels]: after convolution, SiLU, L2 norms
  const float* beta = nullptr;   // [rows][n_v_heads]: before the sigmoid
  const float* alpha = nullptr;  // [rows][n_v_heads]: before softplus(· + dt_bias) · a
  const float* z = nullptr;      // [rows][value_dim]: the output gate
  float* out = nullptr;          // [rows][value_dim]
  // Given (state_size a multiple of 32): the gated norm also writes out as int8 blocks, as
  // launch_quantize_q8(out, rows, value_dim) would, for the output projection to read.
  ActivationQ8 out_q8;
  // The chunked form's scratch (delta_net_chunk_scratch_floats) and [rows][value_dim] floats it
  // may overwrite (cuda_hybrid.cpp gives `mixed`'s, dead after the convolution); either null:
  // every run token by token.
  float* chunk_scratch = nullptr;
  float* chunk_w = nullptr;
};

// Tokens per chunk of the chunked form (the Gated DeltaNet papers' and llama.cpp's 64).
constexpr int kDeltaNetChunkTokens = 64;
// Runs of at least this many rows take the chunked form. Below one chunk the chunked form does
// the recurrent form's sequential work (the forward substitution over the chunk's tokens) plus
// its products and two more launches; from one whole chunk on, its sequential part is one state
// update a chunk instead of one a token (a 64-token run: 64 dependent token steps of ~0.3 us
// against three short launches).
constexpr int kDeltaNetChunkedMinRows = kDeltaNetChunkTokens;
// Floats of DeltaNetArgs::chunk_scratch for steps of up to `rows` rows (its start 16-byte
// aligned).
constexpr int64_t delta_net_chunk_scratch_floats(int64_t rows, int64_t n_v_heads) {
  return rows * (65 * n_v_heads + 3) + 20;  // + 4: room to align the start to 16 bytes
}

// The short convolution, SiLU and L2 norms (conv_out from mixed and the conv states), then the
// conv states advanced over each run. state_size must be one the kernels take.
// Every launcher here launches early (launch_early, common.cuh) per config.early_launch: the
// kernels request weights, step inputs and the slot's state (which only earlier steps and this
// layer's own kernels write) before their PDL wait, everything else after it.
cudaError_t launch_delta_net_conv(const DeltaNetArgs& args, const KernelConfig& config,
                                  cudaStream_t stream);
// The gated delta rule over each run, writing out: chunked for runs of kDeltaNetChunkedMinRows
// rows and more when chunk_scratch is given, else token by token (one thread per state column,
// the state in registers); then RMSNorm(out) · norm_weight · SiLU(z) per value head, in place
// (and into args.out_q8 when given).
cudaError_t launch_delta_net_rule(const DeltaNetArgs& args, const KernelConfig& config,
                                  cudaStream_t stream);
bool delta_net_supports(int state_size);

// Qwen3.5's gated full attention, before the attention kernel: q_gate holds per head Q then its
// gate ([rows][n_head][2][head_dim]); Q is RMS-normed (q_norm) into q, K (k_norm) in place,
// both rotated over the first rope_dims (NeoX pairs (i, i + rope_dims / 2) at frequencies[i],
// 0 for a pair that does not turn), and K and V written as f16 into the KV as rope_kv does.
struct GatedAttentionArgs {
  int rows = 0;
  const int32_t* positions = nullptr;
  const int32_t* slots = nullptr;
  const float* q_gate = nullptr;
  float* q = nullptr;  // [rows][n_head * head_dim]
  float* k = nullptr;  // [rows][n_kv * head_dim]
  const float* v = nullptr;
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  float eps = 1e-6f;
  const double* frequencies = nullptr;  // rope_dims / 2
  int rope_dims = 0;
  int n_head = 0, n_kv = 0, head_dim = 0;
  __half* const* slot_base = nullptr;
  int64_t token_stride = 0;  // halves per token of the layer's KV part
  int64_t kv_offset = 0;     // halves from a slot's base to the layer's K
};
cudaError_t launch_gated_attention_prep(const GatedAttentionArgs& args, const KernelConfig& config,
                                        cudaStream_t stream);
// out[row][h][e] *= sigmoid(q_gate[row][h][1][e]); the results also as int8 blocks into out_q8
// when given (as launch_quantize_q8(out, rows, n_head * head_dim) would; n_head * head_dim a
// multiple of 32).
cudaError_t launch_attention_output_gate(float* out, const float* q_gate, int rows, int n_head,
                                         int head_dim, ActivationQ8 out_q8,
                                         const KernelConfig& config, cudaStream_t stream);

}  // namespace granule::kernels
