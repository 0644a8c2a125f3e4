// arbiter/memory/system_memory.h — what the OS says about RAM, and about
// this process's resident memory.
//
// Reads /proc/meminfo (Linux): MemTotal and MemAvailable; and
// /proc/self/status: RssAnon, RssFile, RssShmem. All in bytes.
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

// A process's resident memory by kind (/proc/PID/status).
struct ProcessMemoryInfo {
  uint64_t anon_bytes = 0;   // RssAnon: heap, stacks, anonymous mappings
  uint64_t file_bytes = 0;   // RssFile: mapped files (binary, libraries, models)
  uint64_t shmem_bytes = 0;  // RssShmem: shared memory (shm host floors)
  // What the ledger is compared with: the process's own memory, anonymous
  // and shared (docs/memory.md "The ledger is the truth"). File pages are
  // the page cache's, which the kernel drops on its own.
  uint64_t resident_bytes() const { return anon_bytes + shmem_bytes; }
};

// Parses the text of /proc/PID/status.
Result<ProcessMemoryInfo> ParseProcessStatus(const std::string& text);
// Reads `path` (default /proc/self/status).
Result<ProcessMemoryInfo> ReadProcessMemory(const std::string& path = "/proc/self/status");

}  // namespace arbiter
