// The OpenAI routes: GET /v1/models, POST /v1/chat/completions,
// POST /v1/completions (one text runner for both, streaming and not) and
// POST /v1/embeddings. Each parses its body into a native request at the
// edge (openai.h), hands it to the Runtime, and serializes the result.
//
// Note [Cancellation]
// Every generation and embedding gets its Responder's CancelToken, checked by
// the engine between tokens and waking a wait for a KV slot at once (no
// polling). The transport fires it when the client is gone — it keeps
// reading the connection while the handler runs and cancels the Responder
// on EOF or a reset, for streaming and non-streaming requests alike — when
// a stream write fails or times out, and when the server stops (Stop()
// cancels every Responder being answered). A stream also stops when a
// write returns false (the TextCallback's result).
#include <ctime>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "arbiter/server/openai.h"
#include "server/internal/context.h"
#include "server/internal/errors.h"

namespace arbiter::server_internal {
namespace {

using json = nlohmann::json;

int64_t UnixNow() { return static_cast<int64_t>(std::time(nullptr)); }

// What the text runner needs to shape a response, besides the generation.
struct TextJob {
  std::unique_ptr<TextGeneration> generation;
  bool chat = true;
  std::string id;
  std::string model;
  int64_t created = 0;
  bool include_usage = false;
  TextRun metrics;  // TTFT, TPOT, e2e, tokens, running/waiting (internal/metrics.h)
};

Usage UsageOf(const GenerationResult& g) {
  return Usage{g.prompt_tokens, static_cast<int>(g.output_ids.size()), g.cached_tokens};
}

// The text runner: one admitted generation answered as JSON.
void RunNonStreaming(ServerContext& ctx, http::Responder& out, TextJob& job) {
  Result<TextResult> result = job.generation->Run(
      [&job](std::string_view) {
        job.metrics.FirstToken();
        return true;
      },
      out.cancel_token());
  if (result.ok()) {
    job.metrics.Finished(result->generation.prompt_tokens,
                         static_cast<int>(result->generation.output_ids.size()));
  }
  std::vector<std::pair<std::string, std::string>> headers;
  if (result.ok() && result->kv.slot >= 0) {
    const KvOutcome& kv = result->kv;
    headers.emplace_back("X-Arbiter-Kv-Slot", std::to_string(kv.slot));
    headers.emplace_back("X-Arbiter-Kv-Source", std::string(KvSourceName(kv.source)));
    if (kv.restored_tokens > 0) {
      headers.emplace_back("X-Arbiter-Kv-Restored", std::to_string(kv.restored_tokens));
    }
  }
  if (!result.ok()) return SendStatus(out, result.status());
  const GenerationResult& g = result->generation;
  if (g.finish_reason == FinishReason::kCancelled) {
    spdlog::info("{} {}: client went away; generation stopped after {} tokens", job.id, job.model,
                 g.output_ids.size());
    return SendStatus(out, CancelledError("generation cancelled", ErrorReason::kCancelled));
  }
  const std::string& echo = job.generation->echo_text();
  SendJson(out, 200,
           job.chat ? ChatCompletionJson(job.id, job.created, job.model, g.text, g.finish_reason,
                                         UsageOf(g))
                    : CompletionJson(job.id, job.created, job.model, echo + g.text,
                                     g.finish_reason, UsageOf(g)),
           std::move(headers));
}

// The text runner: one admitted generation as SSE chunks, ending in
// `data: [DONE]`. The headers (and the role or echo chunk) go out with the
// first piece of text, or when the generation ends: an error before that —
// the weights cannot get room in the budget, externally managed weights were
// demoted — is still a plain JSON error with its status and Retry-After
// (docs/http-api.md "Streaming"). Errors after the headers are reported
// in-band.
void RunStreaming(ServerContext& ctx, http::Responder& out, TextJob& job) {
  bool client_ok = true;
  bool started = false;
  auto write = [&](const std::string& payload) {
    if (client_ok && !out.Write(SseData(payload))) client_ok = false;
    return client_ok;
  };
  const std::string assistant = "assistant";
  const std::string empty;
  const std::string& echo = job.generation->echo_text();
  auto start = [&] {
    if (started) return client_ok;
    started = true;
    if (!out.StartStream(200, "text/event-stream",
                         {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}})) {
      client_ok = false;  // the client is gone already
      return false;
    }
    if (job.chat) {
      write(ChatChunkJson(job.id, job.created, job.model, &assistant, &empty, nullptr,
                          job.include_usage));
    } else if (!echo.empty()) {
      write(CompletionChunkJson(job.id, job.created, job.model, echo, nullptr,
                                job.include_usage));
    }
    return client_ok;
  };
  auto send = [&](const std::string& payload) { return start() && write(payload); };
  TextCallback on_text = [&](std::string_view delta) {
    job.metrics.FirstToken();
    const std::string text(delta);
    return send(job.chat ? ChatChunkJson(job.id, job.created, job.model, nullptr, &text, nullptr,
                                         job.include_usage)
                         : CompletionChunkJson(job.id, job.created, job.model, text, nullptr,
                                               job.include_usage));
  };
  Result<TextResult> result = job.generation->Run(on_text, out.cancel_token());
  if (result.ok()) {
    job.metrics.Finished(result->generation.prompt_tokens,
                         static_cast<int>(result->generation.output_ids.size()));
  }
  if (!client_ok) {
    spdlog::info("stream {}: client went away; generation stopped", job.id);
    return;
  }
  if (!result.ok()) {
    const Status& st = result.status();
    if (!started) return SendStatus(out, st);  // nothing sent yet: a normal error
    // Headers are gone; report in-band, then end the stream.
    spdlog::error("stream {}: generation failed: {}", job.id, st.ToString());
    send(ErrorJson(st.message(), kServerErrorType, "generation_failed"));
  } else if (result->generation.finish_reason == FinishReason::kCancelled) {
    spdlog::info("stream {}: cancelled after {} tokens ({})", job.id,
                 result->generation.output_ids.size(),
                 ctx.stopping.load() ? "server stopping" : "client went away");
    if (!started) SendStatus(out, CancelledError("generation cancelled", ErrorReason::kCancelled));
    return;
  } else {
    const GenerationResult& g = result->generation;
    const FinishReason fr = g.finish_reason;
    send(job.chat ? ChatChunkJson(job.id, job.created, job.model, nullptr, nullptr, &fr,
                                  job.include_usage)
                  : CompletionChunkJson(job.id, job.created, job.model, "", &fr,
                                        job.include_usage));
    if (job.include_usage) {
      send(UsageChunkJson(job.id, job.created, job.model,
                          job.chat ? "chat.completion.chunk" : "text_completion", UsageOf(g)));
    }
  }
  if (client_ok && out.Write("data: [DONE]\n\n")) out.End();
}

// Admits `request` and answers it (chat or completion, streaming or not).
void RunText(ServerContext& ctx, http::Responder& out, TextRequest request, bool stream,
             bool include_usage) {
  TextJob job;
  job.chat = request.chat;
  job.model = request.model;
  Result<std::unique_ptr<TextGeneration>> admitted = ctx.runtime->StartText(std::move(request));
  if (!admitted.ok()) return SendStatus(out, admitted.status());
  job.generation = std::move(admitted).value();
  job.id = NewCompletionId(job.chat ? "chatcmpl" : "cmpl");
  job.created = UnixNow();
  job.include_usage = include_usage;
  job.metrics = ctx.metrics->StartTextRun(job.model);
  if (stream) return RunStreaming(ctx, out, job);
  RunNonStreaming(ctx, out, job);
}

// The fields chat and completion requests share.
template <typename Parsed>
TextRequest SharedTextFields(Parsed& r) {
  TextRequest t;
  t.model = std::move(r.model);
  t.max_tokens = r.max_tokens;
  t.sampling = r.sampling.ToSamplingParams();
  t.stop = std::move(r.stop);
  t.conversation_id = std::move(r.cache.conversation_id);
  t.cache_ttl = std::move(r.cache.cache_ttl);
  return t;
}

void HandleChat(ServerContext& ctx, const http::Request& req, http::Responder& out) {
  if (ProxyIfProcessModel(ctx, req, out, Capability::kText)) return;
  Result<ChatRequest> parsed = ParseChatRequest(req.body);
  if (!parsed.ok()) return SendStatus(out, parsed.status().WithReason(ErrorReason::kInvalidRequest));
  ChatRequest& r = *parsed;
  TextRequest t = SharedTextFields(r);
  t.chat = true;
  t.messages = std::move(r.messages);
  if (!r.images.empty()) {
    Result<std::vector<ChatImage>> images = ChatImagesOf(ctx, r.images);
    if (!images.ok()) return SendStatus(out, images.status());
    t.images = std::move(images).value();
  }
  RunText(ctx, out, std::move(t), r.stream, r.include_usage);
}

void HandleCompletion(ServerContext& ctx, const http::Request& req, http::Responder& out) {
  if (ProxyIfProcessModel(ctx, req, out, Capability::kText)) return;
  Result<CompletionRequest> parsed = ParseCompletionRequest(req.body);
  if (!parsed.ok()) return SendStatus(out, parsed.status().WithReason(ErrorReason::kInvalidRequest));
  CompletionRequest& r = *parsed;
  TextRequest t = SharedTextFields(r);
  t.chat = false;
  t.prompt = std::move(r.prompt);
  t.prompt_ids = std::move(r.prompt_ids);
  t.prompt_is_ids = r.prompt_is_ids;
  t.echo = r.echo;
  RunText(ctx, out, std::move(t), r.stream, r.include_usage);
}

void HandleEmbeddings(ServerContext& ctx, const http::Request& req, http::Responder& out) {
  if (ProxyIfProcessModel(ctx, req, out, Capability::kEmbedding)) return;
  Result<EmbeddingRequest> parsed = ParseEmbeddingRequest(req.body);
  if (!parsed.ok()) return SendStatus(out, parsed.status().WithReason(ErrorReason::kInvalidRequest));
  EmbedRequest e;
  e.model = parsed->model;
  e.inputs = std::move(parsed->input);
  e.dimensions = parsed->dimensions;
  Result<EmbedResult> r = ctx.runtime->Embed(e, out.cancel_token());
  if (!r.ok()) return SendStatus(out, r.status());
  SendJson(out, 200, EmbeddingsJson(e.model, r->vectors, parsed->base64, r->prompt_tokens));
}

// One model of GET /v1/models and GET /v1/models/{id}.
json ModelJson(const ServerContext& ctx, const ModelStats& m) {
  json item = {{"id", m.name},
               {"object", "model"},
               {"created", ctx.started_at},
               {"owned_by", "arbiter"},
               {"capability", CapabilityName(m.capability)},
               {"status", ModelStateName(m.state)}};
  if (m.state == ModelState::kFailed) item["error"] = m.last_error;
  return item;
}

void HandleModels(ServerContext& ctx, http::Responder& out) {
  RuntimeStatus s = ctx.runtime->Status();
  json data = json::array();
  for (const ModelStatus& ms : s.models) data.push_back(ModelJson(ctx, ms.arbiter));
  SendJson(out, 200, json{{"object", "list"}, {"data", std::move(data)}}.dump());
}

// The OpenAI SDK's models.retrieve; unknown ids → 404 model_not_found.
void HandleModel(ServerContext& ctx, const http::Request& req, http::Responder& out) {
  const std::string id = req.params.count("id") != 0 ? req.params.at("id") : "";
  for (const ModelStatus& ms : ctx.runtime->Status().models) {
    if (ms.arbiter.name == id) return SendJson(out, 200, ModelJson(ctx, ms.arbiter).dump());
  }
  SendStatus(out, NotFoundError(fmt::format("The model '{}' does not exist", id),
                                ErrorReason::kModelNotFound));
}

}  // namespace

std::vector<Route> OpenAIRoutes(ServerContext& ctx) {
  using http::Dispatch;
  using http::Request;
  using http::Responder;
  return {
      // A snapshot: answered on the event loop even while workers are busy.
      {"GET", "/v1/models", Dispatch::kInline,
       [&ctx](const Request&, Responder& out) { HandleModels(ctx, out); }},
      {"GET", "/v1/models/{id...}", Dispatch::kInline,
       [&ctx](const Request& req, Responder& out) { HandleModel(ctx, req, out); }},
      {"POST", "/v1/chat/completions", Dispatch::kWorker,
       [&ctx](const Request& req, Responder& out) { HandleChat(ctx, req, out); }},
      {"POST", "/v1/completions", Dispatch::kWorker,
       [&ctx](const Request& req, Responder& out) { HandleCompletion(ctx, req, out); }},
      {"POST", "/v1/embeddings", Dispatch::kWorker,
       [&ctx](const Request& req, Responder& out) { HandleEmbeddings(ctx, req, out); }},
  };
}

}  // namespace arbiter::server_internal
