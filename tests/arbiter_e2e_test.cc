// End-to-end: the MemoryArbiter behind the real `arbiter serve` — budget
// eviction, the pressure bridge, the admin control API, the SSE event stream
// and /metrics — driven over HTTP on a free loopback port.
//
// Setup (once per test process): make three `tiny` models — "chat" (text),
// "ea" and "eb" (embedding) — and measure what each charges to the ledger
// once loaded with the server's own loader (LoadEngineModel over a
// WeightCache: the engine's KV and scratch plus the device weights). The
// budget is chat + one embedding model + half of one: chat + one embedding
// model fit, a second embedding model only after the first is evicted
// (reason "fit").
// Each test starts its own server ([pressure] source = "none", so only the
// POST /admin/pressure bridge moves the level and the host's real memory
// state cannot interfere) and kills it in TearDown.
//
// No wall-clock speed assertions: every wait polls with a generous deadline
// that only turns a hang into a failure.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "server_process.h"
#include "arbiter/runtime/models.h"
#include "tools/model_maker/model_maker.h"

extern char** environ;

namespace arbiter {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr const char* kApiKey = "arbiter-e2e-key";
constexpr int kCtx = 256;
// The chat model's context: long enough that a 1900-token stream outgrows
// the socket buffers of a client that does not read (UnloadOfAHeldModelIs409).
constexpr int kChatCtx = 2048;
// Bound on every wait: turns a hang into a failure, never a speed check.
constexpr auto kWait = std::chrono::seconds(60);

using ::arbiter::testing::FreeLoopbackPort;
using ::arbiter::testing::ReadAll;

bool PollUntil(const std::function<bool()>& done) {
  const auto deadline = Clock::now() + kWait;
  while (Clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return done();
}

// {"error":{"message","type","code"}} with `status` and a message containing
// `message_part`.
void ExpectError(const httplib::Result& r, int status, const std::string& message_part) {
  ASSERT_TRUE(r) << "no response";
  EXPECT_EQ(r->status, status) << r->body;
  json j = json::parse(r->body, nullptr, false);
  ASSERT_TRUE(j.is_object() && j.contains("error")) << r->body;
  EXPECT_TRUE(j["error"]["message"].is_string()) << r->body;
  EXPECT_TRUE(j["error"]["type"].is_string()) << r->body;
  EXPECT_TRUE(j["error"].contains("code")) << r->body;
  EXPECT_NE(j["error"]["message"].get<std::string>().find(message_part), std::string::npos)
      << r->body;
}

// Reads GET /admin/events on a background thread into a string.
class EventReader {
 public:
  EventReader(int port, bool auth = true) : cli_("127.0.0.1", port) {
    cli_.set_read_timeout(120, 0);
    if (auth) cli_.set_bearer_token_auth(kApiKey);
    thread_ = std::thread([this] {
      auto r = cli_.Get("/admin/events", [this](const char* data, size_t n) {
        std::lock_guard<std::mutex> l(mu_);
        text_.append(data, n);
        return true;
      });
      std::lock_guard<std::mutex> l(mu_);
      status_ = r ? r->status : -1;
      ended_ = true;
    });
  }
  ~EventReader() { Stop(); }

  std::string text() {
    std::lock_guard<std::mutex> l(mu_);
    return text_;
  }
  bool ended() {
    std::lock_guard<std::mutex> l(mu_);
    return ended_;
  }
  // Waits for `needle` in the stream.
  bool WaitFor(const std::string& needle) {
    return PollUntil([&] { return text().find(needle) != std::string::npos; });
  }
  // Closes the connection from the client side and joins.
  void Stop() {
    if (thread_.joinable()) {
      cli_.stop();
      thread_.join();
    }
  }
  // Joins after the server ended the stream.
  void Join() {
    if (thread_.joinable()) thread_.join();
  }

 private:
  httplib::Client cli_;
  std::thread thread_;
  std::mutex mu_;
  std::string text_;
  int status_ = 0;
  bool ended_ = false;
};

// The `data:` JSON of every `event: <type>` frame in an SSE text.
std::vector<json> EventsOfType(const std::string& sse, const std::string& type) {
  std::vector<json> out;
  const std::string head = "event: " + type + "\ndata: ";
  size_t pos = 0;
  while ((pos = sse.find(head, pos)) != std::string::npos) {
    pos += head.size();
    const size_t end = sse.find('\n', pos);
    out.push_back(json::parse(sse.substr(pos, end - pos), nullptr, false));
  }
  return out;
}

class ArbiterE2E : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = ::arbiter::testing::MakeScratchDir("arb-e2e");
    ASSERT_FALSE(dir_.empty());
    ASSERT_TRUE(MakeModel("tiny", dir_ + "/chat", 1).ok());
    ASSERT_TRUE(MakeModel("tiny", dir_ + "/ea", 2).ok());
    ASSERT_TRUE(MakeModel("tiny", dir_ + "/eb", 3).ok());
    ModelEntry probe;
    probe.name = "probe";
    probe.path = dir_ + "/ea";
    probe.capability = Capability::kEmbedding;
    probe.ctx = kCtx;
    measured_ = LoadedCharge(probe);
    ModelEntry chat = probe;
    chat.path = dir_ + "/chat";
    chat.capability = Capability::kText;
    chat.ctx = kChatCtx;
    const uint64_t chat_charge = LoadedCharge(chat);
    ASSERT_GT(measured_, 0u);
    ASSERT_GT(chat_charge, 0u);
    budget_ = chat_charge + measured_ + measured_ / 2;
  }
  // What `m` charges to the ledger once loaded by the server's own loader:
  // its engine (KV slots and scratch, the arbiter's charge) plus its device
  // weights (the weight cache's charge).
  static uint64_t LoadedCharge(const ModelEntry& m) {
    Config c = DefaultConfig(uint64_t{8} << 30);
    c.budget_bytes = uint64_t{1} << 30;
    c.models = {m};
    MemoryLedger ledger;
    Result<std::unique_ptr<ServeWeights>> w = MakeServeWeights(c, &ledger, nullptr);
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    if (!w.ok()) return 0;
    Result<LoadedBackend> loaded = LoadEngineModel(m, (*w)->cache.get());
    EXPECT_TRUE(loaded.ok()) << loaded.status().ToString();
    if (!loaded.ok()) return 0;
    return loaded->resident_bytes + ledger.charged_bytes();
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }

