// arbiter/kv/prompt_cache.h — the host (RAM) tier of the KV precache: saved
// conversation KV snapshots kept in memory, LRU within a byte capacity and
// the process's MemoryLedger, spilling what it pushes out to the disk tier.
//
// Implements the host tier of docs/kv-precache.md ("Tiers"; idle
// conversations persist their KV, open restores it: "Persistence") with the
// TTL classes of "Keys and names". It sits
// between the engine's slots and KvStore (kv_store.h): a conversation that
// leaves its slot is Put() here, a returning one is Take()n back; what does
// not fit goes through the `spill` callback (typically KvStore::Save).
//
// Concepts:
//   - An entry is (model key, conversation id) → KvSnapshot + TTL class. Its
//     size is snapshot.MemoryBytes() (tokens + K/V). bytes() is the sum over
//     entries, always ≤ capacity().
//   - Each entry holds its own MemoryCharge of its size on the ledger (kind
//     kPromptCache, owner "prompt_cache:<model key>"), so at every moment
//     the ledger's prompt-cache bytes charged by this cache == bytes().
//   - Recency: Put() makes an entry the most recently used. Take() removes
//     it (the slot holds the KV again). Contains()/TokensOf() do not touch.
//   - Expiry: an entry lives TtlMs(class) from its Put() (on the clock's
//     monotonic NowMs()). Expired entries are dropped — never spilled, so a
//     stale state does not get a fresh lifetime on disk — by Take(),
//     PurgeExpired(), and whenever they would be spilled.
//   - Spill: an entry pushed out of RAM (LRU eviction, Spill(),
//     SpillModel(), or a new entry that cannot be kept) is handed to the
//     `spill` callback with its snapshot; without a callback it is dropped.
//     While the callback runs, the entry is in neither tier.
//
// Example:
//   PromptCacheOptions o;
//   o.capacity_bytes = 2ull << 30;
//   o.ledger = &ledger;
//   o.spill = [&store](const std::string&, const std::string& id, TtlClass ttl,
//                      KvSnapshot s) { store->Save(id, ttl, s).IgnoreError(); };
//   PromptCache cache(std::move(o));
//   cache.Put("text::qwen", "room-42", TtlClass::kLong, std::move(snapshot));
//   if (std::optional<KvSnapshot> kv = cache.Take("text::qwen", "room-42")) {
//     engine.RestoreSlot(slot, *kv);
//   }
//
// Thread safety: thread-safe (one mutex). The ledger is called under it
// (MemoryLedger is always the innermost lock and never calls out). The
// spill callback is called with no lock of the cache held — it may call
// back into the cache — and may run on several threads at once (one per
// concurrent Put/Spill). Two spills of the same key from different threads
// may reach the callback in either order. Snapshots of removed entries are
// freed after the lock is released.
// Lifetime: the clock and the ledger (when given) must outlive the cache.
// Destroying the cache drops (does not spill) its entries and uncharges
// them; call Spill(UINT64_MAX) first to keep them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "arbiter/base/clock.h"
#include "arbiter/base/mutex.h"
#include "arbiter/engine/kv_snapshot.h"
#include "arbiter/kv/cache_key.h"
#include "arbiter/memory/memory_ledger.h"

namespace arbiter {

// The ledger owner of a model's entries: "prompt_cache:<model key>".
std::string PromptCacheLedgerOwner(const std::string& model_key);

struct PromptCacheOptions {
  uint64_t capacity_bytes = 0;  // [kv] prompt_cache; 0 = disabled (Put drops/spills)
  // Charged ChargeKind::kPromptCache, owner "prompt_cache:<model key>"; null = no ledger.
  MemoryLedger* ledger = nullptr;
  TtlWindows ttl;          // the class windows, from each entry's Put()
  Clock* clock = nullptr;  // null → Clock::Real(); entry ages use NowMs()
  // Called (outside the lock) with entries pushed out by LRU / capacity /
  // Spill, so they can go to disk. Null: those entries are dropped.
  std::function<void(const std::string& model_key, const std::string& conversation_id, TtlClass,
                     KvSnapshot)>
      spill;
};

// One entry (Entries()).
struct PromptCacheEntryInfo {
  std::string model_key, conversation_id;
  TtlClass ttl_class;
  int n_tokens;
  uint64_t bytes;  // snapshot.MemoryBytes()
  int64_t age_ms;  // since its Put()
};

class PromptCache {
 public:
  explicit PromptCache(PromptCacheOptions options);
  ~PromptCache();
  PromptCache(const PromptCache&) = delete;
  PromptCache& operator=(const PromptCache&) = delete;

