// server/internal/http/http_server.cc — the event-driven HTTP/1.1 server
// (http_server.h; Note [Event loop and workers], Note [Client gone]).
//
// Built on Boost.Asio (the event loop, sockets, timers) and Boost.Beast's
// HTTP/1.1 request parser (request line, headers, Content-Length and chunked
// bodies, limits). Responses are serialized here: they are simple, and the
// bytes of a streamed response have to be produced on worker threads.
//
// Note [Connection state machine]
// Every Connection lives on the event-loop thread; only its Exchange (the
// Responder of the request being answered) is shared with a worker. Phases:
//   kIdle      waiting for the first byte of a request; the read timer
//              closes the connection after keep_alive_timeout_s.
//   kReading   a request has begun: bytes are fed to the parser as they
//              arrive; the read timer fires at min(last byte +
//              read_timeout_s, first byte + request_timeout_s) and answers
//              408. `Expect: 100-continue` is answered when the header is
//              complete and the body still to come.
//   kHandling  the request (or a transport error) is being answered through
//              `exchange_`. The loop keeps a read pending (Note [Client
//              gone]): bytes are kept for the next request, EOF or an error
//              cancels the exchange. Whenever the exchange has bytes the loop
//              writes them (one write in flight, write_timeout_s each, else
//              the connection is closed). When the exchange is finished and
//              everything is written: the next request (kReading at once if
//              pipelined bytes are buffered, else kIdle), or kClosing.
//   kClosing   lingering close: our side is shut down for sending and the
//              peer's remaining bytes are read and dropped (so the kernel
//              does not answer them with a reset that could destroy the
//              response in flight) until EOF or 2 s; then kClosed.
//   kClosed    the socket is closed and the connection forgotten; pending
//              handlers see operation_aborted and return.
// Timer and read completions carry a sequence number so a stale expiry never
// acts on a later phase. A read is never cancelled except by closing: when a
// timer ends a request, its pending read simply becomes the watch read of
// the error response.
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
#include <atomic>
#include <cerrno>
#include <chrono>
#include <deque>
#include <exception>
#include <thread>
#include <unordered_map>

#include <boost/asio.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "arbiter/base/mutex.h"

namespace arbiter::http {

namespace asio = boost::asio;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using SteadyClock = std::chrono::steady_clock;
using boost::system::error_code;

namespace {

// Bytes read from a socket at once (into the loop's one scratch buffer: a
// connection waits for readability with no buffer of its own).
constexpr size_t kReadChunkBytes = 64 << 10;
// While a request is being answered, pipelined bytes buffered beyond this
// stop the watch read (Note [Client gone]).
constexpr size_t kMaxPipelinedBytes = 64 << 10;
// Lingering close: how long the peer's remaining bytes are drained.
constexpr auto kLingerTime = std::chrono::seconds(2);
// After Stop() has joined the workers: connections still writing are closed
// hard after this.
constexpr auto kStopGraceTime = std::chrono::seconds(2);
// Accept failed for want of file descriptors: retry after this.
constexpr auto kAcceptRetryTime = std::chrono::milliseconds(100);
// A blocked Write() gives up on its own this long after write_timeout_s
// without progress (the loop's write timer normally ends it first).
constexpr auto kWriteFuseSlack = std::chrono::seconds(5);

char Lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

bool IEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (Lower(a[i]) != Lower(b[i])) return false;
  }
  return true;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Percent-decodes `in` ('+' → ' ' when `plus_is_space`). False on a
// malformed escape.
bool PercentDecode(std::string_view in, bool plus_is_space, std::string* out) {
  out->clear();
  out->reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    const char c = in[i];
    if (c == '%') {
      if (i + 2 >= in.size()) return false;
      const int hi = HexValue(in[i + 1]);
      const int lo = HexValue(in[i + 2]);
      if (hi < 0 || lo < 0) return false;
      out->push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else if (c == '+' && plus_is_space) {
      out->push_back(' ');
    } else {
      out->push_back(c);
    }
  }
  return true;
}

std::vector<std::string_view> SplitPath(std::string_view path) {
  std::vector<std::string_view> segments;
  size_t start = 1;  // path starts with '/'
  while (start <= path.size()) {
    const size_t slash = path.find('/', start);
    const size_t end = slash == std::string_view::npos ? path.size() : slash;
    segments.push_back(path.substr(start, end - start));
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  return segments;
}

std::string_view StatusText(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 206: return "Partial Content";
    case 301: return "Moved Permanently";
    case 302: return "Found";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 410: return "Gone";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Status";
  }
}

// True for the headers the transport writes itself.
bool IsFramingHeader(std::string_view name) {
  return IEquals(name, "Content-Length") || IEquals(name, "Transfer-Encoding") ||
         IEquals(name, "Connection");
}

Response DefaultErrorBody(int status, std::string message) {
  Response r;
  r.status = status;
  r.content_type = "application/json";
  nlohmann::json j;
  j["error"] = {{"message", std::move(message)}, {"code", status}};
  r.body = j.dump();
  return r;
}

}  // namespace

