// `granule-cli serve MODEL`: the OpenAI-compatible HTTP server, headless. One engine thread
// steps the engine; HTTP handler threads hand it requests (app/server/). Ctrl-C or SIGTERM
// stops it.
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <ctime>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "byte_size.h"
#include "cli.h"
#include "engine_loop.h"
#include "generation.h"
#include "granule/error.h"
#include "openai_server.h"

namespace granule::cli {
namespace {

struct ServeOptions {
  GenerationOptions generation;
  int32_t chats = 8;
  server::ServerOptions server;
  std::string max_body = "1MiB";
  bool kv_reuse = true;
  // Host memory for kept KV evicted from the device. None by default, as llama-server keeps its
  // prompt cache in its slots: under a load of one-off prompts every eviction would otherwise
  // be a device-to-host copy on the engine thread, for KV nobody asks for again.
  std::string kv_host_cache = "0";
};

// Stops the server on SIGINT or SIGTERM. The signals are blocked in every thread (the
// engine's and httplib's inherit the mask) and taken here with sigtimedwait.
class SignalStop {
 public:
  SignalStop() {
    sigemptyset(&signals_);
    sigaddset(&signals_, SIGINT);
    sigaddset(&signals_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals_, &previous_);
  }
  void watch(server::OpenAiServer& server) {
    thread_ = std::thread([this, &server] {
      const timespec tick{0, 200'000'000};
      while (!done_) {
        if (sigtimedwait(&signals_, nullptr, &tick) > 0) {
          std::fprintf(stderr, "granule-cli serve: stopping\n");
          server.stop();
          return;
        }
      }
    });
  }
  ~SignalStop() {
    done_ = true;
    if (thread_.joinable()) thread_.join();
    pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
  }

 private:
  sigset_t signals_{};
  sigset_t previous_{};
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// --kv-host-cache: a size, or 0 / off for none.
uint64_t host_cache_bytes(const std::string& text) {
  return text == "0" || text == "off" ? 0 : parse_byte_size(text);
}

int serve(ServeOptions& options) {
  // A client that hangs up mid-write must not end the process.
  signal(SIGPIPE, SIG_IGN);
  options.server.max_body_bytes = parse_byte_size(options.max_body);
  options.server.limits.default_max_tokens = options.generation.max_tokens;
  options.server.model_id = options.generation.model.stem().string();

  EngineOptions engine_options;
  engine_options.context_length = options.generation.context;
  engine_options.max_sequences = options.chats;
  // Prompt caching: an ended request's KV stays (device, then host memory) for the next
  // request that starts with the same tokens; /metrics reports it as kept, apart from the KV
  // of running requests, and usage.prompt_tokens_details.cached_tokens says what was reused.
  engine_options.kv_reuse = options.kv_reuse;
  engine_options.kv_host_cache_bytes = host_cache_bytes(options.kv_host_cache);
  engine_options.cpu_threads = options.generation.threads;
  engine_options.host_expert_share = options.generation.host_expert_share;
  engine_options.host_row_share = options.generation.host_row_share;
  engine_options.vram_budget_bytes = options.generation.vram_budget_bytes;
  engine_options.chat_template_override = options.generation.template_name;
  const std::string& device = options.generation.device;
  engine_options.device = device == "cpu"    ? DeviceKind::Cpu
                          : device == "cuda" ? DeviceKind::Cuda
                                             : DeviceKind::Auto;

  SignalStop signal_stop;  // before any thread starts, so they all inherit the mask
  std::unique_ptr<Engine> engine = Engine::open(options.generation.model, engine_options);
  const std::string device_name = engine->device_name();
  const int64_t context = engine->options().context_length;
  server::EngineLoop loop(std::move(engine));
  server::OpenAiServer http(loop, options.server);
  int port = 0;
  try {
    port = http.bind();
  } catch (const Error& e) {  // about the address, not the model: no file name in front
    std::fprintf(stderr, "granule-cli: %s\n", e.what());
    return 1;
  }
  std::printf(
      "granule-cli serve: %s on %s, %d chats of %lld tokens, listening on http://%s:%d/v1\n",
      options.server.model_id.c_str(), device_name.c_str(), options.chats,
      static_cast<long long>(context), options.server.host.c_str(), port);
  std::fflush(stdout);
  signal_stop.watch(http);
  const bool ok = http.listen();
  loop.stop();
  if (!ok) throw Error("the HTTP server stopped with an error");
  return 0;
}

}  // namespace

Command add_serve_command(CLI::App& parent) {
  auto options = std::make_shared<ServeOptions>();
  CLI::App* app = parent.add_subcommand(
      "serve", "Serve the model over an OpenAI-compatible HTTP API (/v1/chat/completions, ...)");
  GenerationOptions& g = options->generation;
  app->add_option("model", g.model, "GGUF model file")->required();
  app->add_option("--host", options->server.host,
                  "Address to listen on (any other than 127.0.0.1 "
                  "exposes the model to the network)")
      ->capture_default_str();
  app->add_option("--port", options->server.port, "Port to listen on (0: any free port, printed)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  app->add_option("--api-key", options->server.api_key,
                  "Require 'Authorization: Bearer KEY' on every endpoint but /health");
  app->add_option("-c,--ctx", g.context, "Context length per chat")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  app->add_option("--chats", options->chats,
                  "Requests decoded together (sequence slots); more wait")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app->add_option("--device", g.device, "Where to run: cpu, cuda or auto")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
      ->capture_default_str();
  add_vram_budget_option(*app, g.vram_budget_bytes);
  app->add_option("-t,--threads", g.threads, "CPU threads (0 = all cores)")
      ->check(CLI::Range(0, 4096));
  app->add_option("--template", g.template_name, "Chat template to use instead of the model's")
      ->check(CLI::IsMember(ChatTemplate::family_names()));
  app->add_option("-n,--max-tokens", g.max_tokens,
                  "Tokens a request generates when it names no max_tokens")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app->add_option("--max-body", options->max_body,
                  "Largest request body, e.g. 1MiB (a bare number is MiB); "
                  "larger ones get 413")
      ->type_name("SIZE")
      ->capture_default_str()
      ->check([](const std::string& text) {
        try {
          parse_byte_size(text);
          return std::string();
        } catch (const Error& e) {
          return std::string(e.what());
        }
      });
  app->add_option("--max-requests", options->server.max_requests,
                  "Completions in flight at once; more get 503")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app->add_option("--timeout", options->server.request_timeout_s,
                  "Seconds a completion may run before it is cancelled")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();
  app->add_option("--cors", options->server.cors_origin,
                  "Allow browsers from ORIGIN (or *) to call the API; off by default")
      ->type_name("ORIGIN");
  app->add_option("--kv-reuse", options->kv_reuse,
                  "Keep an ended request's KV for the next request with the same prompt "
                  "prefix (prompt caching): on or off")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, std::string>{{"on", "true"}, {"off", "false"}}, CLI::ignore_case))
      ->default_str("on");
  app->add_option("--kv-host-cache", options->kv_host_cache,
                  "Host memory for kept KV the device evicts, e.g. 2GiB (a bare number is MiB); "
                  "0 drops it instead")
      ->type_name("SIZE")
      ->capture_default_str()
      ->check([](const std::string& text) {
        try {
          host_cache_bytes(text);
          return std::string();
        } catch (const Error& e) {
          return std::string(e.what());
        }
      });
  g.max_tokens = 512;
  return {app, [options] { return serve(*options); }, &options->generation.model};
}

}  // namespace granule::cli
