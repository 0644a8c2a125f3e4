// End-to-end: the real `arbiter serve` binary as a child process, driven over
// HTTP on a free loopback port.
//
// Setup (once per test process; ctest runs each test in its own process, so
// every test gets a fresh server): make the `tiny` model, a second copy of it
// served as an embedding model, and two broken models (truncated safetensors;
// truncated tokenizer.json);
// write a TOML config (API key, 64 KiB body limit, 3 s request timeout);
// start the server; wait
// for /health. Teardown always kills the child.
//
// No wall-clock speed assertions: every wait has a generous deadline and
// only turns a hang into a failure.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "arbiter/base/file.h"
#include "tools/model_maker/model_maker.h"
#include "server_process.h"
#include "server_suite.h"

extern char** environ;

namespace arbiter {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr const char* kApiKey = "e2e-secret-key";
constexpr size_t kBodyLimit = 64 * 1024;
// [server] request_timeout_s: short, so the slow-client test is quick. No
// other test takes this long to send a request.
constexpr int kRequestTimeoutS = 3;

using ::arbiter::testing::FreeLoopbackPort;
using ::arbiter::testing::RawExchange;
using ::arbiter::testing::ReadAll;

// One server-sent-events body → the payloads of its `data:` lines.
std::vector<std::string> SseEvents(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) end = body.size();
    std::string event = body.substr(pos, end - pos);
    if (event.rfind("data: ", 0) == 0) out.push_back(event.substr(6));
    pos = end + 2;
  }
  return out;
}

