// arbiter/memory/memory_pool.h — a best-fit allocator with coalescing over
// the regions of a device (docs/memory.md "The device arena and the pool").
//
// The pool hands out blocks of device regions, as (region, offset) pairs; it
// never touches their memory (the caller copies with
// DeviceBackend::CopyToDevice). It owns the regions it allocates from the
// device (Note [Pool regions] in memory_pool.cc):
//   - it grows on demand: when no free block of the existing regions fits a
//     request, it allocates a new region of `region_bytes` (or of the
//     request, when larger; never above the device's max allocation), as
//     long as its regions stay within limit_bytes;
//   - a region left with no live block goes back to the device at once
//     (FreeRegion), so device memory comes back when weights are unloaded.
// Inside the regions the algorithm is the one XLA's BFC allocator is named
// for, without its bins:
//   - requests are rounded up to a multiple of the alignment (default 64 B,
//     at least the device's; a 0-byte request takes one alignment unit, so
//     live blocks never share an address); every block offset is a multiple
//     of the alignment;
//   - Allocate takes the smallest free block that fits (ties: the oldest
//     region, then the lowest offset) and splits off the rest — O(log n) in
//     the number of free blocks;
//   - Free merges the block with free neighbours in its region, so freeing
//     every block of a region empties it — and returns it to the device.
//     The weight cache's compaction (docs/memory.md "The device arena and the
//     pool") relies on that.
// A block never spans two regions: a request above the device's largest
// allocation is refused (kInvalidArgument) however much memory is free.
// Fragmentation is reported, not fixed: 1 − largest_free / free, where the
// room still unallocated counts as one free block of at most the largest
// allocation. It is cut by placement (pinned models first, in the oldest
// region) and by compaction.
//
// Example:
//   ARBITER_ASSIGN_OR_RETURN(std::unique_ptr<MemoryPool> pool,
//                            MemoryPool::Create(device.get()));
//   ARBITER_ASSIGN_OR_RETURN(PoolBlock block, pool->Allocate(nbytes));
//   ARBITER_RETURN_IF_ERROR(
//       device->CopyToDevice(block.region, block.offset, host, nbytes).Wait());
//   ...
//   ARBITER_RETURN_IF_ERROR(pool->Free(block));
//
// Thread safety: thread-safe (one mutex, held for the O(log n) map updates
// and, rarely, while a region is allocated from or freed to the device;
// messages are formatted after it is released).
// Lifetime: the backend must outlive the pool; the pool frees its regions
// when destroyed (every block must be freed or abandoned by then, and no
// copy in flight). A PoolBlock is a plain value, not an RAII handle: the
// owner (the weight cache) frees it exactly once.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <tuple>
#include <utility>

#include "arbiter/base/mutex.h"
#include "arbiter/base/status.h"
#include "arbiter/memory/device_backend.h"

namespace arbiter {

// One allocation: bytes [offset, offset + size_bytes) of device region
// `region`.
struct PoolBlock {
  DeviceRegionId region = 0;     // never 0 for a real block
  uint64_t offset = 0;           // inside the region; multiple of the pool's alignment
  uint64_t size_bytes = 0;       // rounded size taken from the pool
  uint64_t requested_bytes = 0;  // what Allocate was asked for (≤ size_bytes)
  uint64_t pool_id = 0;          // which pool handed it out (never 0 for a real block)
  uint64_t alloc_id = 0;         // unique per allocation within the pool
};

// A snapshot of the pool's books (STYLE.md rule 9; the reference's device
// memory in_use/limit/free/peak metrics). Bytes are rounded block sizes.
struct MemoryPoolStats {
  uint64_t in_use_bytes = 0;              // Σ size_bytes of live blocks
  uint64_t limit_bytes = 0;               // most bytes the pool's regions may hold
  uint64_t free_bytes = 0;                // limit − in_use (unallocated room included)
  uint64_t peak_in_use_bytes = 0;         // max in_use since construction
  uint64_t largest_free_block_bytes = 0;  // the biggest single request that fits
  double fragmentation = 0.0;             // 1 − largest_free / free; 0 when free == 0
  uint64_t num_allocs = 0;                // successful Allocate calls
  uint64_t num_frees = 0;                 // successful Free calls
  uint64_t num_alloc_failures = 0;        // Allocate calls refused
  uint64_t live_blocks = 0;
  uint64_t free_blocks = 0;               // entries on the free list (inside regions)
  uint64_t regions = 0;                   // device regions held now
  uint64_t region_bytes = 0;              // Σ their sizes
  uint64_t regions_allocated = 0;         // regions taken from the device, ever
  uint64_t regions_freed = 0;             // regions given back to the device, ever
};

struct MemoryPoolOptions {
  // Most bytes the pool's regions may hold together; 0 = the device's heap.
  // Rounded down to a multiple of the alignment.
  uint64_t limit_bytes = 0;
  // Offset and size granularity: a power of two ≥ 1; the device's
  // alignment_bytes when that is larger.
  uint64_t alignment_bytes = 64;
  // Size of a region the pool grows by (a request larger than it gets a
  // region of its own size); 0 = min(limit, the device's max allocation).
  // Rounded up to the alignment.
  uint64_t region_bytes = 0;
};

class MemoryPool {
 public:
  // Errors: kInvalidArgument when `backend` is null, alignment is not a
  // power of two, limit_bytes exceeds the device's heap, or region_bytes
  // exceeds the device's max allocation (names the option).
  static Result<std::unique_ptr<MemoryPool>> Create(DeviceBackend* backend,
                                                    MemoryPoolOptions options = {});
  ~MemoryPool();
  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;

