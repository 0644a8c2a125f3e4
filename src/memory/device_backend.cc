// memory/device_backend.cc — the cpu and fake device arenas.
//
// Both backends check every copy's range against the arena before touching
// anything (overflow-safe: offset ≤ arena and size ≤ arena − offset), so a
// bad offset from a caller is an error value, never a write past the arena.
//
// Note [Arena huge pages]
// The weight cache Discards a block when it evicts it (RSS must drop), so
// the next load of that block writes into pages the kernel has to fault in
// and zero again. With 4 KiB pages that first touch dominated a floor→arena
// load: one fault per 4 KiB page made the load several times slower than a
// memcpy into already-faulted memory, and the Discard itself was slow too.
// With the arena 2 MiB-aligned and MADV_HUGEPAGE, the same load runs close
// to memcpy speed: one fault per 2 MiB, each zeroing a page that the copy
// overwrites next (plausibly while it is still in cache), and the Discard is
// an order of magnitude cheaper (the figures, from `arbiter bench weights`:
// docs/BENCHMARKS.md "Weight runtime", "What changed"). Pre-faulting instead
// (MADV_POPULATE_WRITE of the block before the copy, or by a second thread
// a chunk ahead) was slower with either page size: it zeroes the whole
// block out of cache first, then the copy streams over it again. The
// alignment costs 2 MiB of extra address space at Create, trimmed at once.
#include "arbiter/memory/device_backend.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "arbiter/base/size.h"

