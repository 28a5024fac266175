// L2 prefetch of weight ranges (l2_prefetch.cuh).
#include "common.cuh"
#include "l2_prefetch.cuh"

namespace granule::kernels {
namespace {

// One prefetch.global.L2 per 128-byte line, lines spread over every thread of a grid of up to
// two blocks per SM (bulk prefetches of 64 KiB chunks from 16 blocks held the chain ~30 µs per
// 9 MiB: the kernel ends only when its bulk requests are issued).
constexpr int64_t kLine = 128;
constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) l2_prefetch_kernel(L2PrefetchArgs a) {
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t base = 0;  // lines of the ranges before r
  for (int r = 0; r < a.ranges; ++r) {
    const uint64_t begin = reinterpret_cast<uint64_t>(a.data[r]);
    const int64_t lines = (a.bytes[r] + kLine - 1) / kLine;
    // Line i of this range goes to thread (base + i) % threads.
    for (int64_t i = ((thread - base) % threads + threads) % threads; i < lines; i += threads) {
      const uint64_t at = begin + static_cast<uint64_t>(i * kLine);
      asm volatile("prefetch.global.L2 [%0];" ::"l"(at));
    }
    base += lines;
  }
  // Weights only above (immutable); the chain's order below.
  allow_next_kernel();
  wait_for_previous_kernel();
}

}  // namespace

cudaError_t launch_l2_prefetch(const L2PrefetchArgs& args, const KernelConfig& config,
                               cudaStream_t stream) {
  if (args.ranges < 0 || args.ranges > L2PrefetchArgs::kMaxRanges) return cudaErrorInvalidValue;
  int64_t lines = 0;
  for (int r = 0; r < args.ranges; ++r) {
    if (args.bytes[r] < 0 || (args.bytes[r] > 0 && !args.data[r])) return cudaErrorInvalidValue;
    lines += (args.bytes[r] + kLine - 1) / kLine;
  }
  if (lines == 0) return cudaSuccess;
  const int blocks = static_cast<int>(
      std::min<int64_t>(ceil_div(lines, int64_t{kThreads}), 2 * multiprocessors()));
  return launch_status(
      launch_early(l2_prefetch_kernel, dim3(blocks), dim3(kThreads), config, stream, args));
}

}  // namespace granule::kernels
