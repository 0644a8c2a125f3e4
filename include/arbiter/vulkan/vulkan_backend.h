// arbiter/vulkan/vulkan_backend.h — a Vulkan device's memory as a
// DeviceBackend (arbiter/memory/device_backend.h): the device arena a
// WeightCache loads a model's weights into, so a `device = "vulkan"`
// model's weights live in VRAM under the device's ledger domain.
//
// Each region is one VkBuffer with its own VkDeviceMemory, device-local and
// not host-visible where the device has such memory, at most the device's
// maxMemoryAllocationSize; FreeRegion calls vkFreeMemory, so VRAM comes back
// to the driver when a model's block goes (as RSS does on the cpu device).
// Copies take one of three paths (CopyPathStats counts them):
//   mapped    a memcpy into the region where it is host-visible (lavapipe)
//             and the options allow it; done when the call returns;
//   imported  the source lies inside a host range registered by ImportHost
//             (a model's host floor): the GPU copies straight from those
//             pages (VK_EXT_external_memory_host), no host memcpy;
//   staged    the host copies into the device's staging halves and the GPU
//             copies on from there (Note [Staged uploads]).
// GPU copies run on the device's copy queue and complete asynchronously:
// the ticket completes when the copy timeline semaphore passes the copy's
// value (Note [Copy queue] in vulkan_device.cc).
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
  // Honour ImportHost (where the device has VK_EXT_external_memory_host);
  // false: ImportHost answers kUnimplemented, so floors are staged.
  bool import_host = true;
};

// How many copies took each path (see the class comment), and their bytes.
struct CopyPathStats {
  uint64_t mapped_copies = 0;
  uint64_t mapped_bytes = 0;
  uint64_t imported_copies = 0;
  uint64_t imported_bytes = 0;
  uint64_t staged_copies = 0;   // to the device and back
  uint64_t staged_bytes = 0;
  uint64_t imports = 0;         // successful ImportHost calls
  uint64_t live_imports = 0;
  uint64_t live_import_bytes = 0;  // host bytes imported now (rounded ranges)
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
  // Imports the pages of [p, p + size_bytes) (rounded outward to the
  // device's minImportedHostPointerAlignment: the whole pages must be
  // mapped, as a host floor's mmap is) for copies to read directly.
  // The handle must be destroyed before the backend.
  // Errors: kUnimplemented where the device lacks VK_EXT_external_memory_host,
  // options.import_host is false, or copies are mapped anyway (unified
  // memory without force_staging); VulkanDevice::ImportHost's.
  Result<std::unique_ptr<HostImport>> ImportHost(const void* p, size_t size_bytes) override
      EXCLUDES(mu_);
  // Null: kernels address regions by device address (Address) instead.
  void* HostPointer(DeviceRegionId region, uint64_t offset) override { return nullptr; }
  // Range-checked; nothing to do (the bytes stay allocated until FreeRegion).
  Status Discard(DeviceRegionId region, uint64_t offset, size_t size_bytes) override
      EXCLUDES(mu_);

  const std::shared_ptr<VulkanDevice>& device() const { return device_; }
  // The device address of byte `offset` of `region` (Note [Buffer device
  // addresses]). Errors: kNotFound, kOutOfRange.
  Result<uint64_t> Address(DeviceRegionId region, uint64_t offset) const EXCLUDES(mu_);
  CopyPathStats copy_stats() const EXCLUDES(mu_);
  // Σ live region bytes, and how many.
  uint64_t allocated_bytes() const EXCLUDES(mu_);
  size_t live_regions() const EXCLUDES(mu_);
  // Tests: the driver report QueryMemory returns from now on (lavapipe has
  // no VK_EXT_memory_budget); nullopt goes back to the driver's.
  void SetMemoryReportForTesting(std::optional<DeviceMemoryReport> report) EXCLUDES(mu_);

 private:
  class Import;
  struct ImportedRange {
    const uint8_t* begin = nullptr;  // host address of buffer byte 0
    VulkanBuffer buffer;
  };
  VulkanDeviceBackend(std::shared_ptr<VulkanDevice> device, DeviceProperties properties,
                      VulkanBackendOptions options)
      : device_(std::move(device)), properties_(std::move(properties)),
        force_staging_(options.force_staging), import_host_(options.import_host) {}
  void EndImport(uint64_t id) EXCLUDES(mu_);
  Result<VulkanBuffer> Locate(DeviceRegionId region, uint64_t offset, uint64_t size) const
      EXCLUDES(mu_);

  const std::shared_ptr<VulkanDevice> device_;
  const DeviceProperties properties_;
  const bool force_staging_;
  const bool import_host_;
  mutable Mutex mu_;
  std::map<uint64_t, ImportedRange> imports_ GUARDED_BY(mu_);  // by import id
  uint64_t next_import_ GUARDED_BY(mu_) = 1;
  CopyPathStats stats_ GUARDED_BY(mu_);
  std::map<DeviceRegionId, VulkanBuffer> regions_ GUARDED_BY(mu_);
  uint64_t allocated_bytes_ GUARDED_BY(mu_) = 0;
  DeviceRegionId next_id_ GUARDED_BY(mu_) = 1;
  std::optional<DeviceMemoryReport> injected_ GUARDED_BY(mu_);
};

}  // namespace arbiter::vulkan
