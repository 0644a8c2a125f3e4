// server/internal/http/worker_pool.h — the transport's worker pool
// (Dispatch::kWorker in http_server.h; Note [Event loop and workers]): a
// fixed set of threads running jobs from a bounded FIFO.
//
// A job waits only when every worker is busy; at most `queue_max` jobs wait
// beyond the idle workers, and TrySubmit() refuses the next (the transport
// answers 503). Shutdown() hands each queued job to its `drop` instead of
// running it, lets running jobs finish and joins the threads.
//
// Thread safety: thread-safe. REQUIRES: Shutdown() (and the destructor) are
// not called from a job.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "arbiter/base/mutex.h"

namespace arbiter::http {

class WorkerPool {
 public:
  struct Job {
    std::function<void()> run;   // on a worker
    std::function<void()> drop;  // instead of run, when the pool shuts down first
  };

  WorkerPool(int threads, int queue_max) : n_threads_(threads), queue_max_(queue_max) {}
  ~WorkerPool() { Shutdown(); }
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Starts the threads. No-op once started or shut down.
  void Start() EXCLUDES(mu_);

  // False when `queue_max` jobs already wait beyond the idle workers, or
  // the pool is shut down.
  bool TrySubmit(Job job) EXCLUDES(mu_);

  // Drops the queued jobs (calling their `drop`), lets running jobs finish
  // and joins the threads. Idempotent.
  void Shutdown() EXCLUDES(mu_);

  int64_t busy() const { return busy_.load(); }    // jobs running now
  int64_t queued() const { return queued_.load(); }  // jobs waiting now

 private:
  void Loop() EXCLUDES(mu_);

  const int n_threads_;
  const int queue_max_;
  Mutex mu_;
  CondVar wake_{&mu_};
  std::deque<Job> queue_ GUARDED_BY(mu_);
  std::vector<std::thread> threads_ GUARDED_BY(mu_);
  int idle_ GUARDED_BY(mu_) = 0;  // workers waiting for a job
  bool started_ GUARDED_BY(mu_) = false;
  bool stopped_ GUARDED_BY(mu_) = false;
  std::atomic<int64_t> busy_{0};
  std::atomic<int64_t> queued_{0};
};

}  // namespace arbiter::http
