// End-to-end: the compatibility surface over real HTTP against the
// `arbiter serve` binary — CORS ([server] cors_origins: headers on every
// response to a listed origin, preflights answered without the API key,
// nothing for other origins), the API key on Ollama's and llama.cpp's
// routes, Ollama's NDJSON stream on the wire, GET /v1/models/{id}, and the
// vllm:* gauges under [server] metrics_compat = ["vllm"].
//
// One server for the suite (tiny models); every wait has a deadline.
#include <chrono>
#include <cstdlib>
#include <regex>
#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "server_process.h"
#include "server_suite.h"
#include "tools/model_maker/model_maker.h"

namespace arbiter {
namespace {

using json = nlohmann::json;

constexpr const char* kApiKey = "compat-key";
constexpr const char* kOrigin = "http://localhost:5173";

class CompatE2E : public ::arbiter::testing::ServerSuite {
 protected:
  static void SetUpTestSuite() {
    ASSERT_TRUE(MakeDir("compat-e2e"));
    ASSERT_TRUE(MakeModel("tiny", dir_ + "/tiny", 1).ok());
    std::ostringstream config;
    config << "api_key = \"" << kApiKey << "\"\n"
           << "cors_origins = [\"" << kOrigin << "\"]\n"
           << "metrics_compat = [\"vllm\"]\n"
           << "[memory]\nbudget = \"1GiB\"\n"
           << "[pressure]\nsource = \"none\"\n"
           << "[[models]]\nname = \"tiny\"\npath = \"tiny\"\nctx = 512\n";
    std::string error;
    ASSERT_TRUE(StartServe(config.str(), &error)) << error;
  }

  static httplib::Client Client(bool auth = true) {
    httplib::Client cli("127.0.0.1", server_.port);
    cli.set_read_timeout(120, 0);
    if (auth) cli.set_bearer_token_auth(kApiKey);
    return cli;
  }
};

TEST_F(CompatE2E, CorsHeadersGoToListedOriginsOnly) {
  auto ok = Client().Get("/v1/models", {{"Origin", kOrigin}});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(ok->get_header_value("Access-Control-Allow-Origin"), kOrigin);
  EXPECT_EQ(ok->get_header_value("Vary"), "Origin");
  EXPECT_NE(ok->get_header_value("Access-Control-Expose-Headers").find("Retry-After"),
            std::string::npos);
  // An error the auth check answers carries them too (the browser can read it).
  auto unauth = Client(false).Get("/v1/models", {{"Origin", kOrigin}});
  ASSERT_TRUE(unauth);
  EXPECT_EQ(unauth->status, 401);
  EXPECT_EQ(unauth->get_header_value("Access-Control-Allow-Origin"), kOrigin);
  // Another origin: nothing.
  auto other = Client().Get("/v1/models", {{"Origin", "http://evil.example"}});
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 200);
  EXPECT_FALSE(other->has_header("Access-Control-Allow-Origin"));
}

TEST_F(CompatE2E, PreflightIsAnsweredWithoutTheKeyForListedOrigins) {
  httplib::Client cli = Client(false);
  auto pre = cli.Options("/v1/chat/completions",
                         {{"Origin", kOrigin},
                          {"Access-Control-Request-Method", "POST"},
                          {"Access-Control-Request-Headers", "x-stainless-os, content-type"}});
  ASSERT_TRUE(pre);
  EXPECT_EQ(pre->status, 204);
  EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Origin"), kOrigin);
  EXPECT_NE(pre->get_header_value("Access-Control-Allow-Methods").find("POST"), std::string::npos);
  const std::string headers = pre->get_header_value("Access-Control-Allow-Headers");
  EXPECT_NE(headers.find("Authorization"), std::string::npos) << headers;
  EXPECT_NE(headers.find("x-stainless-os"), std::string::npos) << headers;
  EXPECT_EQ(pre->get_header_value("Access-Control-Max-Age"), "86400");
  // Any route, Ollama's included.
  auto ollama = cli.Options("/api/chat", {{"Origin", kOrigin},
                                          {"Access-Control-Request-Method", "POST"}});
  ASSERT_TRUE(ollama);
  EXPECT_EQ(ollama->status, 204);
  // An unlisted origin's preflight is not answered as one.
  auto other = cli.Options("/v1/chat/completions", {{"Origin", "http://evil.example"},
                                                    {"Access-Control-Request-Method", "POST"}});
  ASSERT_TRUE(other);
  EXPECT_NE(other->status, 204);
  EXPECT_FALSE(other->has_header("Access-Control-Allow-Origin"));
}

TEST_F(CompatE2E, TheApiKeyGuardsOllamaAndLlamaCppRoutesButNotTheProbe) {
  for (const char* path : {"/api/tags", "/api/ps", "/props", "/slots"}) {
    auto r = Client(false).Get(path);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 401) << path;
    auto ok = Client().Get(path);
    ASSERT_TRUE(ok) << path;
    EXPECT_EQ(ok->status, 200) << path << " " << ok->body;
  }
  auto probe = Client(false).Get("/");
  ASSERT_TRUE(probe);
  EXPECT_EQ(probe->status, 200);
  EXPECT_EQ(probe->body, "Ollama is running");
}

