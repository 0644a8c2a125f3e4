// Clock::NowUnixMs: the real wall clock, and the simulated clock's one timeline.
#include "arbiter/base/clock.h"

#include <time.h>

#include <gtest/gtest.h>

namespace arbiter {
namespace {

TEST(ClockTest, RealNowUnixMsIsTheWallClock) {
  timespec ts;
  ASSERT_EQ(clock_gettime(CLOCK_REALTIME, &ts), 0);
  const int64_t before_ms = static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
  const int64_t now_ms = Clock::Real()->NowUnixMs();
  ASSERT_EQ(clock_gettime(CLOCK_REALTIME, &ts), 0);
  const int64_t after_ms = static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
  EXPECT_LE(before_ms, now_ms);
  EXPECT_LE(now_ms, after_ms);
  EXPECT_GT(now_ms, int64_t{1'600'000'000'000});  // after September 2020
}

TEST(ClockTest, SimulatedNowUnixMsFollowsTheSimulatedTimeline) {
  SimulatedClock clock(1'800'000'000'000);
  EXPECT_EQ(clock.NowUnixMs(), 1'800'000'000'000);
  clock.AdvanceMs(360'000);
  EXPECT_EQ(clock.NowUnixMs(), 1'800'000'360'000);
  EXPECT_EQ(clock.NowUnixMs(), clock.NowMs());
  clock.SetMs(5);
  EXPECT_EQ(clock.NowUnixMs(), 5);
  // Through the interface too.
  const Clock& base = clock;
  EXPECT_EQ(base.NowUnixMs(), 5);
}

}  // namespace
}  // namespace arbiter
