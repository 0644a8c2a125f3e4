// See ollama.h. The tables of fields below are the ones docs/http-api.md
// "Ollama compatibility" lists; keep them in step.
//
// Note [Ollama options]
// Every key of Ollama's `options` is one of three kinds:
//   implemented  temperature, top_p, top_k, min_p, seed, num_predict, stop,
//                repeat_penalty (→ repetition_penalty), presence_penalty,
//                frequency_penalty;
//   no-op        keys that choose how or where the computation runs, never
//                what it computes: num_thread, num_gpu, main_gpu, use_mmap,
//                use_mlock, numa, num_batch, low_vram, f16_kv, vocab_only,
//                and num_keep (it only matters when a context is shifted,
//                which arbiter never does: it stops at the context's end);
//   conditional  a value that switches the feature off is a no-op, any other
//                a 400: mirostat 0 (with any mirostat_tau / mirostat_eta),
//                tfs_z 1, typical_p 1, penalize_newline false,
//                repeat_last_n -1 (our repetition penalty covers the whole
//                prompt and output; 0 is accepted when no penalty is set),
//                num_ctx equal to the model's context (checked by the route).
// Anything else is a 400 naming the key.
#include "server/internal/ollama.h"

#include <cmath>
#include <cstdio>
#include <ctime>
#include <limits>
#include <set>

#include <fmt/format.h>

#include "arbiter/base/clip.h"
#include "server/internal/json_fields.h"
#include "server/internal/openai_fields.h"

namespace arbiter::server_internal {
namespace {

using json = RequestJson;  // a request body (Note [One JSON reader])

Status Bad(std::string message) { return InvalidArgumentError(std::move(message)); }

// The shared field getters (json_fields.h), naming the field `name`.
Status Number(const json& obj, const char* key, std::string_view name, double lo, double hi,
              bool lo_open, std::optional<double>* out) {
  return GetNumber(obj, key, lo, hi, lo_open,
                   fmt::format("in {}{}, {}]", lo_open ? "(" : "[", lo, hi), out, name);
}

Status Integer(const json& obj, const char* key, std::string_view name, int64_t lo, int64_t hi,
               std::optional<int64_t>* out) {
  return GetInt(obj, key, lo, hi, out, name);
}

// 400 for the first key of `obj` not in `known`.
Status OnlyKnown(const json& obj, const std::set<std::string, std::less<>>& known,
                 std::string_view prefix, std::string_view where) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (known.count(it.key()) == 0) {
      return Bad(
          fmt::format("\"{}{}\" is not supported by {}", prefix, ClipInput(it.key()), where));
    }
  }
  return OkStatus();
}

