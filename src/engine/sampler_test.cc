#include "arbiter/engine/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <vector>

namespace arbiter {
namespace {

std::vector<float> RandomLogits(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

SamplingParams Params(float temperature, float top_p, int top_k, std::optional<uint64_t> seed) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_p = top_p;
  p.top_k = top_k;
  p.has_seed = seed.has_value();
  p.seed = seed.value_or(0);
  return p;
}

TEST(SamplerTest, GreedyPicksArgMaxLowestIdOnTies) {
  std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f};
  Sampler s(Params(0.0f, 1.0f, 0, std::nullopt));
  for (int i = 0; i < 10; ++i) EXPECT_EQ(s.Sample(logits.data(), 4), 1);
  auto c = FilterCandidates(logits.data(), 4, Params(0.0f, 0.5f, 3, 1));
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].id, 1);
}

TEST(SamplerTest, SameSeedSameSequence) {
  const std::vector<float> logits = RandomLogits(500, 7);
  for (auto params : {Params(1.0f, 1.0f, 0, 42), Params(0.8f, 0.9f, 0, 42),
                      Params(1.3f, 1.0f, 40, 42), Params(0.7f, 0.95f, 20, 42)}) {
    Sampler a(params), b(params);
    std::vector<int32_t> sa, sb;
    for (int i = 0; i < 200; ++i) {
      sa.push_back(a.Sample(logits.data(), 500));
      sb.push_back(b.Sample(logits.data(), 500));
    }
    EXPECT_EQ(sa, sb);
    EXPECT_EQ(a.seed(), 42u);
    // Not degenerate: a random sampler over 500 tokens varies.
    EXPECT_GT(std::set<int32_t>(sa.begin(), sa.end()).size(), 1u);
  }
  Sampler c(Params(1.0f, 1.0f, 0, 43));
  Sampler d(Params(1.0f, 1.0f, 0, 42));
  std::vector<int32_t> sc, sd;
  for (int i = 0; i < 50; ++i) {
    sc.push_back(c.Sample(logits.data(), 500));
    sd.push_back(d.Sample(logits.data(), 500));
  }
  EXPECT_NE(sc, sd);
}

TEST(SamplerTest, TopKKeepsExactlyTheKLargest) {
  const std::vector<float> logits = RandomLogits(1000, 3);
  auto c = FilterCandidates(logits.data(), 1000, Params(1.0f, 1.0f, 10, 1));
  ASSERT_EQ(c.size(), 10u);
  std::vector<int> order(1000);
  for (int i = 0; i < 1000; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  std::set<int32_t> expected(order.begin(), order.begin() + 10), got;
  double sum = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    got.insert(c[i].id);
    sum += c[i].p;
    if (i > 0) {
      EXPECT_GE(c[i - 1].p, c[i].p);
    }
  }
  EXPECT_EQ(got, expected);
  EXPECT_NEAR(sum, 1.0, 1e-5);
  // Sampling never leaves the set.
  Sampler s(Params(1.0f, 1.0f, 10, 5));
  for (int i = 0; i < 500; ++i) EXPECT_TRUE(expected.count(s.Sample(logits.data(), 1000)));
}

TEST(SamplerTest, TopPKeepsSmallestPrefixReachingMass) {
  // Probabilities 0.5, 0.25, 0.125, 0.0625, ... (log2 spaced logits).
  std::vector<float> logits;
  for (int i = 0; i < 12; ++i) logits.push_back(-static_cast<float>(i) * std::log(2.0f));
  // 0.5 < 0.6 → need the second (mass before it 0.5 < 0.6); before third = 0.75 ≥ 0.6 → cut.
  auto c = FilterCandidates(logits.data(), 12, Params(1.0f, 0.6f, 0, 1));
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].id, 0);
  EXPECT_EQ(c[1].id, 1);
  EXPECT_NEAR(c[0].p, 2.0 / 3.0, 1e-5);
  c = FilterCandidates(logits.data(), 12, Params(1.0f, 0.4f, 0, 1));
  ASSERT_EQ(c.size(), 1u);  // at least one survives
  c = FilterCandidates(logits.data(), 12, Params(1.0f, 0.9f, 0, 1));
  EXPECT_EQ(c.size(), 4u);  // 0.5+0.25+0.125 = 0.875 < 0.9 → 4 tokens
  c = FilterCandidates(logits.data(), 12, Params(1.0f, 1.0f, 0, 1));
  EXPECT_EQ(c.size(), 12u);
  // top-k then top-p.
  c = FilterCandidates(logits.data(), 12, Params(1.0f, 0.9f, 2, 1));
  EXPECT_EQ(c.size(), 2u);
}

