// memory/memory_pool.cc — best-fit allocation with coalescing over the
// regions of a device.
//
// Note [Pool regions]
// The pool's memory is a set of device regions (DeviceBackend::
// AllocateRegion), each at most the device's largest allocation, together at
// most limit_bytes. It starts with none. Allocate looks for a free block in
// the regions it has; only when none fits does it add a region: of
// region_bytes, or of the request when that is larger, cut to the room left
// under the limit. A region whose last live block is freed goes back to the
// device (FreeRegion) in the same Free: on a GPU that is VRAM returned to the
// driver when a model's weights leave, on the cpu device an unmapped range
// (RSS and address space). There is no hysteresis: a region is cheap to take
// again (an mmap; a vkAllocateMemory), and memory that stays allocated while
// nothing uses it is what the memory arbiter exists to prevent. Region
// allocation and release happen under mu_ (they are rare, and doing them
// under the lock keeps the pool's limit and the device's heap from ever
// disagreeing transiently between two threads); the common path — a fit in
// an existing region — is map updates only.
//
// Note [Pool invariants]
// At every instant, under mu_:
//   1. Inside each region, the free blocks (free_by_pos_) and the live
//      blocks (live_) tile [0, region size) exactly: no gaps, no overlaps.
//   2. No two free blocks of a region are adjacent (Free merges them), and
//      no region is without a live block (an empty one is given back), so
//      after every block is freed there is no region and no free block.
//   3. free_by_size_ holds the same (size, region, offset) triples as
//      free_by_pos_.
//   4. Every offset and size is a multiple of alignment_bytes_ (region
//      sizes are, the limit is rounded down, requests rounded up, splits
//      happen at rounded sizes).
//   5. in_use_bytes_ == Σ live sizes; region_total_bytes_ == Σ region sizes
//      == in_use + Σ free sizes ≤ limit_bytes_.
// The property tests in memory_pool_test.cc check 1, 4 and 5 from the
// outside and 2 through "free everything → no region left".
//
// Best fit: free_by_size_.lower_bound({rounded, 0, 0}) is the smallest block
// that fits, oldest region and lowest offset among equals. The front of the
// block is taken, so allocations pack toward the start of the oldest region,
// and the rest goes back on the list.
#include "arbiter/memory/memory_pool.h"

#include <algorithm>
#include <atomic>
#include <string>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

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
  const DeviceProperties& device = backend->properties();
  const uint64_t align = std::max(options.alignment_bytes, device.alignment_bytes);
  if (options.limit_bytes > device.heap_bytes) {
    return InvalidArgumentError(fmt::format(
        "memory pool: limit_bytes {} exceeds the {} device's heap of {} bytes",
        options.limit_bytes, device.name, device.heap_bytes));
  }
  if (options.region_bytes > device.max_allocation_bytes) {
    return InvalidArgumentError(fmt::format(
        "memory pool: region_bytes {} exceeds the {} device's largest allocation of {} bytes",
        options.region_bytes, device.name, device.max_allocation_bytes));
  }
  uint64_t limit = options.limit_bytes == 0 ? device.heap_bytes : options.limit_bytes;
  limit -= limit % align;
  const uint64_t max_block = device.max_allocation_bytes - device.max_allocation_bytes % align;
  uint64_t region = options.region_bytes == 0 ? std::min(limit, max_block) : options.region_bytes;
  if (region % align != 0) region = std::min(max_block, region - region % align + align);
  return std::unique_ptr<MemoryPool>(new MemoryPool(backend, limit, align, region, max_block));
}

MemoryPool::MemoryPool(DeviceBackend* backend, uint64_t limit_bytes, uint64_t alignment_bytes,
                       uint64_t region_bytes, uint64_t max_block_bytes)
    : backend_(backend),
      limit_bytes_(limit_bytes),
      alignment_bytes_(alignment_bytes),
      region_bytes_(region_bytes),
      max_block_bytes_(max_block_bytes),
      pool_id_(g_next_pool_id.fetch_add(1)) {}

MemoryPool::~MemoryPool() {
  MutexLock lock(&mu_);
  for (const auto& [id, region] : regions_) {
    Status st = backend_->FreeRegion(id);
    if (!st.ok()) spdlog::error("memory pool: {}", st.message());
  }
}

void MemoryPool::InsertFreeLocked(Pos pos, uint64_t size_bytes) {
  free_by_pos_.emplace(pos, size_bytes);
  free_by_size_.emplace(size_bytes, pos.first, pos.second);
}

void MemoryPool::EraseFreeLocked(std::map<Pos, uint64_t>::iterator it) {
  free_by_size_.erase({it->second, it->first.first, it->first.second});
  free_by_pos_.erase(it);
}

PoolBlock MemoryPool::TakeLocked(std::map<Pos, uint64_t>::iterator it, uint64_t rounded,
                                 uint64_t requested) {
  const Pos pos = it->first;
  const uint64_t size = it->second;
  EraseFreeLocked(it);
  if (size > rounded) InsertFreeLocked({pos.first, pos.second + rounded}, size - rounded);
  PoolBlock block{pos.first, pos.second, rounded, requested, pool_id_, next_alloc_id_++};
  live_.emplace(pos, LiveBlock{rounded, block.alloc_id});
  regions_[pos.first].live_blocks++;
  in_use_bytes_ += rounded;
  peak_in_use_bytes_ = std::max(peak_in_use_bytes_, in_use_bytes_);
  ++num_allocs_;
  return block;
}

uint64_t MemoryPool::GrowableLocked() const {
  return std::min(max_block_bytes_, limit_bytes_ - region_total_bytes_);
}

uint64_t MemoryPool::LargestFreeLocked() const {
  const uint64_t in_regions = free_by_size_.empty() ? 0 : std::get<0>(*free_by_size_.rbegin());
  return std::max(in_regions, GrowableLocked());
}

