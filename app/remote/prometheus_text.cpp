// The text format: `name{label="value",…} value [timestamp]`, label values with \\, \" and \n
// escapes; NaN, +Inf and -Inf as values.
#include "remote/prometheus_text.h"

#include <cmath>
#include <cstdlib>
#include <limits>

namespace granule::remote {
namespace {

bool name_char(char c, bool first) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
         (!first && c >= '0' && c <= '9');
}

std::optional<double> parse_value(std::string_view text) {
  if (text == "NaN") return std::numeric_limits<double>::quiet_NaN();
  if (text == "+Inf" || text == "Inf") return std::numeric_limits<double>::infinity();
  if (text == "-Inf") return -std::numeric_limits<double>::infinity();
  const std::string copy(text);
  char* end = nullptr;
  const double value = std::strtod(copy.c_str(), &end);
  if (end == copy.c_str() || *end != '\0') return std::nullopt;
  return value;
}

// One sample line, or nothing when it cannot be read.
std::optional<PrometheusSample> parse_line(std::string_view line) {
  PrometheusSample s;
  size_t i = 0;
  while (i < line.size() && name_char(line[i], i == 0)) ++i;
  if (i == 0) return std::nullopt;
  s.name = std::string(line.substr(0, i));
  if (i < line.size() && line[i] == '{') {
    ++i;
    while (true) {
      while (i < line.size() && (line[i] == ' ' || line[i] == ',')) ++i;
      if (i < line.size() && line[i] == '}') {
        ++i;
        break;
      }
      const size_t name_begin = i;
      while (i < line.size() && name_char(line[i], i == name_begin)) ++i;
      if (i == name_begin || i + 1 >= line.size() || line[i] != '=' || line[i + 1] != '"') {
        return std::nullopt;
      }
      const std::string label(line.substr(name_begin, i - name_begin));
      i += 2;
      std::string value;
      while (i < line.size() && line[i] != '"') {
        if (line[i] == '\\' && i + 1 < line.size()) {
          ++i;
          value.push_back(line[i] == 'n' ? '\n' : line[i]);
        } else {
          value.push_back(line[i]);
        }
        ++i;
      }
      if (i >= line.size()) return std::nullopt;  // an unterminated label value
      ++i;
      s.labels[label] = std::move(value);
    }
  }
  while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
  size_t end = i;
  while (end < line.size() && line[end] != ' ' && line[end] != '\t') ++end;
  const std::optional<double> value = parse_value(line.substr(i, end - i));
  if (!value) return std::nullopt;
  s.value = *value;
  return s;
}

}  // namespace

PrometheusText parse_prometheus_text(std::string_view text) {
  PrometheusText out;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(begin, end - begin);
    begin = end + 1;
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.remove_suffix(1);
    while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    if (line.empty() || line.front() == '#') continue;
    if (std::optional<PrometheusSample> s = parse_line(line)) {
      out.samples.push_back(std::move(*s));
    } else {
      ++out.skipped_lines;
    }
  }
  return out;
}

std::optional<double> PrometheusText::sum(std::string_view name) const {
  std::optional<double> total;
  for (const PrometheusSample& s : samples) {
    if (s.name == name) total = total.value_or(0) + s.value;
  }
  return total;
}

std::optional<double> PrometheusText::mean(std::string_view name) const {
  double total = 0;
  int count = 0;
  for (const PrometheusSample& s : samples) {
    if (s.name == name) {
      total += s.value;
      ++count;
    }
  }
  if (count == 0) return std::nullopt;
  return total / count;
}

bool PrometheusText::has_prefix(std::string_view prefix) const {
  for (const PrometheusSample& s : samples) {
    if (s.name.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

}  // namespace granule::remote
