// Tests for the PSI and cgroup v2 pressure sources: parsers and level logic
// over fake files, plus what this machine's real PSI / cgroup files do.
#include <gtest/gtest.h>

#include <filesystem>

#include "arbiter/memory/cgroup_pressure_source.h"
#include "arbiter/memory/psi_pressure_source.h"
#include "memory/pressure_test_util.h"

namespace arbiter {
namespace {

using L = MemoryPressureLevel;
using testing_util::EventLog;
using testing_util::TempDir;
using testing_util::WriteText;

const char kQuietPsi[] =
    "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";

// ------------------------------------------------------------------ PSI parser

TEST(ParsePsiTest, ParsesSomeAndFull) {
  auto r = ParsePsi("some avg10=1.50 avg60=0.25 avg300=0.00 total=12345\n"
                    "full avg10=0.75 avg60=0.00 avg300=0.00 total=99\n");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_DOUBLE_EQ(r->some.avg10, 1.5);
  EXPECT_DOUBLE_EQ(r->some.avg60, 0.25);
  EXPECT_EQ(r->some.total_us, 12345u);
  ASSERT_TRUE(r->full.has_value());
  EXPECT_DOUBLE_EQ(r->full->avg10, 0.75);
  EXPECT_FALSE(ParsePsi("some avg10=0.00 avg60=0.00 avg300=0.00 total=0").value().full);
}

TEST(ParsePsiTest, ErrorsNameTheLineAndField) {
  struct Case { const char* text; const char* needle; } cases[] = {
      {"", "no \"some\" line"},
      {"full avg10=0 avg60=0 avg300=0 total=0\n", "no \"some\" line"},
      {"some avg60=0 avg300=0 total=0\n", "no avg10 field"},
      {"some avg10=0 avg60=0 avg300=0\n", "no total field"},
      {"some avg10=x avg60=0 avg300=0 total=0\n", "avg10 is not a number"},
      {"some avg10=0 avg60=0 avg300=0 total=-1\n", "total is not a number"},
      {"some avg10=0 avg60=101 avg300=0 total=0\n", "avg60=101 is outside [0, 100]"},
      {"some avg10=0 avg60=0 avg300=0 total=0\nsome avg10=0 avg60=0 avg300=0 total=0\n",
       "two \"some\" lines"},
      {"half avg10=0\n", "unknown line kind \"half\""},
      {"some avg10 avg60=0 avg300=0 total=0\n", "not key=value"},
  };
  for (const auto& c : cases) {
    auto r = ParsePsi(c.text);
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << c.text;
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos)
        << c.text << " -> " << r.status().message();
  }
}

TEST(PsiTriggerTest, TextAndValidation) {
  PsiTrigger t{PsiTrigger::Kind::kSome, 150000, 1000000};
  EXPECT_EQ(t.ToString(), "some 150000 1000000");
  EXPECT_DOUBLE_EQ(t.Percent(), 15.0);
  PsiPressureSource::Options o;
  o.low_trigger = {PsiTrigger::Kind::kSome, 0, 1000000};
  auto r = PsiPressureSource::Create(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("psi_low_trigger"), std::string::npos);
  EXPECT_NE(r.status().message().find("stall_us"), std::string::npos);
  o.low_trigger = {PsiTrigger::Kind::kSome, 1000, 100};
  EXPECT_NE(PsiPressureSource::Create(o).status().message().find("window_us"),
            std::string::npos);
}

// ------------------------------------------------------------------ PSI level logic

class PsiLogicTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteText(path_, kQuietPsi);
    PsiPressureSource::Options o;
    o.path = path_;
    o.arm_triggers = false;
    o.low_trigger = {PsiTrigger::Kind::kSome, 150000, 1000000};    // 15 %
    o.critical_trigger = {PsiTrigger::Kind::kFull, 100000, 1000000};  // 10 %
    o.quiet_ms = 10000;
    o.clock = &clock_;
    o.warn = [this](std::string_view w) { warnings_.emplace_back(w); };
    src_ = std::move(PsiPressureSource::Create(o)).value();
    sub_ = src_->Subscribe(log_.Listener());
  }
  TempDir dir_;
  std::string path_ = dir_.path() + "/memory";
  SimulatedClock clock_{0};
  std::vector<std::string> warnings_;
  std::unique_ptr<PsiPressureSource> src_;
  EventLog log_;
  MemoryPressureSubscription sub_;
};

TEST_F(PsiLogicTest, TriggersRaiseAndQuietWindowDecaysToNominal) {
  src_->OnTrigger(L::kLow);
  src_->OnTrigger(L::kCritical);
  src_->OnTrigger(L::kLow);  // never lowers
  EXPECT_EQ(src_->Current().level, L::kCritical);
  clock_.AdvanceMs(9999);
  EXPECT_EQ(src_->Tick(), L::kCritical);  // still inside the quiet window
  clock_.AdvanceMs(1);
  // Critical is quiet, but a low trigger fired at t=0 too: both are now quiet.
  EXPECT_EQ(src_->Tick(), L::kNominal);
  EXPECT_EQ(log_.Levels(), (std::vector<L>{L::kLow, L::kCritical, L::kNominal}));
  EXPECT_EQ(log_.Events()[1].source, "psi");
}

