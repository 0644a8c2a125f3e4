// End-to-end fault matrix: the real `arbiter serve` under the faults a
// server meets in the field, each test ending with the server still serving
// and nothing lost or half-written (docs/config.md "Fault-injection hooks"
// lists the test-only hooks some of them use).
//
//   (a) a model file replaced or truncated while serving: loaded afresh
//       (never the old floor) or a clear error naming the file;
//   (b) a weight fill that fails half-way leaves no charge, arena block or
//       shared region;
//   (c) SIGKILL mid-stream and mid-KV-save: only complete, valid KV files
//       remain, and the restarted server restores and serves;
//   (d) a full disk while persisting KV: the request succeeds, the error is
//       logged and counted, the older good file is kept;
//   (e) a pressure storm from the bridge while 8 clients generate;
//   (f) a client that disconnects mid-stream, or stops reading a long
//       stream, has its slot and handle released within 1 s;
//   (g) hostile bodies get clear 400s; embeddings requests are capped in
//       inputs and in tokens.
//
// Every test starts its own server (fresh state dir, free loopback port).
// No wall-clock speed assertions: waits poll with deadlines; the "within
// 1 s" release bounds are deadlines, polled every few milliseconds.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "arbiter/kv/kv_file.h"
#include "tools/model_maker/model_maker.h"
#include "server_process.h"

