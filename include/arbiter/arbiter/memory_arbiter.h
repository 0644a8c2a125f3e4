// arbiter/arbiter/memory_arbiter.h — the MemoryArbiter: the single in-process
// owner of every model handle (text, embedding, vision-describe, image-gen,
// transcribe, speak) under one byte budget.
//
// Keeps the semantics of the reference memory arbiter it replaces, with the
// reference's eight known defects fixed (docs/memory-arbiter.md, which also
// says where the implementation lives); the design notes open
// src/arbiter/memory_arbiter.cc.
//
// Concepts:
//   - A capability is registered once (CapabilityRegistration) with a resident
//     role (default from the capability → role table), an estimated size and
//     load(model_key) / unload(backend) / run(handle, request) callables.
//   - A resident entry is keyed "<capability>::<model_key>" (ResidentKey()).
//   - Acquire(capability, model_key, deadline) returns a move-only
//     ArbiterHandle pinning the entry; pinned entries are never evicted. The
//     first acquire loads (single flight: all concurrent waiters share one
//     load call). Loading a key whose role already has another resident (or
//     loading) entry first waits for that entry to drain, then evicts it with
//     reason "swap" (registrations may opt out with swap_same_role = false).
//   - Budget: the arbiter charges every resident (and loading) entry to a
//     MemoryLedger with owner = resident key; the footprint is the ledger's
//     total, so bytes charged by other layers count. Before a load, idle
//     entries are evicted LRU-first (reason "fit") while footprint + incoming
//     > budget; best effort (the load proceeds if it still does not fit).
//   - Pressure (from an injected MemoryPressureSource): low → purge expired
//     vision-cache entries and evict the lowest-priority idle non-text entry;
//     critical → evict every idle non-text entry and refuse non-text acquires.
//   - Request(capability, model_key, payload, stop) queues a run: per
//     resident key a bounded FIFO drained by one worker thread (one run at a
//     time per loaded model; models, even of one capability, run side by
//     side); returns a std::future.
//   - OnEvent(listener) → RAII subscription to model_load / model_unload /
//     memory_pressure / eviction / capability_run events.
//
// Example:
//   MemoryArbiter arbiter({.budget_bytes = 2ull << 30});
//   ARBITER_RETURN_IF_ERROR(arbiter.RegisterCapability({
//       .capability = Capability::kText, .estimated_bytes = 300 << 20,
//       .load = [](const std::string& key) -> Result<LoadedBackend> { ... }}));
//   ARBITER_ASSIGN_OR_RETURN(ArbiterHandle h,
//       arbiter.Acquire(Capability::kText, "demo-chat", Deadline(30s)));
//   Engine* engine = h.backend<Engine>();   // h releases on scope exit
//
// Thread safety: MemoryArbiter is thread-safe. ArbiterHandle is
// thread-compatible (one owner; move it, Retain() for a second owner).
// Acquire of an already-loaded entry, Retain and Release take no lock and
// allocate nothing (their cost: docs/BENCHMARKS.md, "MemoryArbiter"); see
// Note [Fast path] in memory_arbiter.cc. Every other method may take the
// arbiter's internal locks.
// Callables (load, unload, run, event listeners) are invoked without any
// arbiter lock held and may call back into the arbiter, except that an event
// listener must not destroy its own subscription from inside the callback.
// Lifetime: the arbiter, the ledger, the clock, the pressure source and the
// vision cache must outlive every handle and the arbiter respectively.
#pragma once

#include <any>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <typeindex>
#include <typeinfo>
#include <utility>
#include <vector>

#include "arbiter/base/clock.h"
#include "arbiter/base/status.h"
#include "arbiter/memory/memory_ledger.h"
#include "arbiter/memory/memory_pressure.h"
#include "arbiter/memory/reclaimer.h"

