// WeightCache: docs/weights.md acceptance 1–9, the cache defects it lists as
// fixed ('Leaks after a failed transfer', 'Budget between loads', 'Scratch
// of pinned models'), the ledger and the lease rules.
#include "arbiter/weights/weight_cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "arbiter/memory/device_backend.h"
#include "arbiter/memory/memory_ledger.h"
#include <spdlog/spdlog.h>

namespace arbiter {
namespace {

bool Contains(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

// A model of `n` f32 tensors of `floats` elements; fill writes
// value(i, j) = seed + i * 1000 + j and counts its calls.
struct FakeModel {
  std::string key;
  int n = 2;
  size_t floats = 256;  // 1 KiB per tensor
  float seed = 1;
  std::shared_ptr<std::atomic<int>> fills = std::make_shared<std::atomic<int>>(0);
  std::shared_ptr<std::atomic<bool>> poisoned = std::make_shared<std::atomic<bool>>(false);

  WeightModel Make(ResidencyState residency = ResidencyState::kUnpinned,
                   uint64_t scratch = 0) const {
    WeightModel m;
    m.key = key;
    for (int i = 0; i < n; ++i) {
      m.specs.push_back(WeightSpec{"t" + std::to_string(i), DType::kF32,
                                   {static_cast<int64_t>(floats)}});
    }
    m.digest = 42;
    m.residency = residency;
    m.scratch_bytes = scratch;
    auto fills_ = fills;
    auto poisoned_ = poisoned;
    const float s = seed;
    const size_t f = floats;
    m.fill = [fills_, poisoned_, s, f](const std::vector<void*>& arrays) -> Status {
      // Reference test 5: a poisoned file must not be read.
      if (poisoned_->load()) return DataLossError("poisoned file read");
      fills_->fetch_add(1);
      for (size_t i = 0; i < arrays.size(); ++i) {
        float* p = static_cast<float*>(arrays[i]);
        for (size_t j = 0; j < f; ++j) p[j] = s + static_cast<float>(i * 1000 + j);
      }
      return OkStatus();
    };
    return m;
  }
  uint64_t bytes() const { return static_cast<uint64_t>(n) * floats * sizeof(float); }
};

class WeightCacheTest : public ::testing::Test {
 protected:
  void SetUp() override { spdlog::set_level(spdlog::level::warn); }
  void TearDown() override { spdlog::set_level(spdlog::level::info); }

  // An arena in RAM whose on-demand budget (wiggle 0, fraction 1) holds
  // `budget_models` models of `model_bytes`.
  void MakeCache(uint64_t arena_bytes, ResidencyMode mode = ResidencyMode::kSelfManaged,
                 uint64_t ledger_budget = 0, uint64_t compaction_every_loads = 0) {
    Result<std::unique_ptr<CpuDeviceBackend>> d = CpuDeviceBackend::Create(arena_bytes);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    device_ = std::move(d).value();
    ledger_ = std::make_unique<MemoryLedger>(ledger_budget);
    WeightCacheOptions o;
    o.device = device_.get();
    o.ledger = ledger_.get();
    o.mode = mode;
    o.wiggle = 0;
    o.fraction = fraction_;
    o.compaction_every_loads = compaction_every_loads;
    reclaimer_ = std::make_unique<FunctionReclaimer>([this](size_t bytes) -> size_t {
      reclaim_calls_++;
      return reclaim_ ? reclaim_(bytes) : 0;
    });
    o.reclaimer = reclaimer_.get();
    Result<std::unique_ptr<WeightCache>> c = WeightCache::Create(std::move(o));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    cache_ = std::move(c).value();
  }

  WeightModelStats ModelStats(const std::string& key) {
    for (const WeightModelStats& m : cache_->Stats().models) {
      if (m.key == key) return m;
    }
    ADD_FAILURE() << "no model " << key;
    return {};
  }

  // The ledger equals the cache's own books (device + floors).
  void ExpectLedgerMatches() {
    WeightCacheStats s = cache_->Stats();
    MemoryLedgerSnapshot l = ledger_->Snapshot();
    EXPECT_EQ(l.kind_bytes(ChargeKind::kDeviceWeights), s.resident_bytes + s.pinned_bytes);
    EXPECT_EQ(l.kind_bytes(ChargeKind::kHostFloor), s.host_bytes);
    EXPECT_EQ(s.pool.in_use_bytes, s.resident_bytes + s.pinned_bytes);
  }

  std::unique_ptr<CpuDeviceBackend> device_;
  std::unique_ptr<MemoryLedger> ledger_;
  std::unique_ptr<WeightCache> cache_;
  std::function<uint64_t(uint64_t)> reclaim_;
  std::unique_ptr<FunctionReclaimer> reclaimer_;
  int reclaim_calls_ = 0;
  double fraction_ = 1.0;  // of the arena, for the on-demand budget
};

// docs/weights.md acceptance 1.
TEST_F(WeightCacheTest, FirstAcquireLoadsSecondDoesNotReload) {
  MakeCache(64 << 10);
  FakeModel a{"a"};
  ASSERT_TRUE(cache_->Register(a.Make()).ok());
  {
    Result<WeightLease> l = cache_->Acquire("a");
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    ASSERT_EQ(l->size(), 2u);
    const float* t1 = static_cast<const float*>(l->tensor(1));
    EXPECT_EQ(t1[5], 1 + 1000 + 5);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(l->tensor(0)) % 64, 0u);
  }
  ASSERT_TRUE(cache_->Acquire("a").ok());
  WeightCacheStats s = cache_->Stats();
  EXPECT_EQ(s.loads, 1u);
  EXPECT_EQ(s.evicts, 0u);
  EXPECT_EQ(a.fills->load(), 1);
  EXPECT_EQ(ModelStats("a").last_load_source, WeightLoadSource::kFile);
  ExpectLedgerMatches();
}

// docs/weights.md acceptance 2.
// Note [Changed model files]: a registration with a new digest drops the
// old device copy and floor; the next Acquire fills from the new files and
// re-makes the pinned floor. The same digest is a no-op; a leased model is
// refused.
TEST_F(WeightCacheTest, ReplaceWithANewDigestDropsTheOldCopyAndFloor) {
  MakeCache(64 << 10);
  FakeModel a{"a"};
  ASSERT_TRUE(cache_->Register(a.Make(ResidencyState::kPinnedSystem)).ok());
  ASSERT_TRUE(cache_->PreloadPinned().ok());
  {
    Result<WeightLease> l = cache_->Acquire("a");
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    EXPECT_EQ(static_cast<const float*>(l->tensor(0))[0], 1.0f);
    // Leased: refused, nothing changed.
    FakeModel b{"a"};
    b.seed = 7;
    WeightModel changed = b.Make(ResidencyState::kPinnedSystem);
    changed.digest = 43;
    EXPECT_EQ(cache_->Replace(std::move(changed)).status().code(),
              StatusCode::kFailedPrecondition);
  }
  Result<bool> same = cache_->Replace(a.Make(ResidencyState::kPinnedSystem));
  ASSERT_TRUE(same.ok());
  EXPECT_FALSE(*same);
  EXPECT_TRUE(ModelStats("a").host_resident);

  FakeModel b{"a"};
  b.seed = 7;
  WeightModel changed = b.Make(ResidencyState::kPinnedSystem);
  changed.digest = 43;
  Result<bool> replaced = cache_->Replace(std::move(changed));
  ASSERT_TRUE(replaced.ok()) << replaced.status().ToString();
  EXPECT_TRUE(*replaced);
  EXPECT_FALSE(ModelStats("a").device_resident);
  EXPECT_FALSE(ModelStats("a").host_resident);
  EXPECT_EQ(ModelStats("a").residency, ResidencyState::kPinnedSystem);
  ExpectLedgerMatches();
  {
    Result<WeightLease> l = cache_->Acquire("a");
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    EXPECT_EQ(static_cast<const float*>(l->tensor(0))[0], 7.0f);  // the new files
    EXPECT_EQ(b.fills->load(), 1);
  }
  ExpectLedgerMatches();
}

TEST_F(WeightCacheTest, BudgetOfOneModelEvictsTheOtherAndFreesItsBuffers) {
  MakeCache(3 << 10);  // on-demand budget 3 KiB: one 2 KiB model
  FakeModel a{"a"}, b{"b", 2, 256, 7};
  ASSERT_TRUE(cache_->Register(a.Make()).ok());
  ASSERT_TRUE(cache_->Register(b.Make()).ok());
  ASSERT_TRUE(cache_->Acquire("a").ok());
  Result<WeightLease> lb = cache_->Acquire("b");
  ASSERT_TRUE(lb.ok());
  EXPECT_EQ(static_cast<const float*>(lb->tensor(0))[0], 7);
  EXPECT_FALSE(ModelStats("a").device_resident);
  EXPECT_TRUE(ModelStats("b").device_resident);
  WeightCacheStats s = cache_->Stats();
  EXPECT_EQ(s.evicts, 1u);
  EXPECT_EQ(s.pool.live_blocks, 1u);
  EXPECT_LE(s.resident_bytes, s.max_bytes);
  ExpectLedgerMatches();
}

TEST_F(WeightCacheTest, LeasedModelsAreNeverVictims) {
  fraction_ = 3.0 / 16;  // budget 3 KiB of a 16 KiB arena: one 2 KiB model
  MakeCache(16 << 10);
  FakeModel a{"a"}, b{"b"};
  ASSERT_TRUE(cache_->Register(a.Make()).ok());
  ASSERT_TRUE(cache_->Register(b.Make()).ok());
  Result<WeightLease> la = cache_->Acquire("a");
  ASSERT_TRUE(la.ok());
  const void* before = la->tensor(0);
  // b does not fit beside a in the budget, but a is leased: b still loads
  // (the arena has room; over budget until a lease ends), and a stays where
  // it is.
  Result<WeightLease> lb = cache_->Acquire("b");
  ASSERT_TRUE(lb.ok()) << lb.status().ToString();
  EXPECT_TRUE(ModelStats("a").device_resident);
  EXPECT_EQ(la->tensor(0), before);
  EXPECT_EQ(static_cast<const float*>(la->tensor(0))[3], 1 + 3);
  // Once both are released the next load restores the budget.
  la->Release();
  lb->Release();
  FakeModel c{"c"};
  ASSERT_TRUE(cache_->Register(c.Make()).ok());
  ASSERT_TRUE(cache_->Acquire("c").ok());
  WeightCacheStats s = cache_->Stats();
  EXPECT_LE(s.resident_bytes, s.max_bytes);
}

TEST_F(WeightCacheTest, EvictLastModelsGoOnlyWhenNothingElseIsLeft) {
  MakeCache(5 << 10);  // two 2 KiB models fit, not three
  FakeModel chat{"chat"}, a{"a"}, b{"b"};
  WeightModel m = chat.Make();
  m.evict_last = true;
  ASSERT_TRUE(cache_->Register(std::move(m)).ok());
  ASSERT_TRUE(cache_->Register(a.Make()).ok());
  ASSERT_TRUE(cache_->Register(b.Make()).ok());
  ASSERT_TRUE(cache_->Acquire("chat").ok());  // least recently used, but evict_last
  ASSERT_TRUE(cache_->Acquire("a").ok());
  ASSERT_TRUE(cache_->Acquire("b").ok());
  EXPECT_TRUE(ModelStats("chat").device_resident);
  EXPECT_FALSE(ModelStats("a").device_resident);
  // With a leased, chat is the only idle copy left: it goes.
  Result<WeightLease> la = cache_->Acquire("a");
  ASSERT_TRUE(la.ok());
  EXPECT_FALSE(ModelStats("b").device_resident);
  EXPECT_TRUE(ModelStats("chat").device_resident);
  Result<WeightLease> lb = cache_->Acquire("b");
  ASSERT_TRUE(lb.ok());
  EXPECT_FALSE(ModelStats("chat").device_resident);
}

// docs/weights.md acceptance 3.
TEST_F(WeightCacheTest, PinnedDeviceModelIsResidentFromTheStartAndNeverFreed) {
  MakeCache(8 << 10);
  FakeModel p{"p"}, a{"a"}, b{"b"}, c{"c"};
  ASSERT_TRUE(cache_->Register(p.Make(ResidencyState::kPinnedDevice)).ok());
  for (FakeModel* m : {&a, &b, &c}) ASSERT_TRUE(cache_->Register(m->Make()).ok());
  ASSERT_TRUE(cache_->PreloadPinned().ok());
  ASSERT_TRUE(ModelStats("p").device_resident);
  std::pair<DeviceRegionId, uint64_t> addr;
  {
    Result<WeightLease> l = cache_->Acquire("p");
    ASSERT_TRUE(l.ok());
    addr = {l->region(), l->device_offset(0)};
  }
  for (int round = 0; round < 3; ++round) {
    for (const char* k : {"a", "b", "c"}) ASSERT_TRUE(cache_->Acquire(k).ok());
  }
  ASSERT_TRUE(cache_->Compact({}).ok());
  EXPECT_EQ(cache_->EvictIdle(UINT64_MAX), 0u);
  Result<WeightLease> l = cache_->Acquire("p");
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(std::make_pair(l->region(), l->device_offset(0)), addr);
  EXPECT_EQ(ModelStats("p").loads, 1u);
  EXPECT_EQ(ModelStats("p").evicts, 0u);
  // Pinned models are outside the on-demand budget.
  WeightCacheStats s = cache_->Stats();
  EXPECT_EQ(s.pinned_bytes, p.bytes());
  EXPECT_EQ(s.budget.on_demand_budget_bytes, s.budget.weight_pool_bytes - p.bytes());
}

// docs/weights.md acceptance 4.
TEST_F(WeightCacheTest, ModelHundredTimesTheBudgetLoadsWithAWarning) {
  Result<std::unique_ptr<CpuDeviceBackend>> cpu = CpuDeviceBackend::Create(16 << 20);
  ASSERT_TRUE(cpu.ok());
  WeightCacheOptions o;
  o.device = cpu->get();
  o.fraction = 0.01;  // on-demand budget ≈ 164 KiB of the 16 MiB arena
  o.wiggle = 0;
  Result<std::unique_ptr<WeightCache>> c = WeightCache::Create(std::move(o));
  ASSERT_TRUE(c.ok());
  WeightCache& cache = **c;
  FakeModel small{"small"};
  FakeModel big{"big", 1, 16000 * 1024 / 4};  // 16000 KiB
  ASSERT_TRUE(cache.Register(small.Make()).ok());
  ASSERT_TRUE(cache.Register(big.Make()).ok());
  ASSERT_TRUE(cache.Acquire("small").ok());
  const uint64_t budget = cache.Stats().max_bytes;
  ASSERT_GE(big.bytes(), 95 * budget);
  Result<WeightLease> l = cache.Acquire("big");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(static_cast<const float*>(l->tensor(0))[100], 1 + 100);
  WeightCacheStats s = cache.Stats();
  EXPECT_EQ(s.oversize_loads, 1u);
  EXPECT_EQ(s.evicts, 1u);  // everything evictable went first
  EXPECT_FALSE(s.models[0].device_resident);
}

// docs/weights.md acceptance 5.
TEST_F(WeightCacheTest, WithAHostFloorTheLoadNeverTouchesTheFile) {
  MakeCache(3 << 10);
  FakeModel a{"a"}, b{"b"};
  ASSERT_TRUE(cache_->Register(a.Make(ResidencyState::kPinnedSystem)).ok());
  ASSERT_TRUE(cache_->Register(b.Make()).ok());
  ASSERT_TRUE(cache_->PreloadPinned().ok());
  EXPECT_TRUE(ModelStats("a").host_resident);
  EXPECT_EQ(a.fills->load(), 1);
  a.poisoned->store(true);  // any read of the file now fails
  for (int round = 0; round < 3; ++round) {
    Result<WeightLease> la = cache_->Acquire("a");
    ASSERT_TRUE(la.ok()) << la.status().ToString();
    EXPECT_EQ(static_cast<const float*>(la->tensor(1))[9], 1 + 1000 + 9);
    la->Release();
    ASSERT_TRUE(cache_->Acquire("b").ok());  // evicts a's device copy
  }
  EXPECT_EQ(a.fills->load(), 1);
  EXPECT_EQ(ModelStats("a").loads, 3u);
  EXPECT_EQ(ModelStats("a").last_load_source, WeightLoadSource::kFloor);
  ExpectLedgerMatches();
}

// docs/weights.md acceptance 6.
TEST_F(WeightCacheTest, ExternallyManagedResidencyTransitions) {
  MakeCache(64 << 10, ResidencyMode::kExternallyManaged);
  FakeModel a{"a"};
  ASSERT_TRUE(cache_->Register(a.Make()).ok());
  Result<WeightLease> l = cache_->Acquire("a");
  ASSERT_FALSE(l.ok());
  EXPECT_TRUE(IsNotResident(l.status()));
  EXPECT_EQ(l.status().message(),
            "model 'a' is not resident on the device; the control plane must pin it before "
            "inference");
  // → PINNED_DEVICE: resident, outside the LRU.
  ASSERT_TRUE(cache_->SetResidency("a", ResidencyState::kPinnedDevice).ok());
  EXPECT_TRUE(ModelStats("a").device_resident);
  EXPECT_EQ(cache_->Stats().pinned_bytes, a.bytes());
  EXPECT_EQ(cache_->Stats().resident_bytes, 0u);
  ASSERT_TRUE(cache_->Acquire("a").ok());
  // → PINNED_SYSTEM: keeps a floor, frees the device copy.
  Result<ResidencyState> prev = cache_->SetResidency("a", ResidencyState::kPinnedSystem);
  ASSERT_TRUE(prev.ok());
  EXPECT_EQ(*prev, ResidencyState::kPinnedDevice);
  EXPECT_FALSE(ModelStats("a").device_resident);
  EXPECT_TRUE(ModelStats("a").host_resident);
  EXPECT_TRUE(IsNotResident(cache_->Acquire("a").status()));
  // → UNPINNED: drops the floor.
  ASSERT_TRUE(cache_->SetResidency("a", ResidencyState::kUnpinned).ok());
  EXPECT_FALSE(ModelStats("a").host_resident);
  EXPECT_EQ(ledger_->charged_bytes(), 0u);
  // The floor was made from the device copy, never from the file again.
  EXPECT_EQ(a.fills->load(), 1);
}

TEST_F(WeightCacheTest, ExternallyManagedDemotionOfALeasedModelFreesAfterTheLease) {
  MakeCache(64 << 10, ResidencyMode::kExternallyManaged);
  FakeModel a{"a"};
  ASSERT_TRUE(cache_->Register(a.Make(ResidencyState::kPinnedDevice)).ok());
  ASSERT_TRUE(cache_->PreloadPinned().ok());
  Result<WeightLease> l = cache_->Acquire("a");
  ASSERT_TRUE(l.ok());
  ASSERT_TRUE(cache_->SetResidency("a", ResidencyState::kUnpinned).ok());
  EXPECT_TRUE(ModelStats("a").device_resident);  // in use: not yanked
  EXPECT_EQ(static_cast<const float*>(l->tensor(0))[1], 2);
  // Already not resident for the control plane: new requests are refused.
  EXPECT_TRUE(IsNotResident(cache_->Acquire("a").status()));
  l->Release();
  EXPECT_FALSE(ModelStats("a").device_resident);
  ExpectLedgerMatches();
}

// docs/weights.md acceptance 7 (the cache's part; the HTTP status is tested end to end).
TEST_F(WeightCacheTest, StatusReportsModeAndPerModelStateUnknownFails) {
  MakeCache(64 << 10);
  FakeModel a{"a"};
  ASSERT_TRUE(cache_->Register(a.Make(ResidencyState::kPinnedSystem)).ok());
  WeightCacheStats s = cache_->Stats();
  EXPECT_EQ(s.mode, ResidencyMode::kSelfManaged);
  ASSERT_EQ(s.models.size(), 1u);
  EXPECT_EQ(s.models[0].residency, ResidencyState::kPinnedSystem);
  EXPECT_EQ(s.models[0].weight_bytes, a.bytes());
  EXPECT_FALSE(s.models[0].device_resident);
  EXPECT_EQ(cache_->DeviceResident("a"), false);
  EXPECT_EQ(cache_->DeviceResident("nope"), std::nullopt);
  EXPECT_EQ(cache_->Acquire("nope").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(cache_->SetResidency("nope", ResidencyState::kUnpinned).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(cache_->Evict("nope").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(cache_->ReleaseAll("nope").code(), StatusCode::kNotFound);
  EXPECT_EQ(cache_->Compact({"nope"}).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(cache_->Register(a.Make()).code(), StatusCode::kAlreadyExists);
}

// docs/weights.md acceptance 8.
TEST_F(WeightCacheTest, CompactionFreesOnDemandLeavesPinnedAndReloadsOnlyTheList) {
  MakeCache(16 << 10);
  FakeModel p{"p"}, a{"a"}, b{"b"};
  ASSERT_TRUE(cache_->Register(p.Make(ResidencyState::kPinnedDevice)).ok());
  ASSERT_TRUE(cache_->Register(a.Make()).ok());
  ASSERT_TRUE(cache_->Register(b.Make()).ok());
  ASSERT_TRUE(cache_->PreloadPinned().ok());
  std::vector<float> pinned_before(p.floats);
  std::pair<DeviceRegionId, uint64_t> pinned_addr;
  {
    Result<WeightLease> l = cache_->Acquire("p");
    ASSERT_TRUE(l.ok());
    pinned_addr = {l->region(), l->device_offset(0)};
    std::memcpy(pinned_before.data(), l->tensor(0), p.floats * 4);
  }
  ASSERT_TRUE(cache_->Acquire("a").ok());
  ASSERT_TRUE(cache_->Acquire("b").ok());
  Result<CompactResult> r = cache_->Compact({});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->reloaded, 0);
  EXPECT_EQ(r->freed_bytes, a.bytes() + b.bytes());
  WeightCacheStats s = cache_->Stats();
  EXPECT_EQ(s.resident_bytes, 0u);
  EXPECT_EQ(s.compactions, 1u);
  EXPECT_EQ(r->resident_bytes_after, p.bytes());
  EXPECT_EQ(s.pool.free_blocks, 1u);  // coalesced above the pinned model
  {
    Result<WeightLease> l = cache_->Acquire("p");
    ASSERT_TRUE(l.ok());
    EXPECT_EQ(std::make_pair(l->region(), l->device_offset(0)), pinned_addr);
    EXPECT_EQ(std::memcmp(pinned_before.data(), l->tensor(0), p.floats * 4), 0);
  }
  // The next dispatch reloads.
  ASSERT_TRUE(cache_->Acquire("a").ok());
  EXPECT_EQ(ModelStats("a").loads, 2u);
  // reload = [b] reloads b only.
  r = cache_->Compact({"b"});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->reloaded, 1);
  EXPECT_FALSE(ModelStats("a").device_resident);
  EXPECT_TRUE(ModelStats("b").device_resident);
  EXPECT_EQ(r->resident_bytes_after, p.bytes() + b.bytes());
  ExpectLedgerMatches();
}

TEST_F(WeightCacheTest, CompactionLeavesLeasedModelsInPlace) {
  MakeCache(16 << 10);
  FakeModel a{"a"}, b{"b"};
  ASSERT_TRUE(cache_->Register(a.Make()).ok());
  ASSERT_TRUE(cache_->Register(b.Make()).ok());
  Result<WeightLease> la = cache_->Acquire("a");
  ASSERT_TRUE(la.ok());
  ASSERT_TRUE(cache_->Acquire("b").ok());
  Result<CompactResult> r = cache_->Compact({});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->skipped_leased, std::vector<std::string>{"a"});
  EXPECT_TRUE(ModelStats("a").device_resident);
  EXPECT_FALSE(ModelStats("b").device_resident);
}

// docs/weights.md acceptance 9.
TEST_F(WeightCacheTest, AutoCompactionRunsAfterTheSecondLoad) {
  MakeCache(16 << 10, ResidencyMode::kSelfManaged, 0, /*compaction_every_loads=*/2);
  FakeModel a{"a"}, b{"b"};
  ASSERT_TRUE(cache_->Register(a.Make()).ok());
  ASSERT_TRUE(cache_->Register(b.Make()).ok());
  ASSERT_TRUE(cache_->Acquire("a").ok());
  EXPECT_EQ(cache_->Stats().compactions, 0u);
  Result<WeightLease> lb = cache_->Acquire("b");
  ASSERT_TRUE(lb.ok());
  EXPECT_EQ(cache_->Stats().compactions, 1u);
  // b (just loaded, leased) stays; a was freed and reloads lazily.
  EXPECT_TRUE(ModelStats("b").device_resident);
  EXPECT_FALSE(ModelStats("a").device_resident);
}

// docs/weights.md, 'Leaks after a failed transfer'.
TEST_F(WeightCacheTest, FailedTransferFreesWhatItHadTransferred) {
  Result<std::unique_ptr<DeviceBackend>> d = MakeDeviceBackend("fake", 1 << 20);
  ASSERT_TRUE(d.ok());
  auto* fake = static_cast<FakeDeviceBackend*>(d->get());
  MemoryLedger ledger;
  PrivateWeightStore store;
  WeightCacheOptions o;
  o.device = fake;
  o.ledger = &ledger;
  o.store = &store;
  Result<std::unique_ptr<WeightCache>> c = WeightCache::Create(std::move(o));
  ASSERT_TRUE(c.ok());
  FakeModel a{"a", 4};
  ASSERT_TRUE((*c)->Register(a.Make(ResidencyState::kPinnedSystem)).ok());
  ASSERT_TRUE((*c)->SetResidency("a", ResidencyState::kPinnedSystem).ok());
  // Every tensor's copy is issued, then waited for: 0, 1 and 3 copied, 2
  // fails at its Wait.
  fake->FailNthCopy(3, StatusCode::kInternal);
  Result<WeightLease> l = (*c)->Acquire("a");
  ASSERT_FALSE(l.ok());
  EXPECT_TRUE(Contains(l.status().message(), "weights of 'a'")) << l.status().message();
  WeightCacheStats s = (*c)->Stats();
  EXPECT_EQ(s.pool.in_use_bytes, 0u);
  EXPECT_EQ(s.resident_bytes, 0u);
  EXPECT_EQ(ledger.Snapshot().kind_bytes(ChargeKind::kDeviceWeights), 0u);
  EXPECT_EQ(fake->stats().copies_to_device, 3u);
  EXPECT_EQ(fake->stats().failed_copies, 1u);
  // The block's region went back to the device.
  EXPECT_EQ(s.pool.regions, 0u);
  EXPECT_EQ(fake->stats().live_regions, 0u);
  // The next acquire retries and succeeds.
  EXPECT_TRUE((*c)->Acquire("a").ok());
  EXPECT_EQ((*c)->Stats().pool.live_blocks, 1u);
}

// Note [Device copies]: a load issues every tensor's copy and waits for all
// of them; the model is resident only once the device completed them. When
// its copy is evicted, the pool's region goes back to the device.
TEST_F(WeightCacheTest, LoadWaitsForAsynchronousCopiesAndEvictionReturnsTheRegion) {
  FakeDeviceBackend fake(1 << 20);
  MemoryLedger ledger;
  PrivateWeightStore store;
  WeightCacheOptions o;
  o.device = &fake;
  o.ledger = &ledger;
  o.store = &store;
  Result<std::unique_ptr<WeightCache>> c = WeightCache::Create(std::move(o));
  ASSERT_TRUE(c.ok());
  FakeModel a{"a", 4};
  ASSERT_TRUE((*c)->Register(a.Make(ResidencyState::kPinnedSystem)).ok());
  ASSERT_TRUE((*c)->SetResidency("a", ResidencyState::kPinnedSystem).ok());
  fake.SetAsyncCopies(true);
  std::atomic<bool> returned{false};
  std::optional<Result<WeightLease>> lease;
  std::thread acquirer([&] {
    lease.emplace((*c)->Acquire("a"));
    returned = true;
  });
  while (fake.stats().pending_copies < 4) std::this_thread::yield();
  EXPECT_FALSE(returned.load());  // its copies are still in flight
  EXPECT_EQ((*c)->Stats().resident_bytes, 0u);
  EXPECT_EQ(fake.CompletePendingCopies(), 4u);
  acquirer.join();
  ASSERT_TRUE(lease->ok()) << lease->status().ToString();
  EXPECT_GT((*c)->Stats().resident_bytes, 0u);
  EXPECT_EQ(fake.stats().live_regions, 1u);
  lease.reset();
  fake.SetAsyncCopies(false);
  EXPECT_GT((*c)->EvictIdle(UINT64_MAX), 0u);
  EXPECT_EQ((*c)->Stats().pool.regions, 0u);
  EXPECT_EQ(fake.stats().live_regions, 0u);
  EXPECT_EQ(fake.stats().live_region_bytes, 0u);
}

TEST_F(WeightCacheTest, FailedFillFailsEveryWaiterAndTheNextAcquireRetries) {
  MakeCache(64 << 10);
  FakeModel a{"a"};
  ASSERT_TRUE(cache_->Register(a.Make()).ok());
  a.poisoned->store(true);
  Result<WeightLease> l = cache_->Acquire("a");
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(cache_->Stats().pool.in_use_bytes, 0u);
  EXPECT_EQ(ledger_->charged_bytes(), 0u);
  a.poisoned->store(false);
  EXPECT_TRUE(cache_->Acquire("a").ok());
}

TEST_F(WeightCacheTest, AFillThatThrowsFailsTheLoadAndLeavesNothingBusy) {
  MakeCache(64 << 10);
  FakeModel a{"a"};
  WeightModel m = a.Make();
  auto throws = std::make_shared<std::atomic<bool>>(true);
  WeightFill inner = m.fill;
  m.fill = [inner, throws](const std::vector<void*>& arrays) -> Status {
    if (throws->load()) throw std::runtime_error("boom");
    return inner(arrays);
  };
  ASSERT_TRUE(cache_->Register(std::move(m)).ok());
  Result<WeightLease> l = cache_->Acquire("a");
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), StatusCode::kInternal);
  EXPECT_TRUE(Contains(l.status().message(), "boom")) << l.status().message();
  EXPECT_EQ(cache_->Stats().pool.in_use_bytes, 0u);
  EXPECT_FALSE(cache_->SetResidency("a", ResidencyState::kPinnedSystem).ok());
  EXPECT_EQ(ledger_->charged_bytes(), 0u);
  EXPECT_FALSE(ModelStats("a").host_resident);
  throws->store(false);
  EXPECT_TRUE(cache_->SetResidency("a", ResidencyState::kPinnedSystem).ok());
  EXPECT_TRUE(cache_->Acquire("a").ok());
}

// docs/weights.md, 'Budget between loads': a demotion joins the on-demand
// footprint; the budget holds at once, not at the next load.
TEST_F(WeightCacheTest, DemotionKeepsTheBudgetAtEveryInstant) {
  MakeCache(5 << 10);  // weight pool 5 KiB
  FakeModel p{"p"}, a{"a"};
  ASSERT_TRUE(cache_->Register(p.Make(ResidencyState::kPinnedDevice)).ok());
  ASSERT_TRUE(cache_->Register(a.Make()).ok());
  ASSERT_TRUE(cache_->PreloadPinned().ok());
  ASSERT_TRUE(cache_->Acquire("a").ok());  // budget 3 KiB, a takes 2
  // p leaves the device floor (self-managed: stays resident, evictable): the
  // on-demand budget grows to 5 KiB but the footprint is 4: fits, nothing
  // evicted.
  ASSERT_TRUE(cache_->SetResidency("p", ResidencyState::kUnpinned).ok());
  WeightCacheStats s = cache_->Stats();
  EXPECT_LE(s.resident_bytes, s.max_bytes);
  EXPECT_TRUE(ModelStats("p").device_resident);
  // Pin a to the device: the budget shrinks to 3 KiB; p (2 KiB, idle) still fits.
  ASSERT_TRUE(cache_->SetResidency("a", ResidencyState::kPinnedDevice).ok());
  s = cache_->Stats();
  EXPECT_LE(s.resident_bytes, s.max_bytes);
  // A pin that takes the pinned total past the pool is refused with the reason.
  FakeModel big{"big", 2, 512};  // 4 KiB
  ASSERT_TRUE(cache_->Register(big.Make()).ok());
  Result<ResidencyState> r = cache_->SetResidency("big", ResidencyState::kPinnedDevice);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(r.status().message(), "cannot pin 'big'")) << r.status().message();
  EXPECT_EQ(ModelStats("big").residency, ResidencyState::kUnpinned);
  ExpectLedgerMatches();
}

