// ConversationRegistry: the reference's tests of the registry
// (docs/kv-precache.md "Slots and conversations"), on a simulated clock.
#include "arbiter/kv/conversation_registry.h"

#include <atomic>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "arbiter/kv/cache_key.h"

namespace arbiter {
namespace {

TEST(ConversationRegistryTest, RepeatedOpenReturnsTheSameHandle) {
  SimulatedClock clock(1000);
  ConversationRegistry reg(&clock);
  Result<ConversationHandle> a = reg.Open("m", "room-1", 4);
  ASSERT_TRUE(a.ok());
  clock.AdvanceMs(50);
  Result<ConversationHandle> b = reg.Open("m", "room-1", 4);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->slot_id, a->slot_id);
  EXPECT_EQ(b->opened_at_ms, 1000);
  EXPECT_EQ(b->last_used_ms, 1050);
  EXPECT_EQ(reg.OpenCount(), 1u);
}

TEST(ConversationRegistryTest, AnotherModelIsAnotherHandle) {
  ConversationRegistry reg;
  ASSERT_TRUE(reg.Open("m1", "room-1", 4).ok());
  ASSERT_TRUE(reg.Open("m2", "room-1", 4).ok());
  EXPECT_EQ(reg.OpenCount(), 2u);
  ASSERT_TRUE(reg.Close("m1", "room-1"));
  EXPECT_TRUE(reg.Get("m2", "room-1").has_value());
  EXPECT_FALSE(reg.Get("m1", "room-1").has_value());
}

TEST(ConversationRegistryTest, ParallelFourGivesFourDistinctSlots) {
  ConversationRegistry reg;
  std::set<int> slots;
  for (int i = 0; i < 4; ++i) slots.insert(reg.Open("m", "c" + std::to_string(i), 4)->slot_id);
  EXPECT_EQ(slots, (std::set<int>{0, 1, 2, 3}));
  // All equally loaded and non-empty: the hashed slot.
  Result<ConversationHandle> fifth = reg.Open("m", "c4", 4);
  ASSERT_TRUE(fifth.ok());
  EXPECT_EQ(fifth->slot_id, DeriveSlotId("conv:c4", 4));
}

TEST(ConversationRegistryTest, AFreedSlotIsReused) {
  ConversationRegistry reg;
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(reg.Open("m", "c" + std::to_string(i), 4).ok());
  const int freed = reg.Get("m", "c2")->slot_id;
  EXPECT_TRUE(reg.Close("m", "c2"));
  EXPECT_FALSE(reg.Close("m", "c2"));  // idempotent
  EXPECT_EQ(reg.Open("m", "new", 4)->slot_id, freed);
}

TEST(ConversationRegistryTest, EvictIdleDropsExpiredAndKeepsTheRest) {
  SimulatedClock clock(0);
  ConversationRegistry reg(&clock);
  ASSERT_TRUE(reg.Open("m", "short", 2, 1000).ok());
  ASSERT_TRUE(reg.Open("m", "long", 2, 60000).ok());
  clock.AdvanceMs(5000);
  std::vector<ConversationHandle> dropped = reg.EvictIdle();
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].conversation_id, "short");
  EXPECT_TRUE(dropped[0].closed);
  clock.AdvanceMs(5000);  // +10 000
  EXPECT_TRUE(reg.EvictIdle().empty());
  EXPECT_TRUE(reg.Get("m", "long").has_value());
  EXPECT_FALSE(reg.Get("m", "short").has_value());
}

TEST(ConversationRegistryTest, HighWaterNeverDecreases) {
  ConversationRegistry reg;
  for (const char* c : {"a", "b", "c"}) ASSERT_TRUE(reg.Open("m", c, 4).ok());
  for (const char* c : {"a", "b", "c"}) reg.Close("m", c);
  EXPECT_EQ(reg.HighWater(), 3);
  EXPECT_EQ(reg.OpenCount(), 0u);
}

TEST(ConversationRegistryTest, RecommendedParallel) {
  EXPECT_EQ(ConversationRegistry::RecommendedParallel(2, 4), 4);
  EXPECT_EQ(ConversationRegistry::RecommendedParallel(2, 8), 8);
  EXPECT_EQ(ConversationRegistry::RecommendedParallel(20, 0), 25);
  EXPECT_EQ(ConversationRegistry::RecommendedParallel(5, 0), 7);
  EXPECT_EQ(ConversationRegistry::RecommendedParallel(0, 0), 2);
}

TEST(ConversationRegistryTest, BadInputIsRefused) {
  ConversationRegistry reg;
  EXPECT_EQ(reg.Open("", "c", 2).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(reg.Open("m", "", 2).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(reg.Open("m", "c", 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(reg.Open("m", "c", 2, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(reg.OpenCount(), 0u);
}

TEST(ConversationRegistryTest, ConcurrentOpensAndClosesKeepTheCounts) {
  ConversationRegistry reg;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&reg, t] {
      for (int i = 0; i < 500; ++i) {
        const std::string c = std::to_string(t) + "-" + std::to_string(i % 10);
        ASSERT_TRUE(reg.Open("m", c, 4).ok());
        if (i % 3 == 0) reg.Close("m", c);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const std::vector<ConversationHandle> open = reg.OpenHandles("m");
  EXPECT_EQ(open.size(), reg.OpenCount());
  EXPECT_LE(reg.HighWater(), 40);
  for (const ConversationHandle& h : open) {
    EXPECT_GE(h.slot_id, 0);
    EXPECT_LT(h.slot_id, 4);
  }
}

}  // namespace
}  // namespace arbiter
