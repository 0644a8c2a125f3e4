// arbiter/backends/backend_files.h — the model files a backend reads, and
// their size: the runtime's first estimate of a backend's footprint before
// it has measured one.
//
// Thread safety: thread-safe (reads the file system only).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace arbiter {

// Σ sizes in bytes of the regular files among `paths` (directories are
// summed recursively; missing paths count 0).
uint64_t FilesBytes(const std::vector<std::string>& paths);

}  // namespace arbiter
