// The shared polling pieces (Note [Polling pressure sources]): the poll
// thread's wakes and prompt stop, the interval floor, the watermark
// fallbacks and the level latch. Tests wait on conditions with a fuse, never
// sleep for a state.
#include "memory/internal/pressure_poller.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "arbiter/base/mutex.h"

namespace arbiter::internal {
namespace {

using L = MemoryPressureLevel;

// Counts on_wake calls and what they saw; tests wait on it with a fuse.
class WakeLog {
 public:
  void Record(std::span<pollfd> watches) {
    MutexLock l(&mu_);
    ++wakes_;
    for (const pollfd& p : watches) {
      if (p.revents != 0) ++ready_;
    }
    if (watches.empty() || watches[0].revents == 0) ++timeouts_;
    cv_.SignalAll();
  }
  // A fuse, not a sleep: returns as soon as `pred` holds.
  template <typename Pred>
  bool WaitFor(Pred pred, std::chrono::seconds fuse = std::chrono::seconds(30)) {
    const auto deadline = std::chrono::steady_clock::now() + fuse;
    MutexLock l(&mu_);
    while (!pred(wakes_, ready_, timeouts_)) {
      if (!cv_.WaitUntil(deadline) && std::chrono::steady_clock::now() >= deadline) {
        return pred(wakes_, ready_, timeouts_);
      }
    }
    return true;
  }
  int wakes() {
    MutexLock l(&mu_);
    return wakes_;
  }

 private:
  Mutex mu_;
  CondVar cv_{&mu_};
  int wakes_ GUARDED_BY(mu_) = 0;
  int ready_ GUARDED_BY(mu_) = 0;
  int timeouts_ GUARDED_BY(mu_) = 0;
};

class Pipe {
 public:
  Pipe() { EXPECT_EQ(::pipe(fds_), 0); }
  ~Pipe() {
    ::close(fds_[0]);
    ::close(fds_[1]);
  }
  int read_fd() const { return fds_[0]; }
  void Write() { EXPECT_EQ(::write(fds_[1], "x", 1), 1); }
  void Drain() {
    char c;
    EXPECT_EQ(::read(fds_[0], &c, 1), 1);
  }

