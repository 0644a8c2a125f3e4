// End-to-end: the KV tiers, completions, embeddings and weight demotion of
// `device = "vulkan"` models behind a real `arbiter serve` (lavapipe here
// and in CI; docs/architecture.md "Devices and the Vulkan backend",
// docs/kv-precache.md):
//   - a prewarmed prefix is read from the slot by the first turn (the slot
//     tier's hit counter in /metrics);
//   - a conversation moved out of the only slot comes back from the prompt
//     cache (host tier), and an identical prefix is reused across requests;
//   - a conversation closed on the device model (its KV written to disk)
//     restores into the cpu model of the same weights and back: the KV file
//     does not depend on the device;
//   - completions and embeddings on the device agree with the cpu model;
//   - a device budget for one model's weights: waking the second demotes the
//     first's device weights to a host floor (charged to the host), and the
//     first's next wake copies from that floor.
// The Khronos validation layer is on in the server (inherited
// ARBITER_VULKAN_VALIDATION); a validation message fails the suite.
#include <cmath>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "server_process.h"
#include "server_suite.h"
#include "tools/model_maker/model_maker.h"
#include "vulkan/vulkan_test_util.h"

namespace arbiter {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

[[maybe_unused]] const bool kValidation = vulkan::kValidationRequested;

// Helpers shared by the suites of this file (each has its own server).
class DeviceSuite : public ::arbiter::testing::ServerSuite {
 protected:
  static httplib::Client Client() {
    httplib::Client cli("127.0.0.1", server_.port);
    cli.set_read_timeout(300, 0);
    return cli;
  }
  static httplib::Result Post(const std::string& path, const json& body) {
    return Client().Post(path, body.dump(), "application/json");
  }
  static json Get(const std::string& path) {
    auto r = Client().Get(path);
    EXPECT_TRUE(r && r->status == 200) << path;
    return r ? json::parse(r->body, nullptr, false) : json();
  }
  static json Model(const std::string& name) {
    const json status = Get("/admin/status");
    for (const json& m : status["models"]) {
      if (m.value("name", "") == name) return m;
    }
    return json();
  }

  struct Turn {
    int status = 0;
    int prompt_tokens = 0;
    int cached_tokens = 0;
    std::string source;
    std::string text;
  };
  static Turn Chat(const std::string& model, const std::string& conversation,
                   const json& messages, int max_tokens = 4) {
    json body = {{"model", model},
                 {"messages", messages},
                 {"max_tokens", max_tokens},
                 {"temperature", 0}};
    if (!conversation.empty()) body["conversation_id"] = conversation;
    auto r = Post("/v1/chat/completions", body);
    Turn t;
    if (!r) return t;
    t.status = r->status;
    if (r->status != 200) {
      ADD_FAILURE() << model << ": " << r->status << " " << r->body;
      return t;
    }
    json j = json::parse(r->body);
    t.prompt_tokens = j["usage"]["prompt_tokens"].get<int>();
    t.cached_tokens = j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>();
    t.text = j["choices"][0]["message"]["content"].get<std::string>();
    t.source = r->get_header_value("X-Arbiter-Kv-Source");
    return t;
  }
  static json User(const std::string& s) { return {{"role", "user"}, {"content", s}}; }
  static json Assistant(const std::string& s) { return {{"role", "assistant"}, {"content", s}}; }

  void TearDown() override {
    ServerSuite::TearDown();
    EXPECT_EQ(::arbiter::testing::ReadAll(server_.log).find("vulkan validation"), std::string::npos)
        << "the validation layer reported a message (see the log)";
  }
};

class VulkanTiersE2E : public DeviceSuite {
 protected:
  static void SetUpTestSuite() {
    ASSERT_TRUE(MakeDir("vulkan-tiers"));
    ASSERT_TRUE(MakeModel("tiny-qwen3", dir_ + "/tiny", 5).ok());
    // One slot on the device model, so a second conversation moves the
    // first out of it (to the prompt cache).
    std::ostringstream config;
    config << "[memory]\nbudget = \"1GiB\"\n"
           << "[pressure]\nsource = \"none\"\n"
           << "[[models]]\nname = \"chat-gpu\"\npath = \"tiny\"\nctx = 512\nparallel = 1\n"
           << "device = \"vulkan\"\n"
           << "[[models]]\nname = \"chat-cpu\"\npath = \"tiny\"\nctx = 512\nparallel = 1\n"
           << "[[models]]\nname = \"embed-gpu\"\npath = \"tiny\"\nctx = 256\n"
           << "capability = \"embedding\"\ndevice = \"vulkan\"\n"
           << "[[models]]\nname = \"embed-cpu\"\npath = \"tiny\"\nctx = 256\n"
           << "capability = \"embedding\"\n";
    std::string error;
    ASSERT_TRUE(StartServe(config.str(), &error)) << error;
  }

