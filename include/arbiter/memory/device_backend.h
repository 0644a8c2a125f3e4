// arbiter/memory/device_backend.h — the device weights are transferred into
// (docs/architecture.md "Weight tiers"; docs/memory.md "The device arena and
// the pool").
//
// A DeviceBackend is one compute device's memory as arbiter sees it:
//   - properties(): its name, its heap (the bytes arbiter may hold on it),
//     the largest single allocation, the alignment blocks need, whether its
//     memory is host-visible (a host pointer can reach it) and whether it is
//     the host's RAM (unified memory: the cpu device, lavapipe, phones);
//   - QueryMemory(): what the driver reports of the heap's usage and budget,
//     where the driver reports anything (absent otherwise);
//   - regions: device memory allocations (AllocateRegion / FreeRegion), each
//     at most max_allocation_bytes. A region is addressed by its id and byte
//     offsets inside it; it does not suballocate — a MemoryPool
//     (arbiter/memory/memory_pool.h) hands out blocks of several regions;
//   - copies host → region and region → host that complete asynchronously:
//     each returns a CopyTicket, and Wait() on it says whether the copy
//     worked (Note [Device copies]);
//   - Discard (the bytes of a freed block hold nothing any more) and
//     HostPointer (where host-visible);
//   - optionally ImportHost: long-lived host memory (a model's host floor)
//     registered so that copies from it need no staging memcpy.
//
// Implementations:
//   "cpu"   CpuDeviceBackend: each region is anonymous private memory in RAM
//           (mmap, lazily backed by the kernel; regions of 2 MiB or more are
//           2 MiB-aligned and backed by transparent huge pages where the
//           kernel allows, see CpuDeviceBackend::Create), holding
//           compute-ready tensors; copies are real memcpy, complete when
//           they return; host-visible and unified. FreeRegion unmaps.
//   "fake"  FakeDeviceBackend: no memory at all. Regions are ids with a
//           size, any size works (terabytes), copies are range-checked and
//           counted but move no bytes; a chosen copy or region allocation
//           can be made to fail, copies can be held pending until the test
//           completes them, and the driver's memory report is injected —
//           for tests of huge pools, failed transfers (docs/memory.md "Fixed
//           defects of the reference": no leak on a failed transfer) and of
//           asynchronous completion.
// A GPU backend (Vulkan) plugs in here without changing the pool or the
// weight cache.
//
// Example:
//   ARBITER_ASSIGN_OR_RETURN(std::unique_ptr<DeviceBackend> device,
//                            MakeDeviceBackend("cpu", 8ull << 30));
//   CopyTicket t = device->CopyToDevice(block.region, block.offset, host, n);
//   ARBITER_RETURN_IF_ERROR(t.Wait());
//
// Thread safety: all methods are thread-safe. Concurrent copies must target
// disjoint byte ranges (the pool guarantees this for distinct blocks); the
// backend does not serialize them.
// Lifetime: a region lives until FreeRegion or the backend's destruction;
// every pool and block over the backend must be gone before it is
// destroyed. A copy's source or destination must stay valid, and its region
// allocated, until its ticket's Wait returned.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "arbiter/base/fd.h"
#include "arbiter/base/mutex.h"
#include "arbiter/base/status.h"

