// engine/internal/engine_impl.h — the Engine implementation, visible to the
// engine's own tests (the public surface is arbiter/engine/engine.h).
//
// Compute. The forward pass, the slots' KV caches and their scratch are the
// model's compute device's (a DecoderCompute, compute_backend.h: Note [The
// compute seam]); this file and engine.cc only schedule slots, sample and
// stream, and call the seam. The CPU device is the only one today.
//
// Slots. Each of the n_slots slots owns a ComputeSlot (its KV cache [n_layers,
// 2, n_ctx, kv_dim] and activation scratch, on the device). Under mu_, SlotMeta says whether the slot is
// busy (a SlotReservation holds it), how many Generates read it as a copy
// source, how many pinned callers wait for it, whether its content is
// owned, when it was last filled, and — while free — `tokens`: the ids
// whose K/V are in its cache, positions [0, tokens.size()). A call holds its
// slot through a SlotReservation (engine.h) for its whole duration:
//   - Reserve, under mu_, takes the slot PickSlotLocked chooses (Note [Slot
//     choice] in engine.cc: the one place a slot is chosen), moving
//     `tokens` into the reservation; when nothing fits it waits on
//     slot_freed_ (Note [Slot waits]: no polling unless the caller only has
//     a predicate);
//   - outside the lock, the holder computes in the slot's buffers (only the
//     holder touches them) and keeps the reservation's tokens up to date;
//   - ReleaseReserved, under mu_, publishes the tokens, the owned flag and
//     last_used, and wakes every waiter (waiters may want different slots).
//     A slot released empty counts as never used (last_used 0), so it is
//     taken first.
// Prefix reuse keeps at least one prompt token to recompute so the last
// position's logits exist: cached = min(lcp, prompt.size() − 1).
//
// Note [Prefix copy between slots]. K/V row p depends only on tokens [0, p]
// and the weights, so a prefix computed in one slot is valid in any other.
// When Generate starts on its reserved slot (own prefix `own` = min(lcp,
// prompt − 1)), BeginCopy finds, under mu_, the non-busy slot with the
// longest common prefix `src` (capped the same way). If src > own, it
// counts the caller as a reader of that slot (readers++: no reservation can
// take it, so nothing writes its buffers, but other copies may read it too)
// and Generate, outside the lock, copies K/V rows [own, src) of every layer
// into its own slot (rows below `own` are already identical), then drops
// the reader under mu_ and wakes waiters. Only prompt[src, n) is computed.
// Busy slots are never sources (their rows are being written). Nothing is
// allocated and no lock is taken again when there is nothing to copy. The
// copy happens before the WeightLease: it needs no weights, and a reader is
// never held across a weight reload.
//
// SaveSlot / VisitSlot / RestoreSlot / ClearSlot run within a reservation
// like any call, but take no WeightLease: they only copy between the slot's
// ComputeSlot and a snapshot (or forget its tokens).
//
// Weights. The engine owns no weight memory: every call, once it holds its
// slot, takes a WeightLease on `weight_key` for its whole duration
// (AcquireWeights) and computes from views of the leased buffers. Between
// calls the cache may evict them; the next call reloads them. The slot comes
// first so a caller waiting for a slot does not pin weights; the lease is
// dropped before the slot, and a weight error leaves the slot's cached
// tokens untouched (nothing was computed). In private mode
// (EngineOptions::weight_cache null) the engine owns the cache and its cpu
// arena (WeightSource), destroyed cache first.
//
// Thread safety: thread-safe (see engine.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "arbiter/base/mutex.h"
#include "arbiter/engine/engine.h"
#include "arbiter/engine/model_files.h"
#include "arbiter/memory/device_backend.h"
#include "arbiter/weights/weight_cache.h"
#include "engine/internal/compute_backend.h"
#include "engine/internal/model_weights.h"

namespace arbiter::engine_internal {

class EngineImpl;

// How often waiters went to sleep and woke for a slot (Note [Slot waits]);
// a test hook that shows waits are not polled.
struct SlotWaitStats {
  uint64_t sleeps = 0;   // condition-variable waits begun
  uint64_t wakeups = 0;  // waits returned (signal, deadline, poll step or spurious)
  int waiting = 0;       // callers inside ReserveSlot's wait now
};

// Where an engine's weights live. `owned_device` / `owned_cache` are set in
// private mode only (members destroyed in reverse order: the cache before
// its device).
struct WeightSource {
  std::unique_ptr<DeviceBackend> owned_device;
  std::unique_ptr<WeightCache> owned_cache;
  WeightCache* cache = nullptr;  // owned_cache.get() or EngineOptions::weight_cache
  std::string key;
  // A split model's host part (Note [Partial offload] in split_compute.cc);
  // null / empty otherwise. Owned in private mode, as above.
  std::unique_ptr<DeviceBackend> owned_host_device;
  std::unique_ptr<WeightCache> owned_host_cache;
  WeightCache* host_cache = nullptr;
  std::string host_key;
};

class EngineImpl final : public Engine {
 public:
  // `n_ctx`: tokens per slot (already clamped). REQUIRES: options validated;
  // `compute` made for the files' layout, n_ctx and options; `slots`
  // [options.n_slots] made by `compute`; `weights.key` registered in
  // weights.cache with the layout's specs; files opened with a tokenizer.
  EngineImpl(std::shared_ptr<const ModelFiles> files, std::unique_ptr<DecoderCompute> compute,
             std::vector<std::unique_ptr<ComputeSlot>> slots, WeightSource weights,
             const EngineOptions& options, int n_ctx);
  ~EngineImpl() override;

