// arbiter/kv/precache.h — the KV precache of one text model: which
// conversation each slot holds, moving KV between the tiers (slot ↔ host
// prompt cache ↔ disk), prewarm and keep-alive.
//
// Implements docs/kv-precache.md (slots and conversations, tiers, prewarm
// and keep-alive, persistence; the reference is seed
// 001_abe7ad9154ed4078.txt), with the reference's defects fixed (the list in
// docs/kv-precache.md, "Defects of the reference, fixed"):
//
// Slots. The engine is the one slot scheduler (Engine::ReserveSlot; Note
// [Slot choice] and Note [Slot waits] in src/engine/engine.cc): the
// precache asks it for a SlotReservation and holds it for the whole
// request. A request with a conversation id is pinned to the slot the
// ConversationRegistry gives that conversation (the lowest-loaded one at
// open); every turn of it runs on that slot. A request without one gets the
// free slot whose cached tokens share the longest common prefix with its
// prompt (ties: a slot no conversation owns — nothing to stash — then the
// least recently used; the precache marks owned slots with
// SlotReservation::set_owned). One request runs on a slot at a time
// (reference: "generation on the same slot is serialized"): a request waits
// for its slot on the engine's condition variable until the slot frees,
// its deadline passes or it is cancelled (a CancelToken wakes it at once).
//
// Tiers. Before a request runs on slot s:
//   1. if s holds another conversation D's KV (D "owns" s), D's KV moves to
//      the host prompt cache (PromptCache::Put; what does not fit there is
//      spilled to the disk tier) — the slot keeps the tokens, so the longest
//      common prefix with the new prompt is still reused;
//   2. the request's conversation C (if any) is restored into s only when
//      the slot's state is colder (docs/kv-precache.md "Defects of the reference, fixed":
//      restore only when colder):
//      "warmth" is the number of prompt tokens a state can serve (its
//      longest common prefix with the prompt). C's prompt-cache entry is
//      taken when it is warmer than the slot; otherwise, when C has no
//      in-RAM state at all, C's file in the KvStore is mapped, validated and
//      restored in place (KvStore::LoadMapped: one copy, file → slot) — a
//      corrupt, truncated or foreign file is removed and costs a cold
//      prefill with a warning, never an error;
//   3. the engine runs the request on s, within the same reservation; it
//      copies a longer prefix from another free slot itself (Note [Prefix
//      copy between slots] in src/engine/internal/engine_impl.h).
// Afterwards C owns s. Steps 1–3 run while the reservation is held, so no
// other request can take s between the tier moves and the generation.
//
// Persisting (the disk tier, "<kv dir>/<model hash>/<safe id>.<class>.bin"):
// on Close (the conversation's class), on idle eviction (EvictIdle: .long),
// on the engine's unload (DetachEngine: every owned slot; prompt-cache
// entries stay in RAM and remain valid for the next engine of the same
// model hash) and on Shutdown (slots and this model's prompt-cache
// entries).
//
// Prewarm (docs/kv-precache.md "Prewarm and keep-alive"): prefills a
// conversation's stable prefix on its slot (max_tokens 1, greedy) and
// records {prefix tokens, touched} for it — per conversation, not per slot
// (docs/kv-precache.md "Defects of the reference, fixed": keep-alive per
// conversation).
// Best-effort: a failure is returned, never retried. KeepAlive re-warms
// every prewarmed conversation untouched for ≥ kKeepAliveStaleFraction ×
// ttl_short (the server calls it every [kv] keepalive_interval, which config
// validation keeps below 0.2 × ttl_short, so the re-warm lands before the
// short TTL runs out — docs/kv-precache.md "Defects of the reference, fixed":
// keep-alive before the short TTL).
//
// Thread safety: thread-safe. One internal mutex for the owner table and
// the conversations; slow work (engine calls, file IO) runs outside it
// while the slot is held (a SlotReservation).
// Lifetime: `store`, `prompt_cache` and `clock` must outlive it;
// an attached engine must be detached (DetachEngine) before it is destroyed.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "arbiter/base/cancel.h"
#include "arbiter/base/clock.h"
#include "arbiter/base/mutex.h"
#include "arbiter/base/status.h"
#include "arbiter/engine/engine.h"
#include "arbiter/kv/cache_key.h"
#include "arbiter/kv/conversation_registry.h"
#include "arbiter/kv/kv_store.h"
#include "arbiter/kv/prompt_cache.h"

