// The route handlers in process, against a real Runtime on tiny models (no
// fork, no socket): each handler gets an http::Request and answers through an
// in-memory http::FakeResponder. Covers the OpenAI routes (chat and
// completions share one runner, streaming and not), embeddings, the admin
// actions (empty bodies included), status and KV snapshots, and the error
// table's mapping of typed reasons.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "arbiter/runtime/runtime.h"
#include "server/internal/context.h"
#include "server/internal/http/fake_responder.h"
#include "runtime/testing/forwarding_runtime.h"
#include "runtime/testing/tiny_runtime.h"
#include "server/testing/route_harness.h"

namespace arbiter::server_internal {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

class RoutesTest : public RouteHarness {
 protected:
  std::vector<std::vector<Route>> Groups(ServerContext& ctx) override {
    return {OpenAIRoutes(ctx), AdminRoutes(ctx), ResponsesRoutes(ctx)};
  }
};

const char* kChat = R"({"model":"chat","messages":[{"role":"user","content":"hi"}],
                       "max_tokens":3,"temperature":0})";

TEST_F(RoutesTest, SnapshotsRunInlineAndEverythingThatMayBlockOnAWorker) {
  for (const auto& [name, r] : routes_) {
    const bool inline_ok = name == "GET /v1/models" || name == "GET /v1/models/{id...}" ||
                           name == "GET /admin/status" ||
                           name == "GET /metrics";
    EXPECT_EQ(r.dispatch == http::Dispatch::kInline, inline_ok) << name;
  }
}

TEST_F(RoutesTest, ChatNonStreamingAndStreamingShareOneRunner) {
  auto r = Call("POST /v1/chat/completions", kChat);
  ASSERT_EQ(r->status(), 200) << r->body();
  json j = Body(*r);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);
  const std::string text = j["choices"][0]["message"]["content"];

  json req = json::parse(kChat);
  req["stream"] = true;
  req["stream_options"] = {{"include_usage", true}};
  auto s = Call("POST /v1/chat/completions", req.dump());
  EXPECT_EQ(s->status(), 200);
  EXPECT_TRUE(s->streamed());
  EXPECT_TRUE(s->ended());
  EXPECT_EQ(s->content_type(), "text/event-stream");
  const std::string sse = s->body();
  EXPECT_NE(sse.find("\"usage\""), std::string::npos) << sse;
  EXPECT_EQ(sse.substr(sse.size() - 14), "data: [DONE]\n\n");
  // Greedy: the streamed deltas add up to the same text.
  std::string joined;
  for (const std::string& chunk : s->chunks()) {
    if (chunk.rfind("data: {", 0) != 0) continue;
    json c = json::parse(chunk.substr(6));
    if (!c["choices"].empty() && c["choices"][0]["delta"].contains("content")) {
      joined += c["choices"][0]["delta"]["content"].get<std::string>();
    }
  }
  EXPECT_EQ(joined, text);
}

TEST_F(RoutesTest, CompletionWithEchoAndAConversationReportsTheKvSlot) {
  auto r = Call("POST /v1/completions",
                R"({"model":"chat","prompt":"hello","max_tokens":2,"temperature":0,"echo":true,
                    "conversation_id":"c1"})");
  ASSERT_EQ(r->status(), 200) << r->body();
  EXPECT_EQ(Body(*r)["choices"][0]["text"].get<std::string>().rfind("hello", 0), 0u);
  EXPECT_EQ(r->header("X-Arbiter-Kv-Slot"), "0");
  EXPECT_EQ(r->header("X-Arbiter-Kv-Source"), "none");
}

TEST_F(RoutesTest, AClientThatLeftStopsTheStream) {
  json req = json::parse(kChat);
  req["stream"] = true;
  req["max_tokens"] = 200;
  auto out = std::make_unique<http::FakeResponder>();
  out->CancelAfterWrites(2);
  http::Request hr;
  hr.method = "POST";
  hr.path = "/v1/chat/completions";
  hr.body = req.dump();
  routes_.at("POST /v1/chat/completions").handler(hr, *out);
  EXPECT_LE(out->chunks().size(), 2u);
  EXPECT_FALSE(out->ended());
  EXPECT_EQ(out->body().find("[DONE]"), std::string::npos);
}

