// arbiter/base/clock.h — injectable time (STYLE.md rule 8).
//
// Components take a `Clock*` instead of calling std::chrono directly, so tests
// drive time with `SimulatedClock` and never sleep to wait for a state.
//
// Units: NowMs() is milliseconds on a monotonic (steady) timeline whose origin
// is unspecified; only differences are meaningful. NowUnixMs() is wall-clock
// milliseconds since the Unix epoch, for comparing against file times
// (mtimes); it can jump (NTP, settimeofday), so never measure intervals
// with it.
//
// Thread safety: all implementations are thread-safe.
#pragma once

#include <atomic>
#include <cstdint>

namespace arbiter {

class Clock {
 public:
  virtual ~Clock() = default;
  // Monotonic milliseconds.
  virtual int64_t NowMs() const = 0;
  // Monotonic nanoseconds (for timing measurements).
  virtual int64_t NowNs() const = 0;
  // Monotonic milliseconds on the same timeline as NowMs(), possibly lagging
  // it by up to one kernel tick (1–4 ms), never ahead of it; for timestamps
  // on hot paths (the MemoryArbiter's last-used stamp). The real clock reads
  // CLOCK_MONOTONIC_COARSE (~9 ns vs ~45 ns for NowMs() in a KVM guest);
  // the default (and SimulatedClock) is NowMs().
  virtual int64_t CoarseNowMs() const { return NowMs(); }
  // Wall-clock milliseconds since the Unix epoch (file mtimes are on this
  // timeline). The default reads the real wall clock (CLOCK_REALTIME);
  // SimulatedClock overrides it.
  virtual int64_t NowUnixMs() const;

  // The process-wide real steady clock. Never null; never destroyed.
  static Clock* Real();
};

// A clock that only moves when told. Starts at `start_ms`.
// It has one timeline: NowUnixMs() == NowMs(). A test that compares against
// file mtimes starts it at a Unix time (e.g. SimulatedClock(1'800'000'000'000))
// and sets the mtimes it needs relative to that.
class SimulatedClock final : public Clock {
 public:
  explicit SimulatedClock(int64_t start_ms = 0) : now_ns_(start_ms * 1000000) {}
  int64_t NowMs() const override { return now_ns_.load() / 1000000; }
  int64_t NowNs() const override { return now_ns_.load(); }
  int64_t NowUnixMs() const override { return NowMs(); }
  void AdvanceMs(int64_t ms) { now_ns_.fetch_add(ms * 1000000); }
  void SetMs(int64_t ms) { now_ns_.store(ms * 1000000); }

 private:
  std::atomic<int64_t> now_ns_;
};

}  // namespace arbiter
