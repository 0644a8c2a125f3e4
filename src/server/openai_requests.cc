// The OpenAI request parsers (arbiter/server/openai.h): chat, completions,
// the Responses API, embeddings and prewarm. Each lists every field of its
// API: implemented, a documented no-op, or refused by name
// (docs/http-api.md "Request fields"); the field readers they share are in
// openai_fields.cc.
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "arbiter/server/openai.h"
#include "server/internal/json_fields.h"
#include "server/internal/openai_fields.h"

namespace arbiter {
namespace {

using json = server_internal::RequestJson;  // a request body (Note [One JSON reader])
using namespace server_internal;  // NOLINT: the field readers


}  // namespace

SamplingParams SamplingFields::ToSamplingParams() const {
  SamplingParams p;
  p.temperature = static_cast<float>(temperature.value_or(1.0));
  p.top_p = static_cast<float>(top_p.value_or(1.0));
  p.top_k = top_k.value_or(0);
  p.min_p = static_cast<float>(min_p.value_or(0.0));
  p.presence_penalty = static_cast<float>(presence_penalty.value_or(0.0));
  p.frequency_penalty = static_cast<float>(frequency_penalty.value_or(0.0));
  p.repetition_penalty = static_cast<float>(repetition_penalty.value_or(1.0));
  p.logit_bias = logit_bias;
  if (seed) {
    p.has_seed = true;
    p.seed = static_cast<uint64_t>(*seed);
  }
  return p;
}

Result<ChatRequest> ParseChatRequest(std::string_view body) {
  return Guard([&]() -> Result<ChatRequest> {
    ARBITER_ASSIGN_OR_RETURN(json j, ParseBody(body));
    // Implemented; documented no-ops (user, metadata, safety_identifier,
    // service_tier, store: false, modalities: ["text"],
    // prompt_cache_retention); refused by name (the rest).
    ARBITER_RETURN_IF_ERROR(CheckKnownFields(
        j, {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
            "seed", "stop", "stream", "stream_options", "n", "presence_penalty",
            "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "response_format",
            "tools", "tool_choice", "parallel_tool_calls", "prompt_cache_key", "user", "metadata",
            "safety_identifier", "service_tier", "store", "modalities", "prompt_cache_retention",
            "audio", "function_call", "functions", "prediction", "reasoning_effort", "verbosity",
            "web_search_options", "top_k", "min_p", "repetition_penalty", "conversation_id",
            "cache_ttl", "grammar"}));
    ARBITER_RETURN_IF_ERROR(RejectField(j, "audio", "audio output is not supported"));
    ARBITER_RETURN_IF_ERROR(
        RejectField(j, "function_call", "the deprecated functions API; use \"tool_choice\""));
    ARBITER_RETURN_IF_ERROR(
        RejectField(j, "functions", "the deprecated functions API; use \"tools\""));
    ARBITER_RETURN_IF_ERROR(RejectField(j, "prediction", "predicted outputs are not implemented"));
    ARBITER_RETURN_IF_ERROR(
        RejectField(j, "reasoning_effort", "arbiter's models do not reason in hidden tokens"));
    ARBITER_RETURN_IF_ERROR(RejectField(j, "verbosity", "it is not implemented"));
    ARBITER_RETURN_IF_ERROR(
        RejectField(j, "web_search_options", "arbiter makes no outbound requests"));
    ARBITER_RETURN_IF_ERROR(CheckNoOps(j));
    if (const json* m = Field(j, "modalities")) {
      if (!m->is_array() || m->size() != 1 || !(*m)[0].is_string() || (*m)[0] != "text") {
        return InvalidArgumentError("\"modalities\" must be [\"text\"]: audio output is not "
                                    "supported");
      }
    }
    ChatRequest r;
    ARBITER_RETURN_IF_ERROR(GetString(j, "model", true, &r.model));
    ARBITER_RETURN_IF_ERROR(ParseMessages(j, &r.messages, &r.images));
    ARBITER_RETURN_IF_ERROR(ParseMaxTokens(j, &r.max_tokens));
    ARBITER_RETURN_IF_ERROR(ParseSampling(j, &r.sampling));
    ARBITER_RETURN_IF_ERROR(ParseStop(j, &r.stop));
    ARBITER_RETURN_IF_ERROR(ParseStreamFields(j, &r.stream, &r.include_usage));
    ARBITER_RETURN_IF_ERROR(ParseN(j, &r.n));
    ARBITER_RETURN_IF_ERROR(GetString(j, "user", false, &r.user));
    ARBITER_RETURN_IF_ERROR(ParseCacheFields(j, &r.cache));
    ARBITER_RETURN_IF_ERROR(GetBool(j, "logprobs", &r.logprobs));
    std::optional<int64_t> top;
    ARBITER_RETURN_IF_ERROR(GetInt(j, "top_logprobs", 0, 20, &top));
    if (top) {
      if (!r.logprobs) {
        return InvalidArgumentError("\"top_logprobs\" requires \"logprobs\": true");
      }
      r.top_logprobs = static_cast<int>(*top);
    }
    ARBITER_RETURN_IF_ERROR(ParseOutputFormat(j, &r.format));
    ARBITER_RETURN_IF_ERROR(ParseTools(j, /*flat=*/false, &r.tools));
    return r;
  });
}

Result<CompletionRequest> ParseCompletionRequest(std::string_view body) {
  return Guard([&]() -> Result<CompletionRequest> {
    ARBITER_ASSIGN_OR_RETURN(json j, ParseBody(body));
    ARBITER_RETURN_IF_ERROR(CheckKnownFields(
        j, {"model", "prompt", "max_tokens", "temperature", "top_p", "seed", "stop", "stream",
            "stream_options", "n", "echo", "presence_penalty", "frequency_penalty", "logit_bias",
            "logprobs", "user", "best_of", "suffix", "top_k", "min_p", "repetition_penalty",
            "conversation_id", "cache_ttl", "prompt_cache_key", "response_format", "grammar"}));
    ARBITER_RETURN_IF_ERROR(
        RejectField(j, "suffix", "insertion (fill-in-the-middle) is not implemented"));
    if (const json* b = Field(j, "best_of"); b != nullptr && !(b->is_number() && *b == 1)) {
      return InvalidArgumentError("\"best_of\" is not supported (only 1): arbiter does not rank "
                                  "server-side candidates; use \"n\"");
    }
    ARBITER_RETURN_IF_ERROR(CheckNoOps(j));
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
    ARBITER_RETURN_IF_ERROR(ParseN(j, &r.n));
    std::optional<int64_t> lp;
    ARBITER_RETURN_IF_ERROR(GetInt(j, "logprobs", 0, 5, &lp));
    if (lp) r.logprobs = static_cast<int>(*lp);
    ARBITER_RETURN_IF_ERROR(ParseOutputFormat(j, &r.format));
    ARBITER_RETURN_IF_ERROR(GetBool(j, "echo", &r.echo));
    ARBITER_RETURN_IF_ERROR(GetString(j, "user", false, &r.user));
    ARBITER_RETURN_IF_ERROR(ParseCacheFields(j, &r.cache));
    return r;
  });
}

Result<ResponsesRequest> ParseResponsesRequest(std::string_view body) {
  return Guard([&]() -> Result<ResponsesRequest> {
    ARBITER_ASSIGN_OR_RETURN(json j, ParseBody(body));
    ARBITER_RETURN_IF_ERROR(CheckKnownFields(
        j, {"model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "stream",
            "stream_options", "tools", "tool_choice", "parallel_tool_calls", "text", "store",
            "previous_response_id", "metadata", "user", "safety_identifier", "service_tier",
            "prompt_cache_key", "prompt_cache_retention", "truncation", "include", "reasoning",
            "background", "conversation", "prompt", "max_tool_calls", "top_logprobs", "seed",
            "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
            "conversation_id", "cache_ttl"}));
    ARBITER_RETURN_IF_ERROR(RejectField(j, "previous_response_id",
                                        "arbiter keeps no responses; send the whole conversation "
                                        "in \"input\""));
    ARBITER_RETURN_IF_ERROR(RejectField(j, "conversation", "arbiter keeps no conversations "
                                                           "objects; send the whole input"));
    ARBITER_RETURN_IF_ERROR(RejectField(j, "prompt", "stored prompt templates are not kept"));
    ARBITER_RETURN_IF_ERROR(
        RejectField(j, "reasoning", "arbiter's models do not reason in hidden tokens"));
    ARBITER_RETURN_IF_ERROR(RejectField(j, "max_tool_calls", "it is not implemented"));
    ARBITER_RETURN_IF_ERROR(RejectField(j, "top_logprobs", "use /v1/chat/completions for logprobs"));
    if (const json* inc = Field(j, "include"); inc != nullptr && !(inc->is_array() && inc->empty())) {
      return InvalidArgumentError("\"include\" is not supported (only an empty list)");
    }
    bool background = false;
    ARBITER_RETURN_IF_ERROR(GetBool(j, "background", &background));
    if (background) {
      return InvalidArgumentError("\"background\": true is not supported (responses are not kept)");
    }
    if (const json* t = Field(j, "truncation"); t != nullptr && !(t->is_string() && *t == "disabled")) {
      return InvalidArgumentError("\"truncation\" must be \"disabled\": arbiter never drops input "
                                  "(a prompt over the context is a 400)");
    }
    ARBITER_RETURN_IF_ERROR(CheckNoOps(j));
    ResponsesRequest r;
    ARBITER_RETURN_IF_ERROR(GetString(j, "model", true, &r.model));
    std::string instructions;
    ARBITER_RETURN_IF_ERROR(GetString(j, "instructions", false, &instructions));
    if (!instructions.empty()) r.messages.push_back({"system", instructions});
    const json* in = Field(j, "input");
    if (in == nullptr) return InvalidArgumentError("\"input\" is required");
    ARBITER_RETURN_IF_ERROR(ParseResponsesInput(*in, &r.messages, &r.images));
    std::optional<int64_t> max;
    ARBITER_RETURN_IF_ERROR(
        GetInt(j, "max_output_tokens", 1, std::numeric_limits<int32_t>::max(), &max));
    if (max) r.max_output_tokens = static_cast<int>(*max);
    ARBITER_RETURN_IF_ERROR(ParseSampling(j, &r.sampling));
    bool ignored_usage = false;
    ARBITER_RETURN_IF_ERROR(ParseStreamFields(j, &r.stream, &ignored_usage));
    ARBITER_RETURN_IF_ERROR(ParseTools(j, /*flat=*/true, &r.tools));
    if (const json* text = Field(j, "text")) {
      if (!text->is_object()) return TypeError("text", "an object {\"format\": ...}");
      ARBITER_RETURN_IF_ERROR(CheckKnownFields(*text, {"format", "verbosity"}, "text."));
      ARBITER_RETURN_IF_ERROR(RejectField(*text, "verbosity", "it is not implemented"));
      if (const json* f = Field(*text, "format")) {
        if (!f->is_object()) return TypeError("text.format", "an object with \"type\"");
        ARBITER_RETURN_IF_ERROR(CheckKnownFields(
            *f, {"type", "name", "schema", "description", "strict"}, "text.format."));
        std::string type;
        ARBITER_RETURN_IF_ERROR(GetString(*f, "type", true, &type));
        if (type == "json_object") {
          r.format.kind = OutputConstraintKind::kJsonObject;
        } else if (type == "json_schema") {
          const json* schema = Field(*f, "schema");
          if (schema == nullptr) return InvalidArgumentError("\"text.format.schema\" is required");
          ARBITER_ASSIGN_OR_RETURN(r.format.text, SchemaText(*schema, "text.format.schema"));
          r.format.kind = OutputConstraintKind::kJsonSchema;
        } else if (type != "text") {
          return InvalidArgumentError(
              "\"text.format.type\" must be \"text\", \"json_object\" or \"json_schema\"");
        }
      }
    }
    ARBITER_RETURN_IF_ERROR(GetString(j, "user", false, &r.user));
    ARBITER_RETURN_IF_ERROR(ParseCacheFields(j, &r.cache));
    return r;
  });
}

Result<PrewarmRequest> ParsePrewarmRequest(std::string_view body) {
  return Guard([&]() -> Result<PrewarmRequest> {
    ARBITER_ASSIGN_OR_RETURN(json j, ParseBody(body));
    ARBITER_RETURN_IF_ERROR(CheckKnownFields(
        j, {"model", "conversation_id", "messages", "prompt", "cache_ttl", "prompt_cache_key"}));
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
    ARBITER_RETURN_IF_ERROR(
        CheckKnownFields(j, {"model", "input", "encoding_format", "dimensions", "user"}));
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
    ARBITER_RETURN_IF_ERROR(GetInt(j, "dimensions", 1, std::numeric_limits<int32_t>::max(), &dims));
    if (dims) r.dimensions = static_cast<int>(*dims);
    ARBITER_RETURN_IF_ERROR(GetString(j, "user", false, &r.user));
    return r;
  });
}

}  // namespace arbiter
