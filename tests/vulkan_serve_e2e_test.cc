// End-to-end: `arbiter serve` with a `device = "vulkan"` chat model — on
// lavapipe here and in CI, the first (only) Vulkan device — beside the same
// weights on the CPU (docs/architecture.md "Devices and the Vulkan backend"):
//   - a greedy chat agrees with the CPU model up to near-ties; streaming
//     gives the same text; a two-turn conversation reuses its KV;
//   - /admin/status shows the vulkan:0 domain with the model's charges (and
//     the model's device), /metrics its domain series; unloading brings the
//     domain to 0;
//   - a device budget that holds one model of two: loading the second
//     evicts the first, the domain is never over its budget, and after 100
//     load/unload cycles it is at 0;
//   - partial offload: a device budget between what one layer and what
//     both layers of the model need splits it (one layer and the output on
//     the device, one on the CPU), decided at startup; it chats as the CPU
//     model does, /admin/status shows its layers per device, the device's
//     domain stays within its budget, and unloading empties it.
// The Khronos validation layer is on in the server (ARBITER_VULKAN_VALIDATION
// inherited); a validation message is logged at error level, and the suite
// fails on any in the server log.
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "arbiter/engine/engine.h"
#include "arbiter/engine/model_files.h"
#include "server_process.h"
#include "server_suite.h"
#include "tools/model_maker/model_maker.h"
#include "vulkan/vulkan_test_util.h"

namespace arbiter {
namespace {

using json = nlohmann::json;

// The server inherits ARBITER_VULKAN_VALIDATION=1 (set by the Vulkan tests'
// shared helper at static initialization).
[[maybe_unused]] const bool kValidation = vulkan::kValidationRequested;

class VulkanServeE2E : public ::arbiter::testing::ServerSuite {
 protected:
  static void SetUpTestSuite() {
    ASSERT_TRUE(MakeDir("vulkan-e2e"));
    ASSERT_TRUE(MakeModel("tiny-qwen3", dir_ + "/tiny", 5).ok());
    // Vulkan models of 771 KiB weights and 1.07 MiB KV and scratch each
    // (ctx 256, prefill batch 512): the device budget below holds one, not
    // two. draft-a and draft-b are drafters, which the policy may evict for
    // room (a text target is never evicted: only its device weights are
    // demoted).
    std::ostringstream config;
    config << "[memory]\nbudget = \"1GiB\"\n"
           << "[pressure]\nsource = \"none\"\n"
           << "[devices.\"vulkan:0\"]\nbudget = \"" << kDeviceBudget << "\"\n"
           << "[[models]]\nname = \"chat-cpu\"\npath = \"tiny\"\nctx = 256\n"
           << "[[models]]\nname = \"chat-gpu\"\npath = \"tiny\"\nctx = 256\ndevice = \"vulkan\"\n"
           << "[[models]]\nname = \"draft-a\"\npath = \"tiny\"\nctx = 256\ndevice = \"vulkan:0\"\n"
           << "role = \"drafter\"\n"
           << "[[models]]\nname = \"draft-b\"\npath = \"tiny\"\nctx = 256\ndevice = \"vulkan:0\"\n"
           << "role = \"drafter\"\n";
    std::string error;
    ASSERT_TRUE(StartServe(config.str(), &error)) << error;
  }

  static constexpr const char* kDeviceBudget = "2600KiB";

