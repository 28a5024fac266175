// The attention inputs of one layer in one pass: optional Q/K/V bias (Qwen2) and per-head
// RMSNorm of Q and K (Qwen3), rotary position embedding of Q (in place) and K (its cos and sin
// times YaRN's magnitude), and K, V written as f16 into each sequence's token-major KV:
// [token][layer][K|V][kv_head][head_dim]. Optionally also the attention output bias added to the
// residual stream ahead of the output projection that accumulates into it (gpt-oss).
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace granule::kernels {

struct RopeKvArgs {
  float* q = nullptr;
  int64_t q_stride = 0;  // [rows][n_head * head_dim], rotated in place
  const float* k = nullptr;
  int64_t k_stride = 0;  // [rows][n_kv * head_dim]
  const float* v = nullptr;
  int64_t v_stride = 0;
  const float* q_bias = nullptr;  // optional, n_head * head_dim
  const float* k_bias = nullptr;  // optional, n_kv * head_dim
  const float* v_bias = nullptr;
  const float* q_norm = nullptr;  // optional, head_dim (applied per head before rotation)
  const float* k_norm = nullptr;
  float norm_eps = 1e-6f;
  const double* frequencies = nullptr;  // head_dim / 2 rotation frequencies (double: angles at
                                        // long positions keep their precision)
  bool neox = false;                    // pairs (i, i + head_dim/2) instead of (2i, 2i+1)
  float magnitude = 1.0f;               // cos and sin are multiplied by it (rope_magnitude())
  int n_head = 0, n_kv = 0, head_dim = 0;
  int rows = 0;
  const int32_t* positions = nullptr;  // [rows] token position (also the KV row written)
  const int32_t* slots = nullptr;      // [rows] index into slot_base; < 0: padding, no KV write
  __half* const* slot_base = nullptr;  // per slot: the slot's KV base
  int64_t token_stride = 0;            // halves per token of the layer's KV part
  int64_t kv_offset = 0;               // halves from the slot's base to that part (attention.cuh)
  int layer = 0;
  // Optional: residual[row][i] += residual_bias[i] for i < residual_width on rows with a slot
  // (the output projection then accumulates wo · attention on top: (x + bo) + wo · a).
  float* residual = nullptr;
  const float* residual_bias = nullptr;
  int residual_width = 0;
  int64_t residual_stride = 0;
};

// head_dim must be 64, 128 or 256.
cudaError_t launch_rope_kv(const RopeKvArgs& args, const KernelConfig& config, cudaStream_t stream);

#ifdef __CUDACC__
// sin and cos of position * frequency: the angle is formed and reduced in double, so a
// position in the thousands loses no precision, then evaluated in float. rope_kv_kernel and
// the batch-1 Q/K/V product's epilogue (matvec_split.cu) rotate with it.
__device__ __forceinline__ void rope_rotation(int32_t position, double frequency, float* s,
                                              float* c) {
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  const double angle = fmod(static_cast<double>(position) * frequency, kTwoPi);
  sincosf(static_cast<float>(angle), s, c);
}
#endif  // __CUDACC__

}  // namespace granule::kernels
