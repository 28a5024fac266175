// The client of one OpenAI-compatible endpoint (vLLM, SGLang, llama-server, a Granule server):
// its models from /v1/models, a chat completion streamed from /v1/chat/completions, and its
// Prometheus /metrics text. Every failure comes back as a Fault with a one-line message, never
// as an exception, so a caller keeps whatever part of an answer arrived.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
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
  std::string role;                  // "system", "user", "assistant", "tool"
  std::string content;               // sent exactly as stored, so the server's prefix cache hits
  std::string tool_calls_json = {};  // an assistant message's calls: OpenAI's tool_calls array
  std::string tool_call_id = {};     // a tool message: the call it answers
  std::string name = {};             // a tool message: the tool's name
};

// A tool call the server parsed from its model's reply (OpenAI's tool_calls).
struct RemoteToolCall {
  std::string id;  // "" when the server gave none
  std::string name;
  std::string arguments;  // a JSON object's text, as the server sent it
};

// What the reply must be (OpenAI's response_format).
enum class ResponseFormat { Text, JsonObject, JsonSchema };

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
  // Tools the model may call: OpenAI's tools array ("" none). tool_choice: "" the server's
  // default (auto), "none", "auto", "required", or the name of the one function to call.
  std::string tools_json;
  std::string tool_choice;
  ResponseFormat response_format = ResponseFormat::Text;
  std::string json_schema;  // ResponseFormat::JsonSchema: the schema's text
  // The reasoning setting: enable_thinking goes to the server's chat template
  // (chat_template_kwargs, which vLLM, SGLang, llama-server and Granule take); reasoning_effort
  // is OpenAI's ("low", "medium", "high"; "" not sent).
  std::optional<bool> enable_thinking;
  std::string reasoning_effort;
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
  // Calls reassembled from the stream's tool_calls fragments, in the order of their index; only
  // a stream that ended cleanly has them (a call cut mid-way is not one).
  std::vector<RemoteToolCall> tool_calls;
  std::string finish_reason;  // "stop", "length", …; "" when the answer did not end
  std::optional<Usage> usage;
  bool cancelled = false;  // `cancel` was set: a stop, not a fault
  Fault fault;
  double first_token_seconds = 0;  // from sending to the first content or reasoning delta
  double total_seconds = 0;
};

class SseStream;

// Reads a streamed chat completion (the SSE bytes of /v1/chat/completions) into a ChatResult:
// content and reasoning deltas go to the callbacks as they come; tool calls are put together
// from their fragments (index, id, function.name, function.arguments pieces) and land in the
// result at finish(). OpenAiClient::stream_chat feeds it; exposed for the tests (canned SSE).
class ChatStreamReader {
 public:
  explicit ChatStreamReader(StreamCallbacks callbacks);
  ~ChatStreamReader();
  ChatStreamReader(const ChatStreamReader&) = delete;
  ChatStreamReader& operator=(const ChatStreamReader&) = delete;

  void feed(std::string_view bytes);
  // The end of the bytes: the calls go into the result (unless the stream held a fault).
  void finish();
  // "data: [DONE]" arrived.
  bool done() const { return done_; }
  // Not the OpenAI format, or an error reported inside the stream; None otherwise.
  const Fault& fault() const { return fault_; }
  ChatResult& result() { return result_; }

 private:
  struct PartialCall {
    std::string id;
    std::string name;
    std::string arguments;
  };
  void on_event(std::string_view data);
  void on_delta_text(const std::string& text, bool reasoning);

  StreamCallbacks callbacks_;
  ChatResult result_;
  Fault fault_;
  bool done_ = false;
  bool got_delta_ = false;
  double started_ = 0;  // steady-clock seconds at construction, for first_token_seconds
  std::vector<std::pair<int64_t, PartialCall>> calls_;  // by index, in order of arrival
  std::unique_ptr<SseStream> sse_;
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
