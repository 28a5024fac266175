// libcurl transfers for the OpenAI API: one easy handle per request, the stream read through
// SseStream as it arrives, faults classified from curl's result and the HTTP status.
#include "remote/openai_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>

#include "remote/sse_stream.h"

namespace granule::remote {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

std::string one_line(std::string text, size_t limit = 300) {
  for (char& c : text) {
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  }
  while (!text.empty() && text.back() == ' ') text.pop_back();
  if (text.size() > limit) text = text.substr(0, limit) + "…";
  return text;
}

std::string trim_slashes(std::string url) {
  while (!url.empty() && url.back() == '/') url.pop_back();
  return url;
}

bool ends_with(const std::string& text, std::string_view tail) {
  return text.size() >= tail.size() &&
         text.compare(text.size() - tail.size(), tail.size(), tail) == 0;
}

const char* reason_phrase(long status) {
  switch (status) {
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 408:
      return "Request Timeout";
    case 413:
      return "Payload Too Large";
    case 422:
      return "Unprocessable Entity";
    case 429:
      return "Too Many Requests";
    case 500:
      return "Internal Server Error";
    case 502:
      return "Bad Gateway";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    default:
      return "";
  }
}

// One transfer's state, shared with curl's callbacks.
struct Transfer {
  long status = 0;
  std::optional<int32_t> retry_after;
  std::string error_body;                        // a non-2xx body, for its message
  std::string body;                              // a 2xx body when not streamed
  std::function<void(std::string_view)> stream;  // a 2xx body as it arrives, when set
  const std::atomic<bool>* cancel = nullptr;
  bool cancelled = false;
};

size_t on_header(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const std::string_view line(data, size * count);
  if (line.rfind("HTTP/", 0) == 0) {
    const size_t space = line.find(' ');
    if (space != std::string_view::npos)
      t->status = std::atol(std::string(line.substr(space + 1, 3)).c_str());
    t->retry_after.reset();
  } else if (line.size() > 12) {
    std::string name(line.substr(0, 12));
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (name == "retry-after:") {
      const int value = std::atoi(std::string(line.substr(12)).c_str());
      if (value > 0) t->retry_after = value;
    }
  }
  return size * count;
}

size_t on_body(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const std::string_view bytes(data, size * count);
  if (t->status < 200 || t->status >= 300) {
    if (t->error_body.size() < 64 * 1024) t->error_body.append(bytes);
  } else if (t->stream) {
    t->stream(bytes);
  } else {
    t->body.append(bytes);
  }
  return size * count;
}

int on_progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* t = static_cast<Transfer*>(user);
  if (t->cancel != nullptr && t->cancel->load()) {
    t->cancelled = true;
    return 1;  // aborts the transfer (CURLE_ABORTED_BY_CALLBACK)
  }
  return 0;
}

struct CurlHandle {
  CURL* curl = curl_easy_init();
  curl_slist* headers = nullptr;
  ~CurlHandle() {
    curl_slist_free_all(headers);
    if (curl != nullptr) curl_easy_cleanup(curl);
  }
};