TEST_F(RoutesTest, EmbeddingsAndCapabilityErrors) {
  auto r = Call("POST /v1/embeddings", R"({"model":"emb","input":["a","b"]})");
  ASSERT_EQ(r->status(), 200) << r->body();
  EXPECT_EQ(Body(*r)["data"].size(), 2u);
  auto wrong = Call("POST /v1/embeddings", R"({"model":"chat","input":"a"})");
  EXPECT_EQ(wrong->status(), 400);
  EXPECT_EQ(Body(*wrong)["error"]["code"], "wrong_model_capability");
  auto missing = Call("POST /v1/chat/completions", R"({"model":"nope","messages":[
                      {"role":"user","content":"x"}]})");
  EXPECT_EQ(missing->status(), 404);
  EXPECT_EQ(Body(*missing)["error"]["code"], "model_not_found");
  auto bad = Call("POST /v1/chat/completions", R"({"model":"chat"})");
  EXPECT_EQ(bad->status(), 400);
  EXPECT_EQ(Body(*bad)["error"]["code"], "invalid_request");
}

TEST_F(RoutesTest, PressureRefusesNonTextWithRetryAfterAndStatusShowsIt) {
  ASSERT_EQ(Call("POST /v1/embeddings", R"({"model":"emb","input":"a"})")->status(), 200);
  auto p = Call("POST /admin/pressure", R"({"level":"critical","free_mb":10})");
  ASSERT_EQ(p->status(), 200) << p->body();
  EXPECT_EQ(Body(*p)["pressure"], "critical");
  auto e = Call("POST /v1/embeddings", R"({"model":"emb","input":"a"})");
  EXPECT_EQ(e->status(), 503);
  EXPECT_EQ(Body(*e)["error"]["code"], "memory_pressure");
  EXPECT_EQ(e->header("Retry-After"), "5");
  EXPECT_EQ(Call("POST /v1/chat/completions", kChat)->status(), 200);
  json st = Body(*Call("GET /admin/status"));
  EXPECT_EQ(st["pressure"], "critical");
  EXPECT_TRUE(st.contains("next_victim"));
  EXPECT_EQ(st["domains"]["host"]["next_victim"], st["next_victim"]);
  for (const json& m : st["models"]) {
    if (m["name"] == "emb") {
      EXPECT_FALSE(m["resident"].get<bool>());
    }
  }
  EXPECT_EQ(Call("POST /admin/pressure", R"({"level":"nominal"})")->status(), 200);
  EXPECT_EQ(Call("POST /v1/embeddings", R"({"model":"emb","input":"a"})")->status(), 200);
  EXPECT_EQ(Call("POST /admin/pressure", R"({"level":"panic"})")->status(), 400);
}

TEST_F(RoutesTest, AdminActionsAcceptEmptyBodies) {
  auto load = Call("POST /admin/models/{name}/load", "", {{"name", "emb"}});
  ASSERT_EQ(load->status(), 200) << load->body();
  EXPECT_TRUE(Body(*load)["resident"].get<bool>());
  EXPECT_EQ(Call("POST /admin/compact", "")->status(), 200);
  auto unload = Call("POST /admin/models/{name}/unload", "", {{"name", "emb"}});
  ASSERT_EQ(unload->status(), 200) << unload->body();
  EXPECT_TRUE(Body(*unload)["unloaded"].get<bool>());
  auto close = Call("POST /admin/conversations/{id}/close", "", {{"id", "room-1"}});
  EXPECT_EQ(close->status(), 404);
  EXPECT_EQ(Body(*close)["error"]["code"], "conversation_not_found");
  EXPECT_EQ(Call("POST /admin/models/{name}/load", "", {{"name", "nope"}})->status(), 404);
  auto t = Call("POST /admin/models/{name}/unload", "", {{"name", "emb"}},
                {{"timeout_ms", "-1"}});
  EXPECT_EQ(t->status(), 400);
}