  void SetUp() override { StartServer(); }
  void TearDown() override {
    if (HasFailure() || std::getenv("ARBITER_E2E_VERBOSE") != nullptr) {
      std::cerr << "---- serve.log ----\n" << ReadAll(log_path_) << "-------\n";
    }
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }

  // `ea_extra`: TOML lines added to model "ea"'s table.
  void StartServer(const std::string& ea_extra = "") {
    port_ = FreeLoopbackPort();
    ASSERT_GT(port_, 0);
    const std::string config = dir_ + "/arbiter-" + std::to_string(port_) + ".toml";
    std::ofstream(config) << "[server]\n"
                          << "port = " << port_ << "\n"
                          << "api_key = \"" << kApiKey << "\"\n"
                          << "[memory]\nbudget = " << budget_ << "\n"
                          << "[pressure]\nsource = \"none\"\n"
                          << "[[models]]\nname = \"chat\"\npath = \"chat\"\nctx = " << kChatCtx << "\n"
                          << "[[models]]\nname = \"ea\"\npath = \"ea\"\ncapability = "
                             "\"embedding\"\nctx = "
                          << kCtx << "\n"
                          << ea_extra
                          << "[[models]]\nname = \"eb\"\npath = \"eb\"\ncapability = "
                             "\"embedding\"\nrole = \"embedding\"\nidle_ttl = \"1h\"\nctx = "
                          << kCtx << "\n";
    log_path_ = dir_ + "/serve-" + std::to_string(port_) + ".log";
    std::string error;
    pid_ = ::arbiter::testing::StartServer(ARBITER_BINARY, config, dir_ + "/state", log_path_,
                                           port_, kWait, &error);
    ASSERT_GT(pid_, 0) << error;
  }

