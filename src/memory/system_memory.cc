#include "arbiter/memory/system_memory.h"

#include <cstdlib>
#include <sstream>

#include "arbiter/base/file.h"

namespace arbiter {

Result<SystemMemoryInfo> ParseMemInfo(const std::string& text) {
  SystemMemoryInfo info;
  bool have_total = false, have_avail = false;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    if (key != "MemTotal" && key != "MemAvailable") continue;
    const char* p = line.c_str() + colon + 1;
    char* end = nullptr;
    errno = 0;
    unsigned long long kb = std::strtoull(p, &end, 10);
    if (end == p || errno != 0) {
      return DataLossError("meminfo field " + key + " is not a number: \"" + line + "\"");
    }
    if (key == "MemTotal") {
      info.total_bytes = kb * 1024;
      have_total = true;
    } else {
      info.available_bytes = kb * 1024;
      have_avail = true;
    }
  }
  if (!have_total) return DataLossError("meminfo has no MemTotal field");
  if (!have_avail) return DataLossError("meminfo has no MemAvailable field");
  return info;
}

Result<SystemMemoryInfo> ReadSystemMemory(const std::string& path) {
  auto text = ReadFile(path, 1 << 20);
  if (!text.ok()) return UnavailableError("cannot read " + path + ": " + text.status().message());
  return ParseMemInfo(*text);
}

}  // namespace arbiter
