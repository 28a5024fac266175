// A spin channel between a captured step and a host thread (engine/src/backends/cuda/
// host_channel.h): launch_host_post copies a round's input rows into mapped host memory and
// posts a request; launch_host_join waits, on the device, for the host's answer and writes (or
// adds) the host's result rows into the round's outputs. No host node: a round trip costs a
// PCIe poll, not a callback's 20-60 µs.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernel_config.h"

namespace granule::kernels {

// The channel's words. state (device memory): [0] the last sequence posted, [1] the sequence
// the next join waits for, [2] the post's block counter. request (mapped host memory): [0] the
// sequence, written last, [1] the job, [2] the rows. done (mapped): [0] the sequence the host
// answered, [1] set by a join that gave up (2 s), which the engine reads as a failure.
struct HostChannelWords {
  unsigned int* state = nullptr;
  unsigned int* request = nullptr;
  unsigned int* done = nullptr;
};

// One output of a join: for rows r < rows, y[r * y_stride + first + c] (+)= host[r * cols + c]
// for c < cols (host: the mapped answer, offset floats in).
struct HostRowsOut {
  float* y = nullptr;
  int64_t y_stride = 0;
  int first = 0, cols = 0;
  int64_t offset = 0;
  bool accumulate = false;
};
constexpr int kMaxHostRowsOuts = 3;

// Copies rows x[r * x_stride + 0..width) for r < rows into host_x (packed rows of width, mapped
// memory; width a multiple of 4), then posts {seq, job, rows}.
cudaError_t launch_host_post(const HostChannelWords& words, const float* x, int64_t x_stride,
                             int width, int rows, float* host_x, unsigned int job,
                             const KernelConfig& config, cudaStream_t stream);

// Waits for the host's answer to the last post (2 s at most: then done[1] = 1 and nothing is
// written), then applies outs[0..n_outs) for `rows` rows from host_y (mapped).
cudaError_t launch_host_join(const HostChannelWords& words, const HostRowsOut* outs, int n_outs,
                             int rows, const float* host_y, const KernelConfig& config,
                             cudaStream_t stream);

}  // namespace granule::kernels
