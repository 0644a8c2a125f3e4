// bench/http_transport/http_bench_server.cc — the HTTP transport
// (src/server/internal/http/http_server.h) serving /health inline and
// POST /echo on a worker, for bench/http_transport/http_transport.py.
//
// Usage: http_bench_server PORT [WORKER_THREADS] [MAX_CONNECTIONS] [KEEP_ALIVE_TIMEOUT_S]
// Runs until SIGINT/SIGTERM. Prints "listening on PORT" once bound.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <utility>

#include "server/internal/http/http_server.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s PORT [WORKER_THREADS] [MAX_CONNECTIONS] [KEEP_ALIVE_TIMEOUT_S]\n",
                 argv[0]);
    return 2;
  }
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);  // before any thread starts

  arbiter::http::ServerOptions o;
  o.port = std::atoi(argv[1]);
  if (argc > 2) o.worker_threads = std::atoi(argv[2]);
  o.max_connections = argc > 3 ? std::atoi(argv[3]) : 4096;
  if (argc > 4) o.keep_alive_timeout_s = std::atoi(argv[4]);
  arbiter::http::Server server(o);
  server.Route("GET", "/health", arbiter::http::Dispatch::kInline,
               [](const arbiter::http::Request&, arbiter::http::Responder& r) {
                 arbiter::http::Response res;
                 res.content_type = "application/json";
                 res.body = R"({"status":"ok"})";
                 r.Send(std::move(res));
               });
  server.Route("POST", "/echo", arbiter::http::Dispatch::kWorker,
               [](const arbiter::http::Request& req, arbiter::http::Responder& r) {
                 arbiter::http::Response res;
                 res.content_type = "text/plain";
                 res.body = req.body;
                 r.Send(std::move(res));
               });
  if (arbiter::Status s = server.Bind(); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("listening on %d\n", server.port());
  std::fflush(stdout);
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&set, &sig);
    server.Stop();
  });
  arbiter::Status s = server.Run();
  waiter.join();
  return s.ok() ? 0 : 1;
}