namespace arbiter {

// Identifies one region of a device; 0 is never a region.
using DeviceRegionId = uint64_t;

// One device memory allocation, as AllocateRegion returns it.
struct DeviceRegion {
  DeviceRegionId id = 0;
  uint64_t size_bytes = 0;
  // Host address of the region's byte 0 where the device is host-visible;
  // nullptr otherwise.
  void* host = nullptr;
};

// What a device is. Fixed for the backend's lifetime.
struct DeviceProperties {
  std::string name;                   // "cpu", "fake", ...
  // Bytes of device memory arbiter may hold at once: the sum of live region
  // sizes never exceeds it (an allocation past it is kResourceExhausted).
  // cpu: the configured capacity; a GPU: its device-local heap.
  uint64_t heap_bytes = 0;
  // Largest single region, bytes (≤ heap_bytes).
  uint64_t max_allocation_bytes = 0;
  // Power of two: a block's offset inside a region must be a multiple of it
  // for the device to bind or copy it (cpu: 64, a cache line, what the
  // engine's vector loads assume).
  uint64_t alignment_bytes = 1;
  // HostPointer works: the host can read and write region memory directly.
  bool host_visible = false;
  // Region memory is the host's RAM (counts in the process's RSS).
  bool unified_memory = false;
};

// The driver's view of the device heap (VK_EXT_memory_budget's heapUsage /
// heapBudget on Vulkan). Bytes; usage counts every process on the device.
struct DeviceMemoryReport {
  uint64_t usage_bytes = 0;
  uint64_t budget_bytes = 0;
};

// Note [Device copies]
// A copy between host and device may run after the call returns (a GPU
// queues it on a transfer queue). The caller gets a CopyTicket and must Wait
// on it before reading the destination, freeing the source, or freeing,
// discarding or reusing the region's bytes. Every error of a copy — a range
// outside the region, an unknown region, a device failure — surfaces at
// Wait, never earlier, so one code path handles them all. The cpu device
// copies synchronously and returns a completed ticket; the fake device can
// hold copies pending (FakeDeviceBackend::SetAsyncCopies) so the waiting is
// tested.

// The shared state of one copy: completed once by the backend, waited on by
// its tickets. Thread-safe.
class CopyCompletion {
 public:
  // Marks the copy done with `status`. Only the first call counts.
  void Complete(Status status) EXCLUDES(mu_);
  // Blocks until Complete was called; returns its status.
  Status Wait() EXCLUDES(mu_);
  bool done() const EXCLUDES(mu_);

 private:
  mutable Mutex mu_;
  CondVar cv_{&mu_};
  bool done_ GUARDED_BY(mu_) = false;
  Status status_ GUARDED_BY(mu_);
};

// The handle of one copy (Note [Device copies]). Copyable: copies share the
// completion. A default-constructed ticket is a completed, successful copy.
class CopyTicket {
 public:
  CopyTicket() = default;
  explicit CopyTicket(std::shared_ptr<CopyCompletion> completion)
      : completion_(std::move(completion)) {}
  // A ticket whose copy is already done with `status`.
  static CopyTicket Done(Status status);

  // Blocks until the copy completed; returns its result (OK, or why it
  // failed). May be called again; returns the same result.
  [[nodiscard]] Status Wait() const { return completion_ ? completion_->Wait() : OkStatus(); }
  // Whether the copy completed (Wait would not block).
  bool ready() const { return !completion_ || completion_->done(); }

 private:
  std::shared_ptr<CopyCompletion> completion_;
};

// A host range registered with a device by DeviceBackend::ImportHost.
// Destroying the handle ends the import. REQUIRES: every copy that read
// from the range was waited for, and the range is still mapped, when the
// handle is destroyed (destroy it before the memory it covers).
class HostImport {
 public:
  virtual ~HostImport() = default;
};

// Waits for every ticket (all of them, also after a failure: the memory they
// touch is safe to release afterwards); returns the first error in order.
Status WaitAll(const std::vector<CopyTicket>& tickets);

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  virtual const DeviceProperties& properties() const = 0;
  // properties().name.
  std::string_view name() const { return properties().name; }

  // The driver's report of the device heap, or nullopt where the driver
  // reports nothing (cpu: none; its memory is the host's, measured as RSS).
  virtual std::optional<DeviceMemoryReport> QueryMemory() const = 0;

  // Allocates one region of `size_bytes` (> 0).
  // Errors: kInvalidArgument when size_bytes is 0 or above
  // max_allocation_bytes (names both); kResourceExhausted when the heap has
  // no room left (live regions + size_bytes > heap_bytes) or the device
  // cannot allocate it (the message names the size).
  virtual Result<DeviceRegion> AllocateRegion(uint64_t size_bytes) = 0;

