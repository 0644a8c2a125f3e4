// The HTTP server (cpp-httplib): transport, auth, limits, the error
// handler and the server's lifecycle. The routes are in routes_openai.cc and
// routes_admin.cc; every operation below them is the Runtime's.
//
// Request path (ARCHITECTURE.md "One chat request, end to end"):
//   0. the request (headers and body) must arrive within request_timeout_s,
//      else 408 and the connection is closed (Note [Slow clients] in
//      server/internal/deadline_stream.h);
//   1. pre-routing: API key check for /v1/*, /admin/* and /metrics (401);
//   2. the body (≤ max_body_bytes, else httplib answers 413 and the error
//      handler writes the JSON body) is parsed into a native request struct
//      (openai.h) — 400 naming the field on any problem;
//   3. the Runtime admits the request (model resolved, pinned, prompt
//      checked) or refuses it with a typed reason, which the one error table
//      (internal/errors.h) turns into the HTTP status, code and Retry-After;
//   4. the Runtime generates; streaming sends SSE chunks from httplib's
//      chunked content provider on the same worker thread.
#include "arbiter/server/server.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <memory>
#include <set>
#include <string>

#include <fmt/format.h>
#include <httplib.h>
#include <spdlog/spdlog.h>

#include "arbiter/server/openai.h"
#include "server/internal/context.h"
#include "server/internal/deadline_stream.h"
#include "server/internal/errors.h"

namespace arbiter {
namespace server_internal {

void SendError(httplib::Response& res, int status, std::string_view message,
               std::string_view type, std::string_view code, int retry_after_s) {
  res.status = status;
  if (retry_after_s > 0) res.set_header("Retry-After", std::to_string(retry_after_s));
  res.set_content(ErrorJson(message, type, code), "application/json");
}

void SendStatus(httplib::Response& res, const Status& status) {
  const HttpError e = HttpErrorFor(status);
  if (e.bug) spdlog::error("bug: unexpected error: {}", status.ToString());
  SendError(res, e.status, status.message(), e.type, e.code, e.retry_after_s);
}

}  // namespace server_internal

namespace {

using server_internal::DeadlineStream;
using server_internal::SendError;
using server_internal::ServerContext;
using server_internal::WaitReadable;
constexpr const char* kInvalidRequest = server_internal::kInvalidRequestType;
constexpr const char* kServerError = server_internal::kServerErrorType;

// The route pattern of `path` for the arbiter_http_requests_total label
// (bounded cardinality: model names never become label values here).
std::string RouteLabel(const std::string& path) {
  static const std::set<std::string, std::less<>> kFixed = {
      "/health",        "/v1/models",     "/v1/chat/completions", "/v1/completions",
      "/v1/embeddings", "/admin/status",  "/admin/pressure",      "/admin/events",
      "/admin/compact", "/admin/prewarm", "/admin/kv",    "/metrics"};
  if (kFixed.count(path) != 0) return path;
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
bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// The stream the calling worker thread is reading a request from (set by
// HttpServer while httplib processes the request), for the error handler.
thread_local const DeadlineStream* tls_request_stream = nullptr;

// True when the calling worker's current request ran out of
// request_timeout_s while being read (Note [Slow clients]).
bool RequestReadTimedOut() {
  return tls_request_stream != nullptr && tls_request_stream->deadline_expired();
}

// Two changes to httplib::Server, hence the subclass:
// - httplib 0.11 listens with a backlog of 5: a burst of more simultaneous
//   connects gets SYNs dropped and waits for the 1 s retransmission. Linux
//   lets listen() be called again on a listening socket to raise the backlog;
//   the socket is a protected member.
// - Each connection is served by our keep-alive loop (httplib's, with the
//   same limits) over a DeadlineStream, which bounds the time to send a whole
//   request: Note [Slow clients] in server/internal/deadline_stream.h.
class HttpServer : public httplib::Server {
 public:
  void RaiseListenBacklog() {
    const socket_t sock = svr_sock_;
    if (sock != INVALID_SOCKET) ::listen(sock, SOMAXCONN);
  }
  void set_request_timeout(std::chrono::milliseconds timeout) { request_timeout_ = timeout; }

 private:
  // Overrides httplib's (private virtual) connection loop; called on a worker
  // thread for every accepted socket, which it closes.
  bool process_and_close_socket(socket_t sock) override {
    using std::chrono::milliseconds;
    using std::chrono::seconds;
    const auto stopping = [this] { return svr_sock_ == INVALID_SOCKET; };
    const milliseconds read_timeout =
        seconds(read_timeout_sec_) + milliseconds(read_timeout_usec_ / 1000);
    const milliseconds write_timeout =
        seconds(write_timeout_sec_) + milliseconds(write_timeout_usec_ / 1000);
    bool ret = false;
    for (size_t left = keep_alive_max_count_; left > 0; --left) {
      if (!WaitReadable(sock, seconds(keep_alive_timeout_sec_), stopping)) break;
      DeadlineStream stream(sock, read_timeout, write_timeout,
                            std::chrono::steady_clock::now() + request_timeout_);
      bool connection_closed = false;
      tls_request_stream = &stream;
      ret = process_request(stream, /*close_connection=*/left == 1, connection_closed, nullptr);
      tls_request_stream = nullptr;
      if (!ret || connection_closed || stream.deadline_expired()) break;
    }
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return ret;
  }

  std::chrono::milliseconds request_timeout_{std::chrono::seconds(60)};
};

}  // namespace

struct Server::Impl {
  ServerContext ctx;
  HttpServer http;
  int port = -1;
  ArbiterEventSubscription metrics_sub;

