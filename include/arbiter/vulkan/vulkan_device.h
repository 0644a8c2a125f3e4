// arbiter/vulkan/vulkan_device.h — the Vulkan compute devices: discovery
// (`arbiter devices`), one opened device shared by everything that uses it
// (its memory backend, the engine's forward pass), buffers, pipelines and
// submission (docs/architecture.md "Devices"; the weight-runtime seed's
// device tier).
//
// Names: "vulkan:N" is the N-th physical device as the loader enumerates
// it; "vulkan" is the first GPU-type device (discrete, integrated, virtual)
// or, where there is none (a machine with only lavapipe), the first device.
// The ledger domain of a device is its "vulkan:N" name.
//
// The loader is opened at run time (volk): on a machine without
// libvulkan.so.1 or without a device, ListVulkanDevices and Open return
// kUnavailable naming what is missing, and nothing else changes.
//
// Note [Buffer device addresses]
// Kernels reach memory through buffer device addresses
// (VK_KHR_buffer_device_address, core in Vulkan 1.2) passed as push
// constants: no descriptor sets, one pipeline layout for every kernel, and a
// tensor is addressed wherever it lies in a region — there is no binding
// range, so maxStorageBufferRange (128 MiB on lavapipe) limits nothing and
// no tensor needs splitting. A device without bufferDeviceAddress or
// shaderInt64 is listed but not usable (VulkanDeviceInfo::usable).
//
// Validation: with ARBITER_VULKAN_VALIDATION=1 in the environment when the
// instance is made (the first call of this file's functions), the Khronos
// validation layer is on and every message it reports is logged and
// counted (ValidationMessageCount); the tests fail on any.
//
// Thread safety: the free functions and VulkanDevice are thread-safe
// (queue submission and the shared command pool are serialized inside);
// a command buffer a caller allocates from its own pool is the caller's.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <volk.h>

#include "arbiter/base/mutex.h"
#include "arbiter/base/status.h"

namespace arbiter::vulkan {

// One memory heap of a device, bytes.
struct VulkanHeapInfo {
  uint64_t size_bytes = 0;
  bool device_local = false;
  // VK_EXT_memory_budget's heapBudget / heapUsage (the usage of every
  // process on the device) where the driver has the extension.
  std::optional<uint64_t> budget_bytes;
  std::optional<uint64_t> usage_bytes;
};

// What `arbiter devices` reports of one physical device.
struct VulkanDeviceInfo {
  int index = 0;               // N of "vulkan:N"
  std::string name;            // deviceName
  std::string type;            // "discrete-gpu" | "integrated-gpu" | "virtual-gpu" | "cpu" | "other"
  std::string driver;          // driverName (VkPhysicalDeviceDriverProperties)
  std::string driver_info;     // driverInfo
  std::string api_version;     // "1.3.230"
  uint32_t vendor_id = 0;
  uint32_t device_id = 0;
  std::vector<VulkanHeapInfo> heaps;
  int weight_heap = 0;         // the heap weights and KV are allocated from (largest device-local)
  bool memory_budget = false;  // VK_EXT_memory_budget
  bool external_memory_host = false;  // VK_EXT_external_memory_host
  // Memory of weight_heap is host-visible (the device reads host RAM:
  // lavapipe, integrated GPUs, phones) — its domain lies inside the host's.
  bool unified_memory = false;
  bool fp16 = false;               // shaderFloat16
  bool storage16 = false;          // storageBuffer16BitAccess
  bool int64 = false;              // shaderInt64
  bool buffer_device_address = false;
  bool cooperative_matrix_nv = false;  // VK_NV_cooperative_matrix
  // Its cooperativeMatrix feature, for compute shaders.
  bool cooperative_matrix_feature = false;
  // The multiply shape the cooperative-matrix GEMM would use, among those the
  // device lists (f16 × f16 + f32, subgroup scope): "16x16x16" | "16x8x16";
  // empty when it lists neither.
  std::string cooperative_matrix_shape;
  bool vulkan_memory_model = false;  // vulkanMemoryModel
  // The cooperative-matrix GEMM may run here (Note [Cooperative-matrix GEMM]
  // in arbiter/vulkan/coopmat_gemm.h): it is then enabled at device open and
  // self-checked; cooperative_matrix_gemm_reason says why not otherwise.
  bool cooperative_matrix_gemm_possible = false;
  std::string cooperative_matrix_gemm_reason;
  uint32_t subgroup_size = 0;
  uint64_t max_allocation_bytes = 0;       // maxMemoryAllocationSize
  uint64_t max_storage_buffer_range = 0;   // maxStorageBufferRange (unused: Note [Buffer device addresses])
  uint32_t max_shared_memory_bytes = 0;    // maxComputeSharedMemorySize
  bool transfer_queue = false;     // a queue family with transfer but no compute/graphics
  bool usable = false;             // arbiter can compute on it
  std::string unusable_reason;     // why not, when !usable

