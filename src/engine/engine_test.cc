// Engine behaviour on the `tiny` preset: prompt validation, prefix reuse,
// stop strings, cancellation, slot contention, embeddings. No test asserts
// wall-clock speed; waits are bounded by the engine's own 50 ms polling.
#include "arbiter/engine/engine.h"
#include "tools/model_maker/model_maker.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <thread>
#include <vector>

#include "engine/internal/engine_impl.h"
#include "engine/internal/test_model.h"

namespace arbiter {
namespace {

using engine_internal::EngineImpl;

class EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(engine_internal::MakeTempDir("arbiter_engine_test_"));
    Status s = MakeModel("tiny", *dir_, 7);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  std::unique_ptr<Engine> LoadEngine(int n_ctx = 256, int n_slots = 2, int prefill_batch = 16) {
    EngineOptions o;
    o.n_ctx = n_ctx;
    o.n_slots = n_slots;
    o.prefill_batch = prefill_batch;
    Result<std::unique_ptr<Engine>> e = Engine::Load(*dir_, o);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    return e.ok() ? std::move(*e) : nullptr;
  }

  static GenerationRequest Greedy(std::vector<int32_t> prompt, int max_tokens) {
    GenerationRequest r;
    r.prompt_ids = std::move(prompt);
    r.sampling.temperature = 0.0f;
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    return r;
  }

  std::vector<int32_t> Prompt(const Engine& e, const std::string& text) {
    return e.tokenizer().Encode(text, /*parse_special=*/false);
  }

  static std::string* dir_;
};
std::string* EngineTest::dir_ = nullptr;

TEST_F(EngineTest, LoadReportsSizesAndClampsContext) {
  auto e = LoadEngine(/*n_ctx=*/100000, /*n_slots=*/3);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->n_ctx(), e->config().max_position_embeddings);
  EXPECT_EQ(e->n_slots(), 3);
  EXPECT_GT(e->weight_bytes(), 0u);
  // 3 slots × [n_layers, 2, n_ctx, kv_dim] f16 (the default KV type) at least.
  const ModelConfig& c = e->config();
  const size_t kv_dim = size_t{1} * c.num_key_value_heads * (c.head_dim > 0 ? c.head_dim : c.hidden_size / c.num_attention_heads);
  EXPECT_EQ(e->kv_type(), GgmlType::kF16);
  EXPECT_GE(e->kv_bytes(), 3 * size_t{2} * c.num_hidden_layers * e->n_ctx() * kv_dim * 2);
  EXPECT_TRUE(e->chat_template().ok());
}

TEST_F(EngineTest, LoadErrorsNameThePath) {
  Result<std::unique_ptr<Engine>> e = Engine::Load("/nonexistent/model", EngineOptions{});
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("/nonexistent/model"), std::string::npos);
  EngineOptions bad;
  bad.n_slots = 0;
  e = Engine::Load(*dir_, bad);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
}

