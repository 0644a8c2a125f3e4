// Serializers: the Runtime's snapshot structs → the JSON bodies of
// /admin/status, /admin/kv and the admin actions (docs/http-api.md). They
// only turn structs into JSON; nothing here reads live state.
//
// Thread safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>

#include "arbiter/runtime/runtime.h"

namespace arbiter::server_internal {

// One model: the arbiter's fields, the weights' fields when it has a weight
// cache entry, and "ready".
nlohmann::json ModelStatusJson(const ModelStatus& model);
// GET /admin/status (plus the server's own "event_streams").
nlohmann::json RuntimeStatusJson(const RuntimeStatus& status, size_t event_streams);
// GET /admin/kv.
nlohmann::json KvStatusJson(const KvStatus& kv);

}  // namespace arbiter::server_internal