namespace arbiter {
namespace {

Status CheckRange(std::string_view backend, uint64_t arena_bytes, uint64_t offset,
                  uint64_t size_bytes) {
  if (offset <= arena_bytes && size_bytes <= arena_bytes - offset) return OkStatus();
  return OutOfRangeError(std::string(backend) + " device: copy of " + std::to_string(size_bytes) +
                         " bytes at offset " + std::to_string(offset) +
                         " is outside the arena of " + std::to_string(arena_bytes) + " bytes");
}

}  // namespace

// ---- CpuDeviceBackend ---------------------------------------------------------

Result<std::unique_ptr<CpuDeviceBackend>> CpuDeviceBackend::Create(uint64_t arena_bytes,
                                                                   bool huge_pages) {
  Mapping arena_mapping;
  if (arena_bytes > 0) {
    const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    const bool huge = huge_pages && arena_bytes >= kHugePageBytes;
    const uint64_t slack = huge ? kHugePageBytes : 0;  // room to align the start
    if (arena_bytes > static_cast<uint64_t>(SIZE_MAX) - slack - page) {
      return ResourceExhaustedError("cpu device: arena of " + std::to_string(arena_bytes) +
                                    " bytes does not fit the address space");
    }
    const uint64_t length = (arena_bytes + page - 1) / page * page;
    void* p = ::mmap(nullptr, static_cast<size_t>(length + slack), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      return ResourceExhaustedError("cpu device: cannot map an arena of " +
                                    FormatSize(arena_bytes) + " (" + std::to_string(arena_bytes) +
                                    " bytes): " + std::strerror(err) +
                                    "; use a smaller arena");
    }
    uint8_t* arena = static_cast<uint8_t*>(p);
    if (huge) {  // Note [Arena huge pages]
      const uintptr_t start = reinterpret_cast<uintptr_t>(p);
      const uintptr_t aligned = (start + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
      const uintptr_t end = start + length + slack;
      if (aligned > start) ::munmap(p, aligned - start);
      if (end > aligned + length) {
        ::munmap(reinterpret_cast<void*>(aligned + length), end - (aligned + length));
      }
      arena = reinterpret_cast<uint8_t*>(aligned);
      // EINVAL without THP support: the arena works the same on base pages.
      (void)::madvise(arena, static_cast<size_t>(length), MADV_HUGEPAGE);
    }
    arena_mapping = Mapping(arena, static_cast<size_t>(length));
  }
  return std::unique_ptr<CpuDeviceBackend>(
      new CpuDeviceBackend(std::move(arena_mapping), arena_bytes));
}

CpuDeviceBackend::~CpuDeviceBackend() = default;

Status CpuDeviceBackend::CopyToDevice(uint64_t device_offset, const void* src,
                                      size_t size_bytes) {
  ARBITER_RETURN_IF_ERROR(CheckRange(name(), arena_bytes_, device_offset, size_bytes));
  if (size_bytes > 0) std::memcpy(arena_ + device_offset, src, size_bytes);
  return OkStatus();
}

Status CpuDeviceBackend::CopyFromDevice(uint64_t device_offset, void* dst, size_t size_bytes) {
  ARBITER_RETURN_IF_ERROR(CheckRange(name(), arena_bytes_, device_offset, size_bytes));
  if (size_bytes > 0) std::memcpy(dst, arena_ + device_offset, size_bytes);
  return OkStatus();
}

void* CpuDeviceBackend::HostPointer(uint64_t device_offset) {
  if (arena_ == nullptr || device_offset >= arena_bytes_) return nullptr;
  return arena_ + device_offset;
}

Status CpuDeviceBackend::Discard(uint64_t device_offset, size_t size_bytes) {
  ARBITER_RETURN_IF_ERROR(CheckRange(name(), arena_bytes_, device_offset, size_bytes));
  // Only whole pages inside the range: a partial page may be shared with a
  // neighbouring live block.
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t begin = (device_offset + page - 1) / page * page;
  const uint64_t end = (device_offset + size_bytes) / page * page;
  if (end > begin && ::madvise(arena_ + begin, static_cast<size_t>(end - begin),
                               MADV_DONTNEED) != 0) {
    const int err = errno;
    return InternalError("cpu device: madvise(DONTNEED) of " + std::to_string(end - begin) +
                         " bytes at offset " + std::to_string(begin) + ": " + std::strerror(err));
  }
  return OkStatus();
}

// ---- FakeDeviceBackend --------------------------------------------------------

Status FakeDeviceBackend::Discard(uint64_t device_offset, size_t size_bytes) {
  return CheckRange(name(), arena_bytes_, device_offset, size_bytes);
}

Status FakeDeviceBackend::CopyToDevice(uint64_t device_offset, const void* src,
                                       size_t size_bytes) {
  return Copy(/*to_device=*/true, device_offset, size_bytes);
}

Status FakeDeviceBackend::CopyFromDevice(uint64_t device_offset, void* dst, size_t size_bytes) {
  return Copy(/*to_device=*/false, device_offset, size_bytes);
}

Status FakeDeviceBackend::Copy(bool to_device, uint64_t device_offset, size_t size_bytes) {
  MutexLock lock(&mu_);
  if (fail_countdown_ > 0 && --fail_countdown_ == 0) {
    ++stats_.failed_copies;
    return Status(fail_code_, std::string("fake device: injected failure of the copy ") +
                                  (to_device ? "to" : "from") + " the device at offset " +
                                  std::to_string(device_offset) + " (" +
                                  std::to_string(size_bytes) + " bytes)");
  }
  Status range = CheckRange(name(), arena_bytes_, device_offset, size_bytes);
  if (!range.ok()) {
    ++stats_.failed_copies;
    return range;
  }
  if (to_device) {
    ++stats_.copies_to_device;
    stats_.bytes_to_device += size_bytes;
  } else {
    ++stats_.copies_from_device;
    stats_.bytes_from_device += size_bytes;
  }
  return OkStatus();
}

void FakeDeviceBackend::FailNthCopy(uint64_t nth, StatusCode code) {
  MutexLock lock(&mu_);
  fail_countdown_ = nth;
  fail_code_ = code == StatusCode::kOk ? StatusCode::kInternal : code;
}

FakeDeviceStats FakeDeviceBackend::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

// ---- factory --------------------------------------------------------------------

Result<std::unique_ptr<DeviceBackend>> MakeDeviceBackend(std::string_view kind,
                                                         uint64_t arena_bytes) {
  if (kind == "cpu") {
    ARBITER_ASSIGN_OR_RETURN(std::unique_ptr<CpuDeviceBackend> cpu,
                             CpuDeviceBackend::Create(arena_bytes));
    return std::unique_ptr<DeviceBackend>(std::move(cpu));
  }
  if (kind == "fake") {
    if (arena_bytes > FakeDeviceBackend::kMaxArenaBytes) {
      return InvalidArgumentError("fake device: arena of " + std::to_string(arena_bytes) +
                                  " bytes is above the limit of " +
                                  std::to_string(FakeDeviceBackend::kMaxArenaBytes) + " bytes");
    }
    return std::unique_ptr<DeviceBackend>(std::make_unique<FakeDeviceBackend>(arena_bytes));
  }
  return InvalidArgumentError("unknown device backend \"" + std::string(kind) +
                              "\"; known backends: cpu, fake");
}

}  // namespace arbiter