// Note [Ollama options].
Status ParseOptions(const json& body, OllamaTextRequest* r) {
  const json* o = Field(body, "options");
  if (o == nullptr) return OkStatus();
  if (!o->is_object()) return TypeError("options", "an object");
  static const std::set<std::string, std::less<>> kImplemented = {
      "temperature", "top_p", "top_k", "min_p", "seed", "num_predict", "stop", "repeat_penalty",
      "presence_penalty", "frequency_penalty"};
  static const std::set<std::string, std::less<>> kNoOp = {
      "num_thread", "num_gpu", "main_gpu", "use_mmap", "use_mlock", "numa",
      "num_batch",  "low_vram", "f16_kv",  "vocab_only", "num_keep"};
  static const std::set<std::string, std::less<>> kConditional = {
      "mirostat", "mirostat_tau", "mirostat_eta", "tfs_z", "typical_p", "penalize_newline",
      "repeat_last_n", "num_ctx"};
  for (auto it = o->begin(); it != o->end(); ++it) {
    const std::string& k = it.key();
    if (kImplemented.count(k) == 0 && kNoOp.count(k) == 0 && kConditional.count(k) == 0) {
      return Bad(fmt::format("\"options.{}\" is not supported", ClipInput(k)));
    }
  }
  SamplingParams& s = r->text.sampling;
  std::optional<double> d;
  std::optional<int64_t> i;
  // The number options: range, destination, and (penalties) the value
  // that turns it off.
  struct FloatOption {
    const char* key;
    double lo, hi;
    bool lo_open;
    float* dst;
    std::optional<double> penalty_off;
  };
  const FloatOption kFloats[] = {
      {"temperature", 0, 100, false, &s.temperature, std::nullopt},
      {"top_p", 0, 1, true, &s.top_p, std::nullopt},
      {"min_p", 0, 1, false, &s.min_p, std::nullopt},
      {"repeat_penalty", 0, 100, true, &s.repetition_penalty, 1.0},
      {"presence_penalty", -2, 2, false, &s.presence_penalty, 0.0},
      {"frequency_penalty", -2, 2, false, &s.frequency_penalty, 0.0},
  };
  bool any_penalty = false;
  for (const FloatOption& f : kFloats) {
    d.reset();
    ARBITER_RETURN_IF_ERROR(
        Number(*o, f.key, fmt::format("options.{}", f.key), f.lo, f.hi, f.lo_open, &d));
    if (!d) continue;
    *f.dst = static_cast<float>(*d);
    any_penalty |= f.penalty_off && *d != *f.penalty_off;
  }
  d.reset();
  ARBITER_RETURN_IF_ERROR(Integer(*o, "top_k", "options.top_k", 0, 1 << 30, &i));
  if (i) s.top_k = static_cast<int>(*i);
  i.reset();
  ARBITER_RETURN_IF_ERROR(Integer(*o, "seed", "options.seed", std::numeric_limits<int64_t>::min(),
                                  std::numeric_limits<int64_t>::max(), &i));
  if (i && *i >= 0) {  // negative: random, as llama.cpp's -1
    s.has_seed = true;
    s.seed = static_cast<uint64_t>(*i);
  }
  i.reset();
  ARBITER_RETURN_IF_ERROR(Integer(*o, "num_predict", "options.num_predict", -2, 1 << 30, &i));
  if (i) {
    if (*i == 0) return Bad("\"options.num_predict\" must be ≥ 1, -1 (no limit) or -2 (fill the context)");
    if (*i > 0) r->text.max_tokens = static_cast<int>(*i);  // -1, -2: the rest of the context
  }
  i.reset();
  if (const json* stop = Field(*o, "stop")) {
    if (stop->is_string()) {
      r->text.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (size_t k = 0; k < stop->size(); ++k) {
        if (!(*stop)[k].is_string() || (*stop)[k].get<std::string>().empty()) {
          return TypeError(fmt::format("options.stop[{}]", k), "a non-empty string");
        }
        r->text.stop.push_back((*stop)[k].get<std::string>());
      }
    } else {
      return TypeError("options.stop", "an array of strings");
    }
  }
  // Conditional keys: the value that turns the feature off, else a 400.
  ARBITER_RETURN_IF_ERROR(Integer(*o, "mirostat", "options.mirostat", 0, 2, &i));
  if (i && *i != 0) return Bad("\"options.mirostat\" is not supported (only 0, off)");
  i.reset();
  ARBITER_RETURN_IF_ERROR(Number(*o, "mirostat_tau", "options.mirostat_tau", 0, 1e9, false, &d));
  d.reset();
  ARBITER_RETURN_IF_ERROR(Number(*o, "mirostat_eta", "options.mirostat_eta", 0, 1e9, false, &d));
  d.reset();
  ARBITER_RETURN_IF_ERROR(Number(*o, "tfs_z", "options.tfs_z", 0, 1e9, false, &d));
  if (d && *d != 1.0) return Bad("\"options.tfs_z\" is not supported (only 1, off)");
  d.reset();
  ARBITER_RETURN_IF_ERROR(Number(*o, "typical_p", "options.typical_p", 0, 1e9, false, &d));
  if (d && *d != 1.0) return Bad("\"options.typical_p\" is not supported (only 1, off)");
  d.reset();
  bool penalize_newline = false;
  ARBITER_RETURN_IF_ERROR(GetBool(*o, "penalize_newline", &penalize_newline, "options.penalize_newline"));
  if (penalize_newline) return Bad("\"options.penalize_newline\" is not supported (only false)");
  ARBITER_RETURN_IF_ERROR(Integer(*o, "repeat_last_n", "options.repeat_last_n", -1, 1 << 30, &i));
  if (i && *i != -1 && !(*i == 0 && !any_penalty)) {
    return Bad(fmt::format(
        "\"options.repeat_last_n\" = {} is not supported: the penalties cover the whole prompt "
        "and output (-1){}",
        *i, *i == 0 ? "; 0 is accepted only without a penalty" : ""));
  }
  i.reset();
  ARBITER_RETURN_IF_ERROR(Integer(*o, "num_ctx", "options.num_ctx", 1, 1 << 30, &r->num_ctx));
  // The no-ops are type-checked only loosely: they are not read.
  return OkStatus();
}

