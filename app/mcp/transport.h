// How an MCP client reaches its server: one JSON-RPC 2.0 message out, the response to it back,
// within a deadline. StdioTransport runs the server as a child process; HttpTransport speaks
// streamable HTTP.
#pragma once
#include <chrono>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace granule::mcp {

// Everything that goes wrong talking to a server: it did not start, it went away, it timed
// out, it answered with a JSON-RPC error or with something that is not MCP. One line.
struct McpError : std::runtime_error {
  enum class Kind { Transport, Timeout, Protocol, Refused };
  McpError(Kind kind, const std::string& message) : std::runtime_error(message), kind(kind) {}
  Kind kind;
};

class Transport {
 public:
  virtual ~Transport() = default;
  // Sends a request (a message with an id) and returns the response with that id, waiting at
  // most `timeout`. Notifications and requests from the server that come first are handled
  // (ping answered, the rest refused or ignored). Throws McpError.
  virtual nlohmann::json request(const nlohmann::json& message,
                                 std::chrono::milliseconds timeout) = 0;
  // Sends a notification (no id, no response). Throws McpError.
  virtual void notify(const nlohmann::json& message) = 0;
  // The protocol revision agreed in initialize (streamable HTTP sends it as a header).
  virtual void set_protocol_version(const std::string& version) { (void)version; }
  // What the transport connects to, for messages: "python3 server.py", "http://...".
  virtual std::string describe() const = 0;
};

// The answer a client gives to a request from the server: ping gets an empty result; the
// client offers no capabilities (sampling, roots, elicitation), so anything else is refused.
nlohmann::json answer_server_request(const nlohmann::json& request);

}  // namespace granule::mcp
