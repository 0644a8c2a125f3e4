#include "arbiter/vulkan/vulkan_device.h"

#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "vulkan/vulkan_test_util.h"

namespace arbiter::vulkan {
namespace {

TEST(VulkanDeviceNameTest, AcceptsVulkanAndVulkanN) {
  EXPECT_TRUE(IsVulkanDeviceName("vulkan"));
  EXPECT_TRUE(IsVulkanDeviceName("vulkan:0"));
  EXPECT_TRUE(IsVulkanDeviceName("vulkan:12"));
  EXPECT_FALSE(IsVulkanDeviceName("vulkan:"));
  EXPECT_FALSE(IsVulkanDeviceName("vulkan:x"));
  EXPECT_FALSE(IsVulkanDeviceName("cuda:0"));
  EXPECT_FALSE(IsVulkanDeviceName("vulkan:12345"));
}

TEST(VulkanDeviceNameTest, ResolvePrefersAGpuThenTheFirstDevice) {
  std::vector<VulkanDeviceInfo> d(3);
  d[0].index = 0;
  d[0].type = "cpu";
  d[1].index = 1;
  d[1].type = "integrated-gpu";
  d[2].index = 2;
  d[2].type = "discrete-gpu";
  EXPECT_EQ(*ResolveVulkanDevice("vulkan", d), 1);
  EXPECT_EQ(*ResolveVulkanDevice("vulkan:2", d), 2);
  EXPECT_EQ(ResolveVulkanDevice("vulkan:3", d).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(*ResolveVulkanDevice("vulkan", {d[0]}), 0);
  EXPECT_EQ(ResolveVulkanDevice("vulkan", {}).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(ResolveVulkanDevice("gpu", d).status().code(), StatusCode::kInvalidArgument);
}

using VulkanDeviceTest = VulkanTest;

TEST_F(VulkanDeviceTest, ListsUsableDevicesWithTheirProperties) {
  std::vector<VulkanDeviceInfo> devices = *ListVulkanDevices();
  ASSERT_FALSE(devices.empty());
  const VulkanDeviceInfo& d = devices[0];
  EXPECT_EQ(d.index, 0);
  EXPECT_EQ(d.domain(), "vulkan:0");
  EXPECT_FALSE(d.name.empty());
  EXPECT_FALSE(d.driver.empty());
  EXPECT_GT(d.weight_heap_bytes(), 0u);
  EXPECT_GT(d.subgroup_size, 0u);
  EXPECT_GT(d.max_allocation_bytes, 0u);
  EXPECT_TRUE(d.usable) << d.unusable_reason;
}

TEST_F(VulkanDeviceTest, RunsAKernelOnDeviceBuffersAndFreesThem) {
  std::shared_ptr<VulkanDevice> dev = *VulkanDevice::Open("vulkan");
  EXPECT_EQ(dev.get(), VulkanDevice::Open("vulkan:" + std::to_string(dev->info().index))->get());
  const uint64_t before = dev->live_bytes(BufferMemory::kDevice);
  constexpr uint32_t kN = 1000;
  VulkanBuffer x = *dev->CreateBuffer(kN * 4, BufferMemory::kDevice);
  VulkanBuffer out = *dev->CreateBuffer(kN * 4, BufferMemory::kDevice);
  EXPECT_EQ(dev->live_bytes(BufferMemory::kDevice), before + 2 * kN * 4);
  EXPECT_NE(x.address, 0u);
  std::vector<float> in(kN);
  for (uint32_t i = 0; i < kN; ++i) in[i] = 0.5f * static_cast<float>(i % 7);
  // Through a staging buffer, as on a discrete GPU.
  ASSERT_TRUE(dev->Upload(x, 0, in.data(), kN * 4, /*allow_mapped=*/false).ok());
  VkPipeline p = *dev->Pipeline("fill_test");
  struct {
    uint64_t x, out;
    uint32_t n;
    float scale;
  } push{x.address, out.address, kN, 2.0f};
  ASSERT_TRUE(dev->RunOnce([&](VkCommandBuffer cb) {
                   vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, p);
                   vkCmdPushConstants(cb, dev->pipeline_layout(), VK_SHADER_STAGE_COMPUTE_BIT, 0,
                                      sizeof(push), &push);
                   vkCmdDispatch(cb, (kN + 63) / 64, 1, 1);
                 }).ok());
  std::vector<float> got(kN);
  ASSERT_TRUE(dev->Download(out, 0, got.data(), kN * 4, /*allow_mapped=*/false).ok());
  for (uint32_t i = 0; i < kN; ++i) ASSERT_EQ(got[i], 2.0f * i + in[i]) << i;
  dev->Destroy(x);
  dev->Destroy(out);
  EXPECT_EQ(dev->live_bytes(BufferMemory::kDevice), before);
  // Only the device's persistent upload staging stays (two 32 MiB halves,
  // Note [Staged uploads]).
  EXPECT_LE(dev->live_bytes(BufferMemory::kUpload), uint64_t{64} << 20);
  EXPECT_EQ(dev->live_bytes(BufferMemory::kReadback), 0u);
}

TEST_F(VulkanDeviceTest, RefusesBuffersAboveTheLargestAllocation) {
  std::shared_ptr<VulkanDevice> dev = *VulkanDevice::Open("vulkan");
  Result<VulkanBuffer> b = dev->CreateBuffer(dev->info().max_allocation_bytes + 1,
                                             BufferMemory::kDevice);
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(b.status().message().find("maxMemoryAllocationSize"), std::string::npos);
  EXPECT_EQ(dev->CreateBuffer(0, BufferMemory::kDevice).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(VulkanDeviceTest, UnknownShaderIsNotFound) {
  std::shared_ptr<VulkanDevice> dev = *VulkanDevice::Open("vulkan");
  EXPECT_EQ(dev->Pipeline("no_such_kernel").status().code(), StatusCode::kNotFound);
}

TEST_F(VulkanDeviceTest, AMissingDeviceIsNotFoundNamingTheDevices) {
  Result<std::shared_ptr<VulkanDevice>> d = VulkanDevice::Open("vulkan:99");
  EXPECT_EQ(d.status().code(), StatusCode::kNotFound);
  EXPECT_NE(d.status().message().find("vulkan:0"), std::string::npos);
}

}  // namespace
}  // namespace arbiter::vulkan
