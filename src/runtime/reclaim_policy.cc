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
//      loaded engines stay, their next request reloads the weights; and
//      drop the host floors that demotions on a device kept (unpinned
//      models' floors, LRU first: their next wake reads the file).
//   5. Critical pressure refuses new non-text acquires until the level drops
//      (held handles are never yanked).
// Those are the host's stages. Every charge names a memory domain (Note
// [Memory domains] in memory_ledger.h), and room is made where the charge
// is refused: MakeRoom(domain, bytes) asks the ledger's Shortfalls(domain,
// bytes) and runs the stages of each domain whose budget refuses it — the
// charge's own first, then (for a domain inside the host) the host's. A
// device domain's stages, cheapest loss first, act only on that domain's
// holders (models whose entry is charged there — the arbiter's domain_for —
// and the weight caches whose device copies are):
//   6. drop the prompt-cache entries resident on the device (their KV is
//      recomputed or restored from the host/disk tiers);
//   4. demote idle device weights to their host floors (WeightCache::
//      DemoteIdle: the floor a model holds stays, and one without a floor
//      gets one copied from the device when the host budget takes it as it
//      stands, so its re-wake is one host → device copy);
//   3. evict idle models charged there (LRU; never a text target).
// Freeing device memory never helps the host, so a device's shortfall never
// runs host stages; freeing a nested domain's charges frees host room too,
// so the host's "evict idle models" takes every idle model as a victim
// (a device model's unload also drops its host floor and host-side state).
// Device pressure (a DevicePressureSource's events, MemoryPressureEvent::
// domain) runs the device's stages: low — 6 and 4, all of them; critical —
// also 3 for every idle non-text model there. Stage 5 (refusing non-text
// loads) is the host's only: device pressure never refuses a cpu model.
// Triggers and how far they go (the host):
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
#include <span>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "arbiter/base/size.h"

