// Tests for MemoryArbiter: the reference arbiter's behaviours and the eight
// defects of the reference it fixes (docs/memory-arbiter.md; the DefectN
// tests). Waits are bounded ("fuses").
#include "arbiter/arbiter/memory_arbiter.h"

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace arbiter {
namespace {

using namespace std::chrono_literals;
constexpr size_t kMB = 1 << 20;

struct Fake {
  std::string key;
};

// Records loads/unloads and events; registers fake capabilities.
class ArbiterTest : public ::testing::Test {
 protected:
  CapabilityRegistration Reg(Capability cap, size_t estimate_mb = 0, int load_delay_ms = 0) {
    CapabilityRegistration r;
    r.capability = cap;
    r.estimated_bytes = estimate_mb * kMB;
    r.load = [this, cap, load_delay_ms](const std::string& key) -> Result<LoadedBackend> {
      {
        std::lock_guard<std::mutex> l(mu_);
        loaded_.push_back(key);
      }
      load_calls_++;
      if (load_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(load_delay_ms));
      if (fail_load_) return DataLossError("weights truncated");
      return LoadedBackend::Of(std::make_shared<Fake>(Fake{std::string(CapabilityName(cap)) + ":" + key}), 0);
    };
    r.unload = [this](const std::string&, LoadedBackend b) {
      std::lock_guard<std::mutex> l(mu_);
      unloaded_.push_back(static_cast<Fake*>(b.object.get())->key);
    };
    r.run = [](const ArbiterHandle& h, std::any& req) -> Result<std::any> {
      const std::string s = std::any_cast<std::string>(req);
      if (s == "fail") return InternalError("run failed");
      if (s == "slow") std::this_thread::sleep_for(30ms);
      return std::any(h.backend<Fake>()->key + "|" + s);
    };
    return r;
  }
  void Listen(MemoryArbiter& a) {
    sub_ = a.OnEvent([this](const ArbiterEvent& e) {
      std::lock_guard<std::mutex> l(mu_);
      events_.push_back(e);
    });
  }
  std::vector<ArbiterEvent> Events(ArbiterEventType t) {
    std::lock_guard<std::mutex> l(mu_);
    std::vector<ArbiterEvent> out;
    for (const auto& e : events_) {
      if (e.type == t) out.push_back(e);
    }
    return out;
  }
  std::vector<std::string> Unloaded() {
    std::lock_guard<std::mutex> l(mu_);
    return unloaded_;
  }
  std::vector<std::string> Loaded() {
    std::lock_guard<std::mutex> l(mu_);
    return loaded_;
  }
  static bool Resident(MemoryArbiter& a, const std::string& key) {
    for (const auto& r : a.ResidentSnapshot()) {
      if (r.resident_key == key) return true;
    }
    return false;
  }
  static ArbiterHandle Get(MemoryArbiter& a, Capability c, const std::string& k) {
    auto h = a.Acquire(c, k, Deadline(5s));
    EXPECT_TRUE(h.ok()) << h.status().ToString();
    return h.ok() ? std::move(h).value() : ArbiterHandle();
  }

  std::mutex mu_;
  std::vector<std::string> loaded_, unloaded_;
  std::vector<ArbiterEvent> events_;
  std::atomic<int> load_calls_{0};
  std::atomic<bool> fail_load_{false};
  ArbiterEventSubscription sub_;
};

TEST(ArbiterTables, RolesCapabilitiesAndKeys) {
  EXPECT_EQ(ResidentRolePriority(ResidentRole::kDrafter), 10);
  EXPECT_EQ(ResidentRolePriority(ResidentRole::kVision), 20);
  EXPECT_EQ(ResidentRolePriority(ResidentRole::kEmbedding), 25);
  EXPECT_EQ(ResidentRolePriority(ResidentRole::kTts), 50);
  EXPECT_EQ(ResidentRolePriority(ResidentRole::kTextTarget), 100);
  EXPECT_EQ(DefaultRoleFor(Capability::kImageGen), ResidentRole::kVision);
  EXPECT_EQ(DefaultRoleFor(Capability::kTranscribe), ResidentRole::kAsr);
  EXPECT_EQ(ResidentKey(Capability::kVisionDescribe, "qwen"), "vision-describe::qwen");
  for (size_t i = 0; i < kCapabilityCount; ++i) {
    auto c = static_cast<Capability>(i);
    EXPECT_EQ(*ParseCapability(CapabilityName(c)), c);
  }
  EXPECT_FALSE(ParseCapability("vision").ok());
}

// ---- Registration and acquire ----

TEST_F(ArbiterTest, AcquireWithNothingRegisteredFails) {
  MemoryArbiter a;
  auto h = a.Acquire(Capability::kText, "m", Deadline(1s));
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("no capability registered"), std::string::npos);
}

TEST_F(ArbiterTest, DuplicateRegistrationFails) {
  MemoryArbiter a;
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kText)).ok());
  Status s = a.RegisterCapability(Reg(Capability::kText));
  EXPECT_EQ(s.message(), "capability \"text\" is already registered");
}

TEST_F(ArbiterTest, SecondAcquireReusesFirstLoadAndReleaseDoesNotUnload) {
  MemoryArbiter a;
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kText)).ok());
  ArbiterHandle h1 = Get(a, Capability::kText, "m");
  ArbiterHandle h2 = Get(a, Capability::kText, "m");
  EXPECT_EQ(load_calls_, 1);
  EXPECT_EQ(h1.backend<Fake>(), h2.backend<Fake>());
  h1.Release();
  h2.Release();
  EXPECT_TRUE(Resident(a, "text::m"));
  EXPECT_TRUE(Unloaded().empty());
}

TEST_F(ArbiterTest, ThreeConcurrentAcquiresShareOneLoad) {
  MemoryArbiter a;
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kText, 0, 30)).ok());
  std::vector<std::thread> ts;
  std::atomic<int> ok{0};
  for (int i = 0; i < 3; ++i) {
    ts.emplace_back([&] { ok += a.Acquire(Capability::kText, "m", Deadline(5s)).ok(); });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(ok, 3);
  EXPECT_EQ(load_calls_, 1);
}

TEST_F(ArbiterTest, FailedLoadIsPrefixedAndRetried) {
  MemoryArbiter a;
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kText)).ok());
  fail_load_ = true;
  auto h = a.Acquire(Capability::kText, "m", Deadline(1s));
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().message().rfind("model \"m\" failed to load", 0), 0u);
  EXPECT_EQ(a.Stats().models[0].state, ModelState::kFailed);
  fail_load_ = false;
  EXPECT_TRUE(a.Acquire(Capability::kText, "m", Deadline(1s)).ok());
}

// ---- Swap ----

TEST_F(ArbiterTest, SameRoleNewKeySwapsWithOneEvictionEvent) {
  MemoryArbiter a;
  Listen(a);
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kText)).ok());
  Get(a, Capability::kText, "a").Release();
  Get(a, Capability::kText, "b").Release();
  EXPECT_EQ(Loaded(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(Unloaded(), (std::vector<std::string>{"text:a"}));
  auto ev = Events(ArbiterEventType::kEviction);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].capability, Capability::kText);
  EXPECT_EQ(ev[0].model_key, "a");
  EXPECT_EQ(ev[0].reason, UnloadReason::kSwap);
}

