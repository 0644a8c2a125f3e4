// The engine over a caller's WeightCache (docs/architecture.md "Weight
// tiers"): same tokens as the private cache, reload after eviction (from the
// file, or from the host floor without calling the fill), NotResident in
// externally-managed mode, registration checks at Load, and leases that keep
// the weights in place while other threads evict.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "arbiter/engine/engine.h"
#include "arbiter/memory/device_backend.h"
#include "arbiter/memory/memory_ledger.h"
#include "arbiter/weights/weight_cache.h"
#include "tools/model_maker/model_maker.h"
#include "engine/internal/engine_impl.h"
#include "engine/internal/forward.h"
#include "engine/internal/test_model.h"

namespace arbiter {
namespace {

constexpr uint64_t kArenaBytes = uint64_t{64} << 20;  // room for a few tiny models

class EngineWeightsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(engine_internal::MakeTempDir("arbiter_engine_weights_test_"));
    Status s = MakeModel("tiny", *dir_, 7);
    ASSERT_TRUE(s.ok()) << s.ToString();
    other_dir_ = new std::string(engine_internal::MakeTempDir("arbiter_engine_weights_test_"));
    s = MakeModel("tiny-qwen2", *other_dir_, 7);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete other_dir_;
    dir_ = other_dir_ = nullptr;
  }

  // A cpu arena and a ledger-charging cache in `mode`.
  void MakeCache(ResidencyMode mode = ResidencyMode::kSelfManaged) {
    Result<std::unique_ptr<CpuDeviceBackend>> device = CpuDeviceBackend::Create(kArenaBytes);
    ASSERT_TRUE(device.ok()) << device.status().ToString();
    device_ = std::move(*device);
    WeightCacheOptions o;
    o.device = device_.get();
    o.ledger = &ledger_;
    o.mode = mode;
    Result<std::unique_ptr<WeightCache>> cache = WeightCache::Create(std::move(o));
    ASSERT_TRUE(cache.ok()) << cache.status().ToString();
    cache_ = std::move(*cache);
  }

  static EngineOptions Options(WeightCache* cache = nullptr, std::string key = "") {
    EngineOptions o;
    o.n_ctx = 256;
    o.n_slots = 2;
    o.prefill_batch = 16;
    o.weight_cache = cache;
    o.weight_key = std::move(key);
    return o;
  }

  // Registers *dir_ as `key`, with the fill wrapped to count its calls.
  void Register(const std::string& key, ResidencyState residency = ResidencyState::kUnpinned) {
    Result<WeightModel> m = Engine::WeightModelFor(*dir_, key, Options(), residency);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    WeightFill inner = std::move(m->fill);
    m->fill = [this, inner](const std::vector<void*>& arrays) {
      fills_.fetch_add(1);
      return inner(arrays);
    };
    Status s = cache_->Register(std::move(*m));
    ASSERT_TRUE(s.ok()) << s.ToString();
  }

  std::unique_ptr<Engine> Load(const EngineOptions& o) {
    Result<std::unique_ptr<Engine>> e = Engine::Load(*dir_, o);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    return e.ok() ? std::move(*e) : nullptr;
  }

  static GenerationRequest Greedy(const Engine& e, const std::string& text, int max_tokens = 16) {
    GenerationRequest r;
    r.prompt_ids = e.tokenizer().Encode(text, /*parse_special=*/false);
    r.sampling.temperature = 0.0f;
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    return r;
  }

  static std::vector<int32_t> Tokens(Engine& e, const GenerationRequest& r) {
    Result<GenerationResult> g = e.Generate(r, nullptr, nullptr);
    EXPECT_TRUE(g.ok()) << g.status().ToString();
    return g.ok() ? g->output_ids : std::vector<int32_t>{};
  }

  // The greedy tokens of `text` on an engine with a private cache.
  std::vector<int32_t> PrivateTokens(const std::string& text) {
    std::unique_ptr<Engine> e = Load(Options());
    if (e == nullptr) return {};
    return Tokens(*e, Greedy(*e, text));
  }

  WeightModelStats ModelStats(const std::string& key) const {
    for (const WeightModelStats& m : cache_->Stats().models) {
      if (m.key == key) return m;
    }
    ADD_FAILURE() << "no model " << key;
    return {};
  }

  static std::string* dir_;
  static std::string* other_dir_;
  // Declaration order = reverse destruction order: engines (declared in the
  // tests) go first, then the cache, the device and the ledger.
  MemoryLedger ledger_;
  std::unique_ptr<CpuDeviceBackend> device_;
  std::unique_ptr<WeightCache> cache_;
  std::atomic<int> fills_{0};
};
std::string* EngineWeightsTest::dir_ = nullptr;
std::string* EngineWeightsTest::other_dir_ = nullptr;

