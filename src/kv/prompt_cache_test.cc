// PromptCache, the host tier: LRU within capacity and the ledger, spills,
// TTL on a simulated clock, and the ledger invariant under 4 threads.
#include "arbiter/kv/prompt_cache.h"

#include <atomic>
#include <cstdint>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "arbiter/base/mutex.h"
#include "kv/internal/test_fuse.h"

namespace arbiter {
namespace {

constexpr int64_t kMinuteMs = 60'000;

// n_tokens tokens all equal to `tag`, one layer, kv_dim 1:
// MemoryBytes() = 4·n + 8·n = 12·n.
KvSnapshot Snap(int n_tokens, int32_t tag = 1) {
  KvSnapshot s;
  s.n_layers = 1;
  s.kv_dim = 1;
  s.tokens.assign(static_cast<size_t>(n_tokens), tag);
  s.kv.assign(s.ExpectedKvBytes(), static_cast<uint8_t>(tag));  // f32 rows: 4 bytes
  return s;
}
constexpr uint64_t BytesOf(int n_tokens) { return 12 * static_cast<uint64_t>(n_tokens); }

struct Spilled {
  std::string model_key, conversation_id;
  TtlClass ttl;
  int n_tokens;
  int32_t tag;
  bool operator==(const Spilled&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Spilled& s) {
  return os << "{" << s.model_key << ", " << s.conversation_id << ", " << TtlClassName(s.ttl)
            << ", " << s.n_tokens << " tokens, tag " << s.tag << "}";
}

// Records every spill (thread-safe).
class SpillLog {
 public:
  std::function<void(const std::string&, const std::string&, TtlClass, KvSnapshot)> Callback() {
    return [this](const std::string& m, const std::string& c, TtlClass t, KvSnapshot s) {
      MutexLock l(&mu_);
      log_.push_back(
          Spilled{m, c, t, static_cast<int>(s.n_tokens()), s.tokens.empty() ? -1 : s.tokens[0]});
    };
  }
  std::vector<Spilled> Take() {
    MutexLock l(&mu_);
    std::vector<Spilled> out;
    out.swap(log_);
    return out;
  }

 private:
  Mutex mu_;
  std::vector<Spilled> log_ GUARDED_BY(mu_);
};

std::vector<std::string> Ids(const PromptCache& cache) {
  std::vector<std::string> out;
  for (const PromptCacheEntryInfo& e : cache.Entries()) out.push_back(e.conversation_id);
  return out;
}

uint64_t LedgerCacheBytes(const MemoryLedger& ledger) {
  return ledger.Snapshot().kind_bytes(ChargeKind::kPromptCache);
}

class PromptCacheTest : public ::testing::Test {
 protected:
  PromptCacheOptions Options(uint64_t capacity, MemoryLedger* ledger = nullptr) {
    PromptCacheOptions o;
    o.capacity_bytes = capacity;
    o.ledger = ledger;
    o.clock = &clock_;
    o.spill = spills_.Callback();
    return o;
  }

