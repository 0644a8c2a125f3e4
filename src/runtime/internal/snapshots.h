// The runtime's snapshot structs (runtime/snapshots.h) from the weights and
// kv layers' stats: field by field, nothing computed.
//
// Thread safety: pure functions.
#pragma once

#include "arbiter/kv/precache.h"
#include "arbiter/runtime/snapshots.h"
#include "arbiter/weights/weight_cache.h"

namespace arbiter::runtime_internal {

WeightModelStatus WeightModelStatusOf(const WeightModelStats& s);
WeightCacheStatus WeightCacheStatusOf(const WeightCacheStats& s);
KvCountersStatus KvCountersStatusOf(const KvPrecacheCounters& c);

}  // namespace arbiter::runtime_internal
