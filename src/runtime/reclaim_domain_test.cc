// The reclaim policy per memory domain, on a fake device domain: a real
// MemoryLedger with a registered device domain (inside the host and not), a
// real MemoryArbiter whose models are charged to the host or to the device
// (domain_for), a real WeightCache whose device copies are charged to the
// device (host floors to the host), device-resident prompt-cache entries
// stood in for by charges in the device domain, and a DevicePressureSource
// over an injected driver report. Time is a SimulatedClock; nothing sleeps.
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include "arbiter/arbiter/memory_arbiter.h"
#include "arbiter/base/clock.h"
#include "arbiter/memory/device_backend.h"
#include "arbiter/memory/device_pressure_source.h"
#include "arbiter/memory/memory_ledger.h"
#include "arbiter/runtime/reclaim_policy.h"
#include "arbiter/weights/weight_cache.h"

namespace arbiter {
namespace {

constexpr size_t kMiB = 1ull << 20;

// A device model's weights: 1 MiB of f32, kept with a host floor
// (pinned-system), so demoting the device copy keeps the floor.
WeightModel DeviceWeights(const std::string& key) {
  WeightModel m;
  m.key = key;
  m.specs.push_back(WeightSpec{"w", DType::kF32, {static_cast<int64_t>(kMiB / sizeof(float))}});
  m.digest = std::hash<std::string>()(key);
  m.residency = ResidencyState::kPinnedSystem;
  m.fill = [](const std::vector<void*>& arrays) -> Status {
    std::memset(arrays[0], 1, kMiB);
    return OkStatus();
  };
  return m;
}

class ReclaimDomainTest : public ::testing::TestWithParam<bool> {
 protected:
  bool inside_host() const { return GetParam(); }

  void SetUp() override {
    spdlog::set_level(spdlog::level::warn);
    ledger_ = std::make_unique<MemoryLedger>(64 * kMiB);
    Result<MemoryDomain> d =
        ledger_->RegisterDomain("vulkan:0", {.budget_bytes = 8 * kMiB, .inside_host = inside_host()});
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    gpu_ = *d;

    Result<std::unique_ptr<CpuDeviceBackend>> dev = CpuDeviceBackend::Create(16 * kMiB, false);
    ASSERT_TRUE(dev.ok()) << dev.status().ToString();
    device_ = std::move(dev).value();
    WeightCacheOptions wo;
    wo.device = device_.get();
    wo.ledger = ledger_.get();
    wo.fraction = 1.0;
    wo.wiggle = 0;
    wo.domain = gpu_;
    wo.reclaimer = &policy_;
    Result<std::unique_ptr<WeightCache>> wc = WeightCache::Create(std::move(wo));
    ASSERT_TRUE(wc.ok()) << wc.status().ToString();
    weights_ = std::move(wc).value();
    for (const char* key : {"dw1", "dw2", "dw3"}) {
      ASSERT_TRUE(weights_->Register(DeviceWeights(key)).ok());
    }

    MemoryArbiterOptions ao;
    ao.ledger = ledger_.get();
    ao.clock = &clock_;
    ao.idle_check_interval_ms = 0;
    ao.reclaimer = &policy_;
    arbiter_ = std::make_unique<MemoryArbiter>(ao);
    CapabilityRegistration r;
    r.capability = Capability::kEmbedding;
    r.swap_same_role = false;
    r.estimated_bytes = 2 * kMiB;
    r.charge_kind = ChargeKind::kKvSlot;
    r.domain_for = [this](const std::string& key) -> std::optional<MemoryDomain> {
      if (key.rfind("gpu-", 0) == 0) return gpu_;
      return std::nullopt;  // the host
    };
    r.load = [](const std::string&) -> Result<LoadedBackend> {
      return LoadedBackend::Of(std::make_shared<int>(0), 2 * kMiB);
    };
    r.unload = [this](const std::string& key, LoadedBackend) { unloaded_.push_back(key); };
    ASSERT_TRUE(arbiter_->RegisterCapability(std::move(r)).ok());

    targets_.ledger = ledger_.get();
    targets_.arbiter = arbiter_.get();
    targets_.device_weights = {weights_.get()};
    targets_.drop_device_prompt_entries = [this](MemoryDomain d, uint64_t bytes) -> uint64_t {
      uint64_t dropped = 0, freed = 0;
      while (!prompt_entries_.empty() && freed < bytes && d == gpu_) {
        freed += prompt_entries_.back().bytes();
        prompt_entries_.pop_back();
        ++dropped;
      }
      return dropped;
    };
    policy_.set_observer([this](ReclaimTrigger, const ReclaimStep& s) { observed_.push_back(s); });
  }