// An admin action refuses what it does not read: fields, query parameters,
// and any body on an action that takes none.
TEST_F(RoutesTest, AdminActionsRefuseFieldsAndParametersTheyDoNotTake) {
  auto expect400 = [&](std::unique_ptr<http::FakeResponder> r, const std::string& part) {
    EXPECT_EQ(r->status(), 400) << r->body();
    EXPECT_NE(Body(*r)["error"]["message"].get<std::string>().find(part), std::string::npos)
        << r->body();
  };
  const std::map<std::string, std::string> emb = {{"name", "emb"}};
  expect400(Call("POST /admin/pressure", R"({"level":"low","zz":1})"), "\"zz\"");
  expect400(Call("POST /admin/models/{name}/residency", R"({"target":"unpinned","zz":1})", emb),
            "\"zz\"");
  expect400(Call("POST /admin/compact", R"({"zz":1})"), "\"zz\"");
  for (const char* body : {R"({"a":1})", "[]", "null", "7"}) {
    expect400(Call("POST /admin/models/{name}/load", body, emb), "takes no fields");
    expect400(Call("POST /admin/models/{name}/unload", body, emb), "takes no fields");
    expect400(Call("POST /admin/conversations/{id}/close", body, {{"id", "r"}}), "takes no fields");
  }
  expect400(Call("POST /admin/models/{name}/unload", "", emb, {{"zz", "1"}}),
            "unrecognized query parameter \"zz\": this action takes only \"timeout_ms\"");
  expect400(Call("POST /admin/models/{name}/load", "", emb, {{"zz", "1"}}),
            "unrecognized query parameter \"zz\": this action takes none");
  expect400(Call("POST /admin/pressure", R"({"level":"low"})", {}, {{"zz", "1"}}), "\"zz\"");
  expect400(Call("POST /admin/compact", "", {}, {{"zz", "1"}}), "\"zz\"");
  expect400(Call("POST /admin/prewarm", "{}", {}, {{"zz", "1"}}), "\"zz\"");
  expect400(Call("POST /admin/conversations/{id}/close", "", {{"id", "r"}}, {{"zz", "1"}}),
            "this action takes only \"model\"");
  // Nothing was done by a refused action; {} and an empty body are no fields.
  EXPECT_EQ(Body(*Call("GET /admin/status"))["pressure"], "nominal");
  EXPECT_EQ(Call("POST /admin/models/{name}/load", "{}", emb)->status(), 200);
  EXPECT_EQ(Call("POST /admin/models/{name}/unload", " {} ", emb, {{"timeout_ms", "100"}})->status(),
            200);
}

// Every admin body goes through the routes' one reader: depth bound and
// duplicate keys as on the API routes.
TEST_F(RoutesTest, AdminBodiesAreReadLikeEveryOtherBody) {
  const std::string deep = std::string(1 << 20, '[') + std::string(1 << 20, ']');
  for (const char* route : {"POST /admin/pressure", "POST /admin/compact",
                            "POST /admin/models/{name}/residency", "POST /admin/models/{name}/load"}) {
    auto r = Call(route, deep, {{"name", "emb"}});
    EXPECT_EQ(r->status(), 400) << route;
    EXPECT_NE(r->body().find("nest deeper than 128 levels"), std::string::npos) << r->body();
  }
  auto dup = Call("POST /admin/pressure", R"({"level":"critical","level":"nominal"})");
  EXPECT_EQ(dup->status(), 400);
  EXPECT_NE(Body(*dup)["error"]["message"].get<std::string>().find("the key \"level\" twice"),
            std::string::npos)
      << dup->body();
  EXPECT_EQ(Body(*Call("GET /admin/status"))["pressure"], "nominal");
  auto free_mb = Call("POST /admin/pressure", R"({"level":"low","free_mb":1e13})");
  EXPECT_EQ(free_mb->status(), 400);
  EXPECT_NE(free_mb->body().find("between 0 and 1000000000000"), std::string::npos);
}

