// Telemetry frames as JSON lines: a writer generic over the sections' fields (the engine
// carries no JSON library; the window's replay reads the frames with Qt's), and the recorder
// that appends throttled frames to a file.
#include "granule/telemetry_json.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "granule/error.h"

namespace granule {
namespace {

template <class>
inline constexpr bool kAlwaysFalse = false;
template <class T>
inline constexpr bool kIsVector = false;
template <class T>
inline constexpr bool kIsVector<std::vector<T>> = true;

// The frame's sections in the order they are written; "sequences" follows them.
template <class Snapshot, class F>
void for_each_section(Snapshot& s, F&& f) {
  f("device", s.device);
  f("kv", s.kv);
  f("scheduler", s.scheduler);
  f("graphs", s.graphs);
  f("streaming", s.streaming);
  f("experts", s.experts);
  f("throughput", s.throughput);
}

// The length of the valid UTF-8 sequence starting at s[i], or 0 when it is not one
// (overlong forms, surrogates and code points past U+10FFFF are not).
size_t utf8_sequence_length(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char lead = byte(i);
  size_t length = 0;
  unsigned char low = 0x80, high = 0xBF;  // the range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return 0;
  }
  if (i + length > s.size()) return 0;
  if (byte(i + 1) < low || byte(i + 1) > high) return 0;
  for (size_t k = 2; k < length; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  }
  return length;
}

void write_string(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      const size_t length = utf8_sequence_length(s, i);
      if (length == 0) {
        out += "\\ufffd";
        ++i;
      } else {
        out.append(s, i, length);
        i += length;
      }
      continue;
    }
    if (c == '"') {
      out += "\\\"";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20) {
      out += "\\u00";
      out += kHex[c >> 4];
      out += kHex[c & 0xF];
    } else {
      out += static_cast<char>(c);
    }
    ++i;
  }
  out += '"';
}

template <class T>
void write_number(std::string& out, T value) {
  char text[64];
  const auto [end, ec] = std::to_chars(text, text + sizeof text, value);
  out.append(text, ec == std::errc() ? end : text);
}

template <class T>
void write_value(std::string& out, const T& value) {
  if constexpr (std::is_same_v<T, bool>) {
    out += value ? "true" : "false";
  } else if constexpr (std::is_integral_v<T>) {
    write_number(out, value);
  } else if constexpr (std::is_floating_point_v<T>) {
    if (std::isfinite(value)) {
      write_number(out, static_cast<double>(value));
    } else {
      out += '0';
    }
  } else if constexpr (std::is_same_v<T, std::string>) {
    write_string(out, value);
  } else if constexpr (std::is_same_v<T, Ledger>) {
    out += '{';
    for (size_t c = 0; c < kMemoryCategoryCount; ++c) {
      if (c > 0) out += ',';
      write_string(out, memory_category_name(static_cast<MemoryCategory>(c)));
      out += ':';
      write_number(out, value[c]);
    }
    out += '}';
  } else if constexpr (kIsVector<T>) {
    out += '[';
    for (size_t i = 0; i < value.size(); ++i) {
      if (i > 0) out += ',';
      write_value(out, value[i]);
    }
    out += ']';
  } else {
    static_assert(kAlwaysFalse<T>, "telemetry_json: a field type the writer does not know");
  }
}

template <class Section>
void write_section(std::string& out, const Section& section) {
  out += '{';
  bool first = true;
  for_each_field(section, [&](std::string_view name, const auto& field) {
    if (!first) out += ',';
    first = false;
    write_string(out, name);
    out += ':';
    write_value(out, field);
  });
  out += '}';
}

}  // namespace

std::string telemetry_to_json(const TelemetrySnapshot& snapshot, double t_seconds) {
  std::string out;
  out.reserve(2048 + 256 * snapshot.sequences.size());
  out += "{\"t\":";
  write_value(out, t_seconds);
  for_each_section(snapshot, [&](std::string_view name, const auto& section) {
    out += ',';
    write_string(out, name);
    out += ':';
    write_section(out, section);
  });
  out += ",\"sequences\":[";
  for (size_t i = 0; i < snapshot.sequences.size(); ++i) {
    if (i > 0) out += ',';
    write_section(out, snapshot.sequences[i]);
  }
  out += "]}";
  return out;
}

// ---------------------------------------------------------------------------------------
// TelemetryRecorder

namespace {

std::string write_error(const std::filesystem::path& path, int error_number) {
  return "cannot write telemetry to " + path.string() + ": " +
         std::generic_category().message(error_number);
}

}  // namespace

TelemetryRecorder::TelemetryRecorder(const std::filesystem::path& path, double min_interval_seconds)
    : path_(path), start_(Clock::now()) {
  if (!(min_interval_seconds >= 0)) {
    throw UsageError("telemetry recorder: the interval between frames must be 0 or more seconds");
  }
  min_interval_ = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(min_interval_seconds));
  errno = 0;
  file_ = std::fopen(path.c_str(), "w");
  if (file_ == nullptr) throw Error(write_error(path, errno != 0 ? errno : EIO));
}

TelemetryRecorder::~TelemetryRecorder() {
  try {
    close();
  } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor must not throw
  }
  if (file_ != nullptr) std::fclose(file_);  // close() threw before closing it
}

bool TelemetryRecorder::due() const {
  return file_ != nullptr && (!last_write_ || Clock::now() - *last_write_ >= min_interval_);
}

bool TelemetryRecorder::record(const TelemetrySnapshot& snapshot) {
  if (file_ == nullptr) throw UsageError("telemetry recorder: record() after close()");
  const Clock::time_point now = Clock::now();
  const double t = std::chrono::duration<double>(now - start_).count();
  if (last_write_ && now - *last_write_ < min_interval_) {
    pending_ = snapshot;
    pending_t_ = t;
    return false;
  }
  write_frame(snapshot, t, now);
  return true;
}

void TelemetryRecorder::record_now(const TelemetrySnapshot& snapshot) {
  if (file_ == nullptr) throw UsageError("telemetry recorder: record_now() after close()");
  const Clock::time_point now = Clock::now();
  write_frame(snapshot, std::chrono::duration<double>(now - start_).count(), now);
}

void TelemetryRecorder::close() {
  if (file_ == nullptr) return;
  if (pending_) {
    const TelemetrySnapshot last = std::move(*pending_);
    pending_.reset();
    write_frame(last, pending_t_, Clock::now());
  }
  std::FILE* file = std::exchange(file_, nullptr);
  if (std::fclose(file) != 0) throw Error(write_error(path_, errno));
}

void TelemetryRecorder::write_frame(const TelemetrySnapshot& snapshot, double t_seconds,
                                    Clock::time_point at) {
  std::string line = telemetry_to_json(snapshot, t_seconds);
  line += '\n';
  errno = 0;
  const bool written = std::fwrite(line.data(), 1, line.size(), file_) == line.size();
  if (!written || std::fflush(file_) != 0)
    throw Error(write_error(path_, errno != 0 ? errno : EIO));
  pending_.reset();  // a newer frame supersedes a skipped one
  last_write_ = at;
  ++frames_written_;
}

}  // namespace granule
