// One HTTP request through libcurl, for the Hub client: headers in, status, headers and
// body (or a sink for a large body) out. Proxies come from the environment as curl reads
// them (http_proxy, https_proxy, no_proxy, all_proxy).
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace granule::hub {

struct HttpRequest {
  std::string url;
  bool head = false;  // HEAD instead of GET
  bool follow_redirects = true;
  std::vector<std::string> headers;     // "Name: value"
  std::optional<uint64_t> range_begin;  // "Range: bytes=BEGIN-[END]"
  std::optional<uint64_t> range_end;    // inclusive
  int32_t stall_timeout_seconds = 30;
  int32_t connect_timeout_seconds = 15;
};

struct HttpResponse {
  long status = 0;
  std::map<std::string, std::string> headers;  // of the last response; names in lower case
  std::string body;                            // unless a sink took it (2xx only)
  std::string effective_url;
  std::string header(const std::string& lower_name) const;  // "" when absent
};

// Receives a 2xx body as it arrives, with the response's status (206 for a range); returns
// false to stop the transfer (perform() then returns normally, with `stopped` set).
using BodySink = std::function<bool(long status, const char* data, size_t size)>;

struct TransferResult {
  HttpResponse response;
  bool stopped = false;  // the sink asked to stop, or `cancel` was set
  std::string error;     // a transport failure (connection dropped, stall, DNS): curl's text
  bool stalled = false;  // the stall timeout ended it
};

// Performs the request; never throws for HTTP or transport errors (see TransferResult).
// `cancel`, when given, is polled during the transfer.
TransferResult perform(const HttpRequest& request, const BodySink& sink = {},
                       const std::atomic<bool>* cancel = nullptr);

// "%2F"-escapes a query value.
std::string url_escape(const std::string& text);

}  // namespace granule::hub
