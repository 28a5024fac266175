// Staging of streamed experts (issue 36): when part of a layer's experts sit in mapped pinned
// host memory, one launch after the router's top-k copies the experts this step chose that are
// not resident into a VRAM staging area, at a rate that fills PCIe, and writes a step table the
// expert products then read: every byte they read is in VRAM, so the tiled products run on
// streamed layers too, and an expert chosen by several rows crosses PCIe once.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "host_channel.cuh"
#include "kernel_config.h"

namespace granule::kernels {

// One layer's experts and where the step's copies go. An expert is resident when its gate
// pointer lies outside [host_begin, host_end) (the mapped host image): every other pointer of a
// CudaMoe table is VRAM (a cache slot or the all-resident image).
struct MoeStage {
  const void* const* table = nullptr;  // the layer's [3][n_expert] pointers (gate, up, down)
  const void** step = nullptr;         // written: the step's [3][n_expert] pointers
  const uint8_t* host_begin = nullptr;
  const uint8_t* host_end = nullptr;
  // capacity slots of slot_bytes each (16-byte aligned); an expert keeps its image's layout in
  // its slot: matrix m at offsets[m] from the expert's gate pointer (offsets[0] is 0).
  uint8_t* staging = nullptr;
  uint64_t slot_bytes = 0;
  int capacity = 0;
  uint64_t offsets[3] = {0, 0, 0};
  uint64_t copy_bytes = 0;               // copied per expert: a multiple of 16, at most slot_bytes
  uint64_t expert_bytes = 0;             // counted per expert copied (gate + up + down)
  unsigned long long* copied = nullptr;  // += expert_bytes per expert staged, or null
  // Host compute (cpu/host_experts.h, issue 36). Of the chosen, non-resident experts that at
  // most host_max_pairs pairs chose (the candidates), host_share / 256 are left to the host:
  // the r-th candidate in expert order where (r + 1) * host_share / 256 > r * host_share / 256
  // (spread evenly). They are not staged; their step entries point at `zero` (a slot of zero
  // bytes, laid out as a staging slot) and gpu_weights gets `weights` with their pairs' weights
  // 0, so that the device's products add nothing for them; and the host's inputs are written to
  // mapped host memory: host_mask[e] 1 for them and 0 for every other expert, host_ids and
  // host_weights the pairs' ids and weights, host_x the x_floats values at x (the experts' input
  // rows). host_share 0: none, and none of these is read.
  int host_share = 0;  // 0 .. 256
  int host_max_pairs = 0;
  const uint8_t* zero = nullptr;
  const float* weights = nullptr;
  float* gpu_weights = nullptr;   // [pairs]
  uint8_t* host_mask = nullptr;   // mapped: [n_expert]
  int32_t* host_ids = nullptr;    // mapped: [pairs]
  float* host_weights = nullptr;  // mapped: [pairs]
  const float* x = nullptr;
  float* host_x = nullptr;  // mapped: [x_floats]
  int x_floats = 0;         // a multiple of 4
  // The host's request (host_channel.cuh's words; no host node): where the plan chose host
  // experts, it posts {seq, host_layer, host_rows} as launch_host_post does, so that
  // launch_host_join waits for the host's sum; where it chose none, the join waits for nothing.
  // host_words.request null: no request (the kernel test).
  HostChannelWords host_words;
  int host_layer = 0, host_rows = 0;
  // The split launches' plan: [0] the experts staged, [1 + slot] each one's expert (1 +
  // capacity ints, device memory).
  int* plan = nullptr;
};

// From the step's pairs' expert ids (ids[0 .. pairs), every row's, padding rows included, so
// that no product reads host memory), the distinct chosen experts that are not resident, each
// given a staging slot in expert order (deterministic); the step table points at the slot for
// those and at the layer table's entry for every other expert; then their copy_bytes are copied
// host -> slot by every block of a fixed grid (16-byte non-coherent loads, several in flight per
// thread). One launch; each block works out the same plan, block 0 writes the step table and
// the counter. More distinct misses than capacity (not possible at capacity >= min(n_expert,
// pairs)) keep their host pointers: read in place. Captured graphs stay valid: the grid and
// every argument are fixed.
cudaError_t launch_moe_stage(const int32_t* ids, int pairs, int n_expert, const MoeStage& stage,
                             const KernelConfig& config, cudaStream_t stream);
// The same in two launches, so that the host compute's request (written by the plan, with its
// mask and weights) is posted before the copy grid fills the device: one block works out the plan
// and writes the step table, mask, weights, counter and stage.plan; then the grid copies the
// experts stage.plan names.
cudaError_t launch_moe_stage_plan(const int32_t* ids, int pairs, int n_expert,
                                  const MoeStage& stage, const KernelConfig& config,
                                  cudaStream_t stream);
cudaError_t launch_moe_stage_copy(const MoeStage& stage, const KernelConfig& config,
                                  cudaStream_t stream);

}  // namespace granule::kernels
