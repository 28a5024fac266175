// The HTTP side of the OpenAI server: routes, auth, limits, the per-request channel between
// the engine's sink and the handler thread, SSE streaming and cancellation on disconnect.
#include "openai_server.h"

#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "granule/error.h"
#include "granule/log.h"
#include "granule/reasoning.h"
#include "prometheus_metrics.h"

namespace granule::server {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// What the engine thread's sink writes and the handler thread reads, for one request.
struct Channel {
  std::mutex mutex;
  std::condition_variable changed;
  std::string text;       // released by the engine, not yet sent to the client
  std::string reasoning;  // the same for the model's reasoning (chat, ReasoningParser)
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens whose KV was kept (PromptInfo::reused_tokens)
  // When the request was handed to the engine thread, and its first and last tokens.
  std::chrono::steady_clock::time_point submitted, first_token, last_token;
  std::vector<TokenLogprobs> logprobs;    // of tokens not yet sent (when the request asked)
  std::vector<ToolCallPiece> tool_calls;  // parsed from the reply, not yet sent
  int tool_call_count = 0;                // every call parsed so far
  bool finished = false;
  FinishReason reason = FinishReason::None;
  std::string error;
};

int port_of(const sockaddr_storage& address) {
  if (address.ss_family == AF_INET)
    return ntohs(reinterpret_cast<const sockaddr_in&>(address).sin_port);
  if (address.ss_family == AF_INET6)
    return ntohs(reinterpret_cast<const sockaddr_in6&>(address).sin6_port);
  return -1;
}

// The socket of the connection a request came on: httplib does not hand it to handlers, so
// it is found among the process's descriptors by its two ports. -1 when not found.
int find_connection_socket(const httplib::Request& request) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    int fd = -1;
    try {
      fd = std::stoi(entry.path().filename().string());
    } catch (...) {
      continue;
    }
    sockaddr_storage peer{}, local{};
    socklen_t peer_length = sizeof peer, local_length = sizeof local;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_length) != 0) continue;
    if (port_of(peer) != request.remote_port) continue;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_length) != 0) continue;
    if (port_of(local) == request.local_port) return fd;
  }
  return -1;
}

// True when the client has closed its side or the connection broke.
bool peer_closed(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, static_cast<short>(POLLIN | POLLRDHUP), 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return true;
  char byte;
  const ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

bool constant_time_equal(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= a[i] ^ b[i % (b.empty() ? 1 : b.size())];
  return diff == 0;
}

std::string dump(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

void send_error(httplib::Response& response, const ApiError& error) {
  response.status = error.status;
  response.set_content(dump(error_json(error)), "application/json");
}

// httplib runs each connection on one of its queue's threads for as long as the connection
// lives, waiting on an idle keep-alive socket until its timeout: with a fixed pool, a few
// hundred idle connections made /health wait seconds. This queue starts another thread
// whenever every thread is busy, up to `max_threads` (the total connections served at once;
// past it, connections wait for a thread as before), so idle clients never starve the others.
class ConnectionQueue final : public httplib::TaskQueue {
 public:
  explicit ConnectionQueue(size_t max_threads) : max_threads_(std::max<size_t>(max_threads, 1)) {}
  ~ConnectionQueue() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    std::lock_guard lock(mutex_);
    if (stopping_) return;
    jobs_.push_back(std::move(fn));
    if (idle_ < jobs_.size() && threads_.size() < max_threads_) {
      threads_.emplace_back([this] { work(); });
    } else {
      ready_.notify_one();
    }
  }

  void shutdown() override {
    std::vector<std::thread> threads;
    {
      std::lock_guard lock(mutex_);
      if (stopping_ && threads_.empty()) return;
      stopping_ = true;
      threads.swap(threads_);
    }
    ready_.notify_all();
    for (std::thread& t : threads) t.join();
  }

 private:
  void work() {
    std::unique_lock lock(mutex_);
    for (;;) {
      ++idle_;
      ready_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
      --idle_;
      if (jobs_.empty()) return;  // stopping, nothing left
      std::function<void()> job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      job();
      lock.lock();
    }
  }

  const size_t max_threads_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;
  bool stopping_ = false;
};

// An engine error from submit() as the API error a client should see.
ApiError api_error_from(const std::exception& e, std::string_view param) {
  if (dynamic_cast<const CapacityError*>(&e)) {
    return ApiError(400, e.what(), "invalid_request_error", std::string(param),
                    "context_length_exceeded");
  }
  if (dynamic_cast<const UsageError*>(&e) || dynamic_cast<const UnsupportedError*>(&e)) {
    return ApiError(400, e.what(), "invalid_request_error", std::string(param));
  }
  if (dynamic_cast<const DeviceLostError*>(&e)) {
    return ApiError(503, e.what(), "server_error", "", "device_lost");
  }
  return ApiError(500, e.what(), "server_error");
}

}  // namespace

