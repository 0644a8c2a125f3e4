// External model servers as child processes (backends/process_model.h).
//
// Note [One spawner thread]
// PR_SET_PDEATHSIG sends the child its signal when the *thread* that forked
// it exits, not the process. A child forked from a request's worker thread
// would be killed when that worker ends, so every fork happens on one
// thread the supervisor owns for its whole life (Impl::Loop). The same
// thread drains every child's output pipe into a 4 KiB ring and reaps its
// own children with waitpid(pid, WNOHANG) every ≤ 50 ms — never
// waitpid(-1), which would steal the exit status of children other code in
// the process started. Start() hands the thread a Job and waits for "forked
// and exec'd" (or the exec's errno, sent back over a CLOEXEC pipe: EOF on
// that pipe means the exec succeeded); the health wait then runs on the
// caller's thread.
//
// Note [Child states]
//   running  → (leader exits; the spawner reaps it)            → exited
//   running  → Stop(): stopping → SIGTERM group … SIGKILL group → exited, stop_done
// `exited` is set only by the spawner, after the reap; `stopping` and
// `stop_done` only by Stop(). A leader that exits while not stopping
// crashed: the spawner logs its status and output tail, SIGKILLs what is
// left of its process group (helpers it forked) and removes its record.
// Stop() waits for the group to be empty (leader reaped, no other member),
// which is what "stopped" means for the budget: nothing of it is resident.
//
// Note [Process group ids]
// Each child calls setpgid(0, 0), so its pid is its group id and every
// process it forks inherits the group. The kernel does not reuse a pid
// while it names a live process group, so signalling -pgid is safe while
// the leader is unreaped or any member remains; Stop() and ReapStale()
// check membership (a /proc scan) before each group signal sent after the
// leader may be gone.
#include "arbiter/backends/process_model.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <httplib.h>
#include <spdlog/spdlog.h>

#include "arbiter/base/fd.h"
#include "arbiter/base/log_safe.h"
#include "arbiter/base/mutex.h"

extern char** environ;

namespace arbiter {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr size_t kTailBytes = 4096;     // output kept per child
constexpr int kLoopPollMs = 50;         // the spawner's reap period
constexpr int kHealthPollMs = 100;      // Start()'s health poll period

struct ProcStat {
  char state = '?';
  pid_t pgrp = 0;
  uint64_t start_time = 0;
};

// /proc/<pid>/stat: "pid (comm) state ppid pgrp ... starttime(22) ...".
// comm may hold spaces and parentheses: parse after the last ')'.
std::optional<ProcStat> ReadProcStat(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string line;
  std::getline(in, line);
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream rest(line.substr(close + 1));
  ProcStat st;
  std::string skip;
  pid_t ppid = 0;
  rest >> st.state >> ppid >> st.pgrp;  // fields 3, 4, 5
  for (int field = 6; field < 22 && rest; ++field) rest >> skip;
  rest >> st.start_time;  // field 22
  if (!rest) return std::nullopt;
  return st;
}

// Live (not zombie) processes whose process group is `pgid`.
std::vector<pid_t> GroupMembers(pid_t pgid) {
  std::vector<pid_t> out;
  DIR* dir = opendir("/proc");
  if (dir == nullptr) return out;
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    std::optional<ProcStat> st = ReadProcStat(static_cast<pid_t>(pid));
    if (st && st->pgrp == pgid && st->state != 'Z' && st->state != 'X') {
      out.push_back(static_cast<pid_t>(pid));
    }
  }
  closedir(dir);
  return out;
}

// RssAnon + RssFile + RssShmem of /proc/<pid>/status, in bytes.
uint64_t ProcessRssBytes(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/status", static_cast<int>(pid));
  std::ifstream in(path);
  uint64_t kib = 0;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("RssAnon:", 0) == 0 || line.rfind("RssFile:", 0) == 0 ||
        line.rfind("RssShmem:", 0) == 0) {
      kib += std::strtoull(line.c_str() + line.find(':') + 1, nullptr, 10);
    }
  }
  return kib * 1024;
}

