// tools/arbiter/devices_command.cc — `arbiter devices` (devices_command.h).
#include "tools/arbiter/devices_command.h"

#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "arbiter/base/size.h"
#if ARBITER_HAS_VULKAN
#include "arbiter/vulkan/coopmat_gemm.h"
#include "arbiter/vulkan/vulkan_device.h"
#endif

namespace arbiter::tools {
namespace {

#if ARBITER_HAS_VULKAN
// The prefill GEMM's cooperative-matrix path on `d` (Note
// [Cooperative-matrix GEMM]): a device that may run it is opened and the
// path self-checked, as a model's first load on it would.
std::string CoopmatGemmReport(const vulkan::VulkanDeviceInfo& d) {
  if (!d.usable || !d.cooperative_matrix_gemm_possible) {
    return std::string(CoopmatGemmStateName(vulkan::CoopmatGemmState::kUnavailable));
  }
  Result<std::shared_ptr<vulkan::VulkanDevice>> dev = vulkan::VulkanDevice::Open(d.domain());
  if (!dev.ok()) return std::string(CoopmatGemmStateName(vulkan::CoopmatGemmState::kUnavailable));
  return std::string(CoopmatGemmStateName(vulkan::CoopmatGemmStateOf(**dev)));
}
#endif

nlohmann::ordered_json CpuJson() {
  return {{"name", "cpu"}, {"type", "cpu"},
          {"threads", std::max(1u, std::thread::hardware_concurrency())},
          {"memory_domain", "host"}};
}

}  // namespace

int RunDevices(bool json) {
  nlohmann::ordered_json out;
  out["devices"] = nlohmann::ordered_json::array({CpuJson()});
  std::string vulkan_error;
#if ARBITER_HAS_VULKAN
  Result<std::vector<vulkan::VulkanDeviceInfo>> list = vulkan::ListVulkanDevices();
  if (!list.ok()) {
    vulkan_error = list.status().message();
  } else if (list->empty()) {
    vulkan_error =
        "the Vulkan loader finds no device: install a driver (mesa-vulkan-drivers, or the GPU "
        "vendor's) or check VK_DRIVER_FILES";
  } else {
    Result<int> chosen = vulkan::ResolveVulkanDevice("vulkan", *list);
    for (const vulkan::VulkanDeviceInfo& d : *list) {
      nlohmann::ordered_json heaps = nlohmann::ordered_json::array();
      for (const vulkan::VulkanHeapInfo& h : d.heaps) {
        nlohmann::ordered_json j = {{"size_bytes", h.size_bytes}, {"device_local", h.device_local}};
        if (h.budget_bytes) j["budget_bytes"] = *h.budget_bytes;
        if (h.usage_bytes) j["usage_bytes"] = *h.usage_bytes;
        heaps.push_back(j);
      }
      const vulkan::VulkanHeapInfo& w = d.heaps[static_cast<size_t>(d.weight_heap)];
      nlohmann::ordered_json j = {
          {"name", d.domain()},
          {"device_name", d.name},
          {"type", d.type},
          {"default", chosen.ok() && *chosen == d.index},
          {"driver", d.driver},
          {"driver_info", d.driver_info},
          {"api_version", d.api_version},
          {"vendor_id", d.vendor_id},
          {"device_id", d.device_id},
          {"memory_domain", d.domain()},
          {"unified_memory", d.unified_memory},
          {"heap_bytes", w.size_bytes},
          {"budget_bytes", w.budget_bytes ? nlohmann::ordered_json(*w.budget_bytes) : nullptr},
          {"usage_bytes", w.usage_bytes ? nlohmann::ordered_json(*w.usage_bytes) : nullptr},
          {"memory_budget_extension", d.memory_budget},
          {"heaps", heaps},
          {"fp16", d.fp16},
          {"storage_16bit", d.storage16},
          {"int64", d.int64},
          {"buffer_device_address", d.buffer_device_address},
          {"subgroup_size", d.subgroup_size},
          {"cooperative_matrix", d.cooperative_matrix_nv},
          {"cooperative_matrix_shape", d.cooperative_matrix_shape},
          {"cooperative_matrix_gemm", CoopmatGemmReport(d)},
          {"transfer_queue", d.transfer_queue},
          {"external_memory_host", d.external_memory_host},
          {"max_allocation_bytes", d.max_allocation_bytes},
          {"max_storage_buffer_range", d.max_storage_buffer_range},
          {"usable", d.usable}};
      if (!d.usable) j["unusable_reason"] = d.unusable_reason;
      if (!d.cooperative_matrix_gemm_possible) {
        j["cooperative_matrix_gemm_reason"] = d.cooperative_matrix_gemm_reason;
      }
      out["devices"].push_back(j);
    }
  }
#else
  vulkan_error = "this build has no Vulkan device (ARBITER_VULKAN=OFF)";
#endif
  out["vulkan"] = vulkan_error.empty()
                      ? nlohmann::ordered_json{{"available", true}}
                      : nlohmann::ordered_json{{"available", false}, {"error", vulkan_error}};
  if (json) {
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  for (const auto& d : out["devices"]) {
    if (d["name"] == "cpu") {
      std::cout << fmt::format("cpu        cpu             {} threads, memory domain host\n",
                               d["threads"].get<unsigned>());
      continue;
    }
    std::string budget = d["budget_bytes"].is_null()
                             ? "no budget report"
                             : "budget " + FormatSize(d["budget_bytes"].get<uint64_t>());
    std::cout << fmt::format(
        "{:<10} {:<15} {}{} — {} {}; heap {}, {}; fp16 {}, subgroup {}, cooperative matrix {} "
        "(GEMM {}){}\n",
        d["name"].get<std::string>(), d["type"].get<std::string>(),
        d["device_name"].get<std::string>(), d["default"].get<bool>() ? " (default)" : "",
        d["driver"].get<std::string>(), d["api_version"].get<std::string>(),
        FormatSize(d["heap_bytes"].get<uint64_t>()), budget, d["fp16"].get<bool>() ? "yes" : "no",
        d["subgroup_size"].get<unsigned>(), d["cooperative_matrix"].get<bool>() ? "yes" : "no",
        d["cooperative_matrix_gemm"].get<std::string>(),
        d["usable"].get<bool>() ? "" : " — not usable: " + d["unusable_reason"].get<std::string>());
  }
  if (!vulkan_error.empty()) std::cout << "vulkan     none            " << vulkan_error << "\n";
  return 0;
}

}  // namespace arbiter::tools
