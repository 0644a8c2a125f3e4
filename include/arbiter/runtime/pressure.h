// arbiter/runtime/pressure.h — builds the MemoryPressureSource of `arbiter
// serve` from the `[pressure]` config section (docs/config.md "[pressure]").
//
// The result is always a CompositePressureSource over
//   1. the OS source chosen by `[pressure] source` (none for "none"), and
//   2. a BridgePressureSource fed by `POST /admin/pressure`,
// so the arbiter reacts to the worse of the two.
//
// "auto" probes, in order: cgroup (the process is in a cgroup v2 with a
// memory limit), PSI (/proc/pressure/memory accepts triggers), meminfo
// (always works). A probe Start()s the source; kUnavailable (and kDataLoss,
// an unreadable file) from a probe means "not here" and the next is tried.
// An explicitly named source that is unavailable is a startup error.
//
// Thread safety: MakeServePressure is a pure function of its inputs (it
// reads /proc and /sys); the returned sources are thread-safe.
#pragma once

#include <memory>
#include <string>

#include "arbiter/base/status.h"
#include "arbiter/memory/memory_pressure.h"
#include "arbiter/runtime/config.h"

namespace arbiter {

struct ServePressure {
  // Owns the OS source (if any) and the bridge. Not started: pass it to
  // MemoryArbiterOptions::pressure_source and call MemoryArbiter::Start().
  std::unique_ptr<CompositePressureSource> composite;
  // The bridge inside `composite` (for POST /admin/pressure); never null.
  BridgePressureSource* bridge = nullptr;
  // "cgroup" | "psi" | "meminfo" | "none": the OS source in use.
  std::string os_source;
  // Why probes were skipped ("psi: ...; cgroup: ..."), for the log.
  std::string probe_notes;
};

// Errors: kInvalidArgument for thresholds the source rejects (naming the
// [pressure] key); kUnavailable when an explicitly chosen source does not
// work here, naming `[pressure].source` and the cause.
Result<ServePressure> MakeServePressure(const PressureSettings& settings);

}  // namespace arbiter
