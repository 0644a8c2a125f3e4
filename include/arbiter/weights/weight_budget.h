// arbiter/weights/weight_budget.h — how much of a device arena the weight
// cache may use (the reference weight runtime's weight_budget; the table
// below is docs/weights.md acceptance 10).
//
// The arena is split into a wiggle reserve (allocator slack, never handed
// out), the scratch the models need to run (activations, measured by the
// scratch probe as `max_scratch`), and the weight pool. Device-pinned models
// live in the pool outside the LRU; what remains is the on-demand budget the
// WeightCache's LRU works within:
//
//   scratch_ceiling    = floor((1 − wiggle) × arena)
//   weight_pool        = max(0, min(floor(fraction × arena),
//                                   scratch_ceiling − max_scratch))
//   on_demand_budget   = clamp(weight_pool − pinned, 0, weight_pool)
//   pinned_over_commit = pinned > weight_pool
//
// Example (arena 1000 B, wiggle 0.1): fraction 1.0, max_scratch 300,
// pinned 200 → scratch_ceiling 900, weight_pool 600, on_demand_budget 400,
// no over-commit.
//
// Over-commit is reported, not refused: pinned models still load (they must,
// to serve), and the caller logs it.
//
// Thread safety: a pure function and a value type.
#pragma once

#include <cstdint>

#include "arbiter/base/status.h"

namespace arbiter {

// Defaults of the reference weight runtime.
inline constexpr double kDefaultWeightFraction = 1.0;  // of the arena
inline constexpr double kDefaultWeightWiggle = 0.1;    // of the arena

// The solution. All sizes in bytes.
struct WeightBudget {
  size_t scratch_ceiling_bytes = 0;    // arena minus the wiggle reserve
  size_t weight_pool_bytes = 0;        // bytes for all weights, pinned included
  size_t on_demand_budget_bytes = 0;   // bytes for the LRU (pool minus pinned)
  bool pinned_over_commit = false; // pinned weights alone exceed the pool

  friend bool operator==(const WeightBudget&, const WeightBudget&) = default;
};

// Solves the formula above. `arena_bytes`: the device arena; `fraction`: the
// share of the arena weights may take, in (0, 1]; `wiggle`: the share kept
// free, in [0, 1); `max_scratch_bytes`: scratch the models need;
// `pinned_bytes`: Σ weight bytes of device-pinned models. The products are
// computed in double, as the reference does (so 0.7 × 1000 B gives 700, not
// 699); every result is ≤ arena_bytes.
// Errors: kInvalidArgument naming the parameter ("fraction", "wiggle") when
// it is out of range or not a number; nothing else fails.
Result<WeightBudget> SolveWeightBudget(size_t arena_bytes, double fraction, double wiggle,
                                       size_t max_scratch_bytes, size_t pinned_bytes);

}  // namespace arbiter
