// kv/conversation_registry.cc — conversations pinned to KV slots
// (docs/kv-precache.md "Slots and conversations").
//
// Invariants (under mu_): open_ = number of handles with closed == false;
// slots_[m].load[s] = open handles of model m on slot s; high_water_ =
// max over time of open_. A closed handle stays in handles_ (so a later Open
// creates a fresh one with a fresh slot choice) until it is replaced.
#include "arbiter/kv/conversation_registry.h"

#include <algorithm>

#include <fmt/format.h>

#include "arbiter/kv/cache_key.h"

namespace arbiter {
namespace {

std::string HandleKey(std::string_view model_id, std::string_view conversation_id) {
  return fmt::format("{}::{}", model_id, conversation_id);
}

}  // namespace

ConversationRegistry::ConversationRegistry(Clock* clock)
    : clock_(clock != nullptr ? clock : Clock::Real()) {}

Result<ConversationHandle> ConversationRegistry::Open(std::string_view model_id,
                                                      std::string_view conversation_id,
                                                      int parallel,
                                                      std::optional<int64_t> ttl_ms) {
  if (model_id.empty()) return InvalidArgumentError("conversation registry: empty model id");
  if (conversation_id.empty()) {
    return InvalidArgumentError("conversation registry: empty conversation id");
  }
  if (parallel < 1) {
    return InvalidArgumentError(
        fmt::format("conversation registry: parallel must be ≥ 1 (got {})", parallel));
  }
  if (ttl_ms && *ttl_ms <= 0) {
    return InvalidArgumentError(
        fmt::format("conversation registry: ttl must be > 0 ms (got {})", *ttl_ms));
  }
  const int64_t now = clock_->NowMs();
  const std::string key = HandleKey(model_id, conversation_id);
  MutexLock l(&mu_);
  if (auto it = handles_.find(key); it != handles_.end() && !it->second.closed) {
    it->second.last_used_ms = now;
    return it->second;
  }
  std::vector<int>& load = slots_[std::string(model_id)].load;
  if (static_cast<int>(load.size()) < parallel) load.resize(parallel, 0);
  // Lowest-loaded of [0, parallel), lowest index on ties.
  int slot = 0;
  bool all_equal = true;
  for (int s = 1; s < parallel; ++s) {
    if (load[s] != load[0]) all_equal = false;
    if (load[s] < load[slot]) slot = s;
  }
  if (all_equal && load[0] > 0) {
    slot = DeriveSlotId("conv:" + std::string(conversation_id), parallel);
  }
  load[slot]++;
  ConversationHandle h;
  h.conversation_id = std::string(conversation_id);
  h.model_id = std::string(model_id);
  h.slot_id = slot;
  h.opened_at_ms = now;
  h.last_used_ms = now;
  h.ttl_ms = ttl_ms.value_or(kDefaultConversationTtlMs);
  handles_[key] = h;
  open_++;
  high_water_ = std::max(high_water_, static_cast<int>(open_));
  return h;
}

std::optional<ConversationHandle> ConversationRegistry::Get(std::string_view model_id,
                                                            std::string_view conversation_id) {
  MutexLock l(&mu_);
  auto it = handles_.find(HandleKey(model_id, conversation_id));
  if (it == handles_.end() || it->second.closed) return std::nullopt;
  it->second.last_used_ms = clock_->NowMs();
  return it->second;
}

bool ConversationRegistry::Close(std::string_view model_id, std::string_view conversation_id) {
  MutexLock l(&mu_);
  auto it = handles_.find(HandleKey(model_id, conversation_id));
  if (it == handles_.end() || it->second.closed) return false;
  it->second.closed = true;
  std::vector<int>& load = slots_[it->second.model_id].load;
  if (it->second.slot_id >= 0 && it->second.slot_id < static_cast<int>(load.size())) {
    load[it->second.slot_id]--;
  }
  open_--;
  return true;
}

std::vector<ConversationHandle> ConversationRegistry::EvictIdle() {
  const int64_t now = clock_->NowMs();
  std::vector<ConversationHandle> dropped;
  MutexLock l(&mu_);
  for (auto& [key, h] : handles_) {
    if (h.closed || now - h.last_used_ms <= h.ttl_ms) continue;
    h.closed = true;
    std::vector<int>& load = slots_[h.model_id].load;
    if (h.slot_id >= 0 && h.slot_id < static_cast<int>(load.size())) load[h.slot_id]--;
    open_--;
    dropped.push_back(h);
  }
  std::sort(dropped.begin(), dropped.end(),
            [](const ConversationHandle& a, const ConversationHandle& b) {
              return a.last_used_ms < b.last_used_ms;
            });
  return dropped;
}

std::vector<ConversationHandle> ConversationRegistry::OpenHandles(std::string_view model_id) const {
  std::vector<ConversationHandle> out;
  MutexLock l(&mu_);
  for (const auto& [key, h] : handles_) {
    if (!h.closed && (model_id.empty() || h.model_id == model_id)) out.push_back(h);
  }
  std::sort(out.begin(), out.end(), [](const ConversationHandle& a, const ConversationHandle& b) {
    return a.model_id != b.model_id ? a.model_id < b.model_id : a.slot_id < b.slot_id;
  });
  return out;
}

size_t ConversationRegistry::OpenCount() const {
  MutexLock l(&mu_);
  return open_;
}

int ConversationRegistry::HighWater() const {
  MutexLock l(&mu_);
  return high_water_;
}

int ConversationRegistry::RecommendedParallel(int running) const {
  return RecommendedParallel(HighWater(), running);
}

int ConversationRegistry::RecommendedParallel(int high_water, int running) {
  const int headroom = std::max(2, (high_water + 3) / 4);  // ceil(hw × 0.25)
  return std::max(running, std::max(1, high_water + headroom));
}

}  // namespace arbiter
