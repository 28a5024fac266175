// The engine thread a server hands its work to: EngineExecutor is what the server needs (run
// a function on the thread that owns the engine), EngineLoop the headless one, which steps
// the engine whenever it has work. The window's engine worker can implement EngineExecutor
// too, so API requests join the same batch as its chats.
#pragma once
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

#include "granule/engine.h"

namespace granule::server {

class EngineExecutor {
 public:
  virtual ~EngineExecutor() = default;
  // Runs `task` on the engine thread, soon (before the next step). Callable from any thread.
  virtual void post(std::function<void(Engine&)> task) = 0;

  // Runs `task` on the engine thread and waits for its result (or its exception).
  template <class F>
  auto call(F task) -> decltype(task(std::declval<Engine&>())) {
    using Result = decltype(task(std::declval<Engine&>()));
    auto promise = std::make_shared<std::promise<Result>>();
    std::future<Result> future = promise->get_future();
    post([promise, task = std::move(task)](Engine& engine) mutable {
      try {
        if constexpr (std::is_void_v<Result>) {
          task(engine);
          promise->set_value();
        } else {
          promise->set_value(task(engine));
        }
      } catch (...) {
        promise->set_exception(std::current_exception());
      }
    });
    return future.get();
  }
};

// Owns the engine and one thread that runs posted tasks and steps the engine while it has
// work, sleeping when it has none.
class EngineLoop final : public EngineExecutor {
 public:
  explicit EngineLoop(std::unique_ptr<Engine> engine);
  ~EngineLoop() override;  // stops the thread; tasks posted after that are dropped
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  void post(std::function<void(Engine&)> task) override;
  void stop();

 private:
  void run();

  std::unique_ptr<Engine> engine_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void(Engine&)>> tasks_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace granule::server