TEST_F(ArbiterTest, SwapWaitsForHolderToDrain) {
  MemoryArbiter a;
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kText)).ok());
  ArbiterHandle h = Get(a, Capability::kText, "a");
  std::thread releaser([&] {
    std::this_thread::sleep_for(30ms);
    h.Release();
  });
  const auto t0 = std::chrono::steady_clock::now();
  ArbiterHandle b = Get(a, Capability::kText, "b");
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 20ms);
  releaser.join();
  EXPECT_EQ(Unloaded(), (std::vector<std::string>{"text:a"}));
}

TEST_F(ArbiterTest, TwoDifferentRolesCoexist) {
  MemoryArbiter a;
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kText)).ok());
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kEmbedding)).ok());
  Get(a, Capability::kText, "t").Release();
  Get(a, Capability::kEmbedding, "e").Release();
  EXPECT_EQ(a.ResidentSnapshot().size(), 2u);
}

// ---- Pressure ----

class PressureTest : public ArbiterTest {
 protected:
  void SetUp() override {
    a_ = std::make_unique<MemoryArbiter>(MemoryArbiterOptions{.pressure_source = &bridge_});
    Listen(*a_);
    for (Capability c : {Capability::kText, Capability::kEmbedding, Capability::kVisionDescribe,
                         Capability::kImageGen, Capability::kTranscribe}) {
      ASSERT_TRUE(a_->RegisterCapability(Reg(c)).ok());
    }
    ASSERT_TRUE(a_->Start().ok());
  }
  BridgePressureSource bridge_;
  std::unique_ptr<MemoryArbiter> a_;
};

TEST_F(PressureTest, StartEmitsNominalPressureEvent) {
  auto ev = Events(ArbiterEventType::kMemoryPressure);
  // The bridge has no event before its first dispatch; dispatch one now.
  bridge_.Dispatch(MemoryPressureLevel::kNominal);
  ev = Events(ArbiterEventType::kMemoryPressure);
  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev.back().level, MemoryPressureLevel::kNominal);
  EXPECT_EQ(ev.back().source, "bridge");
}

TEST_F(PressureTest, LowUnloadsVisionKeepsText) {
  Get(*a_, Capability::kText, "t").Release();
  Get(*a_, Capability::kVisionDescribe, "v").Release();
  bridge_.Dispatch(MemoryPressureLevel::kLow);
  EXPECT_FALSE(Resident(*a_, "vision-describe::v"));
  EXPECT_TRUE(Resident(*a_, "text::t"));
  auto ev = Events(ArbiterEventType::kEviction);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].reason, UnloadReason::kPressure);
}

TEST_F(PressureTest, CriticalUnloadsVisionAndEmbeddingKeepsText) {
  Get(*a_, Capability::kText, "t").Release();
  Get(*a_, Capability::kVisionDescribe, "v").Release();
  Get(*a_, Capability::kEmbedding, "e").Release();
  bridge_.Dispatch(MemoryPressureLevel::kCritical);
  EXPECT_EQ(a_->ResidentSnapshot().size(), 1u);
  EXPECT_TRUE(Resident(*a_, "text::t"));
}

TEST_F(PressureTest, CriticalRejectsNonTextAcquireAcceptsText) {
  bridge_.Dispatch(MemoryPressureLevel::kCritical);
  EXPECT_EQ(a_->CurrentPressureLevel(), MemoryPressureLevel::kCritical);
  auto h = a_->Acquire(Capability::kEmbedding, "e", Deadline(1s));
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().message(),
            "memory pressure is critical; refusing to load capability \"embedding\". Free RAM "
            "and retry.");
  EXPECT_TRUE(a_->Acquire(Capability::kText, "t", Deadline(1s)).ok());
  bridge_.Dispatch(MemoryPressureLevel::kNominal);
  EXPECT_TRUE(a_->Acquire(Capability::kEmbedding, "e", Deadline(1s)).ok());
}

TEST_F(PressureTest, CriticalKeepsHeldEntry) {
  ArbiterHandle h = Get(*a_, Capability::kVisionDescribe, "v");
  bridge_.Dispatch(MemoryPressureLevel::kCritical);
  EXPECT_TRUE(Resident(*a_, "vision-describe::v"));
}

TEST_F(PressureTest, LowEvictsVisionBeforeEmbedding) {
  Get(*a_, Capability::kEmbedding, "e").Release();
  Get(*a_, Capability::kVisionDescribe, "v").Release();
  bridge_.Dispatch(MemoryPressureLevel::kLow);
  EXPECT_FALSE(Resident(*a_, "vision-describe::v"));
  EXPECT_TRUE(Resident(*a_, "embedding::e"));
}

// Fixed defect 1: with only text resident, low evicts nothing.
TEST_F(PressureTest, Defect1LowNeverEvictsText) {
  Get(*a_, Capability::kText, "t").Release();
  bridge_.Dispatch(MemoryPressureLevel::kLow);
  EXPECT_TRUE(Resident(*a_, "text::t"));
  EXPECT_TRUE(Unloaded().empty());
}

// Fixed defect 2: a held vision entry does not stop low from evicting embedding.
TEST_F(PressureTest, Defect2HeldLowestRoleDoesNotBlockNextIdle) {
  ArbiterHandle v = Get(*a_, Capability::kVisionDescribe, "v");
  Get(*a_, Capability::kEmbedding, "e").Release();
  bridge_.Dispatch(MemoryPressureLevel::kLow);
  EXPECT_TRUE(Resident(*a_, "vision-describe::v"));
  EXPECT_FALSE(Resident(*a_, "embedding::e"));
}

TEST_F(PressureTest, LowDuringLoadDoesNotFailIt) {
  MemoryArbiter a({.pressure_source = &bridge_});
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kVisionDescribe, 0, 40)).ok());
  ASSERT_TRUE(a.Start().ok());
  std::thread t([&] {
    std::this_thread::sleep_for(10ms);
    bridge_.Dispatch(MemoryPressureLevel::kLow);
  });
  EXPECT_TRUE(a.Acquire(Capability::kVisionDescribe, "v", Deadline(5s)).ok());
  t.join();
}

// ---- Cross-capability ----

TEST_F(PressureTest, VisionImageGenRoundTripReloadsVision) {
  Get(*a_, Capability::kVisionDescribe, "v").Release();
  Get(*a_, Capability::kImageGen, "g").Release();
  Get(*a_, Capability::kVisionDescribe, "v").Release();
  EXPECT_EQ(Loaded(), (std::vector<std::string>{"v", "g", "v"}));
  EXPECT_EQ(Unloaded(), (std::vector<std::string>{"vision-describe:v", "image-gen:g"}));
}

TEST_F(PressureTest, ImageGenWaitsForHeldVision) {
  ArbiterHandle v = Get(*a_, Capability::kVisionDescribe, "v");
  std::thread t([&] {
    std::this_thread::sleep_for(30ms);
    v.Release();
  });
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(a_->Acquire(Capability::kImageGen, "g", Deadline(5s)).ok());
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 20ms);
  t.join();
}

TEST_F(PressureTest, TextAndVisionCoexistInEitherOrder) {
  Get(*a_, Capability::kVisionDescribe, "v").Release();
  Get(*a_, Capability::kText, "t").Release();
  EXPECT_EQ(a_->ResidentSnapshot().size(), 2u);
}

// ---- Fit / budget with a fake clock ----

TEST_F(ArbiterTest, BudgetEvictsOlderWithReasonFit) {
  SimulatedClock clock(0);
  MemoryArbiter a({.budget_bytes = 1000 * kMB, .clock = &clock});
  Listen(a);
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kEmbedding, 600)).ok());
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kTranscribe, 600)).ok());
  clock.SetMs(1);
  Get(a, Capability::kEmbedding, "e").Release();
  clock.SetMs(2);
  Get(a, Capability::kTranscribe, "s").Release();
  EXPECT_FALSE(Resident(a, "embedding::e"));
  auto ev = Events(ArbiterEventType::kEviction);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].reason, UnloadReason::kFit);
  EXPECT_EQ(ev[0].estimated_bytes, 600 * kMB);
}

