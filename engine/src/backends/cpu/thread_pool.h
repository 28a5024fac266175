// A small fixed pool of worker threads that splits an index range among themselves and the
// caller (parallel_for); the CPU backend runs every row- and head-parallel loop on it.
// Waiting threads spin briefly before they sleep: a forward pass issues hundreds of short
// loops back to back, and a futex wake-up per loop would cost more than the loops.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace granule::cpu {

class ThreadPool {
 public:
  // threads = total threads including the caller (at least 1).
  explicit ThreadPool(int32_t threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int32_t threads() const { return static_cast<int32_t>(workers_.size()) + 1; }
  // Calls fn(begin, end, thread_index) over contiguous chunks covering [0, n) once, and
  // waits for all. Threads take chunks as they come free; fn must not throw. Not reentrant.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int32_t)>& fn);
  // Waiting threads spin until `deadline` instead of sleeping after their brief spin (they
  // yield the core at each clock read): for a caller whose next jobs come sooner than a futex
  // wake-up of every worker takes, such as the host's part of each layer of a decode step.
  void stay_awake_until(std::chrono::steady_clock::time_point deadline);

 private:
  bool held_awake() const;  // before the deadline of stay_awake_until
  void worker_loop(int32_t index);
  void run_chunks(int32_t thread_index);   // takes chunks of the current job until none are left

  std::vector<std::thread> workers_;
  // The current job, published to the workers by the release increment of generation_.
  const std::function<void(int64_t, int64_t, int32_t)>* job_ = nullptr;
  int64_t job_size_ = 0;
  int64_t job_chunk_ = 1;
  std::atomic<int64_t> next_index_{0};   // the first index no thread has taken yet
  std::atomic<uint64_t> generation_{0};
  std::atomic<int32_t> pending_{0};   // workers still running the current job
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> awake_until_{0};  // steady_clock ticks

  std::mutex mutex_;   // guards the sleep flags below and the condition variables
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  int32_t sleeping_workers_ = 0;
  bool caller_sleeping_ = false;
};

}  // namespace granule::cpu