// A 4 MiB model name is not echoed whole: errors quote 256 bytes of it.
TEST_F(RoutesTest, ErrorsQuoteAtMost256BytesOfAModelName) {
  const std::string name(4 << 20, 'm');
  std::vector<std::unique_ptr<http::FakeResponder>> answers;
  answers.push_back(Call("POST /v1/chat/completions",
                         R"({"model":")" + name + R"(","messages":[{"role":"user","content":"x"}]})"));
  answers.push_back(Call("POST /v1/embeddings", R"({"model":")" + name + R"(","input":"x"})"));
  answers.push_back(Call("POST /admin/models/{name}/residency", R"({"target":"unpinned"})",
                         {{"name", name}}));
  answers.push_back(Call("POST /admin/models/{name}/load", "", {{"name", name}}));
  for (const auto& r : answers) {
    EXPECT_EQ(r->status(), 404);
    EXPECT_LT(r->body().size(), 600u);
    EXPECT_NE(Body(*r)["error"]["message"].get<std::string>().find(std::string(256, 'm') +
                                                                    "\u2026\""),
              std::string::npos)
        << r->body().substr(0, 100);
  }
}

TEST_F(RoutesTest, PrewarmThenCloseAndTheKvSnapshot) {
  auto p = Call("POST /admin/prewarm",
                R"({"model":"chat","conversation_id":"room-2","prompt":"a stable prefix"})");
  ASSERT_EQ(p->status(), 200) << p->body();
  EXPECT_GT(Body(*p)["prefix_tokens"].get<int>(), 0);
  json kv = Body(*Call("GET /admin/kv"));
  ASSERT_EQ(kv["models"].size(), 1u);
  EXPECT_EQ(kv["models"][0]["slots"][0]["conversation_id"], "room-2");
  auto c = Call("POST /admin/conversations/{id}/close", "", {{"id", "room-2"}});
  ASSERT_EQ(c->status(), 200) << c->body();
  EXPECT_EQ(Body(*c)["models"], json::array({"chat"}));
  EXPECT_GE(Body(*Call("GET /admin/kv"))["files_total"].get<int>(), 1);
}

TEST_F(RoutesTest, MetricsAndModels) {
  ASSERT_EQ(Call("POST /v1/chat/completions", kChat)->status(), 200);
  auto m = Call("GET /metrics");
  EXPECT_EQ(m->status(), 200);
  EXPECT_NE(m->body().find("arbiter_"), std::string::npos);
  for (const char* series : {"arbiter_memory_runtime_bytes ", "arbiter_process_resident_bytes ",
                             "arbiter_memory_unaccounted_bytes "}) {
    EXPECT_NE(m->body().find(series), std::string::npos) << series;
  }
  // The measured side of the ledger (docs/memory.md "The ledger is the truth").
  json st = Body(*Call("GET /admin/status"));
  EXPECT_GT(st["runtime_bytes"].get<uint64_t>(), 0u);
  EXPECT_GT(st["process_resident_bytes"].get<uint64_t>(), 0u);
  EXPECT_EQ(st["unaccounted_bytes"].get<int64_t>(),
            st["process_resident_bytes"].get<int64_t>() - st["charged_bytes"].get<int64_t>() -
                st["runtime_bytes"].get<int64_t>());
  // A CPU-only runtime has the host domain alone, with the top-level figures.
  ASSERT_EQ(st["domains"].size(), 1u) << st.dump();
  for (const char* k : {"budget_bytes", "charged_bytes", "runtime_bytes", "over_commits"}) {
    EXPECT_EQ(st["domains"]["host"][k], st[k]) << k;
  }
  EXPECT_EQ(st["domains"]["host"]["by_kind"], st["charged_by_kind"]);
  json models = Body(*Call("GET /v1/models"));
  EXPECT_EQ(models["data"].size(), 2u);
}

