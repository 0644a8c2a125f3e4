// MemoryArbiter, events: OnEvent() subscriptions and Emit(). Listeners live
// in a table with its own lock, shared with the subscriptions (a
// subscription may outlive the arbiter); Emit copies the table and calls
// each listener without any lock, so a listener may call the arbiter. A
// listener that throws is removed.
#include <exception>
#include <memory>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "internal/arbiter_impl.h"

namespace arbiter {
namespace arbiter_internal {

bool MemoryArbiterImpl::HasListeners() const {
  return listeners_->count.load(std::memory_order_acquire) > 0;
}

void MemoryArbiterImpl::Emit(const ArbiterEvent& event) {
  std::vector<std::pair<uint64_t, std::shared_ptr<ArbiterEventListener>>> copy;
  {
    MutexLock l(&listeners_->mu);
    if (listeners_->map.empty()) return;
    copy.assign(listeners_->map.begin(), listeners_->map.end());
  }
  for (auto& [id, fn] : copy) {
    bool failed = false;
    try {
      (*fn)(event);
    } catch (const std::exception& ex) {
      failed = true;
      spdlog::warn("arbiter: event listener threw ({}); removed", ex.what());
    } catch (...) {
      failed = true;
      spdlog::warn("arbiter: event listener threw; removed");
    }
    if (failed) {
      MutexLock l(&listeners_->mu);
      listeners_->map.erase(id);
      listeners_->count.store(listeners_->map.size(), std::memory_order_release);
    }
  }
}

ArbiterEventSubscription MemoryArbiterImpl::OnEvent(ArbiterEventListener listener) {
  uint64_t id;
  {
    MutexLock l(&listeners_->mu);
    id = listeners_->next_id++;
    listeners_->map.emplace(id, std::make_shared<ArbiterEventListener>(std::move(listener)));
    listeners_->count.store(listeners_->map.size(), std::memory_order_release);
  }
  std::weak_ptr<Listeners> weak = listeners_;
  return ArbiterEventSubscription([weak, id] {
    if (auto ls = weak.lock()) {
      MutexLock l(&ls->mu);
      ls->map.erase(id);
      ls->count.store(ls->map.size(), std::memory_order_release);
    }
  });
}

}  // namespace arbiter_internal
}  // namespace arbiter
