// perform(): one libcurl easy transfer with header capture, a body sink and cancellation.
#include "hub/http_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>

namespace granule::hub {
namespace {

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct Transfer {
  HttpResponse* response;
  const BodySink* sink;
  const std::atomic<bool>* cancel;
  bool stopped = false;
};

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

size_t on_header(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const std::string line(data, size * count);
  if (line.starts_with("HTTP/")) {  // a new response (after a redirect or a 100)
    t->response->headers.clear();
    // The status is known before the body arrives: on_body reads it.
    const auto space = line.find(' ');
    if (space != std::string::npos)
      t->response->status = std::strtol(line.c_str() + space + 1, nullptr, 10);
    return size * count;
  }
  const auto colon = line.find(':');
  if (colon == std::string::npos) return size * count;
  std::string value = line.substr(colon + 1);
  const auto first = value.find_first_not_of(" \t");
  const auto last = value.find_last_not_of(" \t\r\n");
  value = first == std::string::npos ? "" : value.substr(first, last - first + 1);
  t->response->headers[lower(line.substr(0, colon))] = value;
  return size * count;
}

size_t on_body(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t n = size * count;
  if (t->cancel != nullptr && t->cancel->load()) {
    t->stopped = true;
    return 0;
  }
  // Error bodies (and bodies without a sink) are kept as text for the message.
  const bool success = t->response->status >= 200 && t->response->status < 300;
  if (t->sink != nullptr && *t->sink && success) {
    if (!(*t->sink)(t->response->status, data, n)) {
      t->stopped = true;
      return 0;
    }
    return n;
  }
  if (t->response->body.size() < (64u << 20)) t->response->body.append(data, n);
  return n;
}

int on_progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* t = static_cast<Transfer*>(user);
  if (t->cancel != nullptr && t->cancel->load()) {
    t->stopped = true;
    return 1;
  }
  return 0;
}

}  // namespace

std::string HttpResponse::header(const std::string& lower_name) const {
  const auto it = headers.find(lower_name);
  return it == headers.end() ? std::string() : it->second;
}

TransferResult perform(const HttpRequest& request, const BodySink& sink,
                       const std::atomic<bool>* cancel) {
  global_init();
  TransferResult result;
  std::unique_ptr<CURL, decltype(&curl_easy_cleanup)> curl(curl_easy_init(), curl_easy_cleanup);
  if (!curl) {
    result.error = "cannot start an HTTP transfer (libcurl)";
    return result;
  }
  Transfer transfer{&result.response, &sink, cancel};
  CURL* c = curl.get();
  curl_easy_setopt(c, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_USERAGENT, "granule/" GRANULE_HUB_VERSION);
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, request.follow_redirects ? 1L : 0L);
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, static_cast<long>(request.connect_timeout_seconds));
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, static_cast<long>(request.stall_timeout_seconds));
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &transfer);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &transfer);
  curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
  curl_easy_setopt(c, CURLOPT_XFERINFODATA, &transfer);
  curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
  if (request.head) curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  std::string range;
  if (request.range_begin) {
    range = std::to_string(*request.range_begin) + "-" +
            (request.range_end ? std::to_string(*request.range_end) : "");
    curl_easy_setopt(c, CURLOPT_RANGE, range.c_str());
  }
  curl_slist* headers = nullptr;
  // The real sizes: no compression of file bodies.
  headers = curl_slist_append(headers, "Accept-Encoding: identity");
  for (const std::string& h : request.headers) headers = curl_slist_append(headers, h.c_str());
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);

  const CURLcode code = curl_easy_perform(c);
  curl_slist_free_all(headers);
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  if (status != 0) result.response.status = status;
  char* effective = nullptr;
  if (curl_easy_getinfo(c, CURLINFO_EFFECTIVE_URL, &effective) == CURLE_OK && effective != nullptr)
    result.response.effective_url = effective;
  result.stopped = transfer.stopped;
  if (code != CURLE_OK && !transfer.stopped) {
    result.error = curl_easy_strerror(code);
    result.stalled = code == CURLE_OPERATION_TIMEDOUT;
  }
  return result;
}

std::string url_escape(const std::string& text) {
  std::string out;
  for (unsigned char ch : text) {
    if (std::isalnum(ch) || ch == '-' || ch == '_' || ch == '.' || ch == '~') {
      out += static_cast<char>(ch);
    } else {
      char hex[4];
      std::snprintf(hex, sizeof hex, "%%%02X", ch);
      out += hex;
    }
  }
  return out;
}

}  // namespace granule::hub
