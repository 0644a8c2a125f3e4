// Tool calling in a family's format (arbiter/engine/tool_calls.h).
//
// The prompts follow the families' reference templates: Qwen 2.5 / 3's
// "# Tools" system block with <tools> JSON lines and <tool_call> answers,
// and Llama 3.1's JSON tool calling with the functions in the first user
// message. The tool JSON is written with ", " and ": " separators, as the
// templates' `tojson` writes it, so a real Qwen or Llama checkpoint sees the
// text it was trained on.
#include "arbiter/engine/tool_calls.h"

#include <nlohmann/json.hpp>

namespace arbiter {
namespace {

using json = nlohmann::ordered_json;  // keys in the order written, as the templates print them

// JSON text with Python json.dumps's default separators (", " and ": ").
std::string PyJson(const json& j) {
  switch (j.type()) {
    case json::value_t::object: {
      std::string out = "{";
      bool first = true;
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (!first) out += ", ";
        first = false;
        out += json(it.key()).dump(-1, ' ', false, json::error_handler_t::replace);
        out += ": ";
        out += PyJson(it.value());
      }
      return out + "}";
    }
    case json::value_t::array: {
      std::string out = "[";
      for (size_t i = 0; i < j.size(); ++i) {
        if (i > 0) out += ", ";
        out += PyJson(j[i]);
      }
      return out + "]";
    }
    default:
      return j.dump(-1, ' ', false, json::error_handler_t::replace);
  }
}

// The arguments / parameters JSON text as an object (invalid text → {}).
json ObjectOf(std::string_view text) {
  if (text.empty()) return json::object();
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  return j.is_object() ? j : json::object();
}

json ToolJson(const ToolDefinition& t) {
  json fn = json::object();
  fn["name"] = t.name;
  if (!t.description.empty()) fn["description"] = t.description;
  fn["parameters"] = t.parameters.empty() ? json::object() : ObjectOf(t.parameters);
  json out = json::object();
  out["type"] = "function";
  out["function"] = std::move(fn);
  return out;
}

std::string_view Trim(std::string_view s) {
  const char* ws = " \t\n\r";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

bool HasToolMessages(const std::vector<ChatMessage>& messages) {
  for (const ChatMessage& m : messages) {
    if (!m.tool_calls.empty() || m.role == "tool") return true;
  }
  return false;
}

// {"name": n, "<args_key>": args} with the arguments' own JSON text.
std::string CallText(const ToolCall& c, std::string_view args_key) {
  return "{\"name\": " + json(c.name).dump(-1, ' ', false, json::error_handler_t::replace) +
         ", \"" + std::string(args_key) + "\": " + PyJson(ObjectOf(c.arguments)) + "}";
}

std::vector<ChatMessage> QwenMessages(const std::vector<ChatMessage>& messages,
                                      const std::vector<ToolDefinition>& tools) {
  std::vector<ChatMessage> out;
  size_t first = 0;
  if (!tools.empty()) {
    std::string system;
    if (!messages.empty() && messages[0].role == "system") {
      system = messages[0].content + "\n\n";
      first = 1;
    }
    system +=
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
    for (const ToolDefinition& t : tools) system += "\n" + PyJson(ToolJson(t));
    system +=
        "\n</tools>\n\nFor each function call, return a json object with function name and "
        "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
        "<function-name>, \"arguments\": <args-json-object>}\n</tool_call>";
    out.push_back({"system", std::move(system)});
  }
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "tool") {
      std::string block = "<tool_response>\n" + m.content + "\n</tool_response>";
      const bool joins = i > first && messages[i - 1].role == "tool";
      if (joins) {
        out.back().content += "\n" + block;
      } else {
        out.push_back({"user", std::move(block)});
      }
      continue;
    }
    ChatMessage plain{m.role, m.content};
    for (size_t k = 0; k < m.tool_calls.size(); ++k) {
      if (!plain.content.empty() || k > 0) plain.content += "\n";
      plain.content += "<tool_call>\n" + CallText(m.tool_calls[k], "arguments") + "\n</tool_call>";
    }
    out.push_back(std::move(plain));
  }
  return out;
}

std::vector<ChatMessage> Llama3Messages(const std::vector<ChatMessage>& messages,
                                        const std::vector<ToolDefinition>& tools) {
  std::vector<ChatMessage> out;
  bool described = tools.empty();
  for (const ChatMessage& m : messages) {
    if (m.role == "tool") {
      out.push_back({"ipython", m.content});
      continue;
    }
    ChatMessage plain{m.role, m.content};
    if (!m.tool_calls.empty()) {
      // Llama 3.1 answers one call per turn; several are written one per line.
      plain.content.clear();
      for (size_t k = 0; k < m.tool_calls.size(); ++k) {
        if (k > 0) plain.content += "\n";
        plain.content += CallText(m.tool_calls[k], "parameters");
      }
    }
    if (!described && m.role == "user") {
      std::string intro =
          "Given the following functions, please respond with a JSON for a function call with "
          "its proper arguments that best answers the given prompt.\n\nRespond in the format "
          "{\"name\": function name, \"parameters\": dictionary of argument name and its "
          "value}. Do not use variables.\n\n";
      for (const ToolDefinition& t : tools) intro += PyJson(ToolJson(t)) + "\n\n";
      plain.content = intro + plain.content;
      described = true;
    }
    out.push_back(std::move(plain));
  }
  return out;
}

