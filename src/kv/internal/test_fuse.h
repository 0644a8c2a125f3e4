// kv/internal/test_fuse.h — a test "fuse" (STYLE.md, BFC allocator): runs a
// body that could deadlock if a locking rule were broken, and turns a hang
// into a failure. Test-only.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>

namespace arbiter::testing_internal {

// Runs `body` on the calling thread. If it has not returned after `limit`,
// prints `what` and ends the process with status 1 (a deadlocked thread
// cannot be unwound, so the test binary fails instead of hanging).
inline void RunWithFuse(const char* what, std::chrono::seconds limit,
                        const std::function<void()>& body) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> l(mu);
    if (!cv.wait_for(l, limit, [&] { return done; })) {
      std::fprintf(stderr, "test fuse: %s did not finish within %lld s (deadlock?)\n", what,
                   static_cast<long long>(limit.count()));
      std::fflush(stderr);
      std::_Exit(1);
    }
  });
  body();
  {
    std::lock_guard<std::mutex> l(mu);
    done = true;
  }
  cv.notify_one();
  watchdog.join();
}

}  // namespace arbiter::testing_internal