TEST_F(ArbiterTest, ExternalFootprintCountsAgainstBudget) {
  SimulatedClock clock(0);
  MemoryLedger ledger(1000 * kMB);
  MemoryCharge external = ledger.Charge("kv", ChargeKind::kKvSlot, 500 * kMB);
  MemoryArbiter a({.ledger = &ledger, .clock = &clock});
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kEmbedding, 400)).ok());
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kTranscribe, 400)).ok());
  Get(a, Capability::kEmbedding, "e").Release();
  clock.AdvanceMs(1);
  Get(a, Capability::kTranscribe, "s").Release();
  EXPECT_FALSE(Resident(a, "embedding::e"));
  EXPECT_EQ(ledger.charged_bytes(), 900 * kMB);
  EXPECT_EQ(ledger.Snapshot().by_owner.count("transcribe::s"), 1u);
}

TEST_F(ArbiterTest, ReclaimIdleEvictsLruIdleEntriesUntilTheLedgerHasRoom) {
  SimulatedClock clock(0);
  MemoryLedger ledger(1000 * kMB);
  MemoryArbiter a({.ledger = &ledger, .clock = &clock});
  Listen(a);
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kEmbedding, 300)).ok());
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kTranscribe, 300)).ok());
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kText, 300)).ok());
  Get(a, Capability::kText, "t").Release();  // text-target: never a victim
  clock.AdvanceMs(1);
  Get(a, Capability::kEmbedding, "e").Release();
  clock.AdvanceMs(1);
  ArbiterHandle held = Get(a, Capability::kTranscribe, "s");  // held: never a victim
  // 100 MB available; asking for 200 MB evicts e (300 MB) only.
  EXPECT_EQ(a.ReclaimIdle(200 * kMB), 300 * kMB);
  EXPECT_FALSE(Resident(a, "embedding::e"));
  EXPECT_TRUE(Resident(a, "transcribe::s"));
  EXPECT_TRUE(Resident(a, "text::t"));
  EXPECT_EQ(Unloaded(), std::vector<std::string>{"embedding:e"});
  ASSERT_EQ(Events(ArbiterEventType::kEviction).size(), 1u);
  EXPECT_EQ(Events(ArbiterEventType::kEviction)[0].reason, UnloadReason::kFit);
  // Enough room already, or nothing idle left: nothing happens.
  EXPECT_EQ(a.ReclaimIdle(100 * kMB), 0u);
  EXPECT_EQ(a.ReclaimIdle(900 * kMB), 0u);
}

TEST_F(ArbiterTest, ChargePartsSplitTheMeasuredSizeByKind) {
  MemoryLedger ledger(1000 * kMB);
  MemoryArbiter a({.ledger = &ledger});
  CapabilityRegistration r = Reg(Capability::kText, 500);
  r.charge_kind = ChargeKind::kKvSlot;
  r.load = [](const std::string& key) -> Result<LoadedBackend> {
    LoadedBackend b = LoadedBackend::Of(std::make_shared<Fake>(Fake{key}), 300 * kMB);
    b.charge_parts = {{ChargeKind::kKvSlot, 200 * kMB}, {ChargeKind::kScratch, 100 * kMB}};
    return b;
  };
  ASSERT_TRUE(a.RegisterCapability(std::move(r)).ok());
  Get(a, Capability::kText, "t").Release();
  MemoryLedgerSnapshot s = ledger.Snapshot();
  EXPECT_EQ(s.kind_bytes(ChargeKind::kKvSlot), 200 * kMB);
  EXPECT_EQ(s.kind_bytes(ChargeKind::kScratch), 100 * kMB);
  EXPECT_EQ(s.by_owner.at("text::t").total_bytes, 300 * kMB);
  EXPECT_EQ(s.over_commits, 0u);
  ASSERT_TRUE(a.Unload(Capability::kText, "t", Deadline(5s)).ok());
  EXPECT_EQ(ledger.charged_bytes(), 0u);
}

// A per-model kind (a process model beside built-in text models), and a
// re-measured size resizing that charge.
TEST_F(ArbiterTest, ChargeKindPerModelAndRemeasuredBytes) {
  MemoryLedger ledger(1000 * kMB);
  MemoryArbiter a({.ledger = &ledger});
  CapabilityRegistration r = Reg(Capability::kText, 100);
  r.swap_same_role = false;
  r.charge_kind = ChargeKind::kKvSlot;
  r.charge_kind_for = [](const std::string& key) -> std::optional<ChargeKind> {
    if (key == "remote") return ChargeKind::kModel;
    return std::nullopt;
  };
  ASSERT_TRUE(a.RegisterCapability(std::move(r)).ok());
  Get(a, Capability::kText, "local").Release();
  Get(a, Capability::kText, "remote").Release();
  EXPECT_EQ(ledger.Snapshot().kind_bytes(ChargeKind::kKvSlot), 100 * kMB);
  EXPECT_EQ(ledger.Snapshot().kind_bytes(ChargeKind::kModel), 100 * kMB);
  ASSERT_TRUE(*a.UpdateResidentBytes(Capability::kText, "remote", 250 * kMB));
  EXPECT_EQ(ledger.Snapshot().kind_bytes(ChargeKind::kModel), 250 * kMB);
  EXPECT_EQ(a.Stats().resident_bytes, 350 * kMB);
  EXPECT_FALSE(*a.UpdateResidentBytes(Capability::kText, "never-loaded", kMB));
  EXPECT_FALSE(a.UpdateResidentBytes(Capability::kSpeak, "x", kMB).ok());
}

