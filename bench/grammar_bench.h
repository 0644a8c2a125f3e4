// bench/grammar_bench.h — the cost of constrained decoding's token mask
// against the engine's decode step (`arbiter bench grammar`,
// docs/BENCHMARKS.md "Constrained decoding").
//
// Method (one call):
//   1. load the model (1 slot) and build its GrammarVocabulary (timed; from
//      `tokenizer_path` instead when set);
//   2. compile a JSON schema (an object with a string, an integer and an
//      array of strings) to a Grammar (timed);
//   3. GrammarConstraint::FillAllowed, `iterations` times each on one
//      constraint (after the first call the state's mask is cached: Note
//      [Mask cache] in src/engine/grammar.cc — the cost of every step of a
//      model rambling inside a string), in three states: the start (before
//      "{"), an object boundary (after `{"city": "Paris", `: the next key)
//      and inside a string (after `{"city": "Pa`), with a large budget (the
//      length check does not bind) and with a budget of 30 tokens; and
//      inside a string on a fresh constraint each time (nothing cached: the
//      full trie walk of a first step in a new state);
//   4. the decode step: greedy, ignore_eos, gen_tokens steps after a
//      16-token prompt, best of `repetitions` (engine timings);
//   5. the same generation under the constraint (temperature 1, fixed
//      seed), its decode time per step (the mask included);
//   6. ratio = median mask time inside a string / decode step.
// The target: mask ≤ 10 % of a decode step on demo-chat.
//
// Errors: those of Engine::Load; kInvalidArgument for non-positive options.
// Thread safety: not thread-safe (sets the process-wide BLAS thread count).
#pragma once

#include <string>

#include "arbiter/base/status.h"
#include "bench/bench_stats.h"

namespace arbiter {

struct GrammarBenchOptions {
  std::string model_dir;
  int threads = 0;      // 0: all hardware threads
  int iterations = 200;  // FillAllowed calls per state
  int gen_tokens = 32;
  int repetitions = 3;
  // Optional: time the mask over this tokenizer.json's vocabulary instead of
  // the model's (e.g. a 150 k-token one); the decode step is still the model's.
  std::string tokenizer_path;
};

struct GrammarBenchResult {
  std::string model_dir;
  std::string tokenizer_path;  // empty: the model's vocabulary
  int n_threads = 0;
  int vocab_size = 0;
  double vocab_build_ms = 0;
  double grammar_compile_ms = 0;
  SampleSummary mask_start_us;     // FillAllowed at the start
  SampleSummary mask_boundary_us;  // at an object boundary
  SampleSummary mask_string_us;    // inside a string
  SampleSummary mask_string_budget_us;  // inside a string, 30 tokens left
  SampleSummary mask_string_cold_us;    // inside a string, fresh constraint (nothing cached)
  int allowed_start = 0;  // tokens allowed in each state
  int allowed_boundary = 0;
  int allowed_string = 0;
  double decode_step_ms = 0;              // unconstrained, best repetition
  double constrained_decode_step_ms = 0;  // under the constraint, best repetition
  int constrained_tokens = 0;             // tokens generated under it
  double ratio_string = 0;    // mask_string_us.p50 / decode step
  double ratio_boundary = 0;  // mask_boundary_us.p50 / decode step
  double ratio_cold = 0;      // mask_string_cold_us.p50 / decode step
  double load_average_start = 0;
  double load_average_end = 0;
};

Result<GrammarBenchResult> RunGrammarBench(const GrammarBenchOptions& options);
std::string FormatGrammarBench(const GrammarBenchResult& r);
std::string FormatGrammarBenchJson(const GrammarBenchResult& r);

}  // namespace arbiter