namespace arbiter {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using ::arbiter::testing::ConnectLoopback;
using ::arbiter::testing::FreeLoopbackPort;
using ::arbiter::testing::ReadAll;
using Proc = ::arbiter::testing::ServerProc;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr auto kStartWait = seconds(120);
// Context of the "chat" model: long enough that a stream outruns every
// socket buffer between the server and a client that stopped reading.
constexpr int kLongCtx = 32768;

// Extra TOML of one server, by table.
struct ServerConfig {
  std::string server;  // lines of [server]
  std::string memory;  // lines of [memory]
  std::string kv;      // lines of [kv]
  std::string chat;    // lines of the "chat" model's table
  std::string chat_name = "chat";  // its name
  int parallel = 2;                // its slots
  // > 0: the child's RLIMIT_FSIZE (bytes), with SIGXFSZ ignored, so a write
  // past it fails with EFBIG like a write to a full disk.
  uint64_t file_size_limit = 0;
  std::string extra_models;  // more [[models]] tables
  std::vector<std::string> env;  // "NAME=value" for the child
};

class FaultE2E : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/arbiter-fault-e2e-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = new std::string(tmpl);
    // Only the RoPE table grows: long streams stay cheap to compute.
    ASSERT_TRUE(::arbiter::testing::MakeTinyModelWithContext(*dir_ + "/chat", 1, kLongCtx).ok());
    ASSERT_TRUE(MakeModel("tiny", *dir_ + "/embed", 2).ok());
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*dir_, ec);
    delete dir_;
  }

  void SetUp() override {
    state_ = *dir_ + "/state-" + std::to_string(counter_++);
    fs::create_directories(state_);
  }
  void TearDown() override {
    for (Proc& p : procs_) {
      if (HasFailure()) std::cerr << "---- " << p.log << " ----\n" << ReadAll(p.log) << "\n";
      ::arbiter::testing::KillServer(p, SIGKILL);
    }
  }

  std::string ConfigText(int port, const ServerConfig& c) const {
    std::ostringstream o;
    o << "[server]\nport = " << port << "\n"
      << c.server << "\n"
      << "[memory]\nbudget = \"2GiB\"\n"
      << c.memory << "\n"
      // The host's real pressure must not turn requests into 503s.
      << "[pressure]\nsource = \"none\"\n"
      << "[kv]\ndir = \"" << state_ << "/kv\"\n"
      << c.kv << "\n"
      << "[[models]]\nname = \"" << c.chat_name << "\"\npath = \"" << *dir_
      << "/chat\"\nparallel = " << c.parallel << "\n"
      << c.chat << "\n"
      << "[[models]]\nname = \"embed\"\npath = \"" << *dir_
      << "/embed\"\ncapability = \"embedding\"\n"
      << c.extra_models;
    return o.str();
  }

  // Starts a server and waits for /health; the returned index names it in
  // procs_ (the test's servers are all killed at teardown).
  size_t Start(const ServerConfig& c = {}) {
    Proc p;
    p.port = FreeLoopbackPort();
    const std::string base = state_ + "/server-" + std::to_string(procs_.size());
    std::ofstream(base + ".toml") << ConfigText(p.port, c);
    p.log = base + ".log";
    std::string error;
    // Limits and ignored signals are inherited across fork and exec: set
    // them for the spawn only (this process writes nothing meanwhile).
    rlimit old_limit{};
    getrlimit(RLIMIT_FSIZE, &old_limit);
    sighandler_t old_xfsz = SIG_DFL;
    if (c.file_size_limit > 0) {
      rlimit l = old_limit;
      l.rlim_cur = c.file_size_limit;
      setrlimit(RLIMIT_FSIZE, &l);
      old_xfsz = signal(SIGXFSZ, SIG_IGN);
    }
    p.pid = ::arbiter::testing::SpawnServer(ARBITER_BINARY, base + ".toml", state_, p.log, &error,
                                            c.env);
    if (c.file_size_limit > 0) {
      setrlimit(RLIMIT_FSIZE, &old_limit);
      signal(SIGXFSZ, old_xfsz);
    }
    if (p.pid > 0 &&
        !::arbiter::testing::WaitHealthy(p.pid, p.port, p.log, kStartWait, &error)) {
      p.pid = -1;
    }
    EXPECT_GT(p.pid, 0) << error;
    procs_.push_back(p);
    return procs_.size() - 1;
  }
  Proc& P(size_t i) { return procs_[i]; }

  static httplib::Result Post(const Proc& p, const std::string& path, const std::string& body) {
    httplib::Client cli("127.0.0.1", p.port);
    cli.set_read_timeout(300, 0);
    cli.set_write_timeout(60, 0);
    return cli.Post(path.c_str(), body, "application/json");
  }
  static httplib::Result Post(const Proc& p, const std::string& path, const json& body) {
    return Post(p, path, body.dump());
  }
  static json Get(const Proc& p, const std::string& path) {
    httplib::Client cli("127.0.0.1", p.port);
    cli.set_read_timeout(60, 0);
    auto r = cli.Get(path.c_str());
    if (!r || r->status != 200) return json();
    return json::parse(r->body, nullptr, false);
  }
  static json ModelStatus(const Proc& p, const std::string& name) {
    json s = Get(p, "/admin/status");
    if (s.is_object()) {
      for (const json& m : s["models"]) {
        if (m["name"] == name) return m;
      }
    }
    return json();
  }
  // Slots of `model` marked busy in GET /admin/kv; -1 when unknown.
  static int BusySlots(const Proc& p, const std::string& model) {
    json kv = Get(p, "/admin/kv");
    if (!kv.is_object()) return -1;
    for (const json& m : kv["models"]) {
      if (m["name"] != model) continue;
      int busy = 0;
      for (const json& s : m["slots"]) busy += s["busy"].get<bool>() ? 1 : 0;
      return busy;
    }
    return -1;
  }
  // Neither a handle on the model nor a busy slot.
  static bool ChatIdle(const Proc& p, const std::string& model = "chat") {
    return ModelStatus(p, model)["refcount"] == 0 && BusySlots(p, model) == 0;
  }
  // Polls `done` every 5 ms until it holds or `limit` passes.
  template <typename Fn>
  static bool Within(Clock::duration limit, Fn done) {
    const auto deadline = Clock::now() + limit;
    while (true) {
      if (done()) return true;
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(milliseconds(5));
    }
  }
  static bool LogEventually(const Proc& p, const std::string& text) {
    return Within(seconds(60), [&] { return ReadAll(p.log).find(text) != std::string::npos; });
  }

  static json ChatBody(int max_tokens, bool stream = false, const std::string& model = "chat") {
    return json{{"model", model},
                {"messages", {{{"role", "user"}, {"content", "Say hello."}}}},
                {"max_tokens", max_tokens},
                // Greedy: the random weights of "tiny" cycle without ever
                // choosing end-of-sequence, so a stream runs to max_tokens.
                {"temperature", 0},
                {"stream", stream}};
  }
  // One non-streaming turn of `conversation`; the status, and the KV source
  // header in `*source` when given.
  static int Turn(const Proc& p, const std::string& conversation, const std::string& user,
                  std::string* source = nullptr) {
    json body = ChatBody(4);
    body["conversation_id"] = conversation;
    body["messages"] = {{{"role", "user"}, {"content", user}}};
    auto r = Post(p, "/v1/chat/completions", body);
    if (!r) return 0;
    if (r->status != 200) ADD_FAILURE() << r->status << " " << r->body;
    if (source != nullptr) *source = r->get_header_value("X-Arbiter-Kv-Source");
    return r->status;
  }
  // Regular files under the KV dir, relative to it, with their sizes.
  std::map<std::string, uintmax_t> KvFiles() const {
    std::map<std::string, uintmax_t> out;
    std::error_code ec;
    for (const auto& e : fs::recursive_directory_iterator(state_ + "/kv", ec)) {
      if (e.is_regular_file()) out[fs::relative(e.path(), state_ + "/kv").string()] = e.file_size();
    }
    return out;
  }
  // Every KV file under the KV dir is complete and valid: only "*.bin"
  // files (no temp file of an interrupted save), each read back whole and
  // checksummed for the model hash it is filed under.
  void ExpectOnlyValidKvFiles() const {
    std::error_code ec;
    for (const auto& e : fs::recursive_directory_iterator(state_ + "/kv", ec)) {
      if (!e.is_regular_file()) continue;
      const fs::path& path = e.path();
      EXPECT_EQ(path.extension(), ".bin") << "left behind: " << path;
      if (path.extension() != ".bin") continue;
      Result<KvSnapshot> kv = ReadKvFile(path.string(), path.parent_path().filename().string());
      EXPECT_TRUE(kv.ok()) << path << ": " << kv.status().ToString();
    }
  }
  // Closes a conversation (its KV is saved); the status.
  static int Close(const Proc& p, const std::string& conversation) {
    httplib::Client cli("127.0.0.1", p.port);
    cli.set_read_timeout(120, 0);
    auto r = cli.Post(("/admin/conversations/" + conversation + "/close").c_str(), "",
                      "application/json");
    return r ? r->status : 0;
  }

  // A metric's value from GET /metrics (the first sample whose line starts
  // with `name`); -1 when absent.
  static double Metric(const Proc& p, const std::string& name) {
    httplib::Client cli("127.0.0.1", p.port);
    auto r = cli.Get("/metrics");
    if (!r || r->status != 200) return -1;
    std::istringstream in(r->body);
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind(name, 0) == 0 && line.size() > name.size() &&
          (line[name.size()] == ' ' || line[name.size()] == '{')) {
        return std::stod(line.substr(line.rfind(' ') + 1));
      }
    }
    return -1;
  }

  // A short chat answered 200: the server still serves.
  static void ExpectServes(const Proc& p, const std::string& model = "chat") {
    auto r = Post(p, "/v1/chat/completions", ChatBody(4, false, model));
    ASSERT_TRUE(r) << "no answer";
    EXPECT_EQ(r->status, 200) << r->body;
  }
  static void Expect400(const httplib::Result& r, const std::string& part) {
    ASSERT_TRUE(r) << "no answer";
    EXPECT_EQ(r->status, 400) << r->body;
    json j = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("error")) << r->body;
    EXPECT_NE(j["error"]["message"].get<std::string>().find(part), std::string::npos)
        << j["error"]["message"];
  }

  // Sends a streaming chat request on a raw connection and reads until the
  // first SSE event arrived; -1 on failure. `rcvbuf` > 0 shrinks the
  // client's receive buffer first.
  static int OpenStream(const Proc& p, const json& body, int rcvbuf = 0) {
    int fd = -1;
    if (rcvbuf > 0) {
      fd = socket(AF_INET, SOCK_STREAM, 0);
      setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      addr.sin_port = htons(static_cast<uint16_t>(p.port));
      if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
        close(fd);
        return -1;
      }
    } else {
      fd = ConnectLoopback(p.port);
      if (fd < 0) return -1;
    }
    const std::string b = body.dump();
    const std::string req = "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                            "Content-Type: application/json\r\nContent-Length: " +
                            std::to_string(b.size()) + "\r\n\r\n" + b;
    if (send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
      close(fd);
      return -1;
    }
    std::string got;
    char buf[1024];
    const auto deadline = Clock::now() + seconds(60);
    while (got.find("data: ") == std::string::npos && Clock::now() < deadline) {
      const ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      got.append(buf, static_cast<size_t>(n));
    }
    if (got.find(" 200 ") == std::string::npos || got.find("data: ") == std::string::npos) {
      close(fd);
      return -1;
    }
    return fd;
  }

  static std::string* dir_;
  static int counter_;
  std::string state_;
  std::vector<Proc> procs_;
};

