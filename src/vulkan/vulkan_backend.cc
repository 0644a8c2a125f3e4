// vulkan/vulkan_backend.cc — VulkanDeviceBackend (arbiter/vulkan/vulkan_backend.h).
#include "arbiter/vulkan/vulkan_backend.h"

#include <fmt/format.h>

namespace arbiter::vulkan {

Result<std::unique_ptr<VulkanDeviceBackend>> VulkanDeviceBackend::Create(
    std::shared_ptr<VulkanDevice> device, VulkanBackendOptions options) {
  const VulkanDeviceInfo& info = device->info();
  DeviceProperties p;
  p.name = info.domain();
  const uint64_t heap = info.weight_heap_bytes();
  p.heap_bytes = options.heap_bytes == 0 ? heap : std::min(options.heap_bytes, heap);
  if (options.max_allocation_bytes > info.max_allocation_bytes) {
    return InvalidArgumentError(fmt::format(
        "{}: max_allocation_bytes {} is above the device's maxMemoryAllocationSize {}", p.name,
        options.max_allocation_bytes, info.max_allocation_bytes));
  }
  p.max_allocation_bytes = std::min(
      options.max_allocation_bytes == 0 ? info.max_allocation_bytes : options.max_allocation_bytes,
      p.heap_bytes);
  p.alignment_bytes = kAlignmentBytes;
  p.host_visible = false;
  p.unified_memory = info.unified_memory;
  return std::unique_ptr<VulkanDeviceBackend>(
      new VulkanDeviceBackend(std::move(device), std::move(p), options));
}

VulkanDeviceBackend::~VulkanDeviceBackend() {
  MutexLock l(&mu_);
  for (auto& [id, b] : regions_) device_->Destroy(b);
  for (auto& [id, r] : imports_) device_->Destroy(r.buffer);  // handles outlived us
}

// The handle ImportHost returns: ends the import when destroyed.
class VulkanDeviceBackend::Import final : public HostImport {
 public:
  Import(VulkanDeviceBackend* backend, uint64_t id) : backend_(backend), id_(id) {}
  ~Import() override { backend_->EndImport(id_); }

