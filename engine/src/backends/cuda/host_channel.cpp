// HostChannel's buffers and its server thread: spin on the mapped request while steps come, nap
// when idle (200 µs after 50 ms without a request, 2 ms after 2 s), answer each request once.
#include "backends/cuda/host_channel.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "backends/cuda/cuda_check.h"
#include "granule/error.h"
#include "granule/log.h"

namespace granule::cuda {
namespace {

// The request and done words each on their own cache line, so the server's polls do not share
// a line with the device's writes of the other.
constexpr size_t kWordsBytes = 64;

}  // namespace

HostChannel::HostChannel(MemoryManager& memory, size_t x_floats, size_t y_floats, Job job)
    : job_(std::move(job)), x_floats_(x_floats), y_floats_(y_floats) {
  state_ = DeviceBuffer(memory, MemoryCategory::Workspace, 4 * sizeof(uint32_t));
  check_cuda(cudaMemset(state_.get(), 0, state_.bytes()), "cudaMemset");
  request_ = PinnedBuffer(kWordsBytes);
  done_ = PinnedBuffer(kWordsBytes);
  std::memset(request_.as<uint8_t>(), 0, kWordsBytes);
  std::memset(done_.as<uint8_t>(), 0, kWordsBytes);
  x_ = PinnedBuffer(std::max<size_t>(x_floats, 4) * sizeof(float));
  y_ = PinnedBuffer(std::max<size_t>(y_floats, 4) * sizeof(float));
  words_.state = state_.as<unsigned int>();
  words_.request = request_.device_as<unsigned int>();
  words_.done = done_.device_as<unsigned int>();
  device_x_ = x_.device_as<float>();
  device_y_ = y_.device_as<const float>();
  server_ = std::thread([this] { serve(); });
}

HostChannel::~HostChannel() {
  stop_.store(true, std::memory_order_relaxed);
  if (server_.joinable()) server_.join();
}

void HostChannel::check() const {
  if (failed_.load(std::memory_order_relaxed))
    throw DeviceError("the host's part of a streamed layer failed; reload the model");
  if (done_.as<volatile uint32_t>()[1] != 0)
    throw DeviceError(
        "the GPU gave up waiting for the host's part of a streamed layer (2 s); reload the model");
}

void HostChannel::serve() {
  const volatile uint32_t* request = request_.as<volatile uint32_t>();
  volatile uint32_t* done = done_.as<volatile uint32_t>();
  uint32_t last = 0;
  auto last_work = std::chrono::steady_clock::now();
  uint32_t polls = 0;
  while (!stop_.load(std::memory_order_relaxed)) {
    const uint32_t seq = request[0];
    if (seq == last) {
      // Spin while steps come (a round's answer is due within microseconds); read the clock
      // only every 64 polls.
      if (++polls % 64 != 0) {
        _mm_pause();
        continue;
      }
      const auto idle = std::chrono::steady_clock::now() - last_work;
      if (idle > std::chrono::seconds(2))
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      else if (idle > std::chrono::milliseconds(50))
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      continue;
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    last = seq;
    const uint32_t job = request[1];
    const int rows = static_cast<int>(request[2]);
    try {
      job_(job, rows, x_.as<const float>(), y_.as<float>());
    } catch (const std::exception& e) {
      if (!failed_.exchange(true))
        logger("engine.cuda")->error("the host's part of a streamed layer failed: {}", e.what());
      std::fill_n(y_.as<float>(), y_floats_, 0.0f);
    }
    jobs_.fetch_add(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    done[0] = seq;
    last_work = std::chrono::steady_clock::now();
  }
}

}  // namespace granule::cuda
