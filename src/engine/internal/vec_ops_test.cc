#include "engine/internal/vec_ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace arbiter::engine_internal {
namespace {

TEST(VecOpsTest, ExpFMatchesLibm) {
  double max_rel = 0;
  for (float x = -87.0f; x <= 88.0f; x += 0.0137f) {
    const double want = std::exp(static_cast<double>(x));
    max_rel = std::max(max_rel, std::fabs(ExpF(x) - want) / want);
  }
  EXPECT_LT(max_rel, 5e-7);
  EXPECT_EQ(ExpF(0.0f), 1.0f);
  EXPECT_TRUE(std::isfinite(ExpF(1000.0f)));
  EXPECT_GE(ExpF(-1000.0f), 0.0f);
  EXPECT_LT(ExpF(-1000.0f), 1e-37f);
}

TEST(VecOpsTest, ReductionsMatchNaiveSums) {
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  for (int n : {1, 15, 16, 17, 64, 100, 768}) {
    std::vector<float> a(n), b(n);
    for (int i = 0; i < n; ++i) {
      a[i] = nd(rng);
      b[i] = nd(rng);
    }
    double dot = 0, sum = 0, ss = 0;
    for (int i = 0; i < n; ++i) {
      dot += double{a[i]} * b[i];
      sum += a[i];
      ss += double{a[i]} * a[i];
    }
    EXPECT_NEAR(Dot(a.data(), b.data(), n), dot, 1e-4 * (1 + std::fabs(dot))) << n;
    EXPECT_NEAR(Sum(a.data(), n), sum, 1e-4 * (1 + std::fabs(sum))) << n;
    EXPECT_NEAR(SumSquares(a.data(), n), ss, 1e-4 * ss) << n;
  }
}

TEST(VecOpsTest, SoftmaxIsStableAndNormalized) {
  std::vector<float> a = {1000.0f, 999.0f, -1000.0f, 1000.0f};
  Softmax(a.data(), 4);
  const double e1 = std::exp(-1.0);
  const double z = 2 + e1;
  EXPECT_NEAR(a[0], 1 / z, 1e-6);
  EXPECT_NEAR(a[1], e1 / z, 1e-6);
  EXPECT_NEAR(a[2], 0.0, 1e-30);
  EXPECT_NEAR(a[3], 1 / z, 1e-6);
}

TEST(VecOpsTest, RmsNormMatchesDefinition) {
  std::vector<float> x = {1, -2, 3, -4}, w = {1, 0.5f, 2, 1}, out(4);
  RmsNorm(x.data(), w.data(), 1e-6f, 4, out.data());
  const double inv = 1 / std::sqrt((1 + 4 + 9 + 16) / 4.0 + 1e-6);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(out[i], x[i] * inv * w[i], 1e-6);
}

}  // namespace
}  // namespace arbiter::engine_internal
