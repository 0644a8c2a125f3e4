#include "arbiter/base/clock.h"

#include <time.h>

#include <chrono>

namespace arbiter {
namespace {

class SteadyClock final : public Clock {
 public:
  int64_t NowMs() const override { return NowNs() / 1000000; }
  int64_t NowNs() const override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  int64_t CoarseNowMs() const override {
#if defined(CLOCK_MONOTONIC_COARSE)
    // Same timeline as steady_clock (CLOCK_MONOTONIC) on Linux, updated per tick.
    timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC_COARSE, &ts) == 0) {
      return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
    }
#endif
    return NowMs();
  }
};

}  // namespace

int64_t Clock::NowUnixMs() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Clock* Clock::Real() {
  static SteadyClock* clock = new SteadyClock();  // never destroyed
  return clock;
}

}  // namespace arbiter
