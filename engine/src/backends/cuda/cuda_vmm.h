// The CUDA VirtualMemory under KvSpace: reserve device address space once, back it with
// physical granules (cuMemCreate + cuMemMap) as sequences grow, unmap from the tail. The
// driver API is reached through cudaGetDriverEntryPointByVersion, so libcuda is not linked.
#pragma once
#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "memory/kv_space.h"

namespace granule::cuda {

// Throws DeviceError when the device or driver has no virtual memory management. `streams`
// are the streams whose work may touch the KV: fence() records an event on each (none
// given: the legacy default stream, which covers work on blocking streams too).
std::unique_ptr<VirtualMemory> make_cuda_virtual_memory(int device,
                                                        std::vector<cudaStream_t> streams = {});

}  // namespace granule::cuda
