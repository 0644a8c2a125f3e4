// The compatibility routes in process, against a real Runtime on tiny
// models (as routes_test.cc): Ollama's API (routes_ollama.cc,
// internal/ollama.h), the llama.cpp server's endpoints
// (routes_llamacpp.cc), GET /v1/models/{id} and the text-request metrics
// (internal/metrics.h TextRun). CORS lives in the transport and is covered
// by tests/compat_e2e_test.cc.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <limits>
#include <map>
#include <regex>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "arbiter/runtime/runtime.h"
#include "runtime/testing/tiny_runtime.h"
#include "server/internal/context.h"
#include "server/internal/http/fake_responder.h"
#include "server/internal/ollama.h"
#include "server/testing/route_harness.h"

namespace arbiter::server_internal {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

class CompatRoutesTest : public RouteHarness {
 protected:
  std::vector<std::vector<Route>> Groups(ServerContext& ctx) override {
    return {OpenAIRoutes(ctx), AdminRoutes(ctx), OllamaRoutes(ctx), LlamaCppRoutes(ctx)};
  }

  // The NDJSON lines of a streamed body.
  static std::vector<json> Lines(const http::FakeResponder& r) {
    std::vector<json> out;
    const std::string body = r.body();
    size_t pos = 0;
    while (pos < body.size()) {
      size_t end = body.find('\n', pos);
      if (end == std::string::npos) end = body.size();
      out.push_back(json::parse(body.substr(pos, end - pos), nullptr, false));
      pos = end + 1;
    }
    return out;
  }

  bool Loaded(const std::string& model) {
    for (const ModelStatus& m : rt_->Status().models) {
      if (m.arbiter.name == model) return m.arbiter.state == ModelState::kLoaded;
    }
    return false;
  }
};

// ---- Ollama -----------------------------------------------------------------

TEST_F(CompatRoutesTest, TagsListTextAndEmbeddingModelsWithTheLatestTag) {
  auto r = Call("GET /api/tags");
  ASSERT_EQ(r->status(), 200);
  json j = Body(*r);
  ASSERT_EQ(j["models"].size(), 2u) << j;
  EXPECT_EQ(j["models"][0]["name"], "chat:latest");
  EXPECT_EQ(j["models"][0]["model"], "chat:latest");
  EXPECT_EQ(j["models"][0]["digest"].get<std::string>().size(), 64u);
  EXPECT_EQ(j["models"][1]["name"], "emb:latest");
  EXPECT_EQ(Body(*Call("GET /api/version"))["version"], "0.9.0");
  EXPECT_EQ(Call("GET /")->body(), "Ollama is running");
  EXPECT_EQ(Call("HEAD /")->body(), "");
}

TEST_F(CompatRoutesTest, ChatNotStreamedHasOllamasShapeAndTimings) {
  auto r = Call("POST /api/chat",
                R"({"model":"chat:latest","messages":[{"role":"user","content":"hi"}],
                    "stream":false,"options":{"num_predict":3,"temperature":0}})");
  ASSERT_EQ(r->status(), 200) << r->body();
  EXPECT_FALSE(r->streamed());
  json j = Body(*r);
  EXPECT_EQ(j["model"], "chat:latest");
  EXPECT_EQ(j["message"]["role"], "assistant");
  EXPECT_TRUE(j["message"]["content"].is_string());
  EXPECT_EQ(j["done"], true);
  EXPECT_EQ(j["done_reason"], "length");
  EXPECT_EQ(j["eval_count"], 3);
  EXPECT_GT(j["prompt_eval_count"].get<int>(), 0);
  for (const char* k : {"total_duration", "load_duration", "prompt_eval_duration",
                        "eval_duration"}) {
    EXPECT_TRUE(j[k].is_number_integer()) << k;
  }
  EXPECT_GE(j["total_duration"].get<int64_t>(), j["eval_duration"].get<int64_t>());
  EXPECT_EQ(j["created_at"].get<std::string>().back(), 'Z');
}

