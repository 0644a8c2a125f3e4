// The shared pieces of the polling pressure sources; see
// Note [Polling pressure sources] in pressure_poller.h.
#include "memory/internal/pressure_poller.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

namespace arbiter::internal {
namespace {

std::string FormatFraction(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

}  // namespace

int64_t ClampPollIntervalMs(int64_t interval_ms) {
  return std::max(interval_ms, kMinPressurePollIntervalMs);
}

Status NormalizeWatermarks(double* low_fraction, double* critical_fraction) {
  if (!(*low_fraction > 0.0 && *low_fraction < 1.0)) *low_fraction = kDefaultLowWaterFraction;
  if (!(*critical_fraction > 0.0 && *critical_fraction < 1.0)) {
    *critical_fraction = kDefaultCriticalWaterFraction;
  }
  if (*critical_fraction >= *low_fraction) {
    return InvalidArgumentError("pressure.critical_fraction (" + FormatFraction(*critical_fraction) +
                                ") must be < pressure.low_fraction (" +
                                FormatFraction(*low_fraction) + ")");
  }
  return OkStatus();
}

std::optional<PressureListeners::Pending> PressureLevelLatch::Offer(
    const MemoryPressureEvent& event, PressureListeners& listeners) {
  if (fired_ && event.level == level_) return std::nullopt;
  fired_ = true;
  level_ = event.level;
  return listeners.Record(event);
}

PressurePoller::PressurePoller(std::string source_id, PressureWarningSink warn)
    : source_id_(std::move(source_id)), warn_(std::move(warn)) {}

PressurePoller::~PressurePoller() { Stop(); }

bool PressurePoller::running() const {
  MutexLock l(&mu_);
  return thread_.joinable();
}

Status PressurePoller::Start(int64_t interval_ms, std::vector<pollfd> watches, OnWake on_wake) {
  MutexLock l(&mu_);
  if (thread_.joinable()) return OkStatus();
  int wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    const int err = errno;
    return InternalError("eventfd for the poll thread of memory pressure source " + source_id_ +
                         " failed: " + std::strerror(err));
  }
  wake_fd_ = wake;
  watches.push_back(pollfd{wake, POLLIN, 0});  // last: Stop()
  thread_ = std::thread([this, interval_ms, fds = std::move(watches),
                         on_wake = std::move(on_wake)]() mutable {
    Loop(interval_ms, std::move(fds), on_wake);
  });
  return OkStatus();
}

void PressurePoller::Stop() {
  MutexLock l(&mu_);
  if (!thread_.joinable()) return;
  uint64_t one = 1;
  while (::write(wake_fd_, &one, sizeof(one)) < 0 && errno == EINTR) {
  }
  thread_.join();
  ::close(wake_fd_);
  wake_fd_ = -1;
}

void PressurePoller::Loop(int64_t interval_ms, std::vector<pollfd> fds,
                          const OnWake& on_wake) const {
  const size_t n_watches = fds.size() - 1;
  const int timeout = static_cast<int>(std::min<int64_t>(interval_ms, INT32_MAX));
  while (true) {
    for (pollfd& p : fds) p.revents = 0;
    int n = ::poll(fds.data(), fds.size(), timeout);
    if (n < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      EmitPressureWarning(warn_, "memory pressure source " + source_id_ + ": poll failed (" +
                                     std::strerror(err) + "); its poll thread stops");
      return;
    }
    if (fds.back().revents != 0) return;  // Stop()
    on_wake(std::span<pollfd>(fds.data(), n_watches));
  }
}

}  // namespace arbiter::internal
