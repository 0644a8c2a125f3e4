// arbiter/vulkan/vulkan_backend.h — a Vulkan device's memory as a
// DeviceBackend (arbiter/memory/device_backend.h): the device arena a
// WeightCache loads a model's weights into, so a `device = "vulkan"`
// model's weights live in VRAM under the device's ledger domain.
//
// Each region is one VkBuffer with its own VkDeviceMemory, device-local and
// not host-visible where the device has such memory, at most the device's
// maxMemoryAllocationSize; FreeRegion calls vkFreeMemory, so VRAM comes back
// to the driver when a model's block goes (as RSS does on the cpu device).
// Copies go through host-visible staging buffers (or straight into mapped
// memory where the region is host-visible and the options allow it) and
// complete before the call returns: every ticket is a completed one (Note
// [Device copies] allows that).
//
// Thread safety: as DeviceBackend (all methods thread-safe).
#pragma once

#include <map>
#include <memory>
#include <optional>

#include "arbiter/base/mutex.h"
#include "arbiter/memory/device_backend.h"
#include "arbiter/vulkan/vulkan_device.h"

namespace arbiter::vulkan {

struct VulkanBackendOptions {
  // Bytes arbiter may hold on the device (DeviceProperties::heap_bytes);
  // 0 = the weight heap's size. Clamped to the heap.
  uint64_t heap_bytes = 0;
  // Largest region; 0 = the device's maxMemoryAllocationSize (and the heap).
  uint64_t max_allocation_bytes = 0;
  // Never copy through a mapped pointer, even where the region is
  // host-visible (lavapipe): tests the staging path a discrete GPU takes.
  bool force_staging = false;
};

class VulkanDeviceBackend final : public DeviceBackend {
 public:
  // Block alignment: buffer device addresses of every tensor aligned for
  // the widest load a kernel makes (and nonCoherentAtomSize).
  static constexpr uint64_t kAlignmentBytes = 256;

  // Errors: kInvalidArgument for max_allocation_bytes above the device's.
  static Result<std::unique_ptr<VulkanDeviceBackend>> Create(std::shared_ptr<VulkanDevice> device,
                                                             VulkanBackendOptions options = {});
  ~VulkanDeviceBackend() override;

  const DeviceProperties& properties() const override { return properties_; }
  // The driver's usage/budget of the weight heap (VK_EXT_memory_budget), or
  // the injected report (SetMemoryReportForTesting).
  std::optional<DeviceMemoryReport> QueryMemory() const override EXCLUDES(mu_);
  Result<DeviceRegion> AllocateRegion(uint64_t size_bytes) override EXCLUDES(mu_);
  Status FreeRegion(DeviceRegionId region) override EXCLUDES(mu_);
  CopyTicket CopyToDevice(DeviceRegionId region, uint64_t offset, const void* src,
                          size_t size_bytes) override EXCLUDES(mu_);
  CopyTicket CopyFromDevice(DeviceRegionId region, uint64_t offset, void* dst,
                            size_t size_bytes) override EXCLUDES(mu_);
  // Null: kernels address regions by device address (Address) instead.
  void* HostPointer(DeviceRegionId region, uint64_t offset) override { return nullptr; }
  // Range-checked; nothing to do (the bytes stay allocated until FreeRegion).
  Status Discard(DeviceRegionId region, uint64_t offset, size_t size_bytes) override
      EXCLUDES(mu_);

  const std::shared_ptr<VulkanDevice>& device() const { return device_; }
  // The device address of byte `offset` of `region` (Note [Buffer device
  // addresses]). Errors: kNotFound, kOutOfRange.
  Result<uint64_t> Address(DeviceRegionId region, uint64_t offset) const EXCLUDES(mu_);
  // Σ live region bytes, and how many.
  uint64_t allocated_bytes() const EXCLUDES(mu_);
  size_t live_regions() const EXCLUDES(mu_);
  // Tests: the driver report QueryMemory returns from now on (lavapipe has
  // no VK_EXT_memory_budget); nullopt goes back to the driver's.
  void SetMemoryReportForTesting(std::optional<DeviceMemoryReport> report) EXCLUDES(mu_);

 private:
  VulkanDeviceBackend(std::shared_ptr<VulkanDevice> device, DeviceProperties properties,
                      bool force_staging)
      : device_(std::move(device)), properties_(std::move(properties)),
        force_staging_(force_staging) {}
  Result<VulkanBuffer> Locate(DeviceRegionId region, uint64_t offset, uint64_t size) const
      EXCLUDES(mu_);

  const std::shared_ptr<VulkanDevice> device_;
  const DeviceProperties properties_;
  const bool force_staging_;
  mutable Mutex mu_;
  std::map<DeviceRegionId, VulkanBuffer> regions_ GUARDED_BY(mu_);
  uint64_t allocated_bytes_ GUARDED_BY(mu_) = 0;
  DeviceRegionId next_id_ GUARDED_BY(mu_) = 1;
  std::optional<DeviceMemoryReport> injected_ GUARDED_BY(mu_);
};

}  // namespace arbiter::vulkan
