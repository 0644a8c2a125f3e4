// Tests for pressure levels, the bridge, the composite and the meminfo poller,
// including every item of the reference's checklist for the sources
// (docs/memory.md "Pressure levels and sources"), plus a contract suite run
// against every MemoryPressureSource implementation.
#include "arbiter/memory/memory_pressure.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>

#include "arbiter/memory/cgroup_pressure_source.h"
#include "arbiter/memory/meminfo_pressure_source.h"
#include "arbiter/memory/psi_pressure_source.h"
#include "memory/pressure_test_util.h"

namespace arbiter {
namespace {

using L = MemoryPressureLevel;
using testing_util::EventLog;
using testing_util::TempDir;
using testing_util::WriteText;

constexpr uint64_t kGiB = uint64_t{1} << 30;

std::string Meminfo(double avail_gib, double total_gib) {
  return "MemTotal:       " + std::to_string(static_cast<uint64_t>(total_gib * 1024 * 1024)) +
         " kB\nMemFree: 1 kB\nMemAvailable:   " +
         std::to_string(static_cast<uint64_t>(avail_gib * 1024 * 1024)) + " kB\n";
}

// ------------------------------------------------------------------ levels

TEST(MemoryPressureLevelTest, NamesRoundTrip) {
  for (L l : {L::kNominal, L::kLow, L::kCritical}) {
    auto parsed = ParseMemoryPressureLevel(MemoryPressureLevelName(l));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, l);
  }
  EXPECT_EQ(MemoryPressureLevelName(L::kCritical), "critical");
  auto bad = ParseMemoryPressureLevel("HIGH");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("HIGH"), std::string::npos);
  EXPECT_NE(bad.status().message().find("nominal, low, critical"), std::string::npos);
}

TEST(MemoryPressureLevelTest, WorseLevelOrdersCriticalOverLowOverNominal) {
  EXPECT_EQ(WorseLevel(L::kLow, L::kCritical), L::kCritical);
  EXPECT_EQ(WorseLevel(L::kNominal, L::kLow), L::kLow);
  EXPECT_EQ(WorseLevel(L::kNominal, L::kNominal), L::kNominal);
}

TEST(MemoryPressureLevelTest, ClassifyBoundariesAreInclusive) {
  EXPECT_EQ(ClassifyFreeFraction(0.05, 0.15, 0.05), L::kCritical);
  EXPECT_EQ(ClassifyFreeFraction(0.15, 0.15, 0.05), L::kLow);
  EXPECT_EQ(ClassifyFreeFraction(0.1501, 0.15, 0.05), L::kNominal);
}

// ------------------------------------------------------------------ meminfo

class MeminfoTest : public ::testing::Test {
 protected:
  Result<std::unique_ptr<MeminfoPressureSource>> Make(double low, double critical) {
    MeminfoPressureSource::Options o;
    o.meminfo_path = path_;
    o.low_fraction = low;
    o.critical_fraction = critical;
    o.clock = &clock_;
    o.warn = [this](std::string_view w) { warnings_.emplace_back(w); };
    return MeminfoPressureSource::Create(o);
  }
  void SetFree(double avail_gib, double total_gib) {
    WriteText(path_, Meminfo(avail_gib, total_gib));
  }
  TempDir dir_;
  std::string path_ = dir_.path() + "/meminfo";
  SimulatedClock clock_{1000};
  std::vector<std::string> warnings_;
};

TEST_F(MeminfoTest, EightOfSixteenGibFreeIsNominal) {
  SetFree(8, 16);
  auto src = Make(kDefaultLowWaterFraction, kDefaultCriticalWaterFraction);
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  MemoryPressureEvent e = (*src)->Tick();
  EXPECT_EQ(e.level, L::kNominal);
  EXPECT_EQ(e.free_bytes, 8 * kGiB);
  EXPECT_EQ(e.total_bytes, 16 * kGiB);
  EXPECT_DOUBLE_EQ(*e.free_fraction, 0.5);
  EXPECT_EQ(e.source, "meminfo");
  EXPECT_EQ(e.at_ms, 1000);
}

TEST_F(MeminfoTest, CustomWatermarksClassifyNominalLowCritical) {
  auto src = Make(0.2, 0.05);
  ASSERT_TRUE(src.ok());
  SetFree(8, 16);
  EXPECT_EQ((*src)->Tick().level, L::kNominal);
  SetFree(2, 16);
  EXPECT_EQ((*src)->Tick().level, L::kLow);
  SetFree(0.5, 16);
  EXPECT_EQ((*src)->Tick().level, L::kCritical);
}

