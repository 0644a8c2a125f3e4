// engine/internal/cpu_compute.cc — the "cpu" compute device (cpu_compute.h).
//
// Slots and weights are the CPU's own types behind the seam's handles:
// CpuSlot holds the KvCache and ForwardScratch a slot always had, CpuWeights
// the ModelWeights views of a lease. A handle passed in was made by this
// object (the seam's REQUIRES), so the downcasts below are static. Every
// call forwards to the Decoder of forward.h unchanged: one virtual call per
// prefill chunk list or decode step, none per layer or element.
#include "engine/internal/cpu_compute.h"

#include <algorithm>
#include <new>

namespace arbiter::engine_internal {
namespace {

class CpuSlot final : public ComputeSlot {
 public:
  CpuSlot(const ModelDims& d, int n_layers, int n_ctx, int batch, bool typed, GgmlType kv_type,
          size_t kv_bytes_per_token)
      : kv(n_layers, n_ctx, d.kv_dim, kv_type),
        scratch(d, batch, n_ctx, typed, kv_type),
        kv_bytes_per_token_(kv_bytes_per_token) {}
  SlotFootprint footprint() const override {
    return {kv.bytes(), scratch.bytes(), kv_bytes_per_token_};
  }

  KvCache kv;
  ForwardScratch scratch;

