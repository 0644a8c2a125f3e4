// The rules every request body follows (Note [One JSON reader] in
// internal/json_fields.h): one JSON reader with one depth bound and no
// duplicate keys, number errors that name their range, tool messages that
// can be paired with their calls, and errors that quote at most 256 bytes
// of the input.
#include <limits>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "arbiter/base/clip.h"
#include "arbiter/server/openai.h"
#include "server/internal/json_fields.h"
#include "server/internal/ollama.h"

namespace arbiter::server_internal {
namespace {

using json = RequestJson;  // what ParseJson builds
using ::testing::HasSubstr;

std::string ErrorOf(const Result<json>& r) { return r.ok() ? "(ok)" : r.status().message(); }

TEST(ParseJson, AcceptsWhatNlohmannAcceptsAndBuildsTheSameValue) {
  const std::string text =
      R"({"s":"a\"[{\u00e9","n":[-1,0,18446744073709551615,1.5e3,-0.0],"b":[true,false,null],)"
      R"("o":{"e":{},"a":[],"x":{"y":[[{"z":1}]]}},"same":{"k":1},"other":{"k":2},"k":3})";
  Result<json> r = ParseJson(text, "request body");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, json::parse(text));
  EXPECT_TRUE(ParseJson(" 7 ", "x").ok());
  EXPECT_EQ(*ParseJson("[1,[2,[3]],{}]", "x"), json::parse("[1,[2,[3]],{}]"));
}

TEST(ParseJson, ADuplicateKeyIsRefusedNamingItsPath) {
  EXPECT_EQ(ErrorOf(ParseJson(R"({"model":"a","messages":[],"model":"b"})", "request body")),
            "request body has the key \"model\" twice; a key may appear once per object");
  EXPECT_THAT(ErrorOf(ParseJson(
                  R"({"messages":[{"role":"user"},{"role":"user","content":"x","role":"tool"}]})",
                  "request body")),
              HasSubstr("the key \"messages[1].role\" twice"));
  EXPECT_THAT(ErrorOf(ParseJson(R"({"l":[1,[2],{"k":1,"k":2}]})", "request body")),
              HasSubstr("the key \"l[2].k\" twice"));
  EXPECT_THAT(ErrorOf(ParseJson(R"([{"a":1},{"a":1,"a":2}])", "\"f\"")),
              HasSubstr("\"f\" has the key \"[1].a\" twice"));
  EXPECT_THAT(ErrorOf(ParseJson(R"({"a":{"b":{"c":1,"c":1}}})", "x")),
              HasSubstr("the key \"a.b.c\" twice"));
  // An escaped key is the same key.
  EXPECT_THAT(ErrorOf(ParseJson(R"({"ab":1,"a\u0062":2})", "x")), HasSubstr("\"ab\" twice"));
  // The same key in different objects is fine.
  EXPECT_TRUE(ParseJson(R"({"a":{"k":1},"b":{"k":1},"k":[{"k":1},{"k":2}]})", "x").ok());
}

TEST(ParseJson, KeepsTheKeysInTheOrderWritten) {
  const std::string text = R"({"zeta":1,"alpha":{"y":[{"b":1,"a":2}],"x":0},"mid":null})";
  Result<json> r = ParseJson(text, "x");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::string keys;
  for (auto it = r->begin(); it != r->end(); ++it) keys += it.key() + ",";
  EXPECT_EQ(keys, "zeta,alpha,mid,");
  EXPECT_EQ(DumpJson(*r), text);
}

