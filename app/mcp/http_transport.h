// The streamable HTTP transport (MCP 2025-06-18): every message is a POST to the server's one
// endpoint; a response comes back as JSON or as a server-sent event stream that carries it. The
// session id the server gives at initialize goes with every later request; the session is
// closed with a DELETE at the end.
#pragma once
#include <string>
#include <vector>

#include "mcp/transport.h"

namespace granule::mcp {

class HttpTransport : public Transport {
 public:
  // `headers`: "Name: value" lines sent with every request (Authorization, ...).
  explicit HttpTransport(std::string url, std::vector<std::string> headers = {});
  ~HttpTransport() override;
  HttpTransport(const HttpTransport&) = delete;
  HttpTransport& operator=(const HttpTransport&) = delete;

  nlohmann::json request(const nlohmann::json& message, std::chrono::milliseconds timeout) override;
  void notify(const nlohmann::json& message) override;
  void set_protocol_version(const std::string& version) override { protocol_version_ = version; }
  std::string describe() const override { return url_; }
  const std::string& session_id() const { return session_id_; }

 private:
  struct Reply;
  // POSTs `message`; with `id` set, returns once the response with that id arrived.
  nlohmann::json post(const nlohmann::json& message, const nlohmann::json* id,
                      std::chrono::milliseconds timeout);

  std::string url_;
  std::vector<std::string> headers_;
  std::string session_id_;
  std::string protocol_version_;
};

}  // namespace granule::mcp