namespace arbiter {
namespace {

constexpr uint64_t kAll = std::numeric_limits<uint64_t>::max();

// The stages of a charge-needs-room round in a domain, in order.
constexpr ReclaimStage kHostChargeStages[] = {
    ReclaimStage::kPurgeExpired, ReclaimStage::kSpillPromptCache,
    ReclaimStage::kEvictIdleModels, ReclaimStage::kDemoteDeviceWeights};
constexpr ReclaimStage kDeviceChargeStages[] = {ReclaimStage::kDropDevicePromptCache,
                                                ReclaimStage::kDemoteDeviceWeights,
                                                ReclaimStage::kEvictIdleModels};
std::span<const ReclaimStage> ChargeStages(MemoryDomain domain) {
  if (domain.is_host()) return kHostChargeStages;
  return kDeviceChargeStages;
}

}  // namespace

std::string_view ReclaimStageName(ReclaimStage stage) {
  switch (stage) {
    case ReclaimStage::kPurgeExpired: return "purge_expired";
    case ReclaimStage::kSpillPromptCache: return "spill_prompt_cache";
    case ReclaimStage::kEvictIdleModels: return "evict_idle_models";
    case ReclaimStage::kDemoteDeviceWeights: return "demote_device_weights";
    case ReclaimStage::kRefuseNonText: return "refuse_non_text";
    case ReclaimStage::kDropDevicePromptCache: return "drop_device_prompt_cache";
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

bool ReclaimPolicy::ShortIn(MemoryDomain domain, size_t bytes, MemoryDomain target) const {
  const MemoryLedger* ledger = targets_->ledger;
  if (ledger == nullptr) return false;
  for (const DomainShortfall& s : ledger->Shortfalls(domain, bytes)) {
    if (s.domain == target) return true;
  }
  return false;
}

bool ReclaimPolicy::Frees(const WeightCache& cache, MemoryDomain target) const {
  if (cache.domain() == target) return true;
  // A device whose memory is host RAM: its copies free host room too.
  return target.is_host() && targets_->ledger != nullptr &&
         targets_->ledger->DomainSnapshot(cache.domain()).inside_host;
}

std::string ReclaimPolicy::Name(MemoryDomain domain) const {
  if (domain.is_host() || targets_->ledger == nullptr) return std::string(kHostDomainName);
  return targets_->ledger->DomainName(domain);
}

void ReclaimPolicy::RunStage(ReclaimStage stage, ReclaimTrigger trigger, MemoryDomain target,
                             size_t need, ReclaimReport* report) {
  const ReclaimTargets& t = *targets_;
  const uint64_t before = t.ledger != nullptr ? t.ledger->charged_bytes(target) : 0;
  // How many ledger bytes of `target` this stage should free (kCharge),
  // else "all".
  auto shortfall = [&]() -> uint64_t {
    if (trigger != ReclaimTrigger::kCharge || t.ledger == nullptr) return kAll;
    const uint64_t charged = t.ledger->charged_bytes(target);
    const uint64_t budget = t.ledger->budget_bytes(target);
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
    case ReclaimStage::kDropDevicePromptCache:
      if (t.drop_device_prompt_entries && !target.is_host()) {
        const uint64_t wanted = shortfall();
        if (wanted > 0) items = static_cast<size_t>(t.drop_device_prompt_entries(target, wanted));
      }
      break;
    case ReclaimStage::kEvictIdleModels:
      if (t.arbiter == nullptr) break;
      if (trigger == ReclaimTrigger::kCharge) {
        // One model at a time until the charge fits (ReclaimIdle re-reads
        // the ledger after each unload, which frees the weights too).
        if (shortfall() > 0) t.arbiter->ReclaimIdle(target, need, &items);
      } else {
        items = t.arbiter->EvictIdleByPriority(
            target,
            trigger == ReclaimTrigger::kPressureLow ? 1 : std::numeric_limits<size_t>::max(),
            UnloadReason::kPressure);
      }
      break;
    case ReclaimStage::kDemoteDeviceWeights: {
      std::vector<WeightCache*> caches;
      if (t.weights != nullptr) caches.push_back(t.weights);
      caches.insert(caches.end(), t.device_weights.begin(), t.device_weights.end());
      for (WeightCache* cache : caches) {
        if (cache == nullptr) continue;
        if (Frees(*cache, target)) {
          const uint64_t wanted = shortfall();
          if (wanted == 0) break;
          // Room on the cache's own device keeps host floors where the host
          // can take them; room on the host frees without (Note [Demotion
          // floors] in weight_cache.cc).
          const bool keep_floors = !target.is_host() && cache->domain() == target;
          if ((keep_floors ? cache->DemoteIdle(wanted) : cache->EvictIdle(wanted)) > 0) ++items;
        }
        if (target.is_host()) {
          const uint64_t wanted = shortfall();
          if (wanted == 0) break;
          if (cache->DropDemotionFloors(wanted) > 0) ++items;
        }
      }
      break;
    }
    case ReclaimStage::kRefuseNonText:
      break;  // raised by OnPressure through SetPressureLevel
  }
  const uint64_t after = t.ledger != nullptr ? t.ledger->charged_bytes(target) : 0;
  ReclaimStep step{stage, target, static_cast<size_t>(before > after ? before - after : 0),
                   items};
  if (step.freed_bytes == 0 && step.items == 0) return;
  report->steps.push_back(step);
  report->freed_bytes += step.freed_bytes;
  if (observer_) observer_(trigger, step);
}

ReclaimReport ReclaimPolicy::MakeRoomReport(MemoryDomain domain, size_t bytes) {
  ReclaimReport report;
  report.trigger = ReclaimTrigger::kCharge;
  report.domain = domain;
  report.wanted_bytes = bytes;
  // The charge's own domain first, then the host (which refuses it only for
  // a domain inside the host: Shortfalls names the host then).
  for (MemoryDomain target : {domain, kHostDomain}) {
    for (ReclaimStage stage : ChargeStages(target)) {
      if (!ShortIn(domain, bytes, target)) break;
      RunStage(stage, ReclaimTrigger::kCharge, target, bytes, &report);
    }
    if (domain.is_host()) break;
  }
  if (report.freed_bytes > 0) {
    spdlog::info("reclaim: {} for a charge of {} in {} ({} step(s))",
                 FormatSize(report.freed_bytes), FormatSize(bytes), Name(domain),
                 report.steps.size());
  }
  return report;
}

size_t ReclaimPolicy::MakeRoom(MemoryDomain domain, size_t bytes) {
  return MakeRoomReport(domain, bytes).freed_bytes;
}

ReclaimReport ReclaimPolicy::OnPressure(const MemoryPressureEvent& event) {
  ReclaimReport report;
  report.trigger = event.level == MemoryPressureLevel::kCritical ? ReclaimTrigger::kPressureCritical
                                                                  : ReclaimTrigger::kPressureLow;
  if (!event.domain.empty() && event.domain != kHostDomainName) {
    std::optional<MemoryDomain> d;
    if (targets_->ledger != nullptr) d = targets_->ledger->FindDomain(event.domain);
    if (!d) {
      spdlog::warn("memory pressure {} from {} names memory domain \"{}\", which is not "
                   "registered; ignored",
                   MemoryPressureLevelName(event.level), event.source, event.domain);
      return report;
    }
    report.domain = *d;
    if (event.level == MemoryPressureLevel::kNominal) return report;
    RunStage(ReclaimStage::kDropDevicePromptCache, report.trigger, *d, 0, &report);
    RunStage(ReclaimStage::kDemoteDeviceWeights, report.trigger, *d, 0, &report);
    if (report.trigger == ReclaimTrigger::kPressureCritical) {
      RunStage(ReclaimStage::kEvictIdleModels, report.trigger, *d, 0, &report);
    }
  } else {
    // Stage 5 first for critical (and lifted for nominal/low): the level is
    // what the arbiter's refusal reads.
    if (targets_->arbiter != nullptr) targets_->arbiter->SetPressureLevel(event);
    if (event.level == MemoryPressureLevel::kNominal) return report;
    RunStage(ReclaimStage::kPurgeExpired, report.trigger, kHostDomain, 0, &report);
    RunStage(ReclaimStage::kSpillPromptCache, report.trigger, kHostDomain, 0, &report);
    RunStage(ReclaimStage::kEvictIdleModels, report.trigger, kHostDomain, 0, &report);
    if (report.trigger == ReclaimTrigger::kPressureCritical) {
      RunStage(ReclaimStage::kDemoteDeviceWeights, report.trigger, kHostDomain, 0, &report);
      ReclaimStep refuse{ReclaimStage::kRefuseNonText, kHostDomain, 0, 0};
      report.steps.push_back(refuse);
      if (observer_) observer_(report.trigger, refuse);
    }
  }
  spdlog::warn("memory pressure {} in {} from {}: released {} ({})",
               MemoryPressureLevelName(event.level), Name(report.domain), event.source,
               FormatSize(report.freed_bytes), [&] {
                 std::string s;
                 for (const ReclaimStep& st : report.steps) {
                   if (!s.empty()) s += ", ";
                   s += fmt::format("{} {}", ReclaimStageName(st.stage), FormatSize(st.freed_bytes));
                 }
                 return s.empty() ? std::string("nothing to release") : s;
               }());
  return report;
}

std::optional<NextVictim> ReclaimPolicy::Next(MemoryDomain domain) const {
  if (targets_->arbiter == nullptr) return std::nullopt;
  std::optional<ResidentEntryInfo> e = targets_->arbiter->NextFitVictim(domain);
  if (!e) return std::nullopt;
  NextVictim v;
  v.model = e->model_key;
  v.domain = Name(domain);
  v.capability = e->capability;
  v.role = e->role;
  v.bytes = e->bytes;
  v.reason = domain.is_host()
                 ? "least recently used idle model that is not a text target (evicted first "
                   "when a charge needs room, after expired cache entries and the prompt cache)"
                 : "least recently used idle model charged to this device that is not a text "
                   "target (evicted when a charge there needs room, after the device's prompt-"
                   "cache entries and idle device weights)";
  return v;
}

std::map<std::string, std::optional<NextVictim>> ReclaimPolicy::NextByDomain() const {
  std::map<std::string, std::optional<NextVictim>> out;
  if (targets_->ledger == nullptr) {
    out[std::string(kHostDomainName)] = Next(kHostDomain);
    return out;
  }
  for (const auto& [name, snap] : targets_->ledger->Snapshot().domains) {
    std::optional<MemoryDomain> d = targets_->ledger->FindDomain(name);
    if (d) out[name] = Next(*d);
  }
  return out;
}

}  // namespace arbiter
