// engine/internal/cpu_compute.h — the "cpu" compute device: the Decoder of
// forward.h behind the compute seam (compute_backend.h). A slot is a
// KvCache and a ForwardScratch in host memory (the `host` ledger domain);
// the weights are views of a lease's buffers, which must be
// host-addressable (a cpu arena).
//
// Thread safety: as DecoderCompute (compute_backend.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/internal/compute_backend.h"
#include "engine/internal/forward.h"

namespace arbiter::engine_internal {

// Checks that `lease` can back `layout` on the CPU: one tensor per compute
// buffer, all host-addressable. Errors: kFailedPrecondition naming the key
// and what to do.
Status CheckWeightLease(const WeightLease& lease, const ComputeLayout& layout,
                        const std::string& key);

class CpuDecoderCompute final : public DecoderCompute {
 public:
  // REQUIRES: spec as MakeDecoderCompute requires, spec.device "cpu".
  explicit CpuDecoderCompute(const ComputeSpec& spec);

  // One slot's bytes under `spec` (KvCache::BytesFor, ForwardScratch::BytesFor).
  static SlotFootprint FootprintFor(const ComputeSpec& spec);

  std::string_view device() const override { return "cpu"; }
  std::string_view memory_domain() const override { return "host"; }
  const ModelDims& dims() const override { return decoder_.dims(); }
  GgmlType kv_type() const override { return kv_type_; }
  int n_ctx() const override { return decoder_.n_ctx(); }
  SlotFootprint slot_footprint() const override { return footprint_; }

  Result<std::unique_ptr<ComputeSlot>> CreateSlot() override;
  Result<std::unique_ptr<ComputeWeights>> BindWeights(const WeightLease& lease,
                                                      const std::string& key) const override;

  Status Prefill(const ComputeWeights& w, ComputeSlot& slot, const int32_t* tokens, int n,
                 int pos, const ForwardOutputs& out) override;
  Status Decode(const ComputeWeights& w, ComputeSlot& slot, int32_t token, int pos,
                float* logits) override;

  void CopyKv(const ComputeSlot& src, ComputeSlot& dst, int begin, int end) override;
  void ReadKv(const ComputeSlot& slot, int n, uint8_t* out) override;
  void WriteKv(ComputeSlot& slot, int n, const uint8_t* in) override;
  Status VisitKv(const ComputeSlot& slot, KvRowsView rows,
                 const std::function<Status(const KvRowsView&)>& visit) override;

  // A split's host part (spec.end_layer < n_layers; Note [Partial offload]
  // in split_compute.cc): one chunk of nt ≤ spec.batch tokens through the
  // embedding and layers [0, end_layer), their residual stream into `x`
  // [nt, hidden]. REQUIRES: as Prefill.
  void ForwardHidden(const ComputeWeights& w, ComputeSlot& slot, const int32_t* tokens, int nt,
                     int pos, float* x);

  // The CPU forward pass itself (tests and benchmarks read its shapes).
  const Decoder& decoder() const { return decoder_; }

 private:
  std::shared_ptr<const ComputeLayout> layout_;
  Decoder decoder_;
  GgmlType kv_type_;
  int batch_;
  // A split's host part: the layout buffers its lease holds, in order
  // (SplitBuffersOf(...).host); empty when it runs the whole model.
  std::vector<size_t> lease_buffers_;
  SlotFootprint footprint_;
};

}  // namespace arbiter::engine_internal