// docs/weights.md, 'Scratch of pinned models': reserved too.
TEST_F(WeightCacheTest, ScratchOfPinnedModelsIsReserved) {
  MakeCache(100 << 10);
  FakeModel p{"p"}, a{"a"};
  ASSERT_TRUE(cache_->Register(p.Make(ResidencyState::kPinnedDevice, 30 << 10)).ok());
  ASSERT_TRUE(cache_->Register(a.Make(ResidencyState::kUnpinned, 10 << 10)).ok());
  WeightCacheStats s = cache_->Stats();
  EXPECT_EQ(s.max_scratch_bytes, 30u << 10);
  EXPECT_EQ(s.budget.weight_pool_bytes, (100u << 10) - (30u << 10));
}

TEST_F(WeightCacheTest, FullLedgerEvictsIdleCopiesThenAsksReclaimThenRefusesWhileLeased) {
  // Ledger of 5 KiB: a (2 KiB) + b (2 KiB) + 1 KiB of another owner.
  MakeCache(64 << 10, ResidencyMode::kSelfManaged, 5 << 10);
  FakeModel a{"a"}, b{"b"}, c{"c"};
  for (FakeModel* m : {&a, &b, &c}) ASSERT_TRUE(cache_->Register(m->Make()).ok());
  MemoryCharge other = ledger_->Charge("text::x", ChargeKind::kKvSlot, 1 << 10);
  Result<WeightLease> la = cache_->Acquire("a");
  ASSERT_TRUE(la.ok());
  ASSERT_TRUE(cache_->Acquire("b").ok());
  // c needs 2 KiB: b is idle and is evicted for the ledger.
  Result<WeightLease> lc = cache_->Acquire("c");
  ASSERT_TRUE(lc.ok()) << lc.status().ToString();
  EXPECT_FALSE(ModelStats("b").device_resident);
  EXPECT_LE(ledger_->charged_bytes(), ledger_->budget_bytes());
  // Now a and c are leased; b needs room: reclaim frees the other owner.
  reclaim_ = [&](uint64_t) -> uint64_t {
    const uint64_t freed = other.bytes();
    other.Release();
    return freed;
  };
  ledger_->SetBudget(5 << 10);
  Result<WeightLease> lb = cache_->Acquire("b");
  EXPECT_FALSE(lb.ok());  // 2+2+1 = 5 KiB charged; b needs 2 more; reclaim frees 1 only
  EXPECT_EQ(lb.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(lb.status().message(), "'a' (1 lease(s))")) << lb.status().message();
  EXPECT_GE(reclaim_calls_, 1);
  EXPECT_LE(ledger_->charged_bytes(), ledger_->budget_bytes());
  EXPECT_EQ(ledger_->Snapshot().over_commits, 0u);
  // With nothing leased, the one over-budget exception applies.
  la->Release();
  lc->Release();
  ledger_->SetBudget(1 << 10);
  Result<WeightLease> lb2 = cache_->Acquire("b");
  EXPECT_TRUE(lb2.ok()) << lb2.status().ToString();
  EXPECT_EQ(ledger_->Snapshot().over_commits, 1u);
}

