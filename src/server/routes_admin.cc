// The admin and observability routes (docs/http-api.md "Admin"):
// GET /admin/status, /admin/kv, /admin/events (SSE), /metrics, and the
// actions POST /admin/pressure, /admin/models/{name}/{load,unload,residency},
// /admin/compact, /admin/prewarm, /admin/conversations/{id}/close.
//
// An action reads its body with the routes' one JSON reader (Note [One
// JSON reader] in internal/json_fields.h) and refuses what it does not
// read: a field or a query parameter it does not take is a 400 naming it.
// Where every field is optional (compact, and the actions that take none:
// load, unload, close) an empty body means {}.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "arbiter/base/clip.h"
#include "arbiter/server/openai.h"
#include "server/internal/context.h"
#include "server/internal/json_fields.h"
#include "server/internal/status_json.h"

namespace arbiter::server_internal {
namespace {

using json = nlohmann::json;

// GET /admin/events: events buffered per connection before the oldest are
// dropped (and counted), and how often an idle stream checks that its client
// is still there (real ms) and sends a keep-alive comment (s).
constexpr size_t kEventQueueCapacity = 1024;
constexpr int kEventPollMs = 250;
constexpr int kEventKeepAliveS = 15;
// POST /admin/models/{name}/unload: default and largest ?timeout_ms=.
constexpr int64_t kDefaultUnloadTimeoutMs = 10000;
constexpr int64_t kMaxUnloadTimeoutMs = 3600000;

// The `usage` of the actions that take no body.
constexpr std::string_view kNoBody = "this action takes no fields: send an empty body or {}";

Status BadBody(std::string message) {
  return InvalidArgumentError(std::move(message), ErrorReason::kInvalidRequest);
}

size_t OpenStreams(ServerContext& ctx) {
  MutexLock l(&ctx.streams_mu);
  return ctx.streams.size();
}

void HandleStatus(ServerContext& ctx, http::Responder& out) {
  SendJson(out, 200, RuntimeStatusJson(ctx.runtime->Status(), OpenStreams(ctx)).dump());
}

void HandleKv(ServerContext& ctx, http::Responder& out) {
  Result<KvStatus> kv = ctx.runtime->Kv();
  if (!kv.ok()) return SendStatus(out, kv.status());
  json j = KvStatusJson(*kv);
  // Each text model's context size ([[models]] ctx): how full a slot is.
  for (json& m : j["models"]) {
    for (const ModelEntry& e : ctx.runtime->config().models) {
      if (e.name == m["name"].get<std::string>()) m["ctx"] = e.ctx;
    }
  }
  SendJson(out, 200, j.dump());
}

void HandleMetrics(ServerContext& ctx, http::Responder& out) {
  RuntimeStatus s = ctx.runtime->Status();
  std::optional<KvMetricsSample> k;
  if (Result<KvStatus> kv = ctx.runtime->Kv(/*with_files=*/false); kv.ok()) {
    k.emplace();
    for (const KvModelStatus& m : kv->models) {
      k->models.emplace_back(m.name, m.counters);
      // KV usage: tokens the slots hold over their capacity ([[models]] ctx each).
      int ctx_tokens = 0;
      for (const ModelEntry& e : ctx.runtime->config().models) {
        if (e.name == m.name) ctx_tokens = e.ctx;
      }
      double used = 0;
      for (const KvSlotView& slot : m.slots) used += slot.n_tokens;
      const double capacity = static_cast<double>(ctx_tokens) * static_cast<double>(m.slots.size());
      k->kv_usage.emplace_back(m.name, capacity > 0 ? std::min(1.0, used / capacity) : 0.0);
    }
    k->files_swept = kv->files_swept;
    k->write_errors = kv->write_errors;
    if (kv->prompt_cache) {
      k->prompt_cache_bytes = kv->prompt_cache->bytes;
      k->prompt_cache_entries = kv->prompt_cache->entries.size();
    }
    k->disk_bytes = kv->disk_bytes;
  }
  http::Response res;
  res.content_type = "text/plain; version=0.0.4";
  const server_internal::ProcessMemorySample process{s.process_resident_bytes,
                                                     s.unaccounted_bytes};
  const server_internal::ModalityMetricsSample modalities{s.processes, s.vision_cache};
  res.body = ctx.metrics->Scrape(s.arbiter, s.ledger, s.weights ? &*s.weights : nullptr,
                                 k ? &*k : nullptr, &process, &modalities);
  out.Send(std::move(res));
}

// The body of an admin action: a JSON object with only `fields`, or (when
// `optional`) empty, meaning {}; no query parameter but `query`. `usage`
// words the body for a client that sent something else.
Result<RequestJson> ActionBody(const http::Request& req, bool optional, std::string_view usage,
                               std::initializer_list<std::string_view> fields,
                               std::initializer_list<std::string_view> query = {}) {
  for (const auto& [name, value] : req.query) {
    if (std::find(query.begin(), query.end(), name) != query.end()) continue;
    std::string taken;
    for (std::string_view q : query) taken += fmt::format("{}\"{}\"", taken.empty() ? "" : ", ", q);
    return BadBody(fmt::format("unrecognized query parameter \"{}\": this action takes {}",
                               ClipInput(name), taken.empty() ? "none" : "only " + taken));
  }
  if (optional && req.body.find_first_not_of(" \t\r\n") == std::string::npos) {
    return RequestJson::object();
  }
  Result<RequestJson> body = ParseJson(req.body, "request body");
  if (!body.ok()) return body.status();
  if (!body->is_object()) return BadBody(std::string(usage));
  if (Status known = CheckKnownFields(*body, fields); !known.ok()) {
    return BadBody(fields.size() == 0 ? std::string(kNoBody) : std::string(known.message()));
  }
  return body;
}

void HandlePressure(ServerContext& ctx, const http::Request& req, http::Responder& out) {
  const char* usage =
      "request body must be a JSON object {\"level\": \"nominal\" | \"low\" | \"critical\", "
      "\"free_mb\": N}";
  Result<RequestJson> body = ActionBody(req, /*optional=*/false, usage, {"level", "free_mb"});
  if (!body.ok()) return SendStatus(out, body.status());
  auto level_it = body->find("level");
  if (level_it == body->end() || !level_it->is_string()) {
    return SendStatus(
        out, BadBody("\"level\" is required and must be \"nominal\", \"low\" or \"critical\""));
  }
  Result<MemoryPressureLevel> level = ParseMemoryPressureLevel(level_it->get<std::string>());
  if (!level.ok()) {
    return SendStatus(out, BadBody(fmt::format("\"level\" must be \"nominal\", \"low\" or "
                                               "\"critical\" (got \"{}\")",
                                               ClipInput(level_it->get<std::string>()))));
  }
  std::optional<uint64_t> free_bytes;
  if (auto f = body->find("free_mb"); f != body->end() && !f->is_null()) {
    constexpr double kMaxMb = 1e12;  // ~1 EB: anything above is a typo
    if (!f->is_number() || f->get<double>() < 0 || f->get<double>() > kMaxMb) {
      return SendStatus(
          out, BadBody(fmt::format("\"free_mb\" must be a number between 0 and {:.0f} (MiB of free "
                                   "memory)",
                                   kMaxMb)));
    }
    free_bytes = static_cast<uint64_t>(f->get<double>() * 1048576.0);
  }
  const MemoryPressureLevel now = ctx.runtime->DispatchPressure(*level, free_bytes);
  json j = {{"level", MemoryPressureLevelName(*level)},
            {"pressure", MemoryPressureLevelName(now)}};
  if (free_bytes) j["free_mb"] = *free_bytes >> 20;
  SendJson(out, 200, j.dump());
}

void HandleLoad(ServerContext& ctx, const http::Request& req, const std::string& name,
                http::Responder& out) {
  if (Result<RequestJson> body = ActionBody(req, /*optional=*/true, kNoBody, {}); !body.ok()) {
    return SendStatus(out, body.status());
  }
  Result<ModelStatus> m = ctx.runtime->LoadModel(name);
  if (!m.ok()) return SendStatus(out, m.status());
  SendJson(out, 200, ModelStatusJson(*m).dump());
}

void HandleUnload(ServerContext& ctx, const http::Request& req, const std::string& name,
                  http::Responder& out) {
  if (Result<RequestJson> body = ActionBody(req, /*optional=*/true, kNoBody, {}, {"timeout_ms"});
      !body.ok()) {
    return SendStatus(out, body.status());
  }
  int64_t timeout_ms = kDefaultUnloadTimeoutMs;
  if (req.has_query("timeout_ms")) {
    Result<int64_t> parsed =
        ParseQueryInt("timeout_ms", req.query_value("timeout_ms"), 0, kMaxUnloadTimeoutMs,
                      fmt::format("an integer in 0..{}", kMaxUnloadTimeoutMs));
    if (!parsed.ok()) return SendStatus(out, parsed.status());
    timeout_ms = *parsed;
  }
  Result<UnloadResult> r = ctx.runtime->UnloadModel(name, timeout_ms);
  if (!r.ok()) return SendStatus(out, r.status());
  json j = ModelStatusJson(r->model);
  j["unloaded"] = r->unloaded;  // false: it was not resident
  SendJson(out, 200, j.dump());
}

void HandleResidency(ServerContext& ctx, const http::Request& req, const std::string& name,
                     http::Responder& out) {
  const char* usage =
      "request body must be a JSON object {\"target\": \"unpinned\" | \"pinned_system\" | "
      "\"pinned_device\"}";
  bool known = false;
  for (const auto& [n, cap] : ctx.runtime->ModelNames()) known = known || n == name;
  if (!known) {
    return SendStatus(out, NotFoundError(fmt::format("model \"{}\" not found", ClipInput(name)),
                                         ErrorReason::kModelNotFound));
  }
  Result<RequestJson> body = ActionBody(req, /*optional=*/false, usage, {"target"});
  if (!body.ok()) return SendStatus(out, body.status());
  auto t = body->find("target");
  if (t == body->end() || !t->is_string()) return SendStatus(out, BadBody(usage));
  Result<ResidencyState> target = ParseResidencyState(t->get<std::string>());
  if (!target.ok()) {
    return SendStatus(out, BadBody(fmt::format("\"target\": {}", target.status().message())));
  }
  auto r = ctx.runtime->SetResidency(name, *target);
  if (!r.ok()) return SendStatus(out, r.status());
  json j = ModelStatusJson(r->second);
  j["previous_residency"] = ResidencyStateName(r->first);
  SendJson(out, 200, j.dump());
}

void HandleCompact(ServerContext& ctx, const http::Request& req, http::Responder& out) {
  const char* usage = "request body must be a JSON object {\"reload\": [model names]}";
  Result<RequestJson> body = ActionBody(req, /*optional=*/true, usage, {"reload"});
  if (!body.ok()) return SendStatus(out, body.status());
  std::vector<std::string> reload;
  if (auto r = body->find("reload"); r != body->end() && !r->is_null()) {
    if (!r->is_array()) return SendStatus(out, BadBody(usage));
    for (size_t i = 0; i < r->size(); ++i) {
      if (!(*r)[i].is_string()) {
        return SendStatus(out, BadBody(fmt::format("\"reload[{}]\" must be a model name", i)));
      }
      reload.push_back((*r)[i].get<std::string>());
    }
  }
  Result<CompactResult> r = ctx.runtime->Compact(reload);
  if (!r.ok()) return SendStatus(out, r.status());
  json j = {{"reloaded", r->reloaded},
            {"resident_bytes_after", r->resident_bytes_after},
            {"freed_bytes", r->freed_bytes},
            {"skipped_leased", r->skipped_leased}};
  SendJson(out, 200, j.dump());
}

void HandlePrewarm(ServerContext& ctx, const http::Request& req, http::Responder& out) {
  if (!req.query.empty()) {  // the fields are checked by ParsePrewarmRequest
    return SendStatus(out, BadBody(fmt::format("unrecognized query parameter \"{}\": this "
                                               "action takes none",
                                               ClipInput(req.query.begin()->first))));
  }
  Result<PrewarmRequest> parsed = ParsePrewarmRequest(req.body);
  if (!parsed.ok()) {
    return SendStatus(out, parsed.status().WithReason(ErrorReason::kInvalidRequest));
  }
  PrewarmSpec p;
  p.model = parsed->model;
  p.conversation_id = parsed->cache.conversation_id;
  p.messages = std::move(parsed->messages);
  p.prompt = std::move(parsed->prompt);
  p.cache_ttl = parsed->cache.cache_ttl;
  Result<PrewarmResult> r = ctx.runtime->Prewarm(p);
  if (!r.ok()) return SendStatus(out, r.status());
  const GenerationResult& g = r->generation;
  json j = {{"model", p.model},
            {"conversation_id", p.conversation_id},
            {"slot", g.slot},
            {"prefix_tokens", g.prompt_tokens},
            {"cached_tokens", g.cached_tokens},
            {"computed_tokens", g.timings.prefill_tokens},
            {"prefill_ms", g.timings.prefill_ms}};
  SendJson(out, 200, j.dump());
}

void HandleCloseConversation(ServerContext& ctx, const http::Request& req,
                             const std::string& id, http::Responder& out) {
  if (Result<RequestJson> body = ActionBody(req, /*optional=*/true, kNoBody, {}, {"model"});
      !body.ok()) {
    return SendStatus(out, body.status());
  }
  const std::string only = req.query_value("model");
  Result<std::vector<std::string>> closed = ctx.runtime->CloseConversation(id, only);
  if (!closed.ok()) return SendStatus(out, closed.status());
  SendJson(out, 200, json{{"conversation_id", id}, {"closed", true}, {"models", *closed}}.dump());
}

// GET /admin/events: Note [Event stream lifetime] in internal/event_stream.h.
// The stream holds a worker until the client leaves or the server stops.
void HandleEvents(ServerContext& ctx, http::Responder& out) {
  auto queue = std::make_shared<EventQueue>(kEventQueueCapacity);
  // Each stream holds a worker thread: keep half of them for requests.
  const size_t max_streams = static_cast<size_t>(std::max(1, ctx.threads / 2));
  {
    MutexLock l(&ctx.streams_mu);
    if (ctx.streams.size() >= max_streams) {
      return SendStatus(
          out, UnavailableError(fmt::format("too many open /admin/events streams ({}; each holds "
                                            "one of the {} worker threads); close one or raise "
                                            "[server] threads",
                                            ctx.streams.size(), ctx.threads),
                                ErrorReason::kTooManyStreams));
    }
    ctx.streams.insert(queue);
  }
  if (ctx.stopping.load()) queue->Close();  // raced with Stop(): end at once
  ArbiterEventSubscription sub =
      ctx.runtime->OnEvent([queue](const ArbiterEvent& e) { queue->Push(e); });
  auto last_write = std::chrono::steady_clock::now();
  auto write = [&](const std::string& s) {
    last_write = std::chrono::steady_clock::now();
    return out.Write(s);
  };
  // The greeting lets a client know the subscription is live before it acts.
  if (out.StartStream(200, "text/event-stream",
                      {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}}) &&
      write(": subscribed to arbiter events\n\n")) {
    for (;;) {
      std::vector<ArbiterEvent> events;
      uint64_t dropped = 0;
      const bool open = queue->Wait(
          std::chrono::steady_clock::now() + std::chrono::milliseconds(kEventPollMs), &events,
          &dropped);
      bool ok = true;
      if (dropped > 0) {
        spdlog::warn("events stream: client lags; dropped {} event(s)", dropped);
        ok = write(fmt::format("event: dropped\ndata: {{\"dropped\":{}}}\n\n", dropped));
      }
      for (const ArbiterEvent& e : events) ok = ok && write(ArbiterEventFrame(e));
      if (!ok || out.cancelled()) break;  // client gone
      if (!open || ctx.stopping.load()) {
        out.End();  // server stopping: end the response cleanly
        break;
      }
      if (events.empty() &&
          std::chrono::steady_clock::now() - last_write >= std::chrono::seconds(kEventKeepAliveS) &&
          !write(": keep-alive\n\n")) {
        break;
      }
    }
  }
  sub.Reset();
  queue->Close();
  MutexLock l(&ctx.streams_mu);
  ctx.streams.erase(queue);
}

}  // namespace

