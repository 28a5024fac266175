// The MCP session over a transport: the JSON-RPC envelope, initialize's version agreement,
// paged tools/list and tools/call's result.
#include "mcp/mcp_client.h"

#include "mcp/http_transport.h"
#include "mcp/stdio_transport.h"

namespace granule::mcp {
namespace {

using json = nlohmann::json;

// The revisions this client speaks; a server may answer initialize with any of them.
bool known_version(const std::string& v) {
  return v == "2025-11-25" || v == "2025-06-18" || v == "2025-03-26" || v == "2024-11-05";
}

std::string string_of(const json& o, const char* key) {
  const auto it = o.find(key);
  return it != o.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace

json answer_server_request(const json& request) {
  json reply = {{"jsonrpc", "2.0"}, {"id", request.value("id", json())}};
  if (request.value("method", "") == "ping") {
    reply["result"] = json::object();
  } else {
    reply["error"] = {{"code", -32601},
                      {"message", "the client does not offer " + request.value("method", "?")}};
  }
  return reply;
}

std::string content_text(const json& content, const json& structured) {
  std::string text;
  if (content.is_array()) {
    for (const json& item : content) {
      if (!item.is_object()) continue;
      const std::string type = string_of(item, "type");
      std::string piece;
      if (type == "text") {
        piece = string_of(item, "text");
      } else if (type == "image" || type == "audio") {
        piece = "[" + type + " " + string_of(item, "mimeType") + "]";
      } else if (type == "resource") {
        const json resource = item.value("resource", json::object());
        piece = resource.contains("text") ? string_of(resource, "text")
                                          : "[resource " + string_of(resource, "uri") + "]";
      } else if (type == "resource_link") {
        piece = "[resource " + string_of(item, "uri") + "]";
      } else {
        continue;
      }
      if (!text.empty()) text += "\n";
      text += piece;
    }
  }
  if (text.empty() && !structured.is_null()) text = structured.dump();
  return text;
}

Client::Client(std::unique_ptr<Transport> transport, Timeouts timeouts)
    : transport_(std::move(transport)), timeouts_(timeouts) {}

json Client::call(const std::string& method, json params, std::chrono::milliseconds timeout) {
  const json id = next_id_++;
  json message = {{"jsonrpc", "2.0"}, {"id", id}, {"method", method}};
  if (!params.is_null()) message["params"] = std::move(params);
  const json reply = transport_->request(message, timeout);
  if (const auto error = reply.find("error"); error != reply.end()) {
    std::string text = error->is_object() ? string_of(*error, "message") : std::string();
    if (text.empty()) text = error->dump();
    throw McpError(McpError::Kind::Refused, "the server refused " + method + ": " + text);
  }
  const auto result = reply.find("result");
  if (result == reply.end() || !result->is_object())
    throw McpError(McpError::Kind::Protocol,
                   "the server's answer to " + method + " has no result object");
  return *result;
}

void Client::initialize(const std::string& client_name, const std::string& client_version) {
  const json result = call("initialize",
                           {{"protocolVersion", kProtocolVersion},
                            {"capabilities", json::object()},
                            {"clientInfo", {{"name", client_name}, {"version", client_version}}}},
                           timeouts_.request);
  protocol_version_ = string_of(result, "protocolVersion");
  if (!known_version(protocol_version_))
    throw McpError(McpError::Kind::Protocol, "the server speaks MCP revision '" +
                                                 protocol_version_ + "', this client " +
                                                 kProtocolVersion + " (or 2025-03-26, 2024-11-05)");
  const json info = result.value("serverInfo", json::object());
  server_name_ = info.is_object() ? string_of(info, "name") : std::string();
  server_version_ = info.is_object() ? string_of(info, "version") : std::string();
  instructions_ = string_of(result, "instructions");
  const json capabilities = result.value("capabilities", json::object());
  if (!capabilities.is_object() || !capabilities.contains("tools"))
    throw McpError(McpError::Kind::Protocol, "the server offers no tools");
  transport_->set_protocol_version(protocol_version_);
  transport_->notify({{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}});
}

std::vector<Tool> Client::list_tools() {
  std::vector<Tool> tools;
  std::string cursor;
  // A server that pages forever is cut off: no MCP server offers a thousand pages of tools.
  for (int page = 0; page < 1000; ++page) {
    json params = json::object();
    if (!cursor.empty()) params["cursor"] = cursor;
    const json result = call("tools/list", params, timeouts_.request);
    const auto list = result.find("tools");
    if (list == result.end() || !list->is_array())
      throw McpError(McpError::Kind::Protocol, "the server's tools/list has no tools array");
    for (const json& t : *list) {
      if (!t.is_object() || string_of(t, "name").empty()) continue;
      Tool tool;
      tool.name = string_of(t, "name");
      tool.title = string_of(t, "title");
      tool.description = string_of(t, "description");
      if (const auto schema = t.find("inputSchema"); schema != t.end() && schema->is_object())
        tool.input_schema = *schema;
      tools.push_back(std::move(tool));
    }
    cursor = string_of(result, "nextCursor");
    if (cursor.empty()) return tools;
  }
  throw McpError(McpError::Kind::Protocol, "the server's tools/list pages never end");
}

CallResult Client::call_tool(const std::string& name, const json& arguments) {
  const json result =
      call("tools/call",
           {{"name", name}, {"arguments", arguments.is_object() ? arguments : json::object()}},
           timeouts_.call);
  CallResult out;
  out.is_error = result.value("isError", false);
  if (const auto content = result.find("content"); content != result.end() && content->is_array())
    out.content = *content;
  if (const auto s = result.find("structuredContent"); s != result.end()) out.structured = *s;
  out.text = content_text(out.content, out.structured);
  return out;
}

std::unique_ptr<Transport> open_transport(const ServerConfig& config) {
  if (!config.command.empty())
    return std::make_unique<StdioTransport>(StdioCommand{config.command, config.args, config.env});
  if (!config.url.empty()) {
    if (!config.url.starts_with("http://") && !config.url.starts_with("https://"))
      throw McpError(
          McpError::Kind::Transport,
          "an MCP server's URL starts with http:// or https://, not '" + config.url + "'");
    return std::make_unique<HttpTransport>(config.url, config.headers);
  }
  throw McpError(McpError::Kind::Transport, "an MCP server needs a command or an URL");
}

}  // namespace granule::mcp
