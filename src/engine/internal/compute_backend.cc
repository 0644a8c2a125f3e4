// engine/internal/compute_backend.cc — the compute devices this build has,
// and the one place that picks an implementation for a model's device.
//
// Note [The compute seam]
// The engine splits at the forward pass. Below the seam (DecoderCompute,
// one implementation per device): the kernels, the KV cache and activation
// scratch of every slot — allocated from the device, so a GPU model's KV
// lives in VRAM — and the views of the leased weights as the device reads
// them. Above it, on the host and device-independent: the slot scheduler
// and prefix reuse (engine.cc decides which rows to copy; the device copies
// them), sampling and logit adjustments, grammar masks, tokenizers, text
// streaming, and everything in kv/ and runtime/. What crosses the seam is
// small and host-shaped: token ids in; logits [vocab] (or [n, vocab], or the
// summed hidden state) out to host floats, once per prefill or decode step;
// KV in and out in kv_snapshot.h's host layout only when a slot is saved,
// visited or restored. Because that layout is the interchange format, a KV
// file written by one device restores into another model of the same
// weights and kv_type on any device.
// Memory: a slot's bytes (SlotFootprint) are the engine's kv_bytes() and
// scratch_bytes(), charged by the runtime to the ledger as kv_slot and
// scratch; DecoderCompute::memory_domain() names the domain they belong to
// ("host" for the CPU) and is the one place that says so.
// Granularity: one virtual call per prefill (chunked inside) or decode
// step, none per layer or element (docs/BENCHMARKS.md "The compute seam"
// has the CPU's decode speed before and after).
#include "engine/internal/compute_backend.h"

#include "engine/internal/cpu_compute.h"
#include "engine/internal/split_compute.h"
#include "engine/internal/vulkan_compute.h"

namespace arbiter::engine_internal {

bool IsVulkanComputeDevice(std::string_view device) {
  if (device == "vulkan") return true;
  if (device.substr(0, 7) != "vulkan:" || device.size() == 7 || device.size() > 10) return false;
  return device.substr(7).find_first_not_of("0123456789") == std::string_view::npos;
}

Status CheckComputeDevice(std::string_view device) {
  if (device == "cpu") return OkStatus();
  if (IsVulkanComputeDevice(device)) {
    if (VulkanComputeBuilt()) return OkStatus();
    return InvalidArgumentError("compute device \"" + std::string(device) +
                                "\": this build has no Vulkan device (configure with "
                                "ARBITER_VULKAN=ON after scripts/install-deps.sh); use \"cpu\"");
  }
  return InvalidArgumentError("compute device \"" + std::string(device.substr(0, 256)) +
                              "\" is not one this build has; use \"cpu\", \"vulkan\" or "
                              "\"vulkan:N\"");
}

int FirstDeviceLayer(const ComputeSpec& spec) {
  const int n = spec.layout->dims.n_layers;
  if (!IsVulkanComputeDevice(spec.device) || spec.device_layers <= 0 || spec.device_layers >= n) {
    return 0;
  }
  return n - spec.device_layers;
}

SplitBuffers SplitBuffersOf(const ComputeLayout& layout, int first_device_layer) {
  std::vector<bool> dev(layout.buffers.size(), false), host(layout.buffers.size(), false);
  auto mark = [](std::vector<bool>& v, int b) {
    if (b >= 0) v[static_cast<size_t>(b)] = true;
  };
  auto mark_matrix = [&](std::vector<bool>& v, const MatrixBuffers& m) {
    for (int k = 0; k < m.n; ++k) mark(v, m.buffer[static_cast<size_t>(k)]);
  };
  mark_matrix(host, layout.embed);
  for (size_t l = 0; l < layout.layers.size(); ++l) {
    std::vector<bool>& v = static_cast<int>(l) < first_device_layer ? host : dev;
    const LayerBuffers& lb = layout.layers[l];
    for (int b : {lb.attn_norm, lb.bqkv, lb.q_norm, lb.k_norm, lb.ffn_norm}) mark(v, b);
    for (const MatrixBuffers* m : {&lb.wqkv, &lb.wo, &lb.w_gate_up, &lb.w_down}) {
      mark_matrix(v, *m);
    }
  }
  mark(dev, layout.final_norm);
  mark_matrix(dev, layout.lm_head.n > 0 ? layout.lm_head : layout.embed);
  SplitBuffers out;
  for (size_t i = 0; i < layout.buffers.size(); ++i) {
    if (dev[i]) out.device.push_back(i);
    if (host[i]) out.host.push_back(i);
  }
  return out;
}

Result<SlotFootprint> SlotFootprintFor(const ComputeSpec& spec) {
  ARBITER_RETURN_IF_ERROR(CheckComputeDevice(spec.device));
  if (FirstDeviceLayer(spec) > 0) return SplitSlotFootprint(spec);
  if (IsVulkanComputeDevice(spec.device) && spec.device_layers == 0) {
    ComputeSpec cpu = spec;
    cpu.device = "cpu";
    return CpuDecoderCompute::FootprintFor(cpu);
  }
  if (IsVulkanComputeDevice(spec.device)) return VulkanSlotFootprint(spec);
  return CpuDecoderCompute::FootprintFor(spec);
}

Result<std::unique_ptr<DecoderCompute>> MakeDecoderCompute(const ComputeSpec& spec) {
  ARBITER_RETURN_IF_ERROR(CheckComputeDevice(spec.device));
  if (FirstDeviceLayer(spec) > 0) return MakeSplitDecoderCompute(spec);
  if (IsVulkanComputeDevice(spec.device) && spec.device_layers != 0) {
    return MakeVulkanDecoderCompute(spec);
  }
  ComputeSpec cpu = spec;
  cpu.device = "cpu";
  return std::unique_ptr<DecoderCompute>(std::make_unique<CpuDecoderCompute>(cpu));
}

}  // namespace arbiter::engine_internal
