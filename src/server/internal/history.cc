// See history.h, Note [History memory].
#include "server/internal/history.h"

#include <chrono>
#include <deque>
#include <utility>

#include <nlohmann/json.hpp>

#include "arbiter/base/mutex.h"
#include "server/internal/event_stream.h"

namespace arbiter::server_internal {
namespace {

int64_t UnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// What one event entry holds beyond sizeof(HistoryEvent): its strings'
// heap blocks (std::string's capacity; short strings live inline).
size_t EventHeapBytes(const HistoryEvent& e) {
  auto heap = [](const std::string& s) {
    return s.capacity() > sizeof(std::string) - 1 ? s.capacity() + 1 : 0;
  };
  return sizeof(HistoryEvent) + heap(e.type) + heap(e.json);
}

}  // namespace

struct HistoryRecorder::Rings {
  mutable Mutex mu;
  CondVar cv{&mu};
  bool stop GUARDED_BY(mu) = false;
  // A fixed ring: samples[(head + i) % capacity] for i < count.
  std::vector<HistorySample> samples GUARDED_BY(mu);
  size_t head GUARDED_BY(mu) = 0;
  size_t count GUARDED_BY(mu) = 0;
  std::deque<HistoryEvent> events GUARDED_BY(mu);
  size_t event_bytes GUARDED_BY(mu) = 0;
  MemoryCharge charge GUARDED_BY(mu);

  void Add(const ArbiterEvent& e, int64_t unix_ms) EXCLUDES(mu) {
    HistoryEvent h{unix_ms, std::string(ArbiterEventTypeName(e.type)), ArbiterEventJson(e)};
    h.json.shrink_to_fit();
    HistoryEvent dropped;  // freed after the lock
    MutexLock l(&mu);
    if (events.size() >= kEventCapacity) {
      event_bytes -= EventHeapBytes(events.front());
      dropped = std::move(events.front());
      events.pop_front();
    }
    event_bytes += EventHeapBytes(h);
    events.push_back(std::move(h));
    charge.ForceResize(BytesLocked());
  }

  size_t BytesLocked() const REQUIRES(mu) {
    return samples.capacity() * sizeof(HistorySample) + event_bytes;
  }
};

HistoryRecorder::HistoryRecorder(Runtime* runtime)
    : rings_(std::make_shared<Rings>()), runtime_(runtime) {
  MutexLock l(&rings_->mu);
  rings_->samples.resize(kSampleCapacity);
  rings_->charge =
      runtime_->ChargeMemory("server::history", ChargeKind::kOther, rings_->BytesLocked());
}

HistoryRecorder::~HistoryRecorder() { Stop(); }

void HistoryRecorder::Start() {
  if (started_) return;
  started_ = true;
  // The listener holds the rings, not the recorder: a call already running
  // when Stop() unsubscribes may finish after the recorder is gone.
  sub_ = runtime_->OnEvent(
      [rings = rings_](const ArbiterEvent& e) { rings->Add(e, UnixMs()); });
  thread_ = std::thread([this] {
    Rings& r = *rings_;
    for (;;) {
      SampleNow();
      MutexLock l(&r.mu);
      const auto until =
          std::chrono::steady_clock::now() + std::chrono::milliseconds(kSampleIntervalMs);
      while (!r.stop) {
        if (!r.cv.WaitUntil(until)) break;
      }
      if (r.stop) return;
    }
  });
}

void HistoryRecorder::Stop() {
  sub_.Reset();
  {
    MutexLock l(&rings_->mu);
    rings_->stop = true;
  }
  rings_->cv.SignalAll();
  if (thread_.joinable()) thread_.join();
}

void HistoryRecorder::SampleNow() {
  const RuntimeStatus st = runtime_->Status();
  HistorySample s;
  s.unix_ms = UnixMs();
  s.by_kind = st.ledger.by_kind;
  s.charged_bytes = st.ledger.charged_bytes;
  s.runtime_bytes = st.ledger.runtime_bytes;
  s.budget_bytes = st.arbiter.budget_bytes;
  s.rss_bytes = st.process_resident_bytes;
  s.unaccounted_bytes = st.unaccounted_bytes;
  s.pressure = st.arbiter.pressure;
  s.resident_models = st.arbiter.resident_models;
  Rings& r = *rings_;
  MutexLock l(&r.mu);
  const size_t cap = r.samples.size();
  if (r.count < cap) {
    r.samples[(r.head + r.count) % cap] = s;
    ++r.count;
  } else {
    r.samples[r.head] = s;
    r.head = (r.head + 1) % cap;
  }
}

void HistoryRecorder::AddEvent(const ArbiterEvent& e, int64_t unix_ms) {
  rings_->Add(e, unix_ms);
}

size_t HistoryRecorder::bytes() const {
  MutexLock l(&rings_->mu);
  return rings_->BytesLocked();
}

std::string HistoryRecorder::Json(int64_t since_unix_ms) const {
  using json = nlohmann::json;
  json kinds = json::array();
  for (size_t k = 0; k < kChargeKindCount; ++k) {
    kinds.push_back(ChargeKindName(static_cast<ChargeKind>(k)));
  }
  json samples = json::array();
  std::string events = "[";
  {
    const Rings& r = *rings_;
    MutexLock l(&r.mu);
    const size_t cap = r.samples.size();
    for (size_t i = 0; i < r.count; ++i) {
      const HistorySample& s = r.samples[(r.head + i) % cap];
      if (s.unix_ms <= since_unix_ms) continue;
      samples.push_back({{"t", s.unix_ms},
                         {"by_kind", s.by_kind},
                         {"charged", s.charged_bytes},
                         {"runtime", s.runtime_bytes},
                         {"budget", s.budget_bytes},
                         {"rss", s.rss_bytes},
                         {"unaccounted", s.unaccounted_bytes},
                         {"pressure", MemoryPressureLevelName(s.pressure)},
                         {"resident_models", s.resident_models}});
    }
    bool first = true;
    for (const HistoryEvent& e : r.events) {
      if (e.unix_ms <= since_unix_ms) continue;
      if (!first) events += ',';
      first = false;
      // The type is one of ArbiterEventTypeName's plain names and the event
      // is already JSON: no escaping needed.
      events += "{\"t\":" + std::to_string(e.unix_ms) + ",\"type\":\"" + e.type +
                "\",\"event\":" + e.json + "}";
    }
  }
  events += "]";
  json j = {{"interval_ms", kSampleIntervalMs},
            {"capacity", kSampleCapacity},
            {"event_capacity", kEventCapacity},
            {"kinds", std::move(kinds)},
            {"samples", std::move(samples)}};
  std::string out = j.dump();
  out.pop_back();  // '}'
  out += ",\"events\":" + events + "}";
  return out;
}

}  // namespace arbiter::server_internal