constexpr const char* kText = "The quick brown fox jumps over the lazy dog";

TEST_F(EngineWeightsTest, WeightModelForDescribesTheComputeLayout) {
  EngineOptions o = Options();
  o.n_ctx = 100000;  // clamped to the model's context
  Result<WeightModel> m = Engine::WeightModelFor(*dir_, "tiny", o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  std::unique_ptr<Engine> e = Load(Options());
  ASSERT_NE(e, nullptr);
  const auto& impl = dynamic_cast<const engine_internal::EngineImpl&>(*e);
  ASSERT_EQ(m->specs.size(), impl.layout().buffers.size());
  for (size_t i = 0; i < m->specs.size(); ++i) {
    EXPECT_EQ(m->specs[i].name, impl.layout().buffers[i].name);
    EXPECT_EQ(m->specs[i].dtype, DType::kF32);
    EXPECT_EQ(m->specs[i].shape, impl.layout().buffers[i].shape);
  }
  EXPECT_EQ(m->specs.front().name, "model.embed");
  EXPECT_EQ(m->specs[2].name, "model.layers.0.wqkv");
  EXPECT_EQ(m->key, "tiny");
  EXPECT_EQ(m->residency, ResidencyState::kUnpinned);
  const int n_ctx = e->config().max_position_embeddings;
  EXPECT_EQ(m->scratch_bytes,
            engine_internal::ForwardScratch(impl.decoder().dims(), 16, n_ctx, false, e->kv_type())
                .bytes());
  EXPECT_NE(m->digest, 0u);
  // Same files, same key → same digest; another key → another one.
  Result<WeightModel> again = Engine::WeightModelFor(*dir_, "tiny", o);
  Result<WeightModel> other = Engine::WeightModelFor(*dir_, "tiny2", o);
  ASSERT_TRUE(again.ok() && other.ok());
  EXPECT_EQ(again->digest, m->digest);
  EXPECT_NE(other->digest, m->digest);
  EXPECT_EQ(e->weight_bytes(), impl.layout().bytes());

  Result<WeightModel> missing = Engine::WeightModelFor("/nonexistent/model", "x", o);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/model"), std::string::npos);
  o.n_ctx = 1;
  EXPECT_EQ(Engine::WeightModelFor(*dir_, "x", o).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(EngineWeightsTest, CallerCacheGivesSameTokensAsPrivateCache) {
  const std::vector<int32_t> want = PrivateTokens(kText);
  ASSERT_FALSE(want.empty());
  MakeCache();
  Register("tiny");
  std::unique_ptr<Engine> e = Load(Options(cache_.get(), "tiny"));
  ASSERT_NE(e, nullptr);
  // Load made it resident; the engine holds no lease between calls.
  WeightModelStats s = ModelStats("tiny");
  EXPECT_TRUE(s.device_resident);
  EXPECT_EQ(s.leases, 0);
  EXPECT_EQ(s.loads, 1u);
  EXPECT_EQ(s.weight_bytes, e->weight_bytes());
  EXPECT_EQ(fills_.load(), 1);
  EXPECT_EQ(Tokens(*e, Greedy(*e, kText)), want);
  EXPECT_EQ(ModelStats("tiny").leases, 0);
  // Every device byte is on the ledger, under the model's owner.
  const MemoryLedgerSnapshot snap = ledger_.Snapshot();
  ASSERT_EQ(snap.by_owner.count("weights::tiny"), 1u);
  EXPECT_GE(snap.kind_bytes(ChargeKind::kDeviceWeights), e->weight_bytes());
  EXPECT_TRUE(e->Embed(Greedy(*e, kText).prompt_ids, nullptr).ok());
  EXPECT_TRUE(e->ComputeLogits(Greedy(*e, kText).prompt_ids).ok());
}

TEST_F(EngineWeightsTest, EvictedWeightsReloadOnTheNextRequest) {
  MakeCache();
  Register("tiny");
  std::unique_ptr<Engine> e = Load(Options(cache_.get(), "tiny"));
  ASSERT_NE(e, nullptr);
  const std::vector<int32_t> first = Tokens(*e, Greedy(*e, kText));
  ASSERT_FALSE(first.empty());
  Result<bool> evicted = cache_->Evict("tiny");
  ASSERT_TRUE(evicted.ok());
  EXPECT_TRUE(*evicted);
  EXPECT_FALSE(ModelStats("tiny").device_resident);
  // The reload is transparent, and the slot's cached prefix (computed with
  // the same weights before the eviction) stays valid.
  const std::vector<int32_t> second = Tokens(*e, Greedy(*e, kText));
  EXPECT_EQ(second, first);
  const WeightModelStats s = ModelStats("tiny");
  EXPECT_EQ(s.loads, 2u);
  EXPECT_EQ(s.last_load_source, WeightLoadSource::kFile);
  EXPECT_EQ(fills_.load(), 2);
  EXPECT_EQ(PrivateTokens(kText), first);
}

TEST_F(EngineWeightsTest, PinnedSystemReloadsFromTheFloorWithoutTheFill) {
  MakeCache();
  Register("tiny", ResidencyState::kPinnedSystem);
  ASSERT_TRUE(cache_->PreloadPinned().ok());
  EXPECT_TRUE(ModelStats("tiny").host_resident);
  EXPECT_EQ(fills_.load(), 1);  // the floor
  std::unique_ptr<Engine> e = Load(Options(cache_.get(), "tiny"));
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(ModelStats("tiny").last_load_source, WeightLoadSource::kFloor);
  const std::vector<int32_t> first = Tokens(*e, Greedy(*e, kText));
  ASSERT_TRUE(cache_->Evict("tiny").ok());
  EXPECT_FALSE(ModelStats("tiny").device_resident);
  EXPECT_EQ(Tokens(*e, Greedy(*e, kText)), first);
  const WeightModelStats s = ModelStats("tiny");
  EXPECT_EQ(s.loads, 2u);
  EXPECT_EQ(s.last_load_source, WeightLoadSource::kFloor);
  EXPECT_EQ(fills_.load(), 1);  // never re-read the file
  EXPECT_EQ(PrivateTokens(kText), first);
}

TEST_F(EngineWeightsTest, ExternallyManagedRequestForNonResidentModelIsNotResident) {
  MakeCache(ResidencyMode::kExternallyManaged);
  Register("tiny");
  // Not resident: Load cannot make it resident either.
  Result<std::unique_ptr<Engine>> refused = Engine::Load(*dir_, Options(cache_.get(), "tiny"));
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(IsNotResident(refused.status())) << refused.status().ToString();

  ASSERT_TRUE(cache_->SetResidency("tiny", ResidencyState::kPinnedDevice).ok());
  std::unique_ptr<Engine> e = Load(Options(cache_.get(), "tiny"));
  ASSERT_NE(e, nullptr);
  const GenerationRequest req = Greedy(*e, kText);
  const std::vector<int32_t> first = Tokens(*e, req);
  ASSERT_FALSE(first.empty());

  // The control plane unpins it: the device copy goes, requests fail.
  ASSERT_TRUE(cache_->SetResidency("tiny", ResidencyState::kUnpinned).ok());
  EXPECT_FALSE(ModelStats("tiny").device_resident);
  Result<GenerationResult> g = e->Generate(req, nullptr, nullptr);
  ASSERT_FALSE(g.ok());
  EXPECT_TRUE(IsNotResident(g.status())) << g.status().ToString();
  EXPECT_EQ(g.status().message(), NotResidentError("tiny").message());
  EXPECT_TRUE(IsNotResident(e->Embed(req.prompt_ids, nullptr).status()));
  EXPECT_TRUE(IsNotResident(e->ComputeLogits(req.prompt_ids).status()));
  auto* impl = dynamic_cast<engine_internal::EngineImpl*>(e.get());
  EXPECT_TRUE(IsNotResident(impl->IncrementalLogits(req.prompt_ids, 2).status()));
  EXPECT_EQ(ModelStats("tiny").leases, 0);

  // Pinned again: the same answer (the failed requests left the slots intact).
  ASSERT_TRUE(cache_->SetResidency("tiny", ResidencyState::kPinnedDevice).ok());
  Result<GenerationResult> again = e->Generate(req, nullptr, nullptr);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->output_ids, first);
  EXPECT_GT(again->cached_tokens, 0);
}

// SaveSlot / RestoreSlot / ClearSlot touch only KV buffers: they work while
// the weights are not resident and take no lease, and the Generate copy
// happens before the weight lease is refused.
TEST_F(EngineWeightsTest, SlotApisNeedNoResidentWeights) {
  MakeCache(ResidencyMode::kExternallyManaged);
  Register("tiny");
  ASSERT_TRUE(cache_->SetResidency("tiny", ResidencyState::kPinnedDevice).ok());
  std::unique_ptr<Engine> e = Load(Options(cache_.get(), "tiny"));
  ASSERT_NE(e, nullptr);
  GenerationRequest req = Greedy(*e, kText);
  req.slot = 0;
  const std::vector<int32_t> first = Tokens(*e, req);
  ASSERT_FALSE(first.empty());

  ASSERT_TRUE(cache_->SetResidency("tiny", ResidencyState::kUnpinned).ok());
  ASSERT_FALSE(ModelStats("tiny").device_resident);
  Result<KvSnapshot> saved = e->SaveSlot(0, nullptr);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  ASSERT_TRUE(e->ClearSlot(0, nullptr).ok());
  Result<int> n = e->RestoreSlot(1, *saved, nullptr);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, static_cast<int>(saved->n_tokens()));
  // Pinned to the empty slot 0: the prefix is copied from slot 1, then the
  // weights are refused; slot 0 keeps the copied prefix.
  Result<GenerationResult> g = e->Generate(req, nullptr, nullptr);
  EXPECT_TRUE(IsNotResident(g.status())) << g.status().ToString();
  EXPECT_EQ(e->SlotTokens(0).size(), req.prompt_ids.size() - 1);
  EXPECT_EQ(ModelStats("tiny").leases, 0);
  EXPECT_FALSE(ModelStats("tiny").device_resident);

  ASSERT_TRUE(cache_->SetResidency("tiny", ResidencyState::kPinnedDevice).ok());
  Result<GenerationResult> again = e->Generate(req, nullptr, nullptr);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->output_ids, first);
  EXPECT_EQ(again->cached_tokens, static_cast<int>(req.prompt_ids.size()) - 1);
  EXPECT_EQ(again->copied_tokens, 0);  // already in slot 0
}

