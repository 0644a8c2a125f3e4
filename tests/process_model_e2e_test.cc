// End-to-end tests of external model servers (backends/process_model.h,
// server/internal/proxy.h): real child processes — a second `arbiter serve`,
// /bin/sh, python3's http.server — and real HTTP, no mocks.
#include "arbiter/backends/process_model.h"

#include <dirent.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>

#include "arbiter/base/cancel.h"
#include "server/internal/http/http_server.h"
#include "server/internal/proxy.h"

extern char** environ;

namespace arbiter {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr const char* kPython = "/usr/bin/python3";

// Waits (polling, bounded) for `pred`; a fuse, not a timing assertion.
bool WaitFor(const std::function<bool()>& pred, milliseconds limit) {
  const auto end = Clock::now() + limit;
  while (Clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return pred();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Running, or a zombie not yet reaped by its parent, counts as "gone" only
// when the process no longer runs: missing or state Z.
bool ProcessRuns(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  if (!in) return false;
  std::string line;
  std::getline(in, line);
  const size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return false;
  const char state = line[close + 2];
  return state != 'Z' && state != 'X';
}

// pgrp (field 5) of /proc/<pid>/stat, or 0.
pid_t ProcessGroupOf(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(in, line);
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(line.substr(close + 1));
  char state;
  long ppid = 0, pgrp = 0;
  rest >> state >> ppid >> pgrp;
  return static_cast<pid_t>(pgrp);
}

std::vector<pid_t> RunningMembersOf(pid_t pgid) {
  std::vector<pid_t> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t p = static_cast<pid_t>(std::stol(name));
    if (ProcessGroupOf(p) == pgid && ProcessRuns(p)) out.push_back(p);
  }
  return out;
}

// Our own reading of /proc/<pid>/status: RssAnon + RssFile + RssShmem.
uint64_t MyRssBytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  uint64_t kib = 0;
  while (std::getline(in, line)) {
    for (const char* key : {"RssAnon:", "RssFile:", "RssShmem:"}) {
      if (line.rfind(key, 0) == 0) kib += std::stoull(line.substr(std::strlen(key)));
    }
  }
  return kib * 1024;
}

std::string CommOf(pid_t pid) {
  std::string s = ReadFile("/proc/" + std::to_string(pid) + "/comm");
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

// Forks `argv` in a new session (its own process group); returns its pid.
pid_t SpawnInOwnGroup(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    setsid();
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

class ProcessModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/arbiter_process_model_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto sup = ProcessSupervisor::Create(dir_ + "/sup");
    ASSERT_TRUE(sup.ok()) << sup.status().ToString();
    sup_ = std::move(*sup);
  }
  void TearDown() override {
    sup_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  ProcessModelSpec ArbiterSpec() const {
    ProcessModelSpec spec;
    spec.name = "child-arbiter";
    spec.command = {ARBITER_BINARY, "serve",       "--host", "127.0.0.1", "--port",
                    "{port}",       "--state-dir", dir_ + "/child-state"};
    spec.ready_timeout_ms = 120000;
    return spec;
  }
  // A tiny HTTP server (python3 -m http.server) run by /bin/sh -c `prefix`.
  ProcessModelSpec ShellServerSpec(const std::string& prefix) const {
    ProcessModelSpec spec;
    spec.name = "py";
    spec.command = {"/bin/sh", "-c",
                    prefix + std::string(kPython) + " -m http.server {port} --bind 127.0.0.1"};
    spec.health = "/";
    spec.ready_timeout_ms = 30000;
    return spec;
  }
  std::string RecordPath(pid_t pid) const {
    return dir_ + "/sup/children/" + std::to_string(pid) + ".rec";
  }

  std::string dir_;
  std::unique_ptr<ProcessSupervisor> sup_;
};

TEST_F(ProcessModelTest, ChildArbiterServesIsMeasuredAndStops) {
  auto started = sup_->Start(ArbiterSpec());
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  std::unique_ptr<ProcessModel> m = std::move(*started);
  const pid_t pid = m->pid();
  EXPECT_GT(m->port(), 0);
  EXPECT_TRUE(m->alive());
  EXPECT_EQ(m->spec().command[5], std::to_string(m->port()));  // "{port}" replaced
  EXPECT_TRUE(std::filesystem::exists(RecordPath(pid)));
  EXPECT_EQ(ProcessGroupOf(pid), pid);

  httplib::Client cli("127.0.0.1", m->port());
  auto r = cli.Get("/v1/models");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_NE(r->body.find("demo-chat"), std::string::npos) << r->body;

  uint64_t mine = 0;
  for (pid_t p : RunningMembersOf(pid)) mine += MyRssBytes(p);
  const uint64_t measured = m->MeasureRssBytes();
  std::printf("child arbiter RSS: %.1f MiB (measured), %.1f MiB (own reading)\n",
              measured / 1048576.0, mine / 1048576.0);
  EXPECT_GT(measured, 10u << 20);
  EXPECT_NEAR(static_cast<double>(measured), static_cast<double>(mine), 0.1 * mine);

  m->Stop();
  EXPECT_FALSE(m->alive());
  EXPECT_FALSE(ProcessRuns(pid));
  EXPECT_FALSE(std::filesystem::exists(RecordPath(pid)));
  ASSERT_TRUE(m->exit().has_value());
  EXPECT_EQ(m->MeasureRssBytes(), 0u);
  m->Stop();  // idempotent
}

TEST_F(ProcessModelTest, EmptyCommandIsInvalid) {
  ProcessModelSpec spec;
  spec.name = "empty";
  auto r = sup_->Start(spec);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
}

TEST_F(ProcessModelTest, MissingOrNonExecutableCommandIsNotFound) {
  const std::string plain = dir_ + "/not-executable";
  std::ofstream(plain) << "#!/bin/sh\nexit 0\n";
  chmod(plain.c_str(), 0644);
  for (const std::string& cmd : {plain, dir_ + "/does-not-exist", std::string("no-such-server-xyz")}) {
    ProcessModelSpec spec;
    spec.name = "bad";
    spec.command = {cmd, "--port", "{port}"};
    auto r = sup_->Start(spec);
    ASSERT_FALSE(r.ok()) << cmd;
    EXPECT_EQ(r.status().code(), StatusCode::kNotFound) << r.status().ToString();
    EXPECT_NE(r.status().message().find(cmd), std::string::npos) << r.status().ToString();
  }
}

TEST_F(ProcessModelTest, ExecFailureInTheChildIsNotFound) {
  // Executable bit set, but no format exec knows: the exec itself fails
  // (ENOEXEC), reported through the status pipe.
  const std::string junk = dir_ + "/junk";
  std::ofstream(junk) << std::string("\x7f" "ELFjunk", 8);
  chmod(junk.c_str(), 0755);
  ProcessModelSpec spec;
  spec.name = "junk";
  spec.command = {junk};
  auto r = sup_->Start(spec);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound) << r.status().ToString();
  EXPECT_NE(r.status().message().find("exec"), std::string::npos) << r.status().ToString();
}

TEST_F(ProcessModelTest, EarlyExitReportsStatusAndOutput) {
  ProcessModelSpec spec;
  spec.name = "boomer";
  spec.command = {"/bin/sh", "-c", "echo boom >&2; exit 3"};
  auto r = sup_->Start(spec);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().ToString();
  EXPECT_NE(r.status().message().find("code 3"), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find("boom"), std::string::npos) << r.status().ToString();
  EXPECT_TRUE(std::filesystem::is_empty(dir_ + "/sup/children"));
}

TEST_F(ProcessModelTest, SpecEnvReachesTheChild) {
  ProcessModelSpec spec;
  spec.name = "env";
  spec.command = {"/bin/sh", "-c", "echo \"value=$ARBITER_PM_TEST_VALUE\"; exit 1"};
  spec.env = {{"ARBITER_PM_TEST_VALUE", "from-spec"}};
  auto r = sup_->Start(spec);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("value=from-spec"), std::string::npos) << r.status().ToString();
}

