// CancelSource / CancelToken / Cancellation (arbiter/base/cancel.h).
#include "arbiter/base/cancel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace arbiter {
namespace {

TEST(CancelTest, DefaultTokenNeverFires) {
  CancelToken t;
  EXPECT_FALSE(t.cancelled());
  EXPECT_FALSE(t.can_be_cancelled());
  bool ran = false;
  CancelRegistration r = t.OnCancel([&] { ran = true; });
  EXPECT_FALSE(ran);
  Cancellation c;
  EXPECT_FALSE(c.cancelled());
  EXPECT_FALSE(c.polls());
  Cancellation n(nullptr);
  EXPECT_FALSE(n.cancelled());
}

TEST(CancelTest, CancelRunsCallbacksOnceAndLateOnesAtOnce) {
  CancelSource source;
  CancelToken token = source.token();
  EXPECT_TRUE(token.can_be_cancelled());
  int runs = 0;
  CancelRegistration r = token.OnCancel([&] { ++runs; });
  EXPECT_EQ(runs, 0);
  source.Cancel();
  EXPECT_TRUE(token.cancelled());
  EXPECT_TRUE(source.cancelled());
  EXPECT_EQ(runs, 1);
  source.Cancel();  // idempotent
  EXPECT_EQ(runs, 1);
  int late = 0;
  CancelRegistration r2 = token.OnCancel([&] { ++late; });
  EXPECT_EQ(late, 1);  // already cancelled: ran on this thread
}

TEST(CancelTest, ResetRegistrationDoesNotRun) {
  CancelSource source;
  int runs = 0;
  CancelRegistration r = source.token().OnCancel([&] { ++runs; });
  CancelRegistration moved = std::move(r);
  moved.Reset();
  source.Cancel();
  EXPECT_EQ(runs, 0);
}

// The use the engine makes of it: a waiter with an hour-long deadline is
// woken by a Cancel() from another thread through its callback.
TEST(CancelTest, CancelFromAnotherThreadWakesAWaiter) {
  CancelSource source;
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<bool> waiting{false};
  bool woke_cancelled = false;
  std::thread waiter([&] {
    CancelToken token = source.token();
    CancelRegistration r = token.OnCancel([&] {
      std::lock_guard<std::mutex> l(mu);
      cv.notify_all();
    });
    std::unique_lock<std::mutex> l(mu);
    waiting = true;
    woke_cancelled = cv.wait_until(l, std::chrono::steady_clock::now() + std::chrono::hours(1),
                                   [&] { return token.cancelled(); });
  });
  while (!waiting) std::this_thread::yield();
  source.Cancel();
  waiter.join();
  EXPECT_TRUE(woke_cancelled);
}

TEST(CancelTest, CancellationCombinesTokenAndPredicate) {
  bool flag = false;
  Cancellation pred([&] { return flag; });
  EXPECT_TRUE(pred.polls());
  EXPECT_FALSE(pred.cancelled());
  flag = true;
  EXPECT_TRUE(pred.cancelled());

  CancelFn empty;
  Cancellation from_empty(empty);
  EXPECT_FALSE(from_empty.polls());
  EXPECT_FALSE(from_empty.cancelled());

  CancelSource source;
  Cancellation tok(source.token());
  EXPECT_FALSE(tok.polls());
  EXPECT_FALSE(tok.cancelled());
  source.Cancel();
  EXPECT_TRUE(tok.cancelled());

  CancelSource s2;
  Cancellation both(s2.token(), [] { return false; });
  EXPECT_TRUE(both.polls());
  EXPECT_FALSE(both.cancelled());
  s2.Cancel();
  EXPECT_TRUE(both.cancelled());
}

}  // namespace
}  // namespace arbiter
