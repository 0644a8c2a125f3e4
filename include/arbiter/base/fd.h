// arbiter/base/fd.h — RAII owners of two kernel resources: a file
// descriptor (UniqueFd) and a memory mapping (Mapping). Every fd and every
// mmap region the runtime keeps past one statement is owned by one of them,
// so an early return never leaks one and a moved-from owner never closes or
// unmaps twice.
//
//   ARBITER_ASSIGN_OR_RETURN(UniqueFd fd, UniqueFd::Open(path, O_RDONLY | O_CLOEXEC));
//   ARBITER_ASSIGN_OR_RETURN(
//       Mapping m, Mapping::Map(size, PROT_READ, MAP_PRIVATE, fd.get(), path));
//   fd.reset();  // the mapping stays valid after its fd is closed
//   Use(m.data(), m.size_bytes());
//   // m munmaps when it goes out of scope
//
// Ownership: both are move-only. The destructor (and reset()) closes the fd
// / munmaps the region; a moved-from owner is empty and releases nothing.
// release() hands the resource to the caller, who then closes or unmaps it.
// Failing factories own nothing (no fd is open, nothing is mapped).
//
// Thread safety: thread-compatible. Distinct objects may be used from
// distinct threads; one object needs external synchronization if any thread
// mutates it (move, reset, release). The const accessors are safe to call
// concurrently. Reading or writing the mapped bytes is the caller's to
// synchronize.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "arbiter/base/status.h"

namespace arbiter {

// The canonical code for an errno value: ENOENT → kNotFound, EACCES/EPERM →
// kPermissionDenied, ENOSPC/EDQUOT/ENOMEM/EFBIG → kResourceExhausted, EISDIR
// → kInvalidArgument, anything else → kInternal. The message is
// "<what>: <strerror(err)>".
Status ErrnoToStatus(int err, std::string_view what);

// Owns one file descriptor (or none: get() == -1).
class UniqueFd {
 public:
  UniqueFd() = default;
  // Takes ownership of `fd` (a negative value means "none").
  explicit UniqueFd(int fd) : fd_(fd < 0 ? -1 : fd) {}
  UniqueFd(UniqueFd&& o) noexcept;
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();

  // open(2), retried on EINTR. Errors: ErrnoToStatus(errno, "open <path>").
  static Result<UniqueFd> Open(const char* path, int flags, mode_t mode = 0);

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives up ownership: returns the fd (or -1) and leaves this empty.
  [[nodiscard]] int release();
  // Closes the owned fd (if any), then owns `fd`. Errors of close(2) are
  // ignored; use Close() where they matter.
  void reset(int fd = -1);
  // Closes the owned fd now and reports close(2)'s result: 0, or the errno.
  // Empty afterwards either way (Linux releases the fd even on error). An
  // empty UniqueFd returns 0.
  int Close();

 private:
  int fd_ = -1;
};

// Owns one mmap region [data(), data() + size_bytes()) (or none).
class Mapping {
 public:
  Mapping() = default;
  // Takes ownership of a region mmap returned (`addr` page-aligned,
  // `size_bytes` > 0). A null `addr` means "none".
  Mapping(void* addr, size_t size_bytes);
  Mapping(Mapping&& o) noexcept;
  Mapping& operator=(Mapping&& o) noexcept;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping();

  // mmap(nullptr, size_bytes, prot, flags, fd, offset_bytes). `what` names
  // the file or the purpose for the error ("shared region /arbiter-x",
  // "host floor of chat"). Pass fd = -1 with MAP_ANONYMOUS.
  // Errors: kInvalidArgument for size_bytes == 0 (mmap refuses it; callers
  // that allow empty files handle that case themselves); otherwise
  // ErrnoToStatus(errno, "mmap <what> (<size_bytes> bytes)"), so ENOMEM is
  // kResourceExhausted and EACCES kPermissionDenied.
  static Result<Mapping> Map(size_t size_bytes, int prot, int flags, int fd,
                             std::string_view what, off_t offset_bytes = 0);

  uint8_t* data() const { return static_cast<uint8_t*>(addr_); }
  size_t size_bytes() const { return size_bytes_; }
  bool valid() const { return addr_ != nullptr; }
  // Gives up ownership: returns the address (or nullptr); the caller now
  // munmaps [addr, addr + size_bytes()) — read size_bytes() first.
  [[nodiscard]] void* release();
  // Unmaps the owned region (if any); empty afterwards.
  void reset();

 private:
  void* addr_ = nullptr;
  size_t size_bytes_ = 0;
};

}  // namespace arbiter
