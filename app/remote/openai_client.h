// The client of one OpenAI-compatible endpoint (vLLM, SGLang, llama-server, a Granule server):
// its models from /v1/models, a chat completion streamed from /v1/chat/completions, and its
// Prometheus /metrics text. Every failure comes back as a Fault with a one-line message, never
// as an exception, so a caller keeps whatever part of an answer arrived.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace granule::remote {

struct Endpoint {
  std::string base_url;  // "http://host:8000" or "http://host:8000/v1"; the /v1 is added if absent
  std::string api_key;   // "" sends no Authorization header
  int32_t connect_timeout_seconds = 10;
  // A stream that sends nothing (not even a keep-alive) for this long is a stall.
  int32_t stall_timeout_seconds = 60;
};

// What went wrong with a request, in the classes a user acts on differently.
enum class FaultKind {
  None,
  Unreachable,   // no connection (refused, DNS, TLS, connect timeout)
  Unauthorized,  // 401 or 403: the API key
  RateLimited,   // 429: retry later (retry_after_seconds when the server said)
  ServerError,   // 5xx
  Rejected,      // another 4xx: the request itself (an unknown model, a bad setting)
  StreamCut,     // the connection ended before the answer did
  Stalled,       // nothing arrived for stall_timeout_seconds
  Protocol,      // an answer that is not the OpenAI format
};

struct Fault {
  FaultKind kind = FaultKind::None;
  long http_status = 0;
  std::optional<int32_t> retry_after_seconds;
  std::string message;  // one line: "429 Too Many Requests: rate limited (retry after 2 s)"
  explicit operator bool() const { return kind != FaultKind::None; }
  // Whether sending the same request again may work (not for 401 or a rejected request).
  bool retryable() const;
};

const char* fault_kind_name(FaultKind kind);  // "unreachable", "unauthorized", …

struct RemoteModel {
  std::string id;
  std::string owned_by;                   // "vllm", "llamacpp", "sglang", "granule", …
  std::optional<int64_t> context_tokens;  // max_model_len (vLLM), meta.n_ctx_train (llama-server)
};

struct ModelList {
  std::vector<RemoteModel> models;
  Fault fault;
};

// The server program behind an endpoint, as /v1/models' owned_by names it; it decides how the
// sampling settings outside the OpenAI API are sent.
enum class ServerKind { Unknown, Vllm, Sglang, LlamaServer, Granule };
ServerKind server_kind(std::string_view owned_by);
const char* server_kind_name(ServerKind kind);

struct RemoteMessage {
  std::string role;     // "system", "user", "assistant"
  std::string content;  // sent exactly as stored, so the server's prefix cache hits
};

// Unset values are not sent (the server's defaults apply).
struct RemoteSampling {
  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<int32_t> top_k;
  std::optional<float> min_p;
  std::optional<float> repeat_penalty;
  std::optional<uint64_t> seed;
  std::optional<int32_t> max_tokens;
  std::vector<std::string> stop;
};

struct ChatRequest {
  std::string model;
  std::vector<RemoteMessage> messages;
  RemoteSampling sampling;
  ServerKind server = ServerKind::Unknown;
};

// The request's JSON body, and a line for each setting the server would not understand and
// that was therefore left out ("top_k is not part of the OpenAI API: not sent").
struct RequestBody {
  std::string json;
  std::vector<std::string> not_sent;
};
RequestBody chat_request_body(const ChatRequest& request);

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_prompt_tokens = -1;  // -1: the server did not say
};

struct StreamCallbacks {
  std::function<void(std::string_view)> on_content;
  std::function<void(std::string_view)> on_reasoning;  // delta.reasoning_content (or .reasoning)
};

struct ChatResult {
  std::string content;
  std::string reasoning;
  std::string finish_reason;  // "stop", "length", …; "" when the answer did not end
  std::optional<Usage> usage;
  bool cancelled = false;  // `cancel` was set: a stop, not a fault
  Fault fault;
  double first_token_seconds = 0;  // from sending to the first content or reasoning delta
  double total_seconds = 0;
};

class OpenAiClient {
 public:
  explicit OpenAiClient(Endpoint endpoint);
  const Endpoint& endpoint() const { return endpoint_; }
  // "http://host:8000/v1"
  std::string api_base() const;
  // "http://host:8000" (the /metrics path lives beside /v1, not under it)
  std::string server_root() const;

  ModelList list_models() const;
  // Streams one completion; `cancel`, when given, is polled while it runs.
  ChatResult stream_chat(const ChatRequest& request, const StreamCallbacks& callbacks,
                         const std::atomic<bool>* cancel = nullptr) const;
  // The Prometheus text of GET /metrics; a fault when the server has none (404) or fails.
  struct MetricsText {
    std::string text;
    Fault fault;
  };
  MetricsText fetch_metrics() const;

 private:
  Endpoint endpoint_;
};

// The fault for an HTTP error status and its body (the OpenAI error object's message when the
// body holds one). Exposed for the tests.
Fault http_fault(long status, std::string_view body, std::optional<int32_t> retry_after);

}  // namespace granule::remote
