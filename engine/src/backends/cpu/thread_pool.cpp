// ThreadPool: a generation counter announces each job; workers and the caller spin for a
// few tens of microseconds (or until stay_awake_until's deadline), then sleep on a condition
// variable (see thread_pool.h).
#include "backends/cpu/thread_pool.h"

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace granule::cpu {
namespace {

// About 30-60 µs of pause instructions: longer than the gap between two loops of a forward
// pass, far shorter than the gap between two engine steps.
constexpr int kSpinIterations = 1000;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}


}  // namespace

void ThreadPool::stay_awake_until(std::chrono::steady_clock::time_point deadline) {
  awake_until_.store(deadline.time_since_epoch().count(), std::memory_order_relaxed);
}

bool ThreadPool::held_awake() const {
  if (std::chrono::steady_clock::now().time_since_epoch().count() >=
      awake_until_.load(std::memory_order_relaxed))
    return false;
  std::this_thread::yield();
  return true;
}

ThreadPool::ThreadPool(int32_t threads) {
  const int32_t workers = std::max(threads, 1) - 1;
  workers_.reserve(static_cast<size_t>(workers));
  for (int32_t i = 0; i < workers; ++i) workers_.emplace_back([this, i] { worker_loop(i + 1); });
}

ThreadPool::~ThreadPool() {
  stopping_.store(true);
  {
    std::lock_guard lock(mutex_);
  }
  work_ready_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int32_t)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    fn(0, n, 0);
    return;
  }
  job_ = &fn;
  job_size_ = n;
  // Eight chunks per thread: a thread that starts late or runs slow (a busy core, an SMT
  // sibling) leaves its share to the others instead of holding everyone up.
  job_chunk_ = std::max<int64_t>(1, n / (8 * threads()));
  next_index_.store(0, std::memory_order_relaxed);
  pending_.store(static_cast<int32_t>(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  {
    // Taking the lock orders this against a worker that is about to sleep (see worker_loop).
    std::lock_guard lock(mutex_);
    if (sleeping_workers_ > 0) work_ready_.notify_all();
  }
  run_chunks(0);

  for (int spin = 0;; ++spin) {
    if (pending_.load(std::memory_order_acquire) == 0) return;
    // Past the brief spin, the clock every 64 spins: on while held awake, else to sleep.
    if (spin >= kSpinIterations && spin % 64 == 0 && !held_awake()) break;
    cpu_relax();
  }
  std::unique_lock lock(mutex_);
  caller_sleeping_ = true;
  work_done_.wait(lock, [this] { return pending_.load(std::memory_order_acquire) == 0; });
  caller_sleeping_ = false;
}

void ThreadPool::run_chunks(int32_t thread_index) {
  for (;;) {
    const int64_t begin = next_index_.fetch_add(job_chunk_, std::memory_order_relaxed);
    if (begin >= job_size_) return;
    (*job_)(begin, std::min(job_size_, begin + job_chunk_), thread_index);
  }
}

void ThreadPool::worker_loop(int32_t index) {
  uint64_t seen = 0;
  for (;;) {
    int spin = 0;
    while (generation_.load(std::memory_order_acquire) == seen && !stopping_.load()) {
      if (++spin < kSpinIterations || spin % 64 != 0 || held_awake()) {
        cpu_relax();
        continue;
      }
      std::unique_lock lock(mutex_);
      ++sleeping_workers_;
      work_ready_.wait(lock, [&] {
        return generation_.load(std::memory_order_acquire) != seen || stopping_.load();
      });
      --sleeping_workers_;
    }
    if (stopping_.load()) return;
    // The caller waits for every worker before the next job, so exactly one job is new.
    seen = generation_.load(std::memory_order_acquire);
    run_chunks(index);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard lock(mutex_);
      if (caller_sleeping_) work_done_.notify_one();
    }
  }
}

}  // namespace granule::cpu