// domain_for puts every charge of a model in its memory domain; reclaim in a
// device domain takes only that domain's idle entries, in LRU order, and
// stops at that domain's budget; the host's victims are every entry.
TEST_F(ArbiterTest, DomainForChargesTheDomainAndReclaimIsPerDomain) {
  SimulatedClock clock(0);
  MemoryLedger ledger(1000 * kMB);
  Result<MemoryDomain> gpu = ledger.RegisterDomain("vulkan:0", {.budget_bytes = 500 * kMB});
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  MemoryArbiter a({.ledger = &ledger, .clock = &clock});
  CapabilityRegistration r = Reg(Capability::kEmbedding, 200);
  r.swap_same_role = false;
  r.domain_for = [&](const std::string& key) -> std::optional<MemoryDomain> {
    if (key.rfind("g", 0) == 0) return *gpu;
    return std::nullopt;
  };
  r.load = [](const std::string& key) -> Result<LoadedBackend> {
    LoadedBackend b = LoadedBackend::Of(std::make_shared<Fake>(Fake{key}), 200 * kMB);
    b.charge_parts = {{ChargeKind::kKvSlot, 150 * kMB}, {ChargeKind::kScratch, 50 * kMB}};
    return b;
  };
  ASSERT_TRUE(a.RegisterCapability(std::move(r)).ok());
  for (const char* key : {"h1", "g1", "h2", "g2"}) {
    clock.AdvanceMs(1);
    Get(a, Capability::kEmbedding, key).Release();
  }
  EXPECT_EQ(ledger.charged_bytes(*gpu), 400 * kMB);
  EXPECT_EQ(ledger.charged_bytes(), 400 * kMB);  // the device is not inside the host
  EXPECT_EQ(ledger.DomainSnapshot(*gpu).kind_bytes(ChargeKind::kScratch), 100 * kMB);
  for (const ResidentEntryInfo& e : a.ResidentSnapshot()) {
    EXPECT_EQ(e.domain, e.model_key[0] == 'g' ? *gpu : kHostDomain) << e.model_key;
  }
  ASSERT_TRUE(a.NextFitVictim().has_value());
  EXPECT_EQ(a.NextFitVictim()->model_key, "h1");
  ASSERT_TRUE(a.NextFitVictim(*gpu).has_value());
  EXPECT_EQ(a.NextFitVictim(*gpu)->model_key, "g1");

  // 100 MB free on the device; 200 MB more takes g1 only (LRU), never a host model.
  size_t evicted = 0;
  EXPECT_EQ(a.ReclaimIdle(*gpu, 200 * kMB, &evicted), 200 * kMB);
  EXPECT_EQ(evicted, 1u);
  EXPECT_EQ(Unloaded(), std::vector<std::string>{"g1"});
  EXPECT_EQ(ledger.charged_bytes(*gpu), 200 * kMB);
  EXPECT_EQ(a.ReclaimIdle(*gpu, 300 * kMB), 0u);  // fits already

  // A held device entry is never a victim; pressure-style eviction in the
  // device takes the rest of its idle entries only.
  ArbiterHandle held = Get(a, Capability::kEmbedding, "g3");
  EXPECT_EQ(a.EvictIdleByPriority(*gpu, 10, UnloadReason::kPressure), 1u);
  EXPECT_EQ(Unloaded(), (std::vector<std::string>{"g1", "g2"}));
  EXPECT_TRUE(Resident(a, "embedding::g3"));
  EXPECT_TRUE(Resident(a, "embedding::h1"));
  EXPECT_TRUE(Resident(a, "embedding::h2"));
  EXPECT_FALSE(a.NextFitVictim(*gpu).has_value());
  EXPECT_EQ(ledger.Snapshot().over_commits, 0u);
  held.Release();
  a.Shutdown();
  EXPECT_EQ(ledger.charged_bytes(*gpu), 0u);
}

TEST_F(ArbiterTest, WithoutExternalFootprintBothStay) {
  MemoryArbiter a({.budget_bytes = 1000 * kMB});
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kEmbedding, 400)).ok());
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kTranscribe, 400)).ok());
  Get(a, Capability::kEmbedding, "e").Release();
  Get(a, Capability::kTranscribe, "s").Release();
  EXPECT_EQ(a.ResidentSnapshot().size(), 2u);
}

TEST_F(ArbiterTest, TextIsNeverAFitVictim) {
  SimulatedClock clock(0);
  MemoryArbiter a({.budget_bytes = 1000 * kMB, .clock = &clock});
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kText, 600)).ok());
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kEmbedding, 600)).ok());
  Get(a, Capability::kText, "t").Release();
  clock.AdvanceMs(1);
  Get(a, Capability::kEmbedding, "e").Release();
  EXPECT_TRUE(Resident(a, "text::t"));
  EXPECT_TRUE(Resident(a, "embedding::e"));  // best effort: loads anyway
}

TEST_F(ArbiterTest, HeldRefcountPins) {
  SimulatedClock clock(0);
  MemoryArbiter a({.budget_bytes = 1000 * kMB, .clock = &clock});
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kEmbedding, 600)).ok());
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kTranscribe, 600)).ok());
  ArbiterHandle e = Get(a, Capability::kEmbedding, "e");
  clock.AdvanceMs(1);
  Get(a, Capability::kTranscribe, "s").Release();
  EXPECT_TRUE(Resident(a, "embedding::e"));
}

TEST_F(ArbiterTest, Budget1300EvictsLeastRecentlyUsed) {
  SimulatedClock clock(0);
  MemoryArbiter a({.budget_bytes = 1300 * kMB, .clock = &clock});
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kEmbedding, 400)).ok());
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kVisionDescribe, 400)).ok());
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kTranscribe, 600)).ok());
  clock.SetMs(1);
  Get(a, Capability::kEmbedding, "emb").Release();
  clock.SetMs(2);
  Get(a, Capability::kVisionDescribe, "vl").Release();
  clock.SetMs(3);
  Get(a, Capability::kEmbedding, "emb").Release();
  clock.SetMs(4);
  Get(a, Capability::kTranscribe, "asr").Release();
  EXPECT_FALSE(Resident(a, "vision-describe::vl"));
  EXPECT_TRUE(Resident(a, "embedding::emb"));
  for (const auto& r : a.ResidentSnapshot()) {
    if (r.model_key == "emb") EXPECT_EQ(r.last_used_ms, 3);
    if (r.model_key == "asr") EXPECT_EQ(r.last_used_ms, 4);
  }
}

TEST_F(ArbiterTest, RefuseOverBudgetFailsWithoutEvictingWhileHeld) {
  MemoryArbiter a({.budget_bytes = 1000 * kMB, .refuse_over_budget = true});
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kEmbedding, 500)).ok());
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kTranscribe, 300)).ok());
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kSpeak, 600)).ok());
  ArbiterHandle e = Get(a, Capability::kEmbedding, "e");
  Get(a, Capability::kTranscribe, "s").Release();
  auto h = a.Acquire(Capability::kSpeak, "tts", Deadline(1s));
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(h.status().message().find("\"e\""), std::string::npos) << h.status().message();
  EXPECT_TRUE(Resident(a, "transcribe::s"));  // nothing evicted
  e.Release();
  EXPECT_TRUE(a.Acquire(Capability::kSpeak, "tts", Deadline(1s)).ok());
}

TEST_F(ArbiterTest, NoBudgetNoEviction) {
  MemoryArbiter a;
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kEmbedding, 60000)).ok());
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kTranscribe, 60000)).ok());
  Get(a, Capability::kEmbedding, "e").Release();
  Get(a, Capability::kTranscribe, "s").Release();
  EXPECT_EQ(a.ResidentSnapshot().size(), 2u);
}

// ---- Preload ----

TEST_F(PressureTest, PreloadNominalWithRoomLoadsUnpinned) {
  MemoryArbiter a({.budget_bytes = 1000 * kMB, .pressure_source = &bridge_});
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kEmbedding, 100)).ok());
  ASSERT_TRUE(a.Start().ok());
  EXPECT_TRUE(a.Preload(Capability::kEmbedding, "e"));
  auto snap = a.ResidentSnapshot();
  ASSERT_EQ(snap.size(), 1u);
  EXPECT_EQ(snap[0].refcount, 0);
  bridge_.Dispatch(MemoryPressureLevel::kLow);
  EXPECT_FALSE(a.Preload(Capability::kEmbedding, "f"));
  bridge_.Dispatch(MemoryPressureLevel::kCritical);
  EXPECT_FALSE(a.Preload(Capability::kEmbedding, "f"));
}

TEST_F(ArbiterTest, PreloadOverBudgetDeclines) {
  MemoryArbiter a({.budget_bytes = 100 * kMB});
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kEmbedding, 200)).ok());
  EXPECT_FALSE(a.Preload(Capability::kEmbedding, "e"));
  EXPECT_EQ(load_calls_, 0);
}