// An object of about 800k distinct keys in an 8 MiB body is read in
// O(n log n) (ordered_json's own parse would make ~3·10^11 key
// comparisons), a repeat among them is still found, and the request
// parsers look up their fields, never each key.
TEST(ParseJson, AnObjectOfManyKeysIsReadInBoundedWork) {
  constexpr size_t kBodyLimit = 8 << 20;  // [server] max_body_bytes' default
  std::string members;
  size_t n = 0;
  while (members.size() < kBodyLimit - 4096) {
    members += fmt::format("{}\"{:x}\":0", n == 0 ? "" : ",", n);
    ++n;
  }
  ASSERT_GE(n, 750000u);
  const std::string last = fmt::format("{:x}", n - 1);
  Result<json> r = ParseJson("{" + members + "}", "request body");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), n);
  EXPECT_EQ(r->begin().key(), "0");
  EXPECT_EQ((--r->end()).key(), last);
  // A repeat of the first key, at the end, is found and named by its path.
  EXPECT_EQ(ErrorOf(ParseJson("{" + members + ",\"0\":1}", "request body")),
            "request body has the key \"0\" twice; a key may appear once per object");
  EXPECT_EQ(ErrorOf(ParseJson(R"({"a":[{"b":{)" + members + ",\"" + last + "\":1}}]}", "x")),
            "x has the key \"a[0].b." + last + "\" twice; a key may appear once per object");
  // The parsers: an unknown field at once; a no-op object and a schema of
  // that many keys are accepted, the schema passed on in the order written.
  EXPECT_THAT(ParseChatRequest("{" + members + "}").status().message(),
              HasSubstr("unrecognized field \"0\""));
  const std::string chat = R"({"model":"m","messages":[{"role":"user","content":"x"}],)";
  EXPECT_TRUE(ParseChatRequest(chat + R"("metadata":{)" + members + "}}").ok());
  Result<ChatRequest> schema = ParseChatRequest(
      chat + R"("response_format":{"type":"json_schema","json_schema":{"schema":{"properties":{)" +
      members + "}}}}}");
  ASSERT_TRUE(schema.ok()) << schema.status().ToString();
  EXPECT_EQ(schema->format.text, R"({"properties":{)" + members + "}}");
  Result<OllamaTextRequest> ollama = ParseOllamaGenerate(
      R"({"model":"m","prompt":"x","format":{"properties":{)" + members + "}}}");
  ASSERT_TRUE(ollama.ok()) << ollama.status().ToString();
  EXPECT_EQ(ollama->text.constraint_text, R"({"properties":{)" + members + "}}");
}

TEST(ParseJson, NestingIsBoundedAsEachContainerOpens) {
  auto nested = [](int levels) {
    return std::string(levels, '[') + std::string(levels, ']');
  };
  EXPECT_TRUE(ParseJson(nested(kMaxJsonDepth), "x").ok());
  EXPECT_EQ(ErrorOf(ParseJson(nested(kMaxJsonDepth + 1), "request body")),
            "request body is not valid JSON: arrays and objects nest deeper than 128 levels");
  // 8 MB of `[`: refused at the 129th, never built (nor closed).
  EXPECT_THAT(ErrorOf(ParseJson(std::string(8 << 20, '['), "request body")),
              HasSubstr("nest deeper than 128"));
  std::string objects;
  for (int i = 0; i <= kMaxJsonDepth; ++i) objects += "{\"a\":";
  EXPECT_THAT(ErrorOf(ParseJson(objects, "x")), HasSubstr("nest deeper than 128"));
  // Brackets in strings do not count.
  EXPECT_TRUE(ParseJson("{\"s\":\"" + std::string(1000, '[') + "\"}", "x").ok());
}

TEST(ParseJson, ErrorsQuoteAtMost256BytesOfTheInput) {
  // nlohmann quotes the token it read; a 1 MB bad literal is clipped.
  const std::string bad = "{\"a\":" + std::string(1 << 20, 't') + "}";
  const std::string e = ErrorOf(ParseJson(bad, "request body"));
  EXPECT_THAT(e, HasSubstr("request body is not valid JSON"));
  EXPECT_LE(e.size(), 300u) << e.size();
  const std::string key(1 << 20, 'k');
  const std::string dup = ErrorOf(ParseJson("{\"" + key + "\":1,\"" + key + "\":2}", "x"));
  EXPECT_THAT(dup, HasSubstr("twice"));
  EXPECT_LE(dup.size(), 400u);
  EXPECT_THAT(ErrorOf(ParseJson("{\"a\":1e400}", "x")), HasSubstr("not valid JSON"));
  EXPECT_THAT(ErrorOf(ParseJson("{} trailing", "x")), HasSubstr("not valid JSON"));
  EXPECT_THAT(ErrorOf(ParseJson("", "x")), HasSubstr("not valid JSON"));
}

