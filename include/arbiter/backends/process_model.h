// arbiter/backends/process_model.h — external model servers run as child
// processes: the mechanism behind "external model servers as capabilities"
// (docs/architecture.md, the backends layer). A `[[models]]` entry with a
// `command` is a program (llama-server, a second arbiter, any
// OpenAI-compatible server) that arbiter starts on a free loopback port,
// waits for, measures and stops; the runtime charges what MeasureRssBytes()
// reports to the ledger and proxies the model's routes to port().
//
// Two classes:
//   ProcessSupervisor  owns the one long-lived thread that forks every child
//                      (so PR_SET_PDEATHSIG, which fires when the *thread*
//                      that forked dies, holds for the child's whole life),
//                      drains their output and reaps them; keeps a record of
//                      each child under state_dir/children/ so the next
//                      arbiter can stop the ones a killed arbiter left.
//   ProcessModel       one running child: port, pid, RSS of its process
//                      group, exit status, Stop().
//
// Usage:
//   ARBITER_ASSIGN_OR_RETURN(auto sup, ProcessSupervisor::Create(state_dir + "/process"));
//   for (const std::string& line : sup->ReapStale()) spdlog::warn("{}", line);
//   ProcessModelSpec spec;
//   spec.name = "qwen";
//   spec.command = {"/opt/llama/llama-server", "--port", "{port}", "-m", "/m/qwen.gguf"};
//   ARBITER_ASSIGN_OR_RETURN(std::unique_ptr<ProcessModel> m, sup->Start(spec, cancel));
//   ... proxy to 127.0.0.1:m->port(); charge m->MeasureRssBytes() every second ...
//   m.reset();  // SIGTERM to its process group, grace, SIGKILL
//
// What survives a SIGKILL of arbiter: each child dies with the supervisor
// thread (PR_SET_PDEATHSIG = SIGKILL). Grandchildren a child forked do not
// (their parent is the child); they keep the child's process group, and
// ReapStale() at the next start finds and stops that group from its record.
//
// Thread safety: ProcessSupervisor and ProcessModel are thread-safe. A
// ProcessModel may outlive its supervisor (the supervisor's destructor has
// stopped it by then; its methods then report it exited).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "arbiter/base/cancel.h"
#include "arbiter/base/status.h"

namespace arbiter {

// How to run one external model server.
struct ProcessModelSpec {
  std::string name;                  // model name (logs, the child record)
  std::vector<std::string> command;  // argv; every "{port}" in any element becomes the port
  std::string health = "/health";    // GET path polled until it answers 200
  int64_t ready_timeout_ms = 60000;  // longest wait for the first 200 from `health`
  int64_t stop_grace_ms = 5000;      // SIGTERM → wait this long → SIGKILL
  // NAME=value pairs added to (or replacing in) arbiter's environment.
  std::vector<std::pair<std::string, std::string>> env;
};

// How a child ended.
struct ProcessExit {
  int exit_code = -1;       // its exit code, or -1 when a signal ended it
  int signal = 0;           // the signal that ended it, or 0
  std::string stderr_tail;  // the last ≤ 4 KiB of its output (stdout and stderr share one pipe)
};

// "exited with code 3" / "killed by signal 9 (Killed)".
std::string DescribeExit(const ProcessExit& e);

// The record of one child, kept as state_dir/children/<pid>.rec while it
// runs: text lines "pid=…", "pgid=…", "start_time=…" (field 22 of
// /proc/<pid>/stat: clock ticks after boot, which tells a reused pid
// apart), "name=…", "command=…" (argv joined by spaces, for logs only).
struct ChildRecord {
  pid_t pid = 0;
  pid_t pgid = 0;
  uint64_t start_time = 0;
  std::string name;
  std::string command;
};
// Writes `rec` under state_dir/children/ (atomically: temp file + rename).
Status WriteChildRecord(const std::string& state_dir, const ChildRecord& rec);
// Field 22 of /proc/<pid>/stat; nullopt when the process does not exist.
std::optional<uint64_t> ProcStartTime(pid_t pid);

class ProcessModel;

// Starts, watches and stops external model servers (see the file comment).
class ProcessSupervisor {
 public:
  // state_dir: where children/ lives (created with mode 0700). Starts the
  // spawner thread. Errors: the directory cannot be created (ErrnoToStatus).
  static Result<std::unique_ptr<ProcessSupervisor>> Create(std::string state_dir);
  // Stops every live child (SIGTERM to each group at once, each one's grace,
  // SIGKILL), then joins the spawner thread.
  ~ProcessSupervisor();
  ProcessSupervisor(const ProcessSupervisor&) = delete;
  ProcessSupervisor& operator=(const ProcessSupervisor&) = delete;