Result<PoolBlock> MemoryPool::Allocate(uint64_t bytes) {
  // Round up without overflow: anything above the limit cannot fit anyway.
  uint64_t rounded = 0;
  if (bytes <= limit_bytes_) {
    rounded = bytes == 0 ? alignment_bytes_
                         : (bytes + alignment_bytes_ - 1) / alignment_bytes_ * alignment_bytes_;
  }
  if (rounded > max_block_bytes_ && rounded <= limit_bytes_) {
    {
      MutexLock lock(&mu_);
      ++num_alloc_failures_;
    }
    return InvalidArgumentError(fmt::format(
        "{} memory pool: cannot allocate {} as one block: the device's largest allocation is "
        "{}; a block never spans two device regions",
        backend_->name(), Bytes(bytes), Bytes(max_block_bytes_)));
  }
  uint64_t free_bytes = 0, largest = 0;
  Status device_refused;
  {
    MutexLock lock(&mu_);
    auto it = rounded == 0 ? free_by_size_.end() : free_by_size_.lower_bound({rounded, 0, 0});
    if (it != free_by_size_.end()) {
      return TakeLocked(free_by_pos_.find({std::get<1>(*it), std::get<2>(*it)}), rounded, bytes);
    }
    // Grow by one region (Note [Pool regions]).
    const uint64_t grow = std::min(std::max(region_bytes_, rounded), GrowableLocked());
    if (rounded != 0 && grow >= rounded) {
      Result<DeviceRegion> region = backend_->AllocateRegion(grow);
      if (region.ok()) {
        regions_.emplace(region->id, Region{grow, 0});
        region_total_bytes_ += grow;
        ++regions_allocated_;
        InsertFreeLocked({region->id, 0}, grow);
        return TakeLocked(free_by_pos_.find({region->id, 0}), rounded, bytes);
      }
      device_refused = region.status();
    }
    ++num_alloc_failures_;
    free_bytes = limit_bytes_ - in_use_bytes_;
    largest = LargestFreeLocked();
  }
  return ResourceExhaustedError(fmt::format(
      "{} memory pool: cannot allocate {} (rounded to {}-byte alignment): {} free of {}, "
      "largest free block {}{}; free or compact device weights, or use a larger arena",
      backend_->name(), Bytes(bytes), alignment_bytes_, Bytes(free_bytes), Bytes(limit_bytes_),
      Bytes(largest),
      device_refused.ok() ? "" : fmt::format(" (the device refused a region: {})",
                                             device_refused.message())));
}

Status MemoryPool::Free(const PoolBlock& block) {
  {
    MutexLock lock(&mu_);
    const Pos pos{block.region, block.offset};
    auto live = block.pool_id == pool_id_ ? live_.find(pos) : live_.end();
    if (live != live_.end() && live->second.alloc_id == block.alloc_id &&
        live->second.size_bytes == block.size_bytes) {
      uint64_t offset = block.offset;
      uint64_t size = block.size_bytes;
      live_.erase(live);
      in_use_bytes_ -= size;
      ++num_frees_;
      // Merge with the free block after it, then the one before it (same
      // region only: positions order by region first).
      auto next = free_by_pos_.lower_bound(pos);
      if (next != free_by_pos_.end() && next->first == Pos{block.region, offset + size}) {
        size += next->second;
        EraseFreeLocked(next);
      }
      auto after = free_by_pos_.lower_bound(pos);
      if (after != free_by_pos_.begin()) {
        auto prev = std::prev(after);
        if (prev->first.first == block.region && prev->first.second + prev->second == offset) {
          offset = prev->first.second;
          size += prev->second;
          EraseFreeLocked(prev);
        }
      }
      auto region = regions_.find(block.region);
      if (--region->second.live_blocks > 0) {
        InsertFreeLocked({block.region, offset}, size);
        return OkStatus();
      }
      // Empty: back to the device (Note [Pool regions]). offset == 0 and
      // size == the region's size here (invariant 1).
      region_total_bytes_ -= region->second.size_bytes;
      regions_.erase(region);
      ++regions_freed_;
      Status st = backend_->FreeRegion(block.region);
      if (st.ok()) return st;
      return st.WithPrefix(fmt::format("{} memory pool: freeing an empty region",
                                       backend_->name()));
    }
  }
  return FailedPreconditionError(fmt::format(
      "{} memory pool: block at offset {} of region {} ({} bytes, allocation {}) is not a live "
      "block of this pool (freed twice, stale, or from another pool)",
      backend_->name(), block.offset, block.region, block.size_bytes, block.alloc_id));
}

MemoryPoolStats MemoryPool::Stats() const {
  MutexLock lock(&mu_);
  MemoryPoolStats s;
  s.in_use_bytes = in_use_bytes_;
  s.limit_bytes = limit_bytes_;
  s.free_bytes = limit_bytes_ - in_use_bytes_;
  s.peak_in_use_bytes = peak_in_use_bytes_;
  s.largest_free_block_bytes = std::min(LargestFreeLocked(), s.free_bytes);
  s.fragmentation = s.free_bytes == 0 ? 0.0
                                      : 1.0 - static_cast<double>(s.largest_free_block_bytes) /
                                                  static_cast<double>(s.free_bytes);
  s.num_allocs = num_allocs_;
  s.num_frees = num_frees_;
  s.num_alloc_failures = num_alloc_failures_;
  s.live_blocks = live_.size();
  s.free_blocks = free_by_pos_.size();
  s.regions = regions_.size();
  s.region_bytes = region_total_bytes_;
  s.regions_allocated = regions_allocated_;
  s.regions_freed = regions_freed_;
  return s;
}

}  // namespace arbiter
