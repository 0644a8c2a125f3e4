// End-to-end: bounded and strict reading of requests over real HTTP against
// the `arbiter serve` binary (docs/http-api.md "Limits"):
//   - every route that reads a JSON body, the admin actions and the
//     dashboard's sign-in included, refuses an 8 MB body of nested `[` at
//     the 129th level without building it (the server's peak RSS stays
//     put), and refuses a key sent twice;
//   - an admin action refuses fields and query parameters it does not
//     take;
//   - a transport error names the limit that applied, with its value: the
//     audio routes' max_audio_bytes, max_body_bytes elsewhere, the
//     read_timeout_s that fired;
//   - a number's error names its range; a multipart field sent twice, an
//     image whose data: URL declares a non-image type, a tool result
//     without its call's id and a call whose arguments are not a JSON
//     object are 400s naming them;
//   - errors quote at most 256 bytes of what the client sent.
//
// One server for the suite (a tiny model); every wait has a deadline.
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "server_process.h"
#include "server_suite.h"
#include "tools/model_maker/model_maker.h"

namespace arbiter {
namespace {

using json = nlohmann::json;

constexpr const char* kApiKey = "limits-key";
constexpr int kMaxAudioBytes = 100000;

class RequestLimitsE2E : public ::arbiter::testing::ServerSuite {
 protected:
  static void SetUpTestSuite() {
    ASSERT_TRUE(MakeDir("limits-e2e"));
    ASSERT_TRUE(MakeModel("tiny", dir_ + "/tiny", 1).ok());
    // max_body_bytes stays at its default (8 MiB): the nested bodies below
    // reach the JSON reader.
    std::ostringstream config;
    config << "api_key = \"" << kApiKey << "\"\n"
           << "max_audio_bytes = " << kMaxAudioBytes << "\n"
           << "read_timeout_s = 1\n"
           << "request_timeout_s = 60\n"
           << "[memory]\nbudget = \"1GiB\"\n"
           << "[pressure]\nsource = \"none\"\n"
           << "[[models]]\nname = \"tiny\"\npath = \"tiny\"\nctx = 512\n";
    std::string error;
    ASSERT_TRUE(StartServe(config.str(), &error)) << error;
  }

  static httplib::Client Client() {
    httplib::Client cli("127.0.0.1", server_.port);
    cli.set_read_timeout(120, 0);
    cli.set_write_timeout(60, 0);
    cli.set_bearer_token_auth(kApiKey);
    return cli;
  }

  static httplib::Result Post(const std::string& path, const std::string& body,
                              const char* type = "application/json") {
    return Client().Post(path, body, type);
  }

  // The status and error message of an answer ("" when there is none).
  static std::pair<int, std::string> Answer(const httplib::Result& r) {
    if (!r) return {-1, "no answer: " + httplib::to_string(r.error())};
    json j = json::parse(r->body, nullptr, false);
    std::string message = r->body;
    if (j.is_object() && j.contains("error")) {
      const json& e = j["error"];  // OpenAI's {"message", ...}, Ollama's string
      if (e.is_string()) message = e.get<std::string>();
      if (e.is_object() && e.contains("message")) message = e["message"].get<std::string>();
    }
    return {r->status, message};
  }

  static void Expect400(const httplib::Result& r, const std::string& part) {
    const auto [status, message] = Answer(r);
    EXPECT_EQ(status, 400) << message.substr(0, 500);
    EXPECT_NE(message.find(part), std::string::npos) << message.substr(0, 500);
  }

  // Sends `request` on a new connection and reads the answer until the
  // server closes it (a fuse of 30 s per read).
  static std::string RawExchange(const std::string& request) {
    return ::arbiter::testing::RawExchange(server_.port, request);
  }

