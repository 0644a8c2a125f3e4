// arbiter/server/shutdown_deadline.h — a bound on how long stopping takes.
//
// Stopping `arbiter serve` (SIGINT/SIGTERM) cancels every request and then
// waits for their handlers and for Runtime::Shutdown(). A handler stuck in
// a backend call that does not look at its cancellation would keep the
// process alive for as long as the call lasts. A ShutdownDeadline, started
// when the stop begins, ends that wait: if it is not disarmed within
// `timeout` ([server] shutdown_timeout_s), it logs what it abandons — the
// running requests (Server::DescribeRunning) and the models still held or
// queued (Runtime::Status) — as errors, and calls `expire`, by default
// flushing the logs and leaving with std::_Exit(1) (no destructors: the
// threads still inside a backend call would crash them).
//
// Usage (tools/arbiter/main.cc):
//   std::optional<ShutdownDeadline> deadline;
//   ... on the signal: deadline.emplace(&server, runtime,
//                                      std::chrono::seconds(shutdown_timeout_s));
//   server.Stop();
//   deadline->StopReadingRuntime();
//   runtime->Shutdown();
//   deadline->Disarm();
//
// The report is gathered on a helper thread and waited for at most
// kShutdownReportTimeout (a lock held by the stuck call must not keep the
// process alive either); a report that does not come in time is replaced
// by a line saying so.
//
// Thread safety: Disarm() may be called from any thread; the destructor
// disarms and joins the watching thread. `server` and `runtime` must
// outlive the object, and, when the deadline passes with an `expire` that
// returns (tests), the report's helper thread.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "arbiter/base/mutex.h"
#include "arbiter/runtime/runtime.h"
#include "arbiter/server/server.h"

namespace arbiter {

// The longest wait for the list of abandoned work, once the deadline passed.
inline constexpr std::chrono::milliseconds kShutdownReportTimeout{1000};

class ShutdownDeadline {
 public:
  // Called when the deadline passes, after the report was logged; the
  // report is its lines joined by '\n'. Empty: flush the logs, std::_Exit(1).
  using Expire = std::function<void(const std::string& report)>;

  // Starts counting `timeout` now. `runtime` may be null (no models listed).
  ShutdownDeadline(const Server* server, const Runtime* runtime, std::chrono::milliseconds timeout,
                   Expire expire = {});
  ~ShutdownDeadline();
  ShutdownDeadline(const ShutdownDeadline&) = delete;
  ShutdownDeadline& operator=(const ShutdownDeadline&) = delete;

  // The shutdown finished in time: nothing is logged, `expire` is not
  // called. Idempotent; no effect once the deadline has passed.
  void Disarm();

  // Call before Runtime::Shutdown(), which frees what Status() reads: from
  // then on the report says the runtime was shutting down instead of
  // listing its models. Waits for a read of the runtime in progress.
  void StopReadingRuntime();

  // The runtime the report may read (null once StopReadingRuntime() ran);
  // shared with the report's helper thread, which may outlive this object.
  struct RuntimeRef {
    Mutex mu;
    const Runtime* runtime GUARDED_BY(mu) = nullptr;
    bool shutting_down GUARDED_BY(mu) = false;
  };

 private:
  void Watch();

  const Server* const server_;
  const std::shared_ptr<RuntimeRef> runtime_;
  const std::chrono::milliseconds timeout_;
  const Expire expire_;
  Mutex mu_;
  CondVar cv_{&mu_};
  bool disarmed_ GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: started once the fields above are set
};

}  // namespace arbiter
