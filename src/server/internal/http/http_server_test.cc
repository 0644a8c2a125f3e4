// Tests of the HTTP transport (http_server.h) over real sockets on
// 127.0.0.1, port 0. No assertion depends on timing beyond generous bounds:
// states are awaited with a deadline (WaitFor), blocked handlers have fuses.
#include "server/internal/http/http_server.h"
#include "server/internal/http/fake_responder.h"
#include "server/internal/http/server_impl.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace arbiter::http {
namespace {

using ::testing::HasSubstr;
using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

// Polls `pred` every 5 ms until it holds or `timeout` passes.
bool WaitFor(const std::function<bool()>& pred, milliseconds timeout = seconds(10)) {
  const auto deadline = Clock::now() + timeout;
  while (!pred()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(milliseconds(5));
  }
  return true;
}

// A one-shot latch that waits with a fuse (a test bug becomes a failure,
// not a hang).
class Gate {
 public:
  void Open() {
    std::lock_guard<std::mutex> l(mu_);
    open_ = true;
    cv_.notify_all();
  }
  // True when opened, false when the fuse blew.
  bool Wait(milliseconds fuse = seconds(30)) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, fuse, [&] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

struct RawResponse {
  int status = 0;
  Headers headers;
  std::string body;
  bool chunked = false;
  std::string header(std::string_view name) const {
    auto it = headers.find(name);
    return it == headers.end() ? std::string() : it->second;
  }
};

// A blocking HTTP/1.1 client on a raw socket, reading with poll() timeouts.
class Client {
 public:
  explicit Client(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~Client() { Close(); }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  bool ok() const { return fd_ >= 0; }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  // Closes with a reset (SO_LINGER 0).
  void Reset() {
    linger l{1, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    Close();
  }

  bool Send(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      bytes.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  // Reads one response; nullopt on timeout, EOF or a framing error.
  std::optional<RawResponse> Read(milliseconds timeout = seconds(10)) {
    deadline_ = Clock::now() + timeout;
    RawResponse r;
    std::string line;
    if (!ReadLine(&line)) return std::nullopt;
    if (line.rfind("HTTP/1.", 0) != 0 || line.size() < 12) return std::nullopt;
    r.status = std::stoi(line.substr(9, 3));
    while (true) {
      if (!ReadLine(&line)) return std::nullopt;
      if (line.empty()) break;
      const size_t colon = line.find(':');
      if (colon == std::string::npos) return std::nullopt;
      std::string value = line.substr(colon + 1);
      while (!value.empty() && value.front() == ' ') value.erase(0, 1);
      r.headers.emplace(line.substr(0, colon), value);
    }
    if (r.status / 100 == 1) return r;  // interim: no body
    if (r.header("Transfer-Encoding") == "chunked") {
      r.chunked = true;
      while (true) {
        if (!ReadLine(&line)) return std::nullopt;
        const size_t size = std::stoul(line, nullptr, 16);
        std::string data;
        if (!ReadExactly(size + 2, &data)) return std::nullopt;
        if (size == 0) break;
        r.body += data.substr(0, size);
      }
    } else if (r.headers.count("Content-Length") != 0) {
      if (!ReadExactly(std::stoul(r.header("Content-Length")), &r.body)) return std::nullopt;
    } else {
      while (Fill()) {
      }
      r.body = std::move(buf_);
      buf_.clear();
    }
    return r;
  }

  // True once the server closed the connection (EOF or reset) within
  // `timeout`; bytes that arrive first are discarded.
  bool WaitClosed(milliseconds timeout = seconds(10)) {
    deadline_ = Clock::now() + timeout;
    while (true) {
      buf_.clear();
      const int r = FillOnce();
      if (r == 0) return true;   // EOF or reset
      if (r < 0) return false;   // timeout
    }
  }

  // True when no byte and no EOF arrives within `d` (the connection is
  // still open and silent).
  bool SilentFor(milliseconds d) {
    pollfd p{fd_, POLLIN, 0};
    return ::poll(&p, 1, static_cast<int>(d.count())) == 0;
  }

  int fd() const { return fd_; }
  std::string& buffered() { return buf_; }

 private:
  // 1 = read bytes, 0 = EOF/reset, -1 = timeout.
  int FillOnce() {
    const auto left =
        std::chrono::duration_cast<milliseconds>(deadline_ - Clock::now()).count();
    if (left <= 0) return -1;
    pollfd p{fd_, POLLIN, 0};
    const int pr = ::poll(&p, 1, static_cast<int>(left));
    if (pr <= 0) return -1;
    char tmp[16384];
    const ssize_t n = ::recv(fd_, tmp, sizeof(tmp), 0);
    if (n <= 0) return 0;
    buf_.append(tmp, static_cast<size_t>(n));
    return 1;
  }
  bool Fill() { return FillOnce() == 1; }
  bool ReadLine(std::string* line) {
    while (true) {
      const size_t eol = buf_.find("\r\n");
      if (eol != std::string::npos) {
        *line = buf_.substr(0, eol);
        buf_.erase(0, eol + 2);
        return true;
      }
      if (!Fill()) return false;
    }
  }
  bool ReadExactly(size_t n, std::string* out) {
    while (buf_.size() < n) {
      if (!Fill()) return false;
    }
    *out = buf_.substr(0, n);
    buf_.erase(0, n);
    return true;
  }

  int fd_ = -1;
  std::string buf_;
  Clock::time_point deadline_;
};

std::string Get(std::string_view path, std::string_view extra = "") {
  return std::string("GET ") + std::string(path) + " HTTP/1.1\r\nHost: t\r\n" +
         std::string(extra) + "\r\n";
}

std::string Post(std::string_view path, std::string_view body, std::string_view extra = "") {
  return std::string("POST ") + std::string(path) + " HTTP/1.1\r\nHost: t\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n" + std::string(extra) + "\r\n" + std::string(body);
}

Response Text(std::string body, int status = 200) {
  Response r;
  r.status = status;
  r.content_type = "text/plain";
  r.body = std::move(body);
  return r;
}

class HttpServerTest : public ::testing::Test {
 protected:
  static ServerOptions Options() {
    ServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.worker_threads = 4;
    o.keep_alive_timeout_s = 30;
    return o;
  }

  // Builds the server with /health (inline) and /echo (worker) plus
  // whatever `routes` adds, binds it and runs it on a thread.
  void Start(ServerOptions o, const std::function<void(Server&)>& routes = nullptr) {
    server_ = std::make_unique<Server>(o);
    server_->Route("GET", "/health", Dispatch::kInline,
                   [](const Request&, Responder& r) { r.Send(Text(R"({"status":"ok"})")); });
    server_->Route("POST", "/echo", Dispatch::kWorker,
                   [](const Request& req, Responder& r) { r.Send(Text(req.body)); });
    if (routes) routes(*server_);
    ASSERT_TRUE(server_->Bind().ok());
    ASSERT_GT(server_->port(), 0);
    loop_ = std::thread([this] { run_status_ = server_->Run(); });
  }

  void TearDown() override {
    if (server_) server_->Stop();
    if (loop_.joinable()) loop_.join();
    EXPECT_TRUE(run_status_.ok()) << run_status_.ToString();
  }

  int port() const { return server_->port(); }

  std::unique_ptr<Server> server_;
  std::thread loop_;
  Status run_status_;
};

// ---- basics ---------------------------------------------------------------------

TEST_F(HttpServerTest, AnswersInlineAndWorkerRoutes) {
  Start(Options());
  Client c(port());
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(c.Send(Get("/health")));
  auto r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, R"({"status":"ok"})");
  EXPECT_EQ(r->header("Content-Type"), "text/plain");
  EXPECT_EQ(r->header("Connection"), "keep-alive");
  ASSERT_TRUE(c.Send(Post("/echo", "hello")));
  r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "hello");
}

TEST_F(HttpServerTest, ParsesPathParamsQueryAndHeaders) {
  std::mutex mu;
  Request seen;
  Start(Options(), [&](Server& s) {
    s.Route("POST", "/admin/models/{name}/load", Dispatch::kWorker,
            [&](const Request& req, Responder& r) {
              {
                std::lock_guard<std::mutex> l(mu);
                seen = req;
              }
              r.Send(Text("ok"));
            });
    s.Route("GET", "/static/{path...}", Dispatch::kInline,
            [](const Request& req, Responder& r) { r.Send(Text(req.params.at("path"))); });
  });
  Client c(port());
  ASSERT_TRUE(c.Send(Post("/admin/models/my%20model/load?x=1&y=a+b&x=2&flag", "{}",
                          "X-Custom: Value\r\n")));
  auto r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  std::lock_guard<std::mutex> l(mu);
  EXPECT_EQ(seen.method, "POST");
  EXPECT_EQ(seen.path, "/admin/models/my model/load");
  EXPECT_EQ(seen.target, "/admin/models/my%20model/load?x=1&y=a+b&x=2&flag");
  EXPECT_EQ(seen.params.at("name"), "my model");
  EXPECT_EQ(seen.query_value("x"), "1");
  EXPECT_EQ(seen.query.count("x"), 2u);
  EXPECT_EQ(seen.query_value("y"), "a b");
  EXPECT_TRUE(seen.has_query("flag"));
  EXPECT_FALSE(seen.has_query("z"));
  EXPECT_EQ(seen.header("x-custom"), "Value");
  EXPECT_EQ(seen.header("CONTENT-LENGTH"), "2");
  EXPECT_EQ(seen.header("absent"), "");
  EXPECT_EQ(seen.body, "{}");
  EXPECT_EQ(seen.remote_addr, "127.0.0.1");
  EXPECT_GT(seen.remote_port, 0);

  ASSERT_TRUE(c.Send(Get("/static/css/app%2Fx.css")));
  r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body, "css/app/x.css");
}

TEST_F(HttpServerTest, EmptyPostWithoutContentLengthRunsTheHandler) {
  Start(Options());
  Client c(port());
  ASSERT_TRUE(c.Send("POST /echo HTTP/1.1\r\nHost: t\r\n\r\n"));
  auto r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "");
}

TEST_F(HttpServerTest, ChunkedRequestBody) {
  Start(Options());
  Client c(port());
  ASSERT_TRUE(c.Send("POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                     "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"));
  auto r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "hello world");
}

TEST_F(HttpServerTest, MalformedUnknownAndWrongMethod) {
  std::vector<int> statuses;
  std::mutex mu;
  ServerOptions o = Options();
  Start(o, [&](Server& s) {
    s.SetErrorBody([](int status, std::string message) {
      Response r;
      r.content_type = "application/json";
      r.body = "{\"custom\":" + std::to_string(status) + ",\"message\":\"" + message + "\"}";
      return r;
    });
    s.SetLogger([&](const Request&, int status) {
      std::lock_guard<std::mutex> l(mu);
      statuses.push_back(status);
    });
  });
  {
    Client c(port());
    ASSERT_TRUE(c.Send("GARBAGE\r\n\r\n"));
    auto r = c.Read();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400);
    EXPECT_THAT(r->body, HasSubstr("\"custom\":400"));
    EXPECT_THAT(r->body, HasSubstr("malformed HTTP request"));
    EXPECT_EQ(r->header("Connection"), "close");
    EXPECT_TRUE(c.WaitClosed());
  }
  {
    Client c(port());
    ASSERT_TRUE(c.Send("GET /health HTTP/1.1\r\nBad Header\r\n\r\n"));
    auto r = c.Read();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400);
  }
  Client c(port());
  ASSERT_TRUE(c.Send(Get("/nope")));
  auto r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_THAT(r->body, HasSubstr("no route for GET /nope"));
  ASSERT_TRUE(c.Send(Post("/health", "")));  // the connection stays usable
  r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->header("Allow"), "GET");
  EXPECT_TRUE(WaitFor([&] {
    std::lock_guard<std::mutex> l(mu);
    return statuses.size() == 4;
  }));
  std::lock_guard<std::mutex> l(mu);
  EXPECT_EQ(statuses, (std::vector<int>{400, 400, 404, 405}));
}

