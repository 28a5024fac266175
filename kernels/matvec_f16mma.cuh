// Batched products of split-layout Q4_0/Q4_1/Q8_0/Q2_K/Q3_K/Q4_K/Q5_K/Q6_K/IQ4_NL/IQ4_XS/MXFP4
// weights with f16 activations on f16 tensor cores (mma.sync m16n8k16, f32 accumulation): the
// weights are dequantised to f16 in registers, so no per-sub-block epilogue runs
// (matvec_f16mma.cu; kernels/README.md).
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "matvec.cuh"  // MatvecTask, kMaxMatvecTasks, KernelConfig via kernel_config.h

namespace granule::kernels {

struct MatvecInputF16 {
  int n_in = 0;   // multiple of 32 (of 256 for the K types)
  int batch = 0;  // columns, 1..64 (the launcher may tile; must be correct for any 1..64)
  const __half* x = nullptr;  // [batch][n_in] f16 activations, row-contiguous, 16-byte aligned rows
};

// True when launch_matvec_f16mma runs this weight type in this layout (split Q4_0, Q4_1, Q8_0,
// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS and MXFP4; the K types' and IQ4_XS's rows must be
// whole 256-element super-blocks).
bool matvec_f16mma_supports(uint32_t weight_type, bool split_layout);

// True when the device has f16 mma.sync (cc >= 8.0) and the kernels got their shared memory
// (call once before launching and before any stream capture; sets
// cudaFuncAttributeMaxDynamicSharedMemorySize).
bool matvec_f16mma_fits_device();

// launch_matvec's contract: 1..3 tasks of one type over the same input in one launch;
// task.accumulate (y += W x); task.weight_up != nullptr means fused SwiGLU: y = silu(W_gate x) *
// (W_up x) (1 task). y[b * y_stride + o] as f32, or as f16 (rounded to nearest) to
// task.y_f16[b * y_stride + o] where y_f16 is set (then y is not read; y_f16 with accumulate is
// refused). Every launch gives the same bits for the same inputs (sums in a fixed order).
// Returns cudaErrorInvalidValue for an unsupported type/layout/shape.
cudaError_t launch_matvec_f16mma(uint32_t weight_type, const MatvecTask* tasks, int n_tasks,
                                 const MatvecInputF16& input, const KernelConfig& config,
                                 cudaStream_t stream);

}  // namespace granule::kernels
