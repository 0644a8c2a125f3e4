// POST /v1/responses — OpenAI's Responses API, stateless (issue 15 point
// 5): the request becomes one TextRequest (instructions as the system
// message, input items as messages, text.format as the output constraint,
// flat function tools), run like a chat completion, and is answered as a
// Response object or as the Responses event stream.
//
// Note [Responses status]
// As OpenAI's: "completed" when the model ended its turn, "incomplete" with
// incomplete_details.reason "max_output_tokens" when the token budget ran
// out (the stream then ends in `response.incomplete`, not
// `response.completed`). Nothing is stored: `store: true`,
// `previous_response_id`, `background` are refused by the parser.
//
// The stream's events, in order (each `event: <type>` + `data: <json>`
// with a sequence_number): response.created, response.in_progress; per
// output item response.output_item.added, then for a message
// response.content_part.added, response.output_text.delta…,
// response.output_text.done, response.content_part.done, and for a
// function call response.function_call_arguments.delta / .done; then
// response.output_item.done; finally response.completed (or
// response.incomplete). Text is streamed as it is generated; a tool call is
// sent whole once generated (Note [Tool-call hold-back] in runtime text.cc).
#include <ctime>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "arbiter/base/log_safe.h"
#include "arbiter/server/openai.h"
#include "server/internal/context.h"
#include "server/internal/errors.h"
#include "server/internal/json_fields.h"

