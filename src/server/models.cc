// [[models]] → MemoryArbiter registrations backed by the Engine; see models.h
// for the lazy-load policy.
#include "arbiter/server/models.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "arbiter/base/size.h"
#include "arbiter/engine/engine.h"
#include "arbiter/formats/model_config.h"
#include "arbiter/formats/safetensors.h"

namespace arbiter {
namespace {

namespace fs = std::filesystem;

// The startup check: EstimateModelBytes, plus Engine::Validate (tokenizer.json
// parses, every tensor the architecture needs is present with its shape;
// headers only), so a broken model shows in the startup log and /v1/models
// as failed rather than only on the first request.
Result<size_t> StartupCheck(const ModelEntry& entry) {
  ARBITER_ASSIGN_OR_RETURN(size_t bytes, EstimateModelBytes(entry));
  ARBITER_RETURN_IF_ERROR(Engine::Validate(entry.path).WithPrefix(entry.path));
  return bytes;
}

}  // namespace

Result<size_t> EstimateModelBytes(const ModelEntry& entry) {
  std::error_code ec;
  if (!fs::is_directory(entry.path, ec)) {
    return NotFoundError(fmt::format("model directory {} does not exist or is not a directory",
                                     entry.path));
  }
  const std::string config_path = (fs::path(entry.path) / "config.json").string();
  ARBITER_ASSIGN_OR_RETURN(ModelConfig cfg, LoadModelConfig(config_path));
  const std::string tokenizer_path = (fs::path(entry.path) / "tokenizer.json").string();
  if (!fs::is_regular_file(tokenizer_path, ec)) {
    return NotFoundError(fmt::format("{} is missing", tokenizer_path));
  }
  ARBITER_ASSIGN_OR_RETURN(SafetensorsModel weights, SafetensorsModel::Open(entry.path));
  size_t weight_bytes = 0;
  for (const TensorInfo* t : weights.tensors()) {
    weight_bytes += static_cast<size_t>(t->num_elements()) * sizeof(float);
  }
  const size_t ctx = static_cast<size_t>(std::min(entry.ctx, cfg.max_position_embeddings));
  const size_t kv_bytes = static_cast<size_t>(entry.parallel) * cfg.num_hidden_layers * 2 * ctx *
                          cfg.num_key_value_heads * cfg.head_dim * sizeof(float);
  return weight_bytes + kv_bytes;
}

Result<LoadedBackend> LoadEngineModel(const ModelEntry& entry) {
  // The cheap check first: its errors are clearer than a load's, and a
  // model fixed on disk since startup loads on the next request.
  ARBITER_RETURN_IF_ERROR(EstimateModelBytes(entry).status());
  EngineOptions options;
  options.n_ctx = entry.ctx;
  options.n_slots = entry.parallel;
  Result<std::unique_ptr<Engine>> loaded = Engine::Load(entry.path, options);
  if (!loaded.ok()) {
    // Some loader errors name only the file ("model.safetensors: tensor
    // ... has shape ..."); say which model directory.
    const Status& st = loaded.status();
    if (st.message().find(entry.path) != std::string::npos) return st;
    return Status(st.code(), fmt::format("{}: {}", entry.path, st.message()));
  }
  std::unique_ptr<Engine> engine = std::move(loaded).value();
  const size_t bytes = engine->weight_bytes() + engine->kv_bytes();
  return LoadedBackend::Of(std::shared_ptr<Engine>(std::move(engine)), bytes);
}

CapabilityRegistration EngineCapabilityRegistration(
    Capability capability, const std::vector<ModelEntry>& entries,
    const std::map<std::string, size_t>& estimated_bytes) {
  auto models = std::make_shared<std::map<std::string, ModelEntry>>();
  auto estimates = std::make_shared<std::map<std::string, size_t>>(estimated_bytes);
  CapabilityRegistration r;
  r.capability = capability;
  // Several configured models of one capability stay resident together
  // (budget permitting) until [[models]] roles are configurable.
  r.swap_same_role = false;
  for (const ModelEntry& e : entries) {
    if (e.capability != capability) continue;
    models->emplace(e.name, e);
    r.model_keys.push_back(e.name);
  }
  r.estimate_bytes = [estimates](const std::string& key) -> size_t {
    auto it = estimates->find(key);
    return it == estimates->end() ? 0 : it->second;
  };
  // [[models]] role / idle_ttl: called under the arbiter lock, so they only
  // read the immutable map.
  r.role_for = [models](const std::string& key) -> std::optional<ResidentRole> {
    auto it = models->find(key);
    return it == models->end() ? std::nullopt : it->second.role;
  };
  r.idle_ttl_for = [models](const std::string& key) -> std::optional<int64_t> {
    auto it = models->find(key);
    return it == models->end() ? std::nullopt : it->second.idle_ttl_ms;
  };
  r.load = [models](const std::string& key) -> Result<LoadedBackend> {
    auto it = models->find(key);
    if (it == models->end()) return NotFoundError(fmt::format("model \"{}\" not found", key));
    return LoadEngineModel(it->second);
  };
  return r;
}

Status RegisterConfiguredModels(const Config& config, MemoryArbiter* arbiter) {
  std::vector<std::string> broken;
  std::map<std::string, size_t> estimates;
  for (const ModelEntry& m : config.models) {
    Result<size_t> estimate = StartupCheck(m);
    estimates[m.name] = estimate.ok() ? *estimate : 0;
    if (estimate.ok()) {
      spdlog::info("model \"{}\" ({}, {}): {} estimated, parallel {}, ctx {}", m.name,
                   CapabilityName(m.capability), m.path, FormatSize(*estimate), m.parallel, m.ctx);
    } else {
      spdlog::error("model \"{}\" ({}) is broken and will not serve: {}", m.name, m.path,
                    estimate.status().message());
      broken.push_back(m.name);
    }
  }
  for (Capability cap : {Capability::kText, Capability::kEmbedding}) {
    CapabilityRegistration r = EngineCapabilityRegistration(cap, config.models, estimates);
    if (r.model_keys.empty()) continue;
    ARBITER_RETURN_IF_ERROR(arbiter->RegisterCapability(std::move(r)));
  }
  // Record the failures in the arbiter (its load re-runs the cheap check and
  // fails fast), so /v1/models shows them as failed with their error.
  for (const std::string& name : broken) {
    const ModelEntry* m = nullptr;
    for (const ModelEntry& e : config.models) {
      if (e.name == name) m = &e;
    }
    auto h = arbiter->Acquire(m->capability, name, Deadline(std::chrono::seconds(60)));
    (void)h;
  }
  if (config.server.preload) {
    for (const ModelEntry& m : config.models) {
      if (std::find(broken.begin(), broken.end(), m.name) != broken.end()) continue;
      auto h = arbiter->Acquire(m.capability, m.name,
                                Deadline(std::chrono::seconds(config.server.acquire_timeout_s)));
      if (!h.ok()) {
        spdlog::error("preload of model \"{}\" failed: {}", m.name, h.status().message());
      }
    }
  }
  return OkStatus();
}

}  // namespace arbiter
