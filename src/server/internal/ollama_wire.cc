// The small pieces of Ollama's wire format (server/internal/ollama.h):
// keep_alive durations (Go's time.ParseDuration units), model names with
// the ":latest" tag, RFC 3339 times and done_reason. The request parsers are
// in ollama.cc.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <limits>

#include <fmt/format.h>

#include "server/internal/json_fields.h"
#include "server/internal/ollama.h"

namespace arbiter::server_internal {
namespace {

// Go's time.ParseDuration units, in nanoseconds.
std::optional<double> UnitNs(std::string_view u) {
  if (u == "ns") return 1.0;
  if (u == "us" || u == "µs" || u == "μs") return 1e3;
  if (u == "ms") return 1e6;
  if (u == "s") return 1e9;
  if (u == "m") return 60e9;
  if (u == "h") return 3600e9;
  return std::nullopt;
}

// A keep_alive of `seconds` (maybe ±infinity). Negative, or as long as Go's
// largest time.Duration (2^63 − 1 ns, ~292 years) or longer, is Ollama's
// "forever": no TTL. So every TTL set fits the arbiter's int64 milliseconds
// and every expires_at computed from it is a real date.
OllamaKeepAlive FromSeconds(double seconds) {
  if (seconds < 0 || seconds * 1000 >= static_cast<double>(kOllamaForeverMs)) {
    return OllamaKeepAlive{std::nullopt};
  }
  return OllamaKeepAlive{static_cast<int64_t>(std::llround(seconds * 1000))};
}

}  // namespace

Result<OllamaKeepAlive> ParseKeepAlive(const RequestJson& v) {
  constexpr const char* kWhat =
      "a duration: seconds as a number, or a string such as \"5m\", \"30s\", \"1h30m\", \"0\" or "
      "\"-1\"";
  if (v.is_number()) {
    const double s = v.get<double>();
    if (!std::isfinite(s)) return TypeError("keep_alive", kWhat);
    return FromSeconds(s);
  }
  if (!v.is_string()) return TypeError("keep_alive", kWhat);
  const std::string text = v.get<std::string>();
  if (text.empty()) return TypeError("keep_alive", kWhat);
  // A bare number in a string is seconds, as Ollama reads it.
  {
    char* end = nullptr;
    const double s = std::strtod(text.c_str(), &end);
    if (end != nullptr && *end == '\0' && std::isfinite(s)) return FromSeconds(s);
  }
  // Go's duration: [-+]? (number unit)+.
  size_t p = 0;
  double sign = 1;
  if (text[p] == '-' || text[p] == '+') sign = text[p++] == '-' ? -1 : 1;
  double total_ns = 0;
  bool any = false;
  while (p < text.size()) {
    const size_t num_start = p;
    while (p < text.size() && (std::isdigit(static_cast<unsigned char>(text[p])) || text[p] == '.')) ++p;
    if (p == num_start) return TypeError("keep_alive", kWhat);
    const double n = std::strtod(text.substr(num_start, p - num_start).c_str(), nullptr);
    const size_t unit_start = p;
    while (p < text.size() && !std::isdigit(static_cast<unsigned char>(text[p])) && text[p] != '.') ++p;
    std::optional<double> unit = UnitNs(std::string_view(text).substr(unit_start, p - unit_start));
    if (!unit) return TypeError("keep_alive", kWhat);
    total_ns += n * *unit;
    any = true;
  }
  if (!any) return TypeError("keep_alive", kWhat);
  return FromSeconds(sign * total_ns / 1e9);
}

std::string OllamaStripTag(std::string_view model) {
  constexpr std::string_view kLatest = ":latest";
  if (model.size() > kLatest.size() &&
      model.compare(model.size() - kLatest.size(), kLatest.size(), kLatest) == 0) {
    model.remove_suffix(kLatest.size());
  }
  return std::string(model);
}

std::string OllamaTagged(std::string_view model) { return fmt::format("{}:latest", model); }

std::string OllamaTime(int64_t unix_s, int64_t ns) {
  // RFC 3339 has four-digit years: clamp to 0001-01-01 .. 9999-12-31.
  constexpr int64_t kFirst = -62135596800;  // 0001-01-01T00:00:00Z
  constexpr int64_t kLast = 253402300799;   // 9999-12-31T23:59:59Z
  // Carry whole seconds out of `ns` so the fraction is in [0, 1e9) (after a
  // first clamp that leaves room for the carry, ≤ 9.3e9 s either way).
  constexpr int64_t kCarryRoom = int64_t{10000000000};
  unix_s = std::clamp(unix_s, kFirst - kCarryRoom, kLast + kCarryRoom);
  unix_s += ns / 1000000000;
  ns %= 1000000000;
  if (ns < 0) {
    ns += 1000000000;
    --unix_s;
  }
  if (unix_s < kFirst) {
    unix_s = kFirst;
    ns = 0;
  } else if (unix_s > kLast) {
    unix_s = kLast;
    ns = 999999999;
  }
  const std::time_t secs = static_cast<std::time_t>(unix_s);
  std::tm tm{};
  if (gmtime_r(&secs, &tm) == nullptr) return "1970-01-01T00:00:00.000000000Z";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%09lldZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<long long>(ns));
  return buf;
}

std::string_view OllamaDoneReason(FinishReason reason) {
  return reason == FinishReason::kLength ? "length" : "stop";
}

}  // namespace arbiter::server_internal
