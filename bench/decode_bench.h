// bench/decode_bench.h — decode/prefill throughput of the CPU engine
// against the machine's memory-bandwidth roofline (`arbiter bench decode`,
// docs/BENCHMARKS.md "Engine benchmarks").
//
// Method (one call):
//   1. load the model (1 slot, n_ctx = prompt + gen + 8);
//   2. set OpenBLAS to `n_threads` (openblas_set_num_threads: process-wide;
//      prefill's sgemm) and EngineOptions::n_threads (decode's matvec pool);
//   3. warm up: a 16-token prompt, 4 generated tokens (faults pages in, starts
//      the BLAS thread pool);
//   4. `repetitions` times: a fresh pseudo-random prompt of prompt_tokens ids
//      (first id differs per run, so no prefix is reused), greedy, ignore_eos,
//      gen_tokens decode steps; keep the best prefill and the best decode rate;
//   5. memcpy bandwidth: a 256 MiB buffer copied by n_threads threads, best
//      of 5 (MeasureMemcpyBandwidth, bench/memory_bandwidth.h);
//   6. read bandwidth: the same buffer summed by n_threads threads, best of 5
//      (MeasureReadBandwidth);
//   7. roofline tok/s = memcpy bandwidth / weight bytes streamed per decoded
//      token; fraction = decode tok/s / roofline tok/s. The same against the
//      read bandwidth is reported as read_roofline_*.
// Decode is memory-bound (every weight matrix is read once per token, f32).
// memcpy moves each byte twice (read + write), so the memcpy roofline is
// conservative and a fraction above 1 is possible; the read roofline is the
// tighter bound.
//
// Errors: those of Engine::Load; kInvalidArgument for non-positive
// arguments.
// Thread safety: not thread-safe (changes the process-wide BLAS thread
// count); run one bench at a time, with nothing else computing.
#pragma once

#include <cstddef>
#include <string>

#include "arbiter/base/status.h"
#include "arbiter/engine/kv_snapshot.h"  // KV types

namespace arbiter {

struct DecodeBenchResult {
  std::string model_dir;
  std::string blas_core;  // openblas_get_corename(), e.g. "Zen"
  int n_threads = 0;
  int prompt_tokens = 0;
  int gen_tokens = 0;  // decode steps timed per repetition
  int repetitions = 0;
  double load_ms = 0;
  double prefill_ms = 0;              // best repetition
  double prefill_tok_s = 0;           // prompt_tokens / prefill seconds (best)
  double decode_ms = 0;               // best repetition, gen_tokens steps incl. sampling
  double decode_tok_s = 0;            // gen_tokens / decode seconds (best)
  size_t weight_bytes = 0;            // f32 weights held
  size_t weight_bytes_per_token = 0;  // weights streamed per decode step
  double kv_bytes_per_token = 0;      // K/V read per decode step, mean over the run
  std::string kv_type;                // KvTypeName of the KV cache
  std::string device;                 // the compute device (EngineOptions::device)
  double memcpy_bytes_per_s = 0;      // bytes copied per second, n_threads (best of 5)
  double roofline_tok_s = 0;          // memcpy_bytes_per_s / weight_bytes_per_token
  double roofline_fraction = 0;       // decode_tok_s / roofline_tok_s
  double read_bytes_per_s = 0;        // sequential read (sum), n_threads, best of 5
  double read_roofline_tok_s = 0;     // read_bytes_per_s / weight_bytes_per_token
  double read_roofline_fraction = 0;  // decode_tok_s / read_roofline_tok_s
};

// `compute_f32`: convert the weights to f32 at load (`compute_dtype =
// "f32"`) instead of computing them in their stored type. `kv_type`: the
// KV cache's type (EngineOptions::kv_type).
Result<DecodeBenchResult> RunDecodeBench(const std::string& model_dir, int n_threads,
                                         int prompt_tokens = 512, int gen_tokens = 128,
                                         int repetitions = 3, bool compute_f32 = false,
                                         GgmlType kv_type = kDefaultKvType,
                                         const std::string& device = "cpu");

// Multi-line human-readable report. Scripts parse its lines
//   prefill         N tokens: X ms, Y tok/s (best of R)
//   decode          N tokens: X ms, Y tok/s (best of R)
// keep their format.
std::string FormatDecodeBench(const DecodeBenchResult& r);

// The same figures as one JSON object (`arbiter bench decode --json`): every
// DecodeBenchResult field under its own name (e.g. "prefill_tok_s",
// "decode_ms", "roofline_fraction"), with a trailing newline.
std::string FormatDecodeBenchJson(const DecodeBenchResult& r);

}  // namespace arbiter