// Fixed defect 7: preload declines rather than swap or fit-evict anything.
TEST_F(ArbiterTest, Defect7PreloadNeverEvicts) {
  MemoryArbiter a({.budget_bytes = 1000 * kMB});
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kVisionDescribe, 100)).ok());
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kImageGen, 100)).ok());
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kEmbedding, 950)).ok());
  Get(a, Capability::kVisionDescribe, "v").Release();
  EXPECT_FALSE(a.Preload(Capability::kImageGen, "g"));   // same role: would swap
  EXPECT_FALSE(a.Preload(Capability::kEmbedding, "e"));  // would need a fit eviction
  EXPECT_TRUE(Resident(a, "vision-describe::v"));
  EXPECT_TRUE(Unloaded().empty());
}

// ---- Queues ----

TEST_F(ArbiterTest, TwoTextRequestsOneLoadOneRunEventEach) {
  MemoryArbiter a;
  Listen(a);
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kText)).ok());
  auto f1 = a.Request(Capability::kText, "m", std::string("one"));
  auto f2 = a.Request(Capability::kText, "m", std::string("two"));
  auto r1 = f1.get(), r2 = f2.get();
  ASSERT_TRUE(r1.ok() && r2.ok());
  EXPECT_EQ(std::any_cast<std::string>(*r1), "text:m|one");
  EXPECT_EQ(std::any_cast<std::string>(*r2), "text:m|two");
  EXPECT_EQ(load_calls_, 1);
  EXPECT_EQ(Events(ArbiterEventType::kCapabilityRun).size(), 2u);
}

TEST_F(ArbiterTest, RunErrorFailsOnlyItsRequest) {
  MemoryArbiter a;
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kText)).ok());
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kEmbedding)).ok());
  auto bad = a.Request(Capability::kText, "m", std::string("fail"));
  auto good = a.Request(Capability::kEmbedding, "e", std::string("x"));
  EXPECT_FALSE(bad.get().ok());
  EXPECT_TRUE(good.get().ok());
}

TEST_F(ArbiterTest, SlowTextAndVisionRequestsOverlap) {
  MemoryArbiter a;
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kText)).ok());
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kVisionDescribe)).ok());
  Get(a, Capability::kText, "t").Release();
  Get(a, Capability::kVisionDescribe, "v").Release();
  const auto t0 = std::chrono::steady_clock::now();
  auto f1 = a.Request(Capability::kText, "t", std::string("slow"));
  auto f2 = a.Request(Capability::kVisionDescribe, "v", std::string("slow"));
  EXPECT_TRUE(f1.get().ok());
  EXPECT_TRUE(f2.get().ok());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 200ms);
}

TEST_F(ArbiterTest, CancelledRequestDoesNotRun) {
  MemoryArbiter a;
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kText)).ok());
  std::stop_source stop;
  stop.request_stop();
  auto r = a.Request(Capability::kText, "m", std::string("x"), stop.get_token()).get();
  EXPECT_EQ(r.status().code(), StatusCode::kCancelled);
}

// Queues are per resident key: two models of one capability run side by
// side (each waits for the other to have started its run).
TEST_F(ArbiterTest, TwoModelsOfOneCapabilityRunSideBySide) {
  MemoryArbiter a;
  CapabilityRegistration r = Reg(Capability::kSpeak);
  r.swap_same_role = false;
  auto started = std::make_shared<std::atomic<int>>(0);
  r.run = [started](const ArbiterHandle&, std::any&) -> Result<std::any> {
    started->fetch_add(1);
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (started->load() < 2) {
      if (std::chrono::steady_clock::now() > until) return InternalError("ran alone");
      std::this_thread::sleep_for(1ms);
    }
    return std::any(1);
  };
  ASSERT_TRUE(a.RegisterCapability(std::move(r)).ok());
  auto f1 = a.Request(Capability::kSpeak, "tts-a", std::string("x"));
  auto f2 = a.Request(Capability::kSpeak, "tts-b", std::string("x"));
  EXPECT_TRUE(f1.get().ok());
  EXPECT_TRUE(f2.get().ok());
}

// Note [Bounded queues]: the waiting items are bounded, the running one is
// not counted, and an item whose client left frees its place.
TEST_F(ArbiterTest, FullQueueRefusesAndACancelledItemFreesItsPlace) {
  MemoryArbiter a;
  CapabilityRegistration r = Reg(Capability::kTranscribe);
  r.queue_max = 1;
  r.model_keys = {"asr"};
  auto gate = std::make_shared<std::promise<void>>();
  std::shared_future<void> open = gate->get_future().share();
  r.run = [open](const ArbiterHandle&, std::any& req) -> Result<std::any> {
    if (std::any_cast<std::string>(req) == "hold") open.wait();
    return std::any(std::any_cast<std::string>(req));
  };
  ASSERT_TRUE(a.RegisterCapability(std::move(r)).ok());
  auto running = a.Request(Capability::kTranscribe, "asr", std::string("hold"));
  auto model = [&] { return a.Stats().models.at(0); };
  for (int i = 0; i < 10000 && !model().running; ++i) std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(model().running);
  std::stop_source leaves;
  auto waiting = a.Request(Capability::kTranscribe, "asr", std::string("w"), leaves.get_token());
  EXPECT_EQ(model().queued, 1);
  Result<std::any> full = a.Request(Capability::kTranscribe, "asr", std::string("x")).get();
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().reason(), ErrorReason::kQueueFull);
  EXPECT_EQ(model().queue_rejections, 1u);
  leaves.request_stop();
  auto next = a.Request(Capability::kTranscribe, "asr", std::string("y"));
  EXPECT_EQ(waiting.get().status().code(), StatusCode::kCancelled);
  gate->set_value();
  EXPECT_TRUE(running.get().ok());
  Result<std::any> y = next.get();
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(std::any_cast<std::string>(*y), "y");
  EXPECT_EQ(model().runs, 2u);
}

// ---- Handles, events and shutdown ----

TEST_F(ArbiterTest, DoubleReleaseIsNoOpAndRetainAfterReleaseFails) {
  MemoryArbiter a;
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kText)).ok());
  ArbiterHandle h = Get(a, Capability::kText, "m");
  h.Release();
  h.Release();
  EXPECT_EQ(a.ResidentSnapshot()[0].refcount, 0);
  auto r = h.Retain();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "cannot retain text/m after release");
}

// Fixed defect 3: each retain has its own release; the count returns to zero.
TEST_F(ArbiterTest, Defect3EveryRetainHasItsOwnRelease) {
  MemoryArbiter a;
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kVisionDescribe)).ok());
  ArbiterHandle h = Get(a, Capability::kVisionDescribe, "v");
  ArbiterHandle r1 = std::move(h.Retain()).value();
  ArbiterHandle r2 = std::move(r1.Retain()).value();
  EXPECT_EQ(a.ResidentSnapshot()[0].refcount, 3);
  h.Release();
  r1.Release();
  r1.Release();
  EXPECT_EQ(a.ResidentSnapshot()[0].refcount, 1);
  r2.Release();
  EXPECT_EQ(a.ResidentSnapshot()[0].refcount, 0);
}

TEST_F(ArbiterTest, ThrowingListenerIsRemoved) {
  MemoryArbiter a;
  std::atomic<int> calls{0};
  auto bad = a.OnEvent([&](const ArbiterEvent&) {
    calls++;
    throw std::runtime_error("boom");
  });
  Listen(a);
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kText)).ok());
  Get(a, Capability::kText, "a").Release();
  Get(a, Capability::kText, "b").Release();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(Events(ArbiterEventType::kModelLoad).size(), 2u);
}

