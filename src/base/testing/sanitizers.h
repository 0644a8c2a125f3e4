// Test support: whether this build runs under AddressSanitizer or
// ThreadSanitizer. GCC defines __SANITIZE_ADDRESS__ / __SANITIZE_THREAD__;
// clang (the sanitizer build `make test-asan` uses) answers through
// __has_feature instead, so both are asked here, once.
//
// Under a sanitizer the process's resident memory is the sanitizer's too
// (shadow memory, ASan's quarantine of freed blocks), so tests that hold RSS
// against a bound skip there; LeakSanitizer checks for leaks instead.
#pragma once

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define ARBITER_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define ARBITER_SANITIZED 1
#endif
#endif

namespace arbiter::testing {

#ifdef ARBITER_SANITIZED
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

}  // namespace arbiter::testing
