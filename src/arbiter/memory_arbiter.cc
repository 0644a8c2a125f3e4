// MemoryArbiter: capabilities, roles, handles, swaps, evict-to-fit against
// the MemoryLedger, pressure response, request queues, events.
//
// Each (capability, model key) seen has one Entry (never deleted, so handles
// may point at it). Its state machine:
//
//   kReady/kFailed --claim (one acquirer or preload)--> kLoading
//   kLoading --load ok--> kLoaded         --load error--> kFailed
//   kLoaded --evicted (swap|fit|pressure|idle|shutdown, refcount 0)--> kReady
//
// Invariants (all under mu_):
//   - role_members_[r] = entries of role r that are kLoading or kLoaded.
//     Same-role conflicts are taken from it, so a load in flight is a
//     conflict (defect 4), and a key is claimed only in a lock section that
//     saw no conflict.
//   - idle_by_role_[r] holds the kLoaded entries of role r ≠ text-target
//     (held ones included), keyed (last_used, priority, loaded_at, seq)
//     where the key's last_used may be older than the entry's (lazy LRU,
//     Note [Fast path]); idle_listed_ counts them. ClaimLruLocked pops
//     begin(), re-keys a stale key, sets held entries aside and closes the
//     first idle entry with a fresh key: the role's true LRU idle entry (in
//     the lowest non-empty role, the low-pressure victim). The fit victim
//     (ClaimFitVictimLocked) is the least key among the roles' normalized
//     begin()s: the global LRU without a second map.
//     Held entries and text-target are never claimed, hence never evicted by
//     fit or pressure (defects 1, 2).
//   - Every kLoading/kLoaded entry holds one MemoryCharge (owner = resident
//     key): the estimate while loading, the measured bytes once loaded. The
//     footprint is ledger_->charged_bytes(), which includes other owners.
//   - An entry's pin word (Note [Fast path]) is kOpen | refcount while
//     kLoaded, 0 otherwise; at every release of mu_, kLoaded ⇔ open.
//     loading_count_ = #kLoading.
//   - After every Acquire, footprint ≤ budget or no idle evictable entry is
//     left (evict-to-fit also runs on the reuse path, since a best-effort
//     load or another ledger owner can push the footprint over the budget).
//
// Slow work is outside mu_ (STYLE rule 6): load/unload/run callables,
// listeners and logging. Evictions are decided under the lock (the charge is
// released there so the fit loop sees it) and the unload callables run after
// it (FinishUnloads), followed by model_unload and eviction events.
//
// Note [Waits use real time]
// The drain wait of a swap, Acquire deadlines and the shutdown bound are
// std::chrono::steady_clock deadlines, never the injected Clock, so a frozen
// SimulatedClock cannot turn them into hangs (defect 6). The injected clock
// stamps last-used / loaded-at / events and drives the idle TTL.
//
// Note [Refusing over budget]
// The reference is best effort: after evict-to-fit the load proceeds even if
// it still does not fit. With options.refuse_over_budget (the server sets it,
// docs/http-api.md `budget_exceeded`), an acquire that could not fit even
// after evicting every idle victim fails with kResourceExhausted, evicting
// nothing for the fit, whenever some handle is held or a load is in flight
// (the caller retries later); when nothing is held the load proceeds as in
// the reference (a model larger than the budget must stay usable). The
// same-role swap runs before the budget check, so a refused acquire may
// already have unloaded an idle entry of its own role (reason "swap"): that
// entry would have been replaced anyway.
//
// Note [Reclaim through a Reclaimer]
// With options.reclaimer set (the runtime's ReclaimPolicy), the arbiter does
// not decide what is given back when a load needs room: AcquireSlow finds the
// shortfall under mu_, leaves the lock, asks reclaimer->MakeRoom(incoming) —
// which may spill caches, call ReclaimIdle, demote weights, in the policy's
// order — and then decides again from scratch (once per acquire). The
// refuse_over_budget check still runs first, so a refused acquire frees
// nothing; on the second round, victims that became idle meanwhile are
// evicted here as before. After a load (measured size above the estimate)
// and on the reuse path, an over-budget ledger is handed to MakeRoom(0)
// after the lock instead of being fitted under it. Without a reclaimer
// everything is as the seed says: evict-to-fit under mu_.

// Note [Fast path]
// Acquire + release of a resident entry must cost tens of ns (issue 3 point
// 9: p50 ≤ 40 ns), so it takes no lock, allocates nothing and copies no
// shared_ptr:
//   - Lookup: tables_[capability] is an open-addressing table of Entry*
//     keyed by a hash of the model key (no "cap::key" string is built). Slots
//     are filled (release) under mu_ and never cleared; a full table is
//     replaced by a bigger copy and the old one kept until the destructor,
//     so a reader never sees freed memory. Entry fields read there
//     (model_key, hash, capability) are immutable once published.
//   - Pin word (Entry::pin): kOpen | refcount. kOpen is set (release) when a
//     load is published (after e->backend is written) and cleared only by
//     TryCloseLocked, a CAS from exactly kOpen (refcount 0) to 0, under mu_,
//     immediately followed by the eviction. The fast acquire CASes
//     refcount+1 only while kOpen is set (acquire), so it either pins before
//     the close (which then fails: the entry is held, never evicted) or
//     fails and takes the slow path. Hence a pinned entry's backend stays
//     put, and the handle points at e->backend / e->model_key instead of
//     copying them. Retain adds 1 to a count that is ≥ 1 (no lock needed).
//   - Checks that the slow path makes are mirrored in gate_ (written under
//     mu_, read with acquire): kGateShutdown and kGateCritical (non-text
//     only) send the fast path to the slow path, which reports the errors in
//     the documented order (an acquire that read the gate just before the
//     change is ordered before it, as if it had taken mu_ first). The
//     ledger's OverBudgetHint() does too, so the slow path's evict-to-fit on
//     reuse still runs whenever the footprint is over the budget.
//   - Release is one fetch_sub. Only a release to 0 while gate_ has a waiter
//     or shutdown bit takes mu_ (to signal changed_, or to unload after
//     shutdown). Threads that wait for a refcount to drain (swap, Unload,
//     Shutdown) register in gate_ (ReleaseWaiter) before they check the
//     count: both sides use seq_cst RMW-then-load, so either the waiter sees
//     the count at 0 or the releaser sees the waiter and signals under mu_
//     (the waiter holds mu_ from its check until it sleeps).
//   - Lazy LRU: release to 0 cannot touch the maps, so loaded entries stay
//     listed while held and Entry::last_used is an atomic the fast path
//     raises to max(last_used, now). A map key's stamp is ≤ the entry's
//     stamp (the fast path goes to the slow path if the clock is behind the
//     entry's stamp; the slow path sets the stamp exactly and re-keys), so
//     the first entry in key order whose key is fresh and that is idle is
//     the LRU idle entry. After the close succeeds the stamp is re-checked
//     (an acquire + release may have run between the check and the CAS); a
//     changed stamp reopens and re-keys it. Each re-key pays for one fast
//     acquire; set-aside held entries are few (they are pinned by live
//     requests).
//   - Stamps use Clock::CoarseNowMs() (CLOCK_MONOTONIC_COARSE: ~9 ns, ≤ one
//     tick behind) for last-used, loaded-at and the idle TTL, the same clock
//     everywhere so stamps are comparable; SimulatedClock returns NowMs(), so
//     last-used equals the clock at each acquire in tests.
//   - Stats() and ResidentSnapshot() read refcounts and stamps atomically:
//     exact at the instant each entry is read.
//
// Note [Shutdown]
// Shutdown refuses new work, stops the pressure source and the queues, then
// waits (bounded) for loads in flight and held handles. It then unloads every
// idle entry. A load that completes after the flag is set unloads its own
// result and fails its waiters; a handle released after shutdown unloads its
// entry at once. So no entry survives shutdown (defect 5), and held backends
// are never freed under a holder.
#include "arbiter/arbiter/memory_arbiter.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <exception>
#include <tuple>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "arbiter/arbiter/vision_embedding_cache.h"
#include "arbiter/base/size.h"