 private:
  VulkanDeviceBackend* const backend_;
  const uint64_t id_;
};

Result<std::unique_ptr<HostImport>> VulkanDeviceBackend::ImportHost(const void* p,
                                                                     size_t size_bytes) {
  if (!import_host_) {
    return UnimplementedError(properties_.name + ": host import is off (import_host = false)");
  }
  if (!force_staging_ && device_->info().unified_memory) {
    // Copies into this device's memory are a memcpy (the mapped path),
    // which an import would not shorten.
    return UnimplementedError(properties_.name +
                              ": no host import needed, its memory is the host's");
  }
  const uint8_t* begin = nullptr;
  ARBITER_ASSIGN_OR_RETURN(VulkanBuffer b, device_->ImportHost(p, size_bytes, &begin));
  MutexLock l(&mu_);
  const uint64_t id = next_import_++;
  imports_.emplace(id, ImportedRange{begin, b});
  stats_.imports++;
  stats_.live_imports++;
  stats_.live_import_bytes += b.size_bytes;
  return std::unique_ptr<HostImport>(new Import(this, id));
}

void VulkanDeviceBackend::EndImport(uint64_t id) {
  VulkanBuffer b;
  {
    MutexLock l(&mu_);
    auto it = imports_.find(id);
    if (it == imports_.end()) return;
    b = it->second.buffer;
    imports_.erase(it);
    stats_.live_imports--;
    stats_.live_import_bytes -= b.size_bytes;
  }
  device_->Destroy(b);
}

CopyPathStats VulkanDeviceBackend::copy_stats() const {
  MutexLock l(&mu_);
  return stats_;
}

std::optional<DeviceMemoryReport> VulkanDeviceBackend::QueryMemory() const {
  {
    MutexLock l(&mu_);
    if (injected_) return injected_;
  }
  std::optional<VulkanHeapInfo> h = device_->QueryWeightHeap();
  if (!h) return std::nullopt;
  return DeviceMemoryReport{.usage_bytes = *h->usage_bytes, .budget_bytes = *h->budget_bytes};
}

Result<DeviceRegion> VulkanDeviceBackend::AllocateRegion(uint64_t size_bytes) {
  if (size_bytes == 0 || size_bytes > properties_.max_allocation_bytes) {
    return InvalidArgumentError(fmt::format("{}: a region of {} bytes (the largest is {})",
                                            properties_.name, size_bytes,
                                            properties_.max_allocation_bytes));
  }
  {
    MutexLock l(&mu_);
    if (allocated_bytes_ + size_bytes > properties_.heap_bytes) {
      return ResourceExhaustedError(fmt::format(
          "{}: no room for a region of {} bytes ({} of {} allocated)", properties_.name,
          size_bytes, allocated_bytes_, properties_.heap_bytes));
    }
    allocated_bytes_ += size_bytes;  // reserved while the driver allocates
  }
  Result<VulkanBuffer> b = device_->CreateBuffer(size_bytes, BufferMemory::kDevice);
  MutexLock l(&mu_);
  if (!b.ok()) {
    allocated_bytes_ -= size_bytes;
    return b.status();
  }
  const DeviceRegionId id = next_id_++;
  regions_.emplace(id, *b);
  return DeviceRegion{.id = id, .size_bytes = size_bytes, .host = nullptr};
}

Status VulkanDeviceBackend::FreeRegion(DeviceRegionId region) {
  VulkanBuffer b;
  {
    MutexLock l(&mu_);
    auto it = regions_.find(region);
    if (it == regions_.end()) {
      return NotFoundError(fmt::format("{}: no region {}", properties_.name, region));
    }
    b = it->second;
    allocated_bytes_ -= b.size_bytes;
    regions_.erase(it);
  }
  device_->Destroy(b);
  return OkStatus();
}

Result<VulkanBuffer> VulkanDeviceBackend::Locate(DeviceRegionId region, uint64_t offset,
                                                 uint64_t size) const {
  MutexLock l(&mu_);
  auto it = regions_.find(region);
  if (it == regions_.end()) {
    return NotFoundError(fmt::format("{}: no region {}", properties_.name, region));
  }
  if (offset > it->second.size_bytes || size > it->second.size_bytes - offset) {
    return OutOfRangeError(fmt::format("{}: bytes [{}, +{}) are outside region {} of {} bytes",
                                       properties_.name, offset, size, region,
                                       it->second.size_bytes));
  }
  return it->second;
}

CopyTicket VulkanDeviceBackend::CopyToDevice(DeviceRegionId region, uint64_t offset,
                                             const void* src, size_t size_bytes) {
  Result<VulkanBuffer> b = Locate(region, offset, size_bytes);
  if (!b.ok()) return CopyTicket::Done(b.status());
  auto c = std::make_shared<CopyCompletion>();
  auto done = [c](Status s) { c->Complete(std::move(s)); };
  const bool mapped = !force_staging_ && b->host != nullptr;
  std::optional<ImportedRange> from;
  {
    MutexLock l(&mu_);
    const auto* s = static_cast<const uint8_t*>(src);
    if (!mapped && size_bytes > 0) {
      for (const auto& [id, r] : imports_) {
        if (s >= r.begin && s + size_bytes <= r.begin + r.buffer.size_bytes) {
          from = r;
          break;
        }
      }
    }
    uint64_t& copies = mapped ? stats_.mapped_copies
                              : (from ? stats_.imported_copies : stats_.staged_copies);
    uint64_t& bytes = mapped ? stats_.mapped_bytes
                             : (from ? stats_.imported_bytes : stats_.staged_bytes);
    copies++;
    bytes += size_bytes;
  }
  device_->CountUpload(mapped ? UploadPath::kMapped
                              : (from ? UploadPath::kImported : UploadPath::kStaged),
                       size_bytes);
  if (from) {
    device_->CopyAsync(from->buffer, static_cast<const uint8_t*>(src) - from->begin, *b, offset,
                       size_bytes, done);
  } else {
    device_->UploadAsync(*b, offset, src, size_bytes, !force_staging_, done);
  }
  return CopyTicket(c);
}

CopyTicket VulkanDeviceBackend::CopyFromDevice(DeviceRegionId region, uint64_t offset, void* dst,
                                               size_t size_bytes) {
  Result<VulkanBuffer> b = Locate(region, offset, size_bytes);
  if (!b.ok()) return CopyTicket::Done(b.status());
  const bool mapped = !force_staging_ && b->host != nullptr;
  {
    MutexLock l(&mu_);
    (mapped ? stats_.mapped_copies : stats_.staged_copies)++;
    (mapped ? stats_.mapped_bytes : stats_.staged_bytes) += size_bytes;
  }
  auto c = std::make_shared<CopyCompletion>();
  device_->DownloadAsync(*b, offset, dst, size_bytes, !force_staging_,
                         [c](Status s) { c->Complete(std::move(s)); });
  return CopyTicket(c);
}

Status VulkanDeviceBackend::Discard(DeviceRegionId region, uint64_t offset, size_t size_bytes) {
  return Locate(region, offset, size_bytes).status();
}

Result<uint64_t> VulkanDeviceBackend::Address(DeviceRegionId region, uint64_t offset) const {
  ARBITER_ASSIGN_OR_RETURN(VulkanBuffer b, Locate(region, offset, 0));
  return b.address + offset;
}

uint64_t VulkanDeviceBackend::allocated_bytes() const {
  MutexLock l(&mu_);
  return allocated_bytes_;
}

size_t VulkanDeviceBackend::live_regions() const {
  MutexLock l(&mu_);
  return regions_.size();
}

void VulkanDeviceBackend::SetMemoryReportForTesting(std::optional<DeviceMemoryReport> report) {
  MutexLock l(&mu_);
  injected_ = report;
}

}  // namespace arbiter::vulkan
