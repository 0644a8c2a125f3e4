// Unit tests of the server's internal helpers: the per-connection event
// queue of GET /admin/events, the event JSON, the metrics registry, and the
// pressure wiring ([pressure] source = "none" / "meminfo").
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "arbiter/runtime/pressure.h"
#include "server/internal/access.h"
#include "server/internal/event_stream.h"
#include "server/internal/metrics.h"
#include "server/internal/status_json.h"

namespace arbiter::server_internal {
namespace {

using json = nlohmann::json;

ArbiterEvent Load(const std::string& key) {
  ArbiterEvent e;
  e.type = ArbiterEventType::kModelLoad;
  e.capability = Capability::kEmbedding;
  e.model_key = key;
  e.load_ms = 1.5;
  e.at_ms = 7;
  return e;
}

TEST(EventQueue, DropsOldestWhenFullAndCounts) {
  EventQueue q(3);
  for (int i = 0; i < 5; ++i) q.Push(Load("m" + std::to_string(i)));
  std::vector<ArbiterEvent> out;
  uint64_t dropped = 0;
  ASSERT_TRUE(q.Wait(std::chrono::steady_clock::now(), &out, &dropped));
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].model_key, "m2");
  EXPECT_EQ(out[2].model_key, "m4");
  EXPECT_EQ(dropped, 2u);
  // The count resets once reported.
  q.Push(Load("m5"));
  ASSERT_TRUE(q.Wait(std::chrono::steady_clock::now(), &out, &dropped));
  EXPECT_EQ(dropped, 0u);
}

TEST(EventQueue, CloseWakesAWaiterAndStopsPushes) {
  EventQueue q(4);
  std::thread closer([&] { q.Close(); });
  std::vector<ArbiterEvent> out;
  uint64_t dropped = 0;
  // A generous deadline: only turns a hang into a failure.
  EXPECT_FALSE(q.Wait(std::chrono::steady_clock::now() + std::chrono::seconds(30), &out, &dropped));
  closer.join();
  q.Push(Load("late"));
  EXPECT_FALSE(q.Wait(std::chrono::steady_clock::now(), &out, &dropped));
  EXPECT_TRUE(out.empty());
}

TEST(EventJson, FieldsPerType) {
  json load = json::parse(ArbiterEventJson(Load("a")));
  EXPECT_EQ(load["type"], "model_load");
  EXPECT_EQ(load["capability"], "embedding");
  EXPECT_EQ(load["model_key"], "a");
  EXPECT_EQ(load["load_ms"], 1.5);
  EXPECT_EQ(load["at_ms"], 7);
  ArbiterEvent ev;
  ev.type = ArbiterEventType::kEviction;
  ev.model_key = "b";
  ev.reason = UnloadReason::kFit;
  ev.estimated_bytes = 123;
  json evj = json::parse(ArbiterEventJson(ev));
  EXPECT_EQ(evj["reason"], "fit");
  EXPECT_EQ(evj["estimated_bytes"], 123);
  ArbiterEvent p;
  p.type = ArbiterEventType::kMemoryPressure;
  p.level = MemoryPressureLevel::kCritical;
  p.source = "bridge";
  p.free_bytes = 42;
  json pj = json::parse(ArbiterEventJson(p));
  EXPECT_EQ(pj["level"], "critical");
  EXPECT_EQ(pj["source"], "bridge");
  EXPECT_EQ(pj["free_bytes"], 42);
  EXPECT_FALSE(pj.contains("model_key"));
  EXPECT_EQ(ArbiterEventFrame(ev).rfind("event: eviction\ndata: {", 0), 0u);
}

