// Telemetry frames as JSON lines: a writer and a small recursive-descent reader, both generic
// over the sections' for_each_field (the engine carries no JSON library), and the recorder
// that appends throttled frames to a file.
#include "granule/telemetry_json.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
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
  f("throughput", s.throughput);
}

// ---------------------------------------------------------------------------------------
// Writing

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
  section.for_each_field([&](std::string_view name, const auto& field) {
    if (!first) out += ',';
    first = false;
    write_string(out, name);
    out += ':';
    write_value(out, field);
  });
  out += '}';
}

// ---------------------------------------------------------------------------------------
// Reading: the line is parsed into a tree of JsonValues, which then fills the snapshot.

struct JsonValue {
  enum class Kind { Null, Bool, Number, String, Array, Object };
  Kind kind = Kind::Null;
  size_t offset = 0;  // where the value starts in the line
  bool boolean = false;
  std::string text;               // a number as written, or a string decoded
  std::vector<JsonValue> items;   // an array's items, or an object's values
  std::vector<std::string> keys;  // an object's keys, beside its values in `items`

  // The value of `key` in an object (the last one when a key repeats), or null if absent.
  const JsonValue* member(std::string_view key) const {
    for (size_t i = keys.size(); i-- > 0;) {
      if (keys[i] == key) return &items[i];
    }
    return nullptr;
  }
};

