#include "arbiter/base/clock.h"

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
};

}  // namespace

Clock* Clock::Real() {
  static SteadyClock* clock = new SteadyClock();  // never destroyed
  return clock;
}

}  // namespace arbiter