TEST(ParseBody, IsAnObjectAndEveryRequestParserUsesIt) {
  EXPECT_EQ(ErrorOf(ParseBody("[1]")), "request body must be a JSON object");
  Result<json> r = ParseBody("[1]");
  EXPECT_EQ(r.status().reason(), ErrorReason::kInvalidRequest);
  const std::string dup =
      R"({"model":"a","model":"b","messages":[{"role":"user","content":"x"}],"prompt":"x",)"
      R"("input":"x"})";
  for (const Status& st :
       {ParseChatRequest(dup).status(), ParseCompletionRequest(dup).status(),
        ParseEmbeddingRequest(dup).status(), ParseResponsesRequest(dup).status(),
        ParsePrewarmRequest(dup).status(), ParseOllamaChat(dup).status(),
        ParseOllamaGenerate(dup).status(), ParseOllamaEmbed(dup, false).status()}) {
    EXPECT_THAT(st.message(), HasSubstr("the key \"model\" twice")) << st.ToString();
  }
}

TEST(GetInt, ErrorsNameTheRange) {
  EXPECT_EQ(IntRangeText(1, 16), "an integer between 1 and 16");
  EXPECT_EQ(IntRangeText(std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()),
            "an integer");
  std::optional<int64_t> v;
  const int64_t max = std::numeric_limits<int32_t>::max();
  auto error = [&](const char* body) {
    return GetInt(json::parse(body), "max_tokens", 1, max, &v).message();
  };
  EXPECT_EQ(error(R"({"max_tokens":2147483648})"),
            "\"max_tokens\" must be an integer between 1 and 2147483647 (got 2147483648)");
  EXPECT_EQ(error(R"({"max_tokens":0})"),
            "\"max_tokens\" must be an integer between 1 and 2147483647 (got 0)");
  EXPECT_EQ(error(R"({"max_tokens":"10"})"),
            "\"max_tokens\" must be an integer between 1 and 2147483647");
  EXPECT_EQ(error(R"({"max_tokens":1.5})"),
            "\"max_tokens\" must be an integer between 1 and 2147483647 (got 1.5)");
  EXPECT_EQ(error(R"({"max_tokens":1e19})"),
            "\"max_tokens\" must be an integer between 1 and 2147483647 (got 1e+19)");
  EXPECT_TRUE(GetInt(json::parse(R"({"max_tokens":2147483647})"), "max_tokens", 1, max, &v).ok());
  EXPECT_EQ(v, max);
  // The request parsers and the numbers' type errors say the range too.
  EXPECT_THAT(
      ParseChatRequest(
          R"({"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":2147483648})")
          .status()
          .message(),
      HasSubstr("between 1 and 2147483647"));
  std::optional<double> d;
  EXPECT_EQ(GetNumber(json::parse(R"({"t":"hot"})"), "t", 0, 2, false, "between 0 and 2", &d)
                .message(),
            "\"t\" must be a number between 0 and 2");
}

constexpr const char* kCall =
    R"({"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function",)"
    R"("function":{"name":"f","arguments":ARGS}}]})";

std::string ChatWith(const std::string& messages) {
  return R"({"model":"m","messages":[{"role":"user","content":"hi"},)" + messages + "]}";
}

std::string CallWithArguments(const std::string& args) {
  std::string call = kCall;
  call.replace(call.find("ARGS"), 4, args);
  return call;
}

