// bench/memory_bench.cc — see memory_bench.h.
#include "bench/memory_bench.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "arbiter/memory/system_memory.h"
#include "arbiter/runtime/runtime.h"
#include "tools/model_maker/model_maker.h"

extern char** environ;

namespace arbiter {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kToleranceFloorBytes = uint64_t{16} << 20;
constexpr double kToleranceFraction = 0.05;

// A removed-on-exit temp directory.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "arbiter-bench-memory-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) != nullptr) path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path.empty()) fs::remove_all(path, ec);
  }
};

int FreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

// One HTTP/1.1 POST on loopback with Connection: close; the status code, or
// -1 when the server cannot be reached.
int PostLoopback(int port, const std::string& path, const std::string& body) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  const std::string req = fmt::format(
      "POST {} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
      "Content-Length: {}\r\nConnection: close\r\n\r\n{}",
      path, body.size(), body);
  size_t sent = 0;
  while (sent < req.size()) {
    const ssize_t n = ::send(fd, req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  std::string reply;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) reply.append(buf, static_cast<size_t>(n));
  ::close(fd);
  int status = -1;
  if (reply.rfind("HTTP/1.1 ", 0) == 0) status = std::atoi(reply.c_str() + 9);
  return status;
}

// The second process: `arbiter serve` of demo-chat, pinned_system, with
// shared host floors; stopped (SIGTERM, then waited for) on destruction.
class SecondProcess {
 public:
  ~SecondProcess() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  Status Start(const std::string& binary, const fs::path& dir, const std::string& chat_dir) {
    const fs::path config = dir / "second.toml";
    std::ofstream(config) << fmt::format(
        "[memory]\nshared_host_weights = true\n\n[[models]]\nname = \"demo-chat\"\n"
        "path = \"{}\"\ncapability = \"text\"\nresidency = \"pinned_system\"\n",
        chat_dir);
    port_ = FreeLoopbackPort();
    if (port_ <= 0) return InternalError("no free loopback port for the second process");
    const std::string port = std::to_string(port_);
    const std::string state = (dir / "second-state").string();
    const std::string log = (dir / "second.log").string();
    const std::string config_path = config.string();
    std::vector<std::string> args = {binary, "serve",       "--host",      "127.0.0.1",
                                     "--port", port,        "--config",    config_path,
                                     "--state-dir", state};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    const int rc = ::posix_spawn(&pid_, binary.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) {
      pid_ = 0;
      return InternalError(fmt::format("cannot start {}: {}", binary, std::strerror(rc)));
    }
    return OkStatus();
  }
  // One chat, retried until the server answers (up to `timeout`).
  Status Chat(std::chrono::seconds timeout) {
    const std::string body =
        R"({"model":"demo-chat","messages":[{"role":"user","content":"hello"}],"max_tokens":2})";
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      const int status = PostLoopback(port_, "/v1/chat/completions", body);
      if (status == 200) return OkStatus();
      if (status > 0) return InternalError(fmt::format("second process: chat answered {}", status));
      int wstatus = 0;
      if (::waitpid(pid_, &wstatus, WNOHANG) == pid_) {
        pid_ = 0;
        return InternalError("second process exited; see its log");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return InternalError("second process did not answer in time");
  }
  Result<ProcessMemoryInfo> Memory() const {
    return ReadProcessMemory("/proc/" + std::to_string(pid_) + "/status");
  }

 private:
  pid_t pid_ = 0;
  int port_ = 0;
};

Result<MemoryBenchState> Measure(Runtime& rt, std::string name) {
  const RuntimeStatus s = rt.Status();
  ARBITER_ASSIGN_OR_RETURN(ProcessMemoryInfo mem, ReadProcessMemory());
  MemoryBenchState st;
  st.name = std::move(name);
  st.by_kind = s.ledger.by_kind;
  st.charged_bytes = s.ledger.charged_bytes;
  st.runtime_bytes = s.ledger.runtime_bytes;
  st.anon_bytes = mem.anon_bytes;
  st.shmem_bytes = mem.shmem_bytes;
  return st;
}

Status Chat(Runtime& rt, const std::string& conversation, const std::string& text, int tokens) {
  TextRequest t;
  t.model = "demo-chat";
  t.messages = {{"user", text}};
  t.max_tokens = tokens;
  t.sampling.temperature = 0;
  t.conversation_id = conversation;
  ARBITER_ASSIGN_OR_RETURN(std::unique_ptr<TextGeneration> g, rt.StartText(std::move(t)));
  return g->Run(nullptr, nullptr).status();
}

}  // namespace