TEST_F(EngineTest, RejectsBadPrompts) {
  auto e = LoadEngine(/*n_ctx=*/32);
  ASSERT_NE(e, nullptr);
  Result<GenerationResult> r = e->Generate(Greedy({}, 4), nullptr, nullptr);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  // n_ctx − 1 = 31 tokens fit; 32 do not.
  std::vector<int32_t> long_prompt(32, 5);
  r = e->Generate(Greedy(long_prompt, 4), nullptr, nullptr);
  ASSERT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("32"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("31"), std::string::npos) << r.status().message();
  long_prompt.pop_back();
  r = e->Generate(Greedy(long_prompt, 4), nullptr, nullptr);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // Context full after one generated token at position 31.
  EXPECT_EQ(r->finish_reason, FinishReason::kLength);
  EXPECT_EQ(r->output_ids.size(), 2u);
  r = e->Generate(Greedy({1, e->config().vocab_size + 3}, 4), nullptr, nullptr);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  GenerationRequest bad_sampling = Greedy({1, 2}, 4);
  bad_sampling.sampling.top_p = 0;
  EXPECT_EQ(e->Generate(bad_sampling, nullptr, nullptr).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(e->Generate(Greedy({1, 2}, 0), nullptr, nullptr).status().code(),
            StatusCode::kInvalidArgument);
}

// Each logits entry point names itself in its errors.
TEST_F(EngineTest, LogitsErrorsNameTheirFunction) {
  auto e = LoadEngine();
  ASSERT_NE(e, nullptr);
  auto* impl = dynamic_cast<EngineImpl*>(e.get());
  ASSERT_NE(impl, nullptr);
  Result<std::vector<float>> r = impl->IncrementalLogits({1, 2, 3}, 0);
  ASSERT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message().rfind("IncrementalLogits: n_prefill 0", 0), 0u)
      << r.status().message();
  EXPECT_EQ(r.status().message().find("ComputeLogits"), std::string::npos);
  r = impl->IncrementalLogits({1, 2, 3}, 4);
  ASSERT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message().rfind("IncrementalLogits:", 0), 0u) << r.status().message();
  // And the call itself works.
  r = impl->IncrementalLogits({1, 2, 3}, 2);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->size(), static_cast<size_t>(e->config().vocab_size));
}

TEST_F(EngineTest, MaxTokensEndsWithLength) {
  auto e = LoadEngine();
  ASSERT_NE(e, nullptr);
  Result<GenerationResult> r = e->Generate(Greedy(Prompt(*e, "Hello there"), 7), nullptr, nullptr);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->finish_reason, FinishReason::kLength);
  EXPECT_EQ(r->output_ids.size(), 7u);
  EXPECT_EQ(r->prompt_tokens, static_cast<int>(Prompt(*e, "Hello there").size()));
  EXPECT_EQ(r->timings.decode_tokens, 6);  // the last sampled token is not fed back
  EXPECT_EQ(FinishReasonName(r->finish_reason), "length");
}

TEST_F(EngineTest, PrefixReuseGivesSameGreedyOutput) {
  auto e = LoadEngine(256, /*n_slots=*/1);
  ASSERT_NE(e, nullptr);
  const std::vector<int32_t> prompt = Prompt(*e, "The quick brown fox jumps over the lazy dog");
  ASSERT_GT(prompt.size(), 4u);
  Result<GenerationResult> a = e->Generate(Greedy(prompt, 12), nullptr, nullptr);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->cached_tokens, 0);
  Result<GenerationResult> b = e->Generate(Greedy(prompt, 12), nullptr, nullptr);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->cached_tokens, static_cast<int>(prompt.size()) - 1);  // ≥ 1 recomputed
  EXPECT_EQ(b->timings.prefill_tokens, 1);
  EXPECT_EQ(a->output_ids, b->output_ids);
  EXPECT_EQ(a->text, b->text);

  // A continuation of the first conversation reuses prompt + fed outputs.
  std::vector<int32_t> longer = prompt;
  longer.insert(longer.end(), a->output_ids.begin(), a->output_ids.end() - 1);
  longer.push_back(a->output_ids.back());
  longer.push_back(prompt[1]);
  Result<GenerationResult> c = e->Generate(Greedy(longer, 5), nullptr, nullptr);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->cached_tokens, static_cast<int>(prompt.size() + a->output_ids.size()) - 1);
  // Same as computing it from scratch on a fresh engine.
  auto fresh = LoadEngine(256, 1);
  Result<GenerationResult> d = fresh->Generate(Greedy(longer, 5), nullptr, nullptr);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->cached_tokens, 0);
  EXPECT_EQ(c->output_ids, d->output_ids);
}