namespace arbiter::server_internal {
namespace {

// Keys in the order written: the tools' parameters and the text.format
// schema echoed as the client sent them, the Response's own fields as
// built.
using json = nlohmann::ordered_json;

json ToolChoiceJson(const ToolChoice& c) {
  switch (c.mode) {
    case ToolChoice::Mode::kNone: return "none";
    case ToolChoice::Mode::kRequired: return "required";
    case ToolChoice::Mode::kFunction: return json{{"type", "function"}, {"name", c.function}};
    case ToolChoice::Mode::kAuto: break;
  }
  return "auto";
}

// The Response object's fixed part: what the request asked for.
struct ResponseShape {
  std::string id;
  int64_t created_at = 0;
  std::string model;
  std::string instructions;
  std::optional<int> max_output_tokens;
  SamplingFields sampling;
  std::vector<ToolDefinition> tools;
  ToolChoice tool_choice;
  bool parallel = true;
  OutputFormat format;
  std::string user;
};

json MessageItem(const std::string& id, const std::string& text, std::string_view status) {
  json content = json::array();
  if (status == "completed") {
    content.push_back({{"type", "output_text"},
                       {"text", text},
                       {"annotations", json::array()},
                       {"logprobs", json::array()}});
  }
  return {{"type", "message"},
          {"id", id},
          {"status", status},
          {"role", "assistant"},
          {"content", std::move(content)}};
}

json CallItem(const std::string& id, const ToolCall& c, std::string_view status) {
  return {{"type", "function_call"}, {"id", id},         {"call_id", c.id},
          {"name", c.name},          {"arguments", c.arguments}, {"status", status}};
}

// The Response object; `result` null while in progress.
json ResponseJson(const ResponseShape& s, const TextResult* result, const json& output) {
  json tools = json::array();
  for (const ToolDefinition& t : s.tools) {
    tools.push_back({{"type", "function"},
                     {"name", t.name},
                     {"description", t.description.empty() ? json(nullptr) : json(t.description)},
                     {"parameters", t.parameters.empty() ? json::object()
                                                         : json::parse(t.parameters, nullptr, false)},
                     {"strict", true}});
  }
  json format = {{"type", "text"}};
  if (s.format.kind == OutputConstraintKind::kJsonObject) format = {{"type", "json_object"}};
  if (s.format.kind == OutputConstraintKind::kJsonSchema) {
    format = {{"type", "json_schema"},
              {"name", "response"},
              {"schema", json::parse(s.format.text, nullptr, false)},
              {"strict", true}};
  }
  std::string status = "in_progress";
  json incomplete = nullptr;
  json usage = nullptr;
  if (result != nullptr) {
    const GenerationResult& g = result->generation;
    const bool length = g.finish_reason == FinishReason::kLength && result->tool_calls.empty();
    status = length ? "incomplete" : "completed";
    if (length) incomplete = {{"reason", "max_output_tokens"}};
    const int out_tokens = static_cast<int>(g.output_ids.size());
    usage = {{"input_tokens", g.prompt_tokens},
             {"input_tokens_details", {{"cached_tokens", g.cached_tokens}}},
             {"output_tokens", out_tokens},
             {"output_tokens_details", {{"reasoning_tokens", 0}}},
             {"total_tokens", g.prompt_tokens + out_tokens}};
  }
  return {{"id", s.id},
          {"object", "response"},
          {"created_at", s.created_at},
          {"status", status},
          {"background", false},
          {"error", nullptr},
          {"incomplete_details", incomplete},
          {"instructions", s.instructions.empty() ? json(nullptr) : json(s.instructions)},
          {"max_output_tokens", s.max_output_tokens ? json(*s.max_output_tokens) : json(nullptr)},
          {"model", s.model},
          {"output", output},
          {"parallel_tool_calls", s.parallel},
          {"previous_response_id", nullptr},
          {"reasoning", {{"effort", nullptr}, {"summary", nullptr}}},
          {"store", false},
          {"temperature", s.sampling.temperature.value_or(1.0)},
          {"text", {{"format", std::move(format)}}},
          {"tool_choice", ToolChoiceJson(s.tool_choice)},
          {"tools", std::move(tools)},
          {"top_p", s.sampling.top_p.value_or(1.0)},
          {"truncation", "disabled"},
          {"usage", usage},
          {"user", s.user.empty() ? json(nullptr) : json(s.user)},
          {"metadata", json::object()}};
}

// The output items of a finished run: the message (when it has text or
// made no call) and one function_call item per call.
json OutputOf(const TextResult& r, const std::string& message_id,
              const std::vector<std::string>& call_ids) {
  json output = json::array();
  if (!r.content.empty() || r.tool_calls.empty()) {
    json item = MessageItem(message_id, r.content, "completed");
    if (r.generation.finish_reason == FinishReason::kLength) item["status"] = "incomplete";
    output.push_back(std::move(item));
  }
  for (size_t i = 0; i < r.tool_calls.size(); ++i) {
    output.push_back(CallItem(call_ids[i], r.tool_calls[i], "completed"));
  }
  return output;
}

// A finished run: its metrics recorded, ids given to its tool calls;
// returns the calls' output item ids ("fc_…").
std::vector<std::string> FinishRun(TextRun& metrics, TextResult* result) {
  metrics.Finished(result->generation.prompt_tokens,
                   static_cast<int>(result->generation.output_ids.size()));
  std::vector<std::string> call_ids;
  for (ToolCall& c : result->tool_calls) {
    c.id = NewToolCallId();
    call_ids.push_back(NewItemId("fc"));
  }
  return call_ids;
}

void RunStreamingResponse(ServerContext& ctx, http::Responder& out, TextGeneration& gen,
                          const ResponseShape& shape, TextRun& metrics) {
  bool client_ok = true;
  bool started = false;
  int sequence = 0;
  auto event = [&](json data) {
    if (!client_ok) return false;
    if (!started) {
      started = true;
      if (!out.StartStream(200, "text/event-stream",
                           {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}})) {
        client_ok = false;
        return false;
      }
    }
    data["sequence_number"] = sequence++;
    const std::string type = data["type"].get<std::string>();
    if (!out.Write("event: " + type + "\n" + SseData(DumpJson(data)))) client_ok = false;
    return client_ok;
  };
  const std::string message_id = NewItemId("msg");
  bool message_open = false;
  std::string text;
  auto open_message = [&] {
    if (message_open) return client_ok;
    message_open = true;
    event({{"type", "response.output_item.added"},
           {"output_index", 0},
           {"item", MessageItem(message_id, "", "in_progress")}});
    return event({{"type", "response.content_part.added"},
                  {"item_id", message_id},
                  {"output_index", 0},
                  {"content_index", 0},
                  {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}}});
  };
  TextCallback on_text = [&](std::string_view delta) {
    metrics.FirstToken();
    if (sequence == 0) {
      event({{"type", "response.created"}, {"response", ResponseJson(shape, nullptr, json::array())}});
      event({{"type", "response.in_progress"},
             {"response", ResponseJson(shape, nullptr, json::array())}});
    }
    text += delta;
    return open_message() && event({{"type", "response.output_text.delta"},
                                    {"item_id", message_id},
                                    {"output_index", 0},
                                    {"content_index", 0},
                                    {"delta", std::string(delta)},
                                    {"logprobs", json::array()}});
  };
  Result<TextResult> result = gen.Run(on_text, out.cancel_token());
  if (!client_ok) return;
  if (!result.ok()) {
    if (!started) return SendStatus(out, result.status());
    spdlog::error("response {}: generation failed: {}", LogSafe(shape.id),
                  LogSafe(result.status().ToString(), kLogSafeMessageBytes));
    event({{"type", "error"},
           {"code", "generation_failed"},
           {"message", result.status().message()},
           {"param", nullptr}});
    out.End();
    return;
  }
  if (result->generation.finish_reason == FinishReason::kCancelled) {
    if (!started) SendStatus(out, CancelledError("generation cancelled", ErrorReason::kCancelled));
    return;
  }
  if (sequence == 0) {
    event({{"type", "response.created"}, {"response", ResponseJson(shape, nullptr, json::array())}});
    event({{"type", "response.in_progress"}, {"response", ResponseJson(shape, nullptr, json::array())}});
  }
  const std::vector<std::string> call_ids = FinishRun(metrics, &*result);
  int index = 0;
  if (message_open || result->tool_calls.empty()) {
    open_message();
    json part = {{"type", "output_text"}, {"text", text}, {"annotations", json::array()}};
    event({{"type", "response.output_text.done"},
           {"item_id", message_id},
           {"output_index", 0},
           {"content_index", 0},
           {"text", text},
           {"logprobs", json::array()}});
    event({{"type", "response.content_part.done"},
           {"item_id", message_id},
           {"output_index", 0},
           {"content_index", 0},
           {"part", part}});
    event({{"type", "response.output_item.done"},
           {"output_index", 0},
           {"item", MessageItem(message_id, text, "completed")}});
    index = 1;
  }
  for (size_t i = 0; i < result->tool_calls.size(); ++i, ++index) {
    const ToolCall& c = result->tool_calls[i];
    ToolCall empty_args = c;
    empty_args.arguments.clear();
    event({{"type", "response.output_item.added"},
           {"output_index", index},
           {"item", CallItem(call_ids[i], empty_args, "in_progress")}});
    event({{"type", "response.function_call_arguments.delta"},
           {"item_id", call_ids[i]},
           {"output_index", index},
           {"delta", c.arguments}});
    event({{"type", "response.function_call_arguments.done"},
           {"item_id", call_ids[i]},
           {"output_index", index},
           {"arguments", c.arguments}});
    event({{"type", "response.output_item.done"},
           {"output_index", index},
           {"item", CallItem(call_ids[i], c, "completed")}});
  }
  TextResult final_result = *result;
  final_result.content = message_open ? text : result->content;
  json response = ResponseJson(shape, &final_result, OutputOf(final_result, message_id, call_ids));
  const std::string type =
      response["status"] == "completed" ? "response.completed" : "response.incomplete";
  if (event({{"type", type}, {"response", std::move(response)}})) out.End();
  (void)ctx;
}

