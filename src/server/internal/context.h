// What every route of the server shares (server.cc builds it; the route
// files register their handlers on it). HTTP only: everything below the
// routes is the Runtime's.
#pragma once

#include <atomic>
#include <memory>
#include <set>
#include <string>

#include <httplib.h>

#include "arbiter/base/mutex.h"
#include "arbiter/base/status.h"
#include "arbiter/runtime/config.h"
#include "arbiter/runtime/runtime.h"
#include "server/internal/event_stream.h"
#include "server/internal/metrics.h"

namespace arbiter::server_internal {

struct ServerContext {
  ServerSettings settings;
  Runtime* runtime = nullptr;
  int threads = 0;                 // HTTP worker threads
  int64_t started_at = 0;          // unix seconds (the "created" of /v1/models)
  std::atomic<bool> stopping{false};
  // Shared with the event listener, which may run after the subscription is
  // gone (Note [Event stream lifetime] in internal/event_stream.h).
  std::shared_ptr<ServerMetrics> metrics = std::make_shared<ServerMetrics>();
  // Open GET /admin/events streams; Stop() closes them.
  Mutex streams_mu;
  std::set<std::shared_ptr<EventQueue>> streams GUARDED_BY(streams_mu);
};

// Writes the OpenAI-shaped error body {"error":{"message","type","code"}}.
void SendError(httplib::Response& res, int status, std::string_view message,
               std::string_view type, std::string_view code, int retry_after_s = 0);
// Writes the error `status` maps to through the one table (errors.h).
void SendStatus(httplib::Response& res, const Status& status);

// The route groups (routes_openai.cc, routes_admin.cc).
void AddOpenAIRoutes(httplib::Server& http, ServerContext& ctx);
void AddAdminRoutes(httplib::Server& http, ServerContext& ctx);

}  // namespace arbiter::server_internal
