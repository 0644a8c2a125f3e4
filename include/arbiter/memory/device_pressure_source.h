// arbiter/memory/device_pressure_source.h — memory pressure of a device's
// heap: what the driver reports as left of its budget (heapBudget −
// heapUsage, VK_EXT_memory_budget on Vulkan), sampled by polling.
//
// Every `interval_ms` the poll thread asks `query` for the device's
// DeviceMemoryReport (DeviceBackend::QueryMemory() in production, an
// injected callable in tests) and classifies the free fraction
// (budget − usage) / budget with ClassifyFreeFraction (≤ critical →
// critical, ≤ low → low, else nominal). Events carry the device's domain
// name in MemoryPressureEvent::domain, so the reclaim policy runs that
// domain's stages (Note [Reclaim order] in src/runtime/reclaim_policy.cc).
// Listeners fire on the first tick and on every level change; Subscribe()
// replays the last fired event; Current() samples and notifies nobody.
//
// Where the driver reports nothing (no VK_EXT_memory_budget; the cpu
// device) Start() fails with kUnavailable, so a caller can fall back to the
// ledger's own budget; a later tick without a report counts as nominal and
// warns. A report with budget 0 is nominal plus a warning; usage above the
// budget is a free fraction of 0 (critical).
//
// Timing and thread safety as the other polling sources (Note [Polling
// pressure sources] in src/memory/internal/pressure_poller.h): the interval
// is real time, Stop() interrupts it at once, the injected Clock only stamps
// events, tests call Tick(). Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "arbiter/base/clock.h"
#include "arbiter/base/mutex.h"
#include "arbiter/memory/device_backend.h"
#include "arbiter/memory/memory_pressure.h"

namespace arbiter {

namespace internal {
class PressureListeners;
class PressureLevelLatch;
class PressurePoller;
}  // namespace internal

class DevicePressureSource final : public MemoryPressureSource {
 public:
  // The driver's report of the device heap now, or nullopt (nothing
  // reported). Called on the poll thread and by Tick()/Current(); must be
  // thread-safe.
  using Query = std::function<std::optional<DeviceMemoryReport>()>;

  struct Options {
    // The device's memory domain ("vulkan:0"): MemoryPressureEvent::domain.
    // REQUIRED (not empty, not "host").
    std::string domain;
    std::string id;  // empty → "device:<domain>"
    Query query;     // REQUIRED
    int64_t interval_ms = kDefaultPressurePollIntervalMs;  // floor: kMinPressurePollIntervalMs
    // Fractions of the budget left; outside (0, 1) → the defaults
    // (kDefaultLowWaterFraction, kDefaultCriticalWaterFraction).
    double low_fraction = kDefaultLowWaterFraction;
    double critical_fraction = kDefaultCriticalWaterFraction;
    Clock* clock = nullptr;  // stamps events; nullptr = Clock::Real(); must outlive
    PressureWarningSink warn;
  };

  // Applies the fallbacks. Errors: kInvalidArgument for an empty or "host"
  // domain, a missing query, or critical ≥ low (the message of
  // NormalizeWatermarks).
  static Result<std::unique_ptr<DevicePressureSource>> Create(Options options);
  // A query over `device` (QueryMemory()); the device must outlive the source.
  static Query QueryOf(const DeviceBackend* device);
  ~DevicePressureSource() override;  // Stop()s

  const std::string& id() const override { return options_.id; }
  const std::string& domain() const { return options_.domain; }
  MemoryPressureSubscription Subscribe(MemoryPressureListener listener) override;
  // Samples once (firing as a tick would) and starts the poll thread.
  // Errors: kUnavailable (nothing started) when the driver reports nothing;
  // kInternal when the poll thread's eventfd cannot be created.
  Status Start() override;
  void Stop() override;
  MemoryPressureEvent Current() override;

  // One poll: samples, and fans out on the first tick or a level change.
  // Returns the sample. Tests call it directly without Start().
  MemoryPressureEvent Tick();

  double low_fraction() const { return options_.low_fraction; }
  double critical_fraction() const { return options_.critical_fraction; }
  int64_t interval_ms() const { return options_.interval_ms; }

 private:
  explicit DevicePressureSource(Options options);
  // Queries and classifies; `warning` gets the text of a bad reading;
  // `reported` whether the driver reported anything.
  MemoryPressureEvent Sample(std::string* warning, bool* reported) const;
  MemoryPressureEvent Offer(MemoryPressureEvent e, const std::string& warning);

  const Options options_;
  Clock* const clock_;
  std::shared_ptr<internal::PressureListeners> listeners_;

  Mutex mu_;
  std::unique_ptr<internal::PressureLevelLatch> latch_ GUARDED_BY(mu_);
  Mutex lifecycle_mu_;  // serializes Start/Stop
  std::unique_ptr<internal::PressurePoller> poller_;  // thread-safe
};

}  // namespace arbiter