TEST_F(MeminfoTest, CriticalNotBelowLowIsRejected) {
  auto same = Make(0.1, 0.1);
  ASSERT_FALSE(same.ok());
  EXPECT_EQ(same.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(same.status().message(),
            "pressure.critical_fraction (0.1) must be < pressure.low_fraction (0.1)");
  auto above = Make(0.1, 0.3);
  ASSERT_FALSE(above.ok());
  EXPECT_EQ(above.status().message(),
            "pressure.critical_fraction (0.3) must be < pressure.low_fraction (0.1)");
}

TEST_F(MeminfoTest, OutOfRangeFractionsAndShortIntervalFallBack) {
  MeminfoPressureSource::Options o;
  o.meminfo_path = path_;
  o.low_fraction = 1.5;
  o.critical_fraction = 0;
  o.interval_ms = 10;
  auto src = MeminfoPressureSource::Create(o);
  ASSERT_TRUE(src.ok());
  EXPECT_DOUBLE_EQ((*src)->low_fraction(), 0.15);
  EXPECT_DOUBLE_EQ((*src)->critical_fraction(), 0.05);
  EXPECT_EQ((*src)->interval_ms(), kMinPressurePollIntervalMs);
  // A fallback can itself create the conflict: low 0.01 with default critical.
  o.low_fraction = 0.01;
  o.critical_fraction = -1;
  auto conflict = MeminfoPressureSource::Create(o);
  ASSERT_FALSE(conflict.ok());
  EXPECT_EQ(conflict.status().message(),
            "pressure.critical_fraction (0.05) must be < pressure.low_fraction (0.01)");
}

TEST_F(MeminfoTest, FiresOnLevelChangeOnlyAndFirstTickAlways) {
  auto src = Make(0.2, 0.05);
  ASSERT_TRUE(src.ok());
  EventLog log;
  auto sub = (*src)->Subscribe(log.Listener());
  EXPECT_EQ(log.size(), 0u);  // nothing to replay before the first tick
  SetFree(8, 16);
  (*src)->Tick();
  SetFree(7, 16);
  (*src)->Tick();  // still nominal: no event
  SetFree(2, 16);
  (*src)->Tick();
  SetFree(1.9, 16);
  (*src)->Tick();  // still low
  SetFree(8, 16);
  (*src)->Tick();
  EXPECT_EQ(log.Levels(), (std::vector<L>{L::kNominal, L::kLow, L::kNominal}));
}

TEST_F(MeminfoTest, SubscribeReplaysLastEventAndCurrentDoesNotNotify) {
  auto src = Make(0.2, 0.05);
  ASSERT_TRUE(src.ok());
  SetFree(2, 16);
  (*src)->Tick();
  EventLog log;
  auto sub = (*src)->Subscribe(log.Listener());
  EXPECT_EQ(log.Levels(), std::vector<L>{L::kLow});
  SetFree(0.5, 16);
  MemoryPressureEvent now = (*src)->Current();
  EXPECT_EQ(now.level, L::kCritical);  // a fresh sample...
  EXPECT_EQ(log.size(), 1u);           // ...that notified nobody
  (*src)->Tick();
  EXPECT_EQ(log.Levels(), (std::vector<L>{L::kLow, L::kCritical}));
}

TEST_F(MeminfoTest, BadReadingIsNominalWithAWarning) {
  auto src = Make(0.2, 0.05);
  ASSERT_TRUE(src.ok());
  SetFree(0.5, 16);
  EXPECT_EQ((*src)->Tick().level, L::kCritical);
  WriteText(path_, "MemTotal: garbage kB\n");
  MemoryPressureEvent e = (*src)->Tick();
  EXPECT_EQ(e.level, L::kNominal);
  EXPECT_FALSE(e.free_bytes.has_value());
  ASSERT_EQ(warnings_.size(), 1u);
  EXPECT_NE(warnings_[0].find(path_), std::string::npos);
  EXPECT_NE(warnings_[0].find("MemTotal"), std::string::npos);
  std::filesystem::remove(path_);
  EXPECT_EQ((*src)->Tick().level, L::kNominal);
  EXPECT_EQ(warnings_.size(), 2u);
}

TEST_F(MeminfoTest, StartSamplesAtOnceAndStopInterruptsTheWait) {
  SetFree(2, 16);
  MeminfoPressureSource::Options o;
  o.meminfo_path = path_;
  o.interval_ms = 60'000;  // Stop() must not wait this out
  auto src = MeminfoPressureSource::Create(o);
  ASSERT_TRUE(src.ok());
  ASSERT_TRUE((*src)->Start().ok());
  ASSERT_TRUE((*src)->Start().ok());  // idempotent
  EventLog log;
  auto sub = (*src)->Subscribe(log.Listener());
  EXPECT_EQ(log.Levels(), std::vector<L>{L::kLow});
  auto t0 = std::chrono::steady_clock::now();
  (*src)->Stop();
  (*src)->Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

TEST_F(MeminfoTest, PollThreadTicksOnTheInterval) {
  SetFree(8, 16);
  MeminfoPressureSource::Options o;
  o.meminfo_path = path_;
  o.interval_ms = kMinPressurePollIntervalMs;
  auto src = MeminfoPressureSource::Create(o);
  ASSERT_TRUE(src.ok());
  EventLog log;
  auto sub = (*src)->Subscribe(log.Listener());
  ASSERT_TRUE((*src)->Start().ok());
  SetFree(0.5, 16);
  ASSERT_TRUE(log.WaitForLevel(L::kCritical, std::chrono::seconds(30)));
  (*src)->Stop();
}

// ------------------------------------------------------------------ bridge

TEST(BridgePressureSourceTest, DispatchesAreObserved) {
  SimulatedClock clock(5);
  BridgePressureSource bridge("bridge", &clock);
  EventLog log;
  auto sub = bridge.Subscribe(log.Listener());
  EXPECT_EQ(log.Levels(), std::vector<L>{L::kNominal});  // replay of the initial event
  clock.SetMs(7);
  bridge.Dispatch(L::kLow, 300 * (uint64_t{1} << 20));
  bridge.Dispatch(L::kLow);  // always fans out, even unchanged
  bridge.Dispatch(L::kCritical);
  EXPECT_EQ(log.Levels(), (std::vector<L>{L::kNominal, L::kLow, L::kLow, L::kCritical}));
  auto events = log.Events();
  EXPECT_EQ(events[1].free_bytes, 300 * (uint64_t{1} << 20));
  EXPECT_EQ(events[1].at_ms, 7);
  EXPECT_EQ(events[1].source, "bridge");
  EXPECT_EQ(bridge.Current().level, L::kCritical);
  EventLog late;
  auto sub2 = bridge.Subscribe(late.Listener());
  EXPECT_EQ(late.Levels(), std::vector<L>{L::kCritical});
}

TEST(BridgePressureSourceTest, UnsubscribedListenerHearsNothing) {
  BridgePressureSource bridge;
  EventLog log;
  {
    auto sub = bridge.Subscribe(log.Listener());
  }
  bridge.Dispatch(L::kLow);
  EXPECT_EQ(log.size(), 1u);  // only the replay
}

TEST(BridgePressureSourceTest, ThrowingListenerIsRemovedWithAWarning) {
  std::vector<std::string> warnings;
  BridgePressureSource bridge("bridge", nullptr,
                              [&](std::string_view w) { warnings.emplace_back(w); });
  int calls = 0;
  auto sub = bridge.Subscribe([&](const MemoryPressureEvent& e) {
    ++calls;
    if (e.level == L::kLow) throw std::runtime_error("boom");
  });
  bridge.Dispatch(L::kLow);
  bridge.Dispatch(L::kCritical);
  EXPECT_EQ(calls, 2);  // replay + the throwing call; nothing after
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("boom"), std::string::npos);
}

TEST(BridgePressureSourceTest, ListenerMayUnsubscribeItselfInsideTheCallback) {
  BridgePressureSource bridge;
  MemoryPressureSubscription sub;
  int calls = 0;
  sub = bridge.Subscribe([&](const MemoryPressureEvent& e) {
    ++calls;
    if (e.level == L::kLow) sub.Reset();
  });
  bridge.Dispatch(L::kLow);
  bridge.Dispatch(L::kCritical);
  EXPECT_EQ(calls, 2);
  EXPECT_FALSE(sub.active());
}

TEST(BridgePressureSourceTest, SubscriptionMayOutliveTheSource) {
  MemoryPressureSubscription sub;
  {
    BridgePressureSource bridge;
    sub = bridge.Subscribe([](const MemoryPressureEvent&) {});
  }
  sub.Reset();  // must not touch the dead source
  EXPECT_FALSE(sub.active());
}

// ------------------------------------------------------------------ composite

struct TwoBridges {
  TwoBridges() {
    std::vector<std::unique_ptr<MemoryPressureSource>> children;
    auto ua = std::make_unique<BridgePressureSource>("a");
    auto ub = std::make_unique<BridgePressureSource>("b");
    a = ua.get();
    b = ub.get();
    children.push_back(std::move(ua));
    children.push_back(std::move(ub));
    composite = std::make_unique<CompositePressureSource>(std::move(children));
  }
  BridgePressureSource* a;
  BridgePressureSource* b;
  std::unique_ptr<CompositePressureSource> composite;
};

TEST(CompositePressureSourceTest, WorstLevelAcrossChildren) {
  TwoBridges t;
  ASSERT_TRUE(t.composite->Start().ok());
  EventLog log;
  auto sub = t.composite->Subscribe(log.Listener());
  t.a->Dispatch(L::kLow);
  t.b->Dispatch(L::kCritical);
  EXPECT_EQ(t.composite->Current().level, L::kCritical);
  t.b->Dispatch(L::kNominal);
  EXPECT_EQ(t.composite->Current().level, L::kLow);
  t.a->Dispatch(L::kNominal);
  EXPECT_EQ(t.composite->Current().level, L::kNominal);
  EXPECT_EQ(log.Levels(),
            (std::vector<L>{L::kNominal, L::kLow, L::kCritical, L::kLow, L::kNominal}));
  auto events = log.Events();
  EXPECT_EQ(events[2].source, "b");  // the event names the child that fired
  EXPECT_EQ(events[3].source, "a");
}

TEST(CompositePressureSourceTest, FansOutOnlyWhenTheWorstLevelChanges) {
  TwoBridges t;
  ASSERT_TRUE(t.composite->Start().ok());
  EventLog log;
  auto sub = t.composite->Subscribe(log.Listener());
  t.a->Dispatch(L::kCritical);
  t.b->Dispatch(L::kLow);       // worst stays critical
  t.a->Dispatch(L::kCritical);  // unchanged
  EXPECT_EQ(log.Levels(), (std::vector<L>{L::kNominal, L::kCritical}));
}

TEST(CompositePressureSourceTest, SubscribeEmitsTheWorstNow) {
  TwoBridges t;
  ASSERT_TRUE(t.composite->Start().ok());
  t.b->Dispatch(L::kLow);
  EventLog log;
  auto sub = t.composite->Subscribe(log.Listener());
  EXPECT_EQ(log.Levels(), std::vector<L>{L::kLow});
}

class FailingSource final : public MemoryPressureSource {
 public:
  const std::string& id() const override { return id_; }
  MemoryPressureSubscription Subscribe(MemoryPressureListener l) override {
    return bridge_.Subscribe(std::move(l));
  }
  Status Start() override { return UnavailableError("no such signal here"); }
  void Stop() override { ++stops; }
  MemoryPressureEvent Current() override { return {L::kCritical, {}, {}, {}, id_, 0}; }
  void Fire(L level) { bridge_.Dispatch(level); }
  int stops = 0;

 private:
  std::string id_ = "failing";
  BridgePressureSource bridge_{"failing"};
};

TEST(CompositePressureSourceTest, ChildThatFailsToStartIsSkippedAndReported) {
  std::vector<std::unique_ptr<MemoryPressureSource>> children;
  auto failing = std::make_unique<FailingSource>();
  FailingSource* f = failing.get();
  auto bridge = std::make_unique<BridgePressureSource>("ok");
  BridgePressureSource* ok = bridge.get();
  children.push_back(std::move(failing));
  children.push_back(std::move(bridge));
  CompositePressureSource composite(std::move(children));
  ASSERT_TRUE(composite.Start().ok());
  auto errors = composite.child_errors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].first, "failing");
  EXPECT_EQ(errors[0].second.code(), StatusCode::kUnavailable);
  f->Fire(L::kCritical);  // ignored: the child is not running
  EXPECT_EQ(composite.Current().level, L::kNominal);
  ok->Dispatch(L::kLow);
  EXPECT_EQ(composite.Current().level, L::kLow);
  composite.Stop();
  EXPECT_EQ(f->stops, 0);  // never started, never stopped
}

