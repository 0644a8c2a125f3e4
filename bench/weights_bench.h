// bench/weights_bench.h — the weight runtime measured on a real
// model, each figure next to a limit measured in the same run
// (`arbiter bench weights`, docs/BENCHMARKS.md "Weight runtime").
//
// Scenarios (all on `model_dir`; bytes are decimal GB = 1e9 B; seconds are
// wall time; "p50" is the median over the repetitions — bench/bench_stats.h):
//
//   (a) floor_load — on-demand load from the host floor. A WeightCache over a
//       cpu DeviceBackend holds the model kPinnedSystem (floor materialized,
//       private store); then `repetitions` times: Evict (timed apart) and
//       Acquire (timed). Reports the Acquire wall time and
//       GB/s = weight bytes (Σ tensor bytes, f32) / seconds, p50.
//       The transfer is one thread's memcpy per tensor, into the cpu
//       backend's default huge-page arena. Limit, same byte count: 1-thread
//       memcpy between two plain buffers whose pages are already faulted in,
//       one copy right after each Acquire (a shared VM's memory bandwidth
//       drifts within a minute — docs/BENCHMARKS.md "Weight runtime" — so
//       each load is paired with its own limit); memcpy GB/s is their p50, and ratio = the p50
//       of the per-repetition ratios load GB/s / memcpy GB/s (goal ≥ 0.9).
//       Context (p50 of max(repetitions, 5) copies): memcpy into a faulted
//       huge-page arena (a tighter limit: fewer TLB misses), into a
//       just-Discarded one (what the load's copy itself can reach), into
//       freshly mapped base pages; and the same loads over an arena without
//       huge pages.
//
//   (b) file_load — Acquire of a kUnpinned model: the engine's fill reads the
//       safetensors tensors (bf16/f16/f32) and converts them to f32 straight
//       into the arena. Warm: the files' pages are in the page cache. Cold:
//       before every repetition each safetensors file is fdatasync'ed and
//       dropped with posix_fadvise(POSIX_FADV_DONTNEED); mincore() then
//       measures what stayed resident, and a note says so when the drop did
//       not take (another process maps the file, or the kernel refused).
//       Reports seconds, GB/s of file bytes (Σ safetensors file sizes) and of
//       f32 bytes. Limits, same run: a plain sequential read() of the same
//       files (8 MiB chunks) in the same cache state, and (a)'s memcpy.
//
//   (c) alternation — the method of vLLM's sleep-mode benchmark: two models
//       (model_dir and model2_dir) served by two Engines over one
//       WeightCache whose on-demand budget holds one of them, and requests
//       alternating A, B, A, B … for `repetitions` rounds (a round is one
//       request to each; 2 × repetitions requests after one untimed warm-up
//       round), each an 8-token pseudo-random prompt (never a cached prefix),
//       greedy, `gen_tokens` tokens. Every request after the first therefore
//       swaps the weights. Cases: "floor" (both kPinnedSystem: a swap is a
//       floor→arena copy), "file" (both kUnpinned: a swap re-reads and
//       converts the file; page cache warm), and "both_fit" (the budget holds
//       both: no swap, the ideal). Reports the total wall time of the timed
//       requests and the time to first token (TTFT = the request's wall time
//       minus the engine's decode timing, which starts at the first sample:
//       slot + weight Acquire (the swap) + prefill), p50 / min / max, and the
//       cache's load time per swap.
//
//   (d) worker_pss — `workers` fork()ed children each materialize the
//       model's floor through a SharedWeightStore (one region under a unique
//       prefix, unlinked by the last holder; leftovers swept) and, in a
//       second run, a PrivateWeightStore; each then reads one byte of every
//       page of its floor and waits. The parent sums over the children the
//       Pss of /proc/PID/smaps_rollup (whole process) and the Pss and Rss of
//       the /proc/PID/smaps mappings that hold the floor. ratio =
//       shared / private (≈ 1/workers expected for the floor); also each
//       Σ floor Pss against one copy's mapped bytes (≈ 1 shared, ≈ workers
//       private). The children inherit the parent's pages copy-on-write, so
//       the whole-process Pss includes a share of those.
//
// The loads in (a)–(c) time the library as the server runs it (no ledger:
// its bookkeeping is a few µs). spdlog is set to `err` during the run and
// restored afterwards.
//
// Errors: kInvalidArgument for repetitions, workers or gen_tokens < 1 or a
// missing model_dir; the errors of Engine::WeightModelFor / Engine::Load and
// WeightCache; kInternal when a scenario does not behave as set up (e.g. an
// Acquire that did not load from the floor, a child that failed: its message
// is included); kUnavailable when a temp dir or a child cannot be made.
//
// Thread safety: not thread-safe, and not to be run beside other work in the
// same process: it forks, changes the process-wide OpenBLAS thread count and
// spdlog level, and drops the model files from the page cache. Run one bench
// at a time on a quiet machine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "arbiter/base/status.h"
#include "bench/bench_stats.h"

