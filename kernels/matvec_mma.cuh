// Batched quantised matrix products on int8 tensor cores (mma.sync m16n8k32, sm_80+) over
// split-layout Q4_0/Q4_1/Q8_0/Q4_K/Q5_K/Q6_K/Q2_K/Q3_K/IQ4_NL/IQ4_XS/MXFP4 weights and int8
// activation blocks: the same tasks, epilogues and per-block numerics as launch_matvec_split, for
// batches of a few rows and more.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "matvec.cuh"

namespace granule::kernels {

// True when launch_matvec_mma runs this weight type in this layout (split Q4_0/Q4_1/Q8_0, and
// split Q4_K, Q5_K, Q6_K, Q2_K, Q3_K, IQ4_NL, IQ4_XS and MXFP4, which the block-staged kernel
// hands to the dp4a kernel (launch_matvec)).
bool matvec_mma_supports(uint32_t weight_type, bool split_layout);

// True when the current device has int8 mma (compute capability 8.0 or later, and this build
// has code for it); false, with no error left behind, when the query fails. Also lets every
// kernel use its shared memory, so call it once before launching (and before any capture).
bool matvec_mma_fits_device();

// The kernel a launch runs: kDevice, the device's (the warp-pipelined kernel where the device
// gives a block ~208 KB of shared memory: H100/H200; else the block-staged one: every consumer
// GPU); kBlockStaged, the block-staged kernel on any device (the tests run both).
enum class MmaKernel { kDevice, kBlockStaged };

// What kDevice runs here: 2 the warp-pipelined kernel, 1 the block-staged one. Call
// matvec_mma_fits_device() first.
int matvec_mma_device_kernel();

// launch_matvec's contract (1..3 tasks of one type over the same input, accumulate and
// SwiGLU epilogues) for any batch: one launch covers every column, in tiles of up to 64.
// Returns cudaErrorInvalidValue for an unsupported type, layout or shape, else the
// launch's status.
cudaError_t launch_matvec_mma(uint32_t weight_type, const MatvecTask* tasks, int n_tasks,
                              const MatvecInput& input, const KernelConfig& config,
                              cudaStream_t stream, MmaKernel kernel = MmaKernel::kDevice);

}  // namespace granule::kernels
