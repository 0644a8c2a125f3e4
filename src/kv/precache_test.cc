// KvPrecache over a real engine (the "tiny" preset), a real KvStore in a
// temp dir and a real PromptCache: conversations pinned to slots, moves
// between the slot, host and disk tiers, restore only when colder, prewarm
// and keep-alive per conversation that lands before the short TTL (the fixed
// defects of docs/kv-precache.md "Defects of the reference, fixed"), idle
// eviction, engine detach/attach (a model eviction or restart).
#include "arbiter/kv/precache.h"
#include "tools/model_maker/model_maker.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <atomic>
#include <chrono>
#include <thread>

#include <gtest/gtest.h>


namespace arbiter {
namespace {

namespace fs = std::filesystem;

constexpr const char* kHash = "0123456789abcdef";

class PrecacheTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/arbiter-precache-model-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    model_dir_ = new std::string(tmpl);
    Status s = MakeModel("tiny", *model_dir_, 7);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*model_dir_, ec);
    delete model_dir_;
  }

  void SetUp() override {
    char tmpl[] = "/tmp/arbiter-precache-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    KvStoreOptions so;
    so.dir = dir_ + "/kv";
    Result<std::unique_ptr<KvStore>> st = KvStore::Open(so);
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    store_ = std::move(*st);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::unique_ptr<Engine> LoadEngine(int n_slots, GgmlType kv_type = kDefaultKvType) {
    EngineOptions o;
    o.n_ctx = 256;
    o.n_slots = n_slots;
    o.prefill_batch = 16;
    o.kv_type = kv_type;
    Result<std::unique_ptr<Engine>> e = Engine::Load(*model_dir_, o);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    return e.ok() ? std::move(*e) : nullptr;
  }

  // A prompt cache spilling into store_.
  std::unique_ptr<PromptCache> MakePromptCache(uint64_t capacity) {
    PromptCacheOptions po;
    po.capacity_bytes = capacity;
    po.clock = &clock_;
    KvStore* disk = store_.get();
    po.spill = [disk](const std::string&, const std::string& conversation, TtlClass ttl,
                      KvSnapshot snapshot) {
      ASSERT_TRUE(disk->Save(conversation, ttl, snapshot).ok());
    };
    return std::make_unique<PromptCache>(std::move(po));
  }

  std::unique_ptr<KvPrecache> MakePrecache(int n_slots, PromptCache* pc,
                                           int64_t conversation_ttl_ms = 60000) {
    KvPrecacheOptions o;
    o.model_key = "tiny";
    o.model_hash = kHash;
    o.n_slots = n_slots;
    o.store = store_.get();
    o.prompt_cache = pc;
    o.clock = &clock_;
    o.conversation_ttl_ms = conversation_ttl_ms;
    return std::make_unique<KvPrecache>(std::move(o));
  }

  // Distinct deterministic prompts: `n` ids in [4, vocab) from `seed`.
  static std::vector<int32_t> Ids(int n, int seed) {
    std::vector<int32_t> ids;
    for (int i = 0; i < n; ++i) ids.push_back(4 + (seed * 131 + i * 17 + i * i) % 100);
    return ids;
  }
  static std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }
  static GenerationRequest Greedy(std::vector<int32_t> prompt, int max_tokens = 4) {
    GenerationRequest r;
    r.prompt_ids = std::move(prompt);
    r.sampling.temperature = 0.0f;
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    return r;
  }
  // Output of a cold run on a fresh engine (the reference).
  std::vector<int32_t> Cold(const std::vector<int32_t>& prompt, int max_tokens = 4) {
    std::unique_ptr<Engine> e = LoadEngine(1);
    Result<GenerationResult> r = e->Generate(Greedy(prompt, max_tokens), nullptr, nullptr);
    EXPECT_TRUE(r.ok());
    return r.ok() ? r->output_ids : std::vector<int32_t>{};
  }

  Result<GenerationResult> Run(KvPrecache& pc, Engine* e, const std::string& conv,
                               const std::vector<int32_t>& prompt, KvOutcome* out,
                               TtlClass ttl = TtlClass::kShort) {
    return pc.Generate(e, conv, ttl, Greedy(prompt), nullptr, nullptr, out);
  }

  std::string FileOf(const std::string& conv, TtlClass ttl) {
    return store_->PathFor(kHash, conv, ttl);
  }

  static std::string* model_dir_;
  std::string dir_;
  SimulatedClock clock_{1000000};
  std::unique_ptr<KvStore> store_;
};
std::string* PrecacheTest::model_dir_ = nullptr;