TEST(CompositePressureSourceTest, AllChildrenFailingIsUnavailable) {
  std::vector<std::unique_ptr<MemoryPressureSource>> children;
  children.push_back(std::make_unique<FailingSource>());
  CompositePressureSource composite(std::move(children));
  Status s = composite.Start();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("no such signal here"), std::string::npos);
}

// ------------------------------------------------------------------ contract suite

// Builds a source over fake inputs in `dir`; `raise` makes it report low.
struct ContractCase {
  std::string name;
  std::function<std::unique_ptr<MemoryPressureSource>(const std::string& dir,
                                                      std::function<void()>* raise)>
      make;
};

class PressureSourceContractTest : public ::testing::TestWithParam<ContractCase> {
 protected:
  void SetUp() override {
    source_ = GetParam().make(dir_.path(), &raise_);
    ASSERT_NE(source_, nullptr);
  }
  TempDir dir_;
  std::function<void()> raise_;
  std::unique_ptr<MemoryPressureSource> source_;
};

TEST_P(PressureSourceContractTest, StartReplaysAndRaiseIsDelivered) {
  ASSERT_TRUE(source_->Start().ok());
  EXPECT_TRUE(source_->Start().ok());
  EventLog log;
  auto sub = source_->Subscribe(log.Listener());
  ASSERT_EQ(log.size(), 1u) << "subscribe after Start() must replay";
  EXPECT_EQ(log.Events()[0].level, L::kNominal);
  raise_();
  EXPECT_EQ(log.Levels().back(), L::kLow);
  EXPECT_EQ(source_->Current().level, L::kLow);
  sub.Reset();
  size_t before = log.size();
  source_->Stop();
  source_->Stop();
  EXPECT_EQ(log.size(), before);
  ASSERT_TRUE(source_->Start().ok()) << "a stopped source starts again";
  source_->Stop();
}

