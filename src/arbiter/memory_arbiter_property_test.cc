// Property tests (rapidcheck) for MemoryArbiter: random
// registrations, budgets and operation sequences against one arbiter, driven
// from one thread with a SimulatedClock, checked after every operation
// against a small model of what the test holds.
//
// Note [What evict-to-fit guarantees]
// Evict-to-fit (memory_arbiter.h "Budget") is best effort: idle entries are
// evicted LRU-first while footprint + incoming > budget, and the load then
// proceeds even if it still does not fit. Text-target entries and held
// entries are never fit victims. So the property is, after every successful
// Acquire (the reuse path evicts too, since an earlier best-effort load or an
// external ledger charge can leave the ledger over budget):
//
//   budget == 0  ∨  charged ≤ budget  ∨  every loaded entry whose role is not
//   text-target has refcount > 0 (no idle fit victim is left).
//
// With refuse_over_budget an Acquire that cannot fit even after evicting
// every idle victim, while some handle is held, fails with
// kResourceExhausted and changes nothing (no unload, same charges). So,
// additionally, a successful Acquire that loaded a key while something else
// was held, whose measured size is not above the size it was admitted with,
// leaves charged ≤ budget. Without the option, kResourceExhausted never
// happens. Both option values are tested (two properties below).
//
// Also checked after every operation:
//   - ledger charged == Σ resident entry bytes + Σ live external charges, and
//     every ledger owner but "external" is a resident key with its bytes;
//   - each resident entry's refcount == the handles the test holds on it,
//     and every held key is resident;
//   - no model_unload event names a key the test holds (listener);
//   - every held handle's backend is alive (its unload has not run);
//   - Acquire fails exactly when the model says it must (not registered,
//     critical pressure for non-text, a held same-role conflict with
//     swap_same_role, a failing load of a non-resident key, refusal);
//   - Preload declines under pressure or without a budget and evicts nothing
//     unless the measured size overshot its estimate;
//   - pressure low evicts at most one idle non-text-target entry, of the
//     lowest priority; critical leaves only held or text-target entries;
//   - ReapIdle leaves no idle entry past its TTL; manual Unload follows its
//     contract;
//   - after Shutdown and the release of every handle (before or after it),
//     nothing is resident, loads == unloads per key, every backend object was
//     destroyed exactly once and the ledger holds no arbiter charge.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "arbiter/arbiter/memory_arbiter.h"
#include "arbiter/base/clock.h"
#include "arbiter/memory/memory_ledger.h"
#include "arbiter/memory/memory_pressure.h"

namespace arbiter {
namespace {

constexpr size_t kMB = size_t{1} << 20;
constexpr int kKeys = 3;  // model keys "k0".."k2" per capability
const char* const kExternalOwner = "external";

// Quiets the arbiter's per-load info logging for the length of a property.
class QuietLogs {
 public:
  QuietLogs() : old_(spdlog::get_level()) { spdlog::set_level(spdlog::level::err); }
  ~QuietLogs() { spdlog::set_level(old_); }

