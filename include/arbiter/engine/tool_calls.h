// arbiter/engine/tool_calls.h — function calling in a chat template
// family's own format (issue 15 point 4; docs/chat-templates.md "Tools").
//
// Two families have a tool format:
//   kChatML (Qwen 2.5 / Qwen 3): the tools are listed in the system message
//     inside <tools></tools> as JSON lines, and the model answers a call as
//       <tool_call>\n{"name": "<fn>", "arguments": {...}}\n</tool_call>
//     (several blocks for parallel calls). An assistant message's calls are
//     rendered the same way; a tool result is a user turn holding
//     <tool_response>\n...\n</tool_response> (consecutive results share one
//     turn).
//   kLlama3 (Llama 3.1 / 3.2 JSON tool calling): the tools are described in
//     the first user message, and the model answers one call as the JSON
//     object {"name": "<fn>", "parameters": {...}}; tool results are
//     "ipython" turns.
// Every other family has none: RenderToolMessages refuses tools for it.
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "arbiter/base/status.h"
#include "arbiter/engine/chat_template.h"

namespace arbiter {

// True for the families that have a tool format (kChatML, kLlama3).
bool HasToolFormat(ChatTemplateKind kind);

// `messages` rewritten as plain messages (role + content, no tool_calls or
// tool_call_id) that the family's template renders as its tool format:
// `tools` described where the family puts them, assistant calls and tool
// results in the family's shape. With no tools and no tool messages the
// messages come back unchanged. Errors: kInvalidArgument when the family
// has no tool format and there are tools or tool messages ("tools": the
// model's chat template family "<name>" has no tool-call format).
Result<std::vector<ChatMessage>> RenderToolMessages(ChatTemplateKind kind,
                                                    const std::vector<ChatMessage>& messages,
                                                    const std::vector<ToolDefinition>& tools);

// A model's output split into its text and the calls it made.
struct ParsedToolCalls {
  std::string content;          // the output outside the calls (trimmed)
  std::vector<ToolCall> calls;  // in order; ids empty (the caller assigns them)
};

// The calls in `output` in the family's format: each well-formed call (its
// JSON parses, "name" is one of `tools`, the arguments are an object)
// becomes a ToolCall with the arguments re-serialized compactly; anything
// else stays text. For a family without a tool format: all content.
ParsedToolCalls ParseToolCalls(ChatTemplateKind kind, std::string_view output,
                               const std::vector<ToolDefinition>& tools);

// The text a call starts with in the family's output ("<tool_call>" for
// ChatML, "{" for Llama-3): a streaming client is sent text only once the
// output can no longer begin a call. Empty for families without a format.
std::string_view ToolCallOpening(ChatTemplateKind kind);

// GBNF (arbiter/engine/grammar.h) for exactly one call of one of
// `functions` in the family's format, with `arguments_rules[i]` the GBNF
// rules of function i's arguments whose start rule is `arguments_names[i]`
// (JsonSchemaToGbnf(parameters, name)). Start rule "root".
// REQUIRES: HasToolFormat(kind); the three vectors have equal sizes ≥ 1.
std::string ToolCallGbnf(ChatTemplateKind kind, const std::vector<ToolDefinition>& functions,
                         const std::vector<std::string>& arguments_names,
                         const std::vector<std::string>& arguments_rules);

}  // namespace arbiter
