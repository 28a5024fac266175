// The host channel's two kernels (host_channel.cuh): the post (input rows out to mapped memory,
// then the request, by the last block to finish) and the join (one thread per block polls the
// answer, then the block applies its share of the host's rows).
#include "common.cuh"
#include "host_channel.cuh"
#include "host_channel_post.cuh"

namespace granule::kernels {
namespace {

constexpr int kPostThreads = 256;
constexpr int kJoinThreads = 256;
// A block copies this many float4 per thread before the next block takes over: enough blocks
// that a batch of rows (8 x 14336 floats, the widest input) leaves in a few microseconds.
constexpr int kPostVectorsPerThread = 4;
constexpr uint64_t kJoinTimeoutNs = 2000000000ull;

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void __launch_bounds__(kPostThreads)
    host_post_kernel(HostChannelWords words, const float* __restrict__ x, int64_t x_stride,
                     int width, int rows, float* host_x, unsigned int job) {
  wait_for_previous_kernel();
  const int vectors_per_row = width / 4;
  const int total = vectors_per_row * rows;
  for (int i = blockIdx.x * kPostThreads + threadIdx.x; i < total; i += gridDim.x * kPostThreads) {
    const int r = i / vectors_per_row, v = i % vectors_per_row;
    const float4 value = *reinterpret_cast<const float4*>(x + r * x_stride + 4 * v);
    reinterpret_cast<float4*>(host_x)[i] = value;
  }
  // Every block's writes reach host memory before it counts itself; the last block to count
  // posts, so the host never reads a row before it has landed.
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x != 0) return;
  const unsigned int arrived = atomicAdd(words.state + 2, 1u);
  if (arrived + 1 != gridDim.x) return;
  words.state[2] = 0;  // the next post counts from zero (it starts after this kernel ends)
  host_channel_post(words, job, static_cast<unsigned int>(rows));
}

struct JoinOuts {
  HostRowsOut out[kMaxHostRowsOuts];
};

__global__ void __launch_bounds__(kJoinThreads)
    host_join_kernel(HostChannelWords words, JoinOuts outs, int n_outs, int rows,
                     const float* host_y) {
  __shared__ int go;
  wait_for_previous_kernel();
  if (threadIdx.x == 0) {
    const unsigned int want = words.state[1];
    int ok = 0;
    if (want != 0) {
      const volatile unsigned int* done = words.done;
      const uint64_t t0 = global_ns();
      for (;;) {
        if (done[0] == want) {
          ok = 1;
          break;
        }
        if (global_ns() - t0 > kJoinTimeoutNs) {
          reinterpret_cast<volatile unsigned int*>(words.done)[1] = 1u;
          break;
        }
      }
      __threadfence_system();
    }
    go = ok;
  }
  __syncthreads();
  if (!go) return;
  for (int o = 0; o < n_outs; ++o) {
    // (selects, not outs.out[o]'s dynamic index into the parameter: that would copy it to the
    // stack)
    const HostRowsOut& d = o == 0 ? outs.out[0] : o == 1 ? outs.out[1] : outs.out[2];
    const int total = d.cols * rows;
    for (int i = blockIdx.x * kJoinThreads + threadIdx.x; i < total;
         i += gridDim.x * kJoinThreads) {
      const int r = i / d.cols, c = i % d.cols;
      const float h = __ldcv(host_y + d.offset + i);
      float* y = d.y + r * d.y_stride + d.first + c;
      *y = d.accumulate ? *y + h : h;
    }
  }
}

}  // namespace

cudaError_t launch_host_post(const HostChannelWords& words, const float* x, int64_t x_stride,
                             int width, int rows, float* host_x, unsigned int job,
                             const KernelConfig& config, cudaStream_t stream) {
  if (!words.state || !words.request || !words.done || !x || !host_x || width <= 0 ||
      width % 4 != 0 || x_stride % 4 != 0 || rows <= 0)
    return cudaErrorInvalidValue;
  const int vectors = width / 4 * rows;
  const int blocks = std::max(
      1, std::min(ceil_div(vectors, kPostThreads * kPostVectorsPerThread), multiprocessors()));
  return launch_status(launch_early(host_post_kernel, dim3(blocks), dim3(kPostThreads), config,
                                    stream, words, x, x_stride, width, rows, host_x, job));
}

cudaError_t launch_host_join(const HostChannelWords& words, const HostRowsOut* outs, int n_outs,
                             int rows, const float* host_y, const KernelConfig& config,
                             cudaStream_t stream) {
  if (!words.state || !words.done || !host_y || n_outs < 1 || n_outs > kMaxHostRowsOuts ||
      rows <= 0)
    return cudaErrorInvalidValue;
  JoinOuts packed;
  int widest = 0;
  for (int o = 0; o < n_outs; ++o) {
    if (!outs[o].y || outs[o].cols <= 0 || outs[o].first < 0) return cudaErrorInvalidValue;
    packed.out[o] = outs[o];
    widest = std::max(widest, outs[o].cols * rows);
  }
  const int blocks = std::max(1, std::min(ceil_div(widest, kJoinThreads * 4), 64));
  return launch_status(launch_early(host_join_kernel, dim3(blocks), dim3(kJoinThreads), config,
                                    stream, words, packed, n_outs, rows, host_y));
}

}  // namespace granule::kernels