// A loopback TCP port nobody listens on right now; -1 on failure.
int PickFreePort() {
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return -1;
  socklen_t len = sizeof(addr);
  if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) return -1;
  return ntohs(addr.sin_port);
}

bool IsExecutableFile(const std::string& path) {
  struct stat st{};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

// command[0] as a path execve accepts: as given when it has a '/', else the
// first match on $PATH.
Result<std::string> ResolveExecutable(const std::string& name, const std::string& model) {
  if (name.find('/') != std::string::npos) {
    if (IsExecutableFile(name)) return name;
    return NotFoundError(fmt::format(
        "model \"{}\": command \"{}\" is not an executable file; fix `command` in its [[models]] entry",
        model, name));
  }
  const char* env_path = std::getenv("PATH");
  std::string dirs = env_path != nullptr ? env_path : "/usr/local/bin:/usr/bin:/bin";
  std::istringstream in(dirs);
  std::string dir;
  while (std::getline(in, dir, ':')) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (IsExecutableFile(candidate)) return candidate;
  }
  return NotFoundError(fmt::format(
      "model \"{}\": command \"{}\" was not found on PATH; give its full path in `command`",
      model, name));
}

std::string JoinCommand(const std::vector<std::string>& argv) {
  std::string out;
  for (const std::string& a : argv) {
    if (!out.empty()) out += ' ';
    out += a;
  }
  return out;
}

std::string RecordPath(const std::string& children_dir, pid_t pid) {
  return fmt::format("{}/{}.rec", children_dir, pid);
}

std::optional<ChildRecord> ReadChildRecord(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  ChildRecord rec;
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = line.substr(0, eq), value = line.substr(eq + 1);
    if (key == "pid") rec.pid = static_cast<pid_t>(std::strtol(value.c_str(), nullptr, 10));
    if (key == "pgid") rec.pgid = static_cast<pid_t>(std::strtol(value.c_str(), nullptr, 10));
    if (key == "start_time") rec.start_time = std::strtoull(value.c_str(), nullptr, 10);
    if (key == "name") rec.name = value;
    if (key == "command") rec.command = value;
  }
  if (rec.pid <= 0 || rec.pgid <= 0) return std::nullopt;
  return rec;
}

// SIGTERM to group `pgid` (if it has members), waits ≤ grace_ms for it to
// empty, SIGKILLs what remains and waits ≤ 5 s more. `done` tells whether
// the group counts as gone (the caller's own child must also be reaped).
// Returns true when SIGKILL was needed.
bool TerminateGroup(pid_t pgid, int64_t grace_ms, const std::function<bool()>& leader_gone,
                    const std::function<void(Clock::time_point)>& wait_until) {
  auto empty = [&] { return leader_gone() && GroupMembers(pgid).empty(); };
  if (empty()) return false;
  kill(-pgid, SIGTERM);
  const auto grace_end = Clock::now() + milliseconds(grace_ms);
  while (!empty()) {
    if (Clock::now() >= grace_end) break;
    wait_until(std::min(grace_end, Clock::now() + milliseconds(kLoopPollMs)));
  }
  if (empty()) return false;
  if (!GroupMembers(pgid).empty() || !leader_gone()) kill(-pgid, SIGKILL);
  const auto kill_end = Clock::now() + std::chrono::seconds(5);
  while (!empty() && Clock::now() < kill_end) {
    wait_until(Clock::now() + milliseconds(kLoopPollMs / 2));
  }
  return true;
}

// A child's output for our log: each of its lines indented by "  | " and
// escaped (LogSafe), so what the child printed — a prompt it echoed, say —
// can never read as a log line of ours.
std::string QuotedOutput(std::string_view tail) {
  std::string out;
  while (!tail.empty()) {
    const size_t nl = tail.find('\n');
    std::string_view line = tail.substr(0, nl);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    out += "\n  | ";
    out += LogSafe(line, kTailBytes);
    if (nl == std::string_view::npos) break;
    tail.remove_prefix(nl + 1);
  }
  return out;
}

}  // namespace

std::string DescribeExit(const ProcessExit& e) {
  if (e.signal != 0) return fmt::format("killed by signal {} ({})", e.signal, strsignal(e.signal));
  return fmt::format("exited with code {}", e.exit_code);
}

