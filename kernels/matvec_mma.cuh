// Batched quantised matrix products on int8 tensor cores (mma.sync m16n8k32, sm_80+) over
// split-layout Q4_0/Q4_1/Q8_0 (and, in version 2, Q6_K) weights and int8 activation blocks:
// the same tasks, epilogues and per-block numerics as launch_matvec_split, for batches of a
// few rows up to prefill.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "matvec.cuh"

namespace granule::kernels {

// True when launch_matvec_mma runs this weight type in this layout (split Q4_0/Q4_1/Q8_0, and
// split Q6_K, which version 1 hands to the dp4a kernel (launch_matvec)).
bool matvec_mma_supports(uint32_t weight_type, bool split_layout);

// True when the current device has int8 mma (compute capability 8.0 or later, and this build
// has code for it); false, with no error left behind, when the query fails. Also lets every
// kernel use its shared memory, so call it once before launching (and before any capture).
bool matvec_mma_fits_device();

// The kernel version launch_matvec_mma runs under `config`: 0 (config.mma off), 1, or 2
// (config.mma = 2 on a device that gives version 2 its shared memory; else version 1).
// Call matvec_mma_fits_device() first.
int matvec_mma_version(const KernelConfig& config);

// The occupancy variant of version 2 that launch_matvec_mma runs for 9-64 rows under
// `config` (KernelConfig::mma_occupancy): 0 when the version is not 2, the variant is 0, or
// the device did not give the variant's kernels their shared memory. Call
// matvec_mma_fits_device() first.
int matvec_mma_occupancy(const KernelConfig& config);

// launch_matvec's contract (1..3 tasks of one type over the same input, accumulate and
// SwiGLU epilogues) for any batch: one launch covers every column, in tiles of up to 64.
// Returns cudaErrorInvalidValue for an unsupported type, layout or shape, else the
// launch's status.
cudaError_t launch_matvec_mma(uint32_t weight_type, const MatvecTask* tasks, int n_tasks,
                              const MatvecInput& input, const KernelConfig& config,
                              cudaStream_t stream);

}  // namespace granule::kernels
