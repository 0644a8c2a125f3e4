// server/internal/http/server_impl.h — Server::Impl, the state the HTTP
// transport's parts share (http_server.h): options, routes and hooks, the
// event loop and its acceptor, the worker pool, the open connections, the
// lifecycle and the stats. Defined in http_server.cc; Connection and
// Exchange reach the server through it.
//
// Thread safety: `options`, `routes` and the hooks are immutable once Bind()
// is called; the fields marked "loop thread only" belong to the event loop;
// `stopping` and the stats are atomics; `state` is GUARDED_BY(state_mu).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <boost/asio.hpp>

#include "arbiter/base/mutex.h"
#include "server/internal/http/http_server.h"
#include "server/internal/http/request_reader.h"
#include "server/internal/http/route_table.h"
#include "server/internal/http/worker_pool.h"

namespace arbiter::http {

class Connection;
class Exchange;

// The default ErrorBody: {"error":{"message":...,"code":status}}.
Response DefaultErrorBody(int status, std::string message);

struct Server::Impl {
  explicit Impl(ServerOptions o)
      : options(std::move(o)),
        acceptor(io),
        accept_retry(io),
        stop_grace(io),
        pool(std::max(1, options.worker_threads), std::max(0, options.worker_queue_max)) {}

  const ServerOptions options;
  RouteTable routes;  // immutable once Bind() is called
  PreRouting pre_routing;
  Logger logger;
  ErrorBody error_body = DefaultErrorBody;
  ResponseHeaders response_headers;

  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor acceptor;
  boost::asio::steady_timer accept_retry;
  boost::asio::steady_timer stop_grace;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>>
      work_guard;
  int bound_port = -1;
  std::thread::id loop_thread;  // set by Run() before any handler runs

  WorkerPool pool;

  // Loop thread only.
  std::unordered_map<Connection*, std::shared_ptr<Connection>> connections;
  int64_t n_open = 0;       // connections counted by the cap
  int64_t n_rejecting = 0;  // connections being answered 503 (over the cap)
  bool accept_error_logged = false;
  std::vector<char> read_scratch = std::vector<char>(kReadChunkBytes);

  std::atomic<bool> stopping{false};

  // Worker handlers running now (Server::Running()), by a running number.
  mutable Mutex running_mu;
  std::map<uint64_t, RunningRequest> running GUARDED_BY(running_mu);
  uint64_t next_running_id GUARDED_BY(running_mu) = 0;

  // Lifecycle: kNew → kBound → kRunning → kStopping → kStopped.
  enum class State { kNew, kBound, kRunning, kStopping, kStopped };
  Mutex state_mu;
  CondVar state_cv{&state_mu};
  State state GUARDED_BY(state_mu) = State::kNew;

  // Stats.
  std::atomic<int64_t> open_connections{0};
  std::atomic<uint64_t> accepted_total{0};
  std::atomic<uint64_t> rejected_total{0};
  std::atomic<uint64_t> requests_total{0};
  std::atomic<uint64_t> queue_full_total{0};
  std::atomic<uint64_t> timeouts_total{0};

  bool OnLoopThread() const { return std::this_thread::get_id() == loop_thread; }

  // A transport error response, with the error body hook's body (and
  // Retry-After on a 503).
  Response ErrorResponse(int status, std::string message) const;

  // What DispatchRequest() did with a request.
  enum class Dispatched {
    kAnswerNow,  // *answer is the response: the pre-routing hook's, 404,
                 // 405, or 503 (queue full, stopping); no handler runs
    kRanInline,  // an inline handler ran and the exchange is Finish()ed
    kQueued,     // a worker will run the handler (or answer 503 on Stop())
  };
  // Loop: runs the pre-routing hook on `req` (its decoded path `segments`),
  // routes it and runs or queues its handler, which answers through `ex`.
  Dispatched DispatchRequest(const std::shared_ptr<Request>& req,
                             const std::vector<std::string>& segments,
                             const std::shared_ptr<Exchange>& ex, Response* answer);

  // Loop: counts a finished response and calls the logger hook with its
  // request (nullptr: an empty Request).
  void LogResponse(const Request* req, int status);

  void Accept();
  void OnAccept(const boost::system::error_code& ec, boost::asio::ip::tcp::socket socket);
  void StopOnLoop();
  void Forget(Connection* c);
  void MaybeFinishStop();
  bool stop_released = false;  // loop thread: the work guard is gone
};

}  // namespace arbiter::http