  SimulatedClock clock_{1000};
  SpillLog spills_;
};

TEST_F(PromptCacheTest, LruOrderAndCapacity) {
  PromptCache cache(Options(BytesOf(30)));
  EXPECT_EQ(cache.capacity(), BytesOf(30));
  EXPECT_TRUE(cache.Put("m", "a", TtlClass::kLong, Snap(10, 1)));
  EXPECT_TRUE(cache.Put("m", "b", TtlClass::kLong, Snap(10, 2)));
  EXPECT_TRUE(cache.Put("m", "c", TtlClass::kShort, Snap(10, 3)));
  EXPECT_EQ(Ids(cache), (std::vector<std::string>{"c", "b", "a"}));
  EXPECT_EQ(cache.bytes(), BytesOf(30));
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_TRUE(spills_.Take().empty());

  // Replacing b makes it the most recent; the old b is dropped, not spilled.
  EXPECT_TRUE(cache.Put("m", "b", TtlClass::kLong, Snap(5, 22)));
  EXPECT_EQ(Ids(cache), (std::vector<std::string>{"b", "c", "a"}));
  EXPECT_EQ(cache.bytes(), BytesOf(25));
  EXPECT_TRUE(spills_.Take().empty());
  EXPECT_EQ(cache.TokensOf("m", "b"), 5);

  // d needs 12 tokens of room: a (10) goes, then c (10).
  EXPECT_TRUE(cache.Put("m", "d", TtlClass::kExtended, Snap(17, 4)));
  EXPECT_EQ(Ids(cache), (std::vector<std::string>{"d", "b"}));
  EXPECT_EQ(spills_.Take(), (std::vector<Spilled>{{"m", "a", TtlClass::kLong, 10, 1},
                                                  {"m", "c", TtlClass::kShort, 10, 3}}));
  EXPECT_EQ(cache.bytes(), BytesOf(22));

  // Contains and TokensOf do not change the order; Take removes.
  EXPECT_TRUE(cache.Contains("m", "b"));
  EXPECT_FALSE(cache.Contains("m", "a"));
  EXPECT_FALSE(cache.Contains("other", "b"));
  EXPECT_EQ(cache.TokensOf("m", "a"), 0);
  EXPECT_EQ(Ids(cache), (std::vector<std::string>{"d", "b"}));
  std::optional<KvSnapshot> b = cache.Take("m", "b");
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->tokens, Snap(5, 22).tokens);
  EXPECT_EQ(b->kv, Snap(5, 22).kv);
  EXPECT_EQ(Ids(cache), (std::vector<std::string>{"d"}));
  EXPECT_FALSE(cache.Take("m", "b").has_value());
  cache.Erase("m", "d");
  cache.Erase("m", "nothing");
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_EQ(cache.bytes(), 0u);
  EXPECT_TRUE(spills_.Take().empty());
}

TEST_F(PromptCacheTest, EntriesDescribeEveryEntryMostRecentFirst) {
  PromptCache cache(Options(BytesOf(100)));
  cache.Put("m1", "a", TtlClass::kShort, Snap(3));
  clock_.AdvanceMs(250);
  cache.Put("m2", "a", TtlClass::kExtended, Snap(7));
  clock_.AdvanceMs(50);
  std::vector<PromptCacheEntryInfo> e = cache.Entries();
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0].model_key, "m2");
  EXPECT_EQ(e[0].conversation_id, "a");
  EXPECT_EQ(e[0].ttl_class, TtlClass::kExtended);
  EXPECT_EQ(e[0].n_tokens, 7);
  EXPECT_EQ(e[0].bytes, BytesOf(7));
  EXPECT_EQ(e[0].age_ms, 50);
  EXPECT_EQ(e[1].model_key, "m1");
  EXPECT_EQ(e[1].ttl_class, TtlClass::kShort);
  EXPECT_EQ(e[1].n_tokens, 3);
  EXPECT_EQ(e[1].age_ms, 300);
  // Keys of two fields never collide.
  cache.Put("ab", "c", TtlClass::kLong, Snap(1, 1));
  cache.Put("a", "bc", TtlClass::kLong, Snap(1, 2));
  EXPECT_EQ(cache.size(), 4u);
}

TEST_F(PromptCacheTest, OversizedEntriesAndCapacityZeroSpillDirectly) {
  PromptCache cache(Options(BytesOf(10)));
  EXPECT_TRUE(cache.Put("m", "a", TtlClass::kLong, Snap(4, 1)));
  EXPECT_FALSE(cache.Put("m", "big", TtlClass::kShort, Snap(11, 2)));
  EXPECT_EQ(Ids(cache), (std::vector<std::string>{"a"}));  // the others stay
  EXPECT_EQ(spills_.Take(), (std::vector<Spilled>{{"m", "big", TtlClass::kShort, 11, 2}}));
  // An oversized replacement drops the older in-RAM state and spills the new one.
  EXPECT_FALSE(cache.Put("m", "a", TtlClass::kLong, Snap(12, 3)));
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_EQ(spills_.Take(), (std::vector<Spilled>{{"m", "a", TtlClass::kLong, 12, 3}}));

  MemoryLedger ledger;
  PromptCache off(Options(0, &ledger));
  EXPECT_EQ(off.capacity(), 0u);
  EXPECT_FALSE(off.Put("m", "a", TtlClass::kLong, Snap(1, 5)));
  EXPECT_FALSE(off.Put("m", "empty", TtlClass::kLong, Snap(0, 5)));
  EXPECT_EQ(off.size(), 0u);
  EXPECT_EQ(ledger.charged_bytes(), 0u);
  EXPECT_EQ(spills_.Take(), (std::vector<Spilled>{{"m", "a", TtlClass::kLong, 1, 5},
                                                  {"m", "empty", TtlClass::kLong, 0, -1}}));
  EXPECT_EQ(off.counters().spilled, 2u);
  EXPECT_EQ(off.counters().puts, 2u);

  // Without a callback, what would be spilled is dropped.
  PromptCacheOptions o = Options(BytesOf(1));
  o.spill = nullptr;
  PromptCache dropping(std::move(o));
  EXPECT_TRUE(dropping.Put("m", "a", TtlClass::kLong, Snap(1)));
  EXPECT_TRUE(dropping.Put("m", "b", TtlClass::kLong, Snap(1)));
  EXPECT_EQ(Ids(dropping), (std::vector<std::string>{"b"}));
  EXPECT_EQ(dropping.counters().spilled, 1u);
}

