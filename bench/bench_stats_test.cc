// bench/bench_stats_test.cc — the benches' one summary, GB/s and clock.
#include "bench/bench_stats.h"

#include <gtest/gtest.h>

#include <vector>

namespace arbiter {
namespace {

TEST(BenchStatsTest, EmptySummaryIsZero) {
  const SampleSummary s = Summarize({});
  EXPECT_EQ(s.samples, 0u);
  EXPECT_EQ(s.min, 0);
  EXPECT_EQ(s.p50, 0);
  EXPECT_EQ(s.p99, 0);
  EXPECT_EQ(s.max, 0);
  EXPECT_EQ(s.mean, 0);
}

TEST(BenchStatsTest, MedianOfAnOddAndAnEvenCount) {
  SampleSummary s = Summarize({3, 1, 2});
  EXPECT_EQ(s.samples, 3u);
  EXPECT_EQ(s.min, 1);
  EXPECT_EQ(s.p50, 2);
  EXPECT_EQ(s.max, 3);
  EXPECT_DOUBLE_EQ(s.mean, 2);
  s = Summarize({4, 1, 3, 2});
  EXPECT_EQ(s.p50, 2.5);  // the mean of the two middle samples
  EXPECT_DOUBLE_EQ(s.mean, 2.5);
}

TEST(BenchStatsTest, P99IsTheNearestRank) {
  std::vector<double> v;
  for (int i = 1; i <= 200; ++i) v.push_back(i);
  EXPECT_EQ(Summarize(v).p99, 198);  // ceil(0.99 · 200) = 198th smallest
  v.resize(50);
  EXPECT_EQ(Summarize(v).p99, 50);  // ceil(49.5) = 50: the largest
  EXPECT_EQ(Summarize({7}).p99, 7);
}

TEST(BenchStatsTest, GbPerSecondIsDecimalGigabytesPerSecond) {
  EXPECT_DOUBLE_EQ(GbPerSecond(2e9, 0.5), 4.0);
  EXPECT_DOUBLE_EQ(GbPerSecond(16e6, 7.4 / 1e3), 16e6 / 7.4e-3 / 1e9);
  EXPECT_EQ(GbPerSecond(1e9, 0), 0);
  EXPECT_EQ(GbPerSecond(1e9, -1), 0);
}

TEST(BenchStatsTest, ClockIsMonotonic) {
  const double t0 = NowSeconds();
  double last = t0;
  for (int i = 0; i < 1000; ++i) {
    const double t = NowSeconds();
    EXPECT_GE(t, last);
    last = t;
  }
  EXPECT_GE(MsSince(t0), 0);
  EXPECT_GE(LoadAverage1(), 0);
}

}  // namespace
}  // namespace arbiter