bool CaseInsensitiveLess::operator()(std::string_view a, std::string_view b) const {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const char x = Lower(a[i]);
    const char y = Lower(b[i]);
    if (x != y) return x < y;
  }
  return a.size() < b.size();
}

bool Request::has_query(std::string_view name) const {
  return query.find(std::string(name)) != query.end();
}

std::string Request::query_value(std::string_view name) const {
  auto it = query.find(std::string(name));
  return it == query.end() ? std::string() : it->second;
}

bool Request::has_header(std::string_view name) const { return headers.find(name) != headers.end(); }

std::string Request::header(std::string_view name) const {
  auto it = headers.find(name);
  return it == headers.end() ? std::string() : it->second;
}

// ---- the worker pool ---------------------------------------------------------

namespace {

// A fixed set of threads running jobs from a bounded FIFO.
// Thread safety: thread-safe.
class WorkerPool {
 public:
  struct Job {
    std::function<void()> run;   // on a worker
    std::function<void()> drop;  // instead of run, when the pool shuts down first
  };

  WorkerPool(int threads, int queue_max) : n_threads_(threads), queue_max_(queue_max) {}
  ~WorkerPool() { Shutdown(); }

  void Start() EXCLUDES(mu_) {
    MutexLock l(&mu_);
    if (started_ || stopped_) return;
    started_ = true;
    for (int i = 0; i < n_threads_; ++i) threads_.emplace_back([this] { Loop(); });
  }

  // False when `queue_max` jobs already wait beyond the idle workers, or
  // the pool is shut down.
  bool TrySubmit(Job job) EXCLUDES(mu_) {
    MutexLock l(&mu_);
    if (stopped_ || static_cast<int>(queue_.size()) >= queue_max_ + idle_) return false;
    queue_.push_back(std::move(job));
    queued_.store(static_cast<int64_t>(queue_.size()));
    wake_.Signal();
    return true;
  }

  // Drops the queued jobs (calling their `drop`), lets running jobs finish
  // and joins the threads. Idempotent.
  void Shutdown() EXCLUDES(mu_) {
    std::deque<Job> dropped;
    std::vector<std::thread> threads;
    {
      MutexLock l(&mu_);
      stopped_ = true;
      dropped.swap(queue_);
      queued_.store(0);
      threads.swap(threads_);
      wake_.SignalAll();
    }
    for (Job& job : dropped) {
      if (job.drop) job.drop();
    }
    for (std::thread& t : threads) t.join();
  }

  int64_t busy() const { return busy_.load(); }
  int64_t queued() const { return queued_.load(); }

 private:
  void Loop() EXCLUDES(mu_) {
    while (true) {
      Job job;
      {
        MutexLock l(&mu_);
        ++idle_;
        while (!stopped_ && queue_.empty()) wake_.Wait();
        --idle_;
        if (queue_.empty()) return;  // stopped
        job = std::move(queue_.front());
        queue_.pop_front();
        queued_.store(static_cast<int64_t>(queue_.size()));
        busy_.fetch_add(1);
      }
      job.run();
      job = Job();  // destroy captures outside the lock, before counting idle
      busy_.fetch_sub(1);
    }
  }

  const int n_threads_;
  const int queue_max_;
  Mutex mu_;
  CondVar wake_{&mu_};
  std::deque<Job> queue_ GUARDED_BY(mu_);
  std::vector<std::thread> threads_ GUARDED_BY(mu_);
  int idle_ GUARDED_BY(mu_) = 0;  // workers waiting for a job
  bool started_ GUARDED_BY(mu_) = false;
  bool stopped_ GUARDED_BY(mu_) = false;
  std::atomic<int64_t> busy_{0};
  std::atomic<int64_t> queued_{0};
};

struct RoutePattern {
  struct Segment {
    std::string literal;  // when !param
    std::string name;     // parameter name when param
    bool param = false;
    bool rest = false;  // "{name...}": the rest of the path
  };
  std::string method;
  std::vector<Segment> segments;
  bool has_params = false;
  Dispatch dispatch = Dispatch::kWorker;
  Handler handler;

  // Matches the decoded segments; fills `params` on success.
  bool Match(const std::vector<std::string>& path,
             std::map<std::string, std::string>* params) const {
    params->clear();
    for (size_t i = 0; i < segments.size(); ++i) {
      const Segment& s = segments[i];
      if (s.rest) {
        if (i >= path.size()) return false;
        std::string joined;
        for (size_t k = i; k < path.size(); ++k) {
          if (k > i) joined.push_back('/');
          joined += path[k];
        }
        if (joined.empty()) return false;
        (*params)[s.name] = std::move(joined);
        return true;
      }
      if (i >= path.size()) return false;
      if (s.param) {
        if (path[i].empty()) return false;
        (*params)[s.name] = path[i];
      } else if (path[i] != s.literal) {
        return false;
      }
    }
    return segments.size() == path.size();
  }
};

}  // namespace

// ---- the server's shared state ------------------------------------------------

class Connection;

struct Server::Impl {
  explicit Impl(ServerOptions o)
      : options(std::move(o)),
        acceptor(io),
        accept_retry(io),
        stop_grace(io),
        pool(std::max(1, options.worker_threads), std::max(0, options.worker_queue_max)) {}

