// memory/internal/pressure_poller.h — what every polling MemoryPressureSource
// shares (meminfo, PSI, cgroup, and any later one such as a device's
// heap-budget source): the poll thread, the interval floor, the watermark
// fallbacks, and the "fire on the first event and on every level change"
// state.
//
// Note [Polling pressure sources]
// A polling source is a Sample() (read something, classify it into a level;
// outside every lock) plus these pieces:
//   - PressurePoller runs the poll thread. It wakes every interval (real
//     time: poll()'s timeout), when a watched fd is ready (PSI triggers,
//     cgroup memory.events), and at once on Stop(): Stop() writes an eventfd
//     that the thread polls with the rest, so shutdown never waits out an
//     interval. After every wake but the stopping one it calls the source's
//     OnWake on the poll thread, which usually calls the source's Tick().
//   - PressureLevelLatch is the fired-level state. The source offers each
//     event to it under the source's own lock; it records the event in the
//     source's PressureListeners (Note [Pressure event ordering]) when it is
//     the first event or its level differs from the last fired one, and the
//     source delivers the result after releasing its lock.
//   - ClampPollIntervalMs and NormalizeWatermarks are the option fallbacks of
//     the sources that sample a free fraction (docs/memory.md "Pressure
//     levels and sources").
// So a new sampling source is: Options + Create (the two fallbacks), a
// Sample(), a Tick() of five lines (sample; Offer under the lock; warn and
// deliver after it), Start() = Tick() then poller.Start(), Stop() =
// poller.Stop(). Tests call Tick() directly, so no test waits on the thread.
//
// Thread safety: PressurePoller is thread-safe. PressureLevelLatch is
// thread-compatible: keep it GUARDED_BY the source's mutex.
#pragma once

#include <poll.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "arbiter/base/mutex.h"
#include "arbiter/base/status.h"
#include "arbiter/memory/memory_pressure.h"
#include "memory/internal/pressure_listeners.h"

namespace arbiter::internal {

// `interval_ms` raised to kMinPressurePollIntervalMs (a floor, not an error).
int64_t ClampPollIntervalMs(int64_t interval_ms);

// The watermark fallbacks of a free-fraction source: a fraction outside
// (0, 1) becomes its default (kDefaultLowWaterFraction,
// kDefaultCriticalWaterFraction). Errors: kInvalidArgument "pressure.
// critical_fraction (c) must be < pressure.low_fraction (l)" when, after the
// fallbacks, critical ≥ low (c and l as %g).
Status NormalizeWatermarks(double* low_fraction, double* critical_fraction);

// The fired-level state of one source (see the Note above).
class PressureLevelLatch {
 public:
  // Records `event` in `listeners` when it is the first event offered or its
  // level differs from the last recorded one; returns the delivery to make
  // (PressureListeners::Deliver) after the caller's lock is released, or
  // nullopt when nothing fired. Call it under the source's lock.
  std::optional<PressureListeners::Pending> Offer(const MemoryPressureEvent& event,
                                                  PressureListeners& listeners);

  // Whether an event has been recorded yet.
  bool fired() const { return fired_; }
  // The level of the last recorded event (nominal before the first).
  MemoryPressureLevel level() const { return level_; }

 private:
  bool fired_ = false;
  MemoryPressureLevel level_ = MemoryPressureLevel::kNominal;
};

// The poll thread of one source (see the Note above).
class PressurePoller {
 public:
  // Called on the poll thread after each wake except Stop()'s, with the
  // watched fds and their revents (all 0 when the interval passed). It may
  // set a watch's fd to -1 to stop polling it (poll() skips negative fds).
  using OnWake = std::function<void(std::span<pollfd> watches)>;

  // `source_id` names the source in warnings; `warn` as the sources' (empty
  // = stderr).
  PressurePoller(std::string source_id, PressureWarningSink warn);
  ~PressurePoller();  // Stop()s
  PressurePoller(const PressurePoller&) = delete;
  PressurePoller& operator=(const PressurePoller&) = delete;

  // Starts the thread: every `interval_ms` (real milliseconds), or when one
  // of `watches` (fd and events; a negative fd is skipped) is ready, it calls
  // `on_wake`. The caller owns the fds and keeps them open until Stop()
  // returns. A poll() error other than EINTR writes a warning and ends the
  // thread. Idempotent while running (the arguments are then ignored).
  // REQUIRES: interval_ms > 0; on_wake is callable.
  // Errors: kInternal when the wake-up eventfd cannot be created.
  Status Start(int64_t interval_ms, std::vector<pollfd> watches, OnWake on_wake)
      EXCLUDES(mu_);
  // Wakes the thread at once and joins it. Idempotent; never fails. A
  // stopped poller may be started again. REQUIRES: not called from on_wake.
  void Stop() EXCLUDES(mu_);
  bool running() const EXCLUDES(mu_);

 private:
  void Loop(int64_t interval_ms, std::vector<pollfd> fds, const OnWake& on_wake) const;

  const std::string source_id_;
  const PressureWarningSink warn_;
  mutable Mutex mu_;  // serializes Start/Stop
  int wake_fd_ GUARDED_BY(mu_) = -1;  // eventfd; Stop() writes it
  std::thread thread_ GUARDED_BY(mu_);
};

}  // namespace arbiter::internal