namespace arbiter {

class VisionEmbeddingCache;

// The arbiter's machinery (src/arbiter/internal/arbiter_impl.h).
namespace arbiter_internal {
class MemoryArbiterImpl;
struct Entry;
}  // namespace arbiter_internal

// The seed's six capabilities plus kVad (voice-activity detection, role vad,
// priority 35), which the seed's roles name but its capabilities did not.
enum class Capability { kText = 0, kEmbedding, kVisionDescribe, kImageGen, kTranscribe, kSpeak, kVad };
inline constexpr size_t kCapabilityCount = 7;
// "text" | "embedding" | "vision-describe" | "image-gen" | "transcribe" |
// "speak" | "vad".
std::string_view CapabilityName(Capability capability);
// Parses the names above; kInvalidArgument otherwise.
Result<Capability> ParseCapability(std::string_view name);

// Ordered by priority (lowest evicts first); the priorities are the
// reference's (docs/memory-arbiter.md).
enum class ResidentRole {
  kDrafter = 0,   // 10
  kEmotion,       // 15
  kSpeakerId,     // 18
  kVision,        // 20
  kEmbedding,     // 25
  kTurnDetector,  // 28
  kWakeWord,      // 30
  kVad,           // 35
  kAsr,           // 40
  kTts,           // 50
  kTextTarget,    // 100 — never evicted by fit or pressure
};
inline constexpr size_t kResidentRoleCount = 11;
// "drafter", "emotion", "speaker-id", "vision", "embedding", "turn-detector",
// "wake-word", "vad", "asr", "tts", "text-target".
std::string_view ResidentRoleName(ResidentRole role);
Result<ResidentRole> ParseResidentRole(std::string_view name);
int ResidentRolePriority(ResidentRole role);
// text → text-target, embedding → embedding, vision-describe → vision,
// image-gen → vision (they cross-evict on purpose), transcribe → asr,
// speak → tts, vad → vad.
ResidentRole DefaultRoleFor(Capability capability);
// "<capability>::<model_key>".
std::string ResidentKey(Capability capability, std::string_view model_key);

using ArbiterDeadline = std::chrono::steady_clock::time_point;
// now + timeout.
inline ArbiterDeadline Deadline(std::chrono::milliseconds timeout) {
  return std::chrono::steady_clock::now() + timeout;
}

// What a load callable produces: the backend object (type-erased, shared so
// a handle keeps it alive) and its measured size.
struct LoadedBackend {
  std::shared_ptr<void> object;
  std::type_index type = typeid(void);
  // Bytes the backend holds once loaded; 0 → keep the estimate.
  size_t resident_bytes = 0;
  // Optional split of resident_bytes by ledger kind (e.g. KV slots and
  // scratch): Σ bytes must equal resident_bytes; each part is charged under
  // the entry's owner with its own kind. Empty → one charge of the
  // registration's charge_kind.
  std::vector<std::pair<ChargeKind, size_t>> charge_parts;
  // Bytes the backend holds in host memory although its registration's
  // domain is a device's (a model split between a device and the CPU):
  // each part is charged under the entry's owner in the `host` domain,
  // outside resident_bytes, and released when the entry is evicted.
  std::vector<std::pair<ChargeKind, size_t>> host_charge_parts;