  void TearDown() override {
    prompt_entries_.clear();
    if (arbiter_) arbiter_->Shutdown();
    arbiter_.reset();
    weights_.reset();
    spdlog::set_level(spdlog::level::info);
  }

  void Use(const std::string& key) {
    clock_.AdvanceMs(10);
    Result<ArbiterHandle> h = arbiter_->Acquire(Capability::kEmbedding, key, Deadline(std::chrono::seconds(5)));
    ASSERT_TRUE(h.ok()) << h.status().ToString();
  }
  bool Loaded(const std::string& key) {
    for (const ResidentEntryInfo& e : arbiter_->ResidentSnapshot()) {
      if (e.model_key == key) return true;
    }
    return false;
  }
  const WeightModelStats* W(const WeightCacheStats& s, const std::string& key) {
    for (const WeightModelStats& m : s.models) {
      if (m.key == key) return &m;
    }
    return nullptr;
  }

  // host: h1, h2 idle (2 MiB each); device: g1, g2 idle (2 MiB each), the
  // device copies of dw1 and dw2 idle (1 MiB each, floors in the host) and
  // one prompt-cache entry of 1 MiB: 7 MiB of the device's 8.
  void Fill() {
    Use("h1");
    Use("gpu-g1");
    Use("h2");
    Use("gpu-g2");
    for (const char* key : {"dw1", "dw2"}) {
      Result<WeightLease> lease = weights_->Acquire(key);
      ASSERT_TRUE(lease.ok()) << lease.status().ToString();
    }
    Result<MemoryCharge> pc =
        ledger_->TryCharge(gpu_, "prompt_cache", ChargeKind::kPromptCache, 1 * kMiB);
    ASSERT_TRUE(pc.ok()) << pc.status().ToString();
    prompt_entries_.push_back(std::move(pc).value());
    ASSERT_EQ(ledger_->charged_bytes(gpu_), 7 * kMiB);
    observed_.clear();
  }

  void ExpectWithinBudgets() {
    const MemoryLedgerSnapshot s = ledger_->Snapshot();
    for (const auto& [name, d] : s.domains) {
      EXPECT_EQ(d.over_commits, 0u) << name;
      EXPECT_LE(d.peak_bytes, d.budget_bytes) << name;
      EXPECT_EQ(d.over_budget_bytes, 0u) << name;
    }
  }

  static std::vector<ReclaimStage> Stages(const std::vector<ReclaimStep>& steps) {
    std::vector<ReclaimStage> out;
    for (const ReclaimStep& s : steps) out.push_back(s.stage);
    return out;
  }