std::optional<uint64_t> ProcStartTime(pid_t pid) {
  std::optional<ProcStat> st = ReadProcStat(pid);
  if (!st) return std::nullopt;
  return st->start_time;
}

Status WriteChildRecord(const std::string& state_dir, const ChildRecord& rec) {
  const std::string dir = state_dir + "/children";
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return ErrnoToStatus(errno, "mkdir " + dir);
  const std::string path = RecordPath(dir, rec.pid);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << "pid=" << rec.pid << "\npgid=" << rec.pgid << "\nstart_time=" << rec.start_time
        << "\nname=" << rec.name << "\ncommand=" << rec.command << "\n";
    if (!out.flush()) return InternalError("cannot write child record " + tmp);
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) return ErrnoToStatus(errno, "rename " + tmp);
  return OkStatus();
}

// One child. Fields above `mu` are set by the spawner before the child is
// published to anyone (the Job's completion under Impl::mu) and are
// constant afterwards, except `out`, which only the spawner thread touches.
struct ProcessModel::Child {
  ProcessModelSpec spec;  // "{port}" replaced
  int port = 0;
  pid_t pid = 0;
  uint64_t start_time = 0;
  std::string record_path;
  UniqueFd out;  // read end of its stdout+stderr pipe (spawner thread only)

  Mutex mu;
  CondVar cv{&mu};  // signalled on exited / stop_done
  bool exited GUARDED_BY(mu) = false;
  ProcessExit exit_status GUARDED_BY(mu);
  std::string tail GUARDED_BY(mu);  // last ≤ kTailBytes of output
  bool stopping GUARDED_BY(mu) = false;
  bool stop_done GUARDED_BY(mu) = false;

  void AppendOutput(const char* data, size_t n) EXCLUDES(mu) {
    MutexLock l(&mu);
    tail.append(data, n);
    if (tail.size() > kTailBytes) tail.erase(0, tail.size() - kTailBytes);
  }
  bool IsExited() EXCLUDES(mu) {
    MutexLock l(&mu);
    return exited;
  }
  // Waits until exited or `deadline`.
  void WaitExited(Clock::time_point deadline) EXCLUDES(mu) {
    MutexLock l(&mu);
    if (!exited) cv.WaitUntil(deadline);
  }
};

struct ProcessSupervisor::Impl {
  using Child = ProcessModel::Child;

  // A spawn request, owned by the Start() call waiting for it.
  struct Job {
    std::string path;               // resolved executable
    std::vector<std::string> argv;
    std::vector<std::string> envp;  // "NAME=value"
    std::shared_ptr<Child> child;   // filled by the spawner on success
    bool done = false;
    Status status;
  };

  std::string state_dir;
  std::string children_dir;
  UniqueFd wake;  // eventfd: a job is queued or quit is set
  std::thread thread;

  Mutex mu;
  CondVar cv{&mu};  // signalled when a job is done
  std::deque<Job*> jobs GUARDED_BY(mu);
  std::vector<std::shared_ptr<Child>> live GUARDED_BY(mu);  // spawned, not reaped
  bool quit GUARDED_BY(mu) = false;

  void Wake() {
    const uint64_t one = 1;
    ssize_t n = write(wake.get(), &one, sizeof(one));
    (void)n;
  }

  void Loop();
  void Spawn(Job& job);
  void Drain(Child& c);
  void Reaped(const std::shared_ptr<Child>& c, int wstatus);
  void StopChild(const std::shared_ptr<Child>& c);
};