TEST(ServerMetrics, CountsEventsAndSnapshots) {
  ServerMetrics m;
  m.OnEvent(Load("a"));
  ArbiterEvent ev;
  ev.type = ArbiterEventType::kEviction;
  ev.reason = UnloadReason::kFit;
  m.OnEvent(ev);
  m.OnHttpRequest("/v1/embeddings", 200);
  ArbiterStats s;
  s.budget_bytes = 1000;
  s.charged_bytes = 400;
  s.pressure = MemoryPressureLevel::kLow;
  ModelStats a;
  a.name = "a";
  a.resident_key = "embedding::a";
  a.capability = Capability::kEmbedding;
  a.state = ModelState::kLoaded;
  a.load_failures = 2;
  s.models.push_back(a);
  MemoryLedgerSnapshot ledger;
  ledger.by_kind[static_cast<size_t>(ChargeKind::kHostFloor)] = 77;
  WeightCacheStatus w;
  w.resident_bytes = 300;
  w.max_bytes = 900;
  w.weight_pool_bytes = 950;
  w.loads = 3;
  w.evicts = 1;
  w.load_seconds = 0.5;
  w.pool.in_use_bytes = 320;
  w.pool.limit_bytes = 1000;
  WeightModelStatus wm;
  wm.key = "a";
  wm.residency = ResidencyState::kPinnedSystem;
  wm.device_resident = true;
  wm.weight_bytes = 300;
  w.models.push_back(wm);
  const std::string text = m.Scrape(s, ledger, &w);
  for (const char* line :
       {"arbiter_memory_charged_by_kind_bytes{kind=\"host_floor\"} 77",
        "arbiter_weight_cache_resident_bytes 300", "arbiter_weight_cache_max_bytes 900",
        "arbiter_weight_pool_bytes 950", "arbiter_weight_cache_loads_total 3",
        "arbiter_weight_cache_evicts_total 1", "arbiter_weight_cache_load_seconds_total 0.5",
        "arbiter_device_memory_in_use_bytes 320", "arbiter_device_memory_limit_bytes 1000",
        "arbiter_model_weights_resident{model=\"a\"} 1",
        "arbiter_model_weights_pinned{model=\"a\"} 1",
        "arbiter_model_weight_bytes{model=\"a\"} 300"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;
  }
  EXPECT_NE(text.find("arbiter_model_loads_total{capability=\"embedding\",model=\"a\"} 1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("arbiter_evictions_total{reason=\"fit\"} 1"), std::string::npos) << text;
  EXPECT_NE(text.find("arbiter_memory_pressure_level 1"), std::string::npos) << text;
  EXPECT_NE(text.find("arbiter_memory_budget_bytes 1000"), std::string::npos) << text;
  EXPECT_NE(text.find("arbiter_memory_charged_bytes 400"), std::string::npos) << text;
  EXPECT_NE(text.find("arbiter_model_resident{capability=\"embedding\",model=\"a\"} 1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("arbiter_model_load_failures_total{capability=\"embedding\",model=\"a\"} 2"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("arbiter_http_requests_total{code=\"200\",route=\"/v1/embeddings\"} 1"),
            std::string::npos)
      << text;
  // A second scrape with the same snapshot does not double-count failures.
  const std::string again = m.Scrape(s, ledger, &w);
  EXPECT_NE(again.find("arbiter_weight_cache_loads_total 3"), std::string::npos) << again;
  EXPECT_NE(m.Scrape(s, ledger, nullptr).find("arbiter_memory_charged_bytes 400"),
            std::string::npos);
  EXPECT_NE(again.find("arbiter_model_load_failures_total{capability=\"embedding\",model=\"a\"} 2"),
            std::string::npos)
      << again;
}

// The per-domain series and /admin/status's "domains" from a real ledger
// with a device beside the host and one inside it (Note [Memory domains]).
TEST(ServerMetrics, DomainsCarryADomainLabel) {
  MemoryLedger ledger(1000);
  const MemoryDomain gpu = *ledger.RegisterDomain("vulkan:0", {.budget_bytes = 500});
  const MemoryDomain lvp =
      *ledger.RegisterDomain("vulkan:1", {.budget_bytes = 300, .inside_host = true});
  MemoryCharge h = ledger.Charge("m", ChargeKind::kHostFloor, 100);
  MemoryCharge g = ledger.Charge(gpu, "m", ChargeKind::kDeviceWeights, 400);
  MemoryCharge l = ledger.Charge(lvp, "n", ChargeKind::kKvSlot, 200);
  ledger.SetRuntimeBytes(gpu, 64);
  ASSERT_FALSE(ledger.TryCharge(gpu, "m", ChargeKind::kKvSlot, 101).ok());
  ServerMetrics m;
  ArbiterStats s;
  s.budget_bytes = ledger.budget_bytes();
  s.charged_bytes = ledger.charged_bytes();
  const std::string text = m.Scrape(s, ledger.Snapshot(), nullptr);
  for (const char* line : {
           // The host-only series keep their names and values...
           "arbiter_memory_budget_bytes 1000\n",
           "arbiter_memory_charged_bytes 300\n",
           "arbiter_memory_charged_by_kind_bytes{kind=\"kv_slot\"} 200\n",
           // ...and every domain has its own, labelled.
           "arbiter_memory_domain_budget_bytes{domain=\"host\"} 1000\n",
           "arbiter_memory_domain_charged_bytes{domain=\"host\"} 300\n",
           "arbiter_memory_domain_budget_bytes{domain=\"vulkan:0\"} 500\n",
           "arbiter_memory_domain_charged_bytes{domain=\"vulkan:0\"} 400\n",
           "arbiter_memory_domain_runtime_bytes{domain=\"vulkan:0\"} 64\n",
           "arbiter_memory_domain_refusals_total{domain=\"vulkan:0\"} 1\n",
           "arbiter_memory_domain_refusals_total{domain=\"host\"} 0\n",
           "arbiter_memory_domain_charged_bytes{domain=\"vulkan:1\"} 200\n",
           "arbiter_memory_domain_charged_by_kind_bytes{domain=\"vulkan:0\",kind=\"device_weights\"} "
           "400\n",
       }) {
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;
  }
  // Counters advance by the change only.
  EXPECT_NE(m.Scrape(s, ledger.Snapshot(), nullptr)
                .find("arbiter_memory_domain_refusals_total{domain=\"vulkan:0\"} 1\n"),
            std::string::npos);

  RuntimeStatus st;
  st.arbiter = s;
  st.ledger = ledger.Snapshot();
  NextVictim host_victim;
  host_victim.model = "emb";
  host_victim.capability = Capability::kEmbedding;
  host_victim.role = ResidentRole::kEmbedding;
  host_victim.bytes = 100;
  st.next_victim = host_victim;
  NextVictim gpu_victim = host_victim;
  gpu_victim.model = "gpu-emb";
  gpu_victim.domain = "vulkan:0";
  st.domain_next_victims = {{"host", host_victim}, {"vulkan:0", gpu_victim},
                            {"vulkan:1", std::nullopt}};
  const json j = RuntimeStatusJson(st, 0);
  // next_victim per domain; the host's equals the top-level one.
  EXPECT_EQ(j["domains"]["host"]["next_victim"], j["next_victim"]);
  EXPECT_EQ(j["domains"]["host"]["next_victim"]["model"], "emb");
  EXPECT_EQ(j["domains"]["vulkan:0"]["next_victim"]["model"], "gpu-emb");
  EXPECT_EQ(j["domains"]["vulkan:0"]["next_victim"]["role"], "embedding");
  EXPECT_TRUE(j["domains"]["vulkan:1"]["next_victim"].is_null());
  ASSERT_EQ(j["domains"].size(), 3u) << j["domains"].dump();
  EXPECT_EQ(j["domains"]["host"]["charged_bytes"], j["charged_bytes"]);
  EXPECT_EQ(j["domains"]["host"]["budget_bytes"], j["budget_bytes"]);
  EXPECT_EQ(j["domains"]["host"]["by_kind"], j["charged_by_kind"]);
  const json& v0 = j["domains"]["vulkan:0"];
  EXPECT_EQ(v0["budget_bytes"], 500);
  EXPECT_EQ(v0["charged_bytes"], 400);
  EXPECT_EQ(v0["peak_bytes"], 400);
  EXPECT_EQ(v0["runtime_bytes"], 64);
  EXPECT_EQ(v0["refusals"], 1);
  EXPECT_EQ(v0["inside_host"], false);
  EXPECT_EQ(v0["by_kind"]["device_weights"], 400);
  EXPECT_EQ(j["domains"]["vulkan:1"]["inside_host"], true);
}

TEST(ServePressure, NoneIsTheBridgeAlone) {
  PressureSettings s;
  s.source = PressureSourceKind::kNone;
  auto p = MakeServePressure(s);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->os_source, "none");
  ASSERT_NE(p->bridge, nullptr);
  ASSERT_EQ(p->composite->child_count(), 1u);
  ASSERT_TRUE(p->composite->Start().ok());
  MemoryPressureLevel seen = MemoryPressureLevel::kNominal;
  MemoryPressureSubscription sub =
      p->composite->Subscribe([&](const MemoryPressureEvent& e) { seen = e.level; });
  p->bridge->Dispatch(MemoryPressureLevel::kCritical);
  EXPECT_EQ(seen, MemoryPressureLevel::kCritical);
  p->composite->Stop();
}

TEST(ServePressure, AutoPicksAWorkingSourceAndMeminfoAlwaysWorks) {
  PressureSettings s;
  auto autop = MakeServePressure(s);
  ASSERT_TRUE(autop.ok()) << autop.status().ToString();
  EXPECT_TRUE(autop->os_source == "cgroup" || autop->os_source == "psi" ||
              autop->os_source == "meminfo")
      << autop->os_source;
  EXPECT_EQ(autop->composite->child_count(), 2u);
  s.source = PressureSourceKind::kMeminfo;
  auto mem = MakeServePressure(s);
  ASSERT_TRUE(mem.ok()) << mem.status().ToString();
  EXPECT_EQ(mem->os_source, "meminfo");
}

// ---- access: Note [Host check] and bearer credentials -----------------------

TEST(HostCheck, NormalizeHost) {
  EXPECT_EQ(NormalizeHost("localhost"), "localhost");
  EXPECT_EQ(NormalizeHost("LocalHost:8080"), "localhost");
  EXPECT_EQ(NormalizeHost("localhost."), "localhost");
  EXPECT_EQ(NormalizeHost("localhost.:80"), "localhost");
  EXPECT_EQ(NormalizeHost("localhost:"), "localhost");  // RFC 7230: port = *DIGIT
  EXPECT_EQ(NormalizeHost("127.0.0.1:1"), "127.0.0.1");
  EXPECT_EQ(NormalizeHost("[::1]:8080"), "::1");
  EXPECT_EQ(NormalizeHost("[::1]"), "::1");
  for (const char* bad : {"", ":80", "::1", "[::1", "[]:80", "localhost:8o", "a b", "a/b",
                          "user@localhost", "localhost:80:80", "[::1]x", "local%68ost"}) {
    EXPECT_EQ(NormalizeHost(bad), "") << bad;
  }
}

TEST(HostCheck, LoopbackBindAnswersOnlyLoopbackNamesAndTheList) {
  const AllowedHosts hosts("127.0.0.1", {});
  for (const char* ok :
       {"localhost", "localhost:8080", "LOCALHOST:1", "localhost.", "127.0.0.1", "127.0.0.1:8080",
        "127.1.2.3:80", "[::1]", "[::1]:8080", "[0:0:0:0:0:0:0:1]:80"}) {
    EXPECT_TRUE(hosts.Allows(ok)) << ok;
  }
  for (const char* bad : {"attacker.example", "attacker.example:8080", "localhost.attacker.example",
                          "127.0.0.1.nip.io", "0.0.0.0", "10.0.0.1", "[::2]", "127.1", "x", "",
                          "localhost:abc", "::1"}) {
    EXPECT_FALSE(hosts.Allows(bad)) << bad;
  }
  // No Host header at all: not a browser, served.
  EXPECT_TRUE(hosts.Allows("", /*present=*/false));
  const std::string msg = hosts.RefusalMessage("attacker.example\r\nX: y");
  EXPECT_NE(msg.find("[server] allowed_hosts"), std::string::npos) << msg;
  EXPECT_NE(msg.find("attacker.example\\x0d\\x0aX: y"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;

  const AllowedHosts listed("localhost", {"Arbiter.LAN.", "[fd00::1]"});
  EXPECT_TRUE(listed.Allows("arbiter.lan:9000"));
  EXPECT_TRUE(listed.Allows("ARBITER.lan"));
  EXPECT_TRUE(listed.Allows("[fd00::1]:80"));
  EXPECT_TRUE(listed.Allows("localhost:80"));
  EXPECT_FALSE(listed.Allows("other.lan"));
  EXPECT_TRUE(AllowedHosts("[::1]", {}).Allows("[::1]:1"));
  EXPECT_FALSE(AllowedHosts("::1", {}).Allows("attacker.example"));
}

TEST(HostCheck, OtherBindsAnswerAnyHostUnlessListed) {
  EXPECT_TRUE(AllowedHosts("0.0.0.0", {}).Allows("attacker.example"));
  EXPECT_TRUE(AllowedHosts("192.168.1.5", {}).Allows("anything:1"));
  const AllowedHosts listed("0.0.0.0", {"arbiter.lan"});
  EXPECT_TRUE(listed.Allows("arbiter.lan:8080"));
  EXPECT_TRUE(listed.Allows("127.0.0.1:8080"));
  EXPECT_FALSE(listed.Allows("192.168.1.5:8080"));
  EXPECT_NE(listed.RefusalMessage("x").find("allowed_hosts"), std::string::npos);
  // "*" opts out, on loopback too.
  EXPECT_TRUE(AllowedHosts("127.0.0.1", {"*"}).Allows("attacker.example"));
  EXPECT_TRUE(IsLoopbackBind("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackBind("127.0.0.2"));
  EXPECT_TRUE(IsLoopbackBind("LocalHost"));
  EXPECT_TRUE(IsLoopbackBind("::1"));
  EXPECT_TRUE(IsLoopbackBind("[::1]"));
  EXPECT_FALSE(IsLoopbackBind("0.0.0.0"));
  EXPECT_FALSE(IsLoopbackBind("::"));
  EXPECT_FALSE(IsLoopbackBind("192.168.1.5"));
}

TEST(BearerToken, SchemeInAnyCaseThenSpaces) {
  EXPECT_EQ(BearerToken("Bearer k1"), "k1");
  EXPECT_EQ(BearerToken("bearer k1"), "k1");
  EXPECT_EQ(BearerToken("BEARER k1"), "k1");
  EXPECT_EQ(BearerToken("bEaReR    k1"), "k1");
  for (const char* bad : {"", "Bearer", "Bearer ", "Bearer    ", "Bearerk1", "Basic k1",
                          "Bearer\tk1", " Bearer k1", "Bear k1"}) {
    EXPECT_EQ(BearerToken(bad), std::nullopt) << bad;
  }
}

}  // namespace
}  // namespace arbiter::server_internal
