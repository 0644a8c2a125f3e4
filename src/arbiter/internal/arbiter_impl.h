// src/arbiter/internal/arbiter_impl.h — the MemoryArbiter's machinery,
// private to src/arbiter/.
//
// MemoryArbiter (include/arbiter/arbiter/memory_arbiter.h) forwards every
// call to one MemoryArbiterImpl. The implementation is spread over:
//   memory_arbiter.cc   design notes (Note [Fast path], Note [Shutdown], ...),
//                       names, ArbiterHandle, the registry and key tables,
//                       the lock-free fast path, Start/Stop/Shutdown, stats
//   arbiter_load.cc     the slow acquire (swap, fit, reclaim), loads,
//                       Preload, Unload
//   arbiter_eviction.cc idle lists, victims, evictions, pressure, idle TTL
//   request_queues.cc   Request() and the per-resident-key queue workers
//   arbiter_events.cc   OnEvent(), Emit() and the listener table
//
// Thread safety: as MemoryArbiter. Lock order: lifecycle_mu_ → mu_ and
// queue_mu_ → nothing; a listener table's lock is never held with another.
#pragma once

#include <any>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "arbiter/arbiter/memory_arbiter.h"
#include "arbiter/base/mutex.h"
#include "arbiter/base/thread_annotations.h"

namespace arbiter {
namespace arbiter_internal {

inline size_t Index(Capability c) { return static_cast<size_t>(c); }
inline size_t Index(ResidentRole r) { return static_cast<size_t>(r); }

inline std::chrono::steady_clock::time_point RealNow() { return std::chrono::steady_clock::now(); }

// Note [Fast path]: the pin word and the gate.
inline constexpr uint32_t kOpen = 1u << 31;
inline constexpr uint32_t kCountMask = kOpen - 1;
inline constexpr uint32_t kGateShutdown = 1;
inline constexpr uint32_t kGateCritical = 2;
inline constexpr uint32_t kGateWaiter = 4;  // one registered ReleaseWaiter

inline uint32_t Count(uint32_t pin) { return pin & kCountMask; }

inline constexpr size_t kNoSlot = ~size_t{0};

// A fast 64-bit hash of a short key (8 bytes per step).
inline uint64_t HashKey(std::string_view s) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ s.size();
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
  }
  uint64_t w = 0;
  std::memcpy(&w, s.data() + i, s.size() - i);
  h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
  h ^= h >> 29;
  return h;
}

struct Registration {
  CapabilityRegistration reg;
  ResidentRole role = ResidentRole::kTextTarget;
  int priority = 100;
};

// Orders idle evictable entries: oldest last use, then lower role priority,
// then older load, then a unique sequence number.
struct LruKey {
  int64_t last_used_ms;
  int priority;
  int64_t loaded_at_ms;
  uint64_t seq;
  bool operator<(const LruKey& o) const {
    if (last_used_ms != o.last_used_ms) return last_used_ms < o.last_used_ms;
    if (priority != o.priority) return priority < o.priority;
    if (loaded_at_ms != o.loaded_at_ms) return loaded_at_ms < o.loaded_at_ms;
    return seq < o.seq;
  }
};

// One (capability, model key); never deleted before the arbiter, so handles
// may point at it (state machine and invariants: memory_arbiter.cc).
struct Entry {
  Registration* reg = nullptr;
  std::string key;        // resident key
  std::string model_key;
  Capability capability = Capability::kText;
  ResidentRole role = ResidentRole::kTextTarget;
  int priority = 100;
  // Per model (docs/memory-arbiter.md, fixed defect 8).
  std::optional<int64_t> idle_ttl_ms;
  bool swap_same_role = true;          // per model
  ChargeKind charge_kind = ChargeKind::kDeviceWeights;  // per model (charge_kind_for)
  MemoryDomain domain;    // of every charge; per model (domain_for)
  uint64_t hash = 0;      // HashKey(model_key)
  ModelState state = ModelState::kReady;
  size_t bytes = 0;       // charge: estimate until measured
  bool measured = false;
  MemoryCharge charge;    // live while kLoading/kLoaded
  // LoadedBackend::charge_parts beyond the registration's kind (kLoaded only).
  std::vector<MemoryCharge> part_charges;
  std::vector<MemoryCharge> host_charges;  // LoadedBackend::host_charge_parts
  LoadedBackend backend;
  // Note [Fast path]: kOpen | refcount; read and written without mu_.
  std::atomic<uint32_t> pin{0};
  int64_t loaded_at_ms = 0;
  // Note [Fast path]: raised without mu_ by fast acquires, set under mu_.
  std::atomic<int64_t> last_used{0};
  bool idle_listed = false;  // in idle_by_role_[role] under `lru`
  size_t role_slot = kNoSlot;  // index in role_members_[role], kNoSlot if absent
  LruKey lru{};
  uint64_t load_attempt = 0;
  Status last_error;
  uint64_t loads = 0;
  uint64_t load_failures = 0;
  uint64_t evictions = 0;
  double last_load_ms = 0;
};