// Regression (scripts/soak.py: two 204 MiB chat models charged together
// over a 393 MiB budget): a load in flight holds its charge and is about to
// be leased, so a second load that cannot make room is refused, not
// over-committed next to it. The over-budget exception stays for a model
// alone.
TEST_F(WeightCacheTest, ALoadInFlightCountsAsInUseSoASecondLoadIsRefusedNotOverCommitted) {
  MakeCache(64 << 10, ResidencyMode::kSelfManaged, 3 << 10);  // ledger: one 2 KiB model
  FakeModel a{"a"}, b{"b"};
  std::mutex mu;
  std::condition_variable cv;
  bool filling = false, go = false;
  WeightModel ma = a.Make();
  WeightFill fill_a = ma.fill;
  ma.fill = [&, fill_a](const std::vector<void*>& arrays) -> Status {
    std::unique_lock<std::mutex> l(mu);
    filling = true;
    cv.notify_all();
    cv.wait(l, [&] { return go; });
    return fill_a(arrays);
  };
  ASSERT_TRUE(cache_->Register(std::move(ma)).ok());
  ASSERT_TRUE(cache_->Register(b.Make()).ok());
  Result<WeightLease> la = InternalError("not run");
  std::thread loader([&] { la = cache_->Acquire("a"); });
  bool a_in_flight;
  {
    std::unique_lock<std::mutex> l(mu);
    a_in_flight = cv.wait_for(l, std::chrono::seconds(30), [&] { return filling; });
  }
  EXPECT_TRUE(a_in_flight);
  if (a_in_flight) {
    Result<WeightLease> lb = cache_->Acquire("b");
    EXPECT_FALSE(lb.ok());
    EXPECT_EQ(lb.status().code(), StatusCode::kResourceExhausted);
    EXPECT_EQ(lb.status().reason(), ErrorReason::kBudgetExceeded);
    EXPECT_TRUE(Contains(lb.status().message(), "'a' (loading)")) << lb.status().message();
    EXPECT_LE(ledger_->charged_bytes(), ledger_->budget_bytes());
    EXPECT_EQ(ledger_->Snapshot().over_commits, 0u);
  }
  {
    std::lock_guard<std::mutex> l(mu);
    go = true;
  }
  cv.notify_all();
  loader.join();
  ASSERT_TRUE(la.ok()) << la.status().ToString();
  la->Release();
  // a is idle now: b evicts it and loads within the budget.
  Result<WeightLease> lb = cache_->Acquire("b");
  EXPECT_TRUE(lb.ok()) << lb.status().ToString();
  EXPECT_FALSE(ModelStats("a").device_resident);
  EXPECT_EQ(ledger_->Snapshot().over_commits, 0u);
  ExpectLedgerMatches();
}

