// [[models]] → MemoryArbiter registrations backed by the Engine; see models.h
// for the lazy-load policy.
#include "arbiter/runtime/models.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "arbiter/base/buffer_memory.h"
#include "arbiter/base/clip.h"
#include "arbiter/base/size.h"
#include "arbiter/engine/engine.h"
#include "arbiter/formats/model_config.h"
#include "arbiter/formats/safetensors.h"
#if ARBITER_HAS_VULKAN
#include "arbiter/vulkan/vulkan_backend.h"
#include "arbiter/vulkan/vulkan_device.h"
#endif

namespace arbiter {
namespace {

namespace fs = std::filesystem;

// The entry's files, opened once per load or startup check (Note [One parse
// per load] in src/engine/engine.cc): config.json and tokenizer.json parse,
// every tensor the architecture needs is present with its shape (headers
// only), so a broken model shows in the startup log and /v1/models as
// failed rather than only on the first request.
Result<std::shared_ptr<const ModelFiles>> OpenEntryFiles(const ModelEntry& entry) {
  std::error_code ec;
  if (!fs::is_directory(entry.path, ec) && !fs::is_regular_file(entry.path, ec)) {
    return NotFoundError(fmt::format(
        "model {} does not exist (a model directory or a .gguf file)", entry.path));
  }
  Result<std::shared_ptr<const ModelFiles>> files =
      OpenModelFiles(entry.path, ModelFilesOptions{.compute_f32 = entry.compute_f32,
                                                   .chat_template = entry.chat_template});
  if (!files.ok()) return files.status().WithPrefix(entry.path);
  return files;
}

// Load errors that name only a file ("model.safetensors: tensor ...") get
// the model directory.
Status NameTheModel(const ModelEntry& entry, const Status& st) {
  if (st.ok() || std::string_view(st.message()).starts_with(entry.path)) return st;
  return st.WithPrefix(entry.path);
}

// The weight cache registration of `entry`. Fault injection for tests
// (docs/config.md "Fault-injection hooks"): ARBITER_TEST_FLOOR_FILL_DELAY_MS=N
// makes every fill (materializing a host floor or loading from the file)
// sleep N ms first, so a test can kill a process while it holds a
// half-filled shared region; ARBITER_TEST_FILL_FAIL_MODEL=NAME makes every
// fill of model NAME fail (kDataLoss) after its destination was allocated
// and half-written, as a read error half-way through the file would.
Result<WeightModel> WeightModelForEntry(const ModelEntry& entry, const ModelFiles& files,
                                        WeightCache* cache) {
  Result<WeightModel> weights = Engine::WeightModelFor(
      files, entry.name, EngineOptionsFor(entry, cache), entry.residency);
  if (!weights.ok()) return weights;
  // Text targets keep their weights longest (the arbiter never evicts them
  // for room either).
  weights->evict_last =
      entry.role.value_or(DefaultRoleFor(entry.capability)) == ResidentRole::kTextTarget;
  if (const char* delay = std::getenv("ARBITER_TEST_FLOOR_FILL_DELAY_MS")) {
    const int ms = std::atoi(delay);
    if (ms > 0) {
      spdlog::warn("ARBITER_TEST_FLOOR_FILL_DELAY_MS={}: every weight fill of \"{}\" sleeps first "
                   "(fault injection for tests)",
                   ms, entry.name);
      weights->fill = [fill = std::move(weights->fill), ms](const std::vector<void*>& arrays) {
        std::this_thread::sleep_for(std::chrono::milliseconds(ms));
        return fill(arrays);
      };
    }
  }
  if (const char* fail = std::getenv("ARBITER_TEST_FILL_FAIL_MODEL");
      fail != nullptr && entry.name == fail) {
    spdlog::warn("ARBITER_TEST_FILL_FAIL_MODEL={}: every weight fill of \"{}\" fails half-way "
                 "(fault injection for tests)",
                 fail, entry.name);
    weights->fill = [fill = std::move(weights->fill),
                     name = entry.name](const std::vector<void*>& arrays) -> Status {
      ARBITER_RETURN_IF_ERROR(fill(arrays));  // the destination is written...
      return DataLossError(fmt::format("model \"{}\": injected weight fill failure "
                                       "(ARBITER_TEST_FILL_FAIL_MODEL)",
                                       name));  // ...and the fill fails all the same
    };
  }
  return weights;
}

// Partial offload (Note [Partial offload] in
// src/engine/internal/split_compute.cc): a split model's host part is
// registered in the host's cache under this key, its device part in the
// device's under the model's name.
std::string HostWeightKey(const std::string& name) { return name + "#host"; }

// Whether `entry` runs split between its device and the CPU.
bool IsSplitEntry(const ModelEntry& entry, const ModelFiles& files) {
  return entry.device != "cpu" && entry.device_layers > 0 &&
         entry.device_layers < files.config().num_hidden_layers;
}

// Registers (or, when its files changed, replaces) a split entry's host
// part in `host_cache`; nothing for other entries.
Status RegisterHostPart(const ModelEntry& entry, const ModelFiles& files,
                        WeightCache* host_cache) {
  if (host_cache == nullptr || !IsSplitEntry(entry, files)) return OkStatus();
  ARBITER_ASSIGN_OR_RETURN(WeightModel w,
                           Engine::HostWeightModelFor(files, HostWeightKey(entry.name),
                                                      EngineOptionsFor(entry, nullptr),
                                                      entry.residency));
  if (!host_cache->Contains(w.key)) {
    Status st = host_cache->Register(std::move(w));
    return st.code() == StatusCode::kAlreadyExists ? OkStatus() : st;
  }
  return host_cache->Replace(std::move(w)).status();
}

// [[models]] system_prompt → prefilled on the synthetic conversation
// "__system_prefix__" (docs/kv-precache.md "Prewarm and keep-alive").
// Best-effort: a failure is logged and the first request prefills cold.
void PrewarmSystemPrompt(const ModelEntry& entry, Engine* engine, KvPrecache* precache) {
  Result<ChatTemplateKind> kind = engine->chat_template();
  std::vector<int32_t> ids =
      kind.ok() ? EncodeChat(engine->tokenizer(), *kind, {ChatMessage{"system", entry.system_prompt}},
                             /*add_generation_prompt=*/false)
                : engine->tokenizer().Encode(entry.system_prompt, true);
  if (static_cast<int>(ids.size()) > engine->n_ctx() - 1) {
    spdlog::warn("model \"{}\": system_prompt is {} tokens, more than the context holds ({}); "
                 "not prewarmed",
                 entry.name, ids.size(), engine->n_ctx());
    return;
  }
  Result<GenerationResult> r =
      precache->Prewarm(engine, kSystemPrefixConversation, std::move(ids), TtlClass::kLong, nullptr);
  if (!r.ok()) {
    spdlog::warn("model \"{}\": prewarming the system prompt failed: {}", entry.name,
                 r.status().message());
    return;
  }
  spdlog::info("model \"{}\": system prompt prewarmed ({} tokens, {} computed) in slot {}",
               entry.name, r->prompt_tokens, r->timings.prefill_tokens, r->slot);
}

}  // namespace

EngineOptions EngineOptionsFor(const ModelEntry& entry, WeightCache* cache,
                               WeightCache* host_cache) {
  EngineOptions options;
  options.n_ctx = entry.ctx;
  options.n_slots = entry.parallel;
  options.weight_cache = cache;
  options.weight_key = entry.name;
  options.kv_type = entry.kv_type;
  options.device = entry.device;
  options.device_layers = entry.device_layers;
  options.host_weight_cache = host_cache;
  options.host_weight_key = HostWeightKey(entry.name);
  return options;
}

void WeightCaches::AddDevice(const std::string& device, WeightCache* cache, MemoryDomain domain) {
  devices_[device] = Device{cache, domain, OkStatus()};
}

void WeightCaches::AddBrokenDevice(const std::string& device, Status error) {
  devices_[device] = Device{nullptr, MemoryDomain(), std::move(error)};
}

Result<WeightCache*> WeightCaches::For(const ModelEntry& entry) const {
  if (entry.device == "cpu") return host_;
  auto it = devices_.find(entry.device);
  if (it == devices_.end()) {
    return FailedPreconditionError(fmt::format(
        "model \"{}\": device \"{}\" was not opened", entry.name, entry.device));
  }
  if (!it->second.error.ok()) {
    return it->second.error.WithPrefix(fmt::format("model \"{}\"", entry.name));
  }
  return it->second.cache;
}

MemoryDomain WeightCaches::DomainFor(const ModelEntry& entry) const {
  if (entry.device == "cpu") return MemoryDomain();
  auto it = devices_.find(entry.device);
  return it == devices_.end() ? MemoryDomain() : it->second.domain;
}

Result<ModelFootprint> EstimateModelFootprint(const ModelEntry& entry, const ModelFiles& files) {
  ARBITER_ASSIGN_OR_RETURN(EngineFootprint bytes,
                           Engine::Footprint(files, EngineOptionsFor(entry, nullptr)));
  ModelFootprint f;
  f.engine_bytes = bytes.engine_bytes();
  f.weight_bytes = bytes.weight_bytes;
  return f;
}

Result<ModelFootprint> EstimateModelFootprint(const ModelEntry& entry) {
  ARBITER_ASSIGN_OR_RETURN(std::shared_ptr<const ModelFiles> files, OpenEntryFiles(entry));
  return EstimateModelFootprint(entry, *files);
}

Result<LoadedBackend> LoadEngineModel(const ModelEntry& entry, WeightCache* cache,
                                      KvPrecache* precache, WeightCache* host_cache) {
  // One parse per load: the files are opened once, here, and the estimate,
  // the registration and the engine all use them. A model fixed on disk
  // since startup loads on the next request.
  ARBITER_ASSIGN_OR_RETURN(std::shared_ptr<const ModelFiles> files, OpenEntryFiles(entry));
  ARBITER_RETURN_IF_ERROR(EstimateModelFootprint(entry, *files).status());
  if (cache != nullptr) {
    Result<WeightModel> weights = WeightModelForEntry(entry, *files, cache);
    if (!weights.ok()) return NameTheModel(entry, weights.status());
    if (!cache->Contains(entry.name)) {
      Status st = cache->Register(std::move(weights).value());
      if (!st.ok() && st.code() != StatusCode::kAlreadyExists) return st;
    } else {
      // Files changed on disk since they were registered: their old device
      // copy and floor must never be served (Note [Changed model files] in
      // src/weights/weight_cache.cc).
      Result<bool> replaced = cache->Replace(std::move(weights).value());
      if (!replaced.ok()) return NameTheModel(entry, replaced.status());
      if (*replaced) {
        spdlog::warn("model \"{}\": its weight files in {} changed on disk; the old weights and "
                     "their host floor were dropped, loading the new files",
                     entry.name, entry.path);
      }
    }
  }
  if (cache != nullptr) {
    Status host = RegisterHostPart(entry, *files, host_cache);
    if (!host.ok()) return NameTheModel(entry, host);
  }
  Result<std::unique_ptr<Engine>> loaded =
      Engine::Load(files, EngineOptionsFor(entry, cache, host_cache));
  if (!loaded.ok()) return NameTheModel(entry, loaded.status());
  std::unique_ptr<Engine> engine = std::move(loaded).value();
  // A split model's CPU layers' KV and scratch are host memory: charged
  // in the host domain, the rest in the model's (the device's).
  const size_t host_kv = engine->host_kv_bytes();
  const size_t host_scratch = engine->host_scratch_bytes();
  const size_t bytes = engine->kv_bytes() - host_kv - host_scratch;
  const size_t scratch = engine->scratch_bytes() - host_scratch;
  if (precache != nullptr) {
    precache->AttachEngine(engine.get());
    if (!entry.system_prompt.empty()) PrewarmSystemPrompt(entry, engine.get(), precache);
  }
  // A plain shared_ptr: unloading is UnloadEngineModel, an explicit step
  // (Note [Unloading an engine model]).
  std::shared_ptr<Engine> shared(std::move(engine));
  LoadedBackend backend = LoadedBackend::Of(std::move(shared), bytes);
  // Two ledger charges: the KV caches (kv_slot) and the activations (scratch).
  backend.charge_parts = {{ChargeKind::kKvSlot, bytes - scratch}, {ChargeKind::kScratch, scratch}};
  if (host_kv + host_scratch > 0) {
    backend.host_charge_parts = {{ChargeKind::kKvSlot, host_kv},
                                 {ChargeKind::kScratch, host_scratch}};
  }
  return backend;
}

// Note [Unloading an engine model]
// An engine model leaves memory in one place: UnloadEngineModel, which the
// arbiter runs through the registration's unload whenever the entry is
// unloaded — evicted for room, pressure, a same-role swap or idleness,
// unloaded by hand (POST /admin/unload, keep_alive 0), replaced, or at
// shutdown. The steps, in order:
//   1. Stop serving. The arbiter calls unload only for a closed entry: its
//      pin count is 0 and no handle can be taken any more (EvictLocked), so
//      no request holds the engine and none can start. The KV precache then
//      detaches it (KvPrecache::DetachEngine): it holds every slot, so a
//      request still running on a slot through the precache finishes first,
//      saves the conversations the slots own to the disk tier, and forgets
//      the engine.
//   2. Release the KV caches and slots: the engine is destroyed (its slots,
//      KV caches and scratch; its weight leases were per request and are
//      gone).
//   3. Drop the weights: WeightCache::Evict(key) frees the model's device
//      copy (a pinned_device copy and the host floor stay).
//   4. Release the charges: the arbiter released the entry's kv_slot and
//      scratch charges under its lock before calling unload (so its fit loop
//      sees the room at once); step 3 released the weight charges.
//   5. Return the memory: TrimProcessHeap() gives the heap's free pages back
//      to the OS (Note [Where freed memory goes] in base/buffer_memory.cc).
//   6. Log: one debug line here; the arbiter logs "unloaded" and emits its
//      model_unload and eviction events after unload returns.
// The last user. Every user of an engine holds an ArbiterHandle, which pins
// the entry and holds no reference to the engine, so in step 2 the step's
// reference is the last and the engine is destroyed there. A caller that
// copied ArbiterHandle::backend_object() past its handle would keep it alive:
// the engine is then destroyed when that copy goes (shared_ptr lifetime, so
// never under a user), its KV freed late, and the step writes a warning;
// the weights are evicted all the same (a lease taken later reloads them).
void UnloadEngineModel(const std::string& model_key, LoadedBackend backend, WeightCache* cache,
                       KvPrecache* precache, WeightCache* host_cache) {
  std::shared_ptr<Engine> engine;
  if (backend.type == typeid(Engine)) {
    engine = std::static_pointer_cast<Engine>(std::move(backend.object));
  }
  backend = LoadedBackend{};
  if (engine == nullptr) {
    spdlog::error("model \"{}\": unload of a backend that is not an engine", model_key);
    return;
  }
  // 1. Stop serving.
  if (precache != nullptr) precache->DetachEngine(engine.get());
  // 2. Release the KV caches and slots.
  if (const long others = engine.use_count() - 1; others > 0) {
    spdlog::warn("model \"{}\": unloaded while {} other reference(s) to its engine remain; its "
                 "KV caches are freed when the last one goes",
                 model_key, others);
  }
  engine.reset();
  // 3. Drop the weights (4. their charges go with them).
  if (cache != nullptr) {
    Result<bool> evicted = cache->Evict(model_key);
    if (!evicted.ok() && evicted.status().code() != StatusCode::kNotFound) {
      spdlog::warn("model \"{}\": evicting its weights on unload failed: {}", model_key,
                   evicted.status().ToString());
    }
  }
  // A split model's host part (not registered for the others: kNotFound).
  if (host_cache != nullptr && host_cache != cache) {
    Result<bool> evicted = host_cache->Evict(HostWeightKey(model_key));
    if (!evicted.ok() && evicted.status().code() != StatusCode::kNotFound) {
      spdlog::warn("model \"{}\": evicting its host layers' weights on unload failed: {}",
                   model_key, evicted.status().ToString());
    }
  }
  // 5. Return the memory.
  TrimProcessHeap();
  // 6. Log.
  spdlog::debug("model \"{}\": engine unloaded (conversations saved, KV and scratch freed, "
                "device weights evicted, heap trimmed)",
                model_key);
}

void SetPerModelFields(CapabilityRegistration* r,
                       std::shared_ptr<const std::map<std::string, ModelEntry>> models,
                       std::shared_ptr<const std::map<std::string, size_t>> estimates,
                       std::optional<SameRolePolicy> same_role) {
  r->estimate_bytes = [estimates](const std::string& key) -> size_t {
    auto it = estimates->find(key);
    return it == estimates->end() ? 0 : it->second;
  };
  // Called under the arbiter lock: they only read the immutable maps.
  r->role_for = [models](const std::string& key) -> std::optional<ResidentRole> {
    auto it = models->find(key);
    return it == models->end() ? std::nullopt : it->second.role;
  };
  r->idle_ttl_for = [models](const std::string& key) -> std::optional<int64_t> {
    auto it = models->find(key);
    return it == models->end() ? std::nullopt : it->second.idle_ttl_ms;
  };
  r->swap_same_role_for = [models, same_role](const std::string& key) -> std::optional<bool> {
    auto it = models->find(key);
    std::optional<SameRolePolicy> p = same_role;
    if (it != models->end() && it->second.same_role) p = it->second.same_role;
    if (!p) return std::nullopt;
    return *p == SameRolePolicy::kSwap;
  };
}

CapabilityRegistration EngineCapabilityRegistration(
    Capability capability, const std::vector<ModelEntry>& entries,
    const std::map<std::string, size_t>& estimated_bytes, WeightCaches caches,
    const ServeKv* kv, SameRolePolicy same_role) {
  auto models = std::make_shared<std::map<std::string, ModelEntry>>();
  auto estimates = std::make_shared<std::map<std::string, size_t>>(estimated_bytes);
  CapabilityRegistration r;
  r.capability = capability;
  // [memory] same_role, overridden per model.
  r.swap_same_role = false;
  // The entry's charges are the engine's KV slots (kv_slot) and activation
  // scratch (scratch); the weights are the WeightCache's charges.
  r.charge_kind = ChargeKind::kKvSlot;
  for (const ModelEntry& e : entries) {
    if (e.capability != capability) continue;
    models->emplace(e.name, e);
    r.model_keys.push_back(e.name);
  }
  // [[models]] role / idle_ttl / same_role.
  SetPerModelFields(&r, models, estimates, same_role);
  r.load = [models, caches, kv](const std::string& key) -> Result<LoadedBackend> {
    auto it = models->find(key);
    if (it == models->end()) {
      return NotFoundError(fmt::format("model \"{}\" not found", ClipInput(key)));
    }
    ARBITER_ASSIGN_OR_RETURN(WeightCache * cache, caches.For(it->second));
    return LoadEngineModel(it->second, cache, kv != nullptr ? kv->Find(key) : nullptr,
                           caches.host());
  };
  r.unload = [models, caches, kv](const std::string& key, LoadedBackend backend) {
    auto it = models->find(key);
    Result<WeightCache*> cache =
        it == models->end() ? Result<WeightCache*>(caches.host()) : caches.For(it->second);
    UnloadEngineModel(key, std::move(backend), cache.ok() ? *cache : nullptr,
                      kv != nullptr ? kv->Find(key) : nullptr, caches.host());
  };
  // A model on a device is charged there: its KV slots and scratch (this
  // registration's charges) and its device weights (its cache's).
  r.domain_for = [models, caches](const std::string& key) -> std::optional<MemoryDomain> {
    auto it = models->find(key);
    if (it == models->end()) return std::nullopt;
    return caches.DomainFor(it->second);
  };
  return r;
}

OpenedModels OpenConfiguredModels(const Config& config) {
  OpenedModels out;
  for (const ModelEntry& m : config.models) {
    if (m.engine == ModelEngine::kBuiltin) out.emplace(m.name, OpenEntryFiles(m));
  }
  return out;
}

ModelLayers ResolveDeviceLayers(Config* config, const ServeWeights& weights,
                                const OpenedModels& opened) {
  ModelLayers out;
  for (ModelEntry& m : config->models) {
    if (m.engine != ModelEngine::kBuiltin) continue;
    auto found = opened.find(m.name);
    if (found == opened.end() || !found->second.ok()) continue;
    const ModelFiles& files = **found->second;
    const int n_layers = files.config().num_hidden_layers;
    if (m.device == "cpu") {
      out[m.name] = {{"cpu", n_layers}};
      continue;
    }
    Result<WeightCache*> cache = weights.caches.For(m);
    if (!cache.ok() || *cache == nullptr) continue;
    std::string domain = m.device;
    for (const auto& [name, d] : weights.devices) {
      if (d.cache.get() == *cache) domain = name;
    }
    if (m.device_layers < 0) {
      const uint64_t budget = (*cache)->Stats().max_bytes;
      Result<int> n = Engine::DeviceLayersFor(files, EngineOptionsFor(m, nullptr), budget);
      if (!n.ok()) continue;  // Load reports the options' error
      if (*n == 0) {
        spdlog::warn("model \"{}\": not even one layer and the output layer fit device {}'s "
                     "budget of {} with {} slot(s) of ctx {}; it runs on the CPU (raise "
                     "[devices.\"{}\"] budget, or lower parallel or ctx)",
                     m.name, domain, FormatSize(budget), m.parallel, m.ctx, domain);
        m.device = "cpu";
        out[m.name] = {{"cpu", n_layers}};
        continue;
      }
      if (*n < n_layers) {
        spdlog::info("model \"{}\": {} of its {} layers (and the output layer) on device {}, "
                     "{} on the CPU: the whole model does not fit the device's budget of {}",
                     m.name, *n, n_layers, domain, n_layers - *n, FormatSize(budget));
        m.device_layers = *n;
      }
    }
    const int on_device =
        m.device_layers < 0 ? n_layers : std::min(m.device_layers, n_layers);
    if (on_device == 0) {
      m.device = "cpu";
      out[m.name] = {{"cpu", n_layers}};
      continue;
    }
    out[m.name][domain] = on_device;
    if (on_device < n_layers) out[m.name]["cpu"] = n_layers - on_device;
  }
  return out;
}

Status RegisterConfiguredModels(const Config& config, MemoryArbiter* arbiter,
                                WeightCaches caches, const ServeKv* kv,
                                const OpenedModels* opened,
                                std::shared_ptr<BackendContext> backends) {
  std::vector<std::string> broken;
  std::map<std::string, size_t> estimates;
  std::vector<ModelEntry> builtin;
  for (const ModelEntry& m : config.models) {
    if (m.engine == ModelEngine::kBuiltin) builtin.push_back(m);
  }
  for (const ModelEntry& m : config.models) {
    if (m.engine != ModelEngine::kBuiltin) {
      spdlog::info("model \"{}\" ({}, engine {}{}): estimated {} until measured", m.name,
                   CapabilityName(m.capability), ModelEngineName(m.engine),
                   m.path.empty() ? "" : ", " + m.path, FormatSize(EstimateBackendBytes(m)));
      continue;
    }
    auto found = opened != nullptr ? opened->find(m.name) : OpenedModels::const_iterator();
    Result<std::shared_ptr<const ModelFiles>> files =
        opened != nullptr && found != opened->end() ? found->second : OpenEntryFiles(m);
    Result<ModelFootprint> estimate =
        files.ok() ? EstimateModelFootprint(m, **files) : Result<ModelFootprint>(files.status());
    Result<WeightCache*> entry_cache = caches.For(m);
    if (estimate.ok() && !entry_cache.ok()) estimate = entry_cache.status();
    WeightCache* cache = entry_cache.ok() ? *entry_cache : nullptr;
    if (estimate.ok() && cache != nullptr) {
      Result<WeightModel> weights = WeightModelForEntry(m, **files, cache);
      Status st = weights.ok() ? cache->Register(std::move(weights).value()) : weights.status();
      if (st.ok()) st = RegisterHostPart(m, **files, caches.host());
      if (!st.ok()) estimate = st;
    }
    estimates[m.name] = estimate.ok() ? estimate->engine_bytes : 0;
    if (estimate.ok()) {
      spdlog::info("model \"{}\" ({}, {}): weights {}, KV and scratch {}, parallel {}, ctx {}, "
                   "residency {}",
                   m.name, CapabilityName(m.capability), m.path, FormatSize(estimate->weight_bytes),
                   FormatSize(estimate->engine_bytes), m.parallel, m.ctx,
                   ResidencyStateName(m.residency));
    } else {
      spdlog::error("model \"{}\" ({}) is broken and will not serve: {}", m.name, m.path,
                    estimate.status().message());
      broken.push_back(m.name);
    }
  }
  if (backends == nullptr) backends = std::make_shared<BackendContext>(nullptr, nullptr);
  for (size_t c = 0; c < kCapabilityCount; ++c) {
    const Capability cap = static_cast<Capability>(c);
    std::vector<std::string> order;
    for (const ModelEntry& m : config.models) {
      if (m.capability == cap) order.push_back(m.name);
    }
    if (order.empty()) continue;
    CapabilityRegistration r = MergeRegistrations(
        EngineCapabilityRegistration(cap, builtin, estimates, caches, kv, config.same_role),
        BackendCapabilityRegistration(cap, config.models, backends), order);
    ARBITER_RETURN_IF_ERROR(arbiter->RegisterCapability(std::move(r)));
  }
  // Record the failures in the arbiter (its load re-runs the cheap check and
  // fails fast), so /v1/models shows them as failed with their error.
  for (const std::string& name : broken) {
    const ModelEntry* m = nullptr;
    for (const ModelEntry& e : config.models) {
      if (e.name == name) m = &e;
    }
    auto h = arbiter->Acquire(m->capability, name, Deadline(std::chrono::seconds(60)));
    (void)h;
  }
  {
    // Pinned models first, so device-pinned weights sit at the arena's base.
    // Failures are logged by the cache; those models load on demand.
    std::set<WeightCache*> all;
    for (const ModelEntry& m : config.models) {
      Result<WeightCache*> c = caches.For(m);
      if (c.ok() && *c != nullptr) all.insert(*c);
    }
    for (WeightCache* c : all) c->PreloadPinned().IgnoreError();
  }
  WeightCache* cache = caches.host();
  if (config.server.preload) {
    for (const ModelEntry& m : config.models) {
      if (std::find(broken.begin(), broken.end(), m.name) != broken.end()) continue;
      if (cache != nullptr && cache->mode() == ResidencyMode::kExternallyManaged &&
          m.residency != ResidencyState::kPinnedDevice) {
        // The control plane decides: the engine loads once it pins the model.
        spdlog::info("preload of model \"{}\" skipped: externally managed and not pinned to the "
                     "device",
                     m.name);
        continue;
      }
      auto h = arbiter->Acquire(m.capability, m.name,
                                Deadline(std::chrono::seconds(config.server.acquire_timeout_s)));
      if (!h.ok()) {
        spdlog::error("preload of model \"{}\" failed: {}", m.name, h.status().message());
      }
    }
  }
  return OkStatus();
}

namespace {

// Opens the compute device `device` names (as a model writes it) for
// `out`: once per physical device, its domain, arena and cache; a second
// spelling of the same device ("vulkan" and "vulkan:0") shares them.
Status OpenServeDevice(const Config& config, const std::string& device, MemoryLedger* ledger,
                       Reclaimer* reclaimer, ServeWeights* out) {
#if ARBITER_HAS_VULKAN
  ModelEntry probe;
  probe.device = device;
  if (out->caches.For(probe).ok()) return OkStatus();
  ARBITER_ASSIGN_OR_RETURN(std::vector<vulkan::VulkanDeviceInfo> infos,
                           vulkan::ListVulkanDevices());
  ARBITER_ASSIGN_OR_RETURN(int index, vulkan::ResolveVulkanDevice(device, infos));
  const vulkan::VulkanDeviceInfo& info = infos[static_cast<size_t>(index)];
  const std::string name = info.domain();
  auto found = out->devices.find(name);
  if (found == out->devices.end()) {
    const vulkan::VulkanHeapInfo& heap = info.heaps[static_cast<size_t>(info.weight_heap)];
    const uint64_t usage_before = heap.usage_bytes.value_or(0);
    ARBITER_ASSIGN_OR_RETURN(std::shared_ptr<vulkan::VulkanDevice> dev,
                             vulkan::VulkanDevice::Open(name));
    std::optional<std::string> budget_text;
    std::string headroom_text{kDefaultDeviceHeadroom};
    for (const DeviceSettings& d : config.devices) {
      if (d.name == name) {
        budget_text = d.budget_text;
        headroom_text = d.headroom_text;
      }
    }
    ARBITER_ASSIGN_OR_RETURN(uint64_t budget,
                             ResolveDeviceBudget(name, budget_text, headroom_text,
                                                 heap.size_bytes, heap.budget_bytes));
    ARBITER_ASSIGN_OR_RETURN(
        MemoryDomain domain,
        ledger->RegisterDomain(name, {.budget_bytes = budget, .inside_host = info.unified_memory}));
    // The device's fixed cost (its context, pools): what the driver's usage
    // grew by when it was opened; 0 without a driver report (lavapipe's
    // memory is host RAM, in the host's measured runtime bytes).
    if (std::optional<vulkan::VulkanHeapInfo> now = dev->QueryWeightHeap()) {
      const uint64_t after = now->usage_bytes.value_or(usage_before);
      ledger->SetRuntimeBytes(domain, after > usage_before ? after - usage_before : 0);
    }
    ServeWeights::Device d;
    d.name = name;
    d.domain = domain;
    ARBITER_ASSIGN_OR_RETURN(
        std::unique_ptr<vulkan::VulkanDeviceBackend> backend,
        vulkan::VulkanDeviceBackend::Create(std::move(dev), {.heap_bytes = budget}));
    d.backend = std::move(backend);
    WeightCacheOptions o;
    o.device = d.backend.get();
    o.ledger = ledger;
    o.store = out->store.get();
    o.mode = config.weights.mode;
    o.fraction = 1.0;
    o.wiggle = 0.0;
    o.reclaimer = reclaimer;
    o.domain = domain;
    o.pool_region_bytes = 1;
    ARBITER_ASSIGN_OR_RETURN(d.cache, WeightCache::Create(std::move(o)));
    spdlog::info("device {}: {} ({}, {}), budget {} of a {} heap{}", name, info.name, info.type,
                 info.driver, FormatSize(budget), FormatSize(heap.size_bytes),
                 info.unified_memory ? ", inside the host's budget (unified memory)" : "");
    found = out->devices.emplace(name, std::move(d)).first;
  }
  out->caches.AddDevice(device, found->second.cache.get(), found->second.domain);
  return OkStatus();
#else
  return UnavailableError("device \"" + device +
                          "\": this build has no Vulkan device (configure with ARBITER_VULKAN=ON "
                          "after scripts/install-deps.sh); use device = \"cpu\"");
#endif
}

}  // namespace

Result<std::unique_ptr<ServeWeights>> MakeServeWeights(
    const Config& config, MemoryLedger* ledger, Reclaimer* reclaimer) {
  const WeightSettings& w = config.weights;
  auto out = std::make_unique<ServeWeights>();
  // Default arena: twice the budget. On the cpu device the arena is address
  // space (mapped lazily, MAP_NORESERVE) and every byte in it is charged to
  // the ledger, so the ledger's budget is what binds — the arbiter then
  // chooses victims by role. A smaller device_arena models a real device.
  uint64_t arena = w.device_arena_bytes > 0 ? w.device_arena_bytes : 2 * config.budget_bytes;
  // The weight pool maps the arena as one region when the first model loads
  // (and unmaps it when the last one leaves); mapping it once here finds out
  // now whether the kernel allows it.
  auto make_and_probe = [](uint64_t bytes) -> Result<std::unique_ptr<DeviceBackend>> {
    ARBITER_ASSIGN_OR_RETURN(std::unique_ptr<DeviceBackend> d, MakeDeviceBackend("cpu", bytes));
    if (bytes > 0) {
      ARBITER_ASSIGN_OR_RETURN(DeviceRegion probe, d->AllocateRegion(bytes));
      ARBITER_RETURN_IF_ERROR(d->FreeRegion(probe.id));
    }
    return d;
  };
  Result<std::unique_ptr<DeviceBackend>> device = make_and_probe(arena);
  if (!device.ok() && w.device_arena_bytes == 0) {
    // Strict overcommit (vm.overcommit_memory = 2) counts even a lazily
    // backed mapping: fall back to an arena of the budget.
    spdlog::warn("weights: cannot map the default arena of {} ({}); using {}", FormatSize(arena),
                 device.status().message(), FormatSize(config.budget_bytes));
    arena = config.budget_bytes;
    device = make_and_probe(arena);
  }
  if (!device.ok()) return device.status().WithPrefix("[memory].device_arena");
  out->device = std::move(device).value();
  if (w.shared_host_weights) {
    SharedWeightStoreOptions o;
    o.prefix = w.shared_host_weights_prefix;
    o.mode = w.shared_host_weights_mode;
    Result<std::unique_ptr<SharedWeightStore>> shared = SharedWeightStore::Create(o);
    if (!shared.ok()) return shared.status().WithPrefix("[memory].shared_host_weights");
    std::set<std::string> live;
    for (const ModelEntry& m : config.models) live.insert(m.name);
    Result<std::vector<std::string>> swept = (*shared)->SweepOrphans(live);
    if (!swept.ok()) {
      spdlog::warn("shared host weights: sweeping leftover regions: {}", swept.status().message());
    } else {
      for (const std::string& name : *swept) {
        spdlog::info("shared host weights: removed leftover region {} (model not configured)",
                     name);
      }
    }
    out->store = std::move(shared).value();
  } else {
    out->store = std::make_unique<PrivateWeightStore>();
  }
  WeightCacheOptions o;
  o.device = out->device.get();
  o.ledger = ledger;
  o.store = out->store.get();
  o.mode = w.mode;
  o.fraction = w.weight_cache_fraction;
  o.wiggle = w.wiggle_fraction;
  o.compaction_every_loads = w.compaction_every_loads;
  o.reclaimer = reclaimer;
  Result<std::unique_ptr<WeightCache>> cache = WeightCache::Create(std::move(o));
  if (!cache.ok()) return cache.status().WithPrefix("[memory]");
  out->cache = std::move(cache).value();
  spdlog::info("weights: {} arena of {}, {} host floors{}, mode {}", out->device->name(),
               FormatSize(arena), out->store->kind(),
               w.shared_host_weights ? fmt::format(" (/dev/shm/{}-*, mode {:04o})",
                                                   w.shared_host_weights_prefix,
                                                   w.shared_host_weights_mode)
                                     : std::string(),
               ResidencyModeName(w.mode));
  out->caches = WeightCaches(out->cache.get());
  for (const ModelEntry& m : config.models) {
    if (m.engine != ModelEngine::kBuiltin || m.device == "cpu") continue;
    Status st = OpenServeDevice(config, m.device, ledger, reclaimer, out.get());
    if (!st.ok()) {
      spdlog::error("device \"{}\" (model \"{}\") cannot be used: {}", m.device, m.name,
                    st.message());
      out->caches.AddBrokenDevice(m.device, std::move(st));
    }
  }
  return out;
}

}  // namespace arbiter