  const ModelConfig& config() const override { return layout_->config; }
  const Tokenizer& tokenizer() const override { return *tokenizer_; }
  Result<ChatTemplateKind> chat_template() const override;
  int n_ctx() const override { return n_ctx_; }
  int n_slots() const override { return static_cast<int>(slot_states_.size()); }
  std::string_view device() const override { return compute_->device(); }
  std::string_view memory_domain() const override { return compute_->memory_domain(); }
  int device_layers() const override { return compute_->device_layers(); }
  size_t weight_bytes() const override { return layout_->bytes(); }
  size_t kv_bytes() const override;
  GgmlType kv_type() const override { return options_.kv_type; }
  size_t scratch_bytes() const override;
  size_t host_kv_bytes() const override {
    return slot_states_.size() * compute_->slot_footprint().host_kv_bytes;
  }
  size_t host_scratch_bytes() const override {
    return slot_states_.size() * compute_->slot_footprint().host_scratch_bytes;
  }

  std::vector<SlotInfo> Slots() const override EXCLUDES(mu_);
  std::vector<int32_t> SlotTokens(int slot) const override EXCLUDES(mu_);
  Result<SlotReservation> ReserveSlot(const SlotRequest& request,
                                      std::chrono::steady_clock::time_point deadline,
                                      const Cancellation& cancel) override EXCLUDES(mu_);

  Result<KvSnapshot> SaveSlot(const SlotReservation& slot) override;
  Result<KvSnapshot> SaveSlot(int slot, const Cancellation& cancelled) override EXCLUDES(mu_);
  Status VisitSlot(const SlotReservation& slot,
                   const std::function<Status(const KvRowsView&)>& visit) override;
  Status VisitSlot(int slot, const std::function<Status(const KvRowsView&)>& visit,
                   const Cancellation& cancelled) override EXCLUDES(mu_);
  Result<int> RestoreSlot(SlotReservation& slot, const KvSnapshotView& snapshot) override;
  Result<int> RestoreSlot(int slot, const KvSnapshot& snapshot,
                          const Cancellation& cancelled) override EXCLUDES(mu_);
  Result<int> RestoreSlot(int slot, const KvSnapshotView& view,
                          const Cancellation& cancelled) override EXCLUDES(mu_);
  Status ClearSlot(SlotReservation& slot) override;
  Status ClearSlot(int slot, const Cancellation& cancelled) override EXCLUDES(mu_);

  Result<GenerationResult> Generate(SlotReservation& slot, const GenerationRequest& request,
                                    const TextCallback& on_text,
                                    const Cancellation& cancel) override EXCLUDES(mu_);
  Result<GenerationResult> Generate(const GenerationRequest& request, const TextCallback& on_text,
                                    const Cancellation& cancelled) override EXCLUDES(mu_);
  Result<std::vector<float>> Embed(const std::vector<int32_t>& ids,
                                   const Cancellation& cancelled) override EXCLUDES(mu_);
  Result<std::vector<float>> ComputeLogits(const std::vector<int32_t>& ids) override
      EXCLUDES(mu_);

  // --- for tests and the bench
  // Logits [vocab] of the last of `ids`, computed the way Generate does:
  // ids[0, n_prefill) as one prefill call (chunked by prefill_batch), then
  // every further id as its own single-token decode step. Starts from an
  // empty KV state. REQUIRES: 1 ≤ n_prefill ≤ ids.size() ≤ n_ctx.
  // Errors: as ComputeLogits, and the weight-acquire errors of engine.h.
  Result<std::vector<float>> IncrementalLogits(const std::vector<int32_t>& ids, int n_prefill)
      EXCLUDES(mu_);
  // Token ids that end generation (config eos + end-of-turn specials).
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  // The forward pass (the model's compute device).
  const DecoderCompute& decoder() const { return *compute_; }
  // The compute buffers the engine reads (ComputeLayout::bytes() = weight_bytes()).
  const ComputeLayout& layout() const { return *layout_; }
  // The files the engine was loaded from.
  const ModelFiles& files() const { return *files_; }
  // The cache and key the weights are leased from (private mode: the
  // engine's own cache and "engine").
  WeightCache& weight_cache() const { return *weights_.cache; }
  const std::string& weight_key() const { return weights_.key; }
  SlotWaitStats slot_wait_stats() const EXCLUDES(mu_);

