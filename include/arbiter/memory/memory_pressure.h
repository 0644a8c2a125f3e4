// arbiter/memory/memory_pressure.h — OS memory-pressure levels, events and
// the MemoryPressureSource interface (docs/memory.md "Pressure levels and
// sources").
//
// A pressure source turns some signal (free RAM, PSI stall triggers, a cgroup
// limit, a host app's "memory warning") into a MemoryPressureLevel and fans
// MemoryPressureEvents out to listeners. The MemoryArbiter subscribes to one
// source — usually a CompositePressureSource over several — and reacts to the
// level (docs/architecture.md "Giving memory back: the reclaim order").
//
// Implementations in this layer:
//   MeminfoPressureSource   (meminfo_pressure_source.h)  the reference "OS poller"
//   PsiPressureSource       (psi_pressure_source.h)      Linux PSI triggers
//   CgroupPressureSource    (cgroup_pressure_source.h)   cgroup v2 memory limit
//   BridgePressureSource    (below)                      host/mobile bridge
//   CompositePressureSource (below)                      worst of several
//
// Usage:
//   auto bridge = std::make_unique<BridgePressureSource>();
//   BridgePressureSource* host = bridge.get();
//   std::vector<std::unique_ptr<MemoryPressureSource>> children;
//   children.push_back(std::move(bridge));
//   CompositePressureSource pressure(std::move(children));
//   Status s = pressure.Start();                  // skips children that fail
//   MemoryPressureSubscription sub = pressure.Subscribe(
//       [](const MemoryPressureEvent& e) { /* react to e.level */ });
//   host->Dispatch(MemoryPressureLevel::kLow);    // listener sees "low"
//   // `sub` going out of scope unsubscribes.
//
// Common contract of every MemoryPressureSource (the contract test suite in
// memory_pressure_test.cc runs it against each implementation):
//   - Subscribe() replays the source's last fanned-out event to the new
//     listener (if there is one yet), then delivers every later event.
//   - Listeners are called outside the source's lock, possibly on the
//     source's own thread. One listener is never called concurrently with
//     itself, and sees events in the order the source produced them (an
//     older event that loses a race to a newer one is dropped, not delivered
//     late). A listener may subscribe or unsubscribe (even itself) from
//     inside the callback. A listener that throws is removed and a warning
//     is written.
//   - Destroying (or Reset()ing) a MemoryPressureSubscription unsubscribes;
//     when it returns the listener is not running and will not run again
//     (unless it is the listener that is unsubscribing itself from inside
//     its own callback). A subscription may outlive its source: it then
//     does nothing.
//   - Start() and Stop() are idempotent; a stopped source may be started
//     again. Stop() returns promptly (it interrupts a waiting poll thread)
//     and joins it. Destruction stops the source.
//   - Current() returns the level now without notifying anyone.
//
// Thread safety: every MemoryPressureSource is thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "arbiter/base/clock.h"
#include "arbiter/base/mutex.h"
#include "arbiter/base/status.h"