 private:
  spdlog::level::level_enum old_;
};

struct BackendCounters {
  int constructed = 0;
  int destroyed = 0;
};

struct PropBackend {
  PropBackend(BackendCounters* c, std::string k) : counters(c), key(std::move(k)) {
    counters->constructed++;
  }
  ~PropBackend() { counters->destroyed++; }
  BackendCounters* counters;
  std::string key;
  bool unloaded = false;  // set by the unload callable
};

// One capability's generated registration.
struct CapSpec {
  bool registered = false;
  std::optional<ResidentRole> role;  // empty → DefaultRoleFor
  bool swap_same_role = true;
  std::optional<int64_t> idle_ttl_ms;
  size_t estimate_bytes[kKeys] = {};  // per key
  size_t measured_bytes[kKeys] = {};  // 0 → keep the estimate
};

CapSpec GenCapSpec() {
  CapSpec s;
  s.registered = *rc::gen::element(true, true, true, true, true, false);
  const int role = *rc::gen::inRange(-4, static_cast<int>(kResidentRoleCount));
  if (role >= 0) s.role = static_cast<ResidentRole>(role);
  s.swap_same_role = *rc::gen::inRange(0, 3) != 0;
  if (*rc::gen::inRange(0, 3) == 0) s.idle_ttl_ms = *rc::gen::inRange<int64_t>(1, 60);
  for (int k = 0; k < kKeys; ++k) {
    s.estimate_bytes[k] = *rc::gen::inRange<size_t>(0, 700) * kMB;
    const int measured = *rc::gen::inRange(-700, 800);
    s.measured_bytes[k] = measured > 0 ? static_cast<size_t>(measured) * kMB : 0;
  }
  return s;
}

enum OpType {
  kAcquireHold = 0,  // acquire and keep the handle
  kAcquireDrop,      // acquire and release at once
  kAcquireHold2,     // = kAcquireHold: holding is twice as likely as dropping
  kRelease,
  kRetain,
  kPreload,
  kPressure,
  kExternalCharge,
  kExternalRelease,
  kAdvanceClock,
  kReapIdle,
  kManualUnload,
  kFlipLoadFailure,
  kOpTypes
};
using Op = std::tuple<int, int, int, int>;  // type, a, b, c

struct Held {
  std::string resident_key;
  ArbiterHandle handle;
};

// The arbiter under test plus everything the test knows about it.
class World {
 public:
  World(bool refuse_over_budget, uint64_t budget_bytes, std::vector<CapSpec> specs)
      : refuse_(refuse_over_budget), specs_(std::move(specs)), ledger_(budget_bytes) {
    MemoryArbiterOptions o;
    o.ledger = &ledger_;
    o.clock = &clock_;
    o.pressure_source = &bridge_;
    o.drain_timeout_ms = 0;        // a held same-role conflict fails the swap at once
    o.shutdown_timeout_ms = 0;     // Shutdown() does not wait for held handles
    o.idle_check_interval_ms = 0;  // ReapIdle() is an operation
    o.refuse_over_budget = refuse_over_budget;
    arbiter_.emplace(o);
    for (size_t i = 0; i < kCapabilityCount; ++i) {
      if (specs_[i].registered) Register(static_cast<Capability>(i));
    }
    sub_ = arbiter_->OnEvent([this](const ArbiterEvent& e) { OnEvent(e); });
    RC_ASSERT(arbiter_->Start().ok());
  }

  ~World() {
    sub_.Reset();
    held_.clear();
    arbiter_.reset();
    external_.clear();
  }

  void Run(const Op& op) {
    const auto& [type, a, b, c] = op;
    const Capability cap = static_cast<Capability>(a % kCapabilityCount);
    const int key_index = b % kKeys;
    const std::string key = "k" + std::to_string(key_index);
    switch (type) {
      case kAcquireHold:
      case kAcquireHold2:
      case kAcquireDrop:
        DoAcquire(cap, key_index, type != kAcquireDrop);
        break;
      case kRelease:
        if (!held_.empty()) {
          const size_t i = static_cast<size_t>(c) % held_.size();
          ArbiterHandle h = std::move(held_[i].handle);
          held_.erase(held_.begin() + static_cast<long>(i));
          h.Release();
          h.Release();  // idempotent
        }
        break;
      case kRetain:
        if (!held_.empty()) {
          Held& src = held_[static_cast<size_t>(c) % held_.size()];
          Result<ArbiterHandle> r = src.handle.Retain();
          RC_ASSERT(r.ok());
          const bool same_backend = r->backend_object() == src.handle.backend_object();
          RC_ASSERT(same_backend);
          std::string rk = src.resident_key;
          held_.push_back(Held{std::move(rk), std::move(r).value()});
        }
        break;
      case kPreload:
        DoPreload(cap, key_index);
        break;
      case kPressure:
        DoPressure(static_cast<MemoryPressureLevel>(c % 3));
        break;
      case kExternalCharge:
        if (c % 2 == 0) {
          external_.push_back(ledger_.Charge(kExternalOwner, ChargeKind::kKvSlot,
                                             static_cast<uint64_t>(c) * kMB / 2));
        } else {
          Result<MemoryCharge> charge = ledger_.TryCharge(kExternalOwner, ChargeKind::kPromptCache,
                                                          static_cast<uint64_t>(c) * kMB / 2);
          if (charge.ok()) external_.push_back(std::move(charge).value());
        }
        break;
      case kExternalRelease:
        if (!external_.empty()) {
          external_.erase(external_.begin() +
                          static_cast<long>(static_cast<size_t>(c) % external_.size()));
        }
        break;
      case kAdvanceClock:
        clock_.AdvanceMs(c % 40);
        break;
      case kReapIdle:
        DoReapIdle();
        break;
      case kManualUnload:
        DoManualUnload(cap, key);
        break;
      case kFlipLoadFailure:
        if (c % 3 == 0) failing_.clear();  // keep failures a minority
        failing_[ResidentKey(cap, key)] = !failing_[ResidentKey(cap, key)];
        break;
    }
    CheckInvariants();
  }