  template <typename T>
  static LoadedBackend Of(std::shared_ptr<T> backend, size_t resident_bytes) {
    LoadedBackend b;
    b.object = std::move(backend);
    b.type = typeid(T);
    b.resident_bytes = resident_bytes;
    return b;
  }
};

class ArbiterHandle;

struct CapabilityRegistration {
  Capability capability = Capability::kText;
  // Empty → DefaultRoleFor(capability).
  std::optional<ResidentRole> resident_role;
  // Charged to the ledger while a load is in flight and until the measured
  // size is known; used by evict-to-fit and preload.
  size_t estimated_bytes = 0;
  // Optional per-model estimate; when set it replaces estimated_bytes.
  std::function<size_t(const std::string& model_key)> estimate_bytes;
  // Ledger kind of the resident charge (kDeviceWeights or kOther).
  ChargeKind charge_kind = ChargeKind::kDeviceWeights;
  // Optional per-model kind (a capability serving built-in engines and
  // measured backends), same calling rules as role_for; an empty result
  // keeps charge_kind.
  std::function<std::optional<ChargeKind>(const std::string& model_key)> charge_kind_for;
  // Optional per-model memory domain (Note [Memory domains] in
  // memory_ledger.h): every charge of the entry — the estimate while it
  // loads, the resident charge and its charge_parts — is made there, and
  // the entry is a holder of that domain for the reclaim policy (ReclaimIdle
  // / EvictIdleByPriority / NextFitVictim of a device domain pick only its
  // holders). Same calling rules as role_for; empty (or no callable): the
  // host. REQUIRES: a domain of the arbiter's ledger.
  std::function<std::optional<MemoryDomain>(const std::string& model_key)> domain_for;
  // Optional per-model role (e.g. [[models]] role = "..."): called once per
  // model key, under the arbiter lock (must not call the arbiter); an empty
  // result keeps the capability's role.
  std::function<std::optional<ResidentRole>(const std::string& model_key)> role_for;
  // Unload an idle (refcount 0) entry of this capability once it has been
  // unused for this long (arbiter clock; docs/memory-arbiter.md, fixed
  // defect 8). Empty = never (default).
  std::optional<int64_t> idle_ttl_ms;
  // Optional per-model idle TTL, same calling rules as role_for; an empty
  // result keeps idle_ttl_ms.
  std::function<std::optional<int64_t>(const std::string& model_key)> idle_ttl_for;
  // As in the reference, loading swaps out another resident entry of the
  // same role first (reason "swap"). false lets several keys of the role
  // coexist within the budget.
  bool swap_same_role = true;
  // Optional per-model swap_same_role (e.g. [[models]] same_role), same
  // calling rules as role_for; an empty result keeps swap_same_role.
  std::function<std::optional<bool>(const std::string& model_key)> swap_same_role_for;
  // Model keys known up front: listed by Stats() before their first acquire.
  std::vector<std::string> model_keys;
  // REQUIRED. Runs without a lock on the first acquirer's thread; may take
  // seconds. An error (or exception) fails every waiter of this load with the
  // message prefixed `model "KEY" failed to load: `; the next acquire retries.
  std::function<Result<LoadedBackend>(const std::string& model_key)> load;
  // Optional. Called once per successful load when the entry is unloaded
  // (evicted for any reason, unloaded, shut down), without a lock, with the
  // model key and the arbiter's own reference to the backend: the entry is
  // closed (no handle holds it and none can be taken) and its charges are
  // already released. Handles hold no copy of the object, so the callback
  // holds the last reference (unless someone copied backend_object()) and
  // decides when the object goes; it goes at the latest when the callback
  // returns. Exceptions are logged. Without an unload the arbiter drops the
  // object itself.
  std::function<void(const std::string& model_key, LoadedBackend backend)> unload;
  // Optional (required for Request()). Runs one queued request.
  std::function<Result<std::any>(const ArbiterHandle& handle, std::any& request)> run;
  // Request() queue bound per resident key: requests waiting (not the one
  // running) beyond it are refused at once (kResourceExhausted, reason
  // kQueueFull). 0 = unbounded.
  size_t queue_max = 0;
  // Optional per-model bound, same calling rules as role_for; empty keeps
  // queue_max.
  std::function<std::optional<size_t>(const std::string& model_key)> queue_max_for;
};

enum class ModelState {
  kReady,    // not resident, last load (if any) succeeded
  kLoading,  // a load is in flight
  kLoaded,   // resident
  kFailed,   // not resident; the last load failed (error in last_error)
};
// "ready" | "loading" | "loaded" | "failed".
std::string_view ModelStateName(ModelState state);

// Snapshot of one model key (Stats()).
struct ModelStats {
  std::string name;            // model key
  std::string resident_key;    // "<capability>::<model_key>"
  Capability capability = Capability::kText;
  ResidentRole role = ResidentRole::kTextTarget;
  ModelState state = ModelState::kReady;
  size_t bytes = 0;            // measured when ever loaded, else the estimate
  bool bytes_measured = false;
  int refcount = 0;            // live handles
  uint64_t loads = 0;
  uint64_t load_failures = 0;
  uint64_t evictions = 0;      // unloads for any reason but shutdown
  double last_load_ms = 0;
  std::string last_error;
  int queued = 0;              // Request()s waiting in the model's queue (not running)
  bool running = false;        // a queued Request() is running now
  uint64_t runs = 0;           // Request()s run (successful or not)
  uint64_t queue_rejections = 0;  // Request()s refused because the queue was full
  // The entry's idle TTL in force (registration's, or SetIdleTtl's); empty
  // = never reaped for idleness.
  std::optional<int64_t> idle_ttl_ms;
  // Loaded and unheld: arbiter-clock ms since its last use; else 0.
  int64_t idle_ms = 0;
};

struct ArbiterStats {
  size_t budget_bytes = 0;     // 0 = unlimited
  size_t charged_bytes = 0;    // ledger total (this arbiter + other owners)
  size_t resident_bytes = 0;   // Σ bytes of loaded entries
  size_t loading_bytes = 0;    // Σ estimates of in-flight loads
  int resident_models = 0;
  uint64_t loads = 0;
  uint64_t load_failures = 0;
  uint64_t evictions = 0;
  MemoryPressureLevel pressure = MemoryPressureLevel::kNominal;
  std::vector<ModelStats> models;  // registration order, then first use
};

// One loaded entry (ResidentSnapshot()).
struct ResidentEntryInfo {
  std::string resident_key;
  Capability capability = Capability::kText;
  std::string model_key;
  ResidentRole role = ResidentRole::kTextTarget;
  size_t bytes = 0;
  int refcount = 0;
  int64_t loaded_at_ms = 0;
  int64_t last_used_ms = 0;
  MemoryDomain domain;  // where its charges are (CapabilityRegistration::domain_for)
};

enum class UnloadReason { kSwap, kPressure, kShutdown, kFit, kIdle, kManual };
// "swap" | "pressure" | "shutdown" | "fit" | "idle" | "manual" (Unload()).
std::string_view UnloadReasonName(UnloadReason reason);

enum class ArbiterEventType { kModelLoad, kModelUnload, kMemoryPressure, kEviction, kCapabilityRun };
// "model_load" | "model_unload" | "memory_pressure" | "eviction" | "capability_run".
std::string_view ArbiterEventTypeName(ArbiterEventType type);

// One event. Fields not listed for a type keep their defaults.
struct ArbiterEvent {
  ArbiterEventType type = ArbiterEventType::kModelLoad;
  Capability capability = Capability::kText;      // all but memory_pressure
  std::string model_key;                           // all but memory_pressure
  double load_ms = 0;                              // model_load
  double run_ms = 0;                               // capability_run
  UnloadReason reason = UnloadReason::kFit;        // model_unload, eviction
  size_t estimated_bytes = 0;                      // eviction
  MemoryPressureLevel level = MemoryPressureLevel::kNominal;  // memory_pressure
  std::string source;                              // memory_pressure
  std::optional<uint64_t> free_bytes;              // memory_pressure
  int64_t at_ms = 0;                               // arbiter clock
};
using ArbiterEventListener = std::function<void(const ArbiterEvent&)>;

// Keeps an OnEvent() listener registered; unsubscribes on destruction.
// Reset() does not wait for a call of the listener already running on
// another thread (events are delivered outside every lock), so whatever the
// listener captures must outlive it, e.g. through a shared_ptr.
class [[nodiscard]] ArbiterEventSubscription {
 public:
  ArbiterEventSubscription() = default;
  explicit ArbiterEventSubscription(std::function<void()> cancel) : cancel_(std::move(cancel)) {}
  ArbiterEventSubscription(ArbiterEventSubscription&& o) noexcept
      : cancel_(std::exchange(o.cancel_, nullptr)) {}
  ArbiterEventSubscription& operator=(ArbiterEventSubscription&& o) noexcept {
    if (this != &o) {
      Reset();
      cancel_ = std::exchange(o.cancel_, nullptr);
    }
    return *this;
  }
  ArbiterEventSubscription(const ArbiterEventSubscription&) = delete;
  ArbiterEventSubscription& operator=(const ArbiterEventSubscription&) = delete;
  ~ArbiterEventSubscription() { Reset(); }
  void Reset() {
    if (cancel_) std::exchange(cancel_, nullptr)();
  }

