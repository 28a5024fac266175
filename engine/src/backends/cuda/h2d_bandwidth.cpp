// h2d_bandwidth: timed pinned copies on a stream of their own, once per process.
#include "backends/cuda/h2d_bandwidth.h"

#include <algorithm>
#include <cstring>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device_memory.h"
#include "granule/error.h"

namespace granule::cuda {
namespace {

double measure(MemoryManager& memory) {
  constexpr size_t kBytes = size_t{64} << 20;
  DeviceBuffer device(memory, MemoryCategory::Workspace, kBytes);
  PinnedBuffer host(kBytes);
  std::memset(host.as<uint8_t>(), 1, kBytes);
  CudaStream stream;
  CudaEvent start, stop;
  double best = 0;
  for (int i = 0; i < 4; ++i) {
    check_cuda(cudaEventRecord(start.get(), stream.get()), "cudaEventRecord");
    check_cuda(cudaMemcpyAsync(device.get(), host.as<uint8_t>(), kBytes, cudaMemcpyHostToDevice,
                               stream.get()),
               "measuring host-to-device bandwidth");
    check_cuda(cudaEventRecord(stop.get(), stream.get()), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(stop.get()), "cudaEventSynchronize");
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, start.get(), stop.get()), "cudaEventElapsedTime");
    if (i > 0 && ms > 0) best = std::max(best, static_cast<double>(kBytes) / (ms * 1e-3));
  }
  return best;
}

}  // namespace

MeasuredOnce& h2d_bandwidth_cache() {
  static MeasuredOnce cache;
  return cache;
}

double h2d_bandwidth(MemoryManager& memory) {
  try {
    return h2d_bandwidth_cache().get([&] { return measure(memory); });
  } catch (const CapacityError&) {
    return 0;  // the ledger refused the buffer: nothing was allocated, nothing is cached
  } catch (const DeviceLostError&) {
    throw;
  } catch (const DeviceError&) {
    cudaGetLastError();
    return h2d_bandwidth_cache().get([] { return 0.0; });  // unmeasurable here: cache 0
  }
}

}  // namespace granule::cuda
