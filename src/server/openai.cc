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
#include "server/internal/json_fields.h"

namespace arbiter {
namespace {

using json = nlohmann::json;
using server_internal::Field;
using server_internal::GetBool;
using server_internal::GetInt;
using server_internal::GetNumber;
using server_internal::GetString;
using server_internal::Guard;
using server_internal::ParseBody;
using server_internal::TypeError;

constexpr size_t kMaxStopStrings = 4;

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

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