TEST_F(PrecacheTest, EveryTurnOfAConversationRunsOnItsSlotAndReusesIt) {
  std::unique_ptr<Engine> e = LoadEngine(3);
  std::unique_ptr<KvPrecache> pc = MakePrecache(3, nullptr);
  pc->AttachEngine(e.get());
  std::vector<int32_t> prompt = Ids(40, 1);
  int slot = -1;
  int hits = 0;
  for (int turn = 0; turn < 10; ++turn) {
    KvOutcome out;
    Result<GenerationResult> r = Run(*pc, e.get(), "room-1", prompt, &out);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    if (turn == 0) slot = out.slot;
    EXPECT_EQ(out.slot, slot) << "turn " << turn;
    EXPECT_EQ(r->slot, slot);
    if (turn > 0) {
      // The previous prompt and its fed outputs are in the slot.
      EXPECT_GE(r->cached_tokens, static_cast<int>(prompt.size()) - 8) << "turn " << turn;
      hits += out.source == KvSource::kSlot;
    }
    prompt = Concat(Concat(prompt, r->output_ids), Ids(5, 100 + turn));
  }
  EXPECT_EQ(hits, 9);
  EXPECT_EQ(pc->counters().slot_hits, 9u);
  // A second conversation gets another slot (lowest-loaded).
  KvOutcome other;
  ASSERT_TRUE(Run(*pc, e.get(), "room-2", Ids(20, 2), &other).ok());
  EXPECT_NE(other.slot, slot);
  const std::vector<KvSlotView> slots = pc->Slots();
  EXPECT_EQ(slots[slot].conversation_id, "room-1");
  EXPECT_EQ(slots[other.slot].conversation_id, "room-2");
  pc->DetachEngine(e.get());
}

TEST_F(PrecacheTest, ADisplacedConversationComesBackFromTheHostTier) {
  std::unique_ptr<Engine> e = LoadEngine(1);
  std::unique_ptr<PromptCache> cache = MakePromptCache(64ull << 20);
  std::unique_ptr<KvPrecache> pc = MakePrecache(1, cache.get());
  const std::vector<int32_t> a1 = Ids(60, 3);
  KvOutcome out;
  Result<GenerationResult> r = Run(*pc, e.get(), "a", a1, &out);
  ASSERT_TRUE(r.ok());
  // b takes the only slot: a's KV moves to the prompt cache.
  ASSERT_TRUE(Run(*pc, e.get(), "b", Ids(50, 4), &out).ok());
  EXPECT_TRUE(out.stashed);
  EXPECT_TRUE(cache->Contains("tiny", "a"));
  // a's next turn restores it (warmer than b's tokens in the slot).
  const std::vector<int32_t> a2 = Concat(Concat(a1, r->output_ids), Ids(6, 5));
  r = Run(*pc, e.get(), "a", a2, &out);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(out.source, KvSource::kPromptCache);
  EXPECT_EQ(out.restored_tokens, static_cast<int>(a1.size()) + 3);  // prompt + fed outputs
  EXPECT_EQ(r->cached_tokens, out.restored_tokens);
  EXPECT_EQ(r->output_ids, Cold(a2));
  EXPECT_FALSE(cache->Contains("tiny", "a"));
  EXPECT_TRUE(cache->Contains("tiny", "b"));  // b was stashed in turn
  EXPECT_EQ(pc->counters().prompt_cache_hits, 1u);
}