  // Stops what a previous arbiter, killed before it could stop its
  // children, left running: for each record in children/, the process group
  // is stopped (SIGTERM, ≤ grace_ms, SIGKILL) when its leader still runs
  // with the recorded start time, or when the leader is gone but processes
  // of the group remain (a group id is not reused while it has members). A
  // record whose pid now belongs to another process (start time differs) is
  // removed without signalling anything. Every record is removed. Returns
  // one line per record, for logs. Call before the first Start().
  std::vector<std::string> ReapStale(int64_t grace_ms = 2000);

  // Picks a free loopback port, spawns spec.command with "{port}" replaced,
  // and polls GET http://127.0.0.1:<port><health> every 100 ms until it
  // answers 200 (≤ ready_timeout_ms). On any failure the child is stopped.
  // Errors:
  //   kInvalidArgument   empty command;
  //   kNotFound          command[0] is not an executable file (not on PATH,
  //                      missing, not executable, or exec refused it);
  //   kUnavailable       the child exited before it was healthy (the message
  //                      has its exit status and output tail);
  //   kDeadlineExceeded  not healthy within ready_timeout_ms;
  //   kCancelled         `cancelled` fired while waiting;
  //   kInternal          fork/pipe failed.
  // Blocks the calling thread (not the spawner) for the wait.
  Result<std::unique_ptr<ProcessModel>> Start(const ProcessModelSpec& spec,
                                              const Cancellation& cancelled = {});

  struct Impl;

 private:
  explicit ProcessSupervisor(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

// One running child started by ProcessSupervisor::Start. Destruction =
// Stop(). Thread-safe.
class ProcessModel {
 public:
  struct Child;
  ProcessModel(std::shared_ptr<ProcessSupervisor::Impl> sup, std::shared_ptr<Child> child);
  ~ProcessModel();
  ProcessModel(const ProcessModel&) = delete;
  ProcessModel& operator=(const ProcessModel&) = delete;

  int port() const;
  pid_t pid() const;  // also its process group id
  const ProcessModelSpec& spec() const;  // with "{port}" replaced in command

  // Resident memory of the child and everything in its process group, in
  // bytes: Σ RssAnon + RssFile + RssShmem of /proc/<p>/status over every p
  // whose /proc/<p>/stat pgrp is pid(). 0 once the group is gone. Costs one
  // scan of /proc (a few ms on a busy machine): call it about once a second.
  uint64_t MeasureRssBytes() const;
  // False once the child (the group leader) has exited and been reaped
  // (the supervisor reaps every ~50 ms). A child that exits without Stop()
  // crashed: the supervisor logs its status and output tail, SIGKILLs what
  // remains of its process group and removes its record; the caller marks
  // the model failed and may Start() it again.
  bool alive() const;
  // Once exited: its status and output tail; nullopt while it runs.
  std::optional<ProcessExit> exit() const;
  // The last ≤ 4 KiB of its output so far.
  std::string output_tail() const;

  // SIGTERM to the process group, waits ≤ stop_grace_ms for the group to
  // empty, SIGKILLs what remains, waits for the reap, removes the child's
  // record. Idempotent; a concurrent second call waits for the first.
  void Stop();

 private:
  friend class ProcessSupervisor;
  std::shared_ptr<ProcessSupervisor::Impl> sup_;
  std::shared_ptr<Child> child_;
};

}  // namespace arbiter