TEST_F(ArbiterTest, ShutdownUnloadsEverythingAndLaterAcquiresFail) {
  MemoryArbiter a;
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kText)).ok());
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kEmbedding)).ok());
  Get(a, Capability::kText, "t").Release();
  Get(a, Capability::kEmbedding, "e").Release();
  a.Shutdown();
  EXPECT_TRUE(a.ResidentSnapshot().empty());
  EXPECT_EQ(Unloaded().size(), 2u);
  auto h = a.Acquire(Capability::kText, "t", Deadline(1s));
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("shutting down"), std::string::npos);
  EXPECT_EQ(a.Start().message(), "cannot start after shutdown");
}

// Fixed defect 4: two concurrent loads of different keys of one role never both
// end up resident.
TEST_F(ArbiterTest, Defect4LoadsInFlightAreSameRoleConflicts) {
  MemoryArbiter a;
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kVisionDescribe, 0, 40)).ok());
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kImageGen, 0, 40)).ok());
  std::thread t1([&] { EXPECT_TRUE(a.Acquire(Capability::kVisionDescribe, "v", Deadline(5s)).ok()); });
  std::thread t2([&] { EXPECT_TRUE(a.Acquire(Capability::kImageGen, "g", Deadline(5s)).ok()); });
  t1.join();
  t2.join();
  EXPECT_EQ(a.ResidentSnapshot().size(), 1u);
  EXPECT_EQ(Unloaded().size(), 1u);
}

// Fixed defect 5: a load in flight at shutdown is waited for and unloaded.
TEST_F(ArbiterTest, Defect5ShutdownWaitsForInFlightLoad) {
  MemoryArbiter a;
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kEmbedding, 0, 50)).ok());
  std::thread t([&] { (void)a.Acquire(Capability::kEmbedding, "e", Deadline(5s)); });
  while (load_calls_ == 0) std::this_thread::yield();
  a.Shutdown();
  t.join();
  EXPECT_TRUE(a.ResidentSnapshot().empty());
  EXPECT_EQ(Unloaded(), (std::vector<std::string>{"embedding:e"}));
}

// Fixed defect 6: with a frozen injected clock the drain wait still times out.
TEST_F(ArbiterTest, Defect6DrainWaitUsesRealDeadline) {
  SimulatedClock frozen(0);
  MemoryArbiter a({.clock = &frozen, .drain_timeout_ms = 50});
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kText)).ok());
  ArbiterHandle h = Get(a, Capability::kText, "a");
  auto b = a.Acquire(Capability::kText, "b", Deadline(5s));
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().message(),
            "timeout waiting for text/a to drain (refcount=1); refusing to swap mid-flight");
}

// Fixed defect 8: an idle TTL unloads idle entries (not held ones).
TEST_F(ArbiterTest, Defect8IdleTtlUnloadsIdleModels) {
  SimulatedClock clock(0);
  MemoryArbiter a({.clock = &clock});
  Listen(a);
  CapabilityRegistration r = Reg(Capability::kEmbedding);
  r.idle_ttl_ms = 1000;
  ASSERT_TRUE(a.RegisterCapability(std::move(r)).ok());
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kTranscribe)).ok());
  Get(a, Capability::kEmbedding, "e").Release();
  Get(a, Capability::kTranscribe, "s").Release();
  clock.AdvanceMs(999);
  EXPECT_EQ(a.ReapIdle(), 0u);
  clock.AdvanceMs(1);
  EXPECT_EQ(a.ReapIdle(), 1u);
  EXPECT_FALSE(Resident(a, "embedding::e"));
  EXPECT_TRUE(Resident(a, "transcribe::s"));  // no TTL: default off
  auto ev = Events(ArbiterEventType::kModelUnload);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].reason, UnloadReason::kIdle);
}

// [[models]] role / idle_ttl: per-model overrides of the capability's role
// and idle TTL.
TEST_F(ArbiterTest, PerModelRoleAndIdleTtlOverrideTheCapability) {
  SimulatedClock clock(0);
  MemoryArbiter a({.clock = &clock});
  CapabilityRegistration r = Reg(Capability::kText);
  r.swap_same_role = false;
  r.role_for = [](const std::string& key) -> std::optional<ResidentRole> {
    if (key == "draft") return ResidentRole::kDrafter;
    return std::nullopt;
  };
  r.idle_ttl_for = [](const std::string& key) -> std::optional<int64_t> {
    if (key == "draft") return 500;
    return std::nullopt;
  };
  ASSERT_TRUE(a.RegisterCapability(std::move(r)).ok());
  Get(a, Capability::kText, "main").Release();
  Get(a, Capability::kText, "draft").Release();
  auto snap = a.ResidentSnapshot();
  ASSERT_EQ(snap.size(), 2u);
  for (const auto& e : snap) {
    EXPECT_EQ(e.role, e.model_key == "draft" ? ResidentRole::kDrafter : ResidentRole::kTextTarget);
  }
  clock.AdvanceMs(500);
  EXPECT_EQ(a.ReapIdle(), 1u);
  EXPECT_FALSE(Resident(a, "text::draft"));
  EXPECT_TRUE(Resident(a, "text::main"));
  // A drafter is an ordinary pressure victim even though its capability is text.
  Get(a, Capability::kText, "draft").Release();
  a.HandlePressure({.level = MemoryPressureLevel::kLow, .source = "test"});
  EXPECT_FALSE(Resident(a, "text::draft"));
  EXPECT_TRUE(Resident(a, "text::main"));
}

// SetIdleTtl (Ollama's keep_alive): replaces an entry's TTL from then on —
// 0 reaps it once unheld, empty never; Stats() reports the TTL and idle time.
TEST_F(ArbiterTest, SetIdleTtlReplacesTheEntrysTtl) {
  SimulatedClock clock(0);
  MemoryArbiter a({.clock = &clock, .idle_check_interval_ms = 0});
  CapabilityRegistration r = Reg(Capability::kText);
  r.swap_same_role = false;
  r.idle_ttl_ms = 1000;
  ASSERT_TRUE(a.RegisterCapability(std::move(r)).ok());
  EXPECT_EQ(a.SetIdleTtl(Capability::kEmbedding, "x", 0).code(), StatusCode::kNotFound);
  EXPECT_EQ(a.SetIdleTtl(Capability::kText, "x", -1).code(), StatusCode::kInvalidArgument);
  // Before first use: the entry keeps it when it loads.
  ASSERT_TRUE(a.SetIdleTtl(Capability::kText, "forever", std::nullopt).ok());
  Get(a, Capability::kText, "forever").Release();
  ArbiterHandle held = Get(a, Capability::kText, "now");
  ASSERT_TRUE(a.SetIdleTtl(Capability::kText, "now", 0).ok());
  EXPECT_EQ(a.ReapIdle(), 0u);  // held: never reaped
  clock.AdvanceMs(10);
  held.Release();
  for (const ModelStats& m : a.Stats().models) {
    if (m.name == "now") EXPECT_EQ(m.idle_ttl_ms, 0);
    if (m.name == "forever") {
      EXPECT_EQ(m.idle_ttl_ms, std::nullopt);
      EXPECT_EQ(m.idle_ms, 10);
    }
  }
  EXPECT_EQ(a.ReapIdle(), 1u);
  EXPECT_FALSE(Resident(a, "text::now"));
  clock.AdvanceMs(100000);
  EXPECT_EQ(a.ReapIdle(), 0u);
  EXPECT_TRUE(Resident(a, "text::forever"));
}

