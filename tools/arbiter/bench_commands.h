// tools/arbiter/bench_commands.h — the `arbiter bench` subcommands: their
// flags, and running the scenario of bench/ (arbiter_bench) each one names.
//
//   arbiter bench decode --model DIR [--threads N] [--prompt-tokens N]
//                        [--gen-tokens N] [--repetitions N] [--json]
//   arbiter bench arbiter [--iterations N] [--json]
//   arbiter bench weights --model DIR [--model2 DIR] [--repetitions N]
//                         [--workers N] [--gen-tokens N] [--threads N] [--json]
//   arbiter bench kv --model DIR [--prefix-tokens N] [--turn-tokens N]
//                    [--repetitions N] [--threads N] [--only SCENARIO] [--json]
//   arbiter bench kernels [--n N] [--stream-mb MB] [--repetitions N] [--json]
//   arbiter bench memory [--chat DIR] [--embed DIR] [--conversations N] [--json]
//   arbiter bench modalities [--chat DIR] [--sentences N] [--json]
//
// Each prints its scenario's text report (Format*Bench) or, with --json, one
// JSON object (Format*BenchJson) on stdout; docs/BENCHMARKS.md describes
// them. Exit status: 0, or 1 with "arbiter: bench <name> failed: …" on
// stderr.
//
// Usage (main.cc):
//   CLI::App app{...};
//   BenchCommands bench(&app);
//   ... app.parse(argc, argv) ...
//   if (bench.parsed()) return bench.Run();
//
// Thread safety: not thread-safe; one per process.
#pragma once

#include <memory>

namespace CLI {
class App;
}  // namespace CLI

namespace arbiter {

class BenchCommands {
 public:
  // Adds `bench` and its subcommands to `app`, which must outlive this.
  explicit BenchCommands(CLI::App* app);
  ~BenchCommands();
  BenchCommands(const BenchCommands&) = delete;
  BenchCommands& operator=(const BenchCommands&) = delete;

  // True when the parsed command line named one of the bench subcommands.
  bool parsed() const;

  // Runs that subcommand; its exit status. REQUIRES: parsed().
  int Run();

 private:
  struct Commands;
  std::unique_ptr<Commands> commands_;
};

}  // namespace arbiter
