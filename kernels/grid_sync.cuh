// A barrier across every block of a grid, for kernels whose blocks are all resident at once
// (a grid no larger than the SMs hold; see resident blocks in the launchers). One 64-bit
// counter that only grows: a block's thread 0 adds 1 when its block arrives (release, so the
// block's writes before the barrier go with it) and spins until the counter reaches the next
// multiple of the grid's blocks (acquire). Nothing is reset, so a graph replays it as it is,
// as long as every kernel that shares a counter has the same number of blocks and passes
// every barrier it starts (the counter then stays a multiple of that number between them).
#pragma once
#include <cstdint>

namespace granule::kernels {

#ifdef __CUDACC__
__device__ __forceinline__ unsigned long long arrive_release(unsigned long long* counter) {
  unsigned long long old;
  asm volatile("atom.add.release.gpu.u64 %0, [%1], 1;" : "=l"(old) : "l"(counter) : "memory");
  return old;
}

__device__ __forceinline__ unsigned long long load_acquire(const unsigned long long* counter) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.u64 %0, [%1];" : "=l"(v) : "l"(counter) : "memory");
  return v;
}

// Every thread of every block calls it. BACKOFF: the spinning thread sleeps ~32 ns between
// reads, so that many spinning blocks do not crowd the counter's L2 line.
template <bool BACKOFF = false>
__device__ __forceinline__ void grid_barrier(unsigned long long* counter) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned long long blocks = gridDim.x;
    const unsigned long long target = (arrive_release(counter) / blocks + 1) * blocks;
    while (load_acquire(counter) < target) {
      if constexpr (BACKOFF) __nanosleep(32);
    }
  }
  __syncthreads();
}
#endif  // __CUDACC__

}  // namespace granule::kernels
