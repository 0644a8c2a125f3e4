// vulkan/vulkan_test_util.h — what every Vulkan test shares: the Khronos
// validation layer on (ARBITER_VULKAN_VALIDATION=1 before the instance is
// made) and a check that it reported nothing.
#pragma once

#include <cstdlib>

#include <gtest/gtest.h>

#include "arbiter/vulkan/vulkan_device.h"

namespace arbiter::vulkan {

// Set at static initialization of every test binary that includes this.
inline const bool kValidationRequested = [] {
  ::setenv("ARBITER_VULKAN_VALIDATION", "1", /*overwrite=*/0);
  return true;
}();

// A fixture whose tests fail on any validation message they cause, and skip
// where the machine has no Vulkan device (a build without a driver).
class VulkanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<std::vector<VulkanDeviceInfo>> devices = ListVulkanDevices();
    if (!devices.ok() || devices->empty()) {
      GTEST_SKIP() << "no Vulkan device: "
                   << (devices.ok() ? "none listed" : devices.status().message());
    }
    messages_before_ = ValidationMessageCount();
  }
  void TearDown() override {
    EXPECT_EQ(ValidationMessageCount(), messages_before_) << "validation messages (see the log)";
  }

 private:
  uint64_t messages_before_ = 0;
};

}  // namespace arbiter::vulkan
