// engine/internal/split_compute.cc — partial offload (split_compute.h).
//
// Note [Partial offload]
// A model whose weights do not fit its device's budget runs its last N
// layers there and the first L − N on the CPU (llama.cpp's n_gpu_layers,
// counted from the output end): the output projection — the largest
// single matrix, read once per token — and the final norm always go with
// the device part, because the logits are what comes back anyway. The
// split is a DecoderCompute of two: a CpuDecoderCompute whose Decoder
// stops after layer L − N − 1 (ComputeSpec::end_layer) and a Vulkan compute
// that starts at layer L − N from the residual stream instead of token ids
// (ComputeSpec::first_layer, HiddenInputCompute). What crosses between
// them per chunk of spec.batch tokens (or per decode step) is that
// residual stream, [m, hidden] floats host → device, once; the logits (or
// the final-normed rows for embeddings) come back as for a device model.
// Each part keeps the KV of its own layers: the CPU layers' in host
// slots (the `host` domain: SlotFootprint::host_*), the device layers' on
// the device. In the host layout of kv_snapshot.h ([n_layers, 2, n] rows)
// the CPU layers are a prefix and the device layers the rest, so ReadKv /
// WriteKv put each part's rows at its offset and VisitKv joins the two
// parts' row views: snapshots and KV files do not depend on the split (a
// snapshot of a split model restores into a CPU or a whole-device model of
// the same weights, and back). Both parts keep KV in f16 (the device's
// type), so the rows are the same bytes.
// Weights: the device part's buffers (SplitBuffersOf(...).device) and the
// host part's are two WeightCache registrations — the model's key in the
// device's cache and its host key in the host's — each charged to its own
// domain; a call leases both (EngineImpl::AcquireWeights) and binds them
// with the two-lease BindWeights. A tied model's embedding is in both.
#include "engine/internal/split_compute.h"

#include <algorithm>
#include <new>
#include <vector>

#include "engine/internal/cpu_compute.h"
#include "engine/internal/vulkan_compute.h"

namespace arbiter::engine_internal {
namespace {

class SplitSlot final : public ComputeSlot {
 public:
  SlotFootprint footprint() const override { return fp; }
  std::unique_ptr<ComputeSlot> host, dev;
  std::vector<float> x;  // [batch, hidden]: the residual stream handed host → device
  SlotFootprint fp;
};

class SplitWeights final : public ComputeWeights {
 public:
  std::unique_ptr<ComputeWeights> host, dev;
};

SplitSlot& Slot(ComputeSlot& s) { return static_cast<SplitSlot&>(s); }
const SplitSlot& Slot(const ComputeSlot& s) { return static_cast<const SplitSlot&>(s); }
const SplitWeights& Weights(const ComputeWeights& w) {
  return static_cast<const SplitWeights&>(w);
}

ComputeSpec HostSpec(const ComputeSpec& spec, int first) {
  ComputeSpec h = spec;
  h.device = "cpu";
  h.device_layers = -1;
  h.end_layer = first;
  return h;
}

ComputeSpec DeviceSpec(const ComputeSpec& spec, int first) {
  ComputeSpec d = spec;
  d.device_layers = -1;
  d.first_layer = first;
  return d;
}

class SplitDecoderCompute final : public DecoderCompute {
 public:
  SplitDecoderCompute(const ComputeSpec& spec, int first, std::unique_ptr<CpuDecoderCompute> host,
                      std::unique_ptr<DecoderCompute> dev)
      : first_(first), batch_(spec.batch), host_(std::move(host)), dev_owner_(std::move(dev)),
        dev_(static_cast<HiddenInputCompute*>(dev_owner_.get())),
        footprint_(SplitSlotFootprint(spec)) {}

  std::string_view device() const override { return dev_->device(); }
  std::string_view memory_domain() const override { return dev_->memory_domain(); }
  const ModelDims& dims() const override { return dev_->dims(); }
  GgmlType kv_type() const override { return dev_->kv_type(); }
  int n_ctx() const override { return dev_->n_ctx(); }
  SlotFootprint slot_footprint() const override { return footprint_; }
  int device_layers() const override { return dims().n_layers - first_; }
  bool split() const override { return true; }

  Result<std::unique_ptr<ComputeSlot>> CreateSlot() override {
    auto slot = std::make_unique<SplitSlot>();
    slot->fp = footprint_;
    ARBITER_ASSIGN_OR_RETURN(slot->host, host_->CreateSlot());
    ARBITER_ASSIGN_OR_RETURN(slot->dev, dev_->CreateSlot());
    try {
      slot->x.resize(size_t{1} * batch_ * dims().hidden);
    } catch (const std::bad_alloc&) {
      return ResourceExhaustedError("out of memory allocating a split slot's hidden rows");
    }
    return std::unique_ptr<ComputeSlot>(std::move(slot));
  }

  Result<std::unique_ptr<ComputeWeights>> BindWeights(const WeightLease&,
                                                      const std::string& key) const override {
    return FailedPreconditionError("weights '" + key + "': the model is split between " +
                                   std::string(device()) +
                                   " and the CPU; bind its device and host leases");
  }
  Result<std::unique_ptr<ComputeWeights>> BindWeights(const WeightLease& device,
                                                      const WeightLease& host,
                                                      const std::string& key) const override {
    auto w = std::make_unique<SplitWeights>();
    ARBITER_ASSIGN_OR_RETURN(w->dev, dev_->BindWeights(device, key));
    ARBITER_ASSIGN_OR_RETURN(w->host, host_->BindWeights(host, key));
    return std::unique_ptr<ComputeWeights>(std::move(w));
  }

