// memory/device_backend.cc — the cpu and fake devices, and copy tickets.
//
// Both backends check every copy's range against its region before touching
// anything (overflow-safe: offset ≤ region and size ≤ region − offset), so a
// bad offset from a caller is an error value, never a write past a region.
//
// Note [Arena huge pages]
// The weight cache Discards a block when it evicts it (RSS must drop), so
// the next load of that block writes into pages the kernel has to fault in
// and zero again. With 4 KiB pages that first touch dominated a floor→arena
// load: one fault per 4 KiB page made the load several times slower than a
// memcpy into already-faulted memory, and the Discard itself was slow too.
// With a region 2 MiB-aligned and MADV_HUGEPAGE, the same load runs close
// to memcpy speed: one fault per 2 MiB, each zeroing a page that the copy
// overwrites next (plausibly while it is still in cache), and the Discard is
// an order of magnitude cheaper (the figures, from `arbiter bench weights`:
// docs/BENCHMARKS.md "Weight runtime", "What changed"). Pre-faulting instead
// (MADV_POPULATE_WRITE of the block before the copy, or by a second thread
// a chunk ahead) was slower with either page size: it zeroes the whole
// block out of cache first, then the copy streams over it again. The
// alignment costs 2 MiB of extra address space per mapping, trimmed at once.
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

Status CheckRange(std::string_view backend, DeviceRegionId region, uint64_t region_bytes,
                  uint64_t offset, uint64_t size_bytes) {
  if (offset <= region_bytes && size_bytes <= region_bytes - offset) return OkStatus();
  return OutOfRangeError(std::string(backend) + " device: " + std::to_string(size_bytes) +
                         " bytes at offset " + std::to_string(offset) + " are outside region " +
                         std::to_string(region) + " of " + std::to_string(region_bytes) +
                         " bytes");
}

Status UnknownRegion(std::string_view backend, DeviceRegionId region) {
  return NotFoundError(std::string(backend) + " device: no region " + std::to_string(region));
}

// The checks every backend makes before allocating a region.
Status CheckRegionSize(const DeviceProperties& p, uint64_t allocated, uint64_t size_bytes) {
  if (size_bytes == 0) {
    return InvalidArgumentError(p.name + " device: a region needs at least one byte");
  }
  if (size_bytes > p.max_allocation_bytes) {
    return InvalidArgumentError(
        p.name + " device: a region of " + FormatSize(size_bytes) + " (" +
        std::to_string(size_bytes) + " bytes) is larger than the device's largest allocation, " +
        FormatSize(p.max_allocation_bytes) + " (" + std::to_string(p.max_allocation_bytes) +
        " bytes)");
  }
  if (size_bytes > p.heap_bytes - allocated) {
    return ResourceExhaustedError(
        p.name + " device: no room for a region of " + FormatSize(size_bytes) + " (" +
        std::to_string(size_bytes) + " bytes): " + FormatSize(allocated) + " of the " +
        FormatSize(p.heap_bytes) + " heap are allocated");
  }
  return OkStatus();
}

}  // namespace

// ---- CopyTicket -----------------------------------------------------------------

void CopyCompletion::Complete(Status status) {
  MutexLock lock(&mu_);
  if (done_) return;
  done_ = true;
  status_ = std::move(status);
  cv_.SignalAll();
}

Status CopyCompletion::Wait() {
  MutexLock lock(&mu_);
  while (!done_) cv_.Wait();
  return status_;
}

bool CopyCompletion::done() const {
  MutexLock lock(&mu_);
  return done_;
}

CopyTicket CopyTicket::Done(Status status) {
  if (status.ok()) return CopyTicket();
  auto c = std::make_shared<CopyCompletion>();
  c->Complete(std::move(status));
  return CopyTicket(std::move(c));
}

Status WaitAll(const std::vector<CopyTicket>& tickets) {
  Status first;
  for (const CopyTicket& t : tickets) {
    Status s = t.Wait();
    if (first.ok() && !s.ok()) first = std::move(s);
  }
  return first;
}

// ---- CpuDeviceBackend ---------------------------------------------------------