// Note [Fast path]: capacity is a power of two, at most half full.
struct KeyTable {
  explicit KeyTable(size_t capacity) : slots(capacity), mask(capacity - 1) {}
  std::vector<std::atomic<Entry*>> slots;
  const size_t mask;
  size_t used = 0;  // written under mu_
};

// An entry taken out of residency under mu_, unloaded after it
// (FinishUnloads).
struct Unloaded {
  Registration* reg;
  Capability capability;
  std::string model_key;
  LoadedBackend backend;
  UnloadReason reason;
  size_t bytes;
};

// OnEvent() listeners (arbiter_events.cc). Shared with the subscriptions,
// which may outlive the arbiter.
struct Listeners {
  Mutex mu;
  uint64_t next_id GUARDED_BY(mu) = 1;
  std::map<uint64_t, std::shared_ptr<ArbiterEventListener>> map GUARDED_BY(mu);
  // map.size(), written under mu, read without it so that callers skip
  // building events nobody listens to (a racing subscription may miss one).
  std::atomic<size_t> count{0};
};

// One resident key's request FIFO and its worker (request_queues.cc).
// Fields other than the immutable ones are guarded by queue_mu_.
struct Queue {
  struct Item {
    std::any payload;
    std::stop_token stop;
    std::promise<Result<std::any>> promise;
  };
  Queue(Mutex* mu, Capability capability, std::string model_key)
      : cv(mu), capability(capability), model_key(std::move(model_key)) {}
  CondVar cv;
  const Capability capability;
  const std::string model_key;
  std::deque<Item> items;
  bool running = false;
  uint64_t runs = 0;
  uint64_t rejections = 0;
  std::thread worker;
};

class MemoryArbiterImpl {
 public:
  explicit MemoryArbiterImpl(const MemoryArbiterOptions& options);
  // Shutdown() (bounded) then joins every thread.
  ~MemoryArbiterImpl();
  MemoryArbiterImpl(const MemoryArbiterImpl&) = delete;
  MemoryArbiterImpl& operator=(const MemoryArbiterImpl&) = delete;

  // MemoryArbiter's methods, same contracts (memory_arbiter.h). The lock
  // annotations live here: MemoryArbiter's declarations cannot name mu_,
  // since the public header does not define this class.
  Status RegisterCapability(CapabilityRegistration registration) EXCLUDES(mu_);
  Result<ArbiterHandle> Acquire(Capability capability, std::string_view model_key,
                                ArbiterDeadline deadline) EXCLUDES(mu_);
  bool Preload(Capability capability, std::string_view model_key) EXCLUDES(mu_);
  Result<bool> Unload(Capability capability, std::string_view model_key,
                      ArbiterDeadline deadline) EXCLUDES(mu_);
  size_t ReclaimIdle(MemoryDomain domain, size_t bytes, size_t* evicted) EXCLUDES(mu_);
  std::future<Result<std::any>> Request(Capability capability, std::string model_key,
                                        std::any payload, std::stop_token stop)
      EXCLUDES(queue_mu_);
  ArbiterEventSubscription OnEvent(ArbiterEventListener listener);  // the listener table's lock
  Result<bool> UpdateResidentBytes(Capability capability, std::string_view model_key,
                                   size_t bytes) EXCLUDES(mu_);
  Status Start() EXCLUDES(mu_, lifecycle_mu_);
  void Stop() EXCLUDES(mu_, lifecycle_mu_);
  void Shutdown() EXCLUDES(mu_, lifecycle_mu_, queue_mu_);
  void HandlePressure(const MemoryPressureEvent& event) EXCLUDES(mu_);
  void SetPressureLevel(const MemoryPressureEvent& event) EXCLUDES(mu_);
  size_t EvictIdleByPriority(MemoryDomain domain, size_t max_entries, UnloadReason reason)
      EXCLUDES(mu_);
  std::optional<ResidentEntryInfo> NextFitVictim(MemoryDomain domain) const EXCLUDES(mu_);
  size_t ReapIdle() EXCLUDES(mu_);
  Status SetIdleTtl(Capability capability, std::string_view model_key,
                    std::optional<int64_t> ttl_ms) EXCLUDES(mu_);
  std::vector<ResidentEntryInfo> ResidentSnapshot() const EXCLUDES(mu_);
  MemoryPressureLevel CurrentPressureLevel() const EXCLUDES(mu_);
  ArbiterStats Stats() const EXCLUDES(mu_);
  MemoryLedger* ledger() const { return ledger_; }