  static json System() {
    return {{"role", "system"},
            {"content",
             "You are a careful assistant for a lighthouse keeper. Answer briefly, name the "
             "tide tables when asked, and never guess the weather."}};
  }
  static json KvCounters(const std::string& model) {
    const json kv = Get("/admin/kv");
    for (const json& m : kv["models"]) {
      if (m.value("name", "") == model) return m["counters"];
    }
    return json();
  }
  // The value of the Prometheus series `series` (its whole name with
  // labels), or -1 when /metrics lacks it.
  static double Metric(const std::string& series) {
    auto r = Client().Get("/metrics");
    if (!r) return -1;
    std::istringstream lines(r->body);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
    }
    return -1;
  }
  static std::vector<fs::path> KvFiles(const std::string& conversation) {
    std::vector<fs::path> out;
    std::error_code ec;
    for (const auto& e : fs::recursive_directory_iterator(dir_ + "/state", ec)) {
      if (e.is_regular_file() && e.path().extension() == ".bin" &&
          e.path().filename().string().rfind(conversation + ".", 0) == 0) {
        out.push_back(e.path());
      }
    }
    return out;
  }
  static int Close(const std::string& conversation, const std::string& model) {
    auto r = Client().Post("/admin/conversations/" + conversation + "/close?model=" + model, "",
                           "application/json");
    return r ? r->status : -1;
  }
};