std::string* FaultE2E::dir_ = nullptr;
int FaultE2E::counter_ = 0;

// (g) Hostile bodies: each a 400 naming the problem, and the server keeps
// serving. Embeddings: more than max_embedding_inputs inputs, or more than
// max_embedding_tokens tokens in all, is a 400 naming the key.
TEST_F(FaultE2E, HostileBodiesAndOversizedEmbeddingsGet400s) {
  ServerConfig c;
  c.server = "max_embedding_tokens = 5000\n";
  const Proc& p = P(Start(c));
  ASSERT_GT(p.pid, 0);
  // 100,000-deep nesting: refused before parsing.
  const std::string deep = R"({"model":"chat","messages":)" + std::string(100000, '[') +
                           std::string(100000, ']') + "}";
  Expect400(Post(p, "/v1/chat/completions", deep), "nest deeper than 128 levels");
  // Invalid UTF-8, a number out of range, NaN.
  Expect400(Post(p, "/v1/chat/completions",
                 std::string(R"({"model":"chat","messages":[{"role":"user","content":"a)") +
                     "\xff\xfe" + "\"}]}"),
            "not valid JSON");
  Expect400(Post(p, "/v1/chat/completions",
                 std::string(R"({"model":"chat","messages":[{"role":"user","content":"a"}],)"
                             R"("max_tokens":1e400})")),
            "not valid JSON");
  Expect400(Post(p, "/v1/chat/completions",
                 std::string(R"({"model":"chat","messages":[{"role":"user","content":"a"}],)"
                             R"("temperature":NaN})")),
            "not valid JSON");

  // 5,000 inputs: over OpenAI's 2,048, refused before the model loads.
  json many = {{"model", "embed"}, {"input", std::vector<std::string>(5000, "hello")}};
  Expect400(Post(p, "/v1/embeddings", many), "max_embedding_inputs");
  EXPECT_EQ(ModelStatus(p, "embed")["loads"], 0);
  // 2,048 short inputs (2 tokens each) are fine...
  many["input"] = std::vector<std::string>(2048, "hi");
  auto ok = Post(p, "/v1/embeddings", many);
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  // ...but not more than 5,000 tokens in all (this server's limit).
  std::string words;
  for (int i = 0; i < 100; ++i) words += " hello world";
  json heavy = {{"model", "embed"}, {"input", std::vector<std::string>(40, words)}};
  Expect400(Post(p, "/v1/embeddings", heavy), "max_embedding_tokens");
  heavy["input"] = std::vector<std::string>(1, words);
  ok = Post(p, "/v1/embeddings", heavy);
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  EXPECT_EQ(ModelStatus(p, "embed")["refcount"], 0);
  ExpectServes(p);
}