  // ArbiterHandle's hooks (Note [Fast path]). RetainEntry takes no lock;
  // ReleaseEntry takes mu_ only on a release to 0 with a waiter or after
  // shutdown.
  Result<ArbiterHandle> RetainEntry(Entry* e);
  void ReleaseEntry(Entry* e) EXCLUDES(mu_);

 private:
  // Registers the calling thread (which holds mu_) as waiting for a
  // refcount to drain, so that a lock-free release to 0 signals changed_.
  // Note [Fast path].
  class ReleaseWaiter {
   public:
    explicit ReleaseWaiter(MemoryArbiterImpl* a) : a_(a) { a_->gate_.fetch_add(kGateWaiter); }
    ~ReleaseWaiter() { a_->gate_.fetch_sub(kGateWaiter); }
    ReleaseWaiter(const ReleaseWaiter&) = delete;
    ReleaseWaiter& operator=(const ReleaseWaiter&) = delete;

   private:
    MemoryArbiterImpl* const a_;
  };

  // Note [Fast path]: lock-free acquire of a loaded entry; false → slow path.
  bool TryPinFast(Entry* e) const;
  ArbiterHandle MakeHandle(Entry* e);
  Result<ArbiterHandle> AcquireSlow(Capability capability, std::string_view model_key,
                                    ArbiterDeadline deadline) EXCLUDES(mu_);
  void ReleaseSlow(Entry* e) EXCLUDES(mu_);
  ArbiterHandle PinLocked(Entry* e) REQUIRES(mu_);
  // Lock-free lookup (Note [Fast path]); also used under mu_.
  Entry* FindEntry(Capability capability, std::string_view model_key) const;
  Entry* FindOrCreateLocked(Registration* reg, std::string_view model_key) REQUIRES(mu_);
  // Lists a loaded non-text-target entry in idle_by_role_ keyed by
  // its current last-used stamp (no-op if listed or text-target).
  void AddIdleLocked(Entry* e) REQUIRES(mu_);
  void RemoveIdleLocked(Entry* e) REQUIRES(mu_);
  void RelistLocked(std::vector<Entry*>* held) REQUIRES(mu_);
  // Closes a loaded entry whose pin count is 0 (no fast acquire can pin it
  // afterwards); false if it is pinned. The caller evicts it, or reopens it,
  // before releasing mu_.
  bool TryCloseLocked(Entry* e) REQUIRES(mu_);
  // The least recently used idle entry of `lru`, closed; null if none. Stale
  // keys are re-keyed; held entries are unlisted into *held (RelistLocked).
  Entry* ClaimLruLocked(std::map<LruKey, Entry*>* lru, std::vector<Entry*>* held) REQUIRES(mu_);
  // The same over every role: the global LRU idle entry (fit victim).
  Entry* ClaimFitVictimLocked(std::vector<Entry*>* held) REQUIRES(mu_);
  // Whether `e` is a victim for room in `domain`: for the host every entry,
  // for a device domain those charged there.
  static bool InDomain(const Entry& e, MemoryDomain domain) {
    return domain.is_host() || e.domain == domain;
  }
  // A device domain's victim, closed (see ClaimLruLocked), or null: the
  // least LruKey order (`by_priority`: role priority first, as
  // EvictIdleByPriority) among the idle loaded non-text-target entries
  // charged in `domain`. A scan of every entry: reclaim in a device domain
  // is not a hot path.
  Entry* ClaimDomainVictimLocked(MemoryDomain domain, bool by_priority) REQUIRES(mu_);
  // charged(domain) + bytes ≤ budget(domain), or the domain is unlimited.
  bool FitsLocked(MemoryDomain domain, size_t bytes) const REQUIRES(mu_);
  int HeldCountLocked() const REQUIRES(mu_);
  ResidentEntryInfo InfoLocked(const Entry& e) const REQUIRES(mu_);
  void AddRoleMemberLocked(Entry* e) REQUIRES(mu_);
  void RemoveRoleMemberLocked(Entry* e) REQUIRES(mu_);
  int64_t StampMs() const { return clock_->CoarseNowMs(); }
  // Takes a loaded entry out of residency (any refcount: the caller checks),
  // releases its charge and queues the unload for after the lock.
  void EvictLocked(Entry* e, UnloadReason reason, std::vector<Unloaded>* out) REQUIRES(mu_);
  void EvictToFitLocked(size_t incoming, std::vector<Unloaded>* out) REQUIRES(mu_);
  // Runs unload callables and emits events.
  void FinishUnloads(std::vector<Unloaded>* unloaded) EXCLUDES(mu_);
  void Emit(const ArbiterEvent& event) EXCLUDES(mu_);
  // Lock-free: some OnEvent() listener is registered.
  bool HasListeners() const;
  size_t EstimateFor(const Registration& reg, const std::string& model_key) const;
  // Closes the request queues and joins their workers (pending items fail).
  void CloseQueues() EXCLUDES(queue_mu_);
  void QueueWorker(Queue* q) EXCLUDES(mu_, queue_mu_);
  // Fills ModelStats' queue fields from queues_.
  void AddQueueStats(ArbiterStats* stats) const EXCLUDES(queue_mu_);
  ArbiterStats StatsWithoutQueues() const EXCLUDES(mu_);
  // After a load or a reuse: asks the reclaimer to bring the host and
  // `domain` back within their budgets, where their hints say they are over.
  void MakeRoomAfter(MemoryDomain domain) EXCLUDES(mu_);
  // Marks `e` loading and charges `incoming` to the ledger.
  void ClaimLocked(Entry* e, size_t incoming) REQUIRES(mu_);
  // Runs the claimed load unlocked, publishes it, pins it when `pin`.
  Result<ArbiterHandle> LoadClaimed(Entry* e, bool pin) EXCLUDES(mu_);
  void ReaperLoop() EXCLUDES(mu_);

