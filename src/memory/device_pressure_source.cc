// DevicePressureSource — a device heap's pressure from the driver's budget
// report (arbiter/memory/device_pressure_source.h).
//
// A polling source (Note [Polling pressure sources] in
// internal/pressure_poller.h): Tick() samples outside the lock, offers the
// event to the level latch under mu_, and warns and delivers after it.
#include "arbiter/memory/device_pressure_source.h"

#include <utility>

#include <fmt/format.h>

#include "memory/internal/pressure_listeners.h"
#include "memory/internal/pressure_poller.h"

namespace arbiter {

Result<std::unique_ptr<DevicePressureSource>> DevicePressureSource::Create(Options options) {
  if (options.domain.empty() || options.domain == "host") {
    return InvalidArgumentError(fmt::format(
        "a device pressure source needs a device's memory domain (got \"{}\")", options.domain));
  }
  if (!options.query) {
    return InvalidArgumentError(fmt::format(
        "the device pressure source of \"{}\" has no memory query", options.domain));
  }
  if (options.id.empty()) options.id = "device:" + options.domain;
  options.interval_ms = internal::ClampPollIntervalMs(options.interval_ms);
  ARBITER_RETURN_IF_ERROR(
      internal::NormalizeWatermarks(&options.low_fraction, &options.critical_fraction));
  return std::unique_ptr<DevicePressureSource>(new DevicePressureSource(std::move(options)));
}

DevicePressureSource::Query DevicePressureSource::QueryOf(const DeviceBackend* device) {
  return [device]() -> std::optional<DeviceMemoryReport> { return device->QueryMemory(); };
}

DevicePressureSource::DevicePressureSource(Options options)
    : options_(std::move(options)),
      clock_(options_.clock ? options_.clock : Clock::Real()),
      listeners_(std::make_shared<internal::PressureListeners>(options_.warn)),
      latch_(std::make_unique<internal::PressureLevelLatch>()),
      poller_(std::make_unique<internal::PressurePoller>(options_.id, options_.warn)) {}

DevicePressureSource::~DevicePressureSource() { Stop(); }

MemoryPressureSubscription DevicePressureSource::Subscribe(MemoryPressureListener listener) {
  return listeners_->Subscribe(std::move(listener));
}

MemoryPressureEvent DevicePressureSource::Sample(std::string* warning, bool* reported) const {
  MemoryPressureEvent e;
  e.source = options_.id;
  e.domain = options_.domain;
  const std::optional<DeviceMemoryReport> report = options_.query();
  e.at_ms = clock_->NowMs();
  *reported = report.has_value();
  if (!report) {
    *warning = fmt::format("memory pressure source {}: the driver reports no heap budget for {}; "
                           "treating as nominal",
                           options_.id, options_.domain);
    return e;
  }
  if (report->budget_bytes == 0) {
    *warning = fmt::format("memory pressure source {}: the driver reports a heap budget of 0 "
                           "for {}; treating as nominal",
                           options_.id, options_.domain);
    return e;
  }
  const uint64_t left =
      report->usage_bytes < report->budget_bytes ? report->budget_bytes - report->usage_bytes : 0;
  e.free_bytes = left;
  e.total_bytes = report->budget_bytes;
  e.free_fraction = static_cast<double>(left) / static_cast<double>(report->budget_bytes);
  e.level = ClassifyFreeFraction(*e.free_fraction, options_.low_fraction,
                                 options_.critical_fraction);
  return e;
}

MemoryPressureEvent DevicePressureSource::Offer(MemoryPressureEvent e,
                                                const std::string& warning) {
  std::optional<internal::PressureListeners::Pending> pending;
  {
    MutexLock l(&mu_);
    pending = latch_->Offer(e, *listeners_);
  }
  if (!warning.empty()) internal::EmitPressureWarning(options_.warn, warning);
  if (pending) listeners_->Deliver(*pending);
  return e;
}

MemoryPressureEvent DevicePressureSource::Tick() {
  std::string warning;
  bool reported = false;
  MemoryPressureEvent e = Sample(&warning, &reported);
  return Offer(std::move(e), warning);
}

MemoryPressureEvent DevicePressureSource::Current() {
  std::string warning;
  bool reported = false;
  MemoryPressureEvent e = Sample(&warning, &reported);
  if (!warning.empty()) internal::EmitPressureWarning(options_.warn, warning);
  return e;
}

Status DevicePressureSource::Start() {
  MutexLock lifecycle(&lifecycle_mu_);
  if (poller_->running()) return OkStatus();
  std::string warning;
  bool reported = false;
  MemoryPressureEvent first = Sample(&warning, &reported);
  if (!reported) {
    return UnavailableError(fmt::format(
        "memory pressure source {}: the driver reports no heap budget for {} (no "
        "VK_EXT_memory_budget); device pressure is not polled",
        options_.id, options_.domain));
  }
  Offer(std::move(first), warning);
  return poller_->Start(options_.interval_ms, {}, [this](std::span<pollfd>) { Tick(); });
}

void DevicePressureSource::Stop() {
  MutexLock lifecycle(&lifecycle_mu_);
  poller_->Stop();
}

}  // namespace arbiter
