// The OpenAI request fields shared by the request parsers
// (openai_requests.cc): sampling, stop, streaming, n, response_format and
// grammar, tools, messages and the Responses API's input items, the cache
// extensions, and the documented no-ops (server/internal/openai_fields.h).
// Parsing policy: openai.h's file comment.
#include "server/internal/openai_fields.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

#include <fmt/format.h>

#include "arbiter/base/clip.h"

namespace arbiter::server_internal {
namespace {

using json = RequestJson;  // a request body (Note [One JSON reader])

// A tool call's `arguments` as a client sends them back: a string holding
// a JSON object, read by the bodies' reader (Note [One JSON reader]).
Status CheckArguments(const std::string& text, const std::string& field) {
  Result<json> args = ParseJson(text, fmt::format("\"{}\"", field));
  if (!args.ok()) return args.status();
  if (!args->is_object()) return TypeError(field, "a string holding a JSON object");
  return OkStatus();
}

}  // namespace

static constexpr size_t kMaxStopStrings = 4;

Status ParseSampling(const json& j, SamplingFields* s) {
  ARBITER_RETURN_IF_ERROR(GetNumber(j, "temperature", 0.0, 2.0, false, "between 0 and 2",
                                    &s->temperature));
  ARBITER_RETURN_IF_ERROR(GetNumber(j, "top_p", 0.0, 1.0, true, "in (0, 1]", &s->top_p));
  std::optional<int64_t> v;
  ARBITER_RETURN_IF_ERROR(GetInt(j, "top_k", 0, std::numeric_limits<int32_t>::max(), &v));
  if (v) s->top_k = static_cast<int>(*v);
  v.reset();
  ARBITER_RETURN_IF_ERROR(GetInt(j, "seed", std::numeric_limits<int64_t>::min(),
                                 std::numeric_limits<int64_t>::max(), &v));
  if (v) s->seed = *v;
  ARBITER_RETURN_IF_ERROR(GetNumber(j, "min_p", 0.0, 1.0, false, "between 0 and 1", &s->min_p));
  ARBITER_RETURN_IF_ERROR(GetNumber(j, "presence_penalty", -2.0, 2.0, false, "between -2 and 2",
                                    &s->presence_penalty));
  ARBITER_RETURN_IF_ERROR(GetNumber(j, "frequency_penalty", -2.0, 2.0, false, "between -2 and 2",
                                    &s->frequency_penalty));
  ARBITER_RETURN_IF_ERROR(GetNumber(j, "repetition_penalty", 0.0, 10.0, true, "in (0, 10]",
                                    &s->repetition_penalty));
  if (const json* lb = Field(j, "logit_bias")) {
    if (!lb->is_object()) return TypeError("logit_bias", "an object of token id → bias");
    if (lb->size() > 1024) {
      return InvalidArgumentError("\"logit_bias\" may hold at most 1024 tokens");
    }
    for (auto it = lb->begin(); it != lb->end(); ++it) {
      const std::string& key = it.key();
      char* end = nullptr;
      errno = 0;
      const long id = std::strtol(key.c_str(), &end, 10);
      if (key.empty() || *end != '\0' || errno != 0 || id < 0 ||
          id > std::numeric_limits<int32_t>::max()) {
        return InvalidArgumentError(
            fmt::format("\"logit_bias\" key \"{}\" must be a token id (a non-negative integer)",
                        ClipInput(key)));
      }
      if (!it.value().is_number() || !std::isfinite(it.value().get<double>()) ||
          it.value().get<double>() < -100 || it.value().get<double>() > 100) {
        return TypeError(fmt::format("logit_bias.{}", key), "a number between -100 and 100");
      }
      s->logit_bias.emplace_back(static_cast<int32_t>(id), it.value().get<float>());
    }
  }
  return OkStatus();
}

// "n": [1, kMaxChoices] choices.
static constexpr int kMaxChoices = 16;
Status ParseN(const json& j, int* n) {
  std::optional<int64_t> v;
  ARBITER_RETURN_IF_ERROR(GetInt(j, "n", 1, kMaxChoices, &v));
  if (v) *n = static_cast<int>(*v);
  return OkStatus();
}

// A JSON schema given as an object: its text for the grammar compiler.
Result<std::string> SchemaText(const json& schema, std::string_view field) {
  if (!schema.is_object()) return TypeError(field, "a JSON schema object");
  return DumpJson(schema);
}

// response_format {"type": "text" | "json_object" | "json_schema",
// "json_schema": {"name", "description", "schema", "strict"}} (chat,
// completions), and the `grammar` extension (GBNF text); at most one of them.
Status ParseOutputFormat(const json& j, OutputFormat* out) {
  if (const json* rf = Field(j, "response_format")) {
    if (!rf->is_object()) return TypeError("response_format", "an object with \"type\"");
    ARBITER_RETURN_IF_ERROR(CheckKnownFields(*rf, {"type", "json_schema"}, "response_format."));
    std::string type;
    ARBITER_RETURN_IF_ERROR(GetString(*rf, "type", true, &type));
    if (type == "json_object") {
      out->kind = OutputConstraintKind::kJsonObject;
    } else if (type == "json_schema") {
      const json* js = Field(*rf, "json_schema");
      if (js == nullptr || !js->is_object()) {
        return TypeError("response_format.json_schema", "an object with \"schema\"");
      }
      // name and description only label the schema; strict: arbiter always
      // enforces the schema during sampling.
      ARBITER_RETURN_IF_ERROR(CheckKnownFields(*js, {"name", "description", "schema", "strict"},
                                               "response_format.json_schema."));
      const json* schema = Field(*js, "schema");
      if (schema == nullptr) {
        return InvalidArgumentError("\"response_format.json_schema.schema\" is required");
      }
      ARBITER_ASSIGN_OR_RETURN(out->text,
                               SchemaText(*schema, "response_format.json_schema.schema"));
      out->kind = OutputConstraintKind::kJsonSchema;
    } else if (type != "text") {
      return InvalidArgumentError(fmt::format(
          "\"response_format.type\" must be \"text\", \"json_object\" or \"json_schema\" (got "
          "\"{}\")",
          ClipInput(type)));
    }
  }
  if (const json* g = Field(j, "grammar")) {
    if (!g->is_string() || g->get_ref<const std::string&>().empty()) {
      return TypeError("grammar", "a non-empty GBNF grammar string");
    }
    if (out->kind != OutputConstraintKind::kNone) {
      return InvalidArgumentError("give at most one of \"response_format\" and \"grammar\"");
    }
    out->kind = OutputConstraintKind::kGrammar;
    out->text = g->get<std::string>();
  }
  return OkStatus();
}

static bool ValidFunctionName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return false;
  }
  return true;
}

