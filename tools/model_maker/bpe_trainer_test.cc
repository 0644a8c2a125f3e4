#include "tools/model_maker/bpe_trainer.h"

#include <gtest/gtest.h>

#include <chrono>

#include "arbiter/engine/tokenizer.h"
#include "arbiter/formats/tokenizer_json.h"

namespace arbiter {
namespace {

TEST(BpeTrainerTest, HandComputedMergesAndTieBreaks) {
  // Words: "ab", " ab", " ba". Pair counts: (a,b)=2, ( ,a)=1, ( ,b)=1, (b,a)=1.
  BpeTrainerOptions o;
  o.num_merges = 10;
  o.min_pair_count = 1;
  auto r = TrainBpe("ab ab ba", o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::vector<std::pair<std::string, std::string>> merges;
  for (auto [a, b] : r->merges) merges.emplace_back(r->vocab[a], r->vocab[b]);
  // After (a,b): ( ,ab)=1, ( ,b)=1, (b,a)=1 all tie; smallest strings first:
  // " " < "b", then "ab" < "b". Merging ( ,b) turns " ba" into " b"+"a".
  using M = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(merges, (M{{"a", "b"}, {" ", "ab"}, {" ", "b"}, {" b", "a"}}));
  EXPECT_EQ(r->vocab.size(), 260u);
  EXPECT_EQ(r->vocab[258], " b");

  o.min_pair_count = 2;
  r = TrainBpe("ab ab ba", o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->merges.size(), 1u);
}

TEST(BpeTrainerTest, RepeatedSymbolsCountCorrectly) {
  BpeTrainerOptions o;
  o.num_merges = 3;
  o.min_pair_count = 1;
  auto r = TrainBpe("aaaa", o);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->merges.size(), 2u);  // a a → aa; aa aa → aaaa
  EXPECT_EQ(r->vocab[r->merges[1].first], "aa");
  EXPECT_EQ(r->vocab.back(), "aaaa");
}

TEST(BpeTrainerTest, DefaultCorpusTrainsFastAndRoundTripsThroughTheParser) {
  auto corpus = DefaultTrainingCorpus();
  ASSERT_TRUE(corpus.ok()) << corpus.status().ToString();
  EXPECT_GT(corpus->size(), 100'000u);
  BpeTrainerOptions o;
  o.num_merges = 3700;
  o.special_tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  auto t0 = std::chrono::steady_clock::now();
  auto r = TrainBpe(*corpus, o);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::printf("trained %zu merges on %zu bytes in %.3f s\n", r->merges.size(), corpus->size(), secs);
  EXPECT_GE(r->merges.size(), 2000u);
  EXPECT_EQ(r->merges.size(), 3700u);
  EXPECT_LT(secs, 10.0);
  EXPECT_EQ(r->SpecialTokenId("<|im_end|>"), static_cast<int32_t>(r->vocab.size() + 2));
  EXPECT_EQ(r->SpecialTokenId("nope"), -1);

  std::string json = r->ToTokenizerJson();
  auto spec = ParseTokenizerJson(json, "trained");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->merges.size(), 3700u);
  EXPECT_EQ(spec->vocab.size(), r->vocab.size());
  ASSERT_EQ(spec->added_tokens.size(), 3u);
  EXPECT_TRUE(spec->added_tokens[1].special);
  ASSERT_EQ(spec->pre_tokenizer.size(), 2u);
  EXPECT_EQ(spec->pre_tokenizer[0].kind, TokenizerPreTokenizerStep::Kind::kSplit);
  EXPECT_EQ(spec->pre_tokenizer[0].pattern, kDefaultBpeSplitRegex);
  EXPECT_EQ(spec->pre_tokenizer[1].kind, TokenizerPreTokenizerStep::Kind::kByteLevel);
  EXPECT_FALSE(spec->pre_tokenizer[1].use_regex);
  ASSERT_EQ(spec->decoder.size(), 1u);
  auto tok = Tokenizer::FromJson(json, "trained");
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->vocab_size(), r->vocab_size());

  // Deterministic.
  auto again = TrainBpe(*corpus, o);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->ToTokenizerJson(), json);
}

TEST(BpeTrainerTest, Errors) {
  BpeTrainerOptions o;
  o.special_tokens = {"<a>", "<a>"};
  EXPECT_EQ(TrainBpe("x", o).status().code(), StatusCode::kInvalidArgument);
  o.special_tokens = {""};
  EXPECT_EQ(TrainBpe("x", o).status().code(), StatusCode::kInvalidArgument);
  o.special_tokens = {};
  o.split_regex = "(";
  EXPECT_EQ(TrainBpe("x", o).status().code(), StatusCode::kInvalidArgument);
  auto missing = DefaultTrainingCorpus("/nonexistent/licenses");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/licenses"), std::string::npos);
}

TEST(BpeTrainerTest, EmptyCorpusGivesBytesOnly) {
  auto r = TrainBpe("", BpeTrainerOptions{});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->vocab.size(), 256u);
  EXPECT_TRUE(r->merges.empty());
  auto tok = Tokenizer::FromJson(r->ToTokenizerJson(), "empty");
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->Encode("hi"), (std::vector<int32_t>{'h', 'i'}));
}

}  // namespace
}  // namespace arbiter
