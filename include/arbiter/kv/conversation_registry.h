// arbiter/kv/conversation_registry.h — which conversation is pinned to which
// KV slot of which model.
//
// Implements the registry of docs/kv-precache.md "Slots and conversations"
// (the reference's conversationRegistry, pickLowestLoadedSlot, evictIdle,
// recommended parallel; seed 001 "PRECACHE").
//
// Concepts:
//   - A handle is keyed "<model_id>::<conversation_id>". Open() returns the
//     open handle (bumping last-used) or opens one on the model's
//     lowest-loaded slot (lowest index on ties; when every slot is equally
//     loaded and none is empty, the conversation's hashed slot,
//     DeriveSlotId("conv:<id>", parallel), so colliding conversations spread
//     the same way every time), counting it on that slot.
//   - Close() frees the slot's count (idempotent). EvictIdle() closes and
//     returns every handle unused for longer than its TTL (default 60 min),
//     for the caller to persist their KV first.
//   - HighWater() is the most conversations ever open at once; it never
//     decreases. RecommendedParallel(running) = max(running, max(1, hw +
//     max(2, ceil(hw / 4)))).
//
// Example:
//   ConversationRegistry reg(&clock);
//   ARBITER_ASSIGN_OR_RETURN(ConversationHandle h, reg.Open("qwen", "room-1", 4));
//   // h.slot_id in [0, 4); the same handle on every later Open.
//
// Thread safety: thread-safe (one mutex; handles are returned by value).
// Lifetime: the clock must outlive the registry.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "arbiter/base/clock.h"
#include "arbiter/base/mutex.h"
#include "arbiter/base/status.h"

namespace arbiter {

// Default conversation TTL: 60 min, the reference's (docs/kv-precache.md
// "Slots and conversations").
inline constexpr int64_t kDefaultConversationTtlMs = 3600000;

struct ConversationHandle {
  std::string conversation_id;
  std::string model_id;
  int slot_id = -1;          // in [0, parallel) of the Open that created it
  int64_t opened_at_ms = 0;  // registry clock
  int64_t last_used_ms = 0;
  int64_t ttl_ms = kDefaultConversationTtlMs;
  bool closed = false;
};

class ConversationRegistry {
 public:
  // `clock` null → Clock::Real().
  explicit ConversationRegistry(Clock* clock = nullptr);

  // The open handle of (model_id, conversation_id), last-used bumped; else a
  // new one on the lowest-loaded of `parallel` slots with TTL `ttl_ms`
  // (default kDefaultConversationTtlMs).
  // Errors: kInvalidArgument for an empty model or conversation id, or
  // parallel < 1, or ttl_ms ≤ 0.
  Result<ConversationHandle> Open(std::string_view model_id, std::string_view conversation_id,
                                  int parallel, std::optional<int64_t> ttl_ms = std::nullopt)
      EXCLUDES(mu_);
  // The open handle (last-used bumped), or nullopt when unknown or closed.
  std::optional<ConversationHandle> Get(std::string_view model_id,
                                        std::string_view conversation_id) EXCLUDES(mu_);
  // Closes the handle and frees its slot count. Returns whether it was open.
  bool Close(std::string_view model_id, std::string_view conversation_id) EXCLUDES(mu_);
  // Closes every handle with now − last_used > ttl and returns them (closed
  // = true), oldest first.
  std::vector<ConversationHandle> EvictIdle() EXCLUDES(mu_);

  // Open handles of `model_id` ("" = all models), by slot.
  std::vector<ConversationHandle> OpenHandles(std::string_view model_id = "") const EXCLUDES(mu_);
  size_t OpenCount() const EXCLUDES(mu_);
  int HighWater() const EXCLUDES(mu_);
  int RecommendedParallel(int running) const EXCLUDES(mu_);
  static int RecommendedParallel(int high_water, int running);

 private:
  struct Slots {
    std::vector<int> load;  // open conversations per slot
  };

  Clock* const clock_;
  mutable Mutex mu_;
  std::map<std::string, ConversationHandle, std::less<>> handles_ GUARDED_BY(mu_);
  std::map<std::string, Slots, std::less<>> slots_ GUARDED_BY(mu_);  // by model id
  size_t open_ GUARDED_BY(mu_) = 0;
  int high_water_ GUARDED_BY(mu_) = 0;
};

}  // namespace arbiter
