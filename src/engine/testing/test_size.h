// Test support: how large the engine's randomized and brute-force tests
// run. An optimized build without a sanitizer runs them at full size; a
// Debug or sanitizer build (CI runs the engine tests under ASan and TSan)
// runs fewer and smaller cases, which would otherwise take minutes there.
#pragma once

#include "base/testing/sanitizers.h"

namespace arbiter::testing {

#ifdef NDEBUG
inline constexpr bool kFullSizeTests = !kSanitized;
#else
inline constexpr bool kFullSizeTests = false;
#endif

}  // namespace arbiter::testing
