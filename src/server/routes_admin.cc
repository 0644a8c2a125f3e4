// The admin and observability routes (docs/http-api.md "Admin"):
// GET /admin/status, /admin/kv, /admin/events (SSE), /metrics, and the
// actions POST /admin/pressure, /admin/models/{name}/{load,unload,residency},
// /admin/compact, /admin/prewarm, /admin/conversations/{id}/close. Empty
// POST bodies are accepted wherever the body is optional.
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "arbiter/server/openai.h"
#include "server/internal/context.h"
#include "server/internal/status_json.h"

namespace arbiter::server_internal {
namespace {

using json = nlohmann::json;
constexpr const char* kJson = "application/json";

// GET /admin/events: events buffered per connection before the oldest are
// dropped (and counted), and how often an idle stream checks that its client
// is still there (real ms) and sends a keep-alive comment (s).
constexpr size_t kEventQueueCapacity = 1024;
constexpr int kEventPollMs = 250;
constexpr int kEventKeepAliveS = 15;
// POST /admin/models/{name}/unload: default and largest ?timeout_ms=.
constexpr int64_t kDefaultUnloadTimeoutMs = 10000;
constexpr int64_t kMaxUnloadTimeoutMs = 3600000;

Status BadBody(std::string message) {
  return InvalidArgumentError(std::move(message), ErrorReason::kInvalidRequest);
}

size_t OpenStreams(ServerContext& ctx) {
  MutexLock l(&ctx.streams_mu);
  return ctx.streams.size();
}

void HandleStatus(ServerContext& ctx, httplib::Response& res) {
  res.set_content(RuntimeStatusJson(ctx.runtime->Status(), OpenStreams(ctx)).dump(), kJson);
}

void HandleKv(ServerContext& ctx, httplib::Response& res) {
  Result<KvStatus> kv = ctx.runtime->Kv();
  if (!kv.ok()) return SendStatus(res, kv.status());
  res.set_content(KvStatusJson(*kv).dump(), kJson);
}

void HandleMetrics(ServerContext& ctx, httplib::Response& res) {
  RuntimeStatus s = ctx.runtime->Status();
  std::optional<KvMetricsSample> k;
  if (Result<KvStatus> kv = ctx.runtime->Kv(); kv.ok()) {
    k.emplace();
    for (const KvModelStatus& m : kv->models) k->models.emplace_back(m.name, m.counters);
    k->files_swept = kv->files_swept;
    if (kv->prompt_cache) {
      k->prompt_cache_bytes = kv->prompt_cache->bytes;
      k->prompt_cache_entries = kv->prompt_cache->entries.size();
    }
    k->disk_bytes = kv->disk_bytes;
  }
  res.set_content(ctx.metrics->Scrape(s.arbiter, s.ledger, s.weights ? &*s.weights : nullptr,
                                      k ? &*k : nullptr),
                  "text/plain; version=0.0.4");
}

// The body of an admin action: an object, or empty (→ {}) when `optional`.
Result<json> ParseBody(const std::string& body, bool optional, const char* usage) {
  if (body.empty() && optional) return json::object();
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return BadBody(usage);
  return j;
}

void HandlePressure(ServerContext& ctx, const httplib::Request& req, httplib::Response& res) {
  const char* usage =
      "request body must be a JSON object {\"level\": \"nominal\" | \"low\" | \"critical\", "
      "\"free_mb\": N}";
  Result<json> body = ParseBody(req.body, /*optional=*/false, usage);
  if (!body.ok()) return SendStatus(res, body.status());
  auto level_it = body->find("level");
  if (level_it == body->end() || !level_it->is_string()) {
    return SendStatus(
        res, BadBody("\"level\" is required and must be \"nominal\", \"low\" or \"critical\""));
  }
  Result<MemoryPressureLevel> level = ParseMemoryPressureLevel(level_it->get<std::string>());
  if (!level.ok()) {
    return SendStatus(res, BadBody(fmt::format("\"level\" must be \"nominal\", \"low\" or "
                                               "\"critical\" (got \"{}\")",
                                               level_it->get<std::string>())));
  }
  std::optional<uint64_t> free_bytes;
  if (auto f = body->find("free_mb"); f != body->end() && !f->is_null()) {
    constexpr double kMaxMb = 1e12;  // ~1 EB: anything above is a typo
    if (!f->is_number() || f->get<double>() < 0 || f->get<double>() > kMaxMb) {
      return SendStatus(res, BadBody("\"free_mb\" must be a number ≥ 0 (MiB of free memory)"));
    }
    free_bytes = static_cast<uint64_t>(f->get<double>() * 1048576.0);
  }
  const MemoryPressureLevel now = ctx.runtime->DispatchPressure(*level, free_bytes);
  json j = {{"level", MemoryPressureLevelName(*level)},
            {"pressure", MemoryPressureLevelName(now)}};
  if (free_bytes) j["free_mb"] = *free_bytes >> 20;
  res.set_content(j.dump(), kJson);
}

void HandleLoad(ServerContext& ctx, const std::string& name, httplib::Response& res) {
  Result<ModelStatus> m = ctx.runtime->LoadModel(name);
  if (!m.ok()) return SendStatus(res, m.status());
  res.set_content(ModelStatusJson(*m).dump(), kJson);
}

void HandleUnload(ServerContext& ctx, const httplib::Request& req, const std::string& name,
                  httplib::Response& res) {
  int64_t timeout_ms = kDefaultUnloadTimeoutMs;
  if (req.has_param("timeout_ms")) {
    const std::string v = req.get_param_value("timeout_ms");
    char* end = nullptr;
    errno = 0;
    const long long parsed = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || errno != 0 || parsed < 0 || parsed > kMaxUnloadTimeoutMs) {
      return SendStatus(res, BadBody(fmt::format("\"timeout_ms\" must be an integer in 0..{} "
                                                 "(got \"{}\")",
                                                 kMaxUnloadTimeoutMs, v)));
    }
    timeout_ms = parsed;
  }
  Result<UnloadResult> r = ctx.runtime->UnloadModel(name, timeout_ms);
  if (!r.ok()) return SendStatus(res, r.status());
  json j = ModelStatusJson(r->model);
  j["unloaded"] = r->unloaded;  // false: it was not resident
  res.set_content(j.dump(), kJson);
}

void HandleResidency(ServerContext& ctx, const httplib::Request& req, const std::string& name,
                     httplib::Response& res) {
  const char* usage =
      "request body must be a JSON object {\"target\": \"unpinned\" | \"pinned_system\" | "
      "\"pinned_device\"}";
  bool known = false;
  for (const auto& [n, cap] : ctx.runtime->ModelNames()) known = known || n == name;
  if (!known) {
    return SendStatus(res, NotFoundError(fmt::format("model \"{}\" not found", name),
                                         ErrorReason::kModelNotFound));
  }
  Result<json> body = ParseBody(req.body, /*optional=*/false, usage);
  if (!body.ok()) return SendStatus(res, body.status());
  auto t = body->find("target");
  if (t == body->end() || !t->is_string()) return SendStatus(res, BadBody(usage));
  Result<ResidencyState> target = ParseResidencyState(t->get<std::string>());
  if (!target.ok()) {
    return SendStatus(res, BadBody(fmt::format("\"target\": {}", target.status().message())));
  }
  auto r = ctx.runtime->SetResidency(name, *target);
  if (!r.ok()) return SendStatus(res, r.status());
  json j = ModelStatusJson(r->second);
  j["previous_residency"] = ResidencyStateName(r->first);
  res.set_content(j.dump(), kJson);
}

void HandleCompact(ServerContext& ctx, const httplib::Request& req, httplib::Response& res) {
  const char* usage = "request body must be a JSON object {\"reload\": [model names]}";
  Result<json> body = ParseBody(req.body, /*optional=*/true, usage);
  if (!body.ok()) return SendStatus(res, body.status());
  std::vector<std::string> reload;
  if (auto r = body->find("reload"); r != body->end() && !r->is_null()) {
    if (!r->is_array()) return SendStatus(res, BadBody(usage));
    for (size_t i = 0; i < r->size(); ++i) {
      if (!(*r)[i].is_string()) {
        return SendStatus(res, BadBody(fmt::format("\"reload[{}]\" must be a model name", i)));
      }
      reload.push_back((*r)[i].get<std::string>());
    }
  }
  Result<CompactResult> r = ctx.runtime->Compact(reload);
  if (!r.ok()) return SendStatus(res, r.status());
  json j = {{"reloaded", r->reloaded},
            {"resident_bytes_after", r->resident_bytes_after},
            {"freed_bytes", r->freed_bytes},
            {"skipped_leased", r->skipped_leased}};
  res.set_content(j.dump(), kJson);
}

void HandlePrewarm(ServerContext& ctx, const httplib::Request& req, httplib::Response& res) {
  Result<PrewarmRequest> parsed = ParsePrewarmRequest(req.body);
  if (!parsed.ok()) {
    return SendStatus(res, parsed.status().WithReason(ErrorReason::kInvalidRequest));
  }
  PrewarmSpec p;
  p.model = parsed->model;
  p.conversation_id = parsed->cache.conversation_id;
  p.messages = std::move(parsed->messages);
  p.prompt = std::move(parsed->prompt);
  p.cache_ttl = parsed->cache.cache_ttl;
  Result<PrewarmResult> r = ctx.runtime->Prewarm(p);
  if (!r.ok()) return SendStatus(res, r.status());
  const GenerationResult& g = r->generation;
  json j = {{"model", p.model},
            {"conversation_id", p.conversation_id},
            {"slot", g.slot},
            {"prefix_tokens", g.prompt_tokens},
            {"cached_tokens", g.cached_tokens},
            {"computed_tokens", g.timings.prefill_tokens},
            {"prefill_ms", g.timings.prefill_ms}};
  res.set_content(j.dump(), kJson);
}

void HandleCloseConversation(ServerContext& ctx, const httplib::Request& req,
                             const std::string& id, httplib::Response& res) {
  const std::string only = req.has_param("model") ? req.get_param_value("model") : "";
  Result<std::vector<std::string>> closed = ctx.runtime->CloseConversation(id, only);
  if (!closed.ok()) return SendStatus(res, closed.status());
  res.set_content(json{{"conversation_id", id}, {"closed", true}, {"models", *closed}}.dump(),
                  kJson);
}

// GET /admin/events: Note [Event stream lifetime] in internal/event_stream.h.
void HandleEvents(ServerContext& ctx, httplib::Response& res) {
  auto queue = std::make_shared<EventQueue>(kEventQueueCapacity);
  // Each stream holds a worker thread: keep half of them for requests.
  const size_t max_streams = static_cast<size_t>(std::max(1, ctx.threads / 2));
  {
    MutexLock l(&ctx.streams_mu);
    if (ctx.streams.size() >= max_streams) {
      return SendStatus(
          res, UnavailableError(fmt::format("too many open /admin/events streams ({}; each holds "
                                            "one of the {} worker threads); close one or raise "
                                            "[server] threads",
                                            ctx.streams.size(), ctx.threads),
                                ErrorReason::kTooManyStreams));
    }
    ctx.streams.insert(queue);
  }
  if (ctx.stopping.load()) queue->Close();  // raced with Stop(): end at once
  auto sub = std::make_shared<ArbiterEventSubscription>(
      ctx.runtime->OnEvent([queue](const ArbiterEvent& e) { queue->Push(e); }));
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  struct State {
    bool greeted = false;
    std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();
  };
  auto state = std::make_shared<State>();
  res.set_chunked_content_provider(
      "text/event-stream",
      [&ctx, queue, state](size_t /*offset*/, httplib::DataSink& sink) {
        const auto now = std::chrono::steady_clock::now();
        auto write = [&](const std::string& s) {
          state->last_write = now;
          return sink.write(s.data(), s.size());
        };
        if (!state->greeted) {
          // Lets a client know the subscription is live before it acts.
          state->greeted = true;
          return write(": subscribed to arbiter events\n\n");
        }
        std::vector<ArbiterEvent> events;
        uint64_t dropped = 0;
        const bool open =
            queue->Wait(now + std::chrono::milliseconds(kEventPollMs), &events, &dropped);
        if (dropped > 0) {
          spdlog::warn("events stream: client lags; dropped {} event(s)", dropped);
          if (!write(fmt::format("event: dropped\ndata: {{\"dropped\":{}}}\n\n", dropped))) {
            return false;
          }
        }
        for (const ArbiterEvent& e : events) {
          if (!write(ArbiterEventFrame(e))) return false;
        }
        if (!open || ctx.stopping.load()) {
          sink.done();  // server stopping: end the response cleanly
          return true;
        }
        if (events.empty()) {
          if (!sink.is_writable()) return false;  // client gone
          if (now - state->last_write >= std::chrono::seconds(kEventKeepAliveS)) {
            return write(": keep-alive\n\n");
          }
        }
        return true;
      },
      [&ctx, queue, sub](bool /*success*/) {
        // On the worker thread, never inside the listener.
        sub->Reset();
        queue->Close();
        MutexLock l(&ctx.streams_mu);
        ctx.streams.erase(queue);
      });
}

}  // namespace