TEST_F(EngineTest, PrefersSlotWithLongestCommonPrefix) {
  auto e = LoadEngine(256, /*n_slots=*/2);
  ASSERT_NE(e, nullptr);
  const auto p1 = Prompt(*e, "alpha beta gamma delta epsilon");
  const auto p2 = Prompt(*e, "one two three four five six");
  ASSERT_TRUE(e->Generate(Greedy(p1, 3), nullptr, nullptr).ok());
  ASSERT_TRUE(e->Generate(Greedy(p2, 3), nullptr, nullptr).ok());
  Result<GenerationResult> r1 = e->Generate(Greedy(p1, 3), nullptr, nullptr);
  Result<GenerationResult> r2 = e->Generate(Greedy(p2, 3), nullptr, nullptr);
  ASSERT_TRUE(r1.ok() && r2.ok());
  EXPECT_EQ(r1->cached_tokens, static_cast<int>(p1.size()) - 1);
  EXPECT_EQ(r2->cached_tokens, static_cast<int>(p2.size()) - 1);
}

TEST_F(EngineTest, SeededSamplingIsReproducible) {
  auto e = LoadEngine();
  ASSERT_NE(e, nullptr);
  GenerationRequest r = Greedy(Prompt(*e, "Once upon a time"), 20);
  r.sampling.temperature = 1.0f;
  r.sampling.top_p = 0.95f;
  r.sampling.top_k = 50;
  r.sampling.has_seed = true;
  r.sampling.seed = 1234;
  Result<GenerationResult> a = e->Generate(r, nullptr, nullptr);
  Result<GenerationResult> b = e->Generate(r, nullptr, nullptr);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->output_ids, b->output_ids);
}

TEST_F(EngineTest, StopStringAcrossTokenBoundary) {
  auto e = LoadEngine();
  ASSERT_NE(e, nullptr);
  const auto prompt = Prompt(*e, "Tell me a story about");
  Result<GenerationResult> full = e->Generate(Greedy(prompt, 40), nullptr, nullptr);
  ASSERT_TRUE(full.ok());
  // Find two consecutive output tokens whose pieces are non-empty ASCII, and
  // use "<last char of piece i><first char of piece i+1>" as the stop string.
  const Tokenizer& tok = e->tokenizer();
  std::string stop;
  auto ascii = [](const std::string& s) {
    for (unsigned char c : s) {
      if (c >= 0x80) return false;
    }
    return !s.empty();
  };
  for (size_t i = 0; i + 1 < full->output_ids.size() && stop.empty(); ++i) {
    const std::string a = tok.TokenBytes(full->output_ids[i]);
    const std::string b = tok.TokenBytes(full->output_ids[i + 1]);
    if (ascii(a) && ascii(b) && !tok.IsSpecial(full->output_ids[i]) &&
        !tok.IsSpecial(full->output_ids[i + 1])) {
      stop = a.substr(a.size() - 1) + b.substr(0, 1);
    }
  }
  ASSERT_FALSE(stop.empty()) << "no two consecutive ASCII tokens in: " << full->text;
  const size_t at = full->text.find(stop);
  ASSERT_NE(at, std::string::npos);

  GenerationRequest r = Greedy(prompt, 40);
  r.stop = {stop};
  std::string streamed;
  bool delta_had_stop = false;
  Result<GenerationResult> got = e->Generate(
      r,
      [&](std::string_view d) {
        streamed += d;
        delta_had_stop |= streamed.find(stop) != std::string::npos;
        return true;
      },
      nullptr);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->finish_reason, FinishReason::kStop);
  EXPECT_EQ(got->text, full->text.substr(0, at));
  EXPECT_EQ(streamed, got->text);
  EXPECT_FALSE(delta_had_stop);
}

TEST_F(EngineTest, StreamedDeltasConcatenateToText) {
  auto e = LoadEngine();
  ASSERT_NE(e, nullptr);
  std::string streamed;
  int calls = 0;
  Result<GenerationResult> r = e->Generate(
      Greedy(Prompt(*e, "Some words"), 30),
      [&](std::string_view d) {
        EXPECT_FALSE(d.empty());
        streamed += d;
        ++calls;
        return true;
      },
      nullptr);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(streamed, r->text);
  EXPECT_GT(calls, 0);
}