  Impl(ServerSettings s, Runtime* runtime) {
    ctx.settings = std::move(s);
    ctx.runtime = runtime;
    ctx.started_at = static_cast<int64_t>(std::time(nullptr));
    int total_parallel = 0;
    for (const ModelEntry& m : runtime->config().models) total_parallel += m.parallel;
    ctx.threads = ctx.settings.threads > 0 ? ctx.settings.threads : 8 + std::max(1, total_parallel);
    std::shared_ptr<server_internal::ServerMetrics> m = ctx.metrics;
    metrics_sub = runtime->OnEvent([m](const ArbiterEvent& e) { m->OnEvent(e); });
    Configure();
    http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"status":"ok"})", "application/json");
    });
    server_internal::AddOpenAIRoutes(http, ctx);
    server_internal::AddAdminRoutes(http, ctx);
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
    const int n = ctx.threads;
    http.new_task_queue = [n] { return new httplib::ThreadPool(static_cast<size_t>(n)); };
    http.set_payload_max_length(ctx.settings.max_body_bytes);
    http.set_read_timeout(ctx.settings.read_timeout_s, 0);
    http.set_request_timeout(std::chrono::seconds(ctx.settings.request_timeout_s));
    http.set_write_timeout(ctx.settings.write_timeout_s, 0);
    http.set_keep_alive_max_count(static_cast<size_t>(ctx.settings.keep_alive_max));
    http.set_keep_alive_timeout(ctx.settings.keep_alive_timeout_s);
    http.set_tcp_nodelay(true);

    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (ctx.settings.api_key.empty()) return httplib::Server::HandlerResponse::Unhandled;
      const bool protected_path =
          req.path.rfind("/v1/", 0) == 0 || req.path.rfind("/admin/", 0) == 0 ||
          (req.path == "/metrics" && !ctx.settings.metrics_public);
      if (!protected_path) return httplib::Server::HandlerResponse::Unhandled;
      const std::string auth = req.get_header_value("Authorization");
      constexpr std::string_view kBearer = "Bearer ";
      if (auth.size() > kBearer.size() && auth.compare(0, kBearer.size(), kBearer) == 0 &&
          ConstantTimeEquals(std::string_view(auth).substr(kBearer.size()), ctx.settings.api_key)) {
        return httplib::Server::HandlerResponse::Unhandled;
      }
      res.set_header("WWW-Authenticate", "Bearer");
      // The body (if any) was not read; do not reuse the connection.
      res.set_header("Connection", "close");
      SendError(res, 401,
                auth.empty() ? "missing API key: send \"Authorization: Bearer <key>\""
                             : "invalid API key",
                kInvalidRequest, "invalid_api_key");
      return httplib::Server::HandlerResponse::Handled;
    });

    // Fills a JSON body for statuses httplib produced itself (404 no route,
    // 413 payload too large, 400 unparsable request line ...).
    httplib::Server::HandlerWithResponse on_error = [this](const httplib::Request& req,
                                                           httplib::Response& res) {
      if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
      if (RequestReadTimedOut()) {
        // httplib reports a failed read as 400; the cause was the deadline.
        res.set_header("Connection", "close");
        SendError(res, 408,
                  fmt::format("the request was not received within {} s ([server] "
                              "request_timeout_s); the connection is closed",
                              ctx.settings.request_timeout_s),
                  kInvalidRequest, "request_timeout");
        return httplib::Server::HandlerResponse::Handled;
      }
      switch (res.status) {
        case 404:
          SendError(res, 404, fmt::format("no route for {} {}", req.method, req.path),
                    kInvalidRequest, "not_found");
          break;
        case 413:
          SendError(res, 413,
                    fmt::format("request body is larger than the limit of {} bytes "
                                "([server] max_body_bytes)",
                                ctx.settings.max_body_bytes),
                    kInvalidRequest, "request_too_large");
          break;
        default:
          SendError(res, res.status,
                    res.status == 400 ? std::string("malformed HTTP request")
                                      : fmt::format("HTTP error {}", res.status),
                    res.status >= 500 ? kServerError : kInvalidRequest, "");
      }
      return httplib::Server::HandlerResponse::Handled;
    };
    http.set_error_handler(std::move(on_error));

    http.set_exception_handler(
        [](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
          std::string what = "unknown exception";
          try {
            if (ep) std::rethrow_exception(ep);
          } catch (const std::exception& e) {
            what = e.what();
          } catch (...) {
          }
          spdlog::error("bug: {} {} threw: {}", req.method, req.path, what);
          SendError(res, 500, fmt::format("internal error: {}", what), kServerError,
                    "internal_error");
        });

    http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      ctx.metrics->OnHttpRequest(RouteLabel(req.path), res.status);
      spdlog::info("{} {} {} ({}:{})", req.method, req.path, res.status, req.remote_addr,
                   req.remote_port);
    });
  }

};

