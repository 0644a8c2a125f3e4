// bench/kv_bench.h — the KV precache measured on a real model
// (`arbiter bench kv`, docs/BENCHMARKS.md "KV precache (`arbiter bench
// kv`)"), each figure next to an ideal or a limit measured in the same run.
//
// Everything runs in one process on one Engine of `n_slots` slots with a
// real KvPrecache, PromptCache (no ledger) and KvStore (a temp dir, removed
// afterwards). Token ids are deterministic pseudo-random ids in [0, vocab)
// (every prompt is reproducible; no tokenizer involved). Times are wall
// times in ms (NowSeconds, bench/bench_stats.h); GB = 1e9 B; "best" is the
// minimum and "p50" the median over the repetitions; p99 is the
// nearest-rank percentile (SampleSummary).
//
// Scenarios:
//
//   TTFT of one turn — a stable prefix of prefix_tokens and a user turn of
//   turn_tokens, 1 generated token (greedy), so TTFT = the wall time of the
//   whole KvPrecache::Generate call (slot wait, any stash and restore,
//   prefill, the sample). Each repetition runs the cases in this order, each
//   from empty slots, a fresh PromptCache and a fresh KvPrecache, with a turn
//   of its own (the same in every case of that repetition):
//     ideal         Engine::Generate pinned to a slot that holds exactly the
//                   prefix (RestoreSlot of the prefix, computed once at the
//                   start): the cost of prefilling only the turn's tokens at
//                   position prefix_tokens. Wall time of the call (the
//                   engine's prefill_ms is reported beside it).
//     cold          a new conversation, nothing in any slot, the host tier
//                   or on disk: the whole prompt is computed.
//     prewarm       KvPrecache::Prewarm of the prefix (its own time is
//                   reported, not part of the TTFT), then the turn: the slot
//                   already holds the prefix.
//     prompt_cache  the prefix is on the conversation's slot (RestoreSlot +
//                   Prewarm, which then computes one token), then short
//                   displacer conversations (turn_tokens each) run until one
//                   takes that slot, moving the conversation's KV into the
//                   PromptCache; then the turn: the displacer's KV is
//                   stashed and the conversation's restored from RAM.
//     disk          the prefix on the conversation's slot as above, then
//                   KvPrecache::Close (the KV file is written, fsynced),
//                   then empty slots and a fresh PromptCache/KvPrecache;
//                   then the turn: the file is read and restored (page
//                   cache warm: it was just written).
//   Each case reports best and p50, and each as a ratio to the ideal's
//   best and p50. Every repetition is checked (cached, restored and copied
//   tokens, the tier the outcome names); a deviation is kInternal.
//
//   Save and restore — the prefix in slot 0; per repetition:
//     save_slot     Engine::SaveSlot(0) (slot → KvSnapshot)
//     write_file    KvStore::Save of that snapshot as a conversation saved
//                   for the first time (WriteKvFile: temp file, fsync,
//                   rename, fsync of the directory)
//     rewrite_file  KvStore::Save of it again: the rename replaces (frees)
//                   the conversation's previous file
//     read_file     ReadKvFile of that file (page cache warm), validated
//     restore_slot  Engine::RestoreSlot(1, snapshot)
//     file_to_slot  KvStore::LoadMapped + RestoreSlot(1) of the mapped
//                   file's view + unmapping: what a disk restore costs a
//                   request (KvPrecache restores the same way)
//   and as context in the same run: the restore through a KvSnapshot
//   (KvStore::Load + RestoreSlot + free: two copies); write() of as many
//   bytes without fsync (+ close), then the fsync of that file alone;
//   memcpy bandwidth (MeasureMemcpyBandwidth, snapshot bytes, 1 thread,
//   best of 5) next to each repetition. GB/s use the file's bytes for file
//   operations and the snapshot's (tokens + K/V) for slot operations.
//   Reference (llama.cpp on this machine class, the figures the KV precache
//   is judged against; docs/BENCHMARKS.md "KV precache"): a 2000-token state
//   of ref_bytes saved in ref_save_ms and loaded in ref_load_ms, no fsync
//   (KvSaveRestoreResult). Targets: file_to_slot ≥ target_file_to_slot_gb_s;
//   save_slot + write_file (with fsync) ≤ 2 × ref_save_ms × our file bytes /
//   ref_bytes (our K/V is f32, so about twice their bytes);
//   the same bound is also checked for save_slot + rewrite_file. Judged on
//   the p50.
//
//   Shared prefix — for each length in shared_prefix_tokens: shared_requests
//   requests without a conversation id, one at a time, each that shared
//   prefix + a suffix of U[suffix_min, suffix_max] tokens, generating
//   U[output_min, output_max] tokens (fixed seed). TTFT = wall − the
//   engine's decode_ms (decode_ms starts at the first sample, so this is
//   slot + prefill; the first sample itself, µs, is left out). Reports
//   p50/p99 TTFT, the first (cold) request's TTFT, hit fraction = Σ cached
//   / Σ prompt tokens, and prompt tokens computed.
//
//   Multi-round QA — qa_users conversations × qa_rounds rounds on n_slots
//   slots, round-robin (user 0..n−1 in every round). A user's first prompt
//   is its own context of qa_context_tokens plus a question of turn_tokens;
//   every later round appends the previous answer (qa_answer_tokens
//   generated, greedy) and a new question. TTFT as in the shared-prefix
//   case. Two host-tier sizes: one PromptCache that holds every user's
//   final KV ("host_holds_all"), one that holds two of them
//   ("host_holds_2"; LRU under a cyclic order then sends every return to
//   disk). Reports per round the mean TTFT and how many turns each tier
//   served (KvOutcome::source: slot / prompt_cache / disk / none).
//
// Errors: kInvalidArgument for a missing model_dir, an unknown `only`,
// non-positive sizes or shapes that do not fit the model's context; the
// errors of Engine::Load, KvStore::Open and the calls above; kInternal when a scenario does not
// behave as set up (the message names the case, what was expected and what
// happened); kUnavailable when the temp dir cannot be made.
//
// Thread safety: not thread-safe, and not to be run beside other work in
// the same process: with threads > 0 it sets the process-wide OpenBLAS
// thread count. Run one bench at a time on a quiet machine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "arbiter/base/status.h"
#include "arbiter/engine/kv_snapshot.h"  // KV types
#include "bench/bench_stats.h"

