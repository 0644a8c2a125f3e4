// arbiter/memory/meminfo_pressure_source.h — the reference "OS poller"
// (docs/memory.md "Pressure levels and sources", meminfo): free-RAM
// watermarks sampled from /proc/meminfo.
//
// Every `interval_ms` the poll thread samples MemAvailable / MemTotal and
// classifies it with ClassifyFreeFraction (≤ critical → critical, ≤ low →
// low, else nominal). Listeners fire on a level change only; the first tick
// after construction always fires. A bad reading (file missing, fields
// malformed, MemTotal 0) counts as nominal and writes a warning naming the
// file and the error. Subscribe() replays the last fired event. Current()
// takes a fresh sample and notifies nobody. Start() takes the first sample
// synchronously, so a subscriber after a successful Start() always gets a
// replay.
//
// Config (`[pressure]`; names match the reference's lowWaterFraction /
// criticalWaterFraction):
//   interval_ms          default 5000 (kDefaultPressurePollIntervalMs); values
//                        below 500 (kMinPressurePollIntervalMs) are raised to it.
//   low_fraction         default 0.15; outside (0, 1) → the default.
//   critical_fraction    default 0.05; outside (0, 1) → the default.
// After the fallbacks, critical_fraction ≥ low_fraction is kInvalidArgument
// with the message "pressure.critical_fraction (c) must be <
// pressure.low_fraction (l)" (the reference's "criticalWaterFraction (c)
// must be < lowWaterFraction (l)"), c and l printed as given.
//
// Timing: the poll interval is real time and Stop() interrupts it at once
// (Note [Polling pressure sources] in src/memory/internal/pressure_poller.h);
// the injected Clock only stamps events. Tests call Tick() directly instead
// of running the thread.
//
// Thread safety: thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "arbiter/base/clock.h"
#include "arbiter/base/mutex.h"
#include "arbiter/memory/memory_pressure.h"

namespace arbiter {

namespace internal {
class PressureListeners;
class PressureLevelLatch;
class PressurePoller;
}  // namespace internal

class MeminfoPressureSource final : public MemoryPressureSource {
 public:
  struct Options {
    std::string id = "meminfo";
    std::string meminfo_path = "/proc/meminfo";  // injectable for tests
    int64_t interval_ms = kDefaultPressurePollIntervalMs;
    double low_fraction = kDefaultLowWaterFraction;
    double critical_fraction = kDefaultCriticalWaterFraction;
    Clock* clock = nullptr;  // stamps events; nullptr = Clock::Real(); must outlive
    PressureWarningSink warn;
  };

  // Applies the fallbacks above. Errors: kInvalidArgument (critical ≥ low).
  static Result<std::unique_ptr<MeminfoPressureSource>> Create(Options options);
  ~MeminfoPressureSource() override;  // Stop()s

  const std::string& id() const override { return options_.id; }
  MemoryPressureSubscription Subscribe(MemoryPressureListener listener) override;
  // Samples once (firing as a tick would) and starts the poll thread. A bad
  // reading is nominal plus a warning, not an error. Errors: kInternal when
  // the poll thread's wake-up eventfd cannot be created.
  Status Start() override;
  void Stop() override;
  MemoryPressureEvent Current() override;

  // One poll: samples, and fans out if the level changed (or on the first
  // tick). Returns the sample. Called by the poll thread; tests call it
  // directly without Start().
  MemoryPressureEvent Tick();

  // The effective settings after fallbacks.
  int64_t interval_ms() const { return options_.interval_ms; }
  double low_fraction() const { return options_.low_fraction; }
  double critical_fraction() const { return options_.critical_fraction; }

 private:
  explicit MeminfoPressureSource(Options options);
  // Reads and classifies; `warning` gets the text of a bad reading.
  MemoryPressureEvent Sample(std::string* warning) const;

  const Options options_;
  Clock* const clock_;
  std::shared_ptr<internal::PressureListeners> listeners_;

  Mutex mu_;
  std::unique_ptr<internal::PressureLevelLatch> latch_ GUARDED_BY(mu_);
  Mutex lifecycle_mu_;  // serializes Start/Stop
  std::unique_ptr<internal::PressurePoller> poller_;  // thread-safe
};

}  // namespace arbiter
