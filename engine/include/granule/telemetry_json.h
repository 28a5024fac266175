// Telemetry snapshots as JSON lines, the recording format the window replays (one frame a
// line): the writer, and TelemetryRecorder, which appends throttled frames to a file. Fields
// are written through for_each_field, so a field added to telemetry.h needs no code here.
// The engine writes frames only; the window's replay (app/gui/telemetry_replay.h) reads them.
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>

#include "granule/telemetry.h"

namespace granule {

// One frame: {"t":T,"device":{...},"kv":{...},"scheduler":{...},"graphs":{...},
// "streaming":{...},"experts":{...},"throughput":{...},"sequences":[...]} on one line, without a
// newline. Integers are written exactly, doubles in their shortest round-trip form (non-finite as
// 0), strings as UTF-8 with control characters escaped (invalid UTF-8 bytes become U+FFFD).
std::string telemetry_to_json(const TelemetrySnapshot& snapshot, double t_seconds);

// Appends frames to a file, one line each, flushed as written so a reader (or a crash)
// sees every frame whole. Time "t" counts from the recorder's construction on a steady
// clock. record() is meant to be called after every engine step: it writes at most one
// frame per min_interval_seconds and keeps the latest skipped snapshot, which close() (or
// the destructor) writes as the final frame.
class TelemetryRecorder {
 public:
  // Creates or truncates `path`. Throws Error ("cannot write telemetry to PATH: Permission
  // denied") when it cannot be opened for writing.
  explicit TelemetryRecorder(const std::filesystem::path& path, double min_interval_seconds = 0.1);
  ~TelemetryRecorder();  // close(), swallowing any error
  TelemetryRecorder(const TelemetryRecorder&) = delete;
  TelemetryRecorder& operator=(const TelemetryRecorder&) = delete;

  // Whether record() would write now: a caller can skip taking a snapshot when it is not.
  bool due() const;
  // Writes the frame when due, else keeps it as the pending final frame. Returns whether it
  // wrote. Throws Error when the write fails, UsageError after close().
  bool record(const TelemetrySnapshot& snapshot);
  // Writes the frame now, whatever the interval (it replaces any pending one).
  void record_now(const TelemetrySnapshot& snapshot);
  // Writes the pending frame, if any, and closes the file. Later calls do nothing.
  void close();

  const std::filesystem::path& path() const { return path_; }
  uint64_t frames_written() const { return frames_written_; }

 private:
  using Clock = std::chrono::steady_clock;
  void write_frame(const TelemetrySnapshot& snapshot, double t_seconds, Clock::time_point at);

  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
  Clock::duration min_interval_;
  Clock::time_point start_;
  std::optional<Clock::time_point> last_write_;
  std::optional<TelemetrySnapshot> pending_;
  double pending_t_ = 0;
  uint64_t frames_written_ = 0;
};

}  // namespace granule
