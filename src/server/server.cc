// The HTTP server: auth, the error bodies of transport errors, request
// logging and the server's lifecycle, over the event-driven transport
// (internal/http/http_server.h: one event loop owns every socket, a bounded
// worker pool runs the handlers that may block). The routes are in
// routes_openai.cc and routes_admin.cc; every operation below them is the
// Runtime's.
//
// Request path (docs/architecture.md "One chat request"):
//   0. the transport reads the request (limits: max_body_bytes → 413, a
//      whole request within request_timeout_s → 408, max_connections → 503,
//      a full worker queue → 503);
//   1. pre-routing: the Host check (403, Note [Host check] in
//      internal/access.h), then the API key check for /v1/*, /admin/* and
//      /metrics (401);
//   2. the handler parses the body into a native request struct (openai.h)
//      — 400 naming the field on any problem;
//   3. the Runtime admits the request (model resolved, pinned, prompt
//      checked) or refuses it with a typed reason, which the one error table
//      (internal/errors.h) turns into the HTTP status, code and Retry-After;
//   4. the Runtime generates; a stream writes SSE chunks through the
//      Responder, back-pressured, and stops when the client goes away.
#include "arbiter/server/server.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <memory>
#include <set>
#include <string>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "arbiter/base/log_safe.h"
#include "arbiter/server/openai.h"
#include "server/internal/access.h"
#include "server/internal/context.h"
#include "server/internal/errors.h"

