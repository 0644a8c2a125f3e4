// WeightCache: device residency of model weights under the arena's weight
// budget and the MemoryLedger (docs/weights.md).
//
// Each registered model has one Entry (never deleted before the cache). Its
// device copy is one MemoryPool block holding the tensors at 64-byte-aligned
// offsets (`rel_offsets`), in spec order; its host floor is a HostFloor of
// the configured WeightStore.
//
// Invariants (under mu_):
//   - `resident` ⇔ the entry owns `block` and `device_charge` (ledger kind
//     kDeviceWeights, bytes = block size). `floor` non-null ⇔ it owns
//     `floor_charge` (kHostFloor, bytes = the floor's mapped size).
//   - `busy`: one slow operation (device load, floor materialization) runs
//     on the entry, outside the lock, on the thread that set it. Others that
//     need the entry wait on changed_. A busy or leased entry is never a
//     victim; a leased entry's block never moves or frees.
//   - On-demand footprint = Σ block bytes of entries that are resident or
//     loading and not kPinnedDevice. After every operation it is ≤ the
//     on-demand budget, or the one oversize model is the only thing left
//     besides leased/busy entries (logged, counted in oversize_loads).
//   - The budget's pinned bytes are the block sizes of every kPinnedDevice
//     entry, loaded or not (a reservation, so the budget does not move when
//     the pinned loads finish); max_scratch is the largest scratch_bytes of
//     any entry, pinned ones included (docs/weights.md, 'Scratch of pinned
//     models').
//
// Victims are chosen and taken out of residency under the lock; their pool
// blocks are freed, their pages discarded and their charges released after
// it (FreeVictims), before the load that needed the room (STYLE rule 6).
// Charges are released only after the memory is really returned, so the
// ledger never under-reports.
//
// Note [Charging weights]
// Every device and host byte is a ledger charge taken with TryCharge before
// the memory is used (ChargeRoom). When the ledger is full the cache asks its
// `reclaimer` (the runtime's reclaim policy, which decides what goes first:
// caches, idle models — whose unload evicts their weights here —, idle
// device copies), then evicts its own idle device copies (what is left when
// there is no policy), and retries. Only if
// that fails and no other model is leased or busy does it charge anyway — the
// documented "single model larger than the whole budget" exception, which
// the ledger counts as an over-commit and we log. A busy model (a device load
// or a floor in flight) counts as in use: it holds its charge and is leased
// as soon as it is done, and an over-commit next to it would put two models'
// weights over the budget at once; the load is refused (kBudgetExceeded,
// retry later) instead. A failed load releases its
// block and its charge before returning (docs/weights.md, 'Leaks after a
// failed transfer').
//
// Note [Floors from the device]
// A floor requested while the device copy is resident (SetResidency to
// kPinnedSystem of a loaded model) is filled by CopyFromDevice rather than by
// re-reading and re-converting the file; the entry is busy meanwhile, so the
// copy cannot be evicted under it.
//
// Note [Imported floors]
// A floor's first load to the device offers its pages to the device
// (DeviceBackend::ImportHost over the span of its arrays; the floor is one
// page-aligned mapping, so rounding the span outward to the device's import
// alignment stays inside it). Where the device takes them (Vulkan with
// VK_EXT_external_memory_host), every later CopyToDevice from the floor is
// a GPU copy straight out of its pages: a wake of a pinned_system model does
// no host memcpy. The import is made once per floor and kept with it —
// importing pins the pages, which costs time proportional to their size on
// a GPU driver, so doing it per wake would spend what it saves — by
// replacing the entry's floor with an ImportedFloor that owns both and
// destroys the import first; every path that drops a floor drops both. A
// device that refuses (the cpu device, no extension, import_host off, a
// driver error) leaves an ImportedFloor without an import, so it is asked
// once per floor, and copies are staged as before.
//
// Note [Demotion floors]
// Demoting an unpinned device model for room on its device (DemoteIdle, the
// device domain's demote stage) keeps its weights one copy away: a demoted
// entry with no floor gets one, copied from the device copy before that copy
// is freed (the entry is busy meanwhile, so a wake waits and then copies
// from the floor: WeightLoadSource kFloor). The floor is taken only when the
// host domain can charge it as it stands — TryCharge, never the reclaimer:
// a convenience floor is worth less than anything the host would drop for
// it. It is then an ordinary kHostFloor charge of an unpinned entry: the
// host's demote stage drops such floors (DropDemotionFloors, LRU first),
// the model's unload drops it with its device copy (Evict), and a residency
// change to unpinned drops it as before. Floors of pinned_system and
// pinned_device entries are their residency, never dropped by reclaim.
//
// Note [Compaction]
// Compact frees every resident, idle, non-device-pinned block in one step;
// MemoryPool merges free neighbours, so the on-demand space above the
// pinned models becomes one free block again (and a device region left
// empty goes back to the device). Device-pinned models were
// loaded first (PreloadPinned at startup) and sit at the base. Leased blocks
// cannot move (an engine is computing from them) and are reported as
// skipped. Automatic compaction (every N-th load) runs after the load with
// the new lease held, so the model just loaded stays and the others reload
// lazily, from their floors where they have one.
#include "arbiter/weights/weight_cache.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <functional>
#include <limits>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "arbiter/base/clip.h"
#include "arbiter/base/size.h"

namespace arbiter {

namespace {

constexpr std::string_view kNotResidentSuffix =
    "is not resident on the device; the control plane must pin it before inference";

uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

std::string Owner(std::string_view key) { return fmt::format("weights::{}", key); }

// Runs slow work that calls out (fills, stores, devices), turning an
// exception into a Status so an entry is never left busy.
Status Guarded(const std::function<Status()>& work) {
  try {
    return work();
  } catch (const std::exception& ex) {
    return InternalError(fmt::format("unexpected exception: {}", ex.what()));
  } catch (...) {
    return InternalError("unexpected exception");
  }
}

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A floor plus its import by the device (Note [Imported floors]). Members
// are destroyed in reverse order: the import ends before the floor unmaps.
class ImportedFloor final : public HostFloor {
 public:
  ImportedFloor(std::unique_ptr<HostFloor> floor, std::unique_ptr<HostImport> import)
      : floor_(std::move(floor)), import_(std::move(import)) {
    arrays_ = floor_->arrays();
    tensor_bytes_ = floor_->tensor_bytes();
    payload_bytes_ = floor_->payload_bytes();
    mapped_bytes_ = floor_->mapped_bytes();
    filled_here_ = floor_->filled_here();
    region_name_ = floor_->region_name();
  }
  bool imported() const { return import_ != nullptr; }