Result<std::unique_ptr<CpuDeviceBackend>> CpuDeviceBackend::Create(
    uint64_t heap_bytes, bool huge_pages, uint64_t max_allocation_bytes) {
  if (max_allocation_bytes > heap_bytes) {
    return InvalidArgumentError("cpu device: max_allocation_bytes " +
                                std::to_string(max_allocation_bytes) + " exceeds the heap of " +
                                std::to_string(heap_bytes) + " bytes");
  }
  DeviceProperties p;
  p.name = "cpu";
  p.heap_bytes = heap_bytes;
  p.max_allocation_bytes = max_allocation_bytes == 0 ? heap_bytes : max_allocation_bytes;
  p.alignment_bytes = kAlignmentBytes;
  p.host_visible = true;
  p.unified_memory = true;
  return std::unique_ptr<CpuDeviceBackend>(new CpuDeviceBackend(std::move(p), huge_pages));
}

CpuDeviceBackend::~CpuDeviceBackend() = default;

Result<DeviceRegion> CpuDeviceBackend::AllocateRegion(uint64_t size_bytes) {
  {
    MutexLock lock(&mu_);
    ARBITER_RETURN_IF_ERROR(CheckRegionSize(properties_, allocated_bytes_, size_bytes));
    allocated_bytes_ += size_bytes;  // reserved while mapping, outside the lock
  }
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const bool huge = huge_pages_ && size_bytes >= kHugePageBytes;
  const uint64_t slack = huge ? kHugePageBytes : 0;  // room to align the start
  void* p = MAP_FAILED;
  int err = ENOMEM;
  uint64_t length = 0;
  if (size_bytes <= static_cast<uint64_t>(SIZE_MAX) - slack - page) {
    length = (size_bytes + page - 1) / page * page;
    p = ::mmap(nullptr, static_cast<size_t>(length + slack), PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    err = errno;
  }
  if (p == MAP_FAILED) {
    MutexLock lock(&mu_);
    allocated_bytes_ -= size_bytes;
    return ResourceExhaustedError("cpu device: cannot map a region of " + FormatSize(size_bytes) +
                                  " (" + std::to_string(size_bytes) +
                                  " bytes): " + std::strerror(err) +
                                  "; use a smaller device arena");
  }
  uint8_t* data = static_cast<uint8_t*>(p);
  if (huge) {  // Note [Arena huge pages]
    const uintptr_t start = reinterpret_cast<uintptr_t>(p);
    const uintptr_t aligned = (start + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
    const uintptr_t end = start + length + slack;
    if (aligned > start) ::munmap(p, aligned - start);
    if (end > aligned + length) {
      ::munmap(reinterpret_cast<void*>(aligned + length), end - (aligned + length));
    }
    data = reinterpret_cast<uint8_t*>(aligned);
    // EINVAL without THP support: the region works the same on base pages.
    (void)::madvise(data, static_cast<size_t>(length), MADV_HUGEPAGE);
  }
  MutexLock lock(&mu_);
  const DeviceRegionId id = next_id_++;
  regions_.emplace(id, Region{Mapping(data, static_cast<size_t>(length)), data, size_bytes});
  return DeviceRegion{id, size_bytes, data};
}

Status CpuDeviceBackend::FreeRegion(DeviceRegionId region) {
  Mapping unmap;  // unmapped after the lock is released
  {
    MutexLock lock(&mu_);
    auto it = regions_.find(region);
    if (it == regions_.end()) return UnknownRegion(name(), region);
    unmap = std::move(it->second.mapping);
    allocated_bytes_ -= it->second.size_bytes;
    regions_.erase(it);
  }
  return OkStatus();
}

Result<uint8_t*> CpuDeviceBackend::Locate(DeviceRegionId region, uint64_t offset,
                                          uint64_t size_bytes) const {
  MutexLock lock(&mu_);
  auto it = regions_.find(region);
  if (it == regions_.end()) return UnknownRegion(name(), region);
  ARBITER_RETURN_IF_ERROR(CheckRange(name(), region, it->second.size_bytes, offset, size_bytes));
  return it->second.data;
}

CopyTicket CpuDeviceBackend::CopyToDevice(DeviceRegionId region, uint64_t offset,
                                          const void* src, size_t size_bytes) {
  Result<uint8_t*> data = Locate(region, offset, size_bytes);
  if (!data.ok()) return CopyTicket::Done(data.status());
  if (size_bytes > 0) std::memcpy(*data + offset, src, size_bytes);
  return CopyTicket();
}

CopyTicket CpuDeviceBackend::CopyFromDevice(DeviceRegionId region, uint64_t offset, void* dst,
                                            size_t size_bytes) {
  Result<uint8_t*> data = Locate(region, offset, size_bytes);
  if (!data.ok()) return CopyTicket::Done(data.status());
  if (size_bytes > 0) std::memcpy(dst, *data + offset, size_bytes);
  return CopyTicket();
}

void* CpuDeviceBackend::HostPointer(DeviceRegionId region, uint64_t offset) {
  MutexLock lock(&mu_);
  auto it = regions_.find(region);
  if (it == regions_.end() || offset >= it->second.size_bytes) return nullptr;
  return it->second.data + offset;
}

Status CpuDeviceBackend::Discard(DeviceRegionId region, uint64_t offset, size_t size_bytes) {
  ARBITER_ASSIGN_OR_RETURN(uint8_t* data, Locate(region, offset, size_bytes));
  // Only whole pages inside the range: a partial page may be shared with a
  // neighbouring live block.
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t begin = (offset + page - 1) / page * page;
  const uint64_t end = (offset + size_bytes) / page * page;
  if (end > begin &&
      ::madvise(data + begin, static_cast<size_t>(end - begin), MADV_DONTNEED) != 0) {
    const int err = errno;
    return InternalError("cpu device: madvise(DONTNEED) of " + std::to_string(end - begin) +
                         " bytes at offset " + std::to_string(begin) + " of region " +
                         std::to_string(region) + ": " + std::strerror(err));
  }
  return OkStatus();
}

uint64_t CpuDeviceBackend::allocated_bytes() const {
  MutexLock lock(&mu_);
  return allocated_bytes_;
}

size_t CpuDeviceBackend::live_regions() const {
  MutexLock lock(&mu_);
  return regions_.size();
}

// ---- FakeDeviceBackend --------------------------------------------------------

FakeDeviceBackend::FakeDeviceBackend(FakeDeviceOptions options)
    : properties_{.name = "fake",
                  .heap_bytes = options.heap_bytes,
                  .max_allocation_bytes = options.max_allocation_bytes == 0
                                              ? options.heap_bytes
                                              : options.max_allocation_bytes,
                  .alignment_bytes = options.alignment_bytes,
                  .host_visible = options.host_visible,
                  .unified_memory = false} {}

std::optional<DeviceMemoryReport> FakeDeviceBackend::QueryMemory() const {
  MutexLock lock(&mu_);
  return report_;
}

Result<DeviceRegion> FakeDeviceBackend::AllocateRegion(uint64_t size_bytes) {
  MutexLock lock(&mu_);
  ARBITER_RETURN_IF_ERROR(CheckRegionSize(properties_, stats_.live_region_bytes, size_bytes));
  if (alloc_fail_countdown_ > 0 && --alloc_fail_countdown_ == 0) {
    return ResourceExhaustedError("fake device: injected failure to allocate a region of " +
                                  std::to_string(size_bytes) + " bytes");
  }
  const DeviceRegionId id = next_id_++;
  regions_.emplace(id, size_bytes);
  ++stats_.regions_allocated;
  ++stats_.live_regions;
  stats_.live_region_bytes += size_bytes;
  return DeviceRegion{id, size_bytes, nullptr};
}

Status FakeDeviceBackend::FreeRegion(DeviceRegionId region) {
  MutexLock lock(&mu_);
  auto it = regions_.find(region);
  if (it == regions_.end()) return UnknownRegion(name(), region);
  ++stats_.regions_freed;
  --stats_.live_regions;
  stats_.live_region_bytes -= it->second;
  regions_.erase(it);
  return OkStatus();
}

Status FakeDeviceBackend::CheckLocked(DeviceRegionId region, uint64_t offset,
                                      uint64_t size_bytes) const {
  auto it = regions_.find(region);
  if (it == regions_.end()) return UnknownRegion(name(), region);
  return CheckRange(name(), region, it->second, offset, size_bytes);
}

Status FakeDeviceBackend::Discard(DeviceRegionId region, uint64_t offset, size_t size_bytes) {
  MutexLock lock(&mu_);
  return CheckLocked(region, offset, size_bytes);
}

CopyTicket FakeDeviceBackend::CopyToDevice(DeviceRegionId region, uint64_t offset,
                                           const void* src, size_t size_bytes) {
  return Copy(/*to_device=*/true, region, offset, size_bytes);
}

CopyTicket FakeDeviceBackend::CopyFromDevice(DeviceRegionId region, uint64_t offset, void* dst,
                                             size_t size_bytes) {
  return Copy(/*to_device=*/false, region, offset, size_bytes);
}

CopyTicket FakeDeviceBackend::Copy(bool to_device, DeviceRegionId region, uint64_t offset,
                                   size_t size_bytes) {
  MutexLock lock(&mu_);
  Status result;
  if (fail_countdown_ > 0 && --fail_countdown_ == 0) {
    result = Status(fail_code_, std::string("fake device: injected failure of the copy ") +
                                    (to_device ? "to" : "from") + " region " +
                                    std::to_string(region) + " at offset " +
                                    std::to_string(offset) + " (" + std::to_string(size_bytes) +
                                    " bytes)");
  } else {
    result = CheckLocked(region, offset, size_bytes);
  }
  if (!result.ok()) {
    ++stats_.failed_copies;
  } else if (to_device) {
    ++stats_.copies_to_device;
    stats_.bytes_to_device += size_bytes;
  } else {
    ++stats_.copies_from_device;
    stats_.bytes_from_device += size_bytes;
  }
  if (!async_) return CopyTicket::Done(std::move(result));
  auto completion = std::make_shared<CopyCompletion>();
  pending_.emplace_back(completion, std::move(result));
  stats_.pending_copies = pending_.size();
  return CopyTicket(std::move(completion));
}

void FakeDeviceBackend::FailNthCopy(uint64_t nth, StatusCode code) {
  MutexLock lock(&mu_);
  fail_countdown_ = nth;
  fail_code_ = code == StatusCode::kOk ? StatusCode::kInternal : code;
}

void FakeDeviceBackend::FailNthAllocation(uint64_t nth) {
  MutexLock lock(&mu_);
  alloc_fail_countdown_ = nth;
}

void FakeDeviceBackend::SetAsyncCopies(bool async) {
  MutexLock lock(&mu_);
  async_ = async;
}

size_t FakeDeviceBackend::CompletePendingCopies() {
  std::vector<std::pair<std::shared_ptr<CopyCompletion>, Status>> pending;
  {
    MutexLock lock(&mu_);
    pending.swap(pending_);
    stats_.pending_copies = 0;
  }
  for (auto& [completion, status] : pending) completion->Complete(std::move(status));
  return pending.size();
}

void FakeDeviceBackend::SetMemoryReport(std::optional<DeviceMemoryReport> report) {
  MutexLock lock(&mu_);
  report_ = report;
}

FakeDeviceStats FakeDeviceBackend::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

// ---- factory --------------------------------------------------------------------

Result<std::unique_ptr<DeviceBackend>> MakeDeviceBackend(std::string_view kind,
                                                         uint64_t heap_bytes) {
  if (kind == "cpu") {
    ARBITER_ASSIGN_OR_RETURN(std::unique_ptr<CpuDeviceBackend> cpu,
                             CpuDeviceBackend::Create(heap_bytes));
    return std::unique_ptr<DeviceBackend>(std::move(cpu));
  }
  if (kind == "fake") {
    if (heap_bytes > FakeDeviceBackend::kMaxHeapBytes) {
      return InvalidArgumentError("fake device: heap of " + std::to_string(heap_bytes) +
                                  " bytes is above the limit of " +
                                  std::to_string(FakeDeviceBackend::kMaxHeapBytes) + " bytes");
    }
    return std::unique_ptr<DeviceBackend>(std::make_unique<FakeDeviceBackend>(heap_bytes));
  }
  return InvalidArgumentError("unknown device backend \"" + std::string(kind) +
                              "\"; known backends: cpu, fake");
}

}  // namespace arbiter
