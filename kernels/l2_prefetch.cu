// L2 prefetch of weight ranges (l2_prefetch.cuh): one bulk prefetch per 64 KiB chunk, chunks
// spread over the grid's threads.
#include "common.cuh"
#include "l2_prefetch.cuh"

namespace granule::kernels {
namespace {

constexpr int64_t kChunkBytes = 64 * 1024;
constexpr int kThreads = 128;
constexpr int kMaxBlocks = 16;

// [first, last) of the range's whole 16-byte units, as byte addresses.
__host__ __device__ inline uint64_t range_begin(const void* p) {
  return (reinterpret_cast<uint64_t>(p) + 15) & ~uint64_t{15};
}
__host__ __device__ inline uint64_t range_end(const void* p, int64_t bytes) {
  return (reinterpret_cast<uint64_t>(p) + static_cast<uint64_t>(bytes)) & ~uint64_t{15};
}

__global__ void __launch_bounds__(kThreads) l2_prefetch_kernel(L2PrefetchArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t chunk_base = 0;  // chunks of the ranges before r
  for (int r = 0; r < a.ranges; ++r) {
    const uint64_t begin = range_begin(a.data[r]);
    const uint64_t end = range_end(a.data[r], a.bytes[r]);
    const int64_t bytes = end > begin ? static_cast<int64_t>(end - begin) : 0;
    const int64_t chunks = (bytes + kChunkBytes - 1) / kChunkBytes;
    // Chunk c of this range goes to thread (chunk_base + c) % threads.
    int64_t c = ((thread - chunk_base) % threads + threads) % threads;
    for (; c < chunks; c += threads) {
      const uint64_t at = begin + static_cast<uint64_t>(c * kChunkBytes);
      const uint32_t size = static_cast<uint32_t>(min(kChunkBytes, bytes - c * kChunkBytes));
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(at), "r"(size) : "memory");
    }
    chunk_base += chunks;
  }
#endif
  // Weights only above (immutable); the chain's order below.
  allow_next_kernel();
  wait_for_previous_kernel();
}

}  // namespace

cudaError_t launch_l2_prefetch(const L2PrefetchArgs& args, const KernelConfig& config,
                               cudaStream_t stream) {
  if (args.ranges < 0 || args.ranges > L2PrefetchArgs::kMaxRanges) return cudaErrorInvalidValue;
  int64_t chunks = 0;
  for (int r = 0; r < args.ranges; ++r) {
    if (args.bytes[r] < 0 || (args.bytes[r] > 0 && !args.data[r])) return cudaErrorInvalidValue;
    const uint64_t begin = range_begin(args.data[r]), end = range_end(args.data[r], args.bytes[r]);
    if (end > begin) chunks += ceil_div(static_cast<int64_t>(end - begin), kChunkBytes);
  }
  if (chunks == 0) return cudaSuccess;
  const int blocks =
      static_cast<int>(std::min<int64_t>(ceil_div(chunks, int64_t{kThreads}), kMaxBlocks));
  return launch_status(
      launch_early(l2_prefetch_kernel, dim3(blocks), dim3(kThreads), config, stream, args));
}

}  // namespace granule::kernels
