// MeminfoPressureSource — the reference OS poller (docs/memory.md "Pressure
// levels and sources", meminfo).
//
// State: `level_` is the level of the last *fired* event and `ticked_` says
// whether any tick happened; a tick fires when !ticked_ or the level differs.
// The decision and the Record() of the outgoing event happen under mu_ (see
// Note [Pressure event ordering]) so that a tick from the poll thread and a
// tick from a test or a Start() cannot fire out of order; the file read
// happens before taking the lock, and delivery and warnings after it.
//
// The poll thread waits on a CondVar with a steady-clock deadline; Stop()
// sets stop_requested_ and signals, so shutdown never waits out an interval.
#include "arbiter/memory/meminfo_pressure_source.h"

#include <chrono>
#include <cstdio>

#include "arbiter/memory/system_memory.h"
#include "memory/internal/pressure_listeners.h"

namespace arbiter {
namespace {

std::string FormatFraction(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

}  // namespace

Result<std::unique_ptr<MeminfoPressureSource>> MeminfoPressureSource::Create(Options options) {
  if (options.interval_ms < kMinIntervalMs) options.interval_ms = kMinIntervalMs;
  if (!(options.low_fraction > 0.0 && options.low_fraction < 1.0)) {
    options.low_fraction = kDefaultLowWaterFraction;
  }
  if (!(options.critical_fraction > 0.0 && options.critical_fraction < 1.0)) {
    options.critical_fraction = kDefaultCriticalWaterFraction;
  }
  if (options.critical_fraction >= options.low_fraction) {
    return InvalidArgumentError("pressure.critical_fraction (" +
                                FormatFraction(options.critical_fraction) +
                                ") must be < pressure.low_fraction (" +
                                FormatFraction(options.low_fraction) + ")");
  }
  return std::unique_ptr<MeminfoPressureSource>(new MeminfoPressureSource(std::move(options)));
}

MeminfoPressureSource::MeminfoPressureSource(Options options)
    : options_(std::move(options)),
      clock_(options_.clock ? options_.clock : Clock::Real()),
      listeners_(std::make_shared<internal::PressureListeners>(options_.warn)) {}

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
  internal::PressureListeners::Pending pending;
  bool fire = false;
  {
    MutexLock l(&mu_);
    if (!ticked_ || e.level != level_) {
      ticked_ = true;
      level_ = e.level;
      pending = listeners_->Record(e);
      fire = true;
    }
  }
  if (!warning.empty()) internal::EmitPressureWarning(options_.warn, warning);
  if (fire) listeners_->Deliver(pending);
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
  {
    MutexLock l(&mu_);
    if (running_) return OkStatus();
    running_ = true;
    stop_requested_ = false;
  }
  Tick();
  thread_ = std::thread([this] { PollLoop(); });
  return OkStatus();
}

void MeminfoPressureSource::Stop() {
  MutexLock lifecycle(&lifecycle_mu_);
  {
    MutexLock l(&mu_);
    if (!running_) return;
    stop_requested_ = true;
    wake_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
  MutexLock l(&mu_);
  running_ = false;
}

void MeminfoPressureSource::PollLoop() {
  const auto interval = std::chrono::milliseconds(options_.interval_ms);
  while (true) {
    {
      MutexLock l(&mu_);
      auto deadline = std::chrono::steady_clock::now() + interval;
      while (!stop_requested_ && std::chrono::steady_clock::now() < deadline) {
        wake_.WaitUntil(deadline);
      }
      if (stop_requested_) return;
    }
    Tick();
  }
}

}  // namespace arbiter