  // "vulkan:<index>".
  std::string domain() const { return "vulkan:" + std::to_string(index); }
  uint64_t weight_heap_bytes() const {
    return heaps.empty() ? 0 : heaps[static_cast<size_t>(weight_heap)].size_bytes;
  }
};

// Whether `name` is "vulkan" or "vulkan:<digits>".
bool IsVulkanDeviceName(std::string_view name);

// Every physical device the loader finds, in its order, with fresh budget
// figures. Errors: kUnavailable when the loader cannot be opened or the
// instance cannot be made (the message names the library and the fix).
Result<std::vector<VulkanDeviceInfo>> ListVulkanDevices();

// The index `name` ("vulkan", "vulkan:N") names among `devices`.
// Errors: kInvalidArgument for another name; kNotFound when there is no
// such device (the message lists the devices and says how to see them).
Result<int> ResolveVulkanDevice(std::string_view name, const std::vector<VulkanDeviceInfo>& devices);

// Validation-layer messages reported since the process started (0 when
// validation is off).
uint64_t ValidationMessageCount();

// Where a buffer's memory lives.
enum class BufferMemory {
  kDevice,    // device-local (not host-visible where the device has such memory)
  kUpload,    // host-visible, coherent: the host writes, the device reads
  kReadback,  // host-visible, cached where possible: the device writes, the host reads
  kImported,  // host pages imported with VK_EXT_external_memory_host (ImportHost)
};

// How bytes reached a device buffer from the host (VulkanDeviceBackend's
// class comment): a memcpy into mapped memory, a GPU copy out of imported
// host pages, or a memcpy into staging and a GPU copy from there.
enum class UploadPath { kMapped = 0, kImported = 1, kStaged = 2 };
// "mapped" | "import" | "staging".
std::string_view UploadPathName(UploadPath path);

// One VkBuffer with its own VkDeviceMemory. Move-only; destroyed by
// VulkanDevice::Destroy (not by its destructor: it does not know its device).
struct VulkanBuffer {
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  uint64_t size_bytes = 0;
  uint64_t address = 0;   // its device address (Note [Buffer device addresses])
  void* host = nullptr;   // mapped pointer when host-visible
  BufferMemory kind = BufferMemory::kDevice;
};

// The push constants every kernel may use, bytes (Vulkan guarantees 128).
inline constexpr uint32_t kPushConstantBytes = 128;

// An opened device (Open). Shared: the memory backend and every model's
// forward pass on it hold the same one; it is closed when the last holder
// lets go.
class VulkanDevice {
 public:
  // The device `name` names ("vulkan", "vulkan:N"), opened once per process
  // and shared. Errors: ListVulkanDevices's and ResolveVulkanDevice's;
  // kFailedPrecondition when the device is not usable (names why);
  // kUnavailable when it cannot be opened.
  static Result<std::shared_ptr<VulkanDevice>> Open(std::string_view name);
  ~VulkanDevice();
  VulkanDevice(const VulkanDevice&) = delete;
  VulkanDevice& operator=(const VulkanDevice&) = delete;

  const VulkanDeviceInfo& info() const { return info_; }
  // The ledger domain, "vulkan:N".
  std::string domain() const { return info_.domain(); }
  VkDevice device() const { return device_; }
  VkPipelineLayout pipeline_layout() const { return layout_; }
  uint32_t queue_family() const { return queue_family_; }
  // The queue family copies are submitted to (Note [Copy queue]): a
  // transfer-only family where the device has one, else queue_family().
  uint32_t copy_queue_family() const { return copy_family_; }
  // Whether copies run on a queue of their own (a transfer-only family).
  bool separate_copy_queue() const { return copy_queue_ != queue_; }
  // Timestamp queries on the compute queue: the bits a timestamp holds (0:
  // the queue has no timestamps) and the nanoseconds per tick.
  uint32_t timestamp_valid_bits() const { return timestamp_valid_bits_; }
  float timestamp_period_ns() const { return timestamp_period_ns_; }