// Note [Forced tool calls] (runtime text.cc), at the edge: with
// tool_choice "required" or a named function every answer is one parsed
// call (finish_reason "tool_calls"), or, when max_tokens is below the
// shortest call, finish_reason "length" with neither call nor content.
json ForcedCallRequest(const json& tool_choice, int max_tokens, int seed) {
  const json number = {{"type", "number"}};
  const json add = {{"type", "object"},
                    {"properties", {{"a", number}, {"b", number}}},
                    {"required", {"a", "b"}}};
  const json note = {{"type", "object"},
                     {"properties", {{"title", {{"type", "string"}}},
                                     {"priority", {{"type", "integer"}, {"minimum", 1},
                                                   {"maximum", 5}}}}},
                     {"required", {"title", "priority"}}};
  return {{"model", "chat"},
          {"messages", {{{"role", "user"}, {"content", "add 2 and 3"}}}},
          {"tools", {{{"type", "function"}, {"function", {{"name", "add"}, {"parameters", add}}}},
                     {{"type", "function"}, {"function", {{"name", "note"}, {"parameters", note}}}}}},
          {"tool_choice", tool_choice},
          {"max_tokens", max_tokens},
          {"temperature", 1},
          {"seed", seed}};
}

// The call's arguments: a JSON object whose numbers are finite and whose
// integers are in range (the schemas above).
void ExpectArguments(const json& call, const std::string& where) {
  const std::string name = call["function"]["name"];
  const json args = json::parse(call["function"]["arguments"].get<std::string>(), nullptr, false);
  ASSERT_TRUE(args.is_object()) << where << call.dump();
  if (name == "add") {
    for (const char* k : {"a", "b"}) {
      ASSERT_TRUE(args.contains(k) && args[k].is_number()) << where << args.dump();
      EXPECT_TRUE(std::isfinite(args[k].get<double>())) << where << args.dump();
    }
  } else {
    ASSERT_EQ(name, "note") << where;
    ASSERT_TRUE(args["title"].is_string()) << where << args.dump();
    ASSERT_TRUE(args["priority"].is_number_integer()) << where << args.dump();
    EXPECT_GE(args["priority"].get<int64_t>(), 1);
    EXPECT_LE(args["priority"].get<int64_t>(), 5);
  }
}

// A context that holds the tool prompt (two tools: about 510 tokens of the
// tiny model's 512-token vocabulary) and a 150-token call.
class ToolCallRoutesTest : public RoutesTest {
 protected:
  void AdjustConfig(Config* config) override {
    for (ModelEntry& m : config->models) m.ctx = 1024;
  }
};

TEST_F(ToolCallRoutesTest, AForcedToolCallIsACallOrSaysItRanOutOfTokens) {
  const json named = {{"type", "function"}, {"function", {{"name", "note"}}}};
  int calls = 0, cut = 0;
  for (const json& choice : {json("required"), named}) {
    for (int max_tokens : {1, 4, 12, 24, 48, 96, 150}) {
      for (int seed = 1; seed <= 3; ++seed) {
        const std::string where = choice.dump() + " max_tokens " + std::to_string(max_tokens) +
                                  " seed " + std::to_string(seed) + ": ";
        auto r = Call("POST /v1/chat/completions", ForcedCallRequest(choice, max_tokens, seed).dump());
        ASSERT_EQ(r->status(), 200) << where << r->body();
        const json c = Body(*r)["choices"][0];
        if (c["finish_reason"] == "tool_calls") {
          ++calls;
          ASSERT_EQ(c["message"]["tool_calls"].size(), 1u) << where << c.dump();
          EXPECT_TRUE(c["message"]["content"].is_null()) << where << c.dump();
          if (choice.is_object()) {
            EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["name"], "note");
          }
          ExpectArguments(c["message"]["tool_calls"][0], where);
          continue;
        }
        // Never the call's text as content: the budget was too small.
        ++cut;
        EXPECT_EQ(c["finish_reason"], "length") << where << c.dump();
        EXPECT_FALSE(c["message"].contains("tool_calls")) << where << c.dump();
        EXPECT_EQ(c["message"]["content"], "") << where << c.dump();
        // 96 tokens hold the shortest call of either function, byte by byte.
        EXPECT_LT(max_tokens, 96) << where;
      }
    }
  }
  EXPECT_GT(calls, 0);
  EXPECT_GT(cut, 0);  // max_tokens 1 cannot hold a call
}