namespace arbiter {
namespace server_internal {

bool ApiKeyMatches(const ServerSettings& settings, std::string_view key) {
  const std::string& want = settings.api_key;
  if (key.size() != want.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < key.size(); ++i) diff |= static_cast<unsigned char>(key[i] ^ want[i]);
  return diff == 0;
}

bool HasValidSessionCookie(const ServerContext& ctx, const http::Request& req) {
  return ctx.sessions.Valid(CookieValue(req.header("Cookie"), kSessionCookie),
                            UiSessions::Clock::now());
}

void SendJson(http::Responder& out, int status, std::string body,
              std::vector<std::pair<std::string, std::string>> headers) {
  http::Response r;
  r.status = status;
  r.content_type = "application/json";
  r.headers = std::move(headers);
  r.body = std::move(body);
  out.Send(std::move(r));
}

void SendError(http::Responder& out, int status, std::string_view message,
               std::string_view type, std::string_view code, int retry_after_s) {
  std::vector<std::pair<std::string, std::string>> headers;
  if (retry_after_s > 0) headers.emplace_back("Retry-After", std::to_string(retry_after_s));
  SendJson(out, status, ErrorJson(message, type, code), std::move(headers));
}

void SendStatus(http::Responder& out, const Status& status) {
  const HttpError e = HttpErrorFor(status);
  if (e.bug) {
    spdlog::error("bug: unexpected error: {}", LogSafe(status.ToString(), kLogSafeMessageBytes));
  }
  SendError(out, e.status, status.message(), e.type, e.code, e.retry_after_s);
}

}  // namespace server_internal

namespace {

using server_internal::ServerContext;
constexpr const char* kInvalidRequest = server_internal::kInvalidRequestType;
constexpr const char* kServerError = server_internal::kServerErrorType;

// The route pattern of `path` for the arbiter_http_requests_total label
// (bounded cardinality: model names never become label values here).
std::string RouteLabel(const std::string& path) {
  static const std::set<std::string, std::less<>> kFixed = {
      "/health",        "/v1/models",     "/v1/chat/completions", "/v1/completions",
      "/v1/embeddings", "/admin/status",  "/admin/pressure",      "/admin/events",
      "/admin/compact", "/admin/prewarm", "/admin/kv",    "/metrics",
      "/v1/audio/transcriptions", "/v1/audio/speech", "/v1/audio/vad", "/v1/vision/describe",
      "/v1/images/generations", "/api/tags", "/api/ps", "/api/show", "/api/chat",
      "/api/generate", "/api/embed", "/api/embeddings", "/api/version", "/", "/tokenize",
      "/detokenize", "/props", "/slots", "/ui", "/ui/login", "/ui/logout", "/ui/session", "/admin/history"};
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  if (kFixed.count(path) != 0) return path;
  if (path.rfind("/ui/", 0) == 0) return "/ui/{file}";
  if (path.rfind("/admin/conversations/", 0) == 0 && path.size() > 27 &&
      path.compare(path.size() - 6, 6, "/close") == 0) {
    return "/admin/conversations/{id}/close";
  }
  constexpr std::string_view kModels = "/admin/models/";
  if (path.rfind(kModels, 0) == 0) {
    for (std::string_view action : {"/load", "/unload", "/residency"}) {
      if (path.size() > kModels.size() + action.size() &&
          path.compare(path.size() - action.size(), action.size(), action) == 0) {
        return fmt::format("/admin/models/{{name}}{}", action);
      }
    }
  }
  return "other";
}

// Note [Dashboard sessions] in internal/ui_sessions.h: a session cookie
// stands in for the key on the admin routes and /metrics (what the page
// reads), for requests from the server's own origin. SameSite=Strict keeps
// other sites' pages from sending it; the Origin check keeps out pages of
// the same site on another port (http://127.0.0.1:8080 is the same site as
// the server), which a browser lets send a cookie with a simple POST.
bool SessionAllows(const ServerContext& ctx, const http::Request& req) {
  const bool dashboard_path = req.path.rfind("/admin/", 0) == 0 || req.path == "/metrics";
  if (!dashboard_path) return false;
  const std::string origin = req.header("Origin");
  if (!origin.empty() && origin != "http://" + req.header("Host")) return false;
  return server_internal::HasValidSessionCookie(ctx, req);
}

// Note [CORS]
// [server] cors_origins lists the browser origins allowed to call the API
// (exact scheme://host[:port] strings, or "*" for any). For a request whose
// Origin is allowed, every response — handlers', auth errors', transport
// errors', streams — carries Access-Control-Allow-Origin (the origin
// itself, so credentials work with "*" too), Vary: Origin and the exposed
// headers; a preflight (OPTIONS with Access-Control-Request-Method) on any
// path is answered 204 before the API key check, since browsers send it
// without credentials. Other origins get no CORS headers and their
// preflights fall through to routing (405/404), which the browser treats as
// a refusal.
constexpr const char* kCorsExposed =
    "Retry-After, WWW-Authenticate, X-Arbiter-Kv-Slot, X-Arbiter-Kv-Source, "
    "X-Arbiter-Kv-Restored";

bool CorsAllowed(const ServerSettings& st, const std::string& origin) {
  if (origin.empty()) return false;
  for (const std::string& o : st.cors_origins) {
    if (o == "*" || o == origin) return true;
  }
  return false;
}

http::Response CorsPreflight(const http::Request& req) {
  http::Response r;
  r.status = 204;
  std::string allow_headers = "Authorization, Content-Type";
  const std::string requested = req.header("Access-Control-Request-Headers");
  if (!requested.empty()) allow_headers += ", " + requested;
  r.headers = {{"Access-Control-Allow-Methods", "GET, POST, HEAD, OPTIONS"},
               {"Access-Control-Allow-Headers", allow_headers},
               {"Access-Control-Max-Age", "86400"}};
  return r;
}

http::Response JsonResponse(int status, std::string body) {
  http::Response r;
  r.status = status;
  r.content_type = "application/json";
  r.body = std::move(body);
  return r;
}

}  // namespace

struct Server::Impl {
  ServerContext ctx;
  server_internal::AllowedHosts allowed_hosts;
  std::unique_ptr<http::Server> http;
  ArbiterEventSubscription metrics_sub;

