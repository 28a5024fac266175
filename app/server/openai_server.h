// An OpenAI-compatible HTTP server (cpp-httplib) over an engine thread: /v1/models,
// /v1/chat/completions, /v1/completions (streamed as server-sent events or not), /health
// and /metrics. Handler threads hand requests to the engine thread through EngineExecutor
// and wait on a per-request channel the engine's sink fills; a client that goes away has
// its request cancelled, so its KV is freed.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine_loop.h"
#include "openai_request.h"

namespace granule::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;      // 0: any free port (bind() returns it)
  std::string api_key;  // "": no key needed; else "Authorization: Bearer KEY" on all but /health
  size_t max_body_bytes = 1 << 20;  // larger bodies get 413
  int32_t max_requests = 64;        // completions in flight at once; more get 503
  int32_t request_timeout_s = 600;  // a completion running longer is cancelled
  std::string cors_origin;          // "": no CORS headers; else Access-Control-Allow-Origin
  std::string model_id;             // the name /v1/models lists and responses carry
  RequestLimits limits;
};

// A completion in flight (submitted to the engine, its response not yet over), as a window
// lists it beside its chats.
struct ServedRequest {
  std::string id;  // the response's id, "chatcmpl-1733-4"
  Endpoint endpoint = Endpoint::ChatCompletions;
  SequenceId sequence = -1;  // the engine's id for it
  bool stream = false;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;  // generated so far
  bool finished = false;          // the engine is done; the response is being written
};

class OpenAiServer {
 public:
  OpenAiServer(EngineExecutor& engine, ServerOptions options);
  ~OpenAiServer();
  OpenAiServer(const OpenAiServer&) = delete;
  OpenAiServer& operator=(const OpenAiServer&) = delete;

  // Binds the address; returns the port. Throws granule::Error when it cannot be bound.
  int bind();
  // Serves until stop() (from any thread). Returns false when the server failed.
  bool listen();
  // True while listen() accepts connections; stop() before that does not end a listen() that
  // starts later, so a caller on another thread waits for this first.
  bool listening() const;
  void stop();

  // The completions in flight now, oldest first. Callable from any thread.
  std::vector<ServedRequest> requests() const;
  // Tokens generated for every request since the server was made (a window's tokens/s).
  uint64_t generated_tokens() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace granule::server