TEST_F(ProcessModelTest, NeverHealthyIsDeadlineExceededAndStopped) {
  const std::string pid_file = dir_ + "/sleep.pid";
  ProcessModelSpec spec;
  spec.name = "sleeper";
  spec.command = {"/bin/sh", "-c", "echo $$ > " + pid_file + "; exec /bin/sleep 60"};
  spec.ready_timeout_ms = 500;
  auto r = sup_->Start(spec);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status().ToString();
  const pid_t pid = static_cast<pid_t>(std::stol(ReadFile(pid_file)));
  EXPECT_FALSE(ProcessRuns(pid));
  EXPECT_TRUE(std::filesystem::is_empty(dir_ + "/sup/children"));
}

TEST_F(ProcessModelTest, CancelledStartStopsTheChild) {
  const std::string pid_file = dir_ + "/sleep.pid";
  ProcessModelSpec spec;
  spec.name = "sleeper";
  spec.command = {"/bin/sh", "-c", "echo $$ > " + pid_file + "; exec /bin/sleep 60"};
  CancelSource source;
  std::thread canceller([&] {
    WaitFor([&] { return std::filesystem::exists(pid_file); }, seconds(10));
    source.Cancel();
  });
  auto r = sup_->Start(spec, source.token());
  canceller.join();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCancelled) << r.status().ToString();
  EXPECT_FALSE(ProcessRuns(static_cast<pid_t>(std::stol(ReadFile(pid_file)))));
}