TEST_F(HttpServerTest, AmbiguousBodyFramingIsRefused) {
  Start(Options());
  for (const char* framing : {"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
                              "Content-Length: 5\r\nContent-Length: 6\r\n",
                              "Content-Length: -1\r\n", "Transfer-Encoding: gzip\r\n"}) {
    Client c(port());
    ASSERT_TRUE(c.Send(std::string("POST /echo HTTP/1.1\r\nHost: t\r\n") + framing +
                       "\r\n0\r\n\r\n"));
    auto r = c.Read();
    ASSERT_TRUE(r) << framing;
    EXPECT_EQ(r->status, 400) << framing;
    EXPECT_TRUE(c.WaitClosed()) << framing;
  }
}

TEST_F(HttpServerTest, PreRoutingAnswersBeforeTheHandler) {
  std::atomic<int> handled{0};
  Start(Options(), [&](Server& s) {
    s.Route("GET", "/admin/status", Dispatch::kInline, [&](const Request&, Responder& r) {
      handled.fetch_add(1);
      r.Send(Text("status"));
    });
    s.SetPreRouting([](const Request& req) -> std::optional<Response> {
      if (req.path.rfind("/admin/", 0) != 0) return std::nullopt;
      if (req.header("Authorization") == "Bearer k") return std::nullopt;
      Response r = Text("no key", 401);
      r.headers.emplace_back("WWW-Authenticate", "Bearer");
      return r;
    });
  });
  Client c(port());
  ASSERT_TRUE(c.Send(Get("/admin/status")));
  auto r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(r->header("WWW-Authenticate"), "Bearer");
  EXPECT_EQ(handled.load(), 0);
  ASSERT_TRUE(c.Send(Get("/admin/status", "Authorization: Bearer k\r\n")));
  r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(handled.load(), 1);
}

