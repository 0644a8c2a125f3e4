// engine/internal/engine_impl.h — the Engine implementation, visible to the
// engine's own tests (the public surface is arbiter/engine/engine.h).
//
// Slots. Each of the n_slots slots owns a KvCache [n_layers, 2, n_ctx,
// kv_dim] and a ForwardScratch, and remembers `tokens`: the ids whose K/V
// are in its cache, positions [0, tokens.size()). A call leases one slot
// (SlotLease, RAII) for its whole duration:
//   - under mu_, take the requested slot: a pinned call (slot ≥ 0:
//     GenerationRequest::slot, SaveSlot, RestoreSlot, ClearSlot) exactly its
//     slot; an unpinned one, among free slots, the one whose `tokens` share
//     the longest common prefix with the new prompt (ties: least recently
//     used). A slot is free when not busy, not being read as a copy source
//     (readers == 0), and, for unpinned calls, without pinned waiters (a
//     pinned call that has to wait reserves its slot, so unpinned traffic
//     cannot starve it or overwrite the prefix it came for). If nothing fits,
//     wait on slot_freed_ in 50 ms steps, polling the caller's CancelFn
//     between waits, outside the lock;
//   - outside the lock, the holder runs the forward pass on the slot's
//     buffers (only the holder writes them) and tracks the fed tokens;
//   - on release, under mu_, `tokens` becomes what is in the KV now and every
//     waiter is woken (waiters may want different slots). A slot released
//     empty counts as never used (last_used 0), so it is taken first.
// Prefix reuse keeps at least one prompt token to recompute so the last
// position's logits exist: cached = min(lcp, prompt.size() − 1).
//
// Note [Prefix copy between slots]. K/V row p depends only on tokens [0, p]
// and the weights, so a prefix computed in one slot is valid in any other.
// In the same pass under mu_ that leases Generate's slot (own prefix
// `own` = min(lcp, prompt − 1)), AcquireSlot also finds the other non-busy
// slot with the longest common prefix `src` (capped the same way). If
// src > own, it counts the caller as a reader of that slot (readers++: no
// lease can take it, so nothing writes its buffers, but other copies may
// read it too) and Generate, outside the lock, copies K/V rows [own, src) of
// every layer into its own slot (rows below `own` are already identical),
// then drops the reader under mu_ and wakes waiters. Only prompt[src, n) is
// computed. Busy slots are never sources (their rows are being written).
// Nothing is allocated and no lock is taken again when there is nothing to
// copy. The copy happens before the WeightLease: it needs no weights, and a
// reader is never held across a weight reload.
//
// SaveSlot / RestoreSlot / ClearSlot take a pinned lease like any call, but
// no WeightLease: they only copy between the slot's KvCache and a KvSnapshot
// (or forget its tokens).
//
// Weights. The engine owns no weight memory: every call, once it holds its
// slot, takes a WeightLease on `weight_key` for its whole duration
// (AcquireWeights) and computes from views of the leased buffers. Between
// calls the cache may evict them; the next call reloads them. The slot comes
// first so a caller waiting for a slot does not pin weights; the lease is
// dropped before the slot (declared after it), and a weight error leaves the
// slot's cached tokens untouched (nothing was computed). In private mode
// (EngineOptions::weight_cache null) the engine owns the cache and its cpu
// arena (WeightSource), destroyed cache first.
//
// Thread safety: thread-safe (see engine.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "arbiter/base/mutex.h"
#include "arbiter/engine/engine.h"
#include "arbiter/memory/device_backend.h"
#include "arbiter/weights/weight_cache.h"
#include "engine/internal/forward.h"
#include "engine/internal/model_weights.h"

