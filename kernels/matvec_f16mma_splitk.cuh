// Batched products (17-64 columns) of split-layout Q4_0/Q8_0/Q4_K/Q5_K/Q6_K weights with f16
// activations on f16 tensor cores, built to keep HBM busy: a block-wide cp.async ring of 128-row
// weight tiles and their activations, the K range split over blocks so that every product fills
// every SM, and the splits' partial sums added in a fixed order by the last block of a tile
// (matvec_f16mma_splitk.cu; kernels/README.md).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "matvec_f16mma.cuh"  // MatvecInputF16, MatvecTask, KernelConfig

namespace granule::kernels {

// Device memory the split launches share: the splits' partial sums and one ticket counter per
// row tile. The counters must be zero before the first launch; every launch leaves them zero.
// Null (or too small) means fewer splits, down to none (which needs no workspace).
struct F16MmaSplitWorkspace {
  float* partials = nullptr;
  int64_t partial_floats = 0;
  int* counters = nullptr;
  int n_counters = 0;
};

// True when launch_matvec_f16mma_splitk runs this weight type in this layout (split Q4_0, Q8_0,
// Q4_K and Q5_K; the K types' rows whole 256-element super-blocks).
bool matvec_f16mma_splitk_supports(uint32_t weight_type, bool split_layout);

// True when the device has f16 mma.sync (cc >= 8.0) and the kernels got their shared memory
// (call once before launching and before any stream capture).
bool matvec_f16mma_splitk_fits_device();

// The workspace that lets every launch on the current device take as many splits as fill it.
int64_t matvec_f16mma_splitk_partial_floats();
int matvec_f16mma_splitk_counters();

// launch_matvec_f16mma's contract (1..3 tasks, accumulate, SwiGLU, f16 result; batch 1..64),
// with the K range of each 128-row tile split over up to `max_splits` blocks (0: as many as
// fill every SM once, as the workspace allows). The splits and their order depend only on the
// shapes, the device's SM count and the workspace size, never on timing: every launch gives
// the same bits for the same inputs. Returns cudaErrorInvalidValue for an unsupported
// type/layout/shape.
cudaError_t launch_matvec_f16mma_splitk(uint32_t weight_type, const MatvecTask* tasks, int n_tasks,
                                        const MatvecInputF16& input,
                                        const F16MmaSplitWorkspace& workspace,
                                        const KernelConfig& config, cudaStream_t stream,
                                        int max_splits = 0);

}  // namespace granule::kernels