TEST_F(CompatRoutesTest, ChatStreamsNdjsonByDefaultAndMatchesTheWholeAnswer) {
  const char* req = R"({"model":"chat","messages":[{"role":"user","content":"hi"}],
                        "options":{"num_predict":4,"temperature":0}})";
  auto s = Call("POST /api/chat", req);
  ASSERT_EQ(s->status(), 200) << s->body();
  EXPECT_TRUE(s->streamed());
  EXPECT_TRUE(s->ended());
  EXPECT_EQ(s->content_type(), "application/x-ndjson");
  std::vector<json> lines = Lines(*s);
  ASSERT_GE(lines.size(), 2u);
  std::string joined;
  for (size_t i = 0; i + 1 < lines.size(); ++i) {
    EXPECT_EQ(lines[i]["done"], false);
    joined += lines[i]["message"]["content"].get<std::string>();
  }
  EXPECT_EQ(lines.back()["done"], true);
  EXPECT_EQ(lines.back()["eval_count"], 4);
  json whole = json::parse(req);
  whole["stream"] = false;
  EXPECT_EQ(Body(*Call("POST /api/chat", whole.dump()))["message"]["content"], joined);
}

TEST_F(CompatRoutesTest, GenerateTemplatedAndRaw) {
  auto r = Call("POST /api/generate",
                R"({"model":"chat","prompt":"hello","system":"be brief","stream":false,
                    "options":{"num_predict":2,"temperature":0,"seed":3}})");
  ASSERT_EQ(r->status(), 200) << r->body();
  EXPECT_TRUE(Body(*r)["response"].is_string());
  EXPECT_EQ(Body(*r)["eval_count"], 2);
  auto raw = Call("POST /api/generate",
                  R"({"model":"chat","prompt":"hello","raw":true,"stream":false,
                      "options":{"num_predict":2}})");
  ASSERT_EQ(raw->status(), 200) << raw->body();
  // Chat-templated "hello" is longer than the raw prompt.
  EXPECT_LT(Body(*raw)["prompt_eval_count"].get<int>(), Body(*r)["prompt_eval_count"].get<int>());
}

TEST_F(CompatRoutesTest, EveryUnsupportedFieldOrOptionIsA400NamingIt) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"model":"chat","messages":[],"bogus":1})", "\"bogus\""},
      {R"({"model":"chat","messages":[{"role":"user","content":"x","extra":1}]})",
       "messages[0].extra"},
      {R"({"model":"chat","messages":[{"role":"user","content":"x"}],"options":{"mirostat":1}})",
       "options.mirostat"},
      {R"({"model":"chat","messages":[{"role":"user","content":"x"}],"options":{"tfs_z":0.5}})",
       "options.tfs_z"},
      {R"({"model":"chat","messages":[{"role":"user","content":"x"}],"options":{"typical_p":0.5}})",
       "options.typical_p"},
      {R"({"model":"chat","messages":[{"role":"user","content":"x"}],"options":{"repeat_last_n":64}})",
       "options.repeat_last_n"},
      {R"({"model":"chat","messages":[{"role":"user","content":"x"}],"options":{"num_ctx":4096}})",
       "options.num_ctx"},
      {R"({"model":"chat","messages":[{"role":"user","content":"x"}],"options":{"wat":1}})",
       "options.wat"},
      {R"({"model":"chat","messages":[{"role":"user","content":"x"}],"options":{"temperature":"hot"}})",
       "options.temperature"},
      {R"({"model":"chat","messages":[{"role":"user","content":"x"}],"options":{"top_k":1e300}})",
       "options.top_k"},
      {R"({"model":"chat","messages":[{"role":"user","content":"x"}],"options":{"seed":18446744073709551615}})",
       "options.seed"},
      {R"({"model":"chat","messages":[{"role":"user","content":"x"}],"format":"yaml"})", "format"},
      {R"({"model":"chat","messages":[{"role":"user","content":"x"}],"think":true})", "think"},
      {R"({"model":"chat","messages":[{"role":"user","content":"x"}],"keep_alive":"5 parsecs"})",
       "keep_alive"},
      {R"({"model":"chat","messages":[{"role":"user","content":"x","images":["!!"]}]})",
       "messages[0].images[0]"},
      {R"({"model":"chat","messages":[{"role":"user","content":"x","thinking":"hm"}]})",
       "messages[0].thinking"},
      {R"({"model":"chat","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","strict":true}}]})",
       "tools[0].function.strict"},
  };
  for (const auto& [body, name] : cases) {
    auto r = Call("POST /api/chat", body);
    EXPECT_EQ(r->status(), 400) << body;
    json j = Body(*r);
    ASSERT_TRUE(j["error"].is_string()) << r->body();  // Ollama's shape
    EXPECT_NE(j["error"].get<std::string>().find(name), std::string::npos) << j;
  }
  for (const char* body :
       {R"({"model":"chat","prompt":"x","suffix":"y"})", R"({"model":"chat","prompt":"x","template":"t"})",
        R"({"model":"chat","prompt":"x","context":[1,2]})",
        R"({"model":"chat","prompt":"x","raw":true,"system":"s"})"}) {
    EXPECT_EQ(Call("POST /api/generate", body)->status(), 400) << body;
  }
  // Documented no-ops and "off" values pass.
  auto ok = Call("POST /api/chat",
                 R"({"model":"chat","messages":[{"role":"user","content":"x"}],"stream":false,
                     "think":false,"options":{"num_predict":1,"num_thread":4,"num_gpu":0,
                     "use_mmap":true,"numa":false,"num_batch":512,"low_vram":false,
                     "mirostat":0,"mirostat_tau":5,"mirostat_eta":0.1,"tfs_z":1,"typical_p":1,
                     "repeat_last_n":-1,"num_ctx":256,"repeat_penalty":1.1,
                     "presence_penalty":0.5,"frequency_penalty":0.5,"min_p":0.05,"top_k":40,
                     "top_p":0.9,"stop":["\n\n"]}})");
  EXPECT_EQ(ok->status(), 200) << ok->body();
  // Unknown model: 404 in Ollama's shape.
  auto missing = Call("POST /api/chat", R"({"model":"nope","messages":[{"role":"user","content":"x"}]})");
  EXPECT_EQ(missing->status(), 404);
  EXPECT_TRUE(Body(*missing)["error"].is_string());
}

