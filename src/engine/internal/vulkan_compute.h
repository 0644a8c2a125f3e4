// engine/internal/vulkan_compute.h — the "vulkan" compute device: the
// decoder's forward pass as compute shaders (src/vulkan/shaders/) behind the
// compute seam (compute_backend.h). Built when ARBITER_VULKAN is ON.
//
// Note [The Vulkan forward pass]
// Weights: a lease of a WeightCache whose arena is a VulkanDeviceBackend on
// the same device; kernels read the buffers where the lease's block lies, by
// device address. A slot holds, in device memory, the f16 KV cache
// ([n_layers][K, V][n_ctx][kv_dim]) and the activations of one token
// (x, xn, qkv, attention out, gate/up, scores [n_heads, n_ctx]); in
// host-visible memory the step buffer (token, pos: written by the host
// before each submission) and the outputs (logits [vocab], the final-normed
// hidden state [hidden]).
// One token's whole forward pass is one command buffer, recorded once per
// slot and weights placement and replayed for every step: what changes per
// token (token id, position) is read from the step buffer by the kernels, so
// a decode step is one submission and one wait. Two variants are recorded:
// with the lm_head (decode, a prefill's last token) and without (earlier
// prefill tokens, embeddings).
// Prefill runs its tokens one by one through the same command buffer (no
// GEMM yet), which is correct for any length and slow for long prompts.
// KV is f16 on the device (kv_type f16 only); ReadKv/WriteKv/VisitKv move
// rows in kv_snapshot.h's host layout through staging buffers, so a KV
// file written by a Vulkan model restores into a CPU model and back.
//
// Thread safety: as DecoderCompute.
#pragma once

#include <memory>

#include "engine/internal/compute_backend.h"

namespace arbiter::engine_internal {

// Whether this build has the Vulkan device.
bool VulkanComputeBuilt();

// One slot's bytes under `spec` on a Vulkan device (no device is opened).
SlotFootprint VulkanSlotFootprint(const ComputeSpec& spec);

// A weight arena of `heap_bytes` on `device` ("vulkan", "vulkan:N"): a
// VulkanDeviceBackend for an engine's private WeightCache.
// Errors: the device's when it cannot be opened.
Result<std::unique_ptr<DeviceBackend>> MakeVulkanWeightArena(std::string_view device,
                                                             uint64_t heap_bytes);

// The forward pass of `spec` on spec.device ("vulkan", "vulkan:N").
// Errors: kInvalidArgument for a kv_type other than f16 (names the key) or
// a weight type the kernels do not read; the device's (kUnavailable,
// kNotFound, kFailedPrecondition) when it cannot be opened.
Result<std::unique_ptr<DecoderCompute>> MakeVulkanDecoderCompute(const ComputeSpec& spec);

}  // namespace arbiter::engine_internal
