// bench/kv_bench_test.cc — smoke test of RunKvBench (`arbiter bench kv`)
// on the "tiny" preset at tiny sizes: every scenario runs and its counts are
// consistent with what it set up (tokens computed, cached and restored, the
// tier each case hit, bytes = the KV file's size); --json keeps its keys.
// Benchmarks are not tests: no timing is asserted.
#include "bench/kv_bench.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "tools/model_maker/model_maker.h"

namespace arbiter {
namespace {

namespace fs = std::filesystem;

class KvBenchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/arbiter-kv-bench-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    Status s = MakeModel("tiny", dir_ + "/model", 7);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  KvBenchOptions Tiny() const {
    KvBenchOptions o;
    o.model_dir = dir_ + "/model";
    o.work_dir = dir_;
    o.prefix_tokens = 48;
    o.turn_tokens = 8;
    o.repetitions = 2;
    o.threads = 1;
    o.shared_prefix_tokens = {32, 64};
    o.shared_requests = 4;
    o.shared_suffix_min = 4;
    o.shared_suffix_max = 8;
    o.shared_output_min = 2;
    o.shared_output_max = 3;
    o.qa_users = 3;
    o.qa_rounds = 2;
    o.qa_context_tokens = 24;
    o.qa_answer_tokens = 2;
    return o;
  }