// One function definition: chat's {"type":"function","function":{...}}
// (flat = false) or the Responses API's {"type":"function","name",...}.
static Status ParseTool(const json& t, const std::string& path, bool flat, ToolDefinition* out) {
  if (!t.is_object()) return TypeError(path, "an object {\"type\": \"function\", ...}");
  std::string type;
  ARBITER_RETURN_IF_ERROR(GetString(t, "type", true, &type));
  if (type != "function") {
    return InvalidArgumentError(fmt::format(
        "\"{}.type\" is \"{}\": only \"function\" tools are supported", path, ClipInput(type)));
  }
  const json* fn = &t;
  std::string fpath = path;
  if (!flat) {
    ARBITER_RETURN_IF_ERROR(CheckKnownFields(t, {"type", "function"}, path + "."));
    fn = Field(t, "function");
    fpath = path + ".function";
    if (fn == nullptr || !fn->is_object()) return TypeError(fpath, "an object with \"name\"");
    ARBITER_RETURN_IF_ERROR(
        CheckKnownFields(*fn, {"name", "description", "parameters", "strict"}, fpath + "."));
  } else {
    ARBITER_RETURN_IF_ERROR(CheckKnownFields(
        *fn, {"type", "name", "description", "parameters", "strict"}, fpath + "."));
  }
  // strict: arbiter enforces the parameters' schema whenever it constrains a call.
  const json* name = Field(*fn, "name");
  if (name == nullptr || !name->is_string() || !ValidFunctionName(name->get<std::string>())) {
    return TypeError(fpath + ".name", "a function name matching ^[a-zA-Z0-9_-]{1,64}$");
  }
  out->name = name->get<std::string>();
  if (const json* d = Field(*fn, "description")) {
    if (!d->is_string()) return TypeError(fpath + ".description", "a string");
    out->description = d->get<std::string>();
  }
  if (const json* p = Field(*fn, "parameters")) {
    ARBITER_ASSIGN_OR_RETURN(out->parameters, SchemaText(*p, fpath + ".parameters"));
  }
  return OkStatus();
}

