// engine/internal/compute_backend.h — the compute seam: the decoder's
// forward pass and the per-sequence state it reads and writes, behind an
// interface with one implementation per compute device (Note [The compute
// seam] in compute_backend.cc).
//
// A `DecoderCompute` is one loaded model's forward pass on one device. It
// makes `ComputeSlot`s — one sequence's KV cache and activation scratch,
// allocated from the device — and `ComputeWeights` — one call's view of the
// weights a WeightLease pins, as the device addresses them. Prefill and
// Decode run tokens through a slot; their results (logits, the mean hidden
// state) come back to host float buffers (ForwardOutputs). KV moves in and
// out of a slot in the device-independent host layout of
// arbiter/engine/kv_snapshot.h, so a snapshot or KV file written from one
// device restores into another.
//
// Everything above the seam — the slot scheduler, sampling, logit
// adjustments, grammar masks, tokenizers — runs on the host and sees only
// this interface (engine.cc); a device implementation never sees them.
//
// Which rows of a slot are valid is the caller's book (the slot's token
// list, engine_impl.h): Prefill/Decode at `pos` append rows [pos, pos + n)
// and make later rows stale; truncating a slot is forgetting rows, and the
// next call at a smaller `pos` overwrites them. A slot never needs clearing.
//
// Usage (what EngineImpl does):
//   ComputeSpec spec{.device = "cpu", .layout = layout, .n_ctx = 2048, ...};
//   ARBITER_ASSIGN_OR_RETURN(std::unique_ptr<DecoderCompute> c, MakeDecoderCompute(spec));
//   ARBITER_ASSIGN_OR_RETURN(std::unique_ptr<ComputeSlot> slot, c->CreateSlot());
//   ARBITER_ASSIGN_OR_RETURN(std::unique_ptr<ComputeWeights> w, c->BindWeights(lease));
//   std::vector<float> logits(c->dims().vocab);
//   c->Prefill(*w, *slot, ids.data(), n, 0, {.last_logits = logits.data()});
//   c->Decode(*w, *slot, next_id, n, logits.data());
//
// Thread safety: a DecoderCompute is thread-safe: calls on different slots
// run concurrently. A ComputeSlot is thread-compatible: one thread at a time
// (the holder of its reservation), and a slot read as a copy source is not
// written meanwhile. ComputeWeights are immutable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "arbiter/base/status.h"
#include "arbiter/engine/kv_snapshot.h"
#include "arbiter/weights/weight_cache.h"
#include "engine/internal/model_weights.h"