  // The driver's current usage and budget of the weight heap
  // (VK_EXT_memory_budget); nullopt without the extension.
  std::optional<VulkanHeapInfo> QueryWeightHeap() const;

  // --- memory
  // A buffer of `size_bytes` (> 0) in `memory`, usable as a storage buffer
  // with a device address and as a transfer source and destination.
  // Errors: kResourceExhausted when the device has no memory for it (names
  // the size and the domain); kInvalidArgument above max_allocation_bytes.
  Result<VulkanBuffer> CreateBuffer(uint64_t size_bytes, BufferMemory memory);
  // Gives the buffer's memory back to the driver (vkFreeMemory). Idempotent
  // on a default buffer.
  void Destroy(VulkanBuffer& buffer);
  // Bytes of live buffers made by CreateBuffer of kind `memory`.
  uint64_t live_bytes(BufferMemory memory) const;

  // --- kernels
  // The compute pipeline of the embedded shader `name` (shaders.h), made at
  // first use and kept. Errors: kNotFound for an unknown shader;
  // kInternal when the driver fails to make it.
  Result<VkPipeline> Pipeline(std::string_view name);

  // --- submission
  // Submits `cb` (recorded, ended) to the compute queue and waits for it.
  // Errors: kUnavailable when the device is lost or the submission fails.
  Status SubmitAndWait(VkCommandBuffer cb);
  // Records a one-shot command buffer with `record`, submits it and waits.
  Status RunOnce(const std::function<void(VkCommandBuffer)>& record);
  // A command pool for one thread's command buffers (resettable buffers).
  Result<VkCommandPool> CreateCommandPool();
  void DestroyCommandPool(VkCommandPool pool);

  // --- copies (Note [Copy queue], Note [Staged uploads] in vulkan_device.cc)
  // Runs once when a copy finished, with its result: on the device's
  // completion thread, or on the calling thread before the call returns
  // (a mapped copy, an error found before submission). Must not block on
  // other copies.
  using CopyDone = std::function<void(Status)>;
  // Copies `size_bytes` from host `src` to [offset, offset + size_bytes) of
  // `dst`: a memcpy where `dst` is host-visible and `allow_mapped`, else
  // through the staging halves (the host's memcpy into staging happens
  // before the call returns; the GPU's copy of the last chunk may not).
  // `src` must stay valid until `done` ran. Errors (to `done`):
  // kOutOfRange for a range outside `dst`; kUnavailable on device failure.
  void UploadAsync(const VulkanBuffer& dst, uint64_t offset, const void* src,
                   uint64_t size_bytes, bool allow_mapped, CopyDone done);
  // Copies [offset, offset + size_bytes) of `src` to host `dst` (through a
  // readback buffer unless mapped; the memcpy out of it runs on the
  // completion thread). Errors as UploadAsync.
  void DownloadAsync(const VulkanBuffer& src, uint64_t offset, void* dst, uint64_t size_bytes,
                     bool allow_mapped, CopyDone done);
  // A GPU copy buffer → buffer on the copy queue. REQUIRES: both ranges
  // inside their buffers. Errors (to `done`): kUnavailable.
  void CopyAsync(const VulkanBuffer& src, uint64_t src_offset, const VulkanBuffer& dst,
                 uint64_t dst_offset, uint64_t size_bytes, CopyDone done);
  // Bytes uploaded to the device by `path` since it was opened, by every
  // backend on it (VulkanDeviceBackend counts them): `bench vram` reports
  // which path a wake took.
  uint64_t upload_bytes(UploadPath path) const {
    return upload_bytes_[static_cast<int>(path)].load();
  }
  void CountUpload(UploadPath path, uint64_t bytes) {
    upload_bytes_[static_cast<int>(path)] += bytes;
  }
  // The synchronous forms: the copy is done when they return.
  Status Upload(const VulkanBuffer& dst, uint64_t offset, const void* src, uint64_t size_bytes,
                bool allow_mapped = true);
  Status Download(const VulkanBuffer& src, uint64_t offset, void* dst, uint64_t size_bytes,
                  bool allow_mapped = true);

