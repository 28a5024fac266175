// parse_byte_size: a number and a unit, each checked by hand (no locale, no exponent, no sign).
#include "byte_size.h"

#include <cctype>
#include <cmath>
#include <string>

#include "granule/error.h"

namespace granule::cli {
namespace {

constexpr std::string_view kExample = "write it like 6GiB or 6144MiB";

bool is_space(char c) { return c == ' ' || c == '\t'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

std::string lower(std::string_view s) {
  std::string out;
  for (char c : s) out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Bytes per unit, or 0 for an unknown unit. "" is MiB: budgets are read in MiB or GiB.
double unit_bytes(std::string_view unit) {
  const std::string u = lower(unit);
  constexpr double kKi = 1024.0;
  if (u.empty()) return kKi * kKi;
  if (u == "b") return 1;
  if (u == "k" || u == "kib") return kKi;
  if (u == "m" || u == "mib") return kKi * kKi;
  if (u == "g" || u == "gib") return kKi * kKi * kKi;
  if (u == "t" || u == "tib") return kKi * kKi * kKi * kKi;
  if (u == "kb") return 1e3;
  if (u == "mb") return 1e6;
  if (u == "gb") return 1e9;
  if (u == "tb") return 1e12;
  return 0;
}

}  // namespace

uint64_t parse_byte_size(std::string_view text) {
  const std::string_view s = trim(text);
  const auto not_a_size = [&] {
    return UsageError("'" + std::string(text) + "' is not a size; " + std::string(kExample));
  };
  size_t end = 0;
  int digits = 0;
  int dots = 0;
  while (end < s.size() && (std::isdigit(static_cast<unsigned char>(s[end])) || s[end] == '.')) {
    if (s[end] == '.')
      ++dots;
    else
      ++digits;
    ++end;
  }
  if (digits == 0 || dots > 1) throw not_a_size();
  const double per_unit = unit_bytes(trim(s.substr(end)));
  if (per_unit == 0) throw not_a_size();
  // Digits and one dot only: std::stod cannot see a sign, an exponent or "inf" here.
  const double bytes = std::round(std::stod(std::string(s.substr(0, end))) * per_unit);
  if (bytes < 1)
    throw UsageError("'" + std::string(text) + "' is no memory at all; " + std::string(kExample));
  // 2^64 is exact in a double; anything from it up does not fit the result.
  if (bytes >= 18446744073709551616.0)
    throw UsageError("'" + std::string(text) + "' is larger than any memory; " +
                     std::string(kExample));
  return static_cast<uint64_t>(bytes);
}

}  // namespace granule::cli