TEST_F(EngineTest, CancelViaTextCallback) {
  auto e = LoadEngine();
  ASSERT_NE(e, nullptr);
  int calls = 0;
  Result<GenerationResult> r = e->Generate(Greedy(Prompt(*e, "Keep talking"), 100),
                                           [&](std::string_view) { return ++calls < 3; }, nullptr);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(calls, 3);
  EXPECT_LT(r->output_ids.size(), 100u);
  EXPECT_EQ(FinishReasonName(r->finish_reason), "cancelled");
}

TEST_F(EngineTest, CancelViaCancelFn) {
  auto e = LoadEngine();
  ASSERT_NE(e, nullptr);
  int polls = 0;
  Result<GenerationResult> r = e->Generate(Greedy(Prompt(*e, "Keep talking"), 100), nullptr,
                                           [&] { return ++polls > 5; });
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(r->output_ids.size(), 5u);
}

TEST_F(EngineTest, CancelWhileWaitingForSlot) {
  auto e = LoadEngine(256, /*n_slots=*/1);
  ASSERT_NE(e, nullptr);
  std::atomic<bool> holding{false}, release{false};
  std::thread holder([&] {
    // Holds the only slot inside its text callback until released.
    Result<GenerationResult> r = e->Generate(
        Greedy(Prompt(*e, "hold the slot"), 200),
        [&](std::string_view) {
          holding = true;
          while (!release) std::this_thread::yield();
          return false;
        },
        nullptr);
    EXPECT_TRUE(r.ok());
  });
  while (!holding) std::this_thread::yield();
  Result<GenerationResult> r =
      e->Generate(Greedy(Prompt(*e, "waiting"), 5), nullptr, [] { return true; });
  release = true;
  holder.join();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->finish_reason, FinishReason::kCancelled);
  EXPECT_TRUE(r->output_ids.empty());
  Result<std::vector<float>> emb = e->Embed(Prompt(*e, "x y"), [] { return false; });
  EXPECT_TRUE(emb.ok());
}

TEST_F(EngineTest, EightThreadsOnTwoSlotsAllComplete) {
  auto e = LoadEngine(256, /*n_slots=*/2);
  ASSERT_NE(e, nullptr);
  // Expected outputs computed serially first.
  std::vector<std::vector<int32_t>> prompts, expected;
  for (int i = 0; i < 8; ++i) {
    prompts.push_back(Prompt(*e, "request number " + std::to_string(i) + " says hi"));
    Result<GenerationResult> r = e->Generate(Greedy(prompts.back(), 10), nullptr, nullptr);
    ASSERT_TRUE(r.ok());
    expected.push_back(r->output_ids);
  }
  std::vector<std::vector<int32_t>> got(8);
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      for (int rep = 0; rep < 3; ++rep) {
        Result<GenerationResult> r = e->Generate(Greedy(prompts[i], 10), nullptr, nullptr);
        ASSERT_TRUE(r.ok());
        EXPECT_EQ(r->output_ids, expected[i]) << "thread " << i;
        got[i] = r->output_ids;
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 8; ++i) EXPECT_EQ(got[i].size(), 10u);
}

// A constraint over token ids for the engine's hook: allows exactly the
// tokens of `path` in order, then ends (CanEnd after the last).
class PathConstraint final : public TokenConstraint {
 public:
  explicit PathConstraint(std::vector<int32_t> path) : path_(std::move(path)) {}
  void FillAllowed(int tokens_left, std::span<uint8_t> allowed) override {
    last_tokens_left.push_back(tokens_left);
    if (pos_ < path_.size()) allowed[path_[pos_]] = 1;
  }
  Status Accept(int32_t token) override {
    if (pos_ >= path_.size() || token != path_[pos_]) return InvalidArgumentError("off path");
    ++pos_;
    return OkStatus();
  }
  bool CanEnd() const override { return pos_ == path_.size(); }
  bool MustEnd() const override { return must_end_at_end && pos_ == path_.size(); }
  bool must_end_at_end = true;
  std::vector<int> last_tokens_left;

 private:
  std::vector<int32_t> path_;
  size_t pos_ = 0;
};

