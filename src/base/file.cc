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

namespace arbiter {
namespace {

Status ErrnoStatus(int err, const std::string& what) {
  std::string msg = what + ": " + std::strerror(err);
  switch (err) {
    case ENOENT: return NotFoundError(msg);
    case EACCES:
    case EPERM: return PermissionDeniedError(msg);
    case ENOSPC:
    case EDQUOT: return ResourceExhaustedError(msg);
    case EISDIR: return InvalidArgumentError(msg);
    default: return InternalError(msg);
  }
}

Status WriteAll(int fd, const void* data, size_t n, const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "write " + path);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return OkStatus();
}

}  // namespace

Result<MappedFile> MappedFile::Open(const std::string& path, bool populate) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "open " + path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoStatus(err, "stat " + path);
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return InvalidArgumentError(path + " is a directory, not a file");
  }
  MappedFile f;
  f.path_ = path;
  f.size_ = static_cast<size_t>(st.st_size);
  if (f.size_ > 0) {
    void* p = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE | (populate ? MAP_POPULATE : 0),
                     fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      return ErrnoStatus(err, "mmap " + path);
    }
    f.data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return f;
}

MappedFile::MappedFile(MappedFile&& o) noexcept
    : data_(o.data_), size_(o.size_), path_(std::move(o.path_)) {
  o.data_ = nullptr;
  o.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
    data_ = o.data_;
    size_ = o.size_;
    path_ = std::move(o.path_);
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

Result<std::string> ReadFile(const std::string& path, size_t max_bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "open " + path);
  struct stat st;
  if (::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    ::close(fd);
    return InvalidArgumentError(path + " is a directory, not a file");
  }
  std::string out;
  char buf[1 << 16];
  while (true) {
    ssize_t r = ::read(fd, buf, sizeof(buf));
    if (r < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return ErrnoStatus(err, "read " + path);
    }
    if (r == 0) break;
    if (out.size() + static_cast<size_t>(r) > max_bytes) {
      ::close(fd);
      return ResourceExhaustedError(path + " is larger than the limit of " +
                                    std::to_string(max_bytes) + " bytes");
    }
    out.append(buf, static_cast<size_t>(r));
  }
  ::close(fd);
  return out;
}

// Note [Writeback while writing]
// The atomic write ends in an fsync, which waits for every dirty page of the
// temp file to reach the disk. Written as one stream and synced at the end,
// the copy into the page cache and the disk's writeback run one after the
// other: for a 32.8 MB KV file in this VM, write() ~7 ms, then fsync
// 11–16 ms. Every kWritebackChunkBytes appended, sync_file_range(WRITE)
// starts the writeback of that chunk without waiting for it, so the disk
// works while the next chunk is copied, and the final fsync waits only for
// the tail. Standalone (32.8 MB, write + fsync + rename + directory fsync,
// 10 alternating runs): 26.6 ms p50 as one stream, 19.3 ms with 4 MiB
// chunks (1 MiB: 19.6, 8 MiB: 21.1). Durability is unchanged: the fsync
// still decides success. sync_file_range is Linux-only and best-effort (its
// errors are ignored; the fsync reports them).
constexpr size_t kWritebackChunkBytes = size_t{4} << 20;

Status WriteFileAtomicStreaming(
    const std::string& path,
    const std::function<Status(const std::function<Status(const void*, size_t)>&)>& writer,
    unsigned mode) {
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." +
                          std::to_string(counter.fetch_add(1));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, static_cast<mode_t>(mode));
  if (fd < 0) return ErrnoStatus(errno, "create " + tmp);
  auto fail = [&](Status s) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return s;
  };
  uint64_t written = 0;  // bytes appended so far
  uint64_t flushed = 0;  // writeback started for [0, flushed)
  Status s = writer([&](const void* data, size_t n) -> Status {
    const auto* p = static_cast<const uint8_t*>(data);
    while (n > 0) {  // Note [Writeback while writing]
      const size_t part = std::min<size_t>(n, kWritebackChunkBytes - (written - flushed));
      ARBITER_RETURN_IF_ERROR(WriteAll(fd, p, part, tmp));
      p += part;
      n -= part;
      written += part;
      if (written - flushed == kWritebackChunkBytes) {
        ::sync_file_range(fd, static_cast<off64_t>(flushed),
                          static_cast<off64_t>(written - flushed), SYNC_FILE_RANGE_WRITE);
        flushed = written;
      }
    }
    return OkStatus();
  });
  if (!s.ok()) return fail(s);
  if (::fsync(fd) != 0) return fail(ErrnoStatus(errno, "fsync " + tmp));
  if (::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoStatus(err, "close " + tmp);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoStatus(err, "rename " + tmp + " to " + path);
  }
  // Make the rename durable.
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return OkStatus();
}

Status WriteFileAtomic(const std::string& path, std::string_view data, unsigned mode) {
  return WriteFileAtomicStreaming(
      path, [&](const auto& append) { return append(data.data(), data.size()); }, mode);
}

}  // namespace arbiter
