// ThreadPool: workers wait for a generation counter to move, run their part, report back.
#include "cpu/thread_pool.h"

#include <algorithm>

namespace granule::cpu {

ThreadPool::ThreadPool(int32_t threads) {
  const int32_t workers = std::max(threads, 1) - 1;
  workers_.reserve(static_cast<size_t>(workers));
  for (int32_t i = 0; i < workers; ++i) workers_.emplace_back([this, i] { worker_loop(i + 1); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (auto& w : workers_) w.join();
}

namespace {
// Part `index` of `parts` even parts of [0, n).
std::pair<int64_t, int64_t> part_of(int64_t n, int32_t parts, int32_t index) {
  return {n * index / parts, n * (index + 1) / parts};
}
}  // namespace

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int32_t)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    fn(0, n, 0);
    return;
  }
  {
    std::lock_guard lock(mutex_);
    job_ = &fn;
    job_size_ = n;
    pending_ = static_cast<int32_t>(workers_.size());
    ++generation_;
  }
  work_ready_.notify_all();
  auto [begin, end] = part_of(n, threads(), 0);
  if (begin < end) fn(begin, end, 0);
  std::unique_lock lock(mutex_);
  work_done_.wait(lock, [this] { return pending_ == 0; });
  job_ = nullptr;
}

void ThreadPool::worker_loop(int32_t index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t, int32_t)>* job;
    int64_t n;
    {
      std::unique_lock lock(mutex_);
      work_ready_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      job = job_;
      n = job_size_;
    }
    auto [begin, end] = part_of(n, threads(), index);
    if (begin < end) (*job)(begin, end, index);
    {
      std::lock_guard lock(mutex_);
      --pending_;
    }
    work_done_.notify_one();
  }
}

}  // namespace granule::cpu