  httplib::Client Client(bool auth = true) const {
    httplib::Client cli("127.0.0.1", port_);
    cli.set_read_timeout(120, 0);
    cli.set_write_timeout(30, 0);
    if (auth) cli.set_bearer_token_auth(kApiKey);
    return cli;
  }
  httplib::Result Post(const std::string& path, const std::string& body) const {
    return Client().Post(path.c_str(), body, "application/json");
  }
  httplib::Result Embed(const std::string& model) const {
    return Post("/v1/embeddings", json{{"model", model}, {"input", "hello world"}}.dump());
  }
  httplib::Result Chat(int max_tokens = 4) const {
    return Post("/v1/chat/completions",
                json{{"model", "chat"},
                     {"messages", {{{"role", "user"}, {"content", "Say hello."}}}},
                     {"max_tokens", max_tokens},
                     {"temperature", 0}}
                    .dump());
  }
  httplib::Result Pressure(const std::string& level) const {
    return Post("/admin/pressure", json{{"level", level}}.dump());
  }
  json Status() const {
    auto r = Client().Get("/admin/status");
    if (!r || r->status != 200) return json();
    return json::parse(r->body, nullptr, false);
  }
  json Model(const std::string& name) const {
    json s = Status();
    if (!s.is_object()) return json();
    for (const json& m : s["models"]) {
      if (m["name"] == name) return m;
    }
    return json();
  }
  std::string Metrics() const {
    auto r = Client().Get("/metrics");
    return r && r->status == 200 ? r->body : std::string();
  }

  static std::string dir_;
  static size_t measured_;
  static size_t budget_;
  int port_ = -1;
  pid_t pid_ = -1;
  std::string log_path_;
};

std::string ArbiterE2E::dir_;
size_t ArbiterE2E::measured_ = 0;
size_t ArbiterE2E::budget_ = 0;

