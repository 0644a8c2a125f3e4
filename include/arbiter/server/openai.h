// arbiter/server/openai.h — the OpenAI-compatible wire format, parsed into
// native structs at the edge (docs/architecture.md "One chat request": no JSON
// travels below the routes).
//
// Request parsing (Parse*Request) accepts the OpenAI fields listed on each
// struct, treats `null` as absent, ignores unknown fields, and rejects a
// present field of the wrong type or range with kInvalidArgument whose
// message names the field, e.g. `"temperature" must be a number`,
// `"messages[1].content" must be a string or an array of text parts`.
// Malformed JSON is kInvalidArgument ("request body is not valid JSON: ...").
//
// Response serialization (*Json functions) produces exactly the OpenAI
// shapes documented in docs/http-api.md.
//
// Thread safety: pure functions over values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "arbiter/base/status.h"
#include "arbiter/engine/chat_template.h"
#include "arbiter/engine/engine.h"

namespace arbiter {

// Sampling fields shared by chat and completions. Absent → the defaults of
// OpenAI (temperature 1, top_p 1) and no top-k.
struct SamplingFields {
  std::optional<double> temperature;  // [0, 2]
  std::optional<double> top_p;        // (0, 1]
  std::optional<int> top_k;           // ≥ 0 (extension; 0 = off)
  std::optional<int64_t> seed;
  // The engine's SamplingParams for these fields.
  SamplingParams ToSamplingParams() const;
};

// The KV precache's request fields (extensions; docs/http-api.md
// "POST /v1/chat/completions").
// `conversation_id` pins the request to its conversation's slot and is the
// strongest cache key; `prompt_cache_key` is OpenAI's; `cache_ttl` picks the
// TTL class of the conversation's saved KV ("" = short).
inline constexpr size_t kMaxCacheIdBytes = 4096;
struct CacheFields {
  std::string prompt_cache_key;       // ≤ kMaxCacheIdBytes
  std::string conversation_id;        // ≤ kMaxCacheIdBytes
  std::string cache_ttl;              // "" | "short" | "long" | "extended"
};

// An image_url content part of a chat message: its URL as sent and where
// it stands in the message's text (a byte offset into content).
struct ChatImagePart {
  size_t message = 0;
  size_t offset = 0;
  std::string url;
  std::string field;                  // "messages[0].content[1].image_url"
};

struct ChatRequest {
  std::string model;                  // required
  std::vector<ChatMessage> messages;  // required, non-empty; "developer" → "system"
  std::vector<ChatImagePart> images;  // image_url parts, in order
  std::optional<int> max_tokens;      // max_tokens or max_completion_tokens, ≥ 1
  SamplingFields sampling;
  std::vector<std::string> stop;      // "stop": string or array of ≤ 4 strings
  bool stream = false;
  bool include_usage = false;         // stream_options.include_usage
  std::string user;
  CacheFields cache;
};

// POST /admin/prewarm: {"model", "conversation_id", "messages" | "prompt",
// "cache_ttl"} — exactly one of messages and prompt; conversation_id
// required (the synthetic "__system_prefix__" is allowed).
struct PrewarmRequest {
  std::string model;
  std::vector<ChatMessage> messages;
  std::string prompt;
  CacheFields cache;  // conversation_id non-empty
};

struct CompletionRequest {
  std::string model;                  // required
  // "prompt": a string, an array of one string, or an array of token ids.
  std::string prompt;
  std::vector<int32_t> prompt_ids;    // set when the prompt was token ids
  bool prompt_is_ids = false;
  std::optional<int> max_tokens;      // ≥ 1; absent → 16 (OpenAI's default)
  SamplingFields sampling;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;
  bool echo = false;                  // prepend the prompt to the text
  std::string user;
  CacheFields cache;
};

struct EmbeddingRequest {
  std::string model;                  // required
  std::vector<std::string> input;     // "input": string or array of strings (≥ 1)
  bool base64 = false;                // encoding_format "base64" (else "float")
  std::optional<int> dimensions;      // must equal the model's size when set
  std::string user;
};

// POST /v1/audio/speech: {"model", "input", "voice", "response_format",
// "speed"} (OpenAI's shape; stream_format "audio" only).
struct SpeechBody {
  std::string model;                  // required
  std::string input;                  // required, non-empty
  std::string voice;                  // "" = the model's default
  std::string response_format = "mp3";  // mp3 | wav | pcm
  double speed = 1.0;                 // 0.25..4.0
};

// POST /v1/vision/describe: {"model", "image": "data:..."} ("image_url"
// accepted too, as a string or {"url": ...}).
struct DescribeBody {
  std::string model;
  std::string image;                  // the URL as sent
  std::string field;                  // "image" or "image_url"
};

// Errors: kInvalidArgument naming the field (see the file comment).
Result<ChatRequest> ParseChatRequest(std::string_view body);
Result<SpeechBody> ParseSpeechRequest(std::string_view body);
Result<DescribeBody> ParseDescribeRequest(std::string_view body);
Result<CompletionRequest> ParseCompletionRequest(std::string_view body);
Result<PrewarmRequest> ParsePrewarmRequest(std::string_view body);
Result<EmbeddingRequest> ParseEmbeddingRequest(std::string_view body);

// Token counts for `usage`.
struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;  // usage.prompt_tokens_details.cached_tokens
};

// "stop" | "length" (kCancelled never reaches a client).
std::string_view OpenAIFinishReason(FinishReason reason);

// Ids: "chatcmpl-<24 hex>", "cmpl-<24 hex>"; random, thread-safe.
std::string NewCompletionId(std::string_view prefix);

// Non-streaming bodies.
std::string ChatCompletionJson(const std::string& id, int64_t created, const std::string& model,
                               const std::string& content, FinishReason finish,
                               const Usage& usage);
std::string CompletionJson(const std::string& id, int64_t created, const std::string& model,
                           const std::string& text, FinishReason finish, const Usage& usage);
// `vectors`: one [hidden_size] f32 vector per input, in input order.
std::string EmbeddingsJson(const std::string& model, const std::vector<std::vector<float>>& vectors,
                           bool base64, int prompt_tokens);

// Streaming chunks (the JSON of one SSE `data:` line, without framing).
// Chat: the first chunk carries delta {"role":"assistant","content":""};
// content chunks delta {"content"}; the last delta {} with finish_reason.
// `with_usage_null`: include "usage": null (when include_usage is on).
std::string ChatChunkJson(const std::string& id, int64_t created, const std::string& model,
                          const std::string* role, const std::string* content,
                          const FinishReason* finish, bool with_usage_null);
std::string CompletionChunkJson(const std::string& id, int64_t created, const std::string& model,
                                const std::string& text, const FinishReason* finish,
                                bool with_usage_null);
// The include_usage chunk: "choices": [] and the usage object.
// `object` is "chat.completion.chunk" or "text_completion".
std::string UsageChunkJson(const std::string& id, int64_t created, const std::string& model,
                           std::string_view object, const Usage& usage);

// {"error":{"message","type","code"}}; `code` may be empty (→ null).
std::string ErrorJson(std::string_view message, std::string_view type, std::string_view code);

// SSE framing: "data: <payload>\n\n".
std::string SseData(std::string_view payload);

}  // namespace arbiter
