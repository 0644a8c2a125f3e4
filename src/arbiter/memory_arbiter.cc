// MemoryArbiter: capabilities, roles, handles, swaps, evict-to-fit against
// the MemoryLedger, pressure response, request queues, events.
//
// This file holds the design notes, the names, ArbiterHandle, the forwarding
// MemoryArbiter, and of MemoryArbiterImpl (internal/arbiter_impl.h) the
// registry, the key tables, the lock-free fast path, Start/Stop/Shutdown and
// the stats. The slow acquire and loads are in arbiter_load.cc, eviction and
// pressure in arbiter_eviction.cc, Request() in request_queues.cc, events in
// arbiter_events.cc (docs/memory-arbiter.md, "Where the code is").
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
//     conflict (docs/memory-arbiter.md, fixed defect 4), and a key is
//     claimed only in a lock section that saw no conflict.
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
//     fit or pressure (docs/memory-arbiter.md, fixed defects 1 and 2).
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
// SimulatedClock cannot turn them into hangs (docs/memory-arbiter.md, fixed
// defect 6). The injected clock stamps last-used / loaded-at / events and
// drives the idle TTL.
//
// Note [Refusing over budget]
// The reference (docs/memory-arbiter.md) is best effort: after evict-to-fit
// the load proceeds even if it still does not fit. With
// options.refuse_over_budget (the server sets it, docs/http-api.md
// `budget_exceeded`), an acquire that could not fit even
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
// after the lock instead of being fitted under it. Without a reclaimer the
// arbiter evicts to fit under mu_ by itself, as the reference does.

// Note [Fast path]
// Acquire + release of a resident entry runs on every request and in every
// handle copy, so it takes no lock, allocates nothing and copies no
// shared_ptr (its cost and target: docs/BENCHMARKS.md, "MemoryArbiter"):
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
//   - Stamps use Clock::CoarseNowMs() (CLOCK_MONOTONIC_COARSE: a fraction of
//     CLOCK_MONOTONIC's cost, docs/BENCHMARKS.md; ≤ one tick behind) for
//     last-used, loaded-at and the idle TTL, the same clock everywhere so
//     stamps are comparable; SimulatedClock returns NowMs(), so
//     last-used equals the clock at each acquire in tests.
//   - Stats() and ResidentSnapshot() read refcounts and stamps atomically:
//     exact at the instant each entry is read.
//
// Note [Shutdown]
// Shutdown refuses new work, stops the pressure source and the queues, then
// waits (bounded) for loads in flight and held handles. It then unloads every
// idle entry. A load that completes after the flag is set unloads its own
// result and fails its waiters; a handle released after shutdown unloads its
// entry at once. So no entry survives shutdown (docs/memory-arbiter.md, fixed
// defect 5), and held backends are never freed under a holder.
#include "arbiter/arbiter/memory_arbiter.h"

#include <algorithm>
#include <cassert>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "arbiter/base/size.h"
#include "internal/arbiter_impl.h"

