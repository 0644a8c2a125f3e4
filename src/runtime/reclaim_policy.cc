// The reclaim policy: arbiter/runtime/reclaim_policy.h.
//
// Note [Reclaim order]
// Every path that gives memory back runs through this file, in this order,
// cheapest loss first:
//   1. Purge expired cache entries (prompt cache, vision-embedding cache):
//      nothing of value is lost.
//   2. Spill the prompt cache to disk: its KV stays restorable (the disk
//      tier), at the price of a file read on the next turn.
//   3. Evict idle models: their next request pays a reload. For a charge
//      that needs room, the least recently used idle model first (text
//      targets never: they are what the user is talking to); for pressure,
//      the lowest role priority first (vision 20 < embedding 25 < vad 35 <
//      asr 40 < tts 50; text 100 never). An evicted engine's unload also
//      evicts its device weights (and saves its slots' conversations).
//   4. Demote idle device weights to their host floors (or their files):
//      loaded engines stay, their next request reloads the weights.
//   5. Critical pressure refuses new non-text acquires until the level drops
//      (held handles are never yanked).
// Triggers and how far they go:
//   - a charge needs room (the MemoryArbiter before a model's load, the
//     WeightCache before device weights or a host floor): stages 1–4, each
//     only as far as needed, stopping as soon as the charge fits;
//   - low pressure: one round — 1, 2 (all of it), 3 (the one
//     lowest-priority idle model);
//   - critical pressure: 5 is raised first (so nothing non-text loads while
//     the rest runs), then 1, 2, 3 (every idle non-text model), 4 (every
//     idle device copy).
// Victims are chosen by the mechanisms (MemoryArbiter::ReclaimIdle /
// EvictIdleByPriority, WeightCache::EvictIdle) under their own locks; the
// policy never holds a lock across a stage, so a stage may re-enter the
// policy (a model's unload frees weights; a spill writes files) without
// deadlock.
#include "arbiter/runtime/reclaim_policy.h"

#include <limits>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "arbiter/base/size.h"