[[noreturn]] void frame_error(const std::string& what) {
  throw UsageError("telemetry frame: " + what);
}

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  JsonValue parse_document() {
    skip_space();
    if (pos_ == text_.size()) frame_error("empty line");
    JsonValue root = parse_value(0);
    skip_space();
    if (pos_ != text_.size()) fail("unexpected text after the frame");
    return root;
  }

 private:
  static constexpr int kMaxDepth = 32;

  [[noreturn]] void fail(const std::string& what) const { fail_at(what, pos_); }
  [[noreturn]] static void fail_at(const std::string& what, size_t at) {
    frame_error(what + " at byte " + std::to_string(at));
  }

  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return at_end() ? '\0' : text_[pos_]; }

  JsonValue parse_value(int depth) {
    skip_space();
    if (depth > kMaxDepth) fail("nested deeper than " + std::to_string(kMaxDepth) + " levels");
    JsonValue value;
    value.offset = pos_;
    const char c = peek();
    if (c == '{') {
      parse_object(value, depth);
    } else if (c == '[') {
      parse_array(value, depth);
    } else if (c == '"') {
      value.kind = JsonValue::Kind::String;
      value.text = parse_string();
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      value.kind = JsonValue::Kind::Number;
      value.text = parse_number();
    } else if (literal("true")) {
      value.kind = JsonValue::Kind::Bool;
      value.boolean = true;
    } else if (literal("false")) {
      value.kind = JsonValue::Kind::Bool;
    } else if (literal("null")) {
      value.kind = JsonValue::Kind::Null;
    } else {
      fail(at_end() ? "unexpected end of the line" : "expected a value");
    }
    return value;
  }

  bool literal(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  void parse_object(JsonValue& value, int depth) {
    value.kind = JsonValue::Kind::Object;
    ++pos_;  // '{'
    skip_space();
    if (peek() == '}') {
      ++pos_;
      return;
    }
    while (true) {
      skip_space();
      if (peek() != '"') fail("expected a string key");
      value.keys.push_back(parse_string());
      skip_space();
      if (peek() != ':') fail("expected ':'");
      ++pos_;
      value.items.push_back(parse_value(depth + 1));
      skip_space();
      if (peek() == ',') {
        ++pos_;
      } else if (peek() == '}') {
        ++pos_;
        return;
      } else {
        fail("expected ',' or '}'");
      }
    }
  }

  void parse_array(JsonValue& value, int depth) {
    value.kind = JsonValue::Kind::Array;
    ++pos_;  // '['
    skip_space();
    if (peek() == ']') {
      ++pos_;
      return;
    }
    while (true) {
      value.items.push_back(parse_value(depth + 1));
      skip_space();
      if (peek() == ',') {
        ++pos_;
      } else if (peek() == ']') {
        ++pos_;
        return;
      } else {
        fail("expected ',' or ']'");
      }
    }
  }

  // -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?, returned as written.
  std::string parse_number() {
    const size_t start = pos_;
    const auto digits = [&] {
      const size_t first = pos_;
      while (peek() >= '0' && peek() <= '9') ++pos_;
      return pos_ - first;
    };
    if (peek() == '-') ++pos_;
    if (peek() == '0') {
      ++pos_;
    } else if (digits() == 0) {
      fail("expected a digit");
    }
    if (peek() == '.') {
      ++pos_;
      if (digits() == 0) fail("expected a digit after '.'");
    }
    if (peek() == 'e' || peek() == 'E') {
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      if (digits() == 0) fail("expected a digit in the exponent");
    }
    return std::string(text_.substr(start, pos_ - start));
  }

  uint32_t parse_hex4() {
    uint32_t code = 0;
    for (int k = 0; k < 4; ++k) {
      const char h = peek();
      uint32_t digit = 0;
      if (h >= '0' && h <= '9') {
        digit = static_cast<uint32_t>(h - '0');
      } else if (h >= 'a' && h <= 'f') {
        digit = static_cast<uint32_t>(h - 'a' + 10);
      } else if (h >= 'A' && h <= 'F') {
        digit = static_cast<uint32_t>(h - 'A' + 10);
      } else {
        fail("expected 4 hex digits after \\u");
      }
      code = code * 16 + digit;
      ++pos_;
    }
    return code;
  }

  static void append_utf8(std::string& out, uint32_t code) {
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else if (code < 0x800) {
      out += static_cast<char>(0xC0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else if (code < 0x10000) {
      out += static_cast<char>(0xE0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (code >> 18));
      out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    }
  }

  std::string parse_string() {
    const size_t start = pos_;
    ++pos_;  // '"'
    std::string out;
    while (true) {
      if (at_end()) fail_at("unterminated string", start);
      const char c = text_[pos_];
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20) fail("unescaped control character in a string");
      if (c != '\\') {
        out += c;
        ++pos_;
        continue;
      }
      ++pos_;
      const char e = peek();
      ++pos_;
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          uint32_t code = parse_hex4();
          if (code >= 0xD800 && code <= 0xDBFF && text_.substr(pos_, 2) == "\\u") {
            const size_t before = pos_;
            pos_ += 2;
            const uint32_t low = parse_hex4();
            if (low >= 0xDC00 && low <= 0xDFFF) {
              code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
            } else {
              pos_ = before;  // not a pair: the next escape is read on its own
            }
          }
          if (code >= 0xD800 && code <= 0xDFFF) code = 0xFFFD;  // a lone surrogate
          append_utf8(out, code);
          break;
        }
        default:
          pos_ -= 2;
          fail("bad escape in a string");
      }
    }
  }

  std::string_view text_;
  size_t pos_ = 0;
};

[[noreturn]] void value_error(const std::string& path, const std::string& expected,
                              const JsonValue& value) {
  frame_error(path + ": expected " + expected + " at byte " + std::to_string(value.offset));
}

template <class T>
void read_integer(const JsonValue& value, T& out, const std::string& path) {
  const char* expected = std::is_signed_v<T> ? "an integer" : "an unsigned integer";
  if (value.kind != JsonValue::Kind::Number) value_error(path, expected, value);
  const char* first = value.text.data();
  const char* last = first + value.text.size();
  T parsed{};
  const auto [end, ec] = std::from_chars(first, last, parsed);
  if (ec == std::errc() && end == last) {
    out = parsed;
    return;
  }
  if (ec == std::errc::result_out_of_range)
    value_error(path, std::string(expected) + " in range", value);
  // Written as a fraction or with an exponent ("3.0", "1e3"): taken when it is whole.
  double real = 0;
  const auto [real_end, real_ec] = std::from_chars(first, last, real);
  const bool whole = real_ec == std::errc() && real_end == last && std::trunc(real) == real;
  const bool in_range = real >= static_cast<double>(std::numeric_limits<T>::min()) &&
                        real < std::ldexp(1.0, std::numeric_limits<T>::digits);
  if (!whole || !in_range) value_error(path, expected, value);
  out = static_cast<T>(real);
}

