// arbiter/weights/weight_cache.h — the on-demand weight cache: which models'
// compute-ready weights are in the device arena, which keep a host floor,
// and which are evicted, under the arena's weight budget and the process's
// MemoryLedger.
//
// Residency states, modes, acquire, set_residency, release_all,
// preload_pinned, compact, automatic compaction and the scratch reservation
// of the weight budget, as the reference weight runtime has them, with its
// cache defects fixed (docs/weights.md: 'Leaks after a failed transfer',
// 'Budget between loads', 'Scratch of pinned models'). See the design notes
// at the top of weight_cache.cc.
//
// Concepts:
//   - A model is registered once (WeightModel): its key, the compute layout
//     (`specs`: the tensors the engine computes from, in order), the layout
//     digest (names a shared floor), a `fill` that materializes the tensors
//     from the model file (the expensive step) and its initial residency.
//   - Tiers: file → host floor (a WeightStore HostFloor) → device arena (one
//     MemoryPool block per model over a DeviceBackend, tensors at 64-byte
//     aligned offsets inside it).
//   - ResidencyState, ordered: kUnpinned < kPinnedSystem < kPinnedDevice.
//       kUnpinned      nothing kept; a load reads the file.
//       kPinnedSystem  a host floor is kept; the device copy is on demand
//                      (evictable), and a load is a host→device copy.
//       kPinnedDevice  always on the device, outside the LRU and the
//                      on-demand budget; the host floor is kept too (states
//                      are floors: each keeps what the lower ones keep).
//   - ResidencyMode: kSelfManaged (Acquire loads and evicts on demand) or
//     kExternallyManaged (a control plane decides: Acquire of a model that is
//     not device-resident fails with NotResident, and leaving kPinnedDevice
//     frees the device copy).
//   - Acquire(key) returns a move-only WeightLease: the device copy stays put
//     (never evicted, compacted or freed) while any lease on it lives. The
//     engine holds one for the duration of each request.
//   - Budget: the on-demand budget of SolveWeightBudget(arena, fraction,
//     wiggle, max_scratch, pinned device bytes), where max_scratch is the
//     largest registered scratch_bytes of any model, pinned ones included
//     (docs/weights.md, 'Scratch of pinned models'). Resident unpinned +
//     pinned-system device bytes ≤ the on-demand budget after every
//     operation, demotions included (docs/weights.md, 'Budget between
//     loads'), except a single model larger than the whole budget, which
//     evicts everything evictable, is logged as a warning and loads anyway.
//   - Ledger: every device byte (kDeviceWeights) and host-floor byte
//     (kHostFloor) is charged to the MemoryLedger with owner
//     "weights::<key>", with TryCharge: when the ledger is full the cache
//     first asks its `reclaimer` (the runtime's reclaim policy) to free the
//     rest, then evicts its own idle device copies (LRU, text models' too);
//     if it still does
//     not fit it fails with kResourceExhausted — unless nothing else holds a
//     lease, when it charges anyway (the one over-budget exception, logged
//     and counted by the ledger).
//
// Example:
//   ARBITER_ASSIGN_OR_RETURN(std::unique_ptr<WeightCache> cache,
//                            WeightCache::Create({.device = device.get(), .ledger = &ledger}));
//   ARBITER_RETURN_IF_ERROR(cache->Register(std::move(model)));
//   ARBITER_ASSIGN_OR_RETURN(WeightLease lease, cache->Acquire("demo-chat"));
//   const float* embed = static_cast<const float*>(lease.tensor(0));
//   // lease releases on scope exit; the copy stays resident, evictable.
//
// Thread safety: WeightCache is thread-safe. Loads, frees, floor
// materialization, reclaim calls and logging run outside its lock; a load in
// flight is shared by every concurrent Acquire of that model (single
// flight). WeightLease is thread-compatible (one owner; move it).
// Lifetime: the device, ledger and store must outlive the cache; every
// lease must be gone before the cache is destroyed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "arbiter/base/mutex.h"
#include "arbiter/base/status.h"
#include "arbiter/memory/device_backend.h"
#include "arbiter/memory/memory_ledger.h"
#include "arbiter/memory/reclaimer.h"
#include "arbiter/memory/memory_pool.h"
#include "arbiter/weights/weight_budget.h"
#include "arbiter/weights/weight_files.h"
#include "arbiter/weights/weight_store.h"