// Performs GET (post_body null) or POST of JSON; returns curl's result with the transfer filled.
CURLcode perform(const Endpoint& endpoint, const std::string& url, const std::string* post_body,
                 bool event_stream, Transfer& t, int32_t stall_seconds) {
  global_init();
  CurlHandle h;
  if (h.curl == nullptr) return CURLE_FAILED_INIT;
  curl_easy_setopt(h.curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h.curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h.curl, CURLOPT_CONNECTTIMEOUT,
                   static_cast<long>(endpoint.connect_timeout_seconds));
  // A stall: under one byte a second for stall_seconds. A keep-alive comment resets it.
  curl_easy_setopt(h.curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(h.curl, CURLOPT_LOW_SPEED_TIME, static_cast<long>(stall_seconds));
  curl_easy_setopt(h.curl, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(h.curl, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(h.curl, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h.curl, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(h.curl, CURLOPT_XFERINFOFUNCTION, on_progress);
  curl_easy_setopt(h.curl, CURLOPT_XFERINFODATA, &t);
  curl_easy_setopt(h.curl, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(h.curl, CURLOPT_USERAGENT, "granule");
  if (!endpoint.api_key.empty()) {
    h.headers = curl_slist_append(h.headers, ("Authorization: Bearer " + endpoint.api_key).c_str());
  }
  if (post_body != nullptr) {
    h.headers = curl_slist_append(h.headers, "Content-Type: application/json");
    curl_easy_setopt(h.curl, CURLOPT_POSTFIELDS, post_body->c_str());
    curl_easy_setopt(h.curl, CURLOPT_POSTFIELDSIZE_LARGE,
                     static_cast<curl_off_t>(post_body->size()));
  }
  if (event_stream) h.headers = curl_slist_append(h.headers, "Accept: text/event-stream");
  curl_easy_setopt(h.curl, CURLOPT_HTTPHEADER, h.headers);
  return curl_easy_perform(h.curl);
}

// A transport failure (no HTTP error status) as a fault; None for success or a cancel.
Fault transport_fault(CURLcode code, const Transfer& t, bool got_response, int32_t stall_seconds,
                      const std::string& url) {
  Fault f;
  if (code == CURLE_OK || t.cancelled) return f;
  const std::string what = curl_easy_strerror(code);
  if (code == CURLE_OPERATION_TIMEDOUT && got_response) {
    f.kind = FaultKind::Stalled;
    f.message = "the server sent nothing for " + std::to_string(stall_seconds) + " s: stalled";
  } else if (!got_response) {
    f.kind = FaultKind::Unreachable;
    f.message = "cannot reach " + url + ": " + what;
  } else {
    f.kind = FaultKind::StreamCut;
    f.message = "the connection ended before the answer did: " + what;
  }
  return f;
}

std::optional<int64_t> context_of(const json& model) {
  for (const char* key : {"max_model_len", "context_length", "max_context_length"}) {
    if (model.contains(key) && model[key].is_number_integer()) return model[key].get<int64_t>();
  }
  if (model.contains("meta") && model["meta"].is_object()) {
    const json& meta = model["meta"];
    for (const char* key : {"n_ctx", "n_ctx_train"}) {
      if (meta.contains(key) && meta[key].is_number_integer()) return meta[key].get<int64_t>();
    }
  }
  return std::nullopt;
}

}  // namespace

bool Fault::retryable() const {
  switch (kind) {
    case FaultKind::Unreachable:
    case FaultKind::RateLimited:
    case FaultKind::ServerError:
    case FaultKind::StreamCut:
    case FaultKind::Stalled:
      return true;
    default:
      return false;
  }
}

ServerKind server_kind(std::string_view owned_by) {
  if (owned_by == "vllm") return ServerKind::Vllm;
  if (owned_by == "sglang") return ServerKind::Sglang;
  if (owned_by == "llamacpp") return ServerKind::LlamaServer;
  if (owned_by == "granule") return ServerKind::Granule;
  return ServerKind::Unknown;
}

const char* server_kind_name(ServerKind kind) {
  switch (kind) {
    case ServerKind::Vllm:
      return "vLLM";
    case ServerKind::Sglang:
      return "SGLang";
    case ServerKind::LlamaServer:
      return "llama-server";
    case ServerKind::Granule:
      return "Granule";
    case ServerKind::Unknown:
      return "an OpenAI-compatible server";
  }
  return "?";
}

Fault http_fault(long status, std::string_view body, std::optional<int32_t> retry_after) {
  Fault f;
  f.http_status = status;
  f.retry_after_seconds = retry_after;
  if (status == 401 || status == 403) {
    f.kind = FaultKind::Unauthorized;
  } else if (status == 429) {
    f.kind = FaultKind::RateLimited;
  } else if (status >= 500) {
    f.kind = FaultKind::ServerError;
  } else {
    f.kind = FaultKind::Rejected;
  }
  std::string detail;
  const json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_object() && parsed.contains("error")) {
    const json& e = parsed["error"];
    if (e.is_object() && e.contains("message") && e["message"].is_string()) {
      detail = e["message"].get<std::string>();
    } else if (e.is_string()) {
      detail = e.get<std::string>();
    }
  } else if (parsed.is_object() && parsed.contains("detail") && parsed["detail"].is_string()) {
    detail = parsed["detail"].get<std::string>();  // FastAPI's errors (vLLM, SGLang)
  } else {
    detail = std::string(body);
  }
  std::string message = std::to_string(status);
  if (*reason_phrase(status) != '\0') message += std::string(" ") + reason_phrase(status);
  if (f.kind == FaultKind::Unauthorized) message += ": the endpoint refused the API key";
  if (f.kind == FaultKind::RateLimited) {
    message += ": rate limited";
    if (retry_after) message += " (retry after " + std::to_string(*retry_after) + " s)";
  }
  detail = one_line(detail);
  if (!detail.empty()) message += ": " + detail;
  f.message = message;
  return f;
}

RequestBody chat_request_body(const ChatRequest& request) {
  // Ordered: a schema's properties keep the order they were written in (the order a
  // constrained reply writes them), and the body is the same bytes every turn.
  using ojson = nlohmann::ordered_json;
  RequestBody out;
  ojson body;
  body["model"] = request.model;
  ojson messages = ojson::array();
  for (const RemoteMessage& m : request.messages) {
    ojson message = {{"role", m.role}, {"content", m.content}};
    if (!m.tool_calls_json.empty()) {
      ojson calls = ojson::parse(m.tool_calls_json, nullptr, false);
      if (calls.is_array() && !calls.empty()) {
        message["tool_calls"] = std::move(calls);
        // As OpenAI writes it: a reply that only called tools has null content.
        if (m.content.empty()) message["content"] = nullptr;
      }
    }
    if (!m.tool_call_id.empty()) message["tool_call_id"] = m.tool_call_id;
    if (!m.name.empty() && m.role == "tool") message["name"] = m.name;
    messages.push_back(std::move(message));
  }
  body["messages"] = std::move(messages);
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  if (!request.tools_json.empty()) {
    ojson tools = ojson::parse(request.tools_json, nullptr, false);
    if (tools.is_array() && !tools.empty()) {
      const std::string& choice = request.tool_choice;
      const bool named =
          !choice.empty() && choice != "none" && choice != "auto" && choice != "required";
      if (named && request.server == ServerKind::LlamaServer) {
        // llama-server takes tool_choice as a string only (an object falls back to auto): a
        // call to one named function is a required call among that function alone.
        ojson only = ojson::array();
        for (const ojson& tool : tools)
          if (tool.is_object() && tool.contains("function") && tool["function"].is_object() &&
              tool["function"].value("name", std::string()) == choice)
            only.push_back(tool);
        if (!only.empty()) tools = std::move(only);
        body["tools"] = std::move(tools);
        body["tool_choice"] = "required";
      } else {
        body["tools"] = std::move(tools);
        if (named) {
          body["tool_choice"] = {{"type", "function"}, {"function", {{"name", choice}}}};
        } else if (!choice.empty()) {
          body["tool_choice"] = choice;
        }
      }
      // A forced call is one call, as the local engine's constraint makes it.
      if (!choice.empty() && choice != "none" && choice != "auto")
        body["parallel_tool_calls"] = false;
    } else {
      out.not_sent.push_back("the chat's tools are not a JSON array: not sent");
    }
  }
  if (request.response_format == ResponseFormat::JsonObject) {
    body["response_format"] = {{"type", "json_object"}};
  } else if (request.response_format == ResponseFormat::JsonSchema) {
    ojson schema = ojson::parse(request.json_schema, nullptr, false);
    if (schema.is_object()) {
      body["response_format"] = {
          {"type", "json_schema"},
          {"json_schema", {{"name", "reply"}, {"schema", std::move(schema)}, {"strict", true}}}};
    } else {
      // The window checks a schema when it is entered; this is a schema stored before that.
      body["response_format"] = {{"type", "json_object"}};
      out.not_sent.push_back("the chat's JSON schema is not a JSON object: any JSON object asked");
    }
  }
  if (!request.reasoning_effort.empty()) body["reasoning_effort"] = request.reasoning_effort;
  const RemoteSampling& s = request.sampling;
  if (s.temperature) body["temperature"] = *s.temperature;
  if (s.top_p) body["top_p"] = *s.top_p;
  if (s.seed) body["seed"] = *s.seed;
  if (s.max_tokens) body["max_tokens"] = *s.max_tokens;
  if (!s.stop.empty()) body["stop"] = s.stop;
  // Outside the OpenAI API: vLLM, SGLang, llama-server and Granule take top_k and min_p;
  // the repetition penalty is "repetition_penalty" in vLLM and SGLang, "repeat_penalty" in
  // llama-server and Granule. An unknown server gets none of them, and the caller says so.
  const bool known = request.server != ServerKind::Unknown;
  auto extension = [&](const char* name, const auto& value, const char* shown) {
    if (!value) return;
    if (known) {
      body[name] = *value;
    } else {
      out.not_sent.push_back(std::string(shown) +
                             " is not part of the OpenAI API and this server is not known to "
                             "take it: not sent");
    }
  };
  if (request.enable_thinking) {
    if (known) {
      body["chat_template_kwargs"] = {{"enable_thinking", *request.enable_thinking}};
    } else {
      out.not_sent.push_back(
          "the reasoning switch (chat_template_kwargs) is not part of the OpenAI API and this "
          "server is not known to take it: not sent");
    }
  }
  extension("top_k", s.top_k, "top_k");
  extension("min_p", s.min_p, "min_p");
  const bool vllm_like = request.server == ServerKind::Vllm || request.server == ServerKind::Sglang;
  extension(vllm_like ? "repetition_penalty" : "repeat_penalty", s.repeat_penalty,
            "repeat_penalty");
  out.json = body.dump();
  return out;
}

OpenAiClient::OpenAiClient(Endpoint endpoint) : endpoint_(std::move(endpoint)) {}

std::string OpenAiClient::api_base() const {
  const std::string url = trim_slashes(endpoint_.base_url);
  return ends_with(url, "/v1") ? url : url + "/v1";
}

std::string OpenAiClient::server_root() const {
  std::string url = trim_slashes(endpoint_.base_url);
  if (ends_with(url, "/v1")) url.resize(url.size() - 3);
  return url;
}

ModelList OpenAiClient::list_models() const {
  ModelList out;
  Transfer t;
  const std::string url = api_base() + "/models";
  const CURLcode code =
      perform(endpoint_, url, nullptr, false, t, endpoint_.connect_timeout_seconds + 20);
  out.fault = transport_fault(code, t, t.status != 0, endpoint_.connect_timeout_seconds + 20, url);
  if (out.fault) return out;
  if (t.status < 200 || t.status >= 300) {
    out.fault = http_fault(t.status, t.error_body, t.retry_after);
    return out;
  }
  const json parsed = json::parse(t.body, nullptr, false);
  if (!parsed.is_object() || !parsed.contains("data") || !parsed["data"].is_array()) {
    out.fault.kind = FaultKind::Protocol;
    out.fault.message = url + " did not answer with a model list";
    return out;
  }
  for (const json& m : parsed["data"]) {
    if (!m.is_object() || !m.contains("id") || !m["id"].is_string()) continue;
    RemoteModel model;
    model.id = m["id"].get<std::string>();
    if (m.contains("owned_by") && m["owned_by"].is_string())
      model.owned_by = m["owned_by"].get<std::string>();
    model.context_tokens = context_of(m);
    out.models.push_back(std::move(model));
  }
  return out;
}

namespace {

double seconds_now() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

}  // namespace

ChatStreamReader::ChatStreamReader(StreamCallbacks callbacks)
    : callbacks_(std::move(callbacks)),
      started_(seconds_now()),
      sse_(std::make_unique<SseStream>([this](const SseEvent& e) { on_event(e.data); })) {}

ChatStreamReader::~ChatStreamReader() = default;

void ChatStreamReader::feed(std::string_view bytes) { sse_->feed(bytes); }

void ChatStreamReader::on_delta_text(const std::string& text, bool reasoning) {
  if (text.empty()) return;
  if (!got_delta_) result_.first_token_seconds = seconds_now() - started_;
  got_delta_ = true;
  if (reasoning) {
    result_.reasoning += text;
    if (callbacks_.on_reasoning) callbacks_.on_reasoning(text);
  } else {
    result_.content += text;
    if (callbacks_.on_content) callbacks_.on_content(text);
  }
}

void ChatStreamReader::on_event(std::string_view data) {
  if (data == "[DONE]") {
    done_ = true;
    return;
  }
  const json chunk = json::parse(data, nullptr, false);
  if (!chunk.is_object()) {
    fault_.kind = FaultKind::Protocol;
    fault_.message =
        "the stream held something that is not JSON: " + one_line(std::string(data), 80);
    return;
  }
  if (chunk.contains("error")) {  // an error reported inside a 200 stream
    const Fault f = http_fault(500, data, std::nullopt);
    fault_.kind = FaultKind::ServerError;
    fault_.message =
        "the server reported an error mid-answer: " +
        f.message.substr(f.message.find(':') == std::string::npos ? 0 : f.message.find(':') + 2);
    return;
  }
  if (chunk.contains("usage") && chunk["usage"].is_object()) {
    const json& u = chunk["usage"];
    Usage usage;
    usage.prompt_tokens = u.value("prompt_tokens", int64_t{0});
    usage.completion_tokens = u.value("completion_tokens", int64_t{0});
    if (u.contains("prompt_tokens_details") && u["prompt_tokens_details"].is_object()) {
      usage.cached_prompt_tokens = u["prompt_tokens_details"].value("cached_tokens", int64_t{-1});
    }
    result_.usage = usage;
  }
  if (!chunk.contains("choices") || !chunk["choices"].is_array()) return;
  for (const json& choice : chunk["choices"]) {
    if (!choice.is_object()) continue;
    if (choice.contains("delta") && choice["delta"].is_object()) {
      const json& delta = choice["delta"];
      // llama-server and vLLM (before 0.10) say reasoning_content; newer vLLM says reasoning.
      for (const char* key : {"reasoning_content", "reasoning"}) {
        if (delta.contains(key) && delta[key].is_string()) {
          on_delta_text(delta[key].get<std::string>(), true);
          break;
        }
      }
      if (delta.contains("content") && delta["content"].is_string())
        on_delta_text(delta["content"].get<std::string>(), false);
      if (delta.contains("tool_calls") && delta["tool_calls"].is_array()) {
        const json& calls = delta["tool_calls"];
        for (size_t i = 0; i < calls.size(); ++i) {
          const json& c = calls[i];
          if (!c.is_object()) continue;
          // Fragments of one call share its index; a server that sends none sends whole calls.
          const int64_t index = c.contains("index") && c["index"].is_number_integer()
                                    ? c["index"].get<int64_t>()
                                    : static_cast<int64_t>(calls_.size());
          auto it = std::find_if(calls_.begin(), calls_.end(),
                                 [&](const auto& entry) { return entry.first == index; });
          if (it == calls_.end()) it = calls_.insert(calls_.end(), {index, PartialCall{}});
          PartialCall& call = it->second;
          if (!got_delta_) result_.first_token_seconds = seconds_now() - started_;
          got_delta_ = true;
          if (c.contains("id") && c["id"].is_string() && call.id.empty())
            call.id = c["id"].get<std::string>();
          if (c.contains("function") && c["function"].is_object()) {
            const json& f = c["function"];
            // The name comes whole in the first fragment (some servers repeat it).
            if (f.contains("name") && f["name"].is_string()) {
              const std::string name = f["name"].get<std::string>();
              if (name != call.name) call.name += name;
            }
            if (f.contains("arguments")) {
              if (f["arguments"].is_string()) {
                call.arguments += f["arguments"].get<std::string>();
              } else if (f["arguments"].is_object()) {  // a server that sends the object
                call.arguments += f["arguments"].dump();
              }
            }
          }
        }
      }
    }
    if (choice.contains("finish_reason") && choice["finish_reason"].is_string()) {
      result_.finish_reason = choice["finish_reason"].get<std::string>();
    }
  }
}

void ChatStreamReader::finish() {
  if (fault_) return;
  std::stable_sort(calls_.begin(), calls_.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [index, call] : calls_) {
    if (call.name.empty()) continue;  // a fragment without its call
    // No arguments: the function takes none.
    if (call.arguments.find_first_not_of(" \n\t\r") == std::string::npos) call.arguments = "{}";
    result_.tool_calls.push_back({call.id, call.name, call.arguments});
  }
  calls_.clear();
}

ChatResult OpenAiClient::stream_chat(const ChatRequest& request, const StreamCallbacks& callbacks,
                                     const std::atomic<bool>* cancel) const {
  const Clock::time_point start = Clock::now();
  ChatStreamReader reader(callbacks);
  const RequestBody body = chat_request_body(request);
  Transfer t;
  t.cancel = cancel;
  t.stream = [&](std::string_view bytes) { reader.feed(bytes); };
  const std::string url = api_base() + "/chat/completions";
  const CURLcode code =
      perform(endpoint_, url, &body.json, true, t, endpoint_.stall_timeout_seconds);
  ChatResult& result = reader.result();
  result.total_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  result.cancelled = t.cancelled;
  if (t.cancelled) return std::move(result);
  if (t.status != 0 && (t.status < 200 || t.status >= 300)) {
    result.fault = http_fault(t.status, t.error_body, t.retry_after);
    return std::move(result);
  }
  result.fault = transport_fault(code, t, t.status != 0, endpoint_.stall_timeout_seconds, url);
  if (result.fault) return std::move(result);
  if (reader.fault()) {
    result.fault = reader.fault();
    return std::move(result);
  }
  // A clean close without the end of the answer: a proxy or the server dropped the stream.
  if (!reader.done() && result.finish_reason.empty()) {
    result.fault.kind = FaultKind::StreamCut;
    result.fault.message = "the stream ended before the answer did (no finish reason, no [DONE])";
    return std::move(result);
  }
  reader.finish();
  return std::move(result);
}

OpenAiClient::MetricsText OpenAiClient::fetch_metrics() const {
  MetricsText out;
  Transfer t;
  const std::string url = server_root() + "/metrics";
  const CURLcode code = perform(endpoint_, url, nullptr, false, t, 10);
  out.fault = transport_fault(code, t, t.status != 0, 10, url);
  if (out.fault) return out;
  if (t.status < 200 || t.status >= 300) {
    out.fault = http_fault(t.status, t.error_body, t.retry_after);
    if (t.status == 404) out.fault.message = url + " does not exist: the server exposes no metrics";
    return out;
  }
  out.text = std::move(t.body);
  return out;
}

}  // namespace granule::remote
