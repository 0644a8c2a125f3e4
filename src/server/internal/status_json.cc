// Snapshot serializers (server/internal/status_json.h).
#include "server/internal/status_json.h"

#include <string>

namespace arbiter::server_internal {
namespace {

using json = nlohmann::json;

json WeightModelJson(const WeightModelStatus& w) {
  return json{{"residency", ResidencyStateName(w.residency)},
              {"device_resident", w.device_resident},
              {"host_resident", w.host_resident},
              {"weight_bytes", w.weight_bytes},
              {"device_bytes", w.device_bytes},
              {"host_bytes", w.host_bytes},
              {"weight_leases", w.leases},
              {"weight_loads", w.loads},
              {"weight_evicts", w.evicts},
              {"weight_last_load_source", WeightLoadSourceName(w.last_load_source)},
              {"weight_last_load_seconds", w.last_load_seconds},
              {"floor_region", w.floor_region.empty() ? json(nullptr) : json(w.floor_region)}};
}

json WeightCacheJson(const WeightCacheStatus& w) {
  return json{{"mode", ResidencyModeName(w.mode)},
              {"max_bytes", w.max_bytes},
              {"resident_bytes", w.resident_bytes},
              {"pinned_bytes", w.pinned_bytes},
              {"host_bytes", w.host_bytes},
              {"max_scratch_bytes", w.max_scratch_bytes},
              {"weight_pool_bytes", w.weight_pool_bytes},
              {"scratch_ceiling_bytes", w.scratch_ceiling_bytes},
              {"pinned_over_commit", w.pinned_over_commit},
              {"loads", w.loads},
              {"evicts", w.evicts},
              {"compactions", w.compactions},
              {"oversize_loads", w.oversize_loads},
              {"load_seconds", w.load_seconds}};
}

json PoolJson(const MemoryPoolStats& p) {
  return json{{"in_use_bytes", p.in_use_bytes},
              {"limit_bytes", p.limit_bytes},
              {"free_bytes", p.free_bytes},
              {"peak_in_use_bytes", p.peak_in_use_bytes},
              {"largest_free_block_bytes", p.largest_free_block_bytes},
              {"fragmentation", p.fragmentation},
              {"live_blocks", p.live_blocks},
              {"free_blocks", p.free_blocks},
              {"num_allocs", p.num_allocs},
              {"num_frees", p.num_frees},
              {"regions", p.regions},
              {"region_bytes", p.region_bytes}};
}

json ByKindJson(const ChargeKindBytes& bytes) {
  json by_kind = json::object();
  for (size_t k = 0; k < kChargeKindCount; ++k) {
    by_kind[std::string(ChargeKindName(static_cast<ChargeKind>(k)))] = bytes[k];
  }
  return by_kind;
}

// "domains": every memory domain's books by name, "host" included
// (Note [Memory domains] in arbiter/memory/memory_ledger.h).
json DomainsJson(const MemoryLedgerSnapshot& ledger) {
  json domains = json::object();
  for (const auto& [name, d] : ledger.domains) {
    domains[name] = {{"budget_bytes", d.budget_bytes},
                     {"charged_bytes", d.charged_bytes},
                     {"peak_bytes", d.peak_bytes},
                     {"runtime_bytes", d.runtime_bytes},
                     {"over_budget_bytes", d.over_budget_bytes},
                     {"over_commits", d.over_commits},
                     {"refusals", d.refusals},
                     {"live_charges", d.live_charges},
                     {"inside_host", d.inside_host},
                     {"by_kind", ByKindJson(d.by_kind)}};
  }
  return domains;
}

}  // namespace

json ModelStatusJson(const ModelStatus& model) {
  const ModelStats& m = model.arbiter;
  json item = {{"name", m.name},
               {"capability", CapabilityName(m.capability)},
               {"role", ResidentRoleName(m.role)},
               {"priority", ResidentRolePriority(m.role)},
               {"state", ModelStateName(m.state)},
               {"status", ModelStateName(m.state)},
               {"resident", m.state == ModelState::kLoaded},
               {"bytes", std::max<uint64_t>(model.total_bytes, m.bytes)},
               {"entry_bytes", m.bytes},
               {"bytes_measured", m.bytes_measured},
               {"ref_count", m.refcount},
               {"refcount", m.refcount},
               {"loads", m.loads},
               {"load_failures", m.load_failures},
               {"evictions", m.evictions},
               {"last_load_ms", m.last_load_ms},
               {"queued", m.queued},
               {"running", m.running},
               {"runs", m.runs},
               {"queue_rejections", m.queue_rejections},
               // Loaded and unheld: ms since its last use (else 0); the idle
               // TTL in force, null = never unloaded for idleness.
               {"idle_ms", m.idle_ms},
               {"idle_ttl_ms", m.idle_ttl_ms ? json(*m.idle_ttl_ms) : json(nullptr)}};
  if (model.engine) item["engine"] = *model.engine;
  if (model.device) item["device"] = *model.device;
  if (!model.layers.empty()) item["layers"] = model.layers;
  if (model.process) {
    const ProcessModelStats& p = *model.process;
    item["process"] = {{"starts", p.starts},
                       {"crashes", p.crashes},
                       {"over_budget_stops", p.over_budget_stops},
                       {"rss_bytes", p.rss_bytes},
                       {"last_exit", p.last_exit.empty() ? json(nullptr) : json(p.last_exit)}};
  }
  item["error"] = m.last_error.empty() ? json(nullptr) : json(m.last_error);
  if (model.weights) item.update(WeightModelJson(*model.weights));
  item["ready"] = model.ready;
  return item;
}

json RuntimeStatusJson(const RuntimeStatus& st, size_t event_streams) {
  const ArbiterStats& s = st.arbiter;
  json models = json::array();
  for (const ModelStatus& m : st.models) models.push_back(ModelStatusJson(m));
  json j = {{"budget_bytes", s.budget_bytes},
            {"charged_bytes", s.charged_bytes},
            {"runtime_bytes", st.ledger.runtime_bytes},
            {"process_resident_bytes", st.process_resident_bytes},
            {"unaccounted_bytes", st.unaccounted_bytes},
            {"outside_bytes", st.outside_bytes},
            {"resident_bytes", s.resident_bytes},
            {"loading_bytes", s.loading_bytes},
            {"resident_models", s.resident_models},
            {"pressure", MemoryPressureLevelName(s.pressure)},
            {"pressure_source", st.pressure_source},
            {"event_streams", event_streams},
            {"vision_cache",
             {{"entries", st.vision_cache.entries},
              {"bytes", st.vision_cache.bytes},
              {"hits", st.vision_cache.hits},
              {"misses", st.vision_cache.misses}}},
            {"loads", s.loads},
            {"load_failures", s.load_failures},
            {"evictions", s.evictions},
            {"models", std::move(models)},
            {"charged_by_kind", ByKindJson(st.ledger.by_kind)},
            {"over_budget_bytes", st.ledger.over_budget_bytes},
            {"over_commits", st.ledger.over_commits},
            {"domains", DomainsJson(st.ledger)}};
  auto victim = [](const std::optional<NextVictim>& v) -> json {
    if (!v) return nullptr;
    return {{"model", v->model},
            {"capability", CapabilityName(v->capability)},
            {"role", ResidentRoleName(v->role)},
            {"bytes", v->bytes},
            {"reason", v->reason}};
  };
  j["next_victim"] = victim(st.next_victim);
  // Per domain (the host's equals the top-level one): null when no idle
  // model there can be evicted.
  json& domains = j["domains"];
  for (auto d = domains.begin(); d != domains.end(); ++d) {
    auto it = st.domain_next_victims.find(d.key());
    (*d)["next_victim"] = it != st.domain_next_victims.end() ? victim(it->second) : json(nullptr);
  }
  if (st.weights) {
    j["weight_cache"] = WeightCacheJson(*st.weights);
    j["pool"] = PoolJson(st.weights->pool);
  }
  return j;
}

json KvStatusJson(const KvStatus& kv) {
  json j = {{"dir", kv.dir},
            {"disk_bytes", kv.disk_bytes},
            {"disk_budget_bytes", kv.settings.disk_budget_bytes},
            {"ttl_ms",
             {{"short", kv.settings.ttl_short_ms},
              {"long", kv.settings.ttl_long_ms},
              {"extended", kv.settings.ttl_extended_ms}}},
            {"conversation_ttl_ms", kv.settings.conversation_ttl_ms}};
  if (kv.prompt_cache) {
    const KvPromptCacheStatus& pc = *kv.prompt_cache;
    json entries = json::array();
    for (const PromptCacheEntryInfo& e : pc.entries) {
      entries.push_back({{"model", e.model_key},
                         {"conversation_id", e.conversation_id},
                         {"ttl_class", TtlClassName(e.ttl_class)},
                         {"n_tokens", e.n_tokens},
                         {"bytes", e.bytes},
                         {"age_ms", e.age_ms}});
    }
    j["prompt_cache"] = {{"bytes", pc.bytes},
                         {"capacity_bytes", pc.capacity_bytes},
                         {"entries", std::move(entries)},
                         {"puts", pc.counters.puts},
                         {"hits", pc.counters.hits},
                         {"misses", pc.counters.misses},
                         {"spilled", pc.counters.spilled},
                         {"expired", pc.counters.expired}};
  } else {
    j["prompt_cache"] = nullptr;
  }
  json models = json::array();
  for (const KvModelStatus& m : kv.models) {
    json slots = json::array();
    for (const KvSlotView& v : m.slots) {
      slots.push_back({{"index", v.index},
                       {"conversation_id",
                        v.conversation_id.empty() ? json(nullptr) : json(v.conversation_id)},
                       {"n_tokens", v.n_tokens},
                       {"busy", v.busy}});
    }
    json conversations = json::array();
    for (const ConversationHandle& h : m.conversations) {
      conversations.push_back({{"conversation_id", h.conversation_id},
                               {"slot", h.slot_id},
                               {"last_used_ms", h.last_used_ms},
                               {"ttl_ms", h.ttl_ms}});
    }
    json prewarmed = json::array();
    for (const KvPrewarmView& p : m.prewarmed) {
      prewarmed.push_back({{"conversation_id", p.conversation_id},
                           {"prefix_tokens", p.prefix_tokens},
                           {"idle_ms", p.idle_ms}});
    }
    const KvCountersStatus& c = m.counters;
    models.push_back({{"name", m.name},
                      {"model_hash", m.model_hash},
                      {"slots", std::move(slots)},
                      {"conversations", std::move(conversations)},
                      {"prewarmed", std::move(prewarmed)},
                      {"high_water", m.high_water},
                      {"recommended_parallel", m.recommended_parallel},
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
  j["files_total"] = kv.files_total;
  json fj = json::array();
  for (const KvFileInfo& f : kv.files) {
    fj.push_back({{"model_hash", f.model_hash},
                  {"file", f.file_name},
                  {"ttl_class", TtlClassName(f.ttl_class)},
                  {"bytes", f.bytes},
                  {"age_ms", f.age_ms}});
  }
  j["files"] = std::move(fj);
  j["files_swept"] = kv.files_swept;
  j["write_errors"] = kv.write_errors;
  return j;
}

}  // namespace arbiter::server_internal
