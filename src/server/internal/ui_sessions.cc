// See ui_sessions.h, Note [Dashboard sessions].
#include "server/internal/ui_sessions.h"

#include <array>
#include <cstdio>
#include <stdexcept>

#include <openssl/rand.h>

namespace arbiter::server_internal {

std::string UiSessions::Create(Clock::time_point now) {
  std::array<unsigned char, 32> raw{};
  if (RAND_bytes(raw.data(), static_cast<int>(raw.size())) != 1) {
    // OpenSSL's generator failed to seed: no session rather than a weak one.
    throw std::runtime_error("RAND_bytes failed: cannot create a dashboard session");
  }
  std::string token;
  token.reserve(raw.size() * 2);
  static constexpr char kHex[] = "0123456789abcdef";
  for (unsigned char b : raw) {
    token += kHex[b >> 4];
    token += kHex[b & 0xf];
  }
  MutexLock l(&mu_);
  for (auto it = expiry_.begin(); it != expiry_.end();) {
    it = it->second <= now ? expiry_.erase(it) : std::next(it);
  }
  if (expiry_.size() >= kMaxSessions) {
    auto oldest = expiry_.begin();
    for (auto it = expiry_.begin(); it != expiry_.end(); ++it) {
      if (it->second < oldest->second) oldest = it;
    }
    expiry_.erase(oldest);
  }
  expiry_[token] = now + kSessionTtl;
  return token;
}

bool UiSessions::Valid(std::string_view token, Clock::time_point now) const {
  if (token.empty()) return false;
  MutexLock l(&mu_);
  auto it = expiry_.find(token);
  return it != expiry_.end() && now < it->second;
}

void UiSessions::Remove(std::string_view token) {
  MutexLock l(&mu_);
  if (auto it = expiry_.find(token); it != expiry_.end()) expiry_.erase(it);
}

bool UiSessions::AllowAttempt(Clock::time_point now) {
  MutexLock l(&mu_);
  while (!failures_.empty() && now - failures_.front() >= kFailureWindow) failures_.pop_front();
  return failures_.size() < kMaxFailures;
}

void UiSessions::RecordFailure(Clock::time_point now) {
  MutexLock l(&mu_);
  failures_.push_back(now);
  while (failures_.size() > kMaxFailures) failures_.pop_front();
}

size_t UiSessions::size() const {
  MutexLock l(&mu_);
  return expiry_.size();
}

std::string CookieValue(std::string_view header, std::string_view name) {
  size_t pos = 0;
  while (pos < header.size()) {
    size_t end = header.find(';', pos);
    if (end == std::string_view::npos) end = header.size();
    std::string_view part = header.substr(pos, end - pos);
    while (!part.empty() && part.front() == ' ') part.remove_prefix(1);
    while (!part.empty() && part.back() == ' ') part.remove_suffix(1);
    const size_t eq = part.find('=');
    if (eq != std::string_view::npos && part.substr(0, eq) == name) {
      return std::string(part.substr(eq + 1));
    }
    pos = end + 1;
  }
  return "";
}

}  // namespace arbiter::server_internal