TEST_F(ArbiterTest, UnloadWaitsForHolderOrFailsNamingTheHandles) {
  MemoryArbiter a;
  Listen(a);
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kText)).ok());
  EXPECT_EQ(a.Unload(Capability::kEmbedding, "x", Deadline(0ms)).status().code(),
            StatusCode::kNotFound);
  Result<bool> none = a.Unload(Capability::kText, "m", Deadline(0ms));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(*none);
  ArbiterHandle h = Get(a, Capability::kText, "m");
  Result<bool> held = a.Unload(Capability::kText, "m", Deadline(20ms));
  EXPECT_EQ(held.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(held.status().message().find("held by 1 handle(s)"), std::string::npos);
  EXPECT_TRUE(Resident(a, "text::m"));
  std::thread releaser([&] {
    std::this_thread::sleep_for(30ms);
    h.Release();
  });
  Result<bool> done = a.Unload(Capability::kText, "m", Deadline(5s));
  releaser.join();
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_TRUE(*done);
  EXPECT_FALSE(Resident(a, "text::m"));
  auto ev = Events(ArbiterEventType::kModelUnload);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].reason, UnloadReason::kManual);
  EXPECT_EQ(a.ledger()->charged_bytes(), 0u);
}

TEST_F(ArbiterTest, MeasuredBytesReplaceEstimateInLedger) {
  MemoryArbiter a({.budget_bytes = 1000 * kMB});
  CapabilityRegistration r = Reg(Capability::kText, 300);
  r.load = [](const std::string&) -> Result<LoadedBackend> {
    return LoadedBackend::Of(std::make_shared<Fake>(Fake{"x"}), 123 * kMB);
  };
  ASSERT_TRUE(a.RegisterCapability(std::move(r)).ok());
  Get(a, Capability::kText, "m").Release();
  EXPECT_EQ(a.ledger()->charged_bytes(), 123 * kMB);
  EXPECT_EQ(a.Stats().models[0].bytes, 123 * kMB);
}

// The randomized fit property and the concurrent stress test live in
// memory_arbiter_property_test.cc and memory_arbiter_stress_test.cc.


// ---- Fast path (Note [Fast path]): counts and invariants, never timings ----

// A backend that knows whether it was unloaded.
struct Tracked {
  std::atomic<bool> alive{true};
};

CapabilityRegistration TrackedReg(Capability cap, size_t estimate_mb, std::atomic<int>* loads,
                                  std::atomic<int>* unloads) {
  CapabilityRegistration r;
  r.capability = cap;
  r.estimated_bytes = estimate_mb * kMB;
  r.swap_same_role = false;
  r.load = [loads](const std::string&) -> Result<LoadedBackend> {
    loads->fetch_add(1);
    return LoadedBackend::Of(std::make_shared<Tracked>(), 0);
  };
  r.unload = [unloads](const std::string&, LoadedBackend b) {
    static_cast<Tracked*>(b.object.get())->alive.store(false);
    unloads->fetch_add(1);
  };
  return r;
}

// Fit evictions, low/critical pressure and lock-free acquire/release race on a
// few keys: a handle must never see an unloaded backend, and the books must
// balance at the end.
TEST(ArbiterFastPathTest, EvictionRacingFastAcquireNeverHandsOutUnloadedBackend) {
  BridgePressureSource bridge;
  // Before the arbiter: its destructor unloads what is resident and counts it.
  std::atomic<int> loads{0}, unloads{0};
  MemoryArbiter a({.budget_bytes = 300 * kMB, .pressure_source = &bridge,
                   .idle_check_interval_ms = 0});
  ASSERT_TRUE(
      a.RegisterCapability(TrackedReg(Capability::kEmbedding, 100, &loads, &unloads)).ok());
  ASSERT_TRUE(
      a.RegisterCapability(TrackedReg(Capability::kText, 100, &loads, &unloads)).ok());
  ASSERT_TRUE(a.Start().ok());
  std::atomic<int> bad{0}, acquired{0};
  std::atomic<bool> stop{false};
  std::thread pressure([&] {
    std::mt19937 rng(7);
    while (!stop.load()) {
      bridge.Dispatch(rng() % 4 == 0 ? MemoryPressureLevel::kLow : MemoryPressureLevel::kNominal);
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> ts;
  for (uint32_t t = 0; t < 4; ++t) {
    ts.emplace_back([&, t] {
      std::mt19937 rng(200 + t);
      for (int op = 0; op < 4000; ++op) {
        const Capability c = rng() % 4 == 0 ? Capability::kText : Capability::kEmbedding;
        const std::string key = "k" + std::to_string(rng() % 5);
        auto h = a.Acquire(c, key, Deadline(5s));
        if (!h.ok()) continue;  // e.g. a race with nothing: there is no budget refusal here
        acquired.fetch_add(1);
        Tracked* b = h->backend<Tracked>();
        if (b == nullptr || !b->alive.load()) bad.fetch_add(1);
        if (rng() % 2 == 0) {
          auto r = h->Retain();
          if (!r.ok() || r->backend<Tracked>() != b) bad.fetch_add(1);
        }
        std::this_thread::yield();
        if (b == nullptr || !b->alive.load()) bad.fetch_add(1);
      }
    });
  }
  for (auto& th : ts) th.join();
  stop = true;
  pressure.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_GT(acquired.load(), 0);
  size_t resident = 0;
  for (const auto& r : a.ResidentSnapshot()) {
    EXPECT_EQ(r.refcount, 0) << r.resident_key;
    resident += r.bytes;
  }
  ArbiterStats s = a.Stats();
  EXPECT_EQ(a.ledger()->charged_bytes(), resident);
  EXPECT_EQ(s.resident_bytes, resident);
  EXPECT_EQ(loads.load() - unloads.load(), s.resident_models);
  EXPECT_EQ(s.loads, static_cast<uint64_t>(loads.load()));
  a.Shutdown();
  EXPECT_EQ(loads.load(), unloads.load());
  EXPECT_EQ(a.ledger()->charged_bytes(), 0u);
}

// The lock-free release to 0 must wake a swap waiting for the drain (a lost
// wake-up would show as a drain timeout).
TEST(ArbiterFastPathTest, LockFreeReleaseWakesSwapWaiter) {
  // Before the arbiter: its destructor unloads what is resident and counts it
  // (clang's ASan caught the counter used after its scope).
  std::atomic<int> loads{0}, unloads{0};
  MemoryArbiter a({.drain_timeout_ms = 5000, .idle_check_interval_ms = 0});
  CapabilityRegistration r = TrackedReg(Capability::kVisionDescribe, 0, &loads, &unloads);
  r.swap_same_role = true;
  ASSERT_TRUE(a.RegisterCapability(std::move(r)).ok());
  for (int round = 0; round < 200; ++round) {
    const std::string held_key = round % 2 == 0 ? "a" : "b";
    const std::string next_key = round % 2 == 0 ? "b" : "a";
    auto h = a.Acquire(Capability::kVisionDescribe, held_key, Deadline(5s));
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    auto h2 = a.Acquire(Capability::kVisionDescribe, held_key, Deadline(5s));  // fast path
    ASSERT_TRUE(h2.ok());
    h2->Release();
    std::atomic<bool> alive_while_held{true};
    std::thread holder([&, round] {
      for (int spin = 0; spin < (round % 7) * 50; ++spin) std::this_thread::yield();
      alive_while_held = h->backend<Tracked>()->alive.load();
      h->Release();
    });
    auto swapped = a.Acquire(Capability::kVisionDescribe, next_key, Deadline(10s));
    holder.join();
    ASSERT_TRUE(swapped.ok()) << "round " << round << ": " << swapped.status().ToString();
    EXPECT_TRUE(alive_while_held.load()) << "round " << round;
  }
  EXPECT_EQ(loads.load() - unloads.load(), 1);
}

TEST_F(ArbiterTest, FastPathLastUsedEqualsClockAndFollowsItBackwards) {
  SimulatedClock clock(100);
  MemoryArbiter a({.clock = &clock, .idle_check_interval_ms = 0});
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kEmbedding)).ok());
  Get(a, Capability::kEmbedding, "e").Release();  // slow path: loads
  for (int64_t t : {105, 106, 200, 150, 151}) {     // 150: the clock went back
    clock.SetMs(t);
    ArbiterHandle h = Get(a, Capability::kEmbedding, "e");
    auto snap = a.ResidentSnapshot();
    ASSERT_EQ(snap.size(), 1u);
    EXPECT_EQ(snap[0].last_used_ms, t);
    EXPECT_EQ(snap[0].refcount, 1);
  }
  EXPECT_EQ(load_calls_.load(), 1);
}