TEST_F(WeightCacheTest, ReleaseAllDropsDeviceAndFloorButNotWhileLeased) {
  MakeCache(64 << 10);
  FakeModel a{"a"};
  ASSERT_TRUE(cache_->Register(a.Make(ResidencyState::kPinnedDevice)).ok());
  ASSERT_TRUE(cache_->PreloadPinned().ok());
  EXPECT_TRUE(ModelStats("a").host_resident);
  {
    Result<WeightLease> l = cache_->Acquire("a");
    ASSERT_TRUE(l.ok());
    EXPECT_EQ(cache_->ReleaseAll("a").code(), StatusCode::kFailedPrecondition);
  }
  ASSERT_TRUE(cache_->ReleaseAll("a").ok());
  WeightModelStats m = ModelStats("a");
  EXPECT_FALSE(m.device_resident);
  EXPECT_FALSE(m.host_resident);
  EXPECT_EQ(m.residency, ResidencyState::kUnpinned);
  EXPECT_EQ(ledger_->charged_bytes(), 0u);
}

TEST_F(WeightCacheTest, EvictOfALeasedModelHappensAtItsLastRelease) {
  MakeCache(64 << 10);
  FakeModel a{"a"};
  ASSERT_TRUE(cache_->Register(a.Make()).ok());
  Result<WeightLease> l = cache_->Acquire("a");
  ASSERT_TRUE(l.ok());
  Result<bool> now = cache_->Evict("a");
  ASSERT_TRUE(now.ok());
  EXPECT_FALSE(*now);
  EXPECT_TRUE(ModelStats("a").device_resident);
  // A new lease meanwhile does not cancel it: the copy goes after the last.
  Result<WeightLease> l2 = cache_->Acquire("a");
  ASSERT_TRUE(l2.ok());
  l->Release();
  EXPECT_TRUE(ModelStats("a").device_resident);
  l2->Release();
  EXPECT_FALSE(ModelStats("a").device_resident);
  EXPECT_EQ(ledger_->charged_bytes(), 0u);
}