TEST_F(ProcessModelTest, ChildIgnoringSigtermIsKilledAfterTheGrace) {
  ProcessModelSpec spec = ShellServerSpec("trap '' TERM; exec ");
  spec.stop_grace_ms = 500;
  auto started = sup_->Start(spec);
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  std::unique_ptr<ProcessModel> m = std::move(*started);
  const pid_t pid = m->pid();
  const auto t0 = Clock::now();
  m->Stop();
  EXPECT_GE(Clock::now() - t0, milliseconds(400));
  EXPECT_FALSE(ProcessRuns(pid));
  ASSERT_TRUE(m->exit().has_value());
  EXPECT_EQ(m->exit()->signal, SIGKILL);
}

TEST_F(ProcessModelTest, ProcessGroupIsMeasuredAndStoppedWhole) {
  auto started = sup_->Start(ShellServerSpec("/bin/sleep 60 & "));
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  std::unique_ptr<ProcessModel> m = std::move(*started);
  const pid_t pid = m->pid();
  std::vector<pid_t> members = RunningMembersOf(pid);
  pid_t python = 0, sleeper = 0;
  for (pid_t p : members) {
    if (CommOf(p).rfind("python", 0) == 0) python = p;
    if (CommOf(p) == "sleep") sleeper = p;
  }
  ASSERT_GT(python, 0);
  ASSERT_GT(sleeper, 0);
  const uint64_t measured = m->MeasureRssBytes();
  EXPECT_GT(measured, MyRssBytes(python));
  m->Stop();
  EXPECT_FALSE(ProcessRuns(pid));
  EXPECT_FALSE(ProcessRuns(python));
  EXPECT_FALSE(ProcessRuns(sleeper));
  EXPECT_TRUE(RunningMembersOf(pid).empty());
}

