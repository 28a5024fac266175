// The stdio transport: the server is a child process (posix_spawn) reading newline-delimited
// JSON-RPC on its stdin and writing it on its stdout; its stderr is kept (the last few lines)
// for the message when it fails. The process ends with the transport.
#pragma once
#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

#include "mcp/transport.h"

namespace granule::mcp {

struct StdioCommand {
  std::string command;  // found on PATH when it has no '/'
  std::vector<std::string> args;
  std::vector<std::pair<std::string, std::string>> env;  // set on top of this process's
};

class StdioTransport : public Transport {
 public:
  // Starts the process; throws McpError when it cannot be started.
  explicit StdioTransport(StdioCommand command);
  ~StdioTransport() override;
  StdioTransport(const StdioTransport&) = delete;
  StdioTransport& operator=(const StdioTransport&) = delete;

  nlohmann::json request(const nlohmann::json& message, std::chrono::milliseconds timeout) override;
  void notify(const nlohmann::json& message) override;
  std::string describe() const override;
  pid_t pid() const { return pid_; }

 private:
  void send(const nlohmann::json& message);
  // Reads until a line is complete or the deadline passes; false at the deadline.
  bool read_line(std::string& line, std::chrono::steady_clock::time_point deadline);
  void drain_stderr();
  [[noreturn]] void fail_ended();
  std::string stderr_tail() const;

  StdioCommand command_;
  pid_t pid_ = -1;
  int stdin_fd_ = -1;
  int stdout_fd_ = -1;
  int stderr_fd_ = -1;
  std::string out_buffer_;
  std::string err_buffer_;  // the last few KiB of stderr
};

}  // namespace granule::mcp
