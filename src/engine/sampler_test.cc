#include "arbiter/engine/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
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

}  // namespace
}  // namespace arbiter
