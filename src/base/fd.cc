#include "arbiter/base/fd.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

namespace arbiter {

Status ErrnoToStatus(int err, std::string_view what) {
  std::string msg(what);
  msg += ": ";
  msg += std::strerror(err);
  switch (err) {
    case ENOENT: return NotFoundError(msg);
    case EACCES:
    case EPERM: return PermissionDeniedError(msg);
    case ENOSPC:
    case EDQUOT:
    case ENOMEM:
    case EFBIG: return ResourceExhaustedError(msg);
    case EISDIR: return InvalidArgumentError(msg);
    default: return InternalError(msg);
  }
}

// ---- UniqueFd ------------------------------------------------------------------

UniqueFd::UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) reset(std::exchange(o.fd_, -1));
  return *this;
}

UniqueFd::~UniqueFd() { reset(); }

Result<UniqueFd> UniqueFd::Open(const char* path, int flags, mode_t mode) {
  for (;;) {
    const int fd = ::open(path, flags, mode);
    if (fd >= 0) return UniqueFd(fd);
    if (errno != EINTR) {
      std::string what = "open ";
      what += path;
      return ErrnoToStatus(errno, what);
    }
  }
}

int UniqueFd::release() { return std::exchange(fd_, -1); }

void UniqueFd::reset(int fd) {
  const int old = std::exchange(fd_, fd < 0 ? -1 : fd);
  if (old >= 0) ::close(old);
}

int UniqueFd::Close() {
  const int old = std::exchange(fd_, -1);
  if (old < 0) return 0;
  // No retry on EINTR: Linux has released the fd already.
  return ::close(old) == 0 ? 0 : errno;
}

// ---- Mapping -------------------------------------------------------------------

Mapping::Mapping(void* addr, size_t size_bytes)
    : addr_(addr), size_bytes_(addr == nullptr ? 0 : size_bytes) {}

Mapping::Mapping(Mapping&& o) noexcept
    : addr_(std::exchange(o.addr_, nullptr)), size_bytes_(std::exchange(o.size_bytes_, 0)) {}

Mapping& Mapping::operator=(Mapping&& o) noexcept {
  if (this != &o) {
    reset();
    addr_ = std::exchange(o.addr_, nullptr);
    size_bytes_ = std::exchange(o.size_bytes_, 0);
  }
  return *this;
}

Mapping::~Mapping() { reset(); }

Result<Mapping> Mapping::Map(size_t size_bytes, int prot, int flags, int fd,
                             std::string_view what, off_t offset_bytes) {
  // Built by appending: gcc 12 raises a false -Wrestrict on
  // operator+(const char*, string&&) (GCC bug 105329).
  std::string label = "mmap ";
  label += what;
  if (size_bytes == 0) return InvalidArgumentError(label + ": cannot map 0 bytes");
  void* p = ::mmap(nullptr, size_bytes, prot, flags, fd, offset_bytes);
  if (p == MAP_FAILED) {
    const int err = errno;
    label += " (";
    label += std::to_string(size_bytes);
    label += " bytes)";
    return ErrnoToStatus(err, label);
  }
  return Mapping(p, size_bytes);
}

void* Mapping::release() {
  size_bytes_ = 0;
  return std::exchange(addr_, nullptr);
}

void Mapping::reset() {
  void* old = std::exchange(addr_, nullptr);
  const size_t n = std::exchange(size_bytes_, 0);
  if (old != nullptr) ::munmap(old, n);
}

}  // namespace arbiter