TEST_F(PrecacheTest, WithoutAPromptCacheADisplacedConversationGoesToDisk) {
  std::unique_ptr<Engine> e = LoadEngine(1);
  std::unique_ptr<KvPrecache> pc = MakePrecache(1, nullptr);
  const std::vector<int32_t> a1 = Ids(30, 6);
  KvOutcome out;
  ASSERT_TRUE(Run(*pc, e.get(), "a", a1, &out, TtlClass::kLong).ok());
  ASSERT_TRUE(Run(*pc, e.get(), "b", Ids(30, 7), &out).ok());
  EXPECT_TRUE(fs::exists(FileOf("a", TtlClass::kLong)));
  Result<GenerationResult> r = Run(*pc, e.get(), "a", Concat(a1, Ids(4, 8)), &out);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(out.source, KvSource::kDisk);
  EXPECT_GT(out.restored_tokens, 0);
  EXPECT_GE(r->cached_tokens, static_cast<int>(a1.size()));
  EXPECT_EQ(r->output_ids, Cold(Concat(a1, Ids(4, 8))));
}

TEST_F(PrecacheTest, CloseSavesAndARestartRestoresFromDisk) {
  const std::vector<int32_t> p1 = Ids(80, 9);
  std::vector<int32_t> p2;
  {
    std::unique_ptr<Engine> e = LoadEngine(2);
    std::unique_ptr<KvPrecache> pc = MakePrecache(2, nullptr);
    KvOutcome out;
    Result<GenerationResult> r = Run(*pc, e.get(), "room/../x", p1, &out, TtlClass::kExtended);
    ASSERT_TRUE(r.ok());
    p2 = Concat(Concat(p1, r->output_ids), Ids(7, 10));
    EXPECT_TRUE(pc->Close(e.get(), "room/../x"));
    EXPECT_FALSE(pc->Close(e.get(), "room/../x"));  // no longer open, nothing left
    pc->DetachEngine(e.get());
  }
  const std::string file = FileOf("room/../x", TtlClass::kExtended);
  ASSERT_TRUE(fs::exists(file));
  EXPECT_EQ(fs::path(file).parent_path(), fs::path(dir_) / "kv" / kHash);
  // "Restart": a new engine and precache over the same directory.
  std::unique_ptr<Engine> e = LoadEngine(2);
  std::unique_ptr<KvPrecache> pc = MakePrecache(2, nullptr);
  KvOutcome out;
  Result<GenerationResult> r = Run(*pc, e.get(), "room/../x", p2, &out);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(out.source, KvSource::kDisk);
  EXPECT_EQ(out.restored_tokens, static_cast<int>(p1.size()) + 3);
  EXPECT_EQ(r->cached_tokens, out.restored_tokens);
  EXPECT_EQ(r->output_ids, Cold(p2));
  EXPECT_EQ(pc->counters().disk_hits, 1u);
}

TEST_F(PrecacheTest, ACorruptFileCostsAColdPrefillAndIsRemoved) {
  const std::vector<int32_t> p1 = Ids(40, 11);
  {
    std::unique_ptr<Engine> e = LoadEngine(1);
    std::unique_ptr<KvPrecache> pc = MakePrecache(1, nullptr);
    KvOutcome out;
    ASSERT_TRUE(Run(*pc, e.get(), "c", p1, &out).ok());
    ASSERT_TRUE(pc->Close(e.get(), "c"));
  }
  const std::string file = FileOf("c", TtlClass::kShort);
  ASSERT_TRUE(fs::exists(file));
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x7f');
  }
  std::unique_ptr<Engine> e = LoadEngine(1);
  std::unique_ptr<KvPrecache> pc = MakePrecache(1, nullptr);
  KvOutcome out;
  Result<GenerationResult> r = Run(*pc, e.get(), "c", Concat(p1, Ids(3, 12)), &out);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->cached_tokens, 0);
  EXPECT_EQ(out.source, KvSource::kNone);
  EXPECT_NE(out.warning.find("checksum"), std::string::npos) << out.warning;
  EXPECT_FALSE(fs::exists(file));
  EXPECT_EQ(pc->counters().restore_failures, 1u);
  EXPECT_EQ(r->output_ids, Cold(Concat(p1, Ids(3, 12))));
}

