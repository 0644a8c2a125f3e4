// arbiter/arbiter/memory_arbiter.h — the MemoryArbiter (minimal): one
// registry of models, loaded on first use, kept warm, evicted LRU under one
// byte budget, pinned by RAII handles while in use.
//
// Implements the load-or-reuse, single-flight and evict-to-fit parts of the
// Memory Arbiter seed (reference/seed-arbiter-and-precache.md Part 1, §1.3).
// Roles, swaps, pressure, events and request queues are later issues.
//
// Concepts:
//   - A model is registered once (ModelRegistration): a name (the model key),
//     a capability (text | embedding), an estimated size in bytes and a load
//     callable producing a backend (type-erased; e.g. std::shared_ptr<Engine>).
//   - Acquire(capability, name, deadline) returns an ArbiterHandle that pins
//     the model: a pinned (refcount > 0) model is never evicted. The first
//     acquire of a non-resident model runs its load; concurrent acquirers of
//     the same model wait for that one load (single-flight).
//   - Budget: before a load, idle models are evicted least-recently-used first
//     until resident + loading + incoming ≤ budget. See Note [Over budget] in
//     memory_arbiter.cc for what happens when that is impossible.
//   - After a load the estimate is replaced with the measured size reported
//     by the load callable (for the engine: weight_bytes + kv_bytes).
//
// Example:
//   MemoryArbiter arbiter({.budget_bytes = 2ull << 30});
//   ARBITER_RETURN_IF_ERROR(arbiter.Register({
//       .name = "demo-chat", .capability = Capability::kText,
//       .estimated_bytes = 300 << 20,
//       .load = [] () -> Result<LoadedBackend> { ... }}));
//   ARBITER_ASSIGN_OR_RETURN(ArbiterHandle h,
//       arbiter.Acquire(Capability::kText, "demo-chat", Deadline(30s)));
//   Engine* engine = h.backend<Engine>();
//   ...                                   // h releases on scope exit
//
// Thread safety: MemoryArbiter is thread-safe. ArbiterHandle is
// thread-compatible (one owner; move it, don't share it).
// Lifetime: the arbiter must outlive every handle it returned.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <typeindex>
#include <typeinfo>
#include <vector>

#include "arbiter/base/clock.h"
#include "arbiter/base/mutex.h"
#include "arbiter/base/status.h"

namespace arbiter {

enum class Capability { kText, kEmbedding };
// "text" | "embedding".
std::string_view CapabilityName(Capability capability);
// Parses "text" | "embedding"; kInvalidArgument otherwise.
Result<Capability> ParseCapability(std::string_view name);

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
  // Bytes the backend holds once loaded; 0 → keep the registration estimate.
  size_t resident_bytes = 0;

  template <typename T>
  static LoadedBackend Of(std::shared_ptr<T> backend, size_t resident_bytes) {
    LoadedBackend b;
    b.object = std::move(backend);
    b.type = typeid(T);
    b.resident_bytes = resident_bytes;
    return b;
  }
};

struct ModelRegistration {
  std::string name;                        // model key; unique, non-empty
  Capability capability = Capability::kText;
  size_t estimated_bytes = 0;              // charge before the first load
  // Called without any arbiter lock held, on the thread of the first
  // acquirer; may take seconds. An error fails every waiter of this load and
  // is remembered (reported by Stats()) until the next successful load.
  std::function<Result<LoadedBackend>()> load;
};

enum class ModelState {
  kReady,    // registered, not resident, last load (if any) succeeded
  kLoading,  // a load is in flight
  kLoaded,   // resident
  kFailed,   // not resident; the last load failed (error in last_error)
};
// "ready" | "loading" | "loaded" | "failed".
std::string_view ModelStateName(ModelState state);

// Snapshot of one model.
struct ModelStats {
  std::string name;
  Capability capability = Capability::kText;
  ModelState state = ModelState::kReady;
  size_t bytes = 0;            // measured when ever loaded, else the estimate
  bool bytes_measured = false;
  int refcount = 0;            // live handles
  uint64_t loads = 0;          // successful loads
  uint64_t load_failures = 0;
  uint64_t evictions = 0;
  double last_load_ms = 0;
  std::string last_error;      // of the last failed load; empty otherwise
};

// Snapshot of the arbiter (Stats()).
struct ArbiterStats {
  size_t budget_bytes = 0;     // 0 = unlimited
  size_t resident_bytes = 0;   // Σ bytes of loaded models
  size_t loading_bytes = 0;    // Σ estimates of in-flight loads
  int resident_models = 0;
  uint64_t loads = 0;
  uint64_t load_failures = 0;
  uint64_t evictions = 0;
  std::vector<ModelStats> models;  // in registration order
};

