// server/internal/openai_fields.h — the OpenAI request fields the request
// parsers share (openai_requests.cc), with openai.h's parsing policy: null
// is absent; a wrong type or an out-of-range value is kInvalidArgument
// naming the field; every field is implemented, a documented no-op or
// refused by name (CheckKnownFields / RejectField, json_fields.h).
//
// Thread safety: pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "arbiter/server/openai.h"
#include "server/internal/json_fields.h"

namespace arbiter::server_internal {

// temperature, top_p, top_k, seed, min_p, presence_penalty,
// frequency_penalty, repetition_penalty, logit_bias.
Status ParseSampling(const RequestJson& j, SamplingFields* s);
// "n": [1, 16] choices.
Status ParseN(const RequestJson& j, int* n);
// A JSON schema object as JSON text (`field` names it in errors).
Result<std::string> SchemaText(const RequestJson& schema, std::string_view field);
// response_format and the `grammar` extension (at most one).
Status ParseOutputFormat(const RequestJson& j, OutputFormat* out);
// tools, tool_choice, parallel_tool_calls; `flat`: the Responses API's
// tool shape ({"type":"function","name",...}) instead of chat's.
Status ParseTools(const RequestJson& j, bool flat, ToolFields* out);
// tool_choice against the request's `tools` (already parsed): "auto",
// "none", "required" (needs tools) or a named function of `tools` —
// {"type":"function","function":{"name"}}, or {"type":"function","name"}
// when `flat` (Responses). Absent: `choice` unchanged.
Status ParseToolChoice(const RequestJson& j, bool flat, const std::vector<ToolDefinition>& tools,
                       ToolChoice* choice);
// max_tokens / max_completion_tokens (the latter wins).
Status ParseMaxTokens(const RequestJson& j, std::optional<int>* out);
// "stop": a string or ≤ 4 strings.
Status ParseStop(const RequestJson& j, std::vector<std::string>* out);
// stream, stream_options.include_usage.
Status ParseStreamFields(const RequestJson& j, bool* stream, bool* include_usage);
// Chat messages ("developer" → "system"; tool_calls, tool_call_id);
// `images` non-null: image_url parts are recorded, else refused.
Status ParseMessages(const RequestJson& j, std::vector<ChatMessage>* out,
                     std::vector<ChatImagePart>* images = nullptr);
// The Responses API's `input` (a string, or message / function_call /
// function_call_output items) appended to `out`.
Status ParseResponsesInput(const RequestJson& in, std::vector<ChatMessage>* out,
                           std::vector<ChatImagePart>* images);
// prompt_cache_key, conversation_id, cache_ttl.
Status ParseCacheFields(const RequestJson& j, CacheFields* c);
// The documented no-ops' types: user-facing labels that cannot change the
// result (metadata, safety_identifier, service_tier,
// prompt_cache_retention); `store` must be false.
Status CheckNoOps(const RequestJson& j);

}  // namespace arbiter::server_internal