Status ParseFormat(const json& body, TextRequest* t) {
  const json* f = Field(body, "format");
  if (f == nullptr) return OkStatus();
  if (f->is_string()) {
    const std::string s = f->get<std::string>();
    if (s.empty()) return OkStatus();
    if (s == "json") {
      t->constraint = OutputConstraintKind::kJsonObject;
      return OkStatus();
    }
    return Bad(fmt::format("\"format\" must be \"json\" or a JSON schema object (got \"{}\")",
                           ClipInput(s)));
  }
  if (f->is_object()) {
    t->constraint = OutputConstraintKind::kJsonSchema;
    t->constraint_text = f->dump();
    return OkStatus();
  }
  return TypeError("format", "\"json\" or a JSON schema object");
}

Status ParseKeepAliveField(const json& body, std::optional<OllamaKeepAlive>* out) {
  const json* f = Field(body, "keep_alive");
  if (f == nullptr) return OkStatus();
  ARBITER_ASSIGN_OR_RETURN(OllamaKeepAlive k, ParseKeepAlive(*f));
  *out = k;
  return OkStatus();
}

Status ParseModel(const json& body, std::string* model) {
  std::string m;
  ARBITER_RETURN_IF_ERROR(GetString(body, "model", true, &m));
  *model = OllamaStripTag(m);
  return OkStatus();
}

// `images`: base64 strings, attached to message `message` at its start.
Status ParseImages(const json& images, std::string_view field, size_t message,
                   std::vector<ChatImagePart>* out) {
  if (!images.is_array()) return TypeError(field, "an array of base64 strings");
  for (size_t k = 0; k < images.size(); ++k) {
    const std::string name = fmt::format("{}[{}]", field, k);
    if (!images[k].is_string() || images[k].get<std::string>().empty()) {
      return TypeError(name, "a non-empty base64 string");
    }
    ChatImagePart p;
    p.message = message;
    p.offset = 0;
    p.url = "data:;base64," + images[k].get<std::string>();
    p.field = name;
    out->push_back(std::move(p));
  }
  return OkStatus();
}

Status ParseTools(const json& body, TextRequest* t) {
  const json* tools = Field(body, "tools");
  if (tools == nullptr) return OkStatus();
  if (!tools->is_array()) return TypeError("tools", "an array of functions");
  for (size_t k = 0; k < tools->size(); ++k) {
    const json& tool = (*tools)[k];
    const std::string name = fmt::format("tools[{}]", k);
    if (!tool.is_object()) return TypeError(name, "an object");
    ARBITER_RETURN_IF_ERROR(OnlyKnown(tool, {"type", "function"}, name + ".", "/api/chat"));
    std::string type = "function";
    ARBITER_RETURN_IF_ERROR(GetString(tool, "type", false, &type, name + ".type"));
    if (type != "function") return TypeError(name + ".type", "\"function\"");
    const json* fn = Field(tool, "function");
    if (fn == nullptr || !fn->is_object()) return TypeError(name + ".function", "an object");
    ARBITER_RETURN_IF_ERROR(
        OnlyKnown(*fn, {"name", "description", "parameters"}, name + ".function.", "/api/chat"));
    ToolDefinition d;
    ARBITER_RETURN_IF_ERROR(GetString(*fn, "name", false, &d.name, name + ".function.name"));
    if (d.name.empty()) return Bad(fmt::format("\"{}.function.name\" is required", name));
    ARBITER_RETURN_IF_ERROR(GetString(*fn, "description", false, &d.description, name + ".function.description"));
    if (const json* p = Field(*fn, "parameters")) {
      if (!p->is_object()) return TypeError(name + ".function.parameters", "a JSON schema object");
      d.parameters = p->dump();
    }
    t->tools.push_back(std::move(d));
  }
  return OkStatus();
}

