// server/internal/http/http_server.cc — the event-driven HTTP/1.1 server
// (http_server.h; Note [Event loop and workers], Note [Client gone]):
// Server and Server::Impl — binding, the accept loop, routing a parsed
// request to its handler (inline or on the worker pool), stopping.
//
// Built on Boost.Asio (the event loop, sockets, timers) and Boost.Beast's
// HTTP/1.1 request parser (request line, headers, Content-Length and chunked
// bodies, limits). The parts:
//   server_impl.h         Server::Impl, the state the parts share;
//   connection.{h,cc}     one socket's state machine (Note [Connection state
//                         machine]): reading, timeouts, writing;
//   request_reader.{h,cc} the Beast parser glue of a connection;
//   request_parsing.{h,cc} target, path and query decoding;
//   route_table.{h,cc}    route patterns and matching;
//   exchange.{h,cc}       the Responder: serializing responses, the outbox
//                         a handler fills and the loop writes;
//   worker_pool.{h,cc}    the bounded pool that runs kWorker handlers.
//
// Note [Stopping]
// Stop() marks the server stopping (every Responder reports cancelled(),
// Write() returns false), posts to the loop — close the acceptor, close
// idle and reading connections, cancel the exchanges being answered — then
// shuts the worker pool down: queued requests are answered 503 without
// running, running handlers finish and the threads are joined. Then the
// loop releases its work guard: io_context::run() returns once the last
// connection has written its final response and closed (each bounded by
// write_timeout_s; connections still open after a grace period are closed
// hard), and Run() returns.
#include "server/internal/http/http_server.h"

#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <exception>
#include <thread>

#include <boost/asio.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "arbiter/base/log_safe.h"
#include "arbiter/base/mutex.h"
#include "server/internal/http/connection.h"
#include "server/internal/http/exchange.h"
#include "server/internal/http/server_impl.h"

namespace arbiter::http {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;

namespace {

// After Stop() has joined the workers: connections still writing are closed
// hard after this.
constexpr auto kStopGraceTime = std::chrono::seconds(2);
// Accept failed for want of file descriptors: retry after this.
constexpr auto kAcceptRetryTime = std::chrono::milliseconds(100);

// Raises the soft RLIMIT_NOFILE (towards the hard one) so that
// `max_connections` connections, as many being refused, and the process's
// other files fit: Debian's default soft limit is 1024.
void RaiseFileLimit(int max_connections) {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
  const rlim_t want = static_cast<rlim_t>(std::max(0, max_connections)) * 2 + 256;
  if (lim.rlim_cur >= want) return;
  const rlim_t before = lim.rlim_cur;
  lim.rlim_cur = lim.rlim_max == RLIM_INFINITY ? want : std::min(want, lim.rlim_max);
  if (lim.rlim_cur > before && ::setrlimit(RLIMIT_NOFILE, &lim) == 0) {
    spdlog::info("http: raised the open-file limit from {} to {} for max_connections = {}",
                 before, lim.rlim_cur, max_connections);
  }
  if (lim.rlim_cur < want) {
    spdlog::warn("http: the open-file limit ({}) is below what max_connections = {} needs ({}); "
                 "connections beyond it wait in the listen queue",
                 lim.rlim_cur, max_connections, want);
  }
}

std::string Endpoint(const std::string& host, int port) {
  return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port)
                                              : fmt::format("{}:{}", host, port);
}

void RunHandler(const RoutePattern& route, const Request& req, Exchange& ex) {
  try {
    route.handler(req, ex);
  } catch (const std::exception& e) {
    spdlog::error("bug: http: {} {} threw: {}", LogSafe(req.method), LogSafe(req.path),
                  LogSafe(e.what(), kLogSafeMessageBytes));
    // Finish() answers 500 if nothing was sent; a started stream is ended.
  } catch (...) {
    spdlog::error("bug: http: {} {} threw a non-exception", LogSafe(req.method), LogSafe(req.path));
  }
}

}  // namespace

Response DefaultErrorBody(int status, std::string message) {
  Response r;
  r.status = status;
  r.content_type = "application/json";
  nlohmann::json j;
  j["error"] = {{"message", std::move(message)}, {"code", status}};
  // The message may quote request bytes that are not UTF-8 (a path): they
  // become U+FFFD instead of making dump() throw.
  r.body = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return r;
}

// ---- Server::Impl (loop side) -----------------------------------------------------

