// arbiter/memory/system_memory.h — what the OS says about RAM.
//
// Reads /proc/meminfo (Linux): MemTotal and MemAvailable, in bytes.
// Errors: kUnavailable when the file cannot be read; kDataLoss when the
// fields are missing or malformed (message names the field).
//
// Thread safety: thread-safe (reads a file each call).
#pragma once

#include <cstdint>
#include <string>

#include "arbiter/base/status.h"

namespace arbiter {

struct SystemMemoryInfo {
  uint64_t total_bytes = 0;      // MemTotal
  uint64_t available_bytes = 0;  // MemAvailable
};

// Parses meminfo text (the format of /proc/meminfo: "Key:   123 kB").
Result<SystemMemoryInfo> ParseMemInfo(const std::string& text);
// Reads `path` (default /proc/meminfo).
Result<SystemMemoryInfo> ReadSystemMemory(const std::string& path = "/proc/meminfo");

}  // namespace arbiter
