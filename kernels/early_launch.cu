// The switch behind launch_early(): programmatic dependent launch on sm_90 and later.
#include <cstdlib>

#include "common.cuh"

namespace granule::kernels {

bool early_launch_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("GRANULE_PDL");
    if (v && v[0] == '0') return false;
    int device = 0, major = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
      cudaGetLastError();  // leave no sticky error behind for the caller's launch check
      return false;
    }
    return major >= 9;
  }();
  return enabled;
}

}  // namespace granule::kernels
