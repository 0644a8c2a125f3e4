#include "arbiter/base/size.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <string>

namespace arbiter {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

Result<uint64_t> ParseSize(std::string_view text, uint64_t percent_base_bytes) {
  const std::string quoted = "size \"" + std::string(text) + "\"";
  size_t b = 0, e = text.size();
  while (b < e && std::isspace(static_cast<unsigned char>(text[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(text[e - 1]))) --e;
  std::string_view t = text.substr(b, e - b);
  if (t.empty()) return InvalidArgumentError(quoted + " is empty; use e.g. 512MiB, 2GB, 75% or a byte count");

  size_t i = 0;
  bool seen_digit = false, seen_dot = false;
  while (i < t.size() && (std::isdigit(static_cast<unsigned char>(t[i])) || t[i] == '.')) {
    if (t[i] == '.') {
      if (seen_dot) return InvalidArgumentError(quoted + " has two decimal points");
      seen_dot = true;
    } else {
      seen_digit = true;
    }
    ++i;
  }
  if (!seen_digit) {
    return InvalidArgumentError(quoted + " does not start with a number; use e.g. 512MiB, 2GB, 75% or a byte count");
  }
  std::string number(t.substr(0, i));
  std::string_view unit_raw = t.substr(i);
  while (!unit_raw.empty() && unit_raw.front() == ' ') unit_raw.remove_prefix(1);
  const std::string unit = Lower(unit_raw);

  long double multiplier = 1;
  if (unit.empty() || unit == "b") {
    multiplier = 1;
  } else if (unit == "%") {
    if (percent_base_bytes == 0) return InvalidArgumentError(quoted + ": a percentage is not allowed here");
    multiplier = static_cast<long double>(percent_base_bytes) / 100.0L;
  } else if (unit == "k" || unit == "kib") {
    multiplier = 1024.0L;
  } else if (unit == "m" || unit == "mib") {
    multiplier = 1024.0L * 1024;
  } else if (unit == "g" || unit == "gib") {
    multiplier = 1024.0L * 1024 * 1024;
  } else if (unit == "t" || unit == "tib") {
    multiplier = 1024.0L * 1024 * 1024 * 1024;
  } else if (unit == "kb") {
    multiplier = 1e3L;
  } else if (unit == "mb") {
    multiplier = 1e6L;
  } else if (unit == "gb") {
    multiplier = 1e9L;
  } else if (unit == "tb") {
    multiplier = 1e12L;
  } else {
    return InvalidArgumentError(quoted + " has unknown unit \"" + std::string(unit_raw) +
                                "\"; use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB or %");
  }
  if (seen_dot && unit.empty()) {
    return InvalidArgumentError(quoted + ": a byte count must be a whole number");
  }
  long double value = std::strtold(number.c_str(), nullptr);
  if (unit == "%" && value > 100.0L) {
    return InvalidArgumentError(quoted + ": a percentage must be at most 100%");
  }
  long double bytes = std::floor(value * multiplier);
  if (!(bytes < 18446744073709551615.0L)) return InvalidArgumentError(quoted + " is too large");
  return static_cast<uint64_t>(bytes);
}

std::string FormatSize(uint64_t size_bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(size_bytes);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0) {
    std::snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(size_bytes));
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f %s", v, kUnits[u]);
  }
  return buf;
}

}  // namespace arbiter
