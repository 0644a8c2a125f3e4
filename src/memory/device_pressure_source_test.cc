// DevicePressureSource: levels from an injected driver report, per domain.
#include "arbiter/memory/device_pressure_source.h"

#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "arbiter/base/clock.h"
#include "arbiter/base/mutex.h"

namespace arbiter {
namespace {

// The driver's report, set by the test (thread-safe as the query must be).
class FakeReport {
 public:
  void Set(std::optional<DeviceMemoryReport> r) {
    MutexLock l(&mu_);
    report_ = r;
  }
  DevicePressureSource::Query Query() {
    return [this]() -> std::optional<DeviceMemoryReport> {
      MutexLock l(&mu_);
      return report_;
    };
  }

 private:
  Mutex mu_;
  std::optional<DeviceMemoryReport> report_ GUARDED_BY(mu_);
};

constexpr uint64_t kMiB = 1ull << 20;

struct Fixture {
  FakeReport report;
  SimulatedClock clock{1000};
  std::vector<std::string> warnings;
  std::vector<MemoryPressureEvent> events;
  std::unique_ptr<DevicePressureSource> source;
  MemoryPressureSubscription sub;

  explicit Fixture(DeviceMemoryReport first) {
    report.Set(first);
    DevicePressureSource::Options o;
    o.domain = "vulkan:0";
    o.query = report.Query();
    o.low_fraction = 0.25;
    o.critical_fraction = 0.10;
    o.clock = &clock;
    o.warn = [this](std::string_view w) { warnings.emplace_back(w); };
    auto made = DevicePressureSource::Create(std::move(o));
    EXPECT_TRUE(made.ok()) << made.status().ToString();
    source = std::move(made).value();
    sub = source->Subscribe([this](const MemoryPressureEvent& e) { events.push_back(e); });
  }
};

TEST(DevicePressureSourceTest, LevelsFollowTheBudgetLeft) {
  Fixture f({.usage_bytes = 100 * kMiB, .budget_bytes = 1000 * kMiB});
  MemoryPressureEvent e = f.source->Tick();  // 90% left: nominal, fires (first tick)
  EXPECT_EQ(e.level, MemoryPressureLevel::kNominal);
  EXPECT_EQ(e.domain, "vulkan:0");
  EXPECT_EQ(e.source, "device:vulkan:0");
  ASSERT_TRUE(e.free_bytes.has_value());
  EXPECT_EQ(*e.free_bytes, 900 * kMiB);
  EXPECT_EQ(*e.total_bytes, 1000 * kMiB);
  EXPECT_EQ(e.at_ms, 1000);
  ASSERT_EQ(f.events.size(), 1u);

  f.report.Set(DeviceMemoryReport{.usage_bytes = 800 * kMiB, .budget_bytes = 1000 * kMiB});
  f.clock.AdvanceMs(5000);
  EXPECT_EQ(f.source->Tick().level, MemoryPressureLevel::kLow);  // 20% left
  f.report.Set(DeviceMemoryReport{.usage_bytes = 950 * kMiB, .budget_bytes = 1000 * kMiB});
  EXPECT_EQ(f.source->Tick().level, MemoryPressureLevel::kCritical);  // 5% left
  EXPECT_EQ(f.source->Tick().level, MemoryPressureLevel::kCritical);  // no change: no event
  // Usage above the budget (another process) is nothing left: critical.
  f.report.Set(DeviceMemoryReport{.usage_bytes = 1200 * kMiB, .budget_bytes = 1000 * kMiB});
  MemoryPressureEvent over = f.source->Tick();
  EXPECT_EQ(over.level, MemoryPressureLevel::kCritical);
  EXPECT_EQ(*over.free_bytes, 0u);
  f.report.Set(DeviceMemoryReport{.usage_bytes = 0, .budget_bytes = 1000 * kMiB});
  EXPECT_EQ(f.source->Tick().level, MemoryPressureLevel::kNominal);

  ASSERT_EQ(f.events.size(), 4u);  // nominal, low, critical, nominal
  EXPECT_EQ(f.events[1].level, MemoryPressureLevel::kLow);
  EXPECT_EQ(f.events[1].at_ms, 6000);
  EXPECT_EQ(f.events[2].level, MemoryPressureLevel::kCritical);
  EXPECT_EQ(f.events[3].level, MemoryPressureLevel::kNominal);
  for (const MemoryPressureEvent& ev : f.events) EXPECT_EQ(ev.domain, "vulkan:0");
  EXPECT_TRUE(f.warnings.empty());
}

TEST(DevicePressureSourceTest, NoReportIsUnavailableAtStartAndNominalLater) {
  Fixture f({.usage_bytes = 0, .budget_bytes = 1000 * kMiB});
  f.report.Set(std::nullopt);
  Status st = f.source->Start();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("vulkan:0"), std::string::npos) << st.ToString();
  EXPECT_TRUE(f.events.empty());  // nothing fired, nothing started