namespace arbiter {

enum class ResidencyState { kUnpinned = 0, kPinnedSystem = 1, kPinnedDevice = 2 };
// "unpinned" | "pinned_system" | "pinned_device".
std::string_view ResidencyStateName(ResidencyState state);
// Parses the names above. Errors: kInvalidArgument listing them.
Result<ResidencyState> ParseResidencyState(std::string_view name);

enum class ResidencyMode { kSelfManaged = 0, kExternallyManaged = 1 };
// "self_managed" | "externally_managed".
std::string_view ResidencyModeName(ResidencyMode mode);
Result<ResidencyMode> ParseResidencyMode(std::string_view name);

// The reference's NotResidentError text for `key` (kFailedPrecondition):
// "model '<key>' is not resident on the device; the control plane must pin it
// before inference".
Status NotResidentError(std::string_view key);
// Whether `status` is a NotResidentError.
bool IsNotResident(const Status& status);

// A model's registration.
struct WeightModel {
  std::string key;                 // model name; unique in the cache
  std::vector<WeightSpec> specs;   // compute layout, in order (may be empty)
  uint64_t digest = 0;             // WeightsDigest of the layout and file token
  // Materializes the tensors from the model file into `arrays` (spec order,
  // WeightSpecBytes each, 64-byte aligned). REQUIRED. Must write every byte:
  // a floor's arrays are zeroed, but on a host-addressable device the cache
  // fills the arena block directly, which may hold an earlier model's bytes.
  // Called outside the cache's lock, possibly from several threads for
  // different models. An exception is caught and reported as kInternal.
  WeightFill fill;
  ResidencyState residency = ResidencyState::kUnpinned;
  // Device scratch the model needs to run (activations), bytes; the largest
  // over all models is the budget's max_scratch, pinned ones included.
  size_t scratch_bytes = 0;
  // Victim order: an idle copy with evict_last set (the server sets it for
  // text-target models) is evicted only when no other idle copy is left;
  // among equals, least recently used first.
  bool evict_last = false;
};

struct WeightCacheOptions {
  DeviceBackend* device = nullptr;  // REQUIRED: the arena
  MemoryLedger* ledger = nullptr;   // null → nothing charged
  WeightStore* store = nullptr;     // host floors; null → an owned PrivateWeightStore
  ResidencyMode mode = ResidencyMode::kSelfManaged;
  double fraction = kDefaultWeightFraction;  // WeightBudget fraction, (0, 1]
  double wiggle = kDefaultWeightWiggle;      // WeightBudget wiggle, [0, 1)
  // Compact automatically after every N-th load, a count of loads (0 =
  // never). Configured by [memory].compaction_interval.
  uint64_t compaction_every_loads = 0;
  // Asked for ledger room before the cache evicts its own idle device
  // copies (the runtime's ReclaimPolicy: Note [Reclaim order] in
  // runtime/reclaim_policy.h); null → only the cache's own idle copies.
  // Called outside the cache's lock; may call back into the cache (Evict,
  // EvictIdle). Must outlive the cache.
  Reclaimer* reclaimer = nullptr;
  // The ledger domain of the device copies (kDeviceWeights): the device's
  // (Note [Memory domains] in memory_ledger.h); host floors are always
  // charged to the host. Default: the host (the cpu arena).
  MemoryDomain domain;
  // The pool's region size (MemoryPoolOptions::region_bytes): 0 = one
  // region as large as the device allows (the cpu arena: address space
  // mapped lazily); 1 = a region of each model's own size (a GPU: the VRAM
  // allocated is exactly what is charged, and it goes back to the driver
  // when the model's weights leave).
  uint64_t pool_region_bytes = 0;
};

// Where a load's bytes came from.
enum class WeightLoadSource { kNone = 0, kFile, kFloor };
// "none" | "file" | "floor".
std::string_view WeightLoadSourceName(WeightLoadSource source);

// Per model (Stats()).
struct WeightModelStats {
  std::string key;
  ResidencyState residency = ResidencyState::kUnpinned;
  bool device_resident = false;
  bool host_resident = false;      // a host floor is held
  bool loading = false;
  size_t weight_bytes = 0;         // Σ WeightSpecBytes: the model's budget unit
  size_t device_bytes = 0;         // the device block (aligned) when resident
  size_t host_bytes = 0;           // the floor's mapped bytes when held
  int leases = 0;
  uint64_t loads = 0;
  uint64_t evicts = 0;
  WeightLoadSource last_load_source = WeightLoadSource::kNone;
  double last_load_seconds = 0;
  std::string floor_region;        // shared floor region name, else empty
};

// A snapshot (STYLE rule 9); /admin/status and /metrics serialize it.
struct WeightCacheStats {
  ResidencyMode mode = ResidencyMode::kSelfManaged;
  WeightBudget budget;              // the current solution
  size_t max_bytes = 0;             // = budget.on_demand_budget_bytes
  size_t resident_bytes = 0;        // device bytes of non-device-pinned models
  size_t pinned_bytes = 0;          // device bytes of device-pinned models
  size_t host_bytes = 0;            // Σ host floors' mapped bytes
  size_t max_scratch_bytes = 0;
  uint64_t loads = 0;
  uint64_t evicts = 0;              // device copies freed (any reason but shutdown)
  uint64_t compactions = 0;
  double load_seconds = 0;          // Σ load wall time
  uint64_t oversize_loads = 0;      // loads larger than the whole budget
  MemoryPoolStats pool;
  std::vector<WeightModelStats> models;  // registration order
};

struct CompactResult {
  int reloaded = 0;              // models reloaded from the reload list
  size_t freed_bytes = 0;        // device bytes freed by the compaction
  size_t resident_bytes_after = 0;  // device bytes resident (pinned included) after
  std::vector<std::string> skipped_leased;  // resident but leased: left in place
};

class WeightCache;

// Pins one model's device copy. Move-only; releases on destruction.
class WeightLease {
 public:
  WeightLease() = default;
  WeightLease(WeightLease&& o) noexcept;
  WeightLease& operator=(WeightLease&& o) noexcept;
  WeightLease(const WeightLease&) = delete;
  WeightLease& operator=(const WeightLease&) = delete;
  ~WeightLease() { Release(); }