// SetResponseHeaders (CORS): every response of a request gets the hook's
// headers — a handler's, a stream's, pre-routing's and a 404.
TEST_F(HttpServerTest, ResponseHeadersGoOnEveryResponse) {
  Start(Options(), [](Server& s) {
    s.Route("GET", "/plain", Dispatch::kInline,
            [](const Request&, Responder& r) { r.Send(Text("plain")); });
    s.Route("GET", "/stream", Dispatch::kWorker, [](const Request&, Responder& r) {
      if (r.StartStream(200, "text/plain", {}) && r.Write("a")) r.End();
    });
    s.SetPreRouting([](const Request& req) -> std::optional<Response> {
      if (req.path == "/early") return Text("early", 401);
      return std::nullopt;
    });
    s.SetResponseHeaders([](const Request& req) {
      std::vector<std::pair<std::string, std::string>> h;
      if (!req.header("Origin").empty()) h.emplace_back("X-Origin", req.header("Origin"));
      return h;
    });
  });
  Client c(port());
  for (const char* path : {"/plain", "/stream", "/early", "/missing"}) {
    ASSERT_TRUE(c.Send(Get(path, "Origin: http://o\r\n"))) << path;
    auto r = c.Read();
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->header("X-Origin"), "http://o") << path;
  }
  ASSERT_TRUE(c.Send(Get("/plain")));
  auto r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->header("X-Origin"), "");
}

