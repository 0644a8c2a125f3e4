#include "arbiter/base/status.h"

#include <gtest/gtest.h>

namespace arbiter {
namespace {

Result<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgumentError("odd: " + std::to_string(x));
  return x / 2;
}

Result<int> Quarter(int x) {
  ARBITER_ASSIGN_OR_RETURN(int h, Half(x));
  ARBITER_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

TEST(StatusTest, OkAndErrors) {
  EXPECT_TRUE(OkStatus().ok());
  Status s = NotFoundError("model \"x\"");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.ToString(), "NOT_FOUND: model \"x\"");
  EXPECT_EQ(s.WithPrefix("load").message(), "load: model \"x\"");
  EXPECT_EQ(OkStatus().WithPrefix("x").ToString(), "OK");
}

TEST(StatusTest, ResultPropagates) {
  EXPECT_EQ(*Quarter(8), 2);
  Result<int> r = Quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "odd: 3");
}

TEST(StatusTest, ReturnIfError) {
  auto f = [](bool fail) -> Status {
    ARBITER_RETURN_IF_ERROR(fail ? DataLossError("bad") : OkStatus());
    return OkStatus();
  };
  EXPECT_TRUE(f(false).ok());
  EXPECT_EQ(f(true).code(), StatusCode::kDataLoss);
}

TEST(StatusTest, ReasonIsKeptByPrefixAndCompared) {
  Status s = UnavailableError("refused", ErrorReason::kMemoryPressure);
  EXPECT_EQ(s.reason(), ErrorReason::kMemoryPressure);
  EXPECT_EQ(s.WithPrefix("model \"x\"").reason(), ErrorReason::kMemoryPressure);
  EXPECT_EQ(s.WithPrefix("p").message(), "p: refused");
  EXPECT_EQ(InternalError("x").reason(), ErrorReason::kNone);
  EXPECT_EQ(OkStatus().reason(), ErrorReason::kNone);
  EXPECT_EQ(OkStatus().WithReason(ErrorReason::kLoadFailed).reason(), ErrorReason::kNone);
  EXPECT_EQ(InternalError("x").WithReason(ErrorReason::kLoadFailed).reason(),
            ErrorReason::kLoadFailed);
  EXPECT_NE(s, UnavailableError("refused"));
  EXPECT_EQ(ErrorReasonName(ErrorReason::kMemoryPressure), "memory_pressure");
  EXPECT_EQ(ErrorReasonName(ErrorReason::kBudgetExceeded), "budget_exceeded");
}

}  // namespace
}  // namespace arbiter
