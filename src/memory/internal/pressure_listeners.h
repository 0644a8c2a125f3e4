// memory/internal/pressure_listeners.h — the listener registry every
// MemoryPressureSource uses: remembers the last event, replays it on
// subscribe, and delivers events outside the source's lock.
//
// Note [Pressure event ordering]
// Every recorded event gets a sequence number, assigned under the registry's
// lock in Record(). A source that must order events with its own state calls
// Record() while holding its own lock (lock order: source mu_ → registry
// mu_), then Deliver() after releasing it. Each listener remembers the last
// sequence number it was given and runs under its own call mutex, so a
// listener is never re-entered concurrently and never sees an older event
// after a newer one: a stale delivery (e.g. a replay racing a fresh event) is
// dropped. Unsubscribing takes the listener's call mutex, so after it returns
// the listener is not running — except when a listener unsubscribes itself
// from inside its own callback (detected by thread id), where waiting would
// deadlock.
//
// Thread safety: thread-safe. Owned through a shared_ptr so that a
// MemoryPressureSubscription may outlive its source (it holds a weak_ptr).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "arbiter/base/mutex.h"
#include "arbiter/memory/memory_pressure.h"

namespace arbiter::internal {

// Writes `warning` to `sink`, or to stderr when `sink` is empty.
void EmitPressureWarning(const PressureWarningSink& sink, std::string_view warning);

class PressureListeners : public std::enable_shared_from_this<PressureListeners> {
 public:
  struct Entry {
    explicit Entry(MemoryPressureListener l) : listener(std::move(l)) {}
    const MemoryPressureListener listener;
    Mutex call_mu;
    uint64_t delivered_seq GUARDED_BY(call_mu) = 0;
    std::atomic<bool> removed{false};
    std::atomic<std::thread::id> calling_thread{};
  };

  // A recorded event and the listeners to deliver it to.
  struct Pending {
    uint64_t seq = 0;
    MemoryPressureEvent event;
    std::vector<std::shared_ptr<Entry>> targets;
  };

  explicit PressureListeners(PressureWarningSink warn) : warn_(std::move(warn)) {}

  // Registers `listener`; replays the last recorded event to it (if any) on
  // the calling thread before returning.
  MemoryPressureSubscription Subscribe(MemoryPressureListener listener) EXCLUDES(mu_);

  // Remembers `event` as the last one and snapshots the listeners. Cheap; safe
  // to call under the source's lock. Deliver the result outside it.
  Pending Record(MemoryPressureEvent event) EXCLUDES(mu_);
  // Calls each target (outside every lock of the registry).
  void Deliver(const Pending& pending) EXCLUDES(mu_);
  // Record + Deliver, for sources without ordering state of their own.
  void Publish(MemoryPressureEvent event) { Deliver(Record(std::move(event))); }

  std::optional<MemoryPressureEvent> last() const EXCLUDES(mu_);
  size_t size() const EXCLUDES(mu_);
  const PressureWarningSink& warn() const { return warn_; }

 private:
  void Unsubscribe(const std::shared_ptr<Entry>& entry) EXCLUDES(mu_);
  void DeliverOne(const std::shared_ptr<Entry>& entry, uint64_t seq,
                  const MemoryPressureEvent& event) EXCLUDES(mu_);

  const PressureWarningSink warn_;
  mutable Mutex mu_;
  uint64_t next_seq_ GUARDED_BY(mu_) = 1;
  std::optional<MemoryPressureEvent> last_ GUARDED_BY(mu_);
  uint64_t last_seq_ GUARDED_BY(mu_) = 0;
  std::vector<std::shared_ptr<Entry>> entries_ GUARDED_BY(mu_);
};

}  // namespace arbiter::internal