TEST_P(PressureSourceContractTest, EveryEventNamesTheSource) {
  ASSERT_TRUE(source_->Start().ok());
  EventLog log;
  auto sub = source_->Subscribe(log.Listener());
  raise_();
  for (const auto& e : log.Events()) EXPECT_FALSE(e.source.empty());
  source_->Stop();
}

std::vector<ContractCase> ContractCases() {
  std::vector<ContractCase> cases;
  cases.push_back({"Bridge", [](const std::string&, std::function<void()>* raise) {
                     auto b = std::make_unique<BridgePressureSource>();
                     auto* p = b.get();
                     *raise = [p] { p->Dispatch(L::kLow); };
                     return std::unique_ptr<MemoryPressureSource>(std::move(b));
                   }});
  cases.push_back({"Meminfo", [](const std::string& dir, std::function<void()>* raise) {
                     std::string path = dir + "/meminfo";
                     WriteText(path, Meminfo(8, 16));
                     MeminfoPressureSource::Options o;
                     o.meminfo_path = path;
                     o.interval_ms = 60'000;
                     auto s = std::move(MeminfoPressureSource::Create(o)).value();
                     auto* p = s.get();
                     *raise = [p, path] {
                       WriteText(path, Meminfo(1, 16));
                       p->Tick();
                     };
                     return std::unique_ptr<MemoryPressureSource>(std::move(s));
                   }});
  cases.push_back({"Psi", [](const std::string& dir, std::function<void()>* raise) {
                     std::string path = dir + "/memory";
                     WriteText(path,
                               "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
                               "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n");
                     PsiPressureSource::Options o;
                     o.path = path;
                     o.arm_triggers = false;
                     auto s = std::move(PsiPressureSource::Create(o)).value();
                     auto* p = s.get();
                     *raise = [p] { p->OnTrigger(L::kLow); };
                     return std::unique_ptr<MemoryPressureSource>(std::move(s));
                   }});
  cases.push_back({"Cgroup", [](const std::string& dir, std::function<void()>* raise) {
                     std::string cg = dir + "/cg/app";
                     std::filesystem::create_directories(cg);
                     WriteText(dir + "/self_cgroup", "0::/app\n");
                     WriteText(cg + "/memory.max", "1000\n");
                     WriteText(cg + "/memory.current", "100\n");
                     WriteText(cg + "/memory.high", "max\n");
                     WriteText(cg + "/memory.events", "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n");
                     CgroupPressureSource::Options o;
                     o.cgroup_root = dir + "/cg";
                     o.proc_self_cgroup = dir + "/self_cgroup";
                     o.interval_ms = 60'000;
                     auto s = std::move(CgroupPressureSource::Create(o)).value();
                     auto* p = s.get();
                     *raise = [p, cg] {
                       WriteText(cg + "/memory.current", "900\n");
                       p->Tick();
                     };
                     return std::unique_ptr<MemoryPressureSource>(std::move(s));
                   }});
  cases.push_back({"Composite", [](const std::string&, std::function<void()>* raise) {
                     std::vector<std::unique_ptr<MemoryPressureSource>> children;
                     auto b = std::make_unique<BridgePressureSource>();
                     auto* p = b.get();
                     children.push_back(std::move(b));
                     *raise = [p] { p->Dispatch(L::kLow); };
                     return std::unique_ptr<MemoryPressureSource>(
                         std::make_unique<CompositePressureSource>(std::move(children)));
                   }});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllSources, PressureSourceContractTest,
                         ::testing::ValuesIn(ContractCases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace arbiter
