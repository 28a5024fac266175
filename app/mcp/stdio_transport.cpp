// The stdio transport: posix_spawn with three pipes, poll() with the request's deadline, and a
// child that is asked to leave (stdin closed), then told (SIGTERM), then killed.
#include "mcp/stdio_transport.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <thread>

extern char** environ;

namespace granule::mcp {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr size_t kStderrKeepBytes = 4096;
// A line of JSON-RPC longer than this is not one this client reads (a tool result of 64 MiB).
constexpr size_t kMaxLineBytes = 64u << 20;

std::string errno_text(int e) { return std::string(strerror(e)); }

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// Writes all of `data` with SIGPIPE held back in this thread: a server that went away makes
// write() fail with EPIPE instead of ending the whole application.
bool write_all(int fd, const std::string& data) {
  sigset_t pipe_set, old_set;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old_set);
  bool ok = true;
  bool broken = false;
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      broken = errno == EPIPE;
      ok = false;
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (broken) {  // take the SIGPIPE this thread now has pending, unless it was pending before
    sigset_t pending;
    sigpending(&pending);
    if (sigismember(&pending, SIGPIPE) && !sigismember(&old_set, SIGPIPE)) {
      const timespec zero{0, 0};
      sigtimedwait(&pipe_set, nullptr, &zero);
    }
  }
  pthread_sigmask(SIG_SETMASK, &old_set, nullptr);
  return ok;
}

}  // namespace

StdioTransport::StdioTransport(StdioCommand command) : command_(std::move(command)) {
  if (command_.command.empty()) throw McpError(McpError::Kind::Transport, "no command to start");
  int in_pipe[2], out_pipe[2], err_pipe[2];
  if (pipe2(in_pipe, O_CLOEXEC) != 0)
    throw McpError(McpError::Kind::Transport, "cannot make a pipe: " + errno_text(errno));
  if (pipe2(out_pipe, O_CLOEXEC) != 0) {
    ::close(in_pipe[0]);
    ::close(in_pipe[1]);
    throw McpError(McpError::Kind::Transport, "cannot make a pipe: " + errno_text(errno));
  }
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    for (int fd : {in_pipe[0], in_pipe[1], out_pipe[0], out_pipe[1]}) ::close(fd);
    throw McpError(McpError::Kind::Transport, "cannot make a pipe: " + errno_text(errno));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in_pipe[0], 0);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err_pipe[1], 2);
  // Its own process group, so a terminal's Ctrl+C to the window does not reach it first, and
  // SIGTERM reaches what a launcher (npx, uvx) started under it.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);

  std::vector<std::string> argv_strings{command_.command};
  argv_strings.insert(argv_strings.end(), command_.args.begin(), command_.args.end());
  std::vector<char*> argv;
  for (std::string& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  // This process's environment with the server's variables on top.
  std::vector<std::string> env_strings;
  for (char** e = environ; e && *e; ++e) {
    const std::string entry(*e);
    const std::string name = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const auto& [key, value] : command_.env) replaced = replaced || key == name;
    if (!replaced) env_strings.push_back(entry);
  }
  for (const auto& [key, value] : command_.env) env_strings.push_back(key + "=" + value);
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);

  const int rc =
      posix_spawnp(&pid_, command_.command.c_str(), &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(in_pipe[0]);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  stdin_fd_ = in_pipe[1];
  stdout_fd_ = out_pipe[0];
  stderr_fd_ = err_pipe[0];
  if (rc != 0) {
    pid_ = -1;
    close_fd(stdin_fd_);
    close_fd(stdout_fd_);
    close_fd(stderr_fd_);
    throw McpError(McpError::Kind::Transport,
                   "cannot start '" + command_.command + "': " + errno_text(rc));
  }
}

StdioTransport::~StdioTransport() {
  close_fd(stdin_fd_);  // a stdio server ends when its input does
  if (pid_ > 0) {
    const auto wait_for = [this](std::chrono::milliseconds limit) {
      const auto end = Clock::now() + limit;
      for (;;) {
        int status = 0;
        const pid_t r = waitpid(pid_, &status, WNOHANG);
        if (r == pid_ || (r < 0 && errno != EINTR)) return true;
        if (Clock::now() >= end) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    };
    if (!wait_for(std::chrono::milliseconds(500))) {
      ::kill(-pid_, SIGTERM);
      if (!wait_for(std::chrono::milliseconds(1000))) {
        ::kill(-pid_, SIGKILL);
        wait_for(std::chrono::milliseconds(2000));
      }
    }
  }
  close_fd(stdout_fd_);
  close_fd(stderr_fd_);
}

std::string StdioTransport::describe() const {
  std::string text = command_.command;
  for (const std::string& a : command_.args) text += " " + a;
  return text;
}

std::string StdioTransport::stderr_tail() const {
  // The last non-empty line the server wrote to stderr, which usually says what went wrong.
  std::string_view text = err_buffer_;
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' '))
    text.remove_suffix(1);
  const size_t nl = text.rfind('\n');
  if (nl != std::string_view::npos) text.remove_prefix(nl + 1);
  return std::string(text.substr(0, 300));
}