namespace arbiter {
namespace {

constexpr std::string_view kCapabilityNames[kCapabilityCount] = {
    "text", "embedding", "vision-describe", "image-gen", "transcribe", "speak", "vad"};
constexpr std::string_view kRoleNames[kResidentRoleCount] = {
    "drafter", "emotion", "speaker-id", "vision", "embedding", "turn-detector",
    "wake-word", "vad", "asr", "tts", "text-target"};
constexpr int kRolePriorities[kResidentRoleCount] = {10, 15, 18, 20, 25, 28, 30, 35, 40, 50, 100};

using arbiter_internal::Index;


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
      "transcribe, speak, vad",
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
    case Capability::kVad: return ResidentRole::kVad;
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
  arbiter_internal::MemoryArbiterImpl* arbiter = std::exchange(arbiter_, nullptr);
  backend_ = nullptr;
  arbiter->ReleaseEntry(entry_);
}

Result<ArbiterHandle> ArbiterHandle::Retain() const {
  if (arbiter_ == nullptr) {
    return FailedPreconditionError(
        fmt::format("cannot retain {}/{} after release", CapabilityName(capability_), model()));
  }
  return arbiter_->RetainEntry(entry_);
}

// ---------------------------------------------------------------------------
// MemoryArbiter: forwards to its MemoryArbiterImpl.

MemoryArbiter::MemoryArbiter(MemoryArbiterOptions options)
    : impl_(std::make_unique<arbiter_internal::MemoryArbiterImpl>(options)) {}

MemoryArbiter::~MemoryArbiter() = default;

Status MemoryArbiter::RegisterCapability(CapabilityRegistration registration) {
  return impl_->RegisterCapability(std::move(registration));
}

Result<ArbiterHandle> MemoryArbiter::Acquire(Capability capability, std::string_view model_key,
                                             ArbiterDeadline deadline) {
  return impl_->Acquire(capability, model_key, deadline);
}

bool MemoryArbiter::Preload(Capability capability, std::string_view model_key) {
  return impl_->Preload(capability, model_key);
}

Result<bool> MemoryArbiter::Unload(Capability capability, std::string_view model_key,
                                   ArbiterDeadline deadline) {
  return impl_->Unload(capability, model_key, deadline);
}

size_t MemoryArbiter::ReclaimIdle(MemoryDomain domain, size_t bytes, size_t* evicted) {
  return impl_->ReclaimIdle(domain, bytes, evicted);
}

Result<bool> MemoryArbiter::UpdateResidentBytes(Capability capability,
                                                std::string_view model_key, size_t bytes) {
  return impl_->UpdateResidentBytes(capability, model_key, bytes);
}

std::future<Result<std::any>> MemoryArbiter::Request(Capability capability, std::string model_key,
                                                     std::any payload, std::stop_token stop) {
  return impl_->Request(capability, std::move(model_key), std::move(payload), std::move(stop));
}

ArbiterEventSubscription MemoryArbiter::OnEvent(ArbiterEventListener listener) {
  return impl_->OnEvent(std::move(listener));
}

Status MemoryArbiter::Start() { return impl_->Start(); }

void MemoryArbiter::Stop() { impl_->Stop(); }

void MemoryArbiter::Shutdown() { impl_->Shutdown(); }

void MemoryArbiter::HandlePressure(const MemoryPressureEvent& event) {
  impl_->HandlePressure(event);
}

void MemoryArbiter::SetPressureLevel(const MemoryPressureEvent& event) {
  impl_->SetPressureLevel(event);
}

size_t MemoryArbiter::EvictIdleByPriority(MemoryDomain domain, size_t max_entries,
                                          UnloadReason reason) {
  return impl_->EvictIdleByPriority(domain, max_entries, reason);
}

std::optional<ResidentEntryInfo> MemoryArbiter::NextFitVictim(MemoryDomain domain) const {
  return impl_->NextFitVictim(domain);
}

size_t MemoryArbiter::ReapIdle() { return impl_->ReapIdle(); }

Status MemoryArbiter::SetIdleTtl(Capability capability, std::string_view model_key,
                                 std::optional<int64_t> ttl_ms) {
  return impl_->SetIdleTtl(capability, model_key, ttl_ms);
}

std::vector<ResidentEntryInfo> MemoryArbiter::ResidentSnapshot() const {
  return impl_->ResidentSnapshot();
}

MemoryPressureLevel MemoryArbiter::CurrentPressureLevel() const {
  return impl_->CurrentPressureLevel();
}

ArbiterStats MemoryArbiter::Stats() const { return impl_->Stats(); }

size_t MemoryArbiter::budget_bytes() const {
  return static_cast<size_t>(impl_->ledger()->budget_bytes());
}

MemoryLedger* MemoryArbiter::ledger() const { return impl_->ledger(); }

namespace arbiter_internal {

// ---------------------------------------------------------------------------
// MemoryArbiterImpl: registry, key tables, the fast path, lifecycle, stats.

MemoryArbiterImpl::MemoryArbiterImpl(const MemoryArbiterOptions& options)
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

MemoryArbiterImpl::~MemoryArbiterImpl() {
  Shutdown();
  MutexLock l(&mu_);
  if (const int held = HeldCountLocked(); held > 0) {
    spdlog::error("arbiter destroyed with {} handle(s) outstanding", held);
  }
}

Status MemoryArbiterImpl::RegisterCapability(CapabilityRegistration registration) {
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

size_t MemoryArbiterImpl::EstimateFor(const Registration& reg, const std::string& model_key) const {
  if (reg.reg.estimate_bytes) return reg.reg.estimate_bytes(model_key);
  return reg.reg.estimated_bytes;
}

Entry* MemoryArbiterImpl::FindEntry(Capability capability, std::string_view model_key) const {
  const KeyTable* t = tables_[Index(capability)].load(std::memory_order_acquire);
  if (t == nullptr) return nullptr;
  const uint64_t h = HashKey(model_key);
  for (size_t i = h & t->mask;; i = (i + 1) & t->mask) {
    Entry* e = t->slots[i].load(std::memory_order_acquire);
    if (e == nullptr) return nullptr;
    if (e->hash == h && e->model_key == model_key) return e;
  }
}

Entry* MemoryArbiterImpl::FindOrCreateLocked(Registration* reg, std::string_view model_key) {
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
  e->charge_kind = reg->reg.charge_kind;
  if (reg->reg.charge_kind_for) {
    if (std::optional<ChargeKind> kind = reg->reg.charge_kind_for(e->model_key)) {
      e->charge_kind = *kind;
    }
  }
  if (reg->reg.domain_for) {
    if (std::optional<MemoryDomain> domain = reg->reg.domain_for(e->model_key)) {
      e->domain = *domain;
    }
  }
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

int MemoryArbiterImpl::HeldCountLocked() const {
  int held = 0;
  for (const Entry* e : order_) held += static_cast<int>(Count(e->pin.load()));
  return held;
}

ArbiterHandle MemoryArbiterImpl::MakeHandle(Entry* e) {
  ArbiterHandle h;
  h.arbiter_ = this;
  h.entry_ = e;
  h.model_ = &e->model_key;
  h.backend_ = &e->backend;
  h.capability_ = e->capability;
  return h;
}

ArbiterHandle MemoryArbiterImpl::PinLocked(Entry* e) {
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

bool MemoryArbiterImpl::TryPinFast(Entry* e) const {
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

Result<ArbiterHandle> MemoryArbiterImpl::RetainEntry(Entry* e) {
  // The caller's handle pins e: the count is ≥ 1 and e cannot be closed.
  e->pin.fetch_add(1, std::memory_order_relaxed);
  return MakeHandle(e);
}

void MemoryArbiterImpl::ReleaseEntry(Entry* e) {
  // seq_cst RMW then seq_cst load: see ReleaseWaiter in Note [Fast path].
  const uint32_t prev = e->pin.fetch_sub(1);
  assert(Count(prev) > 0 && "ArbiterHandle released more often than pinned");
  if (Count(prev) == 1 && (gate_.load() & ~kGateCritical) != 0) ReleaseSlow(e);
}

void MemoryArbiterImpl::ReleaseSlow(Entry* e) {
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

Result<ArbiterHandle> MemoryArbiterImpl::Acquire(Capability capability, std::string_view model_key,
                                                 ArbiterDeadline deadline) {
  // Note [Fast path].
  if (Entry* e = FindEntry(capability, model_key); e != nullptr && TryPinFast(e)) {
    return MakeHandle(e);
  }
  return AcquireSlow(capability, model_key, deadline);
}

void MemoryArbiterImpl::ReaperLoop() {
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

Status MemoryArbiterImpl::Start() {
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

void MemoryArbiterImpl::Stop() {
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

void MemoryArbiterImpl::Shutdown() {
  {
    MutexLock l(&mu_);
    shutting_down_ = true;
    gate_.fetch_or(kGateShutdown);  // fast acquires fail over; releases to 0 lock
    changed_.SignalAll();
  }
  Stop();
  CloseQueues();
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

std::vector<ResidentEntryInfo> MemoryArbiterImpl::ResidentSnapshot() const {
  MutexLock l(&mu_);
  std::vector<ResidentEntryInfo> out;
  for (const Entry* e : order_) {
    if (e->state == ModelState::kLoaded) out.push_back(InfoLocked(*e));
  }
  return out;
}

ResidentEntryInfo MemoryArbiterImpl::InfoLocked(const Entry& e) const {
  return ResidentEntryInfo{e.key,          e.capability,      e.model_key,
                           e.role,         e.bytes,           static_cast<int>(Count(e.pin.load())),
                           e.loaded_at_ms, e.last_used.load(), e.domain};
}

MemoryPressureLevel MemoryArbiterImpl::CurrentPressureLevel() const {
  MutexLock l(&mu_);
  return level_;
}

ArbiterStats MemoryArbiterImpl::Stats() const {
  ArbiterStats s = StatsWithoutQueues();
  AddQueueStats(&s);
  return s;
}

ArbiterStats MemoryArbiterImpl::StatsWithoutQueues() const {
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
    m.idle_ttl_ms = e->idle_ttl_ms;
    if (e->state == ModelState::kLoaded && m.refcount == 0) {
      m.idle_ms = std::max<int64_t>(0, StampMs() - e->last_used.load(std::memory_order_acquire));
    }
    if (e->state == ModelState::kFailed) m.last_error = e->last_error.message();
    if (e->state == ModelState::kLoaded) s.resident_models++;
    s.models.push_back(std::move(m));
  }
  return s;
}

}  // namespace arbiter_internal
}  // namespace arbiter
