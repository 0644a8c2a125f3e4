// See event_stream.h, Note [Event stream lifetime].
#include "server/internal/event_stream.h"

#include <nlohmann/json.hpp>

namespace arbiter::server_internal {

void EventQueue::Push(const ArbiterEvent& event) {
  {
    MutexLock l(&mu_);
    if (closed_) return;
    if (queue_.size() >= capacity_) {
      queue_.pop_front();
      ++dropped_;
    }
    queue_.push_back(event);
  }
  cv_.Signal();
}

void EventQueue::Close() {
  {
    MutexLock l(&mu_);
    closed_ = true;
  }
  cv_.SignalAll();
}

bool EventQueue::closed() const {
  MutexLock l(&mu_);
  return closed_;
}

bool EventQueue::Wait(std::chrono::steady_clock::time_point deadline,
                      std::vector<ArbiterEvent>* out, uint64_t* dropped) {
  MutexLock l(&mu_);
  while (queue_.empty() && !closed_) {
    if (!cv_.WaitUntil(deadline)) break;
  }
  out->assign(queue_.begin(), queue_.end());
  queue_.clear();
  *dropped = dropped_;
  dropped_ = 0;
  return !closed_ || !out->empty();
}

std::string ArbiterEventJson(const ArbiterEvent& e) {
  nlohmann::json j;
  j["type"] = ArbiterEventTypeName(e.type);
  if (e.type == ArbiterEventType::kMemoryPressure) {
    j["level"] = MemoryPressureLevelName(e.level);
    j["source"] = e.source;
    if (e.free_bytes) j["free_bytes"] = *e.free_bytes;
  } else {
    j["capability"] = CapabilityName(e.capability);
    j["model_key"] = e.model_key;
    switch (e.type) {
      case ArbiterEventType::kModelLoad:
        j["load_ms"] = e.load_ms;
        break;
      case ArbiterEventType::kCapabilityRun:
        j["run_ms"] = e.run_ms;
        break;
      case ArbiterEventType::kEviction:
        j["reason"] = UnloadReasonName(e.reason);
        j["estimated_bytes"] = e.estimated_bytes;
        break;
      case ArbiterEventType::kModelUnload:
        j["reason"] = UnloadReasonName(e.reason);
        break;
      default:
        break;
    }
  }
  j["at_ms"] = e.at_ms;
  return j.dump();
}

std::string ArbiterEventFrame(const ArbiterEvent& e) {
  std::string frame = "event: ";
  frame += ArbiterEventTypeName(e.type);
  frame += "\ndata: ";
  frame += ArbiterEventJson(e);
  frame += "\n\n";
  return frame;
}

}  // namespace arbiter::server_internal