TEST_F(PsiLogicTest, DecayStopsWhereTheAveragesSay) {
  src_->OnTrigger(L::kCritical);
  WriteText(path_, "some avg10=40.00 avg60=10.00 avg300=1.00 total=5\n"
                   "full avg10=12.00 avg60=0.00 avg300=0.00 total=1\n");
  clock_.AdvanceMs(20000);
  EXPECT_EQ(src_->Tick(), L::kCritical);  // full avg10 12 % ≥ 10 %
  WriteText(path_, "some avg10=20.00 avg60=10.00 avg300=1.00 total=5\n"
                   "full avg10=2.00 avg60=0.00 avg300=0.00 total=1\n");
  EXPECT_EQ(src_->Tick(), L::kLow);  // some avg10 20 % ≥ 15 %
  WriteText(path_, kQuietPsi);
  EXPECT_EQ(src_->Tick(), L::kNominal);
  EXPECT_EQ(log_.Levels(), (std::vector<L>{L::kCritical, L::kLow, L::kNominal}));
}

TEST_F(PsiLogicTest, RecentLowTriggerHoldsLowAfterCriticalGoesQuiet) {
  src_->OnTrigger(L::kCritical);
  clock_.AdvanceMs(8000);
  src_->OnTrigger(L::kLow);
  clock_.AdvanceMs(3000);  // critical quiet for 11 s, low for 3 s
  EXPECT_EQ(src_->Tick(), L::kLow);
}

TEST_F(PsiLogicTest, BadReadingHoldsTheLevelWithAWarning) {
  src_->OnTrigger(L::kLow);
  WriteText(path_, "some avg10=oops avg60=0 avg300=0 total=0\n");
  clock_.AdvanceMs(60000);
  EXPECT_EQ(src_->Tick(), L::kLow);
  ASSERT_EQ(warnings_.size(), 1u);
  EXPECT_NE(warnings_[0].find("avg10 is not a number"), std::string::npos);
}

TEST_F(PsiLogicTest, StartOnAFakeFileFiresNominalAndStops) {
  ASSERT_TRUE(src_->Start().ok());
  EXPECT_EQ(log_.Levels(), std::vector<L>{L::kNominal});
  src_->Stop();
}

TEST(PsiPressureSourceTest, MissingFileIsUnavailable) {
  PsiPressureSource::Options o;
  o.path = "/nonexistent/pressure/memory";
  auto src = std::move(PsiPressureSource::Create(o)).value();
  Status s = src->Start();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("PSI triggers are unavailable"), std::string::npos);
  EXPECT_NE(s.message().find("use another memory pressure source"), std::string::npos);
}

// This machine's /proc/pressure/memory: Start() must either arm the default
// (2 s window) triggers or fail with exactly kUnavailable and our message.
TEST(PsiPressureSourceTest, RealProcPressureMemoryArmsOrIsUnavailable) {
  auto src = std::move(PsiPressureSource::Create({})).value();
  EventLog log;
  auto sub = src->Subscribe(log.Listener());
  Status s = src->Start();
  if (s.ok()) {
    EXPECT_EQ(log.Levels(), std::vector<L>{L::kNominal});
    src->Stop();
  } else {
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
    EXPECT_NE(s.message().find("PSI triggers are unavailable"), std::string::npos);
    EXPECT_EQ(log.size(), 0u);
  }
  // A 1 s window needs CAP_SYS_RESOURCE; either way the answer is definite.
  PsiPressureSource::Options o;
  o.low_trigger = {PsiTrigger::Kind::kSome, 150000, 1000000};
  auto one_second = std::move(PsiPressureSource::Create(o)).value();
  Status s1 = one_second->Start();
  EXPECT_TRUE(s1.ok() || s1.code() == StatusCode::kUnavailable) << s1.ToString();
  one_second->Stop();
}

// ------------------------------------------------------------------ cgroup

