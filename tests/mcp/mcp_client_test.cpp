// The MCP client against a server written with the official Python SDK
// (tests/mcp/mcp_test_server.py), over stdio and streamable HTTP: tools listed, called, a tool's
// error, an unknown tool, a call that times out (and the session still works after it), a server
// that dies mid-call, and servers that cannot be reached. Skips when the `mcp` package is absent
// (bash packaging/setup.sh pydeps).
#include "mcp/mcp_client.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "mcp/http_transport.h"
#include "mcp/stdio_transport.h"

extern char** environ;

namespace granule::mcp {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

const std::string kServer = std::string(GRANULE_SOURCE_DIR) + "/tests/mcp/mcp_test_server.py";

// The tests' Python packages (setup.sh pydeps) before whatever PYTHONPATH already holds.
std::string python_path() {
  const char* data = std::getenv("XDG_DATA_HOME");
  const char* home = std::getenv("HOME");
  std::string path = data && *data ? std::string(data) + "/granule/python"
                                   : std::string(home ? home : "") + "/.local/share/granule/python";
  if (const char* extra = std::getenv("PYTHONPATH"); extra && *extra)
    path += ":" + std::string(extra);
  return path;
}

bool have_mcp_sdk() {
  const std::string command =
      "PYTHONPATH='" + python_path() + "' python3 -c 'import mcp.server.mcpserver' 2>/dev/null";
  return std::system(command.c_str()) == 0;
}

#define SKIP_WITHOUT_SDK() \
  if (!have_mcp_sdk())     \
  GTEST_SKIP() << "the official mcp Python package is missing: bash packaging/setup.sh pydeps"

ServerConfig stdio_config() {
  ServerConfig config;
  config.command = "python3";
  config.args = {kServer, "stdio"};
  config.env = {{"PYTHONPATH", python_path()}};
  return config;
}

std::unique_ptr<Client> connect(const ServerConfig& config, Timeouts timeouts = {}) {
  auto client = std::make_unique<Client>(open_transport(config), timeouts);
  client->initialize("granule-test", "1");
  return client;
}

void expect_the_test_tools(Client& client) {
  EXPECT_EQ(client.server_name(), "granule-test-server");
  EXPECT_EQ(client.protocol_version(), kProtocolVersion);
  const std::vector<Tool> tools = client.list_tools();
  std::vector<std::string> names;
  for (const Tool& t : tools) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"add", "weather", "fail", "sleep", "hang", "crash"}));
  ASSERT_FALSE(tools.empty());
  EXPECT_EQ(tools[0].description, "Adds two integers.");
  EXPECT_EQ(tools[0].input_schema["properties"]["a"]["type"], "integer");
  EXPECT_EQ(tools[0].input_schema["required"], nlohmann::json({"a", "b"}));
}

void expect_calls(Client& client) {
  const CallResult sum = client.call_tool("add", {{"a", 2}, {"b", 40}});
  EXPECT_FALSE(sum.is_error);
  EXPECT_EQ(sum.text, "42");
  const CallResult weather = client.call_tool("weather", {{"city", "Paris"}});
  EXPECT_EQ(weather.text, "Paris: 21 °C, light wind, clear sky");
  // The tool ran and failed: a result with isError and the tool's message.
  const CallResult failed = client.call_tool("fail", {{"reason", "no network"}});
  EXPECT_TRUE(failed.is_error);
  EXPECT_NE(failed.text.find("no network"), std::string::npos) << failed.text;
  // Arguments the schema refuses, and a tool that does not exist: errors, the session goes on.
  const CallResult bad = client.call_tool("add", {{"a", "two"}});
  EXPECT_TRUE(bad.is_error) << bad.text;
  try {
    const CallResult unknown = client.call_tool("nope", nlohmann::json::object());
    EXPECT_TRUE(unknown.is_error);  // this SDK answers with a tool error
    EXPECT_NE(unknown.text.find("nope"), std::string::npos) << unknown.text;
  } catch (const McpError& e) {  // others with a JSON-RPC error
    EXPECT_EQ(e.kind, McpError::Kind::Refused) << e.what();
  }
  EXPECT_EQ(client.call_tool("add", {{"a", 1}, {"b", 1}}).text, "2");
}

void expect_timeout_then_working(Client& client) {
  const auto start = Clock::now();
  try {
    client.call_tool("sleep", {{"seconds", 3}});
    FAIL() << "expected a timeout";
  } catch (const McpError& e) {
    EXPECT_EQ(e.kind, McpError::Kind::Timeout) << e.what();
    EXPECT_EQ(std::string(e.what()), "tools/call timed out after 1 s");
  }
  EXPECT_LT(Clock::now() - start, 2500ms);
  // The late answer to the timed-out call is dropped; the next call gets its own.
  EXPECT_EQ(client.call_tool("add", {{"a", 3}, {"b", 4}}).text, "7");
}

TEST(McpStdio, ListsAndCallsTools) {
  SKIP_WITHOUT_SDK();
  auto client = connect(stdio_config());
  expect_the_test_tools(*client);
  expect_calls(*client);
}

TEST(McpStdio, ACallThatTakesTooLongTimesOutAndTheSessionGoesOn) {
  SKIP_WITHOUT_SDK();
  auto client = connect(stdio_config(), {.request = 15s, .call = 1s});
  expect_timeout_then_working(*client);
}

