// ApiServerHost: the window's OpenAI server (app/server's OpenAiServer) over the engine the
// EngineWorker already runs, so API requests and the window's chats decode in the same steps.
// It lives on the engine thread, owned by the worker: the server's handler threads queue
// their engine work here, and the worker runs it between steps (runTasks).
#pragma once
#include <QList>
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "granule/engine.h"
#include "worker_types.h"

namespace granule::server {
class OpenAiServer;
}

namespace granule::app {

class ApiServerHost {
 public:
  // `wake` is called from any thread when work arrives for an empty queue; it must make the
  // engine thread call runTasks() soon (the worker queues an event to itself).
  explicit ApiServerHost(std::function<void()> wake);
  ~ApiServerHost();  // stop()
  ApiServerHost(const ApiServerHost&) = delete;
  ApiServerHost& operator=(const ApiServerHost&) = delete;

  // Binds `settings`' address and starts serving `model_id` on a thread of its own. Returns
  // Serving with the bound port, or Failed with a one-line reason (the port is taken, ...).
  // A server already running is stopped first.
  ServingStatus start(const ServeSettings& settings, const std::string& model_id);
  // Stops listening, ends the requests in flight (their clients get an error), and joins every
  // server thread. Engine work still queued is dropped, so a handler waiting on it fails at
  // once instead of waiting for the engine thread, which is the one calling stop(). The
  // engine keeps the dropped requests' sequences: the caller cancels them. Idempotent.
  void stop();
  bool serving() const { return server_ != nullptr; }

  // On the engine thread: runs the queued work on `engine`; returns how many tasks ran.
  int runTasks(Engine& engine);
  // The completions in flight (without the engine's figures: the worker adds those).
  QList<ApiRequestTelemetry> requests() const;
  // Tokens generated for API requests since this host was made, over every server it ran.
  quint64 generatedTokens() const;

 private:
  class Queue;
  std::function<void()> wake_;
  std::unique_ptr<Queue> queue_;
  std::unique_ptr<server::OpenAiServer> server_;
  std::thread thread_;
  std::atomic<bool> listen_returned_{false};
  quint64 stopped_servers_tokens_ = 0;  // generated under servers since stopped
};

}  // namespace granule::app