// The arbiter end to end: budget eviction (fit), pressure refusing embeddings
// but not text, recovery, with the SSE stream and /metrics watching.
TEST_F(ArbiterE2E, BudgetEvictionAndPressureOverHttp) {
  EventReader events(port_);
  ASSERT_TRUE(events.WaitFor(": subscribed")) << events.text();

  json s = Status();
  ASSERT_TRUE(s.is_object());
  EXPECT_EQ(s["budget_bytes"], budget_);
  EXPECT_EQ(s["pressure"], "nominal");
  EXPECT_EQ(s["pressure_source"], "none");
  EXPECT_EQ(Model("chat")["role"], "text-target");
  EXPECT_EQ(Model("ea")["role"], "embedding");
  EXPECT_EQ(Model("ea")["resident"], false);

  // chat + A fit; B needs A's room.
  auto chat = Chat();
  ASSERT_TRUE(chat);
  ASSERT_EQ(chat->status, 200) << chat->body;
  auto a = Embed("ea");
  ASSERT_TRUE(a);
  ASSERT_EQ(a->status, 200) << a->body;
  EXPECT_EQ(Model("ea")["resident"], true);
  EXPECT_EQ(Model("ea")["state"], "loaded");
  auto b = Embed("eb");
  ASSERT_TRUE(b);
  ASSERT_EQ(b->status, 200) << b->body;

  s = Status();
  for (const json& m : s["models"]) {
    EXPECT_TRUE(m.contains("ref_count") && m.contains("bytes") && m.contains("capability"))
        << m.dump();
    EXPECT_EQ(m["ref_count"], 0) << m.dump();
  }
  EXPECT_EQ(Model("ea")["resident"], false) << s.dump();
  EXPECT_EQ(Model("ea")["evictions"], 1) << s.dump();
  EXPECT_EQ(Model("eb")["resident"], true) << s.dump();
  EXPECT_EQ(Model("chat")["resident"], true) << s.dump();
  EXPECT_LE(s["charged_bytes"].get<size_t>(), s["budget_bytes"].get<size_t>()) << s.dump();

  const std::string metrics = Metrics();
  EXPECT_NE(metrics.find("arbiter_evictions_total{reason=\"fit\"} 1"), std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("arbiter_model_loads_total{capability=\"embedding\",model=\"ea\"} 1"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("arbiter_model_resident{capability=\"embedding\",model=\"ea\"} 0"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("arbiter_memory_budget_bytes " + std::to_string(budget_)),
            std::string::npos)
      << metrics;

  // The stream saw the loads and the fit eviction of A.
  ASSERT_TRUE(events.WaitFor("event: eviction")) << events.text();
  std::vector<json> evictions = EventsOfType(events.text(), "eviction");
  ASSERT_FALSE(evictions.empty());
  EXPECT_EQ(evictions[0]["type"], "eviction");
  EXPECT_EQ(evictions[0]["model_key"], "ea");
  EXPECT_EQ(evictions[0]["reason"], "fit");
  EXPECT_EQ(evictions[0]["capability"], "embedding");
  EXPECT_GT(evictions[0]["estimated_bytes"].get<size_t>(), 0u);
  std::vector<json> loads = EventsOfType(events.text(), "model_load");
  ASSERT_GE(loads.size(), 3u) << events.text();
  EXPECT_TRUE(loads[0]["load_ms"].is_number());
  EXPECT_TRUE(loads[0]["at_ms"].is_number_integer());

  // Critical pressure: embeddings refused with 503 + Retry-After, text served.
  auto crit = Pressure("critical");
  ASSERT_TRUE(crit);
  ASSERT_EQ(crit->status, 200) << crit->body;
  EXPECT_EQ(json::parse(crit->body)["pressure"], "critical");
  EXPECT_EQ(Status()["pressure"], "critical");
  EXPECT_EQ(Model("eb")["resident"], false);  // idle non-text evicted
  auto refused = Embed("eb");
  ExpectError(refused, 503, "memory pressure is critical");
  ASSERT_TRUE(refused);
  EXPECT_FALSE(refused->get_header_value("Retry-After").empty());
  EXPECT_EQ(json::parse(refused->body)["error"]["code"], "memory_pressure");
  auto chat2 = Chat();
  ASSERT_TRUE(chat2);
  EXPECT_EQ(chat2->status, 200) << chat2->body;
  ASSERT_TRUE(events.WaitFor("\"level\":\"critical\"")) << events.text();
  EXPECT_NE(Metrics().find("arbiter_memory_pressure_level 2"), std::string::npos);

  // Back to nominal: embeddings work again.
  auto nominal = Pressure("nominal");
  ASSERT_TRUE(nominal);
  ASSERT_EQ(nominal->status, 200) << nominal->body;
  EXPECT_EQ(Status()["pressure"], "nominal");
  auto again = Embed("eb");
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 200) << again->body;
  s = Status();
  EXPECT_LE(s["charged_bytes"].get<size_t>(), s["budget_bytes"].get<size_t>()) << s.dump();
  events.Stop();
}

TEST_F(ArbiterE2E, LoadUnloadRoundTripAndErrors) {
  auto load = Post("/admin/models/ea/load", "");
  ASSERT_TRUE(load);
  ASSERT_EQ(load->status, 200) << load->body;
  json j = json::parse(load->body);
  EXPECT_EQ(j["name"], "ea");
  EXPECT_EQ(j["resident"], true);
  EXPECT_EQ(j["ref_count"], 0);  // loaded, not pinned
  EXPECT_EQ(Model("ea")["state"], "loaded");

  auto unload = Post("/admin/models/ea/unload", "");
  ASSERT_TRUE(unload);
  ASSERT_EQ(unload->status, 200) << unload->body;
  j = json::parse(unload->body);
  EXPECT_EQ(j["unloaded"], true);
  EXPECT_EQ(j["resident"], false);
  EXPECT_EQ(Model("ea")["resident"], false);
  EXPECT_NE(Metrics().find("arbiter_model_unloads_total{reason=\"manual\"} 1"), std::string::npos);

  // Unloading what is not resident is not an error.
  auto again = Post("/admin/models/ea/unload?timeout_ms=0", "");
  ASSERT_TRUE(again);
  ASSERT_EQ(again->status, 200) << again->body;
  EXPECT_EQ(json::parse(again->body)["unloaded"], false);

  ExpectError(Post("/admin/models/nope/load", ""), 404, "model \"nope\" not found");
  ExpectError(Post("/admin/models/nope/unload", ""), 404, "model \"nope\" not found");
  ExpectError(Post("/admin/models/ea/unload?timeout_ms=soon", ""), 400, "\"timeout_ms\"");

  // Bad pressure bodies: 400 naming the field; the level does not move.
  ExpectError(Post("/admin/pressure", "not json"), 400, "not valid JSON");
  ExpectError(Post("/admin/pressure", "[1]"), 400, "JSON object");
  ExpectError(Post("/admin/pressure", "{}"), 400, "\"level\"");
  ExpectError(Post("/admin/pressure", R"({"level":"panic"})"), 400, "\"level\"");
  ExpectError(Post("/admin/pressure", R"({"level":3})"), 400, "\"level\"");
  ExpectError(Post("/admin/pressure", R"({"level":"low","free_mb":-1})"), 400, "\"free_mb\"");
  ExpectError(Post("/admin/pressure", R"({"level":"low","free_mb":"lots"})"), 400, "\"free_mb\"");
  EXPECT_EQ(Status()["pressure"], "nominal");
  auto low = Post("/admin/pressure", R"({"level":"low","free_mb":512})");
  ASSERT_TRUE(low);
  ASSERT_EQ(low->status, 200) << low->body;
  EXPECT_EQ(json::parse(low->body)["level"], "low");
  EXPECT_EQ(json::parse(low->body)["free_mb"], 512);

  // Admin endpoints and /metrics need the key.
  EXPECT_EQ(Client(false).Get("/admin/status")->status, 401);
  EXPECT_EQ(Client(false).Post("/admin/pressure", R"({"level":"nominal"})", "application/json")->status,
            401);
  EXPECT_EQ(Client(false).Post("/admin/models/ea/load", "", "application/json")->status, 401);
  EXPECT_EQ(Client(false).Get("/metrics")->status, 401);
  EXPECT_EQ(Client(false).Get("/admin/events")->status, 401);
}

// Opens a raw connection with a tiny receive buffer, sends a long streaming
// chat and reads only the response head: the server's writes soon block,
// so the generation (and its handle) stays in flight. Returns the socket.
int StartStalledStream(int port, int seed) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  const int small = 2048;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  const std::string body = json{{"model", "chat"},
                                {"messages", {{{"role", "user"}, {"content", "Talk."}}}},
                                {"max_tokens", kChatCtx - 100},
                                {"temperature", 1.0},
                                {"seed", seed},
                                {"stream", true}}
                               .dump();
  const std::string request = "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                              "Authorization: Bearer " + std::string(kApiKey) +
                              "\r\nContent-Type: application/json\r\nContent-Length: " +
                              std::to_string(body.size()) + "\r\n\r\n" + body;
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    close(fd);
    return -1;
  }
  return fd;
}

