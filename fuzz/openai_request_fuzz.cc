// libFuzzer target: the OpenAI request parsers (ParseChatRequest,
// ParseCompletionRequest, ParseResponsesRequest, ParseEmbeddingRequest) and
// the /admin/prewarm body (ParsePrewarmRequest) on arbitrary bytes, i.e. an
// untrusted HTTP body, and the JSON reader they and every other route use
// (ParseJson / ParseBody, Note [One JSON reader] in
// server/internal/json_fields.h: the admin actions, /ui/login and the
// proxy's peek read their bodies with it). No exception may escape; every
// error must be kInvalidArgument with a message; accepted requests must
// satisfy the ranges openai.h promises on each struct; a document the
// reader accepts nests at most kMaxJsonDepth levels and is what nlohmann's
// own parser makes of the same text, keys in the same order; a chat's
// json_schema is handed on as the client wrote it (declared order).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "arbiter/server/openai.h"
#include "server/internal/json_fields.h"

namespace {

void CheckSampling(const arbiter::SamplingFields& s) {
  if (s.temperature && !(*s.temperature >= 0.0 && *s.temperature <= 2.0)) __builtin_trap();
  if (s.top_p && !(*s.top_p > 0.0 && *s.top_p <= 1.0)) __builtin_trap();
  if (s.top_k && *s.top_k < 0) __builtin_trap();
  if (s.presence_penalty && !(*s.presence_penalty >= -2.0 && *s.presence_penalty <= 2.0)) {
    __builtin_trap();
  }
  if (s.frequency_penalty && !(*s.frequency_penalty >= -2.0 && *s.frequency_penalty <= 2.0)) {
    __builtin_trap();
  }
  for (const auto& [id, bias] : s.logit_bias) {
    if (id < 0 || !(bias >= -100.0f && bias <= 100.0f)) __builtin_trap();
  }
  (void)s.ToSamplingParams();
}

// The deepest nesting of arrays and objects in `root` (a scalar: 0).
int Depth(const nlohmann::ordered_json& root) {
  int deepest = 0;
  std::vector<std::pair<const nlohmann::ordered_json*, int>> todo = {{&root, 0}};
  while (!todo.empty()) {
    auto [j, depth] = todo.back();
    todo.pop_back();
    if (!j->is_structured()) continue;
    deepest = std::max(deepest, depth + 1);
    for (const nlohmann::ordered_json& child : *j) todo.push_back({&child, depth + 1});
  }
  return deepest;
}

template <typename R>
bool CheckError(const arbiter::Result<R>& r) {
  if (r.ok()) return true;
  if (r.status().code() != arbiter::StatusCode::kInvalidArgument) __builtin_trap();
  if (r.status().message().empty()) __builtin_trap();
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);

  namespace si = arbiter::server_internal;
  arbiter::Result<si::RequestJson> doc = si::ParseJson(body, "request body");
  if (CheckError(doc)) {
    if (Depth(*doc) > si::kMaxJsonDepth) __builtin_trap();
    // ordered_json's == compares objects in order.
    if (*doc != nlohmann::ordered_json::parse(body.begin(), body.end())) __builtin_trap();
  }
  if (arbiter::Result<si::RequestJson> obj = si::ParseBody(body); CheckError(obj)) {
    if (!obj->is_object() || !doc.ok()) __builtin_trap();
  }

  arbiter::Result<arbiter::ChatRequest> chat = arbiter::ParseChatRequest(body);
  if (CheckError(chat)) {
    if (chat->model.empty() || chat->messages.empty()) __builtin_trap();
    if (chat->max_tokens && *chat->max_tokens < 1) __builtin_trap();
    if (chat->stop.size() > 4) __builtin_trap();
    for (const auto& m : chat->messages) {
      if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool") {
        __builtin_trap();
      }
    }
    CheckSampling(chat->sampling);
    if (chat->n < 1 || chat->n > 16 || chat->top_logprobs < 0 || chat->top_logprobs > 20) {
      __builtin_trap();
    }
    if (chat->format.kind == arbiter::OutputConstraintKind::kJsonSchema &&
        chat->format.text !=
            si::DumpJson(doc->at("response_format").at("json_schema").at("schema"))) {
      __builtin_trap();
    }
    if (chat->tools.choice.mode == arbiter::ToolChoice::Mode::kFunction) {
      bool found = false;
      for (const auto& t : chat->tools.tools) found = found || t.name == chat->tools.choice.function;
      if (!found) __builtin_trap();
    }
  }

  arbiter::Result<arbiter::ResponsesRequest> responses = arbiter::ParseResponsesRequest(body);
  if (CheckError(responses)) {
    if (responses->model.empty() || responses->messages.empty()) __builtin_trap();
    if (responses->max_output_tokens && *responses->max_output_tokens < 1) __builtin_trap();
    CheckSampling(responses->sampling);
  }

  arbiter::Result<arbiter::CompletionRequest> completion = arbiter::ParseCompletionRequest(body);
  if (CheckError(completion)) {
    if (completion->model.empty()) __builtin_trap();
    if (completion->max_tokens && *completion->max_tokens < 1) __builtin_trap();
    if (completion->stop.size() > 4) __builtin_trap();
    if (completion->prompt_is_ids == completion->prompt_ids.empty()) __builtin_trap();
    for (int32_t id : completion->prompt_ids) {
      if (id < 0) __builtin_trap();
    }
    CheckSampling(completion->sampling);
  }

  arbiter::Result<arbiter::EmbeddingRequest> embedding = arbiter::ParseEmbeddingRequest(body);
  if (CheckError(embedding)) {
    if (embedding->model.empty() || embedding->input.empty()) __builtin_trap();
    for (const auto& s : embedding->input) {
      if (s.empty()) __builtin_trap();
    }
    if (embedding->dimensions && *embedding->dimensions < 1) __builtin_trap();
  }

  arbiter::Result<arbiter::PrewarmRequest> prewarm = arbiter::ParsePrewarmRequest(body);
  if (CheckError(prewarm)) {
    if (prewarm->model.empty() || prewarm->cache.conversation_id.empty()) __builtin_trap();
    if (prewarm->messages.empty() == prewarm->prompt.empty()) __builtin_trap();  // exactly one
  }
  return 0;
}
