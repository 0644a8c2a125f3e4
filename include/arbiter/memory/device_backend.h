// arbiter/memory/device_backend.h — the device arena weights are transferred
// into (docs/architecture.md "Weight tiers"; docs/memory.md "The device
// arena and the pool").
//
// A DeviceBackend owns one contiguous arena of `arena_bytes()` bytes and
// moves bytes between host memory and the arena. It does not allocate within
// the arena: a MemoryPool (arbiter/memory/memory_pool.h) hands out offsets,
// and the weight cache copies tensors to them. Everything is addressed by
// byte offset from the arena start; `base() + offset` is the device address
// a compute kernel would use.
//
// Implementations:
//   "cpu"   CpuDeviceBackend: the arena is anonymous private memory in RAM
//           (mmap, lazily backed by the kernel; arenas of 2 MiB or more are
//           2 MiB-aligned and backed by transparent huge pages where the
//           kernel allows, see CpuDeviceBackend::Create), holding
//           compute-ready tensors; copies are real memcpy; HostPointer works.
//   "fake"  FakeDeviceBackend: no memory at all. Addresses are
//           non-dereferenceable (HostPointer returns nullptr), any arena size
//           works (terabytes), copies are range-checked and counted but move
//           no bytes, and a chosen copy can be made to fail — for tests of
//           huge pools and of failed transfers (docs/memory.md "Fixed
//           defects of the reference": no leak on a failed transfer).
// A GPU backend plugs in here later without changing the cache.
//
// Example:
//   ARBITER_ASSIGN_OR_RETURN(std::unique_ptr<DeviceBackend> device,
//                            MakeDeviceBackend("cpu", 8ull << 30));
//   ARBITER_RETURN_IF_ERROR(device->CopyToDevice(block.offset, host, nbytes));
//
// Thread safety: all methods are thread-safe. Concurrent copies must target
// disjoint byte ranges (the pool guarantees this for distinct blocks); the
// backend does not serialize them.
// Lifetime: the arena lives as long as the backend object; every pool and
// block over it must be gone before it is destroyed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>

#include "arbiter/base/fd.h"
#include "arbiter/base/mutex.h"
#include "arbiter/base/status.h"

namespace arbiter {

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  // "cpu", "fake", ...
  virtual std::string_view name() const = 0;
  // Size of the arena in bytes.
  virtual uint64_t arena_bytes() const = 0;
  // Device address of the arena start (byte 0). Page-aligned for "cpu",
  // 4 KiB-aligned for "fake"; 0 for an empty arena.
  virtual uintptr_t base() const = 0;

  // Copies `size_bytes` from host memory `src` to [device_offset,
  // device_offset + size_bytes) of the arena. A 0-byte copy succeeds.
  // REQUIRES: `src` readable for size_bytes.
  // Errors: kOutOfRange when the range is not inside the arena (nothing is
  // copied); backend failures (kInternal, kUnavailable) — the range's
  // contents are then unspecified.
  virtual Status CopyToDevice(uint64_t device_offset, const void* src, size_t size_bytes) = 0;

  // Copies [device_offset, device_offset + size_bytes) of the arena to
  // host memory `dst`. Errors as CopyToDevice.
  virtual Status CopyFromDevice(uint64_t device_offset, void* dst, size_t size_bytes) = 0;

  // A host pointer to the arena byte at `device_offset`, or nullptr when the
  // arena is not host-dereferenceable (fake, a GPU) or the offset is not
  // inside the arena.
  virtual void* HostPointer(uint64_t device_offset) = 0;

  // Tells the backend the bytes [device_offset, device_offset + size_bytes)
  // no longer hold data (a freed block): "cpu" returns the whole base pages
  // (4 KiB) inside the range to the kernel (madvise MADV_DONTNEED), so RSS
  // drops when the weight cache evicts; their contents read as zero
  // afterwards. Other backends may do nothing. Errors: kOutOfRange as
  // CopyToDevice.
  virtual Status Discard(uint64_t device_offset, size_t size_bytes) = 0;
};

// The arena in RAM. See the file comment.
class CpuDeviceBackend final : public DeviceBackend {
 public:
  // Transparent-huge-page size the arena is aligned to, in bytes.
  static constexpr uint64_t kHugePageBytes = uint64_t{2} << 20;