 private:
  std::function<void()> cancel_;
};

// Pins one resident entry. Move-only; releases on destruction.
// Thread-compatible. Holds no copy of the backend or the key: it points into
// the arbiter's entry, which cannot be evicted while pinned and is never
// deleted before the arbiter (Note [Fast path] in memory_arbiter.cc).
class ArbiterHandle {
 public:
  ArbiterHandle() = default;
  ArbiterHandle(ArbiterHandle&& other) noexcept;
  ArbiterHandle& operator=(ArbiterHandle&& other) noexcept;
  ArbiterHandle(const ArbiterHandle&) = delete;
  ArbiterHandle& operator=(const ArbiterHandle&) = delete;
  ~ArbiterHandle() { Release(); }

  // True until Release() (or a move from it).
  bool valid() const { return arbiter_ != nullptr; }
  // The model key; still readable after Release() (empty for a default handle).
  const std::string& model() const { return model_ != nullptr ? *model_ : kNoModel; }
  const std::string& model_key() const { return model(); }
  Capability capability() const { return capability_; }
  // The backend object; empty after Release(). Copy it to keep the object
  // alive past the release (it is unloaded when the entry is evicted).
  const std::shared_ptr<void>& backend_object() const {
    return backend_ != nullptr ? backend_->object : kNoBackend;
  }
  // The backend as T; nullptr after Release() or for another type.
  template <typename T>
  T* backend() const {
    return backend_ != nullptr && backend_->type == typeid(T)
               ? static_cast<T*>(backend_->object.get())
               : nullptr;
  }
  // A second handle on the same entry with its own release (every retain is
  // matched by its own release: docs/memory-arbiter.md, fixed defect 3).
  // Errors: kFailedPrecondition `cannot retain cap/key after release`.
  Result<ArbiterHandle> Retain() const;
  // Unpins the entry (it stays resident, evictable). Idempotent.
  void Release();