Status ParseToolChoice(const json& j, bool flat, const std::vector<ToolDefinition>& tools,
                       ToolChoice* choice) {
  if (const json* c = Field(j, "tool_choice")) {
    if (c->is_string()) {
      const std::string& mode = c->get_ref<const std::string&>();
      if (mode == "auto") {
        choice->mode = ToolChoice::Mode::kAuto;
      } else if (mode == "none") {
        choice->mode = ToolChoice::Mode::kNone;
      } else if (mode == "required") {
        choice->mode = ToolChoice::Mode::kRequired;
      } else {
        return InvalidArgumentError(fmt::format(
            "\"tool_choice\" must be \"auto\", \"none\", \"required\" or a named function (got "
            "\"{}\")",
            ClipInput(mode)));
      }
    } else if (c->is_object()) {
      const json* type = Field(*c, "type");
      if (type == nullptr || !type->is_string() || *type != "function") {
        return InvalidArgumentError(
            "\"tool_choice.type\" must be \"function\" (allowed_tools and custom tools are not "
            "supported)");
      }
      const json* name = flat ? Field(*c, "name") : nullptr;
      if (!flat) {
        const json* fn = Field(*c, "function");
        if (fn != nullptr && fn->is_object()) name = Field(*fn, "name");
      }
      if (name == nullptr || !name->is_string()) {
        return TypeError(flat ? "tool_choice.name" : "tool_choice.function.name", "a string");
      }
      choice->mode = ToolChoice::Mode::kFunction;
      choice->function = name->get<std::string>();
    } else {
      return TypeError("tool_choice", "a string or {\"type\": \"function\", ...}");
    }
  }
  if (choice->mode == ToolChoice::Mode::kFunction) {
    bool known = false;
    for (const ToolDefinition& t : tools) known = known || t.name == choice->function;
    if (!known) {
      return InvalidArgumentError(
          fmt::format("\"tool_choice\" names the function \"{}\", which is not in \"tools\"",
                      ClipInput(choice->function)));
    }
  }
  if (choice->mode == ToolChoice::Mode::kRequired && tools.empty()) {
    return InvalidArgumentError("\"tool_choice\": \"required\" needs \"tools\"");
  }
  return OkStatus();
}

// tools, tool_choice, parallel_tool_calls.
Status ParseTools(const json& j, bool flat, ToolFields* out) {
  if (const json* tools = Field(j, "tools")) {
    if (!tools->is_array()) return TypeError("tools", "an array of function tools");
    if (tools->size() > 128) return InvalidArgumentError("\"tools\" may hold at most 128 tools");
    for (size_t i = 0; i < tools->size(); ++i) {
      ToolDefinition t;
      ARBITER_RETURN_IF_ERROR(ParseTool((*tools)[i], fmt::format("tools[{}]", i), flat, &t));
      for (const ToolDefinition& other : out->tools) {
        if (other.name == t.name) {
          return InvalidArgumentError(
              fmt::format("\"tools[{}].name\": \"{}\" is defined twice", i, t.name));
        }
      }
      out->tools.push_back(std::move(t));
    }
  }
  ARBITER_RETURN_IF_ERROR(ParseToolChoice(j, flat, out->tools, &out->choice));
  ARBITER_RETURN_IF_ERROR(GetBool(j, "parallel_tool_calls", &out->parallel));
  return OkStatus();
}