namespace arbiter {
namespace {

constexpr std::string_view kCapabilityNames[kCapabilityCount] = {
    "text", "embedding", "vision-describe", "image-gen", "transcribe", "speak"};
constexpr std::string_view kRoleNames[kResidentRoleCount] = {
    "drafter", "emotion", "speaker-id", "vision", "embedding", "turn-detector",
    "wake-word", "vad", "asr", "tts", "text-target"};
constexpr int kRolePriorities[kResidentRoleCount] = {10, 15, 18, 20, 25, 28, 30, 35, 40, 50, 100};

size_t Index(Capability c) { return static_cast<size_t>(c); }
size_t Index(ResidentRole r) { return static_cast<size_t>(r); }

std::chrono::steady_clock::time_point RealNow() { return std::chrono::steady_clock::now(); }

// Note [Fast path]: the pin word and the gate.
constexpr uint32_t kOpen = 1u << 31;
constexpr uint32_t kCountMask = kOpen - 1;
constexpr uint32_t kGateShutdown = 1;
constexpr uint32_t kGateCritical = 2;
constexpr uint32_t kGateWaiter = 4;  // one registered ReleaseWaiter

uint32_t Count(uint32_t pin) { return pin & kCountMask; }

constexpr size_t kNoSlot = ~size_t{0};

// A fast 64-bit hash of a short key (8 bytes per step).
uint64_t HashKey(std::string_view s) {
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

}  // namespace

std::string_view CapabilityName(Capability capability) {
  const size_t i = Index(capability);
  return i < kCapabilityCount ? kCapabilityNames[i] : "unknown";
}

Result<Capability> ParseCapability(std::string_view name) {
  for (size_t i = 0; i < kCapabilityCount; ++i) {
    if (kCapabilityNames[i] == name) return static_cast<Capability>(i);
  }
  return InvalidArgumentError(fmt::format(
      "unknown capability \"{}\"; expected one of text, embedding, vision-describe, image-gen, "
      "transcribe, speak",
      name));
}

std::string_view ResidentRoleName(ResidentRole role) {
  const size_t i = Index(role);
  return i < kResidentRoleCount ? kRoleNames[i] : "unknown";
}

Result<ResidentRole> ParseResidentRole(std::string_view name) {
  for (size_t i = 0; i < kResidentRoleCount; ++i) {
    if (kRoleNames[i] == name) return static_cast<ResidentRole>(i);
  }
  return InvalidArgumentError(fmt::format("unknown resident role \"{}\"", name));
}

int ResidentRolePriority(ResidentRole role) { return kRolePriorities[Index(role)]; }

ResidentRole DefaultRoleFor(Capability capability) {
  switch (capability) {
    case Capability::kText: return ResidentRole::kTextTarget;
    case Capability::kEmbedding: return ResidentRole::kEmbedding;
    case Capability::kVisionDescribe: return ResidentRole::kVision;
    case Capability::kImageGen: return ResidentRole::kVision;
    case Capability::kTranscribe: return ResidentRole::kAsr;
    case Capability::kSpeak: return ResidentRole::kTts;
  }
  return ResidentRole::kTextTarget;
}

std::string ResidentKey(Capability capability, std::string_view model_key) {
  return fmt::format("{}::{}", CapabilityName(capability), model_key);
}

std::string_view ModelStateName(ModelState state) {
  switch (state) {
    case ModelState::kReady: return "ready";
    case ModelState::kLoading: return "loading";
    case ModelState::kLoaded: return "loaded";
    case ModelState::kFailed: return "failed";
  }
  return "unknown";
}

std::string_view UnloadReasonName(UnloadReason reason) {
  switch (reason) {
    case UnloadReason::kSwap: return "swap";
    case UnloadReason::kPressure: return "pressure";
    case UnloadReason::kShutdown: return "shutdown";
    case UnloadReason::kFit: return "fit";
    case UnloadReason::kIdle: return "idle";
    case UnloadReason::kManual: return "manual";
  }
  return "unknown";
}

std::string_view ArbiterEventTypeName(ArbiterEventType type) {
  switch (type) {
    case ArbiterEventType::kModelLoad: return "model_load";
    case ArbiterEventType::kModelUnload: return "model_unload";
    case ArbiterEventType::kMemoryPressure: return "memory_pressure";
    case ArbiterEventType::kEviction: return "eviction";
    case ArbiterEventType::kCapabilityRun: return "capability_run";
  }
  return "unknown";
}

struct MemoryArbiter::Registration {
  CapabilityRegistration reg;
  ResidentRole role = ResidentRole::kTextTarget;
  int priority = 100;
};

struct MemoryArbiter::Entry {
  Registration* reg = nullptr;
  std::string key;        // resident key
  std::string model_key;
  Capability capability = Capability::kText;
  ResidentRole role = ResidentRole::kTextTarget;
  int priority = 100;
  std::optional<int64_t> idle_ttl_ms;  // per model (defect 8)
  bool swap_same_role = true;          // per model
  uint64_t hash = 0;      // HashKey(model_key)
  ModelState state = ModelState::kReady;
  size_t bytes = 0;       // charge: estimate until measured
  bool measured = false;
  MemoryCharge charge;    // live while kLoading/kLoaded
  // LoadedBackend::charge_parts beyond the registration's kind (kLoaded only).
  std::vector<MemoryCharge> part_charges;
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
struct MemoryArbiter::KeyTable {
  explicit KeyTable(size_t capacity) : slots(capacity), mask(capacity - 1) {}
  std::vector<std::atomic<Entry*>> slots;
  const size_t mask;
  size_t used = 0;  // written under mu_
};

// Registers the calling thread (which holds mu_) as waiting for a refcount
// to drain, so that a lock-free release to 0 signals changed_.
// Note [Fast path].
class MemoryArbiter::ReleaseWaiter {
 public:
  explicit ReleaseWaiter(MemoryArbiter* a) : a_(a) { a_->gate_.fetch_add(kGateWaiter); }
  ~ReleaseWaiter() { a_->gate_.fetch_sub(kGateWaiter); }
  ReleaseWaiter(const ReleaseWaiter&) = delete;
  ReleaseWaiter& operator=(const ReleaseWaiter&) = delete;

