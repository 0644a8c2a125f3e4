// MemoryPool: best fit, coalescing, exhaustion, misuse, growth by device
// regions and their return (Note [Pool regions]), and the invariants of
// Note [Pool invariants] as rapidcheck properties.
#include "arbiter/memory/memory_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <set>
#include <thread>
#include <tuple>
#include <vector>

namespace arbiter {
namespace {

bool Contains(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

struct PoolFixture {
  explicit PoolFixture(uint64_t arena, MemoryPoolOptions options = {}) : device(arena) {
    Result<std::unique_ptr<MemoryPool>> p = MemoryPool::Create(&device, options);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    if (p.ok()) pool = std::move(p).value();
  }
  FakeDeviceBackend device;
  std::unique_ptr<MemoryPool> pool;
};

PoolBlock MustAllocate(MemoryPool& pool, uint64_t bytes) {
  Result<PoolBlock> b = pool.Allocate(bytes);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return b.ok() ? *b : PoolBlock{};
}

TEST(MemoryPoolTest, AllocatesAlignedFromTheBaseAndRoundsUp) {
  PoolFixture f(4096);
  PoolBlock a = MustAllocate(*f.pool, 1);
  PoolBlock b = MustAllocate(*f.pool, 100);
  PoolBlock c = MustAllocate(*f.pool, 0);
  EXPECT_EQ(a.offset, 0u);
  EXPECT_EQ(a.size_bytes, 64u);
  EXPECT_EQ(a.requested_bytes, 1u);
  EXPECT_EQ(b.offset, 64u);
  EXPECT_EQ(b.size_bytes, 128u);
  EXPECT_EQ(c.offset, 192u);  // a 0-byte request still gets its own offset
  EXPECT_EQ(c.size_bytes, 64u);
  MemoryPoolStats s = f.pool->Stats();
  EXPECT_EQ(s.in_use_bytes, 256u);
  EXPECT_EQ(s.free_bytes, 4096u - 256u);
  EXPECT_EQ(s.num_allocs, 3u);
  EXPECT_EQ(s.live_blocks, 3u);
}

TEST(MemoryPoolTest, BestFitPicksTheSmallestSufficientHole) {
  // Layout: [h300 | x | h100 | x | h200 | x | rest], holes made by freeing.
  PoolFixture f(100000, {.limit_bytes = 0, .alignment_bytes = 1});
  PoolBlock h300 = MustAllocate(*f.pool, 300);
  PoolBlock x1 = MustAllocate(*f.pool, 10);
  PoolBlock h100 = MustAllocate(*f.pool, 100);
  PoolBlock x2 = MustAllocate(*f.pool, 10);
  PoolBlock h200 = MustAllocate(*f.pool, 200);
  PoolBlock x3 = MustAllocate(*f.pool, 10);
  ASSERT_TRUE(f.pool->Free(h300).ok());
  ASSERT_TRUE(f.pool->Free(h100).ok());
  ASSERT_TRUE(f.pool->Free(h200).ok());

  PoolBlock got = MustAllocate(*f.pool, 150);
  EXPECT_EQ(got.offset, h200.offset);  // not the 300 hole, not the tail
  PoolBlock small = MustAllocate(*f.pool, 100);
  EXPECT_EQ(small.offset, h100.offset);  // exact fit
  PoolBlock mid = MustAllocate(*f.pool, 40);
  EXPECT_EQ(mid.offset, h200.offset + 150);  // the 50-byte remainder of h200
  PoolBlock big = MustAllocate(*f.pool, 250);
  EXPECT_EQ(big.offset, h300.offset);
  (void)x1, (void)x2, (void)x3;
}

TEST(MemoryPoolTest, FreeCoalescesWithBothNeighbours) {
  PoolFixture f(64 * 10);
  PoolBlock a = MustAllocate(*f.pool, 64);
  PoolBlock b = MustAllocate(*f.pool, 64);
  PoolBlock c = MustAllocate(*f.pool, 64);
  PoolBlock d = MustAllocate(*f.pool, 64 * 7);  // pool full
  EXPECT_EQ(f.pool->Stats().free_bytes, 0u);
  EXPECT_EQ(f.pool->Stats().fragmentation, 0.0);
  ASSERT_TRUE(f.pool->Free(a).ok());
  ASSERT_TRUE(f.pool->Free(c).ok());
  MemoryPoolStats s = f.pool->Stats();
  EXPECT_EQ(s.free_blocks, 2u);
  EXPECT_EQ(s.largest_free_block_bytes, 64u);
  EXPECT_DOUBLE_EQ(s.fragmentation, 0.5);
  ASSERT_TRUE(f.pool->Free(b).ok());  // merges a, b, c
  s = f.pool->Stats();
  EXPECT_EQ(s.free_blocks, 1u);
  EXPECT_EQ(s.largest_free_block_bytes, 192u);
  EXPECT_EQ(s.fragmentation, 0.0);
  ASSERT_TRUE(f.pool->Free(d).ok());
  s = f.pool->Stats();
  EXPECT_EQ(s.free_blocks, 0u);  // the empty region went back to the device
  EXPECT_EQ(s.regions, 0u);
  EXPECT_EQ(f.device.stats().live_regions, 0u);
  EXPECT_EQ(s.largest_free_block_bytes, 640u);
  EXPECT_EQ(s.in_use_bytes, 0u);
  EXPECT_EQ(s.peak_in_use_bytes, 640u);
  EXPECT_EQ(s.num_frees, 4u);
}

TEST(MemoryPoolTest, ExhaustionStatesRequestedFreeAndLargestBlock) {
  PoolFixture f(1024);
  PoolBlock a = MustAllocate(*f.pool, 256);
  MustAllocate(*f.pool, 256);
  ASSERT_TRUE(f.pool->Free(a).ok());
  // 768 free in total, but the largest block is 512.
  Result<PoolBlock> r = f.pool->Allocate(600);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  const std::string m = r.status().message();
  EXPECT_TRUE(Contains(m, "600 bytes")) << m;
  EXPECT_TRUE(Contains(m, "768 bytes")) << m;
  EXPECT_TRUE(Contains(m, "largest free block")) << m;
  EXPECT_TRUE(Contains(m, "(512 bytes)")) << m;
  EXPECT_TRUE(Contains(m, "fake memory pool")) << m;
  MemoryPoolStats s = f.pool->Stats();
  EXPECT_EQ(s.num_alloc_failures, 1u);
  EXPECT_EQ(s.in_use_bytes, 256u);  // nothing changed
  // Far beyond the limit, including sizes whose rounding would overflow.
  EXPECT_EQ(f.pool->Allocate(UINT64_MAX).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(f.pool->Allocate(2048).status().code(), StatusCode::kResourceExhausted);
}

TEST(MemoryPoolTest, DoubleFreeAndForeignBlocksAreFailedPrecondition) {
  PoolFixture f(4096);
  PoolFixture other(4096);
  PoolBlock a = MustAllocate(*f.pool, 64);
  ASSERT_TRUE(f.pool->Free(a).ok());
  Status twice = f.pool->Free(a);
  EXPECT_EQ(twice.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(twice.message(), "not a live block")) << twice.message();

  // A stale copy: same offset and size, handed out again since.
  PoolBlock again = MustAllocate(*f.pool, 64);
  EXPECT_EQ(again.offset, a.offset);
  EXPECT_EQ(f.pool->Free(a).code(), StatusCode::kFailedPrecondition);

  // A block of another pool with the same offset and size.
  PoolBlock foreign = MustAllocate(*other.pool, 64);
  EXPECT_EQ(foreign.offset, again.offset);
  EXPECT_EQ(f.pool->Free(foreign).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(f.pool->Free(PoolBlock{}).code(), StatusCode::kFailedPrecondition);
  PoolBlock wrong_size = again;
  wrong_size.size_bytes = 128;
  EXPECT_EQ(f.pool->Free(wrong_size).code(), StatusCode::kFailedPrecondition);

  // None of that changed the books.
  MemoryPoolStats s = f.pool->Stats();
  EXPECT_EQ(s.in_use_bytes, 64u);
  EXPECT_EQ(s.num_frees, 1u);
  EXPECT_TRUE(f.pool->Free(again).ok());
  EXPECT_TRUE(other.pool->Free(foreign).ok());
}

TEST(MemoryPoolTest, FakeBackendWithATebibyteArena) {
  const uint64_t tib = uint64_t{1} << 40;
  PoolFixture f(tib);
  EXPECT_EQ(f.pool->limit_bytes(), tib);
  PoolBlock a = MustAllocate(*f.pool, uint64_t{300} << 30);  // 300 GiB
  PoolBlock b = MustAllocate(*f.pool, uint64_t{500} << 30);
  EXPECT_EQ(b.offset, uint64_t{300} << 30);
  EXPECT_EQ(b.region, a.region);  // one region of the whole heap
  EXPECT_EQ(f.pool->Allocate(uint64_t{300} << 30).status().code(),
            StatusCode::kResourceExhausted);
  // Counted, not performed.
  ASSERT_TRUE(f.device.CopyToDevice(b.region, b.offset, &a, b.size_bytes).Wait().ok());
  ASSERT_TRUE(f.pool->Free(a).ok());
  ASSERT_TRUE(f.pool->Free(b).ok());
  EXPECT_EQ(f.pool->Stats().largest_free_block_bytes, tib);
}

TEST(MemoryPoolTest, LimitAndAlignmentOptions) {
  FakeDeviceBackend device(10000);
  Result<std::unique_ptr<MemoryPool>> p =
      MemoryPool::Create(&device, {.limit_bytes = 1000, .alignment_bytes = 256});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ((*p)->limit_bytes(), 768u);  // rounded down to the alignment
  EXPECT_EQ((*p)->Stats().free_bytes, 768u);
  PoolBlock b = MustAllocate(**p, 300);
  EXPECT_EQ(b.size_bytes, 512u);

  Result<std::unique_ptr<MemoryPool>> bad_align =
      MemoryPool::Create(&device, {.limit_bytes = 0, .alignment_bytes = 48});
  ASSERT_FALSE(bad_align.ok());
  EXPECT_EQ(bad_align.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(bad_align.status().message(), "alignment_bytes"));
  Result<std::unique_ptr<MemoryPool>> bad_limit =
      MemoryPool::Create(&device, {.limit_bytes = 10001, .alignment_bytes = 64});
  ASSERT_FALSE(bad_limit.ok());
  EXPECT_TRUE(Contains(bad_limit.status().message(), "limit_bytes"));
  EXPECT_EQ(MemoryPool::Create(nullptr).status().code(), StatusCode::kInvalidArgument);
}

TEST(MemoryPoolTest, EmptyArenaRefusesEverything) {
  PoolFixture f(0);
  EXPECT_EQ(f.pool->Allocate(0).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(f.pool->Stats().fragmentation, 0.0);
}

TEST(MemoryPoolTest, WorksOverTheCpuBackend) {
  Result<std::unique_ptr<DeviceBackend>> device = MakeDeviceBackend("cpu", 1 << 16);
  ASSERT_TRUE(device.ok());
  Result<std::unique_ptr<MemoryPool>> pool = MemoryPool::Create(device->get());
  ASSERT_TRUE(pool.ok());
  PoolBlock b = MustAllocate(**pool, 1000);
  const std::vector<uint8_t> data(1000, 42);
  ASSERT_TRUE((*device)->CopyToDevice(b.region, b.offset, data.data(), data.size()).Wait().ok());
  auto* p = static_cast<uint8_t*>((*device)->HostPointer(b.region, b.offset));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  EXPECT_EQ(p[999], 42);
  EXPECT_TRUE((*pool)->Free(b).ok());
}

TEST(MemoryPoolTest, ConcurrentAllocateAndFreeKeepTheBooks) {
  PoolFixture f(64 * 1024);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&f, &failures, t] {
      std::vector<PoolBlock> mine;
      for (int i = 0; i < 2000; ++i) {
        if (i % 3 != 2) {
          Result<PoolBlock> b = f.pool->Allocate(static_cast<uint64_t>(1 + (i * 7 + t) % 200));
          if (b.ok()) mine.push_back(*b);
        } else if (!mine.empty()) {
          if (!f.pool->Free(mine.back()).ok()) ++failures;
          mine.pop_back();
        }
      }
      for (const PoolBlock& b : mine) {
        if (!f.pool->Free(b).ok()) ++failures;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  MemoryPoolStats s = f.pool->Stats();
  EXPECT_EQ(s.in_use_bytes, 0u);
  EXPECT_EQ(s.free_blocks, 0u);
  EXPECT_EQ(s.regions, 0u);
  EXPECT_EQ(f.device.stats().live_regions, 0u);
  EXPECT_EQ(s.largest_free_block_bytes, 64u * 1024);
  EXPECT_EQ(s.num_allocs, s.num_frees);
}

// ---- properties (Note [Pool invariants]) ----------------------------------------

// Checks, from the outside, that `live` blocks are inside their regions
// (each at most the device's largest allocation), aligned, pairwise
// disjoint, that every region held has a live block, and that the stats
// agree with them and with the device.
void CheckInvariants(const MemoryPool& pool, const FakeDeviceBackend& device,
                     std::vector<PoolBlock> live) {
  const MemoryPoolStats s = pool.Stats();
  uint64_t sum = 0;
  std::set<DeviceRegionId> regions;
  std::sort(live.begin(), live.end(), [](const PoolBlock& a, const PoolBlock& b) {
    return std::tie(a.region, a.offset) < std::tie(b.region, b.offset);
  });
  for (size_t i = 0; i < live.size(); ++i) {
    const PoolBlock& b = live[i];
    RC_ASSERT(b.region != 0u);
    RC_ASSERT(b.offset % pool.alignment_bytes() == 0u);
    RC_ASSERT(b.size_bytes % pool.alignment_bytes() == 0u);
    RC_ASSERT(b.size_bytes >= b.requested_bytes);
    RC_ASSERT(b.size_bytes > 0u);
    RC_ASSERT(b.offset + b.size_bytes <= device.properties().max_allocation_bytes);
    if (i > 0 && live[i - 1].region == b.region) {
      RC_ASSERT(live[i - 1].offset + live[i - 1].size_bytes <= b.offset);
    }
    regions.insert(b.region);
    sum += b.size_bytes;
  }
  RC_ASSERT(s.regions == regions.size());  // no empty region is kept
  RC_ASSERT(device.stats().live_regions == s.regions);
  RC_ASSERT(device.stats().live_region_bytes == s.region_bytes);
  RC_ASSERT(s.region_bytes <= s.limit_bytes);
  RC_ASSERT(s.region_bytes >= sum);
  RC_ASSERT(s.in_use_bytes == sum);
  RC_ASSERT(s.free_bytes == s.limit_bytes - s.in_use_bytes);
  RC_ASSERT(s.peak_in_use_bytes >= s.in_use_bytes);
  RC_ASSERT(s.largest_free_block_bytes <= s.free_bytes);
  RC_ASSERT(s.live_blocks == live.size());
  RC_ASSERT(s.fragmentation >= 0.0);
  // < 1 unless no block can ever fit (a largest allocation below the
  // alignment).
  const uint64_t max_alloc = device.properties().max_allocation_bytes;
  if (max_alloc >= pool.alignment_bytes()) RC_ASSERT(s.fragmentation < 1.0);
}

RC_GTEST_PROP(MemoryPoolProperty, BlocksAreDisjointAlignedInsideAndAccounted, ()) {
  const uint64_t alignment = uint64_t{1} << *rc::gen::inRange(0, 8);
  const uint64_t arena = *rc::gen::inRange<uint64_t>(0, 20000);
  // Half the runs: a device whose largest allocation is below its heap, and
  // a pool growing by small regions.
  const bool regions = *rc::gen::arbitrary<bool>();
  const uint64_t max_alloc =
      regions && arena > 0 ? *rc::gen::inRange<uint64_t>(1, arena + 1) : arena;
  const uint64_t region_bytes =
      regions && max_alloc > 0 ? *rc::gen::inRange<uint64_t>(0, max_alloc + 1) : 0;
  FakeDeviceBackend device(FakeDeviceOptions{.heap_bytes = arena,
                                             .max_allocation_bytes = max_alloc});
  Result<std::unique_ptr<MemoryPool>> made = MemoryPool::Create(
      &device, {.limit_bytes = 0, .alignment_bytes = alignment, .region_bytes = region_bytes});
  RC_ASSERT(made.ok());
  const uint64_t max_block = max_alloc - max_alloc % alignment;
  MemoryPool& pool = **made;
  // (allocate?, size, which live block to free)
  const auto ops = *rc::gen::container<std::vector<std::tuple<bool, uint64_t, size_t>>>(
      rc::gen::tuple(rc::gen::arbitrary<bool>(), rc::gen::inRange<uint64_t>(0, 3000),
                     rc::gen::inRange<size_t>(0, 1000)));
  std::vector<PoolBlock> live;
  for (const auto& [alloc, size, pick] : ops) {
    if (alloc || live.empty()) {
      const uint64_t largest_before = pool.Stats().largest_free_block_bytes;
      Result<PoolBlock> b = pool.Allocate(size);
      const uint64_t rounded = std::max<uint64_t>(alignment, (size + alignment - 1) / alignment * alignment);
      // Best fit never refuses a request some free block could hold.
      RC_ASSERT(b.ok() == (rounded <= largest_before));
      if (b.ok()) {
        live.push_back(*b);
      } else if (rounded > max_block && rounded <= pool.limit_bytes()) {
        RC_ASSERT(b.status().code() == StatusCode::kInvalidArgument);
      } else {
        RC_ASSERT(b.status().code() == StatusCode::kResourceExhausted);
      }
    } else {
      const size_t i = pick % live.size();
      RC_ASSERT(pool.Free(live[i]).ok());
      live.erase(live.begin() + static_cast<ptrdiff_t>(i));
    }
    CheckInvariants(pool, device, live);
  }
  // Free everything (in a shuffled order): no region left, the whole limit
  // free.
  const std::vector<size_t> order = *rc::gen::container<std::vector<size_t>>(
      live.size(), rc::gen::inRange<size_t>(0, 1000));
  for (size_t k = 0; k < order.size(); ++k) {
    const size_t i = order[k] % live.size();
    RC_ASSERT(pool.Free(live[i]).ok());
    live.erase(live.begin() + static_cast<ptrdiff_t>(i));
  }
  const MemoryPoolStats s = pool.Stats();
  RC_ASSERT(s.in_use_bytes == 0u);
  RC_ASSERT(s.free_bytes == pool.limit_bytes());
  RC_ASSERT(s.largest_free_block_bytes == std::min(pool.limit_bytes(), max_block));
  RC_ASSERT(s.free_blocks == 0u);
  RC_ASSERT(s.regions == 0u);
  RC_ASSERT(device.stats().live_regions == 0u);
  RC_ASSERT(s.regions_allocated == s.regions_freed);
  RC_ASSERT(s.num_allocs == s.num_frees);
}

RC_GTEST_PROP(MemoryPoolProperty, FreeingALiveBlockTwiceIsAlwaysRefused, ()) {
  FakeDeviceBackend device(1 << 16);
  Result<std::unique_ptr<MemoryPool>> made = MemoryPool::Create(&device);
  RC_ASSERT(made.ok());
  const auto sizes = *rc::gen::nonEmpty(
      rc::gen::container<std::vector<uint64_t>>(rc::gen::inRange<uint64_t>(1, 2000)));
  std::vector<PoolBlock> blocks;
  for (uint64_t size : sizes) {
    Result<PoolBlock> b = (*made)->Allocate(size);
    if (b.ok()) blocks.push_back(*b);
  }
  for (const PoolBlock& b : blocks) RC_ASSERT((*made)->Free(b).ok());
  const MemoryPoolStats before = (*made)->Stats();
  for (const PoolBlock& b : blocks) {
    RC_ASSERT((*made)->Free(b).code() == StatusCode::kFailedPrecondition);
  }
  RC_ASSERT((*made)->Stats().num_frees == before.num_frees);
  RC_ASSERT((*made)->Stats().free_blocks == 0u);
  RC_ASSERT((*made)->Stats().regions == 0u);
}

// ---- regions (Note [Pool regions]) ---------------------------------------------

TEST(MemoryPoolRegionsTest, GrowsByRegionsAndGivesEmptyOnesBack) {
  FakeDeviceBackend device(FakeDeviceOptions{.heap_bytes = 10000, .max_allocation_bytes = 4096});
  Result<std::unique_ptr<MemoryPool>> made =
      MemoryPool::Create(&device, {.limit_bytes = 0, .alignment_bytes = 64, .region_bytes = 1024});
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  MemoryPool& pool = **made;
  EXPECT_EQ(pool.Stats().regions, 0u);  // nothing taken before the first block
  EXPECT_EQ(device.stats().live_regions, 0u);
  PoolBlock a = MustAllocate(pool, 600);
  PoolBlock b = MustAllocate(pool, 384);  // fills the rest of the first region
  EXPECT_EQ(a.region, b.region);
  EXPECT_EQ(b.offset, 640u);
  PoolBlock c = MustAllocate(pool, 600);  // does not fit: a second region
  EXPECT_NE(c.region, a.region);
  EXPECT_EQ(c.offset, 0u);
  PoolBlock big = MustAllocate(pool, 3000);  // above region_bytes: a region of its own size
  MemoryPoolStats s = pool.Stats();
  EXPECT_EQ(s.regions, 3u);
  EXPECT_EQ(s.region_bytes, 1024u + 1024u + 3008u);
  EXPECT_EQ(device.stats().live_region_bytes, s.region_bytes);
  EXPECT_EQ(s.regions_allocated, 3u);
  // A region empties: it goes back to the device at once; the others stay.
  ASSERT_TRUE(pool.Free(big).ok());
  EXPECT_EQ(pool.Stats().regions, 2u);
  EXPECT_EQ(device.stats().regions_freed, 1u);
  ASSERT_TRUE(pool.Free(a).ok());  // region 1 still holds b
  EXPECT_EQ(pool.Stats().regions, 2u);
  ASSERT_TRUE(pool.Free(b).ok());
  ASSERT_TRUE(pool.Free(c).ok());
  s = pool.Stats();
  EXPECT_EQ(s.regions, 0u);
  EXPECT_EQ(s.region_bytes, 0u);
  EXPECT_EQ(s.regions_freed, 3u);
  EXPECT_EQ(device.stats().live_regions, 0u);
  EXPECT_EQ(device.stats().live_region_bytes, 0u);
}

TEST(MemoryPoolRegionsTest, GrowthStopsAtTheLimitAndTakesWhatIsLeft) {
  FakeDeviceBackend device(FakeDeviceOptions{.heap_bytes = 10000, .max_allocation_bytes = 4096});
  Result<std::unique_ptr<MemoryPool>> made = MemoryPool::Create(
      &device, {.limit_bytes = 2560, .alignment_bytes = 64, .region_bytes = 1024});
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  MemoryPool& pool = **made;
  MustAllocate(pool, 1024);
  MustAllocate(pool, 1024);
  // 512 bytes of the limit are left: the third region is that small.
  PoolBlock last = MustAllocate(pool, 100);
  EXPECT_EQ(pool.Stats().region_bytes, 2560u);
  Result<PoolBlock> over = pool.Allocate(512);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(pool.Stats().region_bytes, 2560u);
  (void)last;
}

TEST(MemoryPoolRegionsTest, BlockAboveTheLargestAllocationIsRefusedClearly) {
  FakeDeviceBackend device(FakeDeviceOptions{.heap_bytes = 1 << 20, .max_allocation_bytes = 4096});
  Result<std::unique_ptr<MemoryPool>> made = MemoryPool::Create(&device);
  ASSERT_TRUE(made.ok());
  Result<PoolBlock> r = (*made)->Allocate(5000);  // the heap has room; one region cannot
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  const std::string m = r.status().message();
  EXPECT_TRUE(Contains(m, "largest allocation")) << m;
  EXPECT_TRUE(Contains(m, "(5000 bytes)")) << m;
  EXPECT_TRUE(Contains(m, "(4096 bytes)")) << m;
  EXPECT_EQ((*made)->Stats().num_alloc_failures, 1u);
  EXPECT_EQ(device.stats().regions_allocated, 0u);  // nothing was tried on the device
  EXPECT_TRUE((*made)->Allocate(4096).ok());
  // region_bytes above the largest allocation is refused at Create.
  Result<std::unique_ptr<MemoryPool>> bad =
      MemoryPool::Create(&device, {.limit_bytes = 0, .alignment_bytes = 64, .region_bytes = 8192});
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(Contains(bad.status().message(), "region_bytes")) << bad.status().message();
}

TEST(MemoryPoolRegionsTest, TheDevicesAlignmentIsHonoured) {
  FakeDeviceBackend device(FakeDeviceOptions{.heap_bytes = 1 << 20, .alignment_bytes = 256});
  Result<std::unique_ptr<MemoryPool>> made =
      MemoryPool::Create(&device, {.limit_bytes = 0, .alignment_bytes = 16});
  ASSERT_TRUE(made.ok());
  EXPECT_EQ((*made)->alignment_bytes(), 256u);  // the larger of the two
  PoolBlock a = MustAllocate(**made, 1);
  PoolBlock b = MustAllocate(**made, 300);
  PoolBlock c = MustAllocate(**made, 0);
  EXPECT_EQ(a.size_bytes, 256u);
  EXPECT_EQ(b.offset, 256u);
  EXPECT_EQ(b.size_bytes, 512u);
  EXPECT_EQ(c.offset % 256, 0u);
}

TEST(MemoryPoolRegionsTest, ADeviceRefusingARegionIsExhaustionAndChangesNothing) {
  FakeDeviceBackend device(FakeDeviceOptions{.heap_bytes = 1 << 20, .max_allocation_bytes = 4096});
  Result<std::unique_ptr<MemoryPool>> made = MemoryPool::Create(&device);
  ASSERT_TRUE(made.ok());
  device.FailNthAllocation(1);
  Result<PoolBlock> r = (*made)->Allocate(100);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(r.status().message(), "device refused")) << r.status().message();
  EXPECT_TRUE(Contains(r.status().message(), "injected")) << r.status().message();
  MemoryPoolStats s = (*made)->Stats();
  EXPECT_EQ(s.regions, 0u);
  EXPECT_EQ(s.in_use_bytes, 0u);
  EXPECT_EQ(s.num_alloc_failures, 1u);
  EXPECT_TRUE((*made)->Allocate(100).ok());  // the next try gets its region
}

TEST(MemoryPoolRegionsTest, DestroyingThePoolGivesItsRegionsBack) {
  FakeDeviceBackend device(FakeDeviceOptions{.heap_bytes = 1 << 20, .max_allocation_bytes = 4096});
  {
    Result<std::unique_ptr<MemoryPool>> made = MemoryPool::Create(&device);
    ASSERT_TRUE(made.ok());
    MustAllocate(**made, 4000);
    MustAllocate(**made, 4000);
    EXPECT_EQ(device.stats().live_regions, 2u);
  }
  EXPECT_EQ(device.stats().live_regions, 0u);
}

bool IsMapped(const void* p) {
  unsigned char c = 0;
  return ::mincore(const_cast<void*>(p), 1, &c) == 0;  // ENOMEM once unmapped
}

size_t ResidentPages(const void* p, size_t bytes) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> vec((bytes + page - 1) / page);
  EXPECT_EQ(::mincore(const_cast<void*>(p), bytes, vec.data()), 0);
  size_t n = 0;
  for (unsigned char c : vec) n += c & 1;
  return n;
}

// On the cpu device an emptied region is unmapped: its pages leave RSS and
// its address range is gone, while a region still holding a block stays.
TEST(MemoryPoolRegionsTest, CpuRegionIsUnmappedWhenItEmpties) {
  constexpr uint64_t kRegion = 4 << 20;
  Result<std::unique_ptr<CpuDeviceBackend>> device =
      CpuDeviceBackend::Create(4 * kRegion, /*huge_pages=*/true, kRegion);
  ASSERT_TRUE(device.ok());
  Result<std::unique_ptr<MemoryPool>> made = MemoryPool::Create(device->get());
  ASSERT_TRUE(made.ok());
  EXPECT_EQ((*made)->region_bytes(), kRegion);
  PoolBlock keep = MustAllocate(**made, kRegion);
  PoolBlock go = MustAllocate(**made, kRegion);
  ASSERT_NE(keep.region, go.region);
  std::vector<uint8_t> ones(kRegion, 1);
  for (const PoolBlock& b : {keep, go}) {
    ASSERT_TRUE((*device)->CopyToDevice(b.region, b.offset, ones.data(), kRegion).Wait().ok());
  }
  const void* gone = (*device)->HostPointer(go.region, 0);
  const void* kept = (*device)->HostPointer(keep.region, 0);
  ASSERT_NE(gone, nullptr);
  EXPECT_EQ(ResidentPages(gone, kRegion), kRegion / 4096);
  EXPECT_EQ((*device)->allocated_bytes(), 2 * kRegion);
  ASSERT_TRUE((*made)->Free(go).ok());
  EXPECT_FALSE(IsMapped(gone));
  EXPECT_EQ((*device)->HostPointer(go.region, 0), nullptr);
  EXPECT_EQ((*device)->live_regions(), 1u);
  EXPECT_EQ((*device)->allocated_bytes(), kRegion);
  EXPECT_TRUE(IsMapped(kept));
  EXPECT_EQ(static_cast<const uint8_t*>(kept)[kRegion - 1], 1);
  ASSERT_TRUE((*made)->Free(keep).ok());
  EXPECT_FALSE(IsMapped(kept));
  EXPECT_EQ((*device)->live_regions(), 0u);
}

}  // namespace
}  // namespace arbiter