 private:
  // One call's weights: the lease that pins them and views of them.
  struct LeasedWeights {
    WeightLease lease;
    WeightLease host_lease;  // a split model's host part
    std::unique_ptr<ComputeWeights> w;  // views of the lease's buffers: destroyed first
  };

  // Another free slot a Generate copies its prompt's prefix from (Note
  // [Prefix copy between slots]); the caller is counted in its `readers`
  // until EndCopy(index).
  struct CopySource {
    int index = -1;       // -1: nothing to copy
    size_t n_tokens = 0;  // its common prefix with the prompt, ≤ prompt.size() − 1
  };

  // Reserves a slot (engine.h ReserveSlot; Note [Slot waits]); `what`
  // names the call in error messages. REQUIRES: pinned in [-1, n_slots).
  Result<SlotReservation> Reserve(int pinned, std::span<const int32_t> prompt,
                                  std::chrono::steady_clock::time_point deadline,
                                  const Cancellation& cancel, const std::string& what)
      EXCLUDES(mu_);
  // Note [Slot choice]: the slot a caller gets now, or -1 when it must wait.
  int PickSlotLocked(int pinned, std::span<const int32_t> prompt) const REQUIRES(mu_);
  void ReleaseReserved(int slot, std::vector<int32_t> tokens, bool owned, bool filled) override
      EXCLUDES(mu_);
  // Finds a copy source for `prompt` other than `self` whose capped common
  // prefix beats `own` and registers the caller as its reader.
  CopySource BeginCopy(int self, const std::vector<int32_t>& prompt, size_t own) EXCLUDES(mu_);
  // Drops a reader BeginCopy registered on slot `index`.
  void EndCopy(int index) EXCLUDES(mu_);
  // kInvalidArgument unless 0 ≤ slot < n_slots; `what` names the call.
  Status CheckSlot(int slot, const char* what) const;
  // kFailedPrecondition unless `r` is held and this engine's.
  Status CheckHeld(const SlotReservation& r, const char* what) const;
  // RestoreSlot's checks of `snapshot` against this model (engine.h).
  Status CheckSnapshot(const KvSnapshotView& snapshot, int slot) const;
  // Generate's checks of `request` (engine.h), slot range included.
  Status CheckRequest(const GenerationRequest& request) const;
  // Acquires the weights for one call (see the file comment). Errors: the
  // cache's Acquire errors as is; DecoderCompute::BindWeights'.
  Result<LeasedWeights> AcquireWeights() const;
  // kInvalidArgument for an empty sequence, an id outside [0, vocab), or
  // more than `limit` ids.
  Status CheckIds(const std::vector<int32_t>& ids, int limit, const char* what) const;
  bool IsEos(int32_t id) const;
  ComputeSlot& state(const SlotReservation& r) { return *slot_states_[r.slot()]; }

  WeightSource weights_;  // first: destroyed last
  std::shared_ptr<const ModelFiles> files_;
  std::shared_ptr<const Tokenizer> tokenizer_;    // files_'s
  std::shared_ptr<const ComputeLayout> layout_;   // files_'s
  std::unique_ptr<DecoderCompute> compute_;
  EngineOptions options_;
  int n_ctx_;
  std::vector<int32_t> eos_ids_;
  // Touched only by the thread holding the slot's reservation (and read by
  // a copy's reader); fixed after construction; destroyed before compute_.
  std::vector<std::unique_ptr<ComputeSlot>> slot_states_;

  struct SlotMeta {
    bool busy = false;        // reserved
    bool owned = false;       // the last holder's SlotReservation::owned()
    int readers = 0;          // Generates copying from it (never while busy)
    int pinned_waiters = 0;   // pinned callers waiting for it
    uint64_t last_used = 0;   // use_counter_ at the last filling release; 0: never / emptied
    std::vector<int32_t> tokens;  // ids whose K/V are in the slot; empty while busy
  };
  mutable Mutex mu_;
  CondVar slot_freed_{&mu_};
  std::vector<SlotMeta> slots_ GUARDED_BY(mu_);
  uint64_t use_counter_ GUARDED_BY(mu_) = 0;
  SlotWaitStats wait_stats_ GUARDED_BY(mu_);
};

}  // namespace arbiter::engine_internal
