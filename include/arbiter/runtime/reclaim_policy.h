// arbiter/runtime/reclaim_policy.h — THE order in which arbiter gives memory
// back: one policy for "a charge needs room" and for OS memory pressure
// (docs/architecture.md "Giving memory back: the reclaim order"; Note [Reclaim order] in
// src/runtime/reclaim_policy.cc).
//
// The layers below expose mechanisms only — the prompt cache purges and
// spills, the MemoryArbiter picks and evicts idle models (ReclaimIdle,
// EvictIdleByPriority) and refuses non-text work under critical pressure,
// the WeightCache demotes idle device copies to their floors. The policy
// decides which runs first and how far each trigger goes:
//
//   stage                     "a charge needs room"     low pressure     critical pressure
//   1 purge expired caches    yes                       yes              yes
//   2 spill the prompt cache  what is needed            all of it        all of it
//   3 evict idle models       LRU, until it fits        the one lowest-  every idle
//                             (never a text target)     priority one     non-text one
//   4 demote device weights   what is needed            —                all idle ones
//   5 refuse non-text         —                         —                until the level drops
//
// A charge-needs-room round stops as soon as the charge fits. Held models
// are never evicted; text targets never by fit or pressure.
//
// The table above is the host's. Room is made per memory domain (Note
// [Memory domains] in memory_ledger.h; Note [Reclaim order] in the .cc):
// a charge into a device domain, or that device's pressure, runs the
// device's stages on that domain's holders only:
//
//   device stage                 "a charge needs room"   low pressure   critical pressure
//   6 drop device prompt cache   what is needed          all of it      all of it
//   4 demote device weights      what is needed          all idle ones  all idle ones
//   3 evict idle models          LRU, until it fits      —              every idle non-text one
//
// Thread safety: thread-safe. The policy holds no lock while a stage runs:
// every mechanism takes its own component's lock and runs its slow work
// (unloads, spill IO) outside it.
// Lifetime: the targets must stay valid from the first MakeRoom/OnPressure
// call to the last (the Runtime owns both and clears nothing before its
// threads have stopped).
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "arbiter/arbiter/memory_arbiter.h"
#include "arbiter/arbiter/vision_embedding_cache.h"
#include "arbiter/kv/prompt_cache.h"
#include "arbiter/memory/memory_ledger.h"
#include "arbiter/memory/memory_pressure.h"
#include "arbiter/memory/reclaimer.h"
#include "arbiter/weights/weight_cache.h"

namespace arbiter {

enum class ReclaimStage {
  kPurgeExpired = 0,      // expired prompt-cache and vision-cache entries
  kSpillPromptCache,      // prompt-cache entries to the disk tier
  kEvictIdleModels,       // idle models (fit: LRU; pressure: lowest priority)
  kDemoteDeviceWeights,   // idle device weight copies back to their floors / files
  kRefuseNonText,         // critical pressure: non-text acquires refused
  kDropDevicePromptCache, // a device's: prompt-cache entries resident on it
};
inline constexpr size_t kReclaimStageCount = 6;
// "purge_expired" | "spill_prompt_cache" | "evict_idle_models" |
// "demote_device_weights" | "refuse_non_text" | "drop_device_prompt_cache".
std::string_view ReclaimStageName(ReclaimStage stage);

// What each trigger asks of the policy.
enum class ReclaimTrigger { kCharge, kPressureLow, kPressureCritical };
// "charge" | "pressure_low" | "pressure_critical".
std::string_view ReclaimTriggerName(ReclaimTrigger trigger);

// The mechanisms the policy drives. Any may be null (absent component);
// `ledger` and `arbiter` are required by MakeRoom / OnPressure.
struct ReclaimTargets {
  MemoryLedger* ledger = nullptr;
  MemoryArbiter* arbiter = nullptr;
  // Weight caches, each charging its device copies to its domain()
  // (WeightCacheOptions::domain): `weights` (the cpu arena's, the host) and
  // one per device domain. The demote stage of a domain runs the caches
  // whose copies are charged there — for the host, those in the host or in
  // a domain inside it.
  WeightCache* weights = nullptr;
  std::vector<WeightCache*> device_weights;
  PromptCache* prompt_cache = nullptr;
  VisionEmbeddingCache* vision_cache = nullptr;
  // Drops prompt-cache entries whose KV is resident in `domain` (a device)
  // until `bytes` are freed there (UINT64_MAX: all); returns how many it
  // dropped. Null: no prompt-cache entry lives on a device (today's
  // PromptCache keeps its snapshots in host RAM, charged to the host).
  std::function<uint64_t(MemoryDomain domain, uint64_t bytes)> drop_device_prompt_entries;
};

// One stage that ran: the ledger bytes it released (measured as the drop of
// the ledger's charged bytes across the stage, so a model's unload counts
// its weights too) and the items it handled (entries, models, copies).
struct ReclaimStep {
  ReclaimStage stage = ReclaimStage::kPurgeExpired;
  // The domain whose stage it was; freed_bytes is the drop of its charged
  // bytes.
  MemoryDomain domain;
  size_t freed_bytes = 0;
  size_t items = 0;
};

struct ReclaimReport {
  ReclaimTrigger trigger = ReclaimTrigger::kCharge;
  // The domain the charge goes to, or the pressure is about. A charge into
  // a domain inside the host may also run host steps (ReclaimStep::domain).
  MemoryDomain domain;
  size_t wanted_bytes = 0;        // kCharge: the charge that needs room
  std::vector<ReclaimStep> steps; // in the order they ran
  size_t freed_bytes = 0;         // Σ steps
};

// What the policy would give back next: the model stage 3 of a
// charge-needs-room round would evict first.
struct NextVictim {
  std::string model;
  std::string domain{kHostDomainName};  // the domain asked about
  Capability capability = Capability::kText;
  ResidentRole role = ResidentRole::kTextTarget;
  size_t bytes = 0;
  std::string reason;  // e.g. "least recently used idle model (fit)"
};

class ReclaimPolicy final : public Reclaimer {
 public:
  // REQUIRES: `targets` outlives the policy; its fields are set before the
  // first call and not changed while a call may run.
  explicit ReclaimPolicy(const ReclaimTargets* targets);

