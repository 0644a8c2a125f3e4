// MeminfoPressureSource — the reference OS poller (docs/memory.md "Pressure
// levels and sources", meminfo).
//
// A polling source (Note [Polling pressure sources] in
// internal/pressure_poller.h): Tick() samples outside the lock, offers the
// event to the level latch under mu_ (so a tick from the poll thread and one
// from a test or a Start() cannot fire out of order, Note [Pressure event
// ordering]), and warns and delivers after it.
#include "arbiter/memory/meminfo_pressure_source.h"

#include "arbiter/memory/system_memory.h"
#include "memory/internal/pressure_listeners.h"
#include "memory/internal/pressure_poller.h"

namespace arbiter {

Result<std::unique_ptr<MeminfoPressureSource>> MeminfoPressureSource::Create(Options options) {
  options.interval_ms = internal::ClampPollIntervalMs(options.interval_ms);
  ARBITER_RETURN_IF_ERROR(
      internal::NormalizeWatermarks(&options.low_fraction, &options.critical_fraction));
  return std::unique_ptr<MeminfoPressureSource>(new MeminfoPressureSource(std::move(options)));
}

MeminfoPressureSource::MeminfoPressureSource(Options options)
    : options_(std::move(options)),
      clock_(options_.clock ? options_.clock : Clock::Real()),
      listeners_(std::make_shared<internal::PressureListeners>(options_.warn)),
      latch_(std::make_unique<internal::PressureLevelLatch>()),
      poller_(std::make_unique<internal::PressurePoller>(options_.id, options_.warn)) {}

MeminfoPressureSource::~MeminfoPressureSource() { Stop(); }

MemoryPressureSubscription MeminfoPressureSource::Subscribe(MemoryPressureListener listener) {
  return listeners_->Subscribe(std::move(listener));
}

MemoryPressureEvent MeminfoPressureSource::Sample(std::string* warning) const {
  MemoryPressureEvent e;
  e.source = options_.id;
  auto info = ReadSystemMemory(options_.meminfo_path);
  e.at_ms = clock_->NowMs();
  if (!info.ok()) {
    *warning = "memory pressure source " + options_.id + ": bad reading of " +
               options_.meminfo_path + " (" + info.status().ToString() + "); treating as nominal";
    return e;
  }
  if (info->total_bytes == 0) {
    *warning = "memory pressure source " + options_.id + ": " + options_.meminfo_path +
               " reports MemTotal 0; treating as nominal";
    return e;
  }
  e.free_bytes = info->available_bytes;
  e.total_bytes = info->total_bytes;
  e.free_fraction = static_cast<double>(info->available_bytes) /
                    static_cast<double>(info->total_bytes);
  e.level = ClassifyFreeFraction(*e.free_fraction, options_.low_fraction,
                                 options_.critical_fraction);
  return e;
}

MemoryPressureEvent MeminfoPressureSource::Tick() {
  std::string warning;
  MemoryPressureEvent e = Sample(&warning);
  std::optional<internal::PressureListeners::Pending> pending;
  {
    MutexLock l(&mu_);
    pending = latch_->Offer(e, *listeners_);
  }
  if (!warning.empty()) internal::EmitPressureWarning(options_.warn, warning);
  if (pending) listeners_->Deliver(*pending);
  return e;
}

MemoryPressureEvent MeminfoPressureSource::Current() {
  std::string warning;
  MemoryPressureEvent e = Sample(&warning);
  if (!warning.empty()) internal::EmitPressureWarning(options_.warn, warning);
  return e;
}

Status MeminfoPressureSource::Start() {
  MutexLock lifecycle(&lifecycle_mu_);
  if (poller_->running()) return OkStatus();
  Tick();
  return poller_->Start(options_.interval_ms, {},
                        [this](std::span<pollfd>) { Tick(); });
}

void MeminfoPressureSource::Stop() {
  MutexLock lifecycle(&lifecycle_mu_);
  poller_->Stop();
}

}  // namespace arbiter