TEST_F(PromptCacheTest, LedgerChargeEqualsBytesAtEveryStep) {
  MemoryLedger ledger(BytesOf(100));
  PromptCache cache(Options(BytesOf(50), &ledger));
  auto check = [&](int line) {
    EXPECT_EQ(LedgerCacheBytes(ledger), cache.bytes()) << "line " << line;
    uint64_t sum = 0;
    for (const PromptCacheEntryInfo& e : cache.Entries()) sum += e.bytes;
    EXPECT_EQ(sum, cache.bytes()) << "line " << line;
  };
  cache.Put("m1", "a", TtlClass::kLong, Snap(10));
  check(__LINE__);
  cache.Put("m2", "b", TtlClass::kLong, Snap(20));
  check(__LINE__);
  MemoryLedgerSnapshot snap = ledger.Snapshot();
  EXPECT_EQ(
      snap.by_owner.at("prompt_cache:m1").by_kind[static_cast<size_t>(ChargeKind::kPromptCache)],
      BytesOf(10));
  EXPECT_EQ(snap.by_owner.at(PromptCacheLedgerOwner("m2")).total_bytes, BytesOf(20));
  cache.Put("m1", "a", TtlClass::kLong, Snap(15));  // replacement: re-charged at the new size
  check(__LINE__);
  cache.Put("m1", "c", TtlClass::kLong, Snap(36));  // over capacity: b, then a spilled
  check(__LINE__);
  EXPECT_EQ(Ids(cache), (std::vector<std::string>{"c"}));
  EXPECT_EQ(cache.Take("m1", "c")->n_tokens(), 36u);  // Take uncharges
  check(__LINE__);
  EXPECT_EQ(ledger.charged_bytes(), 0u);
  cache.Put("m1", "a", TtlClass::kLong, Snap(5));
  cache.Put("m1", "b", TtlClass::kLong, Snap(5));
  cache.Erase("m1", "a");
  check(__LINE__);
  EXPECT_EQ(cache.Spill(1), BytesOf(5));
  check(__LINE__);
  EXPECT_EQ(ledger.charged_bytes(), 0u);
}

TEST_F(PromptCacheTest, LedgerRefusalEvictsThenSpills) {
  MemoryLedger ledger(BytesOf(100));
  PromptCache cache(Options(BytesOf(1000), &ledger));
  // Someone else holds 60 of the 100.
  Result<MemoryCharge> other =
      ledger.TryCharge("text::qwen", ChargeKind::kDeviceWeights, BytesOf(60));
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(cache.Put("m", "a", TtlClass::kLong, Snap(10, 1)));
  EXPECT_TRUE(cache.Put("m", "b", TtlClass::kLong, Snap(10, 2)));
  EXPECT_TRUE(cache.Put("m", "c", TtlClass::kLong, Snap(10, 3)));
  EXPECT_TRUE(spills_.Take().empty());
  // 30 + 60 charged; d (25) fits once a and b are gone.
  EXPECT_TRUE(cache.Put("m", "d", TtlClass::kLong, Snap(25, 4)));
  EXPECT_EQ(Ids(cache), (std::vector<std::string>{"d", "c"}));
  EXPECT_EQ(spills_.Take(), (std::vector<Spilled>{{"m", "a", TtlClass::kLong, 10, 1},
                                                  {"m", "b", TtlClass::kLong, 10, 2}}));
  EXPECT_EQ(LedgerCacheBytes(ledger), cache.bytes());
  // e (45) could not fit even with the whole cache gone (the ledger's 5
  // free + the cache's 35 = 40 < 45): spilled itself, the others kept.
  EXPECT_FALSE(cache.Put("m", "e", TtlClass::kShort, Snap(45, 5)));
  EXPECT_EQ(Ids(cache), (std::vector<std::string>{"d", "c"}));
  EXPECT_EQ(spills_.Take(), (std::vector<Spilled>{{"m", "e", TtlClass::kShort, 45, 5}}));
  EXPECT_EQ(LedgerCacheBytes(ledger), cache.bytes());
  // With the cache empty and the ledger full, a Put spills its entry.
  cache.Spill(UINT64_MAX);
  spills_.Take();
  Result<MemoryCharge> rest =
      ledger.TryCharge("text::other", ChargeKind::kDeviceWeights, BytesOf(40));
  ASSERT_TRUE(rest.ok());
  EXPECT_FALSE(cache.Put("m", "f", TtlClass::kLong, Snap(1, 6)));
  EXPECT_EQ(spills_.Take(), (std::vector<Spilled>{{"m", "f", TtlClass::kLong, 1, 6}}));
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_EQ(LedgerCacheBytes(ledger), 0u);
  EXPECT_GT(ledger.Snapshot().refusals, 0u);
}