  // Frees a region: its memory goes back to the device (cpu: unmapped, so
  // RSS and address space drop). REQUIRES: no copy on it in flight.
  // Errors: kNotFound for an id that is not a live region.
  virtual Status FreeRegion(DeviceRegionId region) = 0;

  // Copies `size_bytes` from host memory `src` to [offset, offset +
  // size_bytes) of `region`. A 0-byte copy succeeds. Errors, at Wait:
  // kNotFound for an unknown region; kOutOfRange when the range is not
  // inside it (nothing is copied); device failures (kInternal,
  // kUnavailable) — the range's contents are then unspecified.
  virtual CopyTicket CopyToDevice(DeviceRegionId region, uint64_t offset, const void* src,
                                  size_t size_bytes) = 0;

  // Copies [offset, offset + size_bytes) of `region` to host memory `dst`.
  // Errors as CopyToDevice.
  virtual CopyTicket CopyFromDevice(DeviceRegionId region, uint64_t offset, void* dst,
                                    size_t size_bytes) = 0;

  // Registers [p, p + size_bytes) — long-lived host memory such as a
  // model's host floor — with the device, so that later CopyToDevice calls
  // whose source lies inside it read it directly (Vulkan: the pages are
  // imported with VK_EXT_external_memory_host and the GPU copies from them;
  // no memcpy into staging memory). The range must stay mapped and
  // unchanged while the handle lives. Optional: the default refuses with
  // kUnimplemented, and every error means "copy as usual" — CopyToDevice
  // works on any source whether or not it was imported.
  // Errors: kUnimplemented (no such capability), kUnavailable (the driver
  // refused the pages), kInvalidArgument (size 0).
  virtual Result<std::unique_ptr<HostImport>> ImportHost(const void* p, size_t size_bytes) {
    return UnimplementedError(std::string(name()) + ": no host-memory import");
  }

  // A host pointer to byte `offset` of `region`, or nullptr when the device
  // is not host-visible, the region is unknown or the offset is not inside
  // it.
  virtual void* HostPointer(DeviceRegionId region, uint64_t offset) = 0;

  // Tells the backend the bytes [offset, offset + size_bytes) of `region`
  // no longer hold data (a freed block): "cpu" returns the whole base pages
  // (4 KiB) inside the range to the kernel (madvise MADV_DONTNEED), so RSS
  // drops when the weight cache evicts; their contents read as zero
  // afterwards. Other backends may do nothing.
  // Errors: kNotFound, kOutOfRange as CopyToDevice (returned here).
  virtual Status Discard(DeviceRegionId region, uint64_t offset, size_t size_bytes) = 0;
};

// The device in RAM. See the file comment.
class CpuDeviceBackend final : public DeviceBackend {
 public:
  // Transparent-huge-page size large regions are aligned to, in bytes.
  static constexpr uint64_t kHugePageBytes = uint64_t{2} << 20;
  // The alignment blocks get (DeviceProperties::alignment_bytes).
  static constexpr uint64_t kAlignmentBytes = 64;

  // A device of `heap_bytes` capacity; maps nothing yet (regions are mapped
  // by AllocateRegion, without a reservation of swap: pages are backed when
  // first written). max_allocation_bytes: the largest region, 0 = heap_bytes.
  // huge_pages (regions ≥ kHugePageBytes only): a region starts on a
  // kHugePageBytes boundary and is madvise(MADV_HUGEPAGE)d, so a first write
  // faults in one 2 MiB page instead of 512 base pages (Note [Arena huge
  // pages] in device_backend.cc: a floor→device load then runs near memcpy
  // speed, and Discard of whole huge pages is much cheaper; figures in
  // docs/BENCHMARKS.md "Weight runtime"). Ignored where the kernel has no
  // transparent huge pages or has them "never". Cost: a huge page straddling
  // a block's edge is faulted in whole, so up to kHugePageBytes − 4 KiB of
  // zeroes beyond each end of a written block can be resident (and stay so
  // after the block is discarded, until a later block reuses them or the
  // region is freed).
  // Errors: kInvalidArgument when max_allocation_bytes > heap_bytes.
  static Result<std::unique_ptr<CpuDeviceBackend>> Create(uint64_t heap_bytes,
                                                          bool huge_pages = true,
                                                          uint64_t max_allocation_bytes = 0);
  ~CpuDeviceBackend() override;
  CpuDeviceBackend(const CpuDeviceBackend&) = delete;
  CpuDeviceBackend& operator=(const CpuDeviceBackend&) = delete;

