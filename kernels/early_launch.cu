// fit_to_device(): whether the device can take launch_early()'s programmatic dependent
// launch (compute capability 9.0 and later); multiprocessors(): the SM count launches size
// their grids by.
#include "common.cuh"

namespace granule::kernels {

cudaError_t fit_to_device(KernelConfig& config) {
  int device = 0, major = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status == cudaSuccess)
    status = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (status != cudaSuccess) {
    cudaGetLastError();  // reported through the return value, not in a later launch's status
    return status;
  }
  if (major < 9) config.early_launch = false;
  return cudaSuccess;
}

int multiprocessors() {
  static const int count = [] {
    int device = 0, sms = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      cudaGetLastError();
      return 132;
    }
    return sms;
  }();
  return count;
}

}  // namespace granule::kernels