Server::Server(ServerSettings settings, Runtime* runtime)
    : impl_(std::make_unique<Impl>(std::move(settings), runtime)) {}

Server::~Server() { Stop(); }

Status Server::Bind() {
  const ServerSettings& s = impl_->ctx.settings;
  if (s.port == 0) {
    const int port = impl_->http.bind_to_any_port(s.host);
    if (port <= 0) {
      return UnavailableError(fmt::format("cannot bind {}: no free port", s.host));
    }
    impl_->port = port;
  } else {
    if (!impl_->http.bind_to_port(s.host, s.port)) {
      return UnavailableError(fmt::format(
          "cannot bind {}:{} (in use, or not a local address); pick another with --port",
          s.host, s.port));
    }
    impl_->port = s.port;
  }
  impl_->http.RaiseListenBacklog();
  return OkStatus();
}

int Server::port() const { return impl_->port; }

Status Server::Run() {
  spdlog::info("serving on http://{}:{} with {} worker threads", impl_->ctx.settings.host,
               impl_->port, impl_->ctx.threads);
  if (!impl_->http.listen_after_bind() && !impl_->ctx.stopping.load()) {
    return InternalError("the HTTP listener stopped unexpectedly");
  }
  return OkStatus();
}

void Server::Stop() {
  impl_->ctx.stopping.store(true);
  impl_->CloseStreams();
  impl_->http.stop();
}

}  // namespace arbiter
