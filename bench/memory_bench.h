// bench/memory_bench.h — the ledger against the kernel (`arbiter bench
// memory`, docs/BENCHMARKS.md "Memory truth"; docs/memory.md "The ledger is
// the truth").
//
// One real Runtime in this process (demo-chat and demo-embed, generated
// into a temp dir unless given; shared host floors on; the state dir a temp
// dir, removed afterwards) walks these states, and after each the ledger
// (charged bytes by kind, runtime_bytes) is compared with the process's
// RssAnon + RssShmem (/proc/self/status):
//   idle            nothing loaded
//   chat            demo-chat loaded (one 4-token chat)
//   chat+embed      + demo-embed loaded (one embedding)
//   conversations   + `conversations` conversations of ~`prompt_tokens`
//                   tokens each on demo-chat's one slot: every new one
//                   parks the previous in the host prompt cache
//   pinned_floor    + demo-chat's weights pinned_system: a host floor in
//                   /dev/shm (RssShmem)
//   shared_floor    + a second process (`arbiter serve` from
//                   `arbiter_binary`, its own temp state dir and a free
//                   loopback port) serving demo-chat pinned_system, so it
//                   attaches the same floor; the state is measured once
//                   that process has the floor resident
//   unloaded        the second process stopped, demo-chat unpinned, both
//                   models unloaded (prompt-cache entries stay charged)
// The target per state: |resident − (charged + runtime)| ≤ max(5 % of
// charged + runtime, 16 MiB).
//
// Errors: a model that cannot be made or loaded, a request that fails, a
// second process that does not attach the floor within 120 s (kInternal or
// the runtime's error, with the state's name).
// Thread safety: run one at a time (it measures the whole process).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "arbiter/base/status.h"
#include "arbiter/memory/memory_ledger.h"

namespace arbiter {

struct MemoryBenchOptions {
  std::string chat_dir;   // "" = the demo-chat preset, generated
  std::string embed_dir;  // "" = the demo-embed preset, generated
  std::string arbiter_binary = "/proc/self/exe";  // the second process
  int conversations = 8;
  int prompt_tokens = 400;  // about, per conversation
};

struct MemoryBenchState {
  std::string name;
  ChargeKindBytes by_kind{};
  uint64_t charged_bytes = 0;
  uint64_t runtime_bytes = 0;
  uint64_t anon_bytes = 0;   // RssAnon
  uint64_t shmem_bytes = 0;  // RssShmem
  uint64_t resident_bytes() const { return anon_bytes + shmem_bytes; }
  uint64_t ledger_bytes() const { return charged_bytes + runtime_bytes; }
  int64_t unaccounted_bytes() const {
    return static_cast<int64_t>(resident_bytes()) - static_cast<int64_t>(ledger_bytes());
  }
  // resident / (charged + runtime).
  double ratio() const;
  uint64_t tolerance_bytes() const;  // max(5 %, 16 MiB)
  bool within() const;
};

struct MemoryBenchResult {
  std::vector<MemoryBenchState> states;
  uint64_t second_process_shmem_bytes = 0;  // its RssShmem in shared_floor
  bool all_within() const;
};

Result<MemoryBenchResult> RunMemoryBench(const MemoryBenchOptions& options);
std::string FormatMemoryBench(const MemoryBenchResult& result);
std::string FormatMemoryBenchJson(const MemoryBenchResult& result);

}  // namespace arbiter