  SimulatedClock clock_{1000};
  std::unique_ptr<MemoryLedger> ledger_;
  MemoryDomain gpu_;
  std::unique_ptr<CpuDeviceBackend> device_;
  ReclaimTargets targets_;
  ReclaimPolicy policy_{&targets_};
  std::unique_ptr<WeightCache> weights_;
  std::unique_ptr<MemoryArbiter> arbiter_;
  std::vector<MemoryCharge> prompt_entries_;
  std::vector<std::string> unloaded_;
  std::vector<ReclaimStep> observed_;
};

TEST_P(ReclaimDomainTest, ADeviceChargeRunsTheDevicesStagesInOrderOnItsHoldersOnly) {
  Fill();
  const size_t host_before = ledger_->charged_bytes();
  // The whole device budget can never fit next to anything: every device
  // stage runs once, in order, on the device's holders.
  const ReclaimReport r = policy_.MakeRoomReport(gpu_, 8 * kMiB);
  EXPECT_EQ(r.domain, gpu_);
  EXPECT_EQ(Stages(r.steps), (std::vector<ReclaimStage>{ReclaimStage::kDropDevicePromptCache,
                                                        ReclaimStage::kDemoteDeviceWeights,
                                                        ReclaimStage::kEvictIdleModels}));
  EXPECT_EQ(r.steps[0].freed_bytes, 1 * kMiB);
  EXPECT_EQ(r.steps[1].freed_bytes, 2 * kMiB);
  EXPECT_EQ(r.steps[2].freed_bytes, 4 * kMiB);
  for (const ReclaimStep& s : r.steps) EXPECT_EQ(s.domain, gpu_);
  EXPECT_EQ(Stages(observed_), Stages(r.steps));
  EXPECT_EQ(ledger_->charged_bytes(gpu_), 0u);
  // The device's models went, LRU first; the host's stayed.
  EXPECT_EQ(unloaded_, (std::vector<std::string>{"gpu-g1", "gpu-g2"}));
  EXPECT_TRUE(Loaded("h1"));
  EXPECT_TRUE(Loaded("h2"));
  // Demoted weights kept their host floors: a re-wake is one copy.
  const WeightCacheStats ws = weights_->Stats();
  for (const char* key : {"dw1", "dw2"}) {
    ASSERT_NE(W(ws, key), nullptr);
    EXPECT_FALSE(W(ws, key)->device_resident) << key;
    EXPECT_TRUE(W(ws, key)->host_resident) << key;
  }
  // Host figures dropped only by what was nested in them.
  EXPECT_EQ(ledger_->charged_bytes(), inside_host() ? host_before - 7 * kMiB : host_before);
  ExpectWithinBudgets();
}

TEST_P(ReclaimDomainTest, ADeviceChargeStopsAsSoonAsItFits) {
  Fill();
  // 7 + 2 > 8: dropping the device's prompt-cache entry (1 MiB) is enough.
  const ReclaimReport r = policy_.MakeRoomReport(gpu_, 2 * kMiB);
  EXPECT_EQ(Stages(r.steps), std::vector<ReclaimStage>{ReclaimStage::kDropDevicePromptCache});
  EXPECT_TRUE(unloaded_.empty());
  EXPECT_TRUE(W(weights_->Stats(), "dw1")->device_resident);
  // 6 + 3 > 8: then the idle device weights (LRU: dw1) before any model.
  const ReclaimReport r2 = policy_.MakeRoomReport(gpu_, 3 * kMiB);
  EXPECT_EQ(Stages(r2.steps), std::vector<ReclaimStage>{ReclaimStage::kDemoteDeviceWeights});
  EXPECT_TRUE(unloaded_.empty());
  EXPECT_LE(ledger_->charged_bytes(gpu_) + 3 * kMiB, 8 * kMiB);
  ExpectWithinBudgets();
}

TEST_P(ReclaimDomainTest, LoadingADeviceModelMakesRoomOnTheDeviceOnly) {
  Fill();
  // g3 (2 MiB, device) does not fit next to 7 MiB: the arbiter asks the
  // policy for room in the device domain, which drops the prompt-cache
  // entry; nothing of the host is touched.
  Use("gpu-g3");
  EXPECT_TRUE(Loaded("gpu-g3"));
  EXPECT_EQ(Stages(observed_), std::vector<ReclaimStage>{ReclaimStage::kDropDevicePromptCache});
  EXPECT_TRUE(prompt_entries_.empty());
  EXPECT_TRUE(unloaded_.empty());
  // dw3's device copy (1 MiB) does not fit next to 8 MiB: the weight cache
  // asks for room in the device domain: the idle device weights go first
  // (LRU: dw1), no model is evicted.
  observed_.clear();
  Result<WeightLease> lease = weights_->Acquire("dw3");
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_EQ(Stages(observed_), std::vector<ReclaimStage>{ReclaimStage::kDemoteDeviceWeights});
  EXPECT_FALSE(W(weights_->Stats(), "dw1")->device_resident);
  EXPECT_TRUE(W(weights_->Stats(), "dw1")->host_resident);
  EXPECT_TRUE(unloaded_.empty());
  // A host model needs no device room: loading it runs nothing.
  observed_.clear();
  Use("h3");
  EXPECT_TRUE(observed_.empty());
  ExpectWithinBudgets();
}

TEST_P(ReclaimDomainTest, AWeightChargeWithPartRoomRunsThePolicyForExactlyTheShortfall) {
  Fill();
  // A 1.5 MiB prompt-cache entry instead of Fill's 1 MiB one: 7.5 MiB of
  // 8 charged, so dw3's device copy (1 MiB) finds half of its room.
  prompt_entries_.clear();
  Result<MemoryCharge> pc =
      ledger_->TryCharge(gpu_, "prompt_cache", ChargeKind::kPromptCache, 3 * kMiB / 2);
  ASSERT_TRUE(pc.ok()) << pc.status().ToString();
  prompt_entries_.push_back(std::move(pc).value());
  ASSERT_EQ(ledger_->charged_bytes(gpu_), 15 * kMiB / 2);
  // The cache asks the policy for room for the whole charge (MakeRoom's
  // "until a charge of `bytes` fits"); the policy frees only the 0.5 MiB
  // shortfall, in its order: the device's prompt-cache entry goes first, no
  // device weights are demoted and no model is evicted. (Asked for the
  // shortfall alone, the policy would find that 0.5 MiB fits and run
  // nothing, and the cache would demote its own dw1 instead.)
  Result<WeightLease> lease = weights_->Acquire("dw3");
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_EQ(Stages(observed_), std::vector<ReclaimStage>{ReclaimStage::kDropDevicePromptCache});
  EXPECT_TRUE(prompt_entries_.empty());
  const WeightCacheStats ws = weights_->Stats();
  for (const char* key : {"dw1", "dw2", "dw3"}) {
    ASSERT_NE(W(ws, key), nullptr);
    EXPECT_TRUE(W(ws, key)->device_resident) << key;
  }
  EXPECT_TRUE(unloaded_.empty());
  EXPECT_EQ(ledger_->charged_bytes(gpu_), 7 * kMiB);  // 7.5 − 1.5 + 1
  ExpectWithinBudgets();
}

TEST_P(ReclaimDomainTest, RoomForNoChargeBringsAnOverBudgetDomainBackWithin) {
  Fill();
  // A re-measured footprint (or a lowered budget) leaves a domain over its
  // budget; MakeRoom(domain, 0) frees until it holds its charges again.
  ledger_->SetBudget(gpu_, 5 * kMiB);  // 7 MiB charged there
  const ReclaimReport r = policy_.MakeRoomReport(gpu_, 0);
  EXPECT_EQ(Stages(r.steps), (std::vector<ReclaimStage>{ReclaimStage::kDropDevicePromptCache,
                                                        ReclaimStage::kDemoteDeviceWeights}));
  EXPECT_EQ(ledger_->charged_bytes(gpu_), 5 * kMiB);
  EXPECT_TRUE(unloaded_.empty());
  // The host: its LRU idle model (h1) goes, and no more.
  ledger_->SetBudget(ledger_->charged_bytes() - 1 * kMiB);
  const ReclaimReport h = policy_.MakeRoomReport(kHostDomain, 0);
  EXPECT_EQ(Stages(h.steps), std::vector<ReclaimStage>{ReclaimStage::kEvictIdleModels});
  EXPECT_EQ(unloaded_, std::vector<std::string>{"h1"});
  EXPECT_LE(ledger_->charged_bytes(), ledger_->budget_bytes());
  // Within every budget: nothing runs.
  observed_.clear();
  EXPECT_TRUE(policy_.MakeRoomReport(gpu_, 0).steps.empty());
  EXPECT_TRUE(policy_.MakeRoomReport(kHostDomain, 0).steps.empty());
}

TEST_P(ReclaimDomainTest, AHostChargeRunsTheHostsStages) {
  Fill();
  // 62 MiB more in the host: 64 − what is charged there; the LRU idle model
  // goes (h1, the oldest), whichever domain it is charged to, until it fits.
  const size_t host_charged = ledger_->charged_bytes();
  const size_t want = 64 * kMiB - host_charged + 1 * kMiB;
  const ReclaimReport r = policy_.MakeRoomReport(want);
  EXPECT_EQ(r.domain, kHostDomain);
  ASSERT_FALSE(r.steps.empty());
  EXPECT_EQ(r.steps[0].stage, ReclaimStage::kEvictIdleModels);
  EXPECT_EQ(r.steps[0].domain, kHostDomain);
  ASSERT_FALSE(unloaded_.empty());
  EXPECT_EQ(unloaded_[0], "h1");
  for (const ReclaimStep& s : r.steps) EXPECT_NE(s.stage, ReclaimStage::kDropDevicePromptCache);
  EXPECT_EQ(prompt_entries_.size(), 1u);  // the device's prompt cache is not the host's
  ExpectWithinBudgets();
}

TEST_P(ReclaimDomainTest, NextVictimPerDomain) {
  Fill();
  std::optional<NextVictim> host = policy_.Next();
  ASSERT_TRUE(host.has_value());
  EXPECT_EQ(host->model, "h1");
  EXPECT_EQ(host->domain, "host");
  std::optional<NextVictim> dev = policy_.Next(gpu_);
  ASSERT_TRUE(dev.has_value());
  EXPECT_EQ(dev->model, "gpu-g1");
  EXPECT_EQ(dev->domain, "vulkan:0");
  const auto all = policy_.NextByDomain();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all.at("host")->model, "h1");
  EXPECT_EQ(all.at("vulkan:0")->model, "gpu-g1");
  Use("gpu-g1");  // now g2 is the device's LRU
  EXPECT_EQ(policy_.Next(gpu_)->model, "gpu-g2");
}

TEST_P(ReclaimDomainTest, DevicePressureDrivesTheDevicesStages) {
  Fill();
  std::optional<DeviceMemoryReport> report =
      DeviceMemoryReport{.usage_bytes = 1 * kMiB, .budget_bytes = 100 * kMiB};
  DevicePressureSource::Options o;
  o.domain = "vulkan:0";
  o.query = [&report] { return report; };
  o.clock = &clock_;
  auto made = DevicePressureSource::Create(std::move(o));
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  std::unique_ptr<DevicePressureSource> source = std::move(made).value();
  std::vector<ReclaimReport> reports;
  MemoryPressureSubscription sub = source->Subscribe(
      [&](const MemoryPressureEvent& e) { reports.push_back(policy_.OnPressure(e)); });

  source->Tick();  // nominal: nothing
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_TRUE(reports[0].steps.empty());

  report->usage_bytes = 90 * kMiB;  // 10% left: low
  source->Tick();
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(reports[1].trigger, ReclaimTrigger::kPressureLow);
  EXPECT_EQ(reports[1].domain, gpu_);
  EXPECT_EQ(Stages(reports[1].steps), (std::vector<ReclaimStage>{
                                          ReclaimStage::kDropDevicePromptCache,
                                          ReclaimStage::kDemoteDeviceWeights}));
  EXPECT_TRUE(unloaded_.empty());  // low evicts no model
  EXPECT_EQ(arbiter_->CurrentPressureLevel(), MemoryPressureLevel::kNominal);

  report->usage_bytes = 99 * kMiB;  // 1% left: critical
  source->Tick();
  ASSERT_EQ(reports.size(), 3u);
  EXPECT_EQ(Stages(reports[2].steps),
            std::vector<ReclaimStage>{ReclaimStage::kEvictIdleModels});
  EXPECT_EQ(unloaded_, (std::vector<std::string>{"gpu-g1", "gpu-g2"}));
  EXPECT_TRUE(Loaded("h1"));
  EXPECT_TRUE(Loaded("h2"));
  // Device pressure never refuses a host model: the arbiter's level is the
  // host's.
  EXPECT_EQ(arbiter_->CurrentPressureLevel(), MemoryPressureLevel::kNominal);
  Use("h3");
  EXPECT_EQ(ledger_->charged_bytes(gpu_), 0u);
  ExpectWithinBudgets();

  MemoryPressureEvent unknown;
  unknown.level = MemoryPressureLevel::kCritical;
  unknown.domain = "vulkan:9";
  EXPECT_TRUE(policy_.OnPressure(unknown).steps.empty());
}

// Note [Demotion floors] in weight_cache.cc: an unpinned device model
// demoted for room on the device gets a host floor (the host has room), so
// its re-wake is one copy; the host's demote stage drops that floor when the
// host needs the room.
TEST_P(ReclaimDomainTest, ADeviceDemotionKeepsAFloorThatTheHostsDemoteStageDrops) {
  WeightModel du = DeviceWeights("du");
  du.residency = ResidencyState::kUnpinned;
  ASSERT_TRUE(weights_->Register(std::move(du)).ok());
  ASSERT_TRUE(weights_->Acquire("du").ok());
  EXPECT_FALSE(W(weights_->Stats(), "du")->host_resident);
  const ReclaimReport r = policy_.MakeRoomReport(gpu_, 7 * kMiB + kMiB / 2);
  EXPECT_EQ(Stages(r.steps), std::vector<ReclaimStage>{ReclaimStage::kDemoteDeviceWeights});
  EXPECT_EQ(ledger_->charged_bytes(gpu_), 0u);
  const WeightCacheStats stats = weights_->Stats();  // s points into it
  const WeightModelStats* s = W(stats, "du");
  EXPECT_FALSE(s->device_resident);
  EXPECT_TRUE(s->host_resident);
  const size_t floor_bytes = s->host_bytes;
  EXPECT_GE(floor_bytes, kMiB);
  EXPECT_EQ(ledger_->DomainSnapshot(kHostDomain).kind_bytes(ChargeKind::kHostFloor), floor_bytes);
  // The wake copies from the floor.
  ASSERT_TRUE(weights_->Acquire("du").ok());
  EXPECT_EQ(W(weights_->Stats(), "du")->last_load_source, WeightLoadSource::kFloor);
  ASSERT_EQ(weights_->EvictIdle(kMiB), kMiB);  // the device copy goes; the floor stays
  // The host needs the room: its demote stage drops the floor.
  observed_.clear();
  const ReclaimReport h =
      policy_.MakeRoomReport(kHostDomain, 64 * kMiB - ledger_->charged_bytes() + 1);
  EXPECT_EQ(Stages(h.steps), std::vector<ReclaimStage>{ReclaimStage::kDemoteDeviceWeights});
  EXPECT_GE(h.freed_bytes, floor_bytes);
  EXPECT_FALSE(W(weights_->Stats(), "du")->host_resident);
  EXPECT_EQ(ledger_->DomainSnapshot(kHostDomain).kind_bytes(ChargeKind::kHostFloor), 0u);
  ExpectWithinBudgets();
}

INSTANTIATE_TEST_SUITE_P(InsideHostOrNot, ReclaimDomainTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? std::string("InsideHost") : std::string("Discrete");
                         });

}  // namespace
}  // namespace arbiter