TEST_F(PromptCacheTest, SpillFreesLeastRecentlyUsedFirst) {
  PromptCache cache(Options(BytesOf(100)));
  for (int i = 0; i < 5; ++i) {
    cache.Put("m", std::string(1, static_cast<char>('a' + i)), TtlClass::kLong, Snap(10, i));
  }
  EXPECT_EQ(cache.Spill(BytesOf(15)), BytesOf(20));  // a, then b to reach 15
  EXPECT_EQ(spills_.Take(), (std::vector<Spilled>{{"m", "a", TtlClass::kLong, 10, 0},
                                                  {"m", "b", TtlClass::kLong, 10, 1}}));
  EXPECT_EQ(cache.Spill(0), 0u);
  EXPECT_EQ(cache.Spill(UINT64_MAX), BytesOf(30));
  EXPECT_EQ(spills_.Take().size(), 3u);
  EXPECT_EQ(cache.Spill(UINT64_MAX), 0u);
  EXPECT_EQ(cache.counters().spilled, 5u);
}

TEST_F(PromptCacheTest, SpillModelSpillsOnlyThatModel) {
  MemoryLedger ledger;
  PromptCache cache(Options(BytesOf(100), &ledger));
  cache.Put("m1", "a", TtlClass::kLong, Snap(10, 1));
  cache.Put("m2", "a", TtlClass::kLong, Snap(10, 2));
  cache.Put("m1", "b", TtlClass::kShort, Snap(5, 3));
  cache.Put("m2", "c", TtlClass::kLong, Snap(10, 4));
  EXPECT_EQ(cache.SpillModel("m1"), BytesOf(15));
  EXPECT_EQ(spills_.Take(), (std::vector<Spilled>{{"m1", "a", TtlClass::kLong, 10, 1},
                                                  {"m1", "b", TtlClass::kShort, 5, 3}}));
  EXPECT_EQ(Ids(cache), (std::vector<std::string>{"c", "a"}));
  EXPECT_TRUE(cache.Contains("m2", "a"));
  EXPECT_FALSE(cache.Contains("m1", "a"));
  EXPECT_EQ(LedgerCacheBytes(ledger), BytesOf(20));
  EXPECT_EQ(ledger.Snapshot().by_owner.count("prompt_cache:m1"), 0u);
  EXPECT_EQ(cache.SpillModel("m1"), 0u);
  EXPECT_EQ(cache.SpillModel("nobody"), 0u);
}