TEST_F(CompatRoutesTest, AnEmptyGenerateLoadsAndKeepAliveZeroUnloads) {
  EXPECT_FALSE(Loaded("chat"));
  auto load = Call("POST /api/generate", R"({"model":"chat","stream":false})");
  ASSERT_EQ(load->status(), 200) << load->body();
  EXPECT_EQ(Body(*load)["done_reason"], "load");
  EXPECT_TRUE(Loaded("chat"));
  auto ps = Body(*Call("GET /api/ps"));
  ASSERT_EQ(ps["models"].size(), 1u) << ps;
  EXPECT_EQ(ps["models"][0]["name"], "chat:latest");
  EXPECT_EQ(ps["models"][0]["size_vram"], 0);
  EXPECT_GT(ps["models"][0]["size"].get<uint64_t>(), 0u);
  // No TTL: Ollama's "forever", centuries ahead.
  EXPECT_EQ(ps["models"][0]["expires_at"].get<std::string>().substr(0, 2), "23") << ps;
  auto unload = Call("POST /api/generate", R"({"model":"chat","keep_alive":0,"stream":false})");
  ASSERT_EQ(unload->status(), 200) << unload->body();
  EXPECT_EQ(Body(*unload)["done_reason"], "unload");
  EXPECT_FALSE(Loaded("chat"));
  EXPECT_TRUE(Body(*Call("GET /api/ps"))["models"].empty());
}

TEST_F(CompatRoutesTest, KeepAliveSetsTheIdleTtlAfterTheRequest) {
  auto r = Call("POST /api/chat",
                R"({"model":"chat","messages":[{"role":"user","content":"x"}],"stream":false,
                    "keep_alive":"1h","options":{"num_predict":1}})");
  ASSERT_EQ(r->status(), 200) << r->body();
  json ps = Body(*Call("GET /api/ps"));
  ASSERT_EQ(ps["models"].size(), 1u);
  const std::string expires = ps["models"][0]["expires_at"];
  EXPECT_EQ(expires.substr(0, 2), "20") << expires;  // within the hour, not "forever"
  // keep_alive 0: unloaded by the reaper (every second) soon after.
  r = Call("POST /api/chat",
           R"({"model":"chat","messages":[{"role":"user","content":"x"}],"stream":false,
               "keep_alive":0,"options":{"num_predict":1}})");
  ASSERT_EQ(r->status(), 200) << r->body();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (Loaded("chat") && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_FALSE(Loaded("chat"));
}