TEST_F(ToolCallRoutesTest, AForcedCallThatEndsExactlyAtTheBudgetIsStillACall) {
  json req = ForcedCallRequest("required", 150, 5);
  req["temperature"] = 0;
  const json whole = Body(*Call("POST /v1/chat/completions", req.dump()));
  ASSERT_EQ(whole["choices"][0]["finish_reason"], "tool_calls") << whole.dump();
  req["max_tokens"] = whole["usage"]["completion_tokens"];
  const json exact = Body(*Call("POST /v1/chat/completions", req.dump()));
  EXPECT_EQ(exact["choices"][0]["finish_reason"], "tool_calls") << exact.dump();
  EXPECT_EQ(exact["choices"][0]["message"]["tool_calls"][0]["function"],
            whole["choices"][0]["message"]["tool_calls"][0]["function"]);
}

TEST_F(ToolCallRoutesTest, AForcedCallStreamedIsOneToolCallsDeltaAndStopStringsDoNotCutIt) {
  for (int max_tokens : {1, 150}) {
    json req = ForcedCallRequest("required", max_tokens, 7);
    req["stream"] = true;
    req["stop"] = {"\n", "{", "\""};  // each would cut the call's text
    auto s = Call("POST /v1/chat/completions", req.dump());
    ASSERT_EQ(s->status(), 200) << s->body();
    std::string finish, content;
    json calls = json::array();
    for (const std::string& chunk : s->chunks()) {
      if (chunk.rfind("data: {", 0) != 0) continue;
      const json c = json::parse(chunk.substr(6))["choices"][0];
      if (c["delta"].contains("content")) content += c["delta"]["content"].get<std::string>();
      for (const json& t : c["delta"].value("tool_calls", json::array())) calls.push_back(t);
      if (c["finish_reason"].is_string()) finish = c["finish_reason"];
    }
    EXPECT_EQ(content, "") << s->body();
    if (max_tokens == 1) {
      EXPECT_EQ(finish, "length") << s->body();
      EXPECT_TRUE(calls.empty()) << s->body();
    } else {
      EXPECT_EQ(finish, "tool_calls") << s->body();
      ASSERT_EQ(calls.size(), 1u) << s->body();
      ExpectArguments(calls[0], "streamed: ");
    }
  }
}

TEST_F(ToolCallRoutesTest, AForcedCallThroughResponsesIsAFunctionCallItem) {
  for (int max_output_tokens : {1, 150}) {
    const json chat = ForcedCallRequest("required", max_output_tokens, 3);
    json tools = json::array();
    for (const json& t : chat["tools"]) {
      tools.push_back({{"type", "function"}, {"name", t["function"]["name"]},
                       {"parameters", t["function"]["parameters"]}});
    }
    const json req = {{"model", "chat"}, {"input", "add 2 and 3"}, {"tools", tools},
                      {"tool_choice", "required"}, {"max_output_tokens", max_output_tokens},
                      {"temperature", 1}};
    auto r = Call("POST /v1/responses", req.dump());
    ASSERT_EQ(r->status(), 200) << r->body();
    const json j = Body(*r);
    json calls = json::array();
    for (const json& item : j["output"]) {
      if (item["type"] == "function_call") calls.push_back(item);
      if (item["type"] == "message") {
        EXPECT_EQ(item["content"].dump().find("tool_call"), std::string::npos);
      }
    }
    if (max_output_tokens == 1) {
      EXPECT_EQ(j["status"], "incomplete") << j.dump();
      EXPECT_EQ(j["incomplete_details"]["reason"], "max_output_tokens");
      EXPECT_TRUE(calls.empty()) << j.dump();
    } else {
      EXPECT_EQ(j["status"], "completed") << j.dump();
      ASSERT_EQ(calls.size(), 1u) << j.dump();
      ExpectArguments({{"function", {{"name", calls[0]["name"]},
                                     {"arguments", calls[0]["arguments"]}}}},
                      "responses: ");
    }
  }
}