Response Server::Impl::ErrorResponse(int status, std::string message) const {
  Response r;
  try {
    r = error_body(status, std::move(message));
  } catch (const std::exception& e) {
    spdlog::error("http: the error body hook threw: {}", LogSafe(e.what(), kLogSafeMessageBytes));
    r = DefaultErrorBody(status, "error");
  }
  r.status = status;
  if (status == 503) r.headers.emplace_back("Retry-After", std::to_string(options.retry_after_s));
  return r;
}

Server::Impl::Dispatched Server::Impl::DispatchRequest(const std::shared_ptr<Request>& req,
                                                       const std::vector<std::string>& segments,
                                                       const std::shared_ptr<Exchange>& ex,
                                                       Response* answer) {
  if (pre_routing) {
    std::optional<Response> early;
    try {
      early = pre_routing(*req);
    } catch (const std::exception& e) {
      spdlog::error("bug: http: the pre-routing hook threw: {}",
                    LogSafe(e.what(), kLogSafeMessageBytes));
      early = ErrorResponse(500, fmt::format("internal error: {}", e.what()));
    }
    if (early) {
      *answer = std::move(*early);
      return Dispatched::kAnswerNow;
    }
  }

  std::vector<std::string> allowed;  // methods of routes matching the path
  const RoutePattern* route = routes.Find(req->method, segments, &req->params, &allowed);
  if (route == nullptr && allowed.empty()) {
    *answer = ErrorResponse(404, fmt::format("no route for {} {}", req->method, req->path));
    return Dispatched::kAnswerNow;
  }
  if (route == nullptr) {
    std::string allow;
    for (const std::string& m : allowed) allow += (allow.empty() ? "" : ", ") + m;
    *answer = ErrorResponse(
        405, fmt::format("{} is not allowed on {} (allowed: {})", req->method, req->path, allow));
    answer->headers.emplace_back("Allow", allow);
    return Dispatched::kAnswerNow;
  }

  if (route->dispatch == Dispatch::kInline) {
    RunHandler(*route, *req, *ex);
    ex->Finish();  // posts the pump
    return Dispatched::kRanInline;
  }
  Impl* s = this;
  WorkerPool::Job job;
  job.run = [s, route, req, ex] {
    uint64_t id = 0;
    {
      MutexLock l(&s->running_mu);
      id = s->next_running_id++;
      s->running[id] = {req->method, req->path, req->remote_addr, req->remote_port,
                        std::chrono::steady_clock::now()};
    }
    RunHandler(*route, *req, *ex);
    {
      MutexLock l(&s->running_mu);
      s->running.erase(id);
    }
    ex->Finish();
  };
  job.drop = [s, ex] {
    ex->Send(s->ErrorResponse(503, "the server is stopping"));
    ex->Finish();
  };
  if (!pool.TrySubmit(std::move(job))) {
    if (stopping.load()) {
      *answer = ErrorResponse(503, "the server is stopping");
      return Dispatched::kAnswerNow;
    }
    queue_full_total.fetch_add(1);
    *answer = ErrorResponse(503, fmt::format("every worker is busy and {} requests are waiting "
                                             "(worker_queue_max); retry later",
                                             options.worker_queue_max));
    return Dispatched::kAnswerNow;
  }
  return Dispatched::kQueued;
}

void Server::Impl::LogResponse(const Request* req, int status) {
  requests_total.fetch_add(1);
  if (!logger) return;
  static const Request kNone;
  try {
    logger(req ? *req : kNone, status);
  } catch (const std::exception& e) {
    spdlog::error("bug: http: the logger threw: {}", LogSafe(e.what(), kLogSafeMessageBytes));
  }
}

void Server::Impl::Accept() {
  acceptor.async_accept([this](const error_code& ec, tcp::socket socket) {
    OnAccept(ec, std::move(socket));
  });
}