namespace arbiter {

struct KvBenchOptions {
  std::string model_dir;  // REQUIRED
  int prefix_tokens = 2000;
  int turn_tokens = 32;
  int repetitions = 5;
  // OpenBLAS (prefill) and engine (decode) threads; 0 = OpenBLAS's default,
  // which the engine follows.
  int threads = 0;
  int n_slots = 2;
  GgmlType kv_type = kDefaultKvType;  // EngineOptions::kv_type
  // The compute device (EngineOptions::device): "cpu", "vulkan" or
  // "vulkan:N". Every scenario runs on it; snapshots, the prompt cache and
  // KV files stay in host memory and the host layout whatever the device.
  std::string device = "cpu";
  // Shared prefix.
  std::vector<int> shared_prefix_tokens = {512, 1024, 2048};
  int shared_requests = 20;  // per prefix length
  int shared_suffix_min = 32;
  int shared_suffix_max = 128;
  int shared_output_min = 8;
  int shared_output_max = 16;
  // Multi-round QA.
  int qa_users = 6;
  int qa_rounds = 4;
  int qa_context_tokens = 512;
  int qa_answer_tokens = 8;
  // One scenario only ("ttft" | "save_restore" | "shared_prefix" | "qa", e.g.
  // for a profiler); "" = all. The others' results stay empty.
  std::string only;
  // Where the KvStore directory is made; "" = $TMPDIR or /tmp. A fresh
  // subdirectory is created and removed afterwards.
  std::string work_dir;
};

// One case of the TTFT scenario.
struct KvTtftCase {
  std::string name;          // "ideal" | "cold" | "prewarm" | "prompt_cache" | "disk"
  std::string source;        // KvSourceName of the outcome ("" for ideal: no precache)
  SampleSummary ttft_ms;     // wall of the Generate call
  SampleSummary prefill_ms;  // the engine's timings.prefill_ms
  // ttft − prefill_ms of each repetition: what the case adds around the
  // compute (slot wait, stash, restore, the sample), free of the prefill's
  // own run-to-run spread.
  SampleSummary overhead_ms;
  double ratio_best = 0;  // ttft best / ideal ttft best
  double ratio_p50 = 0;   // ttft p50 / ideal ttft p50
  // Of every repetition (checked equal).
  int prompt_tokens = 0;
  int cached_tokens = 0;
  int computed_tokens = 0;  // timings.prefill_tokens
  int restored_tokens = 0;  // KvOutcome::restored_tokens
  bool stashed = false;     // another conversation's KV left the slot first
  // prewarm only: the Prewarm call itself (not part of the TTFT).
  SampleSummary prewarm_ms;
  int prewarm_computed_tokens = 0;
};

struct KvSaveRestoreResult {
  int n_tokens = 0;
  uint64_t snapshot_bytes = 0;  // KvSnapshot::MemoryBytes (tokens + K/V)
  uint64_t file_bytes = 0;      // KvFileBytes = what KvStore::Save wrote
  SampleSummary save_slot_ms;
  SampleSummary write_file_ms;    // KvStore::Save of a new conversation, fsync included
  SampleSummary save_total_ms;    // save_slot + write_file, per repetition
  SampleSummary rewrite_file_ms;  // KvStore::Save over the conversation's previous file
  SampleSummary resave_total_ms;  // save_slot + rewrite_file, per repetition
  // Slot → file with no snapshot (Engine::VisitSlot + KvStore::Save of the
  // rows in place; what KvPrecache does when it persists a slot), new file.
  SampleSummary save_direct_ms;
  SampleSummary read_file_ms;  // ReadKvFile, page cache warm
  SampleSummary restore_slot_ms;
  SampleSummary file_to_slot_ms;       // KvStore::LoadMapped + RestoreSlot(view) + unmap
  SampleSummary file_to_slot_copy_ms;  // context: KvStore::Load + RestoreSlot + free
  // Context, same byte count as the file.
  SampleSummary write_nofsync_ms;  // write() + close, no fsync
  SampleSummary fsync_ms;          // fsync of that file afterwards
  // MeasureMemcpyBandwidth(snapshot_bytes, 1) per repetition, GB/s (here
  // `min` is the slowest sample and `max` the fastest).
  SampleSummary memcpy_gb_s;
  // GB/s from the p50s.
  double save_slot_gb_s = 0;
  double write_file_gb_s = 0;
  double read_file_gb_s = 0;
  double restore_slot_gb_s = 0;
  double file_to_slot_gb_s = 0;
  double restore_slot_vs_memcpy = 0;  // restore_slot_gb_s / memcpy p50
  double file_to_slot_vs_memcpy = 0;  // file_to_slot_gb_s / memcpy p50
  // The reference and the targets (see the file comment).
  double ref_bytes = 16e6;
  double ref_save_ms = 7.4;
  double ref_load_ms = 3.8;
  double ref_save_gb_s = 0;  // ref_bytes / ref_save_ms
  double ref_load_gb_s = 0;
  double target_file_to_slot_gb_s = 4.0;
  double target_save_total_ms = 0;  // 2 × ref_save_ms × file_bytes / ref_bytes
  bool file_to_slot_target_met = false;
  bool save_target_met = false;         // save_total p50 ≤ target_save_total_ms
  bool save_direct_target_met = false;  // save_direct p50 ≤ target_save_total_ms
  bool resave_target_met = false;       // resave_total p50 ≤ target_save_total_ms
};

struct KvSharedPrefixCase {
  int prefix_tokens = 0;
  int requests = 0;
  SampleSummary ttft_ms;         // every request
  double first_ttft_ms = 0;      // the first request (nothing cached yet)
  uint64_t prompt_tokens = 0;    // Σ
  uint64_t cached_tokens = 0;    // Σ
  uint64_t computed_tokens = 0;  // Σ timings.prefill_tokens
  uint64_t copied_tokens = 0;    // Σ, of cached: copied from the other slot
  double hit_fraction = 0;       // cached / prompt
};

struct KvQaRound {
  int round = 0;
  int turns = 0;
  double ttft_mean_ms = 0;
  double prompt_tokens_mean = 0;
  uint64_t computed_tokens = 0;  // Σ
  uint64_t cached_tokens = 0;    // Σ
  int from_slot = 0;
  int from_prompt_cache = 0;
  int from_disk = 0;
  int from_none = 0;
};

struct KvQaCase {
  std::string name;  // "host_holds_all" | "host_holds_2"
  uint64_t prompt_cache_bytes = 0;
  std::vector<KvQaRound> rounds;
  KvQaRound total;       // round = -1; every turn
  uint64_t spilled = 0;  // PromptCache entries pushed to disk
  uint64_t stashes = 0;  // slot → host moves (KvPrecacheCounters)
};

struct KvBenchResult {
  std::string model_dir;
  std::string model_hash;
  int n_slots = 0;
  int n_ctx = 0;
  int threads = 0;  // effective OpenBLAS thread count
  int prefix_tokens = 0;
  int turn_tokens = 0;
  int repetitions = 0;
  int n_layers = 0;
  int kv_dim = 0;
  double kv_bytes_per_token = 0;  // n_layers · 2 · KvRowBytes(kv_type, kv_dim)
  std::string kv_type;            // KvTypeName
  std::string device;             // KvBenchOptions::device
  double loadavg_start = 0;
  double loadavg_end = 0;
  double seconds = 0;            // the whole run
  std::vector<KvTtftCase> ttft;  // ideal, cold, prewarm, prompt_cache, disk
  KvSaveRestoreResult save_restore;
  std::vector<KvSharedPrefixCase> shared_prefix;
  std::vector<KvQaCase> qa;
  std::string kv_dir;  // the KvStore directory used (removed afterwards)
};

Result<KvBenchResult> RunKvBench(const KvBenchOptions& options);

// A human-readable report: one table per scenario with its ideal / limits
// and ratios.
std::string FormatKvBench(const KvBenchResult& result);

// The result as one JSON object (`arbiter bench kv --json`), with a trailing
// newline. A SampleSummary is {samples, best, p50, p99, max, mean} ("best"
// = min: the key scripts and docs/BENCHMARKS.md read).
std::string FormatKvBenchJson(const KvBenchResult& result);

}  // namespace arbiter
