// OpenAI wire format: request parsing into native structs, response JSON.
//
// Parsing policy: `null` is absent; unknown fields are ignored; a present
// field with the wrong JSON type or an out-of-range value is a 400 whose
// message names the field with its path (messages[2].content[0].text). Every
// nlohmann exception is caught here; nothing escapes to the routes.
#include "arbiter/server/openai.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "arbiter/base/mutex.h"

namespace arbiter {
namespace {

using json = nlohmann::json;

constexpr size_t kMaxStopStrings = 4;

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// Deepest JSON nesting accepted in a request body. OpenAI requests nest ~6
// levels (messages[i].content[j].text); tool schemas, which we ignore, a few
// more. Without a bound an 8 MiB body of `[` builds 8M nested arrays
// (~0.5 GiB per request) before nlohmann reports the missing `]`.
constexpr int kMaxJsonDepth = 128;
// Longest parse-error text echoed to the client: nlohmann's message quotes
// the token read so far ("last read: '...'"), which can be the whole body.
constexpr size_t kMaxParseErrorChars = 256;

// True when `body` opens more than kMaxJsonDepth arrays/objects at once.
// Tracks strings (and escapes in them) so brackets inside strings do not
// count. On malformed input it agrees with a JSON lexer up to the first
// error, which is as far as the parser reads, so it never rejects a body the
// parser would accept within the bound.
bool NestsTooDeep(std::string_view body) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (const char c : body) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

Result<json> ParseBody(std::string_view body) {
  if (NestsTooDeep(body)) {
    return InvalidArgumentError(fmt::format(
        "request body is not valid JSON: arrays and objects nest deeper than {} levels",
        kMaxJsonDepth));
  }
  json j;
  try {
    j = json::parse(body.begin(), body.end());
  } catch (const json::exception& e) {
    std::string what = e.what();
    if (what.size() > kMaxParseErrorChars) {
      what.resize(kMaxParseErrorChars);
      what += "...";
    }
    return InvalidArgumentError(fmt::format("request body is not valid JSON: {}", what));
  }
  if (!j.is_object()) return InvalidArgumentError("request body must be a JSON object");
  return j;
}

// Looks up `key`; nullptr when absent or null.
const json* Field(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

Status TypeError(std::string_view field, std::string_view what) {
  return InvalidArgumentError(fmt::format("\"{}\" must be {}", field, what));
}

Status GetString(const json& obj, const char* key, bool required, std::string* out) {
  const json* f = Field(obj, key);
  if (f == nullptr) {
    if (required) return InvalidArgumentError(fmt::format("\"{}\" is required", key));
    return OkStatus();
  }
  if (!f->is_string()) return TypeError(key, "a string");
  *out = f->get<std::string>();
  if (required && out->empty()) {
    return InvalidArgumentError(fmt::format("\"{}\" must not be empty", key));
  }
  return OkStatus();
}

Status GetBool(const json& obj, const char* key, bool* out) {
  const json* f = Field(obj, key);
  if (f == nullptr) return OkStatus();
  if (!f->is_boolean()) return TypeError(key, "a boolean");
  *out = f->get<bool>();
  return OkStatus();
}

// An integer (a float with an integral value is accepted) in [lo, hi].
Status GetInt(const json& obj, const char* key, int64_t lo, int64_t hi, std::string_view what,
              std::optional<int64_t>* out) {
  const json* f = Field(obj, key);
  if (f == nullptr) return OkStatus();
  int64_t v = 0;
  if (f->is_number_unsigned()) {
    uint64_t u = f->get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return TypeError(key, what);
    v = static_cast<int64_t>(u);
  } else if (f->is_number_integer()) {
    v = f->get<int64_t>();
  } else if (f->is_number_float()) {
    double d = f->get<double>();
    if (!std::isfinite(d) || std::floor(d) != d || std::fabs(d) > 9e18) return TypeError(key, what);
    v = static_cast<int64_t>(d);
  } else {
    return TypeError(key, what);
  }
  if (v < lo || v > hi) return TypeError(key, what);
  *out = v;
  return OkStatus();
}

Status GetNumber(const json& obj, const char* key, double lo, double hi, bool lo_open,
                 std::string_view range, std::optional<double>* out) {
  const json* f = Field(obj, key);
  if (f == nullptr) return OkStatus();
  if (!f->is_number()) return TypeError(key, "a number");
  double v = f->get<double>();
  if (!std::isfinite(v) || v > hi || v < lo || (lo_open && v == lo)) {
    return InvalidArgumentError(fmt::format("\"{}\" must be {} (got {})", key, range, v));
  }
  *out = v;
  return OkStatus();
}

Status ParseSampling(const json& j, SamplingFields* s) {
  ARBITER_RETURN_IF_ERROR(GetNumber(j, "temperature", 0.0, 2.0, false, "between 0 and 2",
                                    &s->temperature));
  ARBITER_RETURN_IF_ERROR(GetNumber(j, "top_p", 0.0, 1.0, true, "in (0, 1]", &s->top_p));
  std::optional<int64_t> v;
  ARBITER_RETURN_IF_ERROR(GetInt(j, "top_k", 0, std::numeric_limits<int32_t>::max(),
                                 "a non-negative integer", &v));
  if (v) s->top_k = static_cast<int>(*v);
  v.reset();
  ARBITER_RETURN_IF_ERROR(GetInt(j, "seed", std::numeric_limits<int64_t>::min(),
                                 std::numeric_limits<int64_t>::max(), "an integer", &v));
  if (v) s->seed = *v;
  return OkStatus();
}

Status ParseMaxTokens(const json& j, std::optional<int>* out) {
  std::optional<int64_t> v;
  // max_completion_tokens (newer name) wins over max_tokens when both are set.
  ARBITER_RETURN_IF_ERROR(GetInt(j, "max_tokens", 1, std::numeric_limits<int32_t>::max(),
                                 "a positive integer", &v));
  ARBITER_RETURN_IF_ERROR(GetInt(j, "max_completion_tokens", 1,
                                 std::numeric_limits<int32_t>::max(), "a positive integer", &v));
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
    const json* iu = Field(*so, "include_usage");
    if (iu != nullptr) {
      if (!iu->is_boolean()) return TypeError("stream_options.include_usage", "a boolean");
      *include_usage = iu->get<bool>();
    }
  }
  return OkStatus();
}

Status CheckN(const json& j) {
  std::optional<int64_t> n;
  ARBITER_RETURN_IF_ERROR(GetInt(j, "n", 1, std::numeric_limits<int32_t>::max(),
                                 "a positive integer", &n));
  if (n && *n != 1) {
    return InvalidArgumentError(
        fmt::format("\"n\" must be 1: only one choice per request is supported (got {})", *n));
  }
  return OkStatus();
}

// A message's content: a string, or an array of parts. Text parts are
// concatenated; with `images` (chat requests), image_url parts are recorded
// at their place in the text (a byte offset), else refused.
Status ParseContent(const json& c, const std::string& path, size_t message, std::string* out,
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
      const json* image = Field(part, "image_url");
      const json* url = image != nullptr && image->is_object() ? Field(*image, "url") : image;
      if (url == nullptr || !url->is_string()) {
        return TypeError(ppath + ".image_url", "an object {\"url\": \"data:image/png;base64,...\"}");
      }
      if (image->is_object()) {
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
      return InvalidArgumentError(fmt::format(
          "\"{}.type\" is \"{}\": only \"text\"{} content parts are supported", ppath, kind,
          images != nullptr ? " and \"image_url\"" : ""));
    }
    const json* text = Field(part, "text");
    if (text == nullptr || !text->is_string()) return TypeError(ppath + ".text", "a string");
    *out += text->get<std::string>();
  }
  return OkStatus();
}

Status ParseMessages(const json& j, std::vector<ChatMessage>* out,
                     std::vector<ChatImagePart>* images = nullptr) {
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
          "\"{}.role\" must be one of system, developer, user, assistant, tool (got \"{}\")",
          path, cm.role));
    }
    auto content = msg.find("content");
    if (content != msg.end()) {
      ARBITER_RETURN_IF_ERROR(
          ParseContent(*content, path + ".content", out->size(), &cm.content, images));
    } else if (cm.role != "assistant") {
      return InvalidArgumentError(fmt::format("\"{}.content\" is required", path));
    }
    out->push_back(std::move(cm));
  }
  return OkStatus();
}