  // Stores `snapshot` under (model_key, conversation_id), replacing (and
  // dropping, not spilling: it is older) an entry of the same key, as the
  // most recently used. Makes room by spilling least-recently-used entries
  // until it fits under capacity and the ledger grants its charge
  // (TryCharge, retried after each eviction). The entry itself is spilled
  // instead of kept when it is larger than the capacity (or capacity is 0),
  // or when the ledger refuses it with the cache empty — or, checked first,
  // when the ledger could not grant it even if the whole cache were
  // evicted (available + bytes() < its size), in which case no other entry
  // is evicted for it.
  // Returns true when the entry is kept in RAM.
  bool Put(const std::string& model_key, const std::string& conversation_id, TtlClass ttl,
           KvSnapshot snapshot) EXCLUDES(mu_);

  // Removes and returns the entry (uncharging it): a hit. nullopt when
  // absent, or expired (then it is dropped, not spilled): a miss.
  std::optional<KvSnapshot> Take(const std::string& model_key, const std::string& conversation_id)
      EXCLUDES(mu_);

  // Whether an unexpired entry is held. Does not change recency.
  bool Contains(const std::string& model_key, const std::string& conversation_id) const
      EXCLUDES(mu_);
  // The entry's n_tokens; 0 when absent or expired. Does not change recency.
  int TokensOf(const std::string& model_key, const std::string& conversation_id) const
      EXCLUDES(mu_);
  // Drops the entry (no spill), if any.
  void Erase(const std::string& model_key, const std::string& conversation_id) EXCLUDES(mu_);

  // Spills least-recently-used entries until at least `bytes` are freed (or
  // the cache is empty); Spill(UINT64_MAX) spills all. Expired entries met
  // on the way are dropped instead; their bytes count as freed. Returns the
  // bytes freed.
  uint64_t Spill(uint64_t bytes) EXCLUDES(mu_);
  // Spills every entry of `model_key` (its engine is going away); expired
  // ones are dropped. Returns the bytes freed.
  uint64_t SpillModel(const std::string& model_key) EXCLUDES(mu_);
  // Drops (not spills) the entries past their class's window since their
  // Put(); returns how many.
  int PurgeExpired() EXCLUDES(mu_);

  uint64_t bytes() const EXCLUDES(mu_);
  size_t size() const EXCLUDES(mu_);
  uint64_t capacity() const { return capacity_bytes_; }
  // Every entry, most recently used first.
  std::vector<PromptCacheEntryInfo> Entries() const EXCLUDES(mu_);

  // Since construction.
  struct Counters {
    uint64_t puts = 0;     // Put() calls
    uint64_t hits = 0;     // Take() returned an entry
    uint64_t misses = 0;   // Take() found none, or an expired one
    uint64_t spilled = 0;  // entries pushed out of RAM (to the callback, or dropped without one)
    uint64_t expired = 0;  // entries dropped past their TTL window
  };
  Counters counters() const EXCLUDES(mu_);

 private:
  struct Entry {
    std::string model_key;
    std::string conversation_id;
    TtlClass ttl_class = TtlClass::kShort;
    KvSnapshot snapshot;
    uint64_t bytes = 0;
    int64_t put_ms = 0;   // clock_->NowMs() at Put()
    MemoryCharge charge;  // empty without a ledger
  };
  using List = std::list<Entry>;  // front = most recently used

  bool ExpiredLocked(const Entry& e, int64_t now_ms) const REQUIRES(mu_);
  // Unlinks `it`, releases its charge and moves it to `out`.
  void RemoveLocked(List::iterator it, std::vector<Entry>* out) REQUIRES(mu_);
  // Removes `it` as pushed out of RAM: to `spills`, or to `dropped` when
  // expired. Returns its bytes.
  uint64_t PushOutLocked(List::iterator it, int64_t now_ms, std::vector<Entry>* spills,
                         std::vector<Entry>* dropped) REQUIRES(mu_);
  // Hands `spills` to the callback. REQUIRES: mu_ not held.
  void CallSpill(std::vector<Entry>* spills) EXCLUDES(mu_);

  const uint64_t capacity_bytes_;
  MemoryLedger* const ledger_;
  const TtlWindows ttl_;
  Clock* const clock_;
  const std::function<void(const std::string&, const std::string&, TtlClass, KvSnapshot)> spill_;

  mutable Mutex mu_;
  List lru_ GUARDED_BY(mu_);
  // Key(model_key, conversation_id) → node of lru_.
  std::unordered_map<std::string, List::iterator> index_ GUARDED_BY(mu_);
  uint64_t bytes_ GUARDED_BY(mu_) = 0;
  Counters counters_ GUARDED_BY(mu_);
};

}  // namespace arbiter