  bool valid() const { return cache_ != nullptr; }
  // Host-dereferenceable address of tensor i in the device arena (spec
  // order), or nullptr when the device is not host-addressable (fake, GPU).
  // REQUIRES: valid(), i < size().
  const void* tensor(size_t i) const { return host_[i]; }
  const std::vector<const void*>& tensors() const { return host_; }
  // The device region holding the model's tensors (all in one block).
  DeviceRegionId region() const { return region_; }
  // Byte offset of tensor i inside region(); (region(), device_offset(i))
  // is where a device kernel finds it.
  uint64_t device_offset(size_t i) const { return offsets_[i]; }
  size_t size() const { return offsets_.size(); }
  // The device arena region() lies in (its cache's DeviceBackend).
  // REQUIRES: valid().
  DeviceBackend* device() const;
  // Idempotent.
  void Release();

 private:
  friend class WeightCache;
  WeightCache* cache_ = nullptr;
  void* entry_ = nullptr;
  DeviceRegionId region_ = 0;
  std::vector<uint64_t> offsets_;     // from the region start
  std::vector<const void*> host_;
};

class WeightCache {
 public:
  // Errors: kInvalidArgument when device is null or fraction/wiggle are out
  // of range (names the option).
  static Result<std::unique_ptr<WeightCache>> Create(WeightCacheOptions options);
  // REQUIRES: no live lease. Frees every device copy and floor.
  ~WeightCache();
  WeightCache(const WeightCache&) = delete;
  WeightCache& operator=(const WeightCache&) = delete;

  // Adds a model (not loaded). A kPinnedSystem / kPinnedDevice residency is
  // applied by PreloadPinned() (or the first SetResidency/Acquire).
  // Errors: kAlreadyExists, kInvalidArgument (empty key, no fill, a bad spec).
  Status Register(WeightModel model) EXCLUDES(mu_);
  // Re-registers `model.key` when its digest differs from the registered
  // one (its files changed on disk since they were planned): frees the old
  // device copy and drops the old host floor (a shared region is unlinked
  // by its last user), then takes the new layout, digest and fill; the
  // residency is kept (a pinned floor is re-made from the new files by the
  // next Acquire or SetResidency). Returns whether it replaced anything
  // (false: same digest, nothing done). Errors: kNotFound; kFailedPrecondition
  // when the old weights are leased; kInvalidArgument as Register.
  Result<bool> Replace(WeightModel model) EXCLUDES(mu_);
  bool Contains(std::string_view key) const EXCLUDES(mu_);
  // Whether `key`'s device copy is resident now; nullopt for an unknown key.
  // One lookup (no snapshot): cheap enough for every request.
  std::optional<bool> DeviceResident(std::string_view key) const EXCLUDES(mu_);