 private:
  friend class arbiter_internal::MemoryArbiterImpl;
  inline static const std::string kNoModel;
  inline static const std::shared_ptr<void> kNoBackend;
  arbiter_internal::MemoryArbiterImpl* arbiter_ = nullptr;
  // The pinned entry, stable for the arbiter's life.
  arbiter_internal::Entry* entry_ = nullptr;
  const std::string* model_ = nullptr;       // the entry's model key (immutable)
  const LoadedBackend* backend_ = nullptr;   // the entry's backend; null after Release()
  Capability capability_ = Capability::kText;
};

struct MemoryArbiterOptions {
  // Used only when `ledger` is null: the budget of the arbiter's own ledger
  // (0 = unlimited).
  size_t budget_bytes = 0;
  // The one byte budget shared with other layers; null → an owned ledger.
  MemoryLedger* ledger = nullptr;
  Clock* clock = nullptr;                          // null → Clock::Real()
  MemoryPressureSource* pressure_source = nullptr; // subscribed by Start()
  VisionEmbeddingCache* vision_cache = nullptr;    // purged under pressure
  // Real-time bound on a swap's wait for the old entry to drain (real time,
  // not the injected clock: docs/memory-arbiter.md, fixed defect 6). The
  // reference's value.
  int64_t drain_timeout_ms = 10000;
  // Real-time bound on Shutdown()'s wait for loads and held handles.
  int64_t shutdown_timeout_ms = 10000;
  // Real-time period of the idle-TTL reaper started by Start(); 0 = no thread
  // (call ReapIdle() yourself).
  int64_t idle_check_interval_ms = 1000;
  // false (reference): evict-to-fit is best effort and the load proceeds.
  // true: refuse (kResourceExhausted, nothing evicted) when the load cannot
  // fit even after evicting every idle victim while something is held or
  // loading. See Note [Refusing over budget] in memory_arbiter.cc.
  bool refuse_over_budget = false;
  // Real-time bound on a queued request's acquire.
  int64_t request_acquire_timeout_ms = 60000;
  // Who gives memory back when a load needs room (the runtime's reclaim
  // policy; Note [Reclaim through a Reclaimer] in memory_arbiter.cc). Null:
  // the arbiter evicts idle entries to fit by itself. Must outlive the
  // arbiter.
  Reclaimer* reclaimer = nullptr;
};

class MemoryArbiter {
 public:
  explicit MemoryArbiter(MemoryArbiterOptions options = {});
  // Shutdown() (bounded) then joins every thread.
  ~MemoryArbiter();
  MemoryArbiter(const MemoryArbiter&) = delete;
  MemoryArbiter& operator=(const MemoryArbiter&) = delete;