TEST_F(VulkanTiersE2E, APrewarmedPrefixIsReadFromTheSlotByTheFirstTurn) {
  auto r = Post("/admin/prewarm", {{"model", "chat-gpu"},
                                   {"conversation_id", "room-1"},
                                   {"messages", json::array({System()})}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json w = json::parse(r->body);
  const int prefix = w["prefix_tokens"].get<int>();
  EXPECT_GT(prefix, 20);
  EXPECT_EQ(w["computed_tokens"].get<int>(), prefix);
  const double hits_before = Metric("arbiter_kv_tier_hits_total{model=\"chat-gpu\",tier=\"slot\"}");
  Turn t = Chat("chat-gpu", "room-1", {System(), User("When is high tide?")});
  ASSERT_EQ(t.status, 200);
  EXPECT_GE(t.cached_tokens, prefix);
  EXPECT_EQ(t.source, "slot");
  EXPECT_GT(Metric("arbiter_kv_tier_hits_total{model=\"chat-gpu\",tier=\"slot\"}"),
            std::max(0.0, hits_before));
}

TEST_F(VulkanTiersE2E, AConversationOutOfTheOnlySlotComesBackFromThePromptCache) {
  const json a1 = json::array({System(), User("Which lamp do we light first?")});
  Turn ta = Chat("chat-gpu", "lamp", a1);
  ASSERT_EQ(ta.status, 200);
  // A second conversation takes the only slot: "lamp" moves to the host tier.
  Turn tb = Chat("chat-gpu", "fog", json::array({User("Is the fog horn loud enough?")}));
  ASSERT_EQ(tb.status, 200);
  json a2 = a1;
  a2.push_back(Assistant(ta.text));
  a2.push_back(User("And the second?"));
  Turn ta2 = Chat("chat-gpu", "lamp", a2);
  ASSERT_EQ(ta2.status, 200);
  EXPECT_EQ(ta2.source, "prompt_cache");
  EXPECT_GE(ta2.cached_tokens, ta.prompt_tokens);
  json c = KvCounters("chat-gpu");
  EXPECT_GE(c["prompt_cache_hits"].get<int>(), 1) << c.dump();
  EXPECT_GE(c["stashes"].get<int>(), 1) << c.dump();
  // An identical prefix without a conversation: the second request reuses
  // the first's KV.
  const json p = json::array({System(), User("What is the keeper's first duty at dusk?")});
  ASSERT_EQ(Chat("chat-gpu", "", p).status, 200);
  Turn again = Chat("chat-gpu", "", p);
  ASSERT_EQ(again.status, 200);
  EXPECT_GT(again.cached_tokens, 20);
}

TEST_F(VulkanTiersE2E, AKvFileWrittenOnTheDeviceRestoresOnTheCpuAndBack) {
  json msgs = json::array({User("Remember the number 42 and the colour blue, please.")});
  Turn t1 = Chat("chat-gpu", "logbook", msgs);
  ASSERT_EQ(t1.status, 200);
  ASSERT_EQ(Close("logbook", "chat-gpu"), 200);
  ASSERT_EQ(KvFiles("logbook").size(), 1u);
  // The cpu model of the same weights reads the device's file.
  msgs.push_back(Assistant(t1.text));
  msgs.push_back(User("What was the number?"));
  Turn t2 = Chat("chat-cpu", "logbook", msgs);
  ASSERT_EQ(t2.status, 200);
  EXPECT_EQ(t2.source, "disk");
  EXPECT_GE(t2.cached_tokens, t1.prompt_tokens);
  EXPECT_EQ(KvCounters("chat-cpu")["disk_hits"].get<int>(), 1);
  // And back: the cpu's file restores on the device.
  ASSERT_EQ(Close("logbook", "chat-cpu"), 200);
  msgs.push_back(Assistant(t2.text));
  msgs.push_back(User("And the colour?"));
  Turn t3 = Chat("chat-gpu", "logbook", msgs);
  ASSERT_EQ(t3.status, 200);
  EXPECT_EQ(t3.source, "disk");
  EXPECT_GE(t3.cached_tokens, t2.prompt_tokens);
  EXPECT_GE(KvCounters("chat-gpu")["disk_hits"].get<int>(), 1);
  EXPECT_EQ(KvCounters("chat-gpu")["restore_failures"].get<int>(), 0);
}

TEST_F(VulkanTiersE2E, CompletionsAndEmbeddingsOnTheDeviceAgreeWithTheCpu) {
  // Completions: greedy text equal to the cpu's up to a near-tie, which the
  // logprobs tell.
  auto complete = [](const std::string& model) {
    auto r = Post("/v1/completions", {{"model", model},
                                      {"prompt", "The lighthouse stands on"},
                                      {"max_tokens", 6},
                                      {"temperature", 0},
                                      {"logprobs", 2}});
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : std::string("no answer"));
    return r ? json::parse(r->body, nullptr, false) : json();
  };
  json g = complete("chat-gpu");
  json c = complete("chat-cpu");
  ASSERT_TRUE(g.contains("choices")) << g.dump();
  ASSERT_TRUE(c.contains("choices")) << c.dump();
  EXPECT_EQ(g["usage"]["completion_tokens"], c["usage"]["completion_tokens"]);
  const json& gt = g["choices"][0]["logprobs"]["tokens"];
  const json& ct = c["choices"][0]["logprobs"]["tokens"];
  const json& ctops = c["choices"][0]["logprobs"]["top_logprobs"];
  ASSERT_EQ(gt.size(), ct.size()) << g.dump() << c.dump();
  for (size_t i = 0; i < gt.size(); ++i) {
    if (gt[i] == ct[i]) continue;
    std::vector<double> lp;
    for (const auto& [tok, v] : ctops[i].items()) lp.push_back(v.get<double>());
    ASSERT_GE(lp.size(), 2u);
    EXPECT_LT(std::fabs(lp[0] - lp[1]), 0.02) << "completion differs at token " << i;
    break;
  }
  // Embeddings: the device's vectors are the cpu's within rounding.
  auto embed = [](const std::string& model) {
    auto r = Post("/v1/embeddings",
                  {{"model", model}, {"input", json::array({"tide tables", "the fog horn"})}});
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : std::string("no answer"));
    return r ? json::parse(r->body, nullptr, false) : json();
  };
  json eg = embed("embed-gpu");
  json ec = embed("embed-cpu");
  ASSERT_TRUE(eg.contains("data")) << eg.dump();
  ASSERT_TRUE(ec.contains("data")) << ec.dump();
  ASSERT_EQ(eg["data"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const json& a = eg["data"][i]["embedding"];
    const json& b = ec["data"][i]["embedding"];
    ASSERT_EQ(a.size(), b.size());
    double dot = 0, na = 0, nb = 0;
    for (size_t k = 0; k < a.size(); ++k) {
      dot += a[k].get<double>() * b[k].get<double>();
      na += a[k].get<double>() * a[k].get<double>();
      nb += b[k].get<double>() * b[k].get<double>();
    }
    EXPECT_GT(dot / std::sqrt(na * nb), 0.999) << "input " << i;
  }
  // The embedding model computed on the device: it is charged there.
  EXPECT_GT(Get("/admin/status")["domains"]["vulkan:0"]["charged_bytes"].get<int64_t>(), 0);
}

// Two device text models (never evicted, only demoted) under a device budget
// that holds both KV caches and scratch but one model's weights.
class VulkanDemotionE2E : public DeviceSuite {
 protected:
  static void SetUpTestSuite() {
    ASSERT_TRUE(MakeDir("vulkan-demote"));
    ASSERT_TRUE(MakeModel("tiny-qwen3", dir_ + "/tiny", 5).ok());
    // 771 KiB of weights and 1.07 MiB of KV and scratch per model (ctx
    // 256): 2 × 1.07 MiB + 771 KiB fits 3300 KiB, two weight copies do not.
    std::ostringstream config;
    config << "[memory]\nbudget = \"1GiB\"\n"
           << "[pressure]\nsource = \"none\"\n"
           << "[devices.\"vulkan:0\"]\nbudget = \"3300KiB\"\n"
           << "[[models]]\nname = \"gpu-a\"\npath = \"tiny\"\nctx = 256\ndevice = \"vulkan\"\n"
           << "[[models]]\nname = \"gpu-b\"\npath = \"tiny\"\nctx = 256\ndevice = \"vulkan\"\n";
    std::string error;
    ASSERT_TRUE(StartServe(config.str(), &error)) << error;
  }
};

TEST_F(VulkanDemotionE2E, ADemotedModelKeepsAHostFloorAndWakesFromIt) {
  const json hi = json::array({User("hi")});
  ASSERT_EQ(Chat("gpu-a", "", hi, 2).status, 200);
  json a = Model("gpu-a");
  EXPECT_TRUE(a["device_resident"].get<bool>()) << a.dump();
  EXPECT_EQ(a["weight_last_load_source"], "file");
  // gpu-b's weights do not fit beside gpu-a's: the device's demote stage
  // moves gpu-a's idle weights to a host floor.
  ASSERT_EQ(Chat("gpu-b", "", hi, 2).status, 200);
  a = Model("gpu-a");
  EXPECT_EQ(a["state"], "loaded") << a.dump();
  EXPECT_FALSE(a["device_resident"].get<bool>()) << a.dump();
  EXPECT_TRUE(a["host_resident"].get<bool>()) << a.dump();
  EXPECT_GT(a["host_bytes"].get<int64_t>(), 0) << a.dump();
  json st = Get("/admin/status");
  const json& host = st["domains"]["host"];
  EXPECT_GE(host["by_kind"]["host_floor"].get<int64_t>(), a["host_bytes"].get<int64_t>())
      << host.dump();
  const json& gpu = st["domains"]["vulkan:0"];
  EXPECT_LE(gpu["peak_bytes"].get<int64_t>(), gpu["budget_bytes"].get<int64_t>()) << gpu.dump();
  // The next wake of gpu-a copies from its floor (and demotes gpu-b's).
  ASSERT_EQ(Chat("gpu-a", "", hi, 2).status, 200);
  a = Model("gpu-a");
  EXPECT_TRUE(a["device_resident"].get<bool>()) << a.dump();
  EXPECT_EQ(a["weight_last_load_source"], "floor") << a.dump();
  EXPECT_TRUE(Model("gpu-b")["host_resident"].get<bool>());
  // Unloading drops the floors with everything else.
  for (const char* m : {"gpu-a", "gpu-b"}) {
    auto r = Client().Post(std::string("/admin/models/") + m + "/unload");
    ASSERT_TRUE(r && r->status == 200);
  }
  st = Get("/admin/status");
  EXPECT_EQ(st["domains"]["vulkan:0"]["charged_bytes"].get<int64_t>(), 0);
  EXPECT_FALSE(Model("gpu-a")["host_resident"].get<bool>());
  EXPECT_FALSE(Model("gpu-b")["host_resident"].get<bool>());
}

}  // namespace
}  // namespace arbiter