void ExpectErrorShape(const httplib::Result& r, int status, const std::string& message_part) {
  ASSERT_TRUE(r) << "no response";
  EXPECT_EQ(r->status, status) << r->body;
  json j = json::parse(r->body, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r->body;
  ASSERT_TRUE(j.contains("error")) << r->body;
  EXPECT_TRUE(j["error"]["message"].is_string());
  EXPECT_TRUE(j["error"]["type"].is_string());
  EXPECT_TRUE(j["error"].contains("code"));
  EXPECT_NE(j["error"]["message"].get<std::string>().find(message_part), std::string::npos)
      << j["error"]["message"];
}

class ServeE2E : public ::arbiter::testing::ServerSuite {
 protected:
  static void SetUpTestSuite() {
    ASSERT_TRUE(MakeDir("e2e"));
    const std::string tiny = dir_ + "/tiny";
    const std::string embed = dir_ + "/embed";
    const std::string broken = dir_ + "/broken";
    ASSERT_TRUE(MakeModel("tiny", tiny, 1).ok());
    ASSERT_TRUE(MakeModel("tiny", embed, 2).ok());
    fs::create_directories(broken);
    for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json"}) {
      fs::copy_file(tiny + "/" + f, broken + "/" + f);
    }
    const std::string weights = ReadAll(tiny + "/model.safetensors");
    ASSERT_TRUE(WriteFileAtomic(broken + "/model.safetensors", weights.substr(0, weights.size() / 2)).ok());
    // Good weights, truncated tokenizer.json.
    const std::string badtok = dir_ + "/badtok";
    fs::create_directories(badtok);
    for (const char* f : {"config.json", "model.safetensors", "tokenizer_config.json"}) {
      fs::copy_file(tiny + "/" + f, badtok + "/" + f);
    }
    const std::string tokenizer = ReadAll(tiny + "/tokenizer.json");
    ASSERT_TRUE(
        WriteFileAtomic(badtok + "/tokenizer.json", tokenizer.substr(0, tokenizer.size() / 2)).ok());

    std::ostringstream config;
    config << "api_key = \"" << kApiKey << "\"\n"
           << "max_body_bytes = \"64KiB\"\n"
           << "request_timeout_s = " << kRequestTimeoutS << "\n"
           << "[memory]\nbudget = \"1GiB\"\n"
           // The host's real memory pressure must not turn these requests
           // into 503s (tests/arbiter_e2e_test covers pressure through the
           // bridge).
           << "[pressure]\nsource = \"none\"\n"
           << "[[models]]\nname = \"tiny\"\npath = \"tiny\"\nparallel = 2\nctx = 2048\n"
           << "[[models]]\nname = \"tiny-concurrent\"\npath = \"tiny\"\nparallel = 2\n"
           << "[[models]]\nname = \"embed\"\npath = \"embed\"\ncapability = \"embedding\"\n"
           << "[[models]]\nname = \"broken\"\npath = \"broken\"\n"
           << "[[models]]\nname = \"badtok\"\npath = \"badtok\"\n";
    std::string error;
    ASSERT_TRUE(StartServe(config.str(), &error)) << error;
  }

  // ARBITER_E2E_VERBOSE=1 prints the server log after every test.
  void TearDown() override {
    if (HasFailure() || std::getenv("ARBITER_E2E_VERBOSE") != nullptr) PrintServeLog();
  }

  static httplib::Client Client(bool auth = true) {
    httplib::Client cli("127.0.0.1", server_.port);
    cli.set_read_timeout(120, 0);
    cli.set_write_timeout(30, 0);
    if (auth) cli.set_bearer_token_auth(kApiKey);
    return cli;
  }

  static httplib::Result PostJson(const std::string& path, const json& body) {
    return Client().Post(path.c_str(), body.dump(), "application/json");
  }

  static json AdminStatus() {
    auto r = Client().Get("/admin/status");
    if (!r || r->status != 200) return json();
    return json::parse(r->body);
  }

  static json ModelStatus(const std::string& name) {
    json s = AdminStatus();
    for (const json& m : s["models"]) {
      if (m["name"] == name) return m;
    }
    return json();
  }

  // Waits (with a deadline) until the server log contains `text`.
  static bool LogEventually(const std::string& text) {
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (Clock::now() < deadline) {
      if (ReadAll(server_.log).find(text) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  static json Chat(const std::string& model, int max_tokens, bool stream = false) {
    return json{{"model", model},
                {"messages", {{{"role", "system"}, {"content", "You are terse."}},
                              {{"role", "user"}, {"content", "Say hello."}}}},
                {"max_tokens", max_tokens},
                {"temperature", 0},
                {"stream", stream}};
  }
};

TEST_F(ServeE2E, HealthIsOpen) {
  auto r = Client(/*auth=*/false).Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(json::parse(r->body)["status"], "ok");
}

TEST_F(ServeE2E, ModelsListReportsStatusAndBrokenModel) {
  auto r = Client().Get("/v1/models");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 5u);
  std::map<std::string, json> by_id;
  for (const json& m : j["data"]) {
    EXPECT_EQ(m["object"], "model");
    EXPECT_TRUE(m["created"].is_number_integer());
    EXPECT_TRUE(m["owned_by"].is_string());
    by_id[m["id"]] = m;
  }
  EXPECT_EQ(by_id["tiny"]["capability"], "text");
  EXPECT_TRUE(by_id["tiny"]["status"] == "ready" || by_id["tiny"]["status"] == "loaded");
  EXPECT_EQ(by_id["embed"]["capability"], "embedding");
  EXPECT_EQ(by_id["broken"]["status"], "failed");
  ASSERT_TRUE(by_id["broken"]["error"].is_string());
  EXPECT_NE(by_id["broken"]["error"].get<std::string>().find("model.safetensors"),
            std::string::npos)
      << by_id["broken"]["error"];
  // Regression: a malformed tokenizer.json used to pass the startup check
  // (only its existence was checked) and show as "ready" until a request.
  EXPECT_EQ(by_id["badtok"]["status"], "failed");
  ASSERT_TRUE(by_id["badtok"]["error"].is_string());
  EXPECT_NE(by_id["badtok"]["error"].get<std::string>().find("badtok/tokenizer.json"),
            std::string::npos)
      << by_id["badtok"]["error"];
  auto chat = PostJson("/v1/chat/completions", Chat("badtok", 2));
  ExpectErrorShape(chat, 503, "badtok/tokenizer.json");
}

TEST_F(ServeE2E, ChatCompletionNonStreaming) {
  auto r = PostJson("/v1/chat/completions", Chat("tiny", 8));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_NE(r->get_header_value("Content-Type").find("application/json"), std::string::npos);
  json j = json::parse(r->body);
  EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_TRUE(j["created"].is_number_integer());
  EXPECT_EQ(j["model"], "tiny");
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_TRUE(j["choices"][0]["message"]["content"].is_string());
  const std::string finish = j["choices"][0]["finish_reason"];
  EXPECT_TRUE(finish == "stop" || finish == "length") << finish;
  const json& u = j["usage"];
  EXPECT_GT(u["prompt_tokens"].get<int>(), 0);
  EXPECT_LE(u["completion_tokens"].get<int>(), 8);
  EXPECT_EQ(u["total_tokens"].get<int>(),
            u["prompt_tokens"].get<int>() + u["completion_tokens"].get<int>());
  EXPECT_TRUE(u["prompt_tokens_details"]["cached_tokens"].is_number_integer());
  if (finish == "length") {
    EXPECT_EQ(u["completion_tokens"].get<int>(), 8);
  }
  // The same prompt again: the slot's KV prefix is reused.
  auto again = PostJson("/v1/chat/completions", Chat("tiny", 8));
  ASSERT_TRUE(again);
  json j2 = json::parse(again->body);
  EXPECT_EQ(j2["choices"][0]["message"]["content"], j["choices"][0]["message"]["content"]);
  EXPECT_GT(j2["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0);
}

TEST_F(ServeE2E, ChatCompletionStreamingWithUsage) {
  auto plain = PostJson("/v1/chat/completions", Chat("tiny", 12));
  ASSERT_TRUE(plain);
  ASSERT_EQ(plain->status, 200);
  json expected = json::parse(plain->body);

  json req = Chat("tiny", 12, /*stream=*/true);
  req["stream_options"] = {{"include_usage", true}};
  auto r = PostJson("/v1/chat/completions", req);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_NE(r->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
  std::vector<std::string> events = SseEvents(r->body);
  ASSERT_GE(events.size(), 4u) << r->body;
  EXPECT_EQ(events.back(), "[DONE]");
  json first = json::parse(events[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  const std::string id = first["id"];
  EXPECT_EQ(id.rfind("chatcmpl-", 0), 0u);

  std::string text;
  std::string finish;
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    json c = json::parse(events[i]);
    EXPECT_EQ(c["id"], id);
    EXPECT_TRUE(c.contains("usage") && c["usage"].is_null());
    ASSERT_EQ(c["choices"].size(), 1u);
    const json& delta = c["choices"][0]["delta"];
    if (delta.contains("content")) text += delta["content"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  json usage_chunk = json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage_chunk["choices"].empty());
  EXPECT_EQ(usage_chunk["usage"]["completion_tokens"], expected["usage"]["completion_tokens"]);
  EXPECT_EQ(usage_chunk["usage"]["prompt_tokens"], expected["usage"]["prompt_tokens"]);
  // Greedy: streaming and non-streaming produce the same text.
  EXPECT_EQ(text, expected["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_EQ(finish, expected["choices"][0]["finish_reason"].get<std::string>());
}

TEST_F(ServeE2E, CompletionsNonStreamingAndStreaming) {
  json req = {{"model", "tiny"}, {"prompt", {"Once upon a time"}}, {"max_tokens", 6},
              {"temperature", 0}};
  auto r = PostJson("/v1/completions", req);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "tiny");
  EXPECT_TRUE(j["choices"][0]["text"].is_string());
  EXPECT_LE(j["usage"]["completion_tokens"].get<int>(), 6);

  req["stream"] = true;
  req["stream_options"] = {{"include_usage", true}};
  req["prompt"] = "Once upon a time";
  auto s = PostJson("/v1/completions", req);
  ASSERT_TRUE(s);
  ASSERT_EQ(s->status, 200) << s->body;
  std::vector<std::string> events = SseEvents(s->body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    json c = json::parse(events[i]);
    EXPECT_EQ(c["object"], "text_completion");
    text += c["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, j["choices"][0]["text"].get<std::string>());
  json usage = json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], j["usage"]["completion_tokens"]);
}

// A JSON schema's properties are written in the order the client declared
// them (docs/grammar.md), on every route that takes a schema. The bodies
// are sent as text (a json object would sort the keys), and the answers
// are read with nlohmann::ordered_json, which keeps their order.
TEST_F(ServeE2E, ConstrainedAnswersWriteTheKeysInDeclaredOrder) {
  using ordered = nlohmann::ordered_json;
  const std::string schema =
      R"({"type":"object","properties":{"zeta":{"type":"boolean"},"alpha":{"enum":["a","b"]},)"
      R"("mid":{"type":"integer","minimum":0,"maximum":9}},"required":["zeta","alpha","mid"],)"
      R"("additionalProperties":false})";
  const std::string kDeclared = "zeta,alpha,mid,";
  auto keys_of = [](const ordered& object) {
    std::string keys;
    for (auto it = object.begin(); it != object.end(); ++it) keys += it.key() + ",";
    return keys;
  };
  // The keys of an answer, in the order written (or the text, if it is no
  // JSON object).
  auto answer_keys = [&](const ordered& text) {
    const ordered j =
        ordered::parse(text.is_string() ? text.get<std::string>() : text.dump(), nullptr, false);
    return j.is_object() ? keys_of(j) : "(not an object: " + text.dump() + ")";
  };
  // POSTs `body` with SCHEMA and SEED filled in.
  auto post = [&](const char* path, std::string body, int seed) {
    body.replace(body.find("SCHEMA"), 6, schema);
    body.replace(body.find("SEED"), 4, std::to_string(seed));
    auto r = Client().Post(path, body, "application/json");
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
    return r ? ordered::parse(r->body, nullptr, false) : ordered();
  };
  for (int seed = 1; seed <= 3; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    ordered chat = post("/v1/chat/completions",
                        R"({"model":"tiny","max_tokens":300,"seed":SEED,"messages":)"
                        R"([{"role":"user","content":"Answer in JSON."}],)"
                        R"("response_format":{"type":"json_schema",)"
                        R"("json_schema":{"name":"answer","schema":SCHEMA}}})",
                        seed);
    EXPECT_EQ(chat["choices"][0]["finish_reason"], "stop") << chat.dump();
    EXPECT_EQ(answer_keys(chat["choices"][0]["message"]["content"]), kDeclared);

    // A required call's arguments follow the function's parameters.
    ordered call = post("/v1/chat/completions",
                        R"({"model":"tiny","max_tokens":300,"seed":SEED,"messages":)"
                        R"([{"role":"user","content":"Answer in JSON."}],)"
                        R"("tools":[{"type":"function","function":)"
                        R"({"name":"answer","parameters":SCHEMA}}],"tool_choice":"required"})",
                        seed);
    const ordered& calls = call["choices"][0]["message"]["tool_calls"];
    ASSERT_TRUE(calls.is_array() && !calls.empty()) << call.dump();
    EXPECT_EQ(answer_keys(calls[0]["function"]["arguments"]), kDeclared);

    // The Responses API: the answer, and the schema echoed as declared.
    ordered response = post("/v1/responses",
                            R"({"model":"tiny","max_output_tokens":300,"seed":SEED,)"
                            R"("input":"Answer in JSON.","text":{"format":{"type":"json_schema",)"
                            R"("name":"answer","schema":SCHEMA}}})",
                            seed);
    EXPECT_EQ(response["status"], "completed") << response.dump();
    EXPECT_EQ(answer_keys(response["output"][0]["content"][0]["text"]), kDeclared);
    EXPECT_EQ(keys_of(response["text"]["format"]["schema"]["properties"]), kDeclared);

    // Ollama's format.
    ordered generate = post("/api/generate",
                            R"({"model":"tiny","stream":false,"prompt":"Answer in JSON.",)"
                            R"("options":{"num_predict":300,"seed":SEED},"format":SCHEMA})",
                            seed);
    EXPECT_EQ(generate["done_reason"], "stop") << generate.dump();
    EXPECT_EQ(answer_keys(generate["response"]), kDeclared);
  }
}

TEST_F(ServeE2E, Embeddings) {
  auto r = PostJson("/v1/embeddings", {{"model", "embed"}, {"input", {"hello world", "goodbye"}}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["model"], "embed");
  ASSERT_EQ(j["data"].size(), 2u);
  size_t dim = 0;
  for (size_t i = 0; i < 2; ++i) {
    const json& d = j["data"][i];
    EXPECT_EQ(d["object"], "embedding");
    EXPECT_EQ(d["index"], i);
    ASSERT_TRUE(d["embedding"].is_array());
    dim = d["embedding"].size();
    double norm = 0;
    for (const json& v : d["embedding"]) norm += v.get<double>() * v.get<double>();
    EXPECT_NEAR(std::sqrt(norm), 1.0, 1e-3);
  }
  EXPECT_GT(dim, 0u);
  EXPECT_GT(j["usage"]["prompt_tokens"].get<int>(), 0);
  EXPECT_EQ(j["usage"]["total_tokens"], j["usage"]["prompt_tokens"]);

  auto single = PostJson("/v1/embeddings",
                         {{"model", "embed"}, {"input", "hello world"}, {"encoding_format", "base64"}});
  ASSERT_TRUE(single);
  ASSERT_EQ(single->status, 200) << single->body;
  json b = json::parse(single->body);
  ASSERT_EQ(b["data"].size(), 1u);
  const std::string b64 = b["data"][0]["embedding"];
  EXPECT_EQ(b64.size(), (dim * 4 + 2) / 3 * 4);  // base64 of dim float32s

  // Text endpoints refuse the embedding model, and vice versa.
  ExpectErrorShape(PostJson("/v1/chat/completions", Chat("embed", 4)), 400, "embedding model");
  ExpectErrorShape(PostJson("/v1/embeddings", {{"model", "tiny"}, {"input", "x"}}), 400,
                   "text model");
}

TEST_F(ServeE2E, ErrorStatuses) {
  httplib::Client cli = Client();
  // 400: malformed JSON, wrong type naming the field, n = 2.
  ExpectErrorShape(cli.Post("/v1/chat/completions", "{\"model\": ", "application/json"), 400,
                   "not valid JSON");
  json bad_temp = Chat("tiny", 4);
  bad_temp["temperature"] = "warm";
  ExpectErrorShape(PostJson("/v1/chat/completions", bad_temp), 400,
                   "\"temperature\" must be a number");
  json n17 = Chat("tiny", 4);
  n17["n"] = 17;
  ExpectErrorShape(PostJson("/v1/chat/completions", n17), 400, "\"n\" must be an integer");
  json unknown = Chat("tiny", 4);
  unknown["best_of"] = 2;  // a completions field: unknown to chat
  ExpectErrorShape(PostJson("/v1/chat/completions", unknown), 400, "unrecognized field \"best_of\"");
  ExpectErrorShape(PostJson("/v1/completions", {{"model", "tiny"}, {"prompt", 5}}), 400,
                   "\"prompt\" must be");
  // 401: no key, wrong key; /health stays open.
  httplib::Client anon = Client(/*auth=*/false);
  ExpectErrorShape(anon.Post("/v1/chat/completions", Chat("tiny", 4).dump(), "application/json"),
                   401, "API key");
  ExpectErrorShape(anon.Get("/v1/models"), 401, "API key");
  ExpectErrorShape(anon.Get("/admin/status"), 401, "API key");
  httplib::Client wrong("127.0.0.1", server_.port);
  wrong.set_bearer_token_auth("not-the-key");
  ExpectErrorShape(wrong.Get("/v1/models"), 401, "invalid API key");
  // 404: unknown model, unknown route.
  ExpectErrorShape(PostJson("/v1/chat/completions", Chat("nope", 4)), 404,
                   "model \"nope\" not found");
  ExpectErrorShape(PostJson("/v1/embeddings", {{"model", "nope"}, {"input", "x"}}), 404,
                   "model \"nope\" not found");
  ExpectErrorShape(cli.Get("/v1/nothing-here"), 404, "no route");
  // 413: body over the configured 64 KiB.
  json big = Chat("tiny", 4);
  big["messages"][1]["content"] = std::string(kBodyLimit + 1024, 'a');
  ExpectErrorShape(PostJson("/v1/chat/completions", big), 413, "larger than the limit");
  // The broken model: a clear 503 naming it, every time (retried, still broken).
  for (int i = 0; i < 2; ++i) {
    auto r = PostJson("/v1/chat/completions", Chat("broken", 4));
    ExpectErrorShape(r, 503, "model \"broken\" failed to load");
    EXPECT_EQ(json::parse(r->body)["error"]["code"], "model_load_failed");
  }
  // The server is still healthy.
  auto ok = PostJson("/v1/chat/completions", Chat("tiny", 2));
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

TEST_F(ServeE2E, ConcurrentRequestsShareOneLoad) {
  ASSERT_EQ(ModelStatus("tiny-concurrent")["loads"], 0);
  constexpr int kRequests = 10;
  std::vector<int> statuses(kRequests, 0);
  std::vector<std::thread> threads;
  std::atomic<int> ready{0};
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] {
      json req = Chat("tiny-concurrent", 4);
      req["seed"] = i;
      ready.fetch_add(1);
      while (ready.load() < kRequests) std::this_thread::yield();
      auto r = PostJson("/v1/chat/completions", req);
      statuses[i] = r ? r->status : -1;
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kRequests; ++i) EXPECT_EQ(statuses[i], 200) << "request " << i;
  json m = ModelStatus("tiny-concurrent");
  EXPECT_EQ(m["loads"], 1) << m.dump();
  EXPECT_EQ(m["status"], "loaded");
  EXPECT_EQ(m["refcount"], 0);
}

// Opens a raw connection and sends one POST /v1/chat/completions. Returns the
// socket (or -1).
int SendChatRaw(int port, const std::string& body) {
  const int fd = ::arbiter::testing::ConnectLoopback(port);
  if (fd < 0) return -1;
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

// Sends a streaming request, reads up to the first SSE event, then closes
// the connection.
bool StreamThenDisconnect(int port, const std::string& body) {
  const int fd = SendChatRaw(port, body);
  if (fd < 0) return false;
  timeval tv{30, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::string got;
  char buf[4096];
  while (got.find("data: ") == std::string::npos) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return got.find("200 OK") != std::string::npos && got.find("data: ") != std::string::npos;
}

TEST_F(ServeE2E, ClientDisconnectMidStreamLeavesServerHealthy) {
  json req = Chat("tiny", 1900, /*stream=*/true);
  req["temperature"] = 1.0;
  req["seed"] = 7;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(StreamThenDisconnect(server_.port, req.dump())) << "attempt " << i;
  }
  // Each generation notices and stops (instead of running 1900 tokens):
  // either a failed write stops it ("stream …: client went away; generation
  // stopped") or the transport's hang-up cancel does ("cancelled after N
  // tokens (client went away)"), whichever comes first — waiting for only
  // the second made this test fail when a write lost the race.
  EXPECT_TRUE(LogEventually("client went away"));
  // The handle is released once the generation stops (cancelled or done).
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < deadline && ModelStatus("tiny")["refcount"] != 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(ModelStatus("tiny")["refcount"], 0);
  auto health = Client(false).Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  auto r = PostJson("/v1/chat/completions", Chat("tiny", 4));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
}

TEST_F(ServeE2E, ClientDisconnectStopsNonStreamingGeneration) {
  json req = Chat("tiny", 1900);
  req["temperature"] = 1.0;
  req["seed"] = 11;
  const int fd = SendChatRaw(server_.port, req.dump());
  ASSERT_GE(fd, 0);
  close(fd);  // gone before the answer
  EXPECT_TRUE(LogEventually("client went away; generation stopped"));
  auto r = PostJson("/v1/chat/completions", Chat("tiny", 4));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(ModelStatus("tiny")["refcount"], 0);
}

// Regressions from hostile-input QA: each answer is a 400 naming the
// problem, and the server keeps serving.
TEST_F(ServeE2E, HostileBodiesGet400NamingTheProblem) {
  httplib::Client cli = Client();
  // 30k nested arrays (the body stays under the 64 KiB limit): rejected
  // before parsing.
  const std::string deep = R"({"model":"tiny","messages":)" + std::string(30000, '[') +
                           std::string(30000, ']') + "}";
  ExpectErrorShape(cli.Post("/v1/chat/completions", deep, "application/json"), 400,
                   "nest deeper than 128 levels");
  // Invalid UTF-8 in content; the echoed parse error stays short.
  const std::string bad_utf8 = R"({"model":"tiny","messages":[{"role":"user","content":")" +
                               std::string(40000, 'a') + "\xff\xfe\"}]}";
  auto r = cli.Post("/v1/chat/completions", bad_utf8, "application/json");
  ExpectErrorShape(r, 400, "not valid JSON");
  EXPECT_LT(r->body.size(), 1000u);
  ExpectErrorShape(
      PostJson("/v1/chat/completions", {{"model", "tiny"}, {"messages", {{{"content", "x"}}}}}),
      400, "\"messages[0].role\" is required");
  json many_stops = Chat("tiny", 4);
  many_stops["stop"] = std::vector<std::string>(10000, "x");
  ExpectErrorShape(PostJson("/v1/chat/completions", many_stops), 400, "at most 4");
  json nul = Chat("tiny", 2);
  nul["messages"][1]["content"] = std::string("a\0b", 3);
  auto ok = PostJson("/v1/chat/completions", nul);
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
}

// Opens a connection and sends a chat request's headers and the first bytes
// of its body; -1 on failure.
int StartPartialRequest(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  const std::string head = "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                           "Authorization: Bearer " + std::string(kApiKey) +
                           "\r\nContent-Type: application/json\r\nContent-Length: 4000\r\n\r\n"
                           "{\"model\":";
  if (send(fd, head.data(), head.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(head.size())) {
    close(fd);
    return -1;
  }
  return fd;
}

// Regression (slowloris): httplib's read timeout is per recv, so clients that
// trickle a byte every half second held every worker and the server stopped
// answering. Now each request must arrive within request_timeout_s (408).
TEST_F(ServeE2E, SlowClientsAreCutOffAndOthersServed) {
  // More tricklers than worker threads (8 + Σ parallel = 14).
  constexpr int kTricklers = 24;
  std::vector<int> fds;
  for (int i = 0; i < kTricklers; ++i) {
    const int fd = StartPartialRequest(server_.port);
    ASSERT_GE(fd, 0);
    fds.push_back(fd);
  }
  std::atomic<int> health_status{0};
  std::thread normal([&] {
    httplib::Client cli("127.0.0.1", server_.port);
    cli.set_read_timeout(60, 0);
    auto r = cli.Get("/health");
    health_status = r ? r->status : -1;
  });
  // Keep trickling (well under the 30 s per-read timeout) until the normal
  // request is answered; the fuse turns the old hang into a failure.
  const auto fuse = Clock::now() + std::chrono::seconds(40);
  while (health_status == 0 && Clock::now() < fuse) {
    for (int fd : fds) send(fd, " ", 1, MSG_NOSIGNAL);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  const bool answered = health_status != 0;
  // A trickler gets the 408 once its request_timeout_s runs out (the
  // event-driven transport answers /health long before that): read it,
  // with a fuse.
  std::string got;
  char buf[4096];
  timeval tv{kRequestTimeoutS + 20, 0};
  setsockopt(fds[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ssize_t n;
  while (got.find("request_timeout_s") == std::string::npos &&
         (n = recv(fds[0], buf, sizeof(buf), 0)) > 0) {
    got.append(buf, n);
  }
  for (int fd : fds) shutdown(fd, SHUT_RDWR);  // unblocks the normal request if still stuck
  normal.join();
  ASSERT_TRUE(answered) << "/health was not answered within 40 s while clients trickled";
  EXPECT_EQ(health_status, 200);
  for (int fd : fds) close(fd);
  EXPECT_EQ(got.rfind("HTTP/1.1 408", 0), 0u) << got;
  EXPECT_NE(got.find("request_timeout_s"), std::string::npos) << got;
}

// Runs `arbiter serve` on `config` and `state_dir` until it exits (it must,
// within 60 s); returns its exit status and its log.
std::pair<int, std::string> ServeUntilExit(const std::string& config, const std::string& state_dir,
                                           const std::string& log) {
  std::string error;
  const pid_t p = ::arbiter::testing::SpawnServer(ARBITER_BINARY, config, state_dir, log, &error);
  if (p <= 0) return {-1, error};
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  pid_t got = 0;
  while (std::chrono::steady_clock::now() < deadline && (got = waitpid(p, &status, WNOHANG)) == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (got != p) {
    kill(p, SIGKILL);
    waitpid(p, &status, 0);
    return {-2, "still running after 60 s: " + ReadAll(log)};
  }
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), ReadAll(log)};
}

TEST_F(ServeE2E, ASecondServeOnABusyPortOrStateDirIsRefusedAtStartup) {
  // The same config (same port), another state directory: the kernel must
  // not split connections between two servers.
  auto [rc, log] = ServeUntilExit(dir_ + "/arbiter.toml", dir_ + "/state-b", dir_ + "/b.log");
  EXPECT_NE(rc, 0) << log;
  EXPECT_NE(log.find("is already in use"), std::string::npos) << log;
  EXPECT_NE(log.find("127.0.0.1:" + std::to_string(server_.port)), std::string::npos) << log;
  // The running server still answers every request.
  for (int i = 0; i < 5; ++i) {
    auto r = Client().Get("/v1/models");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
  }
  // Another port, the same state directory: refused (after the bounded wait).
  const std::string other = dir_ + "/other.toml";
  std::ofstream(other) << "[server]\nport = 0\n";
  std::tie(rc, log) = ServeUntilExit(other, dir_ + "/state", dir_ + "/c.log");
  EXPECT_NE(rc, 0) << log;
  EXPECT_NE(log.find("is in use by another arbiter serve"), std::string::npos) << log;
  // A host that is not an IP address says so.
  const std::string bad_host = dir_ + "/badhost.toml";
  std::ofstream(bad_host) << "[server]\nhost = \"not-an-ip\"\nport = 0\n";
  std::tie(rc, log) = ServeUntilExit(bad_host, dir_ + "/state-d", dir_ + "/d.log");
  EXPECT_NE(rc, 0) << log;
  EXPECT_NE(log.find("host \"not-an-ip\" is not a valid IP address"), std::string::npos) << log;
}

TEST_F(ServeE2E, AdminActionsAcceptEmptyPostsWithoutContentLength) {
  // What `curl -X POST .../load` sends: no body, no Content-Length.
  const std::string auth = "Authorization: Bearer " + std::string(kApiKey) + "\r\n";
  std::string got =
      RawExchange(server_.port, "POST /admin/models/embed/load HTTP/1.1\r\nHost: 127.0.0.1\r\n" +
                                    auth + "Connection: close\r\n\r\n");
  EXPECT_EQ(got.rfind("HTTP/1.1 200", 0), 0u) << got;
  got = RawExchange(server_.port,
                    "POST /admin/conversations/room-1/close HTTP/1.1\r\nHost: 127.0.0.1\r\n" +
                        auth + "Connection: close\r\n\r\n");
  EXPECT_EQ(got.rfind("HTTP/1.1 404", 0), 0u) << got;
  EXPECT_NE(got.find("conversation_not_found"), std::string::npos) << got;
}

TEST_F(ServeE2E, HealthMetricsAndStatusAnswerWhileChatsRunAndManyConnectionsAreOpen) {
  rlimit rl{};
  getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
  // 12 chats on a model with 2 slots: most of them wait for a slot.
  std::vector<std::thread> chats;
  std::atomic<int> chats_ok{0};
  for (int i = 0; i < 12; ++i) {
    chats.emplace_back([&] {
      auto r = PostJson("/v1/chat/completions", Chat("tiny", 400));
      if (r && r->status == 200) chats_ok++;
    });
  }
  // 1,000 idle connections (under the default cap of 1,024), then the same
  // 1,000 with half-sent requests.
  std::vector<int> fds;
  for (int i = 0; i < 1000; ++i) {
    const int fd = ::arbiter::testing::ConnectLoopback(server_.port);
    if (fd < 0) break;
    fds.push_back(fd);
  }
  EXPECT_EQ(fds.size(), 1000u);
  // Every snapshot route answers (a generous fuse; no timing is asserted).
  auto snapshots_answer = [&] {
    for (const char* path : {"/health", "/metrics", "/admin/status", "/v1/models"}) {
      httplib::Client cli("127.0.0.1", server_.port);
      cli.set_bearer_token_auth(kApiKey);
      cli.set_read_timeout(10, 0);
      auto r = cli.Get(path);
      ASSERT_TRUE(r) << path;
      EXPECT_EQ(r->status, 200) << path;
    }
  };
  snapshots_answer();
  const std::string head =
      "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n";
  for (int fd : fds) send(fd, head.data(), head.size(), MSG_NOSIGNAL);
  snapshots_answer();
  for (int fd : fds) close(fd);
  for (std::thread& t : chats) t.join();
  EXPECT_EQ(chats_ok.load(), 12);
}

// A second server with its own config: [server] max_connections and
// [memory] same_role = "swap".
TEST_F(ServeE2E, ConnectionCapAndSameRoleSwap) {
  const int port = FreeLoopbackPort();
  const std::string config = dir_ + "/capped.toml";
  std::ofstream(config) << "[server]\nport = " << port << "\nmax_connections = 20\n"
                        << "[memory]\nbudget = \"1GiB\"\nsame_role = \"swap\"\n"
                        << "[pressure]\nsource = \"none\"\n"
                        << "[[models]]\nname = \"e1\"\npath = \"embed\"\ncapability = \"embedding\"\n"
                        << "[[models]]\nname = \"e2\"\npath = \"embed\"\ncapability = \"embedding\"\n";
  std::string error;
  const std::string log = dir_ + "/capped.log";
  pid_t p = ::arbiter::testing::StartServer(ARBITER_BINARY, config, dir_ + "/state-capped", log,
                                            port, std::chrono::seconds(60), &error);
  ASSERT_GT(p, 0) << error;
  // 20 idle connections fill the cap; the next one is answered 503 at once.
  std::vector<int> fds;
  for (int i = 0; i < 20; ++i) {
    const int fd = ::arbiter::testing::ConnectLoopback(port);
    ASSERT_GE(fd, 0);
    fds.push_back(fd);
  }
  // The server counts a connection once its loop accepted it.
  std::string got;
  for (int attempt = 0; attempt < 50 && got.rfind("HTTP/1.1 503", 0) != 0; ++attempt) {
    got = RawExchange(port, "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 10);
    if (got.rfind("HTTP/1.1 503", 0) != 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(got.rfind("HTTP/1.1 503", 0), 0u) << got;
  EXPECT_NE(got.find("Retry-After"), std::string::npos) << got;
  for (int fd : fds) close(fd);
  // Under the cap again: served.
  std::string ok;
  for (int attempt = 0; attempt < 50 && ok.rfind("HTTP/1.1 200", 0) != 0; ++attempt) {
    ok = RawExchange(port, "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
                     10);
    if (ok.rfind("HTTP/1.1 200", 0) != 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(ok.rfind("HTTP/1.1 200", 0), 0u) << ok;
  // same_role = "swap": loading e2 unloads e1 (reason swap).
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(60, 0);
  for (const char* m : {"e1", "e2"}) {
    auto r = cli.Post("/v1/embeddings", json{{"model", m}, {"input", "hello"}}.dump(),
                      "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
  }
  auto st = cli.Get("/admin/status");
  ASSERT_TRUE(st);
  for (const json& m : json::parse(st->body)["models"]) {
    if (m["name"] == "e1") { EXPECT_FALSE(m["resident"].get<bool>()) << m; }
    if (m["name"] == "e2") { EXPECT_TRUE(m["resident"].get<bool>()) << m; }
  }
  EXPECT_NE(ReadAll(log).find("reason swap"), std::string::npos);
  kill(p, SIGTERM);
  waitpid(p, nullptr, 0);
}

TEST_F(ServeE2E, TheStartupHintExpandsTheApiKeyVariable) {
  // Double quotes: a shell expands $ARBITER_API_KEY in the copied command.
  const std::string log = ReadAll(server_.log);
  EXPECT_NE(log.find("-H \"Authorization: Bearer $ARBITER_API_KEY\""), std::string::npos) << log;
  EXPECT_EQ(log.find("'Authorization: Bearer $ARBITER_API_KEY'"), std::string::npos) << log;
}

// Nothing a request carries reaches the log raw: a CR/LF in the path is
// escaped, so it cannot write a line of its own (here one that would claim
// an admin action), and a long path is cut.
TEST_F(ServeE2E, ACrLfInThePathForgesNoLogLine) {
  const std::string stamp = "2031-01-01 00:00:00.000";
  std::string forged =
      "/v1/x%0A2031-01-01%2000:00:00.000%20info%20POST%20/admin/models/tiny/"
      "unload%20200%20(10.1.2.3:5555)%0D%0A";
  std::string got = RawExchange(server_.port, "GET " + forged +
                                                  " HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                                  "Connection: close\r\n\r\n");
  EXPECT_EQ(got.rfind("HTTP/1.1 401", 0), 0u) << got;  // no credentials
  const std::string long_path = "/v1/" + std::string(5000, 'y');
  got = RawExchange(server_.port, "GET " + long_path +
                                      " HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                      "Connection: close\r\n\r\n");
  EXPECT_EQ(got.rfind("HTTP/1.1 401", 0), 0u) << got;
  ASSERT_TRUE(
      LogEventually("GET /v1/x\\x0a2031-01-01 00:00:00.000 info POST "
                    "/admin/models/tiny/unload 200 (10.1.2.3:5555)\\x0d\\x0a 401"));
  ASSERT_TRUE(LogEventually("GET /v1/yyyy"));
  std::istringstream log(ReadAll(server_.log));
  std::string line;
  while (std::getline(log, line)) {
    EXPECT_NE(line.rfind(stamp, 0), 0u) << "a forged log line: " << line;
    if (line.find("GET /v1/yyyy") != std::string::npos) {
      EXPECT_LT(line.size(), 400u) << line;
      EXPECT_NE(line.find("y…"), std::string::npos) << line;
    }
  }
}

// Note [Host check] (src/server/internal/access.h): bound to loopback, only
// Host names of loopback are served; a rebinding page's name gets 403.
TEST_F(ServeE2E, AForeignHostIsRefusedAndLoopbackNamesAreServed) {
  const std::string auth = "Authorization: Bearer " + std::string(kApiKey) + "\r\n";
  auto status_of = [&](const std::string& path, const std::string& host_line,
                       std::string* body = nullptr) {
    const std::string got = RawExchange(server_.port, "GET " + path + " HTTP/1.1\r\n" + host_line +
                                                          auth + "Connection: close\r\n\r\n");
    if (body != nullptr) *body = got;
    return got.size() > 12 ? std::stoi(got.substr(9, 3)) : -1;
  };
  for (const char* path : {"/v1/models", "/admin/status", "/health", "/api/tags", "/ui"}) {
    std::string body;
    EXPECT_EQ(status_of(path, "Host: attacker.example\r\n", &body), 403) << path;
    EXPECT_NE(body.find("host_not_allowed"), std::string::npos) << body;
    EXPECT_NE(body.find("[server] allowed_hosts"), std::string::npos) << body;
    EXPECT_EQ(status_of(path, "Host: attacker.example:" + std::to_string(server_.port) + "\r\n"),
              403)
        << path;
  }
  for (const char* host :
       {"localhost.attacker.example", "127.0.0.1.nip.io", "127.0.0.1@attacker.example"}) {
    EXPECT_EQ(status_of("/v1/models", std::string("Host: ") + host + "\r\n"), 403) << host;
  }
  // A second Host header does not slip a foreign name past the first.
  EXPECT_EQ(status_of("/v1/models", "Host: 127.0.0.1\r\nHost: attacker.example\r\n"), 403);
  const std::string port = std::to_string(server_.port);
  for (const std::string& host : std::vector<std::string>{
           "localhost:" + port, "127.0.0.1:" + port, "[::1]:" + port, "LocalHost:" + port,
           "localhost.:" + port, "localhost", "127.0.0.1", "localhost:1"}) {
    EXPECT_EQ(status_of("/v1/models", "Host: " + host + "\r\n"), 200) << host;
  }
  // No Host header (an HTTP/1.0 tool; browsers always send one): served.
  const std::string got = RawExchange(server_.port, "GET /v1/models HTTP/1.0\r\n" + auth + "\r\n");
  EXPECT_EQ(got.rfind("HTTP/1.1 200", 0), 0u) << got;
}

// [server] allowed_hosts adds names (any port) to loopback's; without an
// API key (the default) the check is what keeps a rebinding page out.
TEST_F(ServeE2E, AllowedHostsAddNamesAndTheDefaultServerRefusesOthers) {
  const int port = FreeLoopbackPort();
  const std::string config = dir_ + "/hosts.toml";
  std::ofstream(config)
      << "[server]\nport = " << port << "\n"
      << "allowed_hosts = [\"arbiter.test\"]\n"
      << "[memory]\nbudget = \"1GiB\"\n[pressure]\nsource = \"none\"\n"
      << "[[models]]\nname = \"e1\"\npath = \"embed\"\ncapability = \"embedding\"\n";
  std::string error;
  const pid_t p =
      ::arbiter::testing::StartServer(ARBITER_BINARY, config, dir_ + "/state-hosts",
                                      dir_ + "/hosts.log", port, std::chrono::seconds(60), &error);
  ASSERT_GT(p, 0) << error;
  auto status_of = [&](const std::string& method, const std::string& path,
                       const std::string& host) {
    const std::string got =
        RawExchange(port, method + " " + path + " HTTP/1.1\r\nHost: " + host +
                              "\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    return got.size() > 12 ? std::stoi(got.substr(9, 3)) : -1;
  };
  EXPECT_EQ(status_of("GET", "/v1/models", "arbiter.test:9999"), 200);
  EXPECT_EQ(status_of("GET", "/v1/models", "ARBITER.TEST"), 200);
  EXPECT_EQ(status_of("GET", "/admin/status", "localhost:" + std::to_string(port)), 200);
  EXPECT_EQ(status_of("GET", "/admin/status", "attacker.example"), 403);
  EXPECT_EQ(status_of("POST", "/admin/models/e1/load", "attacker.example"), 403);
  EXPECT_EQ(status_of("GET", "/v1/models", "sub.arbiter.test"), 403);
  // Nothing the refused requests asked for happened.
  httplib::Client cli("127.0.0.1", port);
  auto st = cli.Get("/admin/status");
  ASSERT_TRUE(st);
  ASSERT_EQ(st->status, 200);
  for (const json& m : json::parse(st->body)["models"])
    EXPECT_FALSE(m["resident"].get<bool>()) << m;
  kill(p, SIGTERM);
  waitpid(p, nullptr, 0);
}

// RFC 7235: the auth scheme is case-insensitive, and 1*SP separates it
// from the credentials.
TEST_F(ServeE2E, TheBearerSchemeIsCaseInsensitive) {
  auto status_with = [&](const std::string& authorization) {
    httplib::Client cli = Client(/*auth=*/false);
    auto r = cli.Get("/v1/models", {{"Authorization", authorization}});
    return r ? r->status : -1;
  };
  const std::string key = kApiKey;
  EXPECT_EQ(status_with("Bearer " + key), 200);
  EXPECT_EQ(status_with("bearer " + key), 200);
  EXPECT_EQ(status_with("BEARER " + key), 200);
  EXPECT_EQ(status_with("bEaReR   " + key), 200);
  EXPECT_EQ(status_with("bearer wrong-key"), 401);
  EXPECT_EQ(status_with("Basic " + key), 401);
  EXPECT_EQ(status_with("Bearer"), 401);
  EXPECT_EQ(status_with("Bearer" + key), 401);
}

TEST_F(ServeE2E, SigtermExitsCleanly) {
  // A long streaming request is (usually) in flight when the signal arrives;
  // shutdown cancels it rather than waiting for it to finish.
  std::thread in_flight([] {
    json req = Chat("tiny", 1900, /*stream=*/true);
    req["temperature"] = 1.0;
    req["seed"] = 3;
    auto r = PostJson("/v1/chat/completions", req);
    (void)r;  // cut short or complete; either is fine
  });
  const auto started = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < started && ModelStatus("tiny")["refcount"] != 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(kill(server_.pid, SIGTERM), 0);
  int status = 0;
  pid_t got = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < deadline && (got = waitpid(server_.pid, &status, WNOHANG)) == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  in_flight.join();
  ASSERT_EQ(got, server_.pid) << "arbiter serve did not exit within 60 s of SIGTERM";
  server_.pid = -1;
  ASSERT_TRUE(WIFEXITED(status)) << "terminated by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_NE(ReadAll(server_.log).find("received SIGTERM"), std::string::npos);
}

// Note [Bounded shutdown] (src/server/shutdown_deadline.cc): a request
// stuck in a backend call that does not watch for the stop does not keep
// the process alive. The stuck call is a real one: the start of a process
// model whose command never answers its health check, which waits up to its
// ready_timeout_s (600 s here) whatever the server is doing. SIGTERM → the
// process exits shutdown_timeout_s (2 s) later, with status 1, naming the
// request and the model it abandons.
TEST(ServeShutdownE2E, AStuckBackendCallIsAbandonedAfterShutdownTimeout) {
  char tmpl[] = "/tmp/arbiter-e2e-shutdown-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const int port = FreeLoopbackPort();
  ASSERT_GT(port, 0);
  const std::string config = dir + "/arbiter.toml";
  std::ofstream(config) << "[server]\nport = " << port << "\nshutdown_timeout_s = 2\n"
                        << "[memory]\nbudget = \"1GiB\"\n"
                        << "[pressure]\nsource = \"none\"\n"
                        << "[[models]]\nname = \"slow\"\n"
                        << "command = [\"/bin/sleep\", \"600\"]\nready_timeout_s = 600\n";
  const std::string log_path = dir + "/serve.log";
  std::string error;
  pid_t pid = ::arbiter::testing::StartServer(ARBITER_BINARY, config, dir + "/state", log_path,
                                              port, std::chrono::seconds(60), &error);
  ASSERT_GT(pid, 0) << error;
  std::thread client([port] {
    httplib::Client cli("127.0.0.1", port);
    cli.set_read_timeout(120, 0);
    (void)cli.Post("/v1/chat/completions",
                   R"({"model":"slow","messages":[{"role":"user","content":"hi"}]})",
                   "application/json");  // cut off when the server exits
  });
  auto state = [port] {
    httplib::Client cli("127.0.0.1", port);
    auto r = cli.Get("/admin/status");
    if (!r || r->status != 200) return std::string();
    const json status = json::parse(r->body);  // not a temporary in the range-for
    for (const json& m : status["models"]) {
      if (m["name"] == "slow") return m["state"].get<std::string>();
    }
    return std::string();
  };
  const auto loading_by = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < loading_by && state() != "loading") {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const std::string loading = state();
  if (loading != "loading") {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    client.join();
    FAIL() << "model \"slow\" is \"" << loading << "\", not loading:\n" << ReadAll(log_path);
  }
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  // The stuck call would last 600 s; the bound is 2 s (+ margin for a
  // loaded machine).
  int status = 0;
  pid_t got = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(2 + 30);
  while (Clock::now() < deadline && (got = waitpid(pid, &status, WNOHANG)) == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (got != pid) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  client.join();
  const std::string log = ReadAll(log_path);
  ASSERT_EQ(got, pid) << "arbiter serve did not exit within 32 s of SIGTERM:\n" << log;
  ASSERT_TRUE(WIFEXITED(status)) << "terminated by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 1);
  EXPECT_NE(log.find("shutdown did not finish within 2 s ([server] shutdown_timeout_s)"),
            std::string::npos) << log;
  EXPECT_NE(log.find("abandoned request: POST /v1/chat/completions from 127.0.0.1:"),
            std::string::npos) << log;
  EXPECT_NE(log.find("abandoned model \"slow\" (text): loading"), std::string::npos) << log;
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace
}  // namespace arbiter