  // Errors: kAlreadyExists `capability "X" is already registered`,
  // kInvalidArgument (no load callable).
  Status RegisterCapability(CapabilityRegistration registration);

  // Pins capability::model_key, loading it if needed. Checks, in order:
  //   kNotFound     `no capability registered for "X"`
  //   kUnavailable  `arbiter is shutting down; cannot acquire X`
  //   kUnavailable  `memory pressure is critical; refusing to load
  //                 capability "X". Free RAM and retry.` (non-text only)
  // then load-or-reuse, which may fail with
  //   kDeadlineExceeded `timeout waiting for cap/key to drain (refcount=N);
  //                 refusing to swap mid-flight` (drain_timeout_ms), or when
  //                 `deadline` passes while waiting for a load or a drain;
  //   kResourceExhausted (only with options.refuse_over_budget) when the
  //                 load cannot fit while other entries are held or loading;
  //   the load's error prefixed `model "KEY" failed to load: `.
  // The thread that runs a load is not bounded by `deadline`.
  Result<ArbiterHandle> Acquire(Capability capability, std::string_view model_key,
                                ArbiterDeadline deadline);

  // Loads without pinning (refcount stays 0). Returns false (declines) when
  // shutting down, pressure is not nominal, there is no budget, the estimate
  // is 0, it would not fit, or another entry of the role is resident or
  // loading (preload never evicts: docs/memory-arbiter.md, fixed defect 7).
  // True when already resident (touches last-used) or loaded now. A measured
  // size above the estimate may leave the footprint over budget until the
  // next acquire evicts to fit.
  // The load runs on the calling thread.
  bool Preload(Capability capability, std::string_view model_key);

  // Unloads capability::model_key on request (POST /admin/models/X/unload)
  // with reason "manual". Waits until `deadline` for a load in flight to end
  // and for every handle to be released. Returns true when it unloaded the
  // entry, false when it was not resident.
  // Errors: kNotFound `no capability registered for "X"`;
  //   kDeadlineExceeded `X is held by N handle(s); not unloaded` or
  //   `X is still loading; not unloaded`.
  Result<bool> Unload(Capability capability, std::string_view model_key,
                      ArbiterDeadline deadline);

  // Mechanism for a reclaim policy ("a charge needs room"): evicts idle
  // entries with reason "fit", least recently used first, one at a time,
  // until charged + `bytes` ≤ budget (bytes = 0: until within the budget)
  // or no idle victim is left (held and text-target entries are never
  // victims). Unload callables run before it returns. Returns the bytes of
  // the entries evicted (their own charges; whatever their unload frees
  // elsewhere comes on top); `evicted` (may be null) receives how many.
  size_t ReclaimIdle(size_t bytes, size_t* evicted = nullptr) {
    return ReclaimIdle(kHostDomain, bytes, evicted);
  }
  // The same for room in `domain`: for the host, every idle entry is a
  // victim (a device model's unload frees its host floor and host-side
  // state too) and the host budget is the one checked; for a device domain,
  // only the idle entries charged there (domain_for), until charged + `bytes`
  // ≤ that domain's budget.
  size_t ReclaimIdle(MemoryDomain domain, size_t bytes, size_t* evicted = nullptr);

  // Queues one run: acquire → run → capability_run event → release, on the
  // resident key's worker thread, FIFO, one at a time per key (keys run
  // concurrently). The future holds the run's result or any acquire error;
  // an error fails only this request. A stop requested before the run
  // starts → kCancelled (such items stop counting against the bound at
  // once). A full queue (the registration's queue_max) → kResourceExhausted
  // with reason kQueueFull, at once. The run itself may observe `stop`
  // through its payload.
  std::future<Result<std::any>> Request(Capability capability, std::string model_key,
                                        std::any payload, std::stop_token stop = {});