// Note [One spawner thread].
void ProcessSupervisor::Impl::Loop() {
  for (;;) {
    std::vector<std::shared_ptr<Child>> children;
    std::deque<Job*> todo;
    bool quitting = false;
    {
      MutexLock l(&mu);
      children = live;
      todo.swap(jobs);
      quitting = quit;
    }
    for (Job* job : todo) {
      if (quitting) {
        job->status = UnavailableError("the process supervisor is shutting down",
                                       ErrorReason::kShuttingDown);
      } else {
        Spawn(*job);
      }
      MutexLock l(&mu);
      job->done = true;
      cv.SignalAll();
    }
    if (!todo.empty()) continue;  // pick up the new children
    for (const std::shared_ptr<Child>& c : children) {
      int wstatus = 0;
      if (waitpid(c->pid, &wstatus, WNOHANG) == c->pid) Reaped(c, wstatus);
    }
    if (quitting && children.empty()) return;

    std::vector<pollfd> fds;
    std::vector<Child*> owners;
    fds.push_back({wake.get(), POLLIN, 0});
    owners.push_back(nullptr);
    for (const std::shared_ptr<Child>& c : children) {
      if (!c->out.valid()) continue;
      fds.push_back({c->out.get(), POLLIN, 0});
      owners.push_back(c.get());
    }
    if (poll(fds.data(), fds.size(), kLoopPollMs) <= 0) continue;
    if (fds[0].revents != 0) {
      uint64_t n = 0;
      ssize_t r = read(wake.get(), &n, sizeof(n));
      (void)r;
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents != 0) Drain(*owners[i]);
    }
  }
}

// Reads what the pipe holds now; closes it at EOF.
void ProcessSupervisor::Impl::Drain(Child& c) {
  char buf[4096];
  while (c.out.valid()) {
    const ssize_t n = read(c.out.get(), buf, sizeof(buf));
    if (n > 0) {
      c.AppendOutput(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    c.out.reset();  // EOF or error
  }
}

void ProcessSupervisor::Impl::Reaped(const std::shared_ptr<Child>& c, int wstatus) {
  Drain(*c);
  c->out.reset();
  ProcessExit e;
  if (WIFEXITED(wstatus)) e.exit_code = WEXITSTATUS(wstatus);
  if (WIFSIGNALED(wstatus)) e.signal = WTERMSIG(wstatus);
  bool stopping = false;
  {
    MutexLock l(&c->mu);
    e.stderr_tail = c->tail;
    c->exit_status = e;
    c->exited = true;
    stopping = c->stopping;
    c->cv.SignalAll();
  }
  {
    MutexLock l(&mu);
    live.erase(std::remove(live.begin(), live.end(), c), live.end());
  }
  if (stopping) return;  // Stop() finishes the job
  // Crashed (Note [Child states]): nothing of it may stay resident.
  if (!GroupMembers(c->pid).empty()) kill(-c->pid, SIGKILL);
  unlink(c->record_path.c_str());
  spdlog::warn("model \"{}\": its process (pid {}) {}; its output ended with:{}", c->spec.name,
               c->pid, DescribeExit(e), QuotedOutput(e.stderr_tail));
}

// On the spawner thread. Sets job.status, and job.child on success.
void ProcessSupervisor::Impl::Spawn(Job& job) {
  int out_pipe[2], status_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) {
    job.status = ErrnoToStatus(errno, "pipe for the output of model \"" + job.child->spec.name + "\"");
    return;
  }
  UniqueFd out_r(out_pipe[0]), out_w(out_pipe[1]);
  if (pipe2(status_pipe, O_CLOEXEC) != 0) {
    job.status = ErrnoToStatus(errno, "pipe for the exec status of model \"" + job.child->spec.name + "\"");
    return;
  }
  UniqueFd status_r(status_pipe[0]), status_w(status_pipe[1]);
  UniqueFd dev_null(open("/dev/null", O_RDONLY | O_CLOEXEC));

  // Everything the child needs, prepared before fork: after fork the child
  // may only call async-signal-safe functions (no allocation).
  std::vector<char*> argv, envp;
  for (std::string& a : job.argv) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (std::string& e : job.envp) envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t parent = getpid();
  sigset_t none;
  sigemptyset(&none);

  const pid_t pid = fork();
  if (pid < 0) {
    job.status = ErrnoToStatus(errno, "fork for model \"" + job.child->spec.name + "\"");
    job.status = InternalError(job.status.message());
    return;
  }
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the spawner died before prctl
    for (int sig = 1; sig < NSIG; ++sig) {
      if (sig != SIGKILL && sig != SIGSTOP) signal(sig, SIG_DFL);
    }
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (dev_null.valid()) dup2(dev_null.get(), STDIN_FILENO);
    dup2(out_w.get(), STDOUT_FILENO);
    dup2(out_w.get(), STDERR_FILENO);
    // Every other descriptor closes at exec (status_w too, which is how the
    // parent learns the exec succeeded).
    if (syscall(SYS_close_range, 3u, ~0u, CLOSE_RANGE_CLOEXEC) != 0) {
      for (int fd = 3; fd < 65536; ++fd) {
        if (fd != status_w.get()) fcntl(fd, F_SETFD, FD_CLOEXEC);
      }
    }
    execve(job.path.c_str(), argv.data(), envp.data());
    int err = errno;
    ssize_t n = write(status_w.get(), &err, sizeof(err));
    (void)n;
    _exit(127);
  }
  setpgid(pid, pid);  // also from here, so the group exists before anyone signals it
  out_w.reset();
  status_w.reset();
  int exec_errno = 0;
  ssize_t n;
  do {
    n = read(status_r.get(), &exec_errno, sizeof(exec_errno));
  } while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof(exec_errno))) {
    waitpid(pid, nullptr, 0);
    const std::string what = fmt::format("model \"{}\": exec \"{}\"", job.child->spec.name, job.path);
    if (exec_errno == ENOENT || exec_errno == EACCES || exec_errno == ENOEXEC) {
      job.status = NotFoundError(fmt::format("{}: {}; fix `command` in its [[models]] entry", what,
                                             std::strerror(exec_errno)));
    } else {
      job.status = InternalError(fmt::format("{}: {}", what, std::strerror(exec_errno)));
    }
    return;
  }
  fcntl(out_r.get(), F_SETFL, fcntl(out_r.get(), F_GETFL) | O_NONBLOCK);
  Child& c = *job.child;
  c.pid = pid;
  c.start_time = ProcStartTime(pid).value_or(0);
  c.out = std::move(out_r);
  c.record_path = RecordPath(children_dir, pid);
  ChildRecord rec{pid, pid, c.start_time, c.spec.name, JoinCommand(c.spec.command)};
  if (Status s = WriteChildRecord(state_dir, rec); !s.ok()) {
    spdlog::warn("model \"{}\": cannot record its process (pid {}); a killed arbiter would not find "
                 "it at the next start: {}", c.spec.name, pid, s.ToString());
  }
  MutexLock l(&mu);
  live.push_back(job.child);
}

