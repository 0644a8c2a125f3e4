#include "arbiter/server/openai.h"

#include <gtest/gtest.h>

#include <limits>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "server/internal/json_fields.h"

namespace arbiter {
namespace {

using json = nlohmann::json;

std::string ErrorOf(const Status& s) { return s.message(); }

TEST(ParseChatRequest, MinimalAndDefaults) {
  auto r = ParseChatRequest(R"({"model":"m","messages":[{"role":"user","content":"hi"}]})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->model, "m");
  ASSERT_EQ(r->messages.size(), 1u);
  EXPECT_EQ(r->messages[0].role, "user");
  EXPECT_EQ(r->messages[0].content, "hi");
  EXPECT_FALSE(r->max_tokens.has_value());
  EXPECT_FALSE(r->stream);
  SamplingParams p = r->sampling.ToSamplingParams();
  EXPECT_FLOAT_EQ(p.temperature, 1.0f);
  EXPECT_FLOAT_EQ(p.top_p, 1.0f);
  EXPECT_EQ(p.top_k, 0);
  EXPECT_FALSE(p.has_seed);
}

TEST(ParseChatRequest, AllFields) {
  auto r = ParseChatRequest(R"({
    "model":"m",
    "messages":[{"role":"developer","content":"be brief"},
                {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
                {"role":"assistant","content":null}],
    "max_completion_tokens": 7, "temperature": 0, "top_p": 0.5, "top_k": 40, "seed": -3,
    "stop": ["x","y"], "stream": true, "stream_options": {"include_usage": true},
    "n": 1, "user": "u", "metadata": {"a": "1"}, "logit_bias": null,
    "conversation_id": "c1", "cache_ttl": "long"})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->messages[0].role, "system");
  EXPECT_EQ(r->messages[1].content, "ab");
  EXPECT_EQ(r->messages[2].content, "");
  EXPECT_EQ(*r->max_tokens, 7);
  EXPECT_EQ(r->stop, (std::vector<std::string>{"x", "y"}));
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  EXPECT_EQ(r->user, "u");
  EXPECT_EQ(r->cache.conversation_id, "c1");
  EXPECT_EQ(r->cache.cache_ttl, "long");
  SamplingParams p = r->sampling.ToSamplingParams();
  EXPECT_FLOAT_EQ(p.temperature, 0.0f);
  EXPECT_FLOAT_EQ(p.top_p, 0.5f);
  EXPECT_EQ(p.top_k, 40);
  EXPECT_TRUE(p.has_seed);
  EXPECT_EQ(p.seed, static_cast<uint64_t>(int64_t{-3}));
}

TEST(ParseChatRequest, StopAsString) {
  auto r = ParseChatRequest(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"stop":"END"})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->stop, std::vector<std::string>{"END"});
}

struct BadCase {
  const char* body;
  const char* message_part;
};

class ChatErrors : public ::testing::TestWithParam<BadCase> {};

TEST_P(ChatErrors, NamesTheField) {
  auto r = ParseChatRequest(GetParam().body);
  ASSERT_FALSE(r.ok()) << GetParam().body;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(ErrorOf(r.status()).find(GetParam().message_part), std::string::npos)
      << ErrorOf(r.status());
}

