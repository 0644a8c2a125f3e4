// The Runtime (arbiter/runtime/runtime.h): construction, shutdown, status,
// the admin operations and the KV maintenance thread. Text generation,
// embeddings and prewarm are in text.cc.
//
// Note [Runtime shutdown]
// Shutdown() runs once, in this order:
//   1. stopping_ is set: new operations fail, running generations see their
//      cancel (the server's CancelFn reads it too);
//   2. the pressure subscription ends and the sources stop (no reclaim
//      starts after this point), then the KV maintenance thread is joined
//      (it may hold a model handle for a pass);
//   3. MemoryArbiter::Shutdown(): waits (bounded) for loads in flight and
//      held handles, then unloads every model — each engine's deleter saves
//      the conversations its slots hold to the KV directory and evicts its
//      device weights;
//   4. the prompt cache spills to disk (ServeKv's destructor), after the
//      arbiter, because engines detached in step 3 no longer read it;
//   5. the weight cache, the host-floor store and the arena go (ServeWeights),
//      then the ledger.
// The reclaim policy's targets stay valid until step 5: nothing can ask for
// room after step 3.
//
// Note [Runtime bytes]
// The ledger charges what models own; the rest of the process's resident
// memory (binary data, tokenizers, thread stacks, OpenBLAS buffers, HTTP
// buffers, the heap) is the ledger's runtime_bytes, so that charged +
// runtime can be compared with what the kernel says (docs/memory.md "The
// ledger is the truth"). It cannot be told apart from model memory while
// models are loaded, so it is measured whenever nothing is charged and
// nothing is loading — at the end of Create(), on every Status() and every
// KV maintenance pass that finds the ledger empty — as the process's
// RssAnon + RssShmem then. It follows the process up (thread stacks and
// pools created by the first requests) and down (the heap trimmed after an
// unload); between such moments it keeps its last value, and what it misses
// shows up as unaccounted_bytes in /admin/status.
#include "runtime/internal/runtime_impl.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <limits>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "arbiter/base/clip.h"
#include "arbiter/base/log_safe.h"
#include "arbiter/base/size.h"
#include "runtime/internal/snapshots.h"

