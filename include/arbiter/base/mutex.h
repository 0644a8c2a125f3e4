// arbiter/base/mutex.h — an annotated mutex, scoped lock and condition
// variable (leveldb port::Mutex style) so clang's -Wthread-safety can check
// every GUARDED_BY field (STYLE.md rule 5).
//
// Usage:
//   class Counter {
//    public:
//     void Add(int n) EXCLUDES(mu_) { MutexLock l(&mu_); total_ += n; }
//    private:
//     Mutex mu_;
//     int total_ GUARDED_BY(mu_) = 0;
//   };
//
// Thread safety: Mutex and CondVar are thread-safe by definition.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "arbiter/base/thread_annotations.h"

namespace arbiter {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  // Documents (and tells the analysis) that the caller holds the lock.
  void AssertHeld() ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds `mu` for the scope.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() RELEASE() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// A condition variable bound to one Mutex. Like leveldb's port::CondVar, its
// methods carry no thread-safety attribute: clang cannot name the caller's
// mutex through the private pointer, so "REQUIRES: mu held" is documented
// and checked by the std::mutex underneath.
class CondVar {
 public:
  explicit CondVar(Mutex* mu) : mu_(mu) {}
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  // REQUIRES: mu held. Atomically releases it, waits, reacquires.
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // REQUIRES: mu held. Returns false on timeout (deadline reached).
  bool WaitUntil(std::chrono::steady_clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mu_->mu_, std::adopt_lock);
    bool signalled = cv_.wait_until(lock, deadline) == std::cv_status::no_timeout;
    lock.release();
    return signalled;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  Mutex* const mu_;
  std::condition_variable cv_;
};

}  // namespace arbiter