// (f) A client that disconnects mid-stream: the generation stops and the
// slot and the model handle are released within 1 s of the close.
TEST_F(FaultE2E, ADisconnectMidStreamReleasesSlotAndHandleWithinASecond) {
  ServerConfig c;
  c.chat = "ctx = " + std::to_string(kLongCtx) + "\n";
  const Proc& p = P(Start(c));
  ASSERT_GT(p.pid, 0);
  for (int i = 0; i < 3; ++i) {
    const int fd = OpenStream(p, ChatBody(kLongCtx - 100, /*stream=*/true));
    ASSERT_GE(fd, 0) << "attempt " << i;
    // Generating: the handle is held and a slot busy.
    EXPECT_TRUE(Within(seconds(30), [&] {
      return ModelStatus(p, "chat")["refcount"] == 1 && BusySlots(p, "chat") == 1;
    }));
    close(fd);
    EXPECT_TRUE(Within(seconds(1), [&] { return ChatIdle(p); }))
        << "attempt " << i << ": refcount " << ModelStatus(p, "chat")["refcount"] << ", busy "
        << BusySlots(p, "chat");
  }
  EXPECT_TRUE(LogEventually(p, "client went away"));
  ExpectServes(p);
}

// (f) A client that stops reading a long stream: once the socket buffers and
// the server's stream buffer are full, generation blocks in Write(); when
// [server] write_timeout_s (1 s here) passes without progress the
// connection is closed, the generation is cancelled, and the slot and the
// handle are released within 1 s after that.
TEST_F(FaultE2E, AClientThatStopsReadingIsCancelledAfterTheWriteTimeout) {
  ServerConfig c;
  c.server = "write_timeout_s = 1\n";
  c.chat = "ctx = " + std::to_string(kLongCtx) + "\n";
  // Every chunk repeats the model's name: a long one makes each token cost
  // ~1 KiB on the wire, so the socket buffers (MiBs) fill in a few thousand
  // tokens.
  c.chat_name = "chat-" + std::string(800, 'x');
  const std::string model = c.chat_name;
  const Proc& p = P(Start(c));
  ASSERT_GT(p.pid, 0);
  const int fd =
      OpenStream(p, ChatBody(kLongCtx - 100, /*stream=*/true, model), /*rcvbuf=*/4096);
  ASSERT_GE(fd, 0);
  // Never read again. Watch the bytes queued on the connection (the
  // server's send queue and the client's receive queue, from
  // /proc/net/tcp): when they stop changing, the client has stopped
  // accepting bytes and the server's write is stuck.
  sockaddr_in me{};
  socklen_t len = sizeof(me);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len), 0);
  const int client_port = ntohs(me.sin_port);
  auto queued = [&] {
    std::ifstream in("/proc/net/tcp");
    std::string line;
    std::getline(in, line);  // header
    std::string sum;
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string sl, local, remote, st, queues;
      f >> sl >> local >> remote >> st >> queues;
      const int lport = std::stoi(local.substr(local.find(':') + 1), nullptr, 16);
      const int rport = std::stoi(remote.substr(remote.find(':') + 1), nullptr, 16);
      if ((lport == client_port && rport == p.port) || (lport == p.port && rport == client_port)) {
        sum += queues + ";";
      }
    }
    return sum;
  };
  std::string last_queued;
  auto last_progress = Clock::now();
  bool idle = false;
  const auto fuse = Clock::now() + seconds(180);
  while (Clock::now() < fuse) {
    if (ChatIdle(p, model)) {
      idle = true;
      break;
    }
    const std::string q = queued();
    if (q != last_queued) {
      last_queued = q;
      last_progress = Clock::now();
    }
    std::this_thread::sleep_for(milliseconds(20));
  }
  const auto idle_at = Clock::now();
  close(fd);
  ASSERT_TRUE(idle) << "the stalled stream still holds the model";
  // Cancelled, not finished (the log says how many tokens it made).
  EXPECT_TRUE(LogEventually(p, "client went away"));
  // The write timeout (1 s) runs from the start of the write the client
  // stopped accepting, no later than the queues' last change; released
  // ≤ 1 s after it expired.
  EXPECT_LE(idle_at - last_progress, seconds(2) + milliseconds(200))
      << "released " << std::chrono::duration_cast<milliseconds>(idle_at - last_progress).count()
      << " ms after the client stopped accepting bytes";
  ExpectServes(p, model);
}

