// arbiter/server/openai.h — the OpenAI-compatible wire format, parsed into
// native structs at the edge (docs/architecture.md "One chat request": no JSON
// travels below the routes).
//
// Request parsing (Parse*Request) accepts the OpenAI fields listed on each
// struct and treats `null` as absent. Issue 15 point 1: no field is silently
// ignored — every field of OpenAI's request is implemented, accepted as a
// documented no-op that cannot change the result (user, metadata,
// safety_identifier, service_tier, store: false, …), or refused with
// kInvalidArgument naming it (`"best_of" is not supported: …`); an unknown
// field is refused too (docs/http-api.md "Request fields" has the table). A
// present field of the wrong type or outside OpenAI's documented range is
// kInvalidArgument whose message names the field, e.g. `"temperature" must
// be a number`, `"messages[1].content" must be a string or an array of text
// parts`. Malformed JSON is kInvalidArgument ("request body is not valid
// JSON: ...").
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
#include "arbiter/runtime/runtime.h"
#include "arbiter/runtime/vocabulary.h"

namespace arbiter {

// Sampling fields shared by chat and completions. Absent → the defaults of
// OpenAI (temperature 1, top_p 1) and no top-k.
struct SamplingFields {
  std::optional<double> temperature;  // [0, 2]
  std::optional<double> top_p;        // (0, 1]
  std::optional<int> top_k;           // ≥ 0 (extension; 0 = off)
  std::optional<double> min_p;        // [0, 1] (extension)
  std::optional<double> presence_penalty;    // [-2, 2]
  std::optional<double> frequency_penalty;   // [-2, 2]
  std::optional<double> repetition_penalty;  // (0, 10] (extension; 1 = off)
  std::vector<std::pair<int32_t, float>> logit_bias;  // token id → [-100, 100]
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

// response_format (chat, completions as an extension), `grammar`
// (extension: GBNF text), or the Responses API's text.format.
struct OutputFormat {
  OutputConstraintKind kind = OutputConstraintKind::kNone;
  std::string text;  // kJsonSchema: the schema as JSON text; kGrammar: GBNF
};

// tools + tool_choice + parallel_tool_calls.
struct ToolFields {
  std::vector<ToolDefinition> tools;  // names match ^[a-zA-Z0-9_-]{1,64}$, unique
  ToolChoice choice;                  // kFunction names one of `tools`
  bool parallel = true;               // parallel_tool_calls
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
  int n = 1;                          // choices, [1, 16]
  bool logprobs = false;
  int top_logprobs = 0;               // [0, 20]; requires logprobs
  OutputFormat format;                // response_format or grammar
  ToolFields tools;
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
  int n = 1;                          // choices, [1, 16]
  std::optional<int> logprobs;        // [0, 5]: top alternatives per token
  OutputFormat format;                // response_format / grammar (extensions)
};

// POST /v1/responses (OpenAI's Responses API, stateless): `input` as a
// string or items (messages with input_text / input_image parts,
// function_call and function_call_output items), `instructions` as a
// leading system message, tools in the Responses' flat shape, text.format.
struct ResponsesRequest {
  std::string model;                  // required
  std::vector<ChatMessage> messages;  // instructions (system) first, then the input
  std::vector<ChatImagePart> images;  // input_image parts, in order
  std::optional<int> max_output_tokens;  // ≥ 1
  SamplingFields sampling;
  bool stream = false;
  OutputFormat format;                // text.format
  ToolFields tools;
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
Result<ResponsesRequest> ParseResponsesRequest(std::string_view body);
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
// A tool call's id: "call_<24 hex>"; random, thread-safe.
std::string NewToolCallId();
// A Responses API id: "<prefix>_<48 hex>" (resp, msg, fc); random, thread-safe.
std::string NewItemId(std::string_view prefix);

// One generated token for logprobs: its bytes in the vocabulary (they may
// be part of a UTF-8 sequence: `token` is then written with U+FFFD, `bytes`
// exactly), its logprob and the most probable alternatives. A logprob of
// −inf (a token the grammar masked) is written as -9999.0, as OpenAI does.
struct LogprobToken {
  std::string bytes;
  float logprob = 0;
  std::vector<std::pair<std::string, float>> top;  // (bytes, logprob), most probable first
};

// One choice of a non-streaming response.
struct Choice {
  std::string text;                  // chat: message.content; completion: text (with echo)
  std::vector<ToolCall> tool_calls;  // chat: message.tool_calls (finish_reason "tool_calls")
  FinishReason finish = FinishReason::kStop;
  bool logprobs = false;             // write logprobs (else null)
  std::vector<LogprobToken> tokens;  // [generated tokens] when logprobs
  size_t text_offset = 0;            // completions: where the generated text starts (echo)
};

// Non-streaming bodies; choices[i] gets index i.
std::string ChatCompletionJson(const std::string& id, int64_t created, const std::string& model,
                               const std::vector<Choice>& choices, const Usage& usage);
std::string CompletionJson(const std::string& id, int64_t created, const std::string& model,
                           const std::vector<Choice>& choices, const Usage& usage);
// `vectors`: one [hidden_size] f32 vector per input, in input order.
std::string EmbeddingsJson(const std::string& model, const std::vector<std::vector<float>>& vectors,
                           bool base64, int prompt_tokens);

// One streaming chunk's choice. Chat: the first chunk of a choice carries
// role "assistant" and content ""; content chunks `content`; a choice that
// called tools sends each call whole in `tool_calls` (with its index, id,
// type and function) before its last chunk; the last chunk has `finish`
// ("stop", "length", "tool_calls") and an empty delta.
struct ChunkDelta {
  int index = 0;
  const std::string* role = nullptr;
  const std::string* content = nullptr;
  const std::vector<ToolCall>* tool_calls = nullptr;
  const std::vector<LogprobToken>* logprobs = nullptr;  // the tokens of this chunk's text
  std::string_view finish;                               // "" = not the last chunk
};
// The JSON of one SSE `data:` line, without framing. `with_usage_null`:
// include "usage": null (when include_usage is on).
std::string ChatChunkJson(const std::string& id, int64_t created, const std::string& model,
                          const ChunkDelta& delta, bool with_usage_null);
// Completions: `text_offset` is where this chunk's text starts in the
// choice's whole text (logprobs.text_offset).
std::string CompletionChunkJson(const std::string& id, int64_t created, const std::string& model,
                                int index, const std::string& text,
                                const std::vector<LogprobToken>* logprobs, size_t text_offset,
                                std::string_view finish, bool with_usage_null);
// The include_usage chunk: "choices": [] and the usage object.
// `object` is "chat.completion.chunk" or "text_completion".
std::string UsageChunkJson(const std::string& id, int64_t created, const std::string& model,
                           std::string_view object, const Usage& usage);

// {"error":{"message","type","code"}}; `code` may be empty (→ null).
std::string ErrorJson(std::string_view message, std::string_view type, std::string_view code);

// SSE framing: "data: <payload>\n\n".
std::string SseData(std::string_view payload);

}  // namespace arbiter