TEST_F(CompatE2E, OllamaStreamsNdjsonOnTheWire) {
  std::string body;
  auto r = Client().Post("/api/chat",
                         R"({"model":"tiny:latest","messages":[{"role":"user","content":"hi"}],
                             "options":{"num_predict":4,"temperature":0}})",
                         "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("Content-Type"), "application/x-ndjson");
  std::vector<json> lines;
  size_t pos = 0;
  while (pos < r->body.size()) {
    const size_t end = r->body.find('\n', pos);
    ASSERT_NE(end, std::string::npos) << "every object ends with a newline";
    lines.push_back(json::parse(r->body.substr(pos, end - pos)));
    pos = end + 1;
  }
  ASSERT_GE(lines.size(), 2u);
  EXPECT_EQ(lines.back()["done"], true);
  EXPECT_EQ(lines.back()["eval_count"], 4);
}

TEST_F(CompatE2E, ModelsRetrieveAndVllmGauges) {
  auto m = Client().Get("/v1/models/tiny");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  EXPECT_EQ(json::parse(m->body)["id"], "tiny");
  auto missing = Client().Get("/v1/models/org/absent");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(json::parse(missing->body)["error"]["code"], "model_not_found");
  auto chat = Client().Post("/v1/chat/completions",
                            R"({"model":"tiny","messages":[{"role":"user","content":"hi"}],
                                "max_tokens":3})",
                            "application/json");
  ASSERT_TRUE(chat);
  ASSERT_EQ(chat->status, 200) << chat->body;
  auto metrics = Client().Get("/metrics");
  ASSERT_TRUE(metrics);
  for (const char* series : {"vllm:num_requests_running{model_name=\"tiny\"} 0",
                             "vllm:num_requests_waiting{model_name=\"tiny\"} 0",
                             "vllm:kv_cache_usage_perc{model_name=\"tiny\"} ",
                             "arbiter_time_to_first_token_seconds_count{model=\"tiny\"} "}) {
    EXPECT_NE(metrics->body.find(series), std::string::npos) << series;
  }
  // The slot holds the chat's tokens: usage above 0.
  const size_t at = metrics->body.find("vllm:kv_cache_usage_perc{model_name=\"tiny\"} ");
  ASSERT_NE(at, std::string::npos);
  EXPECT_GT(std::stod(metrics->body.substr(at + 44)), 0.0);
}

// Ollama's keep_alive past Go's largest duration means "forever": the TTL
// is really lifted (not overflowed, nor refused and only logged), and
// /api/ps reports a valid RFC 3339 expires_at, centuries ahead.
TEST_F(CompatE2E, HugeKeepAliveIsForeverWithAValidExpiresAt) {
  const std::regex rfc3339(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z)");
  auto chat = [&](const json& keep_alive) {
    json body = {{"model", "tiny"},
                 {"messages", {{{"role", "user"}, {"content", "hi"}}}},
                 {"stream", false},
                 {"keep_alive", keep_alive},
                 {"options", {{"num_predict", 2}}}};
    auto r = Client().Post("/api/chat", body.dump(), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << keep_alive << ": " << r->body;
    EXPECT_TRUE(std::regex_match(json::parse(r->body)["created_at"].get<std::string>(), rfc3339));
  };
  auto expires_at = [&] {
    auto ps = Client().Get("/api/ps");
    EXPECT_TRUE(ps && ps->status == 200);
    const json models = json::parse(ps->body)["models"];
    EXPECT_EQ(models.size(), 1u) << models;
    return models.empty() ? std::string() : models[0]["expires_at"].get<std::string>();
  };
  // The TTL is applied after the answer is sent (Note [keep_alive] in
  // routes_ollama.cc): wait, with a deadline, for expires_at to show it.
  auto expires_at_once = [&](const std::string& prefix) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    std::string at = expires_at();
    while (at.rfind(prefix, 0) != 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      at = expires_at();
    }
    return at;
  };
  for (const json& huge : {json(1e18), json(9.3e15), json("99999999999h"), json(-1)}) {
    chat("1h");  // a TTL first, so that "forever" must replace it
    const std::string hour = expires_at_once("20");
    EXPECT_TRUE(std::regex_match(hour, rfc3339)) << hour;
    EXPECT_EQ(hour.substr(0, 2), "20") << hour;
    chat(huge);
    const std::string forever = expires_at_once("23");
    EXPECT_TRUE(std::regex_match(forever, rfc3339)) << huge << ": " << forever;
    EXPECT_GE(forever.substr(0, 4), "2300") << huge << ": " << forever;
    EXPECT_LE(forever.substr(0, 4), "9999") << huge << ": " << forever;
  }
  EXPECT_EQ(::arbiter::testing::ReadAll(server_.log).find("keep_alive of model"),
            std::string::npos);
}

}  // namespace
}  // namespace arbiter