namespace arbiter {

std::string_view ReclaimStageName(ReclaimStage stage) {
  switch (stage) {
    case ReclaimStage::kPurgeExpired: return "purge_expired";
    case ReclaimStage::kSpillPromptCache: return "spill_prompt_cache";
    case ReclaimStage::kEvictIdleModels: return "evict_idle_models";
    case ReclaimStage::kDemoteDeviceWeights: return "demote_device_weights";
    case ReclaimStage::kRefuseNonText: return "refuse_non_text";
  }
  return "unknown";
}

std::string_view ReclaimTriggerName(ReclaimTrigger trigger) {
  switch (trigger) {
    case ReclaimTrigger::kCharge: return "charge";
    case ReclaimTrigger::kPressureLow: return "pressure_low";
    case ReclaimTrigger::kPressureCritical: return "pressure_critical";
  }
  return "unknown";
}

ReclaimPolicy::ReclaimPolicy(const ReclaimTargets* targets) : targets_(targets) {}

bool ReclaimPolicy::Fits(size_t bytes) const {
  const MemoryLedger* ledger = targets_->ledger;
  if (ledger == nullptr || ledger->budget_bytes() == 0) return true;
  return ledger->charged_bytes() + bytes <= ledger->budget_bytes();
}

void ReclaimPolicy::RunStage(ReclaimStage stage, ReclaimTrigger trigger, size_t need,
                             ReclaimReport* report) {
  const ReclaimTargets& t = *targets_;
  const uint64_t before = t.ledger != nullptr ? t.ledger->charged_bytes() : 0;
  // How many ledger bytes this stage should free (kCharge), else "all".
  auto shortfall = [&]() -> uint64_t {
    if (trigger != ReclaimTrigger::kCharge || t.ledger == nullptr) {
      return std::numeric_limits<uint64_t>::max();
    }
    const uint64_t charged = t.ledger->charged_bytes();
    const uint64_t budget = t.ledger->budget_bytes();
    return charged + need > budget ? charged + need - budget : 0;
  };
  size_t items = 0;
  switch (stage) {
    case ReclaimStage::kPurgeExpired:
      if (t.prompt_cache != nullptr) items += static_cast<size_t>(t.prompt_cache->PurgeExpired());
      if (t.vision_cache != nullptr) items += t.vision_cache->PurgeExpired();
      break;
    case ReclaimStage::kSpillPromptCache:
      if (t.prompt_cache != nullptr && t.prompt_cache->bytes() > 0) {
        const size_t entries = t.prompt_cache->size();
        if (t.prompt_cache->Spill(shortfall()) > 0) items = entries - t.prompt_cache->size();
      }
      break;
    case ReclaimStage::kEvictIdleModels:
      if (t.arbiter == nullptr) break;
      if (trigger == ReclaimTrigger::kCharge) {
        // One model at a time until the charge fits (ReclaimIdle re-reads
        // the ledger after each unload, which frees the weights too).
        if (shortfall() > 0) t.arbiter->ReclaimIdle(need, &items);
      } else {
        items = t.arbiter->EvictIdleByPriority(
            trigger == ReclaimTrigger::kPressureLow ? 1 : std::numeric_limits<size_t>::max(),
            UnloadReason::kPressure);
      }
      break;
    case ReclaimStage::kDemoteDeviceWeights:
      if (t.weights != nullptr) {
        const uint64_t demoted = t.weights->EvictIdle(shortfall());
        items = demoted > 0 ? 1 : 0;
      }
      break;
    case ReclaimStage::kRefuseNonText:
      break;  // raised by OnPressure through SetPressureLevel
  }
  const uint64_t after = t.ledger != nullptr ? t.ledger->charged_bytes() : 0;
  ReclaimStep step{stage, static_cast<size_t>(before > after ? before - after : 0), items};
  if (step.freed_bytes == 0 && step.items == 0) return;
  report->steps.push_back(step);
  report->freed_bytes += step.freed_bytes;
  if (observer_) observer_(trigger, step);
}

ReclaimReport ReclaimPolicy::MakeRoomReport(size_t bytes) {
  ReclaimReport report;
  report.trigger = ReclaimTrigger::kCharge;
  report.wanted_bytes = bytes;
  for (ReclaimStage stage : {ReclaimStage::kPurgeExpired, ReclaimStage::kSpillPromptCache,
                             ReclaimStage::kEvictIdleModels,
                             ReclaimStage::kDemoteDeviceWeights}) {
    if (Fits(bytes)) break;
    RunStage(stage, ReclaimTrigger::kCharge, bytes, &report);
  }
  if (report.freed_bytes > 0) {
    spdlog::info("reclaim: {} for a charge of {} ({} step(s))", FormatSize(report.freed_bytes),
                 FormatSize(bytes), report.steps.size());
  }
  return report;
}

size_t ReclaimPolicy::MakeRoom(size_t bytes) { return MakeRoomReport(bytes).freed_bytes; }

ReclaimReport ReclaimPolicy::OnPressure(const MemoryPressureEvent& event) {
  ReclaimReport report;
  report.trigger = event.level == MemoryPressureLevel::kCritical ? ReclaimTrigger::kPressureCritical
                                                                  : ReclaimTrigger::kPressureLow;
  // Stage 5 first for critical (and lifted for nominal/low): the level is
  // what the arbiter's refusal reads.
  if (targets_->arbiter != nullptr) targets_->arbiter->SetPressureLevel(event);
  if (event.level == MemoryPressureLevel::kNominal) return report;
  RunStage(ReclaimStage::kPurgeExpired, report.trigger, 0, &report);
  RunStage(ReclaimStage::kSpillPromptCache, report.trigger, 0, &report);
  RunStage(ReclaimStage::kEvictIdleModels, report.trigger, 0, &report);
  if (report.trigger == ReclaimTrigger::kPressureCritical) {
    RunStage(ReclaimStage::kDemoteDeviceWeights, report.trigger, 0, &report);
    ReclaimStep refuse{ReclaimStage::kRefuseNonText, 0, 0};
    report.steps.push_back(refuse);
    if (observer_) observer_(report.trigger, refuse);
  }
  spdlog::warn("memory pressure {} from {}: released {} ({})",
               MemoryPressureLevelName(event.level), event.source, FormatSize(report.freed_bytes),
               [&] {
                 std::string s;
                 for (const ReclaimStep& st : report.steps) {
                   if (!s.empty()) s += ", ";
                   s += fmt::format("{} {}", ReclaimStageName(st.stage), FormatSize(st.freed_bytes));
                 }
                 return s.empty() ? std::string("nothing to release") : s;
               }());
  return report;
}

std::optional<NextVictim> ReclaimPolicy::Next() const {
  if (targets_->arbiter == nullptr) return std::nullopt;
  std::optional<ResidentEntryInfo> e = targets_->arbiter->NextFitVictim();
  if (!e) return std::nullopt;
  NextVictim v;
  v.model = e->model_key;
  v.capability = e->capability;
  v.role = e->role;
  v.bytes = e->bytes;
  v.reason = "least recently used idle model that is not a text target (evicted first when a "
             "charge needs room, after expired cache entries and the prompt cache)";
  return v;
}

}  // namespace arbiter
