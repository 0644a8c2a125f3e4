// arbiter/runtime/snapshots.h — the runtime's own snapshot structs for the
// weight cache and the KV precaches, as /admin/status, /admin/kv and
// /metrics show them.
//
// Runtime::Status() and Runtime::Kv() fill these from the weights and kv
// layers' stats at the time of the call; the edge serializes them and never
// sees WeightCacheStats or KvPrecacheCounters (stats are structs first, and
// the runtime decides which of them it reports). Field names, meanings and
// units are those of the layer's stats they copy (weights/weight_cache.h,
// kv/precache.h).
//
// Thread safety: plain values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "arbiter/memory/memory_pool.h"
#include "arbiter/runtime/vocabulary.h"

namespace arbiter {

// One model's weights in the weight cache.
struct WeightModelStatus {
  std::string key;
  ResidencyState residency = ResidencyState::kUnpinned;
  bool device_resident = false;
  bool host_resident = false;      // a host floor is held
  bool loading = false;
  size_t weight_bytes = 0;         // Σ the model's weight tensors: its budget unit
  size_t device_bytes = 0;         // the device block (aligned) when resident
  size_t host_bytes = 0;           // the floor's mapped bytes when held
  int leases = 0;
  uint64_t loads = 0;
  uint64_t evicts = 0;
  WeightLoadSource last_load_source = WeightLoadSource::kNone;
  double last_load_seconds = 0;
  std::string floor_region;        // shared floor region name, else empty
};

// The weight cache as a whole; `pool` is the device arena.
struct WeightCacheStatus {
  ResidencyMode mode = ResidencyMode::kSelfManaged;
  // The current budget solution.
  size_t scratch_ceiling_bytes = 0;   // arena minus the wiggle reserve
  size_t weight_pool_bytes = 0;       // bytes for all weights, pinned included
  bool pinned_over_commit = false;    // pinned weights alone exceed the pool
  size_t max_bytes = 0;               // the on-demand (LRU) budget
  size_t resident_bytes = 0;          // device bytes of non-device-pinned models
  size_t pinned_bytes = 0;            // device bytes of device-pinned models
  size_t host_bytes = 0;              // Σ host floors' mapped bytes
  size_t max_scratch_bytes = 0;
  uint64_t loads = 0;
  uint64_t evicts = 0;                // device copies freed (any reason but shutdown)
  uint64_t compactions = 0;
  double load_seconds = 0;            // Σ load wall time
  uint64_t oversize_loads = 0;        // loads larger than the whole budget
  MemoryPoolStats pool;
  std::vector<WeightModelStatus> models;  // registration order
};

// One text model's KV precache counters, since start.
struct KvCountersStatus {
  uint64_t requests = 0;
  uint64_t prompt_tokens = 0;
  uint64_t cached_tokens = 0;
  uint64_t copied_tokens = 0;       // of cached_tokens: copied from another slot
  uint64_t slot_hits = 0;           // requests served (partly) from their slot's KV
  uint64_t prompt_cache_hits = 0;   // restores from the host tier
  uint64_t disk_hits = 0;           // restores from the disk tier
  uint64_t restore_failures = 0;    // corrupt / foreign / unreadable files (cold prefill)
  uint64_t stashes = 0;             // slot → host tier moves
  uint64_t persisted = 0;           // files written (close, idle, unload, shutdown)
  uint64_t prewarms = 0;
  uint64_t prewarm_failures = 0;
  uint64_t keepalive_rewarms = 0;
};

}  // namespace arbiter