  // Releases every handle (before or after Shutdown) and checks that nothing
  // survives.
  void ShutdownAndCheck(bool release_before_shutdown) {
    if (release_before_shutdown) ReleaseAll();
    arbiter_->Shutdown();
    // Held entries stay resident until released (shutdown_timeout_ms = 0).
    for (const ResidentEntryInfo& r : arbiter_->ResidentSnapshot()) {
      RC_ASSERT(HeldCount(r.resident_key) > 0);
      RC_ASSERT(r.refcount == HeldCount(r.resident_key));
    }
    ReleaseAll();  // a release after shutdown unloads at once
    RC_ASSERT(arbiter_->ResidentSnapshot().empty());
    RC_ASSERT(violations_.empty());
    Result<ArbiterHandle> late =
        arbiter_->Acquire(Capability::kText, "k0", Deadline(std::chrono::seconds(1)));
    RC_ASSERT(!late.ok());
    const MemoryLedgerSnapshot s = ledger_.Snapshot();
    for (const auto& [owner, usage] : s.by_owner) RC_ASSERT(owner == kExternalOwner);
    uint64_t external = 0;
    for (const MemoryCharge& c : external_) external += c.bytes();
    RC_ASSERT(ledger_.charged_bytes() == external);
    for (const auto& [key, n] : load_events_) RC_ASSERT(n == unload_events_[key]);
    for (const auto& [key, n] : unload_events_) RC_ASSERT(n == load_events_[key]);
    for (const auto& [key, n] : unload_calls_) RC_ASSERT(n == load_events_[key]);
    RC_ASSERT(counters_.constructed == counters_.destroyed);
    const ArbiterStats stats = arbiter_->Stats();
    uint64_t loads = 0;
    for (const auto& [key, n] : load_events_) loads += static_cast<uint64_t>(n);
    RC_ASSERT(stats.loads == loads);
    RC_ASSERT(static_cast<uint64_t>(counters_.constructed) == loads);
    external_.clear();
    RC_ASSERT(ledger_.charged_bytes() == 0u);
  }

 private:
  // Moves the handles out before releasing them, so the event listener
  // never looks at a vector being destroyed.
  void ReleaseAll() {
    std::vector<Held> handles = std::move(held_);
    held_.clear();
    handles.clear();
  }

  const CapSpec& Spec(Capability cap) const { return specs_[static_cast<size_t>(cap)]; }
  ResidentRole RoleOf(Capability cap) const { return Spec(cap).role.value_or(DefaultRoleFor(cap)); }
  static Capability CapOf(const std::string& resident_key) {
    return *ParseCapability(resident_key.substr(0, resident_key.find("::")));
  }
  static int KeyIndexOf(const std::string& resident_key) { return resident_key.back() - '0'; }