TEST_F(HttpServerTest, HandlerThatThrowsOrDoesNotAnswerGets500) {
  Start(Options(), [](Server& s) {
    s.Route("GET", "/throw", Dispatch::kWorker,
            [](const Request&, Responder&) { throw std::runtime_error("boom"); });
    s.Route("GET", "/silent", Dispatch::kInline, [](const Request&, Responder&) {});
  });
  Client c(port());
  ASSERT_TRUE(c.Send(Get("/throw")));
  auto r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 500);
  ASSERT_TRUE(c.Send(Get("/silent")));
  r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 500);
}

// ---- keep-alive, pipelining, HTTP/1.0 -------------------------------------------

TEST_F(HttpServerTest, KeepAliveMaxClosesAfterTheLastRequest) {
  ServerOptions o = Options();
  o.keep_alive_max = 3;
  Start(o);
  Client c(port());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(c.Send(Get("/health")));
    auto r = c.Read();
    ASSERT_TRUE(r) << i;
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->header("Connection"), i < 2 ? "keep-alive" : "close") << i;
  }
  EXPECT_TRUE(c.WaitClosed());
}

TEST_F(HttpServerTest, IdleConnectionsCloseAfterKeepAliveTimeout) {
  ServerOptions o = Options();
  o.keep_alive_timeout_s = 1;
  Start(o);
  Client silent(port());  // never sends a byte
  Client used(port());
  ASSERT_TRUE(used.Send(Get("/health")));
  ASSERT_TRUE(used.Read());
  EXPECT_TRUE(silent.WaitClosed(seconds(10)));
  EXPECT_TRUE(used.WaitClosed(seconds(10)));
  EXPECT_TRUE(WaitFor([&] { return server_->stats().open_connections == 0; }));
  EXPECT_GE(server_->stats().timeouts_total, 2u);
}

TEST_F(HttpServerTest, Http10AndConnectionCloseCloseAfterTheResponse) {
  Start(Options());
  {
    Client c(port());
    ASSERT_TRUE(c.Send("GET /health HTTP/1.0\r\n\r\n"));
    auto r = c.Read();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->header("Connection"), "close");
    EXPECT_TRUE(c.WaitClosed());
  }
  {
    Client c(port());
    ASSERT_TRUE(c.Send("GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
    auto r = c.Read();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->header("Connection"), "keep-alive");
    ASSERT_TRUE(c.Send("GET /health HTTP/1.0\r\n\r\n"));
    ASSERT_TRUE(c.Read());
  }
  Client c(port());
  ASSERT_TRUE(c.Send(Get("/health", "Connection: close\r\n")));
  auto r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->header("Connection"), "close");
  EXPECT_TRUE(c.WaitClosed());
}

TEST_F(HttpServerTest, PipelinedRequestsAreAnsweredInOrder) {
  Start(Options(), [](Server& s) {
    s.Route("POST", "/slow", Dispatch::kWorker, [](const Request& req, Responder& r) {
      std::this_thread::sleep_for(milliseconds(50));  // the later ones are ready first
      r.Send(Text(req.body));
    });
  });
  Client c(port());
  std::string all = Post("/slow", "one") + Get("/health") + Post("/echo", "three") +
                    Post("/slow", "four") + Get("/health", "Connection: close\r\n");
  ASSERT_TRUE(c.Send(all));
  std::vector<std::string> bodies;
  for (int i = 0; i < 5; ++i) {
    auto r = c.Read();
    ASSERT_TRUE(r) << i;
    bodies.push_back(r->body);
  }
  EXPECT_EQ(bodies, (std::vector<std::string>{"one", R"({"status":"ok"})", "three", "four",
                                              R"({"status":"ok"})"}));
  EXPECT_TRUE(c.WaitClosed());
}

// ---- limits ----------------------------------------------------------------------

