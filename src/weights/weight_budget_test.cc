// WeightBudget: the table in weight_budget.h (docs/weights.md acceptance 10)
// and parameter validation.
#include "arbiter/weights/weight_budget.h"

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

namespace arbiter {
namespace {

struct Row {
  uint64_t arena;
  double fraction;
  uint64_t max_scratch;
  uint64_t pinned;
  uint64_t want_pool;
  uint64_t want_budget;
  bool want_over_commit;
};

// Arena 1000, wiggle 0.1 (the table in weight_budget.h).
TEST(WeightBudgetTest, ReferenceTable) {
  const Row rows[] = {
      {1000, 1.0, 0, 0, 900, 900, false},
      {1000, 0.5, 0, 0, 500, 500, false},
      {1000, 1.0, 300, 0, 600, 600, false},
      {1000, 1.0, 300, 200, 600, 400, false},
      {1000, 1.0, 300, 700, 600, 0, true},
      {1000, 1.0, 950, 0, 0, 0, false},
      {0, 1.0, 0, 0, 0, 0, false},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(testing::Message() << "arena " << r.arena << " fraction " << r.fraction
                                    << " max_scratch " << r.max_scratch << " pinned " << r.pinned);
    Result<WeightBudget> b = SolveWeightBudget(r.arena, r.fraction, 0.1, r.max_scratch, r.pinned);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    EXPECT_EQ(b->scratch_ceiling_bytes, r.arena == 0 ? 0u : 900u);
    EXPECT_EQ(b->weight_pool_bytes, r.want_pool);
    EXPECT_EQ(b->on_demand_budget_bytes, r.want_budget);
    EXPECT_EQ(b->pinned_over_commit, r.want_over_commit);
  }
}

TEST(WeightBudgetTest, FloorsLikeTheReferenceInDouble) {
  // (1 − 0.3) × 1000 is 700.0 in double; a wider type would floor to 699.
  Result<WeightBudget> b = SolveWeightBudget(1000, 1.0, 0.3, 0, 0);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->scratch_ceiling_bytes, 700u);
  b = SolveWeightBudget(1001, 0.5, 0.0, 0, 0);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->scratch_ceiling_bytes, 1001u);
  EXPECT_EQ(b->weight_pool_bytes, 500u);
}

TEST(WeightBudgetTest, PinnedEqualToPoolIsNotAnOverCommit) {
  Result<WeightBudget> b = SolveWeightBudget(1000, 1.0, 0.1, 300, 600);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->on_demand_budget_bytes, 0u);
  EXPECT_FALSE(b->pinned_over_commit);
}

TEST(WeightBudgetTest, HugeArenaStaysWithinArena) {
  const uint64_t arena = std::numeric_limits<uint64_t>::max();
  Result<WeightBudget> b = SolveWeightBudget(arena, 1.0, 0.0, 0, 0);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->scratch_ceiling_bytes, arena);
  EXPECT_EQ(b->weight_pool_bytes, arena);
  b = SolveWeightBudget(uint64_t{1} << 40, 1.0, 0.1, 0, 0);  // 1 TiB
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->weight_pool_bytes, static_cast<uint64_t>(std::floor(0.9 * (uint64_t{1} << 40))));
}

TEST(WeightBudgetTest, FractionOutOfRangeNamesTheParameter) {
  for (double f : {0.0, -0.5, 1.0000001, std::nan("")}) {
    Result<WeightBudget> b = SolveWeightBudget(1000, f, 0.1, 0, 0);
    ASSERT_FALSE(b.ok()) << f;
    EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(b.status().message().rfind("fraction", 0), 0u) << b.status().message();
  }
}

TEST(WeightBudgetTest, WiggleOutOfRangeNamesTheParameter) {
  for (double w : {1.0, -0.1, 2.0, std::nan("")}) {
    Result<WeightBudget> b = SolveWeightBudget(1000, 1.0, w, 0, 0);
    ASSERT_FALSE(b.ok()) << w;
    EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(b.status().message().rfind("wiggle", 0), 0u) << b.status().message();
  }
  EXPECT_TRUE(SolveWeightBudget(1000, 1.0, 0.0, 0, 0).ok());
}

}  // namespace
}  // namespace arbiter
