// Turns CUDA runtime errors into granule::DeviceError with a one-line message naming the
// operation, so the engine never aborts on a device failure.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "granule/error.h"

namespace granule::cuda {

// Errors that poison the whole CUDA context (the CUDA programming guide's "sticky" errors:
// a kernel faulted, trapped or timed out): every later call in the process fails with them
// until the device is reset.
inline bool is_sticky_error(cudaError_t status) {
  switch (status) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
      return true;
    default:
      return false;
  }
}

// Remembers, for the rest of the process, that a sticky error lost the device (the reason
// given); cuda_available() then probes whether a reset brought it back (cuda_backend.cpp).
void note_device_lost(const std::string& reason) noexcept;

inline void check_cuda(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  const std::string message =
      std::string("CUDA error in ") + what + ": " + cudaGetErrorString(status);
  if (is_sticky_error(status)) {
    note_device_lost(message);
    throw DeviceLostError("the GPU stopped working (" + message + "); reload the model");
  }
  throw DeviceError(message);
}

// A kernel launch's check (check_cuda: a failure throws), counted where the caller counts them.
struct LaunchCheck {
  uint64_t* launches;
  void operator()(cudaError_t status, const char* what) const {
    check_cuda(status, what);
    if (launches) ++*launches;
  }
};

}  // namespace granule::cuda
