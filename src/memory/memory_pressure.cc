// Pressure levels, the listener registry shared by every source, and the two
// sources without OS plumbing: the host/mobile bridge and the composite.
//
// The registry's ordering rules are in Note [Pressure event ordering]
// (internal/pressure_listeners.h). The composite follows the reference
// (docs/memory.md "Pressure levels and sources"): it keeps
// each started child's last event, and fans out only when the worst level
// changes; it records the outgoing event under its own lock so that two
// children reporting at once cannot deliver "low" after "critical".
#include "arbiter/memory/memory_pressure.h"

#include <cstdio>
#include <exception>

#include "memory/internal/pressure_listeners.h"

namespace arbiter {

std::string_view MemoryPressureLevelName(MemoryPressureLevel level) {
  switch (level) {
    case MemoryPressureLevel::kNominal: return "nominal";
    case MemoryPressureLevel::kLow: return "low";
    case MemoryPressureLevel::kCritical: return "critical";
  }
  return "nominal";
}

Result<MemoryPressureLevel> ParseMemoryPressureLevel(std::string_view name) {
  if (name == "nominal") return MemoryPressureLevel::kNominal;
  if (name == "low") return MemoryPressureLevel::kLow;
  if (name == "critical") return MemoryPressureLevel::kCritical;
  return InvalidArgumentError("unknown memory pressure level \"" + std::string(name) +
                              "\"; use one of nominal, low, critical");
}

MemoryPressureLevel ClassifyFreeFraction(double free_fraction, double low_fraction,
                                         double critical_fraction) {
  if (free_fraction <= critical_fraction) return MemoryPressureLevel::kCritical;
  if (free_fraction <= low_fraction) return MemoryPressureLevel::kLow;
  return MemoryPressureLevel::kNominal;
}

namespace internal {

void EmitPressureWarning(const PressureWarningSink& sink, std::string_view warning) {
  if (sink) {
    sink(warning);
    return;
  }
  std::fprintf(stderr, "arbiter: warning: %.*s\n", static_cast<int>(warning.size()),
               warning.data());
}

MemoryPressureSubscription PressureListeners::Subscribe(MemoryPressureListener listener) {
  auto entry = std::make_shared<Entry>(std::move(listener));
  std::optional<MemoryPressureEvent> replay;
  uint64_t replay_seq = 0;
  {
    MutexLock l(&mu_);
    entries_.push_back(entry);
    replay = last_;
    replay_seq = last_seq_;
  }
  std::weak_ptr<PressureListeners> weak = weak_from_this();
  MemoryPressureSubscription sub([weak, entry] {
    if (auto self = weak.lock()) self->Unsubscribe(entry);
  });
  if (replay) DeliverOne(entry, replay_seq, *replay);
  return sub;
}

PressureListeners::Pending PressureListeners::Record(MemoryPressureEvent event) {
  Pending p;
  MutexLock l(&mu_);
  p.seq = next_seq_++;
  last_ = event;
  last_seq_ = p.seq;
  p.event = std::move(event);
  p.targets = entries_;
  return p;
}

void PressureListeners::Deliver(const Pending& pending) {
  for (const auto& entry : pending.targets) DeliverOne(entry, pending.seq, pending.event);
}

void PressureListeners::DeliverOne(const std::shared_ptr<Entry>& entry, uint64_t seq,
                                   const MemoryPressureEvent& event) {
  std::string error;
  {
    MutexLock l(&entry->call_mu);
    if (entry->removed.load() || seq <= entry->delivered_seq) return;
    entry->delivered_seq = seq;
    entry->calling_thread.store(std::this_thread::get_id());
    try {
      entry->listener(event);
    } catch (const std::exception& e) {
      error = e.what();
      if (error.empty()) error = "std::exception";
    } catch (...) {
      error = "a non-standard exception";
    }
    entry->calling_thread.store(std::thread::id());
  }
  if (!error.empty()) {
    Unsubscribe(entry);
    EmitPressureWarning(warn_, "memory pressure listener threw (" + error +
                                   ") on a \"" + std::string(MemoryPressureLevelName(event.level)) +
                                   "\" event from " + event.source + "; it was unsubscribed");
  }
}

void PressureListeners::Unsubscribe(const std::shared_ptr<Entry>& entry) {
  {
    MutexLock l(&mu_);
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (*it == entry) {
        entries_.erase(it);
        break;
      }
    }
  }
  entry->removed.store(true);
  // Wait for a call in flight on another thread; never for our own.
  if (entry->calling_thread.load() != std::this_thread::get_id()) {
    MutexLock l(&entry->call_mu);
  }
}

std::optional<MemoryPressureEvent> PressureListeners::last() const {
  MutexLock l(&mu_);
  return last_;
}

size_t PressureListeners::size() const {
  MutexLock l(&mu_);
  return entries_.size();
}

}  // namespace internal

// ---------------------------------------------------------------- bridge

BridgePressureSource::BridgePressureSource(std::string id, Clock* clock, PressureWarningSink warn)
    : id_(std::move(id)),
      clock_(clock ? clock : Clock::Real()),
      listeners_(std::make_shared<internal::PressureListeners>(std::move(warn))) {
  MemoryPressureEvent initial;
  initial.source = id_;
  initial.at_ms = clock_->NowMs();
  (void)listeners_->Record(std::move(initial));  // nobody to deliver to yet
}

BridgePressureSource::~BridgePressureSource() = default;