Status ParseToolCalls(const json& calls, std::string_view field, ChatMessage* m) {
  if (!calls.is_array()) return TypeError(field, "an array");
  for (size_t k = 0; k < calls.size(); ++k) {
    const std::string name = fmt::format("{}[{}]", field, k);
    const json& c = calls[k];
    if (!c.is_object()) return TypeError(name, "an object");
    ARBITER_RETURN_IF_ERROR(OnlyKnown(c, {"id", "type", "function"}, name + ".", "/api/chat"));
    const json* fn = Field(c, "function");
    if (fn == nullptr || !fn->is_object()) return TypeError(name + ".function", "an object");
    ARBITER_RETURN_IF_ERROR(
        OnlyKnown(*fn, {"index", "name", "arguments"}, name + ".function.", "/api/chat"));
    ToolCall call;
    ARBITER_RETURN_IF_ERROR(GetString(c, "id", false, &call.id, name + ".id"));
    ARBITER_RETURN_IF_ERROR(GetString(*fn, "name", false, &call.name, name + ".function.name"));
    if (call.name.empty()) return Bad(fmt::format("\"{}.function.name\" is required", name));
    const json* args = Field(*fn, "arguments");
    if (args == nullptr) {
      call.arguments = "{}";
    } else if (args->is_object()) {
      call.arguments = args->dump();
    } else {
      return TypeError(name + ".function.arguments", "an object");
    }
    if (call.id.empty()) call.id = fmt::format("call_{}", k);
    m->tool_calls.push_back(std::move(call));
  }
  return OkStatus();
}

Status ParseMessages(const json& body, OllamaTextRequest* r) {
  const json* msgs = Field(body, "messages");
  if (msgs == nullptr) return OkStatus();
  if (!msgs->is_array()) return TypeError("messages", "an array");
  for (size_t k = 0; k < msgs->size(); ++k) {
    const json& m = (*msgs)[k];
    const std::string name = fmt::format("messages[{}]", k);
    if (!m.is_object()) return TypeError(name, "an object");
    ARBITER_RETURN_IF_ERROR(OnlyKnown(
        m, {"role", "content", "images", "tool_calls", "tool_name", "thinking"}, name + ".",
        "/api/chat"));
    ChatMessage msg;
    ARBITER_RETURN_IF_ERROR(GetString(m, "role", false, &msg.role, name + ".role"));
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" &&
        msg.role != "tool") {
      return TypeError(name + ".role", "\"system\", \"user\", \"assistant\" or \"tool\"");
    }
    ARBITER_RETURN_IF_ERROR(GetString(m, "content", false, &msg.content, name + ".content"));
    std::string thinking;
    ARBITER_RETURN_IF_ERROR(GetString(m, "thinking", false, &thinking, name + ".thinking"));
    if (!thinking.empty()) {
      return Bad(fmt::format("\"{}.thinking\" is not supported (no thinking models)", name));
    }
    // tool_name: Qwen's <tool_response> format does not name the function;
    // accepted and type-checked only.
    std::string tool_name;
    ARBITER_RETURN_IF_ERROR(GetString(m, "tool_name", false, &tool_name, name + ".tool_name"));
    if (const json* calls = Field(m, "tool_calls")) {
      if (msg.role != "assistant") {
        return Bad(fmt::format("\"{}.tool_calls\" is only allowed on assistant messages", name));
      }
      ARBITER_RETURN_IF_ERROR(ParseToolCalls(*calls, name + ".tool_calls", &msg));
    }
    if (const json* images = Field(m, "images")) {
      ARBITER_RETURN_IF_ERROR(ParseImages(*images, name + ".images", k, &r->images));
    }
    r->text.messages.push_back(std::move(msg));
  }
  return OkStatus();
}

// `think`: false is a no-op (no thinking models); true → 400.
Status ParseThink(const json& body) {
  const json* f = Field(body, "think");
  if (f == nullptr) return OkStatus();
  if (f->is_boolean() && !f->get<bool>()) return OkStatus();
  if (f->is_boolean() || f->is_string()) {
    return Bad("\"think\" is not supported: no configured model is a thinking model");
  }
  return TypeError("think", "a boolean");
}

