// server/internal/http/http_server.h — arbiter's HTTP/1.1 transport: an
// event-driven server (one event-loop thread owns every socket) with a
// bounded worker pool for handlers that block.
//
// What it does for the route layer: accepts connections, parses requests
// into native `Request`s (headers, percent-decoded path, query and path
// parameters, the whole body), enforces the edge's limits (body size,
// per-read and whole-request deadlines, keep-alive caps, a connection cap),
// routes by method and path pattern, and hands each request to its handler
// with a `Responder` through which the handler answers once (`Send`) or
// streams (`StartStream`, `Write`…, `End`, chunked transfer encoding).
//
// Note [Event loop and workers]
// One thread — the one that calls Run() — runs the event loop (Boost.Asio's
// io_context) and owns every socket: accepting, reading, parsing, timeouts
// and writing all happen there, so an idle or half-sent connection costs a
// socket and a few KiB, never a thread. A route is either
//   kInline  its handler runs on the loop itself; it must answer at once and
//            never block (health, metrics, status snapshots), and is
//            therefore answered even while every worker is blocked;
//   kWorker  its handler runs on one of `worker_threads` pool threads and may
//            block for minutes (generation, model loads). When all workers
//            are busy the request waits in a FIFO; when `worker_queue_max`
//            requests already wait, the transport answers 503 with
//            Retry-After (and runs nothing).
// A worker never touches a socket: its Responder appends bytes to the
// request's outbox and posts to the loop, which writes them. Streaming is
// back-pressured: Write() blocks while more than `stream_buffer_bytes` are
// queued and not yet written, at most `write_timeout_s` without progress,
// and returns false once the client is gone, the write timed out or the
// server stops — so a stream whose client went away never holds its worker
// longer than write_timeout_s.
//
// Note [Client gone]
// While a worker handler runs, the loop keeps reading the connection: bytes
// (a pipelined next request) are buffered for later, up to 64 KiB; EOF or a
// reset marks the request cancelled (Responder::cancelled()), so generation
// can stop between tokens even when it sends nothing until the end. A
// client that half-closes its side after sending the request
// (shutdown(SHUT_WR)) therefore looks gone; HTTP clients do not do that.
// Stop() also cancels every Responder.
//
// Limits (ServerOptions; transport errors get bodies from SetErrorBody):
//   400  malformed request line, header or chunked framing, ambiguous body
//        framing (Content-Length with Transfer-Encoding, two lengths, a
//        Transfer-Encoding other than chunked; the connection is closed);
//        431 a header block over max_header_bytes;
//   404  no route for the path; 405 (with Allow) a route for the path exists
//        but not for the method;
//   408  the request did not arrive whole within request_timeout_s of its
//        first byte, or no byte came for read_timeout_s in the middle of it
//        (slowloris guard); the connection is closed;
//   413  body over max_body_bytes (refused from Content-Length before any
//        body byte is read; chunked bodies are counted as they arrive);
//   503  over max_connections open connections (sent at once on accept,
//        then the connection is closed), or the worker queue is full; both
//        with Retry-After.
// An idle keep-alive connection is closed after keep_alive_timeout_s (also
// before its first request); a connection serves at most keep_alive_max
// requests. `Expect: 100-continue` is answered before the body is read.
// Requests on one connection are answered in order (pipelining). HEAD is
// not special: route it explicitly if needed (otherwise 405).
//
// Usage:
//   http::Server server(options);
//   server.Route("GET", "/health", http::Dispatch::kInline,
//                [](const http::Request&, http::Responder& r) {
//                  http::Response res;
//                  res.content_type = "application/json";
//                  res.body = R"({"status":"ok"})";
//                  r.Send(std::move(res));
//                });
//   server.Route("POST", "/admin/models/{name}/load", http::Dispatch::kWorker,
//                [&](const http::Request& req, http::Responder& r) {
//                  Load(req.params.at("name"), r);
//                });
//   if (Status s = server.Bind(); !s.ok()) return s;
//   std::thread loop([&] { server.Run().IgnoreError(); });
//   ...
//   server.Stop();  // from any thread but the loop's and the workers'
//   loop.join();
//
// Thread safety: Route, SetPreRouting, SetLogger and SetErrorBody are
// thread-compatible and must be called before Bind(). Bind, Run and Stop may
// be called from different threads; Stop() is idempotent and thread-safe
// (REQUIRES: not called from a handler or a hook, which run on the loop and
// the workers it joins). stats() is thread-safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "arbiter/base/cancel.h"
#include "arbiter/base/status.h"

