// MemoryArbiter, the slow acquire and loads: same-role swaps (wait for the
// old entry to drain, then evict it), evict-to-fit or the reclaimer before a
// load (Note [Refusing over budget], Note [Reclaim through a Reclaimer]),
// the single-flight load and its publication (Note [Fast path]), Preload and
// Unload. The state machine and invariants are in memory_arbiter.cc.
// "Fixed defect N" is item N of docs/memory-arbiter.md, "Defects of the
// reference, fixed".
#include <algorithm>
#include <exception>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "arbiter/base/size.h"
#include "internal/arbiter_impl.h"

namespace arbiter {
namespace arbiter_internal {

void MemoryArbiterImpl::ClaimLocked(Entry* e, size_t incoming) {
  e->state = ModelState::kLoading;
  ++e->load_attempt;
  AddRoleMemberLocked(e);
  loading_count_++;
  e->bytes = incoming;
  loading_bytes_ += incoming;
  e->charge = ledger_->Charge(e->domain, e->key, e->charge_kind, incoming);
}

void MemoryArbiterImpl::MakeRoomAfter(MemoryDomain domain) {
  if (ledger_->OverBudgetHint()) options_.reclaimer->MakeRoom(kHostDomain, 0);
  if (!domain.is_host() && ledger_->OverBudgetHint(domain)) {
    options_.reclaimer->MakeRoom(domain, 0);
  }
}

Result<ArbiterHandle> MemoryArbiterImpl::AcquireSlow(Capability capability,
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
            fit_after = ledger_->OverBudgetHint() || ledger_->OverBudgetHint(e->domain);
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
        // Same-role conflicts, loads in flight included (docs/memory-arbiter.md, fixed defect 4).
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
        // The entry's domain decides (Note [Memory domains]): its own budget
        // and, inside the host, the host's; for the host, budget != 0 and
        // charged + incoming > budget.
        const bool ask_reclaimer = options_.reclaimer != nullptr && !reclaimed &&
                                   !ledger_->Shortfalls(e->domain, incoming).empty();
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
      options_.reclaimer->MakeRoom(e->domain, reclaim_bytes);
      reclaimed = true;
      continue;  // the world changed: decide again
    }
    if (fit_after) MakeRoomAfter(e->domain);
    if (reused) return std::move(*reused);
    if (!error.ok()) return error;
    return LoadClaimed(e, /*pin=*/true);
  }
}

Result<ArbiterHandle> MemoryArbiterImpl::LoadClaimed(Entry* e, bool pin) {
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
        const ChargeKind main_kind = e->charge_kind;
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
            if (kind != main_kind) e->part_charges.push_back(ledger_->Charge(e->domain, e->key, kind, bytes));
          }
        }
        for (const auto& [kind, bytes] : b.host_charge_parts) {
          e->host_charges.push_back(ledger_->Charge(MemoryDomain(), e->key, kind, bytes));
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
        // a preload (docs/memory-arbiter.md, fixed defect 7: preload never
        // evicts); the next acquire's evict-to-fit makes room.
        if (pin && options_.reclaimer == nullptr) EvictToFitLocked(0, &unloaded);
        fit_after = pin && options_.reclaimer != nullptr &&
                    (ledger_->OverBudgetHint() || ledger_->OverBudgetHint(e->domain));
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
  if (fit_after) MakeRoomAfter(e->domain);
  return out;
}

Result<bool> MemoryArbiterImpl::UpdateResidentBytes(Capability capability,
                                                    std::string_view model_key, size_t bytes) {
  MutexLock l(&mu_);
  if (regs_[Index(capability)] == nullptr) {
    return NotFoundError(
        fmt::format("no capability registered for \"{}\"", CapabilityName(capability)));
  }
  Entry* e = FindEntry(capability, model_key);
  if (e == nullptr || e->state != ModelState::kLoaded) return false;
  size_t parts = 0;
  for (const MemoryCharge& c : e->part_charges) parts += c.bytes();
  bytes = std::max(bytes, parts);
  e->charge.ForceResize(bytes - parts);
  resident_bytes_ = resident_bytes_ - e->bytes + bytes;
  e->bytes = bytes;
  e->measured = true;
  return true;
}

Result<bool> MemoryArbiterImpl::Unload(Capability capability, std::string_view model_key,
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

bool MemoryArbiterImpl::Preload(Capability capability, std::string_view model_key) {
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
    // A same-role conflict would need a swap; preload never evicts
    // (docs/memory-arbiter.md, fixed defect 7).
    if (e->swap_same_role && !role_members_[Index(e->role)].empty()) return false;
    ClaimLocked(e, incoming);
  }
  return LoadClaimed(e, /*pin=*/false).ok();
}

}  // namespace arbiter_internal
}  // namespace arbiter
