// bench/arbiter_bench.h — latency of the MemoryArbiter's hot operations
// against the reference numbers and our targets (`arbiter bench arbiter`;
// docs/BENCHMARKS.md "MemoryArbiter" has the method, the references, the
// targets and the results).
//
// Scenarios (each reports p50 / p99 / mean in ns over per-operation samples,
// a SampleSummary of bench/bench_stats.h):
//   limit_timer             an empty timed region (subtracted from every sample)
//   limit_mutex             uncontended std::mutex lock + unlock
//   limit_atomic            uncontended atomic fetch_add + fetch_sub pair
//   acquire_release_1t      Acquire + Release of an already-resident handle
//   acquire_release_2t_diff 2 threads, each on its own resident model
//   acquire_release_2t_same 2 threads on the same resident model
//                           (2-thread cases: each thread pinned to its own
//                           CPU; the note reports parallelism = Σ thread CPU
//                           time / wall time, 2.0 = fully concurrent)
//   fit_evict_N             (N = 10, 100, 1000 idle resident entries of 1 MiB
//                           under an N MiB budget, refuse_over_budget on as in
//                           the server) an Acquire of a non-resident key that
//                           forces exactly one fit eviction; the load callable
//                           is trivial
//   pressure_to_unload      BridgePressureSource::Dispatch(low) → the victim's
//                           unload callable has run (one idle victim)
//   pressure_rss_drop       Dispatch(low) → /proc/self/statm shows the
//                           victim's 64 MiB (touched, mmap'ed) returned; no
//                           target
// Timing: rdtsc (x86, constant TSC) calibrated against NowSeconds() in the
// same run, else NowSeconds(); the median cost of an empty timed region is
// subtracted from every sample. A virtual machine's TSC may advance in steps
// of several ns (docs/BENCHMARKS.md "MemoryArbiter"), so the ns-scale
// scenarios (acquire_release_*, limit_mutex, limit_atomic) time batches of 8
// consecutive operations and a sample is the batch mean. spdlog is set to
// err while the bench runs (the arbiter logs loads and unloads at info) and
// restored afterwards.
//
// Thread safety: not thread-safe; run one bench at a time on a quiet machine.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "arbiter/base/status.h"
#include "bench/bench_stats.h"

namespace arbiter {

struct ArbiterBenchScenario {
  std::string name;         // e.g. "acquire_release_1t"
  std::string description;  // one line
  SampleSummary ns;         // per operation, timer overhead subtracted
  // Reference (TypeScript implementation, same machine class); 0 = none.
  double reference_p50_ns = 0;
  double reference_p99_ns = 0;
  // Our targets; 0 = none.
  double target_p50_ns = 0;
  double target_p99_ns = 0;
  bool is_limit = false;  // a same-run limit for context, not an arbiter op
  std::string note;       // e.g. "evictions 1000/1000"
};

struct ArbiterBenchResult {
  int iterations = 0;
  std::string timer;  // "rdtsc" or "steady_clock"
  double timer_overhead_ns = 0;
  std::vector<ArbiterBenchScenario> scenarios;
};

// `iterations` timed operations per scenario (the RSS scenario runs
// min(iterations, 20)). Errors: kInvalidArgument for iterations < 1; any
// arbiter error during setup (kInternal when a scenario does not behave as
// set up, e.g. an acquire that did not evict exactly one entry).
Result<ArbiterBenchResult> RunArbiterBench(int iterations);

// A human-readable table: scenario, p50, p99, reference, target, met?
std::string FormatArbiterBench(const ArbiterBenchResult& result);

// The result as one JSON object (`arbiter bench arbiter --json`), with a
// trailing newline; a scenario's summary is flat: samples, p50_ns, p99_ns,
// mean_ns.
std::string FormatArbiterBenchJson(const ArbiterBenchResult& result);

}  // namespace arbiter