template <class T>
void read_value(const JsonValue& value, T& out, const std::string& path) {
  if (value.kind == JsonValue::Kind::Null) return;  // as if missing: the default stays
  if constexpr (std::is_same_v<T, bool>) {
    if (value.kind != JsonValue::Kind::Bool) value_error(path, "true or false", value);
    out = value.boolean;
  } else if constexpr (std::is_integral_v<T>) {
    read_integer(value, out, path);
  } else if constexpr (std::is_floating_point_v<T>) {
    if (value.kind != JsonValue::Kind::Number) value_error(path, "a number", value);
    double parsed = 0;
    const char* last = value.text.data() + value.text.size();
    const auto [end, ec] = std::from_chars(value.text.data(), last, parsed);
    if (ec != std::errc() || end != last) value_error(path, "a finite number", value);
    out = static_cast<T>(parsed);
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (value.kind != JsonValue::Kind::String) value_error(path, "a string", value);
    out = value.text;
  } else if constexpr (std::is_same_v<T, Ledger>) {
    if (value.kind != JsonValue::Kind::Object) value_error(path, "an object", value);
    for (size_t c = 0; c < kMemoryCategoryCount; ++c) {
      const std::string_view name = memory_category_name(static_cast<MemoryCategory>(c));
      if (const JsonValue* m = value.member(name)) {
        read_value(*m, out[c], path + "." + std::string(name));
      }
    }
  } else if constexpr (kIsVector<T>) {
    if (value.kind != JsonValue::Kind::Array) value_error(path, "an array", value);
    out.clear();
    out.reserve(value.items.size());
    for (size_t i = 0; i < value.items.size(); ++i) {
      typename T::value_type item{};
      read_value(value.items[i], item, path + "[" + std::to_string(i) + "]");
      out.push_back(std::move(item));
    }
  } else {
    static_assert(kAlwaysFalse<T>, "telemetry_json: a field type the reader does not know");
  }
}

template <class Section>
void read_section(const JsonValue& value, Section& section, const std::string& path) {
  if (value.kind != JsonValue::Kind::Object) value_error(path, "an object", value);
  section.for_each_field([&](std::string_view name, auto& field) {
    if (const JsonValue* m = value.member(name))
      read_value(*m, field, path + "." + std::string(name));
  });
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

TelemetrySnapshot telemetry_from_json(std::string_view line, double* t_seconds) {
  const JsonValue root = Parser(line).parse_document();
  if (root.kind != JsonValue::Kind::Object) {
    frame_error("expected an object at byte " + std::to_string(root.offset));
  }
  TelemetrySnapshot snapshot;
  double t = 0;
  if (const JsonValue* m = root.member("t")) read_value(*m, t, "t");
  for_each_section(snapshot, [&](std::string_view name, auto& section) {
    if (const JsonValue* m = root.member(name)) read_section(*m, section, std::string(name));
  });
  if (const JsonValue* m = root.member("sequences"); m && m->kind != JsonValue::Kind::Null) {
    if (m->kind != JsonValue::Kind::Array) value_error("sequences", "an array", *m);
    for (size_t i = 0; i < m->items.size(); ++i) {
      SequenceTelemetry sequence;
      read_section(m->items[i], sequence, "sequences[" + std::to_string(i) + "]");
      snapshot.sequences.push_back(std::move(sequence));
    }
  }
  if (t_seconds != nullptr) *t_seconds = t;
  return snapshot;
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

double TelemetryRecorder::seconds_since_start() const {
  return std::chrono::duration<double>(Clock::now() - start_).count();
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
