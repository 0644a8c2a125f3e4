// server/internal/access.h — who may call the server, decided before
// routing (server.cc's pre-routing hook): the Host allowlist that keeps DNS
// rebinding out (Note [Host check]) and the reading of bearer credentials.
//
// Thread safety: AllowedHosts is immutable after construction (safe to share
// between threads); the functions are pure.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace arbiter::server_internal {

// Note [Host check]
// A web page the user visits can make its own host name resolve to
// 127.0.0.1 (DNS rebinding) and then call a loopback server as its own
// origin: the browser sends `Host: attacker.example`. So a server bound to
// loopback answers only Host values that name loopback — `localhost`, an
// IPv4 address in 127.0.0.0/8, `[::1]` — and the names listed in
// [server] allowed_hosts; any other Host gets 403 naming the setting.
// Decisions:
//   - any port: the port is not what rebinding forges (it is the server's
//     own), and a port forward or proxy in front changes it;
//   - names compare case-insensitively, and one trailing dot is ignored
//     ("LocalHost." is "localhost");
//   - a request without Host is served: every browser sends one, so it
//     cannot be a rebinding page;
//   - every path is checked (/health and /ui too), before CORS preflights
//     and the API key;
//   - bound to another address (0.0.0.0, a LAN address), allowed_hosts
//     empty means any Host; a non-empty list restricts it as on loopback;
//   - "*" in allowed_hosts allows any Host.
class AllowedHosts {
 public:
  // `bind_host` is [server] host; `allowed` is [server] allowed_hosts
  // (host names or IP addresses without port, "[::1]" for IPv6, or "*").
  AllowedHosts(std::string_view bind_host, const std::vector<std::string>& allowed);

  // Whether a request whose Host header is `host_header` may be served;
  // `present` = false when the request has no Host header.
  bool Allows(std::string_view host_header, bool present = true) const;

  // The 403 message for a refused Host (quotes at most 256 bytes of it).
  std::string RefusalMessage(std::string_view host_header) const;

 private:
  bool any_ = false;                // no restriction
  bool loopback_ = false;           // bound to loopback
  std::vector<std::string> names_;  // normalized allowed_hosts
};

// Whether `bind_host` ([server] host) is a loopback address or "localhost".
bool IsLoopbackBind(std::string_view bind_host);

// The host part of a Host header value, normalized (lowercase, without a
// port, without brackets around an IPv6 address, without one trailing dot);
// empty when the value is not `host [":" port]`.
std::string NormalizeHost(std::string_view host_header);

// The token of `Authorization: Bearer <token>` (RFC 6750 / RFC 7235: the
// scheme in any case, then one or more spaces); nullopt for another scheme
// or no token.
std::optional<std::string_view> BearerToken(std::string_view authorization);

}  // namespace arbiter::server_internal