std::vector<Route> AdminRoutes(ServerContext& ctx) {
  using http::Dispatch;
  using http::Request;
  using http::Responder;
  return {
      // Snapshots: answered on the event loop even while every worker waits.
      {"GET", "/admin/status", Dispatch::kInline,
       [&ctx](const Request&, Responder& out) { HandleStatus(ctx, out); }},
      {"GET", "/metrics", Dispatch::kInline,
       [&ctx](const Request&, Responder& out) { HandleMetrics(ctx, out); }},
      // Lists the KV directory: file IO, so on a worker.
      {"GET", "/admin/kv", Dispatch::kWorker,
       [&ctx](const Request&, Responder& out) { HandleKv(ctx, out); }},
      {"GET", "/admin/events", Dispatch::kWorker,
       [&ctx](const Request&, Responder& out) { HandleEvents(ctx, out); }},
      {"POST", "/admin/pressure", Dispatch::kWorker,
       [&ctx](const Request& req, Responder& out) { HandlePressure(ctx, req, out); }},
      {"POST", "/admin/models/{name}/load", Dispatch::kWorker,
       [&ctx](const Request& req, Responder& out) {
         HandleLoad(ctx, req, req.params.at("name"), out);
       }},
      {"POST", "/admin/models/{name}/unload", Dispatch::kWorker,
       [&ctx](const Request& req, Responder& out) {
         HandleUnload(ctx, req, req.params.at("name"), out);
       }},
      {"POST", "/admin/models/{name}/residency", Dispatch::kWorker,
       [&ctx](const Request& req, Responder& out) {
         HandleResidency(ctx, req, req.params.at("name"), out);
       }},
      {"POST", "/admin/compact", Dispatch::kWorker,
       [&ctx](const Request& req, Responder& out) { HandleCompact(ctx, req, out); }},
      {"POST", "/admin/prewarm", Dispatch::kWorker,
       [&ctx](const Request& req, Responder& out) { HandlePrewarm(ctx, req, out); }},
      {"POST", "/admin/conversations/{id}/close", Dispatch::kWorker,
       [&ctx](const Request& req, Responder& out) {
         HandleCloseConversation(ctx, req, req.params.at("id"), out);
       }},
  };
}

}  // namespace arbiter::server_internal