namespace arbiter::engine_internal {

class EngineImpl;

// A slot's heavy state; touched only by the thread holding its lease.
struct SlotState {
  KvCache kv;
  ForwardScratch scratch;
};

// Exclusive use of one slot. Move-only; the destructor publishes `fed` as
// the slot's cached tokens and frees the slot.
class SlotLease {
 public:
  SlotLease(EngineImpl* engine, int index, std::vector<int32_t> cached_prefix);
  SlotLease(SlotLease&& o) noexcept;
  SlotLease& operator=(SlotLease&&) = delete;
  SlotLease(const SlotLease&) = delete;
  SlotLease& operator=(const SlotLease&) = delete;
  ~SlotLease();

  int index() const { return index_; }
  SlotState& state();
  // Tokens whose K/V are in the slot, positions [0, fed().size()).
  std::vector<int32_t>& fed() { return fed_; }

 private:
  EngineImpl* engine_;
  int index_;
  std::vector<int32_t> fed_;
};

// Where an engine's weights live. `owned_device` / `owned_cache` are set in
// private mode only (members destroyed in reverse order: the cache before
// its device).
struct WeightSource {
  std::unique_ptr<DeviceBackend> owned_device;
  std::unique_ptr<WeightCache> owned_cache;
  WeightCache* cache = nullptr;  // owned_cache.get() or EngineOptions::weight_cache
  std::string key;
};

// Checks that `lease` can back `layout` on the CPU: one tensor per compute
// buffer, all host-addressable. Errors: kFailedPrecondition naming the key
// and what to do.
Status CheckWeightLease(const WeightLease& lease, const ComputeLayout& layout,
                        const std::string& key);

class EngineImpl final : public Engine {
 public:
  // `n_ctx`: tokens per slot (already clamped). REQUIRES: options validated;
  // `decoder` made for layout->config; `weights.key` registered in
  // weights.cache with `layout`'s specs.
  EngineImpl(std::unique_ptr<Tokenizer> tokenizer, std::shared_ptr<const ComputeLayout> layout,
             std::unique_ptr<Decoder> decoder, WeightSource weights, const EngineOptions& options,
             int n_ctx);
  ~EngineImpl() override;

  const ModelConfig& config() const override { return layout_->config; }
  const Tokenizer& tokenizer() const override { return *tokenizer_; }
  Result<ChatTemplateKind> chat_template() const override;
  int n_ctx() const override { return n_ctx_; }
  int n_slots() const override { return static_cast<int>(slot_states_.size()); }
  size_t weight_bytes() const override { return layout_->bytes(); }
  size_t kv_bytes() const override;
  size_t scratch_bytes() const override;

  std::vector<SlotInfo> Slots() const override EXCLUDES(mu_);
  std::vector<int32_t> SlotTokens(int slot) const override EXCLUDES(mu_);
  Result<KvSnapshot> SaveSlot(int slot, const CancelFn& cancelled) override;
  Status VisitSlot(int slot, const std::function<Status(const KvRowsView&)>& visit,
                   const CancelFn& cancelled) override;
  Result<int> RestoreSlot(int slot, const KvSnapshot& snapshot, const CancelFn& cancelled) override;
  Result<int> RestoreSlot(int slot, const KvSnapshotView& view, const CancelFn& cancelled) override;
  Status ClearSlot(int slot, const CancelFn& cancelled) override;

  Result<GenerationResult> Generate(const GenerationRequest& request, const TextCallback& on_text,
                                    const CancelFn& cancelled) override;
  Result<std::vector<float>> Embed(const std::vector<int32_t>& ids,
                                   const CancelFn& cancelled) override;
  Result<std::vector<float>> ComputeLogits(const std::vector<int32_t>& ids) override;

  // --- for tests and the bench
  // Logits [vocab] of the last of `ids`, computed the way Generate does:
  // ids[0, n_prefill) as one prefill call (chunked by prefill_batch), then
  // every further id as its own single-token decode step. Starts from an
  // empty KV state. REQUIRES: 1 ≤ n_prefill ≤ ids.size() ≤ n_ctx.
  // Errors: as ComputeLogits, and the weight-acquire errors of engine.h.
  Result<std::vector<float>> IncrementalLogits(const std::vector<int32_t>& ids, int n_prefill);
  // Token ids that end generation (config eos + end-of-turn specials).
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  const Decoder& decoder() const { return *decoder_; }
  // The compute buffers the engine reads (ComputeLayout::bytes() = weight_bytes()).
  const ComputeLayout& layout() const { return *layout_; }
  // The cache and key the weights are leased from (private mode: the
  // engine's own cache and "engine").
  WeightCache& weight_cache() const { return *weights_.cache; }
  const std::string& weight_key() const { return weights_.key; }