Result<OllamaTextRequest> ParseChatImpl(std::string_view body) {
  ARBITER_ASSIGN_OR_RETURN(json j, ParseBody(body));
  ARBITER_RETURN_IF_ERROR(OnlyKnown(j,
                                    {"model", "messages", "tools", "tool_choice", "format",
                                     "options", "stream", "keep_alive", "think"},
                                    "", "/api/chat"));
  OllamaTextRequest r;
  r.text.chat = true;
  ARBITER_RETURN_IF_ERROR(ParseModel(j, &r.text.model));
  ARBITER_RETURN_IF_ERROR(ParseMessages(j, &r));
  ARBITER_RETURN_IF_ERROR(ParseTools(j, &r.text));
  // Extension: OpenAI's tool_choice (Ollama has none), so a call can be
  // forced here too (Note [Forced tool calls]).
  ARBITER_RETURN_IF_ERROR(ParseToolChoice(j, /*flat=*/false, r.text.tools, &r.text.tool_choice));
  ARBITER_RETURN_IF_ERROR(ParseFormat(j, &r.text));
  ARBITER_RETURN_IF_ERROR(ParseOptions(j, &r));
  ARBITER_RETURN_IF_ERROR(GetBool(j, "stream", &r.stream));
  ARBITER_RETURN_IF_ERROR(ParseKeepAliveField(j, &r.keep_alive));
  ARBITER_RETURN_IF_ERROR(ParseThink(j));
  r.load_only = r.text.messages.empty();
  return r;
}

Result<OllamaTextRequest> ParseGenerateImpl(std::string_view body) {
  ARBITER_ASSIGN_OR_RETURN(json j, ParseBody(body));
  ARBITER_RETURN_IF_ERROR(OnlyKnown(j,
                                    {"model", "prompt", "suffix", "system", "template", "context",
                                     "stream", "raw", "format", "images", "options", "keep_alive",
                                     "think"},
                                    "", "/api/generate"));
  OllamaTextRequest r;
  ARBITER_RETURN_IF_ERROR(ParseModel(j, &r.text.model));
  std::string prompt, suffix, system, tmpl;
  ARBITER_RETURN_IF_ERROR(GetString(j, "prompt", false, &prompt, "prompt"));
  ARBITER_RETURN_IF_ERROR(GetString(j, "suffix", false, &suffix, "suffix"));
  if (!suffix.empty()) return Bad("\"suffix\" is not supported (no fill-in-the-middle models)");
  ARBITER_RETURN_IF_ERROR(GetString(j, "system", false, &system, "system"));
  ARBITER_RETURN_IF_ERROR(GetString(j, "template", false, &tmpl, "template"));
  if (!tmpl.empty()) {
    return Bad("\"template\" is not supported: the model's own chat template is used (or send "
               "\"raw\": true with a formatted prompt)");
  }
  if (const json* c = Field(j, "context")) {
    if (!c->is_array()) return TypeError("context", "an array of token ids");
    if (!c->empty()) return Bad("\"context\" is not supported (deprecated by Ollama; send the "
                                "conversation to /api/chat)");
  }
  bool raw = false;
  ARBITER_RETURN_IF_ERROR(GetBool(j, "raw", &raw));
  ARBITER_RETURN_IF_ERROR(GetBool(j, "stream", &r.stream));
  ARBITER_RETURN_IF_ERROR(ParseFormat(j, &r.text));
  ARBITER_RETURN_IF_ERROR(ParseOptions(j, &r));
  ARBITER_RETURN_IF_ERROR(ParseKeepAliveField(j, &r.keep_alive));
  ARBITER_RETURN_IF_ERROR(ParseThink(j));
  r.load_only = prompt.empty();
  if (raw) {
    if (!system.empty()) return Bad("\"system\" cannot be used with \"raw\": true");
    if (Field(j, "images") != nullptr) return Bad("\"images\" cannot be used with \"raw\": true");
    r.text.chat = false;
    r.text.prompt = std::move(prompt);
    return r;
  }
  // Not raw: the prompt goes through the model's chat template as one user
  // turn (after the system message), as Ollama's default template does.
  r.text.chat = true;
  if (!system.empty()) r.text.messages.push_back(ChatMessage{"system", std::move(system), {}, {}});
  const size_t user = r.text.messages.size();
  r.text.messages.push_back(ChatMessage{"user", std::move(prompt), {}, {}});
  if (const json* images = Field(j, "images")) {
    ARBITER_RETURN_IF_ERROR(ParseImages(*images, "images", user, &r.images));
  }
  return r;
}

}  // namespace

Result<OllamaTextRequest> ParseOllamaChat(std::string_view body) {
  return Guard([&] { return ParseChatImpl(body); });
}

Result<OllamaTextRequest> ParseOllamaGenerate(std::string_view body) {
  return Guard([&] { return ParseGenerateImpl(body); });
}