#define MSGS R"("messages":[{"role":"user","content":"hi"}])"
INSTANTIATE_TEST_SUITE_P(
    All, ChatErrors,
    ::testing::Values(
        BadCase{"{not json", "not valid JSON"}, BadCase{"[1,2]", "JSON object"},
        BadCase{R"({"messages":[]})", "\"model\" is required"},
        BadCase{R"({"model":5,)" MSGS "}", "\"model\" must be a string"},
        BadCase{R"({"model":"m"})", "\"messages\" is required"},
        BadCase{R"({"model":"m","messages":{}})", "\"messages\" must be an array"},
        BadCase{R"({"model":"m","messages":[]})", "must not be empty"},
        BadCase{R"({"model":"m","messages":[{"content":"x"}]})", "\"messages[0].role\" is required"},
        BadCase{R"({"model":"m","messages":[{"role":7,"content":"x"}]})",
                "\"messages[0].role\" must be a string"},
        BadCase{R"({"model":"",)" MSGS "}", "\"model\" must not be empty"},
        BadCase{R"({"model":"m",)" MSGS R"(,"temperature":NaN})", "not valid JSON"},
        BadCase{R"({"model":"m",)" MSGS R"(,"temperature":Infinity})", "not valid JSON"},
        BadCase{R"({"model":"m",)" MSGS R"(,"max_tokens":1e400})", "not valid JSON"},
        BadCase{R"({"model":"m",)" MSGS R"(,"max_tokens":99999999999999999999})",
                "\"max_tokens\" must be an integer between 1 and 2147483647"},
        BadCase{R"({"model":"m",)" MSGS R"(,"max_tokens":2147483648})",
                "\"max_tokens\" must be an integer between 1 and 2147483647 (got 2147483648)"},
        BadCase{R"({"model":"m",)" MSGS R"(,"stream":true,"stream_options":"on"})",
                "\"stream_options\" must be an object"},
        BadCase{R"({"model":"m",)" MSGS R"(,"temperature":-1})", "\"temperature\" must be between"},
        BadCase{R"({"model":"m","messages":[{"role":"wizard","content":"x"}]})", "messages[0].role"},
        BadCase{R"({"model":"m","messages":[{"role":"user","content":5}]})",
                "\"messages[0].content\" must be a string or an array"},
        BadCase{R"({"model":"m","messages":[{"role":"user","content":[{"type":"image_url"}]}]})",
                "\"messages[0].content[0].image_url\" must be an object"},
        BadCase{R"({"model":"m","messages":[{"role":"user","content":[{"type":"input_audio"}]}]})",
                "only \"text\" and \"image_url\" content parts"},
        BadCase{R"({"model":"m","messages":[{"role":"user","content":[{"type":"image_url",)"
                R"("image_url":{"url":"data:x","detail":"max"}}]}]})",
                "image_url.detail\" must be one of"},
        BadCase{R"({"model":"m","messages":[{"role":"user"}]})", "messages[0].content\" is required"},
        BadCase{R"({"model":"m",)" MSGS R"(,"temperature":"hot"})", "\"temperature\" must be a number"},
        BadCase{R"({"model":"m",)" MSGS R"(,"temperature":2.5})", "\"temperature\" must be between 0 and 2"},
        BadCase{R"({"model":"m",)" MSGS R"(,"top_p":0})", "\"top_p\" must be in (0, 1]"},
        BadCase{R"({"model":"m",)" MSGS R"(,"top_p":1.5})", "\"top_p\""},
        BadCase{R"({"model":"m",)" MSGS R"(,"top_k":-1})", "\"top_k\" must be an integer between 0 and 2147483647"},
        BadCase{R"({"model":"m",)" MSGS R"(,"top_k":1.5})", "\"top_k\""},
        BadCase{R"({"model":"m",)" MSGS R"(,"seed":"x"})", "\"seed\" must be an integer"},
        BadCase{R"({"model":"m",)" MSGS R"(,"max_tokens":0})",
                "\"max_tokens\" must be an integer between 1 and 2147483647"},
        BadCase{R"({"model":"m",)" MSGS R"(,"max_tokens":"10"})", "\"max_tokens\""},
        BadCase{R"({"model":"m",)" MSGS R"(,"max_completion_tokens":-5})", "\"max_completion_tokens\""},
        BadCase{R"({"model":"m",)" MSGS R"(,"stop":["a","b","c","d","e"]})", "at most 4"},
        BadCase{R"({"model":"m",)" MSGS R"(,"stop":[1]})", "\"stop[0]\" must be a string"},
        BadCase{R"({"model":"m",)" MSGS R"(,"stop":5})", "\"stop\" must be"},
        BadCase{R"({"model":"m",)" MSGS R"(,"stream":"yes"})", "\"stream\" must be a boolean"},
        BadCase{R"({"model":"m",)" MSGS R"(,"stream_options":{"include_usage":1}})",
                "\"stream_options.include_usage\" must be a boolean"},
        BadCase{R"({"model":"m",)" MSGS R"(,"n":0})", "\"n\" must be an integer between 1 and 16"},
        BadCase{R"({"model":"m",)" MSGS R"(,"user":7})", "\"user\" must be a string"},
        BadCase{R"({"model":"m",)" MSGS R"(,"cache_ttl":"forever"})", "\"cache_ttl\""},
        BadCase{R"({"model":"m",)" MSGS R"(,"conversation_id":5})", "\"conversation_id\""}));

