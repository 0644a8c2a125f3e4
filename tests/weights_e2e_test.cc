// End-to-end: the weight runtime behind the real `arbiter serve`
// (docs/architecture.md "Weight tiers"; docs/config.md "[memory]").
//
// WeightsE2E: one server per test — residency control, compaction, the
// status and metrics fields, externally-managed mode, and a reload after
// eviction that comes from the host floor (the model file is moved away
// first, so a read of the file would fail).
//
// SharedFloorsE2E: several real server processes with shared_host_weights
// on the same model files — one region in /dev/shm (mode 0600) whose
// proportional set size, summed over the processes, is one copy; a process
// SIGKILLed while filling the region (ARBITER_TEST_FLOOR_FILL_DELAY_MS) is
// replaced by another that rebuilds it and serves; a restart reuses a READY
// region; a stale version is swept after the model file changes.
//
// Every test uses a unique region prefix and removes its regions in
// TearDown. No wall-clock speed assertions: waits poll with deadlines that
// only turn a hang into a failure.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "arbiter/runtime/models.h"
#include "tools/model_maker/model_maker.h"
#include "server_process.h"

namespace arbiter {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ::arbiter::testing::FreeLoopbackPort;
using ::arbiter::testing::ReadAll;
using Proc = ::arbiter::testing::ServerProc;

constexpr auto kWait = std::chrono::seconds(120);

bool Contains(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

// Regions (not lock files) under /dev/shm whose name starts with `prefix-`.
std::vector<std::string> Regions(const std::string& prefix) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/dev/shm", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix + "-", 0) == 0 && name.size() > 5 &&
        name.compare(name.size() - 5, 5, ".lock") != 0) {
      out.push_back(name);
    }
  }
  return out;
}

// kB of proportional set size of `pid`'s mappings of /dev/shm/<region>.
uint64_t RegionPssKb(pid_t pid, const std::string& region) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/smaps");
  std::string line;
  bool in_region = false;
  uint64_t kb = 0;
  const std::string path = "/dev/shm/" + region;
  while (std::getline(in, line)) {
    // Mapping headers start with an address range "7f..-7f.. ".
    const bool header = !line.empty() && std::isxdigit(static_cast<unsigned char>(line[0])) &&
                        line.find('-') != std::string::npos && line.find(':') > line.find(' ');
    if (header) {
      in_region = Contains(line, path);
      continue;
    }
    if (in_region && line.rfind("Pss:", 0) == 0) {
      kb += std::stoull(line.substr(4));
    }
  }
  return kb;
}