namespace arbiter::engine_internal {

// The compute device of an engine that names none.
inline constexpr std::string_view kDefaultComputeDevice = "cpu";

// Where a forward pass writes its results, in host memory; any may be null.
struct ForwardOutputs {
  float* last_logits = nullptr;  // [vocab]: logits of token n − 1
  float* all_logits = nullptr;   // [n, vocab]: logits of every token, row-major
  double* hidden_sum = nullptr;  // [hidden]: += final-normed hidden state of every token
};

// What a DecoderCompute is made for.
struct ComputeSpec {
  std::string device = std::string(kDefaultComputeDevice);  // "cpu"
  std::shared_ptr<const ComputeLayout> layout;  // the model's shapes and weight buffers
  int n_ctx = 0;        // positions per slot, ≥ 2
  int batch = 0;        // tokens per prefill chunk, in [1, n_ctx]
  int n_threads = 1;    // the device's worker threads (cpu: decode's MatVecPool), ≥ 1
  GgmlType kv_type = kDefaultKvType;  // IsKvType; KvRowBytes(kv_type, head_dim) > 0
  // Partial offload (Note [Partial offload] in split_compute.cc): on a
  // Vulkan device, how many of the last layers run there (with the final
  // norm and the output projection); the others run on the CPU. −1 or ≥
  // n_layers: every layer on the device; 0: none (the model runs on the
  // CPU). Ignored on "cpu".
  int device_layers = -1;
  // Set only by a split for its two parts: this compute runs layers
  // [first_layer, end_layer) (end_layer −1: n_layers) and holds their KV
  // only. first_layer > 0: its input is the residual stream entering that
  // layer (HiddenInputCompute); end_layer < n_layers: its output is the
  // residual stream leaving end_layer − 1 (no final norm, no logits).
  int first_layer = 0;
  int end_layer = -1;
};

// The layers a device of a split model runs, [first, n_layers): first =
// n_layers − spec.device_layers when 0 < device_layers < n_layers, else 0
// (the whole model on spec.device).
int FirstDeviceLayer(const ComputeSpec& spec);

// Which of `layout`'s buffers each part of a split at `first_device_layer`
// reads (ascending indices): the device the layers [first, n_layers), the
// final norm and the output projection; the host the embedding and layers
// [0, first). A tied model's embedding is in both (the host looks tokens
// up in it, the device computes the logits from it).
// REQUIRES: 0 < first_device_layer < n_layers.
struct SplitBuffers {
  std::vector<size_t> device, host;
};
SplitBuffers SplitBuffersOf(const ComputeLayout& layout, int first_device_layer);

// One slot's memory on the device, in bytes: what its owner charges to the
// ledger (kv_slot and scratch), in the device's memory domain.
struct SlotFootprint {
  size_t kv_bytes = 0;       // the KV cache: n_layers · 2 · n_ctx rows
  size_t scratch_bytes = 0;  // activations and work buffers
  size_t kv_bytes_per_token = 0;  // n_layers · 2 · KvRowBytes(kv_type, kv_dim)
  // A split's host part (Note [Partial offload]), included in the figures
  // above: the CPU layers' KV and their scratch, in the `host` domain.
  size_t host_kv_bytes = 0;
  size_t host_scratch_bytes = 0;
  size_t bytes() const { return kv_bytes + scratch_bytes; }
};

// One sequence's KV cache and activation scratch on a device. Made by
// DecoderCompute::CreateSlot and used only with the DecoderCompute that made
// it; destroying it gives the memory back to the device.
class ComputeSlot {
 public:
  virtual ~ComputeSlot() = default;
  // The bytes it holds (= the maker's SlotFootprint).
  virtual SlotFootprint footprint() const = 0;
};

// One call's weights as the device computes from them: made by
// DecoderCompute::BindWeights from a WeightLease, valid while that lease is
// alive, used only with the DecoderCompute that made it.
class ComputeWeights {
 public:
  virtual ~ComputeWeights() = default;
};

class DecoderCompute {
 public:
  virtual ~DecoderCompute() = default;

  // The device it computes on ("cpu").
  virtual std::string_view device() const = 0;
  // The ledger domain its slots' memory is charged to ("host" for cpu).
  virtual std::string_view memory_domain() const = 0;
  virtual const ModelDims& dims() const = 0;
  virtual GgmlType kv_type() const = 0;
  virtual int n_ctx() const = 0;
  // The bytes every slot it makes holds.
  virtual SlotFootprint slot_footprint() const = 0;
  // Partial offload: the layers that run on device() ([n_layers −
  // device_layers(), n_layers)); the others run on the CPU, their KV and
  // scratch in host memory (SlotFootprint::host_bytes). n_layers when the
  // whole model runs on device().
  virtual int device_layers() const { return dims().n_layers; }
  // Whether BindWeights takes two leases (a split: its device part, then
  // its host part) rather than one.
  virtual bool split() const { return false; }

  // --- slots and weights
  // A new slot (contents undefined: no valid rows). Errors:
  // kResourceExhausted when the device has no memory for it.
  virtual Result<std::unique_ptr<ComputeSlot>> CreateSlot() = 0;
  // Views of `lease`'s buffers for one call. Errors: kFailedPrecondition
  // when the lease does not hold this model's compute layout or holds it
  // where this device cannot read it (naming `key` and what to do).
  virtual Result<std::unique_ptr<ComputeWeights>> BindWeights(const WeightLease& lease,
                                                              const std::string& key) const = 0;
  // A split's weights: `device` holds SplitBuffersOf(...).device in that
  // order, `host` the host part (registered as `key` and its host key).
  // Errors: as BindWeights; kFailedPrecondition on a compute that is not
  // split().
  virtual Result<std::unique_ptr<ComputeWeights>> BindWeights(const WeightLease& device,
                                                              const WeightLease& host,
                                                              const std::string& key) const {
    (void)device;
    (void)host;
    return FailedPreconditionError("weights '" + key + "': the model is not split between " +
                                   "devices; bind one lease");
  }

