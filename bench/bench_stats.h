// bench/bench_stats.h — the one clock, bandwidth unit and sample summary of
// every benchmark scenario in bench/ (`arbiter bench …`).
//
// Conventions, shared by all scenarios so their figures compare:
//   time       NowSeconds(): Clock::Real()'s monotonic nanoseconds, in
//              seconds; only differences mean anything. A scenario that
//              reports milliseconds converts (MsSince).
//   bandwidth  GbPerSecond(): decimal GB (1e9 bytes) per second of wall time.
//   samples    SampleSummary: count, min, p50 (the median: the mean of the two
//              middle samples when the count is even), p99 (nearest rank: the
//              smallest sample with ≥ 99 % of the samples at or below it),
//              max and mean, in the samples' own unit. For times, min is the
//              best sample; for rates (GB/s), max is.
// The arbiter scenario times nanosecond-scale operations with its own tick
// counter (rdtsc, calibrated against NowSeconds in the same run); its samples
// are summarized here too.
//
// Example:
//   std::vector<double> ms;
//   for (int i = 0; i < 5; ++i) {
//     const double t0 = NowSeconds();
//     Work();
//     ms.push_back(MsSince(t0));
//   }
//   const SampleSummary s = Summarize(ms);  // s.min, s.p50, ...
//   const double gb_s = GbPerSecond(bytes, s.p50 / 1e3);
//
// Thread safety: thread-safe (no shared state).
#pragma once

#include <cstddef>
#include <vector>

namespace arbiter {

// Seconds on the process's real monotonic clock (Clock::Real()).
double NowSeconds();

// Milliseconds from `start_seconds` (a NowSeconds() value) to now.
double MsSince(double start_seconds);

// bytes / seconds / 1e9; 0 when seconds ≤ 0 (no sample, or a clock that did
// not advance).
double GbPerSecond(double bytes, double seconds);

// A summary of one figure's samples; all zero when there are none.
struct SampleSummary {
  size_t samples = 0;
  double min = 0;
  double p50 = 0;  // median
  double p99 = 0;  // nearest rank
  double max = 0;
  double mean = 0;
};

SampleSummary Summarize(std::vector<double> samples);

// The 1-minute load average (/proc/loadavg; 0 when unreadable), recorded by
// the scenarios at start and end so a disturbed run shows.
double LoadAverage1();

}  // namespace arbiter
