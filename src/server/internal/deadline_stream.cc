// DeadlineStream: see deadline_stream.h, Note [Slow clients].
#include "server/internal/deadline_stream.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace arbiter::server_internal {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// poll(2) for `events` up to `timeout`, retrying on EINTR. >0 ready, 0 timeout,
// <0 error.
int PollFor(int sock, short events, milliseconds timeout) {
  pollfd p{sock, events, 0};
  const auto until = Clock::now() + timeout;
  while (true) {
    const auto left = std::chrono::duration_cast<milliseconds>(until - Clock::now());
    const int r = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
    if (r < 0 && errno == EINTR) continue;
    return r;
  }
}

ssize_t RecvRetry(int sock, void* ptr, size_t size, int flags) {
  while (true) {
    const ssize_t n = ::recv(sock, ptr, size, flags);
    if (n < 0 && errno == EINTR) continue;
    return n;
  }
}

// The peer has not closed the connection (httplib's is_socket_alive).
bool PeerAlive(int sock) {
  const int r = PollFor(sock, POLLIN, milliseconds(0));
  if (r == 0) return true;
  if (r < 0) return false;
  char c;
  return RecvRetry(sock, &c, 1, MSG_PEEK) > 0;
}

void Endpoint(const sockaddr_storage& ss, socklen_t len, std::string& ip, int& port) {
  char host[NI_MAXHOST];
  char serv[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&ss), len, host, sizeof(host), serv,
                  sizeof(serv), NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
    ip = host;
    port = std::atoi(serv);
  }
}

}  // namespace

DeadlineStream::DeadlineStream(int sock, milliseconds read_timeout, milliseconds write_timeout,
                               TimePoint deadline)
    : sock_(sock), read_timeout_(read_timeout), write_timeout_(write_timeout),
      deadline_(deadline) {}

bool DeadlineStream::is_readable() const {
  const auto left = std::chrono::duration_cast<milliseconds>(deadline_ - Clock::now());
  if (left.count() <= 0) {
    deadline_expired_ = true;
    return false;
  }
  const milliseconds wait = std::min(read_timeout_, left);
  const int r = PollFor(sock_, POLLIN, wait);
  // A timeout of the wait cut short by the deadline (`left` is rounded down,
  // so the clock may not quite have reached it).
  if (r == 0 && wait == left) deadline_expired_ = true;
  return r > 0;
}

bool DeadlineStream::is_writable() const {
  return PollFor(sock_, POLLOUT, write_timeout_) > 0 && PeerAlive(sock_);
}

ssize_t DeadlineStream::read(char* ptr, size_t size) {
  if (buf_off_ < buf_size_) {
    const size_t n = std::min(size, buf_size_ - buf_off_);
    std::memcpy(ptr, buf_ + buf_off_, n);
    buf_off_ += n;
    return static_cast<ssize_t>(n);
  }
  if (!is_readable()) return -1;
  buf_off_ = 0;
  buf_size_ = 0;
  if (size >= kReadBufferBytes) return RecvRetry(sock_, ptr, size, 0);
  const ssize_t n = RecvRetry(sock_, buf_, kReadBufferBytes, 0);
  if (n <= 0) return n;
  const size_t got = static_cast<size_t>(n);
  const size_t give = std::min(size, got);
  std::memcpy(ptr, buf_, give);
  buf_off_ = give;
  buf_size_ = got;
  return static_cast<ssize_t>(give);
}

ssize_t DeadlineStream::write(const char* ptr, size_t size) {
  if (!is_writable()) return -1;
  while (true) {
    const ssize_t n = ::send(sock_, ptr, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    return n;
  }
}

void DeadlineStream::get_remote_ip_and_port(std::string& ip, int& port) const {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getpeername(sock_, reinterpret_cast<sockaddr*>(&ss), &len) == 0) Endpoint(ss, len, ip, port);
}

void DeadlineStream::get_local_ip_and_port(std::string& ip, int& port) const {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getsockname(sock_, reinterpret_cast<sockaddr*>(&ss), &len) == 0) Endpoint(ss, len, ip, port);
}

bool WaitReadable(int sock, milliseconds timeout, const std::function<bool()>& stopping) {
  const auto until = Clock::now() + timeout;
  while (!stopping()) {
    const int r = PollFor(sock, POLLIN, milliseconds(10));
    if (r < 0) return false;
    if (r > 0) return true;
    if (Clock::now() >= until) return false;
  }
  return false;
}

}  // namespace arbiter::server_internal