  Status Prefill(const ComputeWeights& w, ComputeSlot& slot, const int32_t* tokens, int n,
                 int pos, const ForwardOutputs& out) override {
    SplitSlot& s = Slot(slot);
    const SplitWeights& sw = Weights(w);
    const size_t vocab = static_cast<size_t>(dims().vocab);
    for (int c0 = 0; c0 < n; c0 += batch_) {
      const int m = std::min(batch_, n - c0);
      host_->ForwardHidden(*sw.host, *s.host, tokens + c0, m, pos + c0, s.x.data());
      ForwardOutputs o;
      o.hidden_sum = out.hidden_sum;
      if (out.all_logits != nullptr) o.all_logits = out.all_logits + size_t{1} * c0 * vocab;
      if (c0 + m == n) o.last_logits = out.last_logits;
      ARBITER_RETURN_IF_ERROR(dev_->PrefillHidden(*sw.dev, *s.dev, s.x.data(), m, pos + c0, o));
    }
    return OkStatus();
  }

  Status Decode(const ComputeWeights& w, ComputeSlot& slot, int32_t token, int pos,
                float* logits) override {
    SplitSlot& s = Slot(slot);
    const SplitWeights& sw = Weights(w);
    host_->ForwardHidden(*sw.host, *s.host, &token, 1, pos, s.x.data());
    return dev_->DecodeHidden(*sw.dev, *s.dev, s.x.data(), pos, logits);
  }

  void CopyKv(const ComputeSlot& src, ComputeSlot& dst, int begin, int end) override {
    host_->CopyKv(*Slot(src).host, *Slot(dst).host, begin, end);
    dev_->CopyKv(*Slot(src).dev, *Slot(dst).dev, begin, end);
  }

  // The host layout's [n_layers, 2, n] rows: the CPU layers first.
  void ReadKv(const ComputeSlot& slot, int n, uint8_t* out) override {
    host_->ReadKv(*Slot(slot).host, n, out);
    dev_->ReadKv(*Slot(slot).dev, n, out + HostKvBytes(n));
  }
  void WriteKv(ComputeSlot& slot, int n, const uint8_t* in) override {
    host_->WriteKv(*Slot(slot).host, n, in);
    dev_->WriteKv(*Slot(slot).dev, n, in + HostKvBytes(n));
  }
  Status VisitKv(const ComputeSlot& slot, KvRowsView rows,
                 const std::function<Status(const KvRowsView&)>& visit) override {
    const SplitSlot& s = Slot(slot);
    return host_->VisitKv(*s.host, rows, [&](const KvRowsView& a) -> Status {
      return dev_->VisitKv(*s.dev, rows, [&](const KvRowsView& b) -> Status {
        KvRowsView all = rows;
        all.k = a.k;
        all.v = a.v;
        all.k.insert(all.k.end(), b.k.begin(), b.k.end());
        all.v.insert(all.v.end(), b.v.begin(), b.v.end());
        all.n_layers = static_cast<uint32_t>(dims().n_layers);
        return visit(all);
      });
    });
  }

 private:
  // Bytes of the CPU layers' rows [0, n) in the host layout.
  size_t HostKvBytes(int n) const {
    return size_t{2} * first_ * static_cast<size_t>(n) * KvRowBytes(kv_type(), dims().kv_dim);
  }

  const int first_;  // layers [0, first_) on the CPU
  const int batch_;
  const std::unique_ptr<CpuDecoderCompute> host_;
  const std::unique_ptr<DecoderCompute> dev_owner_;
  HiddenInputCompute* const dev_;  // dev_owner_
  const SlotFootprint footprint_;
};

}  // namespace

SlotFootprint SplitSlotFootprint(const ComputeSpec& spec) {
  const int first = FirstDeviceLayer(spec);
  const SlotFootprint h = CpuDecoderCompute::FootprintFor(HostSpec(spec, first));
  const SlotFootprint d = VulkanSlotFootprint(DeviceSpec(spec, first));
  const size_t x_bytes = size_t{4} * spec.batch * spec.layout->dims.hidden;
  SlotFootprint f;
  f.kv_bytes = h.kv_bytes + d.kv_bytes;
  f.scratch_bytes = h.scratch_bytes + x_bytes + d.scratch_bytes;
  f.kv_bytes_per_token = h.kv_bytes_per_token + d.kv_bytes_per_token;
  f.host_kv_bytes = h.kv_bytes;
  f.host_scratch_bytes = h.scratch_bytes + x_bytes;
  return f;
}

Result<std::unique_ptr<DecoderCompute>> MakeSplitDecoderCompute(const ComputeSpec& spec) {
  const int first = FirstDeviceLayer(spec);
  ARBITER_ASSIGN_OR_RETURN(std::unique_ptr<DecoderCompute> dev,
                           MakeVulkanDecoderCompute(DeviceSpec(spec, first)));
  if (dynamic_cast<HiddenInputCompute*>(dev.get()) == nullptr) {
    return InternalError("device \"" + spec.device + "\" cannot run part of a model");
  }
  auto host = std::make_unique<CpuDecoderCompute>(HostSpec(spec, first));
  return std::unique_ptr<DecoderCompute>(
      std::make_unique<SplitDecoderCompute>(spec, first, std::move(host), std::move(dev)));
}

}  // namespace arbiter::engine_internal