TEST_F(EngineWeightsTest, LoadRequiresARegisteredMatchingKey) {
  MakeCache();
  Result<std::unique_ptr<Engine>> e = Engine::Load(*dir_, Options(cache_.get(), "nope"));
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(e.status().message().find("'nope'"), std::string::npos) << e.status().message();
  EXPECT_FALSE(cache_->Contains("nope"));  // Load never registers

  // A key registered for another model's layout is refused too.
  Result<WeightModel> other = Engine::WeightModelFor(*other_dir_, "other", Options());
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  ASSERT_TRUE(cache_->Register(std::move(*other)).ok());
  e = Engine::Load(*dir_, Options(cache_.get(), "other"));
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(e.status().message().find("WeightModelFor"), std::string::npos)
      << e.status().message();
}

TEST_F(EngineWeightsTest, FillErrorSurfacesAtLoad) {
  MakeCache();
  Result<WeightModel> m = Engine::WeightModelFor(*dir_, "broken", Options());
  ASSERT_TRUE(m.ok());
  m->fill = [](const std::vector<void*>&) {
    return DataLossError("model.safetensors: tensor \"x\" is truncated");
  };
  ASSERT_TRUE(cache_->Register(std::move(*m)).ok());
  Result<std::unique_ptr<Engine>> e = Engine::Load(*dir_, Options(cache_.get(), "broken"));
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(e.status().message(),
            "weights of 'broken': model.safetensors: tensor \"x\" is truncated");
  EXPECT_FALSE(ModelStats("broken").device_resident);
}