namespace arbiter {

Result<std::unique_ptr<Runtime>> Runtime::Create(const Config& config) {
  auto rt = std::make_unique<runtime_internal::RuntimeImpl>(config);
  ARBITER_RETURN_IF_ERROR(rt->Build());
  return std::unique_ptr<Runtime>(std::move(rt));
}

namespace runtime_internal {

RuntimeImpl::RuntimeImpl(Config config) : config_(std::move(config)) {
  for (const ModelEntry& m : config_.models) names_.emplace_back(m.name, m.capability);
}

RuntimeImpl::~RuntimeImpl() { Shutdown(); }

arbiter::Status RuntimeImpl::Build() {
  // [pressure]: the OS source (auto-probed) combined with the bridge that
  // DispatchPressure feeds.
  Result<ServePressure> pressure = MakeServePressure(config_.pressure);
  if (!pressure.ok()) return pressure.status();
  pressure_.emplace(std::move(pressure).value());
  if (!pressure_->probe_notes.empty()) {
    spdlog::info("pressure: skipped unavailable sources ({})", pressure_->probe_notes);
  }
  spdlog::info("pressure source: {} + bridge (POST /admin/pressure)", pressure_->os_source);

  // One ledger for the engines (KV slots, scratch), the weight cache (device
  // weights, host floors) and the prompt cache.
  ledger_ = std::make_unique<MemoryLedger>(config_.budget_bytes);
  // The KV tiers: built before the arbiter and destroyed after it, since
  // freeing an engine saves its slots' conversations through them.
  // Every model's files are opened and planned once here, for the KV model
  // hash, the footprint estimate and the weight registration.
  const OpenedModels opened = OpenConfiguredModels(config_);
  ARBITER_ASSIGN_OR_RETURN(kv_, MakeServeKv(config_, ledger_.get(), &opened));
  ARBITER_ASSIGN_OR_RETURN(weights_, MakeServeWeights(config_, ledger_.get(), &policy_));
  // Partial offload: how many layers of each device model run there.
  layers_ = ResolveDeviceLayers(&config_, *weights_, opened);
  vision_cache_ = std::make_unique<VisionEmbeddingCache>(
      VisionEmbeddingCache::Options{.ledger = ledger_.get()});
  targets_.vision_cache = vision_cache_.get();
  bool any_process = false;
  for (const ModelEntry& m : config_.models) any_process |= m.engine == ModelEngine::kProcess;
  if (any_process) {
    const std::string dir = (std::filesystem::path(config_.state_dir.empty() ? "." : config_.state_dir) /
                             "processes")
                                .string();
    Result<std::unique_ptr<ProcessSupervisor>> sup = ProcessSupervisor::Create(dir);
    if (!sup.ok()) return sup.status().WithPrefix("process models");
    supervisor_ = std::move(sup).value();
    for (const std::string& line : supervisor_->ReapStale()) {
      spdlog::warn("process models: stopped a child left by an earlier arbiter: {}", line);
    }
  }
  backends_ = std::make_shared<BackendContext>(supervisor_.get(), ledger_.get());
  MemoryArbiterOptions ao;
  ao.ledger = ledger_.get();
  ao.refuse_over_budget = true;
  ao.reclaimer = &policy_;
  ao.vision_cache = vision_cache_.get();
  arbiter_ = std::make_unique<MemoryArbiter>(ao);
  backends_->Bind(arbiter_.get(), [this](const std::string&) {
    policy_.MakeRoom(0);
    return ledger_->charged_bytes() <= ledger_->budget_bytes();
  });
  // The policy's targets are complete before any model can load.
  targets_.ledger = ledger_.get();
  targets_.arbiter = arbiter_.get();
  targets_.weights = weights_->cache.get();
  for (auto& [name, device] : weights_->devices) targets_.device_weights.push_back(device.cache.get());
  targets_.prompt_cache = kv_->prompt_cache.get();
  ARBITER_RETURN_IF_ERROR(
      RegisterConfiguredModels(config_, arbiter_.get(), weights_->caches, kv_.get(), &opened,
                               backends_));
  if (arbiter::Status s = arbiter_->Start(); !s.ok()) {
    return s.WithPrefix("cannot start the memory arbiter");
  }
  // Note [Grammar vocabularies] in constrained.cc: a text model's grammar
  // vocabulary (and its charge) goes when the model unloads.
  vocab_sub_ = arbiter_->OnEvent([this](const ArbiterEvent& e) {
    if ((e.type != ArbiterEventType::kModelUnload && e.type != ArbiterEventType::kEviction) ||
        e.capability != Capability::kText) {
      return;
    }
    VocabularyEntry gone;  // freed after the lock
    MutexLock l(&vocab_mu_);
    auto it = vocabularies_.find(e.model_key);
    if (it == vocabularies_.end()) return;
    gone = std::move(it->second);
    vocabularies_.erase(it);
  });
  // OS pressure goes to the reclaim policy (Note [Reclaim order]), never to
  // the arbiter directly.
  ARBITER_RETURN_IF_ERROR(pressure_->composite->Start().WithPrefix("[pressure]"));
  pressure_sub_ = pressure_->composite->Subscribe(
      [this](const MemoryPressureEvent& e) { policy_.OnPressure(e); });
  kv_thread_ = std::thread([this] { KvMaintenanceLoop(); });
  (void)MeasureRuntimeBytes();
  return OkStatus();
}

Result<ProcessMemoryInfo> RuntimeImpl::MeasureRuntimeBytes() const {
  // Empty before and after the read: no charge or load overlapped it.
  auto empty = [this] {
    return ledger_->charged_bytes() == 0 && arbiter_->Stats().loading_bytes == 0;
  };
  const bool empty_before = empty();
  Result<ProcessMemoryInfo> mem = ReadProcessMemory();
  if (empty_before && mem.ok() && empty()) ledger_->SetRuntimeBytes(mem->resident_bytes());
  return mem;
}

void RuntimeImpl::Shutdown() {
  {
    MutexLock l(&shutdown_mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  stopping_.store(true);
  pressure_sub_.Reset();
  if (pressure_) pressure_->composite->Stop();
  StopMaintenance();
  if (backends_) backends_->Stop();    // the process watcher
  if (arbiter_) arbiter_->Shutdown();  // frees every engine (KV saved), stops every child
  kv_.reset();                         // spills the prompt cache
  targets_.prompt_cache = nullptr;
  weights_.reset();
  targets_.weights = nullptr;
}

std::vector<std::pair<std::string, Capability>> RuntimeImpl::ModelNames() const { return names_; }

Result<Capability> RuntimeImpl::FindModel(const std::string& name) const {
  for (const auto& [n, cap] : names_) {
    if (n == name) return cap;
  }
  return NotFoundError(fmt::format("model \"{}\" not found", ClipInput(name)),
                       ErrorReason::kModelNotFound);
}

arbiter::Status RuntimeImpl::CheckCapability(const std::string& name, Capability have,
                                             Capability want) const {
  if (have == want) return OkStatus();
  return InvalidArgumentError(
      fmt::format("model \"{}\" is a {} model; {}", name, CapabilityName(have),
                  have == Capability::kEmbedding ? "use /v1/embeddings"
                                                 : "use /v1/chat/completions or /v1/completions"),
      ErrorReason::kWrongCapability);
}

Result<ArbiterHandle> RuntimeImpl::AcquireModel(const std::string& name, Capability capability,
                                                bool any_backend) {
  if (stopping()) {
    return UnavailableError("the server is shutting down", ErrorReason::kShuttingDown);
  }
  WeightCache* cache = CacheOf(name);
  Result<ModelEntry> entry = Model(name);
  const bool builtin = !entry.ok() || entry->engine == ModelEngine::kBuiltin;
  if (!builtin && !any_backend) {
    return InvalidArgumentError(
        fmt::format("model \"{}\" is served by {} (engine \"{}\"), not by the built-in engine",
                    name, entry->engine == ModelEngine::kProcess ? "an external process" : "a backend",
                    ModelEngineName(entry->engine)),
        ErrorReason::kWrongCapability);
  }
  // Externally managed: the control plane decides residency; a model whose
  // weights are not on the device is refused before anything loads.
  if (builtin && cache->mode() == ResidencyMode::kExternallyManaged &&
      cache->DeviceResident(name) == false) {
    return NotResidentError(name);
  }
  Result<ArbiterHandle> h = arbiter_->Acquire(
      capability, name, Deadline(std::chrono::seconds(config_.server.acquire_timeout_s)));
  if (!h.ok()) return h.status();
  if (!builtin) return h;  // a backend (BackendModel)
  if (h->backend<Engine>() == nullptr) {
    return InternalError(fmt::format("model \"{}\" has no engine backend", name));
  }
  return h;
}

std::optional<ArbiterHandle> RuntimeImpl::ResidentHandle(const std::string& name) {
  Result<Capability> cap = FindModel(name);
  if (!cap.ok()) return std::nullopt;
  for (const ModelStats& m : arbiter_->Stats().models) {
    if (m.name != name || m.state != ModelState::kLoaded) continue;
    auto h = arbiter_->Acquire(*cap, name, Deadline(std::chrono::seconds(1)));
    if (h.ok() && h->backend<Engine>() != nullptr) return std::move(h).value();
  }
  return std::nullopt;
}

KvPrecache* RuntimeImpl::PrecacheFor(const std::string& name) const {
  return kv_ != nullptr ? kv_->Find(name) : nullptr;
}

namespace {

// One model's status from the arbiter's and the weight cache's snapshots:
// ready unless it failed or, externally managed, its weights are off the
// device.
ModelStatus ModelStatusFrom(ModelStats m, const std::optional<WeightCacheStatus>& w) {
  ModelStatus out;
  out.ready = m.state != ModelState::kFailed;
  if (w) {
    for (const WeightModelStatus& wm : w->models) {
      if (wm.key != m.name) continue;
      out.weights = wm;
      if (w->mode == ResidencyMode::kExternallyManaged && !wm.device_resident) out.ready = false;
    }
  }
  out.arbiter = std::move(m);
  return out;
}

}  // namespace

ModelStatus RuntimeImpl::ModelStatusOf(const std::string& name) const {
  ModelStats found;
  found.name = name;
  for (ModelStats& m : arbiter_->Stats().models) {
    if (m.name == name) found = std::move(m);
  }
  std::optional<WeightCacheStatus> w;
  if (weights_ != nullptr) w = WeightsStatus();
  return ModelStatusFrom(std::move(found), w);
}

// The host cache's figures, with the models of every device cache too (each
// model is in exactly one cache).
WeightCacheStatus RuntimeImpl::WeightsStatus() const {
  WeightCacheStatus w = runtime_internal::WeightCacheStatusOf(weights_->cache->Stats());
  for (const auto& [name, device] : weights_->devices) {
    WeightCacheStatus d = runtime_internal::WeightCacheStatusOf(device.cache->Stats());
    for (WeightModelStatus& m : d.models) w.models.push_back(std::move(m));
  }
  return w;
}

WeightCache* RuntimeImpl::CacheOf(const std::string& name) const {
  for (const ModelEntry& e : config_.models) {
    if (e.name != name) continue;
    Result<WeightCache*> c = weights_->caches.For(e);
    if (c.ok() && *c != nullptr) return *c;
  }
  return weights_->cache.get();
}

RuntimeStatus RuntimeImpl::Status() const {
  const Result<ProcessMemoryInfo> mem = MeasureRuntimeBytes();
  RuntimeStatus s;
  s.arbiter = arbiter_->Stats();
  s.ledger = ledger_->Snapshot();
  if (mem.ok()) {
    s.process_resident_bytes = mem->resident_bytes();
    // Charges outside RssAnon + RssShmem: backends' file pages, children.
    s.outside_bytes = backends_ != nullptr ? backends_->OutsideBytes() : 0;
    s.unaccounted_bytes = static_cast<int64_t>(mem->resident_bytes() + s.outside_bytes) -
                          static_cast<int64_t>(s.ledger.charged_bytes + s.ledger.runtime_bytes);
  }
  if (weights_ != nullptr) s.weights = WeightsStatus();
  s.processes = ProcessStats();
  s.vision_cache = vision_cache_->Stats();
  for (const ModelStats& m : s.arbiter.models) {
    ModelStatus& ms = s.models.emplace_back(ModelStatusFrom(m, s.weights));
    for (const ModelEntry& e : config_.models) {
      if (e.name == m.name) {
        ms.engine = std::string(ModelEngineName(e.engine));
        ms.device = e.device;
      }
    }
    if (auto l = layers_.find(m.name); l != layers_.end()) ms.layers = l->second;
    ms.total_bytes = m.bytes;
    for (const ProcessModelStats& p : s.processes) {
      if (p.name == m.name) ms.process = p;
    }
    auto w = s.ledger.by_owner.find("weights::" + m.name);
    if (w != s.ledger.by_owner.end()) ms.total_bytes += w->second.total_bytes;
  }
  // Configuration order (the arbiter lists registrations by capability).
  auto index = [this](const std::string& name) {
    for (size_t i = 0; i < config_.models.size(); ++i) {
      if (config_.models[i].name == name) return i;
    }
    return config_.models.size();
  };
  std::stable_sort(s.models.begin(), s.models.end(),
                   [&](const ModelStatus& a, const ModelStatus& b) {
                     return index(a.arbiter.name) < index(b.arbiter.name);
                   });
  s.pressure_source = pressure_ ? pressure_->os_source : "none";
  s.next_victim = policy_.Next();
  s.domain_next_victims = policy_.NextByDomain();
  return s;
}

Result<KvStatus> RuntimeImpl::Kv(bool with_files) const {
  if (kv_ == nullptr) {
    return UnavailableError("this server has no KV precache", ErrorReason::kNoKvPrecache);
  }
  KvStatus out;
  out.dir = kv_->dir;
  out.settings = kv_->settings;
  if (kv_->prompt_cache != nullptr) {
    KvPromptCacheStatus pc;
    pc.entries = kv_->prompt_cache->Entries();
    pc.counters = kv_->prompt_cache->counters();
    pc.bytes = kv_->prompt_cache->bytes();
    pc.capacity_bytes = kv_->prompt_cache->capacity();
    out.prompt_cache = std::move(pc);
  }
  for (const auto& [name, pc] : kv_->precaches) {
    KvModelStatus m;
    m.name = name;
    m.model_hash = pc->model_hash();
    m.slots = pc->Slots();
    m.conversations = pc->registry().OpenHandles(name);
    m.prewarmed = pc->Prewarmed();
    m.high_water = pc->registry().HighWater();
    m.recommended_parallel =
        ConversationRegistry::RecommendedParallel(m.high_water, static_cast<int>(m.slots.size()));
    m.counters = runtime_internal::KvCountersStatusOf(pc->counters());
    out.models.push_back(std::move(m));
  }
  if (with_files) {
    out.files = kv_->store->List();
    out.files_total = out.files.size();
    out.disk_bytes = 0;
    for (const KvFileInfo& f : out.files) out.disk_bytes += f.bytes;
  } else {
    out.disk_bytes = kv_->store->DiskBytes();
  }
  std::sort(out.files.begin(), out.files.end(),
            [](const KvFileInfo& a, const KvFileInfo& b) { return a.age_ms < b.age_ms; });
  if (out.files.size() > kKvStatusMaxFiles) out.files.resize(kKvStatusMaxFiles);
  out.files_swept = kv_files_swept_.load();
  out.write_errors = kv_->store->write_errors();
  return out;
}

// ---- admin -----------------------------------------------------------------

Result<ModelStatus> RuntimeImpl::LoadModel(const std::string& name) {
  ARBITER_ASSIGN_OR_RETURN(Capability cap, FindModel(name));
  ARBITER_ASSIGN_OR_RETURN(ArbiterHandle h, AcquireModel(name, cap, /*any_backend=*/true));
  h.Release();  // loaded, unpinned: evictable like any idle model
  return ModelStatusOf(name);
}

Result<UnloadResult> RuntimeImpl::UnloadModel(const std::string& name, int64_t timeout_ms) {
  ARBITER_ASSIGN_OR_RETURN(Capability cap, FindModel(name));
  ARBITER_ASSIGN_OR_RETURN(bool unloaded,
                           arbiter_->Unload(cap, name, Deadline(std::chrono::milliseconds(timeout_ms))));
  UnloadResult r;
  r.unloaded = unloaded;
  r.model = ModelStatusOf(name);
  return r;
}

Result<std::pair<ResidencyState, ModelStatus>> RuntimeImpl::SetResidency(const std::string& name,
                                                                         ResidencyState target) {
  ARBITER_RETURN_IF_ERROR(FindModel(name).status());
  WeightCache* cache = CacheOf(name);
  if (!cache->Contains(name)) {
    return FailedPreconditionError(
        fmt::format("model \"{}\" has no weights registered (it failed its startup check; see "
                    "/v1/models)",
                    name),
        ErrorReason::kModelBroken);
  }
  Result<ResidencyState> prev = cache->SetResidency(name, target);
  if (!prev.ok()) {
    arbiter::Status st = prev.status();
    if (st.code() == StatusCode::kResourceExhausted && st.reason() == ErrorReason::kNone) {
      st = st.WithReason(ErrorReason::kPinDoesNotFit);
    }
    spdlog::error("residency of model \"{}\" → {}: {}", LogSafe(name), ResidencyStateName(target),
                  LogSafe(st.message(), kLogSafeMessageBytes));
    return st;
  }
  return std::make_pair(*prev, ModelStatusOf(name));
}

Result<CompactResult> RuntimeImpl::Compact(const std::vector<std::string>& reload) {
  WeightCache* cache = weights_->cache.get();
  for (const std::string& name : reload) {
    if (!cache->Contains(name)) {
      return NotFoundError(fmt::format("model \"{}\" not found", ClipInput(name)),
                           ErrorReason::kModelNotFound);
    }
  }
  return cache->Compact(reload);
}

MemoryPressureLevel RuntimeImpl::DispatchPressure(MemoryPressureLevel level,
                                                  std::optional<uint64_t> free_bytes) {
  spdlog::info("pressure bridge: {}{}", MemoryPressureLevelName(level),
               free_bytes ? fmt::format(" ({} MiB free)", *free_bytes >> 20) : "");
  // Synchronous: the composite and the reclaim policy react on this thread.
  pressure_->bridge->Dispatch(level, free_bytes);
  return arbiter_->CurrentPressureLevel();
}

Result<std::vector<std::string>> RuntimeImpl::CloseConversation(const std::string& id,
                                                                const std::string& model) {
  if (kv_ == nullptr) {
    return UnavailableError("this server has no KV precache", ErrorReason::kNoKvPrecache);
  }
  if (!model.empty() && kv_->Find(model) == nullptr) {
    return NotFoundError(
        fmt::format("model \"{}\" not found or has no KV precache", ClipInput(model)),
        ErrorReason::kModelNotFound);
  }
  std::vector<std::string> closed;
  for (const auto& [name, pc] : kv_->precaches) {
    if (!model.empty() && name != model) continue;
    std::optional<ArbiterHandle> h = ResidentHandle(name);
    if (pc->Close(h ? h->backend<Engine>() : nullptr, id)) closed.push_back(name);
  }
  if (closed.empty()) {
    return NotFoundError(fmt::format("conversation \"{}\" is not open", ClipInput(id)),
                         ErrorReason::kConversationNotFound);
  }
  return closed;
}

ArbiterEventSubscription RuntimeImpl::OnEvent(ArbiterEventListener listener) {
  return arbiter_->OnEvent(std::move(listener));
}

// ---- KV maintenance ------------------------------------------------------------

// Note [KV maintenance]
// One thread per runtime. Every [kv] eviction_interval: the disk tier's
// sweep (expired files, disk budget), the prompt cache's expired entries,
// and each text model's idle conversations (persisted .long, closed). Every
// [kv] keepalive_interval: each loaded text model's keep-alive. (Each
// eviction pass also re-measures runtime_bytes: Note [Runtime bytes].) A model that
// is not loaded is never loaded for this: its engine is taken only while the
// arbiter reports it resident (a handle keeps it so during the pass).
void RuntimeImpl::KvMaintenanceLoop() {
  const int64_t evict_every = kv_->settings.eviction_interval_ms;
  const int64_t keepalive_every = kv_->settings.keepalive_interval_ms;
  auto next_evict = std::chrono::steady_clock::now() + std::chrono::milliseconds(evict_every);
  auto next_keepalive =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(keepalive_every);
  while (true) {
    {
      MutexLock l(&kv_mu_);
      const auto until = std::min(next_evict, next_keepalive);
      while (!kv_stop_ && std::chrono::steady_clock::now() < until) kv_wake_.WaitUntil(until);
      if (kv_stop_) return;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= next_evict) {
      next_evict = now + std::chrono::milliseconds(evict_every);
      KvEvictionPass();
      (void)MeasureRuntimeBytes();
    }
    if (now >= next_keepalive) {
      next_keepalive = now + std::chrono::milliseconds(keepalive_every);
      for (const auto& [name, pc] : kv_->precaches) {
        std::optional<ArbiterHandle> h = ResidentHandle(name);
        const int n = pc->KeepAlive(h ? h->backend<Engine>() : nullptr);
        if (n > 0) {
          spdlog::info("kv: model \"{}\": keep-alive re-warmed {} conversation(s)", name, n);
        }
      }
    }
  }
}

void RuntimeImpl::KvEvictionPass() {
  const KvSweepResult swept = kv_->store->Sweep();
  kv_files_swept_.fetch_add(static_cast<uint64_t>(swept.expired + swept.over_budget));
  if (swept.expired + swept.over_budget > 0) {
    spdlog::info("kv: swept {} expired and {} over-budget file(s) ({})", swept.expired,
                 swept.over_budget, FormatSize(swept.bytes_freed));
  }
  if (kv_->prompt_cache != nullptr) kv_->prompt_cache->PurgeExpired();
  for (const auto& [name, pc] : kv_->precaches) {
    std::optional<ArbiterHandle> h = ResidentHandle(name);
    const std::vector<std::string> ids = pc->EvictIdle(h ? h->backend<Engine>() : nullptr);
    if (!ids.empty()) {
      spdlog::info("kv: model \"{}\": closed {} idle conversation(s), KV saved", name, ids.size());
    }
  }
}

void RuntimeImpl::StopMaintenance() {
  {
    MutexLock l(&kv_mu_);
    kv_stop_ = true;
    kv_wake_.SignalAll();
  }
  if (kv_thread_.joinable()) kv_thread_.join();
}

}  // namespace runtime_internal
}  // namespace arbiter
