// arbiter/base/thread_annotations.h — clang thread-safety analysis macros.
//
// Expand to clang's capability attributes when compiling with clang (the CI's
// -Wthread-safety build checks them) and to nothing elsewhere. See
// https://clang.llvm.org/docs/ThreadSafetyAnalysis.html.
#pragma once

#if defined(__clang__)
#define ARBITER_TSA_(x) __attribute__((x))
#else
#define ARBITER_TSA_(x)
#endif

#define CAPABILITY(x) ARBITER_TSA_(capability(x))
#define SCOPED_CAPABILITY ARBITER_TSA_(scoped_lockable)
#define GUARDED_BY(x) ARBITER_TSA_(guarded_by(x))
#define PT_GUARDED_BY(x) ARBITER_TSA_(pt_guarded_by(x))
#define ACQUIRED_BEFORE(...) ARBITER_TSA_(acquired_before(__VA_ARGS__))
#define ACQUIRED_AFTER(...) ARBITER_TSA_(acquired_after(__VA_ARGS__))
#define REQUIRES(...) ARBITER_TSA_(requires_capability(__VA_ARGS__))
#define REQUIRES_SHARED(...) ARBITER_TSA_(requires_shared_capability(__VA_ARGS__))
#define ACQUIRE(...) ARBITER_TSA_(acquire_capability(__VA_ARGS__))
#define ACQUIRE_SHARED(...) ARBITER_TSA_(acquire_shared_capability(__VA_ARGS__))
#define RELEASE(...) ARBITER_TSA_(release_capability(__VA_ARGS__))
#define RELEASE_SHARED(...) ARBITER_TSA_(release_shared_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) ARBITER_TSA_(try_acquire_capability(__VA_ARGS__))
#define EXCLUDES(...) ARBITER_TSA_(locks_excluded(__VA_ARGS__))
#define ASSERT_CAPABILITY(x) ARBITER_TSA_(assert_capability(x))
#define RETURN_CAPABILITY(x) ARBITER_TSA_(lock_returned(x))
#define NO_THREAD_SAFETY_ANALYSIS ARBITER_TSA_(no_thread_safety_analysis)