TEST_F(ProcessModelTest, CrashIsReportedAndHelpersAreKilled) {
  auto started = sup_->Start(ShellServerSpec("/bin/sleep 60 & echo about to serve; "));
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  std::unique_ptr<ProcessModel> m = std::move(*started);
  const pid_t pid = m->pid();
  kill(pid, SIGKILL);  // the shell (group leader) crashes; python and sleep are left
  ASSERT_TRUE(WaitFor([&] { return !m->alive(); }, seconds(10)));
  ASSERT_TRUE(m->exit().has_value());
  EXPECT_EQ(m->exit()->signal, SIGKILL);
  EXPECT_NE(m->exit()->stderr_tail.find("about to serve"), std::string::npos);
  EXPECT_TRUE(WaitFor([&] { return RunningMembersOf(pid).empty(); }, seconds(10)));
  EXPECT_FALSE(std::filesystem::exists(RecordPath(pid)));
}

// Run only as the helper process of ChildDiesWithItsSupervisorProcess (it
// sets ARBITER_PM_HELPER_DIR): starts a child, says so, and waits to be
// SIGKILLed.
TEST(ProcessModelHelper, StartChildAndWait) {
  const char* dir = std::getenv("ARBITER_PM_HELPER_DIR");
  if (dir == nullptr) GTEST_SKIP() << "helper process only";
  auto sup = ProcessSupervisor::Create(std::string(dir) + "/sup");
  ASSERT_TRUE(sup.ok());
  ProcessModelSpec spec;
  spec.name = "orphan";
  spec.command = {"/bin/sh", "-c",
                  "echo $$ > " + std::string(dir) + "/child.pid; exec " + kPython +
                      " -m http.server {port} --bind 127.0.0.1"};
  spec.health = "/";
  auto m = (*sup)->Start(spec);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  std::ofstream(std::string(dir) + "/ready") << "ready\n";
  std::this_thread::sleep_for(seconds(120));
}

TEST_F(ProcessModelTest, ChildDiesWithItsSupervisorProcess) {
  const std::string helper_dir = dir_ + "/helper";
  std::filesystem::create_directories(helper_dir);
  const pid_t helper = fork();
  ASSERT_GE(helper, 0);
  if (helper == 0) {
    setenv("ARBITER_PM_HELPER_DIR", helper_dir.c_str(), 1);
    execl("/proc/self/exe", "process_model_e2e_test",
          "--gtest_filter=ProcessModelHelper.StartChildAndWait", static_cast<char*>(nullptr));
    _exit(127);
  }
  const bool ready =
      WaitFor([&] { return std::filesystem::exists(helper_dir + "/ready"); }, seconds(60));
  kill(helper, SIGKILL);
  waitpid(helper, nullptr, 0);
  ASSERT_TRUE(ready) << "the helper did not start its child";
  const pid_t child = static_cast<pid_t>(std::stol(ReadFile(helper_dir + "/child.pid")));
  EXPECT_TRUE(WaitFor([&] { return !ProcessRuns(child); }, seconds(10)))
      << "the child outlived its supervisor (PR_SET_PDEATHSIG)";

  // The killed helper left the child's record; the next supervisor finds it.
  auto next = ProcessSupervisor::Create(helper_dir + "/sup");
  ASSERT_TRUE(next.ok());
  std::vector<std::string> lines = (*next)->ReapStale();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("orphan"), std::string::npos) << lines[0];
  EXPECT_TRUE(std::filesystem::is_empty(helper_dir + "/sup/children"));
}