void StdioTransport::drain_stderr() {
  if (stderr_fd_ < 0) return;
  char buffer[4096];
  for (;;) {
    pollfd p{stderr_fd_, POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0 || !(p.revents & (POLLIN | POLLHUP))) return;
    const ssize_t n = ::read(stderr_fd_, buffer, sizeof buffer);
    if (n <= 0) {
      close_fd(stderr_fd_);
      return;
    }
    err_buffer_.append(buffer, static_cast<size_t>(n));
    if (err_buffer_.size() > 2 * kStderrKeepBytes)
      err_buffer_.erase(0, err_buffer_.size() - kStderrKeepBytes);
  }
}

void StdioTransport::fail_ended() {
  drain_stderr();
  std::string why = "the server '" + describe() + "' ended";
  int status = 0;
  if (pid_ > 0) {
    // Give it a moment to be reaped: its stdout closes just before it exits.
    for (int i = 0; i < 50; ++i) {
      const pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        if (WIFEXITED(status)) why += " with status " + std::to_string(WEXITSTATUS(status));
        if (WIFSIGNALED(status)) why += " by signal " + std::to_string(WTERMSIG(status));
        break;
      }
      if (r < 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  const std::string tail = stderr_tail();
  if (!tail.empty()) why += ": " + tail;
  throw McpError(McpError::Kind::Transport, why);
}

void StdioTransport::send(const json& message) {
  if (stdin_fd_ < 0) fail_ended();
  // dump() escapes no newline into the text: one message, one line.
  if (!write_all(stdin_fd_, message.dump() + "\n")) fail_ended();
}

bool StdioTransport::read_line(std::string& line, Clock::time_point deadline) {
  char buffer[65536];
  for (;;) {
    if (const size_t nl = out_buffer_.find('\n'); nl != std::string::npos) {
      line = out_buffer_.substr(0, nl);
      out_buffer_.erase(0, nl + 1);
      return true;
    }
    if (out_buffer_.size() > kMaxLineBytes)
      throw McpError(McpError::Kind::Protocol, "the server wrote a line of over 64 MiB");
    if (stdout_fd_ < 0) fail_ended();
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd fds[2] = {{stdout_fd_, POLLIN, 0}, {stderr_fd_, POLLIN, 0}};
    const int ready = ::poll(fds, stderr_fd_ >= 0 ? 2 : 1,
                             static_cast<int>(std::min<int64_t>(left.count() + 1, 1000)));
    if (ready < 0) {
      if (errno == EINTR) continue;
      throw McpError(McpError::Kind::Transport, "poll failed: " + errno_text(errno));
    }
    if (stderr_fd_ >= 0 && (fds[1].revents & (POLLIN | POLLHUP))) drain_stderr();
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      const ssize_t n = ::read(stdout_fd_, buffer, sizeof buffer);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        close_fd(stdout_fd_);
        fail_ended();
      }
      out_buffer_.append(buffer, static_cast<size_t>(n));
    }
  }
}

json StdioTransport::request(const json& message, std::chrono::milliseconds timeout) {
  const json id = message.at("id");
  send(message);
  const auto deadline = Clock::now() + timeout;
  std::string line;
  for (;;) {
    if (!read_line(line, deadline))
      throw McpError(McpError::Kind::Timeout,
                     message.value("method", "the request") + " timed out after " +
                         std::to_string((timeout.count() + 500) / 1000) + " s");
    const json reply = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!reply.is_object()) continue;  // not JSON-RPC (a server that logs to stdout)
    const bool has_method = reply.contains("method");
    if (has_method && reply.contains("id")) {  // a request from the server
      send(answer_server_request(reply));
      continue;
    }
    if (has_method) continue;  // a notification (log, progress, list changed)
    if (reply.value("id", json()) == id) return reply;
    // A late answer to an earlier request that timed out: dropped.
  }
}

void StdioTransport::notify(const json& message) { send(message); }

}  // namespace granule::mcp