TEST(CgroupParseTest, CgroupV2PathAndEvents) {
  EXPECT_EQ(ParseCgroupV2Path("4:memory:/x\n0::/user.slice/app\n").value(), "/user.slice/app");
  EXPECT_EQ(ParseCgroupV2Path("4:memory:/x\n").status().code(), StatusCode::kUnavailable);
  auto ev = ParseCgroupMemoryEvents("low 1\nhigh 2\nmax 3\noom 4\noom_kill 5\noom_group_kill 0\n");
  ASSERT_TRUE(ev.ok());
  EXPECT_EQ(ev->high, 2u);
  EXPECT_EQ(ev->oom_kill, 5u);
  auto bad = ParseCgroupMemoryEvents("oom x\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(bad.status().message().find("memory.events oom"), std::string::npos);
}

class CgroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(cg_);
    WriteText(dir_.path() + "/self_cgroup", "1:name=systemd:/\n0::/app\n");
    Set("memory.max", "1000");
    Set("memory.current", "100");
    Set("memory.high", "max");
    Events(0, 0, 0);
  }
  void Set(const std::string& file, const std::string& text) { WriteText(cg_ + "/" + file, text + "\n"); }
  void Events(int high, int max, int oom) {
    Set("memory.events", "low 0\nhigh " + std::to_string(high) + "\nmax " + std::to_string(max) +
                             "\noom " + std::to_string(oom) + "\noom_kill 0");
  }
  std::unique_ptr<CgroupPressureSource> Make() {
    CgroupPressureSource::Options o;
    o.cgroup_root = dir_.path() + "/cg/";
    o.proc_self_cgroup = dir_.path() + "/self_cgroup";
    o.interval_ms = 60'000;
    o.clock = &clock_;
    o.warn = [this](std::string_view w) { warnings_.emplace_back(w); };
    return std::move(CgroupPressureSource::Create(o)).value();
  }
  TempDir dir_;
  std::string cg_ = dir_.path() + "/cg/app";
  SimulatedClock clock_{0};
  std::vector<std::string> warnings_;
};

TEST_F(CgroupTest, LevelFromCurrentOverMax) {
  auto src = Make();
  EventLog log;
  auto sub = src->Subscribe(log.Listener());
  MemoryPressureEvent e = src->Tick();
  EXPECT_EQ(e.level, L::kNominal);
  EXPECT_EQ(e.total_bytes, 1000u);
  EXPECT_EQ(e.free_bytes, 900u);
  EXPECT_EQ(src->cgroup_dir(), cg_);
  Set("memory.current", "900");  // 10 % free
  EXPECT_EQ(src->Tick().level, L::kLow);
  Set("memory.current", "1200");  // over the limit: 0 free
  EXPECT_EQ(src->Tick().level, L::kCritical);
  Set("memory.current", "100");
  EXPECT_EQ(src->Tick().level, L::kNominal);
  EXPECT_EQ(log.Levels(), (std::vector<L>{L::kNominal, L::kLow, L::kCritical, L::kNominal}));
}

TEST_F(CgroupTest, OomAndMaxCountersRaiseCriticalHighRaisesLow) {
  auto src = Make();
  src->Tick();
  Events(0, 0, 1);
  EXPECT_EQ(src->Tick().level, L::kCritical);
  EXPECT_EQ(src->Tick().level, L::kNominal);  // no further growth
  Events(0, 5, 1);
  EXPECT_EQ(src->Tick().level, L::kCritical);
  Events(3, 5, 1);
  EXPECT_EQ(src->Tick().level, L::kLow);
}

TEST_F(CgroupTest, NoLimitIsUnavailable) {
  Set("memory.max", "max");
  auto src = Make();
  Status s = src->Start();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("no memory limit"), std::string::npos);
  // Tick without a limit: nominal plus a warning.
  EXPECT_EQ(src->Tick().level, L::kNominal);
  EXPECT_EQ(warnings_.size(), 1u);
}

TEST_F(CgroupTest, MissingControllerAndBadFiles) {
  std::filesystem::remove(cg_ + "/memory.max");
  Status s = Make()->Start();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("memory.max"), std::string::npos);
  Set("memory.max", "1000");
  Set("memory.current", "lots");
  Status bad = Make()->Start();
  EXPECT_EQ(bad.code(), StatusCode::kDataLoss);
  EXPECT_NE(bad.message().find("memory.current"), std::string::npos);
}

TEST_F(CgroupTest, PollThreadTicksAndStopIsPrompt) {
  auto src = Make();
  EventLog log;
  auto sub = src->Subscribe(log.Listener());
  ASSERT_TRUE(src->Start().ok());
  EXPECT_EQ(log.Levels(), std::vector<L>{L::kNominal});
  auto t0 = std::chrono::steady_clock::now();
  src->Stop();  // interval is 60 s; the eventfd must cut it short
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

TEST(CgroupPressureSourceTest, CriticalNotBelowLowIsRejected) {
  CgroupPressureSource::Options o;
  o.low_fraction = 0.05;
  o.critical_fraction = 0.1;
  auto r = CgroupPressureSource::Create(o);
  EXPECT_EQ(r.status().message(),
            "pressure.critical_fraction (0.1) must be < pressure.low_fraction (0.05)");
}

// This machine's cgroup: Start() either works (a v2 memory limit exists) or
// says exactly why not with kUnavailable.
TEST(CgroupPressureSourceTest, RealCgroupStartsOrIsUnavailable) {
  auto src = std::move(CgroupPressureSource::Create({})).value();
  Status s = src->Start();
  if (s.ok()) {
    MemoryPressureEvent e = src->Current();
    EXPECT_TRUE(e.total_bytes.has_value());
    src->Stop();
  } else {
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
    EXPECT_FALSE(s.message().empty());
  }
}

}  // namespace
}  // namespace arbiter