TEST_F(WeightCacheTest, ConcurrentAcquiresShareOneLoadAndKeepTheBooks) {
  MakeCache(6 << 10);  // room for 3 of the 4 models
  std::vector<FakeModel> models;
  for (int i = 0; i < 4; ++i) models.push_back(FakeModel{"m" + std::to_string(i), 2, 256,
                                                         static_cast<float>(i)});
  for (const FakeModel& m : models) ASSERT_TRUE(cache_->Register(m.Make()).ok());
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const int k = (t + i) % 4;
        Result<WeightLease> l = cache_->Acquire(models[k].key);
        if (!l.ok()) {
          // Four leased 2 KiB models cannot share a 6 KiB ledger-free arena:
          // the arena itself refuses the fourth.
          if (l.status().code() != StatusCode::kResourceExhausted) bad++;
          continue;
        }
        const float* p = static_cast<const float*>(l->tensor(1));
        if (p[17] != static_cast<float>(k) + 1000 + 17) bad++;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
  WeightCacheStats s = cache_->Stats();
  EXPECT_LE(s.resident_bytes, s.max_bytes);
  ExpectLedgerMatches();
  for (const WeightModelStats& m : s.models) EXPECT_EQ(m.leases, 0);
}

// Note [Demotion floors]: a cache whose copies live in a device domain
// (the "cpu" backend standing in for the device). Demoting for room on the
// device keeps a host floor (charged kHostFloor to the host) when the host
// takes it as it stands, so the next wake copies from it without reading
// the file; the host's stage drops such floors, never a pinned floor.
TEST_F(WeightCacheTest, DemotionOnADeviceKeepsAHostFloorWhenTheHostBudgetAllows) {
  Result<std::unique_ptr<CpuDeviceBackend>> d = CpuDeviceBackend::Create(64 << 10);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  device_ = std::move(d).value();
  ledger_ = std::make_unique<MemoryLedger>(64 << 10);
  Result<MemoryDomain> gpu = ledger_->RegisterDomain("vulkan:0", {.budget_bytes = 16 << 10});
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  WeightCacheOptions o;
  o.device = device_.get();
  o.ledger = ledger_.get();
  o.wiggle = 0;
  o.fraction = 1.0;
  o.domain = *gpu;
  Result<std::unique_ptr<WeightCache>> c = WeightCache::Create(std::move(o));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  cache_ = std::move(c).value();
  FakeModel a{"a"}, b{"b"}, p{"p"};
  ASSERT_TRUE(cache_->Register(a.Make()).ok());
  ASSERT_TRUE(cache_->Register(b.Make()).ok());
  ASSERT_TRUE(cache_->Register(p.Make(ResidencyState::kPinnedSystem)).ok());
  auto books_match = [&] {
    const WeightCacheStats s = cache_->Stats();
    EXPECT_EQ(ledger_->DomainSnapshot(kHostDomain).kind_bytes(ChargeKind::kHostFloor), s.host_bytes);
    EXPECT_EQ(ledger_->DomainSnapshot(*gpu).kind_bytes(ChargeKind::kDeviceWeights),
              s.resident_bytes + s.pinned_bytes);
    EXPECT_EQ(ledger_->DomainSnapshot(*gpu).kind_bytes(ChargeKind::kHostFloor), 0u);
  };
  ASSERT_TRUE(cache_->Acquire("a").ok());
  EXPECT_EQ(a.fills->load(), 1);
  EXPECT_FALSE(ModelStats("a").host_resident);

  // Demoted for room on the device: the device copy goes, a floor stays.
  EXPECT_EQ(cache_->DemoteIdle(1), a.bytes());
  EXPECT_FALSE(ModelStats("a").device_resident);
  EXPECT_TRUE(ModelStats("a").host_resident);
  EXPECT_GE(ModelStats("a").host_bytes, a.bytes());
  EXPECT_EQ(ledger_->charged_bytes(*gpu), 0u);
  books_match();
  // The wake copies from the floor: the file is never read.
  a.poisoned->store(true);
  {
    Result<WeightLease> l = cache_->Acquire("a");
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    EXPECT_EQ(ModelStats("a").last_load_source, WeightLoadSource::kFloor);
    const float* w = static_cast<const float*>(l->tensor(1));
    ASSERT_NE(w, nullptr);
    EXPECT_EQ(w[7], 1.0f + 1000 + 7);  // the floor holds what the file held
  }
  a.poisoned->store(false);
  EXPECT_EQ(a.fills->load(), 1);
  books_match();

  // The host's stage drops demotion floors, never a pinned floor.
  ASSERT_TRUE(cache_->PreloadPinned().ok());
  EXPECT_TRUE(ModelStats("p").host_resident);
  EXPECT_GE(cache_->DropDemotionFloors(std::numeric_limits<size_t>::max()), a.bytes());
  EXPECT_FALSE(ModelStats("a").host_resident);
  EXPECT_TRUE(ModelStats("a").device_resident);  // its device copy is untouched
  EXPECT_TRUE(ModelStats("p").host_resident);
  books_match();

  // A host without room for the floor: demoted all the same, without one,
  // and the host's other charges are never reclaimed for it.
  ASSERT_TRUE(cache_->Acquire("b").ok());
  ledger_->SetBudget(ledger_->charged_bytes() + 1024);
  EXPECT_EQ(cache_->DemoteIdle(std::numeric_limits<size_t>::max()), a.bytes() + b.bytes());
  EXPECT_FALSE(ModelStats("a").host_resident);
  EXPECT_FALSE(ModelStats("b").host_resident);
  EXPECT_FALSE(ModelStats("b").device_resident);
  EXPECT_LE(ledger_->charged_bytes(), ledger_->budget_bytes());
  EXPECT_EQ(ledger_->Snapshot().over_commits, 0u);
  books_match();
  ASSERT_TRUE(cache_->Acquire("b").ok());
  EXPECT_EQ(ModelStats("b").last_load_source, WeightLoadSource::kFile);
  // A model's unload (Evict) drops its demotion floor with the device copy;
  // ReleaseAll drops it too; a pinned floor stays.
  ledger_->SetBudget(64 << 10);
  ASSERT_EQ(cache_->DemoteIdle(std::numeric_limits<size_t>::max()), b.bytes());
  EXPECT_TRUE(ModelStats("b").host_resident);
  ASSERT_TRUE(cache_->Acquire("b").ok());
  EXPECT_EQ(ModelStats("b").last_load_source, WeightLoadSource::kFloor);
  EXPECT_TRUE(cache_->Evict("b").value());
  EXPECT_FALSE(ModelStats("b").host_resident);
  EXPECT_FALSE(ModelStats("b").device_resident);
  ASSERT_TRUE(cache_->Acquire("b").ok());
  ASSERT_EQ(cache_->DemoteIdle(std::numeric_limits<size_t>::max()), b.bytes());
  EXPECT_TRUE(ModelStats("b").host_resident);
  ASSERT_TRUE(cache_->ReleaseAll("b").ok());
  EXPECT_FALSE(ModelStats("b").host_resident);
  ASSERT_TRUE(cache_->Acquire("p").ok());
  EXPECT_TRUE(cache_->Evict("p").value());
  EXPECT_TRUE(ModelStats("p").host_resident);
  books_match();
}