  const ServerOptions options;
  std::vector<RoutePattern> routes;  // immutable once Bind() is called
  PreRouting pre_routing;
  Logger logger;
  ErrorBody error_body = DefaultErrorBody;

  asio::io_context io;
  tcp::acceptor acceptor;
  asio::steady_timer accept_retry;
  asio::steady_timer stop_grace;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_guard;
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

  // A transport error response, with the error body hook's body.
  Response ErrorResponse(int status, std::string message) const {
    Response r;
    try {
      r = error_body(status, std::move(message));
    } catch (const std::exception& e) {
      spdlog::error("http: the error body hook threw: {}", e.what());
      r = DefaultErrorBody(status, "error");
    }
    r.status = status;
    if (status == 503) r.headers.emplace_back("Retry-After", std::to_string(options.retry_after_s));
    return r;
  }

  void Accept();
  void OnAccept(const error_code& ec, tcp::socket socket);
  void StopOnLoop();
  void Forget(Connection* c);
  void MaybeFinishStop();
  bool stop_released = false;  // loop thread: the work guard is gone
};

namespace {

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

}  // namespace

// ---- Exchange: the Responder of one request ----------------------------------

// The bytes of one response, produced by its handler (any thread) and
// written by the loop. Its outbox is the hand-over: the handler appends, the
// loop takes and writes, and reports written bytes back (back-pressure).
// Thread safety: thread-safe.
class Exchange final : public Responder, public std::enable_shared_from_this<Exchange> {
 public:
  Exchange(Server::Impl* server, std::weak_ptr<Connection> conn, bool keep_alive, int version)
      : s_(server), conn_(std::move(conn)), keep_alive_(keep_alive), version_(version) {}

  void Send(Response response) override EXCLUDES(mu_) {
    std::string bytes;
    bool close = !keep_alive_;
    for (const auto& [name, value] : response.headers) {
      if (IEquals(name, "Connection") && IEquals(value, "close")) close = true;
    }
    AppendHead(&bytes, response.status, response.content_type, response.headers, close);
    bytes += fmt::format("Content-Length: {}\r\n\r\n", response.body.size());
    bytes += response.body;
    {
      MutexLock l(&mu_);
      if (state_ != kFresh) {
        spdlog::error("bug: http: a handler answered its request twice (status {})",
                      response.status);
        return;
      }
      state_ = kDone;
      status_ = response.status;
      close_after_ = close;
      Append(std::move(bytes));
    }
    PostPump();
  }

  bool StartStream(int status, std::string content_type,
                   std::vector<std::pair<std::string, std::string>> headers) override
      EXCLUDES(mu_) {
    bool close = !keep_alive_ || version_ < 11;
    for (const auto& [name, value] : headers) {
      if (IEquals(name, "Connection") && IEquals(value, "close")) close = true;
    }
    chunked_.store(version_ >= 11);
    std::string bytes;
    AppendHead(&bytes, status, content_type, headers, close);
    if (chunked_) bytes += "Transfer-Encoding: chunked\r\n";
    bytes += "\r\n";
    {
      MutexLock l(&mu_);
      if (state_ != kFresh) {
        spdlog::error("bug: http: StartStream on an answered request (status {})", status);
        return false;
      }
      state_ = kStreaming;
      status_ = status;
      close_after_ = close;
      Append(std::move(bytes));
    }
    PostPump();
    return !cancelled();
  }

  bool Write(std::string_view chunk) override EXCLUDES(mu_) {
    if (cancelled()) return false;
    if (chunk.empty()) return true;
    std::string frame;
    if (chunked_) {
      frame = fmt::format("{:x}\r\n", chunk.size());
      frame.append(chunk);
      frame += "\r\n";
    } else {
      frame.assign(chunk);
    }
    const bool on_loop = s_->OnLoopThread();
    const auto no_progress =
        std::chrono::seconds(std::max(1, s_->options.write_timeout_s)) + kWriteFuseSlack;
    {
      MutexLock l(&mu_);
      if (state_ != kStreaming) {
        spdlog::error("bug: http: Write outside a stream");
        return false;
      }
      size_t last = unwritten_;
      auto fuse = SteadyClock::now() + no_progress;
      while (!on_loop && !gone_ && !s_->stopping.load() && unwritten_ > 0 &&
             unwritten_ + frame.size() > s_->options.stream_buffer_bytes) {
        space_.WaitUntil(std::min(fuse, SteadyClock::now() + std::chrono::milliseconds(250)));
        const auto now = SteadyClock::now();
        if (unwritten_ < last) {
          last = unwritten_;
          fuse = now + no_progress;
        } else if (now >= fuse) {
          gone_ = true;  // the loop's write timer should have closed it; give up
          cancelled_.store(true);
          break;
        }
      }
      if (gone_ || s_->stopping.load()) return false;
      Append(std::move(frame));
    }
    PostPump();
    return true;
  }

  void End() override EXCLUDES(mu_) {
    {
      MutexLock l(&mu_);
      if (state_ != kStreaming) return;
      state_ = kDone;
      if (chunked_) Append("0\r\n\r\n");
    }
    PostPump();
  }

