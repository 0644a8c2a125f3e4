// server/internal/deadline_stream.h — the socket stream httplib reads one
// request from, with a deadline for the *whole* request (slowloris guard).
//
// Note [Slow clients]
// httplib 0.11's read timeout applies to each recv: a client that sends one
// byte every read_timeout_s − 1 seconds holds a worker thread forever, and as
// many such connections as there are workers stop the server answering
// anyone. So the server (server.cc, HttpServer) serves each accepted
// connection itself — the keep-alive loop of httplib's
// process_and_close_socket — and hands httplib's process_request a
// DeadlineStream per request. Its reads wait at most read_timeout_ms each and
// never past `deadline` (the request's first byte + [server]
// request_timeout_s); after it, reads fail, httplib stops reading the
// request, and the server answers 408 and closes the connection. The idle
// wait between keep-alive requests does not count (keep_alive_timeout_s
// bounds it). Writes are untouched: a long generation or SSE stream is never
// cut by the deadline; the write timeout covers a client that stops reading.
//
// Everything else mirrors httplib 0.11.4's detail::SocketStream (a 4 KiB read
// buffer — its line reader reads one byte at a time; MSG_NOSIGNAL sends;
// is_writable() = writable within the write timeout and the peer not gone,
// the liveness check SSE cancellation relies on; numeric peer and local
// addresses as the ConnectionProbe expects).
//
// Thread safety: thread-compatible; one stream per request, on the worker
// thread that serves the connection.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>

#include <httplib.h>

namespace arbiter::server_internal {

class DeadlineStream final : public httplib::Stream {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  DeadlineStream(int sock, std::chrono::milliseconds read_timeout,
                 std::chrono::milliseconds write_timeout, TimePoint deadline);

  bool is_readable() const override;
  bool is_writable() const override;
  ssize_t read(char* ptr, size_t size) override;
  ssize_t write(const char* ptr, size_t size) override;
  void get_remote_ip_and_port(std::string& ip, int& port) const override;
  void get_local_ip_and_port(std::string& ip, int& port) const override;
  int socket() const override { return sock_; }

  // True once a read failed because the deadline had passed.
  bool deadline_expired() const { return deadline_expired_; }

 private:
  static constexpr size_t kReadBufferBytes = 4096;

  const int sock_;
  const std::chrono::milliseconds read_timeout_;
  const std::chrono::milliseconds write_timeout_;
  const TimePoint deadline_;
  mutable bool deadline_expired_ = false;
  char buf_[kReadBufferBytes];
  size_t buf_off_ = 0;   // next unread byte in buf_
  size_t buf_size_ = 0;  // bytes held in buf_
};

// Waits up to `timeout` for `sock` to become readable (a request's first
// byte, or EOF). False on timeout, error, or once `stopping()` returns true
// (polled every 10 ms).
bool WaitReadable(int sock, std::chrono::milliseconds timeout,
                  const std::function<bool()>& stopping);

}  // namespace arbiter::server_internal
