// The CUDA VirtualMemory under KvSpace: reserve device address space once, back it with
// physical granules (cuMemCreate + cuMemMap) as sequences grow, unmap from the tail. The
// driver API is reached through cudaGetDriverEntryPointByVersion, so libcuda is not linked.
#pragma once
#include <memory>

#include "kv_space.h"

namespace granule::cuda {

// Throws DeviceError when the device or driver has no virtual memory management.
std::unique_ptr<VirtualMemory> make_cuda_virtual_memory(int device);

}  // namespace granule::cuda
