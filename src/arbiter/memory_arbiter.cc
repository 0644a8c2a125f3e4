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
//   - idle_lru_ / idle_by_role_ hold exactly the kLoaded entries with
//     refcount 0 whose role is not text-target, keyed (last_used, priority,
//     loaded_at, seq): begin() is the fit victim (no scan), and the begin()
//     of the lowest non-empty role is the low-pressure victim. Held entries
//     and text-target are never in them, hence never evicted by fit or
//     pressure (defects 1, 2).
//   - Every kLoading/kLoaded entry holds one MemoryCharge (owner = resident
//     key): the estimate while loading, the measured bytes once loaded. The
//     footprint is ledger_->charged_bytes(), which includes other owners.
//   - held_count_ = Σ refcount; loading_count_ = #kLoading.
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
// nothing, whenever some handle is held or a load is in flight (the caller
// retries later); when nothing is held the load proceeds as in the
// reference (a model larger than the budget must stay usable).
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
#include <exception>
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
  ModelState state = ModelState::kReady;
  size_t bytes = 0;       // charge: estimate until measured
  bool measured = false;
  MemoryCharge charge;    // live while kLoading/kLoaded
  LoadedBackend backend;
  int refcount = 0;
  int64_t loaded_at_ms = 0;
  int64_t last_used_ms = 0;
  bool idle_listed = false;
  LruKey lru{};
  uint64_t load_attempt = 0;
  Status last_error;
  uint64_t loads = 0;
  uint64_t load_failures = 0;
  uint64_t evictions = 0;
  double last_load_ms = 0;
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
      model_(std::move(other.model_)),
      capability_(other.capability_),
      backend_(std::move(other.backend_)),
      type_(other.type_) {}

ArbiterHandle& ArbiterHandle::operator=(ArbiterHandle&& other) noexcept {
  if (this != &other) {
    Release();
    arbiter_ = std::exchange(other.arbiter_, nullptr);
    entry_ = std::exchange(other.entry_, nullptr);
    model_ = std::move(other.model_);
    capability_ = other.capability_;
    backend_ = std::move(other.backend_);
    type_ = other.type_;
  }
  return *this;
}

void ArbiterHandle::Release() {
  if (arbiter_ == nullptr) return;
  MemoryArbiter* arbiter = std::exchange(arbiter_, nullptr);
  backend_.reset();
  arbiter->ReleaseEntry(static_cast<MemoryArbiter::Entry*>(entry_));
}