  const DeviceProperties& properties() const override { return properties_; }
  std::optional<DeviceMemoryReport> QueryMemory() const override { return std::nullopt; }
  // Errors as DeviceBackend, and kResourceExhausted naming the size when the
  // mapping fails.
  Result<DeviceRegion> AllocateRegion(uint64_t size_bytes) override EXCLUDES(mu_);
  Status FreeRegion(DeviceRegionId region) override EXCLUDES(mu_);
  CopyTicket CopyToDevice(DeviceRegionId region, uint64_t offset, const void* src,
                          size_t size_bytes) override EXCLUDES(mu_);
  CopyTicket CopyFromDevice(DeviceRegionId region, uint64_t offset, void* dst,
                            size_t size_bytes) override EXCLUDES(mu_);
  void* HostPointer(DeviceRegionId region, uint64_t offset) override EXCLUDES(mu_);
  Status Discard(DeviceRegionId region, uint64_t offset, size_t size_bytes) override
      EXCLUDES(mu_);

  // Σ sizes of the live regions, bytes.
  uint64_t allocated_bytes() const EXCLUDES(mu_);
  size_t live_regions() const EXCLUDES(mu_);

 private:
  CpuDeviceBackend(DeviceProperties properties, bool huge_pages)
      : properties_(std::move(properties)), huge_pages_(huge_pages) {}

  struct Region {
    Mapping mapping;  // owns the pages (may start before `data`, trimmed)
    uint8_t* data = nullptr;
    uint64_t size_bytes = 0;
  };
  // The region's data and size, checked against [offset, offset + size).
  Result<uint8_t*> Locate(DeviceRegionId region, uint64_t offset, uint64_t size_bytes) const
      EXCLUDES(mu_);

  const DeviceProperties properties_;
  const bool huge_pages_;
  mutable Mutex mu_;
  std::map<DeviceRegionId, Region> regions_ GUARDED_BY(mu_);
  uint64_t allocated_bytes_ GUARDED_BY(mu_) = 0;
  DeviceRegionId next_id_ GUARDED_BY(mu_) = 1;
};

// Counters of a FakeDeviceBackend.
struct FakeDeviceStats {
  uint64_t copies_to_device = 0;      // successful copies to the device
  uint64_t bytes_to_device = 0;
  uint64_t copies_from_device = 0;    // successful copies from the device
  uint64_t bytes_from_device = 0;
  uint64_t failed_copies = 0;         // injected failures and range errors
  uint64_t pending_copies = 0;        // issued, not yet completed (async mode)
  uint64_t regions_allocated = 0;     // successful AllocateRegion calls
  uint64_t regions_freed = 0;         // successful FreeRegion calls
  uint64_t live_regions = 0;
  uint64_t live_region_bytes = 0;
};

struct FakeDeviceOptions {
  uint64_t heap_bytes = 0;            // ≤ FakeDeviceBackend::kMaxHeapBytes
  uint64_t max_allocation_bytes = 0;  // 0 = heap_bytes
  uint64_t alignment_bytes = 1;       // a power of two
  bool host_visible = false;          // reported only: HostPointer stays nullptr
};

// The memory-less test device. See the file comment.
class FakeDeviceBackend final : public DeviceBackend {
 public:
  // Largest fake heap, bytes.
  static constexpr uint64_t kMaxHeapBytes = uint64_t{1} << 62;