TEST_F(HttpServerTest, SlowlorisGets408WithinRequestTimeout) {
  ServerOptions o = Options();
  o.request_timeout_s = 1;
  o.read_timeout_s = 30;
  Start(o);
  Client c(port());
  ASSERT_TRUE(c.Send("GET /health HTTP/1.1\r\n"));
  // One header byte every 100 ms: each read is well within read_timeout_s.
  const auto fuse = Clock::now() + seconds(15);
  bool answered = false;
  while (Clock::now() < fuse) {
    if (!c.Send("X")) break;  // the server may have closed already
    if (!c.SilentFor(milliseconds(100))) {
      answered = true;
      break;
    }
  }
  ASSERT_TRUE(answered);
  auto r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 408);
  EXPECT_THAT(r->body, HasSubstr("request_timeout_s"));
  EXPECT_TRUE(c.WaitClosed());
}

TEST_F(HttpServerTest, StalledRequestGets408AfterReadTimeout) {
  ServerOptions o = Options();
  o.read_timeout_s = 1;
  o.request_timeout_s = 60;
  Start(o);
  Client c(port());
  ASSERT_TRUE(c.Send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\nabc"));
  auto r = c.Read(seconds(15));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 408);
  EXPECT_THAT(r->body, HasSubstr("read_timeout_s"));
  EXPECT_TRUE(c.WaitClosed());
}

TEST_F(HttpServerTest, BodyOverTheLimitGets413) {
  ServerOptions o = Options();
  o.max_body_bytes = 1000;
  Start(o);
  {
    // Refused from Content-Length, before any body byte is sent.
    Client c(port());
    ASSERT_TRUE(c.Send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1000000\r\n\r\n"));
    auto r = c.Read();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 413);
    EXPECT_THAT(r->body, HasSubstr("1000 bytes"));
    EXPECT_TRUE(c.WaitClosed());
  }
  {
    // Chunked: counted as it arrives.
    Client c(port());
    ASSERT_TRUE(c.Send("POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"));
    const std::string chunk = "200\r\n" + std::string(512, 'x') + "\r\n";
    c.Send(chunk);
    c.Send(chunk);
    c.Send(chunk);
    auto r = c.Read();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 413);
  }
  Client c(port());  // at the limit is fine
  ASSERT_TRUE(c.Send(Post("/echo", std::string(1000, 'y'))));
  auto r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body.size(), 1000u);
}

// A path with its own limit (audio uploads): larger than max_body_bytes
// there, the default elsewhere; the 413 names the path's setting.
TEST_F(HttpServerTest, APathsOwnBodyLimitReplacesTheDefault) {
  ServerOptions o = Options();
  o.max_body_bytes = 1000;
  o.path_body_limits["/echo"] = {5000, "max_audio_bytes"};
  Start(o);
  {
    Client c(port());
    ASSERT_TRUE(c.Send(Post("/echo?x=1", std::string(4000, 'y'))));
    auto r = c.Read();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body.size(), 4000u);
  }
  {
    Client c(port());
    ASSERT_TRUE(c.Send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 6000\r\n\r\n"));
    auto r = c.Read();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 413);
    EXPECT_THAT(r->body, HasSubstr("5000 bytes (max_audio_bytes)"));
  }
  {
    // Chunked to the limited path: counted against its own limit.
    Client c(port());
    ASSERT_TRUE(c.Send("POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"));
    const std::string chunk = "800\r\n" + std::string(2048, 'x') + "\r\n";
    for (int i = 0; i < 3; ++i) c.Send(chunk);
    auto r = c.Read();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 413);
  }
  Client c(port());  // another path keeps max_body_bytes
  ASSERT_TRUE(c.Send("POST /other HTTP/1.1\r\nHost: t\r\nContent-Length: 2000\r\n\r\n"));
  auto r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413);
  EXPECT_THAT(r->body, HasSubstr("(max_body_bytes)"));
}

TEST_F(HttpServerTest, ExpectContinueIsAnsweredBeforeTheBody) {
  ServerOptions o = Options();
  o.max_body_bytes = 4000;
  Start(o);
  Client c(port());
  const std::string body(2000, 'b');
  ASSERT_TRUE(c.Send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 2000\r\n"
                     "Expect: 100-continue\r\n\r\n"));
  auto interim = c.Read();
  ASSERT_TRUE(interim);
  EXPECT_EQ(interim->status, 100);
  ASSERT_TRUE(c.Send(body));
  auto r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, body);
  // Too large: 413 instead of 100, without sending the body.
  Client big(port());
  ASSERT_TRUE(big.Send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5000\r\n"
                       "Expect: 100-continue\r\n\r\n"));
  r = big.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413);
}