// Note [Child states].
void ProcessSupervisor::Impl::StopChild(const std::shared_ptr<Child>& c) {
  int64_t grace_ms = c->spec.stop_grace_ms;
  {
    MutexLock l(&c->mu);
    if (c->stop_done) return;
    if (c->stopping) {
      while (!c->stop_done) c->cv.Wait();
      return;
    }
    c->stopping = true;
  }
  const bool killed = TerminateGroup(
      c->pid, grace_ms, [&] { return c->IsExited(); },
      [&](Clock::time_point deadline) { c->WaitExited(deadline); });
  unlink(c->record_path.c_str());
  if (killed) {
    spdlog::warn("model \"{}\": its process (pid {}) did not stop within {} ms of SIGTERM; "
                 "SIGKILLed its process group", c->spec.name, c->pid, grace_ms);
  }
  MutexLock l(&c->mu);
  c->stop_done = true;
  c->cv.SignalAll();
}

ProcessSupervisor::ProcessSupervisor(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<ProcessSupervisor>> ProcessSupervisor::Create(std::string state_dir) {
  auto impl = std::make_shared<Impl>();
  impl->state_dir = std::move(state_dir);
  impl->children_dir = impl->state_dir + "/children";
  for (const std::string& dir : {impl->state_dir, impl->children_dir}) {
    if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
      return ErrnoToStatus(errno, "create the process supervisor's directory " + dir);
    }
  }
  impl->wake.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!impl->wake.valid()) return ErrnoToStatus(errno, "eventfd for the process supervisor");
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->Loop(); });
  return std::unique_ptr<ProcessSupervisor>(new ProcessSupervisor(std::move(impl)));
}