TEST_F(EngineTest, ConstraintDecidesEveryTokenAndEndsTheOutput) {
  auto e = LoadEngine();
  ASSERT_NE(e, nullptr);
  const std::vector<int32_t> path = Prompt(*e, " the quick brown fox");
  PathConstraint c(path);
  GenerationRequest r = Greedy(Prompt(*e, "Once upon a time"), 50);
  r.sampling.temperature = 1.0f;  // sampled, yet only the path can come out
  r.constraint = &c;
  Result<GenerationResult> g = e->Generate(r, nullptr, nullptr);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->output_ids, path);
  EXPECT_EQ(g->text, " the quick brown fox");
  EXPECT_EQ(g->finish_reason, FinishReason::kStop);
  ASSERT_EQ(c.last_tokens_left.size(), path.size());
  EXPECT_EQ(c.last_tokens_left[0], 50);  // the budget is passed down
  EXPECT_EQ(c.last_tokens_left[1], 49);
}

TEST_F(EngineTest, ConstraintAllowsEndOfSequenceOnlyWhenComplete) {
  auto e = LoadEngine();
  ASSERT_NE(e, nullptr);
  const std::vector<int32_t> path = Prompt(*e, " ok");
  PathConstraint c(path);
  c.must_end_at_end = false;  // complete, but not forced to stop: EOS is the only choice
  GenerationRequest r = Greedy(Prompt(*e, "Once upon a time"), 50);
  r.ignore_eos = false;
  r.constraint = &c;
  Result<GenerationResult> g = e->Generate(r, nullptr, nullptr);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->output_ids, path);
  EXPECT_EQ(g->finish_reason, FinishReason::kStop);
  // With ignore_eos nothing may follow a complete path: an error, not garbage.
  PathConstraint c2(path);
  c2.must_end_at_end = false;
  r.ignore_eos = true;
  r.constraint = &c2;
  g = e->Generate(r, nullptr, nullptr);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("constrained decoding"), std::string::npos);
}

TEST_F(EngineTest, LogprobsPerTokenThroughResultAndCallback) {
  auto e = LoadEngine();
  ASSERT_NE(e, nullptr);
  GenerationRequest r = Greedy(Prompt(*e, "Hello there"), 5);
  r.top_logprobs = 4;
  std::vector<int32_t> seen;
  r.on_token = [&](int32_t id, const TokenLogprob* lp) {
    ASSERT_NE(lp, nullptr);
    EXPECT_EQ(lp->id, id);
    seen.push_back(id);
  };
  Result<GenerationResult> g = e->Generate(r, nullptr, nullptr);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(seen, g->output_ids);
  ASSERT_EQ(g->logprobs.size(), 5u);
  for (const TokenLogprob& lp : g->logprobs) {
    ASSERT_EQ(lp.top.size(), 4u);
    EXPECT_EQ(lp.top[0].first, lp.id);  // greedy: the sampled token is the most probable
    EXPECT_LE(lp.logprob, 0.0f);
    EXPECT_GE(lp.top[0].second, lp.top[1].second);
  }
  r.top_logprobs = 21;
  EXPECT_FALSE(e->Generate(r, nullptr, nullptr).ok());
}

TEST_F(EngineTest, LogitBiasBansAndForcesTokens) {
  auto e = LoadEngine();
  ASSERT_NE(e, nullptr);
  GenerationRequest r = Greedy(Prompt(*e, "Hello there"), 6);
  Result<GenerationResult> plain = e->Generate(r, nullptr, nullptr);
  ASSERT_TRUE(plain.ok());
  const int32_t first = plain->output_ids[0];
  r.sampling.logit_bias = {{first, -100.0f}};
  Result<GenerationResult> banned = e->Generate(r, nullptr, nullptr);
  ASSERT_TRUE(banned.ok());
  for (int32_t id : banned->output_ids) EXPECT_NE(id, first);
  r.sampling.logit_bias = {{42, 100.0f}};
  Result<GenerationResult> forced = e->Generate(r, nullptr, nullptr);
  ASSERT_TRUE(forced.ok());
  EXPECT_EQ(forced->output_ids, std::vector<int32_t>(6, 42));
  r.sampling.logit_bias = {{1 << 30, 1.0f}};
  Result<GenerationResult> bad = e->Generate(r, nullptr, nullptr);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("logit_bias"), std::string::npos);
}