TEST_F(CompatRoutesTest, EmbedShowAndLegacyEmbeddings) {
  auto e = Call("POST /api/embed", R"({"model":"emb","input":["a b","c"]})");
  ASSERT_EQ(e->status(), 200) << e->body();
  json j = Body(*e);
  EXPECT_EQ(j["model"], "emb:latest");
  ASSERT_EQ(j["embeddings"].size(), 2u);
  EXPECT_GT(j["prompt_eval_count"].get<int>(), 0);
  auto legacy = Call("POST /api/embeddings", R"({"model":"emb","prompt":"a b"})");
  ASSERT_EQ(legacy->status(), 200) << legacy->body();
  EXPECT_EQ(Body(*legacy)["embedding"], j["embeddings"][0]);
  EXPECT_EQ(Call("POST /api/embed", R"({"model":"emb","input":"a","options":{"temperature":1}})")
                ->status(),
            400);
  auto show = Call("POST /api/show", R"({"model":"chat:latest"})");
  ASSERT_EQ(show->status(), 200) << show->body();
  EXPECT_EQ(Body(*show)["capabilities"][0], "completion");
  EXPECT_EQ(Body(*show)["model_info"]["arbiter.context_length"], 256);
  EXPECT_EQ(Body(*Call("POST /api/show", R"({"name":"emb"})"))["capabilities"][0], "embedding");
  EXPECT_EQ(Call("POST /api/show", R"({"model":"nope"})")->status(), 404);
}

TEST(OllamaParseTest, KeepAliveDurations) {
  auto ms = [](const json& v) -> std::optional<int64_t> {
    Result<OllamaKeepAlive> k = ParseKeepAlive(v);
    EXPECT_TRUE(k.ok()) << v;
    return k.ok() ? k->ttl_ms : std::optional<int64_t>(-42);
  };
  EXPECT_EQ(ms(300), 300000);
  EXPECT_EQ(ms(0), 0);
  EXPECT_EQ(ms(-1), std::nullopt);
  EXPECT_EQ(ms("5m"), 300000);
  EXPECT_EQ(ms("1h30m"), 5400000);
  EXPECT_EQ(ms("30s"), 30000);
  EXPECT_EQ(ms("500ms"), 500);
  EXPECT_EQ(ms("1.5s"), 1500);
  EXPECT_EQ(ms("0"), 0);
  EXPECT_EQ(ms("-1"), std::nullopt);
  EXPECT_EQ(ms("-1m"), std::nullopt);
  EXPECT_EQ(ms("120"), 120000);
  for (const json& bad : {json("5 minutes"), json("m"), json(""), json(true), json::array()}) {
    EXPECT_FALSE(ParseKeepAlive(bad).ok()) << bad;
  }
  EXPECT_EQ(OllamaStripTag("m:latest"), "m");
  EXPECT_EQ(OllamaStripTag("m:7b"), "m:7b");
  EXPECT_EQ(OllamaTime(0, 5), "1970-01-01T00:00:00.000000005Z");
}

// A keep_alive as long as Go's largest duration or longer is Ollama's
// "forever" (no TTL), never an overflowed TTL.
TEST(OllamaParseTest, HugeKeepAliveIsForever) {
  for (const json& huge : {json(1e18), json(9.3e15), json(9223372037.0), json("99999999999h"),
                           json("9223372037s"), json("2562048h"), json(std::string(400, '9') + "h"),
                           json("1e18"), json(1.7976931348623157e308)}) {
    Result<OllamaKeepAlive> k = ParseKeepAlive(huge);
    ASSERT_TRUE(k.ok()) << huge << ": " << k.status().ToString();
    EXPECT_EQ(k->ttl_ms, std::nullopt) << huge;
  }
  // Just under the bound: a TTL, exactly.
  Result<OllamaKeepAlive> k = ParseKeepAlive(json("2562047h"));
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(k->ttl_ms, int64_t{2562047} * 3600 * 1000);
  EXPECT_LT(*k->ttl_ms, kOllamaForeverMs);
  k = ParseKeepAlive(json(9223372036.0));
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(k->ttl_ms, int64_t{9223372036000});
}

