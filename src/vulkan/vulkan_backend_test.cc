#include "arbiter/vulkan/vulkan_backend.h"

#include <sys/mman.h>

#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "arbiter/memory/memory_pool.h"
#include "arbiter/weights/weight_cache.h"
#include "vulkan/vulkan_test_util.h"

namespace arbiter::vulkan {
namespace {

class VulkanBackendTest : public VulkanTest,
                          public ::testing::WithParamInterface<bool> {
 protected:
  std::unique_ptr<VulkanDeviceBackend> Make(uint64_t heap) {
    return *VulkanDeviceBackend::Create(*VulkanDevice::Open("vulkan"),
                                        {.heap_bytes = heap, .force_staging = GetParam()});
  }
};

TEST_P(VulkanBackendTest, CopiesRoundTripAndRegionsGoBackToTheDriver) {
  std::unique_ptr<VulkanDeviceBackend> b = Make(64 << 20);
  std::shared_ptr<VulkanDevice> dev = b->device();
  const uint64_t before = dev->live_bytes(BufferMemory::kDevice);
  EXPECT_EQ(b->properties().name, dev->domain());
  EXPECT_EQ(b->properties().heap_bytes, 64u << 20);
  EXPECT_EQ(b->properties().alignment_bytes, VulkanDeviceBackend::kAlignmentBytes);
  DeviceRegion r = *b->AllocateRegion(3 << 20);
  EXPECT_EQ(b->allocated_bytes(), 3u << 20);
  EXPECT_EQ(dev->live_bytes(BufferMemory::kDevice), before + (3 << 20));
  std::vector<uint8_t> in(1 << 20);
  std::iota(in.begin(), in.end(), 0);
  ASSERT_TRUE(b->CopyToDevice(r.id, 4096, in.data(), in.size()).Wait().ok());
  std::vector<uint8_t> out(in.size());
  ASSERT_TRUE(b->CopyFromDevice(r.id, 4096, out.data(), out.size()).Wait().ok());
  EXPECT_EQ(in, out);
  EXPECT_NE(*b->Address(r.id, 0), 0u);
  EXPECT_EQ(*b->Address(r.id, 100), *b->Address(r.id, 0) + 100);
  // Out of range and unknown regions fail at Wait, nothing copied.
  EXPECT_EQ(b->CopyToDevice(r.id, (3 << 20) - 10, in.data(), 11).Wait().code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(b->CopyToDevice(r.id + 100, 0, in.data(), 1).Wait().code(), StatusCode::kNotFound);
  ASSERT_TRUE(b->FreeRegion(r.id).ok());
  EXPECT_EQ(b->FreeRegion(r.id).code(), StatusCode::kNotFound);
  EXPECT_EQ(b->allocated_bytes(), 0u);
  EXPECT_EQ(dev->live_bytes(BufferMemory::kDevice), before);
}

TEST_P(VulkanBackendTest, RefusesRegionsPastItsHeap) {
  std::unique_ptr<VulkanDeviceBackend> b = Make(8 << 20);
  DeviceRegion r = *b->AllocateRegion(6 << 20);
  EXPECT_EQ(b->AllocateRegion(3 << 20).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(b->AllocateRegion(9 << 20).status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(b->FreeRegion(r.id).ok());
  EXPECT_TRUE(b->AllocateRegion(8 << 20).ok());
}

TEST_P(VulkanBackendTest, APoolOfSeveralRegionsFreesThemWhenEmpty) {
  std::unique_ptr<VulkanDeviceBackend> b = Make(32 << 20);
  for (int cycle = 0; cycle < 100; ++cycle) {
    DeviceRegion r = *b->AllocateRegion(1 << 20);
    std::vector<uint8_t> in(4096, static_cast<uint8_t>(cycle));
    ASSERT_TRUE(b->CopyToDevice(r.id, 0, in.data(), in.size()).Wait().ok());
    ASSERT_TRUE(b->FreeRegion(r.id).ok());
  }
  EXPECT_EQ(b->live_regions(), 0u);
  EXPECT_EQ(b->allocated_bytes(), 0u);
}

TEST_P(VulkanBackendTest, ReportsTheInjectedBudget) {
  std::unique_ptr<VulkanDeviceBackend> b = Make(8 << 20);
  b->SetMemoryReportForTesting(DeviceMemoryReport{.usage_bytes = 5, .budget_bytes = 9});
  EXPECT_EQ(b->QueryMemory()->usage_bytes, 5u);
  EXPECT_EQ(b->QueryMemory()->budget_bytes, 9u);
  b->SetMemoryReportForTesting(std::nullopt);
  EXPECT_EQ(b->QueryMemory().has_value(), b->device()->info().memory_budget);
}

TEST_P(VulkanBackendTest, AsyncCopiesCompleteAndCarryTheirErrorsAtWait) {
  std::unique_ptr<VulkanDeviceBackend> b = Make(64 << 20);
  DeviceRegion r = *b->AllocateRegion(8 << 20);
  // Larger than one staging half: several chunks, the last one in flight.
  std::vector<uint8_t> in((40 << 20) + 3);
  std::mt19937 rng(7);
  for (auto& x : in) x = static_cast<uint8_t>(rng());
  DeviceRegion big = *b->AllocateRegion(48 << 20);
  CopyTicket up = b->CopyToDevice(big.id, 256, in.data(), in.size());
  ASSERT_TRUE(up.Wait().ok());
  EXPECT_TRUE(up.ready());
  std::vector<uint8_t> out(in.size());
  ASSERT_TRUE(b->CopyFromDevice(big.id, 256, out.data(), out.size()).Wait().ok());
  EXPECT_EQ(in, out);
  EXPECT_EQ(b->CopyFromDevice(r.id, 8 << 20, out.data(), 1).Wait().code(),
            StatusCode::kOutOfRange);
  EXPECT_TRUE(up.Wait().ok());  // again: same result
  const CopyPathStats st = b->copy_stats();
  if (GetParam()) {
    EXPECT_EQ(st.mapped_copies, 0u);
    EXPECT_GE(st.staged_bytes, 2 * in.size());
  }
  ASSERT_TRUE(b->FreeRegion(r.id).ok());
  ASSERT_TRUE(b->FreeRegion(big.id).ok());
}

TEST_P(VulkanBackendTest, ManyConcurrentCopiesToDisjointRanges) {
  std::unique_ptr<VulkanDeviceBackend> b = Make(64 << 20);
  DeviceRegion r = *b->AllocateRegion(16 << 20);
  constexpr int kThreads = 4, kPerThread = 16;
  constexpr size_t kBytes = 40000;  // not a multiple of anything
  std::vector<std::vector<uint8_t>> in(kThreads * kPerThread);
  for (size_t i = 0; i < in.size(); ++i) in[i].assign(kBytes, static_cast<uint8_t>(i * 7 + 1));
  std::vector<std::thread> threads;
  std::vector<Status> results(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<CopyTicket> tickets;
      for (int k = 0; k < kPerThread; ++k) {
        const size_t i = static_cast<size_t>(t * kPerThread + k);
        tickets.push_back(b->CopyToDevice(r.id, i * 65536 + 3, in[i].data(), kBytes));
      }
      results[static_cast<size_t>(t)] = WaitAll(tickets);
    });
  }
  for (std::thread& t : threads) t.join();
  for (const Status& s : results) EXPECT_TRUE(s.ok()) << s.message();
  std::vector<std::vector<uint8_t>> out(in.size(), std::vector<uint8_t>(kBytes));
  std::vector<CopyTicket> back;
  for (size_t i = 0; i < in.size(); ++i) {
    back.push_back(b->CopyFromDevice(r.id, i * 65536 + 3, out[i].data(), kBytes));
  }
  ASSERT_TRUE(WaitAll(back).ok());
  for (size_t i = 0; i < in.size(); ++i) EXPECT_EQ(in[i], out[i]) << i;
  ASSERT_TRUE(b->FreeRegion(r.id).ok());
}

INSTANTIATE_TEST_SUITE_P(Copies, VulkanBackendTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Staging" : "Mapped"; });

// A host floor's worth of pages: an anonymous mapping, as the weight store's.
class Pages {
 public:
  explicit Pages(size_t n) : n_(n) {
    p_ = static_cast<uint8_t*>(
        ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  }
  ~Pages() { ::munmap(p_, n_); }
  uint8_t* data() const { return p_; }

 private:
  size_t n_;
  uint8_t* p_;
};

class VulkanImportTest : public VulkanTest {
 protected:
  std::unique_ptr<VulkanDeviceBackend> Make(bool import_host = true) {
    // force_staging: the region is treated as not host-visible (a discrete
    // GPU's VRAM), so a copy is imported or staged, never a memcpy.
    return *VulkanDeviceBackend::Create(
        *VulkanDevice::Open("vulkan"),
        {.heap_bytes = 64 << 20, .force_staging = true, .import_host = import_host});
  }
};

TEST_F(VulkanImportTest, CopiesFromAnImportedFloorAreExactAndTakeTheImportPath) {
  std::unique_ptr<VulkanDeviceBackend> b = Make();
  if (!b->device()->info().external_memory_host) GTEST_SKIP() << "no VK_EXT_external_memory_host";
  constexpr size_t kFloor = (3 << 20) + 8192;
  Pages floor(kFloor);
  std::mt19937 rng(3);
  for (size_t i = 0; i < kFloor; ++i) floor.data()[i] = static_cast<uint8_t>(rng());
  // The floor's arrays start inside the mapping, not on a page boundary.
  const uint8_t* arrays = floor.data() + 100;
  const size_t arrays_bytes = kFloor - 300;
  Result<std::unique_ptr<HostImport>> imp = b->ImportHost(arrays, arrays_bytes);
  ASSERT_TRUE(imp.ok()) << imp.status().message();
  EXPECT_EQ(b->copy_stats().live_imports, 1u);
  EXPECT_EQ(b->device()->live_bytes(BufferMemory::kImported), kFloor);
  DeviceRegion r = *b->AllocateRegion(8 << 20);
  struct Piece {
    size_t src, dst, n;
  };
  const std::vector<Piece> pieces = {
      {0, 0, 1}, {1, 256, 4095}, {777, 8192, 12345}, {5000, 1 << 20, (2 << 20) + 17},
      {arrays_bytes - 999, 4 << 20, 999}};
  std::vector<CopyTicket> tickets;
  for (const Piece& p : pieces) {
    tickets.push_back(b->CopyToDevice(r.id, p.dst, arrays + p.src, p.n));
  }
  ASSERT_TRUE(WaitAll(tickets).ok());
  EXPECT_EQ(b->copy_stats().imported_copies, pieces.size());
  EXPECT_EQ(b->copy_stats().staged_copies, 0u);
  for (const Piece& p : pieces) {
    std::vector<uint8_t> out(p.n);
    ASSERT_TRUE(b->CopyFromDevice(r.id, p.dst, out.data(), p.n).Wait().ok());
    EXPECT_TRUE(std::equal(out.begin(), out.end(), arrays + p.src)) << p.src;
  }
  // A source outside the import is staged.
  std::vector<uint8_t> other(1000, 9);
  ASSERT_TRUE(b->CopyToDevice(r.id, 0, other.data(), other.size()).Wait().ok());
  EXPECT_EQ(b->copy_stats().imported_copies, pieces.size());
  // The import ends before its floor goes (the copies were waited for).
  imp->reset();
  EXPECT_EQ(b->copy_stats().live_imports, 0u);
  EXPECT_EQ(b->device()->live_bytes(BufferMemory::kImported), 0u);
  ASSERT_TRUE(b->FreeRegion(r.id).ok());
}

TEST_F(VulkanImportTest, TurnedOffItIsRefusedAndCopiesAreStaged) {
  std::unique_ptr<VulkanDeviceBackend> b = Make(/*import_host=*/false);
  Pages floor(1 << 20);
  std::memset(floor.data(), 5, 1 << 20);
  EXPECT_EQ(b->ImportHost(floor.data(), 1 << 20).status().code(), StatusCode::kUnimplemented);
  DeviceRegion r = *b->AllocateRegion(1 << 20);
  ASSERT_TRUE(b->CopyToDevice(r.id, 0, floor.data(), 1 << 20).Wait().ok());
  EXPECT_EQ(b->copy_stats().staged_copies, 1u);
  EXPECT_EQ(b->copy_stats().imported_copies, 0u);
  ASSERT_TRUE(b->FreeRegion(r.id).ok());
}

// A pinned_system model woken from its host floor (Note [Imported floors]
// in weight_cache.cc): the floor is imported once, each wake copies from
// its pages on the GPU, the device holds exactly the floor's bytes, and the
// import ends with the floor.
TEST_F(VulkanImportTest, AWakeFromAHostFloorCopiesFromTheImportedPages) {
  std::unique_ptr<VulkanDeviceBackend> b = Make();
  if (!b->device()->info().external_memory_host) GTEST_SKIP() << "no VK_EXT_external_memory_host";
  WeightCacheOptions o;
  o.device = b.get();  // no ledger: nothing charged
  o.wiggle = 0;
  Result<std::unique_ptr<WeightCache>> cache = WeightCache::Create(std::move(o));
  ASSERT_TRUE(cache.ok()) << cache.status().ToString();
  // Odd tensor sizes: offsets inside the floor that are not page-aligned.
  const std::vector<int64_t> sizes = {1000, 77777, 3, 250001};
  WeightModel m;
  m.key = "m";
  for (size_t i = 0; i < sizes.size(); ++i) {
    m.specs.push_back(WeightSpec{"t" + std::to_string(i), DType::kF32, {sizes[i]}});
  }
  m.digest = 9;
  m.residency = ResidencyState::kPinnedSystem;
  auto value = [](size_t i, int64_t j) { return static_cast<float>(i * 1000003 + j); };
  m.fill = [&](const std::vector<void*>& arrays) -> Status {
    for (size_t i = 0; i < arrays.size(); ++i) {
      for (int64_t j = 0; j < sizes[i]; ++j) static_cast<float*>(arrays[i])[j] = value(i, j);
    }
    return OkStatus();
  };
  ASSERT_TRUE((*cache)->Register(std::move(m)).ok());
  for (int wake = 0; wake < 3; ++wake) {
    const CopyPathStats before = b->copy_stats();
    {
      Result<WeightLease> l = (*cache)->Acquire("m");
      ASSERT_TRUE(l.ok()) << l.status().ToString();
      for (size_t i = 0; i < sizes.size(); ++i) {
        std::vector<float> out(static_cast<size_t>(sizes[i]));
        ASSERT_TRUE(b->CopyFromDevice(l->region(), l->device_offset(i), out.data(),
                                      out.size() * sizeof(float))
                        .Wait()
                        .ok());
        for (int64_t j = 0; j < sizes[i]; j += 997) ASSERT_EQ(out[static_cast<size_t>(j)], value(i, j));
        ASSERT_EQ(out.back(), value(i, sizes[i] - 1));
      }
    }
    const CopyPathStats after = b->copy_stats();
    EXPECT_EQ(after.imported_copies - before.imported_copies, sizes.size()) << "wake " << wake;
    EXPECT_EQ(after.imports, 1u);  // once per floor
    EXPECT_EQ(after.live_imports, 1u);
    ASSERT_TRUE(*(*cache)->Evict("m"));
  }
  // Dropping the floor ends its import.
  ASSERT_TRUE((*cache)->ReleaseAll("m").ok());
  EXPECT_EQ(b->copy_stats().live_imports, 0u);
  EXPECT_EQ(b->device()->live_bytes(BufferMemory::kImported), 0u);
}

}  // namespace
}  // namespace arbiter::vulkan