  Impl(ServerSettings s, Runtime* runtime) : allowed_hosts(s.host, s.allowed_hosts) {
    ctx.settings = std::move(s);
    ctx.runtime = runtime;
    ctx.started_at = static_cast<int64_t>(std::time(nullptr));
    int total_parallel = 0;
    for (const ModelEntry& m : runtime->config().models) total_parallel += m.parallel;
    ctx.threads = ctx.settings.threads > 0 ? ctx.settings.threads : 8 + std::max(1, total_parallel);
    for (const std::string& compat : ctx.settings.metrics_compat) {
      if (compat == "vllm") ctx.metrics->EnableVllmCompat();
    }
    std::shared_ptr<server_internal::ServerMetrics> m = ctx.metrics;
    metrics_sub = runtime->OnEvent([m](const ArbiterEvent& e) { m->OnEvent(e); });
    ctx.history = std::make_unique<server_internal::HistoryRecorder>(runtime);

    const ServerSettings& st = ctx.settings;
    http::ServerOptions o;
    o.host = st.host;
    o.port = st.port;
    o.max_body_bytes = st.max_body_bytes;
    // Audio uploads have their own limit ([server] max_audio_bytes) plus
    // room for the multipart framing and fields; the 413 names it.
    for (const char* path : {"/v1/audio/transcriptions", "/v1/audio/vad"}) {
      o.path_body_limits[path] = {
          st.max_audio_bytes + (64u << 10),
          fmt::format("[server] max_audio_bytes = {} plus 64 KiB for the other form fields",
                      st.max_audio_bytes)};
    }
    o.read_timeout_s = st.read_timeout_s;
    o.request_timeout_s = st.request_timeout_s;
    o.write_timeout_s = st.write_timeout_s;
    o.keep_alive_max = st.keep_alive_max;
    o.keep_alive_timeout_s = st.keep_alive_timeout_s;
    o.max_connections = st.max_connections;
    o.worker_threads = ctx.threads;
    o.worker_queue_max = st.queue_max;
    o.retry_after_s = server_internal::kRetryAfterSeconds;
    http = std::make_unique<http::Server>(o);
    Configure();
    http->Route("GET", "/health", http::Dispatch::kInline,
                [](const http::Request&, http::Responder& out) {
                  out.Send(JsonResponse(200, R"({"status":"ok"})"));
                });
    for (auto group : {server_internal::OpenAIRoutes(ctx), server_internal::ModalityRoutes(ctx),
                       server_internal::ResponsesRoutes(ctx),
                       server_internal::AdminRoutes(ctx), server_internal::OllamaRoutes(ctx),
                       server_internal::LlamaCppRoutes(ctx), server_internal::UiRoutes(ctx)}) {
      for (server_internal::Route& r : group) {
        http->Route(std::move(r.method), std::move(r.pattern), r.dispatch, std::move(r.handler));
      }
    }
    ctx.history->Start();
  }

  // Ends every events stream (their workers notice within a poll period).
  void CloseStreams() {
    std::set<std::shared_ptr<server_internal::EventQueue>> open;
    {
      MutexLock l(&ctx.streams_mu);
      open = ctx.streams;
    }
    for (const auto& q : open) q->Close();
  }