// Image parts are recorded where they stand in the message's text.
TEST(ParseChatRequest, ImagePartsAreRecordedAtTheirOffset) {
  auto r = ParseChatRequest(R"({"model":"m","messages":[{"role":"system","content":"s"},
      {"role":"user","content":[{"type":"text","text":"look: "},
        {"type":"image_url","image_url":{"url":"data:image/png;base64,AA==","detail":"low"}},
        {"type":"text","text":" ok"},{"type":"image_url","image_url":"data:image/bmp;base64,Qk0="}]}]})");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->messages[1].content, "look:  ok");
  ASSERT_EQ(r->images.size(), 2u);
  EXPECT_EQ(r->images[0].message, 1u);
  EXPECT_EQ(r->images[0].offset, 6u);
  EXPECT_EQ(r->images[0].url, "data:image/png;base64,AA==");
  EXPECT_EQ(r->images[0].field, "messages[1].content[1].image_url");
  EXPECT_EQ(r->images[1].offset, 9u);
}

TEST(ParseSpeechRequest, DefaultsAndErrors) {
  auto r = ParseSpeechRequest(R"({"model":"tts","input":"hi","voice":"slt"})");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->response_format, "mp3");
  EXPECT_EQ(r->speed, 1.0);
  EXPECT_EQ(r->voice, "slt");
  for (const auto& [body, part] : std::vector<std::pair<std::string, std::string>>{
           {R"({"model":"tts","input":""})", "\"input\" must not be empty"},
           {R"({"model":"tts"})", "\"input\""},
           {R"({"model":"tts","input":"x","response_format":"opus"})", "response_format"},
           {R"({"model":"tts","input":"x","speed":9})", "\"speed\" must be between 0.25 and 4.0"},
           {R"({"model":"tts","input":"x","stream_format":"sse"})", "stream_format"},
           {R"({"model":"tts","input":"x","instructions":"calm"})", "instructions"}}) {
    auto bad = ParseSpeechRequest(body);
    ASSERT_FALSE(bad.ok()) << body;
    EXPECT_NE(bad.status().message().find(part), std::string::npos) << bad.status().message();
  }
}

TEST(ParseDescribeRequest, ImageOrImageUrl) {
  auto a = ParseDescribeRequest(R"({"model":"ocr","image":"data:image/png;base64,AA=="})");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->field, "image");
  auto b = ParseDescribeRequest(R"({"model":"ocr","image_url":{"url":"data:x"}})");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->image, "data:x");
  EXPECT_EQ(b->field, "image_url");
  EXPECT_FALSE(ParseDescribeRequest(R"({"model":"ocr"})").ok());
  EXPECT_FALSE(ParseDescribeRequest(R"({"model":"ocr","image":"a","image_url":"b"})").ok());
}

