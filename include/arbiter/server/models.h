// arbiter/server/models.h — turning [[models]] entries into MemoryArbiter
// registrations backed by the built-in Engine.
//
// Policy (docs/config.md "Model loading"): models load lazily, on the first
// request that needs them, through the arbiter (one load however many
// requests arrive together; evicted LRU under the budget). At startup each
// model directory is checked cheaply (config.json and tokenizer.json parse,
// safetensors headers are valid); a model that fails the check is
// still registered and immediately marked failed — /v1/models reports the
// error and requests for it get 503 — while the other models serve normally.
// `[server] preload = true` loads every model at startup instead.
//
// Thread safety: pure functions; the load callables are thread-safe.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "arbiter/arbiter/memory_arbiter.h"
#include "arbiter/base/status.h"
#include "arbiter/server/config.h"

namespace arbiter {

// The cheap check (startup also parses tokenizer.json). Returns the
// estimated resident bytes: f32 weights (the engine converts at load) + KV
// caches (parallel × layers × 2 × ctx × kv_heads × head_dim × 4).
// Errors: those of the format readers (kNotFound, kDataLoss, kUnimplemented),
// naming the file.
Result<size_t> EstimateModelBytes(const ModelEntry& entry);

// Loads one model: runs EstimateModelBytes, then Engine::Load with
// n_ctx = ctx, n_slots = parallel (load errors name the model directory). The
// backend is a std::shared_ptr<Engine> (ArbiterHandle::backend<Engine>()); its
// measured size is weight_bytes() + kv_bytes().
Result<LoadedBackend> LoadEngineModel(const ModelEntry& entry);

// The registration of `capability` for every entry of that capability
// (model key = entry name, per-model estimates from `estimated_bytes`);
// swap_same_role is off, so several configured models of one capability may
// stay resident together (the budget still evicts them LRU-first). Each
// entry's `role` and `idle_ttl_ms` reach the arbiter through role_for /
// idle_ttl_for.
CapabilityRegistration EngineCapabilityRegistration(
    Capability capability, const std::vector<ModelEntry>& entries,
    const std::map<std::string, size_t>& estimated_bytes);

// Registers every model of `config` (see the policy above) and, with
// preload, loads them in order. Logs each model's outcome. Returns an error
// only for a registration bug (duplicate name); broken models are not errors.
Status RegisterConfiguredModels(const Config& config, MemoryArbiter* arbiter);

}  // namespace arbiter