 private:
  std::unique_ptr<HostFloor> floor_;
  std::unique_ptr<HostImport> import_;
};

// Offers `floor`'s pages to `device`; the ImportedFloor that holds both.
std::unique_ptr<HostFloor> ImportFloor(DeviceBackend* device, std::unique_ptr<HostFloor> floor,
                                       std::string_view key) {
  const uint8_t* begin = nullptr;
  const uint8_t* end = nullptr;
  for (size_t i = 0; i < floor->arrays().size(); ++i) {
    if (floor->tensor_bytes()[i] == 0) continue;  // its pointer may lie outside
    const auto* a = static_cast<const uint8_t*>(floor->arrays()[i]);
    if (begin == nullptr || a < begin) begin = a;
    if (end == nullptr || a + floor->tensor_bytes()[i] > end) end = a + floor->tensor_bytes()[i];
  }
  std::unique_ptr<HostImport> import;
  if (begin != nullptr) {
    Result<std::unique_ptr<HostImport>> made =
        device->ImportHost(begin, static_cast<size_t>(end - begin));
    if (made.ok()) {
      import = std::move(made).value();
    } else if (made.status().code() != StatusCode::kUnimplemented) {
      spdlog::warn("weight cache: the host floor of '{}' could not be imported by {} ({}); "
                   "its loads are staged",
                   key, device->name(), made.status().message());
    }
  }
  return std::make_unique<ImportedFloor>(std::move(floor), std::move(import));
}

}  // namespace

std::string_view ResidencyStateName(ResidencyState state) {
  switch (state) {
    case ResidencyState::kUnpinned: return "unpinned";
    case ResidencyState::kPinnedSystem: return "pinned_system";
    case ResidencyState::kPinnedDevice: return "pinned_device";
  }
  return "unknown";
}

Result<ResidencyState> ParseResidencyState(std::string_view name) {
  for (ResidencyState s : {ResidencyState::kUnpinned, ResidencyState::kPinnedSystem,
                           ResidencyState::kPinnedDevice}) {
    if (ResidencyStateName(s) == name) return s;
  }
  return InvalidArgumentError(
      fmt::format("unknown residency \"{}\"; expected unpinned, pinned_system or pinned_device",
                  ClipInput(name)));
}

std::string_view ResidencyModeName(ResidencyMode mode) {
  return mode == ResidencyMode::kSelfManaged ? "self_managed" : "externally_managed";
}

Result<ResidencyMode> ParseResidencyMode(std::string_view name) {
  if (name == "self_managed") return ResidencyMode::kSelfManaged;
  if (name == "externally_managed") return ResidencyMode::kExternallyManaged;
  return InvalidArgumentError(fmt::format(
      "unknown residency mode \"{}\"; expected self_managed or externally_managed", name));
}

Status NotResidentError(std::string_view key) {
  return FailedPreconditionError(fmt::format("model '{}' {}", key, kNotResidentSuffix),
                                 ErrorReason::kNotResident);
}

bool IsNotResident(const Status& status) { return status.reason() == ErrorReason::kNotResident; }

std::string_view WeightLoadSourceName(WeightLoadSource source) {
  switch (source) {
    case WeightLoadSource::kNone: return "none";
    case WeightLoadSource::kFile: return "file";
    case WeightLoadSource::kFloor: return "floor";
  }
  return "none";
}

struct WeightCache::Entry {
  WeightModel model;
  std::vector<uint64_t> rel_offsets;  // tensor offsets inside the block
  std::vector<uint64_t> tensor_bytes;
  uint64_t weight_bytes = 0;          // Σ tensor_bytes
  uint64_t block_bytes = 0;           // laid-out size (≥ 1 alignment unit)
  ResidencyState residency = ResidencyState::kUnpinned;

  bool resident = false;
  PoolBlock block;
  MemoryCharge device_charge;
  std::unique_ptr<HostFloor> floor;
  MemoryCharge floor_charge;

  bool busy = false;
  bool loading = false;  // busy with a device load (counts in the footprint)
  uint64_t attempt = 0;  // device load attempts
  Status last_error;
  int leases = 0;
  bool evict_when_idle = false;
  uint64_t last_used = 0;