TEST(ParseRequest, CacheFieldsOnBothEndpoints) {
  auto c = ParseCompletionRequest(
      R"({"model":"m","prompt":"x","conversation_id":"../../x","prompt_cache_key":"k","cache_ttl":"extended"})");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->cache.conversation_id, "../../x");
  EXPECT_EQ(c->cache.prompt_cache_key, "k");
  EXPECT_EQ(c->cache.cache_ttl, "extended");
  const std::string long_id(kMaxCacheIdBytes + 1, 'a');
  auto bad = ParseCompletionRequest(R"({"model":"m","prompt":"x","conversation_id":")" +
                                    long_id + "\"}");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("\"conversation_id\" is 4097 bytes"), std::string::npos)
      << bad.status().message();
  auto ok = ParseCompletionRequest(R"({"model":"m","prompt":"x","conversation_id":")" +
                                   long_id.substr(1) + "\"}");
  EXPECT_TRUE(ok.ok());
}

// Regression: a body of 100k `[` used to be parsed into 100k nested arrays
// (an 8 MiB body → ~0.5 GiB); nesting is now bounded before parsing.
TEST(ParseRequest, DeepNestingIsRejectedBeforeParsing) {
  const std::string deep = R"({"model":"m","messages":)" + std::string(100000, '[') +
                           std::string(100000, ']') + "}";
  for (const Status& st : {ParseChatRequest(deep).status(), ParseCompletionRequest(deep).status(),
                           ParseEmbeddingRequest(deep).status()}) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("nest deeper than 128"), std::string::npos) << st.message();
  }
  EXPECT_FALSE(ParseChatRequest(std::string(100000, '[')).ok());
  // Brackets inside strings (and after escaped quotes) do not count.
  const std::string brackets = std::string(1000, '[') + "\\\"" + std::string(1000, '{');
  auto r = ParseChatRequest(R"({"model":"m","messages":[{"role":"user","content":")" +
                            brackets + R"("}]})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->messages[0].content, std::string(1000, '[') + "\"" + std::string(1000, '{'));
  // 128 levels (the body object + 127 arrays) are fine, 129 are not.
  const std::string at_limit = R"({"model":"m","x":)" + std::string(127, '[') +
                               std::string(127, ']') + "," + MSGS "}";
  // (then refused as an unknown field, not for its depth)
  EXPECT_EQ(ParseChatRequest(at_limit).status().message().find("nest deeper"), std::string::npos)
      << ParseChatRequest(at_limit).status().ToString();
  const std::string over = R"({"model":"m","x":)" + std::string(128, '[') +
                           std::string(128, ']') + "," + MSGS "}";
  EXPECT_NE(ParseChatRequest(over).status().message().find("nest deeper"), std::string::npos);
}

// Regression: nlohmann's parse error quotes the token read so far, so an
// invalid byte at the end of a 7 MiB string echoed 7 MiB back to the client.
TEST(ParseRequest, ParseErrorMessageIsBounded) {
  const std::string body = R"({"model":"m","messages":[{"role":"user","content":")" +
                           std::string(1 << 20, 'a') + "\xff\"}]}";
  auto r = ParseChatRequest(body);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not valid JSON"), std::string::npos);
  EXPECT_LT(r.status().message().size(), 400u);
}

