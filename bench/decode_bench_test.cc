// bench/decode_bench_test.cc — RunDecodeBench (`arbiter bench decode`) on
// `tiny` (shape of the result only; no speed asserted).
// Set ARBITER_BENCH_DEMO_CHAT=1 to also run the real benchmark on demo-chat
// with 1 and 2 threads and print the report (used for docs/BENCHMARKS.md);
// ARBITER_BENCH_MODEL_DIR=DIR keeps the generated model in DIR for reuse;
// ARBITER_BENCH_{THREADS,PROMPT,GEN,REPS} override the run shape (profiling).
#include "bench/decode_bench.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <vector>

#include "arbiter/engine/engine.h"
#include "engine/internal/test_model.h"
#include "tools/model_maker/model_maker.h"

namespace arbiter {
namespace {

TEST(DecodeBenchTest, RunsOnTinyModel) {
  const std::string dir = engine_internal::MakeTempDir("arbiter_bench_");
  ASSERT_TRUE(MakeModel("tiny", dir, 3).ok());
  Result<DecodeBenchResult> r = RunDecodeBench(dir, 1, 32, 8, 1);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->prompt_tokens, 32);
  EXPECT_EQ(r->gen_tokens, 8);
  EXPECT_GT(r->prefill_tok_s, 0);
  EXPECT_GT(r->decode_tok_s, 0);
  EXPECT_GT(r->weight_bytes_per_token, 0u);
  EXPECT_LE(r->weight_bytes_per_token, r->weight_bytes);
  EXPECT_GT(r->memcpy_bytes_per_s, 0);
  EXPECT_NEAR(r->roofline_tok_s * r->weight_bytes_per_token, r->memcpy_bytes_per_s,
              r->memcpy_bytes_per_s * 1e-9);
  EXPECT_FALSE(FormatDecodeBench(*r).empty());
  const nlohmann::json j = nlohmann::json::parse(FormatDecodeBenchJson(*r));
  EXPECT_EQ(j.at("prompt_tokens"), 32);
  EXPECT_EQ(j.at("decode_tok_s"), r->decode_tok_s);
  EXPECT_EQ(RunDecodeBench(dir, 0).status().code(), StatusCode::kInvalidArgument);
}

// Scripts parse the prefill and decode lines: their format is fixed.
TEST(DecodeBenchTest, TextReportKeepsTheParsedLines) {
  DecodeBenchResult r;
  r.model_dir = "/m";
  r.n_threads = 2;
  r.prompt_tokens = 512;
  r.gen_tokens = 128;
  r.repetitions = 3;
  r.prefill_ms = 1234.56;
  r.prefill_tok_s = 414.73;
  r.decode_ms = 9876.54;
  r.decode_tok_s = 12.957;
  const std::string text = FormatDecodeBench(r);
  EXPECT_NE(text.find("\nprefill         512 tokens: 1234.6 ms, 414.7 tok/s (best of 3)\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("\ndecode          128 tokens: 9876.5 ms, 12.96 tok/s (best of 3)\n"),
            std::string::npos)
      << text;
}

// --json carries every figure of the text report under the result's field
// names.
TEST(DecodeBenchTest, JsonHasTheTextReportsFigures) {
  DecodeBenchResult r;
  r.model_dir = "/m";
  r.blas_core = "Zen";
  r.n_threads = 2;
  r.prompt_tokens = 512;
  r.gen_tokens = 128;
  r.repetitions = 3;
  r.load_ms = 80;
  r.prefill_ms = 1234.5;
  r.prefill_tok_s = 414.7;
  r.decode_ms = 9876.5;
  r.decode_tok_s = 12.96;
  r.weight_bytes = 213500000;
  r.weight_bytes_per_token = 213400000;
  r.kv_bytes_per_token = 1.5e6;
  r.kv_type = "f16";
  r.device = "vulkan:0";
  r.memcpy_bytes_per_s = 10e9;
  r.roofline_tok_s = 46.9;
  r.roofline_fraction = 0.28;
  r.read_bytes_per_s = 20e9;
  r.read_roofline_tok_s = 93.7;
  r.read_roofline_fraction = 0.14;
  const std::string text = FormatDecodeBenchJson(r);
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  const nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_EQ(j.at("model_dir"), "/m");
  EXPECT_EQ(j.at("blas_core"), "Zen");
  EXPECT_EQ(j.at("n_threads"), 2);
  EXPECT_EQ(j.at("repetitions"), 3);
  EXPECT_EQ(j.at("load_ms"), 80.0);
  EXPECT_EQ(j.at("prompt_tokens"), 512);
  EXPECT_EQ(j.at("prefill_ms"), 1234.5);
  EXPECT_EQ(j.at("prefill_tok_s"), 414.7);
  EXPECT_EQ(j.at("gen_tokens"), 128);
  EXPECT_EQ(j.at("decode_ms"), 9876.5);
  EXPECT_EQ(j.at("decode_tok_s"), 12.96);
  EXPECT_EQ(j.at("weight_bytes"), 213500000u);
  EXPECT_EQ(j.at("weight_bytes_per_token"), 213400000u);
  EXPECT_EQ(j.at("kv_bytes_per_token"), 1.5e6);
  EXPECT_EQ(j.at("kv_type"), "f16");
  EXPECT_EQ(j.at("memcpy_bytes_per_s"), 10e9);
  EXPECT_EQ(j.at("roofline_tok_s"), 46.9);
  EXPECT_EQ(j.at("roofline_fraction"), 0.28);
  EXPECT_EQ(j.at("read_bytes_per_s"), 20e9);
  EXPECT_EQ(j.at("read_roofline_tok_s"), 93.7);
  EXPECT_EQ(j.at("read_roofline_fraction"), 0.14);
  EXPECT_EQ(j.at("device"), "vulkan:0");
  EXPECT_EQ(j.size(), 22u);
}

TEST(DecodeBenchTest, DemoChat) {
  const char* env = std::getenv("ARBITER_BENCH_DEMO_CHAT");
  if (env == nullptr || std::string(env) != "1") GTEST_SKIP() << "set ARBITER_BENCH_DEMO_CHAT=1";
  const char* dir_env = std::getenv("ARBITER_BENCH_MODEL_DIR");
  std::string dir = dir_env ? dir_env : engine_internal::MakeTempDir("arbiter_bench_demo_");
  if (access((dir + "/config.json").c_str(), F_OK) != 0) {  // make it once, reuse after
    ASSERT_TRUE(MakeModel("demo-chat", dir, 1).ok());
  }
  // Optional overrides for profiling runs.
  auto env_int = [](const char* name, int fallback) {
    const char* v = std::getenv(name);
    return v != nullptr ? std::atoi(v) : fallback;
  };
  std::vector<int> thread_counts = {1, 2};
  if (env_int("ARBITER_BENCH_THREADS", 0) > 0)
    thread_counts = {env_int("ARBITER_BENCH_THREADS", 1)};
  // Numerical check at the real shape (bf16 weights, Qwen3, tied, 8 layers).
  {
    EngineOptions o;
    o.n_ctx = 512;
    o.prefill_batch = 16;
    Result<std::unique_ptr<Engine>> e = Engine::Load(dir, o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    std::vector<int32_t> ids = (*e)->tokenizer().Encode(
        "The licensee may copy and distribute "
        "verbatim copies of the Program.",
        false);
    Result<std::vector<float>> got = (*e)->ComputeLogits(ids);
    ASSERT_TRUE(got.ok());
    Result<std::vector<double>> ref =
        engine_internal::RunReferenceLogits(dir, ids, (*e)->config().vocab_size);
    ASSERT_TRUE(ref.ok()) << ref.status().ToString();
    const double err = engine_internal::MaxRelativeError(got->data(), ref->data(), got->size());
    std::printf("demo-chat %zu tokens: rel err vs numpy %.3g\n", ids.size(), err);
    EXPECT_LE(err, 1e-4);
  }
  for (int threads : thread_counts) {
    Result<DecodeBenchResult> r =
        RunDecodeBench(dir, threads, env_int("ARBITER_BENCH_PROMPT", 512),
                       env_int("ARBITER_BENCH_GEN", 128), env_int("ARBITER_BENCH_REPS", 3));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    std::printf("%s\n", FormatDecodeBench(*r).c_str());
  }
}

}  // namespace
}  // namespace arbiter