TEST_F(EngineTest, FrequencyPenaltyStopsGreedyRepetition) {
  auto e = LoadEngine();
  ASSERT_NE(e, nullptr);
  GenerationRequest r = Greedy(Prompt(*e, "Hello there"), 24);
  r.sampling.logit_bias = {{42, 8.0f}};  // a strong favourite the penalty must overcome
  Result<GenerationResult> plain = e->Generate(r, nullptr, nullptr);
  ASSERT_TRUE(plain.ok());
  auto count42 = [](const std::vector<int32_t>& ids) {
    return std::count(ids.begin(), ids.end(), 42);
  };
  r.sampling.frequency_penalty = 2.0f;
  r.sampling.presence_penalty = 2.0f;
  Result<GenerationResult> penalized = e->Generate(r, nullptr, nullptr);
  ASSERT_TRUE(penalized.ok());
  EXPECT_LT(count42(penalized->output_ids), count42(plain->output_ids));
}

TEST_F(EngineTest, EmbedIsUnitNormAndDeterministic) {
  auto e = LoadEngine();
  ASSERT_NE(e, nullptr);
  const auto ids = Prompt(*e, "an embedding of this sentence");
  Result<std::vector<float>> a = e->Embed(ids, nullptr);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_EQ(a->size(), static_cast<size_t>(e->config().hidden_size));
  double norm = 0;
  for (float v : *a) norm += double{v} * v;
  EXPECT_NEAR(norm, 1.0, 1e-5);
  Result<std::vector<float>> b = e->Embed(ids, nullptr);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*a, *b);
  Result<std::vector<float>> c = e->Embed(Prompt(*e, "something else entirely"), nullptr);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(*a, *c);
  EXPECT_EQ(e->Embed({}, nullptr).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(EngineTest, EosIdsIncludeEndOfTurnTokens) {
  auto e = LoadEngine();
  ASSERT_NE(e, nullptr);
  auto* impl = dynamic_cast<EngineImpl*>(e.get());
  ASSERT_NE(impl, nullptr);
  const int32_t im_end = e->tokenizer().TokenId("<|im_end|>");
  ASSERT_GE(im_end, 0);
  const auto& eos = impl->eos_ids();
  EXPECT_NE(std::find(eos.begin(), eos.end(), im_end), eos.end());
}

}  // namespace
}  // namespace arbiter