// One call's JSON object, if it names one of `tools` and its arguments (under
// `args_key`, or "arguments") are an object.
bool CallOf(std::string_view text, std::string_view args_key,
            const std::vector<ToolDefinition>& tools, ToolCall* call) {
  json j = json::parse(Trim(text), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return false;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string()) return false;
  auto args = j.find(std::string(args_key));
  if (args == j.end()) args = j.find("arguments");
  if (args != j.end() && args->is_string()) {
    // Some models write the arguments as a JSON string.
    json inner = json::parse(args->get<std::string>(), nullptr, false);
    if (!inner.is_object()) return false;
    call->arguments = inner.dump();
  } else if (args == j.end() || args->is_object()) {
    call->arguments = args == j.end() ? "{}" : args->dump();
  } else {
    return false;
  }
  call->name = name->get<std::string>();
  for (const ToolDefinition& t : tools) {
    if (t.name == call->name) return true;
  }
  return false;
}

std::string GbnfLiteral(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default: out += c;
    }
  }
  return out + "\"";
}

}  // namespace

bool HasToolFormat(ChatTemplateKind kind) {
  return kind == ChatTemplateKind::kChatML || kind == ChatTemplateKind::kLlama3;
}

Result<std::vector<ChatMessage>> RenderToolMessages(ChatTemplateKind kind,
                                                    const std::vector<ChatMessage>& messages,
                                                    const std::vector<ToolDefinition>& tools) {
  if (tools.empty() && !HasToolMessages(messages)) return messages;
  switch (kind) {
    case ChatTemplateKind::kChatML: return QwenMessages(messages, tools);
    case ChatTemplateKind::kLlama3: return Llama3Messages(messages, tools);
    default:
      return InvalidArgumentError(
          std::string(tools.empty() ? "\"messages\"" : "\"tools\"") +
          ": the model's chat template family \"" + std::string(ChatTemplateName(kind)) +
          "\" has no tool-call format (tools work with the chatml (Qwen) and llama3 families)");
  }
}

ParsedToolCalls ParseToolCalls(ChatTemplateKind kind, std::string_view output,
                               const std::vector<ToolDefinition>& tools) {
  ParsedToolCalls out;
  if (kind == ChatTemplateKind::kChatML) {
    constexpr std::string_view kOpen = "<tool_call>", kClose = "</tool_call>";
    std::string text;
    size_t pos = 0;
    while (true) {
      const size_t open = output.find(kOpen, pos);
      if (open == std::string_view::npos) break;
      const size_t close = output.find(kClose, open + kOpen.size());
      if (close == std::string_view::npos) break;
      ToolCall call;
      if (!CallOf(output.substr(open + kOpen.size(), close - open - kOpen.size()), "arguments",
                  tools, &call)) {
        break;  // not a call: the rest stays text
      }
      text += output.substr(pos, open - pos);
      out.calls.push_back(std::move(call));
      pos = close + kClose.size();
    }
    text += output.substr(pos);
    out.content = std::string(Trim(text));
    return out;
  }
  if (kind == ChatTemplateKind::kLlama3) {
    const std::string_view t = Trim(output);
    if (!t.empty() && t.front() == '{') {
      // One call per line (as rendered), or one object.
      std::vector<ToolCall> calls;
      size_t pos = 0;
      bool all = true;
      while (pos < t.size()) {
        size_t nl = t.find('\n', pos);
        if (nl == std::string_view::npos) nl = t.size();
        ToolCall call;
        if (!CallOf(t.substr(pos, nl - pos), "parameters", tools, &call)) {
          all = false;
          break;
        }
        calls.push_back(std::move(call));
        pos = nl + 1;
      }
      if (!all) {
        calls.clear();
        ToolCall call;
        if (CallOf(t, "parameters", tools, &call)) calls.push_back(std::move(call));
      }
      if (!calls.empty()) {
        out.calls = std::move(calls);
        return out;
      }
    }
  }
  out.content = std::string(Trim(output));
  return out;
}

std::string_view ToolCallOpening(ChatTemplateKind kind) {
  switch (kind) {
    case ChatTemplateKind::kChatML: return "<tool_call>";
    case ChatTemplateKind::kLlama3: return "{";
    default: return "";
  }
}

std::string ToolCallGbnf(ChatTemplateKind kind, const std::vector<ToolDefinition>& functions,
                         const std::vector<std::string>& arguments_names,
                         const std::vector<std::string>& arguments_rules) {
  const bool qwen = kind == ChatTemplateKind::kChatML;
  std::string g = qwen ? "root ::= \"<tool_call>\\n\" tool-call \"\\n</tool_call>\"\n"
                       : "root ::= tool-call\n";
  g += "tool-call ::= ";
  for (size_t i = 0; i < functions.size(); ++i) {
    if (i > 0) g += " | ";
    g += "tool-call-" + std::to_string(i);
  }
  g += "\n";
  for (size_t i = 0; i < functions.size(); ++i) {
    g += "tool-call-" + std::to_string(i) + " ::= " +
         GbnfLiteral("{\"name\": " + json(functions[i].name).dump() + ", \"" +
                     (qwen ? "arguments" : "parameters") + "\": ") +
         " " + arguments_names[i] + " \"}\"\n";
    g += arguments_rules[i];
    if (!arguments_rules[i].empty() && arguments_rules[i].back() != '\n') g += "\n";
  }
  return g;
}

}  // namespace arbiter