// A message's tool_calls: [{"id", "type": "function", "function": {"name", "arguments"}}].
static Status ParseToolCallsField(const json& calls, const std::string& path, std::vector<ToolCall>* out) {
  if (!calls.is_array()) return TypeError(path, "an array of tool calls");
  for (size_t i = 0; i < calls.size(); ++i) {
    const json& c = calls[i];
    const std::string cpath = fmt::format("{}[{}]", path, i);
    if (!c.is_object()) return TypeError(cpath, "an object");
    ARBITER_RETURN_IF_ERROR(CheckKnownFields(c, {"id", "type", "function"}, cpath + "."));
    ToolCall call;
    ARBITER_RETURN_IF_ERROR(GetString(c, "id", false, &call.id));
    if (const json* type = Field(c, "type"); type != nullptr && *type != "function") {
      return TypeError(cpath + ".type", "\"function\"");
    }
    const json* fn = Field(c, "function");
    if (fn == nullptr || !fn->is_object()) return TypeError(cpath + ".function", "an object");
    ARBITER_RETURN_IF_ERROR(CheckKnownFields(*fn, {"name", "arguments"}, cpath + ".function."));
    const json* name = Field(*fn, "name");
    if (name == nullptr || !name->is_string()) {
      return TypeError(cpath + ".function.name", "a string");
    }
    call.name = name->get<std::string>();
    ARBITER_RETURN_IF_ERROR(
        GetString(*fn, "arguments", true, &call.arguments, cpath + ".function.arguments"));
    ARBITER_RETURN_IF_ERROR(CheckArguments(call.arguments, cpath + ".function.arguments"));
    out->push_back(std::move(call));
  }
  return OkStatus();
}

Status ParseMaxTokens(const json& j, std::optional<int>* out) {
  std::optional<int64_t> v;
  // max_completion_tokens (newer name) wins over max_tokens when both are set.
  ARBITER_RETURN_IF_ERROR(GetInt(j, "max_tokens", 1, std::numeric_limits<int32_t>::max(), &v));
  ARBITER_RETURN_IF_ERROR(
      GetInt(j, "max_completion_tokens", 1, std::numeric_limits<int32_t>::max(), &v));
  if (v) *out = static_cast<int>(*v);
  return OkStatus();
}

Status ParseStop(const json& j, std::vector<std::string>* out) {
  const json* f = Field(j, "stop");
  if (f == nullptr) return OkStatus();
  if (f->is_string()) {
    if (!f->get_ref<const std::string&>().empty()) out->push_back(f->get<std::string>());
    return OkStatus();
  }
  if (!f->is_array()) return TypeError("stop", "a string or an array of strings");
  if (f->size() > kMaxStopStrings) {
    return InvalidArgumentError(
        fmt::format("\"stop\" may hold at most {} strings (got {})", kMaxStopStrings, f->size()));
  }
  for (size_t i = 0; i < f->size(); ++i) {
    if (!(*f)[i].is_string()) return TypeError(fmt::format("stop[{}]", i), "a string");
    if (!(*f)[i].get_ref<const std::string&>().empty()) out->push_back((*f)[i].get<std::string>());
  }
  return OkStatus();
}

Status ParseStreamFields(const json& j, bool* stream, bool* include_usage) {
  ARBITER_RETURN_IF_ERROR(GetBool(j, "stream", stream));
  const json* so = Field(j, "stream_options");
  if (so != nullptr) {
    if (!so->is_object()) return TypeError("stream_options", "an object");
    // include_obfuscation pads chunks against side channels on OpenAI's
    // network; it cannot change the result: a no-op.
    ARBITER_RETURN_IF_ERROR(
        CheckKnownFields(*so, {"include_usage", "include_obfuscation"}, "stream_options."));
    const json* iu = Field(*so, "include_usage");
    if (iu != nullptr) {
      if (!iu->is_boolean()) return TypeError("stream_options.include_usage", "a boolean");
      *include_usage = iu->get<bool>();
    }
  }
  return OkStatus();
}