  static httplib::Client Client() {
    httplib::Client cli("127.0.0.1", server_.port);
    cli.set_read_timeout(300, 0);
    return cli;
  }
  static json Post(const std::string& path, const json& body, int* status = nullptr) {
    auto r = Client().Post(path, body.dump(), "application/json");
    if (status != nullptr) *status = r ? r->status : -1;
    if (!r) return json();
    return json::parse(r->body, nullptr, false);
  }
  // An admin action (no body); its HTTP status.
  static int Admin(const std::string& path) {
    auto r = Client().Post(path);
    return r ? r->status : -1;
  }
  static json Status() {
    auto r = Client().Get("/admin/status");
    return r ? json::parse(r->body, nullptr, false) : json();
  }
  static json Domain(const json& status) {
    return status.contains("domains") && status["domains"].contains("vulkan:0")
               ? status["domains"]["vulkan:0"]
               : json();
  }
  static json Chat(const std::string& model, const json& messages, int max_tokens,
                   const std::string& conversation = "") {
    json body = {{"model", model},        {"messages", messages}, {"max_tokens", max_tokens},
                 {"temperature", 0},      {"logprobs", true},     {"top_logprobs", 2}};
    if (!conversation.empty()) body["conversation_id"] = conversation;
    int status = 0;
    json j = Post("/v1/chat/completions", body, &status);
    EXPECT_EQ(status, 200) << j.dump();
    return j;
  }
  void TearDown() override {
    ServerSuite::TearDown();
    EXPECT_EQ(::arbiter::testing::ReadAll(server_.log).find("vulkan validation"), std::string::npos)
        << "the validation layer reported a message (see the log)";
  }
};

TEST_F(VulkanServeE2E, ChatAgreesWithTheCpuStreamsAndReusesTheConversation) {
  const json msgs = json::array({{{"role", "user"}, {"content", "Tell me about the sea"}}});
  json a = Chat("chat-cpu", msgs, 24);
  json b = Chat("chat-gpu", msgs, 24);
  const json& la = a["choices"][0]["logprobs"]["content"];
  const json& lb = b["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(la.size(), lb.size());
  for (size_t i = 0; i < la.size(); ++i) {
    if (la[i]["token"] == lb[i]["token"]) continue;
    const json& tops = la[i]["top_logprobs"];
    const double margin = tops[0]["logprob"].get<double>() - tops[1]["logprob"].get<double>();
    EXPECT_LT(margin, 0.02) << "greedy output differs at token " << i << " (not a near-tie)";
    break;
  }
  // Streaming: the same text as the non-streamed answer.
  json body = {{"model", "chat-gpu"}, {"messages", msgs}, {"max_tokens", 24},
               {"temperature", 0},    {"stream", true}};
  auto r = Client().Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r && r->status == 200);
  std::string streamed;
  std::istringstream lines(r->body);
  bool done = false;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("data: ", 0) != 0) continue;
    if (line == "data: [DONE]") {
      done = true;
      continue;
    }
    json chunk = json::parse(line.substr(6));
    const json& delta = chunk["choices"][0]["delta"];
    if (delta.contains("content") && delta["content"].is_string()) {
      streamed += delta["content"].get<std::string>();
    }
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(streamed, b["choices"][0]["message"]["content"].get<std::string>());
  // Two turns of one conversation: the second reuses the first's KV on the device.
  json t1 = Chat("chat-gpu", msgs, 8, "sea-talk");
  json msgs2 = msgs;
  msgs2.push_back({{"role", "assistant"}, {"content", t1["choices"][0]["message"]["content"]}});
  msgs2.push_back({{"role", "user"}, {"content", "And the sky?"}});
  json t2 = Chat("chat-gpu", msgs2, 8, "sea-talk");
  EXPECT_GT(t2["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 5) << t2.dump();
}

TEST_F(VulkanServeE2E, TheDeviceDomainHoldsTheModelAndEmptiesOnUnload) {
  Chat("chat-gpu", json::array({{{"role", "user"}, {"content", "hi"}}}), 4);
  json st = Status();
  json d = Domain(st);
  ASSERT_TRUE(d.is_object()) << st.dump();
  EXPECT_GT(d["charged_bytes"].get<int64_t>(), 0);
  EXPECT_LE(d["charged_bytes"].get<int64_t>(), d["budget_bytes"].get<int64_t>());
  bool listed = false;
  for (const json& m : st["models"]) {
    if (m["name"] == "chat-gpu") {
      listed = true;
      EXPECT_EQ(m.value("device", ""), "vulkan");
    }
  }
  EXPECT_TRUE(listed);
  auto metrics = Client().Get("/metrics");
  ASSERT_TRUE(metrics && metrics->status == 200);
  EXPECT_NE(metrics->body.find("arbiter_memory_domain_charged_bytes{domain=\"vulkan:0\"}"),
            std::string::npos);
  EXPECT_EQ(Admin("/admin/models/chat-gpu/unload"), 200);
  EXPECT_EQ(Domain(Status())["charged_bytes"].get<int64_t>(), 0);
}

TEST_F(VulkanServeE2E, ADeviceBudgetForOneModelEvictsTheOtherAndEmptiesAfterCycles) {
  const json hi = json::array({{{"role", "user"}, {"content", "hi"}}});
  Chat("draft-a", hi, 2);
  // draft-b does not fit beside draft-a: the device's reclaim stages demote
  // draft-a's idle device weights, then evict the idle model.
  Chat("draft-b", hi, 2);
  json st = Status();
  json d = Domain(st);
  EXPECT_LE(d["peak_bytes"].get<int64_t>(), d["budget_bytes"].get<int64_t>()) << d.dump();
  for (const json& m : st["models"]) {
    if (m["name"] == "draft-a") EXPECT_NE(m["state"], "loaded") << m.dump();
    if (m["name"] == "draft-b") EXPECT_TRUE(m["device_resident"].get<bool>()) << m.dump();
  }
  for (int i = 0; i < 100; ++i) {
    const std::string model = i % 2 == 0 ? "draft-a" : "draft-b";
    ASSERT_EQ(Admin("/admin/models/" + model + "/load"), 200) << "cycle " << i;
    ASSERT_EQ(Admin("/admin/models/" + model + "/unload"), 200) << "cycle " << i;
  }
  d = Domain(Status());
  EXPECT_EQ(d["charged_bytes"].get<int64_t>(), 0);
  EXPECT_LE(d["peak_bytes"].get<int64_t>(), d["budget_bytes"].get<int64_t>());
}


// Partial offload (Note [Partial offload] in src/engine/internal/split_compute.cc).
class VulkanSplitServeE2E : public ::arbiter::testing::ServerSuite {
 protected:
  static void SetUpTestSuite() {
    ASSERT_TRUE(MakeDir("vulkan-split-e2e"));
    ASSERT_TRUE(MakeModel("tiny-qwen3", dir_ + "/tiny", 5).ok());
    // The device budget: between the smallest that holds one layer (with
    // the output layer and the slot's device part) and the smallest that
    // holds both, as the engine counts them.
    Result<std::shared_ptr<const ModelFiles>> files = OpenModelFiles(dir_ + "/tiny");
    ASSERT_TRUE(files.ok()) << files.status().ToString();
    EngineOptions o;
    o.n_ctx = 256;
    o.device = "vulkan";
    auto least_for = [&](int layers) {
      uint64_t lo = 0, hi = uint64_t{1} << 30;
      while (lo + 1 < hi) {
        const uint64_t mid = (lo + hi) / 2;
        (*Engine::DeviceLayersFor(**files, o, mid) >= layers ? hi : lo) = mid;
      }
      return hi;
    };
    one_ = least_for(1);
    const uint64_t two = least_for(2);
    ASSERT_LT(one_ + 64 * 1024, two) << "the split's one layer needs about as much as the model";
    std::ostringstream config;
    config << "[memory]\nbudget = \"1GiB\"\n"
           << "[pressure]\nsource = \"none\"\n"
           << "[devices.\"vulkan:0\"]\nbudget = " << (one_ + two) / 2 << "\n"
           << "[[models]]\nname = \"chat-cpu\"\npath = \"tiny\"\nctx = 256\n"
           << "[[models]]\nname = \"split\"\npath = \"tiny\"\nctx = 256\ndevice = \"vulkan\"\n";
    std::string error;
    ASSERT_TRUE(StartServe(config.str(), &error)) << error;
  }

  static json Get(const std::string& path) {
    httplib::Client cli("127.0.0.1", server_.port);
    cli.set_read_timeout(300, 0);
    auto r = cli.Get(path);
    return r ? json::parse(r->body, nullptr, false) : json();
  }
  static json Chat(const std::string& model, const json& messages, int max_tokens) {
    httplib::Client cli("127.0.0.1", server_.port);
    cli.set_read_timeout(300, 0);
    json body = {{"model", model},   {"messages", messages}, {"max_tokens", max_tokens},
                 {"temperature", 0}, {"logprobs", true},     {"top_logprobs", 2}};
    auto r = cli.Post("/v1/chat/completions", body.dump(), "application/json");
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
    return r ? json::parse(r->body, nullptr, false) : json();
  }
  static json Model(const json& status, const std::string& name) {
    for (const json& m : status["models"]) {
      if (m["name"] == name) return m;
    }
    return json();
  }
  void TearDown() override {
    ServerSuite::TearDown();
    EXPECT_EQ(::arbiter::testing::ReadAll(server_.log).find("vulkan validation"), std::string::npos)
        << "the validation layer reported a message (see the log)";
  }

  static inline uint64_t one_ = 0;
};

TEST_F(VulkanSplitServeE2E, AModelOverTheDeviceBudgetRunsSplitAndChatsAsTheCpu) {
  EXPECT_NE(::arbiter::testing::ReadAll(server_.log)
                .find("model \"split\": 1 of its 2 layers (and the output layer) on device "
                      "vulkan:0, 1 on the CPU"),
            std::string::npos);
  json st = Get("/admin/status");
  EXPECT_EQ(Model(st, "split")["layers"], json({{"vulkan:0", 1}, {"cpu", 1}})) << st.dump();
  EXPECT_EQ(Model(st, "chat-cpu")["layers"], json({{"cpu", 2}}));
  const json msgs = json::array({{{"role", "user"}, {"content", "Tell me about the sea"}}});
  json a = Chat("chat-cpu", msgs, 24);
  json b = Chat("split", msgs, 24);
  const json& la = a["choices"][0]["logprobs"]["content"];
  const json& lb = b["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(la.size(), lb.size());
  for (size_t i = 0; i < la.size(); ++i) {
    if (la[i]["token"] == lb[i]["token"]) continue;
    const json& tops = la[i]["top_logprobs"];
    const double margin = tops[0]["logprob"].get<double>() - tops[1]["logprob"].get<double>();
    EXPECT_LT(margin, 0.02) << "greedy output differs at token " << i << " (not a near-tie)";
    break;
  }
  st = Get("/admin/status");
  const json& dev = st["domains"]["vulkan:0"];
  EXPECT_GT(dev["charged_bytes"].get<int64_t>(), 0);
  EXPECT_LE(dev["peak_bytes"].get<int64_t>(), dev["budget_bytes"].get<int64_t>()) << dev.dump();
  httplib::Client cli("127.0.0.1", server_.port);
  auto r = cli.Post("/admin/models/split/unload");
  ASSERT_TRUE(r && r->status == 200);
  st = Get("/admin/status");
  EXPECT_EQ(st["domains"]["vulkan:0"]["charged_bytes"].get<int64_t>(), 0) << st.dump();
}

}  // namespace
}  // namespace arbiter