  // Guarantees `key`'s device copy is resident and pins it (see the file
  // comment). Resident → bumped to most recently used. Otherwise, in
  // self-managed mode: LRU victims (unleased, not device-pinned) are evicted
  // until it fits the on-demand budget, freed before the load and outside the
  // lock; then the copy is transferred from the floor if one is held, else
  // filled from the file.
  // Errors: kNotFound (unknown key); NotResidentError (externally managed,
  // not resident); kResourceExhausted (the ledger or the arena cannot take
  // it while other models are leased: names the bytes and the holders);
  // a load error (fill or transfer; what was transferred is freed, see
  // docs/weights.md 'Leaks after a failed transfer'), prefixed "weights of '<key>': ".
  Result<WeightLease> Acquire(std::string_view key) EXCLUDES(mu_);

  // Moves `key` to `target` (see ResidencyState): materializes or drops the
  // host floor (a floor made while the device copy is resident is copied
  // back from the device, not re-read from the file), loads the device copy
  // for kPinnedDevice (outside the on-demand budget) and evicts LRU victims
  // when the budget shrank. Leaving kPinnedDevice: externally managed →
  // the device copy is freed (once its leases are gone); self-managed → it
  // stays, evictable. Returns the previous state.
  // Errors: kNotFound; kResourceExhausted when the pin cannot fit: a
  // kPinnedDevice whose device bytes would take the pinned total past the
  // weight pool, or a floor / device copy the ledger cannot take (the
  // message gives the bytes, the pool or budget, and what to unpin); load
  // errors as Acquire. On error the residency is unchanged.
  Result<ResidencyState> SetResidency(std::string_view key, ResidencyState target) EXCLUDES(mu_);

  // Frees `key`'s device copy unless it is device-pinned; a pinned floor stays, an
  // unpinned one (DemoteIdle's) goes. A leased copy is freed when its last lease is
  // released. A load or demotion of `key` in flight is waited for first. Returns
  // whether the copy was freed now. Errors: kNotFound.
  Result<bool> Evict(std::string_view key) EXCLUDES(mu_);

  // Frees device copies of idle (unleased) non-device-pinned models, least
  // recently used first, until `bytes` are freed or none is left (memory
  // pressure: demote device weights to their floors). Returns bytes freed.
  size_t EvictIdle(size_t bytes) EXCLUDES(mu_);

  // EvictIdle for room in the cache's device domain (the device's demote
  // stage): each demoted model without a host floor gets one, copied from
  // its device copy before that copy is freed, when the host domain takes
  // the floor's kHostFloor charge as it stands (TryCharge; nothing is
  // reclaimed for it). A model whose floor could not be made is demoted
  // without one (its next load reads the file). Returns device bytes freed.
  // Note [Demotion floors] in weight_cache.cc.
  size_t DemoteIdle(size_t bytes) EXCLUDES(mu_);

  // Drops the host floors kept by DemoteIdle — floors of unpinned models
  // that are not busy — least recently used first, until `bytes` host bytes
  // are freed or none is left (the host's demote stage). Floors of
  // pinned_system and pinned_device models are never dropped here. Returns
  // host bytes freed.
  size_t DropDemotionFloors(size_t bytes) EXCLUDES(mu_);

  // Releases everything `key` holds: device copy (pinned too), LRU place,
  // host floor. The model stays registered (kUnpinned).
  // Errors: kNotFound; kFailedPrecondition when it is leased.
  Status ReleaseAll(std::string_view key) EXCLUDES(mu_);

  // Makes every kPinnedDevice model device-resident and every kPinnedSystem
  // model's floor present. Returns the first error (keeps going).
  Status PreloadPinned() EXCLUDES(mu_);

  // Defragments the arena: frees every resident, unleased, non-device-pinned
  // device copy at once (the pool coalesces), then reloads the models in
  // `reload` (self-managed mode only; unknown keys → kNotFound before
  // anything is freed). Device-pinned copies and floors are never touched.
  Result<CompactResult> Compact(const std::vector<std::string>& reload) EXCLUDES(mu_);