struct OpenAiServer::Impl {
  // Connections served at once besides the requests in flight (idle keep-alive ones, /health,
  // /metrics): past them a new connection waits for one to close.
  static constexpr size_t kMaxConnections = 1024;
  EngineExecutor& engine;
  ServerOptions options;
  httplib::Server http;
  std::atomic<int64_t> active{0};
  std::atomic<uint64_t> total{0};
  std::atomic<uint64_t> rejected{0};
  // Tokens generated for every request (the engine's sinks count them; shared, as a sink may
  // outlive this object while the engine thread winds down).
  std::shared_ptr<std::atomic<uint64_t>> completion_tokens =
      std::make_shared<std::atomic<uint64_t>>(0);
  std::atomic<uint64_t> next_id{1};
  std::atomic<bool> stopping{false};  // stop() was called: requests in flight end now
  const int64_t started = std::chrono::duration_cast<std::chrono::seconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count();
  std::mutex seed_mutex;
  std::mt19937_64 seed_source{std::random_device{}()};

  Impl(EngineExecutor& e, ServerOptions o) : engine(e), options(std::move(o)) { configure(); }

  // Holds one of the --max-requests places while a completion runs.
  struct Slot {
    std::atomic<int64_t>* active = nullptr;
    explicit Slot(std::atomic<int64_t>& a) : active(&a) {}
    ~Slot() { active->fetch_sub(1); }
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
  };

  // A submitted request: its channel, its id in the engine, what its responses say.
  struct Running {
    std::shared_ptr<Channel> channel = std::make_shared<Channel>();
    SequenceId id = -1;
    Usage usage;
    ResponseHeader header;
    Endpoint endpoint = Endpoint::ChatCompletions;
    bool include_usage = false;
    bool logprobs = false;       // the request asked for log-probabilities
    int64_t logprob_offset = 0;  // bytes of the tokens whose log-probs were sent (completions)
    Clock::time_point deadline;
    int socket = -1;
    std::unique_ptr<Slot> slot;
    bool cancel_sent = false;
    bool stream = false;
    std::vector<ToolCallPiece> new_calls;  // taken from the channel by wait_for_news, not yet sent
    int calls_sent = 0;                    // calls begun in the stream
  };

  // Submitted requests, for requests(): an entry lives as long as its Running (the handler's,
  // or a stream's provider's), so an expired one has been answered.
  mutable std::mutex listed_mutex;
  mutable std::map<uint64_t, std::weak_ptr<const Running>> listed;
  uint64_t next_listed = 0;

  void list(const std::shared_ptr<Running>& running) {
    std::lock_guard lock(listed_mutex);
    listed.emplace(next_listed++, running);
  }

  // Wakes every request waiting for news (stop(): they answer with the shutdown error).
  void wake_all() const {
    std::lock_guard lock(listed_mutex);
    for (const auto& [index, weak] : listed) {
      if (const std::shared_ptr<const Running> running = weak.lock()) {
        std::lock_guard channel_lock(running->channel->mutex);
        running->channel->changed.notify_all();
      }
    }
  }

  std::vector<ServedRequest> requests() const {
    std::vector<ServedRequest> out;
    std::lock_guard lock(listed_mutex);
    for (auto it = listed.begin(); it != listed.end();) {
      const std::shared_ptr<const Running> running = it->second.lock();
      if (!running) {
        it = listed.erase(it);
        continue;
      }
      // Written before the request was listed, and never after.
      ServedRequest r{running->header.id, running->endpoint, running->id, running->stream,
                      running->usage.prompt_tokens};
      {
        std::lock_guard channel_lock(running->channel->mutex);
        r.completion_tokens = running->channel->completion_tokens;
        r.finished = running->channel->finished;
      }
      out.push_back(std::move(r));
      ++it;
    }
    return out;
  }

