// MemoryArbiter (minimal): registry, single-flight loads, LRU eviction under
// a byte budget.
//
// Each registered model has one Entry, whose state machine is:
//
//   kReady/kFailed --Acquire (this thread loads)--> kLoading
//   kLoading --load ok--> kLoaded        --load error--> kFailed
//   kLoaded --evicted (refcount 0)--> kReady
//
// Invariants (all under mu_):
//   - resident_bytes_ = Σ bytes of kLoaded entries;
//     loading_bytes_  = Σ charged estimates of kLoading entries.
//   - An entry with refcount > 0 is kLoaded and is never evicted.
//   - At most one load per entry is in flight (state kLoading). Other
//     acquirers wait on load_done_ for that attempt (load_attempt) and, when
//     it failed, return its error; they never start a second load for the
//     same attempt. The next Acquire after a failure starts a new attempt.
//   - LRU order is a per-acquire sequence number (use_seq_), not wall time,
//     so it is deterministic in tests.
//
// Slow work happens outside mu_ (STYLE.md rule 6): the load callable runs
// unlocked, and evicted backends are moved into a local "graveyard" vector
// under the lock and destroyed (freeing their memory) after it is released.
// Logging happens after the lock is released too.
//
// Note [Over budget]
// Before loading model M (charge c = its estimate, or the measured size of
// its previous load), idle models are evicted LRU-first until
// resident + loading + c ≤ budget. If that is impossible even after evicting
// every idle model:
//   - when some other model is pinned or loading, Acquire fails with
//     kResourceExhausted naming M, c, the budget and what is held — nothing
//     is evicted in that case (the caller may retry later: 503 Retry-After);
//   - when nothing else is pinned or loading (M alone exceeds the whole
//     budget), every idle model is evicted and M loads anyway, with a
//     warning. This is ARCHITECTURE.md's "one exception": refusing would make
//     the model unusable forever.
// After a load, the charge becomes the measured size. If the measured size
// pushed the total over the budget, idle models (not M) are evicted LRU-first
// as far as possible; if still over, a warning is logged.
#include "arbiter/arbiter/memory_arbiter.h"

#include <exception>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "arbiter/base/size.h"