TEST_F(ProcessModelTest, ReapStaleStopsLeftoverGroupsAndSparesReusedPids) {
  const pid_t stale = SpawnInOwnGroup({"/bin/sleep", "60"});
  const pid_t innocent = SpawnInOwnGroup({"/bin/sleep", "60"});
  ASSERT_TRUE(WaitFor([&] { return ProcessGroupOf(stale) == stale && ProcessGroupOf(innocent) == innocent; },
                      seconds(5)));
  const std::optional<uint64_t> stale_start = ProcStartTime(stale);
  const std::optional<uint64_t> innocent_start = ProcStartTime(innocent);
  ASSERT_TRUE(stale_start && innocent_start);
  ASSERT_TRUE(WriteChildRecord(dir_ + "/sup", {stale, stale, *stale_start, "left-behind", "sleep 60"}).ok());
  // The pid of a process that is not the recorded one (another start time).
  ASSERT_TRUE(WriteChildRecord(dir_ + "/sup", {innocent, innocent, *innocent_start + 12345, "reused",
                                               "server --port 1"}).ok());

  std::vector<std::string> lines = sup_->ReapStale(/*grace_ms=*/2000);
  ASSERT_EQ(lines.size(), 2u);
  std::string all = lines[0] + "\n" + lines[1];
  EXPECT_NE(all.find("left-behind"), std::string::npos) << all;
  EXPECT_NE(all.find("stopped"), std::string::npos) << all;
  EXPECT_NE(all.find("another process"), std::string::npos) << all;

  int status = 0;
  ASSERT_EQ(waitpid(stale, &status, 0), stale);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM);
  EXPECT_TRUE(ProcessRuns(innocent));
  EXPECT_TRUE(std::filesystem::is_empty(dir_ + "/sup/children"));
  kill(innocent, SIGKILL);
  waitpid(innocent, nullptr, 0);
}

// A loopback port nothing listens on (bound, then closed).
int DeadPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return -1;
  }
  close(fd);
  return ntohs(addr.sin_port);
}

// Our own HTTP server whose routes proxy to a child `arbiter serve`.
TEST_F(ProcessModelTest, ProxyRelaysPlainAndStreamedAnswersAnd502sADeadPort) {
  auto started = sup_->Start(ArbiterSpec());
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  std::unique_ptr<ProcessModel> m = std::move(*started);
  const int child_port = m->port();
  const int dead_port = DeadPort();

  http::ServerOptions options;
  options.port = 0;
  options.worker_threads = 4;
  http::Server server(options);
  for (const char* method : {"GET", "POST"}) {
    server.Route(method, "/v1/{rest...}", http::Dispatch::kWorker,
                 [&](const http::Request& req, http::Responder& r) {
                   server_internal::ProxyToProcess(req, r, child_port, "child", 60);
                 });
  }
  server.Route("GET", "/dead", http::Dispatch::kWorker,
               [&](const http::Request& req, http::Responder& r) {
                 server_internal::ProxyToProcess(req, r, dead_port, "gone", 5);
               });
  ASSERT_TRUE(server.Bind().ok());
  std::thread loop([&] { server.Run().IgnoreError(); });

  httplib::Client cli("127.0.0.1", server.port());
  cli.set_read_timeout(120, 0);
  // GET with a query string, and the Authorization header the child must not see.
  auto models = cli.Get("/v1/models?limit=5", {{"Authorization", "Bearer outer-key"}});
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 200);
  EXPECT_NE(models->body.find("demo-chat"), std::string::npos) << models->body;

  const std::string body =
      R"({"model":"demo-chat","messages":[{"role":"user","content":"Hello"}],"max_tokens":6)";
  auto plain = cli.Post("/v1/chat/completions", body + "}", "application/json");
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->status, 200) << plain->body;
  EXPECT_NE(plain->get_header_value("Content-Type").find("application/json"), std::string::npos);
  EXPECT_NE(plain->body.find("\"chat.completion\""), std::string::npos) << plain->body;
  EXPECT_NE(plain->body.find("\"completion_tokens\":"), std::string::npos) << plain->body;

  // Streamed: the events arrive through our server as the child sends them.
  std::string streamed;
  int pieces = 0;
  std::string stream_type;
  httplib::Request sreq;
  sreq.method = "POST";
  sreq.path = "/v1/chat/completions";
  sreq.body = body + R"(,"stream":true})";
  sreq.set_header("Content-Type", "application/json");
  sreq.response_handler = [&](const httplib::Response& r) {
    stream_type = r.get_header_value("Content-Type");
    return r.status == 200;
  };
  sreq.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
    streamed.append(d, n);
    ++pieces;
    return true;
  };
  httplib::Response sres;
  httplib::Error serr = httplib::Error::Success;
  ASSERT_TRUE(cli.send(sreq, sres, serr)) << httplib::to_string(serr);
  EXPECT_EQ(sres.status, 200);
  EXPECT_EQ(stream_type.rfind("text/event-stream", 0), 0u) << stream_type;
  size_t events = 0;
  for (size_t at = streamed.find("data: "); at != std::string::npos; at = streamed.find("data: ", at + 1)) {
    ++events;
  }
  EXPECT_GE(events, 3u) << streamed;  // role, tokens (the demo model may stop early), finish, [DONE]
  EXPECT_NE(streamed.find("chat.completion.chunk"), std::string::npos) << streamed;
  EXPECT_EQ(streamed.substr(streamed.size() - 14), "data: [DONE]\n\n") << streamed;
  std::printf("streamed %zu events in %d pieces\n", events, pieces);

  auto dead = cli.Get("/dead");
  ASSERT_TRUE(dead);
  EXPECT_EQ(dead->status, 502);
  EXPECT_NE(dead->body.find(R"("type":"server_error")"), std::string::npos) << dead->body;
  EXPECT_NE(dead->body.find(R"(model \"gone\" (process) did not answer)"), std::string::npos)
      << dead->body;

  server.Stop();
  loop.join();
}

