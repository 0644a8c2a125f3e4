// The reclaim policy driven on a real Runtime (tiny models, real engines,
// real KV tiers, real weight cache): each stage runs in Note [Reclaim
// order]'s order, stops as soon as a charge fits, and pressure goes as far
// as its level says.
#include "arbiter/runtime/reclaim_policy.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include <gtest/gtest.h>

#include "runtime/testing/tiny_runtime.h"
#include "arbiter/runtime/runtime.h"

namespace arbiter {
namespace {

namespace fs = std::filesystem;

class ReclaimPolicyTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    Result<fs::path> dir = testing::MakeTinyModelDir("reclaim-test");
    ASSERT_TRUE(dir.ok()) << dir.status().ToString();
    dir_ = new fs::path(*dir);
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*dir_, ec);
    delete dir_;
  }

  // chat (text) + emb1, emb2 (embedding, the tiny weights mean-pooled), a
  // prompt cache, and one slot for chat so a second conversation stashes
  // the first into the prompt cache.
  void Start(int64_t ttl_short_ms = 300000) {
    Config c = testing::TinyRuntimeConfig(*dir_, (*dir_ / ("state-" + std::to_string(++n_))).string(),
                                          {{"chat", Capability::kText},
                                           {"emb1", Capability::kEmbedding},
                                           {"emb2", Capability::kEmbedding}});
    c.kv.ttl_short_ms = ttl_short_ms;
    c.kv.keepalive_interval_ms = std::max<int64_t>(100, ttl_short_ms / 10);
    c.kv.prompt_cache_bytes = 16ull << 20;
    Result<std::unique_ptr<Runtime>> rt = Runtime::Create(c);
    ASSERT_TRUE(rt.ok()) << rt.status().ToString();
    rt_ = std::move(rt).value();
    rt_->reclaim_policy().set_observer(
        [this](ReclaimTrigger, const ReclaimStep& s) { observed_.push_back(s.stage); });
  }

  void TearDown() override {
    if (rt_) rt_->Shutdown();
  }

  void Chat(const std::string& conversation) {
    TextRequest t;
    t.model = "chat";
    t.messages = {{"user", "hello there, " + conversation}};
    t.max_tokens = 2;
    t.sampling.temperature = 0;
    t.conversation_id = conversation;
    Result<std::unique_ptr<TextGeneration>> g = rt_->StartText(std::move(t));
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    ASSERT_TRUE((*g)->Run(nullptr, nullptr).ok());
  }

  Status Embed(const std::string& model) {
    EmbedRequest e;
    e.model = model;
    e.inputs = {"hello"};
    return rt_->Embed(e, nullptr).status();
  }

  const ModelStatus& Model(const RuntimeStatus& s, const std::string& name) {
    for (const ModelStatus& m : s.models) {
      if (m.arbiter.name == name) return m;
    }
    ADD_FAILURE() << "no model " << name;
    return s.models.front();
  }

  uint64_t PromptCacheBytes() {
    Result<KvStatus> kv = rt_->Kv();
    return kv.ok() && kv->prompt_cache ? kv->prompt_cache->bytes : 0;
  }

  // chat loaded with conversation "a" stashed in the prompt cache (by "b"),
  // emb1 and emb2 loaded and idle, chat's weights idle on the device.
  void Fill() {
    Chat("a");
    Chat("b");
    ASSERT_GT(PromptCacheBytes(), 0u);
    ASSERT_TRUE(Embed("emb1").ok());
    ASSERT_TRUE(Embed("emb2").ok());
  }

  static MemoryPressureEvent Pressure(MemoryPressureLevel level) {
    MemoryPressureEvent e;
    e.level = level;
    e.source = "test";
    return e;
  }

  static std::vector<ReclaimStage> Stages(const ReclaimReport& r) {
    std::vector<ReclaimStage> out;
    for (const ReclaimStep& s : r.steps) out.push_back(s.stage);
    return out;
  }

  static fs::path* dir_;
  static inline int n_ = 0;
  std::unique_ptr<Runtime> rt_;
  std::vector<ReclaimStage> observed_;
};

fs::path* ReclaimPolicyTest::dir_ = nullptr;

TEST_F(ReclaimPolicyTest, AChargeRunsTheStagesInOrder) {
  Start();
  Fill();
  const RuntimeStatus before = rt_->Status();
  ASSERT_TRUE(Model(before, "chat").weights->device_resident);
  // A charge of the whole budget can never fit: every stage runs once, in
  // order, and gives back what it can.
  const ReclaimReport r = rt_->reclaim_policy().MakeRoomReport(before.arbiter.budget_bytes);
  EXPECT_EQ(Stages(r), (std::vector<ReclaimStage>{ReclaimStage::kSpillPromptCache,
                                                   ReclaimStage::kEvictIdleModels,
                                                   ReclaimStage::kDemoteDeviceWeights}));
  for (const ReclaimStep& s : r.steps) {
    EXPECT_GT(s.freed_bytes, 0u) << ReclaimStageName(s.stage);
  }
  EXPECT_EQ(observed_, Stages(r));
  const RuntimeStatus after = rt_->Status();
  EXPECT_EQ(PromptCacheBytes(), 0u);
  EXPECT_FALSE(Model(after, "emb1").arbiter.state == ModelState::kLoaded);
  EXPECT_FALSE(Model(after, "emb2").arbiter.state == ModelState::kLoaded);
  // The text target stays loaded (never a victim); its idle weights went
  // back to the file (no floor: unpinned).
  EXPECT_EQ(Model(after, "chat").arbiter.state, ModelState::kLoaded);
  EXPECT_FALSE(Model(after, "chat").weights->device_resident);
  EXPECT_EQ(r.freed_bytes, before.ledger.charged_bytes - after.ledger.charged_bytes);
  // The model comes back on the next request, weights reloaded.
  Chat("c");
}