  // Reclaimer: a charge of `bytes` into `domain` needs room (bytes = 0: the
  // domain is over its budget). Runs the domain's stages in order (host:
  // 1–4; a device: 6, 4, 3 on its holders) until its budget holds the
  // charge; then, for a domain inside the host whose charge the host's
  // budget still refuses, the host's stages. Returns the ledger bytes
  // released (Σ steps, each in its own domain).
  using Reclaimer::MakeRoom;
  size_t MakeRoom(MemoryDomain domain, size_t bytes) override;
  // The same, with the report of what ran.
  ReclaimReport MakeRoomReport(size_t bytes) { return MakeRoomReport(kHostDomain, bytes); }
  ReclaimReport MakeRoomReport(MemoryDomain domain, size_t bytes);

  // OS memory pressure (or POST /admin/pressure): records the level in the
  // arbiter (stage 5 is in force from that moment for critical, so nothing
  // non-text loads while the other stages run), then runs the trigger's
  // stages. Nominal only records the level.
  // An event of a device domain (MemoryPressureEvent::domain, e.g. from a
  // DevicePressureSource) runs that device's pressure stages on its holders
  // and leaves the arbiter's level (the host's: stage 5) alone; an unknown
  // domain name is logged and ignored.
  ReclaimReport OnPressure(const MemoryPressureEvent& event);

  // See NextVictim; nullopt when no idle model can be evicted. Per domain:
  // the host's victims are every idle model, a device's those charged there.
  std::optional<NextVictim> Next() const { return Next(kHostDomain); }
  std::optional<NextVictim> Next(MemoryDomain domain) const;
  // Next() of every domain of the ledger, by domain name ("host" included).
  std::map<std::string, std::optional<NextVictim>> NextByDomain() const;

  // Called after each stage that ran (tests, logs); null = none. Set before
  // the first call.
  void set_observer(std::function<void(ReclaimTrigger, const ReclaimStep&)> observer) {
    observer_ = std::move(observer);
  }

 private:
  // Runs `stage` of domain `target` for `trigger`; `need` is the charge that
  // needs room (kCharge only; it counts in `target`'s budget). Appends the
  // step to `report` when it did anything.
  void RunStage(ReclaimStage stage, ReclaimTrigger trigger, MemoryDomain target, size_t need,
                ReclaimReport* report);
  // Whether a charge of `bytes` into `domain` is refused by `target`'s
  // budget now (MemoryLedger::Shortfalls).
  bool ShortIn(MemoryDomain domain, size_t bytes, MemoryDomain target) const;
  // Whether `cache`'s device copies free room in `target`.
  bool Frees(const WeightCache& cache, MemoryDomain target) const;
  std::string Name(MemoryDomain domain) const;

  const ReclaimTargets* const targets_;
  std::function<void(ReclaimTrigger, const ReclaimStep&)> observer_;
};

}  // namespace arbiter