namespace arbiter {

// Ordered: a larger value is worse (critical 2 > low 1 > nominal 0, as in the
// reference: docs/memory.md "Pressure levels and sources").
enum class MemoryPressureLevel { kNominal = 0, kLow = 1, kCritical = 2 };

// "nominal", "low", "critical".
std::string_view MemoryPressureLevelName(MemoryPressureLevel level);
// Inverse of MemoryPressureLevelName (exact, lower case). Errors:
// kInvalidArgument naming the bad value and the accepted ones.
Result<MemoryPressureLevel> ParseMemoryPressureLevel(std::string_view name);
// The worse of two levels.
inline MemoryPressureLevel WorseLevel(MemoryPressureLevel a, MemoryPressureLevel b) {
  return static_cast<int>(a) >= static_cast<int>(b) ? a : b;
}

// Default watermarks of the free-memory sources (the reference's; docs/memory.md
// "Pressure levels and sources"), as fractions of total (or of the cgroup
// limit) that are still free.
inline constexpr double kDefaultLowWaterFraction = 0.15;
inline constexpr double kDefaultCriticalWaterFraction = 0.05;

// Poll period of the sources that sample on an interval (meminfo, cgroup;
// `[pressure] interval_ms`), milliseconds: the default, and the floor that a
// shorter configured interval is raised to.
inline constexpr int64_t kDefaultPressurePollIntervalMs = 5000;
inline constexpr int64_t kMinPressurePollIntervalMs = 500;

// As the reference's poller: free_fraction ≤ critical → critical, ≤ low →
// low, else nominal.
// REQUIRES: 0 < critical < low < 1.
MemoryPressureLevel ClassifyFreeFraction(double free_fraction, double low_fraction,
                                         double critical_fraction);

// One observation of a source (the reference's pressure event, docs/memory.md
// "Pressure levels and sources"; we carry bytes where the reference carries
// MiB).
struct MemoryPressureEvent {
  MemoryPressureLevel level = MemoryPressureLevel::kNominal;
  std::optional<uint64_t> free_bytes;   // free/available bytes, when known
  std::optional<uint64_t> total_bytes;  // total (or limit) bytes, when known
  std::optional<double> free_fraction;  // free_bytes / total_bytes in [0, 1]
  std::string source;                   // id() of the source that produced it
  // The memory domain it is about (Note [Memory domains] in
  // memory_ledger.h): empty or "host" for the host's RAM, a device's domain
  // name ("vulkan:0") for a device source.
  std::string domain;
  int64_t at_ms = 0;                    // the source's Clock::NowMs()
};

using MemoryPressureListener = std::function<void(const MemoryPressureEvent&)>;

// Where a source writes warnings (bad readings, a listener that threw). Called
// outside every lock. nullptr = write "arbiter: warning: <text>" to stderr.
using PressureWarningSink = std::function<void(std::string_view warning)>;

// A move-only RAII registration of one listener; see the contract above.
class [[nodiscard]] MemoryPressureSubscription {
 public:
  MemoryPressureSubscription() = default;  // inactive
  explicit MemoryPressureSubscription(std::function<void()> unsubscribe)
      : unsubscribe_(std::move(unsubscribe)) {}
  MemoryPressureSubscription(MemoryPressureSubscription&& o) noexcept
      : unsubscribe_(std::exchange(o.unsubscribe_, nullptr)) {}
  MemoryPressureSubscription& operator=(MemoryPressureSubscription&& o) noexcept {
    if (this != &o) {
      Reset();
      unsubscribe_ = std::exchange(o.unsubscribe_, nullptr);
    }
    return *this;
  }
  MemoryPressureSubscription(const MemoryPressureSubscription&) = delete;
  MemoryPressureSubscription& operator=(const MemoryPressureSubscription&) = delete;
  ~MemoryPressureSubscription() { Reset(); }

  // Unsubscribes now (idempotent).
  void Reset() {
    if (unsubscribe_) std::exchange(unsubscribe_, nullptr)();
  }
  bool active() const { return static_cast<bool>(unsubscribe_); }

 private:
  std::function<void()> unsubscribe_;
};

// The reference's pressure source: {id, subscribe → unsubscribe, start,
// stop, current} (docs/memory.md "Pressure levels and sources").
// Thread-safe.
class MemoryPressureSource {
 public:
  virtual ~MemoryPressureSource() = default;

  // Stable identifier written into every event's `source` ("meminfo", "psi",
  // "cgroup", "bridge", "composite" by default).
  virtual const std::string& id() const = 0;

  // Registers `listener` and replays the last event to it (before returning,
  // on the calling thread) if the source has produced one.
  // REQUIRES: listener is callable.
  virtual MemoryPressureSubscription Subscribe(MemoryPressureListener listener) = 0;

  // Begins observing (threads, file descriptors). Idempotent. Errors are
  // source-specific and documented by each implementation; kUnavailable means
  // "this signal does not exist here, use another source".
  virtual Status Start() = 0;
  // Stops observing; joins any thread. Idempotent; never fails.
  virtual void Stop() = 0;