  WeightCacheStats Stats() const EXCLUDES(mu_);
  ResidencyMode mode() const { return options_.mode; }
  DeviceBackend* device() const { return options_.device; }
  // The domain of its device copies (WeightCacheOptions::domain).
  MemoryDomain domain() const { return options_.domain; }

 private:
  friend class WeightLease;
  struct Entry;
  struct Victim;

  explicit WeightCache(WeightCacheOptions options, std::unique_ptr<WeightStore> owned_store,
                       std::unique_ptr<MemoryPool> pool);

  // An entry laid out for `model` (not registered). Errors as Register.
  Result<std::unique_ptr<Entry>> NewEntry(WeightModel model) const;
  Entry* FindLocked(std::string_view key) const REQUIRES(mu_);
  void ReleaseLease(Entry* e) EXCLUDES(mu_);
  WeightLease MakeLeaseLocked(Entry* e) REQUIRES(mu_);
  WeightBudget BudgetLocked() const REQUIRES(mu_);
  uint64_t OnDemandResidentLocked() const REQUIRES(mu_);
  // Takes idle LRU victims out of residency until resident + incoming ≤
  // budget (or `min_free` bytes are taken); `except` is never a victim.
  void PickVictimsLocked(uint64_t incoming, const Entry* except, std::vector<Victim>* out)
      REQUIRES(mu_);
  void TakeDeviceLocked(Entry* e, std::vector<Victim>* out) REQUIRES(mu_);
  // The next victim: resident, idle (no lease, not busy), not device-pinned,
  // not `except`; evict_last ones last; least recently used first. Null if
  // none.
  Entry* LruVictimLocked(const Entry* except) const REQUIRES(mu_);
  void FreeVictims(std::vector<Victim>* victims) EXCLUDES(mu_);
  // Loads e's device copy (e is marked loading by the caller).
  Status LoadDevice(Entry* e) EXCLUDES(mu_);
  Status MaterializeFloor(Entry* e) EXCLUDES(mu_);
  // The bytes a floor of `e` is charged before the store maps it (corrected
  // to its mapped size after).
  static uint64_t FloorEstimate(const Entry* e);
  // A fill that copies e's tensors out of its device copy at `block` (Note
  // [Floors from the device]); `e` and the block must outlive the fill.
  WeightFill FillFromDevice(const Entry* e, const PoolBlock& block);
  // DemoteIdle's floor for `e` (busy, by the caller) from `block`, its
  // device copy taken out of residency and not yet freed.
  Status KeepDemotionFloor(Entry* e, const PoolBlock& block) EXCLUDES(mu_);
  Result<MemoryCharge> ChargeRoom(Entry* e, ChargeKind kind, uint64_t bytes) EXCLUDES(mu_);
  // Another entry is leased or busy (a load or floor in flight holds its
  // charge and is about to be used): ChargeRoom must not over-commit.
  bool OtherInUseLocked(const Entry* e) const REQUIRES(mu_);
  void MaybeAutoCompact(const std::string& just_loaded) EXCLUDES(mu_);

  const WeightCacheOptions options_;
  std::unique_ptr<WeightStore> owned_store_;
  WeightStore* const store_;
  std::unique_ptr<MemoryPool> pool_;

  mutable Mutex mu_;
  CondVar changed_{&mu_};
  std::vector<std::unique_ptr<Entry>> entries_ GUARDED_BY(mu_);  // registration order
  std::map<std::string, Entry*, std::less<>> by_key_ GUARDED_BY(mu_);
  uint64_t use_tick_ GUARDED_BY(mu_) = 0;
  uint64_t loads_ GUARDED_BY(mu_) = 0;
  uint64_t evicts_ GUARDED_BY(mu_) = 0;
  uint64_t compactions_ GUARDED_BY(mu_) = 0;
  uint64_t oversize_loads_ GUARDED_BY(mu_) = 0;
  double load_seconds_ GUARDED_BY(mu_) = 0;
  uint64_t max_scratch_ GUARDED_BY(mu_) = 0;
  bool compacting_ GUARDED_BY(mu_) = false;
};

inline DeviceBackend* WeightLease::device() const { return cache_->device(); }

}  // namespace arbiter
