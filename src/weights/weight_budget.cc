// weights/weight_budget.cc — the weight_budget formula (see the header).
#include "arbiter/weights/weight_budget.h"

#include <algorithm>
#include <cmath>
#include <string>

#include <fmt/format.h>

namespace arbiter {
namespace {

// floor(share × arena) in double arithmetic, as the reference computes it
// (Float64): 0.7 × 1000 rounds to 700.0 before the floor, where a wider type
// would see 699.99999999999995 and floor to 699. Clamped to [0, arena].
uint64_t FloorShare(double share, uint64_t arena_bytes) {
  const double v = std::floor(share * static_cast<double>(arena_bytes));
  if (v <= 0) return 0;
  if (v >= static_cast<double>(arena_bytes)) return arena_bytes;
  return static_cast<uint64_t>(v);
}

}  // namespace

Result<WeightBudget> SolveWeightBudget(size_t arena_bytes, double fraction, double wiggle,
                                       size_t max_scratch_bytes, size_t pinned_bytes) {
  if (!(fraction > 0.0 && fraction <= 1.0)) {  // also refuses NaN
    return InvalidArgumentError(
        fmt::format("fraction must be in (0, 1] (the share of the arena weights may use); got {}",
                    fraction));
  }
  if (!(wiggle >= 0.0 && wiggle < 1.0)) {
    return InvalidArgumentError(fmt::format(
        "wiggle must be in [0, 1) (the share of the arena kept free); got {}", wiggle));
  }
  WeightBudget b;
  b.scratch_ceiling_bytes = FloorShare(1.0 - wiggle, arena_bytes);
  const uint64_t by_fraction = FloorShare(fraction, arena_bytes);
  const uint64_t by_scratch =
      b.scratch_ceiling_bytes > max_scratch_bytes ? b.scratch_ceiling_bytes - max_scratch_bytes : 0;
  b.weight_pool_bytes = std::min(by_fraction, by_scratch);
  b.on_demand_budget_bytes = b.weight_pool_bytes > pinned_bytes ? b.weight_pool_bytes - pinned_bytes : 0;
  b.pinned_over_commit = pinned_bytes > b.weight_pool_bytes;
  return b;
}

}  // namespace arbiter
