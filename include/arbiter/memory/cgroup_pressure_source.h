// arbiter/memory/cgroup_pressure_source.h — the cgroup v2 memory limit as a
// MemoryPressureSource (docs/memory.md "Pressure levels and sources",
// cgroup).
//
// The process's cgroup is the "0::/path" line of /proc/self/cgroup; its
// directory is <cgroup_root>/<path>. Each sample reads
//   memory.max      the hard limit ("max" = none → the source is unavailable)
//   memory.current  bytes charged now
//   memory.high     the throttle limit ("max" = none), reported only
//   memory.events   counters low/high/max/oom/oom_kill
// free_bytes = max − current (≥ 0), total_bytes = max, and the level is
// ClassifyFreeFraction(free/max, low_fraction, critical_fraction), raised to
// critical when the `oom`, `oom_kill` or `max` counter grew since the last
// sample and to at least low when `high` grew. Listeners fire on level change
// only (the first tick always fires); Subscribe() replays the last fired
// event; Current() samples without notifying; a bad reading is nominal plus a
// warning. Fractions fall back and are validated exactly as in
// MeminfoPressureSource (same kInvalidArgument message).
//
// The poll thread wakes when memory.events changes (poll() POLLPRI on the
// cgroup file; re-read to re-arm) or every interval_ms, and at once on Stop()
// (Note [Polling pressure sources] in src/memory/internal/pressure_poller.h).
//
// Errors (Start()): kUnavailable when there is no cgroup v2 entry, the
// memory controller files are missing (cgroup v1 / hybrid hosts), or
// memory.max is "max"; kDataLoss when a file does not parse (message names
// the file). Stats are CgroupMemoryStats (ReadCgroupMemory).
//
// Thread safety: thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "arbiter/base/clock.h"
#include "arbiter/base/mutex.h"
#include "arbiter/memory/memory_pressure.h"

namespace arbiter {

namespace internal {
class PressureListeners;
class PressureLevelLatch;
class PressurePoller;
}  // namespace internal

struct CgroupMemoryEvents {
  uint64_t low = 0, high = 0, max = 0, oom = 0, oom_kill = 0;  // counts
};

struct CgroupMemoryStats {
  std::optional<uint64_t> max_bytes;   // memory.max; nullopt = "max"
  uint64_t current_bytes = 0;          // memory.current
  std::optional<uint64_t> high_bytes;  // memory.high; nullopt = "max"
  CgroupMemoryEvents events;           // memory.events
};

// "0::/a/b" line of /proc/self/cgroup text → "/a/b". Errors: kUnavailable
// when there is no cgroup v2 ("0::") line.
Result<std::string> ParseCgroupV2Path(std::string_view proc_self_cgroup);
// memory.events text ("low 0\nhigh 3\n..."). Errors: kDataLoss naming the key
// whose value is not a number. Unknown keys are ignored.
Result<CgroupMemoryEvents> ParseCgroupMemoryEvents(std::string_view text);
// Reads the four files under `dir`. Errors as the class comment.
Result<CgroupMemoryStats> ReadCgroupMemory(const std::string& dir);

class CgroupPressureSource final : public MemoryPressureSource {
 public:
  struct Options {
    std::string id = "cgroup";
    std::string cgroup_root = "/sys/fs/cgroup";         // injectable for tests
    std::string proc_self_cgroup = "/proc/self/cgroup";  // injectable for tests
    // Raised to ≥ kMinPressurePollIntervalMs.
    int64_t interval_ms = kDefaultPressurePollIntervalMs;
    double low_fraction = kDefaultLowWaterFraction;
    double critical_fraction = kDefaultCriticalWaterFraction;
    Clock* clock = nullptr;  // nullptr = Clock::Real(); must outlive
    PressureWarningSink warn;
  };

  // Errors: kInvalidArgument (critical ≥ low after fallbacks).
  static Result<std::unique_ptr<CgroupPressureSource>> Create(Options options);
  ~CgroupPressureSource() override;  // Stop()s

  const std::string& id() const override { return options_.id; }
  MemoryPressureSubscription Subscribe(MemoryPressureListener listener) override;
  // Resolves the cgroup, checks that it has a memory limit, ticks once and
  // starts the poll thread. Errors: see the class comment.
  Status Start() override;
  void Stop() override;
  MemoryPressureEvent Current() override;

  // One poll (fires on level change or first tick). Resolves the cgroup
  // directory if Start() has not. Returns the sample.
  MemoryPressureEvent Tick();

  // The cgroup directory in use ("" before it was resolved).
  std::string cgroup_dir() const;

 private:
  explicit CgroupPressureSource(Options options);
  Result<std::string> ResolveDir();
  // Reads and classifies against `prev` counters (nullopt = no previous).
  MemoryPressureEvent Sample(const std::optional<CgroupMemoryEvents>& prev,
                             CgroupMemoryEvents* counters, std::string* warning);

  const Options options_;
  Clock* const clock_;
  std::shared_ptr<internal::PressureListeners> listeners_;

  mutable Mutex mu_;
  std::string dir_ GUARDED_BY(mu_);
  std::unique_ptr<internal::PressureLevelLatch> latch_ GUARDED_BY(mu_);
  std::optional<CgroupMemoryEvents> counters_ GUARDED_BY(mu_);

  Mutex lifecycle_mu_;  // serializes Start/Stop
  bool running_ GUARDED_BY(lifecycle_mu_) = false;
  int events_fd_ GUARDED_BY(lifecycle_mu_) = -1;
  std::unique_ptr<internal::PressurePoller> poller_;  // thread-safe
};

}  // namespace arbiter