ProcessSupervisor::~ProcessSupervisor() {
  std::vector<std::shared_ptr<Impl::Child>> children;
  {
    MutexLock l(&impl_->mu);
    children = impl_->live;
  }
  std::vector<std::thread> stoppers;
  for (const auto& c : children) {
    stoppers.emplace_back([this, c] { impl_->StopChild(c); });
  }
  for (std::thread& t : stoppers) t.join();
  {
    MutexLock l(&impl_->mu);
    impl_->quit = true;
  }
  impl_->Wake();
  impl_->thread.join();
}

std::vector<std::string> ProcessSupervisor::ReapStale(int64_t grace_ms) {
  std::vector<std::string> lines;
  std::vector<pid_t> ours;
  {
    MutexLock l(&impl_->mu);
    for (const auto& c : impl_->live) ours.push_back(c->pid);
  }
  DIR* dir = opendir(impl_->children_dir.c_str());
  if (dir == nullptr) return lines;
  std::vector<std::string> files;
  while (dirent* e = readdir(dir)) {
    const std::string name = e->d_name;
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".rec") == 0) files.push_back(name);
  }
  closedir(dir);
  for (const std::string& file : files) {
    const std::string path = impl_->children_dir + "/" + file;
    std::optional<ChildRecord> rec = ReadChildRecord(path);
    if (!rec) {
      lines.push_back(fmt::format("unreadable child record {} removed", path));
      unlink(path.c_str());
      continue;
    }
    if (std::find(ours.begin(), ours.end(), rec->pid) != ours.end()) continue;
    const std::optional<uint64_t> start = ProcStartTime(rec->pid);
    const bool leader_is_ours = start && *start == rec->start_time;
    const bool orphans = !start && !GroupMembers(rec->pgid).empty();
    const std::string who = fmt::format("model \"{}\" (pid {}, group {}, command: {})", rec->name,
                                        rec->pid, rec->pgid, rec->command);
    if (leader_is_ours || orphans) {
      const pid_t pid = rec->pid;
      const bool killed = TerminateGroup(
          rec->pgid, grace_ms,
          [pid, leader_is_ours] {
            if (!leader_is_ours) return true;
            std::optional<ProcStat> st = ReadProcStat(pid);
            return !st || st->state == 'Z' || st->state == 'X';
          },
          [](Clock::time_point deadline) { std::this_thread::sleep_until(deadline); });
      lines.push_back(fmt::format("stale process of {} left by a previous arbiter: stopped{}", who,
                                  killed ? " (SIGKILL after the grace period)" : ""));
    } else if (start) {
      lines.push_back(fmt::format("stale record of {}: that pid now belongs to another process; "
                                  "record removed, nothing signalled", who));
    } else {
      lines.push_back(fmt::format("stale record of {}: already gone; record removed", who));
    }
    unlink(path.c_str());
  }
  return lines;
}

