// bench/grammar_bench_test.cc — RunGrammarBench (`arbiter bench grammar`) on
// `tiny` (shape of the result only; no speed asserted).
#include "bench/grammar_bench.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine/internal/test_model.h"
#include "tools/model_maker/model_maker.h"

namespace arbiter {
namespace {

TEST(GrammarBenchTest, RunsOnTinyModel) {
  const std::string dir = engine_internal::MakeTempDir("arbiter_grammar_bench_");
  ASSERT_TRUE(MakeModel("tiny", dir, 3).ok());
  GrammarBenchOptions o;
  o.model_dir = dir;
  o.threads = 1;
  o.iterations = 5;
  o.gen_tokens = 8;
  o.repetitions = 1;
  Result<GrammarBenchResult> r = RunGrammarBench(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_GT(r->vocab_size, 0);
  EXPECT_EQ(r->mask_string_us.samples, 5u);
  EXPECT_GE(r->allowed_start, 1);  // "{" and tokens that start with it
  EXPECT_LT(r->allowed_start, r->vocab_size / 10);
  EXPECT_GT(r->allowed_string, r->vocab_size / 2);
  EXPECT_GT(r->decode_step_ms, 0);
  EXPECT_GT(r->ratio_string, 0);
  EXPECT_FALSE(FormatGrammarBench(*r).empty());
  const nlohmann::json j = nlohmann::json::parse(FormatGrammarBenchJson(*r));
  EXPECT_EQ(j.at("allowed_string"), r->allowed_string);
  o.iterations = 0;
  EXPECT_EQ(RunGrammarBench(o).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace arbiter
