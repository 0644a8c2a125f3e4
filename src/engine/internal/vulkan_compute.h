// engine/internal/vulkan_compute.h — the "vulkan" compute device: the
// decoder's forward pass as compute shaders (src/vulkan/shaders/) behind the
// compute seam (compute_backend.h). Built when ARBITER_VULKAN is ON.
//
// Note [The Vulkan forward pass]
// Weights: a lease of a WeightCache whose arena is a VulkanDeviceBackend on
// the same device; kernels read the buffers where the lease's block lies, by
// device address. A slot holds, in device memory, the f16 KV cache
// ([n_layers][K, V][n_ctx][kv_dim]) and the activations of one prefill chunk
// of spec.batch rows (x, xn, qkv, attention out, gate/up, silu·up; decode
// uses row 0) plus the decode attention's split partials; in host-visible
// memory the step area (the first position, then the chunk's token ids:
// written by the host before each submission) and the outputs (logits
// [vocab] of one row, the final-normed hidden rows [batch, hidden]).
// Decode: one token's whole forward pass is one command buffer, recorded
// once per slot and weights placement and replayed for every step: what
// changes per token (token id, position) is read from the step area by the
// kernels, so a decode step is one submission and one wait. Its projections
// are matvecs (matvec.comp) with each RMSNorm folded into the projection
// after it and silu·up into the down projection's loads; its attention
// splits the context over several workgroups per head, the last of them
// combining the splits (attention.comp), so that few heads still fill the
// device.
// Prefill: a chunk of up to spec.batch tokens is one submission, recorded
// for the chunk (a few hundred dispatches: cheap next to the chunk's work):
// the same kernels over m rows, the projections as GEMMs (gemm.comp), RoPE
// and the KV write for m positions before a causal attention of m query
// rows (row i sees positions [0, pos + i], online softmax, no score
// matrix). Logits: only the last row's (matvec) unless every row's are
// asked for, then a GEMM into a readback buffer of one chunk's rows made
// for that call (chunks then shrink to keep it within 64 MiB). hidden_sum
// adds every row's final-normed state on the host.
// KV is f16 on the device (kv_type f16 only); ReadKv/WriteKv/VisitKv move
// rows in kv_snapshot.h's host layout through staging buffers, so a KV
// file written by a Vulkan model restores into a CPU model and back.
//
// Note [Vulkan profiling]
// ARBITER_VULKAN_PROFILE=1 in the environment (any value but "0"; a number
// N > 1 also logs every N decode steps) makes every recorded pass write a
// timestamp before its first dispatch and after each dispatch's barrier
// (a query pool per slot, two halves: decode, prefill). After each
// submission the deltas (masked to the queue's timestampValidBits, scaled
// by timestampPeriod) are added per kernel name (the shader, and for
// projections what it computes: "matvec_f16 qkv+norm"); the totals per
// kernel, per submission and per token are logged with spdlog at warn level
// when the compute is destroyed (so `arbiter bench decode` prints them).
// The segments of one projection (q, k, v) run without barriers between
// them, so their time falls to whichever ends later; everything else is
// separated by barriers. A device whose compute queue has no timestamps is
// not profiled (a warning says so). Off, nothing is recorded.
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