// A message's content: a string, or an array of parts. Text parts are
// concatenated; with `images` (chat requests), image_url parts are recorded
// at their place in the text (a byte offset), else refused.
static Status ParseContent(const json& c, const std::string& path, size_t message, std::string* out,
                    std::vector<ChatImagePart>* images) {
  if (c.is_string()) {
    *out = c.get<std::string>();
    return OkStatus();
  }
  if (c.is_null()) return OkStatus();
  if (!c.is_array()) return TypeError(path, "a string or an array of text parts");
  for (size_t i = 0; i < c.size(); ++i) {
    const json& part = c[i];
    const std::string ppath = fmt::format("{}[{}]", path, i);
    if (!part.is_object()) return TypeError(ppath, "an object {\"type\":\"text\",\"text\":...}");
    const json* type = Field(part, "type");
    if (type == nullptr || !type->is_string()) return TypeError(ppath + ".type", "a string");
    const std::string& kind = type->get_ref<const std::string&>();
    if (kind == "image_url" && images != nullptr) {
      ARBITER_RETURN_IF_ERROR(CheckKnownFields(part, {"type", "image_url"}, ppath + "."));
      const json* image = Field(part, "image_url");
      const json* url = image != nullptr && image->is_object() ? Field(*image, "url") : image;
      if (url == nullptr || !url->is_string()) {
        return TypeError(ppath + ".image_url", "an object {\"url\": \"data:image/png;base64,...\"}");
      }
      if (image->is_object()) {
        ARBITER_RETURN_IF_ERROR(
            CheckKnownFields(*image, {"url", "detail"}, ppath + ".image_url."));
        if (const json* detail = Field(*image, "detail");
            detail != nullptr && !(detail->is_string() && (*detail == "auto" || *detail == "low" ||
                                                          *detail == "high"))) {
          return TypeError(ppath + ".image_url.detail", "one of \"auto\", \"low\", \"high\"");
        }
      }
      images->push_back({message, out->size(), url->get<std::string>(), ppath + ".image_url"});
      continue;
    }
    if (kind != "text") {
      return InvalidArgumentError(
          fmt::format("\"{}.type\" is \"{}\": only \"text\"{} content parts are supported", ppath,
                      ClipInput(kind), images != nullptr ? " and \"image_url\"" : ""));
    }
    ARBITER_RETURN_IF_ERROR(CheckKnownFields(part, {"type", "text"}, ppath + "."));
    const json* text = Field(part, "text");
    if (text == nullptr || !text->is_string()) return TypeError(ppath + ".text", "a string");
    *out += text->get<std::string>();
  }
  return OkStatus();
}

// A Responses API content: a string, or parts input_text / output_text
// (text) and input_image (an image_url data: URL).
static Status ParseResponsesContent(const json& c, const std::string& path, size_t message,
                             std::string* out, std::vector<ChatImagePart>* images) {
  if (c.is_string()) {
    *out = c.get<std::string>();
    return OkStatus();
  }
  if (!c.is_array()) return TypeError(path, "a string or an array of input_text parts");
  for (size_t i = 0; i < c.size(); ++i) {
    const json& part = c[i];
    const std::string ppath = fmt::format("{}[{}]", path, i);
    if (!part.is_object()) return TypeError(ppath, "an object {\"type\":\"input_text\",...}");
    std::string kind;
    ARBITER_RETURN_IF_ERROR(GetString(part, "type", true, &kind));
    if (kind == "input_image") {
      ARBITER_RETURN_IF_ERROR(
          CheckKnownFields(part, {"type", "image_url", "detail", "file_id"}, ppath + "."));
      ARBITER_RETURN_IF_ERROR(RejectField(part, "file_id", "arbiter stores no files; send the "
                                                           "image as a data: URL in image_url"));
      const json* url = Field(part, "image_url");
      if (url == nullptr || !url->is_string()) {
        return TypeError(ppath + ".image_url", "a data: URL string");
      }
      images->push_back({message, out->size(), url->get<std::string>(), ppath + ".image_url"});
      continue;
    }
    if (kind != "input_text" && kind != "output_text") {
      return InvalidArgumentError(fmt::format(
          "\"{}.type\" is \"{}\": only \"input_text\", \"output_text\" and \"input_image\" parts "
          "are supported",
          ppath, ClipInput(kind)));
    }
    // annotations and logprobs of an earlier output_text: no-ops.
    ARBITER_RETURN_IF_ERROR(
        CheckKnownFields(part, {"type", "text", "annotations", "logprobs"}, ppath + "."));
    std::string text;
    ARBITER_RETURN_IF_ERROR(GetString(part, "text", true, &text));
    *out += text;
  }
  return OkStatus();
}

