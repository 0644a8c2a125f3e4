// The dashboard's memory history (GET /admin/history, docs/ui.md): the
// last 10 minutes of the ledger by kind, measured RSS and the pressure
// level, one sample a second, and the last 1,000 arbiter events, so a page
// opened now shows what happened before it was opened.
//
// Note [History memory]
// Both rings live as long as the server and are charged to the one ledger
// (owner "server::history", kind other) through Runtime::ChargeMemory: the
// sample ring is allocated whole at construction (fixed size), the event
// ring's charge follows the bytes its entries hold. The rings never grow
// past their capacity, so a server that runs for months holds the same
// (about 0.3 MiB when full) on day 100 as on day 1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "arbiter/runtime/runtime.h"

namespace arbiter::server_internal {

// One second of the history. Sizes in bytes, times in unix ms.
struct HistorySample {
  int64_t unix_ms = 0;
  ChargeKindBytes by_kind{};        // the ledger by kind (ChargeKind order)
  uint64_t charged_bytes = 0;       // Σ live charges
  uint64_t runtime_bytes = 0;       // the runtime's own bytes (not charged)
  uint64_t budget_bytes = 0;        // 0 = unlimited
  uint64_t rss_bytes = 0;           // measured RssAnon + RssShmem (0: unknown)
  int64_t unaccounted_bytes = 0;    // measured − (charged + runtime), signed
  MemoryPressureLevel pressure = MemoryPressureLevel::kNominal;
  int resident_models = 0;
};

// One arbiter event as the history keeps it: when it arrived (unix ms) and
// its JSON (ArbiterEventJson, the same object GET /admin/events sends).
struct HistoryEvent {
  int64_t unix_ms = 0;
  std::string type;  // ArbiterEventTypeName
  std::string json;
};

// The rings and the sampler thread that fills the sample ring.
//
// Thread safety: thread-safe. Start() once; Stop() (also run by the
// destructor) joins the sampler. The runtime must outlive the recorder.
class HistoryRecorder {
 public:
  static constexpr size_t kSampleCapacity = 600;   // 10 minutes at 1 Hz
  static constexpr size_t kEventCapacity = 1000;
  static constexpr int64_t kSampleIntervalMs = 1000;

  explicit HistoryRecorder(Runtime* runtime);
  ~HistoryRecorder();
  HistoryRecorder(const HistoryRecorder&) = delete;
  HistoryRecorder& operator=(const HistoryRecorder&) = delete;

  // Starts the sampler (one Runtime::Status() a second) and subscribes to
  // the arbiter's events.
  void Start();
  // Stops and joins the sampler; unsubscribes. Idempotent.
  void Stop();

  // Takes one sample now (the sampler calls it; tests call it directly).
  void SampleNow();
  // Records `e`, received at `unix_ms`.
  void AddEvent(const ArbiterEvent& e, int64_t unix_ms);

  // GET /admin/history: {"interval_ms", "capacity", "kinds": [names],
  // "samples": [{"t", "by_kind": [bytes per kind, "kinds" order],
  // "charged", "runtime", "budget", "rss", "unaccounted", "pressure",
  // "resident_models"}], "events": [{"t", "type", "event": {...}}]}, both
  // oldest first, only entries with t > `since_unix_ms` (0: all).
  std::string Json(int64_t since_unix_ms) const;

  // Bytes the rings hold (what is charged).
  size_t bytes() const;

 private:
  struct Rings;  // the state the event listener shares (it may outlive Stop())

  const std::shared_ptr<Rings> rings_;
  Runtime* const runtime_;
  ArbiterEventSubscription sub_;
  std::thread thread_;
  bool started_ = false;  // Start()/Stop() are called by the owner's thread
};

}  // namespace arbiter::server_internal
