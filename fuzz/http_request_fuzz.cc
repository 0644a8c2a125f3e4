// libFuzzer target: the HTTP transport (server/internal/http/http_server.h)
// on arbitrary bytes from a client. One server runs for the whole session
// (loopback, port 0) with an inline route, a worker route with a path
// parameter and a streaming route; each input is sent on a fresh connection
// whose sending side is then shut down, and the answer is read until the
// server closes. Every response must start with a status line; the server
// must keep answering /health; no sanitizer report.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <thread>

#include "server/internal/http/http_server.h"

namespace {

using arbiter::http::Dispatch;
using arbiter::http::Request;
using arbiter::http::Responder;
using arbiter::http::Response;

// A failure to connect is a server that stopped listening: print why, trap.
[[noreturn]] void ConnectFailed(int err) {
  std::fprintf(stderr, "http_request_fuzz: connect to the server failed: %s\n",
               std::strerror(err));
  __builtin_trap();
}

int Connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) return fd;
  // EINTR: libFuzzer's -timeout watchdog (SIGALRM) interrupted the connect
  // (the campaign's second harness "crash", after 105,896 inputs); the
  // connection goes on in the background: wait for it, then read its result.
  if (errno != EINTR) ConnectFailed(errno);
  while (true) {
    pollfd p{fd, POLLOUT, 0};
    const int ready = ::poll(&p, 1, 5000);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) ConnectFailed(ready == 0 ? ETIMEDOUT : errno);
    break;
  }
  int err = 0;
  socklen_t len = sizeof(err);
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) ConnectFailed(errno);
  if (err != 0) ConnectFailed(err);
  return fd;
}

// Sends `bytes`, half-closes, and returns what the server sent until it
// closed (bounded by 5 s: a hang is a failure).
std::string Exchange(int port, std::string_view bytes) {
  const int fd = Connect(port);
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n <= 0) break;  // the server may close early (400, 413)
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  ::shutdown(fd, SHUT_WR);
  std::string got;
  char buf[16384];
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (true) {
    pollfd p{fd, POLLIN, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) __builtin_trap();  // the server never closed
    const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    // EINTR: libFuzzer's -timeout watchdog is a SIGALRM every second or so;
    // an interrupted poll is not a hang (this was the campaign's "hang").
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) __builtin_trap();  // the server never closed
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return got;
}

arbiter::http::Server* StartServer() {
  arbiter::http::ServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.max_body_bytes = 4096;
  o.max_header_bytes = 4096;
  o.read_timeout_s = 2;
  o.request_timeout_s = 2;
  o.worker_threads = 2;
  auto* server = new arbiter::http::Server(o);  // lives for the process
  server->Route("GET", "/health", Dispatch::kInline, [](const Request&, Responder& r) {
    Response res;
    res.body = "ok";
    r.Send(std::move(res));
  });
  server->Route("POST", "/m/{name}/load", Dispatch::kWorker,
                [](const Request& req, Responder& r) {
                  Response res;
                  res.body = req.params.at("name") + req.query_value("x") + req.body;
                  r.Send(std::move(res));
                });
  server->Route("GET", "/s/{rest...}", Dispatch::kWorker, [](const Request& req, Responder& r) {
    if (!r.StartStream(200, "text/plain", {})) return;
    for (char c : req.params.at("rest")) {
      if (!r.Write(std::string(1, c))) return;
    }
    r.End();
  });
  if (!server->Bind().ok()) __builtin_trap();
  std::thread([server] { server->Run().IgnoreError(); }).detach();
  return server;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static arbiter::http::Server* server = StartServer();
  const int port = server->port();
  const std::string got =
      Exchange(port, std::string_view(reinterpret_cast<const char*>(data), size));
  if (!got.empty() && got.rfind("HTTP/1.1 ", 0) != 0) __builtin_trap();
  const std::string health = Exchange(port, "GET /health HTTP/1.1\r\nHost: f\r\n\r\n");
  if (health.rfind("HTTP/1.1 200 ", 0) != 0) __builtin_trap();
  return 0;
}
