// engine/internal/split_compute.h — partial offload: a model's forward
// pass split between the CPU and a Vulkan device, behind the compute seam
// (compute_backend.h; Note [Partial offload] in split_compute.cc).
//
// Thread safety: as DecoderCompute.
#pragma once

#include <memory>

#include "engine/internal/compute_backend.h"

namespace arbiter::engine_internal {

// One slot's bytes under `spec`, a split (FirstDeviceLayer(spec) > 0): both
// parts', the host part's also in host_kv_bytes / host_scratch_bytes.
SlotFootprint SplitSlotFootprint(const ComputeSpec& spec);

// The forward pass of `spec` with layers [0, FirstDeviceLayer(spec)) on
// the CPU and the rest, the final norm and the output projection on
// spec.device. REQUIRES: FirstDeviceLayer(spec) > 0. Errors:
// MakeVulkanDecoderCompute's (kv_type other than f16, the device's).
Result<std::unique_ptr<DecoderCompute>> MakeSplitDecoderCompute(const ComputeSpec& spec);

}  // namespace arbiter::engine_internal