// (d) The disk fills while KV is persisted (RLIMIT_FSIZE: the write fails
// with EFBIG past 256 KiB, as on a full disk): the request that displaced
// the conversation still succeeds, the error is logged and counted, no
// partial or temp file is left, and the conversation's older good file is
// still there.
TEST_F(FaultE2E, ADiskFullWhilePersistingKvKeepsTheOldFileAndServes) {
  ServerConfig c;
  c.parallel = 1;                 // a second conversation displaces the first...
  c.kv = "prompt_cache = 0\n";    // ...straight to disk
  c.file_size_limit = 128 << 10;  // f16 KV of ~500 tokens of "tiny"
  const Proc& p = P(Start(c));
  ASSERT_GT(p.pid, 0);
  // A short conversation "a", displaced by "b": saved whole.
  ASSERT_EQ(Turn(p, "a", "Hello there."), 200);
  ASSERT_EQ(Turn(p, "b", "Hi."), 200);
  const std::map<std::string, uintmax_t> before = KvFiles();
  ASSERT_EQ(before.size(), 1u);
  const std::string a_file = before.begin()->first;
  EXPECT_NE(a_file.find("/a."), std::string::npos) << a_file;
  EXPECT_LT(before.begin()->second, c.file_size_limit);
  EXPECT_EQ(Metric(p, "arbiter_kv_write_errors_total"), 0);
  // "a" comes back from disk and grows past the limit...
  std::string words = "Hello there.";
  for (int i = 0; i < 100; ++i) words += " memory budget";
  std::string source;
  ASSERT_EQ(Turn(p, "a", words, &source), 200);
  EXPECT_EQ(source, "disk");
  // ...then "b" displaces it again: the save fails, "b" is answered.
  ASSERT_EQ(Turn(p, "b", "Hi again."), 200);
  EXPECT_TRUE(LogEventually(p, "could not save conversation \"a\""));
  EXPECT_EQ(Metric(p, "arbiter_kv_write_errors_total"), 1);
  // No partial or temp file; a's older good file is untouched (b's file is
  // from when "a" displaced it).
  std::map<std::string, uintmax_t> after = KvFiles();
  EXPECT_EQ(after.size(), 2u);
  EXPECT_EQ(after[a_file], before.begin()->second);
  for (const auto& [name, bytes] : after) {
    EXPECT_TRUE(name == a_file || name.find("/b.short.bin") != std::string::npos) << name;
  }
  // And it still restores: "a" continues from its older prefix.
  ASSERT_EQ(Turn(p, "a", "Hello there. And more.", &source), 200);
  ExpectServes(p);
}