// Every time OllamaTime writes is RFC 3339 with a four-digit year and a
// nine-digit fraction, whatever it is given.
TEST(OllamaParseTest, OllamaTimeIsAlwaysRfc3339) {
  EXPECT_EQ(OllamaTime(1, -1), "1970-01-01T00:00:00.999999999Z");
  EXPECT_EQ(OllamaTime(0, 1500000000), "1970-01-01T00:00:01.500000000Z");
  EXPECT_EQ(OllamaTime(-1, 0), "1969-12-31T23:59:59.000000000Z");
  EXPECT_EQ(OllamaTime(int64_t{1} << 50, 0), "9999-12-31T23:59:59.999999999Z");
  EXPECT_EQ(OllamaTime(std::numeric_limits<int64_t>::max(), 999999999),
            "9999-12-31T23:59:59.999999999Z");
  EXPECT_EQ(OllamaTime(std::numeric_limits<int64_t>::min() / 2, -840119219),
            "0001-01-01T00:00:00.000000000Z");
  EXPECT_EQ(OllamaTime(std::numeric_limits<int64_t>::min()), "1677-09-21T00:12:43.145224192Z");
}

TEST_F(CompatRoutesTest, HugeKeepAliveLiftsTheTtlAndExpiresAtStaysValid) {
  const std::regex rfc3339(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z)");
  for (const char* huge : {"1e18", "9.3e15", "\"99999999999h\""}) {
    auto r = Call("POST /api/chat",
                  R"({"model":"chat","messages":[{"role":"user","content":"x"}],"stream":false,
                      "keep_alive":"1h","options":{"num_predict":1}})");
    ASSERT_EQ(r->status(), 200) << r->body();
    r = Call("POST /api/chat",
             std::string(R"({"model":"chat","messages":[{"role":"user","content":"x"}],)") +
                 R"("stream":false,"options":{"num_predict":1},"keep_alive":)" + huge + "}");
    ASSERT_EQ(r->status(), 200) << huge << ": " << r->body();
    json ps = Body(*Call("GET /api/ps"));
    ASSERT_EQ(ps["models"].size(), 1u) << ps;
    const std::string expires = ps["models"][0]["expires_at"];
    EXPECT_TRUE(std::regex_match(expires, rfc3339)) << huge << ": " << expires;
    EXPECT_EQ(expires.substr(0, 2), "23") << huge << ": " << expires;  // forever, not the hour
  }
}

// ---- llama.cpp server -------------------------------------------------------

TEST_F(CompatRoutesTest, TokenizeDetokenizeRoundTrip) {
  auto t = Call("POST /tokenize", R"({"content":"hello world","with_pieces":true})");
  ASSERT_EQ(t->status(), 200) << t->body();
  json tokens = Body(*t)["tokens"];
  ASSERT_FALSE(tokens.empty());
  std::string pieces;
  json ids = json::array();
  for (const json& tok : tokens) {
    pieces += tok["piece"].get<std::string>();
    ids.push_back(tok["id"]);
  }
  EXPECT_EQ(pieces, "hello world");
  auto plain = Call("POST /tokenize", R"({"content":"hello world","model":"chat"})");
  EXPECT_EQ(Body(*plain)["tokens"], ids);
  auto d = Call("POST /detokenize", json{{"tokens", ids}}.dump());
  ASSERT_EQ(d->status(), 200) << d->body();
  EXPECT_EQ(Body(*d)["content"], "hello world");
  EXPECT_EQ(Call("POST /detokenize", R"({"tokens":[99999999]})")->status(), 400);
  EXPECT_EQ(Call("POST /tokenize", R"({"content":"x","n_probs":1})")->status(), 400);
  EXPECT_EQ(Call("POST /tokenize", R"({"content":"x"})", {}, {{"model", "emb"}})->status(), 400);
}

TEST_F(CompatRoutesTest, PropsAndSlotsNeverLoadTheModel) {
  auto p = Call("GET /props");
  ASSERT_EQ(p->status(), 200) << p->body();
  json j = Body(*p);
  EXPECT_EQ(j["default_generation_settings"]["n_ctx"], 256);
  EXPECT_EQ(j["total_slots"], 1);
  EXPECT_EQ(j["loaded"], false);
  EXPECT_FALSE(Loaded("chat"));
  auto s = Call("GET /slots");
  ASSERT_EQ(s->status(), 200) << s->body();
  ASSERT_EQ(Body(*s).size(), 1u);
  EXPECT_EQ(Body(*s)[0]["id"], 0);
  EXPECT_EQ(Body(*s)[0]["is_processing"], false);
  // After a chat: loaded, its template known, its slot holding the tokens.
  ASSERT_EQ(Call("POST /api/chat", R"({"model":"chat","messages":[{"role":"user","content":"x"}],
                                        "stream":false,"options":{"num_predict":2}})")
                ->status(),
            200);
  j = Body(*Call("GET /props", "", {}, {{"model", "chat"}}));
  EXPECT_EQ(j["loaded"], true);
  EXPECT_FALSE(j["chat_template"].get<std::string>().empty());
  EXPECT_GT(Body(*Call("GET /slots"))[0]["n_tokens"].get<int>(), 0);
  EXPECT_EQ(Call("GET /slots", "", {}, {{"model", "nope"}})->status(), 404);
}