  void Register(Capability cap) {
    const CapSpec& spec = Spec(cap);
    CapabilityRegistration r;
    r.capability = cap;
    r.resident_role = spec.role;
    r.swap_same_role = spec.swap_same_role;
    r.idle_ttl_ms = spec.idle_ttl_ms;
    r.estimate_bytes = [this, cap](const std::string& key) {
      return Spec(cap).estimate_bytes[KeyIndexOf(key)];
    };
    r.load = [this, cap](const std::string& key) -> Result<LoadedBackend> {
      const std::string rk = ResidentKey(cap, key);
      if (failing_[rk]) return DataLossError("weights truncated");
      return LoadedBackend::Of(std::make_shared<PropBackend>(&counters_, rk),
                               Spec(cap).measured_bytes[KeyIndexOf(key)]);
    };
    r.unload = [this](const std::string&, LoadedBackend b) {
      auto* backend = static_cast<PropBackend*>(b.object.get());
      if (backend->unloaded) violations_.push_back("unload called twice for " + backend->key);
      backend->unloaded = true;
      unload_calls_[backend->key]++;
    };
    RC_ASSERT(arbiter_->RegisterCapability(std::move(r)).ok());
  }

  void OnEvent(const ArbiterEvent& e) {
    const std::string rk = ResidentKey(e.capability, e.model_key);
    switch (e.type) {
      case ArbiterEventType::kModelLoad:
        load_events_[rk]++;
        if (Spec(e.capability).measured_bytes[KeyIndexOf(rk)] > 0) measured_known_[rk] = true;
        break;
      case ArbiterEventType::kModelUnload:
        unload_events_[rk]++;
        op_unloads_.push_back({rk, e.reason});
        if (HeldCount(rk) > 0) {
          violations_.push_back(rk + " unloaded (" + std::string(UnloadReasonName(e.reason)) +
                                ") while the test holds it");
        }
        break;
      default:
        break;
    }
  }

  int HeldCount(const std::string& resident_key) const {
    int n = 0;
    for (const Held& h : held_) n += h.resident_key == resident_key ? 1 : 0;
    return n;
  }
  bool Resident(const std::string& resident_key) const {
    for (const ResidentEntryInfo& r : arbiter_->ResidentSnapshot()) {
      if (r.resident_key == resident_key) return true;
    }
    return false;
  }
  bool AnythingHeld() const { return !held_.empty(); }
  // The size the arbiter admits a load with: the measured size once known.
  size_t IncomingBytes(Capability cap, int key_index) const {
    const std::string rk = ResidentKey(cap, "k" + std::to_string(key_index));
    const CapSpec& s = Spec(cap);
    auto it = measured_known_.find(rk);
    return it != measured_known_.end() && it->second ? s.measured_bytes[key_index]
                                                     : s.estimate_bytes[key_index];
  }
  bool MeasuredOvershoots(Capability cap, int key_index) const {
    return Spec(cap).measured_bytes[key_index] > IncomingBytes(cap, key_index);
  }
  // A key the test holds with the same role as `cap`, other than `rk`.
  bool HeldSameRoleConflict(Capability cap, const std::string& rk) const {
    for (const Held& h : held_) {
      if (h.resident_key != rk && RoleOf(CapOf(h.resident_key)) == RoleOf(cap)) return true;
    }
    return false;
  }
  bool IdleFitVictimExists() const {
    for (const ResidentEntryInfo& r : arbiter_->ResidentSnapshot()) {
      if (r.role != ResidentRole::kTextTarget && r.refcount == 0) return true;
    }
    return false;
  }