 private:
  friend class SlotLease;

  // One call's weights: the lease that pins them and views of them.
  struct LeasedWeights {
    WeightLease lease;
    ModelWeights w;
  };

  // Another free slot a Generate copies its prompt's prefix from (Note
  // [Prefix copy between slots]); the caller is counted in its `readers`
  // until EndCopy(index).
  struct CopySource {
    int index = -1;       // -1: nothing to copy
    size_t n_tokens = 0;  // its common prefix with the prompt, ≤ prompt.size() − 1
  };
  // What a call asks AcquireSlot for.
  struct SlotWant {
    // The call's token sequence. Unpinned calls pick the slot by it, and the
    // lease's fed() is cut to its common prefix with it. Null: fed() is the
    // slot's tokens whole (the slot APIs).
    const std::vector<int32_t>* prompt = nullptr;
    int pinned = -1;            // ≥ 0: exactly this slot
    bool touch = true;          // set the slot's last_used
    CopySource* copy = nullptr; // non-null: find a copy source (REQUIRES: prompt non-empty)
  };

  // Leases a slot as `want` says (see the file comment); std::nullopt when
  // `cancelled` fired while waiting (then no reader is registered).
  // REQUIRES: want.pinned in [-1, n_slots); want.pinned ≥ 0 or want.prompt.
  std::optional<SlotLease> AcquireSlot(const SlotWant& want, const CancelFn& cancelled)
      EXCLUDES(mu_);
  void ReleaseSlot(int index, std::vector<int32_t> fed) EXCLUDES(mu_);
  // Drops a reader AcquireSlot registered on slot `index` for a copy.
  void EndCopy(int index) EXCLUDES(mu_);
  // kInvalidArgument unless 0 ≤ slot < n_slots; `what` names the call.
  Status CheckSlot(int slot, const char* what) const;
  // RestoreSlot's checks of `snapshot` against this model (engine.h).
  Status CheckSnapshot(const KvSnapshotView& snapshot, int slot) const;
  // Acquires the weights for one call (see the file comment). Errors: the
  // cache's Acquire errors as is; CheckWeightLease's.
  Result<LeasedWeights> AcquireWeights() const;
  // kInvalidArgument for an empty sequence, an id outside [0, vocab), or
  // more than `limit` ids.
  Status CheckIds(const std::vector<int32_t>& ids, int limit, const char* what) const;
  bool IsEos(int32_t id) const;

  WeightSource weights_;  // first: destroyed last
  std::unique_ptr<Tokenizer> tokenizer_;
  std::shared_ptr<const ComputeLayout> layout_;
  std::unique_ptr<Decoder> decoder_;
  EngineOptions options_;
  int n_ctx_;
  std::vector<int32_t> eos_ids_;
  std::vector<std::unique_ptr<SlotState>> slot_states_;  // fixed after construction

  struct SlotMeta {
    bool busy = false;        // leased
    int readers = 0;          // Generates copying from it (never while busy)
    int pinned_waiters = 0;   // pinned calls waiting for it
    uint64_t last_used = 0;   // use_counter_ at the last touching lease; 0: never / emptied
    std::vector<int32_t> tokens;  // ids whose K/V are in the slot; empty while busy
  };
  mutable Mutex mu_;
  CondVar slot_freed_{&mu_};
  std::vector<SlotMeta> slots_ GUARDED_BY(mu_);
  uint64_t use_counter_ GUARDED_BY(mu_) = 0;
};

}  // namespace arbiter::engine_internal
