// Streamable HTTP through libcurl: one easy handle per POST, its body read as JSON or as an
// event stream (the remote client's SseStream) until the response with the request's id.
#include "mcp/http_transport.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <memory>

#include "remote/sse_stream.h"

namespace granule::mcp {
namespace {

using json = nlohmann::json;

struct CurlDeleter {
  void operator()(CURL* c) const { curl_easy_cleanup(c); }
};
struct SlistDeleter {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\r' || s.back() == '\n' || s.back() == ' ')) s.pop_back();
  size_t start = 0;
  while (start < s.size() && s[start] == ' ') ++start;
  return s.substr(start);
}

constexpr size_t kMaxBodyBytes = 64u << 20;

}  // namespace

// What one POST received.
struct HttpTransport::Reply {
  const json* id = nullptr;  // the request's id: stop once its response is here
  std::string content_type;
  std::string session_id;
  std::string body;  // a JSON body, or the start of an error's body
  bool event_stream = false;
  std::unique_ptr<remote::SseStream> sse;
  std::vector<json> server_requests;  // requests from the server met in the stream
  json response;                      // the response to `id`, once found
  bool too_big = false;

  void take_message(const json& m) {
    if (!m.is_object()) return;
    if (m.contains("method")) {
      if (m.contains("id")) server_requests.push_back(m);
      return;
    }
    if (id != nullptr && m.value("id", json()) == *id) response = m;
  }
};

HttpTransport::HttpTransport(std::string url, std::vector<std::string> headers)
    : url_(std::move(url)), headers_(std::move(headers)) {
  curl_global_init(CURL_GLOBAL_DEFAULT);  // reference-counted; thread-safe in curl 7.84+
}

HttpTransport::~HttpTransport() {
  // Ends the session on the server (it may refuse with 405; nothing to do about it then).
  if (session_id_.empty()) return;
  std::unique_ptr<CURL, CurlDeleter> curl(curl_easy_init());
  if (!curl) return;
  std::unique_ptr<curl_slist, SlistDeleter> list;
  for (const std::string& h : headers_) list.reset(curl_slist_append(list.release(), h.c_str()));
  list.reset(curl_slist_append(list.release(), ("Mcp-Session-Id: " + session_id_).c_str()));
  curl_easy_setopt(curl.get(), CURLOPT_URL, url_.c_str());
  curl_easy_setopt(curl.get(), CURLOPT_CUSTOMREQUEST, "DELETE");
  curl_easy_setopt(curl.get(), CURLOPT_HTTPHEADER, list.get());
  curl_easy_setopt(curl.get(), CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl.get(), CURLOPT_TIMEOUT_MS, 2000L);
  curl_easy_setopt(
      curl.get(), CURLOPT_WRITEFUNCTION,
      +[](char*, size_t size, size_t n, void*) { return size * n; });
  curl_easy_perform(curl.get());
}

json HttpTransport::post(const json& message, const json* id, std::chrono::milliseconds timeout) {
  std::unique_ptr<CURL, CurlDeleter> curl(curl_easy_init());
  if (!curl) throw McpError(McpError::Kind::Transport, "libcurl could not start a request");
  std::unique_ptr<curl_slist, SlistDeleter> list;
  const auto add = [&list](const std::string& h) {
    list.reset(curl_slist_append(list.release(), h.c_str()));
  };
  add("Content-Type: application/json");
  add("Accept: application/json, text/event-stream");
  if (!protocol_version_.empty()) add("MCP-Protocol-Version: " + protocol_version_);
  if (!session_id_.empty()) add("Mcp-Session-Id: " + session_id_);
  for (const std::string& h : headers_) add(h);
  const std::string body = message.dump();

  Reply reply;
  reply.id = id;
  reply.sse = std::make_unique<remote::SseStream>([&reply](const remote::SseEvent& e) {
    if (e.event.empty() || e.event == "message")
      reply.take_message(json::parse(e.data, nullptr, /*allow_exceptions=*/false));
  });
  const auto on_header = +[](char* data, size_t size, size_t n, void* user) -> size_t {
    auto& r = *static_cast<Reply*>(user);
    const std::string line(data, size * n);
    const size_t colon = line.find(':');
    if (colon != std::string::npos) {
      const std::string name = lower(line.substr(0, colon));
      const std::string value = trim(line.substr(colon + 1));
      if (name == "content-type") {
        r.content_type = lower(value);
        r.event_stream = r.content_type.starts_with("text/event-stream");
      } else if (name == "mcp-session-id") {
        r.session_id = value;
      }
    }
    return size * n;
  };
  const auto on_body = +[](char* data, size_t size, size_t n, void* user) -> size_t {
    auto& r = *static_cast<Reply*>(user);
    if (r.event_stream) {
      r.sse->feed(std::string_view(data, size * n));
      // The answer is in: stop reading (the server may keep the stream open).
      if (!r.response.is_null()) return 0;
    } else {
      if (r.body.size() + size * n > kMaxBodyBytes) {
        r.too_big = true;
        return 0;
      }
      r.body.append(data, size * n);
    }
    return size * n;
  };
  CURL* c = curl.get();
  curl_easy_setopt(c, CURLOPT_URL, url_.c_str());
  curl_easy_setopt(c, CURLOPT_POST, 1L);
  curl_easy_setopt(c, CURLOPT_POSTFIELDS, body.c_str());
  curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, list.get());
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &reply);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &reply);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout.count()));
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(std::min<int64_t>(timeout.count(), 10000)));
  const CURLcode rc = curl_easy_perform(c);
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  if (!reply.session_id.empty()) session_id_ = reply.session_id;
  // Requests the server made inside the stream (ping) get their answers as POSTs of their own.
  for (const json& request : reply.server_requests)
    post(answer_server_request(request), nullptr, std::chrono::milliseconds(5000));
  const std::string method = message.value("method", "the request");
  if (rc == CURLE_WRITE_ERROR && !reply.response.is_null()) return reply.response;
  if (reply.too_big) throw McpError(McpError::Kind::Protocol, "the server's answer is over 64 MiB");
  if (rc == CURLE_OPERATION_TIMEDOUT)
    throw McpError(
        McpError::Kind::Timeout,
        method + " timed out after " + std::to_string((timeout.count() + 500) / 1000) + " s");
  if (rc != CURLE_OK)
    throw McpError(McpError::Kind::Transport,
                   "cannot reach " + url_ + ": " + curl_easy_strerror(rc));
  if (status == 404 && !session_id_.empty())
    throw McpError(McpError::Kind::Transport, "the server ended the session (HTTP 404)");
  if (status < 200 || status >= 300) {
    std::string text = trim(reply.body.substr(0, 200));
    std::replace(text.begin(), text.end(), '\n', ' ');
    throw McpError(McpError::Kind::Transport, url_ + " answered " + method + " with HTTP " +
                                                  std::to_string(status) +
                                                  (text.empty() ? "" : ": " + text));
  }
  if (id == nullptr) return json();  // a notification or an answer: 202 Accepted
  if (!reply.event_stream) {
    const json parsed = json::parse(reply.body, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_array()) {  // a batch (2025-03-26 servers)
      for (const json& m : parsed) reply.take_message(m);
    } else {
      reply.take_message(parsed);
    }
  }
  if (reply.response.is_null())
    throw McpError(McpError::Kind::Protocol,
                   url_ + " answered " + method + " without a JSON-RPC response to it");
  return reply.response;
}

json HttpTransport::request(const json& message, std::chrono::milliseconds timeout) {
  const json id = message.at("id");
  return post(message, &id, timeout);
}

void HttpTransport::notify(const json& message) {
  post(message, nullptr, std::chrono::milliseconds(10000));
}

}  // namespace granule::mcp