// Ollama's /api/chat takes tool_choice as an extension: the same rule, with
// the arguments as an object and done_reason "stop" or "length".
class OllamaToolCallRoutesTest : public ToolCallRoutesTest {
 protected:
  std::vector<std::vector<Route>> Groups(ServerContext& ctx) override { return {OllamaRoutes(ctx)}; }
};

TEST_F(OllamaToolCallRoutesTest, AForcedCallThroughOllamaChatIsAToolCall) {
  for (int num_predict : {1, 150}) {
    const json chat = ForcedCallRequest("required", num_predict, 4);
    const json req = {{"model", "chat"}, {"messages", chat["messages"]}, {"tools", chat["tools"]},
                      {"tool_choice", "required"}, {"stream", false},
                      {"options", {{"num_predict", num_predict}, {"seed", 4}, {"temperature", 1}}}};
    auto r = Call("POST /api/chat", req.dump());
    ASSERT_EQ(r->status(), 200) << r->body();
    const json j = Body(*r);
    if (num_predict == 1) {
      EXPECT_EQ(j["done_reason"], "length") << j.dump();
      EXPECT_FALSE(j["message"].contains("tool_calls")) << j.dump();
      EXPECT_EQ(j["message"]["content"], "") << j.dump();
      continue;
    }
    EXPECT_EQ(j["done_reason"], "stop") << j.dump();
    EXPECT_EQ(j["message"]["content"], "") << j.dump();
    ASSERT_EQ(j["message"]["tool_calls"].size(), 1u) << j.dump();
    const json& fn = j["message"]["tool_calls"][0]["function"];
    ASSERT_TRUE(fn["arguments"].is_object()) << j.dump();
    ExpectArguments({{"function", {{"name", fn["name"]}, {"arguments", fn["arguments"].dump()}}}},
                    "ollama: ");
  }
  auto bad = Call("POST /api/chat", json({{"model", "chat"},
                                          {"messages", {{{"role", "user"}, {"content", "x"}}}},
                                          {"tool_choice", "required"}})
                                        .dump());
  EXPECT_EQ(bad->status(), 400);
  EXPECT_NE(Body(*bad)["error"].get<std::string>().find("needs \"tools\""), std::string::npos)
      << bad->body();
}

// A Runtime whose text generations fail in Run() with `error` after
// `pieces` pieces of text (the real one's, wrapped): what a stream sees when
// the weights cannot get room in the budget after the admission.
class FailingRunRuntime : public testing::ForwardingRuntime {
 public:
  FailingRunRuntime(Runtime* real, ::arbiter::Status error, int pieces)
      : ForwardingRuntime(real), error_(std::move(error)), pieces_(pieces) {}
  Result<std::unique_ptr<TextGeneration>> StartText(TextRequest request) override {
    ARBITER_ASSIGN_OR_RETURN(std::unique_ptr<TextGeneration> g,
                             ForwardingRuntime::StartText(std::move(request)));
    return std::unique_ptr<TextGeneration>(new Failing(std::move(g), error_, pieces_));
  }

 private:
  class Failing : public TextGeneration {
   public:
    Failing(std::unique_ptr<TextGeneration> g, ::arbiter::Status error, int pieces)
        : g_(std::move(g)), error_(std::move(error)), pieces_(pieces) {}
    const std::string& model() const override { return g_->model(); }
    int prompt_tokens() const override { return g_->prompt_tokens(); }
    const std::vector<int32_t>& prompt_ids() const override { return g_->prompt_ids(); }
    const std::string& echo_text() const override { return g_->echo_text(); }
    std::string TokenBytes(int32_t id) const override { return g_->TokenBytes(id); }
    Result<TextResult> Run(const TextCallback& on_text, const Cancellation& cancelled) override {
      for (int i = 0; i < pieces_; ++i) {
        if (!on_text("x")) break;
      }
      return error_;
    }

