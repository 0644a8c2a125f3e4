#include "server/internal/connection_probe.h"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace arbiter::server_internal {
namespace {

// "addr" and port of a sockaddr, formatted as httplib does (numeric host).
bool Endpoint(const sockaddr_storage& ss, socklen_t len, std::string* addr, int* port) {
  char host[NI_MAXHOST];
  char serv[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&ss), len, host, sizeof(host), serv,
                  sizeof(serv), NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return false;
  }
  *addr = host;
  *port = std::atoi(serv);
  return true;
}

}  // namespace

ConnectionProbe ConnectionProbe::Find(const std::string& remote_addr, int remote_port,
                                      const std::string& local_addr, int local_port) {
  ConnectionProbe probe;
  if (remote_port <= 0) return probe;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return probe;
  while (dirent* ent = readdir(dir)) {
    char* end = nullptr;
    long fd = std::strtol(ent->d_name, &end, 10);
    if (*end != '\0' || end == ent->d_name || fd == dirfd(dir)) continue;
    int type = 0;
    socklen_t type_len = sizeof(type);
    if (getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_TYPE, &type, &type_len) != 0 ||
        type != SOCK_STREAM) {
      continue;
    }
    sockaddr_storage peer{};
    socklen_t peer_len = sizeof(peer);
    if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) {
      continue;
    }
    std::string addr;
    int port = 0;
    if (!Endpoint(peer, peer_len, &addr, &port) || port != remote_port || addr != remote_addr) {
      continue;
    }
    sockaddr_storage local{};
    socklen_t local_len = sizeof(local);
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &local_len) != 0) {
      continue;
    }
    if (!Endpoint(local, local_len, &addr, &port)) continue;
    if (local_port > 0 && port != local_port) continue;
    if (!local_addr.empty() && addr != local_addr) continue;
    probe.fd_ = static_cast<int>(fd);
    break;
  }
  closedir(dir);
  return probe;
}

bool ConnectionProbe::PeerGone() const {
  if (fd_ < 0) return false;
  pollfd p{};
  p.fd = fd_;
  p.events = POLLRDHUP;
  if (poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace arbiter::server_internal