template <typename F>
auto Guard(F&& f) -> decltype(f()) {
  // Any nlohmann exception not already handled (should not happen) becomes
  // a 400 rather than escaping into httplib.
  try {
    return f();
  } catch (const std::exception& e) {
    return InvalidArgumentError(fmt::format("invalid request: {}", e.what()));
  }
}

json UsageObject(const Usage& u) {
  return json{{"prompt_tokens", u.prompt_tokens},
              {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

std::string Base64(const uint8_t* data, size_t n) {
  static const char* kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((n + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < n; i += 3) {
    uint32_t v = (uint32_t{data[i]} << 16) | (uint32_t{data[i + 1]} << 8) | data[i + 2];
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  if (i < n) {
    uint32_t v = uint32_t{data[i]} << 16;
    if (i + 1 < n) v |= uint32_t{data[i + 1]} << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < n ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
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

}  // namespace

SamplingParams SamplingFields::ToSamplingParams() const {
  SamplingParams p;
  p.temperature = static_cast<float>(temperature.value_or(1.0));
  p.top_p = static_cast<float>(top_p.value_or(1.0));
  p.top_k = top_k.value_or(0);
  if (seed) {
    p.has_seed = true;
    p.seed = static_cast<uint64_t>(*seed);
  }
  return p;
}

Result<ChatRequest> ParseChatRequest(std::string_view body) {
  return Guard([&]() -> Result<ChatRequest> {
    ARBITER_ASSIGN_OR_RETURN(json j, ParseBody(body));
    ChatRequest r;
    ARBITER_RETURN_IF_ERROR(GetString(j, "model", true, &r.model));
    ARBITER_RETURN_IF_ERROR(ParseMessages(j, &r.messages, &r.images));
    ARBITER_RETURN_IF_ERROR(ParseMaxTokens(j, &r.max_tokens));
    ARBITER_RETURN_IF_ERROR(ParseSampling(j, &r.sampling));
    ARBITER_RETURN_IF_ERROR(ParseStop(j, &r.stop));
    ARBITER_RETURN_IF_ERROR(ParseStreamFields(j, &r.stream, &r.include_usage));
    ARBITER_RETURN_IF_ERROR(CheckN(j));
    ARBITER_RETURN_IF_ERROR(GetString(j, "user", false, &r.user));
    ARBITER_RETURN_IF_ERROR(ParseCacheFields(j, &r.cache));
    return r;
  });
}

Result<CompletionRequest> ParseCompletionRequest(std::string_view body) {
  return Guard([&]() -> Result<CompletionRequest> {
    ARBITER_ASSIGN_OR_RETURN(json j, ParseBody(body));
    CompletionRequest r;
    ARBITER_RETURN_IF_ERROR(GetString(j, "model", true, &r.model));
    const json* p = Field(j, "prompt");
    if (p == nullptr) return InvalidArgumentError("\"prompt\" is required");
    const char* kPromptType = "a string, an array of one string, or an array of token ids";
    if (p->is_string()) {
      r.prompt = p->get<std::string>();
    } else if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) {
      r.prompt = (*p)[0].get<std::string>();
    } else if (p->is_array() && !p->empty() && (*p)[0].is_number_integer()) {
      for (size_t i = 0; i < p->size(); ++i) {
        const json& t = (*p)[i];
        if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
            t.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
          return TypeError(fmt::format("prompt[{}]", i), "a non-negative token id");
        }
        r.prompt_ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
      }
      r.prompt_is_ids = true;
    } else if (p->is_array() && p->size() > 1 && (*p)[0].is_string()) {
      return InvalidArgumentError(
          "\"prompt\" must hold exactly one string: batched prompts are not supported");
    } else {
      return TypeError("prompt", kPromptType);
    }
    ARBITER_RETURN_IF_ERROR(ParseMaxTokens(j, &r.max_tokens));
    ARBITER_RETURN_IF_ERROR(ParseSampling(j, &r.sampling));
    ARBITER_RETURN_IF_ERROR(ParseStop(j, &r.stop));
    ARBITER_RETURN_IF_ERROR(ParseStreamFields(j, &r.stream, &r.include_usage));
    ARBITER_RETURN_IF_ERROR(CheckN(j));
    ARBITER_RETURN_IF_ERROR(GetBool(j, "echo", &r.echo));
    ARBITER_RETURN_IF_ERROR(GetString(j, "user", false, &r.user));
    ARBITER_RETURN_IF_ERROR(ParseCacheFields(j, &r.cache));
    return r;
  });
}

Result<PrewarmRequest> ParsePrewarmRequest(std::string_view body) {
  return Guard([&]() -> Result<PrewarmRequest> {
    ARBITER_ASSIGN_OR_RETURN(json j, ParseBody(body));
    PrewarmRequest r;
    ARBITER_RETURN_IF_ERROR(GetString(j, "model", true, &r.model));
    ARBITER_RETURN_IF_ERROR(ParseCacheFields(j, &r.cache));
    if (r.cache.conversation_id.empty()) {
      return InvalidArgumentError("\"conversation_id\" is required (a non-empty string)");
    }
    const bool has_messages = Field(j, "messages") != nullptr;
    const bool has_prompt = Field(j, "prompt") != nullptr;
    if (has_messages == has_prompt) {
      return InvalidArgumentError("give exactly one of \"messages\" and \"prompt\"");
    }
    if (has_messages) {
      ARBITER_RETURN_IF_ERROR(ParseMessages(j, &r.messages));
    } else {
      ARBITER_RETURN_IF_ERROR(GetString(j, "prompt", true, &r.prompt));
      if (r.prompt.empty()) return InvalidArgumentError("\"prompt\" must not be empty");
    }
    return r;
  });
}

Result<SpeechBody> ParseSpeechRequest(std::string_view body) {
  return Guard([&]() -> Result<SpeechBody> {
    ARBITER_ASSIGN_OR_RETURN(json j, ParseBody(body));
    SpeechBody r;
    ARBITER_RETURN_IF_ERROR(GetString(j, "model", true, &r.model));
    ARBITER_RETURN_IF_ERROR(GetString(j, "input", true, &r.input));
    if (r.input.empty()) return InvalidArgumentError("\"input\" must not be empty");
    ARBITER_RETURN_IF_ERROR(GetString(j, "voice", false, &r.voice));
    if (const json* v = Field(j, "voice"); v != nullptr && v->is_object()) {
      return InvalidArgumentError("\"voice\" must be a voice name; custom voice objects are not "
                                  "supported");
    }
    ARBITER_RETURN_IF_ERROR(GetString(j, "response_format", false, &r.response_format));
    if (r.response_format.empty()) r.response_format = "mp3";
    if (r.response_format != "mp3" && r.response_format != "wav" && r.response_format != "pcm") {
      return InvalidArgumentError(fmt::format(
          "\"response_format\" \"{}\" is not supported: one of mp3 (default), wav, pcm",
          r.response_format));
    }
    std::optional<double> speed;
    ARBITER_RETURN_IF_ERROR(GetNumber(j, "speed", 0.25, 4.0, false, "between 0.25 and 4.0", &speed));
    r.speed = speed.value_or(1.0);
    if (const json* f = Field(j, "stream_format"); f != nullptr && !(f->is_string() && *f == "audio")) {
      return InvalidArgumentError("\"stream_format\" must be \"audio\" (\"sse\" is not supported)");
    }
    if (Field(j, "instructions") != nullptr) {
      return InvalidArgumentError("\"instructions\" is not supported by these speech models");
    }
    return r;
  });
}

Result<DescribeBody> ParseDescribeRequest(std::string_view body) {
  return Guard([&]() -> Result<DescribeBody> {
    ARBITER_ASSIGN_OR_RETURN(json j, ParseBody(body));
    DescribeBody r;
    ARBITER_RETURN_IF_ERROR(GetString(j, "model", true, &r.model));
    for (const char* field : {"image", "image_url"}) {
      const json* v = Field(j, field);
      if (v == nullptr) continue;
      if (!r.field.empty()) return InvalidArgumentError("give one of \"image\" and \"image_url\"");
      const json* url = v->is_object() ? Field(*v, "url") : v;
      if (url == nullptr || !url->is_string()) {
        return TypeError(field, "a data: URL string (or {\"url\": ...})");
      }
      r.image = url->get<std::string>();
      r.field = field;
    }
    if (r.field.empty()) return InvalidArgumentError("\"image\" is required (a data: URL)");
    return r;
  });
}

Result<EmbeddingRequest> ParseEmbeddingRequest(std::string_view body) {
  return Guard([&]() -> Result<EmbeddingRequest> {
    ARBITER_ASSIGN_OR_RETURN(json j, ParseBody(body));
    EmbeddingRequest r;
    ARBITER_RETURN_IF_ERROR(GetString(j, "model", true, &r.model));
    const json* in = Field(j, "input");
    if (in == nullptr) return InvalidArgumentError("\"input\" is required");
    if (in->is_string()) {
      r.input.push_back(in->get<std::string>());
    } else if (in->is_array()) {
      if (in->empty()) return InvalidArgumentError("\"input\" must not be empty");
      for (size_t i = 0; i < in->size(); ++i) {
        if (!(*in)[i].is_string()) return TypeError(fmt::format("input[{}]", i), "a string");
        r.input.push_back((*in)[i].get<std::string>());
      }
    } else {
      return TypeError("input", "a string or an array of strings");
    }
    for (size_t i = 0; i < r.input.size(); ++i) {
      if (r.input[i].empty()) {
        return InvalidArgumentError(fmt::format("\"input[{}]\" must not be empty", i));
      }
    }
    std::string format;
    ARBITER_RETURN_IF_ERROR(GetString(j, "encoding_format", false, &format));
    if (!format.empty() && format != "float" && format != "base64") {
      return InvalidArgumentError("\"encoding_format\" must be \"float\" or \"base64\"");
    }
    r.base64 = format == "base64";
    std::optional<int64_t> dims;
    ARBITER_RETURN_IF_ERROR(GetInt(j, "dimensions", 1, std::numeric_limits<int32_t>::max(),
                                   "a positive integer", &dims));
    if (dims) r.dimensions = static_cast<int>(*dims);
    ARBITER_RETURN_IF_ERROR(GetString(j, "user", false, &r.user));
    return r;
  });
}

std::string_view OpenAIFinishReason(FinishReason reason) {
  return reason == FinishReason::kLength ? "length" : "stop";
}

std::string NewCompletionId(std::string_view prefix) {
  static Mutex mu;
  static std::mt19937_64 rng(std::random_device{}());
  uint64_t a, b;
  {
    MutexLock l(&mu);
    a = rng();
    b = rng();
  }
  return fmt::format("{}-{:016x}{:08x}", prefix, a, static_cast<uint32_t>(b));
}

std::string ChatCompletionJson(const std::string& id, int64_t created, const std::string& model,
                               const std::string& content, FinishReason finish,
                               const Usage& usage) {
  json j = {{"id", id},
            {"object", "chat.completion"},
            {"created", created},
            {"model", model},
            {"choices",
             json::array({{{"index", 0},
                           {"message", {{"role", "assistant"}, {"content", content}}},
                           {"logprobs", nullptr},
                           {"finish_reason", OpenAIFinishReason(finish)}}})},
            {"usage", UsageObject(usage)}};
  return Dump(j);
}

std::string CompletionJson(const std::string& id, int64_t created, const std::string& model,
                           const std::string& text, FinishReason finish, const Usage& usage) {
  json j = {{"id", id},
            {"object", "text_completion"},
            {"created", created},
            {"model", model},
            {"choices", json::array({{{"index", 0},
                                      {"text", text},
                                      {"logprobs", nullptr},
                                      {"finish_reason", OpenAIFinishReason(finish)}}})},
            {"usage", UsageObject(usage)}};
  return Dump(j);
}

std::string EmbeddingsJson(const std::string& model, const std::vector<std::vector<float>>& vectors,
                           bool base64, int prompt_tokens) {
  json data = json::array();
  for (size_t i = 0; i < vectors.size(); ++i) {
    json item = {{"object", "embedding"}, {"index", i}};
    if (base64) {
      // Little-endian float32 bytes, as OpenAI's base64 encoding.
      std::vector<uint8_t> bytes(vectors[i].size() * sizeof(float));
      if (!bytes.empty()) std::memcpy(bytes.data(), vectors[i].data(), bytes.size());
      item["embedding"] = Base64(bytes.data(), bytes.size());
    } else {
      item["embedding"] = vectors[i];
    }
    data.push_back(std::move(item));
  }
  json j = {{"object", "list"},
            {"data", std::move(data)},
            {"model", model},
            {"usage", {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}}}};
  return Dump(j);
}

std::string ChatChunkJson(const std::string& id, int64_t created, const std::string& model,
                          const std::string* role, const std::string* content,
                          const FinishReason* finish, bool with_usage_null) {
  json delta = json::object();
  if (role != nullptr) delta["role"] = *role;
  if (content != nullptr) delta["content"] = *content;
  json choice = {{"index", 0}, {"delta", std::move(delta)}, {"logprobs", nullptr}};
  choice["finish_reason"] = finish != nullptr ? json(OpenAIFinishReason(*finish)) : json(nullptr);
  json j = {{"id", id},
            {"object", "chat.completion.chunk"},
            {"created", created},
            {"model", model},
            {"choices", json::array({std::move(choice)})}};
  if (with_usage_null) j["usage"] = nullptr;
  return Dump(j);
}

std::string CompletionChunkJson(const std::string& id, int64_t created, const std::string& model,
                                const std::string& text, const FinishReason* finish,
                                bool with_usage_null) {
  json choice = {{"index", 0}, {"text", text}, {"logprobs", nullptr}};
  choice["finish_reason"] = finish != nullptr ? json(OpenAIFinishReason(*finish)) : json(nullptr);
  json j = {{"id", id},
            {"object", "text_completion"},
            {"created", created},
            {"model", model},
            {"choices", json::array({std::move(choice)})}};
  if (with_usage_null) j["usage"] = nullptr;
  return Dump(j);
}

std::string UsageChunkJson(const std::string& id, int64_t created, const std::string& model,
                           std::string_view object, const Usage& usage) {
  json j = {{"id", id},       {"object", object},         {"created", created},
            {"model", model}, {"choices", json::array()}, {"usage", UsageObject(usage)}};
  return Dump(j);
}

std::string ErrorJson(std::string_view message, std::string_view type, std::string_view code) {
  json err = {{"message", message}, {"type", type}};
  err["code"] = code.empty() ? json(nullptr) : json(code);
  return Dump(json{{"error", std::move(err)}});
}

std::string SseData(std::string_view payload) {
  std::string out;
  out.reserve(payload.size() + 8);
  out += "data: ";
  out += payload;
  out += "\n\n";
  return out;
}

}  // namespace arbiter
