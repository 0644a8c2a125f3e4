#include "arbiter/engine/tool_calls.h"

#include <gtest/gtest.h>

namespace arbiter {
namespace {

std::vector<ToolDefinition> Weather() {
  return {{"get_weather", "weather of a city",
           R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})"}};
}

TEST(ToolCallsTest, QwenListsToolsInTheSystemTurnAndRendersCallsAndResults) {
  std::vector<ChatMessage> m = {{"system", "Be brief."}, {"user", "weather in Paris?"}};
  ChatMessage call{"assistant", ""};
  call.tool_calls = {{"call_1", "get_weather", R"({"city":"Paris"})"}};
  m.push_back(call);
  ChatMessage result{"tool", "18C"};
  result.tool_call_id = "call_1";
  m.push_back(result);
  m.push_back({"tool", "sunny"});
  Result<std::vector<ChatMessage>> r = RenderToolMessages(ChatTemplateKind::kChatML, m, Weather());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 4u);  // the two results share one user turn
  EXPECT_EQ((*r)[0].role, "system");
  EXPECT_EQ((*r)[0].content.rfind("Be brief.\n\n# Tools\n", 0), 0u);
  EXPECT_NE((*r)[0].content.find(
                "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
                "\"description\": \"weather of a city\", \"parameters\": {\"type\": \"object\", "
                "\"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}\n"
                "</tools>"),
            std::string::npos)
      << (*r)[0].content;
  EXPECT_EQ((*r)[2].content,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
            "</tool_call>");
  EXPECT_EQ((*r)[3].role, "user");
  EXPECT_EQ((*r)[3].content,
            "<tool_response>\n18C\n</tool_response>\n<tool_response>\nsunny\n</tool_response>");
  for (const ChatMessage& p : *r) EXPECT_TRUE(p.tool_calls.empty());
}

TEST(ToolCallsTest, NoToolsNoChange) {
  std::vector<ChatMessage> m = {{"user", "hi"}};
  Result<std::vector<ChatMessage>> r = RenderToolMessages(ChatTemplateKind::kGemma, m, {});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)[0].content, "hi");
}

TEST(ToolCallsTest, FamiliesWithoutAFormatRefuseTools) {
  Result<std::vector<ChatMessage>> r =
      RenderToolMessages(ChatTemplateKind::kGemma, {{"user", "hi"}}, Weather());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("\"tools\""), std::string::npos);
  EXPECT_NE(r.status().message().find("gemma"), std::string::npos);
  EXPECT_FALSE(HasToolFormat(ChatTemplateKind::kMistral));
}

TEST(ToolCallsTest, Llama3DescribesToolsInTheFirstUserTurn) {
  std::vector<ChatMessage> m = {{"system", "sys"}, {"user", "weather?"}};
  ChatMessage call{"assistant", ""};
  call.tool_calls = {{"c", "get_weather", R"({"city":"Oslo"})"}};
  m.push_back(call);
  m.push_back({"tool", "cold"});
  Result<std::vector<ChatMessage>> r = RenderToolMessages(ChatTemplateKind::kLlama3, m, Weather());
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->size(), 4u);
  EXPECT_EQ((*r)[0].content, "sys");
  EXPECT_EQ((*r)[1].content.rfind("Given the following functions", 0), 0u);
  EXPECT_NE((*r)[1].content.find("\"name\": \"get_weather\""), std::string::npos);
  EXPECT_EQ((*r)[1].content.substr((*r)[1].content.size() - 8), "weather?");
  EXPECT_EQ((*r)[2].content, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}");
  EXPECT_EQ((*r)[3].role, "ipython");
}

TEST(ToolCallsTest, ParsesQwenCallsAndKeepsTheRestAsText) {
  ParsedToolCalls p = ParseToolCalls(
      ChatTemplateKind::kChatML,
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\"}}\n</tool_call>\n<tool_call>{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":"
      "\\\"Rome\\\"}\"}</tool_call>",
      Weather());
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, "{\"city\":\"Paris\"}");
  EXPECT_EQ(p.calls[1].arguments, "{\"city\":\"Rome\"}");  // arguments given as a string
  EXPECT_EQ(p.content, "Let me check.");
  // Unknown function, bad JSON, unclosed block: text.
  for (const char* text : {"<tool_call>{\"name\":\"nope\",\"arguments\":{}}</tool_call>",
                           "<tool_call>{oops</tool_call>", "<tool_call>{\"name\":\"get_weather\""}) {
    ParsedToolCalls q = ParseToolCalls(ChatTemplateKind::kChatML, text, Weather());
    EXPECT_TRUE(q.calls.empty()) << text;
    EXPECT_EQ(q.content, text);
  }
}

TEST(ToolCallsTest, ParsesLlama3Calls) {
  ParsedToolCalls p = ParseToolCalls(
      ChatTemplateKind::kLlama3, " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}",
      Weather());
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].arguments, "{\"city\":\"Oslo\"}");
  EXPECT_TRUE(p.content.empty());
  EXPECT_TRUE(ParseToolCalls(ChatTemplateKind::kLlama3, "{not json", Weather()).calls.empty());
}

TEST(ToolCallsTest, GbnfForOneCall) {
  const std::string g = ToolCallGbnf(ChatTemplateKind::kChatML, Weather(), {"args0"},
                                     {"args0 ::= \"{}\"\n"});
  EXPECT_NE(g.find("root ::= \"<tool_call>\\n\" tool-call \"\\n</tool_call>\""), std::string::npos)
      << g;
  EXPECT_NE(g.find("tool-call-0 ::= \"{\\\"name\\\": \\\"get_weather\\\", \\\"arguments\\\": \" "
                   "args0 \"}\""),
            std::string::npos)
      << g;
  EXPECT_NE(g.find("args0 ::= \"{}\""), std::string::npos);
}

}  // namespace
}  // namespace arbiter
