// OpenAI wire format, the response side (arbiter/server/openai.h): response
// and chunk JSON, logprobs, tool calls, ids. The request parsers are in
// openai_requests.cc and openai_fields.cc.
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
using server_internal::DumpJson;


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

}  // namespace

std::string_view OpenAIFinishReason(FinishReason reason) {
  return reason == FinishReason::kLength ? "length" : "stop";
}

namespace {

// `n` random 64-bit words from one process-wide generator.
std::vector<uint64_t> RandomWords(int n) {
  static Mutex mu;
  static std::mt19937_64 rng(std::random_device{}());
  std::vector<uint64_t> out(n);
  MutexLock l(&mu);
  for (uint64_t& w : out) w = rng();
  return out;
}

}  // namespace

std::string NewCompletionId(std::string_view prefix) {
  const std::vector<uint64_t> w = RandomWords(2);
  return fmt::format("{}-{:016x}{:08x}", prefix, w[0], static_cast<uint32_t>(w[1]));
}

std::string NewToolCallId() {
  const std::vector<uint64_t> w = RandomWords(2);
  return fmt::format("call_{:016x}{:08x}", w[0], static_cast<uint32_t>(w[1]));
}

std::string NewItemId(std::string_view prefix) {
  const std::vector<uint64_t> w = RandomWords(3);
  return fmt::format("{}_{:016x}{:016x}{:016x}", prefix, w[0], w[1], w[2]);
}

namespace {

double LogprobValue(float lp) { return std::isfinite(lp) ? lp : -9999.0; }

json BytesArray(const std::string& b) {
  json a = json::array();
  for (unsigned char c : b) a.push_back(static_cast<int>(c));
  return a;
}

// Chat: {"content": [{"token","logprob","bytes","top_logprobs"}], "refusal": null}.
json ChatLogprobs(const std::vector<LogprobToken>& tokens) {
  json content = json::array();
  for (const LogprobToken& t : tokens) {
    json top = json::array();
    for (const auto& [bytes, lp] : t.top) {
      top.push_back({{"token", bytes}, {"logprob", LogprobValue(lp)}, {"bytes", BytesArray(bytes)}});
    }
    content.push_back({{"token", t.bytes},
                       {"logprob", LogprobValue(t.logprob)},
                       {"bytes", BytesArray(t.bytes)},
                       {"top_logprobs", std::move(top)}});
  }
  return json{{"content", std::move(content)}, {"refusal", nullptr}};
}

// Completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}.
json CompletionLogprobs(const std::vector<LogprobToken>& tokens, size_t offset) {
  json toks = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  for (const LogprobToken& t : tokens) {
    toks.push_back(t.bytes);
    lps.push_back(LogprobValue(t.logprob));
    json top = json::object();
    for (const auto& [bytes, lp] : t.top) top[bytes] = LogprobValue(lp);
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += t.bytes.size();
  }
  return json{{"tokens", std::move(toks)},
              {"token_logprobs", std::move(lps)},
              {"top_logprobs", std::move(tops)},
              {"text_offset", std::move(offsets)}};
}

json ToolCallsJson(const std::vector<ToolCall>& calls, bool with_index) {
  json a = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json c = {{"id", calls[i].id},
              {"type", "function"},
              {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (with_index) c["index"] = i;
    a.push_back(std::move(c));
  }
  return a;
}

std::string_view ChatFinish(const Choice& c) {
  return c.tool_calls.empty() ? OpenAIFinishReason(c.finish) : "tool_calls";
}

}  // namespace

std::string ChatCompletionJson(const std::string& id, int64_t created, const std::string& model,
                               const std::vector<Choice>& choices, const Usage& usage) {
  json out = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const Choice& c = choices[i];
    json message = {{"role", "assistant"}, {"refusal", nullptr}};
    message["content"] = c.tool_calls.empty() || !c.text.empty() ? json(c.text) : json(nullptr);
    if (!c.tool_calls.empty()) message["tool_calls"] = ToolCallsJson(c.tool_calls, false);
    out.push_back({{"index", i},
                   {"message", std::move(message)},
                   {"logprobs", c.logprobs ? ChatLogprobs(c.tokens) : json(nullptr)},
                   {"finish_reason", ChatFinish(c)}});
  }
  json j = {{"id", id},
            {"object", "chat.completion"},
            {"created", created},
            {"model", model},
            {"choices", std::move(out)},
            {"usage", UsageObject(usage)}};
  return DumpJson(j);
}

std::string CompletionJson(const std::string& id, int64_t created, const std::string& model,
                           const std::vector<Choice>& choices, const Usage& usage) {
  json out = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const Choice& c = choices[i];
    out.push_back({{"index", i},
                   {"text", c.text},
                   {"logprobs", c.logprobs ? CompletionLogprobs(c.tokens, c.text_offset)
                                           : json(nullptr)},
                   {"finish_reason", OpenAIFinishReason(c.finish)}});
  }
  json j = {{"id", id},
            {"object", "text_completion"},
            {"created", created},
            {"model", model},
            {"choices", std::move(out)},
            {"usage", UsageObject(usage)}};
  return DumpJson(j);
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
  return DumpJson(j);
}

std::string ChatChunkJson(const std::string& id, int64_t created, const std::string& model,
                          const ChunkDelta& d, bool with_usage_null) {
  json delta = json::object();
  if (d.role != nullptr) delta["role"] = *d.role;
  if (d.content != nullptr) delta["content"] = *d.content;
  if (d.tool_calls != nullptr) delta["tool_calls"] = ToolCallsJson(*d.tool_calls, true);
  json choice = {{"index", d.index}, {"delta", std::move(delta)}};
  choice["logprobs"] = d.logprobs != nullptr ? ChatLogprobs(*d.logprobs) : json(nullptr);
  choice["finish_reason"] = d.finish.empty() ? json(nullptr) : json(d.finish);
  json j = {{"id", id},
            {"object", "chat.completion.chunk"},
            {"created", created},
            {"model", model},
            {"choices", json::array({std::move(choice)})}};
  if (with_usage_null) j["usage"] = nullptr;
  return DumpJson(j);
}

std::string CompletionChunkJson(const std::string& id, int64_t created, const std::string& model,
                                int index, const std::string& text,
                                const std::vector<LogprobToken>* logprobs, size_t text_offset,
                                std::string_view finish, bool with_usage_null) {
  json choice = {{"index", index}, {"text", text}};
  choice["logprobs"] =
      logprobs != nullptr ? CompletionLogprobs(*logprobs, text_offset) : json(nullptr);
  choice["finish_reason"] = finish.empty() ? json(nullptr) : json(finish);
  json j = {{"id", id},
            {"object", "text_completion"},
            {"created", created},
            {"model", model},
            {"choices", json::array({std::move(choice)})}};
  if (with_usage_null) j["usage"] = nullptr;
  return DumpJson(j);
}

std::string UsageChunkJson(const std::string& id, int64_t created, const std::string& model,
                           std::string_view object, const Usage& usage) {
  json j = {{"id", id},       {"object", object},         {"created", created},
            {"model", model}, {"choices", json::array()}, {"usage", UsageObject(usage)}};
  return DumpJson(j);
}

std::string ErrorJson(std::string_view message, std::string_view type, std::string_view code) {
  json err = {{"message", message}, {"type", type}};
  err["code"] = code.empty() ? json(nullptr) : json(code);
  return DumpJson(json{{"error", std::move(err)}});
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
