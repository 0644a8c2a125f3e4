#include "arbiter/base/file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

namespace arbiter {
namespace {

Status WriteAll(int fd, const void* data, size_t n, const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, "write " + path);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return OkStatus();
}

}  // namespace

Result<MappedFile> MappedFile::Open(const std::string& path, bool populate) {
  ARBITER_ASSIGN_OR_RETURN(UniqueFd fd, UniqueFd::Open(path.c_str(), O_RDONLY | O_CLOEXEC));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoToStatus(errno, "stat " + path);
  if (S_ISDIR(st.st_mode)) return InvalidArgumentError(path + " is a directory, not a file");
  MappedFile f;
  f.path_ = path;
  const size_t size = static_cast<size_t>(st.st_size);
  if (size > 0) {
    ARBITER_ASSIGN_OR_RETURN(
        f.mapping_, Mapping::Map(size, PROT_READ, MAP_PRIVATE | (populate ? MAP_POPULATE : 0),
                                 fd.get(), path));
  }
  return f;  // closing the fd leaves the mapping valid
}

Result<std::string> ReadFile(const std::string& path, size_t max_bytes) {
  ARBITER_ASSIGN_OR_RETURN(UniqueFd fd, UniqueFd::Open(path.c_str(), O_RDONLY | O_CLOEXEC));
  struct stat st;
  if (::fstat(fd.get(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return InvalidArgumentError(path + " is a directory, not a file");
  }
  std::string out;
  char buf[1 << 16];
  while (true) {
    ssize_t r = ::read(fd.get(), buf, sizeof(buf));
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, "read " + path);
    }
    if (r == 0) break;
    if (out.size() + static_cast<size_t>(r) > max_bytes) {
      return ResourceExhaustedError(path + " is larger than the limit of " +
                                    std::to_string(max_bytes) + " bytes");
    }
    out.append(buf, static_cast<size_t>(r));
  }
  return out;
}

// Note [Writeback while writing]
// The atomic write ends in an fsync, which waits for every dirty page of the
// temp file to reach the disk. Written as one stream and synced at the end,
// the copy into the page cache and the disk's writeback run one after the
// other. Every kWritebackChunkBytes appended, sync_file_range(WRITE) starts
// the writeback of that chunk without waiting for it, so the disk works
// while the next chunk is copied, and the final fsync waits only for the
// tail. The chunk size was chosen by measurement (docs/BENCHMARKS.md,
// "Atomic file writes"). Durability is unchanged: the fsync still decides
// success. sync_file_range is Linux-only and best-effort (its
// errors are ignored; the fsync reports them).
constexpr size_t kWritebackChunkBytes = size_t{4} << 20;

Status WriteFileAtomicStreaming(
    const std::string& path,
    const std::function<Status(const std::function<Status(const void*, size_t)>&)>& writer,
    unsigned mode) {
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." +
                          std::to_string(counter.fetch_add(1));
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
                     static_cast<mode_t>(mode)));
  if (!fd.valid()) return ErrnoToStatus(errno, "create " + tmp);
  auto fail = [&](Status s) {
    fd.reset();
    ::unlink(tmp.c_str());
    return s;
  };
  uint64_t written = 0;  // bytes appended so far
  uint64_t flushed = 0;  // writeback started for [0, flushed)
  Status s = writer([&](const void* data, size_t n) -> Status {
    const auto* p = static_cast<const uint8_t*>(data);
    while (n > 0) {  // Note [Writeback while writing]
      const size_t part = std::min<size_t>(n, kWritebackChunkBytes - (written - flushed));
      ARBITER_RETURN_IF_ERROR(WriteAll(fd.get(), p, part, tmp));
      p += part;
      n -= part;
      written += part;
      if (written - flushed == kWritebackChunkBytes) {
        ::sync_file_range(fd.get(), static_cast<off64_t>(flushed),
                          static_cast<off64_t>(written - flushed), SYNC_FILE_RANGE_WRITE);
        flushed = written;
      }
    }
    return OkStatus();
  });
  if (!s.ok()) return fail(s);
  if (::fsync(fd.get()) != 0) return fail(ErrnoToStatus(errno, "fsync " + tmp));
  if (const int err = fd.Close(); err != 0) {
    ::unlink(tmp.c_str());
    return ErrnoToStatus(err, "close " + tmp);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoToStatus(err, "rename " + tmp + " to " + path);
  }
  // Make the rename durable.
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  if (Result<UniqueFd> dfd = UniqueFd::Open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      dfd.ok()) {
    ::fsync(dfd->get());
  }
  return OkStatus();
}

Status WriteFileAtomic(const std::string& path, std::string_view data, unsigned mode) {
  return WriteFileAtomicStreaming(
      path, [&](const auto& append) { return append(data.data(), data.size()); }, mode);
}

}  // namespace arbiter