// The Responses API's input items: messages, function_call and
// function_call_output.
Status ParseResponsesInput(const json& in, std::vector<ChatMessage>* out,
                           std::vector<ChatImagePart>* images) {
  if (in.is_string()) {
    out->push_back({"user", in.get<std::string>()});
    return OkStatus();
  }
  if (!in.is_array() || in.empty()) {
    return TypeError("input", "a string or a non-empty array of input items");
  }
  for (size_t i = 0; i < in.size(); ++i) {
    const json& item = in[i];
    const std::string path = fmt::format("input[{}]", i);
    if (!item.is_object()) return TypeError(path, "an object");
    std::string type;
    ARBITER_RETURN_IF_ERROR(GetString(item, "type", false, &type));
    if (type == "function_call") {
      ARBITER_RETURN_IF_ERROR(CheckKnownFields(
          item, {"type", "id", "call_id", "name", "arguments", "status"}, path + "."));
      ToolCall call;
      ARBITER_RETURN_IF_ERROR(GetString(item, "call_id", true, &call.id));
      ARBITER_RETURN_IF_ERROR(GetString(item, "name", true, &call.name));
      ARBITER_RETURN_IF_ERROR(
          GetString(item, "arguments", true, &call.arguments, path + ".arguments"));
      ARBITER_RETURN_IF_ERROR(CheckArguments(call.arguments, path + ".arguments"));
      // Consecutive calls belong to one assistant turn.
      if (out->empty() || out->back().role != "assistant" || out->back().tool_calls.empty()) {
        out->push_back({"assistant", ""});
      }
      out->back().tool_calls.push_back(std::move(call));
      continue;
    }
    if (type == "function_call_output") {
      ARBITER_RETURN_IF_ERROR(
          CheckKnownFields(item, {"type", "id", "call_id", "output", "status"}, path + "."));
      ChatMessage m{"tool", ""};
      ARBITER_RETURN_IF_ERROR(GetString(item, "call_id", true, &m.tool_call_id));
      ARBITER_RETURN_IF_ERROR(GetString(item, "output", true, &m.content));
      out->push_back(std::move(m));
      continue;
    }
    if (!type.empty() && type != "message") {
      return InvalidArgumentError(fmt::format(
          "\"{}.type\" is \"{}\": only message, function_call and function_call_output items "
          "are supported",
          path, ClipInput(type)));
    }
    ARBITER_RETURN_IF_ERROR(
        CheckKnownFields(item, {"type", "role", "content", "id", "status"}, path + "."));
    ChatMessage m;
    ARBITER_RETURN_IF_ERROR(GetString(item, "role", true, &m.role));
    if (m.role == "developer") m.role = "system";
    if (m.role != "system" && m.role != "user" && m.role != "assistant") {
      return InvalidArgumentError(
          fmt::format("\"{}.role\" must be one of user, assistant, system, developer (got \"{}\")",
                      path, ClipInput(m.role)));
    }
    const json* content = Field(item, "content");
    if (content == nullptr) return InvalidArgumentError(fmt::format("\"{}.content\" is required", path));
    ARBITER_RETURN_IF_ERROR(
        ParseResponsesContent(*content, path + ".content", out->size(), &m.content, images));
    out->push_back(std::move(m));
  }
  return OkStatus();
}