// ---- OpenAI's models.retrieve -----------------------------------------------

TEST_F(CompatRoutesTest, ModelsRetrieve) {
  auto r = Call("GET /v1/models/{id...}", "", {{"id", "chat"}});
  ASSERT_EQ(r->status(), 200) << r->body();
  EXPECT_EQ(Body(*r)["id"], "chat");
  EXPECT_EQ(Body(*r)["object"], "model");
  auto missing = Call("GET /v1/models/{id...}", "", {{"id", "gpt-4"}});
  EXPECT_EQ(missing->status(), 404);
  EXPECT_EQ(Body(*missing)["error"]["code"], "model_not_found");
}

// ---- metrics ----------------------------------------------------------------

TEST_F(CompatRoutesTest, TextRequestsFeedTheLatencyHistogramsAndGauges) {
  ctx_.metrics->EnableVllmCompat();
  // Greedy: the tiny model runs to the token limit (no early end of turn).
  ASSERT_EQ(Call("POST /api/chat", R"({"model":"chat","messages":[{"role":"user","content":"x"}],
                                        "stream":false,"options":{"num_predict":3,
                                        "temperature":0}})")
                ->status(),
            200);
  ASSERT_EQ(Call("POST /v1/chat/completions",
                 R"({"model":"chat","messages":[{"role":"user","content":"hi"}],"max_tokens":2,
                     "temperature":0})")
                ->status(),
            200);
  const std::string text = Call("GET /metrics")->body();
  for (const char* series :
       {"arbiter_time_to_first_token_seconds_count{model=\"chat\"} 2",
        "arbiter_e2e_request_latency_seconds_count{model=\"chat\"} 2",
        "arbiter_time_per_output_token_seconds_count{model=\"chat\"} 2",
        "arbiter_generation_tokens_total{model=\"chat\"} 5",
        "arbiter_num_requests_running{model=\"chat\"} 0",
        "arbiter_num_requests_waiting{model=\"chat\"} 0",
        "vllm:num_requests_running{model_name=\"chat\"} 0",
        "vllm:num_requests_waiting{model_name=\"chat\"} 0",
        "vllm:kv_cache_usage_perc{model_name=\"chat\"}"}) {
    EXPECT_NE(text.find(series), std::string::npos) << series << "\n" << text;
  }
}

TEST(TextRunTest, WaitingThenRunningThenGone) {
  ServerMetrics m;
  auto gauge = [&](const char* name) {
    const std::string text = m.Scrape(ArbiterStats{}, MemoryLedgerSnapshot{}, nullptr);
    const std::string key = std::string(name) + "{model=\"a\"} ";
    const size_t at = text.find(key);
    return at == std::string::npos ? -1.0 : std::stod(text.substr(at + key.size()));
  };
  {
    TextRun run = m.StartTextRun("a");
    EXPECT_EQ(gauge("arbiter_num_requests_waiting"), 1);
    EXPECT_EQ(gauge("arbiter_num_requests_running"), -1);  // not yet a series
    run.FirstToken();
    run.FirstToken();  // once
    EXPECT_EQ(gauge("arbiter_num_requests_waiting"), 0);
    EXPECT_EQ(gauge("arbiter_num_requests_running"), 1);
    TextRun moved = std::move(run);
    moved.Finished(10, 4);
  }
  EXPECT_EQ(gauge("arbiter_num_requests_running"), 0);
  EXPECT_EQ(gauge("arbiter_prompt_tokens_total"), 10);
  EXPECT_EQ(gauge("arbiter_generation_tokens_total"), 4);
  {
    TextRun failed = m.StartTextRun("a");  // no token: leaves waiting
  }
  EXPECT_EQ(gauge("arbiter_num_requests_waiting"), 0);
}

}  // namespace
}  // namespace arbiter::server_internal
