// The KV precache of `arbiter serve` (arbiter/runtime/kv_service.h).
#include "arbiter/runtime/kv_service.h"

#include <filesystem>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "arbiter/base/log_safe.h"
#include "arbiter/base/size.h"
#include "arbiter/engine/engine.h"
#include "arbiter/kv/cache_key.h"
#include "arbiter/runtime/models.h"

namespace arbiter {

namespace fs = std::filesystem;

KvPrecache* ServeKv::Find(std::string_view model) const {
  auto it = precaches.find(model);
  return it == precaches.end() ? nullptr : it->second.get();
}

ServeKv::~ServeKv() {
  // Whatever is still in RAM goes to disk (the engines were detached, and
  // their owned slots persisted, when the arbiter freed them).
  if (prompt_cache != nullptr) {
    const uint64_t spilled = prompt_cache->Spill(UINT64_MAX);
    if (spilled > 0) spdlog::info("kv: saved {} of prompt cache to {}", FormatSize(spilled), dir);
  }
}

namespace {

// The model hash from the model's WeightsDigest under the key "kv".
std::string KvModelHashOfDigest(uint64_t kv_weights_digest) {
  ModelHashInputs in;
  in.target = fmt::format("{:016x}", kv_weights_digest);
  in.cache_type_k = "f32";
  in.cache_type_v = "f32";
  in.extra = "arbiter-kv-v1";
  return ModelHash(in);
}

}  // namespace

Result<std::string> KvModelHash(const ModelEntry& entry) {
  // Opened as the model's load opens it (compute_dtype changes the layout,
  // hence the digest), so the two hashes agree.
  ARBITER_ASSIGN_OR_RETURN(
      std::shared_ptr<const ModelFiles> files,
      OpenModelFiles(entry.path, ModelFilesOptions{.compute_f32 = entry.compute_f32,
                                                   .chat_template = entry.chat_template}));
  return KvModelHash(*files);
}

Result<std::string> KvModelHash(const ModelFiles& files) {
  return KvModelHashOfDigest(files.WeightsDigestFor("kv"));
}

Result<std::unique_ptr<ServeKv>> MakeServeKv(
    const Config& config, MemoryLedger* ledger,
    const std::map<std::string, Result<std::shared_ptr<const ModelFiles>>>* opened) {
  auto out = std::make_unique<ServeKv>();
  out->settings = config.kv;
  out->dir = !config.kv.dir.empty() ? config.kv.dir
                                    : (fs::path(config.state_dir) / "kv").string();
  TtlWindows ttl;
  ttl.short_ms = config.kv.ttl_short_ms;
  ttl.long_ms = config.kv.ttl_long_ms;
  ttl.extended_ms = config.kv.ttl_extended_ms;
  KvStoreOptions so;
  so.dir = out->dir;
  so.ttl = ttl;
  so.disk_budget = config.kv.disk_budget_bytes;
  Result<std::unique_ptr<KvStore>> store = KvStore::Open(so);
  if (!store.ok()) return store.status().WithPrefix("[kv].dir");
  out->store = std::move(store).value();
  if (config.kv.prompt_cache_bytes > 0) {
    PromptCacheOptions po;
    po.capacity_bytes = config.kv.prompt_cache_bytes;
    po.ledger = ledger;
    po.ttl = ttl;
    KvStore* disk = out->store.get();
    po.spill = [disk](const std::string& model_key, const std::string& conversation_id,
                      TtlClass cls, KvSnapshot snapshot) {
      Result<uint64_t> written = disk->Save(conversation_id, cls, snapshot);
      if (!written.ok()) {
        spdlog::warn("kv: model \"{}\": spilling conversation \"{}\" to disk failed: {}",
                     LogSafe(model_key), LogSafe(conversation_id),
                     LogSafe(written.status().message(), kLogSafeMessageBytes));
      }
    };
    out->prompt_cache = std::make_unique<PromptCache>(std::move(po));
  }
  for (const ModelEntry& m : config.models) {
    if (m.capability != Capability::kText || m.engine != ModelEngine::kBuiltin) continue;
    const auto it = opened != nullptr ? opened->find(m.name) : decltype(opened->end()){};
    Result<std::string> hash =
        opened == nullptr || it == opened->end() ? KvModelHash(m)
        : it->second.ok()                        ? KvModelHash(**it->second)
                                                 : Result<std::string>(it->second.status());
    if (!hash.ok()) {
      spdlog::warn("kv: model \"{}\" gets no KV precache: {}", m.name, hash.status().message());
      continue;
    }
    KvPrecacheOptions o;
    o.model_key = m.name;
    o.model_hash = *hash;
    o.n_slots = m.parallel;
    o.store = out->store.get();
    o.prompt_cache = out->prompt_cache.get();
    o.ttl = ttl;
    o.conversation_ttl_ms = config.kv.conversation_ttl_ms;
    out->precaches.emplace(m.name, std::make_unique<KvPrecache>(std::move(o)));
  }
  spdlog::info("kv: disk tier {} (budget {}), prompt cache {}", out->dir,
               config.kv.disk_budget_bytes > 0 ? FormatSize(config.kv.disk_budget_bytes)
                                               : std::string("unlimited"),
               config.kv.prompt_cache_bytes > 0 ? FormatSize(config.kv.prompt_cache_bytes)
                                                : std::string("off"));
  return out;
}

}  // namespace arbiter
