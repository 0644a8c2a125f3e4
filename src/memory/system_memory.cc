#include "arbiter/memory/system_memory.h"

#include <array>
#include <cerrno>
#include <cstdlib>
#include <sstream>
#include <string_view>

#include "arbiter/base/file.h"

namespace arbiter {

namespace {

// The "Key:   123 kB" fields `keys` of `text` (a /proc file named `what`),
// in bytes, in the order of `keys`. Errors: kDataLoss naming a missing or
// malformed field.
template <size_t N>
Result<std::array<uint64_t, N>> ParseKbFields(const std::string& text,
                                              const std::array<std::string_view, N>& keys,
                                              std::string_view what) {
  std::array<uint64_t, N> out{};
  std::array<bool, N> seen{};
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string_view key(line.data(), colon);
    for (size_t i = 0; i < N; ++i) {
      if (key != keys[i]) continue;
      const char* p = line.c_str() + colon + 1;
      char* end = nullptr;
      errno = 0;
      unsigned long long kb = std::strtoull(p, &end, 10);
      if (end == p || errno != 0 || kb > UINT64_MAX / 1024) {
        return DataLossError(std::string(what) + " field " + std::string(key) +
                             " is not a number: \"" + line + "\"");
      }
      out[i] = kb * 1024;
      seen[i] = true;
    }
  }
  for (size_t i = 0; i < N; ++i) {
    if (!seen[i]) return DataLossError(std::string(what) + " has no " + std::string(keys[i]) + " field");
  }
  return out;
}

}  // namespace

Result<SystemMemoryInfo> ParseMemInfo(const std::string& text) {
  ARBITER_ASSIGN_OR_RETURN(auto v, ParseKbFields<2>(text, {"MemTotal", "MemAvailable"}, "meminfo"));
  return SystemMemoryInfo{v[0], v[1]};
}

Result<ProcessMemoryInfo> ParseProcessStatus(const std::string& text) {
  ARBITER_ASSIGN_OR_RETURN(
      auto v, ParseKbFields<3>(text, {"RssAnon", "RssFile", "RssShmem"}, "process status"));
  return ProcessMemoryInfo{v[0], v[1], v[2]};
}

Result<ProcessMemoryInfo> ReadProcessMemory(const std::string& path) {
  auto text = ReadFile(path, 1 << 20);
  if (!text.ok()) return UnavailableError("cannot read " + path + ": " + text.status().message());
  return ParseProcessStatus(*text);
}

Result<SystemMemoryInfo> ReadSystemMemory(const std::string& path) {
  auto text = ReadFile(path, 1 << 20);
  if (!text.ok()) return UnavailableError("cannot read " + path + ": " + text.status().message());
  return ParseMemInfo(*text);
}

}  // namespace arbiter
