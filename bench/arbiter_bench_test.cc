// bench/arbiter_bench_test.cc — smoke test of RunArbiterBench (`arbiter
// bench arbiter`) at a few iterations: every scenario runs, checks what it
// set up (the fit scenarios evict exactly one entry per acquire) and reports
// its samples; the JSON keeps its keys. No timing is asserted.
#include "bench/arbiter_bench.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

namespace arbiter {
namespace {

TEST(ArbiterBenchTest, EveryScenarioRunsAndReportsItsSamples) {
  Result<ArbiterBenchResult> r = RunArbiterBench(160);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->iterations, 160);
  EXPECT_TRUE(r->timer == "rdtsc" || r->timer == "steady_clock") << r->timer;
  const char* names[] = {"limit_timer",
                         "limit_mutex",
                         "limit_atomic",
                         "acquire_release_1t",
                         "acquire_release_2t_diff",
                         "acquire_release_2t_same",
                         "fit_evict_10",
                         "fit_evict_100",
                         "fit_evict_1000",
                         "pressure_to_unload",
                         "pressure_rss_drop"};
  ASSERT_EQ(r->scenarios.size(), std::size(names));
  for (size_t i = 0; i < r->scenarios.size(); ++i) {
    const ArbiterBenchScenario& s = r->scenarios[i];
    SCOPED_TRACE(s.name);
    EXPECT_EQ(s.name, names[i]);
    EXPECT_GT(s.ns.samples, 0u);
    EXPECT_LE(s.ns.min, s.ns.p50);
    EXPECT_LE(s.ns.p50, s.ns.p99);
    EXPECT_LE(s.ns.p99, s.ns.max);
    if (s.name.rfind("fit_evict_", 0) == 0) {
      EXPECT_EQ(s.note, "160 evictions / 160 acquires");
    }
  }
  EXPECT_EQ(r->scenarios[3].ns.samples, 160u / 8);  // batches of 8
  EXPECT_EQ(r->scenarios.back().ns.samples, 20u);   // the RSS scenario: min(iterations, 20)

  const std::string text = FormatArbiterBench(*r);
  for (const char* name : names) EXPECT_NE(text.find(name), std::string::npos) << name;

  const nlohmann::json j = nlohmann::json::parse(FormatArbiterBenchJson(*r));
  EXPECT_EQ(j.at("iterations"), 160);
  EXPECT_EQ(j.at("timer"), r->timer);
  EXPECT_EQ(j.at("timer_overhead_ns"), r->timer_overhead_ns);
  ASSERT_EQ(j.at("scenarios").size(), r->scenarios.size());
  const nlohmann::json& s = j.at("scenarios").at(3);
  for (const char* key :
       {"name", "description", "samples", "p50_ns", "p99_ns", "mean_ns", "reference_p50_ns",
        "reference_p99_ns", "target_p50_ns", "target_p99_ns", "is_limit", "note"}) {
    EXPECT_TRUE(s.contains(key)) << key;
  }
  EXPECT_EQ(s.size(), 12u);
  EXPECT_EQ(s.at("p50_ns"), r->scenarios[3].ns.p50);
}

TEST(ArbiterBenchTest, RefusesNoIterations) {
  EXPECT_EQ(RunArbiterBench(0).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace arbiter