MemoryPressureSubscription BridgePressureSource::Subscribe(MemoryPressureListener listener) {
  return listeners_->Subscribe(std::move(listener));
}

MemoryPressureEvent BridgePressureSource::Current() {
  auto last = listeners_->last();
  return last ? *last : MemoryPressureEvent{};
}

void BridgePressureSource::Dispatch(MemoryPressureLevel level,
                                    std::optional<uint64_t> free_bytes) {
  MemoryPressureEvent e;
  e.level = level;
  e.free_bytes = free_bytes;
  e.source = id_;
  e.at_ms = clock_->NowMs();
  listeners_->Publish(std::move(e));
}

// ---------------------------------------------------------------- composite

CompositePressureSource::CompositePressureSource(
    std::vector<std::unique_ptr<MemoryPressureSource>> children, std::string id, Clock* clock,
    PressureWarningSink warn)
    : id_(std::move(id)),
      clock_(clock ? clock : Clock::Real()),
      children_(std::move(children)),
      listeners_(std::make_shared<internal::PressureListeners>(std::move(warn))) {
  {
    MutexLock l(&mu_);
    active_.assign(children_.size(), false);
    last_.assign(children_.size(), std::nullopt);
    (void)listeners_->Record(WorstLocked());  // the nominal starting point
  }
  child_subs_.reserve(children_.size());
  for (size_t i = 0; i < children_.size(); ++i) {
    child_subs_.push_back(
        children_[i]->Subscribe([this, i](const MemoryPressureEvent& e) { OnChildEvent(i, e); }));
  }
}

CompositePressureSource::~CompositePressureSource() {
  Stop();
  for (auto& s : child_subs_) s.Reset();
}

MemoryPressureSubscription CompositePressureSource::Subscribe(MemoryPressureListener listener) {
  return listeners_->Subscribe(std::move(listener));
}

MemoryPressureEvent CompositePressureSource::WorstLocked() const {
  const MemoryPressureEvent* worst = nullptr;
  for (size_t i = 0; i < children_.size(); ++i) {
    if (!active_[i] || !last_[i]) continue;
    if (worst == nullptr || static_cast<int>(last_[i]->level) > static_cast<int>(worst->level)) {
      worst = &*last_[i];
    }
  }
  if (worst != nullptr) return *worst;
  MemoryPressureEvent nominal;
  nominal.source = id_;
  nominal.at_ms = clock_->NowMs();
  return nominal;
}

void CompositePressureSource::OnChildEvent(size_t index, const MemoryPressureEvent& event) {
  internal::PressureListeners::Pending pending;
  {
    MutexLock l(&mu_);
    last_[index] = event;
    if (!active_[index]) return;
    MemoryPressureEvent worst = WorstLocked();
    if (worst.level == worst_) return;
    worst_ = worst.level;
    pending = listeners_->Record(std::move(worst));
  }
  listeners_->Deliver(pending);
}

Status CompositePressureSource::Start() {
  {
    MutexLock l(&mu_);
    if (started_) return OkStatus();
    started_ = true;
    errors_.clear();
  }
  // Children start outside our lock: their Start() may publish, which calls
  // OnChildEvent.
  std::vector<bool> ok(children_.size(), false);
  std::vector<std::pair<std::string, Status>> errors;
  for (size_t i = 0; i < children_.size(); ++i) {
    Status s = children_[i]->Start();
    if (s.ok()) {
      ok[i] = true;
    } else {
      errors.emplace_back(children_[i]->id(), std::move(s));
    }
  }
  internal::PressureListeners::Pending pending;
  bool fire = false;
  Status result;
  {
    MutexLock l(&mu_);
    active_ = ok;
    errors_ = errors;
    MemoryPressureEvent worst = WorstLocked();
    if (worst.level != worst_) {
      worst_ = worst.level;
      pending = listeners_->Record(std::move(worst));
      fire = true;
    }
    if (!children_.empty() && errors.size() == children_.size()) {
      std::string msg = "no memory pressure source of \"" + id_ + "\" could start:";
      for (const auto& [child, st] : errors) msg += " [" + child + ": " + st.ToString() + "]";
      result = UnavailableError(std::move(msg));
    }
  }
  if (fire) listeners_->Deliver(pending);
  return result;
}

void CompositePressureSource::Stop() {
  std::vector<bool> was_active;
  {
    MutexLock l(&mu_);
    if (!started_) return;
    started_ = false;
    was_active = active_;
  }
  for (size_t i = 0; i < children_.size(); ++i) {
    if (was_active[i]) children_[i]->Stop();
  }
  MutexLock l(&mu_);
  active_.assign(children_.size(), false);
}

MemoryPressureEvent CompositePressureSource::Current() {
  std::vector<bool> active;
  {
    MutexLock l(&mu_);
    active = active_;
  }
  std::optional<MemoryPressureEvent> worst;
  for (size_t i = 0; i < children_.size(); ++i) {
    if (!active[i]) continue;
    MemoryPressureEvent e = children_[i]->Current();
    if (!worst || static_cast<int>(e.level) > static_cast<int>(worst->level)) worst = std::move(e);
  }
  if (worst) return *worst;
  MemoryPressureEvent nominal;
  nominal.source = id_;
  nominal.at_ms = clock_->NowMs();
  return nominal;
}

std::vector<std::pair<std::string, Status>> CompositePressureSource::child_errors() const {
  MutexLock l(&mu_);
  return errors_;
}

}  // namespace arbiter