  // Takes the best-fitting free block for `bytes` (rounded up to the
  // alignment), growing the pool by a region when none fits.
  // Errors (nothing changes then):
  //   kInvalidArgument when the rounded request is larger than the device's
  //     max allocation and not larger than the limit — it can never fit one
  //     region; the message names both sizes;
  //   kResourceExhausted when no free block is large enough and no region
  //     can be added (the limit is reached or the device refused); the
  //     message states the bytes requested, the free bytes and the largest
  //     free block, and the device's reason where it refused.
  Result<PoolBlock> Allocate(uint64_t bytes) EXCLUDES(mu_);

  // Returns `block` to the pool and merges it with free neighbours; a region
  // left empty goes back to the device.
  // Errors: kFailedPrecondition, leaving the pool unchanged, when `block` is
  // not a live block of this pool (double free, a stale copy of a block whose
  // range was freed and handed out again, a block of another pool, a
  // default-constructed block); the device's error when it refuses to take
  // an empty region back (the block is freed all the same).
  Status Free(const PoolBlock& block) EXCLUDES(mu_);

  MemoryPoolStats Stats() const EXCLUDES(mu_);

  DeviceBackend* backend() const { return backend_; }
  uint64_t limit_bytes() const { return limit_bytes_; }
  uint64_t alignment_bytes() const { return alignment_bytes_; }
  uint64_t region_bytes() const { return region_bytes_; }

 private:
  MemoryPool(DeviceBackend* backend, uint64_t limit_bytes, uint64_t alignment_bytes,
             uint64_t region_bytes, uint64_t max_block_bytes);

  using Pos = std::pair<DeviceRegionId, uint64_t>;  // (region, offset)
  struct LiveBlock {
    uint64_t size_bytes;
    uint64_t alloc_id;
  };
  struct Region {
    uint64_t size_bytes = 0;
    uint64_t live_blocks = 0;
  };

  void InsertFreeLocked(Pos pos, uint64_t size_bytes) REQUIRES(mu_);
  void EraseFreeLocked(std::map<Pos, uint64_t>::iterator it) REQUIRES(mu_);
  // Carves `rounded` bytes off the front of free block `it`.
  PoolBlock TakeLocked(std::map<Pos, uint64_t>::iterator it, uint64_t rounded,
                       uint64_t requested) REQUIRES(mu_);
  // Room for one more region: min(max block, limit − region bytes), aligned.
  uint64_t GrowableLocked() const REQUIRES(mu_);
  uint64_t LargestFreeLocked() const REQUIRES(mu_);

  DeviceBackend* const backend_;
  const uint64_t limit_bytes_;
  const uint64_t alignment_bytes_;
  const uint64_t region_bytes_;
  const uint64_t max_block_bytes_;  // device max allocation, aligned down
  const uint64_t pool_id_;

  mutable Mutex mu_;
  // The free list twice: by (size, region, offset) for best fit, by
  // position for coalescing. Invariants: Note [Pool invariants].
  std::set<std::tuple<uint64_t, DeviceRegionId, uint64_t>> free_by_size_ GUARDED_BY(mu_);
  std::map<Pos, uint64_t> free_by_pos_ GUARDED_BY(mu_);  // position → size
  std::map<Pos, LiveBlock> live_ GUARDED_BY(mu_);
  std::map<DeviceRegionId, Region> regions_ GUARDED_BY(mu_);
  uint64_t region_total_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t next_alloc_id_ GUARDED_BY(mu_) = 1;
  uint64_t in_use_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t peak_in_use_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t num_allocs_ GUARDED_BY(mu_) = 0;
  uint64_t num_frees_ GUARDED_BY(mu_) = 0;
  uint64_t num_alloc_failures_ GUARDED_BY(mu_) = 0;
  uint64_t regions_allocated_ GUARDED_BY(mu_) = 0;
  uint64_t regions_freed_ GUARDED_BY(mu_) = 0;
};

}  // namespace arbiter