Result<ArbiterHandle> ArbiterHandle::Retain() const {
  if (arbiter_ == nullptr) {
    return FailedPreconditionError(
        fmt::format("cannot retain {}/{} after release", CapabilityName(capability_), model_));
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
      listeners_(std::make_shared<Listeners>()) {}

MemoryArbiter::~MemoryArbiter() {
  Shutdown();
  MutexLock l(&mu_);
  if (held_count_ > 0) {
    spdlog::error("arbiter destroyed with {} handle(s) outstanding", held_count_);
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

MemoryArbiter::Entry* MemoryArbiter::FindOrCreateLocked(Registration* reg,
                                                        std::string_view model_key) {
  std::string key = ResidentKey(reg->reg.capability, model_key);
  auto it = entries_.find(key);
  if (it != entries_.end()) return it->second.get();
  auto e = std::make_unique<Entry>();
  e->reg = reg;
  e->key = key;
  e->model_key = std::string(model_key);
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
  e->bytes = EstimateFor(*reg, e->model_key);
  Entry* raw = e.get();
  entries_.emplace(std::move(key), std::move(e));
  order_.push_back(raw);
  return raw;
}

void MemoryArbiter::AddIdleLocked(Entry* e) {
  if (e->idle_listed || e->role == ResidentRole::kTextTarget) return;
  e->lru = LruKey{e->last_used_ms, e->priority, e->loaded_at_ms, ++seq_};
  idle_lru_.emplace(e->lru, e);
  idle_by_role_[Index(e->role)].emplace(e->lru, e);
  e->idle_listed = true;
}

void MemoryArbiter::RemoveIdleLocked(Entry* e) {
  if (!e->idle_listed) return;
  idle_lru_.erase(e->lru);
  idle_by_role_[Index(e->role)].erase(e->lru);
  e->idle_listed = false;
}

ArbiterHandle MemoryArbiter::PinLocked(Entry* e) {
  if (e->refcount == 0) RemoveIdleLocked(e);
  e->refcount++;
  held_count_++;
  e->last_used_ms = clock_->NowMs();
  ArbiterHandle h;
  h.arbiter_ = this;
  h.entry_ = e;
  h.model_ = e->model_key;
  h.capability_ = e->capability;
  h.backend_ = e->backend.object;
  h.type_ = e->backend.type;
  return h;
}

Result<ArbiterHandle> MemoryArbiter::RetainEntry(Entry* e) {
  MutexLock l(&mu_);
  e->refcount++;
  held_count_++;
  ArbiterHandle h;
  h.arbiter_ = this;
  h.entry_ = e;
  h.model_ = e->model_key;
  h.capability_ = e->capability;
  h.backend_ = e->backend.object;
  h.type_ = e->backend.type;
  return h;
}

void MemoryArbiter::ReleaseEntry(Entry* e) {
  std::vector<Unloaded> unloaded;
  {
    MutexLock l(&mu_);
    if (e->refcount <= 0) {
      spdlog::error("arbiter: release of {} with refcount {}", e->key, e->refcount);
      return;
    }
    e->refcount--;
    held_count_--;
    if (e->refcount == 0) {
      if (e->state == ModelState::kLoaded) {
        if (shutting_down_) {
          EvictLocked(e, UnloadReason::kShutdown, &unloaded);
        } else {
          AddIdleLocked(e);
        }
      }
      changed_.SignalAll();
    }
  }
  if (!unloaded.empty()) FinishUnloads(&unloaded);
}

void MemoryArbiter::EvictLocked(Entry* e, UnloadReason reason, std::vector<Unloaded>* out) {
  RemoveIdleLocked(e);
  role_members_[Index(e->role)].erase(e);
  resident_bytes_ -= e->bytes;
  e->charge.Release();
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
  if (idle_lru_.empty()) return;  // no victim: skip the ledger lookups
  const uint64_t budget = ledger_->budget_bytes();
  if (budget == 0) return;
  while (!idle_lru_.empty() && ledger_->charged_bytes() + incoming > budget) {
    EvictLocked(idle_lru_.begin()->second, UnloadReason::kFit, out);
  }
}

void MemoryArbiter::ClaimLocked(Entry* e, size_t incoming) {
  e->state = ModelState::kLoading;
  ++e->load_attempt;
  role_members_[Index(e->role)].insert(e);
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
    u.backend = LoadedBackend{};  // frees the object unless a handle still holds it
    spdlog::info("arbiter: unloaded {} ({}, reason {})", ResidentKey(u.capability, u.model_key),
                 FormatSize(u.bytes), UnloadReasonName(u.reason));
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
    }
  }
}

ArbiterEventSubscription MemoryArbiter::OnEvent(ArbiterEventListener listener) {
  uint64_t id;
  {
    MutexLock l(&listeners_->mu);
    id = listeners_->next_id++;
    listeners_->map.emplace(id, std::make_shared<ArbiterEventListener>(std::move(listener)));
  }
  std::weak_ptr<Listeners> weak = listeners_;
  return ArbiterEventSubscription([weak, id] {
    if (auto ls = weak.lock()) {
      MutexLock l(&ls->mu);
      ls->map.erase(id);
    }
  });
}

Result<ArbiterHandle> MemoryArbiter::Acquire(Capability capability, std::string_view model_key,
                                             ArbiterDeadline deadline) {
  std::vector<Unloaded> unloaded;
  Entry* e = nullptr;
  Status error;
  std::optional<ArbiterHandle> reused;
  {
    MutexLock l(&mu_);
    Registration* reg = regs_[Index(capability)].get();
    if (reg == nullptr) {
      return NotFoundError(
          fmt::format("no capability registered for \"{}\"", CapabilityName(capability)));
    }
    std::optional<std::chrono::steady_clock::time_point> drain_deadline;
    for (;;) {
      if (shutting_down_) {
        error = UnavailableError(fmt::format("arbiter is shutting down; cannot acquire {}",
                                             CapabilityName(capability)));
        break;
      }
      if (level_ == MemoryPressureLevel::kCritical && capability != Capability::kText) {
        error = UnavailableError(fmt::format(
            "memory pressure is critical; refusing to load capability \"{}\". Free RAM and retry.",
            CapabilityName(capability)));
        break;
      }
      e = FindOrCreateLocked(reg, model_key);
      if (e->state == ModelState::kLoaded) {
        reused = PinLocked(e);
        // An earlier best-effort load (or another ledger owner) may have left
        // the footprint over budget while idle victims now exist.
        EvictToFitLocked(0, &unloaded);
        break;
      }
      if (e->state == ModelState::kLoading) {
        const uint64_t attempt = e->load_attempt;
        if (!changed_.WaitUntil(deadline) && RealNow() >= deadline &&
            e->state == ModelState::kLoading) {
          error = DeadlineExceededError(fmt::format(
              "deadline passed while waiting for {} to load; the load continues, retry later",
              e->key));
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
      if (reg->reg.swap_same_role) {
        for (Entry* o : role_members_[Index(e->role)]) {
          if (o != e) {
            conflict = o;
            break;
          }
        }
      }
      if (conflict != nullptr) {
        if (conflict->state == ModelState::kLoaded && conflict->refcount == 0) {
          EvictLocked(conflict, UnloadReason::kSwap, &unloaded);
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
          bool still = role_members_[Index(e->role)].count(conflict) > 0 &&
                       !(conflict->state == ModelState::kLoaded && conflict->refcount == 0);
          if (still) {
            if (until == *drain_deadline) {
              error = DeadlineExceededError(fmt::format(
                  "timeout waiting for {}/{} to drain (refcount={}); refusing to swap mid-flight",
                  CapabilityName(conflict->capability), conflict->model_key, conflict->refcount));
            } else {
              error = DeadlineExceededError(fmt::format(
                  "deadline passed while waiting for {} to drain before loading {}",
                  conflict->key, e->key));
            }
            break;
          }
        }
        continue;
      }
      const size_t incoming = e->measured ? e->bytes : EstimateFor(*reg, e->model_key);
      if (options_.refuse_over_budget && (held_count_ > 0 || loading_count_ > 0)) {
        // Note [Refusing over budget]: fail without evicting when even
        // evicting every idle victim would not make room.
        const uint64_t budget = ledger_->budget_bytes();
        uint64_t idle_bytes = 0;
        for (const auto& [lru, o] : idle_lru_) idle_bytes += o->bytes;
        const uint64_t charged = ledger_->charged_bytes();
        if (budget != 0 && charged - std::min(charged, idle_bytes) + incoming > budget) {
          std::string held;
          for (const Entry* o : order_) {
            if (o->refcount > 0 || o->state == ModelState::kLoading) {
              if (!held.empty()) held += ", ";
              held += o->refcount > 0
                          ? fmt::format("\"{}\" {} ({} handle(s))", o->model_key,
                                        FormatSize(o->bytes), o->refcount)
                          : fmt::format("\"{}\" {} (loading)", o->model_key, FormatSize(o->bytes));
            }
          }
          error = ResourceExhaustedError(fmt::format(
              "cannot load model \"{}\" ({}): the memory budget is {} and {} is held by "
              "requests in flight; retry when they finish, or raise [memory] budget",
              e->model_key, FormatSize(incoming), FormatSize(budget),
              held.empty() ? std::string("memory of other owners") : held));
          break;
        }
      }
      EvictToFitLocked(incoming, &unloaded);
      ClaimLocked(e, incoming);
      break;
    }
  }
  if (!unloaded.empty()) FinishUnloads(&unloaded);
  if (reused) return std::move(*reused);
  if (!error.ok()) return error;
  return LoadClaimed(e, /*pin=*/true);
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
        e->charge.ForceResize(e->bytes);  // estimate → measured
      }
      e->state = ModelState::kLoaded;
      e->backend = std::move(b);
      e->last_error = OkStatus();
      e->loads++;
      loads_++;
      resident_bytes_ += e->bytes;
      bytes = e->bytes;
      e->loaded_at_ms = clock_->NowMs();
      e->last_used_ms = e->loaded_at_ms;
      if (shutting_down_) {
        // Note [Refusing over budget]
// The reference is best effort: after evict-to-fit the load proceeds even if
// it still does not fit. With options.refuse_over_budget (the server sets it,
// docs/http-api.md `budget_exceeded`), an acquire that could not fit even
// after evicting every idle victim fails with kResourceExhausted, evicting
// nothing, whenever some handle is held or a load is in flight (the caller
// retries later); when nothing is held the load proceeds as in the
// reference (a model larger than the budget must stay usable).
//
// Note [Shutdown]: a load finishing after shutdown unloads itself.
        EvictLocked(e, UnloadReason::kShutdown, &unloaded);
        out = UnavailableError(fmt::format("arbiter is shutting down; cannot acquire {}",
                                           CapabilityName(e->capability)));
      } else {
        published = true;
        if (pin) {
          out = PinLocked(e);
        } else {
          AddIdleLocked(e);
          out = ArbiterHandle();
        }
        // The measured size may exceed the estimate: make room again.
        EvictToFitLocked(0, &unloaded);
      }
    } else {
      role_members_[Index(e->role)].erase(e);
      e->charge.Release();
      e->state = ModelState::kFailed;
      e->last_error =
          loaded.status().WithPrefix(fmt::format("model \"{}\" failed to load", e->model_key));
      e->load_failures++;
      load_failures_++;
      out = e->last_error;
    }
    changed_.SignalAll();
  }
  if (published) {
    spdlog::info("arbiter: loaded {} ({}) in {:.0f} ms", e->key, FormatSize(bytes), load_ms);
    ArbiterEvent ev;
    ev.type = ArbiterEventType::kModelLoad;
    ev.capability = e->capability;
    ev.model_key = e->model_key;
    ev.load_ms = load_ms;
    ev.at_ms = clock_->NowMs();
    Emit(ev);
  } else if (!out.ok()) {
    spdlog::error("arbiter: {}", out.status().message());
  }
  if (!unloaded.empty()) FinishUnloads(&unloaded);
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
    auto it = entries_.find(ResidentKey(capability, model_key));
    if (it == entries_.end()) return false;
    Entry* e = it->second.get();
    for (;;) {
      if (e->state == ModelState::kLoaded && e->refcount == 0) break;
      if (e->state != ModelState::kLoaded && e->state != ModelState::kLoading) return false;
      // Note [Waits use real time].
      if (!changed_.WaitUntil(deadline) && RealNow() >= deadline) {
        if (e->state == ModelState::kLoaded && e->refcount == 0) break;
        if (e->state == ModelState::kLoading) {
          return DeadlineExceededError(fmt::format("{} is still loading; not unloaded", e->key));
        }
        if (e->state != ModelState::kLoaded) return false;
        return DeadlineExceededError(fmt::format("{} is held by {} handle(s); not unloaded",
                                                 e->key, e->refcount));
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
      e->last_used_ms = clock_->NowMs();
      if (listed) AddIdleLocked(e);
      return true;
    }
    if (e->state == ModelState::kLoading) return false;
    const size_t incoming = e->measured ? e->bytes : EstimateFor(*reg, e->model_key);
    if (incoming == 0 || ledger_->charged_bytes() + incoming > budget) return false;
    // Defect 7: a same-role conflict would need a swap; preload never evicts.
    if (reg->reg.swap_same_role && !role_members_[Index(e->role)].empty()) return false;
    ClaimLocked(e, incoming);
  }
  return LoadClaimed(e, /*pin=*/false).ok();
}

void MemoryArbiter::HandlePressure(const MemoryPressureEvent& event) {
  std::vector<Unloaded> unloaded;
  {
    MutexLock l(&mu_);
    level_ = event.level;
    if (event.level == MemoryPressureLevel::kLow) {
      // Lowest-priority role with an idle entry; text-target is never listed
      // (defect 1) and held entries are skipped by construction (defect 2).
      for (auto& by_role : idle_by_role_) {
        if (!by_role.empty()) {
          EvictLocked(by_role.begin()->second, UnloadReason::kPressure, &unloaded);
          break;
        }
      }
    } else if (event.level == MemoryPressureLevel::kCritical) {
      for (auto& by_role : idle_by_role_) {
        while (!by_role.empty()) {
          EvictLocked(by_role.begin()->second, UnloadReason::kPressure, &unloaded);
        }
      }
    }
  }
  ArbiterEvent ev;
  ev.type = ArbiterEventType::kMemoryPressure;
  ev.level = event.level;
  ev.source = event.source;
  ev.free_bytes = event.free_bytes;
  ev.at_ms = clock_->NowMs();
  Emit(ev);
  if (event.level != MemoryPressureLevel::kNominal) {
    if (vision_cache_ != nullptr) vision_cache_->PurgeExpired();
    spdlog::warn("arbiter: memory pressure {} from {}; unloading {} idle model(s)",
                 MemoryPressureLevelName(event.level), event.source, unloaded.size());
  }
  if (!unloaded.empty()) FinishUnloads(&unloaded);
}

size_t MemoryArbiter::ReapIdle() {
  std::vector<Unloaded> unloaded;
  {
    MutexLock l(&mu_);
    const int64_t now = clock_->NowMs();
    for (Entry* e : order_) {
      const auto& ttl = e->idle_ttl_ms;
      if (ttl && e->state == ModelState::kLoaded && e->refcount == 0 &&
          now - e->last_used_ms >= *ttl) {
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
    while ((loading_count_ > 0 || held_count_ > 0) && RealNow() < until) {
      changed_.WaitUntil(until);
    }
    for (Entry* e : order_) {
      if (e->state == ModelState::kLoaded && e->refcount == 0) {
        EvictLocked(e, UnloadReason::kShutdown, &unloaded);
      }
    }
    if (loading_count_ > 0 || held_count_ > 0) {
      spdlog::warn("arbiter: shutdown bound passed with {} load(s) in flight and {} handle(s) "
                   "held; they unload when they finish",
                   loading_count_, held_count_);
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
    if (e->state != ModelState::kLoaded) continue;
    out.push_back(ResidentEntryInfo{e->key, e->capability, e->model_key, e->role, e->bytes,
                                    e->refcount, e->loaded_at_ms, e->last_used_ms});
  }
  return out;
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
    m.refcount = e->refcount;
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