TEST_F(HttpServerTest, ConnectionsOverTheCapGet503AndTheCountDrops) {
  ServerOptions o = Options();
  o.max_connections = 3;
  o.retry_after_s = 7;
  Start(o);
  std::vector<std::unique_ptr<Client>> held;
  for (int i = 0; i < 3; ++i) held.push_back(std::make_unique<Client>(port()));
  ASSERT_TRUE(WaitFor([&] { return server_->stats().open_connections == 3; }));
  {
    Client over(port());
    auto r = over.Read();  // without sending anything
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 503);
    EXPECT_EQ(r->header("Retry-After"), "7");
    EXPECT_THAT(r->body, HasSubstr("max_connections"));
    EXPECT_TRUE(over.WaitClosed());
  }
  EXPECT_EQ(server_->stats().rejected_total, 1u);
  EXPECT_EQ(server_->stats().open_connections, 3);
  held[0]->Close();
  ASSERT_TRUE(WaitFor([&] { return server_->stats().open_connections == 2; }));
  Client c(port());
  ASSERT_TRUE(c.Send(Get("/health")));
  auto r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

// ---- workers ---------------------------------------------------------------------

TEST_F(HttpServerTest, InlineRoutesAnswerWhileEveryWorkerIsBlocked) {
  ServerOptions o = Options();
  o.worker_threads = 2;
  Gate release;
  std::atomic<int> entered{0};
  Start(o, [&](Server& s) {
    s.Route("GET", "/block", Dispatch::kWorker, [&](const Request&, Responder& r) {
      entered.fetch_add(1);
      release.Wait();
      r.Send(Text("released"));
    });
  });
  Client a(port());
  Client b(port());
  ASSERT_TRUE(a.Send(Get("/block")));
  ASSERT_TRUE(b.Send(Get("/block")));
  ASSERT_TRUE(WaitFor([&] { return entered.load() == 2; }));
  EXPECT_EQ(server_->stats().workers_busy, 2);
  Client h(port());
  ASSERT_TRUE(h.Send(Get("/health")));
  auto r = h.Read(seconds(5));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  release.Open();
  ASSERT_TRUE(a.Read());
  ASSERT_TRUE(b.Read());
}

TEST_F(HttpServerTest, FullWorkerQueueGets503) {
  ServerOptions o = Options();
  o.worker_threads = 1;
  o.worker_queue_max = 2;
  Gate release;
  std::atomic<int> entered{0};
  Start(o, [&](Server& s) {
    s.Route("GET", "/block", Dispatch::kWorker, [&](const Request&, Responder& r) {
      entered.fetch_add(1);
      release.Wait();
      r.Send(Text("released"));
    });
  });
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < 3; ++i) {
    clients.push_back(std::make_unique<Client>(port()));
    ASSERT_TRUE(clients.back()->Send(Get("/block")));
    if (i == 0) {
      ASSERT_TRUE(WaitFor([&] { return entered.load() == 1; }));
    }
  }
  ASSERT_TRUE(WaitFor([&] { return server_->stats().queued == 2; }));
  Client over(port());
  ASSERT_TRUE(over.Send(Get("/block")));
  auto r = over.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_FALSE(r->header("Retry-After").empty());
  EXPECT_THAT(r->body, HasSubstr("worker_queue_max"));
  EXPECT_EQ(server_->stats().queue_full_total, 1u);
  release.Open();
  for (auto& c : clients) {
    auto ok = c->Read();
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 200);
  }
}

// ---- streaming and cancellation ---------------------------------------------------

TEST_F(HttpServerTest, StreamsChunks) {
  Start(Options(), [](Server& s) {
    s.Route("GET", "/stream", Dispatch::kWorker, [](const Request&, Responder& r) {
      ASSERT_TRUE(r.StartStream(200, "text/event-stream", {{"Cache-Control", "no-cache"}}));
      for (int i = 0; i < 1000; ++i) {
        if (!r.Write("data: " + std::to_string(i) + "\n\n")) return;
      }
      r.End();
    });
  });
  Client c(port());
  ASSERT_TRUE(c.Send(Get("/stream")));
  auto r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_TRUE(r->chunked);
  EXPECT_EQ(r->header("Content-Type"), "text/event-stream");
  EXPECT_EQ(r->header("Cache-Control"), "no-cache");
  std::string want;
  for (int i = 0; i < 1000; ++i) want += "data: " + std::to_string(i) + "\n\n";
  EXPECT_EQ(r->body, want);
  ASSERT_TRUE(c.Send(Get("/health")));  // the connection is reusable
  ASSERT_TRUE(c.Read());
}

