// vulkan/vulkan_device.cc — the process's Vulkan instance, device discovery
// and opened devices (arbiter/vulkan/vulkan_device.h).
#include "arbiter/vulkan/vulkan_device.h"

#include <cstdlib>
#include <cstring>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "arbiter/memory/device_backend.h"
#include "vulkan/coopmat_gemm_internal.h"
#include "vulkan/shaders.h"

namespace arbiter::vulkan {
namespace {

std::atomic<uint64_t> g_validation_messages{0};

VKAPI_ATTR VkBool32 VKAPI_CALL OnValidationMessage(
    VkDebugUtilsMessageSeverityFlagBitsEXT severity, VkDebugUtilsMessageTypeFlagsEXT,
    const VkDebugUtilsMessengerCallbackDataEXT* data, void*) {
  if (severity < VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT) return VK_FALSE;
  g_validation_messages.fetch_add(1);
  spdlog::error("vulkan validation: {}", data != nullptr && data->pMessage ? data->pMessage : "?");
  return VK_FALSE;
}

std::string VkResultName(VkResult r) {
  switch (r) {
    case VK_ERROR_OUT_OF_HOST_MEMORY: return "VK_ERROR_OUT_OF_HOST_MEMORY";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
    case VK_ERROR_INITIALIZATION_FAILED: return "VK_ERROR_INITIALIZATION_FAILED";
    case VK_ERROR_DEVICE_LOST: return "VK_ERROR_DEVICE_LOST";
    case VK_ERROR_LAYER_NOT_PRESENT: return "VK_ERROR_LAYER_NOT_PRESENT";
    case VK_ERROR_EXTENSION_NOT_PRESENT: return "VK_ERROR_EXTENSION_NOT_PRESENT";
    case VK_ERROR_FEATURE_NOT_PRESENT: return "VK_ERROR_FEATURE_NOT_PRESENT";
    case VK_ERROR_INCOMPATIBLE_DRIVER: return "VK_ERROR_INCOMPATIBLE_DRIVER";
    case VK_ERROR_TOO_MANY_OBJECTS: return "VK_ERROR_TOO_MANY_OBJECTS";
    default: return fmt::format("VkResult {}", static_cast<int>(r));
  }
}

// The process's instance: made once, never destroyed (devices opened from it
// may live until exit; the driver reclaims everything at exit).
struct Instance {
  Status status;
  VkInstance instance = VK_NULL_HANDLE;
  VkDebugUtilsMessengerEXT messenger = VK_NULL_HANDLE;
  bool validation = false;
};

bool HasExtension(const std::vector<VkExtensionProperties>& exts, const char* name) {
  for (const VkExtensionProperties& e : exts) {
    if (std::strcmp(e.extensionName, name) == 0) return true;
  }
  return false;
}

Instance MakeInstance() {
  Instance in;
  if (VkResult r = volkInitialize(); r != VK_SUCCESS) {
    in.status = UnavailableError(
        "the Vulkan loader (libvulkan.so.1) could not be opened: install libvulkan1 and a "
        "Vulkan driver (mesa-vulkan-drivers, or the GPU vendor's), or use device \"cpu\"");
    return in;
  }
  const char* v = std::getenv("ARBITER_VULKAN_VALIDATION");
  in.validation = v != nullptr && std::string_view(v) == "1";
  uint32_t n = 0;
  vkEnumerateInstanceExtensionProperties(nullptr, &n, nullptr);
  std::vector<VkExtensionProperties> exts(n);
  vkEnumerateInstanceExtensionProperties(nullptr, &n, exts.data());
  std::vector<const char*> enabled;
  const bool debug_utils = HasExtension(exts, VK_EXT_DEBUG_UTILS_EXTENSION_NAME);
  if (in.validation && debug_utils) enabled.push_back(VK_EXT_DEBUG_UTILS_EXTENSION_NAME);
  const char* layers[] = {"VK_LAYER_KHRONOS_validation"};
  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.pApplicationName = "arbiter";
  app.pEngineName = "arbiter";
  app.apiVersion = VK_API_VERSION_1_2;
  VkInstanceCreateInfo ci{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  ci.pApplicationInfo = &app;
  ci.enabledExtensionCount = static_cast<uint32_t>(enabled.size());
  ci.ppEnabledExtensionNames = enabled.data();
  if (in.validation) {
    ci.enabledLayerCount = 1;
    ci.ppEnabledLayerNames = layers;
  }
  if (VkResult r = vkCreateInstance(&ci, nullptr, &in.instance); r != VK_SUCCESS) {
    in.status = UnavailableError(
        "no Vulkan instance (" + VkResultName(r) + ")" +
        (in.validation ? ": ARBITER_VULKAN_VALIDATION=1 needs vulkan-validationlayers" : "") +
        "; use device \"cpu\" or install a Vulkan driver");
    return in;
  }
  volkLoadInstanceOnly(in.instance);
  if (in.validation && debug_utils) {
    VkDebugUtilsMessengerCreateInfoEXT mi{VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT};
    mi.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT |
                         VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
    mi.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT |
                     VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                     VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
    mi.pfnUserCallback = OnValidationMessage;
    vkCreateDebugUtilsMessengerEXT(in.instance, &mi, nullptr, &in.messenger);
  }
  return in;
}

const Instance& TheInstance() {
  static const Instance* const kInstance = new Instance(MakeInstance());
  return *kInstance;
}

std::string TypeName(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete-gpu";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated-gpu";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual-gpu";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "cpu";
    default: return "other";
  }
}

Result<std::vector<VkPhysicalDevice>> PhysicalDevices() {
  const Instance& in = TheInstance();
  ARBITER_RETURN_IF_ERROR(in.status);
  uint32_t n = 0;
  if (VkResult r = vkEnumeratePhysicalDevices(in.instance, &n, nullptr); r != VK_SUCCESS) {
    return UnavailableError("vkEnumeratePhysicalDevices failed: " + VkResultName(r));
  }
  std::vector<VkPhysicalDevice> devices(n);
  vkEnumeratePhysicalDevices(in.instance, &n, devices.data());
  devices.resize(n);
  return devices;
}

VulkanDeviceInfo Describe(int index, VkPhysicalDevice pd) {
  VulkanDeviceInfo info;
  info.index = index;
  uint32_t n = 0;
  vkEnumerateDeviceExtensionProperties(pd, nullptr, &n, nullptr);
  std::vector<VkExtensionProperties> exts(n);
  vkEnumerateDeviceExtensionProperties(pd, nullptr, &n, exts.data());
  info.memory_budget = HasExtension(exts, VK_EXT_MEMORY_BUDGET_EXTENSION_NAME);
  info.external_memory_host = HasExtension(exts, VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME);
  info.cooperative_matrix_nv = HasExtension(exts, VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME);

  VkPhysicalDeviceDriverProperties driver{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES};
  VkPhysicalDeviceSubgroupProperties subgroup{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
  subgroup.pNext = &driver;
  VkPhysicalDeviceMaintenance3Properties m3{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES};
  m3.pNext = &subgroup;
  VkPhysicalDeviceProperties2 props{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  props.pNext = &m3;
  vkGetPhysicalDeviceProperties2(pd, &props);
  const VkPhysicalDeviceProperties& p = props.properties;
  info.name = p.deviceName;
  info.type = TypeName(p.deviceType);
  info.driver = driver.driverName;
  info.driver_info = driver.driverInfo;
  info.api_version = fmt::format("{}.{}.{}", VK_API_VERSION_MAJOR(p.apiVersion),
                                 VK_API_VERSION_MINOR(p.apiVersion),
                                 VK_API_VERSION_PATCH(p.apiVersion));
  info.vendor_id = p.vendorID;
  info.device_id = p.deviceID;
  info.subgroup_size = subgroup.subgroupSize;
  info.max_allocation_bytes = m3.maxMemoryAllocationSize;
  info.max_storage_buffer_range = p.limits.maxStorageBufferRange;
  info.max_shared_memory_bytes = p.limits.maxComputeSharedMemorySize;

  VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  VkPhysicalDeviceVulkan11Features f11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
  f11.pNext = &f12;
  VkPhysicalDeviceFeatures2 f{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  f.pNext = &f11;
  vkGetPhysicalDeviceFeatures2(pd, &f);
  info.fp16 = f12.shaderFloat16;
  info.storage16 = f11.storageBuffer16BitAccess;
  info.int64 = f.features.shaderInt64;
  info.buffer_device_address = f12.bufferDeviceAddress;
  info.vulkan_memory_model = f12.vulkanMemoryModel;
  DescribeCooperativeMatrix(pd, info);

  VkPhysicalDeviceMemoryBudgetPropertiesEXT budget{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT};
  VkPhysicalDeviceMemoryProperties2 mem{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2};
  if (info.memory_budget) mem.pNext = &budget;
  vkGetPhysicalDeviceMemoryProperties2(pd, &mem);
  const VkPhysicalDeviceMemoryProperties& mp = mem.memoryProperties;
  uint64_t best = 0;
  for (uint32_t h = 0; h < mp.memoryHeapCount; ++h) {
    VulkanHeapInfo heap;
    heap.size_bytes = mp.memoryHeaps[h].size;
    heap.device_local = (mp.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) != 0;
    if (info.memory_budget) {
      heap.budget_bytes = budget.heapBudget[h];
      heap.usage_bytes = budget.heapUsage[h];
    }
    if (heap.device_local && heap.size_bytes > best) {
      best = heap.size_bytes;
      info.weight_heap = static_cast<int>(h);
    }
    info.heaps.push_back(heap);
  }
  // Unified: every device-local type of the weight heap is host-visible.
  bool any = false, all_visible = true;
  for (uint32_t t = 0; t < mp.memoryTypeCount; ++t) {
    const VkMemoryType& type = mp.memoryTypes[t];
    if (static_cast<int>(type.heapIndex) != info.weight_heap ||
        (type.propertyFlags & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) == 0) {
      continue;
    }
    any = true;
    all_visible &= (type.propertyFlags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) != 0;
  }
  info.unified_memory = (any && all_visible) || p.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;

  vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, nullptr);
  std::vector<VkQueueFamilyProperties> families(n);
  vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, families.data());
  bool compute = false;
  for (const VkQueueFamilyProperties& q : families) {
    compute |= (q.queueFlags & VK_QUEUE_COMPUTE_BIT) != 0;
    if ((q.queueFlags & VK_QUEUE_TRANSFER_BIT) != 0 &&
        (q.queueFlags & (VK_QUEUE_COMPUTE_BIT | VK_QUEUE_GRAPHICS_BIT)) == 0) {
      info.transfer_queue = true;
    }
  }
  if (p.apiVersion < VK_API_VERSION_1_2) {
    info.unusable_reason = "Vulkan " + info.api_version + " (1.2 needed)";
  } else if (!compute) {
    info.unusable_reason = "no compute queue";
  } else if (!info.buffer_device_address) {
    info.unusable_reason = "no bufferDeviceAddress";
  } else if (!info.int64) {
    info.unusable_reason = "no shaderInt64";
  } else if (best == 0) {
    info.unusable_reason = "no device-local memory heap";
  }
  info.usable = info.unusable_reason.empty();
  return info;
}

// Opened devices by index: a weak reference, so a device closes when its
// last user lets go and a later Open makes it again.
Mutex g_open_mu;
std::map<int, std::weak_ptr<VulkanDevice>>& OpenDevices() {
  static auto* const kOpen = new std::map<int, std::weak_ptr<VulkanDevice>>();
  return *kOpen;
}

}  // namespace

bool IsVulkanDeviceName(std::string_view name) {
  if (name == "vulkan") return true;
  if (name.substr(0, 7) != "vulkan:" || name.size() == 7 || name.size() > 10) return false;
  for (char c : name.substr(7)) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

Result<std::vector<VulkanDeviceInfo>> ListVulkanDevices() {
  ARBITER_ASSIGN_OR_RETURN(std::vector<VkPhysicalDevice> pds, PhysicalDevices());
  std::vector<VulkanDeviceInfo> out;
  for (size_t i = 0; i < pds.size(); ++i) out.push_back(Describe(static_cast<int>(i), pds[i]));
  return out;
}

Result<int> ResolveVulkanDevice(std::string_view name,
                                const std::vector<VulkanDeviceInfo>& devices) {
  if (!IsVulkanDeviceName(name)) {
    return InvalidArgumentError("device \"" + std::string(name.substr(0, 64)) +
                                "\" is not \"vulkan\" or \"vulkan:N\"");
  }
  std::string listed;
  for (const VulkanDeviceInfo& d : devices) {
    listed += (listed.empty() ? "" : ", ") + d.domain() + " (" + d.name + ", " + d.type + ")";
  }
  if (listed.empty()) listed = "none";
  if (name == "vulkan") {
    for (const VulkanDeviceInfo& d : devices) {
      if (d.type == "discrete-gpu" || d.type == "integrated-gpu" || d.type == "virtual-gpu") {
        return d.index;
      }
    }
    if (!devices.empty()) return 0;
    return NotFoundError("device \"vulkan\": the Vulkan loader finds no device (devices: " +
                         listed + "); install a driver or use device \"cpu\"");
  }
  const int index = std::stoi(std::string(name.substr(7)));
  if (index >= static_cast<int>(devices.size())) {
    return NotFoundError("device \"" + std::string(name) + "\" does not exist (devices: " +
                         listed + "; `arbiter devices` lists them)");
  }
  return index;
}

std::string_view UploadPathName(UploadPath path) {
  switch (path) {
    case UploadPath::kMapped: return "mapped";
    case UploadPath::kImported: return "import";
    case UploadPath::kStaged: return "staging";
  }
  return "unknown";
}

uint64_t ValidationMessageCount() { return g_validation_messages.load(); }

Result<std::shared_ptr<VulkanDevice>> VulkanDevice::Open(std::string_view name) {
  ARBITER_ASSIGN_OR_RETURN(std::vector<VkPhysicalDevice> pds, PhysicalDevices());
  std::vector<VulkanDeviceInfo> infos;
  for (size_t i = 0; i < pds.size(); ++i) infos.push_back(Describe(static_cast<int>(i), pds[i]));
  ARBITER_ASSIGN_OR_RETURN(int index, ResolveVulkanDevice(name, infos));
  const VulkanDeviceInfo& info = infos[static_cast<size_t>(index)];
  if (!info.usable) {
    return FailedPreconditionError("device " + info.domain() + " (" + info.name +
                                   ") cannot run arbiter's kernels: " + info.unusable_reason +
                                   "; use another device or \"cpu\"");
  }
  MutexLock l(&g_open_mu);
  if (std::shared_ptr<VulkanDevice> open = OpenDevices()[index].lock()) return open;
  std::shared_ptr<VulkanDevice> d(new VulkanDevice());
  ARBITER_RETURN_IF_ERROR(d->Init(info, pds[static_cast<size_t>(index)]));
  OpenDevices()[index] = d;
  return d;
}

Status VulkanDevice::Init(const VulkanDeviceInfo& info, VkPhysicalDevice physical) {
  info_ = info;
  physical_ = physical;
  vkGetPhysicalDeviceMemoryProperties(physical, &memory_);
  uint32_t n = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(physical, &n, nullptr);
  std::vector<VkQueueFamilyProperties> families(n);
  vkGetPhysicalDeviceQueueFamilyProperties(physical, &n, families.data());
  bool found = false;
  for (uint32_t i = 0; i < n && !found; ++i) {
    if ((families[i].queueFlags & VK_QUEUE_COMPUTE_BIT) != 0) {
      queue_family_ = i;
      timestamp_valid_bits_ = families[i].timestampValidBits;
      found = true;
    }
  }
  {
    VkPhysicalDeviceProperties props;
    vkGetPhysicalDeviceProperties(physical, &props);
    timestamp_period_ns_ = props.limits.timestampPeriod;
  }
  // Note [Copy queue]: a transfer-only family takes the copies.
  copy_family_ = queue_family_;
  for (uint32_t i = 0; i < n; ++i) {
    const VkQueueFlags fl = families[i].queueFlags;
    if ((fl & VK_QUEUE_TRANSFER_BIT) != 0 &&
        (fl & (VK_QUEUE_COMPUTE_BIT | VK_QUEUE_GRAPHICS_BIT)) == 0 && families[i].queueCount > 0) {
      copy_family_ = i;
      break;
    }
  }
  const float priority = 1.0f;
  VkDeviceQueueCreateInfo qis[2] = {{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO},
                                    {VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO}};
  qis[0].queueFamilyIndex = queue_family_;
  qis[0].queueCount = 1;
  qis[0].pQueuePriorities = &priority;
  qis[1].queueFamilyIndex = copy_family_;
  qis[1].queueCount = 1;
  qis[1].pQueuePriorities = &priority;
  VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  f12.bufferDeviceAddress = VK_TRUE;
  f12.shaderFloat16 = info.fp16;
  f12.timelineSemaphore = VK_TRUE;
  VkPhysicalDeviceVulkan11Features f11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
  f11.storageBuffer16BitAccess = info.storage16;
  f11.pNext = &f12;
  VkPhysicalDeviceFeatures2 f{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  f.features.shaderInt64 = VK_TRUE;
  f.pNext = &f11;
  std::vector<const char*> exts;
  if (info.memory_budget) exts.push_back(VK_EXT_MEMORY_BUDGET_EXTENSION_NAME);
  // Note [Cooperative-matrix GEMM]: enabled only where it may run.
  VkPhysicalDeviceCooperativeMatrixFeaturesNV coopmat{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV};
  if (info.cooperative_matrix_gemm_possible) {
    coopmat.cooperativeMatrix = VK_TRUE;
    f12.vulkanMemoryModel = VK_TRUE;
    coopmat.pNext = f.pNext;
    f.pNext = &coopmat;
    exts.push_back(VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME);
  }
  if (info.external_memory_host) {
    exts.push_back(VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME);
    VkPhysicalDeviceExternalMemoryHostPropertiesEXT host{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_MEMORY_HOST_PROPERTIES_EXT};
    VkPhysicalDeviceProperties2 props{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
    props.pNext = &host;
    vkGetPhysicalDeviceProperties2(physical, &props);
    import_alignment_ = host.minImportedHostPointerAlignment;
  }
  VkDeviceCreateInfo ci{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  ci.pNext = &f;
  ci.queueCreateInfoCount = copy_family_ != queue_family_ ? 2 : 1;
  ci.pQueueCreateInfos = qis;
  ci.enabledExtensionCount = static_cast<uint32_t>(exts.size());
  ci.ppEnabledExtensionNames = exts.data();
  if (VkResult r = vkCreateDevice(physical, &ci, nullptr, &device_); r != VK_SUCCESS) {
    device_ = VK_NULL_HANDLE;
    return UnavailableError("device " + info.domain() + " (" + info.name +
                            ") could not be opened: " + VkResultName(r));
  }
  // Device-level entry points straight from the driver (volk's global
  // table: every opened device of one process uses the same driver here).
  volkLoadDevice(device_);
  vkGetDeviceQueue(device_, queue_family_, 0, &queue_);
  copy_queue_ = queue_;
  if (copy_family_ != queue_family_) vkGetDeviceQueue(device_, copy_family_, 0, &copy_queue_);
  {
    VkSemaphoreTypeCreateInfo type{VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO};
    type.semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE;
    type.initialValue = 0;
    VkSemaphoreCreateInfo si{VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO};
    si.pNext = &type;
    if (VkResult r = vkCreateSemaphore(device_, &si, nullptr, &copy_timeline_); r != VK_SUCCESS) {
      return InternalError("vkCreateSemaphore (copy timeline): " + VkResultName(r));
    }
    VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    pi.flags = VK_COMMAND_POOL_CREATE_TRANSIENT_BIT;
    pi.queueFamilyIndex = copy_family_;
    MutexLock l(&copy_pool_mu_);
    if (VkResult r = vkCreateCommandPool(device_, &pi, nullptr, &copy_pool_); r != VK_SUCCESS) {
      return InternalError("vkCreateCommandPool (copies): " + VkResultName(r));
    }
  }
  completion_thread_ = std::thread([this] { CompletionLoop(); });

  VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, kPushConstantBytes};
  VkPipelineLayoutCreateInfo li{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
  li.pushConstantRangeCount = 1;
  li.pPushConstantRanges = &range;
  if (VkResult r = vkCreatePipelineLayout(device_, &li, nullptr, &layout_); r != VK_SUCCESS) {
    return InternalError("vkCreatePipelineLayout: " + VkResultName(r));
  }
  MutexLock l(&queue_mu_);
  VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  pi.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pi.queueFamilyIndex = queue_family_;
  if (VkResult r = vkCreateCommandPool(device_, &pi, nullptr, &oneshot_pool_); r != VK_SUCCESS) {
    return InternalError("vkCreateCommandPool: " + VkResultName(r));
  }
  VkFenceCreateInfo fi{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
  if (VkResult r = vkCreateFence(device_, &fi, nullptr, &fence_); r != VK_SUCCESS) {
    return InternalError("vkCreateFence: " + VkResultName(r));
  }
  return OkStatus();
}

VulkanDevice::~VulkanDevice() {
  if (device_ == VK_NULL_HANDLE) return;
  vkDeviceWaitIdle(device_);
  if (completion_thread_.joinable()) {
    {
      MutexLock l(&pending_mu_);
      stop_ = true;
      pending_cv_.SignalAll();
    }
    completion_thread_.join();  // completes what is left: the device is idle
  }
  {
    MutexLock l(&copy_pool_mu_);
    if (copy_pool_ != VK_NULL_HANDLE) vkDestroyCommandPool(device_, copy_pool_, nullptr);
  }
  if (copy_timeline_ != VK_NULL_HANDLE) vkDestroySemaphore(device_, copy_timeline_, nullptr);
  {
    MutexLock l(&mu_);
    for (auto& [name, p] : pipelines_) vkDestroyPipeline(device_, p, nullptr);
  }
  {
    MutexLock l(&upload_mu_);
    for (int h = 0; h < 2; ++h) Destroy(ring_.staging[h]);
  }
  {
    MutexLock l(&queue_mu_);
    if (fence_ != VK_NULL_HANDLE) vkDestroyFence(device_, fence_, nullptr);
    if (oneshot_pool_ != VK_NULL_HANDLE) vkDestroyCommandPool(device_, oneshot_pool_, nullptr);
  }
  if (layout_ != VK_NULL_HANDLE) vkDestroyPipelineLayout(device_, layout_, nullptr);
  vkDestroyDevice(device_, nullptr);
}

std::optional<VulkanHeapInfo> VulkanDevice::QueryWeightHeap() const {
  if (!info_.memory_budget) return std::nullopt;
  VkPhysicalDeviceMemoryBudgetPropertiesEXT budget{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT};
  VkPhysicalDeviceMemoryProperties2 mem{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2};
  mem.pNext = &budget;
  vkGetPhysicalDeviceMemoryProperties2(physical_, &mem);
  VulkanHeapInfo h;
  const auto i = static_cast<uint32_t>(info_.weight_heap);
  h.size_bytes = mem.memoryProperties.memoryHeaps[i].size;
  h.device_local = true;
  h.budget_bytes = budget.heapBudget[i];
  h.usage_bytes = budget.heapUsage[i];
  return h;
}

Result<uint32_t> VulkanDevice::MemoryTypeFor(uint32_t type_bits, BufferMemory memory) const {
  // Preference lists, best first; the first type allowed by type_bits wins.
  const VkMemoryPropertyFlags kLocal = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
  const VkMemoryPropertyFlags kVisible =
      VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  const VkMemoryPropertyFlags kCached = kVisible | VK_MEMORY_PROPERTY_HOST_CACHED_BIT;
  struct Want {
    VkMemoryPropertyFlags required;
    VkMemoryPropertyFlags avoided;
  };
  std::vector<Want> wants;
  switch (memory) {
    case BufferMemory::kDevice:
      wants = {{kLocal, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT}, {kLocal, 0}};
      break;
    case BufferMemory::kUpload:
      wants = {{kVisible, kLocal}, {kVisible, 0}};
      break;
    case BufferMemory::kReadback:
      wants = {{kCached, 0}, {kVisible, 0}};
      break;
    case BufferMemory::kImported:  // ImportHost picks its own type
      break;
  }
  for (const Want& w : wants) {
    for (uint32_t t = 0; t < memory_.memoryTypeCount; ++t) {
      const VkMemoryPropertyFlags f = memory_.memoryTypes[t].propertyFlags;
      if ((type_bits & (1u << t)) == 0 || (f & w.required) != w.required ||
          (f & w.avoided) != 0) {
        continue;
      }
      if (memory == BufferMemory::kDevice &&
          static_cast<int>(memory_.memoryTypes[t].heapIndex) != info_.weight_heap) {
        continue;
      }
      return t;
    }
  }
  return InternalError("device " + domain() + " has no memory type for this buffer");
}

Result<VulkanBuffer> VulkanDevice::CreateBuffer(uint64_t size_bytes, BufferMemory memory) {
  if (size_bytes == 0 || size_bytes > info_.max_allocation_bytes) {
    return InvalidArgumentError(fmt::format(
        "device {}: a buffer of {} bytes (the largest is maxMemoryAllocationSize {})", domain(),
        size_bytes, info_.max_allocation_bytes));
  }
  VulkanBuffer b;
  b.size_bytes = size_bytes;
  b.kind = memory;
  VkBufferCreateInfo bi{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  bi.size = size_bytes;
  bi.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
             VK_BUFFER_USAGE_TRANSFER_DST_BIT | VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT;
  // Note [Copy queue]: shared by the compute and the copy family.
  const uint32_t families[2] = {queue_family_, copy_family_};
  bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  if (copy_family_ != queue_family_) {
    bi.sharingMode = VK_SHARING_MODE_CONCURRENT;
    bi.queueFamilyIndexCount = 2;
    bi.pQueueFamilyIndices = families;
  }
  if (VkResult r = vkCreateBuffer(device_, &bi, nullptr, &b.buffer); r != VK_SUCCESS) {
    return ResourceExhaustedError(
        fmt::format("device {}: no buffer of {} bytes ({})", domain(), size_bytes, VkResultName(r)));
  }
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(device_, b.buffer, &req);
  Result<uint32_t> type = MemoryTypeFor(req.memoryTypeBits, memory);
  if (!type.ok()) {
    vkDestroyBuffer(device_, b.buffer, nullptr);
    return type.status();
  }
  VkMemoryAllocateFlagsInfo flags{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO};
  flags.flags = VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT;
  VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  ai.pNext = &flags;
  ai.allocationSize = req.size;
  ai.memoryTypeIndex = *type;
  if (VkResult r = vkAllocateMemory(device_, &ai, nullptr, &b.memory); r != VK_SUCCESS) {
    vkDestroyBuffer(device_, b.buffer, nullptr);
    return ResourceExhaustedError(fmt::format("device {}: out of memory allocating {} bytes ({})",
                                              domain(), size_bytes, VkResultName(r)));
  }
  vkBindBufferMemory(device_, b.buffer, b.memory, 0);
  live_bytes_[static_cast<int>(memory)] += size_bytes;
  const VkMemoryPropertyFlags f = memory_.memoryTypes[*type].propertyFlags;
  if ((f & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) != 0) {
    if (VkResult r = vkMapMemory(device_, b.memory, 0, VK_WHOLE_SIZE, 0, &b.host);
        r != VK_SUCCESS) {
      Destroy(b);
      return InternalError("vkMapMemory: " + VkResultName(r));
    }
  }
  VkBufferDeviceAddressInfo addr{VK_STRUCTURE_TYPE_BUFFER_DEVICE_ADDRESS_INFO};
  addr.buffer = b.buffer;
  b.address = vkGetBufferDeviceAddress(device_, &addr);
  return b;
}

void VulkanDevice::Destroy(VulkanBuffer& b) {
  if (b.buffer == VK_NULL_HANDLE && b.memory == VK_NULL_HANDLE) return;
  if (b.host != nullptr) vkUnmapMemory(device_, b.memory);
  vkDestroyBuffer(device_, b.buffer, nullptr);
  vkFreeMemory(device_, b.memory, nullptr);
  live_bytes_[static_cast<int>(b.kind)] -= b.size_bytes;
  b = VulkanBuffer{};
}

uint64_t VulkanDevice::live_bytes(BufferMemory memory) const {
  return live_bytes_[static_cast<int>(memory)].load();
}

Result<VkPipeline> VulkanDevice::Pipeline(std::string_view name) {
  MutexLock l(&mu_);
  if (auto it = pipelines_.find(name); it != pipelines_.end()) return it->second;
  const ShaderBlob* blob = nullptr;
  for (const ShaderBlob& s : Shaders()) {
    if (s.name == name) blob = &s;
  }
  if (blob == nullptr) return NotFoundError("no compute shader \"" + std::string(name) + "\"");
  VkShaderModuleCreateInfo mi{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
  mi.codeSize = blob->spirv.size() * sizeof(uint32_t);
  mi.pCode = blob->spirv.data();
  VkShaderModule module;
  if (VkResult r = vkCreateShaderModule(device_, &mi, nullptr, &module); r != VK_SUCCESS) {
    return InternalError("shader " + std::string(name) + ": " + VkResultName(r));
  }
  VkComputePipelineCreateInfo pi{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
  pi.stage = {VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO};
  pi.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  pi.stage.module = module;
  pi.stage.pName = "main";
  pi.layout = layout_;
  VkPipeline pipeline;
  const VkResult r = vkCreateComputePipelines(device_, VK_NULL_HANDLE, 1, &pi, nullptr, &pipeline);
  vkDestroyShaderModule(device_, module, nullptr);
  if (r != VK_SUCCESS) {
    return InternalError("pipeline " + std::string(name) + ": " + VkResultName(r));
  }
  pipelines_.emplace(std::string(name), pipeline);
  return pipeline;
}

Status VulkanDevice::SubmitAndWait(VkCommandBuffer cb) {
  MutexLock l(&queue_mu_);
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.commandBufferCount = 1;
  si.pCommandBuffers = &cb;
  // Note [Copy queue]: the kernels see every copy whose completion was
  // observed (its ticket may have been waited for) through this wait.
  const uint64_t copied = copy_completed_.load();
  const VkPipelineStageFlags stage = VK_PIPELINE_STAGE_ALL_COMMANDS_BIT;
  VkTimelineSemaphoreSubmitInfo ts{VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO};
  ts.waitSemaphoreValueCount = 1;
  ts.pWaitSemaphoreValues = &copied;
  if (copied > 0) {
    si.pNext = &ts;
    si.waitSemaphoreCount = 1;
    si.pWaitSemaphores = &copy_timeline_;
    si.pWaitDstStageMask = &stage;
  }
  if (VkResult r = vkQueueSubmit(queue_, 1, &si, fence_); r != VK_SUCCESS) {
    return UnavailableError("device " + domain() + ": vkQueueSubmit failed: " + VkResultName(r));
  }
  const VkResult r = vkWaitForFences(device_, 1, &fence_, VK_TRUE, UINT64_MAX);
  vkResetFences(device_, 1, &fence_);
  if (r != VK_SUCCESS) {
    return UnavailableError("device " + domain() + ": waiting for the GPU failed: " +
                            VkResultName(r));
  }
  return OkStatus();
}

Status VulkanDevice::RunOnce(const std::function<void(VkCommandBuffer)>& record) {
  VkCommandBuffer cb;
  {
    MutexLock l(&queue_mu_);
    VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    ai.commandPool = oneshot_pool_;
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    if (VkResult r = vkAllocateCommandBuffers(device_, &ai, &cb); r != VK_SUCCESS) {
      return UnavailableError("vkAllocateCommandBuffers: " + VkResultName(r));
    }
    VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    vkBeginCommandBuffer(cb, &bi);
    record(cb);
    vkEndCommandBuffer(cb);
  }
  Status s = SubmitAndWait(cb);
  MutexLock l(&queue_mu_);
  vkFreeCommandBuffers(device_, oneshot_pool_, 1, &cb);
  return s;
}

Result<VkCommandPool> VulkanDevice::CreateCommandPool() {
  VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  pi.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pi.queueFamilyIndex = queue_family_;
  VkCommandPool pool;
  if (VkResult r = vkCreateCommandPool(device_, &pi, nullptr, &pool); r != VK_SUCCESS) {
    return ResourceExhaustedError("vkCreateCommandPool: " + VkResultName(r));
  }
  return pool;
}

void VulkanDevice::DestroyCommandPool(VkCommandPool pool) {
  if (pool != VK_NULL_HANDLE) vkDestroyCommandPool(device_, pool, nullptr);
}

namespace {
// Staging chunk for Download through a host-visible buffer.
constexpr uint64_t kStagingBytes = uint64_t{64} << 20;
}  // namespace

// Note [Staged uploads]
// A device whose memory the host cannot map (a discrete GPU) gets its
// weights through host-visible staging memory. Each device keeps two
// staging halves of kStagingHalfBytes for its lifetime (made at the first
// staged upload; pinned host memory the host's RSS measures), each with the
// copy-timeline value of its last copy (Note [Copy queue]). An upload walks
// its bytes in chunks of a half: wait until the half's previous copy
// finished, fill it (a memcpy
// split over several threads when the chunk is large: one thread copies
// ~10 GB/s, the PCIe link carries far more), submit its copy, and go on to
// the other half — so the host's copy into one half overlaps the GPU's copy
// out of the other. The call returns once the last chunk is submitted; its
// completion runs when the GPU copied it. Staged uploads are serialized per
// device (upload_mu_, taken before the queue mutexes). Host floors the
// device imported (ImportHost) skip all of this: the GPU copies straight
// from their pages.
namespace {
constexpr uint64_t kStagingHalfBytes = uint64_t{32} << 20;

// memcpy over up to 8 threads for large copies.
void ParallelCopy(void* dst, const void* src, uint64_t n) {
  constexpr uint64_t kPerThread = uint64_t{4} << 20;
  const unsigned threads = static_cast<unsigned>(
      std::min<uint64_t>({8, std::max(1u, std::thread::hardware_concurrency()), n / kPerThread}));
  if (threads <= 1) {
    std::memcpy(dst, src, n);
    return;
  }
  std::vector<std::thread> pool;
  const uint64_t per = (n + threads - 1) / threads;
  for (unsigned t = 1; t < threads; ++t) {
    const uint64_t b = t * per, e = std::min(n, b + per);
    if (b < e) {
      pool.emplace_back([=] {
        std::memcpy(static_cast<uint8_t*>(dst) + b, static_cast<const uint8_t*>(src) + b, e - b);
      });
    }
  }
  std::memcpy(dst, src, std::min(n, per));
  for (std::thread& t : pool) t.join();
}
}  // namespace


// Note [Copy queue]
// Every GPU copy (staged upload, readback, a copy out of imported host
// pages) is one command buffer submitted to the copy queue — a queue of a
// transfer-only family where the device has one (discrete NVIDIA/AMD GPUs:
// their DMA engines), else the compute queue itself (lavapipe) — and
// signals the next value of one timeline semaphore, copy_timeline_. Values
// are handed out under the submitting queue's mutex, so they rise in
// submission order. A completion thread waits (vkWaitSemaphores) for the
// lowest pending value, then runs the `done` of every copy the timeline has
// reached — this is what completes a DeviceBackend CopyTicket — and frees
// their command buffers. So a copy's caller only blocks on the host-side
// memcpy it needs (staging), never on the GPU, and Wait on many tickets
// overlaps all their copies.
//
// Ownership: with two families, every buffer is made
// VK_SHARING_MODE_CONCURRENT across both (CreateBuffer), so no queue-family
// ownership transfer (a release/acquire barrier pair on both queues per
// copy) is needed; concurrent sharing is what costs with images (layouts,
// compression), not with buffers. With one
// family the buffers stay exclusive (concurrent needs two distinct
// families), and the copy and compute submissions share one queue.
//
// Visibility: compute work that reads copied bytes starts only after the
// host saw the copy's ticket complete (the weight cache waits on every
// ticket before a model is resident). Each compute submission also waits on
// copy_timeline_ for copy_completed_, the highest value the completion
// thread saw reached: a wait that is already satisfied costs nothing, but
// it is the semaphore dependency the memory model asks for, so the
// kernels see the copied bytes whichever queue wrote them. The path is the
// same whether or not the device has a separate copy queue, so lavapipe
// (one queue) runs all of it — the timeline, the completion thread, the
// compute-side wait — and only the choice of VkQueue differs on the H100.

Status VulkanDevice::SubmitCopy(const std::function<void(VkCommandBuffer)>& record, CopyDone done,
                                uint64_t* value) {
  VkCommandBuffer cb;
  {
    MutexLock l(&copy_pool_mu_);
    VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    ai.commandPool = copy_pool_;
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    if (VkResult r = vkAllocateCommandBuffers(device_, &ai, &cb); r != VK_SUCCESS) {
      return UnavailableError("device " + domain() + ": no copy command buffer (" +
                              VkResultName(r) + ")");
    }
    VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    vkBeginCommandBuffer(cb, &bi);
    record(cb);
    vkEndCommandBuffer(cb);
  }
  auto submit = [&]() -> VkResult {
    const uint64_t v = copy_next_ + 1;
    VkTimelineSemaphoreSubmitInfo ts{VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO};
    ts.signalSemaphoreValueCount = 1;
    ts.pSignalSemaphoreValues = &v;
    VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
    si.pNext = &ts;
    si.commandBufferCount = 1;
    si.pCommandBuffers = &cb;
    si.signalSemaphoreCount = 1;
    si.pSignalSemaphores = &copy_timeline_;
    const VkResult r = vkQueueSubmit(copy_queue_, 1, &si, VK_NULL_HANDLE);
    if (r == VK_SUCCESS) {
      copy_next_ = v;
      *value = v;
      MutexLock p(&pending_mu_);
      pending_.push_back(PendingCopy{v, cb, std::move(done)});
      pending_cv_.SignalAll();
    }
    return r;
  };
  VkResult r;
  if (copy_queue_ == queue_) {
    MutexLock q(&queue_mu_);
    r = submit();
  } else {
    MutexLock q(&copy_queue_mu_);
    r = submit();
  }
  if (r != VK_SUCCESS) {
    MutexLock l(&copy_pool_mu_);
    vkFreeCommandBuffers(device_, copy_pool_, 1, &cb);
    return UnavailableError("device " + domain() + ": vkQueueSubmit of a copy failed: " +
                            VkResultName(r));
  }
  return OkStatus();
}

Status VulkanDevice::WaitCopyValue(uint64_t value) {
  if (value == 0) return OkStatus();
  VkSemaphoreWaitInfo wi{VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO};
  wi.semaphoreCount = 1;
  wi.pSemaphores = &copy_timeline_;
  wi.pValues = &value;
  if (VkResult r = vkWaitSemaphores(device_, &wi, UINT64_MAX); r != VK_SUCCESS) {
    return UnavailableError("device " + domain() + ": a copy failed: " + VkResultName(r));
  }
  return OkStatus();
}

void VulkanDevice::CompletionLoop() {
  for (;;) {
    uint64_t target = UINT64_MAX;
    {
      MutexLock l(&pending_mu_);
      while (pending_.empty() && !stop_) pending_cv_.Wait();
      if (pending_.empty()) return;
      for (const PendingCopy& p : pending_) target = std::min(target, p.value);
    }
    Status st = WaitCopyValue(target);
    uint64_t reached = 0;
    if (st.ok()) {
      vkGetSemaphoreCounterValue(device_, copy_timeline_, &reached);
    } else {
      reached = UINT64_MAX;  // the device is lost: fail everything pending
    }
    std::vector<PendingCopy> finished;
    {
      MutexLock l(&pending_mu_);
      for (size_t i = 0; i < pending_.size();) {
        if (pending_[i].value <= reached) {
          finished.push_back(std::move(pending_[i]));
          pending_[i] = std::move(pending_.back());
          pending_.pop_back();
        } else {
          ++i;
        }
      }
    }
    if (st.ok()) {
      uint64_t seen = copy_completed_.load();
      while (reached > seen && !copy_completed_.compare_exchange_weak(seen, reached)) {
      }
    }
    {
      MutexLock l(&copy_pool_mu_);
      for (const PendingCopy& p : finished) vkFreeCommandBuffers(device_, copy_pool_, 1, &p.cb);
    }
    for (PendingCopy& p : finished) {
      if (p.done) p.done(st);
    }
  }
}

Status VulkanDevice::EnsureUploadRingLocked() {
  for (int h = 0; h < 2; ++h) {
    if (ring_.staging[h].buffer != VK_NULL_HANDLE) continue;
    ARBITER_ASSIGN_OR_RETURN(ring_.staging[h],
                             CreateBuffer(kStagingHalfBytes, BufferMemory::kUpload));
  }
  return OkStatus();
}

void VulkanDevice::UploadAsync(const VulkanBuffer& dst, uint64_t offset, const void* src,
                               uint64_t size_bytes, bool allow_mapped, CopyDone done) {
  if (offset > dst.size_bytes || size_bytes > dst.size_bytes - offset) {
    done(OutOfRangeError(fmt::format("upload of {} bytes at {} into a buffer of {}", size_bytes,
                                     offset, dst.size_bytes)));
    return;
  }
  if (size_bytes == 0) {
    done(OkStatus());
    return;
  }
  if (allow_mapped && dst.host != nullptr) {
    ParallelCopy(static_cast<uint8_t*>(dst.host) + offset, src, size_bytes);
    done(OkStatus());
    return;
  }
  MutexLock l(&upload_mu_);
  Status s = EnsureUploadRingLocked();
  for (uint64_t copied = 0; s.ok() && copied < size_bytes;) {
    const int h = ring_.next;
    ring_.next = 1 - h;
    s = WaitCopyValue(ring_.value[h]);  // the half's previous copy read it
    if (!s.ok()) break;
    const uint64_t n = std::min(size_bytes - copied, kStagingHalfBytes);
    ParallelCopy(ring_.staging[h].host, static_cast<const uint8_t*>(src) + copied, n);
    const bool last = copied + n == size_bytes;
    const VkBuffer from = ring_.staging[h].buffer;
    const uint64_t to = offset + copied;
    s = SubmitCopy(
        [&](VkCommandBuffer cb) {
          VkBufferCopy c{0, to, n};
          vkCmdCopyBuffer(cb, from, dst.buffer, 1, &c);
        },
        last ? done : CopyDone(), &ring_.value[h]);
    if (s.ok() && last) return;  // `done` runs when the GPU copied it
    copied += n;
  }
  // Failed before the last chunk went: nothing may still read `src` or
  // write `dst` once `done` runs.
  WaitCopyValue(ring_.value[0]).IgnoreError();  // `s` already says what failed
  WaitCopyValue(ring_.value[1]).IgnoreError();
  done(s);
}

void VulkanDevice::DownloadAsync(const VulkanBuffer& src, uint64_t offset, void* dst,
                                 uint64_t size_bytes, bool allow_mapped, CopyDone done) {
  if (offset > src.size_bytes || size_bytes > src.size_bytes - offset) {
    done(OutOfRangeError(fmt::format("download of {} bytes at {} from a buffer of {}",
                                     size_bytes, offset, src.size_bytes)));
    return;
  }
  if (size_bytes == 0) {
    done(OkStatus());
    return;
  }
  if (allow_mapped && src.host != nullptr) {
    std::memcpy(dst, static_cast<const uint8_t*>(src.host) + offset, size_bytes);
    done(OkStatus());
    return;
  }
  Result<VulkanBuffer> made =
      CreateBuffer(std::min(size_bytes, kStagingBytes), BufferMemory::kReadback);
  if (!made.ok()) {
    done(made.status());
    return;
  }
  VulkanBuffer staging = *made;
  if (size_bytes <= staging.size_bytes) {
    // One chunk: the completion thread copies it out and frees the staging.
    uint64_t value;
    auto finish = [this, staging, dst, size_bytes, done](Status st) mutable {
      if (st.ok()) std::memcpy(dst, staging.host, size_bytes);
      Destroy(staging);
      done(std::move(st));
    };
    Status s = SubmitCopy(
        [&](VkCommandBuffer cb) {
          VkBufferCopy c{offset, 0, size_bytes};
          vkCmdCopyBuffer(cb, src.buffer, staging.buffer, 1, &c);
        },
        finish, &value);
    if (!s.ok()) {
      Destroy(staging);
      done(s);
    }
    return;
  }
  // Larger than one staging buffer: chunk by chunk, done before returning.
  Status s;
  for (uint64_t copied = 0; copied < size_bytes && s.ok();) {
    const uint64_t n = std::min(size_bytes - copied, staging.size_bytes);
    uint64_t value = 0;
    s = SubmitCopy(
        [&](VkCommandBuffer cb) {
          VkBufferCopy c{offset + copied, 0, n};
          vkCmdCopyBuffer(cb, src.buffer, staging.buffer, 1, &c);
        },
        CopyDone(), &value);
    if (s.ok()) s = WaitCopyValue(value);
    if (s.ok()) std::memcpy(static_cast<uint8_t*>(dst) + copied, staging.host, n);
    copied += n;
  }
  Destroy(staging);
  done(s);
}

void VulkanDevice::CopyAsync(const VulkanBuffer& src, uint64_t src_offset, const VulkanBuffer& dst,
                             uint64_t dst_offset, uint64_t size_bytes, CopyDone done) {
  if (size_bytes == 0) {
    done(OkStatus());
    return;
  }
  uint64_t value;
  Status s = SubmitCopy(
      [&](VkCommandBuffer cb) {
        VkBufferCopy c{src_offset, dst_offset, size_bytes};
        vkCmdCopyBuffer(cb, src.buffer, dst.buffer, 1, &c);
      },
      done, &value);
  if (!s.ok()) done(s);
}

namespace {
// Runs a copy and waits for it.
Status Synchronously(const std::function<void(VulkanDevice::CopyDone)>& start) {
  auto c = std::make_shared<CopyCompletion>();
  start([c](Status s) { c->Complete(std::move(s)); });
  return c->Wait();
}
}  // namespace

Status VulkanDevice::Upload(const VulkanBuffer& dst, uint64_t offset, const void* src,
                            uint64_t size_bytes, bool allow_mapped) {
  return Synchronously([&](CopyDone done) {
    UploadAsync(dst, offset, src, size_bytes, allow_mapped, std::move(done));
  });
}

Status VulkanDevice::Download(const VulkanBuffer& src, uint64_t offset, void* dst,
                              uint64_t size_bytes, bool allow_mapped) {
  return Synchronously([&](CopyDone done) {
    DownloadAsync(src, offset, dst, size_bytes, allow_mapped, std::move(done));
  });
}

Result<VulkanBuffer> VulkanDevice::ImportHost(const void* p, uint64_t size_bytes,
                                              const uint8_t** base) {
  if (import_alignment_ == 0) {
    return UnimplementedError("device " + domain() + " has no VK_EXT_external_memory_host");
  }
  const uint64_t a = import_alignment_;
  const auto begin = reinterpret_cast<uintptr_t>(p) / a * a;
  const uint64_t end = (reinterpret_cast<uintptr_t>(p) + size_bytes + a - 1) / a * a;
  const uint64_t n = end - begin;
  if (size_bytes == 0 || n > info_.max_allocation_bytes) {
    return InvalidArgumentError(fmt::format(
        "device {}: cannot import {} host bytes (the largest allocation is {})", domain(), n,
        info_.max_allocation_bytes));
  }
  void* host = reinterpret_cast<void*>(begin);
  VkMemoryHostPointerPropertiesEXT hp{VK_STRUCTURE_TYPE_MEMORY_HOST_POINTER_PROPERTIES_EXT};
  if (VkResult r = vkGetMemoryHostPointerPropertiesEXT(
          device_, VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT, host, &hp);
      r != VK_SUCCESS) {
    return UnavailableError(fmt::format("device {}: host pages at {} not importable ({})",
                                        domain(), host, VkResultName(r)));
  }
  VulkanBuffer b;
  b.size_bytes = n;
  b.kind = BufferMemory::kImported;
  VkExternalMemoryBufferCreateInfo eb{VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO};
  eb.handleTypes = VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT;
  VkBufferCreateInfo bi{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  bi.pNext = &eb;
  bi.size = n;
  bi.usage = VK_BUFFER_USAGE_TRANSFER_SRC_BIT;
  const uint32_t families[2] = {queue_family_, copy_family_};
  bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  if (copy_family_ != queue_family_) {
    bi.sharingMode = VK_SHARING_MODE_CONCURRENT;
    bi.queueFamilyIndexCount = 2;
    bi.pQueueFamilyIndices = families;
  }
  if (VkResult r = vkCreateBuffer(device_, &bi, nullptr, &b.buffer); r != VK_SUCCESS) {
    return UnavailableError("device " + domain() + ": no import buffer: " + VkResultName(r));
  }
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(device_, b.buffer, &req);
  const uint32_t bits = req.memoryTypeBits & hp.memoryTypeBits;
  if (bits == 0 || req.size > n) {
    vkDestroyBuffer(device_, b.buffer, nullptr);
    return UnavailableError("device " + domain() + ": no memory type can import host pages");
  }
  uint32_t type = 0;
  while ((bits & (1u << type)) == 0) ++type;
  VkImportMemoryHostPointerInfoEXT imp{VK_STRUCTURE_TYPE_IMPORT_MEMORY_HOST_POINTER_INFO_EXT};
  imp.handleType = VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT;
  imp.pHostPointer = host;
  VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  ai.pNext = &imp;
  ai.allocationSize = n;
  ai.memoryTypeIndex = type;
  if (VkResult r = vkAllocateMemory(device_, &ai, nullptr, &b.memory); r != VK_SUCCESS) {
    vkDestroyBuffer(device_, b.buffer, nullptr);
    return UnavailableError(fmt::format("device {}: importing {} host bytes failed ({})",
                                        domain(), n, VkResultName(r)));
  }
  vkBindBufferMemory(device_, b.buffer, b.memory, 0);
  live_bytes_[static_cast<int>(BufferMemory::kImported)] += n;
  *base = reinterpret_cast<const uint8_t*>(begin);
  return b;
}

}  // namespace arbiter::vulkan
