// The headless engine thread: posted tasks first, then one step, until stopped.
#include "engine_loop.h"

#include <exception>

#include "granule/log.h"

namespace granule::server {

EngineLoop::EngineLoop(std::unique_ptr<Engine> engine)
    : engine_(std::move(engine)), thread_([this] { run(); }) {}

EngineLoop::~EngineLoop() { stop(); }

void EngineLoop::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void EngineLoop::post(std::function<void(Engine&)> task) {
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return;
    tasks_.push_back(std::move(task));
  }
  wake_.notify_one();
}

void EngineLoop::run() {
  std::deque<std::function<void(Engine&)>> tasks;
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      // Sleep only when the engine has nothing to do; otherwise just take what was posted.
      wake_.wait(lock, [&] { return stopping_ || !tasks_.empty() || !engine_->idle(); });
      if (stopping_) break;
      tasks.swap(tasks_);
    }
    for (auto& task : tasks) {
      try {
        task(*engine_);
      } catch (const std::exception& e) {
        granule::logger("server")->error("engine task failed: {}", e.what());
      }
    }
    tasks.clear();
    try {
      engine_->step();
    } catch (const std::exception& e) {
      // The engine ends the affected sequences itself; the loop keeps serving the rest.
      granule::logger("server")->error("engine step failed: {}", e.what());
    }
  }
  // Cancel whatever is left so every sink hears its end before the engine goes away.
  try {
    for (const SequenceTelemetry& s : engine_->telemetry().sequences) engine_->cancel(s.id);
    while (engine_->step()) {
    }
  } catch (const std::exception& e) {
    granule::logger("server")->error("engine shutdown: {}", e.what());
  }
}

}  // namespace granule::server