Status ParseMessages(const json& j, std::vector<ChatMessage>* out,
                     std::vector<ChatImagePart>* images) {
  const json* m = Field(j, "messages");
  if (m == nullptr) return InvalidArgumentError("\"messages\" is required");
  if (!m->is_array()) return TypeError("messages", "an array");
  if (m->empty()) return InvalidArgumentError("\"messages\" must not be empty");
  for (size_t i = 0; i < m->size(); ++i) {
    const json& msg = (*m)[i];
    const std::string path = fmt::format("messages[{}]", i);
    if (!msg.is_object()) return TypeError(path, "an object");
    const json* role = Field(msg, "role");
    if (role == nullptr) return InvalidArgumentError(fmt::format("\"{}.role\" is required", path));
    if (!role->is_string()) return TypeError(path + ".role", "a string");
    ChatMessage cm;
    cm.role = role->get<std::string>();
    if (cm.role == "developer") cm.role = "system";
    if (cm.role != "system" && cm.role != "user" && cm.role != "assistant" && cm.role != "tool") {
      return InvalidArgumentError(fmt::format(
          "\"{}.role\" must be one of system, developer, user, assistant, tool (got \"{}\")", path,
          ClipInput(cm.role)));
    }
    // name: a participant label the chat templates have no place for (a
    // no-op); refusal: an assistant's earlier refusal text (a no-op).
    ARBITER_RETURN_IF_ERROR(CheckKnownFields(
        msg, {"role", "content", "name", "tool_calls", "tool_call_id", "refusal", "audio",
              "function_call"},
        path + "."));
    ARBITER_RETURN_IF_ERROR(RejectField(msg, "audio", "audio output is not supported"));
    ARBITER_RETURN_IF_ERROR(
        RejectField(msg, "function_call", "the deprecated functions API; use \"tool_calls\""));
    auto content = msg.find("content");
    if (content != msg.end()) {
      ARBITER_RETURN_IF_ERROR(
          ParseContent(*content, path + ".content", out->size(), &cm.content, images));
    } else if (cm.role != "assistant") {
      return InvalidArgumentError(fmt::format("\"{}.content\" is required", path));
    }
    if (const json* calls = Field(msg, "tool_calls")) {
      if (cm.role != "assistant") {
        return InvalidArgumentError(
            fmt::format("\"{}.tool_calls\" is only allowed on assistant messages", path));
      }
      ARBITER_RETURN_IF_ERROR(ParseToolCallsField(*calls, path + ".tool_calls", &cm.tool_calls));
    }
    // A tool result answers one call: without its id the template cannot
    // pair them.
    ARBITER_RETURN_IF_ERROR(GetString(msg, "tool_call_id", cm.role == "tool", &cm.tool_call_id,
                                      path + ".tool_call_id"));
    if (cm.role != "tool" && !cm.tool_call_id.empty()) {
      return InvalidArgumentError(
          fmt::format("\"{}.tool_call_id\" is only allowed on tool messages", path));
    }
    out->push_back(std::move(cm));
  }
  return OkStatus();
}

// prompt_cache_key, conversation_id (≤ kMaxCacheIdBytes each), cache_ttl.
Status ParseCacheFields(const json& j, CacheFields* c) {
  ARBITER_RETURN_IF_ERROR(GetString(j, "prompt_cache_key", false, &c->prompt_cache_key));
  ARBITER_RETURN_IF_ERROR(GetString(j, "conversation_id", false, &c->conversation_id));
  ARBITER_RETURN_IF_ERROR(GetString(j, "cache_ttl", false, &c->cache_ttl));
  for (const auto& [name, value] : {std::pair<const char*, const std::string*>{
                                        "prompt_cache_key", &c->prompt_cache_key},
                                    {"conversation_id", &c->conversation_id}}) {
    if (value->size() > kMaxCacheIdBytes) {
      return InvalidArgumentError(fmt::format("\"{}\" is {} bytes; at most {} are accepted", name,
                                              value->size(), kMaxCacheIdBytes));
    }
  }
  if (!c->cache_ttl.empty() && c->cache_ttl != "short" && c->cache_ttl != "long" &&
      c->cache_ttl != "extended") {
    return InvalidArgumentError("\"cache_ttl\" must be \"short\", \"long\" or \"extended\"");
  }
  return OkStatus();
}

// The documented no-ops' types (they cannot change the result, but a
// wrong type is still a 400): user, metadata, safety_identifier,
// service_tier, prompt_cache_retention; store must be false.
Status CheckNoOps(const json& j) {
  std::string ignored;
  for (const char* key : {"safety_identifier", "service_tier", "prompt_cache_retention"}) {
    ARBITER_RETURN_IF_ERROR(GetString(j, key, false, &ignored));
  }
  if (const json* m = Field(j, "metadata"); m != nullptr && !m->is_object()) {
    return TypeError("metadata", "an object of strings");
  }
  bool store = false;
  ARBITER_RETURN_IF_ERROR(GetBool(j, "store", &store));
  if (store) {
    return InvalidArgumentError("\"store\": true is not supported: arbiter keeps no responses "
                                "(omit it or send false)");
  }
  return OkStatus();
}

}  // namespace arbiter::server_internal