double MemoryBenchState::ratio() const {
  return ledger_bytes() == 0 ? 0.0
                             : static_cast<double>(resident_bytes()) /
                                   static_cast<double>(ledger_bytes());
}

uint64_t MemoryBenchState::tolerance_bytes() const {
  return std::max(kToleranceFloorBytes,
                  static_cast<uint64_t>(kToleranceFraction * static_cast<double>(ledger_bytes())));
}

bool MemoryBenchState::within() const {
  return static_cast<uint64_t>(std::llabs(unaccounted_bytes())) <= tolerance_bytes();
}

bool MemoryBenchResult::all_within() const {
  return std::all_of(states.begin(), states.end(),
                     [](const MemoryBenchState& s) { return s.within(); });
}

Result<MemoryBenchResult> RunMemoryBench(const MemoryBenchOptions& options) {
  TempDir tmp;
  if (tmp.path.empty()) return InternalError("cannot create a temp directory");
  std::string chat_dir = options.chat_dir, embed_dir = options.embed_dir;
  if (chat_dir.empty()) {
    chat_dir = (tmp.path / "demo-chat").string();
    ARBITER_RETURN_IF_ERROR(MakeModel("demo-chat", chat_dir, 1, nullptr));
  }
  if (embed_dir.empty()) {
    embed_dir = (tmp.path / "demo-embed").string();
    ARBITER_RETURN_IF_ERROR(MakeModel("demo-embed", embed_dir, 1, nullptr));
  }
  chat_dir = fs::absolute(chat_dir).string();
  embed_dir = fs::absolute(embed_dir).string();

  ARBITER_ASSIGN_OR_RETURN(SystemMemoryInfo sys, ReadSystemMemory());
  Config c = DefaultConfig(sys.total_bytes);
  c.state_dir = (tmp.path / "state").string();
  c.pressure.source = PressureSourceKind::kNone;
  c.weights.shared_host_weights = true;
  ModelEntry chat;
  chat.name = "demo-chat";
  chat.path = chat_dir;
  chat.capability = Capability::kText;
  ModelEntry embed;
  embed.name = "demo-embed";
  embed.path = embed_dir;
  embed.capability = Capability::kEmbedding;
  c.models = {chat, embed};
  ARBITER_ASSIGN_OR_RETURN(std::unique_ptr<Runtime> rt, Runtime::Create(c));

  MemoryBenchResult out;
  auto measure = [&](const char* name) -> Status {
    ARBITER_ASSIGN_OR_RETURN(MemoryBenchState st, Measure(*rt, name));
    out.states.push_back(std::move(st));
    return OkStatus();
  };
  auto step = [](const char* state, const Status& s) {
    return s.ok() ? s : s.WithPrefix(fmt::format("state {}", state));
  };

  ARBITER_RETURN_IF_ERROR(measure("idle"));
  ARBITER_RETURN_IF_ERROR(step("chat", Chat(*rt, "", "hello", 4)));
  ARBITER_RETURN_IF_ERROR(measure("chat"));
  EmbedRequest e;
  e.model = "demo-embed";
  e.inputs = {"hello world"};
  ARBITER_RETURN_IF_ERROR(step("chat+embed", rt->Embed(e, nullptr).status()));
  ARBITER_RETURN_IF_ERROR(measure("chat+embed"));
  for (int i = 0; i < options.conversations; ++i) {
    std::string text = fmt::format("conversation {}:", i);
    for (int w = 0; w < options.prompt_tokens; ++w) text += fmt::format(" word{}", (w * 7 + i) % 97);
    ARBITER_RETURN_IF_ERROR(step("conversations", Chat(*rt, fmt::format("bench-{}", i), text, 2)));
  }
  ARBITER_RETURN_IF_ERROR(measure("conversations"));
  ARBITER_RETURN_IF_ERROR(
      step("pinned_floor", rt->SetResidency("demo-chat", ResidencyState::kPinnedSystem).status()));
  ARBITER_RETURN_IF_ERROR(measure("pinned_floor"));
  {
    SecondProcess second;
    ARBITER_RETURN_IF_ERROR(step("shared_floor", second.Start(options.arbiter_binary, tmp.path,
                                                              chat_dir)));
    ARBITER_RETURN_IF_ERROR(step("shared_floor", second.Chat(std::chrono::seconds(120))));
    if (Result<ProcessMemoryInfo> m = second.Memory(); m.ok()) {
      out.second_process_shmem_bytes = m->shmem_bytes;
    }
    ARBITER_RETURN_IF_ERROR(measure("shared_floor"));
  }
  ARBITER_RETURN_IF_ERROR(
      step("unloaded", rt->SetResidency("demo-chat", ResidencyState::kUnpinned).status()));
  for (const char* m : {"demo-chat", "demo-embed"}) {
    ARBITER_RETURN_IF_ERROR(step("unloaded", rt->UnloadModel(m, 10000).status()));
  }
  ARBITER_RETURN_IF_ERROR(measure("unloaded"));
  rt->Shutdown();
  return out;
}

