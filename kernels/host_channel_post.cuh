// The device's side of a host channel's request (host_channel.cuh's words), for the kernels that
// post one: launch_host_post's kernel and the MoE staging plan. CUDA code only.
#pragma once
#include "host_channel.cuh"

namespace granule::kernels {

// One thread posts {seq, job, rows}: the next sequence in state[0] (never 0, which means "nothing
// posted"), also in state[1] for the next join, then the request with the sequence written last.
// The request's inputs must already be written and fenced (__threadfence_system) by every thread
// that wrote them.
__device__ __forceinline__ void host_channel_post(const HostChannelWords& words, unsigned int job,
                                                  unsigned int rows) {
  unsigned int seq = words.state[0] + 1;
  if (seq == 0) seq = 1;
  words.state[0] = seq;
  words.state[1] = seq;
  volatile unsigned int* request = words.request;
  request[1] = job;
  request[2] = rows;
  __threadfence_system();
  request[0] = seq;
  __threadfence_system();
}

// One thread: nothing posted this round, so the next join waits for nothing and writes nothing.
__device__ __forceinline__ void host_channel_skip(const HostChannelWords& words) {
  words.state[1] = 0;
}

}  // namespace granule::kernels