TEST(ParseRequest, NulAndEscapesInContentAreText) {
  auto r = ParseChatRequest(
      R"({"model":"m","messages":[{"role":"user","content":"a\u0000b"}]})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->messages[0].content, std::string("a\0b", 3));
  // A lone surrogate is not valid JSON text.
  EXPECT_FALSE(
      ParseChatRequest(R"({"model":"m","messages":[{"role":"user","content":"\ud800"}]})").ok());
}

TEST(ParseCompletionRequest, PromptForms) {
  auto a = ParseCompletionRequest(R"({"model":"m","prompt":"hello"})");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->prompt, "hello");
  EXPECT_FALSE(a->prompt_is_ids);
  auto b = ParseCompletionRequest(R"({"model":"m","prompt":["hello"],"echo":true})");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->prompt, "hello");
  EXPECT_TRUE(b->echo);
  auto c = ParseCompletionRequest(R"({"model":"m","prompt":[1,2,3]})");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->prompt_is_ids);
  EXPECT_EQ(c->prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  auto d = ParseCompletionRequest(R"({"model":"m","prompt":["a","b"]})");
  EXPECT_NE(d.status().message().find("exactly one string"), std::string::npos);
  auto e = ParseCompletionRequest(R"({"model":"m","prompt":{}})");
  EXPECT_NE(e.status().message().find("\"prompt\" must be"), std::string::npos);
  auto f = ParseCompletionRequest(R"({"model":"m"})");
  EXPECT_NE(f.status().message().find("\"prompt\" is required"), std::string::npos);
  auto g = ParseCompletionRequest(R"({"model":"m","prompt":[1,-2]})");
  EXPECT_NE(g.status().message().find("prompt[1]"), std::string::npos);
  auto h = ParseCompletionRequest(R"({"model":"m","prompt":"x","n":17})");
  EXPECT_NE(h.status().message().find("\"n\" must be an integer between 1 and 16"),
            std::string::npos);
}

TEST(ParseEmbeddingRequest, InputForms) {
  auto a = ParseEmbeddingRequest(R"({"model":"e","input":"one"})");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->input, std::vector<std::string>{"one"});
  EXPECT_FALSE(a->base64);
  auto b = ParseEmbeddingRequest(R"({"model":"e","input":["a","b"],"encoding_format":"base64"})");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->input.size(), 2u);
  EXPECT_TRUE(b->base64);
  EXPECT_FALSE(ParseEmbeddingRequest(R"({"model":"e","input":[]})").ok());
  EXPECT_NE(ParseEmbeddingRequest(R"({"model":"e","input":[1]})").status().message().find(
                "\"input[0]\" must be a string"),
            std::string::npos);
  EXPECT_NE(ParseEmbeddingRequest(R"({"model":"e","input":""})").status().message().find(
                "must not be empty"),
            std::string::npos);
  EXPECT_NE(ParseEmbeddingRequest(R"({"model":"e","input":"x","encoding_format":"int8"})")
                .status()
                .message()
                .find("encoding_format"),
            std::string::npos);
}

TEST(ResponseJson, ChatCompletionShape) {
  Choice c;
  c.text = "hello";
  c.finish = FinishReason::kLength;
  json j = json::parse(ChatCompletionJson("chatcmpl-1", 123, "m", {c}, Usage{5, 2, 1}));
  EXPECT_EQ(j["id"], "chatcmpl-1");
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["created"], 123);
  EXPECT_EQ(j["model"], "m");
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "hello");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(j["usage"]["completion_tokens"], 2);
  EXPECT_EQ(j["usage"]["total_tokens"], 7);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 1);
}

TEST(ResponseJson, ChunksAndUsage) {
  const std::string role = "assistant", text = "hi";
  ChunkDelta d;
  d.role = &role;
  json first = json::parse(ChatChunkJson("c", 1, "m", d, true));
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(first.contains("usage") && first["usage"].is_null());
  ChunkDelta end;
  end.finish = "stop";
  json last = json::parse(ChatChunkJson("c", 1, "m", end, false));
  EXPECT_TRUE(last["choices"][0]["delta"].empty());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  EXPECT_FALSE(last.contains("usage"));
  json usage = json::parse(UsageChunkJson("c", 1, "m", "chat.completion.chunk", Usage{3, 4, 0}));
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 7);
  json comp = json::parse(CompletionChunkJson("c", 1, "m", 0, text, nullptr, 0, "", false));
  EXPECT_EQ(comp["object"], "text_completion");
  EXPECT_EQ(comp["choices"][0]["text"], "hi");
  EXPECT_EQ(SseData("{}"), "data: {}\n\n");
}