// Fast acquires leave stale LRU keys and held entries in the maps; the fit
// victim must still be the least recently used idle entry.
TEST_F(ArbiterTest, LazyLruEvictsTrueLeastRecentlyUsedIdleEntry) {
  SimulatedClock clock(0);
  MemoryArbiter a({.budget_bytes = 300 * kMB, .clock = &clock, .idle_check_interval_ms = 0});
  Listen(a);
  CapabilityRegistration r = Reg(Capability::kEmbedding, 100);
  r.swap_same_role = false;
  ASSERT_TRUE(a.RegisterCapability(std::move(r)).ok());
  for (const char* k : {"a", "b", "c"}) {
    clock.AdvanceMs(1);
    Get(a, Capability::kEmbedding, k).Release();
  }
  clock.AdvanceMs(1);
  Get(a, Capability::kEmbedding, "a").Release();  // fast path: a is now the newest
  clock.AdvanceMs(1);
  ArbiterHandle c = Get(a, Capability::kEmbedding, "c");  // fast path, held
  clock.AdvanceMs(1);
  Get(a, Capability::kEmbedding, "d").Release();  // evicts b (a touched, c held)
  EXPECT_FALSE(Resident(a, "embedding::b"));
  EXPECT_TRUE(Resident(a, "embedding::a"));
  EXPECT_TRUE(Resident(a, "embedding::c"));
  clock.AdvanceMs(1);
  Get(a, Capability::kEmbedding, "e").Release();  // evicts a (c still held)
  EXPECT_FALSE(Resident(a, "embedding::a"));
  EXPECT_TRUE(Resident(a, "embedding::c"));
  c.Release();
  clock.AdvanceMs(1);
  Get(a, Capability::kEmbedding, "f").Release();  // c (last used @5) is now the LRU
  EXPECT_FALSE(Resident(a, "embedding::c"));
  EXPECT_TRUE(Resident(a, "embedding::d"));
  auto ev = Events(ArbiterEventType::kEviction);
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(ev[0].model_key, "b");
  EXPECT_EQ(ev[1].model_key, "a");
  EXPECT_EQ(ev[2].model_key, "c");
}

TEST_F(ArbiterTest, FastPathRefusesHeldNonTextUnderCriticalAndAfterShutdown) {
  MemoryArbiter a({.idle_check_interval_ms = 0});
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kVisionDescribe)).ok());
  ASSERT_TRUE(a.RegisterCapability(Reg(Capability::kText)).ok());
  ArbiterHandle v = Get(a, Capability::kVisionDescribe, "v");
  ArbiterHandle t = Get(a, Capability::kText, "t");
  MemoryPressureEvent pressure;
  pressure.source = "test";
  pressure.level = MemoryPressureLevel::kCritical;
  a.HandlePressure(pressure);
  auto again = a.Acquire(Capability::kVisionDescribe, "v", Deadline(1s));  // resident, held
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("critical"), std::string::npos);
  EXPECT_TRUE(a.Acquire(Capability::kText, "t", Deadline(1s)).ok());
  pressure.level = MemoryPressureLevel::kNominal;
  a.HandlePressure(pressure);
  EXPECT_TRUE(a.Acquire(Capability::kVisionDescribe, "v", Deadline(1s)).ok());

  std::thread shutdown([&] { a.Shutdown(); });  // waits for v and t
  for (int i = 0; i < 1000; ++i) {
    auto h = a.Acquire(Capability::kText, "t", Deadline(1s));
    if (!h.ok()) {
      EXPECT_NE(h.status().message().find("shutting down"), std::string::npos);
      break;
    }
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_FALSE(a.Acquire(Capability::kText, "t", Deadline(1s)).ok());
  v.Release();  // lock-free release after shutdown: unloads at once
  t.Release();
  shutdown.join();
  EXPECT_TRUE(a.ResidentSnapshot().empty());
  EXPECT_EQ(a.ledger()->charged_bytes(), 0u);
  EXPECT_EQ(Unloaded().size(), 2u);
}

// Many keys (key table growth) looked up lock-free while others are created.
TEST_F(ArbiterTest, KeyTableGrowsUnderConcurrentLookups) {
  MemoryArbiter a({.idle_check_interval_ms = 0});
  CapabilityRegistration r = Reg(Capability::kEmbedding);
  r.swap_same_role = false;
  ASSERT_TRUE(a.RegisterCapability(std::move(r)).ok());
  std::vector<std::thread> ts;
  for (int t = 0; t < 3; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < 300; ++i) {
        const std::string key = "model-" + std::to_string(t * 1000 + i);
        for (int rep = 0; rep < 3; ++rep) {
          auto h = a.Acquire(Capability::kEmbedding, key, Deadline(5s));
          ASSERT_TRUE(h.ok());
          EXPECT_EQ(h->model(), key);
          EXPECT_EQ(h->backend<Fake>()->key, "embedding:" + key);
        }
      }
    });
  }
  for (auto& th : ts) th.join();
  EXPECT_EQ(load_calls_.load(), 900);
  EXPECT_EQ(a.ResidentSnapshot().size(), 900u);
}

// The unload callable gets the model key and the arbiter's own reference:
// nobody else holds the backend, so the callable decides when it goes (the
// engine models' explicit unload step relies on this).
TEST(ArbiterUnloadTest, UnloadGetsTheKeyAndTheLastReference) {
  std::weak_ptr<Tracked> loaded;
  std::vector<std::pair<std::string, long>> seen;  // {key, use_count}
  bool alive_after_reset = true;
  CapabilityRegistration r;
  r.capability = Capability::kText;
  r.estimated_bytes = kMB;
  r.load = [&](const std::string&) -> Result<LoadedBackend> {
    auto b = std::make_shared<Tracked>();
    loaded = b;
    return LoadedBackend::Of(std::move(b), 0);
  };
  r.unload = [&](const std::string& key, LoadedBackend b) {
    seen.push_back({key, b.object.use_count()});
    b.object.reset();
    alive_after_reset = !loaded.expired();
  };
  MemoryArbiter a({.idle_check_interval_ms = 0});
  ASSERT_TRUE(a.RegisterCapability(std::move(r)).ok());
  {
    Result<ArbiterHandle> h = a.Acquire(Capability::kText, "m", Deadline(5s));
    ASSERT_TRUE(h.ok()) << h.status().ToString();
  }
  ASSERT_TRUE(a.Unload(Capability::kText, "m", Deadline(5s)).ok());
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].first, "m");
  EXPECT_EQ(seen[0].second, 1) << "the callable holds the only reference";
  EXPECT_FALSE(alive_after_reset) << "dropping it inside the callable frees the backend";
}

}  // namespace
}  // namespace arbiter
