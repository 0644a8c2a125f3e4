// The engine against scripts/reference_logits.py (float64 numpy) on the
// tiny, tiny-qwen2 and tiny-qwen3 presets. rel err = max_i |engine_i − ref_i|
// / max_i |ref_i| per prompt, over all positions' logits; must be ≤ 1e-4
// with an f32 KV cache. The other KV types (Note [KV cache types] in
// forward.cc) round K and V before attention reads them; their bound is
// their rounding's: KvTypeBound.
// A missing numpy FAILS the test (it is a required dependency).
#include <gtest/gtest.h>

#include <algorithm>

#include <cstdio>
#include <string>
#include <vector>

#include "arbiter/engine/engine.h"
#include "tools/model_maker/model_maker.h"
#include "engine/internal/engine_impl.h"
#include "engine/internal/test_model.h"

namespace arbiter {
namespace {

using engine_internal::EngineImpl;
using engine_internal::MaxRelativeError;

constexpr int kPrefillBatch = 8;  // small, so prompts span several sgemm chunks

// The bound for a KV cache of `type`: f32 is exact up to summation order;
// f16 keeps 11 significant bits, bf16 8, q8_0 ~7 (per block of 32).
double KvTypeBound(GgmlType type) {
  switch (type) {
    case GgmlType::kF32: return 1e-4;
    case GgmlType::kF16: return 1e-3;
    default: return 1e-2;  // bf16, q8_0
  }
}

class ReferenceTest : public ::testing::TestWithParam<std::tuple<const char*, GgmlType>> {};

TEST_P(ReferenceTest, LogitsMatchNumpy) {
  const std::string preset = std::get<0>(GetParam());
  const GgmlType kv_type = std::get<1>(GetParam());
  const double kMaxRelErr = KvTypeBound(kv_type);
  const std::string dir = engine_internal::MakeTempDir("arbiter_ref_" + preset + "_");
  ASSERT_FALSE(dir.empty());
  Status made = MakeModel(preset, dir, 11);
  ASSERT_TRUE(made.ok()) << made.ToString();
  EngineOptions opts;
  opts.n_ctx = 128;
  opts.n_slots = 1;
  opts.prefill_batch = kPrefillBatch;
  opts.n_threads = 2;  // decode matvecs split across the pool
  opts.kv_type = kv_type;
  Result<std::unique_ptr<Engine>> engine = Engine::Load(dir, opts);
  if (kv_type == GgmlType::kQ8_0 && preset != "tiny-qwen3") {
    // head_dim 16: q8_0's blocks of 32 would straddle two heads.
    ASSERT_EQ(engine.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(engine.status().message().find("head_dim 16 is not a multiple"), std::string::npos)
        << engine.status().message();
    return;
  }
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  auto* impl = dynamic_cast<EngineImpl*>(engine->get());
  ASSERT_NE(impl, nullptr);
  const int vocab = (*engine)->config().vocab_size;

  const std::vector<std::string> texts = {
      "Hi",
      "The licence grants you the right to copy it.",
      "Permission is hereby granted, free of charge, to any person obtaining a copy of this "
      "software and associated documentation files, to deal in the Software without "
      "restriction."};
  for (const std::string& text : texts) {
    std::vector<int32_t> ids = (*engine)->tokenizer().Encode(text, false);
    ASSERT_FALSE(ids.empty());
    Result<std::vector<float>> got = (*engine)->ComputeLogits(ids);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    Result<std::vector<double>> ref = engine_internal::RunReferenceLogits(dir, ids, vocab);
    ASSERT_TRUE(ref.ok()) << ref.status().ToString();
    const double err = MaxRelativeError(got->data(), ref->data(), got->size());

    // Decode-style: prefill all but the last few tokens, then one-token
    // decode steps (the Generate path); the last logits must match both
    // ComputeLogits' last row and the reference.
    const int n = static_cast<int>(ids.size());
    const int n_prefill = std::max(1, n - 4);
    const size_t last = static_cast<size_t>(n - 1) * vocab;
    std::vector<double> last_row(got->begin() + last, got->end());
    Result<std::vector<float>> inc = impl->IncrementalLogits(ids, n_prefill);
    ASSERT_TRUE(inc.ok()) << inc.status().ToString();
    const double err_inc = MaxRelativeError(inc->data(), ref->data() + last, vocab);
    const double diff_vs_batch = MaxRelativeError(inc->data(), last_row.data(), vocab);

    std::printf("[ reference] %-10s kv %-4s %3d tokens (batch %d): rel err %.3g; decode-path "
                "last token %.3g (vs ComputeLogits %.3g)\n",
                preset.c_str(), std::string(KvTypeName(kv_type)).c_str(), n, kPrefillBatch, err,
                err_inc, diff_vs_batch);
    EXPECT_LE(err, kMaxRelErr) << preset << " \"" << text << "\"";
    EXPECT_LE(err_inc, kMaxRelErr) << preset << " \"" << text << "\"";
    EXPECT_LE(diff_vs_batch, kMaxRelErr) << preset << " \"" << text << "\"";
  }
  EXPECT_GT(static_cast<int>((*engine)->tokenizer().Encode(texts[2], false).size()),
            kPrefillBatch);
}

INSTANTIATE_TEST_SUITE_P(Presets, ReferenceTest,
                         ::testing::Combine(::testing::Values("tiny", "tiny-qwen2", "tiny-qwen3"),
                                            ::testing::Values(GgmlType::kF32, GgmlType::kF16,
                                                              GgmlType::kBF16, GgmlType::kQ8_0)),
                         [](const auto& info) {
                           std::string s = std::get<0>(info.param);
                           for (char& c : s) {
                             if (c == '-') c = '_';
                           }
                           return s + "_kv_" + std::string(KvTypeName(std::get<1>(info.param)));
                         });

}  // namespace
}  // namespace arbiter
