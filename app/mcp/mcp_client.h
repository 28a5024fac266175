// An MCP client session: initialize (the 2025-06-18 revision), the server's tools (tools/list,
// every page) and calls to them (tools/call), each with a bounded wait. Not thread-safe: one
// thread drives a Client at a time.
#pragma once
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "mcp/transport.h"

namespace granule::mcp {

inline constexpr const char* kProtocolVersion = "2025-06-18";

// How to reach a server: a command (stdio) or an URL (streamable HTTP).
struct ServerConfig {
  std::string command;  // stdio: the program, found on PATH when it has no '/'
  std::vector<std::string> args;
  std::vector<std::pair<std::string, std::string>> env;
  std::string url;                   // streamable HTTP: http(s)://host:port/mcp
  std::vector<std::string> headers;  // HTTP: "Name: value" lines
};

struct Timeouts {
  std::chrono::milliseconds request{15000};  // initialize, tools/list
  std::chrono::milliseconds call{60000};     // tools/call
};

struct Tool {
  std::string name;
  std::string title;
  std::string description;
  nlohmann::json input_schema = nlohmann::json::object();  // a JSON Schema object
};

struct CallResult {
  bool is_error = false;  // the tool ran and reported an error (isError)
  std::string text;       // the content as text: text items joined, others named
  nlohmann::json content = nlohmann::json::array();
  nlohmann::json structured;  // structuredContent, or null
};

class Client {
 public:
  Client(std::unique_ptr<Transport> transport, Timeouts timeouts = {});

  // initialize + notifications/initialized. Throws McpError.
  void initialize(const std::string& client_name, const std::string& client_version);
  // Every tool the server offers (following nextCursor). Throws McpError.
  std::vector<Tool> list_tools();
  // Calls a tool; a tool's own failure is a result with is_error, a failure to call it (a
  // timeout, an unknown tool, the server gone) is McpError.
  CallResult call_tool(const std::string& name, const nlohmann::json& arguments);

  const std::string& server_name() const { return server_name_; }
  const std::string& server_version() const { return server_version_; }
  const std::string& protocol_version() const { return protocol_version_; }
  const std::string& instructions() const { return instructions_; }
  Transport& transport() { return *transport_; }

 private:
  // One request; the result, or McpError for a JSON-RPC error.
  nlohmann::json call(const std::string& method, nlohmann::json params,
                      std::chrono::milliseconds timeout);

  std::unique_ptr<Transport> transport_;
  Timeouts timeouts_;
  int64_t next_id_ = 1;
  std::string server_name_;
  std::string server_version_;
  std::string protocol_version_;
  std::string instructions_;
};

// The transport for `config` (stdio when it has a command, else HTTP), started; throws McpError
// for a config that names neither or a command that cannot be started.
std::unique_ptr<Transport> open_transport(const ServerConfig& config);

// A result's content as one text for the model: text items as they are, images, audio and
// resources named ("[image image/png]"), structuredContent when there is no text.
std::string content_text(const nlohmann::json& content, const nlohmann::json& structured);

}  // namespace granule::mcp
