// server/internal/event_stream.h — the per-connection queue behind
// GET /admin/events (SSE of MemoryArbiter events).
//
// Note [Event stream lifetime]
// The arbiter calls listeners without its lock, on whatever thread produced
// the event, and ArbiterEventSubscription::Reset() does not wait for a call
// already in flight. So the listener owns a shared_ptr<EventQueue> (never a
// pointer to the connection), and Push() only copies the event under the
// queue's own lock: fast, bounded, never blocks on the client. When the queue
// is full the oldest event is dropped and counted; the writer reports the
// count in-band (`event: dropped`). The HTTP worker that serves the stream
// owns the subscription and drops it when the client goes away, when the
// response ends, or when the server stops (Close() wakes the writer), never
// from inside the listener.
//
// Thread safety: EventQueue is thread-safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "arbiter/arbiter/memory_arbiter.h"
#include "arbiter/base/mutex.h"

namespace arbiter::server_internal {

class EventQueue {
 public:
  // REQUIRES: capacity ≥ 1.
  explicit EventQueue(size_t capacity) : capacity_(capacity) {}

  // Appends `event`; drops the oldest (counted) when full. No-op once closed.
  void Push(const ArbiterEvent& event) EXCLUDES(mu_);
  // Wakes Wait() for good.
  void Close() EXCLUDES(mu_);
  bool closed() const EXCLUDES(mu_);

  // Waits until events are queued, Close(), or `deadline`; moves the queued
  // events to *out and the drop count since the last call to *dropped.
  // Returns false once closed (after the remaining events were handed out).
  bool Wait(std::chrono::steady_clock::time_point deadline, std::vector<ArbiterEvent>* out,
            uint64_t* dropped) EXCLUDES(mu_);

 private:
  const size_t capacity_;
  mutable Mutex mu_;
  CondVar cv_{&mu_};
  std::deque<ArbiterEvent> queue_ GUARDED_BY(mu_);
  uint64_t dropped_ GUARDED_BY(mu_) = 0;
  bool closed_ GUARDED_BY(mu_) = false;
};

// The JSON of one event: {"type", "at_ms", ...} with the fields of its type
// (docs/http-api.md "GET /admin/events"): model_load {capability, model_key, load_ms};
// model_unload {capability, model_key, reason}; eviction {capability,
// model_key, reason, estimated_bytes}; capability_run {capability,
// model_key, run_ms}; memory_pressure {level, source, free_bytes?}.
std::string ArbiterEventJson(const ArbiterEvent& event);

// One SSE frame: "event: <type>\ndata: <json>\n\n".
std::string ArbiterEventFrame(const ArbiterEvent& event);

}  // namespace arbiter::server_internal