  void Configure() {
    // Note [CORS]: every response to a listed origin carries its headers.
    if (!ctx.settings.cors_origins.empty()) {
      http->SetResponseHeaders([this](const http::Request& req) {
        std::vector<std::pair<std::string, std::string>> h;
        const std::string origin = req.header("Origin");
        if (CorsAllowed(ctx.settings, origin)) {
          h.emplace_back("Access-Control-Allow-Origin", origin);
          h.emplace_back("Vary", "Origin");
          h.emplace_back("Access-Control-Expose-Headers", kCorsExposed);
        }
        return h;
      });
    }
    http->SetPreRouting([this](const http::Request& req) -> std::optional<http::Response> {
      const ServerSettings& st = ctx.settings;
      // Note [Host check]: every Host header the request carries must be allowed.
      const auto [host_begin, host_end] = req.headers.equal_range("Host");
      for (auto h = host_begin; h != host_end; ++h) {
        if (!allowed_hosts.Allows(h->second)) {
          return JsonResponse(403, ErrorJson(allowed_hosts.RefusalMessage(h->second),
                                             kInvalidRequest, "host_not_allowed"));
        }
      }
      // A preflight is answered before the key check: browsers send it
      // without credentials.
      if (req.method == "OPTIONS" && req.has_header("Access-Control-Request-Method") &&
          CorsAllowed(st, req.header("Origin"))) {
        return CorsPreflight(req);
      }
      if (st.api_key.empty()) return std::nullopt;
      const bool protected_path = req.path.rfind("/v1/", 0) == 0 ||
                                  req.path.rfind("/admin/", 0) == 0 ||
                                  req.path.rfind("/api/", 0) == 0 || req.path == "/tokenize" ||
                                  req.path == "/detokenize" || req.path == "/props" ||
                                  req.path == "/slots" ||
                                  (req.path == "/metrics" && !st.metrics_public);
      if (!protected_path) return std::nullopt;
      const std::string auth = req.header("Authorization");
      const std::optional<std::string_view> token = server_internal::BearerToken(auth);
      if (token && server_internal::ApiKeyMatches(st, *token)) return std::nullopt;
      if (auth.empty() && SessionAllows(ctx, req)) return std::nullopt;
      http::Response res = JsonResponse(
          401, ErrorJson(auth.empty() ? "missing API key: send \"Authorization: Bearer <key>\""
                                      : "invalid API key",
                         kInvalidRequest, "invalid_api_key"));
      res.headers.emplace_back("WWW-Authenticate", "Bearer");
      return res;
    });
    // JSON bodies for the errors the transport answers itself. Its message
    // names the limit that applied: the timeout that fired
    // (read_timeout_s or request_timeout_s) or the body limit of the path.
    http->SetErrorBody([](int status, std::string message) {
      switch (status) {
        case 404:
          return JsonResponse(404, ErrorJson(message, kInvalidRequest, "not_found"));
        case 405:
          return JsonResponse(405, ErrorJson(message, kInvalidRequest, "method_not_allowed"));
        case 408:
          return JsonResponse(408, ErrorJson(message, kInvalidRequest, "request_timeout"));
        case 413:
          return JsonResponse(413, ErrorJson(message, kInvalidRequest, "request_too_large"));
        case 503:
          return JsonResponse(503, ErrorJson(message, kServerError, "server_busy"));
        default:
          return JsonResponse(status, ErrorJson(message, status >= 500 ? kServerError
                                                                       : kInvalidRequest,
                                                ""));
      }
    });
    http->SetLogger([this](const http::Request& req, int status) {
      ctx.metrics->OnHttpRequest(RouteLabel(req.path), status);
      spdlog::info("{} {} {} ({}:{})", LogSafe(req.method), LogSafe(req.path), status,
                   req.remote_addr, req.remote_port);
    });
  }
};

Server::Server(ServerSettings settings, Runtime* runtime)
    : impl_(std::make_unique<Impl>(std::move(settings), runtime)) {}

Server::~Server() { Stop(); }

Status Server::Bind() { return impl_->http->Bind(); }

int Server::port() const { return impl_->http->port(); }

Status Server::Run() {
  spdlog::info("serving on http://{}:{} with {} worker threads (max {} connections)",
               impl_->ctx.settings.host, port(), impl_->ctx.threads,
               impl_->ctx.settings.max_connections);
  return impl_->http->Run();
}

std::vector<std::string> Server::DescribeRunning() const {
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::string> out;
  for (const http::RunningRequest& r : impl_->http->Running()) {
    out.push_back(fmt::format("{} {} from {}:{}, running for {:.1f} s", LogSafe(r.method),
                              LogSafe(r.path),
                              r.remote_addr, r.remote_port,
                              std::chrono::duration<double>(now - r.since).count()));
  }
  return out;
}

void Server::Stop() {
  impl_->ctx.stopping.store(true);
  impl_->ctx.history->Stop();
  impl_->CloseStreams();
  impl_->http->Stop();
}

}  // namespace arbiter