TEST_F(HttpServerTest, WriteReturnsFalseOnceTheClientIsGone) {
  std::atomic<bool> saw_false{false};
  std::atomic<bool> saw_cancelled{false};
  Start(Options(), [&](Server& s) {
    s.Route("GET", "/forever", Dispatch::kWorker, [&](const Request&, Responder& r) {
      r.StartStream(200, "text/plain", {});
      const auto fuse = Clock::now() + seconds(30);
      while (Clock::now() < fuse) {
        if (!r.Write(std::string(1024, 'z'))) {
          saw_false = true;
          saw_cancelled = r.cancelled();
          return;
        }
        std::this_thread::sleep_for(milliseconds(1));
      }
    });
  });
  {
    Client c(port());
    ASSERT_TRUE(c.Send(Get("/forever")));
    ASSERT_TRUE(WaitFor([&] { return c.buffered().size() > 0 || !c.SilentFor(milliseconds(5)); }));
    c.Reset();
  }
  EXPECT_TRUE(WaitFor([&] { return saw_false.load(); }, seconds(20)));
  EXPECT_TRUE(saw_cancelled.load());
}

TEST_F(HttpServerTest, StreamToAClientThatStopsReadingEndsAfterWriteTimeout) {
  ServerOptions o = Options();
  o.write_timeout_s = 1;
  o.stream_buffer_bytes = 64 << 10;
  std::atomic<bool> returned{false};
  std::atomic<uint64_t> written{0};
  Start(o, [&](Server& s) {
    s.Route("GET", "/flood", Dispatch::kWorker, [&](const Request&, Responder& r) {
      r.StartStream(200, "application/octet-stream", {});
      const std::string mib(1 << 20, 'f');
      const auto fuse = Clock::now() + seconds(60);
      while (Clock::now() < fuse && r.Write(mib)) written += mib.size();
      returned = true;
    });
  });
  Client c(port());
  int small = 4096;  // a small receive buffer: the kernel's buffering stays small
  ::setsockopt(c.fd(), SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  ASSERT_TRUE(c.Send(Get("/flood")));
  // The client never reads.
  EXPECT_TRUE(WaitFor([&] { return returned.load(); }, seconds(30)));
  EXPECT_LT(written.load(), 64ull << 20);
}

TEST_F(HttpServerTest, NonStreamingHandlerSeesTheClientHangUp) {
  std::atomic<bool> saw_cancelled{false};
  std::atomic<bool> entered{false};
  Start(Options(), [&](Server& s) {
    s.Route("POST", "/generate", Dispatch::kWorker, [&](const Request&, Responder& r) {
      entered = true;
      const auto fuse = Clock::now() + seconds(30);
      while (!r.cancelled() && Clock::now() < fuse) std::this_thread::sleep_for(milliseconds(2));
      saw_cancelled = r.cancelled();
      r.Send(Text("too late", 503));
    });
  });
  {
    Client c(port());
    ASSERT_TRUE(c.Send(Post("/generate", "{}")));
    ASSERT_TRUE(WaitFor([&] { return entered.load(); }));
  }  // closes
  EXPECT_TRUE(WaitFor([&] { return saw_cancelled.load(); }, seconds(20)));
  EXPECT_TRUE(WaitFor([&] { return server_->stats().open_connections == 0; }));
}

TEST_F(HttpServerTest, StopCancelsStreamsAndBlockedHandlersAndWaitsForThem) {
  std::atomic<int> entered{0};
  std::atomic<bool> stream_done{false};
  std::atomic<bool> blocked_done{false};
  Start(Options(), [&](Server& s) {
    s.Route("GET", "/stream", Dispatch::kWorker, [&](const Request&, Responder& r) {
      r.StartStream(200, "text/event-stream", {});
      entered.fetch_add(1);
      const auto fuse = Clock::now() + seconds(30);
      while (Clock::now() < fuse && r.Write("data: x\n\n")) {
        std::this_thread::sleep_for(milliseconds(5));
      }
      std::this_thread::sleep_for(milliseconds(50));  // Stop() must wait for this
      stream_done = true;
    });
    s.Route("POST", "/blocked", Dispatch::kWorker, [&](const Request&, Responder& r) {
      entered.fetch_add(1);
      const auto fuse = Clock::now() + seconds(30);
      while (!r.cancelled() && Clock::now() < fuse) std::this_thread::sleep_for(milliseconds(2));
      blocked_done = r.cancelled();
      r.Send(Text("cancelled", 503));
    });
  });
  Client a(port());
  Client b(port());
  Client idle(port());
  ASSERT_TRUE(a.Send(Get("/stream")));
  ASSERT_TRUE(b.Send(Post("/blocked", "{}")));
  ASSERT_TRUE(WaitFor([&] { return entered.load() == 2; }));
  server_->Stop();
  EXPECT_TRUE(stream_done.load());
  EXPECT_TRUE(blocked_done.load());
  loop_.join();
  EXPECT_TRUE(idle.WaitClosed());
  EXPECT_TRUE(b.WaitClosed());
  server_->Stop();  // idempotent
}

// ---- many connections ----------------------------------------------------------------

TEST_F(HttpServerTest, HealthAnswersWithThousandsOfIdleAndHalfSentConnections) {
  rlimit lim{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &lim), 0);
  lim.rlim_cur = lim.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &lim);
  ::getrlimit(RLIMIT_NOFILE, &lim);
  // Each connection takes a descriptor on both sides.
  int per_kind = 1000;
  if (lim.rlim_cur < 4 * 1000 + 200) per_kind = static_cast<int>((lim.rlim_cur - 200) / 4);
  if (per_kind < 100) GTEST_SKIP() << "file descriptor limit too low: " << lim.rlim_cur;
  ServerOptions o = Options();
  o.max_connections = 2 * per_kind + 100;
  o.keep_alive_timeout_s = 120;
  o.request_timeout_s = 120;
  o.read_timeout_s = 120;
  Start(o);
  std::vector<std::unique_ptr<Client>> idle;
  std::vector<std::unique_ptr<Client>> half;
  for (int i = 0; i < per_kind; ++i) {
    idle.push_back(std::make_unique<Client>(port()));
    ASSERT_TRUE(idle.back()->ok()) << i;
  }
  for (int i = 0; i < per_kind; ++i) {
    half.push_back(std::make_unique<Client>(port()));
    ASSERT_TRUE(half.back()->ok()) << i;
    ASSERT_TRUE(half.back()->Send(
        "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n"));
  }
  ASSERT_TRUE(WaitFor([&] { return server_->stats().open_connections == 2 * per_kind; },
                      seconds(30)));
  for (int i = 0; i < 3; ++i) {
    Client c(port());
    ASSERT_TRUE(c.Send(Get("/health")));
    auto r = c.Read(seconds(5));
    ASSERT_TRUE(r) << i;
    EXPECT_EQ(r->status, 200);
  }
  EXPECT_EQ(server_->stats().workers_busy, 0);
}