TEST(WeightCacheNamesTest, ParseAndNames) {
  for (ResidencyState s : {ResidencyState::kUnpinned, ResidencyState::kPinnedSystem,
                           ResidencyState::kPinnedDevice}) {
    Result<ResidencyState> p = ParseResidencyState(ResidencyStateName(s));
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(*p, s);
  }
  Result<ResidencyState> bad = ParseResidencyState("PINNED");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(bad.status().message(), "pinned_device"));
  EXPECT_EQ(*ParseResidencyMode("externally_managed"), ResidencyMode::kExternallyManaged);
  EXPECT_FALSE(ParseResidencyMode("auto").ok());
  EXPECT_FALSE(IsNotResident(FailedPreconditionError("x")));
  EXPECT_TRUE(IsNotResident(NotResidentError("m")));
}

TEST(WeightCacheCreateTest, RejectsBadOptions) {
  WeightCacheOptions o;
  EXPECT_EQ(WeightCache::Create(o).status().code(), StatusCode::kInvalidArgument);
  Result<std::unique_ptr<DeviceBackend>> d = MakeDeviceBackend("fake", 1 << 20);
  ASSERT_TRUE(d.ok());
  o.device = d->get();
  o.fraction = 0;
  Result<std::unique_ptr<WeightCache>> c = WeightCache::Create(o);
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(c.status().message(), "fraction")) << c.status().message();
}

}  // namespace
}  // namespace arbiter
