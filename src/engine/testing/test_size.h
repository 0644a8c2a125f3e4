// Test support: how large the engine's randomized and brute-force tests
// run. An optimized build without a sanitizer runs them at full size; a
// Debug or sanitizer build (CI runs the engine tests under ASan and TSan)
// runs fewer and smaller cases, which would otherwise take minutes there.
#pragma once

namespace arbiter::testing {

#if defined(NDEBUG) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
inline constexpr bool kFullSizeTests = true;
#else
inline constexpr bool kFullSizeTests = false;
#endif

}  // namespace arbiter::testing