namespace arbiter::http {

// ASCII case-insensitive ordering, for header names.
struct CaseInsensitiveLess {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const;
};

// Header fields as received, in order per name; lookup ignores case.
using Headers = std::multimap<std::string, std::string, CaseInsensitiveLess>;

// One parsed request. Everything is decoded before the handler runs.
struct Request {
  std::string method;  // "GET", "POST", "OPTIONS", ... as received (case-sensitive)
  std::string target;  // the request-target as received ("/v1/x?y=1")
  std::string path;    // percent-decoded target without the query
  // Path parameters named by the route pattern ("{name}"), percent-decoded.
  std::map<std::string, std::string> params;
  // Query parameters, percent-decoded ('+' is a space), in order per name.
  std::multimap<std::string, std::string> query;
  Headers headers;
  std::string body;  // the whole body (≤ max_body_bytes), chunked framing removed
  int version = 11;  // 10 = HTTP/1.0, 11 = HTTP/1.1
  std::string remote_addr;  // numeric peer address
  int remote_port = 0;

  bool has_query(std::string_view name) const;
  // The first value of query parameter `name`, "" if absent.
  std::string query_value(std::string_view name) const;
  bool has_header(std::string_view name) const;
  // The first value of header `name` (any case), "" if absent.
  std::string header(std::string_view name) const;
};

// A complete response. The transport adds Content-Length, Connection and
// (for transport errors) Retry-After / Allow; `headers` must not carry
// Content-Length or Transfer-Encoding. `Connection: close` in `headers`
// closes the connection after this response.
struct Response {
  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string content_type;  // "" = no Content-Type header
  std::string body;
};

// How a handler answers its request: exactly one of Send(), or
// StartStream() + Write()* + End(). Implemented by the transport; route
// tests implement it in memory.
//
// Lifetime: valid until the handler returns. A handler that returns without
// answering gets a 500; one that started a stream and returns without End()
// has its stream ended (terminating chunk).
// Thread safety: methods are called by the thread running the handler;
// cancelled() may be called from any thread.
class Responder {
 public:
  virtual ~Responder() = default;

  // Sends a complete response. Once.
  virtual void Send(Response response) = 0;

  // Starts a streamed response: the status line and headers now, then the
  // body in Write() chunks (chunked transfer encoding on HTTP/1.1; on
  // HTTP/1.0 the body runs until the connection closes). False when the
  // client is already gone or the server is stopping.
  virtual bool StartStream(int status, std::string content_type,
                           std::vector<std::pair<std::string, std::string>> headers) = 0;

  // Queues `chunk` (empty chunks are skipped). Blocks while the stream's
  // buffer is full, at most write_timeout_s without progress. False once the
  // client is gone, a write timed out or the server is stopping; the
  // handler should then stop producing. REQUIRES: StartStream() returned
  // true. On an inline (event-loop) handler it never blocks.
  virtual bool Write(std::string_view chunk) = 0;

  // Ends the stream (terminating chunk). REQUIRES: StartStream() was called.
  virtual void End() = 0;

  // True once the peer hung up (Note [Client gone]), a write failed, or the
  // server is stopping. Cheap; polled by generation between tokens.
  virtual bool cancelled() const = 0;

  // Fires when cancelled() becomes true (hang-up, failed write, Stop()), so
  // a call blocked on this request's behalf — a wait for a KV slot — is
  // woken at once instead of polling cancelled() (base/cancel.h).
  virtual CancelToken cancel_token() const = 0;
};

using Handler = std::function<void(const Request&, Responder&)>;

enum class Dispatch {
  kInline,  // runs on the event loop; must never block (health, metrics, status)
  kWorker,  // runs on the worker pool; may block for minutes (generation, loads)
};

struct ServerOptions {
  // An IP literal (IPv4 or IPv6) or "localhost" (= 127.0.0.1).
  std::string host = "127.0.0.1";
  int port = 8080;  // 0 = any free port (see Server::port())