  uint64_t loads = 0;
  uint64_t evicts = 0;
  WeightLoadSource last_source = WeightLoadSource::kNone;
  double last_load_seconds = 0;
};

// A device copy taken out of residency, to free after the lock.
struct WeightCache::Victim {
  Entry* entry = nullptr;
  PoolBlock block;
  MemoryCharge charge;
};

// ---- WeightLease ----------------------------------------------------------------

WeightLease::WeightLease(WeightLease&& o) noexcept
    : cache_(std::exchange(o.cache_, nullptr)),
      entry_(std::exchange(o.entry_, nullptr)),
      region_(o.region_),
      offsets_(std::move(o.offsets_)),
      host_(std::move(o.host_)) {}

WeightLease& WeightLease::operator=(WeightLease&& o) noexcept {
  if (this != &o) {
    Release();
    cache_ = std::exchange(o.cache_, nullptr);
    entry_ = std::exchange(o.entry_, nullptr);
    region_ = o.region_;
    offsets_ = std::move(o.offsets_);
    host_ = std::move(o.host_);
  }
  return *this;
}

void WeightLease::Release() {
  if (cache_ == nullptr) return;
  WeightCache* cache = std::exchange(cache_, nullptr);
  cache->ReleaseLease(static_cast<WeightCache::Entry*>(std::exchange(entry_, nullptr)));
}

// ---- WeightCache ------------------------------------------------------------------

Result<std::unique_ptr<WeightCache>> WeightCache::Create(WeightCacheOptions options) {
  if (options.device == nullptr) {
    return InvalidArgumentError("weight cache: a device backend is required");
  }
  // Validates fraction and wiggle once; BudgetLocked relies on it.
  ARBITER_RETURN_IF_ERROR(
      SolveWeightBudget(options.device->properties().heap_bytes, options.fraction, options.wiggle, 0, 0)
          .status()
          .WithPrefix("weight cache"));
  ARBITER_ASSIGN_OR_RETURN(
      std::unique_ptr<MemoryPool> pool,
      MemoryPool::Create(options.device, {.region_bytes = options.pool_region_bytes}));
  std::unique_ptr<WeightStore> owned;
  if (options.store == nullptr) owned = std::make_unique<PrivateWeightStore>();
  return std::unique_ptr<WeightCache>(
      new WeightCache(std::move(options), std::move(owned), std::move(pool)));
}

WeightCache::WeightCache(WeightCacheOptions options, std::unique_ptr<WeightStore> owned_store,
                         std::unique_ptr<MemoryPool> pool)
    : options_(std::move(options)),
      owned_store_(std::move(owned_store)),
      store_(options_.store != nullptr ? options_.store : owned_store_.get()),
      pool_(std::move(pool)) {}

WeightCache::~WeightCache() {
  std::vector<Victim> victims;
  std::vector<std::unique_ptr<HostFloor>> floors;
  std::vector<MemoryCharge> floor_charges;
  {
    MutexLock l(&mu_);
    for (auto& e : entries_) {
      if (e->leases > 0) {
        spdlog::error("weight cache destroyed with {} live lease(s) on '{}'", e->leases,
                      e->model.key);
      }
      if (e->resident) {
        e->resident = false;
        victims.push_back(Victim{e.get(), e->block, std::move(e->device_charge)});
      }
      if (e->floor) {
        floors.push_back(std::move(e->floor));
        floor_charges.push_back(std::move(e->floor_charge));
      }
    }
  }
  for (Victim& v : victims) {
    options_.device->Discard(v.block.region, v.block.offset, v.block.size_bytes).IgnoreError();
    pool_->Free(v.block).IgnoreError();
    v.charge.Release();
  }
  floors.clear();
  floor_charges.clear();
}

Result<std::unique_ptr<WeightCache::Entry>> WeightCache::NewEntry(WeightModel model) const {
  if (model.key.empty()) return InvalidArgumentError("weight cache: a model needs a key");
  if (!model.fill) {
    return InvalidArgumentError(fmt::format("weight cache: model '{}' has no fill", model.key));
  }
  auto e = std::make_unique<Entry>();
  const uint64_t align = pool_->alignment_bytes();
  uint64_t offset = 0;
  for (const WeightSpec& spec : model.specs) {
    for (int64_t d : spec.shape) {
      if (d < 0) {
        return InvalidArgumentError(fmt::format(
            "weight cache: model '{}' tensor \"{}\" has a negative dimension", model.key,
            spec.name));
      }
    }
    const uint64_t bytes = WeightSpecBytes(spec);
    if (bytes > (std::numeric_limits<uint64_t>::max() >> 2) - offset) {
      return InvalidArgumentError(fmt::format(
          "weight cache: model '{}' tensor \"{}\" overflows the layout", model.key, spec.name));
    }
    offset = AlignUp(offset, align);
    e->rel_offsets.push_back(offset);
    e->tensor_bytes.push_back(bytes);
    e->weight_bytes += bytes;
    offset += bytes;
  }
  e->block_bytes = std::max<uint64_t>(AlignUp(offset, align), align);
  e->residency = model.residency;
  e->model = std::move(model);
  return e;
}

Status WeightCache::Register(WeightModel model) {
  ARBITER_ASSIGN_OR_RETURN(std::unique_ptr<Entry> e, NewEntry(std::move(model)));
  MutexLock l(&mu_);
  if (by_key_.count(e->model.key) > 0) {
    return AlreadyExistsError(
        fmt::format("weight cache: model '{}' is already registered", e->model.key));
  }
  max_scratch_ = std::max(max_scratch_, e->model.scratch_bytes);
  by_key_.emplace(e->model.key, e.get());
  entries_.push_back(std::move(e));
  return OkStatus();
}

// Note [Changed model files]: a model's registration (its digest, which
// names its shared floor, and its fill) describes the files as they were
// planned. When they change on disk, the next load plans them afresh and
// calls Replace: the old device copy and floor (a shared region made from
// the old file) are dropped, never served again, and the new registration
// takes their place; the residency is kept and re-applied on the next
// Acquire or SetResidency (docs/weights.md "Changed model files").
Result<bool> WeightCache::Replace(WeightModel model) {
  ARBITER_ASSIGN_OR_RETURN(std::unique_ptr<Entry> fresh, NewEntry(std::move(model)));
  std::vector<Victim> victims;
  std::unique_ptr<HostFloor> floor;
  MemoryCharge floor_charge;
  {
    MutexLock l(&mu_);
    Entry* e = FindLocked(fresh->model.key);
    if (e == nullptr) {
      return NotFoundError(fmt::format("weight cache: no model '{}'", fresh->model.key));
    }
    while (e->busy) changed_.Wait();
    if (e->model.digest == fresh->model.digest) return false;
    if (e->leases > 0) {
      return FailedPreconditionError(fmt::format(
          "weight cache: the files of '{}' changed on disk while {} lease(s) use its weights; "
          "retry once they are released",
          fresh->model.key, e->leases));
    }
    if (e->resident) TakeDeviceLocked(e, &victims);
    floor = std::move(e->floor);
    floor_charge = std::move(e->floor_charge);
    e->model = std::move(fresh->model);
    e->rel_offsets = std::move(fresh->rel_offsets);
    e->tensor_bytes = std::move(fresh->tensor_bytes);
    e->weight_bytes = fresh->weight_bytes;
    e->block_bytes = fresh->block_bytes;
    e->last_error = OkStatus();
    max_scratch_ = std::max(max_scratch_, e->model.scratch_bytes);
  }
  FreeVictims(&victims);
  floor.reset();  // a shared region is unlinked by its last user
  floor_charge.Release();
  return true;
}

bool WeightCache::Contains(std::string_view key) const {
  MutexLock l(&mu_);
  return FindLocked(key) != nullptr;
}

std::optional<bool> WeightCache::DeviceResident(std::string_view key) const {
  MutexLock l(&mu_);
  const Entry* e = FindLocked(key);
  if (e == nullptr) return std::nullopt;
  return e->resident;
}

WeightCache::Entry* WeightCache::FindLocked(std::string_view key) const {
  auto it = by_key_.find(key);
  return it == by_key_.end() ? nullptr : it->second;
}

WeightBudget WeightCache::BudgetLocked() const {
  uint64_t pinned = 0;
  for (const auto& e : entries_) {
    if (e->residency == ResidencyState::kPinnedDevice) pinned += e->block_bytes;
  }
  Result<WeightBudget> b = SolveWeightBudget(pool_->limit_bytes(), options_.fraction,
                                             options_.wiggle, max_scratch_, pinned);
  return b.ok() ? *b : WeightBudget{};
}

uint64_t WeightCache::OnDemandResidentLocked() const {
  uint64_t total = 0;
  for (const auto& e : entries_) {
    if ((e->resident || e->loading) && e->residency != ResidencyState::kPinnedDevice) {
      total += e->block_bytes;
    }
  }
  return total;
}

bool WeightCache::OtherInUseLocked(const Entry* e) const {
  for (const auto& o : entries_) {
    if (o.get() != e && (o->leases > 0 || o->busy)) return true;
  }
  return false;
}

void WeightCache::TakeDeviceLocked(Entry* e, std::vector<Victim>* out) {
  e->resident = false;
  e->evict_when_idle = false;
  out->push_back(Victim{e, e->block, std::move(e->device_charge)});
  e->block = PoolBlock{};
  e->evicts++;
  evicts_++;
}

WeightCache::Entry* WeightCache::LruVictimLocked(const Entry* except) const {
  Entry* best = nullptr;
  for (const auto& o : entries_) {
    Entry* c = o.get();
    if (c == except || !c->resident || c->busy || c->leases > 0 ||
        c->residency == ResidencyState::kPinnedDevice) {
      continue;
    }
    // evict_last models (text targets) only when nothing else is left.
    if (best == nullptr || (best->model.evict_last && !c->model.evict_last) ||
        (best->model.evict_last == c->model.evict_last && c->last_used < best->last_used)) {
      best = c;
    }
  }
  return best;
}

void WeightCache::PickVictimsLocked(uint64_t incoming, const Entry* except,
                                    std::vector<Victim>* out) {
  const uint64_t budget = BudgetLocked().on_demand_budget_bytes;
  uint64_t footprint = OnDemandResidentLocked();
  while (footprint + incoming > budget) {
    Entry* victim = LruVictimLocked(except);
    if (victim == nullptr) return;
    footprint -= victim->block_bytes;
    TakeDeviceLocked(victim, out);
  }
}

void WeightCache::FreeVictims(std::vector<Victim>* victims) {
  for (Victim& v : *victims) {
    // Discard before the block goes back to the pool: once freed, a
    // concurrent load may be given the same block and fill it, and a discard
    // after that would zero the new weights under the engine computing from
    // them (EngineWeightsTest.EvictionsDuringRequestsNeverChangeTokens).
    Status st = options_.device->Discard(v.block.region, v.block.offset, v.block.size_bytes);
    if (!st.ok()) spdlog::warn("weight cache: {}", st.message());
    st = pool_->Free(v.block);
    if (!st.ok()) spdlog::error("weight cache: freeing '{}': {}", v.entry->model.key, st.message());
    v.charge.Release();  // after the memory is really returned
    spdlog::info("weight cache: evicted '{}' from the device ({})", v.entry->model.key,
                 FormatSize(v.block.size_bytes));
  }
  victims->clear();
}

size_t WeightCache::EvictIdle(size_t bytes) {
  std::vector<Victim> victims;
  uint64_t freed = 0;
  {
    MutexLock l(&mu_);
    while (freed < bytes) {
      Entry* victim = LruVictimLocked(nullptr);
      if (victim == nullptr) break;
      freed += victim->block_bytes;
      TakeDeviceLocked(victim, &victims);
    }
  }
  FreeVictims(&victims);
  return freed;
}

size_t WeightCache::DemoteIdle(size_t bytes) {
  std::vector<Victim> victims;
  std::vector<Entry*> floorless;  // marked busy until their floors are made
  uint64_t freed = 0;
  {
    MutexLock l(&mu_);
    while (freed < bytes) {
      Entry* victim = LruVictimLocked(nullptr);
      if (victim == nullptr) break;
      freed += victim->block_bytes;
      TakeDeviceLocked(victim, &victims);
      if (victim->floor == nullptr) {
        victim->busy = true;
        floorless.push_back(victim);
      }
    }
  }
  for (const Victim& v : victims) {  // Note [Demotion floors]
    if (std::find(floorless.begin(), floorless.end(), v.entry) == floorless.end()) continue;
    const Status st = Guarded([&] { return KeepDemotionFloor(v.entry, v.block); });
    if (!st.ok()) {
      spdlog::info("weight cache: '{}' demoted without a host floor (its next load reads the "
                   "file): {}",
                   v.entry->model.key, st.message());
    }
  }
  FreeVictims(&victims);
  if (!floorless.empty()) {
    MutexLock l(&mu_);
    for (Entry* e : floorless) e->busy = false;
    changed_.SignalAll();
  }
  return freed;
}

uint64_t WeightCache::FloorEstimate(const Entry* e) {
  // Page-rounded payload plus the shared region's header and table: what the
  // store will map, charged up front and corrected after.
  return AlignUp(64 + 16 * e->tensor_bytes.size() + e->block_bytes + kHostFloorAlignment, 4096);
}

WeightFill WeightCache::FillFromDevice(const Entry* e, const PoolBlock& block) {
  return [this, e, block](const std::vector<void*>& arrays) -> Status {
    std::vector<CopyTicket> copies;
    copies.reserve(arrays.size());
    for (size_t i = 0; i < arrays.size(); ++i) {
      copies.push_back(options_.device->CopyFromDevice(
          block.region, block.offset + e->rel_offsets[i], arrays[i], e->tensor_bytes[i]));
    }
    return WaitAll(copies);
  };
}

Status WeightCache::KeepDemotionFloor(Entry* e, const PoolBlock& block) {
  MemoryCharge charge;
  if (options_.ledger != nullptr) {
    ARBITER_ASSIGN_OR_RETURN(charge,
                             options_.ledger->TryCharge(kHostDomain, Owner(e->model.key),
                                                        ChargeKind::kHostFloor, FloorEstimate(e)));
  }
  Result<std::unique_ptr<HostFloor>> floor = store_->Materialize(
      e->model.key, e->model.digest, e->model.specs, FillFromDevice(e, block));
  if (!floor.ok()) return floor.status();
  charge.ForceResize((*floor)->mapped_bytes());
  spdlog::info("weight cache: '{}' demoted to a host floor ({})", e->model.key,
               FormatSize((*floor)->mapped_bytes()));
  MutexLock l(&mu_);
  e->floor = std::move(floor).value();
  e->floor_charge = std::move(charge);
  return OkStatus();
}

size_t WeightCache::DropDemotionFloors(size_t bytes) {
  std::vector<std::unique_ptr<HostFloor>> floors;
  std::vector<MemoryCharge> charges;
  uint64_t freed = 0;
  {
    MutexLock l(&mu_);
    while (freed < bytes) {
      Entry* victim = nullptr;
      for (const auto& o : entries_) {
        Entry* c = o.get();
        if (c->floor == nullptr || c->busy || c->residency != ResidencyState::kUnpinned) continue;
        if (victim == nullptr || c->last_used < victim->last_used) victim = c;
      }
      if (victim == nullptr) break;
      freed += victim->floor->mapped_bytes();
      floors.push_back(std::move(victim->floor));
      charges.push_back(std::move(victim->floor_charge));
    }
  }
  floors.clear();  // the memory goes back before the charges (STYLE rule 6)
  for (MemoryCharge& c : charges) c.Release();
  if (freed > 0) spdlog::info("weight cache: dropped {} of demotion floors", FormatSize(freed));
  return freed;
}

Result<MemoryCharge> WeightCache::ChargeRoom(Entry* e, ChargeKind kind, uint64_t bytes) {
  MemoryLedger* ledger = options_.ledger;
  if (ledger == nullptr) return MemoryCharge();
  const std::string owner = Owner(e->model.key);
  // Device copies are charged to the device's domain, floors to the host
  // (Note [Memory domains] in memory_ledger.h).
  const MemoryDomain domain =
      kind == ChargeKind::kDeviceWeights ? options_.domain : kHostDomain;
  for (int round = 0; round < 4; ++round) {
    Result<MemoryCharge> c = ledger->TryCharge(domain, owner, kind, bytes);
    if (c.ok()) return c;
    const uint64_t available = ledger->available_bytes(domain);
    const uint64_t shortfall = bytes > available ? bytes - available : 1;
    // Other owners first (the policy runs the domain's stages: caches, idle
    // models, idle device copies), then the cache's own idle device copies
    // where freeing them frees `domain`. The policy is asked for room for
    // the whole charge: MakeRoom's contract is "until `bytes` fits".
    if (options_.reclaimer != nullptr && options_.reclaimer->MakeRoom(domain, bytes) > 0) {
      continue;
    }
    if (domain == options_.domain || options_.domain.is_host() ||
        ledger->DomainSnapshot(options_.domain).inside_host) {
      if (EvictIdle(shortfall) > 0) continue;
    }
    break;
  }
  {
    MutexLock l(&mu_);
    if (OtherInUseLocked(e)) {
      std::string holders;
      for (const auto& o : entries_) {
        if (o.get() != e && (o->leases > 0 || o->busy)) {
          if (!holders.empty()) holders += ", ";
          holders += o->leases > 0 ? fmt::format("'{}' ({} lease(s))", o->model.key, o->leases)
                                   : fmt::format("'{}' (loading)", o->model.key);
        }
      }
      return ResourceExhaustedError(fmt::format(
          "cannot take {} for the {} of '{}': the memory budget is {} with {} charged, and the "
          "weights of {} are in use; retry when those requests finish, or raise [memory] budget",
          FormatSize(bytes), ChargeKindName(kind), e->model.key,
          FormatSize(ledger->budget_bytes(domain)), FormatSize(ledger->charged_bytes(domain)),
          holders),
          ErrorReason::kBudgetExceeded);
    }
  }
  if (!domain.is_host()) {
    // A device's budget is its memory: a charge past it is an allocation
    // the driver may fail (or an OOM of the process), never over-committed.
    return ResourceExhaustedError(
        fmt::format("cannot take {} for the {} of '{}' on device {}: its budget is {} with {} "
                    "charged even after the reclaim stages ran; raise [devices.\"{}\"] budget, "
                    "unload a model there, or use device = \"cpu\"",
                    FormatSize(bytes), ChargeKindName(kind), e->model.key,
                    ledger->DomainSnapshot(domain).name, FormatSize(ledger->budget_bytes(domain)),
                    FormatSize(ledger->charged_bytes(domain)), ledger->DomainSnapshot(domain).name),
        ErrorReason::kBudgetExceeded);
  }
  spdlog::warn(
      "weight cache: the {} of '{}' ({}) does not fit the memory budget ({} of {} charged) even "
      "after evicting everything idle; charging it anyway (over budget)",
      ChargeKindName(kind), e->model.key, FormatSize(bytes),
      FormatSize(ledger->charged_bytes(domain)), FormatSize(ledger->budget_bytes(domain)));
  return ledger->Charge(domain, owner, kind, bytes);
}

Status WeightCache::MaterializeFloor(Entry* e) {
  ARBITER_ASSIGN_OR_RETURN(MemoryCharge charge,
                           ChargeRoom(e, ChargeKind::kHostFloor, FloorEstimate(e)));
  bool from_device;
  PoolBlock block;
  {
    MutexLock l(&mu_);
    from_device = e->resident && options_.device->HostPointer(e->block.region, e->block.offset) != nullptr;
    block = e->block;
  }
  // Note [Floors from the device]
  const WeightFill fill = from_device ? FillFromDevice(e, block) : e->model.fill;
  Result<std::unique_ptr<HostFloor>> floor =
      store_->Materialize(e->model.key, e->model.digest, e->model.specs, fill);
  if (!floor.ok()) return floor.status();
  charge.ForceResize((*floor)->mapped_bytes());
  spdlog::info("weight cache: host floor of '{}' ready ({}, {}{})", e->model.key,
               FormatSize((*floor)->mapped_bytes()), store_->kind(),
               (*floor)->filled_here() ? "" : ", attached to an existing region");
  MutexLock l(&mu_);
  e->floor = std::move(floor).value();
  e->floor_charge = std::move(charge);
  return OkStatus();
}

Status WeightCache::LoadDevice(Entry* e) {
  const auto t0 = std::chrono::steady_clock::now();
  bool need_floor, has_floor;
  {
    MutexLock l(&mu_);
    need_floor = e->residency >= ResidencyState::kPinnedSystem && e->floor == nullptr;
  }
  if (need_floor) ARBITER_RETURN_IF_ERROR(MaterializeFloor(e));
  {
    MutexLock l(&mu_);
    has_floor = e->floor != nullptr;
  }
  ARBITER_ASSIGN_OR_RETURN(MemoryCharge charge,
                           ChargeRoom(e, ChargeKind::kDeviceWeights, e->block_bytes));
  // The arena may be fragmented or full of pinned/leased blocks: evict LRU
  // idle copies one at a time until the block fits.
  Result<PoolBlock> block = pool_->Allocate(e->block_bytes);
  while (!block.ok() && block.status().code() == StatusCode::kResourceExhausted) {
    std::vector<Victim> victims;
    {
      MutexLock l(&mu_);
      if (Entry* victim = LruVictimLocked(e)) TakeDeviceLocked(victim, &victims);
    }
    if (victims.empty()) break;
    FreeVictims(&victims);
    block = pool_->Allocate(e->block_bytes);
  }
  if (!block.ok()) return block.status();

  // Transfer. The entry is busy: its floor cannot be dropped meanwhile.
  Status st;
  const std::vector<const void*>* floor_arrays = nullptr;
  if (has_floor) {
    // Note [Imported floors]. The entry is busy: nothing else touches its
    // floor while it is swapped for its ImportedFloor.
    std::unique_ptr<HostFloor> plain;
    {
      MutexLock l(&mu_);
      if (dynamic_cast<ImportedFloor*>(e->floor.get()) == nullptr) plain = std::move(e->floor);
    }
    if (plain != nullptr) {
      std::unique_ptr<HostFloor> imported =
          ImportFloor(options_.device, std::move(plain), e->model.key);
      MutexLock l(&mu_);
      e->floor = std::move(imported);
    }
    MutexLock l(&mu_);
    floor_arrays = &e->floor->arrays();
  }
  if (floor_arrays != nullptr) {
    // Every tensor's copy is issued, then all are waited for (Note [Device
    // copies]): none may still be in flight when the block is freed below.
    std::vector<CopyTicket> copies;
    copies.reserve(e->rel_offsets.size());
    for (size_t i = 0; i < e->rel_offsets.size(); ++i) {
      copies.push_back(options_.device->CopyToDevice(
          block->region, block->offset + e->rel_offsets[i], (*floor_arrays)[i],
          e->tensor_bytes[i]));
    }
    st = WaitAll(copies);
  } else if (options_.device->HostPointer(block->region, block->offset) != nullptr) {
    // Fill straight into the arena (the cpu device): one conversion pass.
    std::vector<void*> arrays;
    arrays.reserve(e->rel_offsets.size());
    for (uint64_t rel : e->rel_offsets) {
      arrays.push_back(options_.device->HostPointer(block->region, block->offset + rel));
    }
    st = Guarded([&] { return e->model.fill(arrays); });
  } else {
    // Not host-addressable and no floor: stage through a private floor.
    PrivateWeightStore staging;
    Result<std::unique_ptr<HostFloor>> staged = InternalError("not staged");
    st = Guarded([&] {
      staged = staging.Materialize(e->model.key, e->model.digest, e->model.specs, e->model.fill);
      return staged.status();
    });
    std::vector<CopyTicket> copies;
    for (size_t i = 0; st.ok() && i < e->rel_offsets.size(); ++i) {
      copies.push_back(options_.device->CopyToDevice(block->region,
                                                     block->offset + e->rel_offsets[i],
                                                     (*staged)->arrays()[i], e->tensor_bytes[i]));
    }
    if (st.ok()) st = WaitAll(copies);  // before `staging` goes away
  }
  if (!st.ok()) {
    // Free what was transferred (docs/weights.md, 'Leaks after a failed
    // transfer').
    options_.device->Discard(block->region, block->offset, block->size_bytes)
        .IgnoreError();  // before Free
    pool_->Free(*block).IgnoreError();
    charge.Release();
    return st;
  }
  const double seconds = SecondsSince(t0);
  MutexLock l(&mu_);
  e->block = *block;
  e->device_charge = std::move(charge);
  e->resident = true;
  e->last_used = ++use_tick_;
  e->loads++;
  e->last_source = floor_arrays != nullptr ? WeightLoadSource::kFloor : WeightLoadSource::kFile;
  e->last_load_seconds = seconds;
  loads_++;
  load_seconds_ += seconds;
  return OkStatus();
}

WeightLease WeightCache::MakeLeaseLocked(Entry* e) {
  WeightLease lease;
  lease.cache_ = this;
  lease.entry_ = e;
  lease.region_ = e->block.region;
  lease.offsets_.reserve(e->rel_offsets.size());
  lease.host_.reserve(e->rel_offsets.size());
  for (uint64_t rel : e->rel_offsets) {
    lease.offsets_.push_back(e->block.offset + rel);
    lease.host_.push_back(options_.device->HostPointer(e->block.region, e->block.offset + rel));
  }
  e->leases++;
  e->last_used = ++use_tick_;
  return lease;
}

void WeightCache::ReleaseLease(Entry* e) {
  std::vector<Victim> victims;
  {
    MutexLock l(&mu_);
    e->leases--;
    e->last_used = ++use_tick_;
    if (e->leases == 0) {
      if (e->evict_when_idle && e->resident && !e->busy &&
          e->residency != ResidencyState::kPinnedDevice) {
        TakeDeviceLocked(e, &victims);
      }
      changed_.SignalAll();
    }
  }
  FreeVictims(&victims);
}

Result<WeightLease> WeightCache::Acquire(std::string_view key) {
  std::vector<Victim> victims;
  Entry* e = nullptr;
  bool oversize = false;
  {
    MutexLock l(&mu_);
    e = FindLocked(key);
    if (e == nullptr) return NotFoundError(fmt::format("weight cache: no model '{}'", key));
    for (;;) {
      if (e->resident) {
        // A copy marked to go once idle (Evict of a leased copy, or a
        // demotion in externally-managed mode) stays marked: new leases keep
        // it only until the last one ends. In externally-managed mode it is
        // already not resident as far as the control plane is concerned.
        if (e->evict_when_idle && options_.mode == ResidencyMode::kExternallyManaged) {
          return NotResidentError(key);
        }
        return MakeLeaseLocked(e);
      }
      if (options_.mode == ResidencyMode::kExternallyManaged) return NotResidentError(key);
      if (!e->busy) break;
      const uint64_t attempt = e->attempt;
      const bool was_loading = e->loading;
      changed_.Wait();
      if (was_loading && !e->busy && !e->resident && e->attempt == attempt &&
          !e->last_error.ok()) {
        return e->last_error;  // the shared load failed
      }
    }
    e->busy = true;
    e->loading = true;
    e->attempt++;
    if (e->residency != ResidencyState::kPinnedDevice) {
      const uint64_t budget = BudgetLocked().on_demand_budget_bytes;
      oversize = e->block_bytes > budget;
      // Our own bytes count as loading in the footprint already.
      PickVictimsLocked(0, e, &victims);
      if (oversize) oversize_loads_++;
    }
  }
  FreeVictims(&victims);
  if (oversize) {
    spdlog::warn("weight cache: '{}' ({}) is larger than the whole on-demand budget; evicted "
                 "everything evictable and loading it anyway",
                 key, FormatSize(e->block_bytes));
  }
  Status st = Guarded([&] { return LoadDevice(e); });
  Result<WeightLease> out = InternalError("unreachable");
  bool loaded = false;
  {
    MutexLock l(&mu_);
    e->busy = false;
    e->loading = false;
    if (st.ok()) {
      e->last_error = OkStatus();
      out = MakeLeaseLocked(e);
      loaded = true;
    } else {
      e->last_error = st.WithPrefix(fmt::format("weights of '{}'", e->model.key));
      out = e->last_error;
    }
    changed_.SignalAll();
  }
  if (loaded) {
    spdlog::info("weight cache: loaded '{}' ({}) from the {} in {:.3f} s", key,
                 FormatSize(e->block_bytes), WeightLoadSourceName(e->last_source),
                 e->last_load_seconds);
    MaybeAutoCompact(std::string(key));
  } else {
    spdlog::error("weight cache: {}", out.status().message());
  }
  return out;
}

void WeightCache::MaybeAutoCompact(const std::string& just_loaded) {
  if (options_.compaction_every_loads == 0) return;
  {
    MutexLock l(&mu_);
    if (loads_ % options_.compaction_every_loads != 0 || compacting_) return;
  }
  Result<CompactResult> r = Compact({});
  if (r.ok()) {
    spdlog::info("weight cache: automatic compaction after loading '{}' freed {}", just_loaded,
                 FormatSize(r->freed_bytes));
  }
}

Result<ResidencyState> WeightCache::SetResidency(std::string_view key, ResidencyState target) {
  Entry* e = nullptr;
  ResidencyState prev;
  {
    MutexLock l(&mu_);
    e = FindLocked(key);
    if (e == nullptr) return NotFoundError(fmt::format("weight cache: no model '{}'", key));
    while (e->busy) changed_.Wait();
    prev = e->residency;
    if (target == ResidencyState::kPinnedDevice && prev != ResidencyState::kPinnedDevice) {
      uint64_t pinned = e->block_bytes;
      for (const auto& o : entries_) {
        if (o->residency == ResidencyState::kPinnedDevice) pinned += o->block_bytes;
      }
      Result<WeightBudget> b = SolveWeightBudget(pool_->limit_bytes(), options_.fraction,
                                                 options_.wiggle, max_scratch_, pinned);
      if (b.ok() && b->pinned_over_commit) {
        return ResourceExhaustedError(fmt::format(
            "cannot pin '{}' ({}) to the device: device-pinned weights would take {} of the {} "
            "weight pool (arena {}, scratch {}); unpin another model or raise [memory] "
            "device_arena",
            key, FormatSize(e->block_bytes), FormatSize(pinned), FormatSize(b->weight_pool_bytes),
            FormatSize(pool_->limit_bytes()), FormatSize(max_scratch_)),
            ErrorReason::kPinDoesNotFit);
      }
    }
    e->busy = true;
  }
  // Slow work outside the lock: the floor, then the device copy.
  bool made_floor = false;
  Status st;
  bool has_floor;
  {
    MutexLock l(&mu_);
    has_floor = e->floor != nullptr;
  }
  if (target >= ResidencyState::kPinnedSystem && !has_floor) {
    st = Guarded([&] { return MaterializeFloor(e); });
    made_floor = st.ok();
  }
  bool resident;
  {
    MutexLock l(&mu_);
    resident = e->resident;
    if (st.ok() && target == ResidencyState::kPinnedDevice) {
      e->residency = target;  // LoadDevice treats it as pinned (no LRU room)
      e->loading = !resident;
    }
  }
  if (st.ok() && target == ResidencyState::kPinnedDevice && !resident) {
    st = Guarded([&] { return LoadDevice(e); });
    if (!st.ok()) st = st.WithPrefix(fmt::format("weights of '{}'", key));
  }
  std::vector<Victim> victims;
  std::unique_ptr<HostFloor> drop_floor;
  MemoryCharge drop_floor_charge;
  {
    MutexLock l(&mu_);
    e->loading = false;
    if (!st.ok()) {
      e->residency = prev;
      if (made_floor && prev < ResidencyState::kPinnedSystem) {
        drop_floor = std::move(e->floor);
        drop_floor_charge = std::move(e->floor_charge);
      }
    } else {
      e->residency = target;
      if (target < ResidencyState::kPinnedSystem && e->floor) {
        drop_floor = std::move(e->floor);
        drop_floor_charge = std::move(e->floor_charge);
      }
      if (prev == ResidencyState::kPinnedDevice && target != ResidencyState::kPinnedDevice &&
          e->resident && options_.mode == ResidencyMode::kExternallyManaged) {
        // No autonomous evictor in this mode: leaving the device floor frees it.
        if (e->leases == 0) {
          TakeDeviceLocked(e, &victims);
        } else {
          e->evict_when_idle = true;
        }
      }
    }
    e->busy = false;
    // A demotion (the copy joins the on-demand footprint) or a new pin (the
    // budget shrinks) may leave the footprint over budget (docs/weights.md,
    // 'Budget between loads').
    PickVictimsLocked(0, nullptr, &victims);
    changed_.SignalAll();
  }
  FreeVictims(&victims);
  drop_floor.reset();
  drop_floor_charge.Release();
  if (!st.ok()) return st;
  if (prev != target) {
    spdlog::info("weight cache: '{}' residency {} → {}", key, ResidencyStateName(prev),
                 ResidencyStateName(target));
  }
  return prev;
}

Result<bool> WeightCache::Evict(std::string_view key) {
  std::vector<Victim> victims;
  std::unique_ptr<HostFloor> floor;
  MemoryCharge floor_charge;
  bool evicted = false;
  {
    MutexLock l(&mu_);
    Entry* e = FindLocked(key);
    if (e == nullptr) return NotFoundError(fmt::format("weight cache: no model '{}'", key));
    // A load or a demotion in flight finishes first, so the floor a
    // demotion is making cannot outlive the unload.
    while (e->busy) changed_.Wait();
    if (e->residency == ResidencyState::kUnpinned) {
      // A demotion floor goes with the copy (Note [Demotion floors]).
      floor = std::move(e->floor);
      floor_charge = std::move(e->floor_charge);
    }
    if (e->resident && e->residency != ResidencyState::kPinnedDevice) {
      if (e->leases > 0) {
        e->evict_when_idle = true;
      } else {
        TakeDeviceLocked(e, &victims);
        evicted = true;
      }
    }
  }
  FreeVictims(&victims);
  floor.reset();
  floor_charge.Release();
  return evicted;
}

Status WeightCache::ReleaseAll(std::string_view key) {
  std::vector<Victim> victims;
  std::unique_ptr<HostFloor> floor;
  MemoryCharge floor_charge;
  {
    MutexLock l(&mu_);
    Entry* e = FindLocked(key);
    if (e == nullptr) return NotFoundError(fmt::format("weight cache: no model '{}'", key));
    while (e->busy) changed_.Wait();
    if (e->leases > 0) {
      return FailedPreconditionError(fmt::format(
          "weight cache: '{}' has {} lease(s) in use; release them first", key, e->leases));
    }
    if (e->resident) TakeDeviceLocked(e, &victims);
    floor = std::move(e->floor);
    floor_charge = std::move(e->floor_charge);
    e->residency = ResidencyState::kUnpinned;
    PickVictimsLocked(0, nullptr, &victims);  // the budget may have grown; harmless
  }
  FreeVictims(&victims);
  floor.reset();
  floor_charge.Release();
  return OkStatus();
}

Status WeightCache::PreloadPinned() {
  std::vector<std::pair<std::string, ResidencyState>> pinned;
  {
    MutexLock l(&mu_);
    // Device-pinned first, so they sit at the base of the arena.
    for (ResidencyState s : {ResidencyState::kPinnedDevice, ResidencyState::kPinnedSystem}) {
      for (const auto& e : entries_) {
        if (e->residency == s) pinned.emplace_back(e->model.key, s);
      }
    }
  }
  Status first;
  for (const auto& [key, state] : pinned) {
    Result<ResidencyState> r = SetResidency(key, state);
    if (!r.ok()) {
      spdlog::error("weight cache: preloading '{}' ({}): {}", key, ResidencyStateName(state),
                    r.status().message());
      if (first.ok()) first = r.status();
    }
  }
  return first;
}

Result<CompactResult> WeightCache::Compact(const std::vector<std::string>& reload) {
  CompactResult result;
  std::vector<Victim> victims;
  {
    MutexLock l(&mu_);
    for (const std::string& k : reload) {
      if (FindLocked(k) == nullptr) {
        return NotFoundError(fmt::format("weight cache: no model '{}' to reload", k));
      }
    }
    while (compacting_) changed_.Wait();
    compacting_ = true;
    for (const auto& o : entries_) {
      Entry* e = o.get();
      if (!e->resident || e->residency == ResidencyState::kPinnedDevice) continue;
      if (e->leases > 0 || e->busy) {
        result.skipped_leased.push_back(e->model.key);
        continue;
      }
      result.freed_bytes += e->block_bytes;
      TakeDeviceLocked(e, &victims);
    }
    // Freed by compaction, not evicted for room: keep evicts an eviction count.
    evicts_ -= victims.size();
    for (Victim& v : victims) v.entry->evicts--;
    compactions_++;
  }
  FreeVictims(&victims);
  Status first;
  if (options_.mode == ResidencyMode::kSelfManaged) {
    for (const std::string& k : reload) {
      Result<WeightLease> lease = Acquire(k);
      if (lease.ok()) {
        result.reloaded++;
      } else if (first.ok()) {
        first = lease.status();
      }
    }
  }
  MutexLock l(&mu_);
  compacting_ = false;
  for (const auto& e : entries_) {
    if (e->resident) result.resident_bytes_after += e->block_bytes;
  }
  changed_.SignalAll();
  if (!first.ok()) return first;
  return result;
}

WeightCacheStats WeightCache::Stats() const {
  WeightCacheStats s;
  s.pool = pool_->Stats();
  MutexLock l(&mu_);
  s.mode = options_.mode;
  s.budget = BudgetLocked();
  s.max_bytes = s.budget.on_demand_budget_bytes;
  s.max_scratch_bytes = max_scratch_;
  s.loads = loads_;
  s.evicts = evicts_;
  s.compactions = compactions_;
  s.load_seconds = load_seconds_;
  s.oversize_loads = oversize_loads_;
  for (const auto& e : entries_) {
    WeightModelStats m;
    m.key = e->model.key;
    m.residency = e->residency;
    m.device_resident = e->resident;
    m.host_resident = e->floor != nullptr;
    m.loading = e->loading;
    m.weight_bytes = e->weight_bytes;
    m.device_bytes = e->resident ? e->block_bytes : 0;
    m.host_bytes = e->floor ? e->floor->mapped_bytes() : 0;
    m.leases = e->leases;
    m.loads = e->loads;
    m.evicts = e->evicts;
    m.last_load_source = e->last_source;
    m.last_load_seconds = e->last_load_seconds;
    if (e->floor) m.floor_region = e->floor->region_name();
    if (e->resident) {
      (e->residency == ResidencyState::kPinnedDevice ? s.pinned_bytes : s.resident_bytes) +=
          e->block_bytes;
    }
    s.host_bytes += m.host_bytes;
    s.models.push_back(std::move(m));
  }
  return s;
}

}  // namespace arbiter