   private:
    std::unique_ptr<TextGeneration> g_;
    ::arbiter::Status error_;
    int pieces_;
  };

  ::arbiter::Status error_;
  int pieces_;
};

// Regression (scripts/soak.py): a stream whose weights could not get room
// after the admission answered 200 and then an in-band "generation_failed"
// event. Nothing has been sent before the first piece of text, so the
// error keeps its status: 503 budget_exceeded with Retry-After.
TEST_F(RoutesTest, AStreamThatFailsBeforeItsFirstTokenGetsAPlainErrorStatus) {
  const ::arbiter::Status budget =
      ResourceExhaustedError("weights of 'chat': no room", ErrorReason::kBudgetExceeded);
  for (const char* route : {"POST /v1/chat/completions", "POST /v1/completions"}) {
    FailingRunRuntime failing(rt_.get(), budget, /*pieces=*/0);
    ctx_.runtime = &failing;
    json req = json::parse(kChat);
    if (std::string(route) == "POST /v1/completions") {
      req.erase("messages");
      req["prompt"] = "hello";
      req["echo"] = true;
    }
    req["stream"] = true;
    auto s = Call(route, req.dump());
    EXPECT_FALSE(s->streamed()) << route;
    EXPECT_EQ(s->status(), 503) << route << " " << s->body();
    EXPECT_EQ(Body(*s)["error"]["code"], "budget_exceeded") << route;
    EXPECT_EQ(s->header("Retry-After"), "5") << route;

    // After text went out, the error can only be reported in-band.
    FailingRunRuntime late(rt_.get(), budget, /*pieces=*/2);
    ctx_.runtime = &late;
    auto l = Call(route, req.dump());
    EXPECT_TRUE(l->streamed()) << route;
    EXPECT_EQ(l->status(), 200) << route;
    EXPECT_NE(l->body().find("generation_failed"), std::string::npos) << l->body();
    EXPECT_EQ(l->body().substr(l->body().size() - 14), "data: [DONE]\n\n");
    ctx_.runtime = rt_.get();
  }
}

// A forced call whose output did not parse (Note [Forced tool calls]) is a
// 500 that says so, streamed or not: never content.
TEST_F(ToolCallRoutesTest, AnUnparsedForcedCallIsAServerErrorNamingIt) {
  const ::arbiter::Status unparsed =
      InternalError("the output of the forced tool call did not parse",
                    ErrorReason::kToolCallUnparsed);
  FailingRunRuntime failing(rt_.get(), unparsed, /*pieces=*/0);
  ctx_.runtime = &failing;
  for (bool stream : {false, true}) {
    json req = ForcedCallRequest("required", 150, 1);
    req["stream"] = stream;
    auto r = Call("POST /v1/chat/completions", req.dump());
    EXPECT_FALSE(r->streamed());
    EXPECT_EQ(r->status(), 500) << r->body();
    EXPECT_EQ(Body(*r)["error"]["code"], "tool_call_unparsed") << r->body();
  }
  ctx_.runtime = rt_.get();
}

TEST_F(RoutesTest, AnEventStreamEndsWhenTheServerStops) {
  http::FakeResponder out;
  std::thread t([&] {
    http::Request req;
    routes_.at("GET /admin/events").handler(req, out);
  });
  // The greeting arrives first; then a load produces events.
  for (int i = 0; i < 500 && out.chunks().empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_FALSE(out.chunks().empty());
  ASSERT_EQ(Call("POST /admin/models/{name}/load", "", {{"name", "emb"}})->status(), 200);
  for (int i = 0; i < 500 && out.body().find("model_load") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_NE(out.body().find("event: model_load"), std::string::npos) << out.body();
  ctx_.stopping.store(true);
  {
    MutexLock l(&ctx_.streams_mu);
    for (const auto& q : ctx_.streams) q->Close();
  }
  t.join();
  EXPECT_TRUE(out.ended());
}

}  // namespace
}  // namespace arbiter::server_internal