class WeightsE2EBase : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = ::arbiter::testing::MakeScratchDir("weights-e2e");
    ASSERT_FALSE(dir_.empty());
    ASSERT_TRUE(MakeModel("tiny", dir_ + "/chat", 1).ok());
    ASSERT_TRUE(MakeModel("tiny", dir_ + "/ea", 2).ok());
    ModelEntry probe;
    probe.name = "chat";
    probe.path = dir_ + "/chat";
    probe.ctx = 256;
    Result<ModelFootprint> f = EstimateModelFootprint(probe);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    weight_bytes_ = f->weight_bytes;
    ASSERT_GT(weight_bytes_, 0u);
    Result<WeightModel> w =
        Engine::WeightModelFor(probe.path, probe.name, EngineOptionsFor(probe, nullptr));
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    scratch_bytes_ = w->scratch_bytes;
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }

  void SetUp() override {
    prefix_ = "arbtest" + std::to_string(getpid()) + "x" + std::to_string(counter_++);
  }
  void TearDown() override {
    for (Proc& p : procs_) {
      if (HasFailure()) std::cerr << "---- " << p.log << " ----\n" << ReadAll(p.log) << "\n";
      Kill(p, SIGKILL);
    }
    std::error_code ec;
    for (const auto& e : fs::directory_iterator("/dev/shm", ec)) {
      if (e.path().filename().string().rfind(prefix_ + "-", 0) == 0) fs::remove(e.path(), ec);
    }
  }

  // The TOML of a server on `port`; `memory` and `chat` are extra lines for
  // [memory] and the chat model's table.
  std::string Config(int port, const std::string& memory, const std::string& chat) const {
    std::ostringstream c;
    c << "[server]\nport = " << port << "\n"
      << server_extra_ << "\n"
      << "[memory]\nbudget = \"1GiB\"\n"
      << "shared_host_weights_prefix = \"" << prefix_ << "\"\n"
      << memory << "\n"
      << "[pressure]\nsource = \"none\"\n"
      << "[[models]]\nname = \"chat\"\npath = \"" << dir_ << "/chat\"\nctx = 256\n"
      << chat << "\n"
      << "[[models]]\nname = \"ea\"\npath = \"" << dir_ << "/ea\"\ncapability = \"embedding\"\n"
      << "ctx = 256\n";
    return c.str();
  }

  // Writes the config and spawns the server; does not wait.
  Proc Spawn(const std::string& memory, const std::string& chat,
             const std::vector<std::string>& env = {}) {
    Proc p;
    p.port = FreeLoopbackPort();
    EXPECT_GT(p.port, 0);
    const std::string base = dir_ + "/" + prefix_ + "-" + std::to_string(p.port);
    std::ofstream(base + ".toml") << Config(p.port, memory, chat);
    p.log = base + ".log";
    std::string error;
    p.pid = ::arbiter::testing::SpawnServer(ARBITER_BINARY, base + ".toml", base + "-state",
                                            p.log, &error, env);
    EXPECT_GT(p.pid, 0) << error;
    procs_.push_back(p);
    return p;
  }
  bool Healthy(const Proc& p) {
    std::string error;
    const bool ok = ::arbiter::testing::WaitHealthy(p.pid, p.port, p.log, kWait, &error);
    EXPECT_TRUE(ok) << error;
    return ok;
  }
  Proc Start(const std::string& memory = "", const std::string& chat = "") {
    Proc p = Spawn(memory, chat);
    if (!Healthy(p)) ADD_FAILURE() << "server did not start";
    return p;
  }
  static void Kill(Proc& p, int sig) { ::arbiter::testing::KillServer(p, sig); }
  void KillAll(int sig) {
    for (Proc& p : procs_) Kill(p, sig);
  }

  static httplib::Client Client(const Proc& p) {
    httplib::Client cli("127.0.0.1", p.port);
    cli.set_read_timeout(120, 0);
    return cli;
  }
  static httplib::Result Post(const Proc& p, const std::string& path, const std::string& body) {
    return Client(p).Post(path.c_str(), body, "application/json");
  }
  static httplib::Result Chat(const Proc& p) {
    return Post(p, "/v1/chat/completions",
                json{{"model", "chat"},
                     {"messages", {{{"role", "user"}, {"content", "hello"}}}},
                     {"max_tokens", 2}}
                    .dump());
  }
  static json Status(const Proc& p) {
    auto r = Client(p).Get("/admin/status");
    EXPECT_TRUE(r && r->status == 200);
    return r ? json::parse(r->body, nullptr, false) : json();
  }
  static json ModelOf(const json& status, const std::string& name) {
    for (const json& m : status["models"]) {
      if (m["name"] == name) return m;
    }
    ADD_FAILURE() << "no model " << name << " in " << status.dump();
    return json::object();
  }
  static httplib::Result SetResidency(const Proc& p, const std::string& model,
                                      const std::string& body) {
    return Post(p, "/admin/models/" + model + "/residency", body);
  }

  static std::string dir_;
  static uint64_t weight_bytes_;
  static uint64_t scratch_bytes_;  // one slot's activation scratch (max_scratch)
  static int counter_;
  std::string prefix_;
  std::string server_extra_;  // lines for [server]
  std::vector<Proc> procs_;
};

std::string WeightsE2EBase::dir_;
uint64_t WeightsE2EBase::weight_bytes_ = 0;
uint64_t WeightsE2EBase::scratch_bytes_ = 0;
int WeightsE2EBase::counter_ = 0;

using WeightsE2E = WeightsE2EBase;

