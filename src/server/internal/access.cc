// The pre-routing access checks (server/internal/access.h): the Host
// allowlist of Note [Host check] and the bearer credentials' syntax.
#include "server/internal/access.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>

#include <fmt/format.h>

#include "arbiter/base/log_safe.h"

namespace arbiter::server_internal {
namespace {

char LowerAscii(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

bool IsDigits(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// RFC 3986 reg-name characters a host name or IPv4 address uses
// (unreserved; percent-encoding and sub-delims never name a real host).
bool IsHostChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '.' || c == '_' || c == '~';
}

// Whether a normalized host (NormalizeHost) names loopback.
bool IsLoopbackName(const std::string& h) {
  if (h == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, h.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, h.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

}  // namespace

std::string NormalizeHost(std::string_view v) {
  std::string host;
  std::string_view rest;
  if (!v.empty() && v.front() == '[') {
    const size_t close = v.find(']');
    if (close == std::string_view::npos || close == 1) return "";
    const std::string_view inner = v.substr(1, close - 1);
    for (char c : inner) {
      if (!(IsHostChar(c) || c == ':')) return "";
    }
    host.assign(inner);
    rest = v.substr(close + 1);
  } else {
    const size_t colon = v.find(':');
    host.assign(v.substr(0, colon));
    if (colon != std::string_view::npos) rest = v.substr(colon);
    if (host.empty() || !std::all_of(host.begin(), host.end(), IsHostChar)) return "";
  }
  // The port: ":" *DIGIT (RFC 7230 allows it empty).
  if (!rest.empty() && (rest.front() != ':' || !IsDigits(rest.substr(1)))) return "";
  for (char& c : host) c = LowerAscii(c);
  if (host.size() > 1 && host.back() == '.') host.pop_back();
  return host;
}

bool IsLoopbackBind(std::string_view bind_host) {
  std::string h(bind_host);
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  for (char& c : h) c = LowerAscii(c);
  if (h.size() > 1 && h.back() == '.') h.pop_back();
  return IsLoopbackName(h);
}

AllowedHosts::AllowedHosts(std::string_view bind_host, const std::vector<std::string>& allowed)
    : loopback_(IsLoopbackBind(bind_host)) {
  for (const std::string& a : allowed) {
    if (a == "*") any_ = true;
    std::string n = NormalizeHost(a);
    if (!n.empty()) names_.push_back(std::move(n));
  }
  if (!loopback_ && allowed.empty()) any_ = true;
}

bool AllowedHosts::Allows(std::string_view host_header, bool present) const {
  if (any_ || !present) return true;
  const std::string h = NormalizeHost(host_header);
  if (h.empty()) return false;
  if (IsLoopbackName(h)) return true;
  return std::find(names_.begin(), names_.end(), h) != names_.end();
}

std::string AllowedHosts::RefusalMessage(std::string_view host_header) const {
  const std::string quoted = LogSafe(host_header);
  if (loopback_) {
    return fmt::format(
        "Host \"{}\" is not allowed: this server is bound to loopback and answers only the Host "
        "names localhost, 127.0.0.1 (127.0.0.0/8) and [::1], with any port, and the names in "
        "[server] allowed_hosts; add the name to allowed_hosts to serve it",
        quoted);
  }
  return fmt::format(
      "Host \"{}\" is not allowed: it is not localhost, 127.0.0.1 (127.0.0.0/8), [::1] or a "
      "name in [server] allowed_hosts",
      quoted);
}

std::optional<std::string_view> BearerToken(std::string_view auth) {
  constexpr std::string_view kScheme = "bearer";
  if (auth.size() <= kScheme.size() || auth[kScheme.size()] != ' ') return std::nullopt;
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (LowerAscii(auth[i]) != kScheme[i]) return std::nullopt;
  }
  const size_t token = auth.find_first_not_of(' ', kScheme.size());
  if (token == std::string_view::npos) return std::nullopt;
  return auth.substr(token);
}

}  // namespace arbiter::server_internal
