// The bound on stopping (arbiter/server/shutdown_deadline.h).
//
// Note [Bounded shutdown]
// Every request is cancelled when the server stops, and the work below the
// routes checks its cancellation between steps (tokens, speech pieces,
// audio frames), so a stop normally takes one step of each running
// request. What it cannot bound is one step that never ends: a backend
// call that ignores cancellation, or a load waiting on something outside
// the process. Joining such a thread would hang the process forever (a
// supervisor then escalates to SIGKILL with nothing in the log), so past
// [server] shutdown_timeout_s the process leaves without joining: it says
// which requests and which models it abandons, flushes the log and
// _Exit()s. Nothing is lost that a crash would not lose (Note [Runtime
// shutdown]: KV files are written atomically, shared weight regions are
// reused by the next start, process models die with their parent).
#include "arbiter/server/shutdown_deadline.h"

#include <cstdio>
#include <cstdlib>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace arbiter {
namespace {

// The models a stop is waiting for: held, running, queued or loading.
std::vector<std::string> DescribeBusyModels(const Runtime& runtime) {
  std::vector<std::string> out;
  for (const ModelStats& m : runtime.Status().arbiter.models) {
    if (m.refcount == 0 && m.queued == 0 && !m.running && m.state != ModelState::kLoading) {
      continue;
    }
    std::string what = fmt::format("model \"{}\" ({}): {}", m.name, CapabilityName(m.capability),
                                   ModelStateName(m.state));
    if (m.refcount > 0) what += fmt::format(", {} holder(s)", m.refcount);
    if (m.running) what += ", a run in progress";
    if (m.queued > 0) what += fmt::format(", {} run(s) queued", m.queued);
    out.push_back(std::move(what));
  }
  return out;
}

// The lines of the report, from a helper thread, waited for at most
// kShutdownReportTimeout.
std::vector<std::string> GatherReport(const Server* server,
                                      std::shared_ptr<ShutdownDeadline::RuntimeRef> runtime) {
  struct Box {
    Mutex mu;
    CondVar cv{&mu};
    bool done GUARDED_BY(mu) = false;
    std::vector<std::string> requests GUARDED_BY(mu), models GUARDED_BY(mu);
  };
  auto box = std::make_shared<Box>();
  std::thread([box, server, runtime] {
    std::vector<std::string> requests = server->DescribeRunning();
    std::vector<std::string> models;
    {
      MutexLock r(&runtime->mu);
      if (runtime->runtime != nullptr) models = DescribeBusyModels(*runtime->runtime);
      if (runtime->shutting_down) {
        models.push_back("the runtime, which was shutting down (freeing its models)");
      }
    }
    MutexLock l(&box->mu);
    box->requests = std::move(requests);
    box->models = std::move(models);
    box->done = true;
    box->cv.SignalAll();
  }).detach();
  const auto until = std::chrono::steady_clock::now() + kShutdownReportTimeout;
  MutexLock l(&box->mu);
  while (!box->done && box->cv.WaitUntil(until)) {
  }
  if (!box->done) {
    return {fmt::format("the running work could not be listed within {} ms",
                        kShutdownReportTimeout.count())};
  }
  std::vector<std::string> lines;
  if (box->requests.empty()) lines.push_back("no request is running");
  for (const std::string& r : box->requests) lines.push_back("abandoned request: " + r);
  for (const std::string& m : box->models) lines.push_back("abandoned " + m);
  return lines;
}

}  // namespace

ShutdownDeadline::ShutdownDeadline(const Server* server, const Runtime* runtime,
                                   std::chrono::milliseconds timeout, Expire expire)
    : server_(server),
      runtime_(std::make_shared<RuntimeRef>()),
      timeout_(timeout),
      expire_(std::move(expire)) {
  {
    MutexLock l(&runtime_->mu);
    runtime_->runtime = runtime;
  }
  thread_ = std::thread([this] { Watch(); });
}

void ShutdownDeadline::StopReadingRuntime() {
  MutexLock l(&runtime_->mu);
  runtime_->runtime = nullptr;
  runtime_->shutting_down = true;
}

ShutdownDeadline::~ShutdownDeadline() {
  Disarm();
  if (thread_.joinable()) thread_.join();
}

void ShutdownDeadline::Disarm() {
  MutexLock l(&mu_);
  disarmed_ = true;
  cv_.SignalAll();
}

void ShutdownDeadline::Watch() {
  {
    const auto until = std::chrono::steady_clock::now() + timeout_;
    MutexLock l(&mu_);
    while (!disarmed_ && std::chrono::steady_clock::now() < until) cv_.WaitUntil(until);
    if (disarmed_) return;
  }
  // Note [Bounded shutdown].
  std::vector<std::string> lines = GatherReport(server_, runtime_);
  const double seconds = std::chrono::duration<double>(timeout_).count();
  lines.insert(lines.begin(),
               fmt::format("shutdown did not finish within {:g} s ([server] shutdown_timeout_s); "
                           "abandoning the work still running and exiting with status 1",
                           seconds));
  std::string report;
  for (const std::string& line : lines) {
    spdlog::error("{}", line);
    report += (report.empty() ? "" : "\n") + line;
  }
  if (expire_) {
    expire_(report);
    return;
  }
  spdlog::default_logger()->flush();
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(1);
}

}  // namespace arbiter
