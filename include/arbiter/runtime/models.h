// arbiter/runtime/models.h — turning [[models]] entries into MemoryArbiter
// registrations backed by the built-in Engine.
//
// Policy (docs/config.md "Model loading"): models load lazily, on the first
// request that needs them, through the arbiter (one load however many
// requests arrive together; evicted LRU under the budget). At startup each
// model directory is checked cheaply (config.json and tokenizer.json parse,
// safetensors headers are valid); a model that fails the check is
// still registered and immediately marked failed — /v1/models reports the
// error and requests for it get 503 — while the other models serve normally.
// `[server] preload = true` loads every model at startup instead.
//
// Thread safety: pure functions; the load callables are thread-safe.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "arbiter/arbiter/memory_arbiter.h"
#include "arbiter/base/status.h"
#include "arbiter/engine/engine.h"
#include "arbiter/memory/device_backend.h"
#include "arbiter/memory/memory_ledger.h"
#include "arbiter/kv/precache.h"
#include "arbiter/runtime/backend_models.h"
#include "arbiter/runtime/config.h"
#include "arbiter/runtime/kv_service.h"
#include "arbiter/weights/weight_cache.h"
#include "arbiter/weights/weight_store.h"

namespace arbiter {

// What a model costs, in bytes, split by who charges it: the engine's own
// memory (every slot's KV cache and activation scratch; the MemoryArbiter
// charges it to the model's entry, kinds kv_slot and scratch) and its compute-ready
// weights (f32 compute layout; the WeightCache charges them, kinds
// device_weights and host_floor).
struct ModelFootprint {
  size_t engine_bytes = 0;
  size_t weight_bytes = 0;
};

// Every [[models]] entry's files opened once (OpenModelFiles; errors name
// the model directory), by model name.
using OpenedModels = std::map<std::string, Result<std::shared_ptr<const ModelFiles>>>;
OpenedModels OpenConfiguredModels(const Config& config);

// The engine options of a [[models]] entry (ctx, parallel, device,
// device_layers), with its weights in `cache` under the entry's name (null:
// a private cache) and, for a split entry, its host layers in `host_cache`
// under "<name>#host".
EngineOptions EngineOptionsFor(const ModelEntry& entry, WeightCache* cache,
                               WeightCache* host_cache = nullptr);

// The footprint of `entry` (ctx, parallel) from its opened files
// (Engine::Footprint). Reads nothing. Errors: kInvalidArgument for a ctx or
// parallel the engine refuses.
Result<ModelFootprint> EstimateModelFootprint(const ModelEntry& entry, const ModelFiles& files);
// The cheap check: opens the entry's files (OpenModelFiles: config.json and
// tokenizer.json parse, the safetensors headers are valid and hold every
// tensor the architecture needs; headers only), then the footprint.
// Errors: kNotFound for a missing directory; those of OpenModelFiles
// (kNotFound, kDataLoss, kUnimplemented), naming the file.
Result<ModelFootprint> EstimateModelFootprint(const ModelEntry& entry);

// Loads one model's engine (Engine::Load with n_ctx = ctx, n_slots =
// parallel) over `cache`, registering the model's weights there first if
// they are not yet (a model fixed on disk since startup). The model's files
// are opened once for the estimate, the registration and the load (Note
// [One parse per load] in src/engine/engine.cc). Load errors name
// the model directory. The backend is a std::shared_ptr<Engine>
// (ArbiterHandle::backend<Engine>()); its measured size is kv_bytes(),
// charged as two parts (kv_slot: the KV caches; scratch). It is unloaded by
// UnloadEngineModel (below); a backend dropped without it frees the engine
// but leaves its weights in `cache` and `precache` attached.
//
// With `precache` (the model's KV precache; may be null) the new engine is
// attached to it and the entry's system_prompt is prewarmed on
// "__system_prefix__" (best-effort, logged).
//
// A split entry (device_layers in (0, n_layers) on a device; Note [Partial
// offload] in src/engine/internal/split_compute.cc) registers its host
// layers in `host_cache` (the host's) under "<name>#host" as well; its
// CPU layers' KV and scratch are charged to the host domain
// (LoadedBackend::host_charge_parts), the rest to the device's.
Result<LoadedBackend> LoadEngineModel(const ModelEntry& entry, WeightCache* cache,
                                      KvPrecache* precache = nullptr,
                                      WeightCache* host_cache = nullptr);

// Unloads an engine model loaded by LoadEngineModel, taking `backend` (the
// arbiter's reference): detaches it from `precache` (saving the
// conversations its slots hold to the disk tier), destroys the engine (its
// KV caches, slots and scratch), evicts its device weights from `cache`
// (WeightCache::Evict; a pinned_device copy and a host floor stay), and
// gives the freed heap pages back. The registration of
// EngineCapabilityRegistration runs it as its unload. Order and the
// guarantee for in-flight users: Note [Unloading an engine model] in
// src/runtime/models.cc. `cache` and `precache` may be null. Never fails
// (a weight eviction error is logged). Thread-safe for distinct models.
// A split model's host part is evicted from `host_cache` too.
void UnloadEngineModel(const std::string& model_key, LoadedBackend backend, WeightCache* cache,
                       KvPrecache* precache, WeightCache* host_cache = nullptr);

// The registration of `capability` for every entry of that capability
// (model key = entry name, per-model estimates of the engine bytes from
// `estimated_bytes`; measured as two charges, kv_slot and scratch). Each
// entry's `role`, `idle_ttl_ms` and `same_role` (default `same_role`: with
// kCoexist several models of one role stay resident together, the budget
// still evicting them LRU-first; with kSwap the seed's same-role swap) reach
// the arbiter through role_for / idle_ttl_for / swap_same_role_for.
// The per-model callables of a registration from its [[models]] entries:
// estimate_bytes (from `estimates`), role_for, idle_ttl_for and
// swap_same_role_for (the entry's same_role, else `same_role`; empty: the
// registration's own swap_same_role).
void SetPerModelFields(CapabilityRegistration* r,
                       std::shared_ptr<const std::map<std::string, ModelEntry>> models,
                       std::shared_ptr<const std::map<std::string, size_t>> estimates,
                       std::optional<SameRolePolicy> same_role);

// Which weight cache a built-in model's engine computes from: the host's
// (the cpu arena) for `device = "cpu"`, its device's for "vulkan[:N]"
// (ServeWeights::devices). A device that could not be opened is kept with
// its error, which every model on it then fails to load with. A plain
// value of non-owning pointers: the caches must outlive it.
class WeightCaches {
 public:
  // Only the host's (null: each engine makes private weights).
  WeightCaches(WeightCache* host = nullptr) : host_(host) {}  // NOLINT: implicit
  // `device` as a model writes it ("vulkan", "vulkan:0").
  void AddDevice(const std::string& device, WeightCache* cache, MemoryDomain domain);
  void AddBrokenDevice(const std::string& device, Status error);
  // The cache `entry`'s engine uses (null with no host cache and a cpu
  // entry). Errors: the device's error (it could not be opened), or
  // kFailedPrecondition for a device no AddDevice named.
  Result<WeightCache*> For(const ModelEntry& entry) const;
  // The ledger domain of `entry`'s KV, scratch and device weights.
  MemoryDomain DomainFor(const ModelEntry& entry) const;
  WeightCache* host() const { return host_; }

