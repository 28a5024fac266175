// A per-test watchdog for the GPU tests, so that a hung kernel, a wait on a stream that never
// finishes or a CUDA call blocked in the driver fails the test binary within a bounded time
// instead of hanging CI or a developer's run (issue 36: two MoE tests hung on an H100 with no
// way to see where). Every binary that includes gpu_test_support.h gets it: a GoogleTest
// listener arms alarm() when a test starts and disarms it when the test ends; past the limit
// the SIGALRM handler writes the test's name and the last step the test named with
// gpu_test::step() to stderr and ends the process with status 124 (as timeout(1) does). Stdout is
// made line-buffered so that whatever a test printed before a hang reaches the log.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>

namespace granule::gpu_test {

// The most seconds one GPU test may take. The slowest GPU tests take well under a minute on an
// H100 (moe_kernels_test's slowest suite: 40 s for all of its cases, most of it CPU checks).
constexpr unsigned kWatchdogSeconds = 240;

namespace watchdog_detail {
inline char test_name[256] = "";
inline std::atomic<const char*> step{"(no step named)"};

// Only async-signal-safe calls here: write() and _exit().
inline void say(const char* s) {
  if (write(STDERR_FILENO, s, std::strlen(s)) < 0) return;
}
inline void on_alarm(int) {
  say("\n[gpu-watchdog] ");
  say(test_name);
  say(" ran past the per-test limit (gpu_watchdog.h); last step: ");
  say(step.load());
  say("\n");
  _exit(124);
}

class Listener : public ::testing::EmptyTestEventListener {
  void OnTestStart(const ::testing::TestInfo& info) override {
    std::snprintf(test_name, sizeof test_name, "%s.%s", info.test_suite_name(), info.name());
    step.store("(test started)");
    std::signal(SIGALRM, on_alarm);
    alarm(kWatchdogSeconds);
  }
  void OnTestEnd(const ::testing::TestInfo&) override { alarm(0); }
};

inline bool install() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  ::testing::UnitTest::GetInstance()->listeners().Append(new Listener);
  return true;
}
inline const bool installed = install();
}  // namespace watchdog_detail

// Names what the running test does now (a string literal: kept by pointer); the watchdog prints
// the last one named when it fires.
inline void step(const char* what) { watchdog_detail::step.store(what); }

}  // namespace granule::gpu_test
