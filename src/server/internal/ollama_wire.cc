// The small pieces of Ollama's wire format (server/internal/ollama.h):
// keep_alive durations (Go's time.ParseDuration units), model names with
// the ":latest" tag, RFC 3339 times and done_reason. The request parsers are
// in ollama.cc.
#include <cmath>
#include <cstdio>
#include <ctime>
#include <limits>

#include <fmt/format.h>

#include "server/internal/json_fields.h"
#include "server/internal/ollama.h"

namespace arbiter::server_internal {
namespace {

using json = nlohmann::json;

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

OllamaKeepAlive FromSeconds(double seconds) {
  if (seconds < 0) return OllamaKeepAlive{std::nullopt};
  return OllamaKeepAlive{static_cast<int64_t>(std::llround(seconds * 1000))};
}

}  // namespace

Result<OllamaKeepAlive> ParseKeepAlive(const nlohmann::json& v) {
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
  const std::time_t secs = static_cast<std::time_t>(unix_s);
  std::tm tm{};
  gmtime_r(&secs, &tm);
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