// A KV file of another KV type — here one an f32 engine wrote, as every file
// from before KV types did — is foreign to an f16 engine: a cold prefill,
// and the file is removed. The f16 engine's own file then restores.
TEST_F(PrecacheTest, AFileOfAnotherKvTypeCostsAColdPrefillAndIsRemoved) {
  const std::vector<int32_t> p1 = Ids(40, 13);
  const std::vector<int32_t> p2 = Concat(p1, Ids(3, 14));
  {
    std::unique_ptr<Engine> e = LoadEngine(1, GgmlType::kF32);
    std::unique_ptr<KvPrecache> pc = MakePrecache(1, nullptr);
    KvOutcome out;
    ASSERT_TRUE(Run(*pc, e.get(), "c", p1, &out).ok());
    ASSERT_TRUE(pc->Close(e.get(), "c"));
  }
  const std::string file = FileOf("c", TtlClass::kShort);
  ASSERT_TRUE(fs::exists(file));
  const uintmax_t f32_bytes = fs::file_size(file);
  {
    std::unique_ptr<Engine> e = LoadEngine(1, GgmlType::kF16);
    std::unique_ptr<KvPrecache> pc = MakePrecache(1, nullptr);
    KvOutcome out;
    Result<GenerationResult> r = Run(*pc, e.get(), "c", p2, &out);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->cached_tokens, 0);
    EXPECT_EQ(out.source, KvSource::kNone);
    EXPECT_NE(out.warning.find("KV of type f32 is not usable by a model whose kv_type is f16"),
              std::string::npos)
        << out.warning;
    EXPECT_FALSE(fs::exists(file));
    EXPECT_EQ(pc->counters().restore_failures, 1u);
    ASSERT_TRUE(pc->Close(e.get(), "c"));
  }
  // The f16 file: the same tokens in about half the bytes, and it restores.
  ASSERT_TRUE(fs::exists(file));
  EXPECT_LT(fs::file_size(file), f32_bytes * 6 / 10);
  std::unique_ptr<Engine> e = LoadEngine(1, GgmlType::kF16);
  std::unique_ptr<KvPrecache> pc = MakePrecache(1, nullptr);
  KvOutcome out;
  const std::vector<int32_t> p3 = Concat(p2, Ids(2, 15));
  Result<GenerationResult> r = Run(*pc, e.get(), "c", p3, &out);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(out.source, KvSource::kDisk);
  EXPECT_GT(r->cached_tokens, 0);
  EXPECT_EQ(r->output_ids, Cold(p3));
}

// Restore only when colder (docs/kv-precache.md "Defects of the reference, fixed"): an
// open conversation whose slot holds warmer KV never reads its (older) file.
TEST_F(PrecacheTest, RestoresOnlyWhenTheInRamStateIsColder) {
  std::unique_ptr<Engine> e = LoadEngine(1);
  std::unique_ptr<KvPrecache> pc = MakePrecache(1, nullptr);
  const std::vector<int32_t> p1 = Ids(50, 13);
  KvOutcome out;
  ASSERT_TRUE(Run(*pc, e.get(), "d", p1, &out).ok());
  // A file for d that would fail to load if it were read.
  fs::create_directories(fs::path(FileOf("d", TtlClass::kShort)).parent_path());
  { std::ofstream(FileOf("d", TtlClass::kShort)) << "not a kv file"; }
  Result<GenerationResult> r = Run(*pc, e.get(), "d", Concat(p1, Ids(4, 14)), &out);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(out.source, KvSource::kSlot);
  EXPECT_TRUE(out.warning.empty()) << out.warning;
  EXPECT_TRUE(fs::exists(FileOf("d", TtlClass::kShort)));
  EXPECT_EQ(pc->counters().restore_failures, 0u);
}

TEST_F(PrecacheTest, DetachSavesOwnedSlotsForTheNextEngine) {
  std::unique_ptr<KvPrecache> pc = MakePrecache(2, nullptr);
  const std::vector<int32_t> p1 = Ids(33, 15);
  {
    std::unique_ptr<Engine> e = LoadEngine(2);
    pc->AttachEngine(e.get());
    KvOutcome out;
    ASSERT_TRUE(Run(*pc, e.get(), "m", p1, &out, TtlClass::kLong).ok());
    pc->DetachEngine(e.get());  // the arbiter evicts the model
  }
  EXPECT_TRUE(fs::exists(FileOf("m", TtlClass::kLong)));
  EXPECT_GE(pc->counters().persisted, 1u);
  std::unique_ptr<Engine> e = LoadEngine(2);
  pc->AttachEngine(e.get());
  for (const KvSlotView& s : pc->Slots()) EXPECT_TRUE(s.conversation_id.empty());
  KvOutcome out;
  Result<GenerationResult> r = Run(*pc, e.get(), "m", Concat(p1, Ids(2, 16)), &out);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(out.source, KvSource::kDisk);
  EXPECT_GE(r->cached_tokens, static_cast<int>(p1.size()));
}