  void DoAcquire(Capability cap, int key_index, bool hold) {
    const std::string key = "k" + std::to_string(key_index);
    const std::string rk = ResidentKey(cap, key);
    const bool registered = Spec(cap).registered;
    const bool was_resident = Resident(rk);
    const bool anything_held = AnythingHeld();
    const bool critical = arbiter_->CurrentPressureLevel() == MemoryPressureLevel::kCritical;
    const bool overshoots = MeasuredOvershoots(cap, key_index);
    const std::vector<ResidentEntryInfo> before = arbiter_->ResidentSnapshot();
    const uint64_t charged_before = ledger_.charged_bytes();
    op_unloads_.clear();

    Result<ArbiterHandle> h = arbiter_->Acquire(cap, key, Deadline(std::chrono::seconds(5)));

    const uint64_t budget = ledger_.budget_bytes();
    if (!registered) {
      RC_ASSERT(h.status().code() == StatusCode::kNotFound);
      return;
    }
    if (critical && cap != Capability::kText) {
      RC_ASSERT(h.status().code() == StatusCode::kUnavailable);
      return;
    }
    const bool conflict =
        Spec(cap).swap_same_role && !was_resident && HeldSameRoleConflict(cap, rk);
    if (conflict) {
      RC_ASSERT(h.status().code() == StatusCode::kDeadlineExceeded);
      return;
    }
    if (!h.ok() && h.status().code() == StatusCode::kResourceExhausted) {
      // Note [What evict-to-fit guarantees]: refusal only with the option,
      // only while something is held, and it changes nothing.
      // (An idle same-role conflict is swapped out before the budget check,
      // so a refusal can follow a swap; nothing else is evicted.)
      RC_ASSERT(refuse_over_budget());
      RC_ASSERT(anything_held);
      RC_ASSERT(!was_resident);
      uint64_t swapped_bytes = 0;
      for (const auto& [victim, reason] : op_unloads_) {
        RC_ASSERT(reason == UnloadReason::kSwap);
        for (const ResidentEntryInfo& r : before) {
          if (r.resident_key == victim) swapped_bytes += r.bytes;
        }
      }
      RC_ASSERT(ledger_.charged_bytes() == charged_before - swapped_bytes);
      RC_ASSERT(arbiter_->ResidentSnapshot().size() == before.size() - op_unloads_.size());
      return;
    }
    if (!was_resident && failing_[rk]) {
      RC_ASSERT(!h.ok());
      RC_ASSERT(h.status().message().find("model \"" + key + "\" failed to load: ") == 0);
      return;
    }
    if (!h.ok()) RC_FAIL("unexpected acquire failure for " + rk + ": " + h.status().ToString());
    RC_ASSERT(h->backend<PropBackend>() != nullptr);
    RC_ASSERT(h->backend<PropBackend>()->key == rk);
    held_.push_back(Held{rk, std::move(h).value()});
    // Note [What evict-to-fit guarantees].
    if (budget != 0 && ledger_.charged_bytes() > budget) {
      if (IdleFitVictimExists()) {
        RC_FAIL("charged " + std::to_string(ledger_.charged_bytes()) + " > budget " +
                std::to_string(budget) + " after acquiring " + rk +
                " while an idle non-text-target entry is resident");
      }
      if (refuse_over_budget() && anything_held && !was_resident && !overshoots) {
        RC_FAIL("refuse_over_budget admitted " + rk + " over budget while something was held");
      }
    }
    // Fit victims are idle and never text-target.
    for (const auto& [victim, reason] : op_unloads_) {
      if (reason != UnloadReason::kFit) continue;
      RC_ASSERT(RoleOf(CapOf(victim)) != ResidentRole::kTextTarget);
    }
    if (!hold) {
      ArbiterHandle released = std::move(held_.back().handle);
      held_.pop_back();
      released.Release();
    }
  }