// (c) SIGKILL in the middle of a stream, then in the middle of a KV save
// (ARBITER_TEST_KV_WRITE_DELAY_MS holds the save half-written): after each
// restart every KV file on disk is complete and valid or absent — the
// interrupted save's temp file is removed at startup, the older file of the
// conversation is intact and restores — and the server serves.
TEST_F(FaultE2E, SigkillMidStreamAndMidKvSaveLeaveOnlyValidKvFiles) {
  ServerConfig c;
  c.chat = "ctx = " + std::to_string(kLongCtx) + "\n";
  size_t first = Start(c);
  ASSERT_GT(P(first).pid, 0);
  ASSERT_EQ(Turn(P(first), "a", "Hello there."), 200);
  ASSERT_EQ(Close(P(first), "a"), 200);
  const std::map<std::string, uintmax_t> saved = KvFiles();
  ASSERT_EQ(saved.size(), 1u);
  // Kill #1, mid-stream.
  const int fd = OpenStream(P(first), ChatBody(kLongCtx - 100, /*stream=*/true));
  ASSERT_GE(fd, 0);
  ::arbiter::testing::KillServer(P(first), SIGKILL);
  close(fd);
  ExpectOnlyValidKvFiles();
  EXPECT_EQ(KvFiles(), saved);

  // Restarted with every KV write paused half-way.
  c.env = {"ARBITER_TEST_KV_WRITE_DELAY_MS=60000"};
  size_t second = Start(c);
  ASSERT_GT(P(second).pid, 0);
  std::string source;
  ASSERT_EQ(Turn(P(second), "a", "Hello there. Tell me more about memory budgets.", &source),
            200);
  EXPECT_EQ(source, "disk");
  // Kill #2, mid-save: the close blocks in the paused write.
  std::thread closer([&, port = P(second).port] {
    Proc copy;
    copy.port = port;
    Close(copy, "a");  // fails when the server dies
  });
  const bool temp_seen = Within(seconds(60), [&] {
    for (const auto& [name, bytes] : KvFiles()) {
      if (name.find(".tmp.") != std::string::npos) return true;
    }
    return false;
  });
  ::arbiter::testing::KillServer(P(second), SIGKILL);
  closer.join();
  ASSERT_TRUE(temp_seen) << "the save never started";
  EXPECT_EQ(KvFiles().size(), 2u);  // the old file and the half-written temp

  c.env.clear();
  size_t third = Start(c);
  ASSERT_GT(P(third).pid, 0);
  ExpectOnlyValidKvFiles();
  EXPECT_EQ(KvFiles(), saved);  // the temp is gone, the old file intact
  ASSERT_EQ(Turn(P(third), "a", "Hello there. Once more.", &source), 200);
  EXPECT_EQ(source, "disk");
  ExpectServes(P(third));
}

// Entries of /dev/shm whose name starts with `prefix`.
std::vector<std::string> ShmEntries(const std::string& prefix) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/dev/shm", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0) out.push_back(name);
  }
  return out;
}