TEST_F(PromptCacheTest, ExpiredEntriesAreDroppedNeverSpilled) {
  MemoryLedger ledger;
  PromptCache cache(Options(BytesOf(30), &ledger));
  cache.Put("m", "s", TtlClass::kShort, Snap(10, 1));
  cache.Put("m", "l", TtlClass::kLong, Snap(10, 2));
  clock_.AdvanceMs(5 * kMinuteMs);  // the window itself: still alive
  EXPECT_TRUE(cache.Contains("m", "s"));
  EXPECT_EQ(cache.PurgeExpired(), 0);
  clock_.AdvanceMs(1 * kMinuteMs);  // +6 min
  EXPECT_FALSE(cache.Contains("m", "s"));
  EXPECT_EQ(cache.TokensOf("m", "s"), 0);
  EXPECT_EQ(cache.PurgeExpired(), 1);
  EXPECT_EQ(Ids(cache), (std::vector<std::string>{"l"}));
  EXPECT_EQ(LedgerCacheBytes(ledger), BytesOf(10));
  EXPECT_TRUE(spills_.Take().empty());

  // Take of an expired entry: a miss, dropped.
  cache.Put("m", "s2", TtlClass::kShort, Snap(10, 3));
  clock_.AdvanceMs(6 * kMinuteMs);
  EXPECT_FALSE(cache.Take("m", "s2").has_value());
  EXPECT_FALSE(cache.Contains("m", "s2"));
  // LRU eviction and Spill drop expired victims instead of spilling them.
  cache.Put("m", "s3", TtlClass::kShort, Snap(10, 4));
  cache.Put("m", "x", TtlClass::kLong, Snap(5, 5));
  clock_.AdvanceMs(55 * kMinuteMs);  // l (67 min old) and s3 (55 min) expired; x (long, 55 min) not
  cache.Put("m", "y", TtlClass::kLong, Snap(20, 6));  // needs l and s3 out
  EXPECT_EQ(Ids(cache), (std::vector<std::string>{"y", "x"}));
  EXPECT_TRUE(spills_.Take().empty());
  clock_.AdvanceMs(61 * kMinuteMs);
  EXPECT_EQ(cache.Spill(UINT64_MAX), BytesOf(25));  // freed, but nothing spilled
  EXPECT_TRUE(spills_.Take().empty());
  EXPECT_EQ(LedgerCacheBytes(ledger), 0u);

  PromptCache::Counters c = cache.counters();
  EXPECT_EQ(c.expired, 6u);  // s, s2, l, s3, x, y
  EXPECT_EQ(c.spilled, 0u);
  EXPECT_EQ(c.misses, 1u);
  EXPECT_EQ(c.hits, 0u);
}

TEST_F(PromptCacheTest, ConfiguredWindows) {
  PromptCacheOptions o = Options(BytesOf(100));
  o.ttl.short_ms = 1000;
  o.ttl.extended_ms = 0;  // unset → long
  PromptCache cache(std::move(o));
  cache.Put("m", "s", TtlClass::kShort, Snap(1));
  cache.Put("m", "e", TtlClass::kExtended, Snap(1));
  clock_.AdvanceMs(1001);
  EXPECT_EQ(cache.PurgeExpired(), 1);
  clock_.AdvanceMs(60 * kMinuteMs);
  EXPECT_EQ(cache.PurgeExpired(), 1);
}

TEST_F(PromptCacheTest, Counters) {
  PromptCache cache(Options(BytesOf(20)));
  cache.Put("m", "a", TtlClass::kLong, Snap(10));
  cache.Put("m", "b", TtlClass::kLong, Snap(10));
  cache.Put("m", "c", TtlClass::kLong, Snap(10));  // spills a
  EXPECT_TRUE(cache.Take("m", "b").has_value());
  EXPECT_FALSE(cache.Take("m", "a").has_value());
  EXPECT_FALSE(cache.Take("m", "zzz").has_value());
  cache.Put("m", "s", TtlClass::kShort, Snap(1));
  clock_.AdvanceMs(6 * kMinuteMs);
  EXPECT_EQ(cache.PurgeExpired(), 1);
  PromptCache::Counters c = cache.counters();
  EXPECT_EQ(c.puts, 4u);
  EXPECT_EQ(c.hits, 1u);
  EXPECT_EQ(c.misses, 2u);
  EXPECT_EQ(c.spilled, 1u);
  EXPECT_EQ(c.expired, 1u);
}

TEST_F(PromptCacheTest, TheSpillCallbackMayCallBackIntoTheCache) {
  PromptCacheOptions o;
  o.capacity_bytes = BytesOf(10);
  o.clock = &clock_;
  PromptCache* self = nullptr;
  std::vector<std::string> seen;
  o.spill = [&](const std::string& m, const std::string& c, TtlClass, KvSnapshot) {
    // Would deadlock if called under the cache's lock.
    seen.push_back(c + (self->Contains(m, c) ? ":present" : ":absent") + ":" +
                   std::to_string(self->size()));
  };
  PromptCache cache(std::move(o));
  self = &cache;
  testing_internal::RunWithFuse("a spill re-entering the cache", std::chrono::seconds(30), [&] {
    cache.Put("m", "a", TtlClass::kLong, Snap(10));
    cache.Put("m", "b", TtlClass::kLong, Snap(10));
  });
  EXPECT_EQ(seen, (std::vector<std::string>{"a:absent:1"}));
}