void HandleResponses(ServerContext& ctx, const http::Request& req, http::Responder& out) {
  if (ProxyIfProcessModel(ctx, req, out, Capability::kText)) return;
  Result<ResponsesRequest> parsed = ParseResponsesRequest(req.body);
  if (!parsed.ok()) return SendStatus(out, parsed.status().WithReason(ErrorReason::kInvalidRequest));
  ResponsesRequest& r = *parsed;
  ResponseShape shape;
  shape.id = NewItemId("resp");
  shape.created_at = static_cast<int64_t>(std::time(nullptr));
  shape.model = r.model;
  if (!r.messages.empty() && r.messages[0].role == "system") shape.instructions = r.messages[0].content;
  shape.max_output_tokens = r.max_output_tokens;
  shape.sampling = r.sampling;
  shape.tools = r.tools.tools;
  shape.tool_choice = r.tools.choice;
  shape.parallel = r.tools.parallel;
  shape.format = r.format;
  shape.user = r.user;
  TextRequest t;
  t.model = std::move(r.model);
  t.chat = true;
  t.messages = std::move(r.messages);
  t.max_tokens = r.max_output_tokens;
  t.sampling = r.sampling.ToSamplingParams();
  t.conversation_id = std::move(r.cache.conversation_id);
  t.cache_ttl = std::move(r.cache.cache_ttl);
  t.constraint = r.format.kind;
  t.constraint_text = std::move(r.format.text);
  t.tools = std::move(r.tools.tools);
  t.tool_choice = r.tools.choice;
  if (Status st = AddChatImages(ctx, r.images, &t); !st.ok()) return SendStatus(out, st);
  Result<std::unique_ptr<TextGeneration>> gen = ctx.runtime->StartText(std::move(t));
  if (!gen.ok()) return SendStatus(out, gen.status());
  TextRun metrics = ctx.metrics->StartTextRun(shape.model);
  if (r.stream) return RunStreamingResponse(ctx, out, **gen, shape, metrics);
  Result<TextResult> result = (*gen)->Run(
      [&metrics](std::string_view) {
        metrics.FirstToken();
        return true;
      },
      out.cancel_token());
  if (!result.ok()) return SendStatus(out, result.status());
  if (result->generation.finish_reason == FinishReason::kCancelled) {
    return SendStatus(out, CancelledError("generation cancelled", ErrorReason::kCancelled));
  }
  const std::vector<std::string> call_ids = FinishRun(metrics, &*result);
  SendJson(out, 200, DumpJson(ResponseJson(shape, &*result, OutputOf(*result, NewItemId("msg"), call_ids))));
}

}  // namespace

std::vector<Route> ResponsesRoutes(ServerContext& ctx) {
  return {{"POST", "/v1/responses", http::Dispatch::kWorker,
           [&ctx](const http::Request& req, http::Responder& out) {
             HandleResponses(ctx, req, out);
           }}};
}

}  // namespace arbiter::server_internal
