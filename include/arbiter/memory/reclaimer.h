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
// Room is asked for in a memory domain (Note [Memory domains] in
// memory_ledger.h): the host by default, or the device domain a charge
// goes to.
//
// Thread safety: implementations are thread-safe.
#pragma once

#include <cstddef>
#include <functional>
#include <utility>

#include "arbiter/memory/memory_ledger.h"

namespace arbiter {

class Reclaimer {
 public:
  virtual ~Reclaimer() = default;

  // Frees memory until a charge of `bytes` fits in `domain` — under every
  // budget MemoryLedger::Shortfalls(domain, bytes) names: the domain's own
  // and, for a domain inside the host, the host's (bytes = 0: until those
  // budgets hold their charges) — or until nothing more can be freed.
  // Returns the ledger bytes it released in the domain that was short
  // (0: nothing could be freed).
  // REQUIRES: the caller holds none of its own locks (the call runs unload
  // callables, file IO for a spill, and calls back into the caller's
  // component); `domain` is one of the ledger's. May take seconds.
  virtual size_t MakeRoom(MemoryDomain domain, size_t bytes) = 0;
  // The host domain's form (what every charge made room for before device
  // domains existed).
  size_t MakeRoom(size_t bytes) { return MakeRoom(kHostDomain, bytes); }
};

// A Reclaimer over a callable, for tests and simple wiring.
class FunctionReclaimer final : public Reclaimer {
 public:
  // Room in any domain.
  explicit FunctionReclaimer(std::function<size_t(MemoryDomain, size_t)> fn)
      : fn_(std::move(fn)) {}
  // Room in the host only: a device domain's request frees nothing.
  explicit FunctionReclaimer(std::function<size_t(size_t)> host_fn)
      : fn_([f = std::move(host_fn)](MemoryDomain d, size_t bytes) -> size_t {
          return f && d.is_host() ? f(bytes) : 0;
        }) {}
  using Reclaimer::MakeRoom;
  size_t MakeRoom(MemoryDomain domain, size_t bytes) override {
    return fn_ ? fn_(domain, bytes) : 0;
  }

 private:
  std::function<size_t(MemoryDomain, size_t)> fn_;
};

}  // namespace arbiter