class MemoryArbiter;

// Pins one resident model. Move-only; releases on destruction.
// Thread-compatible.
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
  const std::string& model() const { return model_; }
  Capability capability() const { return capability_; }
  // The backend object; nullptr after Release().
  const std::shared_ptr<void>& backend_object() const { return backend_; }
  // The backend as T; nullptr after Release() or when the backend was not
  // produced as LoadedBackend::Of<T>.
  template <typename T>
  T* backend() const {
    return backend_ && type_ == typeid(T) ? static_cast<T*>(backend_.get()) : nullptr;
  }
  // Unpins the model (it stays resident, evictable). Idempotent.
  void Release();

 private:
  friend class MemoryArbiter;
  MemoryArbiter* arbiter_ = nullptr;
  std::string model_;
  Capability capability_ = Capability::kText;
  std::shared_ptr<void> backend_;
  std::type_index type_ = typeid(void);
};

struct MemoryArbiterOptions {
  size_t budget_bytes = 0;  // 0 = unlimited
  Clock* clock = nullptr;   // for load timings; nullptr → Clock::Real()
};

class MemoryArbiter {
 public:
  explicit MemoryArbiter(MemoryArbiterOptions options = {});
  // REQUIRES: no handle outstanding. Drops every resident backend.
  ~MemoryArbiter();
  MemoryArbiter(const MemoryArbiter&) = delete;
  MemoryArbiter& operator=(const MemoryArbiter&) = delete;

  // Errors: kAlreadyExists (name taken: `model "x" is already registered`),
  // kInvalidArgument (empty name or no load callable).
  Status Register(ModelRegistration registration);

  // Pins `name`, loading it first if it is not resident. Blocks while a load
  // of it is in flight (until `deadline`).
  // Errors:
  //   kNotFound          not registered (`model "x" not found`)
  //   kInvalidArgument   registered with another capability
  //   kUnavailable       Shutdown() was called
  //   kResourceExhausted the budget cannot make room (message names the
  //                      model, its size, the budget, and what is held)
  //   kDeadlineExceeded  the deadline passed while waiting for another
  //                      thread's load (the load itself continues)
  //   any error of the load callable, with its code and the message
  //   prefixed `model "NAME" failed to load: `, to every waiter of that
  //   load; the next Acquire retries.
  // The thread that runs a load is not bounded by `deadline`.
  Result<ArbiterHandle> Acquire(Capability capability, std::string_view name,
                                ArbiterDeadline deadline);

  // Stops new acquires (kUnavailable) and unloads every idle model. Models
  // still pinned stay until their handles release. Idempotent.
  void Shutdown();

  ArbiterStats Stats() const;
  size_t budget_bytes() const { return budget_bytes_; }

 private:
  friend class ArbiterHandle;
  struct Entry;

  void ReleaseRef(const std::string& name);
  // Increments the refcount of a kLoaded entry, marks it most recently used
  // and returns a handle to it.
  ArbiterHandle PinLocked(Entry* e) REQUIRES(mu_);
  // Picks idle LRU victims (never `except`) until resident + loading +
  // incoming ≤ budget, moving their backends into `graveyard`. Returns
  // whether it now fits.
  bool EvictToFitLocked(size_t incoming, const Entry* except,
                        std::vector<std::shared_ptr<void>>* graveyard,
                        std::vector<std::string>* evicted) REQUIRES(mu_);
  std::string DescribeHeldLocked() const REQUIRES(mu_);

  const size_t budget_bytes_;
  Clock* const clock_;

  mutable Mutex mu_;
  CondVar load_done_;  // signalled whenever a load finishes
  std::map<std::string, std::unique_ptr<Entry>, std::less<>> entries_ GUARDED_BY(mu_);
  std::vector<Entry*> order_ GUARDED_BY(mu_);  // registration order
  size_t resident_bytes_ GUARDED_BY(mu_) = 0;
  size_t loading_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t use_seq_ GUARDED_BY(mu_) = 0;  // LRU clock: bumped per acquire
  uint64_t loads_ GUARDED_BY(mu_) = 0;
  uint64_t load_failures_ GUARDED_BY(mu_) = 0;
  uint64_t evictions_ GUARDED_BY(mu_) = 0;
  bool shutting_down_ GUARDED_BY(mu_) = false;
};

}  // namespace arbiter
