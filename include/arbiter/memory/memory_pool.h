// arbiter/memory/memory_pool.h — a best-fit allocator with coalescing over a
// device arena (docs/memory.md "The device arena and the pool").
//
// The pool hands out blocks of the byte range [0, limit_bytes) of a
// DeviceBackend's arena, as offsets; it never touches the arena's memory
// (the caller copies with DeviceBackend::CopyToDevice). The algorithm is the
// one XLA's BFC allocator is named for, without its bins:
//   - requests are rounded up to a multiple of the alignment (default 64 B;
//     a 0-byte request takes one alignment unit, so live blocks never share
//     an offset); every block offset is a multiple of the alignment;
//   - Allocate takes the smallest free block that fits (ties: the lowest
//     offset) and splits off the rest — O(log n) in the number of free
//     blocks;
//   - Free merges the block with free neighbours, so freeing everything
//     leaves one free block [0, limit_bytes) — which is what compaction
//     (the weight cache's compaction, docs/memory.md "The device arena and
//     the pool") relies on.
// Fragmentation is reported, not fixed: 1 − largest_free / free. It is cut
// by placement (pinned models first, at the base) and by compaction.
//
// Example:
//   ARBITER_ASSIGN_OR_RETURN(std::unique_ptr<MemoryPool> pool,
//                            MemoryPool::Create(device.get()));
//   ARBITER_ASSIGN_OR_RETURN(PoolBlock block, pool->Allocate(nbytes));
//   ARBITER_RETURN_IF_ERROR(device->CopyToDevice(block.offset, host, nbytes));
//   ...
//   ARBITER_RETURN_IF_ERROR(pool->Free(block));
//
// Thread safety: thread-safe (one mutex, held only for the O(log n) map
// updates; messages are formatted after it is released).
// Lifetime: the backend must outlive the pool. A PoolBlock is a plain value,
// not an RAII handle: the owner (the weight cache) frees it exactly once.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <unordered_map>
#include <utility>

#include "arbiter/base/mutex.h"
#include "arbiter/base/status.h"
#include "arbiter/memory/device_backend.h"

namespace arbiter {

// One allocation. `offset` is from the arena start: the device address is
// backend->base() + offset.
struct PoolBlock {
  uint64_t offset = 0;           // multiple of the pool's alignment
  uint64_t size_bytes = 0;       // rounded size taken from the pool
  uint64_t requested_bytes = 0;  // what Allocate was asked for (≤ size_bytes)
  uint64_t pool_id = 0;          // which pool handed it out (never 0 for a real block)
  uint64_t alloc_id = 0;         // unique per allocation within the pool
};

// A snapshot of the pool's books (STYLE.md rule 9; the reference's device
// memory in_use/limit/free/peak metrics). Bytes are rounded block sizes.
struct MemoryPoolStats {
  uint64_t in_use_bytes = 0;              // Σ size_bytes of live blocks
  uint64_t limit_bytes = 0;               // the managed range [0, limit)
  uint64_t free_bytes = 0;                // limit − in_use
  uint64_t peak_in_use_bytes = 0;         // max in_use since construction
  uint64_t largest_free_block_bytes = 0;  // the biggest single request that fits
  double fragmentation = 0.0;             // 1 − largest_free / free; 0 when free == 0
  uint64_t num_allocs = 0;                // successful Allocate calls
  uint64_t num_frees = 0;                 // successful Free calls
  uint64_t num_alloc_failures = 0;        // Allocate calls refused (exhausted)
  uint64_t live_blocks = 0;
  uint64_t free_blocks = 0;               // entries on the free list
};

struct MemoryPoolOptions {
  // The managed range: [0, limit_bytes) of the arena; 0 = the whole arena.
  // Rounded down to a multiple of alignment_bytes.
  uint64_t limit_bytes = 0;
  // Offset and size granularity. A power of two ≥ 1.
  uint64_t alignment_bytes = 64;
};

class MemoryPool {
 public:
  // Errors: kInvalidArgument when `backend` is null, alignment is not a
  // power of two, or limit_bytes exceeds the arena (names the option).
  static Result<std::unique_ptr<MemoryPool>> Create(DeviceBackend* backend,
                                                    MemoryPoolOptions options = {});
  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;

  // Takes the best-fitting free block for `bytes` (rounded up to the
  // alignment).
  // Errors: kResourceExhausted when no free block is large enough; the
  // message states the bytes requested, the free bytes and the largest free
  // block. Nothing changes then.
  Result<PoolBlock> Allocate(uint64_t bytes) EXCLUDES(mu_);

  // Returns `block` to the pool and merges it with free neighbours.
  // Errors: kFailedPrecondition, leaving the pool unchanged, when `block` is
  // not a live block of this pool (double free, a stale copy of a block whose
  // range was freed and handed out again, a block of another pool, a
  // default-constructed block).
  Status Free(const PoolBlock& block) EXCLUDES(mu_);

  MemoryPoolStats Stats() const EXCLUDES(mu_);

  DeviceBackend* backend() const { return backend_; }
  uint64_t limit_bytes() const { return limit_bytes_; }
  uint64_t alignment_bytes() const { return alignment_bytes_; }

 private:
  MemoryPool(DeviceBackend* backend, uint64_t limit_bytes, uint64_t alignment_bytes);

  struct LiveBlock {
    uint64_t size_bytes;
    uint64_t alloc_id;
  };

  void InsertFreeLocked(uint64_t offset, uint64_t size_bytes) REQUIRES(mu_);
  void EraseFreeLocked(std::map<uint64_t, uint64_t>::iterator it) REQUIRES(mu_);
  uint64_t LargestFreeLocked() const REQUIRES(mu_);

  DeviceBackend* const backend_;
  const uint64_t limit_bytes_;
  const uint64_t alignment_bytes_;
  const uint64_t pool_id_;

  mutable Mutex mu_;
  // The free list twice: by (size, offset) for best fit, by offset for
  // coalescing. Invariants: same blocks in both; free blocks never touch
  // (adjacent ones are merged); free and live blocks tile [0, limit).
  std::set<std::pair<uint64_t, uint64_t>> free_by_size_ GUARDED_BY(mu_);
  std::map<uint64_t, uint64_t> free_by_offset_ GUARDED_BY(mu_);  // offset → size
  std::unordered_map<uint64_t, LiveBlock> live_ GUARDED_BY(mu_);  // offset → block
  uint64_t next_alloc_id_ GUARDED_BY(mu_) = 1;
  uint64_t in_use_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t peak_in_use_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t num_allocs_ GUARDED_BY(mu_) = 0;
  uint64_t num_frees_ GUARDED_BY(mu_) = 0;
  uint64_t num_alloc_failures_ GUARDED_BY(mu_) = 0;
};

}  // namespace arbiter
