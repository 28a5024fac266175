// Batched quantised matrix-vector products for decode: y[b][o] = W[o] · x[b] for up to a
// few matrices at once (Q, K and V in one launch), reading the packed GGUF blocks directly;
// B input vectors share one read of the weights. Optional epilogues: accumulate into y
// (the residual add) and SwiGLU (y = silu(W_gate x) * (W_up x)).
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "activation_q8.cuh"

namespace granule::kernels {

struct MatvecTask {
  const void* weight = nullptr;     // n_out rows of row_bytes each
  const void* weight_up = nullptr;  // SwiGLU: the up matrix (same type and shape), else null
  int64_t row_bytes = 0;
  int n_out = 0;
  float* y = nullptr;  // y[b * y_stride + o]
  int64_t y_stride = 0;
  bool accumulate = false;  // y += W x instead of y = W x
  // Rows in split_layout.h's layout (Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K; row_bytes is then
  // the split row stride) instead of GGUF blocks. Every task of a launch must agree.
  bool split_layout = false;
  // launch_matvec_f16mma only: where set, the result goes here as f16 (y[b * y_stride + o]
  // rounded to nearest) instead of to y; not with accumulate. The SwiGLU product writes the
  // down projection's f16 input this way.
  __half* y_f16 = nullptr;
  // Split-layout batch-1 launches only (launch_matvec_split): where y_q8.qs is set, each block
  // of 32 results (after accumulate and SwiGLU; n_out a multiple of 32) leaves also as one int8
  // block there, the next product's input. With norm_weight, what is quantised is y·w, the
  // next RMSNorm without its 1/rms, and sum_squares[o / 32] gets Σ y² over the block: the next
  // launch's MatvecInput::norm_sum_squares, from which it applies the 1/rms itself.
  ActivationQ8 y_q8;
  const float* norm_weight = nullptr;
  float* sum_squares = nullptr;
  // With MatvecInput::rope: which part of Q/K/V this task's rows are (1 Q, 2 K, 3 V), and
  // their bias (Qwen2), added before the rotation. 0: none.
  int rope_part = 0;
  const float* bias = nullptr;
};

// Split-layout batch-1 launches only: rope_kv's work for the step's one row in the Q/K/V
// product's epilogue, for models whose rotation pairs are adjacent elements (not NeoX) and
// without per-head Q/K norms: Q rows rotated into y, K rows rotated and V rows as they are
// into the row's KV at its position, as f16 (rope_kv.cuh has the layout). The rows of a pair
// meet in one thread block.
struct RowRope {
  const int32_t* positions = nullptr;  // [1]: the row's position; null: no RoPE here
  const int32_t* slots = nullptr;      // [1]: its slot; < 0: a padding row, no KV write
  __half* const* slot_base = nullptr;
  const double* frequencies = nullptr;  // head_dim / 2
  int64_t token_stride = 0;             // halves per token of the layer's KV part
  int64_t kv_offset = 0;                // halves from the slot's base to the layer's part
  int layer = 0, n_kv = 0, head_dim = 0;
};

struct MatvecInput {
  int n_in = 0;
  int batch = 0;
  const float* x = nullptr;  // [batch][n_in], read for F32/F16/BF16 and the K quants
  ActivationQ8 xq;           // [batch][n_in] int8 blocks, read for Q4_0/Q4_1/Q8_0
  // Split-layout batch-1 launches only: xq holds an RMSNorm's y·w without its 1/rms (the
  // product before wrote it, MatvecTask::y_q8); every result is multiplied by
  // rsqrt(Σ norm_sum_squares[0 .. n_in / 32) / n_in + norm_eps).
  const float* norm_sum_squares = nullptr;
  float norm_eps = 0.0f;
  RowRope rope;
};

constexpr int kMaxMatvecTasks = 3;

// True when the type's kernel reads the int8 activations (MatvecInput::xq), else x. The
// split-layout kernels always read int8 activations.
bool matvec_reads_q8(uint32_t weight_type, bool split_layout = false);

// True when a split-layout batch-1 product of this type with int8 results whose 32-row
// blocks outnumber the SMs takes blocks that own one 32-row block each
// (matvec_split.cu, split_owned_kernel): Q4_0 and Q4_1, whose kernels keep within the 64
// registers without spilling. The other types' SwiGLU results are quantised by a kernel at
// that size (the owner blocks of Q8_0, Q5_K and Q6_K spill 88-716 bytes; not measured).
bool matvec_owns_row_blocks(uint32_t weight_type);

// Runs n_tasks (1..3) products of one weight type over the same input in one launch (one
// per column group of the batch). Returns cudaErrorInvalidValue for an unsupported type or
// shape, else the first launch error (no later group is launched after one fails).
// Split-layout tasks go to launch_matvec_split. Every kernel is launched early
// (launch_early, common.cuh) when config.early_launch is on.
cudaError_t launch_matvec(uint32_t weight_type, const MatvecTask* tasks, int n_tasks,
                          const MatvecInput& input, const KernelConfig& config,
                          cudaStream_t stream);

// The split-layout kernels (matvec_split.cu): weight_type Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K,
// Q5_K or Q6_K. Returns the first launch's error as cudaLaunchKernelEx reported it
// (launch_matvec adds launch_status()).
cudaError_t launch_matvec_split(uint32_t weight_type, const MatvecTask* tasks, int n_tasks,
                                const MatvecInput& input, const KernelConfig& config,
                                cudaStream_t stream);

}  // namespace granule::kernels
