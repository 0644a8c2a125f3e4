// bench/kv_bench_vulkan_test.cc — `arbiter bench kv --device vulkan` on
// lavapipe (the first Vulkan device here and in CI) with the "tiny" preset
// at tiny sizes: every scenario runs on the device, reuses what it set up
// exactly as on the cpu (the same tokens cached, restored and computed, the
// same tiers, the same KV file bytes: the file format does not depend on the
// device), and the JSON carries the device. Validation layer on; no timing
// is asserted.
#include <stdlib.h>

#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "bench/kv_bench.h"
#include "tools/model_maker/model_maker.h"
#include "vulkan/vulkan_test_util.h"

namespace arbiter {
namespace {

namespace fs = std::filesystem;

class KvBenchVulkanTest : public vulkan::VulkanTest {
 protected:
  void SetUp() override {
    VulkanTest::SetUp();
    if (IsSkipped()) return;
    char tmpl[] = "/tmp/arbiter-kv-bench-vulkan-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    Status s = MakeModel("tiny", dir_ + "/model", 7);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
    VulkanTest::TearDown();
  }

  KvBenchOptions Tiny(const std::string& device) const {
    KvBenchOptions o;
    o.model_dir = dir_ + "/model";
    o.work_dir = dir_;
    o.device = device;
    o.prefix_tokens = 40;
    o.turn_tokens = 8;
    o.repetitions = 1;
    o.threads = 1;
    o.shared_prefix_tokens = {32};
    o.shared_requests = 3;
    o.shared_suffix_min = 4;
    o.shared_suffix_max = 6;
    o.shared_output_min = 2;
    o.shared_output_max = 2;
    o.qa_users = 3;
    o.qa_rounds = 2;
    o.qa_context_tokens = 16;
    o.qa_answer_tokens = 2;
    return o;
  }

  std::string dir_;
};

TEST_F(KvBenchVulkanTest, EveryScenarioRunsOnTheDeviceAsOnTheCpu) {
  Result<KvBenchResult> gpu = RunKvBench(Tiny("vulkan"));
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  Result<KvBenchResult> cpu = RunKvBench(Tiny("cpu"));
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  EXPECT_EQ(gpu->device, "vulkan");
  EXPECT_EQ(cpu->device, "cpu");
  EXPECT_EQ(gpu->kv_type, "f16");
  EXPECT_EQ(gpu->model_hash, cpu->model_hash);

  // TTFT: each case hit the same tier with the same token counts.
  ASSERT_EQ(gpu->ttft.size(), 5u);
  ASSERT_EQ(cpu->ttft.size(), 5u);
  for (size_t i = 0; i < gpu->ttft.size(); ++i) {
    const KvTtftCase& g = gpu->ttft[i];
    const KvTtftCase& c = cpu->ttft[i];
    SCOPED_TRACE(g.name);
    EXPECT_EQ(g.name, c.name);
    EXPECT_EQ(g.source, c.source);
    EXPECT_EQ(g.prompt_tokens, c.prompt_tokens);
    EXPECT_EQ(g.cached_tokens, c.cached_tokens);
    EXPECT_EQ(g.computed_tokens, c.computed_tokens);
    EXPECT_EQ(g.restored_tokens, c.restored_tokens);
    EXPECT_EQ(g.stashed, c.stashed);
  }
  EXPECT_EQ(gpu->ttft[3].source, "prompt_cache");
  EXPECT_EQ(gpu->ttft[4].source, "disk");
  EXPECT_EQ(gpu->ttft[4].restored_tokens, 40);

  // Save and restore: the same snapshot and file bytes as the cpu's.
  EXPECT_EQ(gpu->save_restore.n_tokens, cpu->save_restore.n_tokens);
  EXPECT_EQ(gpu->save_restore.snapshot_bytes, cpu->save_restore.snapshot_bytes);
  EXPECT_EQ(gpu->save_restore.file_bytes, cpu->save_restore.file_bytes);

  // Shared prefix and QA ran too.
  ASSERT_EQ(gpu->shared_prefix.size(), 1u);
  EXPECT_GT(gpu->shared_prefix[0].hit_fraction, 0.0);
  EXPECT_FALSE(gpu->qa.empty());

  // The JSON says where it ran.
  const nlohmann::json j = nlohmann::json::parse(FormatKvBenchJson(*gpu));
  EXPECT_EQ(j["device"], "vulkan");
}

TEST_F(KvBenchVulkanTest, AMissingDeviceIsAnErrorNamingIt) {
  Result<KvBenchResult> r = RunKvBench(Tiny("vulkan:99"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("vulkan:99"), std::string::npos) << r.status().ToString();
}

}  // namespace
}  // namespace arbiter