  // The server's peak resident set (VmHWM), bytes.
  static int64_t PeakRss() {
    std::ifstream in("/proc/" + std::to_string(server_.pid) + "/status");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
    }
    return -1;
  }
};

TEST_F(RequestLimitsE2E, EveryJsonBodyIsReadWithTheSameDepthBound) {
  // Under max_body_bytes: the body reaches the reader, which stops at the
  // 129th `[` instead of building 4 M nested arrays (~250 MB each).
  const std::string deep = std::string(4000000, '[') + std::string(4000000, ']');
  const int64_t peak_before = PeakRss();
  ASSERT_GT(peak_before, 0);
  for (const char* path : {"/admin/pressure", "/admin/compact", "/admin/models/tiny/residency",
                           "/admin/models/tiny/load", "/v1/images/generations", "/ui/login",
                           "/v1/chat/completions", "/v1/responses", "/api/chat", "/tokenize"}) {
    SCOPED_TRACE(path);
    Expect400(Post(path, deep), "nest deeper than 128 levels");
  }
  EXPECT_LT(PeakRss() - peak_before, int64_t{160} << 20)
      << "the peak RSS grew by " << ((PeakRss() - peak_before) >> 20) << " MiB";
  EXPECT_EQ(Answer(Client().Get("/health")).first, 200);
}

TEST_F(RequestLimitsE2E, AKeySentTwiceIsA400NamingIt) {
  // The body of the hostile-input check: `model` twice.
  Expect400(Post("/v1/chat/completions",
                 R"({"model":"nope","model":"tiny","messages":[{"role":"user","content":"x"}],)"
                 R"("max_tokens":2})"),
            "the key \"model\" twice");
  Expect400(Post("/v1/chat/completions",
                 R"({"model":"tiny","messages":[{"role":"user","content":"x","role":"system"}]})"),
            "the key \"messages[0].role\" twice");
  Expect400(Post("/api/chat", R"({"model":"tiny","stream":false,"stream":true,"messages":[]})"),
            "the key \"stream\" twice");
  Expect400(Post("/admin/pressure", R"({"level":"critical","level":"nominal"})"),
            "the key \"level\" twice");
}

TEST_F(RequestLimitsE2E, AdminActionsRefuseWhatTheyDoNotTake) {
  Expect400(Post("/admin/pressure", R"({"level":"low","zz":1})"), "unrecognized field \"zz\"");
  Expect400(Post("/admin/models/tiny/residency", R"({"target":"unpinned","zz":1})"),
            "unrecognized field \"zz\"");
  Expect400(Post("/admin/compact", R"({"zz":1})"), "unrecognized field \"zz\"");
  Expect400(Post("/admin/models/tiny/unload?zz=1", ""), "unrecognized query parameter \"zz\"");
  Expect400(Post("/admin/models/tiny/load", R"({"now":true})"), "takes no fields");
  EXPECT_EQ(Answer(Post("/admin/models/tiny/load", "{}")).first, 200);
  EXPECT_EQ(Answer(Post("/admin/models/tiny/unload?timeout_ms=5000", "")).first, 200);
}

TEST_F(RequestLimitsE2E, A413NamesTheLimitOfItsRoute) {
  const std::string auth = "Authorization: Bearer " + std::string(kApiKey) + "\r\n";
  // An audio upload over max_audio_bytes: refused from its Content-Length.
  std::string got = RawExchange(
      "POST /v1/audio/transcriptions HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth +
      "Content-Type: multipart/form-data; boundary=x\r\nContent-Length: 68157440\r\n\r\n");
  EXPECT_EQ(got.rfind("HTTP/1.1 413", 0), 0u) << got;
  EXPECT_NE(got.find("max_audio_bytes = " + std::to_string(kMaxAudioBytes)), std::string::npos)
      << got;
  EXPECT_EQ(got.find("max_body_bytes"), std::string::npos) << got;
  // Any other route: max_body_bytes, with its value.
  got = RawExchange("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth +
                    "Content-Type: application/json\r\nContent-Length: 9437184\r\n\r\n");
  EXPECT_EQ(got.rfind("HTTP/1.1 413", 0), 0u) << got;
  EXPECT_NE(got.find("8388608 bytes (max_body_bytes)"), std::string::npos) << got;
}

TEST_F(RequestLimitsE2E, A408NamesTheTimeoutThatFired) {
  // 10 of 100 bytes, then silence: read_timeout_s (1 s) fires long before
  // request_timeout_s (60 s), and the answer says so.
  const std::string got = RawExchange(
      "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " +
      std::string(kApiKey) + "\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
                             "{\"model\":");
  EXPECT_EQ(got.rfind("HTTP/1.1 408", 0), 0u) << got;
  EXPECT_NE(got.find("for 1 s (read_timeout_s)"), std::string::npos) << got;
  EXPECT_EQ(got.find("request_timeout_s"), std::string::npos) << got;
}

TEST_F(RequestLimitsE2E, ErrorsNameWhatIsWrongAndTheBound) {
  Expect400(Post("/v1/chat/completions",
                 R"({"model":"tiny","messages":[{"role":"user","content":"x"}],)"
                 R"("max_tokens":2147483648})"),
            "\"max_tokens\" must be an integer between 1 and 2147483647 (got 2147483648)");
  // A multipart field sent twice.
  const std::string form = "--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nasr\r\n"
                           "--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nvad\r\n"
                           "--b--\r\n";
  Expect400(Post("/v1/audio/transcriptions", form, "multipart/form-data; boundary=b"),
            "the field \"model\" is sent twice");
  // PNG bytes declared as text.
  const std::string png_magic_b64 = "iVBORw0KGgoAAAANSUhEUg==";
  Expect400(Post("/v1/vision/describe",
                 json{{"model", "tiny"}, {"image", "data:text/plain;base64," + png_magic_b64}}.dump()),
            "the media type \"text/plain\" is not an image type");
  // A tool result without its call's id; a call whose arguments are not JSON.
  const json call = {{"role", "assistant"},
                     {"content", nullptr},
                     {"tool_calls",
                      {{{"id", "c1"},
                        {"type", "function"},
                        {"function", {{"name", "add"}, {"arguments", "{\"a\":6E688}"}}}}}}};
  json chat = {{"model", "tiny"},
               {"messages", {{{"role", "user"}, {"content", "add"}}, call,
                             {{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "5"}}}}};
  Expect400(Post("/v1/chat/completions", chat.dump()),
            "\"messages[1].tool_calls[0].function.arguments\" is not valid JSON");
  chat["messages"][1]["tool_calls"][0]["function"]["arguments"] = "{\"a\":2}";
  chat["messages"][2].erase("tool_call_id");
  Expect400(Post("/v1/chat/completions", chat.dump()), "\"messages[2].tool_call_id\" is required");
}

TEST_F(RequestLimitsE2E, ErrorsQuoteAtMost256BytesOfTheClientsInput) {
  const std::string name(7900000, 'm');  // a 7.9 MB model name
  for (const auto& [path, body] :
       std::vector<std::pair<std::string, std::string>>{
           {"/v1/chat/completions",
            R"({"model":")" + name + R"(","messages":[{"role":"user","content":"x"}]})"},
           {"/v1/embeddings", R"({"model":")" + name + R"(","input":"x"})"},
           {"/api/chat", R"({"model":")" + name + R"(","messages":[]})"}}) {
    SCOPED_TRACE(path);
    auto r = Post(path, body);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 404);
    EXPECT_LT(r->body.size(), 1000u);
    EXPECT_NE(Answer(r).second.find(std::string(256, 'm') + "\u2026"), std::string::npos)
        << r->body.substr(0, 200);
  }
  auto r = Post("/v1/chat/completions", "{\"" + name + "\":1}");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_LT(r->body.size(), 1000u);
}

}  // namespace
}  // namespace arbiter