 private:
  struct Device {
    WeightCache* cache = nullptr;
    MemoryDomain domain;
    Status error;
  };
  WeightCache* host_ = nullptr;
  std::map<std::string, Device> devices_;
};

CapabilityRegistration EngineCapabilityRegistration(
    Capability capability, const std::vector<ModelEntry>& entries,
    const std::map<std::string, size_t>& estimated_bytes, WeightCaches caches,
    const ServeKv* kv = nullptr, SameRolePolicy same_role = SameRolePolicy::kCoexist);

// Registers every model of `config` (see the policy above): its weights in
// `cache` (Engine::WeightModelFor with the entry's residency; skipped for a
// broken model) and its engine in `arbiter`. Then applies the pinned
// residencies (WeightCache::PreloadPinned: device-pinned weights first, at
// the arena's base; host floors of pinned_system models) and, with [server]
// preload, loads every model in order (in externally-managed mode only the
// pinned_device ones: the others wait for the control plane). Logs each model's
// outcome. Returns an error only for a registration bug (duplicate name);
// broken models are not errors.
// `kv` (may be null) gives each text model's engine its KvPrecache.
// `opened` (may be null: each entry is opened here) holds the entries'
// files opened once at startup (OpenConfiguredModels), shared with the KV
// model hash so a model's files are parsed once.
// `backends` (may be null: a context without a process supervisor) serves
// the entries whose engine is not builtin (runtime/backend_models.h); each
// capability gets one registration joining both kinds.
Status RegisterConfiguredModels(const Config& config, MemoryArbiter* arbiter, WeightCaches caches,
                                const ServeKv* kv = nullptr,
                                const OpenedModels* opened = nullptr,
                                std::shared_ptr<BackendContext> backends = nullptr);

// The weight runtime of `arbiter serve`: the device arena, the host-floor
// store and the WeightCache over them. Destroy in reverse order (cache,
// store, device); the cache must outlive the MemoryArbiter whose engines use
// it.
struct ServeWeights {
  std::unique_ptr<DeviceBackend> device;
  std::unique_ptr<WeightStore> store;
  std::unique_ptr<WeightCache> cache;
  // One per compute device a model names (`device = "vulkan[:N]"`), by its
  // domain name ("vulkan:N"): the device's arena (a VulkanDeviceBackend of
  // the domain's budget) and a WeightCache charging device copies to the
  // domain; host floors go to `store`, charged to the host.
  struct Device {
    std::string name;  // "vulkan:N"
    MemoryDomain domain;
    std::unique_ptr<DeviceBackend> backend;
    std::unique_ptr<WeightCache> cache;
  };
  std::map<std::string, Device> devices;
  // Every model's cache (WeightCaches::For), devices that failed included.
  WeightCaches caches;
  ~ServeWeights() {
    for (auto& [name, d] : devices) d.cache.reset();
    cache.reset();
    store.reset();
  }
};

// Builds it from [memory]: a "cpu" arena of device_arena bytes (default:
// twice the budget; mapped lazily, so it costs RAM only as weights are
// loaded, and the ledger's budget binds first), a
// SharedWeightStore (shared_host_weights; its mode and prefix) or the
// private store, and a WeightCache charging `ledger` that asks `reclaimer`
// (may be null) for room. With a shared store, holder-free regions under the prefix of
// models not in `config` are swept (logged).
// Then, for each compute device a built-in model names: opens it, registers
// its memory domain in `ledger` ([devices."vulkan:N"] budget, default the
// heap minus its headroom, clamped by the driver's budget; inside the host
// domain when the device's memory is host RAM) with the device's measured
// fixed cost as the domain's runtime bytes, and makes its arena and cache.
// A device that cannot be opened is logged and kept as broken
// (WeightCaches::AddBrokenDevice): its models fail to load naming it.
// Errors: kInvalidArgument / kResourceExhausted from the device, store or
// cache, naming the [memory] key; a device's budget error naming its key.
Result<std::unique_ptr<ServeWeights>> MakeServeWeights(
    const Config& config, MemoryLedger* ledger, Reclaimer* reclaimer);

// Each built-in model's layers per compute device ("vulkan:0" → 12, "cpu"
// → 4), by model name.
using ModelLayers = std::map<std::string, std::map<std::string, int>>;

// Partial offload (Note [Partial offload] in
// src/engine/internal/split_compute.cc), decided once at startup, before
// RegisterConfiguredModels: for each built-in model on a device that does
// not set device_layers, Engine::DeviceLayersFor against the device
// cache's budget — every layer when the whole model (weights and its
// slots) fits, else the most that fit (sets device_layers; logged), and
// when not even one layer with the output layer fits the model runs on the
// CPU (sets device = "cpu"; logged with the fix): the model still serves,
// the log says why. Returns every built-in model's layers per device;
// models whose files did not open or whose device is broken are left out.
ModelLayers ResolveDeviceLayers(Config* config, const ServeWeights& weights,
                                const OpenedModels& opened);

}  // namespace arbiter