void AddAdminRoutes(httplib::Server& http, ServerContext& ctx) {
  http.Get("/admin/status",
           [&ctx](const httplib::Request&, httplib::Response& res) { HandleStatus(ctx, res); });
  http.Get("/admin/kv",
           [&ctx](const httplib::Request&, httplib::Response& res) { HandleKv(ctx, res); });
  http.Get("/metrics",
           [&ctx](const httplib::Request&, httplib::Response& res) { HandleMetrics(ctx, res); });
  http.Get("/admin/events",
           [&ctx](const httplib::Request&, httplib::Response& res) { HandleEvents(ctx, res); });
  http.Post("/admin/pressure", [&ctx](const httplib::Request& req, httplib::Response& res) {
    HandlePressure(ctx, req, res);
  });
  http.Post(R"(/admin/models/([^/]+)/load)",
            [&ctx](const httplib::Request& req, httplib::Response& res) {
              HandleLoad(ctx, req.matches[1], res);
            });
  http.Post(R"(/admin/models/([^/]+)/unload)",
            [&ctx](const httplib::Request& req, httplib::Response& res) {
              HandleUnload(ctx, req, req.matches[1], res);
            });
  http.Post(R"(/admin/models/([^/]+)/residency)",
            [&ctx](const httplib::Request& req, httplib::Response& res) {
              HandleResidency(ctx, req, req.matches[1], res);
            });
  http.Post("/admin/compact", [&ctx](const httplib::Request& req, httplib::Response& res) {
    HandleCompact(ctx, req, res);
  });
  http.Post("/admin/prewarm", [&ctx](const httplib::Request& req, httplib::Response& res) {
    HandlePrewarm(ctx, req, res);
  });
  http.Post(R"(/admin/conversations/(.+)/close)",
            [&ctx](const httplib::Request& req, httplib::Response& res) {
              HandleCloseConversation(ctx, req, req.matches[1], res);
            });
}

}  // namespace arbiter::server_internal
