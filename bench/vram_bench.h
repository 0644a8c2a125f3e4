// bench/vram_bench.h — `arbiter bench vram`: whether a device model's VRAM
// is what the ledger says, in every state of its life, and how fast its
// weights wake from the host floor (docs/BENCHMARKS.md "VRAM truth").
//
// Method: a Runtime with one model on `device` (residency pinned_system, so
// its host floor stays in RAM when the device copy goes), then `cycles`
// times: load → one chat → 8 conversations (distinct conversation ids, up to
// `parallel` slots) → unload. In each state the device domain's ledger
// (charged + runtime bytes) is set against the driver's heapUsage
// (VK_EXT_memory_budget) minus its value before the runtime started — the
// process's own VRAM; the difference must stay within 2 % or 16 MiB. The
// load of every cycle after the first is a wake from the host floor: its
// seconds (WeightCache's last_load_seconds) and rate, and the time to the
// first token after it.
//
// Errors: the runtime's (a missing device, a broken model); kUnavailable
// when the driver reports no heap usage (lavapipe: no VK_EXT_memory_budget)
// is NOT an error — the driver columns are then absent.
// Thread safety: one bench at a time.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "arbiter/base/status.h"

namespace arbiter {

struct VramState {
  int cycle = 0;
  std::string state;            // "started" | "loaded" | "chat" | "conversations" | "unloaded"
  uint64_t ledger_bytes = 0;    // the device domain's charged bytes
  uint64_t runtime_bytes = 0;   // its runtime (fixed-cost) bytes
  std::optional<uint64_t> driver_bytes;  // heapUsage − the baseline, when reported
  std::optional<int64_t> difference_bytes;  // driver − (ledger + runtime)
  bool within = true;           // |difference| ≤ max(2 %, 16 MiB) (true without a report)
};

struct VramBenchResult {
  std::string model;
  std::string device;       // the domain, "vulkan:N"
  std::string device_name;
  int cycles = 0;
  uint64_t weight_bytes = 0;
  uint64_t baseline_usage_bytes = 0;  // heapUsage before the runtime started (0: no report)
  bool driver_report = false;
  std::vector<VramState> states;
  double first_load_seconds = 0;      // from the file
  double wake_seconds = 0;            // best floor → device load
  double wake_bytes_per_s = 0;
  double wake_first_token_ms = 0;     // a one-token generation right after the best wake
  // How the best wake's bytes reached the device: "import" (GPU copies from
  // the imported floor), "staging" or "mapped" (vulkan::UploadPathName), the
  // path that carried most of them; empty without a wake.
  std::string wake_path;
  std::optional<int64_t> final_difference_bytes;  // after the last unload: driver − baseline − runtime
  bool all_within = true;
};

Result<VramBenchResult> RunVramBench(const std::string& model_path, const std::string& device,
                                     int cycles);

std::string FormatVramBench(const VramBenchResult& r);
std::string FormatVramBenchJson(const VramBenchResult& r);

}  // namespace arbiter
