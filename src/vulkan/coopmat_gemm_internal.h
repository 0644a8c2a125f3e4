// vulkan/coopmat_gemm_internal.h — the device-description half of the
// cooperative-matrix GEMM (Note [Cooperative-matrix GEMM] in
// arbiter/vulkan/coopmat_gemm.h), called by vulkan_device.cc.
#pragma once

#include <volk.h>

#include "arbiter/vulkan/vulkan_device.h"

namespace arbiter::vulkan {

// Fills info's cooperative_matrix_feature, cooperative_matrix_shape,
// cooperative_matrix_gemm_possible and cooperative_matrix_gemm_reason from
// the driver's reports. REQUIRES: info's extension flags (cooperative_matrix_nv),
// fp16, vulkan_memory_model, subgroup_size and max_shared_memory_bytes are
// filled. Reads ARBITER_VULKAN_COOPMAT.
void DescribeCooperativeMatrix(VkPhysicalDevice pd, VulkanDeviceInfo& info);

}  // namespace arbiter::vulkan