  // REQUIRES: options valid (MakeDeviceBackend and the tests' values are).
  explicit FakeDeviceBackend(FakeDeviceOptions options);
  explicit FakeDeviceBackend(uint64_t heap_bytes)
      : FakeDeviceBackend(FakeDeviceOptions{.heap_bytes = heap_bytes}) {}

  const DeviceProperties& properties() const override { return properties_; }
  std::optional<DeviceMemoryReport> QueryMemory() const override EXCLUDES(mu_);
  Result<DeviceRegion> AllocateRegion(uint64_t size_bytes) override EXCLUDES(mu_);
  Status FreeRegion(DeviceRegionId region) override EXCLUDES(mu_);
  CopyTicket CopyToDevice(DeviceRegionId region, uint64_t offset, const void* src,
                          size_t size_bytes) override EXCLUDES(mu_);
  CopyTicket CopyFromDevice(DeviceRegionId region, uint64_t offset, void* dst,
                            size_t size_bytes) override EXCLUDES(mu_);
  void* HostPointer(DeviceRegionId region, uint64_t offset) override { return nullptr; }
  // Range-checked; counts nothing, moves nothing.
  Status Discard(DeviceRegionId region, uint64_t offset, size_t size_bytes) override
      EXCLUDES(mu_);

  // Fault injection: the `nth` copy (1-based, counting copies both ways from
  // now on) fails with `code` at its Wait and copies nothing; later copies
  // succeed again. Replaces any earlier plan; nth 0 cancels it.
  // REQUIRES: code != kOk (kInternal or kUnavailable model a device error).
  void FailNthCopy(uint64_t nth, StatusCode code) EXCLUDES(mu_);
  // The `nth` AllocateRegion from now on (1-based) fails with
  // kResourceExhausted, as a device out of memory; nth 0 cancels.
  void FailNthAllocation(uint64_t nth) EXCLUDES(mu_);
  // Async mode: copies issued from now on stay pending (ready() false, Wait
  // blocks) until CompletePendingCopies. Off: copies complete at once.
  void SetAsyncCopies(bool async) EXCLUDES(mu_);
  // Completes every pending copy, in issue order; returns how many.
  size_t CompletePendingCopies() EXCLUDES(mu_);
  // What QueryMemory returns from now on (nullopt: no driver report).
  void SetMemoryReport(std::optional<DeviceMemoryReport> report) EXCLUDES(mu_);

  FakeDeviceStats stats() const EXCLUDES(mu_);

 private:
  CopyTicket Copy(bool to_device, DeviceRegionId region, uint64_t offset, size_t size_bytes)
      EXCLUDES(mu_);
  Status CheckLocked(DeviceRegionId region, uint64_t offset, uint64_t size_bytes) const
      REQUIRES(mu_);

  const DeviceProperties properties_;
  mutable Mutex mu_;
  FakeDeviceStats stats_ GUARDED_BY(mu_);
  std::map<DeviceRegionId, uint64_t> regions_ GUARDED_BY(mu_);  // id → size
  DeviceRegionId next_id_ GUARDED_BY(mu_) = 1;
  uint64_t fail_countdown_ GUARDED_BY(mu_) = 0;  // 0: no failure planned
  StatusCode fail_code_ GUARDED_BY(mu_) = StatusCode::kInternal;
  uint64_t alloc_fail_countdown_ GUARDED_BY(mu_) = 0;
  bool async_ GUARDED_BY(mu_) = false;
  std::vector<std::pair<std::shared_ptr<CopyCompletion>, Status>> pending_ GUARDED_BY(mu_);
  std::optional<DeviceMemoryReport> report_ GUARDED_BY(mu_);
};

// Makes the backend named `kind` ("cpu" or "fake") with a heap of
// `heap_bytes` (one region may take all of it).
// Errors: kInvalidArgument for an unknown kind (the message lists the known
// ones) or a fake heap above FakeDeviceBackend::kMaxHeapBytes.
Result<std::unique_ptr<DeviceBackend>> MakeDeviceBackend(std::string_view kind,
                                                         uint64_t heap_bytes);

}  // namespace arbiter
