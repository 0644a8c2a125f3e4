// memory/memory_pool.cc — best-fit allocation with coalescing over a device
// arena's offsets.
//
// Note [Pool invariants]
// At every instant, under mu_:
//   1. The free blocks (free_by_offset_) and the live blocks (live_) tile
//      [0, limit_bytes_) exactly: no gaps, no overlaps.
//   2. No two free blocks are adjacent (Free merges them), so after every
//      block is freed there is exactly one free block [0, limit).
//   3. free_by_size_ holds the same (size, offset) pairs as free_by_offset_.
//   4. Every offset and size is a multiple of alignment_bytes_ (the limit is
//      rounded down, requests rounded up, splits happen at rounded sizes).
//   5. in_use_bytes_ == Σ live sizes; limit − in_use == Σ free sizes.
// The property tests in memory_pool_test.cc check 1, 4 and 5 from the
// outside and 2 through "free everything → one block of the full limit".
//
// Best fit: free_by_size_.lower_bound({rounded, 0}) is the smallest block
// that fits, lowest offset among equals. The front of the block is taken, so
// allocations pack toward the base, and the rest goes back on the list.
#include "arbiter/memory/memory_pool.h"

#include <atomic>
#include <string>

#include <fmt/format.h>

#include "arbiter/base/size.h"

namespace arbiter {
namespace {

std::atomic<uint64_t> g_next_pool_id{1};

bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

std::string Bytes(uint64_t b) { return fmt::format("{} ({} bytes)", FormatSize(b), b); }

}  // namespace

Result<std::unique_ptr<MemoryPool>> MemoryPool::Create(DeviceBackend* backend,
                                                       MemoryPoolOptions options) {
  if (backend == nullptr) return InvalidArgumentError("memory pool: no device backend");
  if (!IsPowerOfTwo(options.alignment_bytes)) {
    return InvalidArgumentError(fmt::format(
        "memory pool: alignment_bytes {} is not a power of two", options.alignment_bytes));
  }
  const uint64_t arena = backend->arena_bytes();
  if (options.limit_bytes > arena) {
    return InvalidArgumentError(fmt::format(
        "memory pool: limit_bytes {} exceeds the {} device arena of {} bytes",
        options.limit_bytes, backend->name(), arena));
  }
  uint64_t limit = options.limit_bytes == 0 ? arena : options.limit_bytes;
  limit -= limit % options.alignment_bytes;
  return std::unique_ptr<MemoryPool>(new MemoryPool(backend, limit, options.alignment_bytes));
}

MemoryPool::MemoryPool(DeviceBackend* backend, uint64_t limit_bytes, uint64_t alignment_bytes)
    : backend_(backend),
      limit_bytes_(limit_bytes),
      alignment_bytes_(alignment_bytes),
      pool_id_(g_next_pool_id.fetch_add(1)) {
  MutexLock lock(&mu_);
  if (limit_bytes_ > 0) InsertFreeLocked(0, limit_bytes_);
}

void MemoryPool::InsertFreeLocked(uint64_t offset, uint64_t size_bytes) {
  free_by_offset_.emplace(offset, size_bytes);
  free_by_size_.emplace(size_bytes, offset);
}

void MemoryPool::EraseFreeLocked(std::map<uint64_t, uint64_t>::iterator it) {
  free_by_size_.erase({it->second, it->first});
  free_by_offset_.erase(it);
}

uint64_t MemoryPool::LargestFreeLocked() const {
  return free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
}

Result<PoolBlock> MemoryPool::Allocate(uint64_t bytes) {
  // Round up without overflow: anything above the limit cannot fit anyway.
  uint64_t rounded = 0;
  if (bytes <= limit_bytes_) {
    rounded = bytes == 0 ? alignment_bytes_
                         : (bytes + alignment_bytes_ - 1) / alignment_bytes_ * alignment_bytes_;
  }
  uint64_t free_bytes = 0, largest = 0;
  {
    MutexLock lock(&mu_);
    auto it = rounded == 0 ? free_by_size_.end() : free_by_size_.lower_bound({rounded, 0});
    if (it != free_by_size_.end()) {
      const auto [size, offset] = *it;
      EraseFreeLocked(free_by_offset_.find(offset));
      if (size > rounded) InsertFreeLocked(offset + rounded, size - rounded);
      PoolBlock block{offset, rounded, bytes, pool_id_, next_alloc_id_++};
      live_.emplace(offset, LiveBlock{rounded, block.alloc_id});
      in_use_bytes_ += rounded;
      if (in_use_bytes_ > peak_in_use_bytes_) peak_in_use_bytes_ = in_use_bytes_;
      ++num_allocs_;
      return block;
    }
    ++num_alloc_failures_;
    free_bytes = limit_bytes_ - in_use_bytes_;
    largest = LargestFreeLocked();
  }
  return ResourceExhaustedError(fmt::format(
      "{} memory pool: cannot allocate {} (rounded to {}-byte alignment): {} free of {}, "
      "largest free block {}; free or compact device weights, or use a larger arena",
      backend_->name(), Bytes(bytes), alignment_bytes_, Bytes(free_bytes), Bytes(limit_bytes_),
      Bytes(largest)));
}

Status MemoryPool::Free(const PoolBlock& block) {
  {
    MutexLock lock(&mu_);
    auto live = block.pool_id == pool_id_ ? live_.find(block.offset) : live_.end();
    if (live != live_.end() && live->second.alloc_id == block.alloc_id &&
        live->second.size_bytes == block.size_bytes) {
      uint64_t offset = block.offset;
      uint64_t size = block.size_bytes;
      live_.erase(live);
      in_use_bytes_ -= size;
      ++num_frees_;
      // Merge with the free block after it, then the one before it.
      auto next = free_by_offset_.lower_bound(offset);
      if (next != free_by_offset_.end() && next->first == offset + size) {
        size += next->second;
        EraseFreeLocked(next);
      }
      auto after = free_by_offset_.lower_bound(offset);
      if (after != free_by_offset_.begin()) {
        auto prev = std::prev(after);
        if (prev->first + prev->second == offset) {
          offset = prev->first;
          size += prev->second;
          EraseFreeLocked(prev);
        }
      }
      InsertFreeLocked(offset, size);
      return OkStatus();
    }
  }
  return FailedPreconditionError(fmt::format(
      "{} memory pool: block at offset {} ({} bytes, allocation {}) is not a live block of this "
      "pool (freed twice, stale, or from another pool)",
      backend_->name(), block.offset, block.size_bytes, block.alloc_id));
}

MemoryPoolStats MemoryPool::Stats() const {
  MutexLock lock(&mu_);
  MemoryPoolStats s;
  s.in_use_bytes = in_use_bytes_;
  s.limit_bytes = limit_bytes_;
  s.free_bytes = limit_bytes_ - in_use_bytes_;
  s.peak_in_use_bytes = peak_in_use_bytes_;
  s.largest_free_block_bytes = LargestFreeLocked();
  s.fragmentation = s.free_bytes == 0 ? 0.0
                                      : 1.0 - static_cast<double>(s.largest_free_block_bytes) /
                                                  static_cast<double>(s.free_bytes);
  s.num_allocs = num_allocs_;
  s.num_frees = num_frees_;
  s.num_alloc_failures = num_alloc_failures_;
  s.live_blocks = live_.size();
  s.free_blocks = free_by_offset_.size();
  return s;
}

}  // namespace arbiter