  void configure() {
    // httplib's default sets SO_REUSEPORT, with which a second server (another granule-cli
    // serve, or a window serving) binds a port already served and the kernel splits the
    // connections between them; SO_REUSEADDR alone makes that a bind error.
    http.set_socket_options([](socket_t sock) {
      int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    });
    http.set_payload_max_length(options.max_body_bytes);
    // Every connection holds a thread while it is open (a request in flight while it waits or
    // streams, an idle keep-alive one until its timeout): threads are started as connections
    // need them, up to kMaxConnections beside the requests allowed in flight.
    const size_t threads = static_cast<size_t>(options.max_requests) + kMaxConnections;
    http.new_task_queue = [threads] { return new ConnectionQueue(threads); };
    // A client silent for 5 s in the middle of its request is dropped; that also bounds how
    // long stop() waits for a handler thread stuck reading one. An idle keep-alive connection
    // is closed after 2 s.
    http.set_read_timeout(5);
    http.set_keep_alive_timeout(2);
    http.set_write_timeout(30);

    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (!options.cors_origin.empty()) {
        res.set_header("Access-Control-Allow-Origin", options.cors_origin);
        res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
        res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        if (req.method == "OPTIONS") {
          res.status = 204;
          return httplib::Server::HandlerResponse::Handled;
        }
      }
      if (!options.api_key.empty() && req.path != "/health") {
        const std::string given = req.get_header_value("Authorization");
        if (!constant_time_equal(given, "Bearer " + options.api_key)) {
          rejected.fetch_add(1);
          send_error(res, ApiError(401,
                                   given.empty()
                                       ? "an API key is needed: send 'Authorization: Bearer KEY'"
                                       : "the API key is not the one the server was started with",
                                   "invalid_request_error", "", "invalid_api_key"));
          return httplib::Server::HandlerResponse::Handled;
        }
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });

    http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"status":"ok"})", "application/json");
    });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      const json model = {{"id", options.model_id},
                          {"object", "model"},
                          {"created", started},
                          {"owned_by", "granule"}};
      res.set_content(dump(json{{"object", "list"}, {"data", json::array({model})}}),
                      "application/json");
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      const TelemetrySnapshot telemetry = engine.call([](Engine& e) { return e.telemetry(); });
      const ServerCounters counters{active.load(), total.load(), rejected.load(),
                                    completion_tokens->load()};
      res.set_content(prometheus_metrics(telemetry, counters), "text/plain; version=0.0.4");
    });
    http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      complete(Endpoint::ChatCompletions, req, res);
    });
    http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      complete(Endpoint::Completions, req, res);
    });

    // Statuses httplib sets itself (404 no route, 413 body too large, 400 unreadable
    // request) get the OpenAI error JSON too.
    http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      if (res.status == 404) {
        send_error(res, ApiError(404, "no such endpoint: " + req.method + " " + req.path,
                                 "invalid_request_error", "", "not_found"));
      } else if (res.status == 413) {
        rejected.fetch_add(1);
        send_error(res, ApiError(413,
                                 "the request body is larger than the server's limit of " +
                                     std::to_string(options.max_body_bytes) + " bytes",
                                 "invalid_request_error", "", "request_too_large"));
      } else if (res.status >= 400 && res.status < 500) {
        send_error(res, ApiError(res.status, "bad request", "invalid_request_error"));
      } else {
        send_error(res, ApiError(res.status, "server error", "server_error"));
      }
    });
    http.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
          std::string what = "unknown error";
          try {
            std::rethrow_exception(ep);
          } catch (const std::exception& e) {
            what = e.what();
          } catch (...) {
          }
          granule::logger("server")->error("request failed: {}", what);
          send_error(res, ApiError(500, what, "server_error"));
        });
  }

  void complete(Endpoint endpoint, const httplib::Request& req, httplib::Response& res) {
    ParsedRequest parsed;
    try {
      parsed = parse_request(endpoint, req.body, options.limits);
    } catch (const ApiError& e) {
      rejected.fetch_add(1);
      return send_error(res, e);
    }
    if (active.fetch_add(1) >= options.max_requests) {
      active.fetch_sub(1);
      rejected.fetch_add(1);
      res.set_header("Retry-After", "1");
      return send_error(res,
                        ApiError(503,
                                 "the server is busy: " + std::to_string(options.max_requests) +
                                     " requests are in flight (--max-requests); retry later",
                                 "server_error", "", "server_busy"));
    }
    auto running = std::make_shared<Running>();
    running->slot = std::make_unique<Slot>(active);
    running->endpoint = endpoint;
    running->include_usage = parsed.include_usage;
    running->logprobs = parsed.top_logprobs >= 0;
    running->header.id =
        std::string(endpoint == Endpoint::ChatCompletions ? "chatcmpl-" : "cmpl-") +
        std::to_string(started) + "-" + std::to_string(next_id.fetch_add(1));
    running->header.created = std::chrono::duration_cast<std::chrono::seconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
                                  .count();
    running->header.model = options.model_id;
    running->deadline = Clock::now() + std::chrono::seconds(options.request_timeout_s);
    if (!parsed.seeded) {
      std::lock_guard lock(seed_mutex);
      parsed.sampling.seed = seed_source();
    }

    const bool stream_reply = parsed.stream;
    try {
      submit(*running, std::move(parsed));
    } catch (const ApiError& e) {
      rejected.fetch_add(1);
      return send_error(res, e);
    }
    total.fetch_add(1);
    running->socket = find_connection_socket(req);
    running->stream = stream_reply;
    list(running);

    if (stream_reply) {
      stream(running, res);
    } else {
      respond_whole(*running, res);
    }
  }

  // On the engine thread: build the engine's Request around the channel and submit it.
  void submit(Running& running, ParsedRequest parsed) {
    const Endpoint endpoint = parsed.endpoint;
    std::shared_ptr<Channel> channel = running.channel;
    struct Submitted {
      SequenceId id;
      int64_t prompt_tokens;
    };
    const char* param = endpoint == Endpoint::ChatCompletions ? "messages" : "prompt";
    channel->submitted = std::chrono::steady_clock::now();
    try {
      const Submitted submitted = engine.call([&, channel](Engine& e) -> Submitted {
        Request request;
        request.sampling = parsed.sampling;
        request.constraint = parsed.constraint;
        std::shared_ptr<ReasoningParser> parser;      // used on the engine thread only
        std::shared_ptr<ToolCallParser> tool_parser;  // the same
        ReasoningFormat tmpl_format = ReasoningFormat::None;
        int64_t prompt_tokens = 0;
        const Tokenizer& tokenizer = e.tokenizer();
        if (endpoint == Endpoint::Completions) {
          // As `granule-cli run --raw`: the vocabulary's BOS habit, control tokens parsed.
          if (!parsed.prompt_token_ids.empty()) {
            for (const int32_t id : parsed.prompt_token_ids) {
              if (static_cast<size_t>(id) >= tokenizer.vocab_size())
                throw UsageError("token id " + std::to_string(id) +
                                 " is outside the vocabulary of " +
                                 std::to_string(tokenizer.vocab_size()) + " tokens");
            }
            request.prompt_tokens = std::move(parsed.prompt_token_ids);
          } else {
            request.prompt_tokens = tokenizer.encode(parsed.prompt, tokenizer.add_bos_by_default(),
                                                     /*parse_special=*/true);
          }
          prompt_tokens = static_cast<int64_t>(request.prompt_tokens->size());
        } else {
          const ChatTemplate* tmpl = e.chat_template();
          if (tmpl == nullptr) {
            throw UnsupportedError(
                "the model has no chat template the engine recognises: use /v1/completions, "
                "or start the server with --template NAME");
          }
          if (parsed.tool_choice == ToolChoice::None) {
            parsed.chat_options.tools_json.clear();  // the model is not to call them
          } else {
            const ToolCallFormat format = tool_call_format(*tmpl);
            const bool forced_call = parsed.tool_choice == ToolChoice::Required ||
                                     parsed.tool_choice == ToolChoice::Named;
            std::optional<std::string> harmony_call;  // the function a forced header names
            if (forced_call && format == ToolCallFormat::Harmony) {
              // The call's header is control tokens: forced after the generation prompt, the
              // constraint covering the arguments (and, for any of several tools, the name and
              // the header's last markers).
              std::optional<HarmonyForcedCall> forced =
                  harmony_forced_call(parsed.tools, parsed.tool_name);
              if (!forced && parsed.tool_choice == ToolChoice::Required) {
                const auto control = [&tokenizer](std::string_view text) {
                  const std::optional<TokenId> id = tokenizer.find_token(text);
                  return id && tokenizer.token_attr(*id) == TokenAttr::Control
                             ? std::optional<int32_t>(*id)
                             : std::nullopt;
                };
                forced = harmony_required_call(parsed.tools, control("<|constrain|>"),
                                               control("<|message|>"));
              }
              if (!forced)
                throw ApiError(400, "tool_choice names no function of 'tools'",
                               "invalid_request_error", "tool_choice");
              request.constraint = std::move(forced->constraint);
              parsed.chat_options.reply_prefix = std::move(forced->header);
              harmony_call = std::move(forced->name);
            } else if (forced_call) {
              std::optional<Constraint> forced = tool_call_constraint(
                  format, parsed.tools, parsed.tool_name, parsed.parallel_tool_calls);
              if (!forced)
                throw ApiError(400,
                               std::string("tool_choice required or a named function is not "
                                           "supported for this model's tool-call format (") +
                                   tool_call_format_name(format) + "): use auto",
                               "invalid_request_error", "tool_choice");
              request.constraint = std::move(*forced);
            }
            tool_parser = std::make_shared<ToolCallParser>(format, "call_" + running.header.id);
            if (harmony_call) tool_parser->begin_call(std::move(*harmony_call));
          }
          // Counted as Engine::submit encodes it: BOS written by the template, control
          // tokens parsed.
          const std::string bos_text =
              tokenizer.bos() ? tokenizer.token_text(*tokenizer.bos()) : "";
          const std::string prompt = tmpl->render(parsed.messages, /*add_generation_prompt=*/true,
                                                  bos_text, parsed.chat_options) +
                                     parsed.chat_options.reply_prefix;
          prompt_tokens = static_cast<int64_t>(tokenizer.encode(prompt, false, true).size());
          request.messages = std::move(parsed.messages);
          request.chat_options = parsed.chat_options;
          // The reply's reasoning (<think>, harmony's analysis) goes to reasoning_content.
          tmpl_format = tmpl->reasoning_format();
          if (tmpl_format != ReasoningFormat::None)
            parser = std::make_shared<ReasoningParser>(tmpl_format);
          // The template's end-of-turn markers end the reply, beside the client's stops.
          for (const std::string& stop : tmpl->stop_strings())
            request.sampling.stop_strings.push_back(stop);
        }
        // The answer's text goes through the tool-call parser when tools may be called.
        const auto take_content = [tool_parser](Channel& c, const std::string& content,
                                                bool at_end) {
          if (!tool_parser) {
            c.text += content;
            return;
          }
          ToolCallParser::Delta d = tool_parser->push(content);
          if (at_end) {
            ToolCallParser::Delta rest = tool_parser->finish();
            d.content += rest.content;
            for (ToolCallPiece& call : rest.calls) d.calls.push_back(std::move(call));
          }
          c.text += d.content;
          for (ToolCallPiece& call : d.calls) {
            c.tool_call_count += !call.id.empty();
            c.tool_calls.push_back(std::move(call));
          }
        };
        // Harmony: calls are whole messages, taken from the raw reply before the ReasoningParser
        // splits the rest into reasoning and answer.
        const bool harmony_calls = tool_parser && parser && tmpl_format == ReasoningFormat::Harmony;
        const auto take_harmony = [tool_parser, parser](Channel& c, const std::string& text,
                                                        bool at_end) {
          ToolCallParser::Delta d = tool_parser->push(text);
          if (at_end) {
            ToolCallParser::Delta rest = tool_parser->finish();
            d.content += rest.content;
            for (ToolCallPiece& call : rest.calls) d.calls.push_back(std::move(call));
          }
          ReasoningDelta delta = parser->push(d.content);
          if (at_end) {
            ReasoningDelta rest = parser->finish();
            delta.reasoning += rest.reasoning;
            delta.content += rest.content;
          }
          c.text += delta.content;
          c.reasoning += delta.reasoning;
          for (ToolCallPiece& call : d.calls) {
            c.tool_call_count += !call.id.empty();
            c.tool_calls.push_back(std::move(call));
          }
        };
        request.sink.on_token = [channel, parser, take_content, take_harmony, harmony_calls,
                                 counted = completion_tokens](SequenceId, const std::string& text,
                                                              int32_t token) {
          if (token != kNoToken) counted->fetch_add(1, std::memory_order_relaxed);
          {
            std::lock_guard lock(channel->mutex);
            if (harmony_calls) {
              take_harmony(*channel, text, false);
            } else if (parser) {
              ReasoningDelta delta = parser->push(text);
              take_content(*channel, delta.content, false);
              channel->reasoning += delta.reasoning;
            } else {
              take_content(*channel, text, false);
            }
            if (token != kNoToken) {
              channel->last_token = std::chrono::steady_clock::now();
              if (channel->completion_tokens++ == 0) channel->first_token = channel->last_token;
            }
          }
          channel->changed.notify_all();
        };
        request.sink.on_prompt = [channel, parser](SequenceId, const PromptInfo& info) {
          std::lock_guard lock(channel->mutex);
          channel->cached_tokens = info.reused_tokens;
          // Before the first token: the template opened <think>, the reply starts inside it.
          if (parser && info.reasoning_opened)
            *parser = ReasoningParser(ReasoningFormat::Think, /*starts_in_reasoning=*/true);
        };
        request.top_logprobs = parsed.top_logprobs;
        if (parsed.top_logprobs >= 0) {
          request.sink.on_logprobs = [channel](SequenceId, const TokenLogprobs& lp) {
            std::lock_guard lock(channel->mutex);
            channel->logprobs.push_back(lp);
          };
        }
        request.sink.on_finish = [channel, parser, take_content, take_harmony, harmony_calls](
                                     SequenceId, FinishReason reason, const std::string& error) {
          {
            std::lock_guard lock(channel->mutex);
            if (harmony_calls) {
              take_harmony(*channel, "", true);
            } else if (parser) {
              ReasoningDelta delta = parser->finish();
              take_content(*channel, delta.content, true);
              channel->reasoning += delta.reasoning;
            } else {
              take_content(*channel, "", true);
            }
            channel->finished = true;
            channel->reason = reason;
            channel->error = error;
          }
          channel->changed.notify_all();
        };
        const SequenceId id = e.submit(std::move(request));
        return {id, prompt_tokens};
      });
      running.id = submitted.id;
      running.usage.prompt_tokens = submitted.prompt_tokens;
    } catch (const ApiError&) {
      throw;
    } catch (const std::exception& e) {
      throw api_error_from(e, param);
    }
  }

  void cancel(Running& running) {
    if (running.cancel_sent) return;
    running.cancel_sent = true;
    engine.post([id = running.id](Engine& e) { e.cancel(id); });
  }

  // Waits up to `wait` for news on the channel; then reports whether the request must end
  // early: the client left (cancelled) or the deadline passed (cancelled, timed_out).
  enum class Wait { Going, Finished, ClientGone, TimedOut };
  Wait wait_for_news(Running& running, std::chrono::milliseconds wait, std::string& text_out,
                     std::string& reasoning_out, std::vector<TokenLogprobs>& logprobs_out) {
    Channel& channel = *running.channel;
    {
      std::unique_lock lock(channel.mutex);
      channel.changed.wait_for(lock, wait, [&] {
        return channel.finished || !channel.text.empty() || !channel.reasoning.empty() ||
               !channel.tool_calls.empty() || stopping.load();
      });
      text_out.swap(channel.text);
      channel.text.clear();
      reasoning_out.swap(channel.reasoning);
      channel.reasoning.clear();
      logprobs_out.insert(logprobs_out.end(), std::make_move_iterator(channel.logprobs.begin()),
                          std::make_move_iterator(channel.logprobs.end()));
      channel.logprobs.clear();
      for (ToolCallPiece& call : channel.tool_calls) running.new_calls.push_back(std::move(call));
      channel.tool_calls.clear();
      running.usage.completion_tokens = channel.completion_tokens;
      running.usage.cached_tokens = channel.cached_tokens;
      if (channel.completion_tokens > 0) {
        using Ms = std::chrono::duration<double, std::milli>;
        running.usage.prompt_ms = Ms(channel.first_token - channel.submitted).count();
        running.usage.predicted_ms = Ms(channel.last_token - channel.first_token).count();
      }
      if (channel.finished) {
        log_finished(running);
        return Wait::Finished;
      }
    }
    if (peer_closed(running.socket) || stopping.load()) {
      cancel(running);
      return Wait::ClientGone;
    }
    if (Clock::now() > running.deadline) {
      cancel(running);
      return Wait::TimedOut;
    }
    return Wait::Going;
  }

  // One info line per finished request, as llama-server prints its timings.
  static void log_finished(const Running& r) {
    const Usage& u = r.usage;
    const double rate = u.completion_tokens > 1 && u.predicted_ms > 0
                            ? static_cast<double>(u.completion_tokens - 1) * 1000.0 / u.predicted_ms
                            : 0.0;
    granule::logger("server")->info(
        "{}: {} prompt tokens ({} cached), first token after {:.0f} ms; {} tokens in {:.0f} ms "
        "({:.1f} t/s), {}",
        r.header.id, u.prompt_tokens, u.cached_tokens, std::max(u.prompt_ms, 0.0),
        u.completion_tokens, std::max(u.predicted_ms, 0.0), rate,
        finish_reason_name(r.channel->reason));
  }

  static ApiError stopping_error() {
    return ApiError(503, "the server is shutting down; the request was cancelled", "server_error",
                    "", "shutting_down");
  }

  ApiError finish_error(const Channel& channel) const {
    if (channel.reason == FinishReason::Error) {
      return ApiError(500, channel.error.empty() ? "the engine failed" : channel.error,
                      "server_error");
    }
    return ApiError(500, "the request was cancelled", "server_error", "", "cancelled");
  }

  void respond_whole(Running& running, httplib::Response& res) {
    std::string text, piece, reasoning, reasoning_piece;
    std::vector<TokenLogprobs> logprobs;
    for (;;) {
      const Wait state =
          wait_for_news(running, std::chrono::milliseconds(100), piece, reasoning_piece, logprobs);
      text += piece;
      reasoning += reasoning_piece;
      if (state == Wait::Finished) break;
      if (state == Wait::ClientGone) {
        if (stopping) return send_error(res, stopping_error());
        granule::logger("server")->info("{}: the client left; cancelled", running.header.id);
        res.status = 499;  // nobody reads it
        return;
      }
      if (state == Wait::TimedOut) {
        return send_error(res, ApiError(503,
                                        "the request ran past the server's time limit of " +
                                            std::to_string(options.request_timeout_s) + " s",
                                        "server_error", "", "timeout"));
      }
    }
    const Channel& channel = *running.channel;
    std::string finish = openai_finish_reason(channel.reason);
    if (finish.empty()) return send_error(res, finish_error(channel));
    std::vector<ToolCall> calls;
    add_tool_call_pieces(calls, running.new_calls);
    if (!calls.empty() && finish == "stop") finish = "tool_calls";
    json response = completion_json(running.endpoint, running.header, text, finish, running.usage,
                                    reasoning, calls);
    if (running.logprobs)
      response["choices"][0]["logprobs"] = logprobs_json(running.endpoint, logprobs);
    res.set_content(dump(response), "application/json");
  }

  void stream(const std::shared_ptr<Running>& running, httplib::Response& res) {
    res.set_header("Cache-Control", "no-cache");
    auto started_stream = std::make_shared<bool>(false);
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, running, started_stream](size_t, httplib::DataSink& sink) {
          Running& r = *running;
          if (!*started_stream) {
            *started_stream = true;
            // Chat streams open with the assistant's role, as OpenAI's do.
            if (r.endpoint == Endpoint::ChatCompletions) {
              const std::string first = sse_event(chunk_json(r.endpoint, r.header, "", "", true));
              if (!sink.write(first.data(), first.size())) {
                cancel(r);
                return false;
              }
            }
          }
          std::string piece, reasoning;
          std::vector<TokenLogprobs> logprobs;
          const Wait state =
              wait_for_news(r, std::chrono::milliseconds(100), piece, reasoning, logprobs);
          std::string out;
          if (!piece.empty() || !reasoning.empty() || (r.logprobs && !logprobs.empty())) {
            json chunk = chunk_json(r.endpoint, r.header, piece, "", false, reasoning);
            if (r.logprobs && !logprobs.empty()) {
              chunk["choices"][0]["logprobs"] =
                  logprobs_json(r.endpoint, logprobs, r.logprob_offset);
              for (const TokenLogprobs& lp : logprobs)
                r.logprob_offset += static_cast<int64_t>(lp.chosen.piece.size());
            }
            out += sse_event(chunk);
          }
          for (const ToolCallPiece& call : r.new_calls) {
            r.calls_sent += !call.id.empty();
            out += sse_event(tool_call_chunk_json(r.header, call));
          }
          r.new_calls.clear();
          if (state == Wait::ClientGone && stopping) {
            out += sse_event(error_json(stopping_error())) + "data: [DONE]\n\n";
            sink.write(out.data(), out.size());
            sink.done();
            return true;
          }
          if (state == Wait::ClientGone) {
            granule::logger("server")->info("{}: the client left; cancelled", r.header.id);
            return false;
          }
          if (state == Wait::TimedOut) {
            out +=
                sse_event(error_json(ApiError(503, "the request ran past the server's time limit",
                                              "server_error", "", "timeout")));
            out += "data: [DONE]\n\n";
          } else if (state == Wait::Finished) {
            std::string finish = openai_finish_reason(r.channel->reason);
            if (r.calls_sent > 0 && finish == "stop") finish = "tool_calls";
            if (finish.empty()) {
              out += sse_event(error_json(finish_error(*r.channel)));
            } else {
              json last = chunk_json(r.endpoint, r.header, "", finish);
              last["usage"] = usage_json(r.usage);  // usage in every response, streamed too
              if (r.usage.prompt_ms >= 0) last["timings"] = timings_json(r.usage);
              out += sse_event(last);
              if (r.include_usage)
                out += sse_event(usage_chunk_json(r.endpoint, r.header, r.usage));
            }
            out += "data: [DONE]\n\n";
          }
          if (!out.empty() && !sink.write(out.data(), out.size())) {
            cancel(r);
            return false;
          }
          if (state != Wait::Going) sink.done();
          return true;
        },
        [this, running](bool) {
          // Ended, written out or broken: a sequence still running has nobody to read it.
          bool finished;
          {
            std::lock_guard lock(running->channel->mutex);
            finished = running->channel->finished;
          }
          if (!finished) cancel(*running);
          running->slot.reset();
        });
  }
};