  void DoPreload(Capability cap, int key_index) {
    const std::string key = "k" + std::to_string(key_index);
    const std::string rk = ResidentKey(cap, key);
    const bool nominal = arbiter_->CurrentPressureLevel() == MemoryPressureLevel::kNominal;
    const bool overshoots = MeasuredOvershoots(cap, key_index);
    const bool was_resident = Resident(rk);
    const int loads_before = load_events_[rk];
    op_unloads_.clear();
    const bool ok = arbiter_->Preload(cap, key);
    if (!Spec(cap).registered || !nominal || ledger_.budget_bytes() == 0) {
      RC_ASSERT(!ok);
      RC_ASSERT(load_events_[rk] == loads_before);
    }
    // docs/memory-arbiter.md, fixed defect 7: preload never evicts (beyond
    // making room for a measured size that came out larger than the estimate
    // it was admitted with).
    if (!overshoots || was_resident) RC_ASSERT(op_unloads_.empty());
    if (ok && op_unloads_.empty()) RC_ASSERT(Resident(rk));
    if (!ok) RC_ASSERT(Resident(rk) == was_resident);
  }

  void DoPressure(MemoryPressureLevel level) {
    // Idle non-text-target entries before: the pressure candidates.
    int lowest_idle_priority = -1;
    for (const ResidentEntryInfo& r : arbiter_->ResidentSnapshot()) {
      if (r.role == ResidentRole::kTextTarget || r.refcount > 0) continue;
      const int p = ResidentRolePriority(r.role);
      if (lowest_idle_priority < 0 || p < lowest_idle_priority) lowest_idle_priority = p;
    }
    op_unloads_.clear();
    bridge_.Dispatch(level);
    RC_ASSERT(arbiter_->CurrentPressureLevel() == level);
    for (const auto& [victim, reason] : op_unloads_) {
      RC_ASSERT(reason == UnloadReason::kPressure);
      RC_ASSERT(RoleOf(CapOf(victim)) != ResidentRole::kTextTarget);
    }
    switch (level) {
      case MemoryPressureLevel::kNominal:
        RC_ASSERT(op_unloads_.empty());
        break;
      case MemoryPressureLevel::kLow:
        RC_ASSERT(op_unloads_.size() == (lowest_idle_priority < 0 ? 0u : 1u));
        if (!op_unloads_.empty()) {
          RC_ASSERT(ResidentRolePriority(RoleOf(CapOf(op_unloads_[0].first))) ==
                    lowest_idle_priority);
        }
        break;
      case MemoryPressureLevel::kCritical:
        RC_ASSERT(!IdleFitVictimExists());
        break;
    }
  }

  void DoReapIdle() {
    op_unloads_.clear();
    const size_t n = arbiter_->ReapIdle();
    RC_ASSERT(n == op_unloads_.size());
    const int64_t now = clock_.NowMs();
    for (const auto& [victim, reason] : op_unloads_) {
      RC_ASSERT(reason == UnloadReason::kIdle);
      RC_ASSERT(Spec(CapOf(victim)).idle_ttl_ms.has_value());
    }
    for (const ResidentEntryInfo& r : arbiter_->ResidentSnapshot()) {
      const auto& ttl = Spec(r.capability).idle_ttl_ms;
      if (ttl && r.refcount == 0) RC_ASSERT(now - r.last_used_ms < *ttl);
    }
  }

  void DoManualUnload(Capability cap, const std::string& key) {
    const std::string rk = ResidentKey(cap, key);
    const bool was_resident = Resident(rk);
    const int held = HeldCount(rk);
    Result<bool> r = arbiter_->Unload(cap, key, Deadline(std::chrono::milliseconds(0)));
    if (!Spec(cap).registered) {
      RC_ASSERT(r.status().code() == StatusCode::kNotFound);
    } else if (!was_resident) {
      RC_ASSERT(r.ok() && !*r);
    } else if (held > 0) {
      RC_ASSERT(r.status().code() == StatusCode::kDeadlineExceeded);
      RC_ASSERT(Resident(rk));
    } else {
      RC_ASSERT(r.ok() && *r);
      RC_ASSERT(!Resident(rk));
    }
  }