namespace arbiter {

// The synthetic conversation a model's [[models]] system_prompt is
// prefilled on at load (docs/kv-precache.md "Prewarm and keep-alive").
inline constexpr const char* kSystemPrefixConversation = "__system_prefix__";

struct KvPrecacheOptions {
  std::string model_key;        // the model's name (prompt-cache and registry key)
  std::string model_hash;       // ModelHash of the model: its KvStore directory
  int n_slots = 1;              // the engine's slot count ([[models]] parallel)
  KvStore* store = nullptr;     // the disk tier; null = none
  PromptCache* prompt_cache = nullptr;  // the host tier; null = none
  TtlWindows ttl;
  int64_t conversation_ttl_ms = kDefaultConversationTtlMs;
  Clock* clock = nullptr;       // null → Clock::Real()
};

// Where a request's reused KV came from.
enum class KvSource {
  kNone,         // nothing reusable: cold prefill
  kSlot,         // the slot already held it (or the engine copied it from another slot)
  kPromptCache,  // restored from the host tier
  kDisk,         // restored from the disk tier
};
// "none" | "slot" | "prompt_cache" | "disk".
std::string_view KvSourceName(KvSource source);

// What a request's cache handling did (for usage, logs and metrics).
struct KvOutcome {
  int slot = -1;
  KvSource source = KvSource::kNone;
  // Tokens a restore put into the slot (docs/kv-precache.md "Defects of the
  // reference, fixed": restores report their tokens).
  int restored_tokens = 0;
  bool stashed = false;         // another conversation's KV moved to the host tier
  std::string warning;          // a corrupt / foreign file fell back to a cold prefill
};

// Counters since construction (monotonic).
struct KvPrecacheCounters {
  uint64_t requests = 0;
  uint64_t prompt_tokens = 0;
  uint64_t cached_tokens = 0;
  uint64_t copied_tokens = 0;       // of cached_tokens: copied from another slot
  uint64_t slot_hits = 0;           // requests served (partly) from their slot's KV
  uint64_t prompt_cache_hits = 0;   // restores from the host tier
  uint64_t disk_hits = 0;           // restores from the disk tier
  uint64_t restore_failures = 0;    // corrupt / foreign / unreadable files (cold prefill)
  uint64_t stashes = 0;             // slot → host tier moves
  uint64_t persisted = 0;           // files written (close, idle, unload, shutdown)
  uint64_t prewarms = 0;
  uint64_t prewarm_failures = 0;
  uint64_t keepalive_rewarms = 0;
};

// One slot, for GET /admin/kv.
struct KvSlotView {
  int index = 0;
  std::string conversation_id;  // "" = no owner
  int n_tokens = 0;
  bool busy = false;
};

// A prewarmed conversation's keep-alive state.
struct KvPrewarmView {
  std::string conversation_id;
  int prefix_tokens = 0;
  int64_t idle_ms = 0;  // since the last prewarm, keep-alive or request
};

class KvPrecache {
 public:
  // REQUIRES: n_slots ≥ 1, model_hash 16 chars.
  explicit KvPrecache(KvPrecacheOptions options);
  ~KvPrecache();
  KvPrecache(const KvPrecache&) = delete;
  KvPrecache& operator=(const KvPrecache&) = delete;

  // A new engine instance serves the model: its slots start empty, and
  // nobody owns them. Calling it again with the attached engine is a no-op.
  // REQUIRES: engine->n_slots() == options.n_slots.
  void AttachEngine(Engine* engine) EXCLUDES(mu_);
  // The engine is about to be destroyed: every slot a conversation owns is
  // saved to the disk tier (the conversation's class), then the slot table
  // is cleared. Waits for running requests on the engine's slots (there are
  // none when the arbiter frees it). No-op for an engine not attached.
  void DetachEngine(Engine* engine) EXCLUDES(mu_);

  // Runs `request` (its `slot` is overwritten) on `engine` for conversation
  // `conversation_id` ("" = none; then the slot with the longest match),
  // moving KV between the tiers as the file comment says. `ttl` is the
  // class the conversation's KV is saved with from now on. The result's
  // cached_tokens counts every prompt token not computed (restored, kept or
  // copied). `outcome` (may be null) receives what happened. Waiting for the
  // slot ends at `deadline` (steady clock) or when `cancelled` fires (a
  // CancelToken wakes the wait; a CancelFn is polled, see Cancellation);
  // cancelled while waiting → finish_reason kCancelled, no output, slot -1.
  // Errors: the engine's (ReserveSlot's kDeadlineExceeded included);
  // kInvalidArgument for a conversation id the registry refuses;
  // kFailedPrecondition when the engine has fewer slots than n_slots. A
  // failed restore is not an error (outcome->warning).
  Result<GenerationResult> Generate(
      Engine* engine, std::string_view conversation_id, TtlClass ttl, GenerationRequest request,
      const TextCallback& on_text, const Cancellation& cancelled, KvOutcome* outcome = nullptr,
      std::chrono::steady_clock::time_point deadline = kNoDeadline) EXCLUDES(mu_);

  // Prefills `prefix_ids` on the conversation's slot (max_tokens 1, greedy)
  // and records it for the keep-alive. Returns the request's result
  // (cached_tokens says how much was already warm). Errors: as Generate;
  // kInvalidArgument for an empty conversation id or prefix.
  Result<GenerationResult> Prewarm(Engine* engine, std::string_view conversation_id,
                                   std::vector<int32_t> prefix_ids, TtlClass ttl,
                                   const Cancellation& cancelled) EXCLUDES(mu_);