void Server::Impl::OnAccept(const error_code& ec, tcp::socket socket) {
  if (!acceptor.is_open() || ec == asio::error::operation_aborted) return;
  if (ec) {
    if (ec == asio::error::no_descriptors || ec.value() == ENFILE || ec.value() == ENOBUFS ||
        ec.value() == ENOMEM) {
      if (!accept_error_logged) {
        spdlog::warn("http: cannot accept connections: {} ({} open); retrying", ec.message(),
                     n_open);
        accept_error_logged = true;
      }
      accept_retry.expires_after(kAcceptRetryTime);
      accept_retry.async_wait([this](const error_code& e) {
        if (!e && acceptor.is_open()) Accept();
      });
      return;
    }
    Accept();
    return;
  }
  accept_error_logged = false;
  accepted_total.fetch_add(1);
  auto c = std::make_shared<Connection>(this, std::move(socket));
  if (n_open >= options.max_connections) {
    rejected_total.fetch_add(1);
    if (n_rejecting < options.max_connections) {
      ++n_rejecting;
      connections.emplace(c.get(), c);
      c->Reject(n_open);
    }  // else: dropped at once (the socket closes with `c`)
  } else {
    ++n_open;
    open_connections.store(n_open);
    connections.emplace(c.get(), c);
    c->Start();
  }
  Accept();
}

void Server::Impl::Forget(Connection* c) {
  auto it = connections.find(c);
  if (it == connections.end()) return;
  if (c->rejected()) {
    --n_rejecting;
  } else {
    --n_open;
    open_connections.store(n_open);
  }
  // The map's reference may be the last one: keep it alive until the
  // caller (a method of `c`) has returned.
  asio::post(io, [keep = std::move(it->second)] {});
  connections.erase(it);
  MaybeFinishStop();
}

void Server::Impl::StopOnLoop() {
  error_code ec;
  acceptor.close(ec);
  accept_retry.cancel();
  std::vector<std::shared_ptr<Connection>> all;
  all.reserve(connections.size());
  for (auto& [ptr, c] : connections) all.push_back(c);
  for (auto& c : all) c->OnStop();
}

void Server::Impl::MaybeFinishStop() {
  if (stop_released && connections.empty()) {
    stop_grace.cancel();
  }
}

// ---- Server ------------------------------------------------------------------------

Server::Server(ServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

Server::~Server() { Stop(); }

void Server::Route(std::string method, std::string pattern, Dispatch dispatch, Handler handler) {
  impl_->routes.Add(std::move(method), pattern, dispatch, std::move(handler));
}

void Server::SetPreRouting(PreRouting hook) { impl_->pre_routing = std::move(hook); }

void Server::SetResponseHeaders(ResponseHeaders hook) {
  impl_->response_headers = std::move(hook);
}
void Server::SetLogger(Logger logger) { impl_->logger = std::move(logger); }
void Server::SetErrorBody(ErrorBody error_body) {
  if (error_body) impl_->error_body = std::move(error_body);
}

Status Server::Bind() {
  Impl& s = *impl_;
  const ServerOptions& o = s.options;
  {
    MutexLock l(&s.state_mu);
    if (s.state != Impl::State::kNew) {
      return FailedPreconditionError("http server: Bind() called twice or after Stop()");
    }
  }
  if (o.port < 0 || o.port > 65535) {
    return InvalidArgumentError(fmt::format("port {} is out of range (0-65535)", o.port));
  }
  error_code ec;
  const std::string host = o.host == "localhost" ? std::string("127.0.0.1") : o.host;
  const asio::ip::address address = asio::ip::make_address(host, ec);
  if (ec) {
    return InvalidArgumentError(fmt::format(
        "host \"{}\" is not a valid IP address (use an IPv4 or IPv6 literal such as 127.0.0.1, "
        "0.0.0.0 or ::1)",
        o.host));
  }
  const tcp::endpoint endpoint(address, static_cast<unsigned short>(o.port));
  const std::string where = Endpoint(host, o.port);
  s.acceptor.open(endpoint.protocol(), ec);
  if (ec) return UnavailableError(fmt::format("cannot open a socket for {}: {}", where, ec.message()));
  // SO_REUSEADDR only (a restart may bind while old connections are in
  // TIME_WAIT); never SO_REUSEPORT, which would let a second server share
  // the port.
  s.acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  s.acceptor.bind(endpoint, ec);
  if (ec) {
    error_code ignored;
    s.acceptor.close(ignored);
    if (ec == asio::error::address_in_use) {
      return UnavailableError(fmt::format(
          "address {} is already in use (another arbiter serve, or another program, listens "
          "there); stop it or pick another port",
          where));
    }
    if (ec == asio::error::access_denied || ec.value() == EPERM) {
      return PermissionDeniedError(fmt::format(
          "cannot bind {}: permission denied (ports below 1024 need root or "
          "CAP_NET_BIND_SERVICE); pick a port above 1023",
          where));
    }
    if (ec.value() == EADDRNOTAVAIL) {
      return InvalidArgumentError(fmt::format(
          "cannot bind {}: {} is not an address of this machine", where, host));
    }
    return UnavailableError(fmt::format("cannot bind {}: {}", where, ec.message()));
  }
  s.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    error_code ignored;
    s.acceptor.close(ignored);
    return UnavailableError(fmt::format("cannot listen on {}: {}", where, ec.message()));
  }
  s.bound_port = s.acceptor.local_endpoint(ec).port();
  RaiseFileLimit(o.max_connections);
  MutexLock l(&s.state_mu);
  s.state = Impl::State::kBound;
  return OkStatus();
}