TEST(SamplerTest, TopPOnLargeVocabMatchesFullSort) {
  // Flat-ish distribution so the nucleus needs more than one partial-sort chunk.
  std::vector<float> logits = RandomLogits(20000, 11);
  for (float& x : logits) x *= 0.1f;
  auto params = Params(1.0f, 0.5f, 0, 1);
  auto c = FilterCandidates(logits.data(), 20000, params);
  // Reference: full sort.
  double mx = *std::max_element(logits.begin(), logits.end()), total = 0;
  std::vector<std::pair<double, int>> all;
  for (int i = 0; i < 20000; ++i) {
    all.push_back({std::exp(logits[i] - mx), i});
    total += all.back().first;
  }
  std::sort(all.begin(), all.end(), [](auto& a, auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  size_t keep = 0;
  double before = 0;
  while (keep < all.size() && (keep == 0 || before < 0.5)) before += all[keep++].first / total;
  EXPECT_GT(keep, 64u);
  // Float vs double probabilities may move the boundary by at most one token.
  EXPECT_NEAR(static_cast<double>(c.size()), static_cast<double>(keep), 1.0);
  // Same set up to the boundary token (near-ties may order differently in float).
  std::set<int32_t> got, want;
  for (size_t i = 0; i + 1 < std::min(c.size(), keep); ++i) {
    got.insert(c[i].id);
    want.insert(all[i].second);
  }
  std::vector<int32_t> diff;
  std::set_symmetric_difference(got.begin(), got.end(), want.begin(), want.end(),
                                std::back_inserter(diff));
  EXPECT_LE(diff.size(), 2u);
}

TEST(SamplerTest, SampleFrequenciesFollowProbabilities) {
  std::vector<float> logits = {std::log(0.7f), std::log(0.2f), std::log(0.1f)};
  Sampler s(Params(1.0f, 1.0f, 0, 99));
  std::map<int, int> counts;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ++counts[s.Sample(logits.data(), 3)];
  EXPECT_NEAR(counts[0] / double(n), 0.7, 0.02);
  EXPECT_NEAR(counts[1] / double(n), 0.2, 0.02);
  EXPECT_NEAR(counts[2] / double(n), 0.1, 0.02);
}

TEST(SamplerTest, ValidateRejectsBadParams) {
  EXPECT_TRUE(ValidateSamplingParams(Params(0.7f, 0.9f, 40, 1)).ok());
  EXPECT_EQ(ValidateSamplingParams(Params(-1.0f, 1.0f, 0, 1)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateSamplingParams(Params(1.0f, 0.0f, 0, 1)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateSamplingParams(Params(1.0f, 1.5f, 0, 1)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateSamplingParams(Params(1.0f, 1.0f, -2, 1)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateSamplingParams(Params(NAN, 1.0f, 0, 1)).code(), StatusCode::kInvalidArgument);
}

TEST(SamplerTest, MinPDropsTokensBelowTheFraction) {
  // softmax([2, 1, 0, -5]) ≈ [0.66, 0.24, 0.09, 0.0006]
  std::vector<float> logits = {2.0f, 1.0f, 0.0f, -5.0f};
  SamplingParams p = Params(1.0f, 1.0f, 0, 1);
  p.min_p = 0.2f;  // floor 0.13: keeps ids 0 and 1
  auto c = FilterCandidates(logits.data(), 4, p);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].id, 0);
  EXPECT_EQ(c[1].id, 1);
  EXPECT_NEAR(c[0].p + c[1].p, 1.0, 1e-6);
  Sampler s(p);
  for (int i = 0; i < 200; ++i) EXPECT_LT(s.Sample(logits.data(), 4), 2);
}

TEST(SamplerTest, ValidationNamesEachNewField) {
  SamplingParams p;
  p.min_p = 1.5f;
  EXPECT_NE(ValidateSamplingParams(p).message().find("min_p"), std::string::npos);
  p = SamplingParams{};
  p.presence_penalty = 9.0f;
  EXPECT_NE(ValidateSamplingParams(p).message().find("presence_penalty"), std::string::npos);
  p = SamplingParams{};
  p.frequency_penalty = -2.5f;
  EXPECT_NE(ValidateSamplingParams(p).message().find("frequency_penalty"), std::string::npos);
  p = SamplingParams{};
  p.repetition_penalty = 0.0f;
  EXPECT_NE(ValidateSamplingParams(p).message().find("repetition_penalty"), std::string::npos);
  p = SamplingParams{};
  p.logit_bias = {{3, 101.0f}};
  EXPECT_NE(ValidateSamplingParams(p).message().find("logit_bias"), std::string::npos);
  p = SamplingParams{};
  p.presence_penalty = 2.0f;
  p.frequency_penalty = -2.0f;
  p.logit_bias = {{3, -100.0f}};
  EXPECT_TRUE(ValidateSamplingParams(p).ok());
}

TEST(SamplerTest, LogitAdjustmentsInOrder) {
  std::vector<float> logits = {1.0f, 2.0f, -1.0f, 0.5f};
  SamplingParams p;
  p.logit_bias = {{0, 1.0f}, {99, 5.0f}};  // 99: outside, skipped
  p.repetition_penalty = 2.0f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  std::vector<uint8_t> seen = {1, 0, 1, 0};
  std::vector<int32_t> counts = {0, 2, 1, 0};
  ApplyLogitAdjustments(p, seen, counts, logits.data(), 4);
  EXPECT_FLOAT_EQ(logits[0], 1.0f);                  // (1 + 1) / 2
  EXPECT_FLOAT_EQ(logits[1], 2.0f - 0.5f - 0.5f);    // not seen; counted twice
  EXPECT_FLOAT_EQ(logits[2], -2.0f - 0.5f - 0.25f);  // seen and negative: × 2
  EXPECT_FLOAT_EQ(logits[3], 0.5f);
}

TEST(SamplerTest, LogprobsAreLogSoftmaxWithTopAlternatives) {
  std::vector<float> logits = {0.0f, std::log(3.0f), -std::numeric_limits<float>::infinity(),
                               std::log(3.0f)};
  TokenLogprob lp = LogprobOf(logits.data(), 4, 0, 3);
  EXPECT_EQ(lp.id, 0);
  EXPECT_NEAR(lp.logprob, std::log(1.0 / 7.0), 1e-5);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].first, 1);  // tie with 3: the lower id first
  EXPECT_EQ(lp.top[1].first, 3);
  EXPECT_EQ(lp.top[2].first, 0);
  EXPECT_NEAR(lp.top[0].second, std::log(3.0 / 7.0), 1e-5);
  EXPECT_TRUE(LogprobOf(logits.data(), 4, 1, 0).top.empty());
}

}  // namespace
}  // namespace arbiter
