// Turns CUDA runtime errors into granule::DeviceError with a one-line message naming the
// operation, so the engine never aborts on a device failure.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "granule/error.h"

namespace granule::cuda {

inline void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw DeviceError(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(status));
}

}  // namespace granule::cuda
