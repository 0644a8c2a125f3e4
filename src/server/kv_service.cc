// The KV precache of `arbiter serve` (arbiter/server/kv_service.h).
#include "arbiter/server/kv_service.h"

#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "arbiter/base/size.h"
#include "arbiter/engine/engine.h"
#include "arbiter/kv/cache_key.h"
#include "arbiter/server/models.h"

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
  EngineOptions options;
  options.n_ctx = entry.ctx;
  // Headers only (not tokenizer.json): the digest is all it needs.
  ARBITER_ASSIGN_OR_RETURN(WeightModel weights,
                           Engine::WeightModelFor(entry.path, "kv", options));
  return KvModelHashOfDigest(weights.digest);
}

Result<std::string> KvModelHash(const ModelFiles& files) {
  return KvModelHashOfDigest(files.WeightsDigestFor("kv"));
}

Result<std::unique_ptr<ServeKv>> MakeServeKv(const Config& config, MemoryLedger* ledger) {
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
                     model_key, conversation_id, written.status().message());
      }
    };
    out->prompt_cache = std::make_unique<PromptCache>(std::move(po));
  }
  for (const ModelEntry& m : config.models) {
    if (m.capability != Capability::kText) continue;
    Result<std::string> hash = KvModelHash(m);
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

std::string KvStatusJson(const ServeKv& kv) {
  using json = nlohmann::json;
  json j = {{"dir", kv.dir},
            {"disk_bytes", kv.store->DiskBytes()},
            {"disk_budget_bytes", kv.settings.disk_budget_bytes},
            {"ttl_ms",
             {{"short", kv.settings.ttl_short_ms},
              {"long", kv.settings.ttl_long_ms},
              {"extended", kv.settings.ttl_extended_ms}}},
            {"conversation_ttl_ms", kv.settings.conversation_ttl_ms}};
  if (kv.prompt_cache != nullptr) {
    json entries = json::array();
    for (const PromptCacheEntryInfo& e : kv.prompt_cache->Entries()) {
      entries.push_back({{"model", e.model_key},
                         {"conversation_id", e.conversation_id},
                         {"ttl_class", TtlClassName(e.ttl_class)},
                         {"n_tokens", e.n_tokens},
                         {"bytes", e.bytes},
                         {"age_ms", e.age_ms}});
    }
    const PromptCache::Counters c = kv.prompt_cache->counters();
    j["prompt_cache"] = {{"bytes", kv.prompt_cache->bytes()},
                         {"capacity_bytes", kv.prompt_cache->capacity()},
                         {"entries", std::move(entries)},
                         {"puts", c.puts},
                         {"hits", c.hits},
                         {"misses", c.misses},
                         {"spilled", c.spilled},
                         {"expired", c.expired}};
  } else {
    j["prompt_cache"] = nullptr;
  }
  json models = json::array();
  for (const auto& [name, pc] : kv.precaches) {
    json slots = json::array();
    for (const KvSlotView& v : pc->Slots()) {
      slots.push_back({{"index", v.index},
                       {"conversation_id", v.conversation_id.empty() ? json(nullptr)
                                                                     : json(v.conversation_id)},
                       {"n_tokens", v.n_tokens},
                       {"busy", v.busy}});
    }
    json conversations = json::array();
    for (const ConversationHandle& h : pc->registry().OpenHandles(name)) {
      conversations.push_back({{"conversation_id", h.conversation_id},
                               {"slot", h.slot_id},
                               {"last_used_ms", h.last_used_ms},
                               {"ttl_ms", h.ttl_ms}});
    }
    json prewarmed = json::array();
    for (const KvPrewarmView& p : pc->Prewarmed()) {
      prewarmed.push_back({{"conversation_id", p.conversation_id},
                           {"prefix_tokens", p.prefix_tokens},
                           {"idle_ms", p.idle_ms}});
    }
    const KvPrecacheCounters c = pc->counters();
    const int hw = pc->registry().HighWater();
    models.push_back(
        {{"name", name},
         {"model_hash", pc->model_hash()},
         {"slots", std::move(slots)},
         {"conversations", std::move(conversations)},
         {"prewarmed", std::move(prewarmed)},
         {"high_water", hw},
         {"recommended_parallel", ConversationRegistry::RecommendedParallel(
                                      hw, static_cast<int>(pc->Slots().size()))},
         {"counters",
          {{"requests", c.requests},
           {"prompt_tokens", c.prompt_tokens},
           {"cached_tokens", c.cached_tokens},
           {"copied_tokens", c.copied_tokens},
           {"slot_hits", c.slot_hits},
           {"prompt_cache_hits", c.prompt_cache_hits},
           {"disk_hits", c.disk_hits},
           {"restore_failures", c.restore_failures},
           {"stashes", c.stashes},
           {"persisted", c.persisted},
           {"prewarms", c.prewarms},
           {"prewarm_failures", c.prewarm_failures},
           {"keepalive_rewarms", c.keepalive_rewarms}}}});
  }
  j["models"] = std::move(models);
  std::vector<KvFileInfo> files = kv.store->List();
  j["files_total"] = files.size();
  std::sort(files.begin(), files.end(),
            [](const KvFileInfo& a, const KvFileInfo& b) { return a.age_ms < b.age_ms; });
  if (files.size() > kKvStatusMaxFiles) files.resize(kKvStatusMaxFiles);
  json fj = json::array();
  for (const KvFileInfo& f : files) {
    fj.push_back({{"model_hash", f.model_hash},
                  {"file", f.file_name},
                  {"ttl_class", TtlClassName(f.ttl_class)},
                  {"bytes", f.bytes},
                  {"age_ms", f.age_ms}});
  }
  j["files"] = std::move(fj);
  return j.dump();
}

}  // namespace arbiter