  // --- the forward pass
  // Runs `tokens` [n] at positions [pos, pos + n), appending their K/V rows
  // to `slot` (in chunks of the spec's batch), and writes `out`.
  // REQUIRES: n ≥ 1; pos + n ≤ n_ctx(); every token in [0, vocab); rows
  // [0, pos) of `slot` hold this sequence's K/V (same weights); logits
  // outputs require the layout's has_lm_head. Errors: the device's
  // (unavailable, device lost); never for the CPU.
  virtual Status Prefill(const ComputeWeights& w, ComputeSlot& slot, const int32_t* tokens, int n,
                         int pos, const ForwardOutputs& out) = 0;
  // One decode step: `token` at `pos`, its logits [vocab] into `logits`.
  // REQUIRES: as Prefill with n = 1 and has_lm_head.
  virtual Status Decode(const ComputeWeights& w, ComputeSlot& slot, int32_t token, int pos,
                        float* logits) = 0;

  // --- KV in and out (the host layout of kv_snapshot.h)
  // Copies K and V rows [begin, end) of every layer from `src` into `dst`.
  // REQUIRES: both this device's; &src != &dst; 0 ≤ begin ≤ end ≤ n_ctx().
  virtual void CopyKv(const ComputeSlot& src, ComputeSlot& dst, int begin, int end) = 0;
  // Rows [0, n) of every layer into `out`, laid out as KvSnapshot::kv
  // ([n_layers, 2, n] rows of KvRowBytes(kv_type, kv_dim)). REQUIRES: 0 ≤ n
  // ≤ n_ctx(); `out` holds n_layers · 2 · n rows.
  virtual void ReadKv(const ComputeSlot& slot, int n, uint8_t* out) = 0;
  // The inverse of ReadKv: rows [0, n) of every layer from `in`.
  virtual void WriteKv(ComputeSlot& slot, int n, const uint8_t* in) = 0;
  // Calls `visit` once with `rows` completed by host views of rows [0,
  // rows.n_tokens) of every layer (in place where the device's memory is
  // the host's, else staged), and returns its status. REQUIRES:
  // rows.n_tokens ≤ n_ctx(); rows' n_layers, kv_dim and kv_type are this
  // model's.
  virtual Status VisitKv(const ComputeSlot& slot, KvRowsView rows,
                         const std::function<Status(const KvRowsView&)>& visit) = 0;
};

// A compute that runs a split's device part (ComputeSpec::first_layer >
// 0): its input is the residual stream [n, hidden] entering first_layer,
// computed on the host, instead of token ids (Prefill and Decode are not
// used on it).
class HiddenInputCompute : public DecoderCompute {
 public:
  // As Prefill, with rows `x` [n, hidden] for the tokens at [pos, pos + n).
  virtual Status PrefillHidden(const ComputeWeights& w, ComputeSlot& slot, const float* x, int n,
                               int pos, const ForwardOutputs& out) = 0;
  // As Decode, with the row `x` [hidden] for the token at `pos`.
  virtual Status DecodeHidden(const ComputeWeights& w, ComputeSlot& slot, const float* x, int pos,
                              float* logits) = 0;
};

// Whether `device` is "vulkan" or "vulkan:N" (built or not).
bool IsVulkanComputeDevice(std::string_view device);

// kOk when `device` names a compute device this build has; else
// kInvalidArgument naming it and the devices there are.
Status CheckComputeDevice(std::string_view device);

// What one slot of `spec` will hold, without making anything.
// Errors: CheckComputeDevice's.
Result<SlotFootprint> SlotFootprintFor(const ComputeSpec& spec);

// The forward pass of spec.layout on spec.device (the one place that picks
// an implementation). REQUIRES: spec's fields as documented. Errors:
// CheckComputeDevice's; the device's when it cannot be opened.
Result<std::unique_ptr<DecoderCompute>> MakeDecoderCompute(const ComputeSpec& spec);

}  // namespace arbiter::engine_internal