int Server::port() const { return impl_->bound_port; }

Status Server::Run() {
  Impl& s = *impl_;
  {
    MutexLock l(&s.state_mu);
    if (s.state == Impl::State::kStopped || s.state == Impl::State::kStopping) return OkStatus();
    if (s.state != Impl::State::kBound) {
      return FailedPreconditionError("http server: Run() before a successful Bind()");
    }
    s.state = Impl::State::kRunning;
    s.loop_thread = std::this_thread::get_id();
    s.work_guard.emplace(s.io.get_executor());
    s.pool.Start();
  }
  s.Accept();
  Status result = OkStatus();
  try {
    s.io.run();
  } catch (const std::exception& e) {
    spdlog::error("bug: http: the event loop threw: {}", e.what());
    result = InternalError(fmt::format("the HTTP event loop failed: {}", e.what()));
  }
  {
    MutexLock l(&s.state_mu);
    if (s.state == Impl::State::kRunning) {
      // The loop died on its own: stop what is left.
      s.state = Impl::State::kStopping;
    }
  }
  s.stopping.store(true);
  s.pool.Shutdown();
  // Connections left are closed with the io_context.
  {
    MutexLock l(&s.state_mu);
    s.state = Impl::State::kStopped;
    s.state_cv.SignalAll();
  }
  return result;
}

void Server::Stop() {
  Impl& s = *impl_;
  {
    MutexLock l(&s.state_mu);
    switch (s.state) {
      case Impl::State::kNew:
      case Impl::State::kBound: {
        s.state = Impl::State::kStopped;
        s.stopping.store(true);
        error_code ec;
        s.acceptor.close(ec);
        return;
      }
      case Impl::State::kStopping:
        while (s.state != Impl::State::kStopped) s.state_cv.Wait();
        return;
      case Impl::State::kStopped:
        return;
      case Impl::State::kRunning:
        s.state = Impl::State::kStopping;
        break;
    }
  }
  s.stopping.store(true);
  asio::post(s.io, [&s] { s.StopOnLoop(); });
  s.pool.Shutdown();  // queued → 503; running handlers finish; joined
  asio::post(s.io, [&s] {
    // Workers are gone: nothing more will be posted. run() returns when the
    // last connection has closed; the grace timer bounds the wait.
    s.work_guard.reset();
    s.stop_released = true;
    if (s.connections.empty()) return;
    s.stop_grace.expires_after(kStopGraceTime +
                               std::chrono::seconds(std::max(1, s.options.write_timeout_s)));
    s.stop_grace.async_wait([&s](const error_code& ec) {
      if (ec) return;
      std::vector<std::shared_ptr<Connection>> all;
      for (auto& [ptr, c] : s.connections) all.push_back(c);
      for (auto& c : all) c->Close();
    });
  });
  MutexLock l(&s.state_mu);
  while (s.state != Impl::State::kStopped) s.state_cv.Wait();
}

std::vector<RunningRequest> Server::Running() const {
  const Impl& s = *impl_;
  MutexLock l(&s.running_mu);
  std::vector<RunningRequest> out;
  out.reserve(s.running.size());
  for (const auto& [id, r] : s.running) out.push_back(r);
  return out;
}

ServerStats Server::stats() const {
  const Impl& s = *impl_;
  ServerStats st;
  st.open_connections = s.open_connections.load();
  st.accepted_total = s.accepted_total.load();
  st.rejected_total = s.rejected_total.load();
  st.requests_total = s.requests_total.load();
  st.queue_full_total = s.queue_full_total.load();
  st.timeouts_total = s.timeouts_total.load();
  st.workers_busy = s.pool.busy();
  st.queued = s.pool.queued();
  return st;
}

}  // namespace arbiter::http