TEST_F(ArbiterE2E, UnloadOfAHeldModelIs409) {
  // A generation holds the chat model while its client does not read. If it
  // happens to finish before we look (short output, large buffers), retry.
  bool saw_409 = false;
  for (int attempt = 0; attempt < 10 && !saw_409; ++attempt) {
    const int fd = StartStalledStream(port_, 100 + attempt);
    ASSERT_GE(fd, 0);
    bool held = false;
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (!held && Clock::now() < deadline) {
      held = Model("chat")["ref_count"] == 1;
      if (!held) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (held) {
      auto r = Post("/admin/models/chat/unload?timeout_ms=100", "");
      ASSERT_TRUE(r);
      if (r->status == 409) {
        saw_409 = true;
        ExpectError(r, 409, "is held by 1 handle(s); not unloaded");
        EXPECT_EQ(json::parse(r->body)["error"]["code"], "model_in_use");
        EXPECT_EQ(Model("chat")["resident"], true);
      }
    }
    close(fd);  // the server's write fails; the generation stops
    ASSERT_TRUE(PollUntil([&] { return Model("chat")["ref_count"] == 0; }));
  }
  EXPECT_TRUE(saw_409) << "never caught the chat model held by a request";
  auto r = Post("/admin/models/chat/unload", "");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(Model("chat")["resident"], false);
}

TEST_F(ArbiterE2E, EventsSubscriptionEndsWhenTheClientLeaves) {
  {
    EventReader events(port_);
    ASSERT_TRUE(events.WaitFor(": subscribed")) << events.text();
    EXPECT_EQ(Status()["event_streams"], 1);
    auto p = Pressure("low");
    ASSERT_TRUE(p);
    ASSERT_TRUE(events.WaitFor("event: memory_pressure")) << events.text();
    std::vector<json> pe = EventsOfType(events.text(), "memory_pressure");
    ASSERT_FALSE(pe.empty());
    EXPECT_EQ(pe.back()["level"], "low");
    EXPECT_EQ(pe.back()["source"], "bridge");
    events.Stop();
  }
  // The server notices the hang-up and drops the subscription.
  EXPECT_TRUE(PollUntil([&] { return Status()["event_streams"] == 0; })) << Status().dump();
  auto health = Client(false).Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

TEST_F(ArbiterE2E, EventStreamsAreCappedAtHalfTheWorkers) {
  // Default threads: 8 + Σ parallel (3) = 11 → at most 5 streams.
  std::vector<std::unique_ptr<EventReader>> readers;
  for (int i = 0; i < 5; ++i) {
    readers.push_back(std::make_unique<EventReader>(port_));
    ASSERT_TRUE(readers.back()->WaitFor(": subscribed")) << i;
  }
  httplib::Client cli = Client();
  cli.set_read_timeout(10, 0);  // a stream (the bug) would time out, not hang
  auto r = cli.Get("/admin/events");
  ExpectError(r, 503, "too many open /admin/events streams");
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->get_header_value("Retry-After").empty());
  // Requests are still served.
  auto e = Embed("ea");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->status, 200) << e->body;
  readers.clear();
  EXPECT_TRUE(PollUntil([&] { return Status()["event_streams"] == 0; })) << Status().dump();
}