TEST_F(PromptCacheTest, DestroyingTheCacheUnchargesWithoutSpilling) {
  MemoryLedger ledger;
  {
    PromptCache cache(Options(BytesOf(100), &ledger));
    cache.Put("m", "a", TtlClass::kLong, Snap(10));
    EXPECT_EQ(ledger.charged_bytes(), BytesOf(10));
  }
  EXPECT_EQ(ledger.charged_bytes(), 0u);
  EXPECT_TRUE(spills_.Take().empty());
}

// 4 threads put, take, erase, spill and purge over a small key space with a
// tight ledger. Checked: no entry is both returned by Take and spilled, or
// lost: every Put is accounted for exactly once (taken, spilled, dropped as
// replaced / erased / expired, or still held); the ledger matches bytes()
// once quiet; bytes() never exceeds capacity.
TEST_F(PromptCacheTest, FourThreadStress) {
  MemoryLedger ledger(BytesOf(300));
  std::atomic<uint64_t> spilled{0};
  PromptCacheOptions o;
  o.capacity_bytes = BytesOf(200);
  o.ledger = &ledger;
  o.clock = &clock_;
  PromptCache* self = nullptr;
  o.spill = [&](const std::string& m, const std::string& c, TtlClass, KvSnapshot s) {
    spilled++;
    if (s.n_tokens() % 7 == 0) (void)self->Contains(m, c);  // re-entry from the callback
  };
  PromptCache cache(std::move(o));
  self = &cache;
  std::atomic<uint64_t> over_capacity{0};
  testing_internal::RunWithFuse("the 4-thread stress", std::chrono::seconds(120), [&] {
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937 rng(77 + t);
        // Someone else's charges come and go too.
        std::optional<MemoryCharge> foreign;
        for (int i = 0; i < 3000; ++i) {
          // append(), not "m" + std::string: GCC 12 warns (-Wrestrict, a false positive).
          const std::string model = std::string("m").append(std::to_string(rng() % 2));
          const std::string id = std::string("c").append(std::to_string(rng() % 12));
          switch (rng() % 10) {
            case 0:
            case 1:
            case 2:
            case 3:
              cache.Put(model, id, static_cast<TtlClass>(rng() % 3),
                        Snap(static_cast<int>(1 + rng() % 60), t));
              break;
            case 4:
            case 5: {
              std::optional<KvSnapshot> s = cache.Take(model, id);
              if (s && s->kv.size() != s->ExpectedKvBytes()) ADD_FAILURE() << "torn snapshot";
              break;
            }
            case 6:
              cache.Erase(model, id);
              break;
            case 7:
              if (t == 0) {
                clock_.AdvanceMs(10'000);
                cache.PurgeExpired();
              } else {
                cache.Spill(BytesOf(static_cast<int>(rng() % 50)));
              }
              break;
            case 8:
              if (rng() % 4 == 0) {
                cache.SpillModel(model);
              } else if (foreign) {
                foreign.reset();
              } else {
                Result<MemoryCharge> c = ledger.TryCharge("other", ChargeKind::kScratch,
                                                          BytesOf(static_cast<int>(rng() % 100)));
                if (c.ok()) foreign = std::move(*c);
              }
              break;
            default:
              if (cache.bytes() > cache.capacity()) over_capacity++;
              (void)cache.Entries();
              (void)cache.TokensOf(model, id);
              (void)cache.counters();
          }
        }
      });
    }
    for (std::thread& th : threads) th.join();
  });
  EXPECT_EQ(over_capacity.load(), 0u);
  EXPECT_EQ(LedgerCacheBytes(ledger), cache.bytes());
  EXPECT_LE(cache.bytes(), cache.capacity());
  uint64_t sum = 0;
  for (const PromptCacheEntryInfo& e : cache.Entries()) sum += e.bytes;
  EXPECT_EQ(sum, cache.bytes());
  const PromptCache::Counters c = cache.counters();
  EXPECT_EQ(c.spilled, spilled.load());
  EXPECT_GT(c.puts, 0u);
  EXPECT_GT(c.hits, 0u);
  EXPECT_LE(c.hits + c.spilled + c.expired + cache.size(),
            c.puts);  // the rest were replaced or erased
  cache.Spill(UINT64_MAX);
  EXPECT_EQ(LedgerCacheBytes(ledger), 0u);
}

}  // namespace
}  // namespace arbiter
