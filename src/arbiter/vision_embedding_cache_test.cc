#include "arbiter/arbiter/vision_embedding_cache.h"

#include <gtest/gtest.h>

#include <thread>

#include "arbiter/base/hash.h"

namespace arbiter {
namespace {

// An entry of `token_count` × `hidden_size` floats, filled with `fill`.
VisionEmbedding MakeEntry(size_t token_count, size_t hidden_size, float fill = 1.0f) {
  VisionEmbedding e;
  e.tokens = std::make_shared<const std::vector<float>>(token_count * hidden_size, fill);
  e.token_count = token_count;
  e.hidden_size = hidden_size;
  return e;
}

std::vector<std::string> Hashes(const VisionEmbeddingCache& cache) {
  std::vector<std::string> out;
  for (const VisionCacheEntryInfo& e : cache.Snapshot()) out.push_back(e.hash);
  return out;
}

// ---------------------------------------------------------------------------
// The reference implementation's vision-cache tests.

TEST(VisionEmbeddingCacheTest, MissReturnsNull) {
  SimulatedClock clock(1000);
  VisionEmbeddingCache cache({.clock = &clock});
  EXPECT_FALSE(cache.Get("nope").has_value());
  EXPECT_EQ(cache.size(), 0u);
}

TEST(VisionEmbeddingCacheTest, HitReturnsTheSameBuffer) {
  SimulatedClock clock(1000);
  VisionEmbeddingCache cache({.clock = &clock});
  VisionEmbedding e = MakeEntry(4, 8, 0.5f);
  const std::vector<float>* buffer = e.tokens.get();
  ASSERT_TRUE(cache.Set("h1", e).ok());
  std::optional<VisionEmbedding> hit = cache.Get("h1");
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->tokens.get(), buffer);  // not a copy
  EXPECT_EQ(hit->token_count, 4u);
  EXPECT_EQ(hit->hidden_size, 8u);
  EXPECT_EQ(cache.Stats().hits, 1u);
}

TEST(VisionEmbeddingCacheTest, LruWithCapacityTwoEvictsTheUntouchedEntry) {
  SimulatedClock clock(1000);
  VisionEmbeddingCache cache({.capacity = 2, .clock = &clock});
  ASSERT_TRUE(cache.Set("a", MakeEntry(1, 2)).ok());
  ASSERT_TRUE(cache.Set("b", MakeEntry(1, 2)).ok());
  ASSERT_TRUE(cache.Get("a").has_value());  // touch a: b is now LRU
  ASSERT_TRUE(cache.Set("c", MakeEntry(1, 2)).ok());
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_TRUE(cache.Get("a").has_value());
  EXPECT_FALSE(cache.Get("b").has_value());
  EXPECT_TRUE(cache.Get("c").has_value());
  EXPECT_EQ(cache.Stats().evictions, 1u);
}

TEST(VisionEmbeddingCacheTest, TtlExpiresAndGetDeletesTheEntry) {
  SimulatedClock clock(1000);
  VisionEmbeddingCache cache({.clock = &clock});
  ASSERT_TRUE(cache.Set("h", MakeEntry(2, 2), 100).ok());
  clock.SetMs(1050);
  EXPECT_TRUE(cache.Get("h").has_value());
  clock.SetMs(1500);
  EXPECT_FALSE(cache.Get("h").has_value());
  EXPECT_EQ(cache.size(), 0u);  // deleted on read
  EXPECT_EQ(cache.Stats().expirations, 1u);
}

TEST(VisionEmbeddingCacheTest, PurgeExpiredCountsRemovedEntries) {
  SimulatedClock clock(1000);
  VisionEmbeddingCache cache({.clock = &clock});
  ASSERT_TRUE(cache.Set("short1", MakeEntry(1, 1), 100).ok());
  ASSERT_TRUE(cache.Set("short2", MakeEntry(1, 1), 200).ok());
  ASSERT_TRUE(cache.Set("long", MakeEntry(1, 1), 10000).ok());
  EXPECT_EQ(cache.PurgeExpired(1000), 0u);
  EXPECT_EQ(cache.PurgeExpired(1500), 2u);
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_EQ(Hashes(cache), std::vector<std::string>{"long"});
  clock.SetMs(20000);
  EXPECT_EQ(cache.PurgeExpired(), 1u);  // uses the clock
  EXPECT_EQ(cache.size(), 0u);
}

TEST(VisionEmbeddingCacheTest, LengthMismatchFails) {
  SimulatedClock clock(1000);
  VisionEmbeddingCache cache({.clock = &clock});
  VisionEmbedding e = MakeEntry(4, 8);
  e.hidden_size = 9;
  Status s = cache.Set("h", e);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("does not match tokenCount*hiddenSize"), std::string::npos)
      << s.message();
  EXPECT_EQ(cache.size(), 0u);
  VisionEmbedding null_tokens;
  null_tokens.token_count = 1;
  null_tokens.hidden_size = 1;
  EXPECT_EQ(cache.Set("h", null_tokens).code(), StatusCode::kInvalidArgument);
  // Overflowing geometry is a mismatch, not a wrap-around match.
  VisionEmbedding huge = MakeEntry(0, 0);
  huge.token_count = SIZE_MAX / 2 + 1;
  huge.hidden_size = 2;  // product wraps to 0 == tokens->size()
  EXPECT_EQ(cache.Set("h", huge).code(), StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------
// The rest of the semantics in vision_embedding_cache.h.

TEST(VisionEmbeddingCacheTest, DefaultsAndClamping) {
  VisionEmbeddingCache defaults;
  EXPECT_EQ(defaults.capacity(), 32);
  EXPECT_EQ(defaults.default_ttl_ms(), 300000);
  VisionEmbeddingCache clamped({.capacity = 0, .default_ttl_ms = -5});
  EXPECT_EQ(clamped.capacity(), 1);
  EXPECT_EQ(clamped.default_ttl_ms(), 0);
  VisionEmbeddingCache negative({.capacity = -3});
  EXPECT_EQ(negative.capacity(), 1);
}

TEST(VisionEmbeddingCacheTest, DefaultCapacityHolds32Entries) {
  SimulatedClock clock(0);
  VisionEmbeddingCache cache({.clock = &clock});
  for (int i = 0; i < 33; ++i) ASSERT_TRUE(cache.Set("h" + std::to_string(i), MakeEntry(1, 1)).ok());
  EXPECT_EQ(cache.size(), 32u);
  EXPECT_FALSE(cache.Get("h0").has_value());
  EXPECT_TRUE(cache.Get("h1").has_value());
}

TEST(VisionEmbeddingCacheTest, NonPositiveTtlUsesTheDefault) {
  SimulatedClock clock(1000);
  VisionEmbeddingCache cache({.default_ttl_ms = 500, .clock = &clock});
  ASSERT_TRUE(cache.Set("none", MakeEntry(1, 1)).ok());
  ASSERT_TRUE(cache.Set("zero", MakeEntry(1, 1), 0).ok());
  ASSERT_TRUE(cache.Set("negative", MakeEntry(1, 1), -7).ok());
  ASSERT_TRUE(cache.Set("own", MakeEntry(1, 1), 50).ok());
  for (const VisionCacheEntryInfo& e : cache.Snapshot()) {
    EXPECT_EQ(e.expires_at_ms, e.hash == "own" ? 1050 : 1500) << e.hash;
  }
}

TEST(VisionEmbeddingCacheTest, DefaultTtlFiveMinutes) {
  SimulatedClock clock(0);
  VisionEmbeddingCache cache({.clock = &clock});
  ASSERT_TRUE(cache.Set("h", MakeEntry(1, 1)).ok());
  clock.SetMs(299999);
  EXPECT_TRUE(cache.Get("h").has_value());
  clock.SetMs(300000);
  EXPECT_FALSE(cache.Get("h").has_value());  // expired when expires_at ≤ now
}

TEST(VisionEmbeddingCacheTest, ZeroDefaultTtlExpiresImmediately) {
  SimulatedClock clock(1000);
  VisionEmbeddingCache cache({.default_ttl_ms = 0, .clock = &clock});
  ASSERT_TRUE(cache.Set("h", MakeEntry(1, 1)).ok());
  EXPECT_FALSE(cache.Get("h").has_value());
}

TEST(VisionEmbeddingCacheTest, SetReplacesAndMovesToMostRecentlyUsed) {
  SimulatedClock clock(1000);
  VisionEmbeddingCache cache({.capacity = 2, .clock = &clock});
  ASSERT_TRUE(cache.Set("a", MakeEntry(1, 1, 1.0f)).ok());
  ASSERT_TRUE(cache.Set("b", MakeEntry(1, 1)).ok());
  ASSERT_TRUE(cache.Set("a", MakeEntry(2, 3, 7.0f), 10).ok());  // a becomes MRU
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(Hashes(cache), (std::vector<std::string>{"b", "a"}));
  std::optional<VisionEmbedding> a = cache.Get("a");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->token_count, 2u);
  EXPECT_EQ((*a->tokens)[0], 7.0f);
  ASSERT_TRUE(cache.Set("c", MakeEntry(1, 1)).ok());
  EXPECT_FALSE(cache.Get("b").has_value());
}

TEST(VisionEmbeddingCacheTest, SnapshotListsLruFirstWithBytesAndExpiry) {
  SimulatedClock clock(1000);
  VisionEmbeddingCache cache({.clock = &clock});
  ASSERT_TRUE(cache.Set("a", MakeEntry(2, 4), 100).ok());
  clock.AdvanceMs(10);
  ASSERT_TRUE(cache.Set("b", MakeEntry(1, 4), 200).ok());
  ASSERT_TRUE(cache.Get("a").has_value());
  std::vector<VisionCacheEntryInfo> snap = cache.Snapshot();
  ASSERT_EQ(snap.size(), 2u);
  EXPECT_EQ(snap[0].hash, "b");
  EXPECT_EQ(snap[0].bytes, 16u);
  EXPECT_EQ(snap[0].expires_at_ms, 1210);
  EXPECT_EQ(snap[1].hash, "a");
  EXPECT_EQ(snap[1].bytes, 32u);
  EXPECT_EQ(snap[1].expires_at_ms, 1100);
  EXPECT_EQ(cache.Stats().bytes, 48u);
}

TEST(VisionEmbeddingCacheTest, ClearDropsEverythingButReturnedBuffersLive) {
  SimulatedClock clock(1000);
  VisionEmbeddingCache cache({.clock = &clock});
  ASSERT_TRUE(cache.Set("a", MakeEntry(2, 2, 3.0f)).ok());
  ASSERT_TRUE(cache.Set("b", MakeEntry(2, 2)).ok());
  std::optional<VisionEmbedding> held = cache.Get("a");
  cache.Clear();
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_FALSE(cache.Get("a").has_value());
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ((*held->tokens)[3], 3.0f);
}

// ---------------------------------------------------------------------------
// HashFrame

TEST(HashFrameTest, IsSha256OfLengthPrefixedFamilyAndBytes) {
  EXPECT_EQ(HashFrame("qwen3-vl", "pixels"), HexEncode(Sha256Of("8:qwen3-vlpixels")));
  EXPECT_EQ(HashFrame("qwen3-vl", "pixels").size(), 64u);
}

TEST(HashFrameTest, FamilyAndBytesBoundaryCannotCollide) {
  EXPECT_NE(HashFrame("ab", "c"), HashFrame("a", "bc"));
  EXPECT_NE(HashFrame("", "abc"), HashFrame("abc", ""));
  EXPECT_NE(HashFrame("qwen3-vl", "x"), HashFrame("gemma-vl", "x"));
  EXPECT_EQ(HashFrame("qwen3-vl", "x"), HashFrame("qwen3-vl", "x"));
  const unsigned char raw[] = {0, 1, 2, 255};
  EXPECT_EQ(HashFrame("f", raw, sizeof(raw)),
            HashFrame("f", std::string_view(reinterpret_cast<const char*>(raw), sizeof(raw))));
}

// ---------------------------------------------------------------------------
// Ledger accounting

uint64_t VisionBytes(const MemoryLedger& ledger) {
  MemoryLedgerSnapshot s = ledger.Snapshot();
  auto it = s.by_owner.find(std::string(kVisionCacheLedgerOwner));
  uint64_t owner_bytes = it == s.by_owner.end() ? 0 : it->second.total_bytes;
  EXPECT_EQ(owner_bytes, s.kind_bytes(ChargeKind::kVisionCache));
  return owner_bytes;
}

TEST(VisionEmbeddingCacheLedgerTest, EntriesAreChargedAndUnchargedOnEveryRemoval) {
  SimulatedClock clock(1000);
  MemoryLedger ledger(0);
  VisionEmbeddingCache cache({.capacity = 2, .clock = &clock, .ledger = &ledger});
  ASSERT_TRUE(cache.Set("a", MakeEntry(10, 10), 100).ok());  // 400 bytes
  EXPECT_EQ(VisionBytes(ledger), 400u);
  ASSERT_TRUE(cache.Set("b", MakeEntry(5, 10), 10000).ok());  // 200 bytes
  EXPECT_EQ(VisionBytes(ledger), 600u);
  // Replace: the difference only.
  ASSERT_TRUE(cache.Set("b", MakeEntry(1, 10), 10000).ok());  // 40 bytes
  EXPECT_EQ(VisionBytes(ledger), 440u);
  EXPECT_EQ(ledger.Snapshot().live_charges, 2u);
  // Expiry via Get.
  clock.SetMs(1100);
  EXPECT_FALSE(cache.Get("a").has_value());
  EXPECT_EQ(VisionBytes(ledger), 40u);
  // Capacity eviction.
  ASSERT_TRUE(cache.Set("c", MakeEntry(1, 1)).ok());
  ASSERT_TRUE(cache.Set("d", MakeEntry(1, 1)).ok());  // evicts b
  EXPECT_EQ(VisionBytes(ledger), 8u);
  // PurgeExpired.
  EXPECT_EQ(cache.PurgeExpired(1000000), 2u);
  EXPECT_EQ(VisionBytes(ledger), 0u);
  // Clear.
  ASSERT_TRUE(cache.Set("e", MakeEntry(3, 3)).ok());
  EXPECT_EQ(VisionBytes(ledger), 36u);
  cache.Clear();
  EXPECT_EQ(ledger.charged_bytes(), 0u);
}

TEST(VisionEmbeddingCacheLedgerTest, DestructorUncharges) {
  MemoryLedger ledger(0);
  {
    SimulatedClock clock(0);
    VisionEmbeddingCache cache({.clock = &clock, .ledger = &ledger});
    ASSERT_TRUE(cache.Set("a", MakeEntry(8, 8)).ok());
    EXPECT_EQ(ledger.charged_bytes(), 256u);
  }
  EXPECT_EQ(ledger.charged_bytes(), 0u);
}

TEST(VisionEmbeddingCacheLedgerTest, FullLedgerEvictsOwnEntriesExpiredFirstThenLru) {
  SimulatedClock clock(1000);
  MemoryLedger ledger(1000);
  VisionEmbeddingCache cache({.clock = &clock, .ledger = &ledger});
  ASSERT_TRUE(cache.Set("old", MakeEntry(100, 1), 10000).ok());   // 400
  ASSERT_TRUE(cache.Set("stale", MakeEntry(100, 1), 10).ok());    // 400, expires 1010
  clock.SetMs(2000);
  // 400 more does not fit (800 + 400 > 1000); the expired one goes first.
  ASSERT_TRUE(cache.Set("new", MakeEntry(100, 1)).ok());
  EXPECT_EQ(Hashes(cache), (std::vector<std::string>{"old", "new"}));
  EXPECT_EQ(ledger.charged_bytes(), 800u);
  // Again: nothing expired, so the LRU ("old") goes.
  ASSERT_TRUE(cache.Set("newer", MakeEntry(100, 1)).ok());
  EXPECT_EQ(Hashes(cache), (std::vector<std::string>{"new", "newer"}));
  EXPECT_LE(ledger.charged_bytes(), 1000u);
  EXPECT_EQ(ledger.Snapshot().over_commits, 0u);
}

TEST(VisionEmbeddingCacheLedgerTest, EntryLargerThanTheRoomIsRefusedAndNothingCached) {
  SimulatedClock clock(1000);
  MemoryLedger ledger(1000);
  MemoryCharge weights = ledger.Charge("text::demo-chat", ChargeKind::kDeviceWeights, 900);
  VisionEmbeddingCache cache({.clock = &clock, .ledger = &ledger});
  ASSERT_TRUE(cache.Set("small", MakeEntry(10, 1)).ok());  // 40
  Status s = cache.Set("big", MakeEntry(100, 1));           // 400 never fits
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("big"), std::string::npos) << s.message();
  EXPECT_FALSE(cache.Get("big").has_value());
  EXPECT_EQ(cache.size(), 0u);  // "small" was evicted trying to make room
  EXPECT_EQ(ledger.charged_bytes(), 900u);
  EXPECT_EQ(cache.Stats().ledger_refusals, 1u);
}