OpenAiServer::OpenAiServer(EngineExecutor& engine, ServerOptions options)
    : impl_(std::make_unique<Impl>(engine, std::move(options))) {}

OpenAiServer::~OpenAiServer() { stop(); }

int OpenAiServer::bind() {
  const ServerOptions& o = impl_->options;
  int port = o.port;
  if (port == 0) {
    port = impl_->http.bind_to_any_port(o.host);
    if (port < 0) throw Error("cannot listen on " + o.host + ": no free port");
  } else if (!impl_->http.bind_to_port(o.host, port)) {
    throw Error("cannot listen on " + o.host + ":" + std::to_string(port) +
                ": the address is in use or not this machine's (try another --port or --host)");
  }
  return port;
}

bool OpenAiServer::listen() { return impl_->http.listen_after_bind(); }

bool OpenAiServer::listening() const { return impl_->http.is_running(); }

std::vector<ServedRequest> OpenAiServer::requests() const { return impl_->requests(); }

uint64_t OpenAiServer::generated_tokens() const { return impl_->completion_tokens->load(); }

void OpenAiServer::stop() {
  impl_->stopping = true;
  // The requests in flight end now, each with the shutdown error: wake them and give them a
  // moment to send it, since httplib stops calling a stream's provider once it shuts down
  // (the client would see the stream cut off instead). A stalled client does not hold this
  // up for more than half a second.
  impl_->wake_all();
  const auto deadline = Clock::now() + std::chrono::milliseconds(500);
  while (impl_->active.load() > 0 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  impl_->http.stop();
}

}  // namespace granule::server