namespace arbiter {
namespace {

// Each KV type (Note [KV cache types] in forward.cc) on tiny-qwen3 (head_dim
// 32, so q8_0 is allowed): the slot holds the type's bytes (kv_bytes() and
// Footprint agree, f16/bf16 half of f32, q8_0 34/128), a snapshot and a
// restore into a second engine carry the type, the restored prefix is
// reused and gives the cold output, and a snapshot of another type is
// refused with the slot untouched.
class KvTypeEngineTest : public ::testing::TestWithParam<GgmlType> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(engine_internal::MakeTempDir("arbiter_kv_type_test_"));
    Status s = MakeModel("tiny-qwen3", *dir_, 3);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static EngineOptions Options(GgmlType kv_type) {
    EngineOptions o;
    o.n_ctx = 128;
    o.n_slots = 2;
    o.prefill_batch = 8;
    o.kv_type = kv_type;
    return o;
  }
  static std::string* dir_;
};
std::string* KvTypeEngineTest::dir_ = nullptr;

TEST_P(KvTypeEngineTest, SlotsSnapshotsAndRestoresHoldTheType) {
  const GgmlType type = GetParam();
  Result<std::shared_ptr<const ModelFiles>> files = OpenModelFiles(*dir_);
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  Result<std::unique_ptr<Engine>> a = Engine::Load(*files, Options(type));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  Engine& e = **a;
  EXPECT_EQ(e.kv_type(), type);
  const ModelConfig& c = e.config();
  const size_t kv_dim = size_t{1} * c.num_key_value_heads * c.head_dim;
  const size_t row = KvRowBytes(type, kv_dim);
  ASSERT_GT(row, 0u);
  EXPECT_EQ(row * 128, KvRowBytes(GgmlType::kF32, kv_dim) *
                           (type == GgmlType::kF32 ? 128 : type == GgmlType::kQ8_0 ? 34 : 64));
  const size_t kv_cache = size_t{2} * 2 * c.num_hidden_layers * e.n_ctx() * row;  // 2 slots
  EXPECT_EQ(e.kv_bytes(), kv_cache + e.scratch_bytes());
  Result<EngineFootprint> fp = Engine::Footprint(**files, Options(type));
  ASSERT_TRUE(fp.ok());
  EXPECT_EQ(fp->kv_bytes, kv_cache);
  EXPECT_EQ(fp->scratch_bytes, e.scratch_bytes());

  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back(5 + (i * 37) % 200);
  GenerationRequest req;
  req.prompt_ids = prompt;
  req.sampling.temperature = 0.0f;
  req.max_tokens = 6;
  req.ignore_eos = true;
  req.slot = 0;
  Result<GenerationResult> first = e.Generate(req, nullptr, nullptr);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  Result<KvSnapshot> snap = e.SaveSlot(0, nullptr);
  ASSERT_TRUE(snap.ok());
  EXPECT_EQ(snap->kv_type, type);
  EXPECT_EQ(snap->kv.size(), size_t{2} * c.num_hidden_layers * snap->n_tokens() * row);

  // Another engine of the type restores it and reuses the prefix.
  Result<std::unique_ptr<Engine>> b = Engine::Load(*files, Options(type));
  ASSERT_TRUE(b.ok());
  Result<int> restored = (*b)->RestoreSlot(1, *snap, nullptr);
  ASSERT_TRUE(restored.ok()) << restored.status().ToString();
  std::vector<int32_t> longer = prompt;
  longer.insert(longer.end(), first->output_ids.begin(), first->output_ids.end());
  longer.push_back(9);
  req.prompt_ids = longer;
  req.slot = 1;
  Result<GenerationResult> warm = (*b)->Generate(req, nullptr, nullptr);
  ASSERT_TRUE(warm.ok());
  EXPECT_EQ(warm->cached_tokens, *restored);
  req.slot = -1;
  Result<std::unique_ptr<Engine>> cold_engine = Engine::Load(*files, Options(type));
  ASSERT_TRUE(cold_engine.ok());
  Result<GenerationResult> cold = (*cold_engine)->Generate(req, nullptr, nullptr);
  ASSERT_TRUE(cold.ok());
  EXPECT_EQ(cold->cached_tokens, 0);
  EXPECT_EQ(warm->output_ids, cold->output_ids);

  // A snapshot of another type is refused; the slot keeps its tokens.
  KvSnapshot other = *snap;
  other.kv_type = type == GgmlType::kF16 ? GgmlType::kBF16 : GgmlType::kF16;
  other.kv.resize(other.ExpectedKvBytes());
  const std::vector<int32_t> held = (*b)->SlotTokens(1);
  Result<int> refused = (*b)->RestoreSlot(1, other, nullptr);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("kv_type"), std::string::npos);
  EXPECT_EQ((*b)->SlotTokens(1), held);
}

INSTANTIATE_TEST_SUITE_P(KvTypes, KvTypeEngineTest,
                         ::testing::Values(GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16,
                                           GgmlType::kQ8_0),
                         [](const auto& info) { return std::string(KvTypeName(info.param)); });

TEST(KvTypeOptionsTest, NotAKvTypeIsRefusedByName) {
  EngineOptions o;
  o.kv_type = GgmlType::kQ4_0;
  Result<std::unique_ptr<Engine>> e = Engine::Load("/nonexistent", o);
  ASSERT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("kv_type Q4_0 is not a KV cache type"), std::string::npos)
      << e.status().message();
}

}  // namespace
}  // namespace arbiter