TEST_F(ArbiterE2E, RoleAndIdleTtlFromTheConfig) {
  // Restart with ea as a drafter that unloads after 1 s idle.
  TearDown();
  StartServer("role = \"drafter\"\nidle_ttl = \"1s\"\n");
  EXPECT_EQ(Model("ea")["role"], "drafter");
  EXPECT_EQ(Model("eb")["role"], "embedding");
  EventReader events(port_);
  ASSERT_TRUE(events.WaitFor(": subscribed")) << events.text();
  auto a = Embed("ea");
  ASSERT_TRUE(a);
  ASSERT_EQ(a->status, 200) << a->body;
  // The idle reaper unloads it (reason "idle") without any request.
  EXPECT_TRUE(PollUntil([&] { return Model("ea")["resident"] == false; })) << Status().dump();
  ASSERT_TRUE(events.WaitFor("\"reason\":\"idle\"")) << events.text();
  EXPECT_NE(Metrics().find("arbiter_model_unloads_total{reason=\"idle\"} 1"), std::string::npos);
  events.Stop();
}

TEST_F(ArbiterE2E, SigtermWithAnOpenEventsStreamExitsCleanly) {
  EventReader events(port_);
  ASSERT_TRUE(events.WaitFor(": subscribed")) << events.text();
  ASSERT_EQ(kill(pid_, SIGTERM), 0);
  int status = 0;
  pid_t got = 0;
  const auto deadline = Clock::now() + kWait;
  while (Clock::now() < deadline && (got = waitpid(pid_, &status, WNOHANG)) == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(got, pid_) << "arbiter serve did not exit with an events stream open";
  pid_ = -1;
  ASSERT_TRUE(WIFEXITED(status)) << "terminated by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  // The server ended the stream; the reader sees the end.
  EXPECT_TRUE(PollUntil([&] { return events.ended(); }));
  events.Join();
}

}  // namespace
}  // namespace arbiter