  std::string dir_;
};

TEST_F(KvBenchTest, EveryScenarioRunsAndItsCountsAreConsistent) {
  const KvBenchOptions o = Tiny();
  Result<KvBenchResult> r = RunKvBench(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const int prefix = o.prefix_tokens, turn = o.turn_tokens;

  // tiny: 2 layers, 2 KV heads × head_dim 16.
  EXPECT_EQ(r->n_layers, 2);
  EXPECT_EQ(r->kv_dim, 32);
  EXPECT_EQ(r->kv_bytes_per_token, 2.0 * 2 * 32 * 2);  // f16, the default KV type
  EXPECT_EQ(r->kv_type, "f16");
  EXPECT_EQ(r->n_slots, 2);
  EXPECT_EQ(r->threads, 1);
  EXPECT_EQ(r->model_hash.size(), 16u);
  EXPECT_FALSE(fs::exists(r->kv_dir)) << "the bench removes its KV dir";

  // TTFT: each case computed and reused what it set up.
  ASSERT_EQ(r->ttft.size(), 5u);
  const char* names[] = {"ideal", "cold", "prewarm", "prompt_cache", "disk"};
  const char* sources[] = {"", "none", "slot", "prompt_cache", "disk"};
  for (size_t i = 0; i < r->ttft.size(); ++i) {
    const KvTtftCase& k = r->ttft[i];
    SCOPED_TRACE(k.name);
    EXPECT_EQ(k.name, names[i]);
    EXPECT_EQ(k.source, sources[i]);
    EXPECT_EQ(k.ttft_ms.samples, static_cast<size_t>(o.repetitions));
    EXPECT_EQ(k.prefill_ms.samples, static_cast<size_t>(o.repetitions));
    EXPECT_EQ(k.overhead_ms.samples, static_cast<size_t>(o.repetitions));
    EXPECT_EQ(k.prompt_tokens, prefix + turn);
    EXPECT_EQ(k.cached_tokens + k.computed_tokens, k.prompt_tokens);
    if (k.name == "cold") {
      EXPECT_EQ(k.cached_tokens, 0);
    } else {
      EXPECT_EQ(k.cached_tokens, prefix);
      EXPECT_EQ(k.computed_tokens, turn);
    }
    const bool restored = k.name == "prompt_cache" || k.name == "disk";
    EXPECT_EQ(k.restored_tokens, restored ? prefix : 0);
    EXPECT_EQ(k.stashed, k.name == "prompt_cache");  // the displacer's KV leaves the slot
  }
  EXPECT_EQ(r->ttft[2].prewarm_computed_tokens, prefix);
  EXPECT_EQ(r->ttft[2].prewarm_ms.samples, static_cast<size_t>(o.repetitions));
  EXPECT_DOUBLE_EQ(r->ttft[0].ratio_best, 1.0);

  // Save and restore: bytes are the snapshot's and the v1 file's sizes.
  const KvSaveRestoreResult& s = r->save_restore;
  EXPECT_EQ(s.n_tokens, prefix);
  const uint64_t kv_bytes = uint64_t{2} * 2 * 32 * 2 * prefix;
  EXPECT_EQ(s.snapshot_bytes, kv_bytes + 4u * prefix);
  EXPECT_EQ(s.file_bytes, 64 + 4u * prefix + kv_bytes + 8);
  for (const SampleSummary* st :
       {&s.save_slot_ms, &s.write_file_ms, &s.save_total_ms, &s.rewrite_file_ms, &s.resave_total_ms,
        &s.save_direct_ms, &s.read_file_ms, &s.restore_slot_ms, &s.file_to_slot_ms,
        &s.file_to_slot_copy_ms, &s.write_nofsync_ms, &s.fsync_ms, &s.memcpy_gb_s}) {
    EXPECT_EQ(st->samples, static_cast<size_t>(o.repetitions));
  }
  EXPECT_DOUBLE_EQ(s.target_save_total_ms, 2 * 7.4 * static_cast<double>(s.file_bytes) / 16e6);
  EXPECT_EQ(s.file_to_slot_target_met, s.file_to_slot_gb_s >= 4.0);
  EXPECT_EQ(s.save_target_met, s.save_total_ms.p50 <= s.target_save_total_ms);
  EXPECT_EQ(s.resave_target_met, s.resave_total_ms.p50 <= s.target_save_total_ms);
  EXPECT_EQ(s.save_direct_target_met, s.save_direct_ms.p50 <= s.target_save_total_ms);

  // Shared prefix: every request after the first reuses the whole prefix.
  ASSERT_EQ(r->shared_prefix.size(), 2u);
  for (size_t i = 0; i < r->shared_prefix.size(); ++i) {
    const KvSharedPrefixCase& k = r->shared_prefix[i];
    SCOPED_TRACE(k.prefix_tokens);
    EXPECT_EQ(k.prefix_tokens, o.shared_prefix_tokens[i]);
    EXPECT_EQ(k.requests, o.shared_requests);
    EXPECT_EQ(k.ttft_ms.samples, static_cast<size_t>(o.shared_requests));
    const uint64_t n = static_cast<uint64_t>(o.shared_requests);
    EXPECT_GE(k.prompt_tokens, n * (k.prefix_tokens + o.shared_suffix_min));
    EXPECT_LE(k.prompt_tokens, n * (k.prefix_tokens + o.shared_suffix_max));
    EXPECT_EQ(k.cached_tokens + k.computed_tokens, k.prompt_tokens);
    EXPECT_GE(k.cached_tokens, (n - 1) * k.prefix_tokens);
    EXPECT_LE(k.copied_tokens, k.cached_tokens);
    EXPECT_DOUBLE_EQ(k.hit_fraction, static_cast<double>(k.cached_tokens) / k.prompt_tokens);
  }

  // Multi-round QA: every turn hit exactly one tier; the first round is cold;
  // later rounds never recompute a user's history.
  ASSERT_EQ(r->qa.size(), 2u);
  EXPECT_EQ(r->qa[0].name, "host_holds_all");
  EXPECT_EQ(r->qa[1].name, "host_holds_2");
  for (const KvQaCase& q : r->qa) {
    SCOPED_TRACE(q.name);
    ASSERT_EQ(q.rounds.size(), static_cast<size_t>(o.qa_rounds));
    int turns = 0, hits = 0;
    for (const KvQaRound& x : q.rounds) {
      EXPECT_EQ(x.turns, o.qa_users);
      EXPECT_EQ(x.from_slot + x.from_prompt_cache + x.from_disk + x.from_none, x.turns);
      EXPECT_EQ(static_cast<double>(x.computed_tokens + x.cached_tokens),
                x.prompt_tokens_mean * x.turns);
      turns += x.turns;
      if (x.round == 0) {
        EXPECT_EQ(x.from_none, o.qa_users);
        EXPECT_EQ(x.cached_tokens, 0u);
      } else {
        EXPECT_EQ(x.from_none, 0);
        hits += x.turns;
        // Only the new question and the last answer token are computed.
        EXPECT_LE(x.computed_tokens, static_cast<uint64_t>(x.turns) * (turn + 1));
      }
    }
    EXPECT_EQ(q.total.round, -1);
    EXPECT_EQ(q.total.turns, turns);
    EXPECT_EQ(q.total.from_slot + q.total.from_prompt_cache + q.total.from_disk, hits);
    EXPECT_EQ(q.total.from_none, o.qa_users);
  }
  // With room in RAM for every user, nothing spills to disk.
  EXPECT_EQ(r->qa[0].spilled, 0u);
  EXPECT_EQ(r->qa[0].total.from_disk, 0);

  const std::string report = FormatKvBench(*r);
  for (const char* part : {"TTFT of one turn", "Save and restore", "Shared prefix",
                           "Multi-round QA", "host_holds_2", "target: file → slot"}) {
    EXPECT_NE(report.find(part), std::string::npos) << part;
  }

  // --json: the keys scripts read; a summary's minimum is "best".
  const nlohmann::json j = nlohmann::json::parse(FormatKvBenchJson(*r));
  for (const char* key :
       {"model_dir", "model_hash", "n_slots", "n_ctx", "threads", "prefix_tokens", "turn_tokens",
        "repetitions", "n_layers", "kv_dim", "kv_type", "device", "kv_bytes_per_token",
        "loadavg_start", "loadavg_end", "seconds", "ttft", "save_restore", "shared_prefix", "qa"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j.size(), 20u);
  EXPECT_EQ(j.at("device"), "cpu");  // the default
  const nlohmann::json& ttft = j.at("ttft").at(1).at("ttft_ms");
  EXPECT_EQ(ttft.size(), 6u);
  EXPECT_EQ(ttft.at("samples"), r->ttft[1].ttft_ms.samples);
  EXPECT_EQ(ttft.at("best"), r->ttft[1].ttft_ms.min);
  for (const char* key : {"p50", "p99", "max", "mean"}) EXPECT_TRUE(ttft.contains(key)) << key;
  EXPECT_TRUE(j.at("ttft").at(2).contains("prewarm_ms"));
  EXPECT_EQ(j.at("save_restore").size(), 34u);
  EXPECT_EQ(j.at("save_restore").at("file_bytes"), s.file_bytes);
  EXPECT_EQ(j.at("shared_prefix").size(), 2u);
  EXPECT_EQ(j.at("qa").at(1).at("name"), "host_holds_2");
  EXPECT_EQ(j.at("qa").at(1).at("total").at("round"), -1);
}

TEST_F(KvBenchTest, OnlyRunsOneScenario) {
  KvBenchOptions o = Tiny();
  o.only = "save_restore";
  Result<KvBenchResult> r = RunKvBench(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->ttft.empty());
  EXPECT_TRUE(r->shared_prefix.empty());
  EXPECT_TRUE(r->qa.empty());
  EXPECT_EQ(r->save_restore.n_tokens, o.prefix_tokens);
  const std::string report = FormatKvBench(*r);
  EXPECT_NE(report.find("Save and restore"), std::string::npos);
  EXPECT_EQ(report.find("TTFT of one turn"), std::string::npos);
}

TEST_F(KvBenchTest, RefusesBadOptions) {
  KvBenchOptions o = Tiny();
  o.repetitions = 0;
  EXPECT_EQ(RunKvBench(o).status().code(), StatusCode::kInvalidArgument);
  o = Tiny();
  o.shared_suffix_min = 9;  // > max
  EXPECT_EQ(RunKvBench(o).status().code(), StatusCode::kInvalidArgument);
  o = Tiny();
  o.model_dir = dir_ + "/missing";
  EXPECT_EQ(RunKvBench(o).status().code(), StatusCode::kInvalidArgument);
  o = Tiny();
  o.only = "everything";
  EXPECT_EQ(RunKvBench(o).status().code(), StatusCode::kInvalidArgument);
  o = Tiny();
  o.prefix_tokens = 4000;  // tiny's context is 2048
  EXPECT_EQ(RunKvBench(o).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace arbiter