 private:
  size_t kv_bytes_per_token_;
};

class CpuWeights final : public ComputeWeights {
 public:
  explicit CpuWeights(ModelWeights weights) : w(std::move(weights)) {}
  ModelWeights w;
};

CpuSlot& Slot(ComputeSlot& s) { return static_cast<CpuSlot&>(s); }
const CpuSlot& Slot(const ComputeSlot& s) { return static_cast<const CpuSlot&>(s); }
const ModelWeights& Weights(const ComputeWeights& w) {
  return static_cast<const CpuWeights&>(w).w;
}

}  // namespace

Status CheckWeightLease(const WeightLease& lease, const ComputeLayout& layout,
                        const std::string& key) {
  if (lease.size() != layout.buffers.size()) {
    return FailedPreconditionError(
        "weights '" + key + "' have " + std::to_string(lease.size()) +
        " tensors but the model's compute layout has " + std::to_string(layout.buffers.size()) +
        "; register the key with Engine::WeightModelFor of this model");
  }
  for (size_t i = 0; i < lease.size(); ++i) {
    if (lease.tensor(i) == nullptr) {
      return FailedPreconditionError(
          "weights '" + key + "' are in a device arena the CPU engine cannot read (tensor " +
          layout.buffers[i].name + " has no host address); give the engine a cpu arena");
    }
  }
  return OkStatus();
}

CpuDecoderCompute::CpuDecoderCompute(const ComputeSpec& spec)
    : layout_(spec.layout),
      decoder_(spec.layout->config, spec.layout->has_lm_head, spec.n_ctx,
               std::max(1, spec.n_threads), spec.end_layer),
      kv_type_(spec.kv_type),
      batch_(spec.batch),
      footprint_(FootprintFor(spec)) {
  if (decoder_.end_layer() < decoder_.dims().n_layers) {
    lease_buffers_ = SplitBuffersOf(*layout_, decoder_.end_layer()).host;
  }
}

SlotFootprint CpuDecoderCompute::FootprintFor(const ComputeSpec& spec) {
  const ModelDims& d = spec.layout->dims;
  const int n_layers =
      spec.end_layer < 0 ? d.n_layers : std::min(spec.end_layer, d.n_layers);
  SlotFootprint f;
  f.kv_bytes = KvCache::BytesFor(n_layers, spec.n_ctx, d.kv_dim, spec.kv_type);
  f.scratch_bytes =
      ForwardScratch::BytesFor(d, spec.batch, spec.n_ctx, spec.layout->typed(), spec.kv_type);
  f.kv_bytes_per_token = size_t{2} * n_layers * KvRowBytes(spec.kv_type, d.kv_dim);
  return f;
}

Result<std::unique_ptr<ComputeSlot>> CpuDecoderCompute::CreateSlot() {
  try {
    return std::unique_ptr<ComputeSlot>(std::make_unique<CpuSlot>(
        decoder_.dims(), decoder_.end_layer(), decoder_.n_ctx(), batch_, layout_->typed(), kv_type_,
        footprint_.kv_bytes_per_token));
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError("out of memory allocating a KV slot (" +
                                  std::to_string(footprint_.bytes()) + " bytes of KV and scratch)");
  }
}

Result<std::unique_ptr<ComputeWeights>> CpuDecoderCompute::BindWeights(
    const WeightLease& lease, const std::string& key) const {
  if (!lease_buffers_.empty()) {
    // A split's host part: the lease holds lease_buffers_, in order; the
    // device's buffers stay unbound (null views this part never reads).
    if (lease.size() != lease_buffers_.size()) {
      return FailedPreconditionError("weights '" + key + "' have " + std::to_string(lease.size()) +
                                     " tensors but the host part of the split model has " +
                                     std::to_string(lease_buffers_.size()) +
                                     "; register the key with Engine::HostWeightModelFor");
    }
    std::vector<const void*> arrays(layout_->buffers.size(), nullptr);
    for (size_t i = 0; i < lease_buffers_.size(); ++i) {
      if (lease.tensor(i) == nullptr) {
        return FailedPreconditionError("weights '" + key +
                                       "' are in a device arena the CPU engine cannot read; "
                                       "register the host part with a cpu arena");
      }
      arrays[lease_buffers_[i]] = lease.tensor(i);
    }
    return std::unique_ptr<ComputeWeights>(
        std::make_unique<CpuWeights>(BindModelWeights(*layout_, arrays)));
  }
  ARBITER_RETURN_IF_ERROR(CheckWeightLease(lease, *layout_, key));
  return std::unique_ptr<ComputeWeights>(
      std::make_unique<CpuWeights>(BindModelWeights(*layout_, lease.tensors())));
}

Status CpuDecoderCompute::Prefill(const ComputeWeights& w, ComputeSlot& slot,
                                  const int32_t* tokens, int n, int pos,
                                  const ForwardOutputs& out) {
  CpuSlot& s = Slot(slot);
  decoder_.Forward(Weights(w), s.kv, s.scratch, tokens, n, pos, out);
  return OkStatus();
}

void CpuDecoderCompute::ForwardHidden(const ComputeWeights& w, ComputeSlot& slot,
                                      const int32_t* tokens, int nt, int pos, float* x) {
  CpuSlot& s = Slot(slot);
  decoder_.ForwardHidden(Weights(w), s.kv, s.scratch, tokens, nt, pos, x);
}

Status CpuDecoderCompute::Decode(const ComputeWeights& w, ComputeSlot& slot, int32_t token,
                                 int pos, float* logits) {
  CpuSlot& s = Slot(slot);
  decoder_.Forward(Weights(w), s.kv, s.scratch, &token, 1, pos,
                   ForwardOutputs{.last_logits = logits});
  return OkStatus();
}

void CpuDecoderCompute::CopyKv(const ComputeSlot& src, ComputeSlot& dst, int begin, int end) {
  Slot(dst).kv.CopyRowsFrom(Slot(src).kv, begin, end);
}

void CpuDecoderCompute::ReadKv(const ComputeSlot& slot, int n, uint8_t* out) {
  Slot(slot).kv.ReadRows(n, out);
}

void CpuDecoderCompute::WriteKv(ComputeSlot& slot, int n, const uint8_t* in) {
  Slot(slot).kv.WriteRows(n, in);
}

Status CpuDecoderCompute::VisitKv(const ComputeSlot& slot, KvRowsView rows,
                                  const std::function<Status(const KvRowsView&)>& visit) {
  // Host memory: the views are the slot's own rows, no copy.
  const KvCache& kv = Slot(slot).kv;
  rows.k.clear();
  rows.v.clear();
  for (int l = 0; l < kv.n_layers(); ++l) {
    rows.k.push_back(kv.k(l));
    rows.v.push_back(kv.v(l));
  }
  return visit(rows);
}

}  // namespace arbiter::engine_internal
