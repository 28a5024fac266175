// MeasuredOnce: a value the first get() measures and every later get() returns, from any
// thread (a second caller waits for the first measurement instead of starting its own). The
// CUDA backend keeps its host-to-device bandwidth in one (cuda/h2d_bandwidth.h), so the fit
// preview's repeated estimates never measure again. Plain C++, header only.
#pragma once
#include <cstdint>
#include <mutex>
#include <optional>

namespace granule {

class MeasuredOnce {
 public:
  // The cached value, measured now by `measure` when there is none. A measurement that
  // throws caches nothing (the next get() tries again) and the exception propagates.
  template <class Measure>
  double get(Measure&& measure) {
    std::lock_guard lock(mutex_);
    if (!value_) {
      ++measurements_;
      value_ = measure();
    }
    return *value_;
  }
  std::optional<double> cached() const {
    std::lock_guard lock(mutex_);
    return value_;
  }
  uint64_t measurements() const {
    std::lock_guard lock(mutex_);
    return measurements_;
  }

 private:
  mutable std::mutex mutex_;
  std::optional<double> value_;
  uint64_t measurements_ = 0;
};

}  // namespace granule