TEST(ResponseJson, EmbeddingsFloatAndBase64) {
  std::vector<std::vector<float>> v = {{1.0f, 0.0f}, {0.5f, -0.5f}};
  json f = json::parse(EmbeddingsJson("e", v, false, 9));
  EXPECT_EQ(f["object"], "list");
  EXPECT_EQ(f["data"].size(), 2u);
  EXPECT_EQ(f["data"][1]["index"], 1);
  EXPECT_EQ(f["data"][1]["object"], "embedding");
  EXPECT_FLOAT_EQ(f["data"][1]["embedding"][1].get<float>(), -0.5f);
  EXPECT_EQ(f["usage"]["prompt_tokens"], 9);
  json b = json::parse(EmbeddingsJson("e", {{1.0f}}, true, 1));
  // 1.0f little-endian = 00 00 80 3f → "AACAPw==".
  EXPECT_EQ(b["data"][0]["embedding"], "AACAPw==");
}

TEST(ResponseJson, ErrorShapeAndIds) {
  json e = json::parse(ErrorJson("bad", "invalid_request_error", ""));
  EXPECT_EQ(e["error"]["message"], "bad");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_TRUE(e["error"]["code"].is_null());
  const std::string id = NewCompletionId("chatcmpl");
  EXPECT_EQ(id.rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(id.size(), std::string("chatcmpl-").size() + 24);
  EXPECT_NE(id, NewCompletionId("chatcmpl"));
}

// Query parameters (?since=, ?timeout_ms=): a 400 naming the parameter and
// the value.
TEST(FieldPolicy, QueryIntegersNameTheParameterAndValue) {
  using server_internal::ParseQueryInt;
  EXPECT_EQ(*ParseQueryInt("t", "0", 0, 10, "x"), 0);
  EXPECT_EQ(*ParseQueryInt("t", "10", 0, 10, "x"), 10);
  for (std::string_view bad : {"", "11", "-1", "1.5", " 1", "1 ", "+1", "0x1",
                               "99999999999999999999"}) {
    Result<int64_t> r = ParseQueryInt("timeout_ms", bad, 0, 10, "an integer in 0..10");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message(),
              fmt::format("\"timeout_ms\" must be an integer in 0..10 (got \"{}\")", bad));
  }
}

// Issue 15 point 1: every field is implemented, a documented no-op, or a
// 400 naming it.
TEST(FieldPolicy, UnknownAndUnsupportedFieldsAreNamed) {
  const std::string base = R"({"model":"m","messages":[{"role":"user","content":"hi"}])";
  auto chat_error = [&](const std::string& extra) {
    Result<ChatRequest> r = ParseChatRequest(base + "," + extra + "}");
    return r.ok() ? std::string("ok") : std::string(r.status().message());
  };
  EXPECT_NE(chat_error(R"("temprature":1)").find("unrecognized field \"temprature\""),
            std::string::npos);
  EXPECT_NE(chat_error(R"("presence_penalty":9)").find("presence_penalty"), std::string::npos);
  EXPECT_NE(chat_error(R"("frequency_penalty":-3)").find("frequency_penalty"), std::string::npos);
  EXPECT_NE(chat_error(R"("functions":[])").find("\"functions\" is not supported"),
            std::string::npos);
  EXPECT_NE(chat_error(R"("store":true)").find("\"store\""), std::string::npos);
  EXPECT_NE(chat_error(R"("reasoning_effort":"low")").find("reasoning_effort"), std::string::npos);
  EXPECT_NE(chat_error(R"("modalities":["text","audio"])").find("modalities"), std::string::npos);
  EXPECT_NE(chat_error(R"("top_logprobs":3)").find("requires \"logprobs\""), std::string::npos);
  EXPECT_NE(chat_error(R"("logprobs":true,"top_logprobs":21)").find("top_logprobs"),
            std::string::npos);
  EXPECT_NE(chat_error(R"("logit_bias":{"12":101})").find("logit_bias.12"), std::string::npos);
  EXPECT_NE(chat_error(R"("logit_bias":{"x":1})").find("logit_bias"), std::string::npos);
  EXPECT_NE(chat_error(R"("n":17)").find("\"n\""), std::string::npos);
  EXPECT_NE(chat_error(R"("stream_options":{"include_usage":true,"x":1})")
                .find("\"stream_options.x\""),
            std::string::npos);
  EXPECT_NE(chat_error(R"("response_format":{"type":"json_schema","json_schema":{"schema":{},"x":1}})")
                .find("response_format.json_schema.x"),
            std::string::npos);
  // Documented no-ops are accepted.
  EXPECT_EQ(chat_error(R"("user":"u","metadata":{"a":"b"},"safety_identifier":"s",)"
                       R"("service_tier":"auto","store":false,"modalities":["text"],)"
                       R"("parallel_tool_calls":true,"stream_options":{"include_obfuscation":false})"),
            "ok");
  Result<CompletionRequest> c = ParseCompletionRequest(R"({"model":"m","prompt":"x","best_of":3})");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("\"best_of\" is not supported"), std::string::npos);
  c = ParseCompletionRequest(R"({"model":"m","prompt":"x","suffix":"y"})");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("\"suffix\""), std::string::npos);
  EXPECT_TRUE(ParseCompletionRequest(R"({"model":"m","prompt":"x","best_of":1,"logprobs":5})").ok());
  EXPECT_FALSE(ParseCompletionRequest(R"({"model":"m","prompt":"x","logprobs":6})").ok());
  Result<EmbeddingRequest> e = ParseEmbeddingRequest(R"({"model":"m","input":"x","truncate":true})");
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("\"truncate\""), std::string::npos);
}

