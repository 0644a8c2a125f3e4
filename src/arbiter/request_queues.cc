// MemoryArbiter, request queues: Request() appends to the FIFO of its
// resident key ("<capability>::<model_key>"); one worker thread per key
// (started by the key's first request) runs acquire → run → capability_run
// event → release, one item at a time. Keys run side by side, so two speech
// models of one capability synthesize concurrently while each runs one
// request at a time (backends are thread-compatible per loaded instance).
//
// Note [Bounded queues]
// A registration's queue_max (or queue_max_for the key) bounds the items
// *waiting* in a key's queue; the running one does not count. Request()
// first drops waiting items whose stop was requested (their futures get
// kCancelled at once: a client that left frees its place), then refuses the
// new item with kResourceExhausted / kQueueFull when the queue is still
// full. The bound is read once, when the key's queue is created.
//
// Shutdown closes the queues (CloseQueues) and fails what is still queued.
#include <exception>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "internal/arbiter_impl.h"

namespace arbiter {
namespace arbiter_internal {
namespace {

Status ShuttingDown(Capability capability, const std::string& model_key) {
  return UnavailableError(fmt::format("arbiter is shutting down; cannot acquire {}",
                                      ResidentKey(capability, model_key)))
      .WithReason(ErrorReason::kShuttingDown);
}

Status CancelledBeforeRun(Capability capability, const std::string& model_key) {
  return CancelledError(fmt::format("request for {} was cancelled before it ran",
                                    ResidentKey(capability, model_key)))
      .WithReason(ErrorReason::kCancelled);
}

}  // namespace

std::future<Result<std::any>> MemoryArbiterImpl::Request(Capability capability,
                                                         std::string model_key, std::any payload,
                                                         std::stop_token stop) {
  Queue::Item item{std::move(payload), std::move(stop), {}};
  std::future<Result<std::any>> f = item.promise.get_future();
  size_t queue_max = 0;
  {
    MutexLock l(&mu_);
    if (const Registration* reg = regs_[Index(capability)].get()) {
      queue_max = reg->reg.queue_max;
      if (reg->reg.queue_max_for) {
        if (std::optional<size_t> m = reg->reg.queue_max_for(model_key)) queue_max = *m;
      }
    }
  }
  MutexLock l(&queue_mu_);
  if (queues_closed_) {
    item.promise.set_value(ShuttingDown(capability, model_key));
    return f;
  }
  std::string key = ResidentKey(capability, model_key);
  std::unique_ptr<Queue>& q = queues_[key];
  if (!q) {
    q = std::make_unique<Queue>(&queue_mu_, capability, std::move(model_key));
    Queue* raw = q.get();
    q->worker = std::thread([this, raw] { QueueWorker(raw); });
  }
  // Note [Bounded queues].
  for (auto it = q->items.begin(); it != q->items.end();) {
    if (it->stop.stop_requested()) {
      it->promise.set_value(CancelledBeforeRun(capability, q->model_key));
      it = q->items.erase(it);
    } else {
      ++it;
    }
  }
  if (queue_max > 0 && q->items.size() >= queue_max) {
    q->rejections++;
    item.promise.set_value(
        ResourceExhaustedError(fmt::format("{} has {} requests waiting (its queue limit); "
                                           "retry later",
                                           key, q->items.size()))
            .WithReason(ErrorReason::kQueueFull));
    return f;
  }
  q->items.push_back(std::move(item));
  q->cv.Signal();
  return f;
}

void MemoryArbiterImpl::QueueWorker(Queue* q) {
  const Capability capability = q->capability;
  for (;;) {
    Queue::Item item;
    {
      MutexLock l(&queue_mu_);
      q->running = false;
      while (q->items.empty() && !queues_closed_) q->cv.Wait();
      if (queues_closed_) {
        for (Queue::Item& rest : q->items) {
          rest.promise.set_value(ShuttingDown(capability, q->model_key));
        }
        q->items.clear();
        return;
      }
      item = std::move(q->items.front());
      q->items.pop_front();
      if (!item.stop.stop_requested()) {
        q->running = true;
        q->runs++;
      }
    }
    if (item.stop.stop_requested()) {
      item.promise.set_value(CancelledBeforeRun(capability, q->model_key));
      continue;
    }
    Result<ArbiterHandle> h = Acquire(capability, q->model_key,
                                      Deadline(std::chrono::milliseconds(
                                          options_.request_acquire_timeout_ms)));
    if (!h.ok()) {
      item.promise.set_value(h.status());
      continue;
    }
    const Registration* reg;
    {
      MutexLock l(&mu_);
      reg = regs_[Index(capability)].get();
    }
    Result<std::any> result = FailedPreconditionError(
        fmt::format("capability \"{}\" has no run function", CapabilityName(capability)));
    const int64_t t0 = clock_->NowNs();
    if (reg->reg.run) {
      try {
        result = reg->reg.run(*h, item.payload);
      } catch (const std::exception& ex) {
        result = InternalError(fmt::format("run threw an exception: {}", ex.what()));
      } catch (...) {
        result = InternalError("run threw an unknown exception");
      }
    }
    ArbiterEvent ev;
    ev.type = ArbiterEventType::kCapabilityRun;
    ev.capability = capability;
    ev.model_key = q->model_key;
    ev.run_ms = static_cast<double>(clock_->NowNs() - t0) / 1e6;
    ev.at_ms = clock_->NowMs();
    h->Release();
    Emit(ev);
    item.promise.set_value(std::move(result));
  }
}

void MemoryArbiterImpl::AddQueueStats(ArbiterStats* stats) const {
  MutexLock l(&queue_mu_);
  for (ModelStats& m : stats->models) {
    auto it = queues_.find(m.resident_key);
    if (it == queues_.end()) continue;
    const Queue& q = *it->second;
    m.queued = static_cast<int>(q.items.size());
    m.running = q.running;
    m.runs = q.runs;
    m.queue_rejections = q.rejections;
  }
}

void MemoryArbiterImpl::CloseQueues() {
  std::vector<std::thread> workers;
  {
    MutexLock l(&queue_mu_);
    queues_closed_ = true;
    for (auto& [key, q] : queues_) {
      q->cv.SignalAll();
      if (q->worker.joinable()) workers.push_back(std::move(q->worker));
    }
  }
  for (std::thread& t : workers) t.join();
}

}  // namespace arbiter_internal
}  // namespace arbiter
