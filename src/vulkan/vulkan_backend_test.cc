#include "arbiter/vulkan/vulkan_backend.h"

#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "arbiter/memory/memory_pool.h"
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

INSTANTIATE_TEST_SUITE_P(Copies, VulkanBackendTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Staging" : "Mapped"; });

}  // namespace
}  // namespace arbiter::vulkan