  // Re-warms every prewarmed conversation untouched for ≥
  // kKeepAliveStaleFraction × ttl_short (and used within conversation_ttl_ms,
  // or the system prefix) whose slot is free and not owned by
  // another conversation (a conversation parked in the host tier is not
  // pulled back: its prompt-cache entry and file get their TTL refreshed
  // instead). Returns how many were re-warmed. Failures are logged, counted
  // and not retried until the next pass.
  int KeepAlive(Engine* engine) EXCLUDES(mu_);

  // Persists the conversation (slot or prompt cache → disk, its class) and
  // closes it. Returns false when it was not open here and had no state.
  // `engine` may be null (model not loaded: only the host tier is saved).
  bool Close(Engine* engine, std::string_view conversation_id) EXCLUDES(mu_);
  // Closes the conversations idle past conversation_ttl_ms, persisting each
  // one's KV as .long (docs/kv-precache.md "Persistence"). Returns their
  // ids. Idle means no request and no explicit prewarm: the keep-alive's
  // re-warms do not count (the keep-alive stops re-warming a conversation
  // idle that long), so an abandoned prewarmed conversation is closed like
  // any other — "__system_prefix__" excepted.
  std::vector<std::string> EvictIdle(Engine* engine) EXCLUDES(mu_);
  // Persists every owned slot and every prompt-cache entry of this model.
  void Shutdown(Engine* engine) EXCLUDES(mu_);

  const std::string& model_key() const { return options_.model_key; }
  const std::string& model_hash() const { return options_.model_hash; }
  std::vector<KvSlotView> Slots() const EXCLUDES(mu_);
  std::vector<KvPrewarmView> Prewarmed() const EXCLUDES(mu_);
  // The model's conversations (one registry per model: slot loads, high
  // water and TTLs are per model).
  const ConversationRegistry& registry() const { return registry_; }
  KvPrecacheCounters counters() const EXCLUDES(mu_);

 private:
  // Which conversation's KV a slot holds (KV policy; whether it is busy,
  // and which slot a request gets, are the engine's).
  struct SlotEntry {
    std::string owner;          // conversation whose KV the slot holds; "" = none
    TtlClass owner_ttl = TtlClass::kShort;
  };
  struct ConversationState {
    TtlClass ttl = TtlClass::kShort;
    std::vector<int32_t> prewarm_prefix;  // empty: never prewarmed
    int64_t touched_ms = 0;  // last request, prewarm or keep-alive re-warm
    int64_t used_ms = 0;     // last request or explicit prewarm
  };

  // Steps 1–2 of the file comment for a held slot.
  void PrepareSlot(Engine* engine, SlotReservation& slot, const std::string& conversation,
                   const std::vector<int32_t>& prompt, KvOutcome* outcome) EXCLUDES(mu_);
  // Saves the held slot's KV to disk as `conversation` (class `ttl`).
  bool PersistSlot(Engine* engine, const SlotReservation& slot, const std::string& conversation,
                   TtlClass ttl) EXCLUDES(mu_);
  bool PersistSnapshot(const std::string& conversation, TtlClass ttl, const KvSnapshot& snapshot)
      EXCLUDES(mu_);
  // Moves a closed conversation's in-RAM KV (its slot, else its prompt-cache
  // entry) to disk, class `ttl` (nullopt: its own), and forgets it.
  bool PersistAndForget(Engine* engine, const std::string& conversation,
                        std::optional<TtlClass> ttl) EXCLUDES(mu_);
  // Marks the conversation touched now (keep-alive clock) and, with `use`,
  // used (idleness clock); sets its class.
  void Touch(const std::string& conversation, std::optional<TtlClass> ttl, bool use) EXCLUDES(mu_);
  // Generate / Prewarm; `use` false for the keep-alive's own re-warms, which
  // do not count as use of the conversation.
  Result<GenerationResult> Run(Engine* engine, std::string_view conversation_id, TtlClass ttl,
                               GenerationRequest request, const TextCallback& on_text,
                               const Cancellation& cancelled, KvOutcome* outcome, bool use,
                               std::chrono::steady_clock::time_point deadline) EXCLUDES(mu_);
  Result<GenerationResult> PrewarmImpl(Engine* engine, std::string_view conversation_id,
                                       std::vector<int32_t> prefix_ids, TtlClass ttl,
                                       const Cancellation& cancelled, bool use) EXCLUDES(mu_);
  // Attaches `engine` when it is not the attached one (a reload).
  void AttachLocked(Engine* engine) REQUIRES(mu_);

  const KvPrecacheOptions options_;
  Clock* const clock_;
  ConversationRegistry registry_;
  const int n_slots_;  // slots_.size(), fixed
  mutable Mutex mu_;
  Engine* engine_ GUARDED_BY(mu_) = nullptr;
  std::vector<SlotEntry> slots_ GUARDED_BY(mu_);
  std::map<std::string, ConversationState, std::less<>> conversations_ GUARDED_BY(mu_);
  KvPrecacheCounters counters_ GUARDED_BY(mu_);
};

}  // namespace arbiter