// An upstream that streams one SSE event every 100 ms for a minute and
// writes "closed" to a file when its client goes away.
constexpr const char* kSlowStreamPy = R"(
import http.server, sys, time
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    def log_message(self, *a): pass
    def do_GET(self):
        if self.path == '/health':
            self.send_response(200); self.send_header('Content-Length', '2'); self.end_headers()
            self.wfile.write(b'ok'); return
        self.send_response(200)
        self.send_header('Content-Type', 'text/event-stream')
        self.send_header('Transfer-Encoding', 'chunked')
        self.end_headers()
        try:
            for i in range(600):
                d = b'data: %d\n\n' % i
                self.wfile.write(b'%x\r\n%s\r\n' % (len(d), d)); self.wfile.flush()
                time.sleep(0.1)
        except (BrokenPipeError, ConnectionResetError):
            open(sys.argv[2], 'w').write('closed')
http.server.ThreadingHTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()
)";

TEST_F(ProcessModelTest, ProxyRelaysEventsAsTheyComeAndClosesUpstreamWhenTheClientLeaves) {
  const std::string script = dir_ + "/slow_stream.py", closed = dir_ + "/closed";
  std::ofstream(script) << kSlowStreamPy;
  ProcessModelSpec spec;
  spec.name = "slow";
  spec.command = {kPython, script, "{port}", closed};
  auto started = sup_->Start(spec);
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  const int child_port = (*started)->port();

  http::ServerOptions options;
  options.port = 0;
  http::Server server(options);
  server.Route("GET", "/stream", http::Dispatch::kWorker,
               [&](const http::Request& req, http::Responder& r) {
                 server_internal::ProxyToProcess(req, r, child_port, "slow", 30);
               });
  ASSERT_TRUE(server.Bind().ok());
  std::thread loop([&] { server.Run().IgnoreError(); });

  // Three events arrive long before the upstream's minute is over: they are
  // relayed as they come. Then the client hangs up.
  std::string got;
  httplib::Client cli("127.0.0.1", server.port());
  auto r = cli.Get("/stream", [&](const char* d, size_t n) {
    got.append(d, n);
    return got.find("data: 2\n\n") == std::string::npos;
  });
  EXPECT_FALSE(r);  // we cancelled it
  EXPECT_EQ(got.rfind("data: 0\n\ndata: 1\n\ndata: 2\n\n", 0), 0u) << got;
  EXPECT_TRUE(WaitFor([&] { return std::filesystem::exists(closed); }, seconds(10)))
      << "the proxy kept reading from the upstream after its client left";
  EXPECT_TRUE(WaitFor([&] { return server.stats().workers_busy == 0; }, seconds(10)));
  server.Stop();
  loop.join();
}

}  // namespace
}  // namespace arbiter