TEST_F(WeightsE2E, ResidencyCompactionStatusAndMetrics) {
  Proc p = Start();
  json st = Status(p);
  ASSERT_TRUE(st.contains("weight_cache")) << st.dump();
  EXPECT_EQ(st["weight_cache"]["mode"], "self_managed");
  EXPECT_TRUE(st.contains("pool"));
  EXPECT_TRUE(st["charged_by_kind"].contains("device_weights"));
  json chat = ModelOf(st, "chat");
  EXPECT_EQ(chat["residency"], "unpinned");
  EXPECT_EQ(chat["device_resident"], false);
  EXPECT_EQ(chat["host_resident"], false);
  EXPECT_EQ(chat["weight_bytes"].get<uint64_t>(), weight_bytes_);

  // Bad input: unknown model, bad target, bad body.
  auto r = SetResidency(p, "nope", R"({"target":"pinned_device"})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  r = SetResidency(p, "chat", R"({"target":"pinned"})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_TRUE(Contains(r->body, "pinned_device")) << r->body;
  r = SetResidency(p, "chat", "not json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);

  // Pin chat to the device (self-managed mode allows it).
  r = SetResidency(p, "chat", R"({"target":"pinned_device"})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["previous_residency"], "unpinned");
  EXPECT_EQ(j["residency"], "pinned_device");
  EXPECT_EQ(j["device_resident"], true);
  EXPECT_EQ(j["host_resident"], true);
  auto c = Chat(p);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, 200) << c->body;
  auto e = Post(p, "/v1/embeddings", R"({"model":"ea","input":"hi"})");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->status, 200) << e->body;
  EXPECT_EQ(ModelOf(Status(p), "ea")["device_resident"], true);

  // Compaction frees the idle on-demand copy (ea), keeps the pinned one.
  r = Post(p, "/admin/compact", "{}");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  j = json::parse(r->body);
  EXPECT_EQ(j["reloaded"], 0);
  EXPECT_GT(j["freed_bytes"].get<uint64_t>(), 0u);
  st = Status(p);
  EXPECT_EQ(ModelOf(st, "ea")["device_resident"], false);
  EXPECT_EQ(ModelOf(st, "chat")["device_resident"], true);
  EXPECT_EQ(st["weight_cache"]["compactions"], 1);
  EXPECT_EQ(j["resident_bytes_after"].get<uint64_t>(),
            st["weight_cache"]["pinned_bytes"].get<uint64_t>());
  r = Post(p, "/admin/compact", R"({"reload":["ea"]})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["reloaded"], 1);
  EXPECT_EQ(ModelOf(Status(p), "ea")["device_resident"], true);
  r = Post(p, "/admin/compact", R"({"reload":["zz"]})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  r = Post(p, "/admin/compact", R"({"reload":"ea"})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);

  auto m = Client(p).Get("/metrics");
  ASSERT_TRUE(m);
  for (const char* series :
       {"arbiter_weight_cache_loads_total", "arbiter_weight_cache_resident_bytes",
        "arbiter_weight_cache_max_bytes", "arbiter_weight_cache_pinned_bytes",
        "arbiter_weight_pool_bytes", "arbiter_weight_cache_compactions_total 2",
        "arbiter_model_weights_pinned{model=\"chat\"} 2",
        "arbiter_model_weights_resident{model=\"chat\"} 1", "arbiter_model_weight_bytes",
        "arbiter_device_memory_in_use_bytes", "arbiter_device_memory_limit_bytes",
        "arbiter_memory_charged_by_kind_bytes{kind=\"host_floor\"}"}) {
    EXPECT_TRUE(Contains(m->body, series)) << series;
  }

  // Back to unpinned: the floor goes, the device copy stays (evictable).
  r = SetResidency(p, "chat", R"({"target":"unpinned"})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  j = json::parse(r->body);
  EXPECT_EQ(j["host_resident"], false);
  EXPECT_EQ(j["device_resident"], true);
  EXPECT_EQ(Status(p)["charged_by_kind"]["host_floor"], 0);
}

TEST_F(WeightsE2E, PinThatCannotFitTheWeightPoolIs409) {
  // A weight pool of 1.5 models: (1 − wiggle) × arena − max_scratch.
  const uint64_t arena = (weight_bytes_ * 3 / 2 + scratch_bytes_) * 10 / 9 + 4096;
  Proc p = Start("device_arena = " + std::to_string(arena));
  auto r = SetResidency(p, "chat", R"({"target":"pinned_device"})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  r = SetResidency(p, "ea", R"({"target":"pinned_device"})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 409) << r->body;
  EXPECT_TRUE(Contains(r->body, "cannot pin 'ea'")) << r->body;
  EXPECT_TRUE(Contains(r->body, "pin_does_not_fit")) << r->body;
  EXPECT_EQ(ModelOf(Status(p), "ea")["residency"], "unpinned");
}

TEST_F(WeightsE2E, ExternallyManagedRefusesUntilPinned) {
  // [server] preload leaves unpinned models to the control plane.
  server_extra_ = "preload = true";
  Proc p = Start("mode = \"externally_managed\"");
  auto c = Chat(p);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, 503) << c->body;
  EXPECT_TRUE(Contains(c->body,
                       "model 'chat' is not resident on the device; the control plane must pin "
                       "it before inference"))
      << c->body;
  EXPECT_TRUE(Contains(c->body, "not_resident")) << c->body;
  EXPECT_TRUE(c->has_header("Retry-After"));
  json st = Status(p);
  EXPECT_EQ(st["weight_cache"]["mode"], "externally_managed");
  EXPECT_EQ(ModelOf(st, "chat")["ready"], false);
  EXPECT_NE(ModelOf(st, "chat")["state"], "failed");
  EXPECT_TRUE(Contains(ReadAll(p.log), "preload of model \"chat\" skipped")) << ReadAll(p.log);

  auto r = SetResidency(p, "chat", R"({"target":"pinned_device"})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(ModelOf(Status(p), "chat")["ready"], true);
  c = Chat(p);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, 200) << c->body;

  // Leaving the device floor frees the copy in this mode: refused again.
  r = SetResidency(p, "chat", R"({"target":"pinned_system"})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["device_resident"], false);
  EXPECT_EQ(j["host_resident"], true);
  c = Chat(p);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, 503) << c->body;
}

TEST_F(WeightsE2E, ReloadAfterEvictionComesFromTheFloorNotTheFile) {
  Proc p = Start("", "residency = \"pinned_system\"");
  json chat = ModelOf(Status(p), "chat");
  EXPECT_EQ(chat["host_resident"], true);  // PreloadPinned made the floor at startup
  auto c = Chat(p);
  ASSERT_TRUE(c);
  ASSERT_EQ(c->status, 200) << c->body;
  chat = ModelOf(Status(p), "chat");
  EXPECT_EQ(chat["weight_loads"], 1);
  EXPECT_EQ(chat["weight_last_load_source"], "floor");
  // Take the weights file away: a reload from the file would now fail.
  const fs::path file = fs::path(dir_) / "chat" / "model.safetensors";
  const fs::path moved = fs::path(dir_) / "chat-moved.safetensors";
  fs::rename(file, moved);
  auto r = Post(p, "/admin/compact", "{}");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(ModelOf(Status(p), "chat")["device_resident"], false);
  c = Chat(p);
  fs::rename(moved, file);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, 200) << c->body;
  chat = ModelOf(Status(p), "chat");
  EXPECT_EQ(chat["weight_loads"], 2);
  EXPECT_EQ(chat["weight_last_load_source"], "floor");
}

TEST_F(WeightsE2E, CriticalPressureDemotesIdleDeviceWeightsToTheirFloors) {
  Proc p = Start("", "residency = \"pinned_system\"");
  auto c = Chat(p);
  ASSERT_TRUE(c);
  ASSERT_EQ(c->status, 200) << c->body;
  ASSERT_EQ(ModelOf(Status(p), "chat")["device_resident"], true);
  auto r = Post(p, "/admin/pressure", R"({"level":"critical"})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json chat = ModelOf(Status(p), "chat");
  EXPECT_EQ(chat["device_resident"], false);
  EXPECT_EQ(chat["host_resident"], true);
  EXPECT_EQ(chat["state"], "loaded");  // the engine (and its KV) stays: text keeps serving
  c = Chat(p);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, 200) << c->body;
  chat = ModelOf(Status(p), "chat");
  EXPECT_EQ(chat["weight_last_load_source"], "floor");
  EXPECT_EQ(chat["weight_loads"], 2);
}

using SharedFloorsE2E = WeightsE2EBase;

constexpr const char* kShared = "shared_host_weights = true";
constexpr const char* kPinnedSystem = "residency = \"pinned_system\"";

TEST_F(SharedFloorsE2E, ThreeProcessesShareOneRegion) {
  std::vector<Proc> ps;
  for (int i = 0; i < 3; ++i) ps.push_back(Start(kShared, kPinnedSystem));
  std::vector<std::string> regions = Regions(prefix_);
  ASSERT_EQ(regions.size(), 1u);
  struct stat sb {};
  ASSERT_EQ(stat(("/dev/shm/" + regions[0]).c_str(), &sb), 0);
  EXPECT_EQ(sb.st_mode & 0777, 0600u);
  // Each process loads the chat weights from the floor, touching every page.
  for (const Proc& p : ps) {
    auto c = Chat(p);
    ASSERT_TRUE(c);
    EXPECT_EQ(c->status, 200) << c->body;
    EXPECT_EQ(ModelOf(Status(p), "chat")["floor_region"], "/" + regions[0]);
  }
  int fillers = 0;
  for (const Proc& p : ps) {
    const std::string log = ReadAll(p.log);
    if (Contains(log, "host floor of 'chat' ready") &&
        !Contains(log, "attached to an existing region")) {
      fillers++;
    }
  }
  EXPECT_EQ(fillers, 1);
  // Summed proportional set size of the floor mappings: one copy.
  const uint64_t region_kb = static_cast<uint64_t>(sb.st_size) / 1024;
  uint64_t sum_kb = 0;
  for (const Proc& p : ps) {
    const uint64_t kb = RegionPssKb(p.pid, regions[0]);
    EXPECT_LT(kb, region_kb * 6 / 10) << "one process holds most of the region alone";
    sum_kb += kb;
  }
  EXPECT_GE(sum_kb, region_kb * 9 / 10) << sum_kb << " of " << region_kb;
  EXPECT_LE(sum_kb, region_kb * 11 / 10) << sum_kb << " of " << region_kb;
  // A graceful stop of every holder unlinks the region (last holder).
  KillAll(SIGTERM);
  EXPECT_TRUE(Regions(prefix_).empty());
}

TEST_F(SharedFloorsE2E, ProcessKilledWhileFillingIsReplacedByARebuild) {
  Proc a = Spawn(kShared, kPinnedSystem, {"ARBITER_TEST_FLOOR_FILL_DELAY_MS=600000"});
  // Wait until a holds the half-filled region.
  const auto deadline = std::chrono::steady_clock::now() + kWait;
  while (Regions(prefix_).empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(Regions(prefix_).size(), 1u) << ReadAll(a.log);
  Proc b = Spawn(kShared, kPinnedSystem);
  Proc c = Spawn(kShared, kPinnedSystem);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // b and c wait on the region
  Kill(procs_[0], SIGKILL);
  ASSERT_TRUE(Healthy(b));
  ASSERT_TRUE(Healthy(c));
  for (const Proc& p : {b, c}) {
    auto r = Chat(p);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
  }
  EXPECT_EQ(Regions(prefix_).size(), 1u);
  const std::string logs = ReadAll(b.log) + ReadAll(c.log);
  EXPECT_TRUE(Contains(logs, "host floor of 'chat' ready")) << logs;
}

TEST_F(SharedFloorsE2E, RestartReusesTheRegionAndAChangedFileSweepsTheStaleOne) {
  Proc a = Start(kShared, kPinnedSystem);
  ASSERT_EQ(Regions(prefix_).size(), 1u);
  const std::string first = Regions(prefix_)[0];
  Kill(procs_.back(), SIGKILL);  // a crash: the READY region stays
  ASSERT_EQ(Regions(prefix_), std::vector<std::string>{first});
  Proc b = Start(kShared, kPinnedSystem);
  EXPECT_TRUE(Contains(ReadAll(b.log), "attached to an existing region")) << ReadAll(b.log);
  EXPECT_EQ(Regions(prefix_), std::vector<std::string>{first});
  Kill(procs_.back(), SIGKILL);
  // Rewrite the model file's timestamp: a new file token, a new digest.
  const fs::path file = fs::path(dir_) / "chat" / "model.safetensors";
  fs::last_write_time(file, fs::last_write_time(file) + std::chrono::seconds(10));
  Proc c = Start(kShared, kPinnedSystem);
  std::vector<std::string> now = Regions(prefix_);
  ASSERT_EQ(now.size(), 1u);
  EXPECT_NE(now[0], first);
  auto r = Chat(c);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  (void)a;
}

}  // namespace
}  // namespace arbiter
