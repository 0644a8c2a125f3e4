// arbiter/base/file.h — files: read-only memory maps, whole-file reads and
// crash-safe writes.
//
// Atomic write protocol (the project's rule "no partial file is ever left
// where a good one was"): write to "<path>.tmp.<pid>.<n>" in the same
// directory, fsync it, rename over <path>, fsync the directory. On any error
// the temp file is removed and <path> is untouched. The writeback of each
// 4 MiB written is started right away (sync_file_range), so the final fsync
// waits only for the tail (Note [Writeback while writing], file.cc).
//
// Thread safety: MappedFile is immutable after Open (thread-safe reads);
// the free functions are thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "arbiter/base/fd.h"
#include "arbiter/base/status.h"

namespace arbiter {

// A read-only, private mmap of a whole file (a Mapping, arbiter/base/fd.h,
// plus the path). Move-only; unmaps on destruction; a moved MappedFile
// keeps its mapping's address. The file's fd is closed before Open returns.
class MappedFile {
 public:
  // Errors: kNotFound (no such file), kPermissionDenied, kInvalidArgument
  // (a directory), kInternal for other OS errors; messages name the path.
  // An empty file maps to data()==nullptr, size()==0. `populate`: the whole
  // file is read and mapped now (MAP_POPULATE), for a caller about to read
  // every byte (one kernel pass instead of a page fault per 64 KiB).
  static Result<MappedFile> Open(const std::string& path, bool populate = false);

  MappedFile() = default;
  MappedFile(MappedFile&& o) noexcept = default;
  MappedFile& operator=(MappedFile&& o) noexcept = default;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() = default;

  const uint8_t* data() const { return mapping_.data(); }
  size_t size() const { return mapping_.size_bytes(); }
  const std::string& path() const { return path_; }

 private:
  Mapping mapping_;
  std::string path_;
};

// Reads the whole file. Errors as MappedFile::Open; kResourceExhausted when
// the file exceeds `max_bytes`.
Result<std::string> ReadFile(const std::string& path, size_t max_bytes = size_t{1} << 30);

// Writes `data` to `path` atomically (see the protocol above). `mode`: the
// new file's permission bits (before the umask).
Status WriteFileAtomic(const std::string& path, std::string_view data, unsigned mode = 0644);

// Same, streaming: `writer` is called with a function that appends bytes to
// the temp file; returning a non-OK Status aborts and removes the temp file.
Status WriteFileAtomicStreaming(
    const std::string& path,
    const std::function<Status(const std::function<Status(const void*, size_t)>& append)>& writer,
    unsigned mode = 0644);

}  // namespace arbiter