TEST_F(ReclaimPolicyTest, AChargeStopsAsSoonAsItFits) {
  Start();
  Fill();
  const RuntimeStatus before = rt_->Status();
  // One byte more than is free: the prompt cache alone makes room.
  const size_t need = before.arbiter.budget_bytes - before.ledger.charged_bytes + 1;
  const ReclaimReport r = rt_->reclaim_policy().MakeRoomReport(need);
  EXPECT_EQ(Stages(r), (std::vector<ReclaimStage>{ReclaimStage::kSpillPromptCache}));
  const RuntimeStatus after = rt_->Status();
  EXPECT_EQ(Model(after, "emb1").arbiter.state, ModelState::kLoaded);
  EXPECT_EQ(Model(after, "emb2").arbiter.state, ModelState::kLoaded);
  EXPECT_TRUE(Model(after, "chat").weights->device_resident);
  // Nothing needed: nothing runs.
  EXPECT_TRUE(rt_->reclaim_policy().MakeRoomReport(0).steps.empty());
}

TEST_F(ReclaimPolicyTest, ExpiredEntriesGoFirst) {
  Start(/*ttl_short_ms=*/1000);
  Fill();
  // Wait (bounded) until the stashed entry is past its short TTL.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    Result<KvStatus> kv = rt_->Kv();
    ASSERT_TRUE(kv.ok() && kv->prompt_cache && !kv->prompt_cache->entries.empty());
    if (kv->prompt_cache->entries.front().age_ms > 1100) break;
    ASSERT_LT(std::chrono::steady_clock::now(), deadline);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const RuntimeStatus before = rt_->Status();
  const size_t need = before.arbiter.budget_bytes - before.ledger.charged_bytes + 1;
  const ReclaimReport r = rt_->reclaim_policy().MakeRoomReport(need);
  EXPECT_EQ(Stages(r), (std::vector<ReclaimStage>{ReclaimStage::kPurgeExpired}));
  EXPECT_EQ(PromptCacheBytes(), 0u);
}

TEST_F(ReclaimPolicyTest, LowPressureIsOneRoundCriticalIsEverythingAndRefusesNonText) {
  Start();
  Fill();
  // Through the bridge, as POST /admin/pressure does (the policy reacts on
  // this thread); the observer sees the stages in order.
  observed_.clear();
  rt_->DispatchPressure(MemoryPressureLevel::kLow, std::nullopt);
  EXPECT_EQ(observed_, (std::vector<ReclaimStage>{ReclaimStage::kSpillPromptCache,
                                                  ReclaimStage::kEvictIdleModels}));
  RuntimeStatus s = rt_->Status();
  // Exactly one embedding model went (both priority 25).
  const int emb_loaded = (Model(s, "emb1").arbiter.state == ModelState::kLoaded) +
                         (Model(s, "emb2").arbiter.state == ModelState::kLoaded);
  EXPECT_EQ(emb_loaded, 1);
  EXPECT_TRUE(Model(s, "chat").weights->device_resident);

  observed_.clear();
  EXPECT_EQ(rt_->DispatchPressure(MemoryPressureLevel::kCritical, std::nullopt),
            MemoryPressureLevel::kCritical);
  EXPECT_EQ(observed_, (std::vector<ReclaimStage>{ReclaimStage::kEvictIdleModels,
                                                  ReclaimStage::kDemoteDeviceWeights,
                                                  ReclaimStage::kRefuseNonText}));
  s = rt_->Status();
  EXPECT_NE(Model(s, "emb1").arbiter.state, ModelState::kLoaded);
  EXPECT_NE(Model(s, "emb2").arbiter.state, ModelState::kLoaded);
  EXPECT_FALSE(Model(s, "chat").weights->device_resident);
  EXPECT_EQ(Embed("emb1").reason(), ErrorReason::kMemoryPressure);
  Chat("d");  // text is never refused
  EXPECT_EQ(rt_->DispatchPressure(MemoryPressureLevel::kNominal, std::nullopt),
            MemoryPressureLevel::kNominal);
  EXPECT_TRUE(Embed("emb1").ok());
}

TEST_F(ReclaimPolicyTest, NextVictimIsAnIdleNonTextModel) {
  Start();
  EXPECT_FALSE(rt_->Status().next_victim.has_value());
  Fill();
  std::optional<NextVictim> v = rt_->Status().next_victim;
  ASSERT_TRUE(v.has_value());
  EXPECT_TRUE(v->model == "emb1" || v->model == "emb2") << v->model;
  EXPECT_EQ(v->capability, Capability::kEmbedding);
  EXPECT_GT(v->bytes, 0u);
  // It is the one a charge evicts first.
  const std::string first = v->model;
  const RuntimeStatus before = rt_->Status();
  rt_->reclaim_policy().MakeRoomReport(before.arbiter.budget_bytes - before.ledger.charged_bytes +
                                       PromptCacheBytes() + 1);
  const RuntimeStatus after = rt_->Status();
  EXPECT_NE(Model(after, first).arbiter.state, ModelState::kLoaded);
  v = after.next_victim;
  ASSERT_TRUE(v.has_value());
  EXPECT_NE(v->model, first);
}

}  // namespace
}  // namespace arbiter