TEST(FieldPolicy, SamplingToolsAndFormatsAreParsed) {
  Result<ChatRequest> r = ParseChatRequest(R"({"model":"m","n":3,"seed":7,
    "messages":[{"role":"user","content":"hi"},
                {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function",
                  "function":{"name":"f","arguments":"{\"a\":1}"}}]},
                {"role":"tool","tool_call_id":"call_1","content":"42"}],
    "presence_penalty":0.5,"frequency_penalty":-0.5,"repetition_penalty":1.1,"min_p":0.05,
    "logit_bias":{"17":-100,"3":2.5},"logprobs":true,"top_logprobs":2,
    "response_format":{"type":"json_schema","json_schema":{"name":"x","strict":true,
      "schema":{"type":"object"}}},
    "tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],
    "tool_choice":{"type":"function","function":{"name":"f"}}})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->n, 3);
  EXPECT_TRUE(r->logprobs);
  EXPECT_EQ(r->top_logprobs, 2);
  const SamplingParams p = r->sampling.ToSamplingParams();
  EXPECT_FLOAT_EQ(p.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(p.frequency_penalty, -0.5f);
  EXPECT_FLOAT_EQ(p.repetition_penalty, 1.1f);
  EXPECT_FLOAT_EQ(p.min_p, 0.05f);
  ASSERT_EQ(p.logit_bias.size(), 2u);
  EXPECT_EQ(r->format.kind, OutputConstraintKind::kJsonSchema);
  EXPECT_EQ(r->format.text, R"({"type":"object"})");
  ASSERT_EQ(r->tools.tools.size(), 1u);
  EXPECT_EQ(r->tools.choice.mode, ToolChoice::Mode::kFunction);
  ASSERT_EQ(r->messages[1].tool_calls.size(), 1u);
  EXPECT_EQ(r->messages[1].tool_calls[0].arguments, R"({"a":1})");
  EXPECT_EQ(r->messages[2].tool_call_id, "call_1");
  // A named function that is not a tool; a bad name; grammar with response_format.
  EXPECT_FALSE(ParseChatRequest(R"({"model":"m","messages":[{"role":"user","content":"x"}],
    "tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}})")
                   .ok());
  EXPECT_FALSE(ParseChatRequest(R"({"model":"m","messages":[{"role":"user","content":"x"}],
    "tools":[{"type":"function","function":{"name":"bad name"}}]})")
                   .ok());
  EXPECT_FALSE(ParseChatRequest(R"({"model":"m","messages":[{"role":"user","content":"x"}],
    "grammar":"root ::= \"a\"","response_format":{"type":"json_object"}})")
                   .ok());
}