namespace arbiter {

struct WeightsBenchOptions {
  std::string model_dir;  // REQUIRED
  // The second model of (c). Empty: a byte copy of model_dir's files in a
  // fresh temp dir (another key and file, same size), removed afterwards.
  std::string model2_dir;
  int repetitions = 10;  // (a), (b) per case; rounds of (c)
  int workers = 3;       // (d)
  int gen_tokens = 4;    // (c) tokens generated per request
  int threads = 1;       // (c) OpenBLAS and engine threads
};

struct FloorLoadResult {           // (a)
  uint64_t weight_bytes = 0;       // bytes transferred per load
  SampleSummary acquire_seconds;   // Evict excluded
  SampleSummary transfer_seconds;  // the cache's own load time (WeightModelStats)
  SampleSummary evict_seconds;
  double load_gb_s = 0;    // weight_bytes / acquire p50
  double memcpy_gb_s = 0;  // limit: faulted plain buffers, 1 thread, p50
  double ratio = 0;        // load_gb_s / memcpy_gb_s (goal ≥ 0.9)
  // Context (1 thread, p50): memcpy into a faulted huge-page arena, into a
  // Discarded huge-page arena, into freshly mapped base pages.
  double memcpy_huge_gb_s = 0;
  double memcpy_huge_discarded_gb_s = 0;
  double memcpy_fresh_gb_s = 0;
  // Context: the same loads over an arena without huge pages.
  SampleSummary base_pages_acquire_seconds;
  SampleSummary base_pages_evict_seconds;
  double base_pages_load_gb_s = 0;
};

struct FileLoadCase {  // one cache state of (b)
  bool cold = false;
  // Largest fraction of the files' pages still resident after a drop
  // (mincore; 0 when warm or when it could not be measured).
  double resident_after_drop = 0;
  SampleSummary acquire_seconds;
  double file_gb_s = 0;        // file bytes / acquire p50
  double f32_gb_s = 0;         // f32 bytes / acquire p50
  SampleSummary read_seconds;  // limit: plain sequential read, same state
  double read_gb_s = 0;        // file bytes / read p50
  double ratio_vs_read = 0;    // file_gb_s / read_gb_s
  double ratio_vs_memcpy = 0;  // f32_gb_s / (a).memcpy_gb_s
};

struct FileLoadResult {     // (b)
  uint64_t file_bytes = 0;  // Σ safetensors file sizes
  uint64_t f32_bytes = 0;   // = (a).weight_bytes
  FileLoadCase warm;
  FileLoadCase cold;
  std::string note;  // e.g. why the cold case is not cold
};

struct AlternationCase {            // one case of (c)
  std::string name;                 // "floor" | "file" | "both_fit"
  std::string residency;            // "pinned_system" | "unpinned"
  bool swapping = true;             // the budget holds one model
  int requests = 0;                 // timed requests
  uint64_t loads = 0;               // cache loads during the timed requests
  double total_seconds = 0;         // Σ wall of the timed requests
  SampleSummary ttft_seconds;       // every timed request
  SampleSummary swap_load_seconds;  // the cache's load time, per load
};

struct AlternationResult {  // (c)
  int rounds = 0;
  int prompt_tokens = 0;
  int gen_tokens = 0;
  uint64_t on_demand_budget = 0;       // swapping cases
  uint64_t model_bytes = 0;            // one model's device block
  std::vector<AlternationCase> cases;  // floor, file, both_fit
};

struct PssCase {      // one store of (d)
  std::string store;  // "shared" | "private"
  int workers = 0;
  int filled_here = 0;                // children that ran the fill
  uint64_t sum_pss_bytes = 0;         // Σ smaps_rollup Pss
  uint64_t sum_floor_pss_bytes = 0;   // Σ Pss of the floor mappings
  uint64_t sum_floor_rss_bytes = 0;   // Σ Rss of the floor mappings
  SampleSummary materialize_seconds;  // per child
};

struct PssResult {           // (d)
  uint64_t floor_bytes = 0;  // one floor's mapped bytes
  PssCase shared;
  PssCase private_store;
  double floor_ratio = 0;      // shared / private, floor Pss
  double total_ratio = 0;      // shared / private, whole-process Pss
  double shared_vs_copy = 0;   // Σ shared floor Pss / floor_bytes
  double private_vs_copy = 0;  // Σ private floor Pss / floor_bytes
  int leftover_regions = 0;    // regions the final sweep removed (0 expected)
};

struct WeightsBenchResult {
  std::string model_dir;
  std::string model2_dir;
  bool model2_is_copy = false;
  int repetitions = 0;
  int workers = 0;
  int threads = 0;
  double loadavg_start = 0;  // /proc/loadavg, 1 minute
  double loadavg_end = 0;
  FloorLoadResult floor_load;
  FileLoadResult file_load;
  AlternationResult alternation;
  PssResult pss;
};

Result<WeightsBenchResult> RunWeightsBench(const WeightsBenchOptions& options);

// A human-readable report: one table per scenario with its limits and ratios.
std::string FormatWeightsBench(const WeightsBenchResult& result);

// The result as one JSON object (`arbiter bench weights --json`), with a
// trailing newline. A SampleSummary (seconds) is {samples, p50, min, max}.
std::string FormatWeightsBenchJson(const WeightsBenchResult& result);

}  // namespace arbiter