  Clock* const clock_;
  std::unique_ptr<MemoryLedger> owned_ledger_;
  MemoryLedger* const ledger_;
  MemoryPressureSource* const pressure_source_;
  VisionEmbeddingCache* const vision_cache_;
  const MemoryArbiterOptions options_;

  mutable Mutex mu_;
  CondVar changed_;  // signalled on load end, release to 0, eviction, shutdown
  CondVar reaper_cv_;
  std::array<std::unique_ptr<Registration>, kCapabilityCount> regs_ GUARDED_BY(mu_);
  // Every entry, in creation order (never deleted before the arbiter).
  std::vector<std::unique_ptr<Entry>> entries_ GUARDED_BY(mu_);
  std::vector<Entry*> order_ GUARDED_BY(mu_);
  // Per capability: open-addressing table of entries by model key, read
  // without mu_ (Note [Fast path]); written and grown under mu_. Replaced
  // tables stay allocated (tables_owned_) until the arbiter is destroyed.
  std::array<std::atomic<KeyTable*>, kCapabilityCount> tables_{};
  std::vector<std::unique_ptr<KeyTable>> tables_owned_ GUARDED_BY(mu_);
  // Note [Fast path]: kGateShutdown | kGateCritical | waiters × kGateWaiter.
  // Written under mu_ (waiter counts by ReleaseWaiter), read without it.
  std::atomic<uint32_t> gate_{0};
  // Loaded or loading entries per role (same-role conflicts,
  // docs/memory-arbiter.md, fixed defect 4). Unordered; Entry::role_slot is
  // an entry's index here (O(1) add/remove).
  std::array<std::vector<Entry*>, kResidentRoleCount> role_members_ GUARDED_BY(mu_);
  // Loaded non-text-target entries, keyed by a last-used stamp that may be
  // older than the entry's (lazy LRU, Note [Fast path]); some may be held.
  // One map per role; the global LRU is the least of their begin()s.
  size_t idle_listed_ GUARDED_BY(mu_) = 0;  // Σ sizes of idle_by_role_
  std::array<std::map<LruKey, Entry*>, kResidentRoleCount> idle_by_role_ GUARDED_BY(mu_);
  uint64_t seq_ GUARDED_BY(mu_) = 0;
  int loading_count_ GUARDED_BY(mu_) = 0;
  size_t resident_bytes_ GUARDED_BY(mu_) = 0;
  size_t loading_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t loads_ GUARDED_BY(mu_) = 0;
  uint64_t load_failures_ GUARDED_BY(mu_) = 0;
  uint64_t evictions_ GUARDED_BY(mu_) = 0;
  MemoryPressureLevel level_ GUARDED_BY(mu_) = MemoryPressureLevel::kNominal;
  bool started_ GUARDED_BY(mu_) = false;
  bool shutting_down_ GUARDED_BY(mu_) = false;
  bool reaper_stop_ GUARDED_BY(mu_) = false;

  // Event listeners (own lock: Emit never holds mu_).
  std::shared_ptr<Listeners> listeners_;

  // Start/Stop state: only touched by Start/Stop/Shutdown, under lifecycle_mu_.
  Mutex lifecycle_mu_;
  MemoryPressureSubscription pressure_sub_ GUARDED_BY(lifecycle_mu_);
  std::thread reaper_ GUARDED_BY(lifecycle_mu_);

  // Request queues.
  mutable Mutex queue_mu_;
  // By resident key; a queue and its worker live until CloseQueues().
  std::map<std::string, std::unique_ptr<Queue>> queues_ GUARDED_BY(queue_mu_);
  bool queues_closed_ GUARDED_BY(queue_mu_) = false;
};

}  // namespace arbiter_internal
}  // namespace arbiter
