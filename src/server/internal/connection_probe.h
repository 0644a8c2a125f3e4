// server/internal/connection_probe.h — "has the client gone away?" for
// non-streaming requests.
//
// cpp-httplib 0.11 does not give handlers the connection's socket. The probe
// finds it by scanning /proc/self/fd for the TCP socket whose peer and local
// endpoints equal the request's (remote_addr:remote_port,
// local_addr:local_port) — unique per connection — and then polls it for
// hang-up. The fd cannot be reused while the handler runs (httplib closes it
// only after the handler returns), so the probe stays valid for the
// handler's duration.
//
// Limitation: a client that half-closes its side (shutdown(SHUT_WR)) after
// sending the request looks gone. HTTP clients do not do that in practice.
// On other systems, or when the socket is not found, found() is false and
// PeerGone() always returns false.
//
// Thread safety: thread-compatible; PeerGone() is a const syscall.
#pragma once

#include <string>

namespace arbiter::server_internal {

class ConnectionProbe {
 public:
  ConnectionProbe() = default;
  static ConnectionProbe Find(const std::string& remote_addr, int remote_port,
                              const std::string& local_addr, int local_port);

  bool found() const { return fd_ >= 0; }
  // True when the peer closed or reset the connection.
  bool PeerGone() const;

 private:
  int fd_ = -1;
};

}  // namespace arbiter::server_internal
