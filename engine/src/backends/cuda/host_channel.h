// HostChannel: the host's end of a spin channel with a captured step (kernels/host_channel.cuh).
// The device's post kernel writes a round's input rows and a request {seq, job, rows} into mapped
// pinned memory; a server thread spinning on the request runs the job (a callback), writes its
// result rows into mapped memory and posts the sequence as done; the device's join kernel polls
// for it. Threads: the server thread only runs jobs; everything else belongs to the engine thread.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <thread>

#include "backends/cuda/device_memory.h"
#include "host_channel.cuh"

namespace granule::cuda {

// How long a job keeps its pool's workers spinning after it (cpu::ThreadPool::stay_awake_until):
// longer than the device's work between two rounds of a step (a 30B MoE layer at batch 1:
// ~60 µs) and between two decode steps, so each round finds the workers awake rather than
// paying a futex wake-up of every worker (tens of µs) on its critical path. (H100, 2026-12-07,
// against pools that slept: 30B MoE shape at a 52 % budget, batch 1 with 160/256 of the misses
// on the host 101.6 against 82.1 t/s, 16 chats 193.4 against 171.7; dense 8B with 61 % of it
// resident and host rows 58.3 / 56.5 against 54.1 / 55.4.)
inline constexpr std::chrono::milliseconds kHostPoolAwake{5};

class HostChannel {
 public:
  // job(job, rows, x, y): x holds `rows` input rows (packed as the post wrote them), y receives
  // the result rows; it runs on the server thread and may throw (the channel then answers with
  // zeros and failed() turns true).
  using Job = std::function<void(uint32_t job, int rows, const float* x, float* y)>;

  // Buffers of x_floats and y_floats (mapped pinned memory) and the device's words (charged to
  // `memory` as Workspace); starts the server thread.
  HostChannel(MemoryManager& memory, size_t x_floats, size_t y_floats, Job job);
  ~HostChannel();
  HostChannel(const HostChannel&) = delete;
  HostChannel& operator=(const HostChannel&) = delete;

  // What the post and join kernels take (device addresses of the mapped buffers).
  const kernels::HostChannelWords& words() const { return words_; }
  float* device_x() const { return device_x_; }
  const float* device_y() const { return device_y_; }
  size_t x_floats() const { return x_floats_; }
  size_t y_floats() const { return y_floats_; }

  // Throws DeviceError when a join gave up waiting (2 s) or a job threw since the channel began:
  // the outputs of that step are wrong. The engine checks after each step.
  void check() const;
  // Jobs the server has answered since the channel began.
  uint64_t jobs() const { return jobs_.load(std::memory_order_relaxed); }

 private:
  void serve();

  Job job_;
  size_t x_floats_ = 0, y_floats_ = 0;
  DeviceBuffer state_;
  PinnedBuffer request_, done_, x_, y_;
  kernels::HostChannelWords words_;
  float* device_x_ = nullptr;
  const float* device_y_ = nullptr;
  std::thread server_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};
  std::atomic<uint64_t> jobs_{0};
};

}  // namespace granule::cuda