  bool cancelled() const override { return cancelled_.load() || s_->stopping.load(); }

  // Called by the transport after the handler returned: answers 500 for a
  // handler that did not, ends an open stream, and marks the response
  // complete.
  void Finish() EXCLUDES(mu_) {
    bool unanswered = false;
    {
      MutexLock l(&mu_);
      unanswered = state_ == kFresh;
    }
    if (unanswered) {
      spdlog::error("bug: http: a handler returned without answering");
      Send(s_->ErrorResponse(500, "the handler sent no response"));
    }
    {
      MutexLock l(&mu_);
      if (state_ == kStreaming) {
        state_ = kDone;
        if (chunked_) Append("0\r\n\r\n");
      }
      finished_ = true;
    }
    PostPump();
  }

  // Loop: the client is gone, a write failed, or the server stops.
  void Cancel() EXCLUDES(mu_) {
    MutexLock l(&mu_);
    gone_ = true;
    cancelled_.store(true);
    space_.SignalAll();
  }

  // Loop: what is to be written now.
  struct Take {
    std::string bytes;
    bool complete = false;  // finished and nothing left to write
    bool close_after = false;
    int status = 0;
  };
  Take TakeOutbox() EXCLUDES(mu_) {
    MutexLock l(&mu_);
    pump_posted_ = false;
    Take t;
    t.bytes.swap(outbox_);
    t.complete = finished_ && t.bytes.empty() && unwritten_ == 0;
    t.close_after = close_after_;
    t.status = status_;
    return t;
  }

  // Loop: `n` bytes taken from the outbox were written.
  void Written(size_t n) EXCLUDES(mu_) {
    MutexLock l(&mu_);
    unwritten_ -= std::min(n, unwritten_);
    space_.SignalAll();
  }

  int status() const EXCLUDES(mu_) {
    MutexLock l(&mu_);
    return status_;
  }

 private:
  enum State { kFresh, kStreaming, kDone };

  void AppendHead(std::string* out, int status, const std::string& content_type,
                  const std::vector<std::pair<std::string, std::string>>& headers,
                  bool close) const {
    *out += fmt::format("HTTP/1.1 {} {}\r\n", status, StatusText(status));
    if (!content_type.empty()) *out += fmt::format("Content-Type: {}\r\n", content_type);
    for (const auto& [name, value] : headers) {
      if (IsFramingHeader(name)) continue;
      if (name.empty() || name.find_first_of(":\r\n") != std::string::npos ||
          value.find_first_of("\r\n") != std::string::npos) {
        spdlog::error("bug: http: dropped a response header with a bad name or value: \"{}\"",
                      name);
        continue;
      }
      *out += name;
      *out += ": ";
      *out += value;
      *out += "\r\n";
    }
    *out += close ? "Connection: close\r\n" : "Connection: keep-alive\r\n";
  }

  void Append(std::string bytes) REQUIRES(mu_) {
    unwritten_ += bytes.size();
    if (outbox_.empty()) {
      outbox_ = std::move(bytes);
    } else {
      outbox_ += bytes;
    }
  }

  void PostPump() EXCLUDES(mu_);

  Server::Impl* const s_;
  const std::weak_ptr<Connection> conn_;
  const bool keep_alive_;
  const int version_;
  std::atomic<bool> chunked_{true};  // set by StartStream

  mutable Mutex mu_;
  CondVar space_{&mu_};  // unwritten_ dropped, or gone_
  State state_ GUARDED_BY(mu_) = kFresh;
  int status_ GUARDED_BY(mu_) = 0;
  bool close_after_ GUARDED_BY(mu_) = false;
  bool finished_ GUARDED_BY(mu_) = false;
  bool gone_ GUARDED_BY(mu_) = false;
  bool pump_posted_ GUARDED_BY(mu_) = false;
  std::string outbox_ GUARDED_BY(mu_);
  size_t unwritten_ GUARDED_BY(mu_) = 0;  // in the outbox or being written
  std::atomic<bool> cancelled_{false};
};

// ---- Connection ------------------------------------------------------------------

