// server/internal/http/fake_responder.h — an in-memory http::Responder for
// tests of route handlers: records what the handler sent, and lets the test
// say when the client is "gone" (cancelled(), Write() returning false).
//
// Usage:
//   http::FakeResponder r;
//   handler(request, r);
//   EXPECT_EQ(r.status(), 200);
//   EXPECT_EQ(r.body(), R"({"status":"ok"})");   // Send() body or the chunks joined
//
//   http::FakeResponder gone;
//   gone.CancelAfterWrites(3);   // the client leaves after three chunks
//
// Thread safety: thread-safe (a handler may run on another thread while the
// test reads or cancels).
#pragma once

#include <atomic>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "arbiter/base/mutex.h"
#include "server/internal/http/http_server.h"

namespace arbiter::http {

class FakeResponder final : public Responder {
 public:
  void Send(Response response) override {
    MutexLock l(&mu_);
    ++answers_;
    status_ = response.status;
    content_type_ = std::move(response.content_type);
    headers_ = std::move(response.headers);
    body_ = std::move(response.body);
  }
  bool StartStream(int status, std::string content_type,
                   std::vector<std::pair<std::string, std::string>> headers) override {
    MutexLock l(&mu_);
    ++answers_;
    streamed_ = true;
    status_ = status;
    content_type_ = std::move(content_type);
    headers_ = std::move(headers);
    return !cancelled();
  }
  bool Write(std::string_view chunk) override {
    MutexLock l(&mu_);
    if (cancelled()) return false;
    chunks_.emplace_back(chunk);
    body_.append(chunk);
    if (cancel_after_writes_ > 0 && static_cast<int>(chunks_.size()) >= cancel_after_writes_) {
      cancelled_.store(true);
      source_.Cancel();
    }
    return true;
  }
  void End() override {
    MutexLock l(&mu_);
    ended_ = true;
  }
  bool cancelled() const override { return cancelled_.load(); }
  CancelToken cancel_token() const override { return source_.token(); }

  // The client hangs up now / after `n` successful Write()s.
  void Cancel() {
    cancelled_.store(true);
    source_.Cancel();
  }
  void CancelAfterWrites(int n) {
    MutexLock l(&mu_);
    cancel_after_writes_ = n;
  }

  int status() const { return Get(&FakeResponder::status_); }
  std::string content_type() const { return Get(&FakeResponder::content_type_); }
  std::string body() const { return Get(&FakeResponder::body_); }
  std::vector<std::string> chunks() const { return Get(&FakeResponder::chunks_); }
  bool streamed() const { return Get(&FakeResponder::streamed_); }
  bool ended() const { return Get(&FakeResponder::ended_); }
  // How many times Send()/StartStream() were called (a handler must answer once).
  int answers() const { return Get(&FakeResponder::answers_); }
  // The first value of response header `name` (any case), "" if absent.
  std::string header(std::string_view name) const {
    MutexLock l(&mu_);
    for (const auto& [n, v] : headers_) {
      if (!CaseInsensitiveLess()(n, name) && !CaseInsensitiveLess()(name, n)) return v;
    }
    return "";
  }

 private:
  // Member pointers are beyond the thread-safety analysis; the lock is held.
  template <typename T>
  T Get(T FakeResponder::*field) const NO_THREAD_SAFETY_ANALYSIS {
    MutexLock l(&mu_);
    return this->*field;
  }

  mutable Mutex mu_;
  int answers_ GUARDED_BY(mu_) = 0;
  int status_ GUARDED_BY(mu_) = 0;
  std::string content_type_ GUARDED_BY(mu_);
  std::vector<std::pair<std::string, std::string>> headers_ GUARDED_BY(mu_);
  std::string body_ GUARDED_BY(mu_);
  std::vector<std::string> chunks_ GUARDED_BY(mu_);
  bool streamed_ GUARDED_BY(mu_) = false;
  bool ended_ GUARDED_BY(mu_) = false;
  int cancel_after_writes_ GUARDED_BY(mu_) = 0;
  std::atomic<bool> cancelled_{false};
  CancelSource source_;
};

}  // namespace arbiter::http
