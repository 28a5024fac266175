// The pinned host-to-device copy bandwidth of the CUDA device, the PCIe bound of weight
// streaming: measured once per process, its buffers charged to a ledger, then cached.
#pragma once
#include "backends/measured_once.h"
#include "memory/memory_manager.h"

namespace granule::cuda {

// Bytes/s of a 64 MiB copy from pinned memory (best of three after a warm-up; 0 when it
// cannot be measured). The first call measures with a device buffer charged to `memory` as
// Workspace and freed before it returns; every later call returns that value and allocates
// nothing. A budget too small for the buffer measures nothing and caches nothing.
double h2d_bandwidth(MemoryManager& memory);
// The process's cache (tests read its measurement count).
MeasuredOnce& h2d_bandwidth_cache();

}  // namespace granule::cuda