  // The level now, without notifying listeners.
  virtual MemoryPressureEvent Current() = 0;
};

namespace internal {
class PressureListeners;
}  // namespace internal

// The mobile/host bridge (docs/memory.md "Pressure levels and sources"),
// fed by `POST /admin/pressure
// {"level","free_mb"}` or an embedding app.
//
// Dispatch() always fans out, even when the level did not change. Current()
// is the last event (a nominal event stamped at construction until the first
// Dispatch); Subscribe() replays it. Start()/Stop() do nothing and always
// succeed.
//
// Intended host mapping (the reference's):
//   Android onTrimMemory TRIM_MEMORY_RUNNING_LOW, TRIM_MEMORY_BACKGROUND → low
//   Android TRIM_MEMORY_RUNNING_CRITICAL, TRIM_MEMORY_COMPLETE         → critical
//   iOS didReceiveMemoryWarning / dispatch MEMORY_PRESSURE_CRITICAL   → critical
//   (iOS dispatch MEMORY_PRESSURE_WARN → low; NORMAL → nominal)
//
// Thread-safe.
class BridgePressureSource final : public MemoryPressureSource {
 public:
  // `clock` stamps events; nullptr = Clock::Real(). It must outlive this.
  explicit BridgePressureSource(std::string id = "bridge", Clock* clock = nullptr,
                                PressureWarningSink warn = nullptr);
  ~BridgePressureSource() override;

  const std::string& id() const override { return id_; }
  MemoryPressureSubscription Subscribe(MemoryPressureListener listener) override;
  Status Start() override { return OkStatus(); }
  void Stop() override {}
  MemoryPressureEvent Current() override;

  // Fans out {level, free_bytes, at = now} to every listener (outside the
  // lock, on the calling thread) and remembers it as Current().
  // free_fraction/total_bytes are left empty: the host reports only free.
  void Dispatch(MemoryPressureLevel level, std::optional<uint64_t> free_bytes = std::nullopt);

 private:
  const std::string id_;
  Clock* const clock_;
  std::shared_ptr<internal::PressureListeners> listeners_;
};

// The worst level across child sources (docs/memory.md "Pressure levels and
// sources").
//
// Owns its children. Each child's events update that child's last event; the
// composite fans out only when the worst level across the *started* children
// changes, and the event it fans out is the worst child's last event (its
// `source` names that child, so the arbiter can say which signal fired; ties
// go to the earlier child). Subscribe() replays the current worst event
// (nominal with source = id() while no started child has reported).
//
// Start() starts every child in order; a child whose Start() fails is skipped
// (its events ignored, it is not stopped) and its error is kept for
// child_errors(). Start() returns OK if at least one child started or there
// are no children, else kUnavailable listing every child's error. Stop()
// stops the started children. Current() is the worst of the started
// children's Current() (sampling them, notifying nobody).
//
// Thread-safe.
class CompositePressureSource final : public MemoryPressureSource {
 public:
  // REQUIRES: no child is null. `clock` as in BridgePressureSource.
  explicit CompositePressureSource(std::vector<std::unique_ptr<MemoryPressureSource>> children,
                                   std::string id = "composite", Clock* clock = nullptr,
                                   PressureWarningSink warn = nullptr);
  ~CompositePressureSource() override;

  const std::string& id() const override { return id_; }
  MemoryPressureSubscription Subscribe(MemoryPressureListener listener) override;
  Status Start() override;
  void Stop() override;
  MemoryPressureEvent Current() override;

  size_t child_count() const { return children_.size(); }
  // REQUIRES: i < child_count(). The composite keeps ownership.
  MemoryPressureSource* child(size_t i) const { return children_[i].get(); }
  // {child id, error} for every child whose last Start() failed.
  std::vector<std::pair<std::string, Status>> child_errors() const;

 private:
  void OnChildEvent(size_t index, const MemoryPressureEvent& event);
  MemoryPressureEvent WorstLocked() const REQUIRES(mu_);

  const std::string id_;
  Clock* const clock_;
  const std::vector<std::unique_ptr<MemoryPressureSource>> children_;
  std::shared_ptr<internal::PressureListeners> listeners_;

  mutable Mutex mu_;
  bool started_ GUARDED_BY(mu_) = false;
  std::vector<bool> active_ GUARDED_BY(mu_);  // [child] started successfully
  std::vector<std::optional<MemoryPressureEvent>> last_ GUARDED_BY(mu_);  // [child]
  std::vector<std::pair<std::string, Status>> errors_ GUARDED_BY(mu_);
  MemoryPressureLevel worst_ GUARDED_BY(mu_) = MemoryPressureLevel::kNominal;

  // Declared last: destroyed first, so no child calls back into a dying
  // composite.
  std::vector<MemoryPressureSubscription> child_subs_;
};

}  // namespace arbiter