  size_t max_body_bytes = 8u << 20;    // request bodies above → 413
  // Per-path body limits replacing max_body_bytes for requests to exactly
  // that path (e.g. audio uploads): path → {bytes, the setting's name for
  // the 413 message}. Applied once the header is read, before any body byte.
  std::map<std::string, std::pair<size_t, std::string>> path_body_limits;
  size_t max_header_bytes = 16 << 10;  // request line + header block above → 431
  int read_timeout_s = 30;             // longest pause inside a request → 408
  int request_timeout_s = 60;          // a whole request (headers + body) from its first byte → 408
  int write_timeout_s = 30;            // longest pause while writing; then the connection is closed
  int keep_alive_max = 100;            // requests per connection
  int keep_alive_timeout_s = 5;        // idle seconds before an open connection is closed
  int max_connections = 1024;          // open connections beyond → immediate 503 and close
  int worker_threads = 16;             // the worker pool (Dispatch::kWorker)
  int worker_queue_max = 256;          // requests waiting for a worker beyond → 503
  size_t stream_buffer_bytes = 256 << 10;  // a stream's queued, unwritten bytes before Write() blocks
  int retry_after_s = 5;               // Retry-After of the transport's 503s
};

// Counters and gauges of the transport (thread-safe snapshot).
struct ServerStats {
  int64_t open_connections = 0;      // accepted and not yet closed (the cap counts these)
  uint64_t accepted_total = 0;       // connections accepted, rejected ones included
  uint64_t rejected_total = 0;       // closed at once with 503: over max_connections
  uint64_t requests_total = 0;       // responses finished (logged), transport errors included
  uint64_t queue_full_total = 0;     // 503: the worker queue was full
  uint64_t timeouts_total = 0;       // 408s and idle/write-timeout closes
  int64_t workers_busy = 0;          // worker handlers running now
  int64_t queued = 0;                // requests waiting for a worker now
};

// A request whose handler is running on a worker (Server::Running()).
struct RunningRequest {
  std::string method;
  std::string path;         // percent-decoded, as received: escape it before logging
  std::string remote_addr;  // numeric peer address
  int remote_port = 0;
  std::chrono::steady_clock::time_point since;  // when its handler started
};

// Runs before routing for every parsed request (on the event loop; must not
// block). Returning a Response answers the request with it and skips the
// handler (e.g. 401); nullopt lets the request through.
using PreRouting = std::function<std::optional<Response>(const Request&)>;
// Called once per finished response (on the event loop; must not block),
// with the request as far as it was parsed (for transport errors the method
// or path may be empty) and the status sent.
using Logger = std::function<void(const Request&, int status)>;
// Builds the body of a transport error (400, 404, 405, 408, 413, 431, 500,
// 503); `message` says what happened in words. Default: a JSON
// {"error":{"message":...}} body.
using ErrorBody = std::function<Response(int status, std::string message)>;
// Headers added to every response of a parsed request — handlers',
// pre-routing's and transport errors' alike, streams included (e.g. CORS).
// Called once per request on the event loop when it has been read; must
// not block.
using ResponseHeaders =
    std::function<std::vector<std::pair<std::string, std::string>>(const Request&)>;

class Server {
 public:
  explicit Server(ServerOptions options);
  ~Server();  // Stop()s
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Routes `method` requests whose path matches `pattern`: literal segments
  // and "{name}" segments (one non-empty segment, percent-decoded into
  // Request::params["name"]); a last segment "{name...}" matches the rest of
  // the path (one or more segments). Literal routes win over parameter
  // routes; otherwise the first registered match wins.
  // REQUIRES: before Bind(); pattern starts with '/'.
  void Route(std::string method, std::string pattern, Dispatch dispatch, Handler handler);
  void SetPreRouting(PreRouting hook);
  void SetLogger(Logger logger);
  void SetErrorBody(ErrorBody error_body);
  void SetResponseHeaders(ResponseHeaders hook);

  // Opens the listening socket (SO_REUSEADDR, never SO_REUSEPORT: a second
  // server on the same port fails here). Errors: InvalidArgument "host \"x\"
  // is not a valid IP address"; Unavailable "address H:P is already in
  // use"; PermissionDenied for privileged ports; InvalidArgument when the
  // address is not one of this machine's. Raises the process's soft
  // RLIMIT_NOFILE (up to the hard limit) to fit 2 × max_connections + 256
  // descriptors.
  Status Bind();
  // The bound port (the chosen one for port 0); -1 before Bind().
  int port() const;
  // Serves on the calling thread (the event loop) until Stop(). Returns at
  // once if Stop() was already called. REQUIRES: Bind() succeeded.
  Status Run();
  // Stops accepting, cancels every Responder, answers queued worker
  // requests 503, waits for running handlers to return and for Run() to
  // return. Idempotent; thread-safe.
  void Stop();

  ServerStats stats() const;
  // The worker handlers running now, oldest first (the requests a stuck
  // shutdown abandons). Thread-safe.
  std::vector<RunningRequest> Running() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace arbiter::http
