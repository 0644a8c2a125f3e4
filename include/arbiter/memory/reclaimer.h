// arbiter/memory/reclaimer.h — how a component that needs room in the
// MemoryLedger asks for it, without knowing who gives memory back.
//
// The MemoryArbiter (before it charges a model's load) and the WeightCache
// (before it charges device weights or a host floor) hold a Reclaimer*. The
// runtime's ReclaimPolicy implements it (runtime/reclaim_policy.h, Note
// [Reclaim order]): it decides in one place what is given back first —
// expired cache entries, the prompt cache, idle models, idle device
// weights. The components only expose mechanisms; the order is the policy's.
//
// Thread safety: implementations are thread-safe.
#pragma once

#include <cstddef>
#include <functional>

namespace arbiter {

class Reclaimer {
 public:
  virtual ~Reclaimer() = default;

  // Frees memory until charged + `bytes` ≤ the ledger's budget (bytes = 0:
  // until the ledger is within its budget), or until nothing more can be
  // freed. Returns the ledger bytes it released (0: nothing could be freed).
  // REQUIRES: the caller holds none of its own locks (the call runs unload
  // callables, file IO for a spill, and calls back into the caller's
  // component). May take seconds.
  virtual size_t MakeRoom(size_t bytes) = 0;
};

// A Reclaimer over a callable, for tests and simple wiring.
class FunctionReclaimer final : public Reclaimer {
 public:
  explicit FunctionReclaimer(std::function<size_t(size_t)> fn) : fn_(std::move(fn)) {}
  size_t MakeRoom(size_t bytes) override { return fn_ ? fn_(bytes) : 0; }

 private:
  std::function<size_t(size_t)> fn_;
};

}  // namespace arbiter