  // Maps `arena_bytes` of anonymous memory (no reservation of swap: pages are
  // backed when first written). Arena 0 maps nothing.
  // huge_pages (arenas ≥ kHugePageBytes only): the arena starts on a
  // kHugePageBytes boundary and is madvise(MADV_HUGEPAGE)d, so a first write
  // faults in one 2 MiB page instead of 512 base pages (Note [Arena huge
  // pages] in device_backend.cc: a floor→arena load then runs near memcpy
  // speed, and Discard of whole huge pages is much cheaper; figures in
  // docs/BENCHMARKS.md "Weight runtime"). Ignored where
  // the kernel has no transparent huge pages or has them "never". Cost: a
  // huge page straddling a block's edge is faulted in whole, so up to
  // kHugePageBytes − 4 KiB of zeroes beyond each end of a written block can
  // be resident (and stay so after the block is discarded, until a later
  // block reuses them).
  // Errors: kResourceExhausted naming the size when the mapping fails.
  static Result<std::unique_ptr<CpuDeviceBackend>> Create(uint64_t arena_bytes,
                                                          bool huge_pages = true);
  ~CpuDeviceBackend() override;
  CpuDeviceBackend(const CpuDeviceBackend&) = delete;
  CpuDeviceBackend& operator=(const CpuDeviceBackend&) = delete;

  std::string_view name() const override { return "cpu"; }
  uint64_t arena_bytes() const override { return arena_bytes_; }
  uintptr_t base() const override { return reinterpret_cast<uintptr_t>(arena_); }
  Status CopyToDevice(uint64_t device_offset, const void* src, size_t size_bytes) override;
  Status CopyFromDevice(uint64_t device_offset, void* dst, size_t size_bytes) override;
  void* HostPointer(uint64_t device_offset) override;
  Status Discard(uint64_t device_offset, size_t size_bytes) override;

 private:
  CpuDeviceBackend(Mapping arena, uint64_t arena_bytes)
      : arena_mapping_(std::move(arena)), arena_(arena_mapping_.data()), arena_bytes_(arena_bytes) {}

  const Mapping arena_mapping_;  // owns the arena; empty when arena_bytes_ == 0
  uint8_t* const arena_;         // arena_mapping_.data(): null when arena_bytes_ == 0
  const uint64_t arena_bytes_;
};

// Copy counters of a FakeDeviceBackend.
struct FakeDeviceStats {
  uint64_t copies_to_device = 0;      // successful CopyToDevice calls
  uint64_t bytes_to_device = 0;
  uint64_t copies_from_device = 0;    // successful CopyFromDevice calls
  uint64_t bytes_from_device = 0;
  uint64_t failed_copies = 0;         // injected failures and range errors
};

// The memory-less test device. See the file comment.
class FakeDeviceBackend final : public DeviceBackend {
 public:
  // The fake arena starts at this (non-dereferenceable, non-canonical on
  // x86-64) address.
  static constexpr uintptr_t kFakeBase = uintptr_t{1} << 62;
  // Largest fake arena: kFakeBase + arena must fit in 64 bits.
  static constexpr uint64_t kMaxArenaBytes = uint64_t{1} << 62;

  // REQUIRES: arena_bytes ≤ kMaxArenaBytes (MakeDeviceBackend checks it).
  explicit FakeDeviceBackend(uint64_t arena_bytes) : arena_bytes_(arena_bytes) {}

  std::string_view name() const override { return "fake"; }
  uint64_t arena_bytes() const override { return arena_bytes_; }
  uintptr_t base() const override { return arena_bytes_ == 0 ? 0 : kFakeBase; }
  Status CopyToDevice(uint64_t device_offset, const void* src, size_t size_bytes) override
      EXCLUDES(mu_);
  Status CopyFromDevice(uint64_t device_offset, void* dst, size_t size_bytes) override
      EXCLUDES(mu_);
  void* HostPointer(uint64_t device_offset) override { return nullptr; }
  // Range-checked; counts nothing, moves nothing.
  Status Discard(uint64_t device_offset, size_t size_bytes) override;

  // Fault injection: the `nth` copy (1-based, counting CopyToDevice and
  // CopyFromDevice calls from now on) fails with `code` and copies nothing;
  // later copies succeed again. Replaces any earlier plan; nth 0 cancels it.
  // REQUIRES: code != kOk (kInternal or kUnavailable model a device error).
  void FailNthCopy(uint64_t nth, StatusCode code) EXCLUDES(mu_);

  FakeDeviceStats stats() const EXCLUDES(mu_);

 private:
  Status Copy(bool to_device, uint64_t device_offset, size_t size_bytes) EXCLUDES(mu_);

  const uint64_t arena_bytes_;
  mutable Mutex mu_;
  FakeDeviceStats stats_ GUARDED_BY(mu_);
  uint64_t fail_countdown_ GUARDED_BY(mu_) = 0;  // 0: no failure planned
  StatusCode fail_code_ GUARDED_BY(mu_) = StatusCode::kInternal;
};

// Makes the backend named `kind` ("cpu" or "fake") with an arena of
// `arena_bytes`.
// Errors: kInvalidArgument for an unknown kind (the message lists the known
// ones) or a fake arena above FakeDeviceBackend::kMaxArenaBytes;
// kResourceExhausted when the cpu arena cannot be mapped.
Result<std::unique_ptr<DeviceBackend>> MakeDeviceBackend(std::string_view kind,
                                                         uint64_t arena_bytes);

}  // namespace arbiter