// Leases pin the weights for a whole request: evictions racing with four
// generating threads never change a token (an evicted-while-leased copy is
// freed when its last lease goes; the next request reloads it).
TEST_F(EngineWeightsTest, EvictionsDuringRequestsNeverChangeTokens) {
  MakeCache();
  Register("tiny");
  std::unique_ptr<Engine> e = Load(Options(cache_.get(), "tiny"));
  ASSERT_NE(e, nullptr);
  std::vector<GenerationRequest> reqs;
  std::vector<std::vector<int32_t>> want;
  for (int i = 0; i < 4; ++i) {
    reqs.push_back(Greedy(*e, "request " + std::to_string(i) + " says hi", 8));
    want.push_back(Tokens(*e, reqs.back()));
  }
  std::atomic<bool> done{false};
  std::thread evictor([&] {
    while (!done.load()) {
      EXPECT_TRUE(cache_->Evict("tiny").ok());
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> workers;
  for (int i = 0; i < 4; ++i) {
    workers.emplace_back([&, i] {
      for (int rep = 0; rep < 5; ++rep) {
        Result<GenerationResult> r = e->Generate(reqs[i], nullptr, nullptr);
        ASSERT_TRUE(r.ok()) << r.status().ToString();
        EXPECT_EQ(r->output_ids, want[i]) << "thread " << i << " rep " << rep;
      }
    });
  }
  for (std::thread& t : workers) t.join();
  done = true;
  evictor.join();
  // How often the race actually evicted depends on scheduling; report it.
  const WeightModelStats s = ModelStats("tiny");
  std::printf("[ weights  ] 20 requests, %llu loads, %llu evictions\n",
              static_cast<unsigned long long>(s.loads), static_cast<unsigned long long>(s.evicts));
  EXPECT_EQ(s.leases, 0);
  EXPECT_EQ(s.loads, s.evicts + (s.device_resident ? 1 : 0));
}

}  // namespace
}  // namespace arbiter