Result<OllamaEmbedRequest> ParseOllamaEmbed(std::string_view body, bool legacy) {
  return Guard([&]() -> Result<OllamaEmbedRequest> {
    ARBITER_ASSIGN_OR_RETURN(json j, ParseBody(body));
    const char* where = legacy ? "/api/embeddings" : "/api/embed";
    if (legacy) {
      ARBITER_RETURN_IF_ERROR(OnlyKnown(j, {"model", "prompt", "options", "keep_alive"}, "", where));
    } else {
      ARBITER_RETURN_IF_ERROR(OnlyKnown(
          j, {"model", "input", "truncate", "dimensions", "options", "keep_alive"}, "", where));
    }
    OllamaEmbedRequest r;
    ARBITER_RETURN_IF_ERROR(ParseModel(j, &r.embed.model));
    if (legacy) {
      std::string prompt;
      ARBITER_RETURN_IF_ERROR(GetString(j, "prompt", true, &prompt));
      r.embed.inputs.push_back(std::move(prompt));
    } else {
      const json* in = Field(j, "input");
      if (in == nullptr) return Bad("\"input\" is required");
      if (in->is_string()) {
        r.embed.inputs.push_back(in->get<std::string>());
      } else if (in->is_array() && !in->empty()) {
        for (size_t k = 0; k < in->size(); ++k) {
          if (!(*in)[k].is_string()) return TypeError(fmt::format("input[{}]", k), "a string");
          r.embed.inputs.push_back((*in)[k].get<std::string>());
        }
      } else {
        return TypeError("input", "a string or a non-empty array of strings");
      }
      for (size_t k = 0; k < r.embed.inputs.size(); ++k) {
        if (r.embed.inputs[k].empty()) {
          return Bad(fmt::format("\"input[{}]\" must not be empty", k));
        }
      }
      // truncate (default true): accepted; an input longer than the
      // context is a 400 rather than truncated (docs/http-api.md).
      bool truncate = true;
      ARBITER_RETURN_IF_ERROR(GetBool(j, "truncate", &truncate));
      std::optional<int64_t> dims;
      ARBITER_RETURN_IF_ERROR(Integer(j, "dimensions", "dimensions", 1, 1 << 20, &dims));
      if (dims) r.embed.dimensions = static_cast<int>(*dims);
    }
    // options: only the run-placement no-ops and num_ctx apply to embeddings.
    if (const json* o = Field(j, "options")) {
      if (!o->is_object()) return TypeError("options", "an object");
      OllamaTextRequest scratch;
      ARBITER_RETURN_IF_ERROR(ParseOptions(j, &scratch));
      for (auto it = o->begin(); it != o->end(); ++it) {
        static const std::set<std::string, std::less<>> kEmbedOk = {
            "num_thread", "num_gpu", "main_gpu", "use_mmap", "use_mlock", "numa",
            "num_batch",  "low_vram", "f16_kv",  "vocab_only", "num_keep", "num_ctx"};
        if (kEmbedOk.count(it.key()) == 0 && !it->is_null()) {
          return Bad(
              fmt::format("\"options.{}\" does not apply to embeddings", ClipInput(it.key())));
        }
      }
      r.num_ctx = scratch.num_ctx;
    }
    ARBITER_RETURN_IF_ERROR(ParseKeepAliveField(j, &r.keep_alive));
    return r;
  });
}

Result<std::string> ParseOllamaShow(std::string_view body) {
  return Guard([&]() -> Result<std::string> {
    ARBITER_ASSIGN_OR_RETURN(json j, ParseBody(body));
    ARBITER_RETURN_IF_ERROR(OnlyKnown(j, {"model", "name", "verbose", "system", "template",
                                          "options"},
                                      "", "/api/show"));
    for (const char* k : {"system", "template", "options"}) {
      if (Field(j, k) != nullptr) return Bad(fmt::format("\"{}\" is not supported by /api/show", k));
    }
    std::string model, name;
    ARBITER_RETURN_IF_ERROR(GetString(j, "model", false, &model, "model"));
    ARBITER_RETURN_IF_ERROR(GetString(j, "name", false, &name, "name"));
    bool verbose = false;  // no-op: model_info has no per-tensor detail to add
    ARBITER_RETURN_IF_ERROR(GetBool(j, "verbose", &verbose));
    if (model.empty()) model = name;
    if (model.empty()) return Bad("\"model\" is required");
    return OllamaStripTag(model);
  });
}

}  // namespace arbiter::server_internal
