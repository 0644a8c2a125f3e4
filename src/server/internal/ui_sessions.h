// The dashboard's login sessions (docs/ui.md "Signing in").
//
// Note [Dashboard sessions]
// A browser's EventSource cannot send an Authorization header, so with an
// API key configured the page signs in once: POST /ui/login with the key
// answers a session cookie (HttpOnly — no script reads it; SameSite=Strict —
// no other site's page sends it; Path=/; Max-Age = the session's life),
// which the admin routes and /metrics accept in place of the bearer key.
// The key never appears in a URL. A session is 32 random bytes from
// OpenSSL's CSPRNG (hex), lives kSessionTtl from its login (not renewed:
// short-lived by design, the page asks for the key again), and is gone at
// logout or restart (held in memory only). At most kMaxSessions live at
// once; a new login past that replaces the oldest. Failed logins are
// limited to kMaxFailures per kFailureWindow across all clients (429
// after that) so the key cannot be guessed at network speed.
#pragma once

#include <chrono>
#include <cstddef>
#include <deque>
#include <map>
#include <string>
#include <string_view>

#include "arbiter/base/mutex.h"

namespace arbiter::server_internal {

inline constexpr std::string_view kSessionCookie = "arbiter_session";

// Thread safety: thread-safe.
class UiSessions {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::seconds kSessionTtl{3600};
  static constexpr size_t kMaxSessions = 64;
  static constexpr size_t kMaxFailures = 10;
  static constexpr std::chrono::seconds kFailureWindow{60};

  // A new session token (64 hex digits), valid until now + kSessionTtl.
  std::string Create(Clock::time_point now) EXCLUDES(mu_);
  // Whether `token` names a live session.
  bool Valid(std::string_view token, Clock::time_point now) const EXCLUDES(mu_);
  // Ends `token`'s session (nothing if unknown).
  void Remove(std::string_view token) EXCLUDES(mu_);
  // Records a failed login; false when kMaxFailures already failed within
  // kFailureWindow (the caller answers 429 without checking the key).
  bool AllowAttempt(Clock::time_point now) EXCLUDES(mu_);
  void RecordFailure(Clock::time_point now) EXCLUDES(mu_);

  size_t size() const EXCLUDES(mu_);

 private:
  mutable Mutex mu_;
  std::map<std::string, Clock::time_point, std::less<>> expiry_ GUARDED_BY(mu_);
  std::deque<Clock::time_point> failures_ GUARDED_BY(mu_);
};

// The value of cookie `name` in a Cookie header ("a=1; b=2"); "" if absent.
std::string CookieValue(std::string_view cookie_header, std::string_view name);

}  // namespace arbiter::server_internal
