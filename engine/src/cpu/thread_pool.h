// A small fixed pool of worker threads that splits an index range among themselves and the
// caller (parallel_for); the CPU backend runs every row- and head-parallel loop on it.
#pragma once
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
  // Calls fn(begin, end, thread_index) over contiguous parts of [0, n) and waits for all.
  // Parts are split evenly by index; fn must not throw.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int32_t)>& fn);

 private:
  void worker_loop(int32_t index);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  const std::function<void(int64_t, int64_t, int32_t)>* job_ = nullptr;
  int64_t job_size_ = 0;
  uint64_t generation_ = 0;
  int32_t pending_ = 0;
  bool stopping_ = false;
};

}  // namespace granule::cpu