Result<std::unique_ptr<ProcessModel>> ProcessSupervisor::Start(const ProcessModelSpec& spec_in,
                                                              const Cancellation& cancelled) {
  if (spec_in.command.empty() || spec_in.command[0].empty()) {
    return InvalidArgumentError(fmt::format(
        "model \"{}\": `command` is empty; give the server's argv, e.g. [\"/path/server\", \"--port\", "
        "\"{{port}}\"]", spec_in.name));
  }
  const int port = PickFreePort();
  if (port <= 0) return UnavailableError("no free loopback port for model \"" + spec_in.name + "\"");
  ProcessModelSpec spec = spec_in;
  const std::string port_text = std::to_string(port);
  for (std::string& arg : spec.command) {
    for (size_t at = arg.find("{port}"); at != std::string::npos; at = arg.find("{port}", at)) {
      arg.replace(at, 6, port_text);
      at += port_text.size();
    }
  }
  ARBITER_ASSIGN_OR_RETURN(std::string path, ResolveExecutable(spec.command[0], spec.name));

  Impl::Job job;
  job.path = path;
  job.argv = spec.command;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    const bool replaced = std::any_of(spec.env.begin(), spec.env.end(),
                                      [&](const auto& kv) { return kv.first == name; });
    if (!replaced) job.envp.push_back(entry);
  }
  for (const auto& [name, value] : spec.env) job.envp.push_back(name + "=" + value);
  job.child = std::make_shared<ProcessModel::Child>();
  job.child->spec = spec;
  job.child->port = port;
  {
    MutexLock l(&impl_->mu);
    if (impl_->quit) return UnavailableError("the process supervisor is shutting down");
    impl_->jobs.push_back(&job);
  }
  impl_->Wake();
  {
    MutexLock l(&impl_->mu);
    while (!job.done) impl_->cv.Wait();
  }
  if (!job.status.ok()) return job.status;
  auto model = std::make_unique<ProcessModel>(impl_, job.child);
  spdlog::info("model \"{}\": started its process (pid {}) on port {}: {}", spec.name, model->pid(),
               port, JoinCommand(spec.command));

  // The health wait (on this thread; the spawner reaps meanwhile).
  httplib::Client cli("127.0.0.1", port);
  cli.set_connection_timeout(0, 500 * 1000);
  const auto deadline = Clock::now() + milliseconds(spec.ready_timeout_ms);
  for (;;) {
    if (std::optional<ProcessExit> e = model->exit()) {
      model->Stop();
      return UnavailableError(fmt::format(
          "model \"{}\": its process {} before it answered GET {} (command: {}); its output ended "
          "with:\n{}", spec.name, DescribeExit(*e), spec.health, JoinCommand(spec.command),
          e->stderr_tail));
    }
    if (cancelled.cancelled()) {
      model->Stop();
      return CancelledError(fmt::format("model \"{}\": start cancelled while waiting for GET {}",
                                        spec.name, spec.health), ErrorReason::kCancelled);
    }
    if (Clock::now() >= deadline) {
      const std::string tail = model->output_tail();
      model->Stop();
      return DeadlineExceededError(fmt::format(
          "model \"{}\": its process did not answer GET http://127.0.0.1:{}{} with 200 within {} ms "
          "and was stopped (raise ready_timeout_s if it loads slowly); its output ended with:\n{}",
          spec.name, port, spec.health, spec.ready_timeout_ms, tail));
    }
    // A child that accepts but does not answer must not hold the wait past
    // its deadline by more than the poll period.
    const auto remaining = std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now());
    const auto read_limit = std::clamp<std::chrono::microseconds>(remaining, milliseconds(kHealthPollMs),
                                                                  std::chrono::seconds(5));
    cli.set_read_timeout(read_limit.count() / 1000000, read_limit.count() % 1000000);
    if (auto r = cli.Get(spec.health.c_str()); r && r->status == 200) break;
    model->child_->WaitExited(std::min(deadline, Clock::now() + milliseconds(kHealthPollMs)));
  }
  spdlog::info("model \"{}\": its process (pid {}) is healthy on port {}", spec.name, model->pid(),
               port);
  return model;
}

ProcessModel::ProcessModel(std::shared_ptr<ProcessSupervisor::Impl> sup, std::shared_ptr<Child> child)
    : sup_(std::move(sup)), child_(std::move(child)) {}

ProcessModel::~ProcessModel() { Stop(); }

int ProcessModel::port() const { return child_->port; }
pid_t ProcessModel::pid() const { return child_->pid; }
const ProcessModelSpec& ProcessModel::spec() const { return child_->spec; }

uint64_t ProcessModel::MeasureRssBytes() const {
  uint64_t total = 0;
  for (pid_t p : GroupMembers(child_->pid)) total += ProcessRssBytes(p);
  return total;
}

bool ProcessModel::alive() const { return !child_->IsExited(); }

std::optional<ProcessExit> ProcessModel::exit() const {
  MutexLock l(&child_->mu);
  if (!child_->exited) return std::nullopt;
  return child_->exit_status;
}

std::string ProcessModel::output_tail() const {
  MutexLock l(&child_->mu);
  return child_->tail;
}

void ProcessModel::Stop() { sup_->StopChild(child_); }

}  // namespace arbiter
