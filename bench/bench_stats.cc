// bench/bench_stats.cc — see bench_stats.h for the conventions.
#include "bench/bench_stats.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include "arbiter/base/clock.h"

namespace arbiter {

double NowSeconds() { return static_cast<double>(Clock::Real()->NowNs()) / 1e9; }

double MsSince(double start_seconds) { return (NowSeconds() - start_seconds) * 1e3; }

double GbPerSecond(double bytes, double seconds) { return seconds > 0 ? bytes / seconds / 1e9 : 0; }

SampleSummary Summarize(std::vector<double> v) {
  SampleSummary s;
  s.samples = v.size();
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  s.min = v.front();
  s.max = v.back();
  s.p50 = n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  // Nearest rank: the smallest value with ≥ 99 % of the samples at or below it.
  const size_t rank = static_cast<size_t>(std::ceil(0.99 * static_cast<double>(n)));
  s.p99 = v[std::max<size_t>(rank, 1) - 1];
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / static_cast<double>(n);
  return s;
}

double LoadAverage1() {
  std::ifstream f("/proc/loadavg");
  double v = 0;
  f >> v;
  return v;
}

}  // namespace arbiter