// One accepted socket (Note [Connection state machine]). Loop thread only.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(Server::Impl* server, tcp::socket socket)
      : s_(server), socket_(std::move(socket)), read_timer_(s_->io), write_timer_(s_->io) {
    error_code ec;
    const tcp::endpoint remote = socket_.remote_endpoint(ec);
    if (!ec) {
      remote_addr_ = remote.address().to_string();
      remote_port_ = remote.port();
    }
    socket_.set_option(tcp::no_delay(true), ec);
    socket_.non_blocking(true, ec);
  }

  void Start() {
    phase_ = Phase::kIdle;
    ArmReadTimer(SteadyClock::now() + std::chrono::seconds(s_->options.keep_alive_timeout_s));
    StartRead();
  }

  // Over the cap: 503 and close.
  void Reject(int64_t open) {
    rejected_ = true;
    phase_ = Phase::kHandling;
    exchange_ = std::make_shared<Exchange>(s_, weak_from_this(), /*keep_alive=*/false, 11);
    exchange_->Send(s_->ErrorResponse(
        503, fmt::format("the server has {} open connections, its limit (max_connections); "
                         "retry later",
                         open)));
    exchange_->Finish();
    StartRead();  // drains the request, if any, while the 503 is written
  }

  bool rejected() const { return rejected_; }

  // Posted by the exchange.
  void Pump(const std::shared_ptr<Exchange>& from) {
    if (phase_ == Phase::kClosed || exchange_ != from || writing_) return;
    Exchange::Take t = exchange_->TakeOutbox();
    if (!t.bytes.empty()) {
      write_buf_ = std::move(t.bytes);
      StartWrite();
      return;
    }
    if (t.complete) ResponseDone(t.close_after, t.status);
  }

  // Loop: the server stops.
  void OnStop() {
    switch (phase_) {
      case Phase::kIdle:
      case Phase::kReading:
        Close();
        break;
      case Phase::kHandling:
        if (exchange_) exchange_->Cancel();
        break;
      case Phase::kClosing:
      case Phase::kClosed:
        break;
    }
  }

  void Close() {
    if (phase_ == Phase::kClosed) return;
    if (exchange_ && !logged_ && exchange_->status() != 0) Log(exchange_->status());
    phase_ = Phase::kClosed;
    ++read_seq_;
    ++write_seq_;
    error_code ec;
    read_timer_.cancel();
    write_timer_.cancel();
    socket_.close(ec);
    if (exchange_) exchange_->Cancel();
    exchange_.reset();
    s_->Forget(this);
  }

 private:
  enum class Phase { kIdle, kReading, kHandling, kClosing, kClosed };

  void ArmReadTimer(SteadyClock::time_point at) {
    const uint64_t seq = ++read_seq_;
    read_timer_.expires_at(at);
    read_timer_.async_wait([self = shared_from_this(), seq](const error_code& ec) {
      if (!ec && seq == self->read_seq_) self->OnReadTimer();
    });
  }

  void DisarmReadTimer() {
    ++read_seq_;
    read_timer_.cancel();
  }

  void OnReadTimer() {
    switch (phase_) {
      case Phase::kIdle:  // keep_alive_timeout_s without a request
        s_->timeouts_total.fetch_add(1);
        Close();
        break;
      case Phase::kReading: {
        s_->timeouts_total.fetch_add(1);
        const bool whole = SteadyClock::now() >= request_deadline_;
        RespondError(408, whole ? fmt::format("the request did not arrive whole within {} s "
                                              "(request_timeout_s); the connection is closed",
                                              s_->options.request_timeout_s)
                                : fmt::format("no byte of the request arrived for {} s "
                                              "(read_timeout_s); the connection is closed",
                                              s_->options.read_timeout_s));
        break;
      }
      case Phase::kClosing:  // linger time over
        Close();
        break;
      case Phase::kHandling:
      case Phase::kClosed:
        break;
    }
  }

  // Waits for the socket to become readable (no buffer is held meanwhile),
  // then reads what is there into `input_`.
  void StartRead() {
    if (reading_ || phase_ == Phase::kClosed || peer_eof_) return;
    reading_ = true;
    socket_.async_wait(tcp::socket::wait_read,
                       [self = shared_from_this()](const error_code& ec) { self->OnReadable(ec); });
  }

  void OnReadable(error_code ec) {
    size_t n = 0;
    if (!ec && phase_ != Phase::kClosed) {
      std::vector<char>& scratch = s_->read_scratch;
      n = socket_.read_some(asio::buffer(scratch), ec);
      if (ec == asio::error::would_block || ec == asio::error::try_again) {
        reading_ = false;
        StartRead();
        return;
      }
      if (!ec) input_.append(scratch.data(), n);
    }
    OnRead(ec);
  }

  size_t buffered() const { return input_.size() - input_off_; }

  void ConsumeInput(size_t n) {
    input_off_ += n;
    if (input_off_ >= input_.size()) {
      DropInput();
    } else if (input_off_ >= (4 << 10)) {
      input_.erase(0, input_off_);
      input_off_ = 0;
    }
  }

  void DropInput() {
    input_.clear();
    input_off_ = 0;
    if (input_.capacity() > kReadChunkBytes) input_.shrink_to_fit();
  }

  void OnRead(const error_code& ec) {
    reading_ = false;
    if (phase_ == Phase::kClosed) return;
    if (ec) {
      peer_eof_ = true;
      switch (phase_) {
        case Phase::kIdle:
        case Phase::kReading:  // the client gave up (mid-request: nothing to answer)
        case Phase::kClosing:
          Close();
          return;
        case Phase::kHandling:
          if (exchange_) exchange_->Cancel();  // Note [Client gone]
          return;
        case Phase::kClosed:
          return;
      }
      return;
    }
    switch (phase_) {
      case Phase::kIdle:
        BeginRequest();
        Parse();
        return;
      case Phase::kReading:
        Parse();
        return;
      case Phase::kHandling:
        if (rejected_) DropInput();
        if (buffered() < kMaxPipelinedBytes) StartRead();
        return;
      case Phase::kClosing:
        DropInput();
        StartRead();
        return;
      case Phase::kClosed:
        return;
    }
  }

  // The first byte of a request is here (or buffered).
  void BeginRequest() {
    phase_ = Phase::kReading;
    request_deadline_ =
        SteadyClock::now() + std::chrono::seconds(s_->options.request_timeout_s);
    parser_.emplace();
    parser_->eager(true);
    parser_->header_limit(static_cast<std::uint32_t>(
        std::min<size_t>(s_->options.max_header_bytes, UINT32_MAX)));
    parser_->body_limit(s_->options.max_body_bytes);
    header_checked_ = false;
  }

  // Feeds the buffered bytes to the parser; dispatches a complete request,
  // answers a malformed one, or waits for more.
  void Parse() {
    error_code ec;
    while (buffered() > 0 && !parser_->is_done()) {
      const size_t used =
          parser_->put(asio::const_buffer(input_.data() + input_off_, buffered()), ec);
      ConsumeInput(used);
      if (ec == bhttp::error::need_more) {
        ec = {};
        break;
      }
      if (ec) break;
      if (used == 0) break;
    }
    if (ec) return OnParseError(ec);
    if (parser_->is_header_done() && !header_checked_) {
      header_checked_ = true;
      const auto& h = parser_->get();
      // A request body's length must be known (RFC 9112 6.3): a
      // Transfer-Encoding other than a final "chunked" cannot be framed.
      if (h.find(bhttp::field::transfer_encoding) != h.end() && !parser_->chunked()) {
        return RespondError(400, "malformed HTTP request: a Transfer-Encoding other than "
                                 "chunked cannot be read");
      }
      auto expect = h.find(bhttp::field::expect);
      if (!parser_->is_done() && expect != h.end() && h.version() >= 11 &&
          IEquals(std::string_view(expect->value().data(), expect->value().size()),
                  "100-continue")) {
        SendInterim("HTTP/1.1 100 Continue\r\n\r\n");
      }
    }
    if (parser_->is_done()) return OnRequest();
    const auto now = SteadyClock::now();
    ArmReadTimer(std::min(request_deadline_,
                          now + std::chrono::seconds(s_->options.read_timeout_s)));
    StartRead();
  }

  void OnParseError(const error_code& ec) {
    if (ec == bhttp::error::body_limit) {
      return RespondError(413, fmt::format("the request body is larger than the limit of {} "
                                           "bytes (max_body_bytes)",
                                           s_->options.max_body_bytes));
    }
    if (ec == bhttp::error::header_limit) {
      return RespondError(431, fmt::format("the request line and headers are larger than the "
                                           "limit of {} bytes",
                                           s_->options.max_header_bytes));
    }
    RespondError(400, fmt::format("malformed HTTP request: {}", ec.message()));
  }

  // Builds the Request from the parsed message and answers it.
  void OnRequest() {
    DisarmReadTimer();
    bhttp::request<bhttp::string_body> msg = parser_->release();
    parser_.reset();
    auto req = std::make_shared<Request>();
    req->method.assign(msg.method_string().data(), msg.method_string().size());
    req->target.assign(msg.target().data(), msg.target().size());
    req->version = static_cast<int>(msg.version());
    req->remote_addr = remote_addr_;
    req->remote_port = remote_port_;
    for (const auto& f : msg) {
      req->headers.emplace(std::string(f.name_string().data(), f.name_string().size()),
                           std::string(f.value().data(), f.value().size()));
    }
    req->body = std::move(msg.body());
    ++served_;
    const bool keep_alive = msg.keep_alive() && served_ < s_->options.keep_alive_max &&
                            !s_->stopping.load();
    request_ = req;
    phase_ = Phase::kHandling;
    exchange_ = std::make_shared<Exchange>(s_, weak_from_this(), keep_alive, req->version);

    // Target → path, query, segments.
    std::string_view target = req->target;
    if (target.rfind("http://", 0) == 0 || target.rfind("https://", 0) == 0) {
      const size_t authority = target.find("//") + 2;
      const size_t slash = target.find('/', authority);
      target = slash == std::string_view::npos ? std::string_view("/") : target.substr(slash);
    }
    if (target.empty() || target[0] != '/') {
      return AnswerNow(s_->ErrorResponse(
          400, fmt::format("malformed HTTP request: the target \"{}\" is not a path",
                           req->target)));
    }
    const size_t qpos = target.find('?');
    const std::string_view raw_path = target.substr(0, qpos);
    std::vector<std::string> segments;
    if (!PercentDecode(raw_path, false, &req->path)) {
      return AnswerNow(
          s_->ErrorResponse(400, "malformed HTTP request: bad percent-encoding in the path"));
    }
    for (std::string_view raw : SplitPath(raw_path)) {
      std::string seg;
      PercentDecode(raw, false, &seg);
      segments.push_back(std::move(seg));
    }
    if (qpos != std::string_view::npos) {
      std::string_view q = target.substr(qpos + 1);
      const size_t hash = q.find('#');
      if (hash != std::string_view::npos) q = q.substr(0, hash);
      while (!q.empty()) {
        const size_t amp = q.find('&');
        const std::string_view pair = q.substr(0, amp);
        q = amp == std::string_view::npos ? std::string_view() : q.substr(amp + 1);
        if (pair.empty()) continue;
        const size_t eq = pair.find('=');
        std::string name;
        std::string value;
        if (!PercentDecode(pair.substr(0, eq), true, &name) ||
            (eq != std::string_view::npos && !PercentDecode(pair.substr(eq + 1), true, &value))) {
          return AnswerNow(s_->ErrorResponse(
              400, "malformed HTTP request: bad percent-encoding in the query"));
        }
        req->query.emplace(std::move(name), std::move(value));
      }
    }

    if (s_->pre_routing) {
      std::optional<Response> early;
      try {
        early = s_->pre_routing(*req);
      } catch (const std::exception& e) {
        spdlog::error("bug: http: the pre-routing hook threw: {}", e.what());
        early = s_->ErrorResponse(500, fmt::format("internal error: {}", e.what()));
      }
      if (early) return AnswerNow(std::move(*early));
    }

    // Literal routes first, then parameter routes, each in registration order.
    const RoutePattern* route = nullptr;
    std::vector<std::string> allowed;  // methods of routes matching the path
    std::map<std::string, std::string> params;
    for (int pass = 0; pass < 2 && route == nullptr; ++pass) {
      for (const RoutePattern& r : s_->routes) {
        if (r.has_params != (pass == 1)) continue;
        if (!r.Match(segments, &params)) continue;
        if (r.method == req->method) {
          route = &r;
          req->params = std::move(params);
          break;
        }
        if (std::find(allowed.begin(), allowed.end(), r.method) == allowed.end()) {
          allowed.push_back(r.method);
        }
      }
    }
    if (route == nullptr && allowed.empty()) {
      return AnswerNow(
          s_->ErrorResponse(404, fmt::format("no route for {} {}", req->method, req->path)));
    }
    if (route == nullptr) {
      std::string allow;
      for (const std::string& m : allowed) allow += (allow.empty() ? "" : ", ") + m;
      Response r = s_->ErrorResponse(
          405, fmt::format("{} is not allowed on {} (allowed: {})", req->method, req->path, allow));
      r.headers.emplace_back("Allow", allow);
      return AnswerNow(std::move(r));
    }

    if (route->dispatch == Dispatch::kInline) {
      RunHandler(*route, *req, *exchange_);
      exchange_->Finish();  // posts the pump
      return;
    }
    std::shared_ptr<Exchange> ex = exchange_;
    Server::Impl* s = s_;
    WorkerPool::Job job;
    job.run = [route, req, ex] { RunHandler(*route, *req, *ex); ex->Finish(); };
    job.drop = [s, ex] {
      ex->Send(s->ErrorResponse(503, "the server is stopping"));
      ex->Finish();
    };
    if (!s_->pool.TrySubmit(std::move(job))) {
      if (s_->stopping.load()) return AnswerNow(s_->ErrorResponse(503, "the server is stopping"));
      s_->queue_full_total.fetch_add(1);
      return AnswerNow(s_->ErrorResponse(
          503, fmt::format("every worker is busy and {} requests are waiting "
                           "(worker_queue_max); retry later",
                           s_->options.worker_queue_max)));
    }
    // Note [Client gone]: watch the socket while the handler runs.
    if (buffered() < kMaxPipelinedBytes) StartRead();
  }

  static void RunHandler(const RoutePattern& route, const Request& req, Exchange& ex) {
    try {
      route.handler(req, ex);
    } catch (const std::exception& e) {
      spdlog::error("bug: http: {} {} threw: {}", req.method, req.path, e.what());
      // Finish() answers 500 if nothing was sent; a started stream is ended.
    } catch (...) {
      spdlog::error("bug: http: {} {} threw a non-exception", req.method, req.path);
    }
  }

  // Answers the current request (kHandling, exchange_ set) with `r` from the
  // loop, without a handler.
  void AnswerNow(Response r) {
    exchange_->Send(std::move(r));
    exchange_->Finish();
    if (buffered() < kMaxPipelinedBytes) StartRead();
  }

  // A transport error while reading a request: answer and close.
  void RespondError(int status, std::string message) {
    DisarmReadTimer();
    request_ = std::make_shared<Request>();
    request_->remote_addr = remote_addr_;
    request_->remote_port = remote_port_;
    request_->version = 0;
    if (parser_ && parser_->is_header_done()) {  // for the logger
      const auto& h = parser_->get();
      request_->method.assign(h.method_string().data(), h.method_string().size());
      request_->target.assign(h.target().data(), h.target().size());
      request_->path = request_->target.substr(0, request_->target.find('?'));
      request_->version = static_cast<int>(h.version());
    }
    parser_.reset();
    phase_ = Phase::kHandling;
    exchange_ = std::make_shared<Exchange>(s_, weak_from_this(), /*keep_alive=*/false, 11);
    exchange_->Send(s_->ErrorResponse(status, std::move(message)));
    exchange_->Finish();
    StartRead();  // no-op when a read is already pending
  }

  void SendInterim(std::string bytes) {
    // Only while reading a request: no exchange is writing.
    if (writing_) return;
    write_buf_ = std::move(bytes);
    interim_ = true;
    StartWrite();
  }

  void StartWrite() {
    writing_ = true;
    const uint64_t seq = ++write_seq_;
    write_timer_.expires_after(std::chrono::seconds(std::max(1, s_->options.write_timeout_s)));
    write_timer_.async_wait([self = shared_from_this(), seq](const error_code& ec) {
      if (!ec && seq == self->write_seq_ && self->writing_) {
        self->s_->timeouts_total.fetch_add(1);
        self->Close();
      }
    });
    asio::async_write(socket_, asio::buffer(write_buf_),
                      [self = shared_from_this()](const error_code& ec, size_t n) {
                        self->OnWrite(ec, n);
                      });
  }

  void OnWrite(const error_code& ec, size_t n) {
    writing_ = false;
    ++write_seq_;
    write_timer_.cancel();
    const bool interim = interim_;
    interim_ = false;
    write_buf_.clear();
    if (phase_ == Phase::kClosed) return;
    if (ec) {
      Close();
      return;
    }
    if (!interim && exchange_) exchange_->Written(n);
    if (exchange_) Pump(exchange_);
  }

  void ResponseDone(bool close_after, int status) {
    Log(status);
    exchange_.reset();
    request_.reset();
    if (close_after || peer_eof_ || s_->stopping.load() || rejected_) {
      GracefulClose();
      return;
    }
    logged_ = false;
    if (buffered() > 0) {  // a pipelined request
      BeginRequest();
      Parse();
      return;
    }
    phase_ = Phase::kIdle;
    ArmReadTimer(SteadyClock::now() + std::chrono::seconds(s_->options.keep_alive_timeout_s));
    StartRead();
  }

  void Log(int status) {
    logged_ = true;
    s_->requests_total.fetch_add(1);
    if (!s_->logger) return;
    static const Request kNone;
    try {
      s_->logger(request_ ? *request_ : kNone, status);
    } catch (const std::exception& e) {
      spdlog::error("bug: http: the logger threw: {}", e.what());
    }
  }

  void GracefulClose() {
    if (peer_eof_) {
      Close();
      return;
    }
    phase_ = Phase::kClosing;
    error_code ec;
    socket_.shutdown(tcp::socket::shutdown_send, ec);
    if (ec) {
      Close();
      return;
    }
    DropInput();
    // Stopping: no lingering unless the peer has bytes in flight already.
    if (s_->stopping.load() && socket_.available(ec) == 0 && !ec) {
      Close();
      return;
    }
    ArmReadTimer(SteadyClock::now() + kLingerTime);
    StartRead();
  }

  Server::Impl* const s_;
  tcp::socket socket_;
  asio::steady_timer read_timer_;
  asio::steady_timer write_timer_;
  std::string input_;      // bytes read and not yet parsed, from input_off_
  size_t input_off_ = 0;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  Phase phase_ = Phase::kIdle;
  std::string remote_addr_;
  int remote_port_ = 0;
  int served_ = 0;                  // requests parsed on this connection
  bool reading_ = false;            // a read is pending
  bool writing_ = false;            // a write is pending
  bool interim_ = false;            // the pending write is a 100 Continue
  bool peer_eof_ = false;           // the peer closed or reset its side
  bool header_checked_ = false;     // this request's header was checked (framing, 100-continue)
  bool rejected_ = false;           // over the cap: 503 then close
  bool logged_ = false;             // the current response was logged
  uint64_t read_seq_ = 0;           // the armed read timer's number
  uint64_t write_seq_ = 0;          // the pending write's number
  SteadyClock::time_point request_deadline_;
  std::string write_buf_;           // the bytes of the pending write
  std::shared_ptr<Exchange> exchange_;  // the response being produced (kHandling)
  std::shared_ptr<Request> request_;    // its request (for the logger)
};