TEST_F(PrecacheTest, AnonymousRequestsTakeTheLongestMatchAndStashOwners) {
  std::unique_ptr<Engine> e = LoadEngine(2);
  std::unique_ptr<PromptCache> cache = MakePromptCache(64ull << 20);
  std::unique_ptr<KvPrecache> pc = MakePrecache(2, cache.get());
  const std::vector<int32_t> shared = Ids(40, 17);
  KvOutcome out;
  // Anonymous: empty slots tie → least recently used; then the match wins.
  ASSERT_TRUE(Run(*pc, e.get(), "", shared, &out).ok());
  const int first = out.slot;
  Result<GenerationResult> r = Run(*pc, e.get(), "", Concat(shared, Ids(5, 18)), &out);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(out.slot, first);
  EXPECT_GE(r->cached_tokens, static_cast<int>(shared.size()));
  EXPECT_FALSE(out.stashed);
  // A conversation owns the other slot; an anonymous request matching it
  // best moves the conversation's KV to the host tier first.
  ASSERT_TRUE(Run(*pc, e.get(), "owner", Ids(30, 19), &out).ok());
  const int owned = out.slot;
  ASSERT_TRUE(Run(*pc, e.get(), "", Concat(Ids(30, 19), Ids(3, 20)), &out).ok());
  EXPECT_EQ(out.slot, owned);
  EXPECT_TRUE(out.stashed);
  EXPECT_TRUE(cache->Contains("tiny", "owner"));
}

TEST_F(PrecacheTest, PrewarmThenFirstTurnComputesOnlyTheNewTokens) {
  std::unique_ptr<Engine> e = LoadEngine(2);
  std::unique_ptr<KvPrecache> pc = MakePrecache(2, nullptr);
  const std::vector<int32_t> prefix = Ids(120, 21);
  Result<GenerationResult> w = pc->Prewarm(e.get(), "room", prefix, TtlClass::kShort, nullptr);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->timings.prefill_tokens, 120);
  KvOutcome out;
  Result<GenerationResult> r = Run(*pc, e.get(), "room", Concat(prefix, Ids(6, 22)), &out);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->cached_tokens, 120);
  EXPECT_EQ(r->timings.prefill_tokens, 6);
  EXPECT_EQ(pc->counters().prewarms, 1u);
  EXPECT_FALSE(pc->Prewarm(e.get(), "", prefix, TtlClass::kShort, nullptr).ok());
  EXPECT_FALSE(pc->Prewarm(e.get(), "x", {}, TtlClass::kShort, nullptr).ok());
  EXPECT_EQ(pc->Prewarm(e.get(), "x", {100000}, TtlClass::kShort, nullptr).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(pc->counters().prewarm_failures, 1u);  // the engine refused the bad id
}

// Keep-alive per conversation and before the short TTL (docs/kv-precache.md
// "Defects of the reference, fixed"): the keep-alive re-warms each
// prewarmed conversation once it has been idle for 0.8 × the short TTL, by
// its own clock.
TEST_F(PrecacheTest, KeepAliveIsPerConversationAndBeforeTheShortTtl) {
  std::unique_ptr<Engine> e = LoadEngine(2);
  std::unique_ptr<KvPrecache> pc = MakePrecache(2, nullptr, /*conversation_ttl_ms=*/3600000);
  ASSERT_TRUE(pc->Prewarm(e.get(), "early", Ids(20, 23), TtlClass::kShort, nullptr).ok());
  clock_.AdvanceMs(120000);
  ASSERT_TRUE(pc->Prewarm(e.get(), "late", Ids(20, 24), TtlClass::kShort, nullptr).ok());
  clock_.AdvanceMs(119999);  // early idle 239 999 ms < 240 000
  EXPECT_EQ(pc->KeepAlive(e.get()), 0);
  clock_.AdvanceMs(1);       // early idle 240 000 = 0.8 × 300 000
  EXPECT_EQ(pc->KeepAlive(e.get()), 1);
  EXPECT_EQ(pc->KeepAlive(e.get()), 0);  // just re-warmed
  clock_.AdvanceMs(120000);  // late idle 240 000; early 120 000
  EXPECT_EQ(pc->KeepAlive(e.get()), 1);
  EXPECT_EQ(pc->counters().keepalive_rewarms, 2u);
  // A request touches a conversation like a re-warm does.
  clock_.AdvanceMs(200000);
  KvOutcome out;
  ASSERT_TRUE(Run(*pc, e.get(), "early", Ids(25, 23), &out).ok());
  clock_.AdvanceMs(40000);  // early: 40 s since the request; late: 240 s
  EXPECT_EQ(pc->KeepAlive(e.get()), 1);
  for (const KvPrewarmView& v : pc->Prewarmed()) EXPECT_LT(v.idle_ms, 240000) << v.conversation_id;
  // Not loaded: nothing is computed.
  clock_.AdvanceMs(300000);
  EXPECT_EQ(pc->KeepAlive(nullptr), 0);
}