 private:
  int fds_[2] = {-1, -1};
};

TEST(PressurePollerTest, WakesOnTheIntervalAndStopsAtOnce) {
  WakeLog log;
  PressurePoller poller("test", nullptr);
  EXPECT_FALSE(poller.running());
  ASSERT_TRUE(poller.Start(kMinPressurePollIntervalMs, {},
                           [&](std::span<pollfd> w) { log.Record(w); })
                  .ok());
  EXPECT_TRUE(poller.running());
  // Two interval wakes, with no fd watched: each is a timeout.
  EXPECT_TRUE(log.WaitFor([](int wakes, int, int timeouts) { return wakes >= 2 && timeouts >= 2; }));
  poller.Stop();
  EXPECT_FALSE(poller.running());
  const int after = log.wakes();
  poller.Stop();  // idempotent
  EXPECT_EQ(log.wakes(), after) << "no wake after Stop() returned";
}

TEST(PressurePollerTest, StopDoesNotWaitOutTheInterval) {
  WakeLog log;
  PressurePoller poller("test", nullptr);
  ASSERT_TRUE(poller.Start(3'600'000, {}, [&](std::span<pollfd> w) { log.Record(w); }).ok());
  ASSERT_TRUE(poller.Start(10, {}, [](std::span<pollfd>) { FAIL(); }).ok())
      << "Start() while running is a no-op";
  const auto t0 = std::chrono::steady_clock::now();
  poller.Stop();
  // The interval is an hour; a Stop() that waited for it would hit the
  // test's own timeout long before this bound.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  EXPECT_EQ(log.wakes(), 0) << "Stop()'s wake is not passed to on_wake";
  // A stopped poller starts again.
  ASSERT_TRUE(poller.Start(3'600'000, {}, [&](std::span<pollfd> w) { log.Record(w); }).ok());
  poller.Stop();
}

TEST(PressurePollerTest, AReadyWatchWakesItWithItsRevents) {
  Pipe pipe;
  WakeLog log;
  PressurePoller poller("test", nullptr);
  ASSERT_TRUE(poller
                  .Start(3'600'000, {pollfd{pipe.read_fd(), POLLIN, 0}, pollfd{-1, POLLIN, 0}},
                         [&](std::span<pollfd> w) {
                           EXPECT_EQ(w.size(), 2u);
                           EXPECT_EQ(w[1].revents, 0) << "a negative fd is skipped";
                           if (w[0].revents & POLLIN) pipe.Drain();
                           log.Record(w);
                         })
                  .ok());
  pipe.Write();
  EXPECT_TRUE(log.WaitFor([](int, int ready, int) { return ready >= 1; }));
  pipe.Write();
  EXPECT_TRUE(log.WaitFor([](int, int ready, int) { return ready >= 2; }));
  poller.Stop();
}

TEST(PressurePollerTest, OnWakeMayStopPollingAWatch) {
  Pipe pipe;
  WakeLog log;
  PressurePoller poller("test", nullptr);
  // The pipe stays readable (never drained): without the fd = -1 below the
  // thread would spin. After it, only Stop() wakes the thread.
  ASSERT_TRUE(poller
                  .Start(3'600'000, {pollfd{pipe.read_fd(), POLLIN, 0}},
                         [&](std::span<pollfd> w) {
                           w[0].fd = -1;
                           log.Record(w);
                         })
                  .ok());
  pipe.Write();
  EXPECT_TRUE(log.WaitFor([](int wakes, int, int) { return wakes >= 1; }));
  poller.Stop();
  EXPECT_EQ(log.wakes(), 1);
}

TEST(PressurePollerTest, IntervalsBelowTheFloorAreRaised) {
  EXPECT_EQ(ClampPollIntervalMs(0), kMinPressurePollIntervalMs);
  EXPECT_EQ(ClampPollIntervalMs(-5), kMinPressurePollIntervalMs);
  EXPECT_EQ(ClampPollIntervalMs(kMinPressurePollIntervalMs - 1), kMinPressurePollIntervalMs);
  EXPECT_EQ(ClampPollIntervalMs(kMinPressurePollIntervalMs), kMinPressurePollIntervalMs);
  EXPECT_EQ(ClampPollIntervalMs(kDefaultPressurePollIntervalMs), kDefaultPressurePollIntervalMs);
}

TEST(PressurePollerTest, WatermarksFallBackThenMustBeOrdered) {
  double low = 1.5, critical = 0;
  ASSERT_TRUE(NormalizeWatermarks(&low, &critical).ok());
  EXPECT_DOUBLE_EQ(low, kDefaultLowWaterFraction);
  EXPECT_DOUBLE_EQ(critical, kDefaultCriticalWaterFraction);
  low = 0.2;
  critical = 0.1;
  ASSERT_TRUE(NormalizeWatermarks(&low, &critical).ok());
  EXPECT_DOUBLE_EQ(low, 0.2);
  EXPECT_DOUBLE_EQ(critical, 0.1);
  low = 0.01;  // the default critical (0.05) is above it
  critical = -1;
  Status s = NormalizeWatermarks(&low, &critical);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "pressure.critical_fraction (0.05) must be < pressure.low_fraction (0.01)");
}

TEST(PressureLevelLatchTest, FiresFirstThenOnlyOnLevelChanges) {
  auto listeners = std::make_shared<PressureListeners>(nullptr);
  std::vector<L> seen;
  MemoryPressureSubscription sub =
      listeners->Subscribe([&](const MemoryPressureEvent& e) { seen.push_back(e.level); });
  PressureLevelLatch latch;
  EXPECT_FALSE(latch.fired());
  auto offer = [&](L level) {
    MemoryPressureEvent e;
    e.level = level;
    std::optional<PressureListeners::Pending> p = latch.Offer(e, *listeners);
    if (p) listeners->Deliver(*p);
    return p.has_value();
  };
  EXPECT_TRUE(offer(L::kNominal)) << "the first event fires even at nominal";
  EXPECT_TRUE(latch.fired());
  EXPECT_FALSE(offer(L::kNominal));
  EXPECT_TRUE(offer(L::kCritical));
  EXPECT_FALSE(offer(L::kCritical));
  EXPECT_TRUE(offer(L::kLow));
  EXPECT_EQ(latch.level(), L::kLow);
  EXPECT_EQ(seen, (std::vector<L>{L::kNominal, L::kCritical, L::kLow}));
  ASSERT_TRUE(listeners->last().has_value());
  EXPECT_EQ(listeners->last()->level, L::kLow);
}

}  // namespace
}  // namespace arbiter::internal
