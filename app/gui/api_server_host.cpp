// The window's OpenAI server: its engine-work queue, its thread, start and stop. Without
// cpp-httplib at build time (no GRANULE_WINDOW_SERVER) it only says that it cannot serve.
#include "api_server_host.h"

#include <chrono>
#include <csignal>
#include <deque>
#include <mutex>

#include "granule/log.h"

#if GRANULE_WINDOW_SERVER
#include "engine_loop.h"
#include "openai_server.h"
#else
namespace granule::server {
class OpenAiServer {};
}  // namespace granule::server
#endif

namespace granule::app {
namespace {
std::shared_ptr<spdlog::logger> log() { return granule::logger("app.server"); }

ServingStatus failed(const ServeSettings& settings, const QString& error) {
  ServingStatus status;
  status.state = ServingStatus::State::Failed;
  status.host = settings.host;
  status.port = settings.port;
  status.error = error;
  return status;
}
}  // namespace

#if GRANULE_WINDOW_SERVER

// The server's EngineExecutor: tasks wait here until the engine thread takes them. Closed, it
// drops what it holds and whatever comes later; a dropped call()'s promise is destroyed
// unfulfilled, so the handler waiting on it gets an exception instead of waiting forever.
class ApiServerHost::Queue final : public server::EngineExecutor {
 public:
  explicit Queue(std::function<void()> wake) : wake_(std::move(wake)) {}

  void post(std::function<void(Engine&)> task) override {
    bool was_empty = false;
    {
      std::lock_guard lock(mutex_);
      if (closed_) return;
      was_empty = tasks_.empty();
      tasks_.push_back(std::move(task));
    }
    // One wake-up per batch: the engine thread takes everything queued when it runs.
    if (was_empty) wake_();
  }

  std::deque<std::function<void(Engine&)>> take() {
    std::deque<std::function<void(Engine&)>> tasks;
    std::lock_guard lock(mutex_);
    tasks.swap(tasks_);
    return tasks;
  }

  void close() {
    std::deque<std::function<void(Engine&)>> dropped;
    {
      std::lock_guard lock(mutex_);
      closed_ = true;
      dropped.swap(tasks_);
    }
    // Destroyed outside the lock: a promise's waiter wakes up and may post again.
  }

 private:
  std::function<void()> wake_;
  std::mutex mutex_;
  std::deque<std::function<void(Engine&)>> tasks_;
  bool closed_ = false;
};

#else

class ApiServerHost::Queue {};

#endif

ApiServerHost::ApiServerHost(std::function<void()> wake) : wake_(std::move(wake)) {}

ApiServerHost::~ApiServerHost() { stop(); }

ServingStatus ApiServerHost::start(const ServeSettings& settings, const std::string& model_id) {
  stop();
#if GRANULE_WINDOW_SERVER
  server::ServerOptions options;
  options.host = settings.host.trimmed().toStdString();
  options.port = settings.port;
  options.api_key = settings.api_key.toStdString();
  options.model_id = model_id;
  queue_ = std::make_unique<Queue>(wake_);
  server_ = std::make_unique<server::OpenAiServer>(*queue_, options);
  int port = 0;
  try {
    port = server_->bind();
  } catch (const std::exception& e) {
    log()->warn("serving on {}:{} failed: {}", options.host, settings.port, e.what());
    server_.reset();
    queue_.reset();
    return failed(settings,
                  QStringLiteral("Cannot serve the API on %1:%2: the port is in use or the "
                                 "address is not this machine's.")
                      .arg(settings.host.trimmed())
                      .arg(settings.port));
  }
  // A client that hangs up while being written to must not end the window.
  std::signal(SIGPIPE, SIG_IGN);
  listen_returned_ = false;
  thread_ = std::thread([this, server = server_.get()] {
    if (!server->listen()) log()->error("the API server stopped with an error");
    listen_returned_ = true;
  });
  // stop() ends only a listen() that has begun, so start() returns once it has.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!server_->listening() && !listen_returned_ && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!server_->listening()) {
    stop();
    return failed(settings, QStringLiteral("The API server did not start listening."));
  }
  log()->info("serving {} on http://{}:{}/v1", model_id, options.host, port);
  ServingStatus status;
  status.state = ServingStatus::State::Serving;
  status.host = settings.host.trimmed();
  status.port = port;
  return status;
#else
  (void)model_id;
  return failed(settings, QStringLiteral("This build of Granule has no HTTP server (it was built "
                                         "without cpp-httplib)."));
#endif
}

void ApiServerHost::stop() {
#if GRANULE_WINDOW_SERVER
  if (!server_) return;
  queue_->close();
  server_->stop();
  // listen() returns once every handler thread has ended; a handler ends within its wait
  // (0.1 s) when it sees the server stopping, or within the read timeout for a stalled client.
  if (thread_.joinable()) thread_.join();
  stopped_servers_tokens_ += server_->generated_tokens();
  server_.reset();
  queue_.reset();
  log()->info("API server stopped");
#endif
}

int ApiServerHost::runTasks(Engine& engine) {
#if GRANULE_WINDOW_SERVER
  if (!queue_) return 0;
  std::deque<std::function<void(Engine&)>> tasks = queue_->take();
  for (auto& task : tasks) {
    try {
      task(engine);
    } catch (const std::exception& e) {
      log()->error("API server task failed: {}", e.what());
    }
  }
  return static_cast<int>(tasks.size());
#else
  (void)engine;
  return 0;
#endif
}

quint64 ApiServerHost::generatedTokens() const {
#if GRANULE_WINDOW_SERVER
  return stopped_servers_tokens_ + (server_ ? server_->generated_tokens() : 0);
#else
  return 0;
#endif
}

QList<ApiRequestTelemetry> ApiServerHost::requests() const {
  QList<ApiRequestTelemetry> rows;
#if GRANULE_WINDOW_SERVER
  if (!server_) return rows;
  for (const server::ServedRequest& r : server_->requests()) {
    ApiRequestTelemetry row;
    row.request_id = QString::fromStdString(r.id);
    row.endpoint = r.endpoint == server::Endpoint::ChatCompletions ? QStringLiteral("chat")
                                                                   : QStringLiteral("completions");
    row.stream = r.stream;
    row.prompt_tokens = r.prompt_tokens;
    row.completion_tokens = r.completion_tokens;
    row.state = r.finished                ? QStringLiteral("finishing")
                : r.completion_tokens > 0 ? QStringLiteral("generating")
                                          : QStringLiteral("prefill");
    row.sequence.id = r.sequence;
    rows.append(row);
  }
#endif
  return rows;
}

}  // namespace granule::app
