// tests/server_process.h — starting the real `arbiter serve` for end-to-end
// tests: a free loopback port, fork/exec with the log in a file, and a wait
// for /health; a scratch directory; one server started in it with the
// test's config (tests/server_suite.h builds a suite's fixture on these).
// Shared by the tests/*_e2e_test.cc suites.
//
// Thread safety: call from the test's main thread (fork).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "tools/model_maker/model_maker.h"

extern char** environ;

namespace arbiter::testing {

inline std::string ReadAll(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// MakeModel("tiny", dir, seed) with a longer context: config.json's
// max_position_embeddings set to `ctx` (only the RoPE table grows).
inline Status MakeTinyModelWithContext(const std::string& dir, uint64_t seed, int ctx) {
  ARBITER_RETURN_IF_ERROR(MakeModel("tiny", dir, seed));
  nlohmann::json cfg = nlohmann::json::parse(ReadAll(dir + "/config.json"));
  cfg["max_position_embeddings"] = ctx;
  std::ofstream(dir + "/config.json") << cfg.dump(2);
  return OkStatus();
}

// A TCP connection to 127.0.0.1:`port`; -1 when it cannot connect.
inline int ConnectLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Sends `raw` on a new connection to 127.0.0.1:`port` and returns what the
// server answers before it closes the connection or a read waits `fuse_s`
// seconds; "connect failed" when it cannot connect.
inline std::string RawExchange(int port, const std::string& raw, int fuse_s = 30) {
  const int fd = ConnectLoopback(port);
  if (fd < 0) return "connect failed";
  timeval tv{fuse_s, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  send(fd, raw.data(), raw.size(), MSG_NOSIGNAL);
  std::string got;
  char buf[4096];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) got.append(buf, n);
  close(fd);
  return got;
}

// A loopback port free at the time of the call; -1 when none could be bound.
inline int FreeLoopbackPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// Starts `binary serve --config CONFIG --state-dir STATE_DIR` with stdout and
// stderr in `log_path` and the caller's environment minus ARBITER_*
// overrides, plus `extra_env` ("NAME=value" entries); the child dies with the
// test process (no orphan servers). Does not wait. Returns the child's pid,
// or -1 with `*error` set.
inline pid_t SpawnServer(const std::string& binary, const std::string& config,
                         const std::string& state_dir, const std::string& log_path,
                         std::string* error, const std::vector<std::string>& extra_env = {}) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::string(*e).rfind("ARBITER_", 0) != 0) env_strings.emplace_back(*e);
  }
  for (const std::string& e : extra_env) env_strings.push_back(e);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = {binary, "serve", "--config", config, "--state-dir", state_dir};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  const int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    *error = "cannot open " + log_path;
    return -1;
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(log_fd);
    *error = "fork failed";
    return -1;
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(log_fd, 1);
    dup2(log_fd, 2);
    execve(binary.c_str(), argv.data(), envp.data());
    _exit(127);
  }
  close(log_fd);
  return pid;
}

// Waits up to `wait` for GET /health on `port` to answer 200. On failure the
// child is killed and reaped, and `*error` holds the reason and the log.
inline bool WaitHealthy(pid_t pid, int port, const std::string& log_path,
                        std::chrono::seconds wait, std::string* error) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_connection_timeout(1, 0);
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (std::chrono::steady_clock::now() < deadline) {
    if (auto r = cli.Get("/health"); r && r->status == 200) return true;
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      *error = "arbiter serve exited during startup:\n" + ReadAll(log_path);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  *error = "arbiter serve did not answer /health within " + std::to_string(wait.count()) +
           " s:\n" + ReadAll(log_path);
  return false;
}

// SpawnServer + WaitHealthy. Returns the child's pid, or -1 with `*error`
// set (the message includes the server log); a child that did not come up
// is killed and reaped.
inline pid_t StartServer(const std::string& binary, const std::string& config,
                         const std::string& state_dir, const std::string& log_path, int port,
                         std::chrono::seconds wait, std::string* error,
                         const std::vector<std::string>& extra_env = {}) {
  const pid_t pid = SpawnServer(binary, config, state_dir, log_path, error, extra_env);
  if (pid < 0) return -1;
  return WaitHealthy(pid, port, log_path, wait, error) ? pid : -1;
}

// One `arbiter serve` child started by a test.
struct ServerProc {
  pid_t pid = -1;
  int port = -1;
  std::string log;  // its stdout + stderr
};

// Sends `sig` to a running child and reaps it (no-op when already gone).
inline void KillServer(ServerProc& p, int sig) {
  if (p.pid <= 0) return;
  kill(p.pid, sig);
  waitpid(p.pid, nullptr, 0);
  p.pid = -1;
}

// A new directory "/tmp/arbiter-<tag>-XXXXXX" for a test's models, config,
// state and log; "" when it cannot be made.
inline std::string MakeScratchDir(const std::string& tag) {
  std::string path = "/tmp/arbiter-" + tag + "-XXXXXX";
  return mkdtemp(path.data()) != nullptr ? path : std::string();
}

// Starts `binary serve` in `dir` on a free loopback port: the config
// `dir`/arbiter.toml is "[server]\nport = <port>\n" followed by
// `config_rest` (the [server] table's other keys, then the other tables),
// the state directory `dir`/state, the log `dir`/serve.log; waits up to
// 60 s for /health. Returns true with `*proc` filled, or false with `*error`
// set (the log included; a child that did not come up is reaped).
inline bool StartServeIn(const std::string& binary, const std::string& dir,
                         const std::string& config_rest, ServerProc* proc, std::string* error) {
  proc->port = FreeLoopbackPort();
  if (proc->port <= 0) {
    *error = "no free loopback port";
    return false;
  }
  const std::string config = dir + "/arbiter.toml";
  std::ofstream(config) << "[server]\nport = " << proc->port << "\n" << config_rest;
  proc->log = dir + "/serve.log";
  proc->pid = StartServer(binary, config, dir + "/state", proc->log, proc->port,
                          std::chrono::seconds(60), error);
  return proc->pid > 0;
}

}  // namespace arbiter::testing