// Keep-alive re-warms are not use: a prewarmed conversation nobody uses is
// re-warmed only within conversation_ttl, then closed and saved; the
// system prefix is kept warm regardless.
TEST_F(PrecacheTest, AnAbandonedPrewarmedConversationStopsBeingKeptAlive) {
  std::unique_ptr<Engine> e = LoadEngine(2);
  std::unique_ptr<KvPrecache> pc = MakePrecache(2, nullptr, /*conversation_ttl_ms=*/600000);
  ASSERT_TRUE(pc->Prewarm(e.get(), "abandoned", Ids(20, 27), TtlClass::kShort, nullptr).ok());
  ASSERT_TRUE(
      pc->Prewarm(e.get(), kSystemPrefixConversation, Ids(20, 28), TtlClass::kLong, nullptr).ok());
  int rewarms = 0;
  for (int i = 0; i < 5; ++i) {  // 5 × 240 s = 20 min > 10 min
    clock_.AdvanceMs(240000);
    rewarms += pc->KeepAlive(e.get());
    pc->EvictIdle(e.get());
  }
  // abandoned: re-warmed at 4 and 8 min (used 8 min ago ≤ 10), then no more;
  // the system prefix: every pass.
  EXPECT_EQ(rewarms, 2 + 5);
  auto open = [&](const std::string& id) {
    for (const ConversationHandle& h : pc->registry().OpenHandles("tiny")) {
      if (h.conversation_id == id) return true;
    }
    return false;
  };
  EXPECT_FALSE(open("abandoned"));
  EXPECT_TRUE(fs::exists(FileOf("abandoned", TtlClass::kLong)));
  EXPECT_TRUE(open(kSystemPrefixConversation));
}

TEST_F(PrecacheTest, IdleConversationsAreSavedAsLongAndClosed) {
  std::unique_ptr<Engine> e = LoadEngine(2);
  std::unique_ptr<KvPrecache> pc = MakePrecache(2, nullptr);
  KvOutcome out;
  ASSERT_TRUE(Run(*pc, e.get(), "idle", Ids(20, 25), &out).ok());
  ASSERT_TRUE(Run(*pc, e.get(), "busy", Ids(20, 26), &out).ok());
  clock_.AdvanceMs(50000);
  ASSERT_TRUE(Run(*pc, e.get(), "busy", Ids(22, 26), &out).ok());
  clock_.AdvanceMs(20000);  // idle: 70 s > 60 s; busy: 20 s
  EXPECT_EQ(pc->EvictIdle(e.get()), std::vector<std::string>{"idle"});
  EXPECT_TRUE(fs::exists(FileOf("idle", TtlClass::kLong)));
  EXPECT_FALSE(fs::exists(FileOf("busy", TtlClass::kLong)));
  EXPECT_EQ(pc->registry().OpenCount(), 1u);
}

