// arbiter/memory/psi_pressure_source.h — Linux Pressure Stall Information
// (PSI) as a MemoryPressureSource (docs/memory.md "Pressure levels and
// sources", psi).
//
// Start() opens the PSI file (default /proc/pressure/memory) once per trigger
// and writes the trigger text, e.g. "some 300000 2000000" (tasks stalled on
// memory ≥ 300 ms within any 2 s window). The poll thread poll()s the trigger
// fds for POLLPRI:
//   low trigger fired      → level at least low
//   critical trigger fired → critical
// Triggers only raise the level. Tick() (every check_interval_ms on the poll
// thread) decays it: once no trigger of the current level has fired for
// quiet_ms (measured on the injected Clock), the level drops to what the
// file's avg10 values say — full avg10 ≥ 100·critical.stall/window → critical,
// some avg10 ≥ 100·low.stall/window → low, else nominal — but never above the
// current level, and never below low while a low trigger fired within
// quiet_ms. Listeners fire on every level change. Start() fires a nominal
// event if nothing has fired yet, so subscribers after Start() get a replay.
//
// Defaults use 2 s windows: the kernel lets processes without
// CAP_SYS_RESOURCE (including root in most containers) create triggers only
// with windows that are multiples of 2 s; 1 s windows ("some 150000 1000000")
// fail with EINVAL there. The ratios match the usual 15 % / 10 % examples.
//
// Errors:
//   Create(): kInvalidArgument when a trigger is malformed (stall_us must be
//     in (0, window_us], window_us in [500000, 10000000]) — message names
//     which trigger and field.
//   Start(): kUnavailable when the file cannot be opened or the kernel
//     refuses a trigger (EPERM/EACCES/ENOENT/EINVAL/EOPNOTSUPP — typical for
//     containers and kernels without CONFIG_PSI); the message says PSI
//     triggers are unavailable and that other pressure sources should be
//     used. kDataLoss when the file's content does not parse (ParsePsi).
//   A bad avg10 reading during decay keeps the level and writes a warning.
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

// One line of a PSI file: "some avg10=0.00 avg60=0.00 avg300=0.00 total=0".
struct PsiLine {
  double avg10 = 0;    // percent of time stalled, 10 s average, [0, 100]
  double avg60 = 0;    // same, 60 s
  double avg300 = 0;   // same, 300 s
  uint64_t total_us = 0;  // cumulative stall time, microseconds
};

struct PsiStats {
  PsiLine some;                // at least one task stalled
  std::optional<PsiLine> full; // all non-idle tasks stalled (memory and io)
};

// Parses the text of a /proc/pressure/* file. Errors: kDataLoss naming the
// line kind and the field: no "some" line, a duplicate or unknown line kind,
// a missing avg10/avg60/avg300/total field, a value that is not a number, an
// average outside [0, 100].
Result<PsiStats> ParsePsi(std::string_view text);

// A PSI trigger: fire when tasks stalled for ≥ stall_us within window_us.
struct PsiTrigger {
  enum class Kind { kSome, kFull };
  Kind kind = Kind::kSome;
  uint64_t stall_us = 0;
  uint64_t window_us = 0;
  // The kernel's text form, e.g. "some 300000 2000000".
  std::string ToString() const;
  // Stall share that the trigger stands for, in percent (100·stall/window).
  double Percent() const;
};

class PsiPressureSource final : public MemoryPressureSource {
 public:
  // Floor of check_interval_ms (real ms). It is not the sampling sources'
  // kMinPressurePollIntervalMs: triggers wake the thread at once, this only
  // bounds how often the decay check reads the file.
  static constexpr int64_t kMinCheckIntervalMs = 10;

  struct Options {
    std::string id = "psi";
    std::string path = "/proc/pressure/memory";  // injectable for tests
    PsiTrigger low_trigger{PsiTrigger::Kind::kSome, 300000, 2000000};
    PsiTrigger critical_trigger{PsiTrigger::Kind::kFull, 200000, 2000000};
    int64_t quiet_ms = 10000;          // no trigger this long → decay (Clock ms)
    // Poll timeout between decay checks (real ms); raised to ≥ kMinCheckIntervalMs.
    int64_t check_interval_ms = 1000;
    // false: open the file but write no triggers — only for tests over a
    // fake regular file, which a trigger write would overwrite.
    bool arm_triggers = true;
    Clock* clock = nullptr;            // nullptr = Clock::Real(); must outlive
    PressureWarningSink warn;
  };

  // Errors: kInvalidArgument (see above). Opens nothing.
  static Result<std::unique_ptr<PsiPressureSource>> Create(Options options);
  ~PsiPressureSource() override;  // Stop()s

  const std::string& id() const override { return options_.id; }
  MemoryPressureSubscription Subscribe(MemoryPressureListener listener) override;
  Status Start() override;
  void Stop() override;
  // {current level, source, now}; PSI knows no byte counts.
  MemoryPressureEvent Current() override;

  // What the poll thread does when a trigger fd reports POLLPRI; public so
  // tests can drive the level logic without a kernel. REQUIRES: level is
  // kLow or kCritical.
  void OnTrigger(MemoryPressureLevel level);
  // One decay check (reads the file's avg10 values when above nominal).
  // Returns the level after the check.
  MemoryPressureLevel Tick();

 private:
  explicit PsiPressureSource(Options options);
  // {level, source, now}.
  MemoryPressureEvent MakeEventLocked(MemoryPressureLevel level) const REQUIRES(mu_);

  const Options options_;
  Clock* const clock_;
  std::shared_ptr<internal::PressureListeners> listeners_;

  mutable Mutex mu_;
  // level() is the current level; fired() says whether any event fired.
  std::unique_ptr<internal::PressureLevelLatch> latch_ GUARDED_BY(mu_);
  std::optional<int64_t> last_low_ms_ GUARDED_BY(mu_);
  std::optional<int64_t> last_critical_ms_ GUARDED_BY(mu_);

  Mutex lifecycle_mu_;  // serializes Start/Stop
  bool running_ GUARDED_BY(lifecycle_mu_) = false;
  int low_fd_ GUARDED_BY(lifecycle_mu_) = -1;
  int critical_fd_ GUARDED_BY(lifecycle_mu_) = -1;
  std::unique_ptr<internal::PressurePoller> poller_;  // thread-safe
};

}  // namespace arbiter