  void CheckInvariants() {
    if (!violations_.empty()) RC_FAIL(violations_.front());
    const std::vector<ResidentEntryInfo> resident = arbiter_->ResidentSnapshot();
    const MemoryLedgerSnapshot ledger = ledger_.Snapshot();
    uint64_t resident_bytes = 0;
    for (const ResidentEntryInfo& r : resident) {
      resident_bytes += r.bytes;
      RC_ASSERT(r.refcount == HeldCount(r.resident_key));
      RC_ASSERT(r.role == RoleOf(r.capability));
      auto it = ledger.by_owner.find(r.resident_key);
      RC_ASSERT(it != ledger.by_owner.end());
      RC_ASSERT(it->second.total_bytes == r.bytes);
    }
    uint64_t external = 0;
    for (const MemoryCharge& c : external_) external += c.bytes();
    RC_ASSERT(ledger.charged_bytes == resident_bytes + external);
    for (const auto& [owner, usage] : ledger.by_owner) {
      if (owner == kExternalOwner) continue;
      RC_ASSERT(std::any_of(resident.begin(), resident.end(),
                            [&](const ResidentEntryInfo& r) { return r.resident_key == owner; }));
    }
    const ArbiterStats stats = arbiter_->Stats();
    RC_ASSERT(stats.loading_bytes == 0u);
    RC_ASSERT(stats.resident_bytes == resident_bytes);
    RC_ASSERT(stats.resident_models == static_cast<int>(resident.size()));
    for (const Held& h : held_) {
      RC_ASSERT(Resident(h.resident_key));
      const PropBackend* b = h.handle.backend<PropBackend>();
      RC_ASSERT(b != nullptr);
      RC_ASSERT(!b->unloaded);
    }
    // Every backend object not yet destroyed is resident (a handle pins its
    // entry, so no unloaded object is kept alive by a handle).
    RC_ASSERT(counters_.constructed - counters_.destroyed == static_cast<int>(resident.size()));
  }

  bool refuse_over_budget() const { return refuse_; }

  const bool refuse_;
  std::vector<CapSpec> specs_;
  SimulatedClock clock_{1000};
  BridgePressureSource bridge_;
  MemoryLedger ledger_;
  std::vector<MemoryCharge> external_;  // after ledger_: released first
  BackendCounters counters_;
  std::map<std::string, bool> failing_;
  std::map<std::string, bool> measured_known_;
  std::map<std::string, int> load_events_, unload_events_, unload_calls_;
  std::vector<std::pair<std::string, UnloadReason>> op_unloads_;  // unloads during one op
  std::vector<std::string> violations_;
  std::optional<MemoryArbiter> arbiter_;  // after everything it points at
  ArbiterEventSubscription sub_;
  std::vector<Held> held_;  // after arbiter_: released before it is destroyed
};

void RunProperty(bool refuse_over_budget) {
  QuietLogs quiet;
  const int budget_mb = *rc::gen::inRange(0, 2000);
  const uint64_t budget = budget_mb < 50 ? 0 : static_cast<uint64_t>(budget_mb) * kMB;
  std::vector<CapSpec> specs;
  for (size_t i = 0; i < kCapabilityCount; ++i) specs.push_back(GenCapSpec());
  const std::vector<Op> ops = *rc::gen::container<std::vector<Op>>(
      rc::gen::tuple(rc::gen::inRange(0, static_cast<int>(kOpTypes)),
                     rc::gen::inRange(0, static_cast<int>(kCapabilityCount)),
                     rc::gen::inRange(0, kKeys), rc::gen::inRange(0, 700)));
  const bool release_before_shutdown = *rc::gen::arbitrary<bool>();
  World world(refuse_over_budget, budget, std::move(specs));
  for (const Op& op : ops) world.Run(op);
  world.ShutdownAndCheck(release_before_shutdown);
}

RC_GTEST_PROP(MemoryArbiterProperty, BestEffortFitAndLedgerInvariants, ()) {
  RunProperty(/*refuse_over_budget=*/false);
}

RC_GTEST_PROP(MemoryArbiterProperty, RefuseOverBudgetFitAndLedgerInvariants, ()) {
  RunProperty(/*refuse_over_budget=*/true);
}

}  // namespace
}  // namespace arbiter
