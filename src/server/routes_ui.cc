// The dashboard's routes (docs/ui.md): GET /ui and /ui/{file} (the page and
// its scripts, styles and uPlot, compiled into the binary), GET /ui/session,
// POST /ui/login and /ui/logout (Note [Dashboard sessions] in internal/ui_sessions.h), and
// GET /admin/history (internal/history.h), which the admin auth protects.
#include <chrono>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "server/internal/context.h"
#include "server/internal/history.h"
#include "server/internal/json_fields.h"
#include "server/internal/ui_assets.h"
#include "server/internal/ui_sessions.h"

namespace arbiter::server_internal {
namespace {

using json = nlohmann::json;

// The page loads only its own files and talks only to this server: no
// inline script, no framing by other pages, no referrer leaks.
constexpr const char* kContentSecurityPolicy =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

void SendAsset(const UiAsset& a, http::Responder& out) {
  http::Response r;
  r.content_type = std::string(a.content_type);
  r.body = std::string(a.body);
  // Revalidated on every load: a new binary's files are used at once.
  r.headers = {{"Cache-Control", "no-cache"},
               {"X-Content-Type-Options", "nosniff"},
               {"Referrer-Policy", "no-referrer"},
               {"X-Frame-Options", "DENY"},
               {"Content-Security-Policy", kContentSecurityPolicy}};
  out.Send(std::move(r));
}

void HandleAsset(const std::string& name, http::Responder& out) {
  for (const UiAsset& a : UiAssets()) {
    if (a.name == name) return SendAsset(a, out);
  }
  SendError(out, 404, fmt::format("no dashboard file \"{}\"", name), kInvalidRequestType,
            "not_found");
}

std::string SessionCookie(const std::string& value, int64_t max_age_s) {
  return fmt::format("{}={}; Path=/; Max-Age={}; HttpOnly; SameSite=Strict", kSessionCookie,
                     value, max_age_s);
}

void HandleLogin(ServerContext& ctx, const http::Request& req, http::Responder& out) {
  const std::string& key = ctx.settings.api_key;
  if (key.empty()) {
    return SendJson(out, 200, R"({"auth_required":false})");
  }
  const auto now = UiSessions::Clock::now();
  if (!ctx.sessions.AllowAttempt(now)) {
    return SendError(out, 429,
                     fmt::format("too many failed sign-ins (more than {} in {} s); wait and try "
                                 "again",
                                 UiSessions::kMaxFailures, UiSessions::kFailureWindow.count()),
                     kInvalidRequestType, "rate_limit_exceeded",
                     static_cast<int>(UiSessions::kFailureWindow.count()));
  }
  Result<RequestJson> body = ParseBody(req.body);
  if (!body.ok()) return SendStatus(out, body.status());
  auto k = body->find("key");
  if (k == body->end() || !k->is_string() || body->size() != 1) {
    return SendError(out, 400, "request body must be a JSON object {\"key\": \"<API key>\"}",
                     kInvalidRequestType, "invalid_request");
  }
  if (!ApiKeyMatches(ctx.settings, k->get_ref<const std::string&>())) {
    ctx.sessions.RecordFailure(now);
    return SendError(out, 401, "invalid API key", kInvalidRequestType, "invalid_api_key");
  }
  const std::string token = ctx.sessions.Create(now);
  SendJson(out, 200,
           json{{"auth_required", true},
                {"expires_in_s", UiSessions::kSessionTtl.count()}}
               .dump(),
           {{"Set-Cookie", SessionCookie(token, UiSessions::kSessionTtl.count())},
            {"Cache-Control", "no-store"}});
}

void HandleLogout(ServerContext& ctx, const http::Request& req, http::Responder& out) {
  ctx.sessions.Remove(CookieValue(req.header("Cookie"), kSessionCookie));
  SendJson(out, 200, R"({"signed_out":true})", {{"Set-Cookie", SessionCookie("", 0)}});
}

// GET /ui/session: whether the page must sign in first (answered 200 in
// both cases, so the page never causes a 401 in the browser's console).
void HandleSession(ServerContext& ctx, const http::Request& req, http::Responder& out) {
  const bool required = !ctx.settings.api_key.empty();
  const bool signed_in = required && HasValidSessionCookie(ctx, req);
  SendJson(out, 200, json{{"auth_required", required}, {"signed_in", signed_in}}.dump(),
           {{"Cache-Control", "no-store"}});
}

void HandleHistory(ServerContext& ctx, const http::Request& req, http::Responder& out) {
  int64_t since = 0;
  if (req.has_query("since")) {
    Result<int64_t> parsed = ParseQueryInt("since", req.query_value("since"), 0,
                                           std::numeric_limits<int64_t>::max(),
                                           "a unix time in ms ≥ 0");
    if (!parsed.ok()) return SendStatus(out, parsed.status());
    since = *parsed;
  }
  SendJson(out, 200, ctx.history->Json(since), {{"Cache-Control", "no-store"}});
}

}  // namespace

std::vector<Route> UiRoutes(ServerContext& ctx) {
  using http::Dispatch;
  using http::Request;
  using http::Responder;
  return {
      {"GET", "/ui", Dispatch::kInline,
       [](const Request&, Responder& out) { HandleAsset("index.html", out); }},
      {"GET", "/ui/{file}", Dispatch::kInline,
       [](const Request& req, Responder& out) { HandleAsset(req.params.at("file"), out); }},
      {"GET", "/ui/session", Dispatch::kInline,
       [&ctx](const Request& req, Responder& out) { HandleSession(ctx, req, out); }},
      {"POST", "/ui/login", Dispatch::kInline,
       [&ctx](const Request& req, Responder& out) { HandleLogin(ctx, req, out); }},
      {"POST", "/ui/logout", Dispatch::kInline,
       [&ctx](const Request& req, Responder& out) { HandleLogout(ctx, req, out); }},
      {"GET", "/admin/history", Dispatch::kInline,
       [&ctx](const Request& req, Responder& out) { HandleHistory(ctx, req, out); }},
  };
}

}  // namespace arbiter::server_internal