 private:
  MemoryArbiter* const a_;
};

struct MemoryArbiter::Unloaded {
  Registration* reg;
  Capability capability;
  std::string model_key;
  LoadedBackend backend;
  UnloadReason reason;
  size_t bytes;
};

struct MemoryArbiter::Listeners {
  Mutex mu;
  uint64_t next_id GUARDED_BY(mu) = 1;
  std::map<uint64_t, std::shared_ptr<ArbiterEventListener>> map GUARDED_BY(mu);
  // map.size(), written under mu, read without it so that callers skip
  // building events nobody listens to (a racing subscription may miss one).
  std::atomic<size_t> count{0};
};

struct MemoryArbiter::Queue {
  struct Item {
    std::string model_key;
    std::any payload;
    std::stop_token stop;
    std::promise<Result<std::any>> promise;
  };
  explicit Queue(Mutex* mu) : cv(mu) {}
  CondVar cv;
  std::deque<Item> items;  // guarded by queue_mu_
  std::thread worker;
};

// ---------------------------------------------------------------------------
// ArbiterHandle

ArbiterHandle::ArbiterHandle(ArbiterHandle&& other) noexcept
    : arbiter_(std::exchange(other.arbiter_, nullptr)),
      entry_(std::exchange(other.entry_, nullptr)),
      model_(other.model_),
      backend_(std::exchange(other.backend_, nullptr)),
      capability_(other.capability_) {}

ArbiterHandle& ArbiterHandle::operator=(ArbiterHandle&& other) noexcept {
  if (this != &other) {
    Release();
    arbiter_ = std::exchange(other.arbiter_, nullptr);
    entry_ = std::exchange(other.entry_, nullptr);
    model_ = other.model_;
    backend_ = std::exchange(other.backend_, nullptr);
    capability_ = other.capability_;
  }
  return *this;
}

void ArbiterHandle::Release() {
  if (arbiter_ == nullptr) return;
  MemoryArbiter* arbiter = std::exchange(arbiter_, nullptr);
  backend_ = nullptr;
  arbiter->ReleaseEntry(static_cast<MemoryArbiter::Entry*>(entry_));
}

Result<ArbiterHandle> ArbiterHandle::Retain() const {
  if (arbiter_ == nullptr) {
    return FailedPreconditionError(
        fmt::format("cannot retain {}/{} after release", CapabilityName(capability_), model()));
  }
  return arbiter_->RetainEntry(static_cast<MemoryArbiter::Entry*>(entry_));
}

// ---------------------------------------------------------------------------
// MemoryArbiter

MemoryArbiter::MemoryArbiter(MemoryArbiterOptions options)
    : clock_(options.clock != nullptr ? options.clock : Clock::Real()),
      owned_ledger_(options.ledger == nullptr ? std::make_unique<MemoryLedger>(options.budget_bytes)
                                              : nullptr),
      ledger_(options.ledger != nullptr ? options.ledger : owned_ledger_.get()),
      pressure_source_(options.pressure_source),
      vision_cache_(options.vision_cache),
      options_(options),
      changed_(&mu_),
      reaper_cv_(&mu_),
      listeners_(std::make_shared<Listeners>()) {
  // spdlog creates its registry and default logger on first use, behind a
  // static-init guard inside the (uninstrumented) shared library. Create
  // them here, before any thread can reach the arbiter's logging, so their
  // construction happens-before every use (ThreadSanitizer saw a first use
  // race between a load thread and a pressure callback otherwise).
  (void)spdlog::default_logger_raw();
}

MemoryArbiter::~MemoryArbiter() {
  Shutdown();
  MutexLock l(&mu_);
  if (const int held = HeldCountLocked(); held > 0) {
    spdlog::error("arbiter destroyed with {} handle(s) outstanding", held);
  }
}

Status MemoryArbiter::RegisterCapability(CapabilityRegistration registration) {
  if (!registration.load) {
    return InvalidArgumentError(fmt::format("capability \"{}\" registered without a load function",
                                            CapabilityName(registration.capability)));
  }
  MutexLock l(&mu_);
  auto& slot = regs_[Index(registration.capability)];
  if (slot) {
    return AlreadyExistsError(fmt::format("capability \"{}\" is already registered",
                                          CapabilityName(registration.capability)));
  }
  auto r = std::make_unique<Registration>();
  r->role = registration.resident_role.value_or(DefaultRoleFor(registration.capability));
  r->priority = ResidentRolePriority(r->role);
  r->reg = std::move(registration);
  slot = std::move(r);
  for (const std::string& key : slot->reg.model_keys) FindOrCreateLocked(slot.get(), key);
  return OkStatus();
}

size_t MemoryArbiter::EstimateFor(const Registration& reg, const std::string& model_key) const {
  if (reg.reg.estimate_bytes) return reg.reg.estimate_bytes(model_key);
  return reg.reg.estimated_bytes;
}

MemoryArbiter::Entry* MemoryArbiter::FindEntry(Capability capability,
                                               std::string_view model_key) const {
  const KeyTable* t = tables_[Index(capability)].load(std::memory_order_acquire);
  if (t == nullptr) return nullptr;
  const uint64_t h = HashKey(model_key);
  for (size_t i = h & t->mask;; i = (i + 1) & t->mask) {
    Entry* e = t->slots[i].load(std::memory_order_acquire);
    if (e == nullptr) return nullptr;
    if (e->hash == h && e->model_key == model_key) return e;
  }
}

MemoryArbiter::Entry* MemoryArbiter::FindOrCreateLocked(Registration* reg,
                                                        std::string_view model_key) {
  if (Entry* found = FindEntry(reg->reg.capability, model_key)) return found;
  auto e = std::make_unique<Entry>();
  e->reg = reg;
  e->key = ResidentKey(reg->reg.capability, model_key);
  e->model_key = std::string(model_key);
  e->hash = HashKey(model_key);
  e->capability = reg->reg.capability;
  e->role = reg->role;
  if (reg->reg.role_for) {
    if (std::optional<ResidentRole> role = reg->reg.role_for(e->model_key)) e->role = *role;
  }
  e->priority = ResidentRolePriority(e->role);
  e->idle_ttl_ms = reg->reg.idle_ttl_ms;
  if (reg->reg.idle_ttl_for) {
    if (std::optional<int64_t> ttl = reg->reg.idle_ttl_for(e->model_key)) e->idle_ttl_ms = ttl;
  }
  e->swap_same_role = reg->reg.swap_same_role;
  if (reg->reg.swap_same_role_for) {
    if (std::optional<bool> swap = reg->reg.swap_same_role_for(e->model_key)) {
      e->swap_same_role = *swap;
    }
  }
  e->bytes = EstimateFor(*reg, e->model_key);
  Entry* raw = e.get();
  entries_.push_back(std::move(e));
  order_.push_back(raw);
  // Publish in the capability's table (Note [Fast path]), growing it first
  // when it would be more than half full.
  std::atomic<KeyTable*>& slot = tables_[Index(reg->reg.capability)];
  KeyTable* t = slot.load(std::memory_order_relaxed);
  if (t == nullptr || (t->used + 1) * 2 > t->slots.size()) {
    auto bigger = std::make_unique<KeyTable>(t == nullptr ? 16 : t->slots.size() * 2);
    if (t != nullptr) {
      for (const auto& s : t->slots) {
        Entry* o = s.load(std::memory_order_relaxed);
        if (o == nullptr) continue;
        size_t i = o->hash & bigger->mask;
        while (bigger->slots[i].load(std::memory_order_relaxed) != nullptr) {
          i = (i + 1) & bigger->mask;
        }
        bigger->slots[i].store(o, std::memory_order_relaxed);
      }
      bigger->used = t->used;
    }
    t = bigger.get();
    tables_owned_.push_back(std::move(bigger));
    slot.store(t, std::memory_order_release);
  }
  size_t i = raw->hash & t->mask;
  while (t->slots[i].load(std::memory_order_relaxed) != nullptr) i = (i + 1) & t->mask;
  t->slots[i].store(raw, std::memory_order_release);
  t->used++;
  return raw;
}

void MemoryArbiter::AddIdleLocked(Entry* e) {
  if (e->idle_listed || e->role == ResidentRole::kTextTarget) return;
  e->lru = LruKey{e->last_used.load(std::memory_order_acquire), e->priority, e->loaded_at_ms,
                  ++seq_};
  idle_listed_++;
  idle_by_role_[Index(e->role)].emplace(e->lru, e);
  e->idle_listed = true;
}

void MemoryArbiter::RemoveIdleLocked(Entry* e) {
  if (!e->idle_listed) return;
  idle_listed_--;
  idle_by_role_[Index(e->role)].erase(e->lru);
  e->idle_listed = false;
}

void MemoryArbiter::RelistLocked(std::vector<Entry*>* held) {
  for (Entry* e : *held) {
    if (e->state == ModelState::kLoaded) AddIdleLocked(e);
  }
  held->clear();
}

bool MemoryArbiter::TryCloseLocked(Entry* e) {
  uint32_t expected = kOpen;
  return e->pin.compare_exchange_strong(expected, 0, std::memory_order_acq_rel);
}

MemoryArbiter::Entry* MemoryArbiter::ClaimLruLocked(std::map<LruKey, Entry*>* lru,
                                                    std::vector<Entry*>* held) {
  while (!lru->empty()) {
    Entry* e = lru->begin()->second;
    const int64_t stamp = e->last_used.load(std::memory_order_acquire);
    if (stamp != e->lru.last_used_ms) {  // stale: re-key
      RemoveIdleLocked(e);
      AddIdleLocked(e);
      continue;
    }
    if (!TryCloseLocked(e)) {  // held
      RemoveIdleLocked(e);
      held->push_back(e);
      continue;
    }
    if (e->last_used.load(std::memory_order_acquire) != stamp) {
      // Acquired and released between the check and the close: reopen.
      e->pin.store(kOpen, std::memory_order_release);
      RemoveIdleLocked(e);
      AddIdleLocked(e);
      continue;
    }
    return e;
  }
  return nullptr;
}

void MemoryArbiter::AddRoleMemberLocked(Entry* e) {
  if (e->role_slot != kNoSlot) return;
  std::vector<Entry*>& members = role_members_[Index(e->role)];
  e->role_slot = members.size();
  members.push_back(e);
}

void MemoryArbiter::RemoveRoleMemberLocked(Entry* e) {
  if (e->role_slot == kNoSlot) return;
  std::vector<Entry*>& members = role_members_[Index(e->role)];
  Entry* last = members.back();
  members[e->role_slot] = last;
  last->role_slot = e->role_slot;
  members.pop_back();
  e->role_slot = kNoSlot;
}

MemoryArbiter::Entry* MemoryArbiter::ClaimFitVictimLocked(std::vector<Entry*>* held) {
  for (;;) {
    // Normalize each role's begin() (fresh key, not held), take the least.
    Entry* best = nullptr;
    for (auto& by_role : idle_by_role_) {
      while (!by_role.empty()) {
        Entry* e = by_role.begin()->second;
        if (e->last_used.load(std::memory_order_acquire) != e->lru.last_used_ms) {
          RemoveIdleLocked(e);
          AddIdleLocked(e);
        } else if (Count(e->pin.load(std::memory_order_acquire)) > 0) {
          RemoveIdleLocked(e);
          held->push_back(e);
        } else {
          break;
        }
      }
      if (!by_role.empty() && (best == nullptr || by_role.begin()->first < best->lru)) {
        best = by_role.begin()->second;
      }
    }
    if (best == nullptr) return nullptr;
    const int64_t stamp = best->lru.last_used_ms;
    if (!TryCloseLocked(best)) {  // pinned since the check
      RemoveIdleLocked(best);
      held->push_back(best);
      continue;
    }
    if (best->last_used.load(std::memory_order_acquire) != stamp) {  // see ClaimLruLocked
      best->pin.store(kOpen, std::memory_order_release);
      RemoveIdleLocked(best);
      AddIdleLocked(best);
      continue;
    }
    return best;
  }
}

int MemoryArbiter::HeldCountLocked() const {
  int held = 0;
  for (const Entry* e : order_) held += static_cast<int>(Count(e->pin.load()));
  return held;
}

ArbiterHandle MemoryArbiter::MakeHandle(Entry* e) {
  ArbiterHandle h;
  h.arbiter_ = this;
  h.entry_ = e;
  h.model_ = &e->model_key;
  h.backend_ = &e->backend;
  h.capability_ = e->capability;
  return h;
}

ArbiterHandle MemoryArbiter::PinLocked(Entry* e) {
  assert(e->state == ModelState::kLoaded);
  e->pin.fetch_add(1, std::memory_order_acq_rel);
  // The slow path stamps exactly (even if the clock went back) and re-keys
  // when the stamp falls below the listed key (Note [Fast path]).
  const int64_t now = StampMs();
  e->last_used.store(now, std::memory_order_release);
  if (e->idle_listed && now < e->lru.last_used_ms) {
    RemoveIdleLocked(e);
    AddIdleLocked(e);
  }
  return MakeHandle(e);
}

bool MemoryArbiter::TryPinFast(Entry* e) const {
  const uint32_t gate = gate_.load(std::memory_order_acquire);
  if ((gate & kGateShutdown) != 0) return false;
  if ((gate & kGateCritical) != 0 && e->capability != Capability::kText) return false;
  if (ledger_->OverBudgetHint()) return false;
  const int64_t now = StampMs();
  if (now < e->last_used.load(std::memory_order_relaxed)) return false;
  uint32_t w = e->pin.load(std::memory_order_relaxed);
  do {
    if ((w & kOpen) == 0) return false;
  } while (!e->pin.compare_exchange_weak(w, w + 1, std::memory_order_acquire,
                                         std::memory_order_relaxed));
  int64_t stamp = e->last_used.load(std::memory_order_relaxed);
  while (stamp < now &&
         !e->last_used.compare_exchange_weak(stamp, now, std::memory_order_release,
                                             std::memory_order_relaxed)) {
  }
  return true;
}

Result<ArbiterHandle> MemoryArbiter::RetainEntry(Entry* e) {
  // The caller's handle pins e: the count is ≥ 1 and e cannot be closed.
  e->pin.fetch_add(1, std::memory_order_relaxed);
  return MakeHandle(e);
}

void MemoryArbiter::ReleaseEntry(Entry* e) {
  // seq_cst RMW then seq_cst load: see ReleaseWaiter in Note [Fast path].
  const uint32_t prev = e->pin.fetch_sub(1);
  assert(Count(prev) > 0 && "ArbiterHandle released more often than pinned");
  if (Count(prev) == 1 && (gate_.load() & ~kGateCritical) != 0) ReleaseSlow(e);
}

void MemoryArbiter::ReleaseSlow(Entry* e) {
  std::vector<Unloaded> unloaded;
  {
    MutexLock l(&mu_);
    if (shutting_down_ && e->state == ModelState::kLoaded && TryCloseLocked(e)) {
      EvictLocked(e, UnloadReason::kShutdown, &unloaded);
    }
    changed_.SignalAll();
  }
  if (!unloaded.empty()) FinishUnloads(&unloaded);
}

void MemoryArbiter::EvictLocked(Entry* e, UnloadReason reason, std::vector<Unloaded>* out) {
  assert(e->pin.load() == 0 && "evicting an open or pinned entry");
  RemoveIdleLocked(e);
  RemoveRoleMemberLocked(e);
  resident_bytes_ -= e->bytes;
  e->charge.Release();
  e->part_charges.clear();
  out->push_back(Unloaded{e->reg, e->capability, e->model_key, std::move(e->backend), reason,
                          e->bytes});
  e->backend = LoadedBackend{};
  e->state = ModelState::kReady;
  if (reason != UnloadReason::kShutdown) {
    e->evictions++;
    evictions_++;
  }
  changed_.SignalAll();
}

void MemoryArbiter::EvictToFitLocked(size_t incoming, std::vector<Unloaded>* out) {
  if (idle_listed_ == 0) return;  // no victim: skip the ledger lookups
  if (incoming == 0 && !ledger_->OverBudgetHint()) return;
  const uint64_t budget = ledger_->budget_bytes();
  if (budget == 0) return;
  std::vector<Entry*> held;
  while (ledger_->charged_bytes() + incoming > budget) {
    Entry* victim = ClaimFitVictimLocked(&held);
    if (victim == nullptr) break;
    EvictLocked(victim, UnloadReason::kFit, out);
  }
  RelistLocked(&held);
}

size_t MemoryArbiter::ReclaimIdle(size_t bytes, size_t* evicted) {
  // One victim at a time: its unload may free more than its own charge (the
  // weight cache releases its weights there), so the ledger is re-read after
  // each unload has run.
  size_t freed = 0;
  for (;;) {
    std::vector<Unloaded> unloaded;
    {
      MutexLock l(&mu_);
      const uint64_t budget = ledger_->budget_bytes();
      if (shutting_down_ || idle_listed_ == 0 || budget == 0 ||
          ledger_->charged_bytes() + bytes <= budget) {
        break;
      }
      std::vector<Entry*> held;
      Entry* victim = ClaimFitVictimLocked(&held);
      RelistLocked(&held);
      if (victim == nullptr) break;
      freed += victim->bytes;
      if (evicted != nullptr) ++*evicted;
      EvictLocked(victim, UnloadReason::kFit, &unloaded);
    }
    FinishUnloads(&unloaded);
  }
  return freed;
}

void MemoryArbiter::ClaimLocked(Entry* e, size_t incoming) {
  e->state = ModelState::kLoading;
  ++e->load_attempt;
  AddRoleMemberLocked(e);
  loading_count_++;
  e->bytes = incoming;
  loading_bytes_ += incoming;
  e->charge = ledger_->Charge(e->key, e->reg->reg.charge_kind, incoming);
}

void MemoryArbiter::FinishUnloads(std::vector<Unloaded>* unloaded) {
  for (Unloaded& u : *unloaded) {
    if (u.reg->reg.unload && u.backend.object) {
      try {
        u.reg->reg.unload(u.backend);
      } catch (const std::exception& ex) {
        spdlog::error("arbiter: unload of {} threw: {}", ResidentKey(u.capability, u.model_key),
                      ex.what());
      } catch (...) {
        spdlog::error("arbiter: unload of {} threw", ResidentKey(u.capability, u.model_key));
      }
    }
    u.backend = LoadedBackend{};  // frees the object unless the caller copied it
    if (spdlog::should_log(spdlog::level::info)) {
      spdlog::info("arbiter: unloaded {} ({}, reason {})", ResidentKey(u.capability, u.model_key),
                   FormatSize(u.bytes), UnloadReasonName(u.reason));
    }
    if (!HasListeners()) continue;
    ArbiterEvent ev;
    ev.type = ArbiterEventType::kModelUnload;
    ev.capability = u.capability;
    ev.model_key = u.model_key;
    ev.reason = u.reason;
    ev.at_ms = clock_->NowMs();
    Emit(ev);
    if (u.reason != UnloadReason::kShutdown) {
      ev.type = ArbiterEventType::kEviction;
      ev.estimated_bytes = u.bytes;
      Emit(ev);
    }
  }
  unloaded->clear();
}

bool MemoryArbiter::HasListeners() const {
  return listeners_->count.load(std::memory_order_acquire) > 0;
}

void MemoryArbiter::Emit(const ArbiterEvent& event) {
  std::vector<std::pair<uint64_t, std::shared_ptr<ArbiterEventListener>>> copy;
  {
    MutexLock l(&listeners_->mu);
    if (listeners_->map.empty()) return;
    copy.assign(listeners_->map.begin(), listeners_->map.end());
  }
  for (auto& [id, fn] : copy) {
    bool failed = false;
    try {
      (*fn)(event);
    } catch (const std::exception& ex) {
      failed = true;
      spdlog::warn("arbiter: event listener threw ({}); removed", ex.what());
    } catch (...) {
      failed = true;
      spdlog::warn("arbiter: event listener threw; removed");
    }
    if (failed) {
      MutexLock l(&listeners_->mu);
      listeners_->map.erase(id);
      listeners_->count.store(listeners_->map.size(), std::memory_order_release);
    }
  }
}

ArbiterEventSubscription MemoryArbiter::OnEvent(ArbiterEventListener listener) {
  uint64_t id;
  {
    MutexLock l(&listeners_->mu);
    id = listeners_->next_id++;
    listeners_->map.emplace(id, std::make_shared<ArbiterEventListener>(std::move(listener)));
    listeners_->count.store(listeners_->map.size(), std::memory_order_release);
  }
  std::weak_ptr<Listeners> weak = listeners_;
  return ArbiterEventSubscription([weak, id] {
    if (auto ls = weak.lock()) {
      MutexLock l(&ls->mu);
      ls->map.erase(id);
      ls->count.store(ls->map.size(), std::memory_order_release);
    }
  });
}

Result<ArbiterHandle> MemoryArbiter::Acquire(Capability capability, std::string_view model_key,
                                             ArbiterDeadline deadline) {
  // Note [Fast path].
  if (Entry* e = FindEntry(capability, model_key); e != nullptr && TryPinFast(e)) {
    return MakeHandle(e);
  }
  return AcquireSlow(capability, model_key, deadline);
}

Result<ArbiterHandle> MemoryArbiter::AcquireSlow(Capability capability,
                                                 std::string_view model_key,
                                                 ArbiterDeadline deadline) {
  // Note [Reclaim through a Reclaimer]: at most one round of reclaim per
  // acquire, then the decision is made as without one.
  bool reclaimed = false;
  for (;;) {
    std::vector<Unloaded> unloaded;
    Entry* e = nullptr;
    Status error;
    std::optional<ArbiterHandle> reused;
    size_t reclaim_bytes = 0;   // > 0: ask the reclaimer for room, then retry
    bool fit_after = false;     // ask the reclaimer to bring the ledger within budget
    {
      MutexLock l(&mu_);
      Registration* reg = regs_[Index(capability)].get();
      if (reg == nullptr) {
        return NotFoundError(
            fmt::format("no capability registered for \"{}\"", CapabilityName(capability)));
      }
      std::optional<std::chrono::steady_clock::time_point> drain_deadline;
      std::optional<ReleaseWaiter> waiter;  // registered before a drain wait
      for (;;) {
        if (shutting_down_) {
          error = UnavailableError(fmt::format("arbiter is shutting down; cannot acquire {}",
                                               CapabilityName(capability)),
                                   ErrorReason::kShuttingDown);
          break;
        }
        if (level_ == MemoryPressureLevel::kCritical && capability != Capability::kText) {
          error = UnavailableError(fmt::format(
              "memory pressure is critical; refusing to load capability \"{}\". Free RAM and retry.",
              CapabilityName(capability)), ErrorReason::kMemoryPressure);
          break;
        }
        e = FindOrCreateLocked(reg, model_key);
        if (e->state == ModelState::kLoaded) {
          reused = PinLocked(e);
          // An earlier best-effort load (or another ledger owner) may have left
          // the footprint over budget while idle victims now exist.
          if (options_.reclaimer == nullptr) {
            EvictToFitLocked(0, &unloaded);
          } else {
            fit_after = ledger_->OverBudgetHint();
          }
          break;
        }
        if (e->state == ModelState::kLoading) {
          const uint64_t attempt = e->load_attempt;
          if (!changed_.WaitUntil(deadline) && RealNow() >= deadline &&
              e->state == ModelState::kLoading) {
            error = DeadlineExceededError(fmt::format(
                "deadline passed while waiting for {} to load; the load continues, retry later",
                e->key), ErrorReason::kAcquireTimeout);
            break;
          }
          if (e->state == ModelState::kFailed && e->load_attempt == attempt) {
            error = e->last_error;
            break;
          }
          continue;
        }
        // Same-role conflicts, loads in flight included (defect 4).
        Entry* conflict = nullptr;
        if (e->swap_same_role) {
          for (Entry* o : role_members_[Index(e->role)]) {
            if (o != e) {
              conflict = o;
              break;
            }
          }
        }
        if (conflict != nullptr) {
          if (conflict->state == ModelState::kLoaded && TryCloseLocked(conflict)) {
            EvictLocked(conflict, UnloadReason::kSwap, &unloaded);
            continue;
          }
          if (!waiter) {  // register, then re-check (Note [Fast path])
            waiter.emplace(this);
            continue;
          }
          // Note [Waits use real time].
          if (!drain_deadline) {
            drain_deadline = RealNow() + std::chrono::milliseconds(options_.drain_timeout_ms);
          }
          const auto until = std::min(deadline, *drain_deadline);
          changed_.WaitUntil(until);
          if (RealNow() >= until) {
            // Re-check: the conflict may have drained exactly now.
            bool still = conflict->role_slot != kNoSlot &&
                         !(conflict->state == ModelState::kLoaded &&
                           Count(conflict->pin.load()) == 0);
            if (still) {
              if (until == *drain_deadline) {
                error = DeadlineExceededError(fmt::format(
                    "timeout waiting for {}/{} to drain (refcount={}); refusing to swap mid-flight",
                    CapabilityName(conflict->capability), conflict->model_key,
                    Count(conflict->pin.load())), ErrorReason::kAcquireTimeout);
              } else {
                error = DeadlineExceededError(fmt::format(
                    "deadline passed while waiting for {} to drain before loading {}",
                    conflict->key, e->key), ErrorReason::kAcquireTimeout);
              }
              break;
            }
          }
          continue;
        }
        const size_t incoming = e->measured ? e->bytes : EstimateFor(*reg, e->model_key);
        const uint64_t budget = ledger_->budget_bytes();
        // With a reclaimer, room is made by the policy (outside the lock),
        // once; refuse_over_budget's check below still decides first, so a
        // refused acquire frees nothing.
        const bool ask_reclaimer = options_.reclaimer != nullptr && !reclaimed && budget != 0 &&
                                   ledger_->charged_bytes() + incoming > budget;
        bool fitted = false;
        if (options_.refuse_over_budget && budget != 0) {
          // Note [Refusing over budget]: close LRU idle victims until the load
          // fits (O(victims), no scan); if it cannot fit while something is
          // held or loading, reopen them and fail without evicting.
          fitted = true;  // below: it fits, or every idle victim is evicted
          const uint64_t charged = ledger_->charged_bytes();
          std::vector<Entry*> claimed, held;
          uint64_t freed = 0;
          while (charged - std::min(charged, freed) + incoming > budget) {
            Entry* victim = ClaimFitVictimLocked(&held);
            if (victim == nullptr) break;
            RemoveIdleLocked(victim);
            claimed.push_back(victim);
            freed += victim->bytes;
          }
          const bool fits = charged - std::min(charged, freed) + incoming <= budget;
          if (!fits && (loading_count_ > 0 || HeldCountLocked() > 0)) {
            for (Entry* victim : claimed) {
              victim->pin.store(kOpen, std::memory_order_release);
              AddIdleLocked(victim);
            }
            RelistLocked(&held);
            std::string holders;
            for (const Entry* o : order_) {
              const uint32_t refs = Count(o->pin.load());
              if (refs > 0 || o->state == ModelState::kLoading) {
                if (!holders.empty()) holders += ", ";
                holders += refs > 0 ? fmt::format("\"{}\" {} ({} handle(s))", o->model_key,
                                                  FormatSize(o->bytes), refs)
                                    : fmt::format("\"{}\" {} (loading)", o->model_key,
                                                  FormatSize(o->bytes));
              }
            }
            error = ResourceExhaustedError(fmt::format(
                "cannot load model \"{}\" ({}): the memory budget is {} and {} is held by "
                "requests in flight; retry when they finish, or raise [memory] budget",
                e->model_key, FormatSize(incoming), FormatSize(budget),
                holders.empty() ? std::string("memory of other owners") : holders),
                ErrorReason::kBudgetExceeded);
            break;
          }
          if (ask_reclaimer) {
            for (Entry* victim : claimed) {
              victim->pin.store(kOpen, std::memory_order_release);
              AddIdleLocked(victim);
            }
            RelistLocked(&held);
            reclaim_bytes = incoming;
            break;
          }
          for (Entry* victim : claimed) EvictLocked(victim, UnloadReason::kFit, &unloaded);
          RelistLocked(&held);
        } else if (ask_reclaimer) {
          reclaim_bytes = incoming;
          break;
        }
        if (!fitted && options_.reclaimer == nullptr) EvictToFitLocked(incoming, &unloaded);
        ClaimLocked(e, incoming);
        break;
      }
    }
    if (!unloaded.empty()) FinishUnloads(&unloaded);
    if (reclaim_bytes > 0) {
      options_.reclaimer->MakeRoom(reclaim_bytes);
      reclaimed = true;
      continue;  // the world changed: decide again
    }
    if (fit_after) options_.reclaimer->MakeRoom(0);
    if (reused) return std::move(*reused);
    if (!error.ok()) return error;
    return LoadClaimed(e, /*pin=*/true);
  }
}

Result<ArbiterHandle> MemoryArbiter::LoadClaimed(Entry* e, bool pin) {
  const int64_t t0 = clock_->NowNs();
  Result<LoadedBackend> loaded = InternalError("load not run");
  try {
    loaded = e->reg->reg.load(e->model_key);
  } catch (const std::exception& ex) {
    loaded = InternalError(fmt::format("load threw an exception: {}", ex.what()));
  } catch (...) {
    loaded = InternalError("load threw an unknown exception");
  }
  const double load_ms = static_cast<double>(clock_->NowNs() - t0) / 1e6;
  if (loaded.ok() && !loaded->object) loaded = InternalError("load returned no backend");

  std::vector<Unloaded> unloaded;
  Result<ArbiterHandle> out = InternalError("unreachable");
  bool published = false;
  bool fit_after = false;
  size_t bytes = 0;
  {
    MutexLock l(&mu_);
    loading_count_--;
    loading_bytes_ -= e->bytes;
    e->last_load_ms = load_ms;
    bytes = e->bytes;
    if (loaded.ok()) {
      LoadedBackend b = std::move(loaded).value();
      if (b.resident_bytes > 0) {
        e->bytes = b.resident_bytes;
        e->measured = true;
        // Estimate → measured: shrink (or grow) the estimate to the part of
        // the registration's kind first, then charge the other parts, so the
        // total never exceeds max(estimate, measured).
        size_t main_bytes = e->bytes;
        const ChargeKind main_kind = e->reg->reg.charge_kind;
        size_t parts_total = 0;
        for (const auto& [kind, bytes] : b.charge_parts) parts_total += bytes;
        const bool split = !b.charge_parts.empty() && parts_total == b.resident_bytes;
        if (split) {
          main_bytes = 0;
          for (const auto& [kind, bytes] : b.charge_parts) {
            if (kind == main_kind) main_bytes += bytes;
          }
        }
        e->charge.ForceResize(main_bytes);
        if (split) {
          for (const auto& [kind, bytes] : b.charge_parts) {
            if (kind != main_kind) e->part_charges.push_back(ledger_->Charge(e->key, kind, bytes));
          }
        }
      }
      e->state = ModelState::kLoaded;
      e->backend = std::move(b);
      e->last_error = OkStatus();
      e->loads++;
      loads_++;
      resident_bytes_ += e->bytes;
      bytes = e->bytes;
      e->loaded_at_ms = StampMs();
      e->last_used.store(e->loaded_at_ms, std::memory_order_relaxed);
      if (shutting_down_) {
        // Note [Shutdown]: a load finishing after shutdown unloads itself
        // (never opened, so no fast acquire can have pinned it).
        EvictLocked(e, UnloadReason::kShutdown, &unloaded);
        out = UnavailableError(fmt::format("arbiter is shutting down; cannot acquire {}",
                                           CapabilityName(e->capability)),
                               ErrorReason::kShuttingDown);
      } else {
        published = true;
        // Open for fast acquires: e->backend is written (Note [Fast path]).
        e->pin.store(kOpen, std::memory_order_release);
        if (pin) {
          out = PinLocked(e);
        } else {
          out = ArbiterHandle();
        }
        AddIdleLocked(e);
        // The measured size may exceed the estimate: make room again. Not for
        // a preload (defect 7: preload never evicts); the next acquire's
        // evict-to-fit makes room.
        if (pin && options_.reclaimer == nullptr) EvictToFitLocked(0, &unloaded);
        fit_after = pin && options_.reclaimer != nullptr && ledger_->OverBudgetHint();
      }
    } else {
      RemoveRoleMemberLocked(e);
      e->charge.Release();
      e->state = ModelState::kFailed;
      // Note [Typed error reasons]: a reason born inside the load (the
      // weight cache's budget_exceeded, not_resident) is kept; any other
      // failure is the model's own (load_failed).
      e->last_error =
          loaded.status().WithPrefix(fmt::format("model \"{}\" failed to load", e->model_key));
      // Out of memory inside a load (the device pool, an allocation) is the
      // budget's transient refusal too.
      if (e->last_error.reason() == ErrorReason::kNone) {
        e->last_error = e->last_error.WithReason(e->last_error.code() == StatusCode::kResourceExhausted
                                                     ? ErrorReason::kBudgetExceeded
                                                     : ErrorReason::kLoadFailed);
      }
      e->load_failures++;
      load_failures_++;
      out = e->last_error;
    }
    changed_.SignalAll();
  }
  if (published) {
    if (spdlog::should_log(spdlog::level::info)) {
      spdlog::info("arbiter: loaded {} ({}) in {:.0f} ms", e->key, FormatSize(bytes), load_ms);
    }
    if (HasListeners()) {
      ArbiterEvent ev;
      ev.type = ArbiterEventType::kModelLoad;
      ev.capability = e->capability;
      ev.model_key = e->model_key;
      ev.load_ms = load_ms;
      ev.at_ms = clock_->NowMs();
      Emit(ev);
    }
  } else if (!out.ok()) {
    spdlog::error("arbiter: {}", out.status().message());
  }
  if (!unloaded.empty()) FinishUnloads(&unloaded);
  if (fit_after) options_.reclaimer->MakeRoom(0);
  return out;
}

Result<bool> MemoryArbiter::Unload(Capability capability, std::string_view model_key,
                                   ArbiterDeadline deadline) {
  std::vector<Unloaded> unloaded;
  {
    MutexLock l(&mu_);
    Registration* reg = regs_[Index(capability)].get();
    if (reg == nullptr) {
      return NotFoundError(
          fmt::format("no capability registered for \"{}\"", CapabilityName(capability)));
    }
    Entry* e = FindEntry(capability, model_key);
    if (e == nullptr) return false;
    ReleaseWaiter waiter(this);  // before the first check (Note [Fast path])
    for (;;) {
      if (e->state == ModelState::kLoaded && TryCloseLocked(e)) break;
      if (e->state != ModelState::kLoaded && e->state != ModelState::kLoading) return false;
      // Note [Waits use real time].
      if (!changed_.WaitUntil(deadline) && RealNow() >= deadline) {
        if (e->state == ModelState::kLoaded && TryCloseLocked(e)) break;
        if (e->state == ModelState::kLoading) {
          return DeadlineExceededError(fmt::format("{} is still loading; not unloaded", e->key),
                                       ErrorReason::kLoadInProgress);
        }
        if (e->state != ModelState::kLoaded) return false;
        return DeadlineExceededError(fmt::format("{} is held by {} handle(s); not unloaded",
                                                 e->key, Count(e->pin.load())),
                                     ErrorReason::kModelHeld);
      }
    }
    EvictLocked(e, UnloadReason::kManual, &unloaded);
  }
  FinishUnloads(&unloaded);
  return true;
}

bool MemoryArbiter::Preload(Capability capability, std::string_view model_key) {
  Entry* e = nullptr;
  {
    MutexLock l(&mu_);
    Registration* reg = regs_[Index(capability)].get();
    const uint64_t budget = ledger_->budget_bytes();
    if (reg == nullptr || shutting_down_ || level_ != MemoryPressureLevel::kNominal ||
        budget == 0) {
      return false;
    }
    e = FindOrCreateLocked(reg, model_key);
    if (e->state == ModelState::kLoaded) {
      const bool listed = e->idle_listed;
      RemoveIdleLocked(e);
      e->last_used.store(StampMs(), std::memory_order_release);
      if (listed) AddIdleLocked(e);
      return true;
    }
    if (e->state == ModelState::kLoading) return false;
    const size_t incoming = e->measured ? e->bytes : EstimateFor(*reg, e->model_key);
    if (incoming == 0 || ledger_->charged_bytes() + incoming > budget) return false;
    // Defect 7: a same-role conflict would need a swap; preload never evicts.
    if (e->swap_same_role && !role_members_[Index(e->role)].empty()) return false;
    ClaimLocked(e, incoming);
  }
  return LoadClaimed(e, /*pin=*/false).ok();
}

void MemoryArbiter::HandlePressure(const MemoryPressureEvent& event) {
  SetPressureLevel(event);
  size_t n_unloaded = 0;
  if (event.level == MemoryPressureLevel::kLow) {
    n_unloaded = EvictIdleByPriority(1, UnloadReason::kPressure);
  } else if (event.level == MemoryPressureLevel::kCritical) {
    n_unloaded = EvictIdleByPriority(SIZE_MAX, UnloadReason::kPressure);
  }
  if (event.level != MemoryPressureLevel::kNominal && vision_cache_ != nullptr) {
    vision_cache_->PurgeExpired();
  }
  if (event.level != MemoryPressureLevel::kNominal) {
    spdlog::warn("arbiter: memory pressure {} from {}; unloaded {} idle model(s)",
                 MemoryPressureLevelName(event.level), event.source, n_unloaded);
  }
}

void MemoryArbiter::SetPressureLevel(const MemoryPressureEvent& event) {
  {
    MutexLock l(&mu_);
    level_ = event.level;
    if (event.level == MemoryPressureLevel::kCritical) {
      gate_.fetch_or(kGateCritical);
    } else {
      gate_.fetch_and(~kGateCritical);
    }
  }
  ArbiterEvent ev;
  ev.type = ArbiterEventType::kMemoryPressure;
  ev.level = event.level;
  ev.source = event.source;
  ev.free_bytes = event.free_bytes;
  ev.at_ms = clock_->NowMs();
  Emit(ev);
}

size_t MemoryArbiter::EvictIdleByPriority(size_t max_entries, UnloadReason reason) {
  std::vector<Unloaded> unloaded;
  {
    MutexLock l(&mu_);
    if (shutting_down_) return 0;
    // Lowest-priority role first; text-target is never listed (defect 1) and
    // held entries are set aside (defect 2).
    std::vector<Entry*> held;
    for (auto& by_role : idle_by_role_) {
      while (unloaded.size() < max_entries) {
        Entry* victim = ClaimLruLocked(&by_role, &held);
        if (victim == nullptr) break;
        EvictLocked(victim, reason, &unloaded);
      }
      if (unloaded.size() >= max_entries) break;
    }
    RelistLocked(&held);
  }
  const size_t n = unloaded.size();
  // Unload before any logging: the log line is not on the way to freed memory.
  if (n > 0) FinishUnloads(&unloaded);
  return n;
}

std::optional<ResidentEntryInfo> MemoryArbiter::NextFitVictim() const {
  MutexLock l(&mu_);
  // The order of LruKey (ClaimFitVictimLocked), read without closing.
  const Entry* best = nullptr;
  std::tuple<int64_t, int, int64_t> best_key{};
  for (const Entry* e : order_) {
    if (e->state != ModelState::kLoaded || e->role == ResidentRole::kTextTarget ||
        Count(e->pin.load(std::memory_order_acquire)) > 0) {
      continue;
    }
    const std::tuple<int64_t, int, int64_t> k{e->last_used.load(std::memory_order_acquire),
                                              e->priority, e->loaded_at_ms};
    if (best == nullptr || k < best_key) {
      best = e;
      best_key = k;
    }
  }
  if (best == nullptr) return std::nullopt;
  return InfoLocked(*best);
}

std::optional<ResidentEntryInfo> MemoryArbiter::NextPressureVictim() const {
  MutexLock l(&mu_);
  const Entry* best = nullptr;
  std::tuple<int, int64_t, int64_t> best_key{};
  for (const Entry* e : order_) {
    if (e->state != ModelState::kLoaded || e->role == ResidentRole::kTextTarget ||
        Count(e->pin.load(std::memory_order_acquire)) > 0) {
      continue;
    }
    // Role priority first, then least recently used (EvictIdleByPriority).
    const std::tuple<int, int64_t, int64_t> k{
        e->priority, e->last_used.load(std::memory_order_acquire), e->loaded_at_ms};
    if (best == nullptr || k < best_key) {
      best = e;
      best_key = k;
    }
  }
  if (best == nullptr) return std::nullopt;
  return InfoLocked(*best);
}

size_t MemoryArbiter::ReapIdle() {
  std::vector<Unloaded> unloaded;
  {
    MutexLock l(&mu_);
    const int64_t now = StampMs();
    for (Entry* e : order_) {
      const auto& ttl = e->idle_ttl_ms;
      if (ttl && e->state == ModelState::kLoaded &&
          now - e->last_used.load(std::memory_order_acquire) >= *ttl && TryCloseLocked(e)) {
        EvictLocked(e, UnloadReason::kIdle, &unloaded);
      }
    }
  }
  const size_t n = unloaded.size();
  if (n > 0) FinishUnloads(&unloaded);
  return n;
}

void MemoryArbiter::ReaperLoop() {
  for (;;) {
    {
      MutexLock l(&mu_);
      if (reaper_stop_) return;
      reaper_cv_.WaitUntil(RealNow() + std::chrono::milliseconds(options_.idle_check_interval_ms));
      if (reaper_stop_) return;
    }
    ReapIdle();
  }
}

Status MemoryArbiter::Start() {
  {
    MutexLock l(&mu_);
    if (shutting_down_) return FailedPreconditionError("cannot start after shutdown");
    if (started_) return OkStatus();
    started_ = true;
    reaper_stop_ = false;
  }
  MutexLock lc(&lifecycle_mu_);
  if (pressure_source_ != nullptr) {
    Status s = pressure_source_->Start();
    if (!s.ok()) {
      MutexLock l(&mu_);
      started_ = false;
      return s;
    }
    pressure_sub_ =
        pressure_source_->Subscribe([this](const MemoryPressureEvent& ev) { HandlePressure(ev); });
  }
  if (options_.idle_check_interval_ms > 0) reaper_ = std::thread([this] { ReaperLoop(); });
  return OkStatus();
}

void MemoryArbiter::Stop() {
  {
    MutexLock l(&mu_);
    if (!started_) return;
    started_ = false;
    reaper_stop_ = true;
    reaper_cv_.SignalAll();
  }
  MutexLock lc(&lifecycle_mu_);
  pressure_sub_.Reset();
  if (pressure_source_ != nullptr) pressure_source_->Stop();
  if (reaper_.joinable()) reaper_.join();
}

void MemoryArbiter::Shutdown() {
  {
    MutexLock l(&mu_);
    shutting_down_ = true;
    gate_.fetch_or(kGateShutdown);  // fast acquires fail over; releases to 0 lock
    changed_.SignalAll();
  }
  Stop();
  // Close the queues and join their workers (pending items fail).
  std::vector<std::thread> workers;
  {
    MutexLock l(&queue_mu_);
    queues_closed_ = true;
    for (auto& q : queues_) {
      if (q) {
        q->cv.SignalAll();
        if (q->worker.joinable()) workers.push_back(std::move(q->worker));
      }
    }
  }
  for (std::thread& t : workers) t.join();
  std::vector<Unloaded> unloaded;
  {
    MutexLock l(&mu_);
    const auto until = RealNow() + std::chrono::milliseconds(options_.shutdown_timeout_ms);
    ReleaseWaiter waiter(this);  // before the first check (Note [Fast path])
    while ((loading_count_ > 0 || HeldCountLocked() > 0) && RealNow() < until) {
      changed_.WaitUntil(until);
    }
    for (Entry* e : order_) {
      if (e->state == ModelState::kLoaded && TryCloseLocked(e)) {
        EvictLocked(e, UnloadReason::kShutdown, &unloaded);
      }
    }
    if (const int held = HeldCountLocked(); loading_count_ > 0 || held > 0) {
      spdlog::warn("arbiter: shutdown bound passed with {} load(s) in flight and {} handle(s) "
                   "held; they unload when they finish",
                   loading_count_, held);
    }
  }
  if (!unloaded.empty()) FinishUnloads(&unloaded);
}

std::future<Result<std::any>> MemoryArbiter::Request(Capability capability, std::string model_key,
                                                     std::any payload, std::stop_token stop) {
  Queue::Item item{std::move(model_key), std::move(payload), std::move(stop), {}};
  std::future<Result<std::any>> f = item.promise.get_future();
  MutexLock l(&queue_mu_);
  if (queues_closed_) {
    item.promise.set_value(UnavailableError(fmt::format(
        "arbiter is shutting down; cannot acquire {}", CapabilityName(capability))));
    return f;
  }
  auto& q = queues_[Index(capability)];
  if (!q) {
    q = std::make_unique<Queue>(&queue_mu_);
    Queue* raw = q.get();
    q->worker = std::thread([this, raw, capability] { QueueWorker(raw, capability); });
  }
  q->items.push_back(std::move(item));
  q->cv.Signal();
  return f;
}

void MemoryArbiter::QueueWorker(Queue* q, Capability capability) {
  for (;;) {
    Queue::Item item;
    {
      MutexLock l(&queue_mu_);
      while (q->items.empty() && !queues_closed_) q->cv.Wait();
      if (queues_closed_) {
        for (Queue::Item& rest : q->items) {
          rest.promise.set_value(UnavailableError(fmt::format(
              "arbiter is shutting down; cannot acquire {}", CapabilityName(capability))));
        }
        q->items.clear();
        return;
      }
      item = std::move(q->items.front());
      q->items.pop_front();
    }
    if (item.stop.stop_requested()) {
      item.promise.set_value(CancelledError(fmt::format(
          "request for {} was cancelled before it ran", ResidentKey(capability, item.model_key))));
      continue;
    }
    Result<ArbiterHandle> h = Acquire(capability, item.model_key,
                                      Deadline(std::chrono::milliseconds(
                                          options_.request_acquire_timeout_ms)));
    if (!h.ok()) {
      item.promise.set_value(h.status());
      continue;
    }
    const Registration* reg;
    {
      MutexLock l(&mu_);
      reg = regs_[Index(capability)].get();
    }
    Result<std::any> result = FailedPreconditionError(
        fmt::format("capability \"{}\" has no run function", CapabilityName(capability)));
    const int64_t t0 = clock_->NowNs();
    if (reg->reg.run) {
      try {
        result = reg->reg.run(*h, item.payload);
      } catch (const std::exception& ex) {
        result = InternalError(fmt::format("run threw an exception: {}", ex.what()));
      } catch (...) {
        result = InternalError("run threw an unknown exception");
      }
    }
    ArbiterEvent ev;
    ev.type = ArbiterEventType::kCapabilityRun;
    ev.capability = capability;
    ev.model_key = item.model_key;
    ev.run_ms = static_cast<double>(clock_->NowNs() - t0) / 1e6;
    ev.at_ms = clock_->NowMs();
    h->Release();
    Emit(ev);
    item.promise.set_value(std::move(result));
  }
}

std::vector<ResidentEntryInfo> MemoryArbiter::ResidentSnapshot() const {
  MutexLock l(&mu_);
  std::vector<ResidentEntryInfo> out;
  for (const Entry* e : order_) {
    if (e->state == ModelState::kLoaded) out.push_back(InfoLocked(*e));
  }
  return out;
}

ResidentEntryInfo MemoryArbiter::InfoLocked(const Entry& e) const {
  return ResidentEntryInfo{e.key,   e.capability, e.model_key, e.role, e.bytes,
                           static_cast<int>(Count(e.pin.load())), e.loaded_at_ms,
                           e.last_used.load()};
}

MemoryPressureLevel MemoryArbiter::CurrentPressureLevel() const {
  MutexLock l(&mu_);
  return level_;
}

ArbiterStats MemoryArbiter::Stats() const {
  MutexLock l(&mu_);
  ArbiterStats s;
  s.budget_bytes = static_cast<size_t>(ledger_->budget_bytes());
  s.charged_bytes = static_cast<size_t>(ledger_->charged_bytes());
  s.resident_bytes = resident_bytes_;
  s.loading_bytes = loading_bytes_;
  s.loads = loads_;
  s.load_failures = load_failures_;
  s.evictions = evictions_;
  s.pressure = level_;
  for (const Entry* e : order_) {
    ModelStats m;
    m.name = e->model_key;
    m.resident_key = e->key;
    m.capability = e->capability;
    m.role = e->role;
    m.state = e->state;
    m.bytes = e->bytes;
    m.bytes_measured = e->measured;
    m.refcount = static_cast<int>(Count(e->pin.load()));
    m.loads = e->loads;
    m.load_failures = e->load_failures;
    m.evictions = e->evictions;
    m.last_load_ms = e->last_load_ms;
    if (e->state == ModelState::kFailed) m.last_error = e->last_error.message();
    if (e->state == ModelState::kLoaded) s.resident_models++;
    s.models.push_back(std::move(m));
  }
  return s;
}

}  // namespace arbiter