// (b) A load whose weight fill fails half-way (ARBITER_TEST_FILL_FAIL_MODEL:
// the arena block, the charges and, for a host floor, the shared region were
// taken and written, then the fill fails) leaves no charge, no arena block
// and no shared-memory region behind; the request gets a clear error and the
// other models serve.
TEST_F(FaultE2E, AFillThatFailsHalfWayLeavesNoChargeBlockOrRegion) {
  const std::string prefix = "arbiter-fault-" + std::to_string(getpid());
  ServerConfig c;
  c.memory = "shared_host_weights = true\nshared_host_weights_prefix = \"" + prefix + "\"\n";
  c.env = {"ARBITER_TEST_FILL_FAIL_MODEL=chat"};
  const Proc& p = P(Start(c));
  ASSERT_GT(p.pid, 0);
  // What loading charges: weights, floors, KV slots and scratch (the
  // process's own "runtime"/"other" bytes move with its RSS).
  auto model_charges = [&] {
    json s = Get(p, "/admin/status");
    uint64_t sum = 0;
    for (const char* k : {"device_weights", "host_floor", "kv_slot", "scratch"}) {
      sum += s["charged_by_kind"].value(k, uint64_t{0});
    }
    return std::make_pair(sum, s["pool"].value("in_use_bytes", uint64_t{0}));
  };
  const auto baseline = model_charges();
  EXPECT_EQ(baseline.first, 0u);
  EXPECT_EQ(baseline.second, 0u);

  auto r = Post(p, "/v1/chat/completions", ChatBody(4));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503) << r->body;
  EXPECT_NE(r->body.find("injected weight fill failure"), std::string::npos) << r->body;
  EXPECT_EQ(model_charges(), baseline);
  EXPECT_EQ(ModelStatus(p, "chat")["refcount"], 0);
  EXPECT_GE(ModelStatus(p, "chat")["load_failures"], 1);

  // A host floor in shared memory: created, half-filled, failed → unlinked.
  httplib::Client cli("127.0.0.1", p.port);
  cli.set_read_timeout(120, 0);
  auto pin = cli.Post("/admin/models/chat/residency", R"({"target":"pinned_system"})",
                      "application/json");
  ASSERT_TRUE(pin);
  EXPECT_GE(pin->status, 400) << pin->body;
  EXPECT_NE(pin->body.find("injected weight fill failure"), std::string::npos) << pin->body;
  EXPECT_EQ(model_charges(), baseline);
  EXPECT_TRUE(ShmEntries(prefix).empty()) << ShmEntries(prefix)[0];

  // Again, then the other model serves and nothing of "chat" is held.
  r = Post(p, "/v1/chat/completions", ChatBody(4));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503) << r->body;
  auto e = Post(p, "/v1/embeddings", json{{"model", "embed"}, {"input", "hello"}});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->status, 200) << e->body;
  EXPECT_TRUE(ShmEntries(prefix).empty());
  EXPECT_EQ(ModelStatus(p, "chat")["refcount"], 0);
  json s = Get(p, "/admin/status");
  EXPECT_EQ(s["charged_by_kind"]["host_floor"], 0);
}

