// The runtime's snapshot structs from the layers' stats
// (runtime/internal/snapshots.h).
#include "runtime/internal/snapshots.h"

namespace arbiter::runtime_internal {

WeightModelStatus WeightModelStatusOf(const WeightModelStats& s) {
  WeightModelStatus out;
  out.key = s.key;
  out.residency = s.residency;
  out.device_resident = s.device_resident;
  out.host_resident = s.host_resident;
  out.loading = s.loading;
  out.weight_bytes = s.weight_bytes;
  out.device_bytes = s.device_bytes;
  out.host_bytes = s.host_bytes;
  out.leases = s.leases;
  out.loads = s.loads;
  out.evicts = s.evicts;
  out.last_load_source = s.last_load_source;
  out.last_load_seconds = s.last_load_seconds;
  out.floor_region = s.floor_region;
  return out;
}

WeightCacheStatus WeightCacheStatusOf(const WeightCacheStats& s) {
  WeightCacheStatus out;
  out.mode = s.mode;
  out.scratch_ceiling_bytes = s.budget.scratch_ceiling_bytes;
  out.weight_pool_bytes = s.budget.weight_pool_bytes;
  out.pinned_over_commit = s.budget.pinned_over_commit;
  out.max_bytes = s.max_bytes;
  out.resident_bytes = s.resident_bytes;
  out.pinned_bytes = s.pinned_bytes;
  out.host_bytes = s.host_bytes;
  out.max_scratch_bytes = s.max_scratch_bytes;
  out.loads = s.loads;
  out.evicts = s.evicts;
  out.compactions = s.compactions;
  out.load_seconds = s.load_seconds;
  out.oversize_loads = s.oversize_loads;
  out.pool = s.pool;
  out.models.reserve(s.models.size());
  for (const WeightModelStats& m : s.models) out.models.push_back(WeightModelStatusOf(m));
  return out;
}

KvCountersStatus KvCountersStatusOf(const KvPrecacheCounters& c) {
  KvCountersStatus out;
  out.requests = c.requests;
  out.prompt_tokens = c.prompt_tokens;
  out.cached_tokens = c.cached_tokens;
  out.copied_tokens = c.copied_tokens;
  out.slot_hits = c.slot_hits;
  out.prompt_cache_hits = c.prompt_cache_hits;
  out.disk_hits = c.disk_hits;
  out.restore_failures = c.restore_failures;
  out.stashes = c.stashes;
  out.persisted = c.persisted;
  out.prewarms = c.prewarms;
  out.prewarm_failures = c.prewarm_failures;
  out.keepalive_rewarms = c.keepalive_rewarms;
  return out;
}

}  // namespace arbiter::runtime_internal
