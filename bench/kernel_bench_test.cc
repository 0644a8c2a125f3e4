// bench/kernel_bench_test.cc — smoke test of RunKernelBench (`arbiter bench
// kernels`) at tiny sizes: every type runs on every supported path, the
// integer types get dequant+f32 and prefill gemm/sgemm figures and the
// float types none, and
// --json keeps its keys. Benchmarks are not tests: no timing is asserted.
#include "bench/kernel_bench.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine/internal/quant.h"

namespace arbiter {
namespace {

TEST(KernelBenchTest, TinyRunCoversEveryTypeAndPath) {
  KernelBenchOptions o;
  o.n = 256;
  o.stream_bytes = size_t{256} << 10;
  o.cached_bytes = size_t{32} << 10;
  o.repetitions = 1;
  o.limit_bytes = size_t{4} << 20;
  o.prefill_tokens = 5;
  o.prefill_rows = 3;
  Result<KernelBenchResult> r = RunKernelBench(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const size_t paths = engine_internal::SupportedKernelPaths().size();
  ASSERT_EQ(r->rows.size(), 12 * paths);
  for (const KernelBenchRow& row : r->rows) {
    EXPECT_GT(row.stream_gb_s, 0) << row.type << " " << row.path;
    EXPECT_GT(row.cached_gb_s, 0) << row.type << " " << row.path;
    const bool is_float = row.type == "F32" || row.type == "F16" || row.type == "BF16";
    EXPECT_EQ(row.dequant_gb_s > 0, !is_float) << row.type;
    EXPECT_EQ(row.gemm_gmac_s > 0, !is_float) << row.type;
    EXPECT_EQ(row.sgemm_gmac_s > 0, !is_float) << row.type;
  }
  EXPECT_EQ(r->rows[0].type, "F32");
  EXPECT_DOUBLE_EQ(r->rows[0].bits_per_weight, 32.0);
  EXPECT_GT(r->read_gb_s, 0);
  const nlohmann::json j = nlohmann::json::parse(FormatKernelBenchJson(*r));
  EXPECT_EQ(j["rows"].size(), r->rows.size());
  EXPECT_TRUE(j["rows"][0].contains("ratio_to_read"));
  EXPECT_NE(FormatKernelBench(*r).find("Q4_K"), std::string::npos);
}

TEST(KernelBenchTest, RejectsRowsThatAreNotWholeSuperBlocks) {
  KernelBenchOptions o;
  o.n = 100;
  EXPECT_EQ(RunKernelBench(o).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace arbiter
