// What every route of the server shares, and the route table. server.cc
// builds the context and registers the routes on the transport
// (internal/http/http_server.h); route tests call the handlers in process
// with an http::FakeResponder. HTTP only: everything below the routes is the
// Runtime's.
#pragma once

#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "arbiter/base/mutex.h"
#include "arbiter/base/status.h"
#include "arbiter/runtime/config.h"
#include "arbiter/runtime/runtime.h"
#include "arbiter/server/openai.h"
#include "server/internal/errors.h"
#include "server/internal/event_stream.h"
#include "server/internal/history.h"
#include "server/internal/http/http_server.h"
#include "server/internal/ui_sessions.h"
#include "server/internal/metrics.h"

namespace arbiter::server_internal {

struct ServerContext {
  ServerSettings settings;
  Runtime* runtime = nullptr;
  int threads = 0;                 // worker threads
  int64_t started_at = 0;          // unix seconds (the "created" of /v1/models)
  std::atomic<bool> stopping{false};
  // Shared with the event listener, which may run after the subscription is
  // gone (Note [Event stream lifetime] in internal/event_stream.h).
  std::shared_ptr<ServerMetrics> metrics = std::make_shared<ServerMetrics>();
  // Open GET /admin/events streams; Stop() closes them.
  Mutex streams_mu;
  std::set<std::shared_ptr<EventQueue>> streams GUARDED_BY(streams_mu);
  // The dashboard: its sign-in sessions and the memory history
  // (GET /admin/history); the server starts the recorder and stops it first.
  UiSessions sessions;
  std::unique_ptr<HistoryRecorder> history;
};

// Whether `key` is the configured API key (constant time in its length).
bool ApiKeyMatches(const ServerSettings& settings, std::string_view key);
// Whether `req` carries the cookie of a dashboard session that has not
// expired (Note [Dashboard sessions] in ui_sessions.h); where the cookie is
// accepted is the caller's rule. Thread-safe.
bool HasValidSessionCookie(const ServerContext& ctx, const http::Request& req);

// One route: method, pattern ("/admin/models/{name}/load"), where it runs
// (inline on the event loop: never blocks; worker: may block) and handler.
struct Route {
  std::string method;
  std::string pattern;
  http::Dispatch dispatch = http::Dispatch::kWorker;
  http::Handler handler;
};

// A JSON response.
void SendJson(http::Responder& out, int status, std::string body,
              std::vector<std::pair<std::string, std::string>> headers = {});
// The OpenAI-shaped error body {"error":{"message","type","code"}}.
void SendError(http::Responder& out, int status, std::string_view message, std::string_view type,
               std::string_view code, int retry_after_s = 0);
// The error `status` maps to through the one table (errors.h).
void SendStatus(http::Responder& out, const Status& status);

// The route groups (routes_openai.cc, routes_admin.cc). The context must
// outlive the routes.
std::vector<Route> OpenAIRoutes(ServerContext& ctx);
std::vector<Route> AdminRoutes(ServerContext& ctx);
// routes_modalities.cc: audio, speech, vision, images.
std::vector<Route> ModalityRoutes(ServerContext& ctx);
// routes_responses.cc: POST /v1/responses.
std::vector<Route> ResponsesRoutes(ServerContext& ctx);
// routes_ollama.cc: Ollama's API (/api/*, GET and HEAD /).
std::vector<Route> OllamaRoutes(ServerContext& ctx);
// routes_llamacpp.cc: the llama.cpp server's /tokenize, /detokenize,
// /props, /slots.
std::vector<Route> LlamaCppRoutes(ServerContext& ctx);
// routes_ui.cc: the dashboard (/ui, /ui/{file}, /ui/login, /ui/logout) and
// GET /admin/history.
std::vector<Route> UiRoutes(ServerContext& ctx);

// Note [Proxied models] in routes_modalities.cc: when the body's `model` is
// a process-backed model of `capability`, forwards the request to its
// process and answers it (true); false when it is not (nothing sent).
bool ProxyIfProcessModel(ServerContext& ctx, const http::Request& req, http::Responder& out,
                         Capability capability);
// A chat's image parts decoded from their data: URLs ([server]
// max_image_bytes). Errors: kInvalidRequest naming the part.
Result<std::vector<ChatImage>> ChatImagesOf(const ServerContext& ctx,
                                            const std::vector<ChatImagePart>& parts);
// ChatImagesOf into `request->images` (nothing when `parts` is empty).
Status AddChatImages(const ServerContext& ctx, const std::vector<ChatImagePart>& parts,
                     TextRequest* request);

}  // namespace arbiter::server_internal