TEST(McpStdio, AServerThatDiesMidCallIsAnErrorWithItsLastWords) {
  SKIP_WITHOUT_SDK();
  auto client = connect(stdio_config());
  try {
    client->call_tool("crash", nlohmann::json::object());
    FAIL() << "expected the call to fail";
  } catch (const McpError& e) {
    EXPECT_EQ(e.kind, McpError::Kind::Transport);
    const std::string what = e.what();
    EXPECT_NE(what.find("ended with status 3"), std::string::npos) << what;
    EXPECT_NE(what.find("crashing on purpose"), std::string::npos) << what;
  }
  // Every later call says the same, at once.
  EXPECT_THROW(client->call_tool("add", {{"a", 1}, {"b", 1}}), McpError);
}

TEST(McpStdio, ACommandThatCannotStartOrIsNoServer) {
  ServerConfig missing;
  missing.command = "granule-no-such-mcp-server";
  try {
    (void)open_transport(missing);
    FAIL() << "expected an error";
  } catch (const McpError& e) {
    EXPECT_EQ(std::string(e.what()),
              "cannot start 'granule-no-such-mcp-server': No such file or directory");
  }
  // A program that is not an MCP server and exits at once.
  ServerConfig not_mcp;
  not_mcp.command = "sh";
  not_mcp.args = {"-c", "echo not a server >&2; exit 1"};
  try {
    connect(not_mcp);
    FAIL() << "expected an error";
  } catch (const McpError& e) {
    EXPECT_NE(std::string(e.what()).find("ended with status 1: not a server"), std::string::npos)
        << e.what();
  }
  // A program that reads and never answers: initialize times out.
  ServerConfig silent;
  silent.command = "sh";
  silent.args = {"-c", "cat >/dev/null"};
  const auto start = Clock::now();
  try {
    connect(silent, {.request = 500ms, .call = 500ms});
    FAIL() << "expected a timeout";
  } catch (const McpError& e) {
    EXPECT_EQ(e.kind, McpError::Kind::Timeout) << e.what();
  }
  EXPECT_LT(Clock::now() - start, 3s);  // the timeout, then the process ended (stdin closed)
  ServerConfig none;
  EXPECT_THROW((void)open_transport(none), McpError);
}

// The streamable-HTTP server as a child process on a free port.
class HttpServer {
 public:
  HttpServer() {
    port_ = free_port();
    const std::string port = std::to_string(port_);
    const std::string env_path = "PYTHONPATH=" + python_path();
    std::vector<std::string> args = {"python3", kServer, "http", port};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_strings;
    for (char** e = environ; *e; ++e)
      if (!std::string(*e).starts_with("PYTHONPATH=")) env_strings.emplace_back(*e);
    env_strings.push_back(env_path);
    std::vector<char*> envp;
    for (std::string& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    if (posix_spawnp(&pid_, "python3", &actions, nullptr, argv.data(), envp.data()) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
  }
  ~HttpServer() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  // Waits until the port accepts connections (the SDK takes a second or two to start).
  bool ready() const {
    const auto end = Clock::now() + 30s;
    while (Clock::now() < end && pid_ > 0) {
      const int fd = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(static_cast<uint16_t>(port_));
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
      ::close(fd);
      if (ok) return true;
      std::this_thread::sleep_for(100ms);
    }
    return false;
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/mcp"; }

  static int free_port() {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    socklen_t len = sizeof addr;
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    ::close(fd);
    return ntohs(addr.sin_port);
  }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

TEST(McpHttp, ListsAndCallsToolsInASession) {
  SKIP_WITHOUT_SDK();
  HttpServer server;
  ASSERT_TRUE(server.ready()) << "the test server did not start on " << server.url();
  ServerConfig config;
  config.url = server.url();
  auto client = connect(config);
  EXPECT_FALSE(dynamic_cast<HttpTransport&>(client->transport()).session_id().empty());
  expect_the_test_tools(*client);
  expect_calls(*client);
}

TEST(McpHttp, ACallThatTakesTooLongTimesOutAndTheSessionGoesOn) {
  SKIP_WITHOUT_SDK();
  HttpServer server;
  ASSERT_TRUE(server.ready()) << "the test server did not start on " << server.url();
  ServerConfig config;
  config.url = server.url();
  auto client = connect(config, {.request = 15s, .call = 1s});
  expect_timeout_then_working(*client);
}

TEST(McpHttp, ServersThatCannotBeReached) {
  ServerConfig closed;
  closed.url = "http://127.0.0.1:" + std::to_string(HttpServer::free_port()) + "/mcp";
  try {
    connect(closed, {.request = 2s, .call = 2s});
    FAIL() << "expected an error";
  } catch (const McpError& e) {
    EXPECT_EQ(e.kind, McpError::Kind::Transport);
    EXPECT_NE(std::string(e.what()).find("cannot reach http://127.0.0.1:"), std::string::npos)
        << e.what();
  }
  ServerConfig bad;
  bad.url = "ftp://example.invalid/mcp";
  EXPECT_THROW((void)open_transport(bad), McpError);
}

}  // namespace
}  // namespace granule::mcp