TEST(FieldPolicy, ResponsesRequest) {
  Result<ResponsesRequest> r = ParseResponsesRequest(R"({"model":"m","instructions":"be brief",
    "input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]},
             {"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},
             {"type":"function_call_output","call_id":"c1","output":"ok"}],
    "max_output_tokens":16,"tools":[{"type":"function","name":"f","parameters":{"type":"object"}}],
    "text":{"format":{"type":"json_object"}},"store":false})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->messages.size(), 4u);
  EXPECT_EQ(r->messages[0].role, "system");
  EXPECT_EQ(r->messages[2].tool_calls[0].id, "c1");
  EXPECT_EQ(r->messages[3].role, "tool");
  EXPECT_EQ(r->max_output_tokens, 16);
  EXPECT_EQ(r->format.kind, OutputConstraintKind::kJsonObject);
  for (const char* bad : {R"({"model":"m","input":"x","store":true})",
                          R"({"model":"m","input":"x","previous_response_id":"resp_1"})",
                          R"({"model":"m","input":"x","reasoning":{"effort":"low"}})",
                          R"({"model":"m","input":"x","background":true})"}) {
    EXPECT_FALSE(ParseResponsesRequest(bad).ok()) << bad;
  }
}

TEST(ResponseJson, LogprobsToolCallsAndChoices) {
  Choice a;
  a.text = "";
  a.tool_calls = {{"call_x", "f", R"({"a":1})"}};
  a.logprobs = true;
  a.tokens = {{"hi", -0.5f, {{"hi", -0.5f}, {"\xe2", -std::numeric_limits<float>::infinity()}}}};
  Choice b;
  b.text = "x";
  json j = json::parse(ChatCompletionJson("c", 1, "m", {a, b}, Usage{1, 2, 0}));
  ASSERT_EQ(j["choices"].size(), 2u);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_TRUE(j["choices"][0]["message"]["content"].is_null());
  EXPECT_EQ(j["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], R"({"a":1})");
  EXPECT_EQ(j["choices"][0]["message"]["tool_calls"][0]["type"], "function");
  const json& lp = j["choices"][0]["logprobs"]["content"][0];
  EXPECT_EQ(lp["token"], "hi");
  EXPECT_EQ(lp["bytes"], json::array({104, 105}));
  EXPECT_EQ(lp["top_logprobs"][1]["logprob"], -9999.0);  // a masked token
  EXPECT_EQ(lp["top_logprobs"][1]["bytes"], json::array({226}));
  EXPECT_EQ(j["choices"][1]["index"], 1);
  EXPECT_TRUE(j["choices"][1]["logprobs"].is_null());
  Choice c;
  c.text = "ab";
  c.logprobs = true;
  c.text_offset = 1;
  c.tokens = {{"b", -1.0f, {{"b", -1.0f}, {"c", -2.0f}}}};
  json comp = json::parse(CompletionJson("c", 1, "m", {c}, Usage{}));
  EXPECT_EQ(comp["choices"][0]["logprobs"]["tokens"][0], "b");
  // top_logprobs maps each alternative's text (not its JSON quoting) to its logprob
  EXPECT_EQ(comp["choices"][0]["logprobs"]["top_logprobs"][0]["c"], -2.0);
  EXPECT_EQ(comp["choices"][0]["logprobs"]["text_offset"][0], 1);
  EXPECT_EQ(NewToolCallId().rfind("call_", 0), 0u);
}

}  // namespace
}  // namespace arbiter
