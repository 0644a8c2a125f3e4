// server/internal/http/worker_pool.cc — the transport's worker pool
// (worker_pool.h).
#include "server/internal/http/worker_pool.h"

#include <utility>

namespace arbiter::http {

void WorkerPool::Start() {
  MutexLock l(&mu_);
  if (started_ || stopped_) return;
  started_ = true;
  for (int i = 0; i < n_threads_; ++i) threads_.emplace_back([this] { Loop(); });
}

bool WorkerPool::TrySubmit(Job job) {
  MutexLock l(&mu_);
  if (stopped_ || static_cast<int>(queue_.size()) >= queue_max_ + idle_) return false;
  queue_.push_back(std::move(job));
  queued_.store(static_cast<int64_t>(queue_.size()));
  wake_.Signal();
  return true;
}

void WorkerPool::Shutdown() {
  std::deque<Job> dropped;
  std::vector<std::thread> threads;
  {
    MutexLock l(&mu_);
    stopped_ = true;
    dropped.swap(queue_);
    queued_.store(0);
    threads.swap(threads_);
    wake_.SignalAll();
  }
  for (Job& job : dropped) {
    if (job.drop) job.drop();
  }
  for (std::thread& t : threads) t.join();
}

void WorkerPool::Loop() {
  while (true) {
    Job job;
    {
      MutexLock l(&mu_);
      ++idle_;
      while (!stopped_ && queue_.empty()) wake_.Wait();
      --idle_;
      if (queue_.empty()) return;  // stopped
      job = std::move(queue_.front());
      queue_.pop_front();
      queued_.store(static_cast<int64_t>(queue_.size()));
      busy_.fetch_add(1);
    }
    job.run();
    job = Job();  // destroy captures outside the lock, before counting idle
    busy_.fetch_sub(1);
  }
}

}  // namespace arbiter::http