std::string FormatMemoryBench(const MemoryBenchResult& r) {
  auto mib = [](uint64_t b) { return static_cast<double>(b) / (1 << 20); };
  std::string s = fmt::format(
      "{:<14} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9} {:>10} {:>7}  {}\n", "state",
      "weights", "floor", "kv_slot", "prompt", "scratch", "runtime", "ledger", "anon", "shmem",
      "unacc.", "ratio", "target");
  for (const MemoryBenchState& st : r.states) {
    auto kind = [&](ChargeKind k) { return mib(st.by_kind[static_cast<size_t>(k)]); };
    s += fmt::format(
        "{:<14} {:>8.1f} {:>8.1f} {:>8.1f} {:>8.1f} {:>8.1f} {:>8.1f} {:>9.1f} {:>9.1f} {:>9.1f} "
        "{:>+10.1f} {:>7.3f}  {}\n",
        st.name, kind(ChargeKind::kDeviceWeights), kind(ChargeKind::kHostFloor),
        kind(ChargeKind::kKvSlot), kind(ChargeKind::kPromptCache), kind(ChargeKind::kScratch),
        mib(st.runtime_bytes), mib(st.ledger_bytes()), mib(st.anon_bytes), mib(st.shmem_bytes),
        static_cast<double>(st.unaccounted_bytes()) / (1 << 20), st.ratio(),
        st.within() ? fmt::format("ok (±{:.1f})", mib(st.tolerance_bytes()))
                    : fmt::format("OVER (±{:.1f})", mib(st.tolerance_bytes())));
  }
  s += fmt::format(
      "MiB; ledger = charged + runtime; ratio = (anon + shmem) / ledger; target |anon + shmem − "
      "ledger| ≤ max(5 %, 16 MiB). Second process RssShmem in shared_floor: {:.1f} MiB. {}\n",
      mib(r.second_process_shmem_bytes),
      r.all_within() ? "All states within target." : "SOME STATES OVER TARGET.");
  return s;
}

std::string FormatMemoryBenchJson(const MemoryBenchResult& r) {
  nlohmann::json states = nlohmann::json::array();
  for (const MemoryBenchState& st : r.states) {
    nlohmann::json kinds = nlohmann::json::object();
    for (size_t k = 0; k < kChargeKindCount; ++k) {
      kinds[std::string(ChargeKindName(static_cast<ChargeKind>(k)))] = st.by_kind[k];
    }
    states.push_back({{"state", st.name},
                      {"charged_by_kind", std::move(kinds)},
                      {"charged_bytes", st.charged_bytes},
                      {"runtime_bytes", st.runtime_bytes},
                      {"rss_anon_bytes", st.anon_bytes},
                      {"rss_shmem_bytes", st.shmem_bytes},
                      {"unaccounted_bytes", st.unaccounted_bytes()},
                      {"ratio", st.ratio()},
                      {"tolerance_bytes", st.tolerance_bytes()},
                      {"within", st.within()}});
  }
  nlohmann::json j = {{"states", std::move(states)},
                      {"second_process_shmem_bytes", r.second_process_shmem_bytes},
                      {"all_within", r.all_within()}};
  return j.dump(2) + "\n";
}

}  // namespace arbiter