// (e) A pressure storm: 1,000 level changes from the bridge
// (POST /admin/pressure), as fast as they go, while 8 clients generate and
// embed. No deadlock (everything finishes, the server answers afterwards),
// no model unloaded under a request (chat is always 200; an embedding is 200
// or, while critical, a clean 503 memory_pressure), every request answered.
TEST_F(FaultE2E, APressureStormWhileEightClientsGenerate) {
  ServerConfig c;
  c.parallel = 4;
  const Proc& p = P(Start(c));
  ASSERT_GT(p.pid, 0);
  ExpectServes(p);
  std::atomic<bool> storming{true};
  std::atomic<int> answered{0}, unanswered{0}, wrong{0};
  std::atomic<int> chats_ok{0}, embeds_ok{0}, embeds_refused{0};
  std::vector<std::string> errors;
  std::mutex errors_mu;
  auto note = [&](const std::string& e) {
    std::lock_guard<std::mutex> l(errors_mu);
    if (errors.size() < 10) errors.push_back(e);
  };
  std::vector<std::thread> clients;
  for (int i = 0; i < 8; ++i) {
    clients.emplace_back([&, i] {
      httplib::Client cli("127.0.0.1", p.port);
      cli.set_read_timeout(120, 0);
      // At least a few requests each, and on until the storm is over.
      for (int n = 0; n < 3 || storming.load(); ++n) {
        const bool embed = i % 4 == 3;  // 2 embedding clients, 6 chat clients
        auto r = embed ? cli.Post("/v1/embeddings",
                                  json{{"model", "embed"}, {"input", "hello " + std::to_string(n)}}
                                      .dump(),
                                  "application/json")
                       : cli.Post("/v1/chat/completions", ChatBody(8).dump(), "application/json");
        if (!r) {
          unanswered++;
          note("no answer: " + httplib::to_string(r.error()));
          continue;
        }
        answered++;
        if (r->status == 200) {
          (embed ? embeds_ok : chats_ok)++;
        } else if (embed && r->status == 503 &&
                   r->body.find("memory_pressure") != std::string::npos) {
          embeds_refused++;
        } else {
          wrong++;
          note(std::to_string(r->status) + " " + r->body);
        }
      }
    });
  }
  // The storm: 1,000 changes cycling nominal → low → critical, from two
  // bridge clients.
  std::atomic<int> changes{0}, change_failures{0};
  std::vector<std::thread> bridges;
  for (int b = 0; b < 2; ++b) {
    bridges.emplace_back([&, b] {
      httplib::Client cli("127.0.0.1", p.port);
      cli.set_read_timeout(60, 0);
      const char* levels[] = {"nominal", "low", "critical"};
      for (int n = 0; n < 500; ++n) {
        auto r = cli.Post("/admin/pressure", json{{"level", levels[(n + b) % 3]}}.dump(),
                          "application/json");
        if (r && r->status == 200) {
          changes++;
        } else {
          change_failures++;
        }
      }
    });
  }
  for (std::thread& t : bridges) t.join();
  storming = false;
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(changes.load(), 1000);
  EXPECT_EQ(change_failures.load(), 0);
  EXPECT_EQ(unanswered.load(), 0);
  EXPECT_EQ(wrong.load(), 0);
  for (const std::string& e : errors) ADD_FAILURE() << e;
  EXPECT_GT(chats_ok.load(), 0);
  // Back to nominal: both models serve, nothing is held.
  auto r = Post(p, "/admin/pressure", json{{"level", "nominal"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  ExpectServes(p);
  auto e = Post(p, "/v1/embeddings", json{{"model", "embed"}, {"input", "after"}});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->status, 200) << e->body;
  EXPECT_TRUE(Within(seconds(10), [&] {
    return ModelStatus(p, "chat")["refcount"] == 0 && ModelStatus(p, "embed")["refcount"] == 0;
  }));
  // The storm did unload the idle embedding model (and reloaded it).
  EXPECT_GT(ModelStatus(p, "embed")["evictions"], 0);
  std::cerr << "chats " << chats_ok << ", embeddings " << embeds_ok << " (+" << embeds_refused
            << " refused under critical pressure), " << changes << " level changes\n";
}

// (a) A model file replaced while the server runs (loaded, then unloaded):
// the change is detected by its size/mtime and the new file is loaded
// afresh — the old weights and the shared floor made from the old file are
// never served again, the region is unlinked. A truncated file is a clear
// error naming the file, and fixing the file fixes the model. The server
// keeps serving throughout. (A file truncated under the mapping in the
// middle of a fill: src/engine/internal/model_weights_test.cc.)
TEST_F(FaultE2E, AModelFileReplacedOrTruncatedWhileServing) {
  // A private copy of the model, to be replaced and truncated.
  const std::string model = state_ + "/victim";
  ASSERT_TRUE(MakeModel("tiny", model, 1).ok());
  const std::string prefix = "arbiter-fault-" + std::to_string(getpid());
  ServerConfig c;
  c.memory = "shared_host_weights = true\nshared_host_weights_prefix = \"" + prefix + "\"\n";
  c.extra_models = "[[models]]\nname = \"victim\"\npath = \"" + model +
                   "\"\nresidency = \"pinned_system\"\n";
  const Proc& p = P(Start(c));
  ASSERT_GT(p.pid, 0);
  auto complete = [&] { return Post(p, "/v1/chat/completions", ChatBody(12, false, "victim")); };
  auto text_of = [](const httplib::Result& r) {
    return json::parse(r->body)["choices"][0]["message"]["content"].get<std::string>();
  };
  auto regions = [&] {
    std::set<std::string> out;
    for (const std::string& n : ShmEntries(prefix + "-victim-")) out.insert(n);
    return out;
  };
  httplib::Client cli("127.0.0.1", p.port);
  cli.set_read_timeout(120, 0);
  auto unload = [&] {
    auto u = cli.Post("/admin/models/victim/unload", "", "application/json");
    ASSERT_TRUE(u);
    ASSERT_EQ(u->status, 200) << u->body;
  };
  auto r = complete();
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const std::string old_text = text_of(r);
  EXPECT_EQ(text_of(complete()), old_text);  // deterministic
  const std::set<std::string> old_regions = regions();
  ASSERT_FALSE(old_regions.empty());  // the floor, in shared memory
  unload();

  // Replaced (new weights renamed over the old file): loaded afresh.
  const std::string other = state_ + "/other";
  ASSERT_TRUE(MakeModel("tiny", other, 9).ok());
  fs::rename(other + "/model.safetensors", model + "/model.safetensors");
  r = complete();
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const std::string new_text = text_of(r);
  EXPECT_NE(new_text, old_text) << "the old weights were served";
  EXPECT_TRUE(LogEventually(p, "changed on disk"));
  for (const std::string& old : old_regions) {
    EXPECT_EQ(regions().count(old), 0u) << "stale region kept: " << old;
  }
  unload();

  // Truncated in place: a clear error naming the file; the others serve.
  const std::string weights = ReadAll(model + "/model.safetensors");
  fs::resize_file(model + "/model.safetensors", weights.size() / 2);
  r = complete();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503) << r->body;
  EXPECT_NE(r->body.find(model), std::string::npos) << r->body;
  ExpectServes(p);
  // Fixed on disk: served again, with the new weights.
  std::ofstream(model + "/model.safetensors", std::ios::binary | std::ios::trunc) << weights;
  r = complete();
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(text_of(r), new_text);
  ExpectServes(p);
}

}  // namespace
}  // namespace arbiter