TEST_F(PrecacheTest, ConcurrentConversationsGetTheColdOutputs) {
  std::unique_ptr<Engine> e = LoadEngine(2);
  std::unique_ptr<PromptCache> cache = MakePromptCache(64ull << 20);
  std::unique_ptr<KvPrecache> pc = MakePrecache(2, cache.get());
  constexpr int kThreads = 4;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<int32_t>> want;
  for (int t = 0; t < kThreads; ++t) {
    prompts.push_back(Ids(24, 30 + t));
    want.push_back(Cold(prompts.back()));
  }
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 5; ++i) {
        KvOutcome out;
        Result<GenerationResult> r = Run(*pc, e.get(), "conv-" + std::to_string(t), prompts[t], &out);
        if (!r.ok() || r->output_ids != want[t]) ++mismatches;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(pc->counters().requests, 20u);
  pc->Shutdown(e.get());
  // Every conversation is on disk or was never displaced... all four are
  // saved after Shutdown (slots persisted, prompt cache spilled).
  for (int t = 0; t < kThreads; ++t) {
    const std::string conv = "conv-" + std::to_string(t);
    EXPECT_TRUE(store_->Contains(kHash, conv)) << conv;
  }
}

// The engine chooses and waits (Engine::ReserveSlot): the precache marks
// the slots conversations own, so the engine's tie-break can prefer the
// others; a request waiting for a held slot ends at its deadline or at a
// cancel from another thread (no polling: the token wakes it).
TEST_F(PrecacheTest, TheEngineWaitsForTheSlotAndKnowsWhichSlotsAreOwned) {
  std::unique_ptr<Engine> e = LoadEngine(2);
  std::unique_ptr<KvPrecache> pc = MakePrecache(2, nullptr);
  KvOutcome out;
  ASSERT_TRUE(Run(*pc, e.get(), "owner", Ids(20, 40), &out).ok());
  const int owned = out.slot;
  ASSERT_TRUE(Run(*pc, e.get(), "", Ids(20, 41), &out).ok());
  const int anonymous = out.slot;
  ASSERT_NE(owned, anonymous);
  EXPECT_TRUE(e->Slots()[owned].owned);
  EXPECT_FALSE(e->Slots()[anonymous].owned);
  // A tie on the prefix (none matches): the slot nobody owns, although it
  // is the more recently used one; nothing is stashed.
  ASSERT_TRUE(Run(*pc, e.get(), "", Ids(20, 42), &out).ok());
  EXPECT_EQ(out.slot, anonymous);
  EXPECT_FALSE(out.stashed);
  EXPECT_TRUE(pc->Close(e.get(), "owner"));
  EXPECT_FALSE(e->Slots()[owned].owned);

  // Both slots held: a request waits for one until its deadline…
  Result<SlotReservation> h0 = e->ReserveSlot({.slot = 0}, kNoDeadline, nullptr);
  Result<SlotReservation> h1 = e->ReserveSlot({.slot = 1}, kNoDeadline, nullptr);
  ASSERT_TRUE(h0.ok() && h1.ok());
  Result<GenerationResult> late =
      pc->Generate(e.get(), "", TtlClass::kShort, Greedy(Ids(10, 43)), nullptr, nullptr, &out,
                   std::chrono::steady_clock::now() + std::chrono::milliseconds(30));
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), StatusCode::kDeadlineExceeded);
  // …or until it is cancelled from another thread, its deadline an hour away.
  CancelSource source;
  std::atomic<bool> returned{false};
  Result<GenerationResult> cancelled{InternalError("not run")};
  std::thread waiter([&] {
    cancelled = pc->Generate(e.get(), "c", TtlClass::kShort, Greedy(Ids(10, 44)), nullptr,
                             source.token(), &out,
                             std::chrono::steady_clock::now() + std::chrono::hours(1));
    returned = true;
  });
  // Whether it is already asleep or not yet waiting, the cancel ends it:
  // the token is looked at before every sleep and wakes a sleeping waiter
  // (engine_slots_test covers the wake-up itself).
  source.Cancel();
  waiter.join();
  EXPECT_TRUE(returned);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status().ToString();
  EXPECT_EQ(cancelled->finish_reason, FinishReason::kCancelled);
  EXPECT_TRUE(cancelled->output_ids.empty());
  h0->Release();
  h1->Release();
  ASSERT_TRUE(Run(*pc, e.get(), "c", Ids(10, 44), &out).ok());
}

}  // namespace
}  // namespace arbiter
