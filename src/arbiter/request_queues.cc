// MemoryArbiter, request queues: Request() appends to its capability's FIFO;
// one worker thread per capability (started by the first request) runs
// acquire → run → capability_run event → release, one item at a time.
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

std::future<Result<std::any>> MemoryArbiterImpl::Request(Capability capability,
                                                         std::string model_key, std::any payload,
                                                         std::stop_token stop) {
  Queue::Item item{std::move(model_key), std::move(payload), std::move(stop), {}};
  std::future<Result<std::any>> f = item.promise.get_future();
  MutexLock l(&queue_mu_);
  if (queues_closed_) {
    item.promise.set_value(UnavailableError(fmt::format(
        "arbiter is shutting down; cannot acquire {}", CapabilityName(capability))));
    return f;
  }
  auto& q = queues_[Index(capability)];
  if (!q) {
    q = std::make_unique<Queue>(&queue_mu_);
    Queue* raw = q.get();
    q->worker = std::thread([this, raw, capability] { QueueWorker(raw, capability); });
  }
  q->items.push_back(std::move(item));
  q->cv.Signal();
  return f;
}

void MemoryArbiterImpl::QueueWorker(Queue* q, Capability capability) {
  for (;;) {
    Queue::Item item;
    {
      MutexLock l(&queue_mu_);
      while (q->items.empty() && !queues_closed_) q->cv.Wait();
      if (queues_closed_) {
        for (Queue::Item& rest : q->items) {
          rest.promise.set_value(UnavailableError(fmt::format(
              "arbiter is shutting down; cannot acquire {}", CapabilityName(capability))));
        }
        q->items.clear();
        return;
      }
      item = std::move(q->items.front());
      q->items.pop_front();
    }
    if (item.stop.stop_requested()) {
      item.promise.set_value(CancelledError(fmt::format(
          "request for {} was cancelled before it ran", ResidentKey(capability, item.model_key))));
      continue;
    }
    Result<ArbiterHandle> h = Acquire(capability, item.model_key,
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
    ev.model_key = item.model_key;
    ev.run_ms = static_cast<double>(clock_->NowNs() - t0) / 1e6;
    ev.at_ms = clock_->NowMs();
    h->Release();
    Emit(ev);
    item.promise.set_value(std::move(result));
  }
}

void MemoryArbiterImpl::CloseQueues() {
  std::vector<std::thread> workers;
  {
    MutexLock l(&queue_mu_);
    queues_closed_ = true;
    for (auto& q : queues_) {
      if (q) {
        q->cv.SignalAll();
        if (q->worker.joinable()) workers.push_back(std::move(q->worker));
      }
    }
  }
  for (std::thread& t : workers) t.join();
}

}  // namespace arbiter_internal
}  // namespace arbiter