  f.report.Set(DeviceMemoryReport{.usage_bytes = 990 * kMiB, .budget_bytes = 1000 * kMiB});
  EXPECT_EQ(f.source->Tick().level, MemoryPressureLevel::kCritical);
  f.report.Set(std::nullopt);  // the report goes away: nominal, with a warning
  EXPECT_EQ(f.source->Tick().level, MemoryPressureLevel::kNominal);
  ASSERT_EQ(f.warnings.size(), 1u);
  EXPECT_NE(f.warnings[0].find("no heap budget"), std::string::npos) << f.warnings[0];
  f.report.Set(DeviceMemoryReport{.usage_bytes = 0, .budget_bytes = 0});
  EXPECT_EQ(f.source->Tick().level, MemoryPressureLevel::kNominal);
  EXPECT_EQ(f.warnings.size(), 2u);
}

TEST(DevicePressureSourceTest, StartFiresTheFirstSampleAndSubscribeReplaysIt) {
  Fixture f({.usage_bytes = 850 * kMiB, .budget_bytes = 1000 * kMiB});
  ASSERT_TRUE(f.source->Start().ok());
  ASSERT_EQ(f.events.size(), 1u);
  EXPECT_EQ(f.events[0].level, MemoryPressureLevel::kLow);
  std::vector<MemoryPressureEvent> late;
  MemoryPressureSubscription s2 =
      f.source->Subscribe([&](const MemoryPressureEvent& e) { late.push_back(e); });
  ASSERT_EQ(late.size(), 1u);
  EXPECT_EQ(late[0].domain, "vulkan:0");
  f.source->Stop();
}

TEST(DevicePressureSourceTest, CreateChecksItsOptions) {
  FakeReport report;
  DevicePressureSource::Options o;
  o.query = report.Query();
  EXPECT_EQ(DevicePressureSource::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.domain = "host";
  EXPECT_EQ(DevicePressureSource::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.domain = "vulkan:1";
  o.low_fraction = 0.05;
  o.critical_fraction = 0.2;
  EXPECT_EQ(DevicePressureSource::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.critical_fraction = 0.01;
  o.query = nullptr;
  EXPECT_EQ(DevicePressureSource::Create(o).status().code(), StatusCode::kInvalidArgument);
}

TEST(DevicePressureSourceTest, QueryOfReadsTheDevicesReport) {
  FakeDeviceBackend device(1024 * kMiB);
  DevicePressureSource::Options o;
  o.domain = "vulkan:0";
  o.query = DevicePressureSource::QueryOf(&device);
  auto made = DevicePressureSource::Create(std::move(o));
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  EXPECT_EQ((*made)->Start().code(), StatusCode::kUnavailable);  // no report yet
  device.SetMemoryReport(DeviceMemoryReport{.usage_bytes = 1000 * kMiB, .budget_bytes = 1024 * kMiB});
  EXPECT_EQ((*made)->Current().level, MemoryPressureLevel::kCritical);
}

}  // namespace
}  // namespace arbiter