void Exchange::PostPump() {
  {
    MutexLock l(&mu_);
    if (pump_posted_) return;
    pump_posted_ = true;
  }
  asio::post(s_->io, [self = shared_from_this()] {
    if (std::shared_ptr<Connection> c = self->conn_.lock()) {
      c->Pump(self);
    } else {
      MutexLock l(&self->mu_);
      self->pump_posted_ = false;
    }
  });
}

// ---- Server::Impl (loop side) -----------------------------------------------------

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
  RoutePattern r;
  r.method = std::move(method);
  r.dispatch = dispatch;
  r.handler = std::move(handler);
  for (std::string_view seg : SplitPath(pattern)) {
    RoutePattern::Segment s;
    if (seg.size() >= 2 && seg.front() == '{' && seg.back() == '}') {
      s.param = true;
      std::string_view name = seg.substr(1, seg.size() - 2);
      if (name.size() > 3 && name.substr(name.size() - 3) == "...") {
        s.rest = true;
        name.remove_suffix(3);
      }
      s.name = std::string(name);
      r.has_params = true;
    } else {
      PercentDecode(seg, false, &s.literal);
    }
    r.segments.push_back(std::move(s));
  }
  impl_->routes.push_back(std::move(r));
}

void Server::SetPreRouting(PreRouting hook) { impl_->pre_routing = std::move(hook); }
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