// ---- the in-memory Responder for route tests ------------------------------------------

TEST(FakeResponderTest, RecordsAnswersAndCancels) {
  FakeResponder sent;
  Response res = Text("hi", 201);
  res.headers.emplace_back("X-Thing", "1");
  sent.Send(res);
  EXPECT_EQ(sent.status(), 201);
  EXPECT_EQ(sent.body(), "hi");
  EXPECT_EQ(sent.header("x-thing"), "1");
  EXPECT_EQ(sent.answers(), 1);
  EXPECT_FALSE(sent.streamed());

  FakeResponder stream;
  stream.CancelAfterWrites(2);
  ASSERT_TRUE(stream.StartStream(200, "text/event-stream", {}));
  EXPECT_TRUE(stream.Write("a"));
  EXPECT_TRUE(stream.Write("b"));
  EXPECT_TRUE(stream.cancelled());
  EXPECT_FALSE(stream.Write("c"));
  stream.End();
  EXPECT_EQ(stream.chunks(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(stream.body(), "ab");
  EXPECT_TRUE(stream.ended());
}

// ---- bind ------------------------------------------------------------------------------

TEST(HttpServerBindTest, PortInUseIsAnError) {
  ServerOptions o;
  o.port = 0;
  Server first(o);
  ASSERT_TRUE(first.Bind().ok());
  ServerOptions same = o;
  same.port = first.port();
  Server second(same);
  Status s = second.Bind();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_THAT(s.message(),
              HasSubstr("address 127.0.0.1:" + std::to_string(first.port()) + " is already in use"));

  // A plain listening socket (not ours) too.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ServerOptions taken;
  taken.port = ntohs(addr.sin_port);
  Server third(taken);
  s = third.Bind();
  EXPECT_THAT(s.message(), HasSubstr("is already in use"));
  ::close(fd);
}

TEST(HttpServerBindTest, InvalidHostIsAnError) {
  ServerOptions o;
  o.host = "not-an-ip";
  o.port = 0;
  Server server(o);
  Status s = server.Bind();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("host \"not-an-ip\" is not a valid IP address"));
}

TEST(HttpServerBindTest, PortZeroPicksAFreePortAndLocalhostIsLoopback) {
  ServerOptions o;
  o.host = "localhost";
  o.port = 0;
  Server server(o);
  EXPECT_EQ(server.port(), -1);
  ASSERT_TRUE(server.Bind().ok());
  EXPECT_GT(server.port(), 0);
  // Stop before Run: Run then returns at once.
  server.Stop();
  EXPECT_TRUE(server.Run().ok());
}

// Found by the http_request fuzz target: a message quoting a request path
// that is not UTF-8 made the default JSON error body throw.
TEST(DefaultErrorBodyTest, BytesThatAreNotUtf8BecomeReplacementCharacters) {
  const Response r = DefaultErrorBody(404, std::string("no route for /\xCB\xFF"));
  EXPECT_EQ(r.status, 404);
  EXPECT_NE(r.body.find("no route for /\xEF\xBF\xBD"), std::string::npos) << r.body;
}

}  // namespace
}  // namespace arbiter::http