TEST(VisionEmbeddingCacheLedgerTest, RefusedReplacementKeepsTheOldEntry) {
  SimulatedClock clock(1000);
  MemoryLedger ledger(100);
  VisionEmbeddingCache cache({.clock = &clock, .ledger = &ledger});
  ASSERT_TRUE(cache.Set("a", MakeEntry(10, 1, 2.0f)).ok());  // 40
  EXPECT_EQ(cache.Set("a", MakeEntry(50, 1)).code(), StatusCode::kResourceExhausted);
  std::optional<VisionEmbedding> a = cache.Get("a");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->token_count, 10u);
  EXPECT_EQ(ledger.charged_bytes(), 40u);
  // A replacement that fits by its difference succeeds.
  ASSERT_TRUE(cache.Set("a", MakeEntry(25, 1)).ok());  // 100
  EXPECT_EQ(ledger.charged_bytes(), 100u);
}

TEST(VisionEmbeddingCacheLedgerTest, ConcurrentUseKeepsLedgerInSync) {
  SimulatedClock clock(0);
  MemoryLedger ledger(4000);
  VisionEmbeddingCache cache({.capacity = 8, .clock = &clock, .ledger = &ledger});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&cache, &clock, t] {
      for (int i = 0; i < 2000; ++i) {
        std::string key = "k";
        key += std::to_string((i * 7 + t) % 20);
        switch (i % 5) {
          case 0:
          case 1: cache.Set(key, MakeEntry(1 + (i % 13), 8), 1 + (i % 50)).IgnoreError(); break;
          case 2:
          case 3: cache.Get(key); break;
          case 4:
            if (t == 0) clock.AdvanceMs(1);
            cache.PurgeExpired();
            break;
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  uint64_t sum = 0;
  for (const VisionCacheEntryInfo& e : cache.Snapshot()) sum += e.bytes;
  EXPECT_EQ(ledger.charged_bytes(), sum);
  EXPECT_LE(cache.size(), 8u);
  EXPECT_LE(ledger.Snapshot().peak_bytes, 4000u);
  cache.Clear();
  EXPECT_EQ(ledger.charged_bytes(), 0u);
}

// Another vision result (an OCR text) is cached as its own bytes.
TEST(VisionEmbeddingCacheTest, AnyResultIsCachedAndChargedAtItsSize) {
  MemoryLedger ledger(1 << 20);
  VisionEmbeddingCache cache({.ledger = &ledger});
  VisionEmbedding e;
  auto text = std::make_shared<const std::string>("Invoice 4711");
  e.result = text;
  e.result_bytes = 1000;
  ASSERT_TRUE(cache.Set("k", e).ok());
  EXPECT_EQ(ledger.charged_bytes(), 1000u);
  std::optional<VisionEmbedding> hit = cache.Get("k");
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->result.get(), text.get());
  EXPECT_EQ(cache.Set("empty", VisionEmbedding{}).code(), StatusCode::kInvalidArgument);
  cache.Clear();
  EXPECT_EQ(ledger.charged_bytes(), 0u);
}

}  // namespace
}  // namespace arbiter