TEST(ToolMessages, AToolResultNamesItsCall) {
  const std::string call = CallWithArguments(R"("{\"a\":1}")");
  EXPECT_TRUE(ParseChatRequest(ChatWith(call + R"(,{"role":"tool","tool_call_id":"c1","content":"2"})")).ok());
  EXPECT_EQ(ParseChatRequest(ChatWith(call + R"(,{"role":"tool","content":"2"})")).status().message(),
            "\"messages[2].tool_call_id\" is required");
  EXPECT_EQ(ParseChatRequest(ChatWith(call + R"(,{"role":"tool","tool_call_id":"","content":"2"})"))
                .status()
                .message(),
            "\"messages[2].tool_call_id\" must not be empty");
  EXPECT_EQ(ParseChatRequest(ChatWith(R"({"role":"user","tool_call_id":"c1","content":"2"})"))
                .status()
                .message(),
            "\"messages[1].tool_call_id\" is only allowed on tool messages");
}

TEST(ToolMessages, AnAssistantCallsArgumentsAreAJsonObject) {
  EXPECT_TRUE(ParseChatRequest(ChatWith(CallWithArguments(R"("{}")"))).ok());
  auto error = [](const std::string& args) {
    return ParseChatRequest(ChatWith(CallWithArguments(args))).status().message();
  };
  const std::string field = "\"messages[1].tool_calls[0].function.arguments\"";
  EXPECT_THAT(error(R"("{\"a\": 6E688}")"), HasSubstr(field + " is not valid JSON"));
  EXPECT_THAT(error(R"("not json")"), HasSubstr(field + " is not valid JSON"));
  EXPECT_EQ(error(R"("[1,2]")"), field + " must be a string holding a JSON object");
  EXPECT_EQ(error(R"({"a":1})"), field + " must be a string");
  EXPECT_THAT(error(R"("{\"a\":1,\"a\":2}")"), HasSubstr(field + " has the key \"a\" twice"));
  std::string deep = "\"";
  deep.append(200, '[');
  deep += '"';
  EXPECT_THAT(error(deep), HasSubstr("nest deeper than 128"));
  std::string no_args = kCall;
  no_args.replace(no_args.find(R"(,"arguments":ARGS)"), 17, "");
  EXPECT_EQ(ParseChatRequest(ChatWith(no_args)).status().message(), field + " is required");
  std::string custom = CallWithArguments(R"("{}")");
  custom.replace(custom.find(R"("type":"function")"), 17, R"("type":"custom")");
  EXPECT_EQ(ParseChatRequest(ChatWith(custom)).status().message(),
            "\"messages[1].tool_calls[0].type\" must be \"function\"");
}

TEST(ToolMessages, TheResponsesApisFunctionCallsToo) {
  auto input = [](const std::string& args) {
    return ParseResponsesRequest(
        R"({"model":"m","input":[{"type":"function_call","call_id":"c1","name":"f","arguments":)" +
        args + R"(},{"type":"function_call_output","call_id":"c1","output":"ok"}]})");
  };
  EXPECT_TRUE(input(R"("{\"x\":[1]}")").ok());
  EXPECT_THAT(input(R"("x")").status().message(),
              HasSubstr("\"input[0].arguments\" is not valid JSON"));
  EXPECT_EQ(input(R"("3")").status().message(),
            "\"input[0].arguments\" must be a string holding a JSON object");
  EXPECT_THAT(ParseResponsesRequest(
                  R"({"model":"m","input":[{"type":"function_call_output","output":"ok"}]})")
                  .status()
                  .message(),
              HasSubstr("\"call_id\" is required"));
}

TEST(ClipInput, ErrorsOfTheRequestParsersQuoteAtMost256Bytes) {
  const std::string huge(1 << 20, 'z');
  for (const Status& st :
       {ParseChatRequest(R"({"model":"m","messages":[{"role":")" + huge + R"(","content":"x"}]})")
            .status(),
        ParseChatRequest(R"({"model":"m","messages":[{"role":"user","content":"x"}],")" + huge +
                         R"(":1})")
            .status(),
        ParseOllamaChat(R"({"model":"m","format":")" + huge + R"("})").status(),
        ParseOllamaChat(R"({"model":"m","options":{")" + huge + R"(":1}})").status(),
        ParseQueryInt("timeout_ms", huge, 0, 10, "an integer in 0..10").status()}) {
    EXPECT_FALSE(st.ok());
    EXPECT_LE(st.message().size(), 600u) << st.message().substr(0, 100);
    EXPECT_THAT(st.message(), HasSubstr(std::string(100, 'z') + "\u2026"));
  }
}

// A JSON schema reaches the runtime in the order the client declared its
// properties (the grammar makes the model write them in that order), and a
// tool's parameters reach the chat template as written: the text handed on
// is the client's own, compacted.
TEST(KeyOrder, SchemasAndToolParametersReachTheRuntimeAsDeclared) {
  const std::string schema =
      R"({"type":"object","properties":{"zeta":{"type":"string"},"alpha":{"type":"integer"},)"
      R"("mid":{"type":"boolean"}},"required":["zeta","alpha","mid"]})";
  const std::string spaced = R"({ "type": "object", "properties": { "zeta": {"type": "string"},)"
                             R"( "alpha": {"type": "integer"}, "mid": {"type": "boolean"} },)"
                             R"( "required": ["zeta", "alpha", "mid"] })";
  const std::string messages = R"("messages":[{"role":"user","content":"x"}])";

  Result<ChatRequest> chat = ParseChatRequest(
      R"({"model":"m",)" + messages +
      R"(,"response_format":{"type":"json_schema","json_schema":{"name":"r","schema":)" + spaced +
      R"(}},"tools":[{"type":"function","function":{"name":"f","parameters":)" + spaced + "}}]}");
  ASSERT_TRUE(chat.ok()) << chat.status().ToString();
  EXPECT_EQ(chat->format.text, schema);
  ASSERT_EQ(chat->tools.tools.size(), 1u);
  EXPECT_EQ(chat->tools.tools[0].parameters, schema);

  Result<CompletionRequest> completion = ParseCompletionRequest(
      R"({"model":"m","prompt":"x","response_format":{"type":"json_schema","json_schema":{"schema":)" +
      spaced + "}}}");
  ASSERT_TRUE(completion.ok()) << completion.status().ToString();
  EXPECT_EQ(completion->format.text, schema);

  Result<ResponsesRequest> responses = ParseResponsesRequest(
      R"({"model":"m","input":"x","text":{"format":{"type":"json_schema","name":"r","schema":)" +
      spaced + R"(}},"tools":[{"type":"function","name":"f","parameters":)" + spaced + "}]}");
  ASSERT_TRUE(responses.ok()) << responses.status().ToString();
  EXPECT_EQ(responses->format.text, schema);
  ASSERT_EQ(responses->tools.tools.size(), 1u);
  EXPECT_EQ(responses->tools.tools[0].parameters, schema);

  Result<OllamaTextRequest> ollama = ParseOllamaChat(
      R"({"model":"m",)" + messages + R"(,"format":)" + spaced +
      R"(,"tools":[{"type":"function","function":{"name":"f","parameters":)" + spaced + "}}]}");
  ASSERT_TRUE(ollama.ok()) << ollama.status().ToString();
  EXPECT_EQ(ollama->text.constraint, OutputConstraintKind::kJsonSchema);
  EXPECT_EQ(ollama->text.constraint_text, schema);
  ASSERT_EQ(ollama->text.tools.size(), 1u);
  EXPECT_EQ(ollama->text.tools[0].parameters, schema);

  // An assistant's earlier call, sent back by an Ollama client: its
  // arguments as written.
  Result<OllamaTextRequest> call = ParseOllamaChat(
      R"({"model":"m","messages":[{"role":"assistant","content":"","tool_calls":[{"function":)"
      R"({"name":"f","arguments":{"zeta":"z","alpha":1,"mid":true}}}]}]})");
  ASSERT_TRUE(call.ok()) << call.status().ToString();
  ASSERT_EQ(call->text.messages.at(0).tool_calls.size(), 1u);
  EXPECT_EQ(call->text.messages[0].tool_calls[0].arguments, R"({"zeta":"z","alpha":1,"mid":true})");
}

}  // namespace
}  // namespace arbiter::server_internal