namespace arbiter {

std::string_view CapabilityName(Capability capability) {
  switch (capability) {
    case Capability::kText: return "text";
    case Capability::kEmbedding: return "embedding";
  }
  return "unknown";
}

Result<Capability> ParseCapability(std::string_view name) {
  if (name == "text") return Capability::kText;
  if (name == "embedding") return Capability::kEmbedding;
  return InvalidArgumentError(fmt::format(
      "unknown capability \"{}\"; expected \"text\" or \"embedding\"", name));
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

struct MemoryArbiter::Entry {
  ModelRegistration reg;
  ModelState state = ModelState::kReady;
  size_t bytes = 0;              // charge: estimate until measured
  bool measured = false;
  size_t charged_loading = 0;    // bytes in loading_bytes_ while kLoading
  std::shared_ptr<void> backend;
  std::type_index type = typeid(void);
  int refcount = 0;
  uint64_t last_used = 0;        // use_seq_ at the last acquire
  uint64_t load_attempt = 0;     // number of the latest started load
  Status last_error;             // of the latest finished load
  // Stats.
  uint64_t loads = 0;
  uint64_t load_failures = 0;
  uint64_t evictions = 0;
  double last_load_ms = 0;
};

// ---------------------------------------------------------------------------
// ArbiterHandle

ArbiterHandle::ArbiterHandle(ArbiterHandle&& other) noexcept
    : arbiter_(std::exchange(other.arbiter_, nullptr)),
      model_(std::move(other.model_)),
      capability_(other.capability_),
      backend_(std::move(other.backend_)),
      type_(other.type_) {}

ArbiterHandle& ArbiterHandle::operator=(ArbiterHandle&& other) noexcept {
  if (this != &other) {
    Release();
    arbiter_ = std::exchange(other.arbiter_, nullptr);
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
  // Drop our reference to the backend first: if the arbiter unloads it on
  // release (shutdown), its memory is freed by the arbiter's graveyard.
  backend_.reset();
  arbiter->ReleaseRef(model_);
}

// ---------------------------------------------------------------------------
// MemoryArbiter

MemoryArbiter::MemoryArbiter(MemoryArbiterOptions options)
    : budget_bytes_(options.budget_bytes),
      clock_(options.clock != nullptr ? options.clock : Clock::Real()),
      load_done_(&mu_) {}

MemoryArbiter::~MemoryArbiter() {
  std::vector<std::shared_ptr<void>> graveyard;
  {
    MutexLock l(&mu_);
    for (auto& [name, e] : entries_) {
      (void)name;
      if (e->refcount > 0) {
        spdlog::error("arbiter destroyed while model \"{}\" has {} handle(s)", e->reg.name,
                      e->refcount);
      }
      if (e->backend) graveyard.push_back(std::move(e->backend));
    }
  }
  graveyard.clear();
}

Status MemoryArbiter::Register(ModelRegistration registration) {
  if (registration.name.empty()) {
    return InvalidArgumentError("model registration has an empty name");
  }
  if (!registration.load) {
    return InvalidArgumentError(
        fmt::format("model \"{}\" registered without a load function", registration.name));
  }
  MutexLock l(&mu_);
  if (entries_.count(registration.name) > 0) {
    return AlreadyExistsError(
        fmt::format("model \"{}\" is already registered", registration.name));
  }
  auto e = std::make_unique<Entry>();
  e->bytes = registration.estimated_bytes;
  e->reg = std::move(registration);
  Entry* raw = e.get();
  entries_.emplace(raw->reg.name, std::move(e));
  order_.push_back(raw);
  return OkStatus();
}

ArbiterHandle MemoryArbiter::PinLocked(Entry* e) {
  e->refcount++;
  e->last_used = ++use_seq_;
  ArbiterHandle h;
  h.arbiter_ = this;
  h.model_ = e->reg.name;
  h.capability_ = e->reg.capability;
  h.backend_ = e->backend;
  h.type_ = e->type;
  return h;
}

bool MemoryArbiter::EvictToFitLocked(size_t incoming, const Entry* except,
                                     std::vector<std::shared_ptr<void>>* graveyard,
                                     std::vector<std::string>* evicted) {
  if (budget_bytes_ == 0) return true;
  while (resident_bytes_ + loading_bytes_ + incoming > budget_bytes_) {
    Entry* victim = nullptr;
    for (Entry* e : order_) {
      if (e == except || e->state != ModelState::kLoaded || e->refcount > 0) continue;
      if (victim == nullptr || e->last_used < victim->last_used) victim = e;
    }
    if (victim == nullptr) return false;
    resident_bytes_ -= victim->bytes;
    graveyard->push_back(std::move(victim->backend));
    victim->backend.reset();
    victim->type = typeid(void);
    victim->state = ModelState::kReady;
    victim->evictions++;
    evictions_++;
    evicted->push_back(fmt::format("{} ({})", victim->reg.name, FormatSize(victim->bytes)));
  }
  return true;
}

std::string MemoryArbiter::DescribeHeldLocked() const {
  std::string out;
  for (const Entry* e : order_) {
    if (e->state == ModelState::kLoaded && e->refcount > 0) {
      if (!out.empty()) out += ", ";
      out += fmt::format("\"{}\" {} ({} handle(s))", e->reg.name, FormatSize(e->bytes),
                         e->refcount);
    } else if (e->state == ModelState::kLoading) {
      if (!out.empty()) out += ", ";
      out += fmt::format("\"{}\" {} (loading)", e->reg.name, FormatSize(e->charged_loading));
    }
  }
  return out.empty() ? "nothing" : out;
}

Result<ArbiterHandle> MemoryArbiter::Acquire(Capability capability, std::string_view name,
                                             ArbiterDeadline deadline) {
  std::vector<std::shared_ptr<void>> graveyard;
  std::vector<std::string> evicted;
  Entry* e = nullptr;
  bool over_budget_alone = false;
  size_t incoming = 0;

  // Phase 1 (locked): reuse, wait for an in-flight load, or claim the load.
  {
    MutexLock l(&mu_);
    for (;;) {
      auto it = entries_.find(name);
      if (it == entries_.end()) return NotFoundError(fmt::format("model \"{}\" not found", name));
      e = it->second.get();
      if (e->reg.capability != capability) {
        return InvalidArgumentError(fmt::format(
            "model \"{}\" has capability \"{}\", not \"{}\"", name,
            CapabilityName(e->reg.capability), CapabilityName(capability)));
      }
      if (shutting_down_) {
        return UnavailableError(
            fmt::format("arbiter is shutting down; cannot acquire model \"{}\"", name));
      }
      if (e->state == ModelState::kLoaded) return PinLocked(e);
      if (e->state == ModelState::kLoading) {
        const uint64_t waiting_for = e->load_attempt;
        while (e->state == ModelState::kLoading && e->load_attempt == waiting_for) {
          if (!load_done_.WaitUntil(deadline) &&
              e->state == ModelState::kLoading && e->load_attempt == waiting_for) {
            return DeadlineExceededError(fmt::format(
                "deadline passed while waiting for model \"{}\" to load; the load "
                "continues, retry later",
                name));
          }
        }
        if (e->load_attempt == waiting_for && e->state == ModelState::kFailed) {
          return e->last_error;
        }
        continue;  // loaded (reuse) or evicted meanwhile (load again)
      }
      break;  // kReady or kFailed: this thread loads.
    }

    incoming = e->bytes;
    if (budget_bytes_ != 0 && resident_bytes_ + loading_bytes_ + incoming > budget_bytes_) {
      size_t idle_bytes = 0;
      bool others_busy = loading_bytes_ > 0;
      for (const Entry* o : order_) {
        if (o->state == ModelState::kLoaded) {
          if (o->refcount == 0) {
            idle_bytes += o->bytes;
          } else {
            others_busy = true;
          }
        } else if (o->state == ModelState::kLoading) {
          others_busy = true;
        }
      }
      const size_t after_evicting = resident_bytes_ + loading_bytes_ - idle_bytes + incoming;
      if (after_evicting > budget_bytes_ && others_busy) {
        return ResourceExhaustedError(fmt::format(
            "cannot load model \"{}\" ({}): the memory budget is {} and {} is held by "
            "requests in flight; retry when they finish, or raise [memory] budget",
            name, FormatSize(incoming), FormatSize(budget_bytes_), DescribeHeldLocked()));
      }
      over_budget_alone = after_evicting > budget_bytes_;
      EvictToFitLocked(incoming, e, &graveyard, &evicted);
    }
    e->state = ModelState::kLoading;
    ++e->load_attempt;
    e->charged_loading = incoming;
    loading_bytes_ += incoming;
  }

  // Phase 2 (unlocked): free victims, log, load.
  graveyard.clear();
  for (const std::string& v : evicted) {
    spdlog::info("arbiter: evicted idle model {} to make room for \"{}\"", v, name);
  }
  if (over_budget_alone) {
    spdlog::warn(
        "arbiter: model \"{}\" ({}) is larger than the whole memory budget ({}); loading it "
        "anyway with nothing else resident",
        name, FormatSize(incoming), FormatSize(budget_bytes_));
  }
  const int64_t t0 = clock_->NowNs();
  Result<LoadedBackend> loaded = InternalError("load not run");
  try {
    loaded = e->reg.load();
  } catch (const std::exception& ex) {
    loaded = InternalError(fmt::format("load threw an exception: {}", ex.what()));
  } catch (...) {
    loaded = InternalError("load threw an unknown exception");
  }
  const double load_ms = static_cast<double>(clock_->NowNs() - t0) / 1e6;
  if (loaded.ok() && !loaded->object) {
    loaded = InternalError("load returned no backend");
  }

  // Phase 3 (locked): publish the outcome and wake waiters.
  Result<ArbiterHandle> out = InternalError("unreachable");
  std::vector<std::string> evicted_after;
  size_t measured = 0, total_after = 0;
  {
    MutexLock l(&mu_);
    loading_bytes_ -= e->charged_loading;
    e->charged_loading = 0;
    e->last_load_ms = load_ms;
    if (loaded.ok()) {
      LoadedBackend b = std::move(loaded).value();
      e->state = ModelState::kLoaded;
      e->backend = std::move(b.object);
      e->type = b.type;
      if (b.resident_bytes > 0) {
        e->bytes = b.resident_bytes;
        e->measured = true;
      }
      measured = e->bytes;
      e->last_error = OkStatus();
      e->loads++;
      loads_++;
      resident_bytes_ += e->bytes;
      if (budget_bytes_ != 0 && resident_bytes_ + loading_bytes_ > budget_bytes_) {
        EvictToFitLocked(0, e, &graveyard, &evicted_after);
      }
      total_after = resident_bytes_ + loading_bytes_;
      out = PinLocked(e);
    } else {
      e->state = ModelState::kFailed;
      e->last_error = loaded.status().WithPrefix(fmt::format("model \"{}\" failed to load", name));
      e->load_failures++;
      load_failures_++;
      out = e->last_error;
    }
    load_done_.SignalAll();
  }

  graveyard.clear();
  if (out.ok()) {
    spdlog::info("arbiter: loaded model \"{}\" ({}) in {:.0f} ms", name, FormatSize(measured),
                 load_ms);
    for (const std::string& v : evicted_after) {
      spdlog::info("arbiter: evicted idle model {} after \"{}\" measured larger than estimated",
                   v, name);
    }
    if (budget_bytes_ != 0 && total_after > budget_bytes_) {
      spdlog::warn("arbiter: {} resident, over the {} budget (every other model is in use)",
                   FormatSize(total_after), FormatSize(budget_bytes_));
    }
  } else {
    spdlog::error("arbiter: {}", out.status().message());
  }
  return out;
}

void MemoryArbiter::ReleaseRef(const std::string& name) {
  std::shared_ptr<void> unloaded;
  {
    MutexLock l(&mu_);
    auto it = entries_.find(name);
    if (it == entries_.end()) return;
    Entry* e = it->second.get();
    if (e->refcount <= 0) {
      spdlog::error("arbiter: release of model \"{}\" with refcount {}", name, e->refcount);
      return;
    }
    e->refcount--;
    if (e->refcount == 0 && shutting_down_ && e->state == ModelState::kLoaded) {
      resident_bytes_ -= e->bytes;
      unloaded = std::move(e->backend);
      e->backend.reset();
      e->state = ModelState::kReady;
    }
  }
  unloaded.reset();  // outside the lock
}

void MemoryArbiter::Shutdown() {
  std::vector<std::shared_ptr<void>> graveyard;
  {
    MutexLock l(&mu_);
    shutting_down_ = true;
    for (Entry* e : order_) {
      if (e->state == ModelState::kLoaded && e->refcount == 0) {
        resident_bytes_ -= e->bytes;
        graveyard.push_back(std::move(e->backend));
        e->backend.reset();
        e->state = ModelState::kReady;
      }
    }
    load_done_.SignalAll();
  }
  graveyard.clear();
}

ArbiterStats MemoryArbiter::Stats() const {
  MutexLock l(&mu_);
  ArbiterStats s;
  s.budget_bytes = budget_bytes_;
  s.resident_bytes = resident_bytes_;
  s.loading_bytes = loading_bytes_;
  s.loads = loads_;
  s.load_failures = load_failures_;
  s.evictions = evictions_;
  for (const Entry* e : order_) {
    ModelStats m;
    m.name = e->reg.name;
    m.capability = e->reg.capability;
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