  ArbiterEventSubscription OnEvent(ArbiterEventListener listener);

  // A loaded entry's size measured again (a backend that grew during its
  // first run, a child process's RSS): its main charge is resized without
  // refusal (parts charged by kind stay), and its bytes become `bytes`
  // (measured). Evicts nothing: the caller asks its reclaim policy for room
  // when the ledger is now over budget. Returns false (nothing changed) when
  // the entry is not loaded. Errors: kNotFound for an unregistered
  // capability.
  Result<bool> UpdateResidentBytes(Capability capability, std::string_view model_key,
                                   size_t bytes);

  // Starts and subscribes to the pressure source (its replayed event is
  // handled like any other) and the idle reaper. Idempotent.
  // Errors: kFailedPrecondition `cannot start after shutdown`; the source's
  // Start() error.
  Status Start();
  // Unsubscribes, stops the source and the reaper. Evicts nothing.
  void Stop();
  // Refuses new acquires, waits (shutdown_timeout_ms) for loads in flight and
  // held handles, then unloads every entry with reason "shutdown". A load
  // finishing later, or a handle released later, unloads at once: nothing is
  // resident after the last handle is gone. Idempotent.
  void Shutdown();

  // Applies a pressure event (what the subscription calls): the reference's
  // response for an arbiter used alone — SetPressureLevel, then low evicts
  // the lowest-priority idle entry and critical every idle non-text-target
  // one (EvictIdleByPriority), then purges the vision cache. The runtime
  // does not subscribe the arbiter; its reclaim policy calls the mechanisms
  // below in its own order (Note [Reclaim order] in
  // runtime/reclaim_policy.h).
  void HandlePressure(const MemoryPressureEvent& event);

  // Mechanisms for a reclaim policy. Each runs its unload callables (and
  // their events) before returning; none is called under an arbiter lock.
  //
  // Records the pressure level — critical refuses new non-text acquires
  // until the level drops — and emits the memory_pressure event. Evicts
  // nothing.
  void SetPressureLevel(const MemoryPressureEvent& event);
  // Evicts up to `max_entries` idle (refcount 0) entries that are not text
  // targets, lowest role priority first, least recently used within a role,
  // with `reason`. Returns how many were evicted.
  size_t EvictIdleByPriority(size_t max_entries, UnloadReason reason) {
    return EvictIdleByPriority(kHostDomain, max_entries, reason);
  }
  // The same among the victims of `domain` (as ReclaimIdle: the host's are
  // every entry, a device's only those charged there).
  size_t EvictIdleByPriority(MemoryDomain domain, size_t max_entries, UnloadReason reason);
  // The entry ReclaimIdle would evict next (least recently used idle entry
  // that is not a text target), or nullopt; per domain as ReclaimIdle.
  std::optional<ResidentEntryInfo> NextFitVictim() const { return NextFitVictim(kHostDomain); }
  std::optional<ResidentEntryInfo> NextFitVictim(MemoryDomain domain) const;
  // Unloads idle entries whose registration has an idle TTL that expired.
  // Returns how many.
  size_t ReapIdle();
  // Replaces capability::model_key's idle TTL from now on (the entry is
  // created, unloaded, when it was never used): empty = never reaped; 0 =
  // reaped by the next sweep once no handle holds it. Errors: kNotFound `no
  // capability registered for "X"`, kInvalidArgument for a negative TTL.
  Status SetIdleTtl(Capability capability, std::string_view model_key,
                    std::optional<int64_t> ttl_ms);

  std::vector<ResidentEntryInfo> ResidentSnapshot() const;
  MemoryPressureLevel CurrentPressureLevel() const;
  ArbiterStats Stats() const;
  size_t budget_bytes() const;
  MemoryLedger* ledger() const;

 private:
  std::unique_ptr<arbiter_internal::MemoryArbiterImpl> impl_;
};

}  // namespace arbiter