  // Imports the host pages holding [p, p + size_bytes), rounded outward to
  // minImportedHostPointerAlignment, as a transfer-source buffer
  // (VK_EXT_external_memory_host). *base is the host address of the
  // buffer's byte 0. The pages must stay mapped until Destroy(buffer).
  // Errors: kUnimplemented without the extension; kInvalidArgument for size
  // 0 or a rounded range above maxMemoryAllocationSize; kUnavailable when
  // the driver refuses the pages.
  Result<VulkanBuffer> ImportHost(const void* p, uint64_t size_bytes, const uint8_t** base);

 private:
  VulkanDevice() = default;
  Status Init(const VulkanDeviceInfo& info, VkPhysicalDevice physical);
  Result<uint32_t> MemoryTypeFor(uint32_t type_bits, BufferMemory memory) const;

  VulkanDeviceInfo info_;
  VkPhysicalDevice physical_ = VK_NULL_HANDLE;
  VkDevice device_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  uint32_t queue_family_ = 0;
  uint32_t timestamp_valid_bits_ = 0;
  float timestamp_period_ns_ = 0;
  VkPipelineLayout layout_ = VK_NULL_HANDLE;
  VkPhysicalDeviceMemoryProperties memory_{};

  mutable Mutex queue_mu_;  // vkQueueSubmit and the one-shot pool
  VkCommandPool oneshot_pool_ GUARDED_BY(queue_mu_) = VK_NULL_HANDLE;
  VkFence fence_ GUARDED_BY(queue_mu_) = VK_NULL_HANDLE;

  // Note [Staged uploads] (vulkan_device.cc).
  struct UploadRing {
    VulkanBuffer staging[2];
    uint64_t value[2] = {0, 0};  // the copy timeline value its last copy signals
    int next = 0;
  };
  Status EnsureUploadRingLocked() REQUIRES(upload_mu_);
  Mutex upload_mu_;  // taken before queue_mu_
  UploadRing ring_ GUARDED_BY(upload_mu_);

  // Note [Copy queue].
  struct PendingCopy {
    uint64_t value = 0;  // the timeline value its submission signals
    VkCommandBuffer cb = VK_NULL_HANDLE;
    CopyDone done;       // may be empty
  };
  // Records `record` into a command buffer of the copy pool, submits it to
  // the copy queue signalling the next timeline value (*value), and hands
  // `done` to the completion thread. On an error nothing was submitted and
  // `done` was not called.
  Status SubmitCopy(const std::function<void(VkCommandBuffer)>& record, CopyDone done,
                    uint64_t* value);
  // Blocks until the copy timeline reached `value` (0: at once).
  Status WaitCopyValue(uint64_t value);
  void CompletionLoop();

  VkQueue copy_queue_ = VK_NULL_HANDLE;
  uint32_t copy_family_ = 0;
  uint64_t import_alignment_ = 0;  // minImportedHostPointerAlignment; 0: no import
  VkSemaphore copy_timeline_ = VK_NULL_HANDLE;
  Mutex copy_queue_mu_;  // vkQueueSubmit on copy_queue_ when it is not queue_
  uint64_t copy_next_ = 0;  // last value handed out; under the submitting queue's mutex
  Mutex copy_pool_mu_;
  VkCommandPool copy_pool_ GUARDED_BY(copy_pool_mu_) = VK_NULL_HANDLE;
  Mutex pending_mu_;  // taken after the queue mutexes
  CondVar pending_cv_{&pending_mu_};
  std::vector<PendingCopy> pending_ GUARDED_BY(pending_mu_);
  bool stop_ GUARDED_BY(pending_mu_) = false;
  // The highest timeline value the completion thread saw reached: compute
  // submissions wait on it (Note [Copy queue]).
  std::atomic<uint64_t> copy_completed_{0};
  std::thread completion_thread_;

  mutable Mutex mu_;  // pipelines
  std::map<std::string, VkPipeline, std::less<>> pipelines_ GUARDED_BY(mu_);

  std::atomic<uint64_t> live_bytes_[4] = {0, 0, 0, 0};
  std::atomic<uint64_t> upload_bytes_[3] = {0, 0, 0};
};

}  // namespace arbiter::vulkan
