// The OpenAI routes: GET /v1/models, POST /v1/chat/completions,
// POST /v1/completions (one text runner for both, streaming and not) and
// POST /v1/embeddings. Each parses its body into a native request at the
// edge (openai.h), hands it to the Runtime, and serializes the result.
//
// Note [Cancellation]
// Every generation gets a CancelFn, polled by the engine between tokens and
// while waiting for a slot. It returns true when the server is stopping, or
// the client is gone: for SSE, when a write fails or sink.is_writable()
// (select + MSG_PEEK liveness check in httplib) says so; for non-streaming
// requests, when the ConnectionProbe sees a hang-up on the request's socket.
#include <ctime>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "arbiter/server/openai.h"
#include "server/internal/connection_probe.h"
#include "server/internal/context.h"
#include "server/internal/errors.h"

namespace arbiter::server_internal {
namespace {

using json = nlohmann::json;
constexpr const char* kJson = "application/json";

int64_t UnixNow() { return static_cast<int64_t>(std::time(nullptr)); }

// What the text runner needs to shape a response, besides the generation.
struct TextJob {
  std::unique_ptr<TextGeneration> generation;
  bool chat = true;
  std::string id;
  std::string model;
  int64_t created = 0;
  bool include_usage = false;
};

Usage UsageOf(const GenerationResult& g) {
  return Usage{g.prompt_tokens, static_cast<int>(g.output_ids.size()), g.cached_tokens};
}

// The text runner: one admitted generation answered as JSON.
void RunNonStreaming(ServerContext& ctx, const httplib::Request& req, httplib::Response& res,
                     TextJob& job) {
  const ConnectionProbe probe =
      ConnectionProbe::Find(req.remote_addr, req.remote_port, req.local_addr, req.local_port);
  CancelFn cancel = [&ctx, &probe] { return ctx.stopping.load() || probe.PeerGone(); };
  Result<TextResult> result = job.generation->Run([](std::string_view) { return true; }, cancel);
  if (result.ok() && result->kv.slot >= 0) {
    const KvOutcome& kv = result->kv;
    res.set_header("X-Arbiter-Kv-Slot", std::to_string(kv.slot));
    res.set_header("X-Arbiter-Kv-Source", std::string(KvSourceName(kv.source)));
    if (kv.restored_tokens > 0) {
      res.set_header("X-Arbiter-Kv-Restored", std::to_string(kv.restored_tokens));
    }
  }
  if (!result.ok()) return SendStatus(res, result.status());
  const GenerationResult& g = result->generation;
  if (g.finish_reason == FinishReason::kCancelled) {
    spdlog::info("{} {}: client went away; generation stopped after {} tokens", req.method,
                 req.path, g.output_ids.size());
    return SendStatus(res, CancelledError("generation cancelled", ErrorReason::kCancelled));
  }
  const std::string& echo = job.generation->echo_text();
  res.set_content(job.chat ? ChatCompletionJson(job.id, job.created, job.model, g.text,
                                                g.finish_reason, UsageOf(g))
                           : CompletionJson(job.id, job.created, job.model, echo + g.text,
                                            g.finish_reason, UsageOf(g)),
                  kJson);
}

// The text runner: one admitted generation as SSE chunks, ending in
// `data: [DONE]`; errors after the headers are reported in-band.
void RunStreaming(ServerContext& ctx, httplib::Response& res, std::shared_ptr<TextJob> job) {
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream", [&ctx, job](size_t /*offset*/, httplib::DataSink& sink) {
        bool client_ok = true;
        auto send = [&](const std::string& payload) {
          if (!client_ok) return false;
          const std::string frame = SseData(payload);
          if (!sink.write(frame.data(), frame.size())) client_ok = false;
          return client_ok;
        };
        const std::string assistant = "assistant";
        const std::string empty;
        const std::string& echo = job->generation->echo_text();
        if (job->chat) {
          send(ChatChunkJson(job->id, job->created, job->model, &assistant, &empty, nullptr,
                             job->include_usage));
        } else if (!echo.empty()) {
          send(CompletionChunkJson(job->id, job->created, job->model, echo, nullptr,
                                   job->include_usage));
        }
        TextCallback on_text = [&](std::string_view delta) {
          const std::string text(delta);
          return send(job->chat ? ChatChunkJson(job->id, job->created, job->model, nullptr, &text,
                                                nullptr, job->include_usage)
                                : CompletionChunkJson(job->id, job->created, job->model, text,
                                                      nullptr, job->include_usage));
        };
        CancelFn cancel = [&] { return !client_ok || ctx.stopping.load() || !sink.is_writable(); };
        Result<TextResult> result = job->generation->Run(on_text, cancel);
        if (!client_ok) {
          spdlog::info("stream {}: client went away; generation stopped", job->id);
          return false;  // closes the connection
        }
        if (!result.ok()) {
          // Headers are gone; report in-band, then end the stream.
          const Status& st = result.status();
          spdlog::error("stream {}: generation failed: {}", job->id, st.ToString());
          send(ErrorJson(st.message(), kServerErrorType, "generation_failed"));
        } else if (result->generation.finish_reason == FinishReason::kCancelled) {
          spdlog::info("stream {}: cancelled after {} tokens ({})", job->id,
                       result->generation.output_ids.size(),
                       ctx.stopping.load() ? "server stopping" : "client went away");
          return false;
        } else {
          const GenerationResult& g = result->generation;
          const FinishReason fr = g.finish_reason;
          send(job->chat ? ChatChunkJson(job->id, job->created, job->model, nullptr, nullptr, &fr,
                                         job->include_usage)
                         : CompletionChunkJson(job->id, job->created, job->model, "", &fr,
                                               job->include_usage));
          if (job->include_usage) {
            send(UsageChunkJson(job->id, job->created, job->model,
                                job->chat ? "chat.completion.chunk" : "text_completion",
                                UsageOf(g)));
          }
        }
        const std::string done = "data: [DONE]\n\n";
        if (!client_ok || !sink.write(done.data(), done.size())) return false;
        sink.done();
        return true;
      });
}

// Admits `request` and answers it (chat or completion, streaming or not).
void RunText(ServerContext& ctx, const httplib::Request& req, httplib::Response& res,
             TextRequest request, bool stream, bool include_usage) {
  auto job = std::make_shared<TextJob>();
  job->chat = request.chat;
  job->model = request.model;
  Result<std::unique_ptr<TextGeneration>> admitted = ctx.runtime->StartText(std::move(request));
  if (!admitted.ok()) return SendStatus(res, admitted.status());
  job->generation = std::move(admitted).value();
  job->id = NewCompletionId(job->chat ? "chatcmpl" : "cmpl");
  job->created = UnixNow();
  job->include_usage = include_usage;
  if (stream) return RunStreaming(ctx, res, std::move(job));
  RunNonStreaming(ctx, req, res, *job);
}

void HandleChat(ServerContext& ctx, const httplib::Request& req, httplib::Response& res) {
  Result<ChatRequest> parsed = ParseChatRequest(req.body);
  if (!parsed.ok()) return SendStatus(res, parsed.status().WithReason(ErrorReason::kInvalidRequest));
  ChatRequest& r = *parsed;
  TextRequest t;
  t.model = std::move(r.model);
  t.chat = true;
  t.messages = std::move(r.messages);
  t.max_tokens = r.max_tokens;
  t.sampling = r.sampling.ToSamplingParams();
  t.stop = std::move(r.stop);
  t.conversation_id = std::move(r.cache.conversation_id);
  t.cache_ttl = std::move(r.cache.cache_ttl);
  RunText(ctx, req, res, std::move(t), r.stream, r.include_usage);
}

void HandleCompletion(ServerContext& ctx, const httplib::Request& req, httplib::Response& res) {
  Result<CompletionRequest> parsed = ParseCompletionRequest(req.body);
  if (!parsed.ok()) return SendStatus(res, parsed.status().WithReason(ErrorReason::kInvalidRequest));
  CompletionRequest& r = *parsed;
  TextRequest t;
  t.model = std::move(r.model);
  t.chat = false;
  t.prompt = std::move(r.prompt);
  t.prompt_ids = std::move(r.prompt_ids);
  t.prompt_is_ids = r.prompt_is_ids;
  t.echo = r.echo;
  t.max_tokens = r.max_tokens;
  t.sampling = r.sampling.ToSamplingParams();
  t.stop = std::move(r.stop);
  t.conversation_id = std::move(r.cache.conversation_id);
  t.cache_ttl = std::move(r.cache.cache_ttl);
  RunText(ctx, req, res, std::move(t), r.stream, r.include_usage);
}

void HandleEmbeddings(ServerContext& ctx, const httplib::Request& req, httplib::Response& res) {
  Result<EmbeddingRequest> parsed = ParseEmbeddingRequest(req.body);
  if (!parsed.ok()) return SendStatus(res, parsed.status().WithReason(ErrorReason::kInvalidRequest));
  EmbedRequest e;
  e.model = parsed->model;
  e.inputs = std::move(parsed->input);
  e.dimensions = parsed->dimensions;
  const ConnectionProbe probe =
      ConnectionProbe::Find(req.remote_addr, req.remote_port, req.local_addr, req.local_port);
  CancelFn cancel = [&ctx, &probe] { return ctx.stopping.load() || probe.PeerGone(); };
  Result<EmbedResult> r = ctx.runtime->Embed(e, cancel);
  if (!r.ok()) return SendStatus(res, r.status());
  res.set_content(EmbeddingsJson(e.model, r->vectors, parsed->base64, r->prompt_tokens), kJson);
}

void HandleModels(ServerContext& ctx, httplib::Response& res) {
  RuntimeStatus s = ctx.runtime->Status();
  json data = json::array();
  for (const ModelStatus& ms : s.models) {
    const ModelStats& m = ms.arbiter;
    json item = {{"id", m.name},
                 {"object", "model"},
                 {"created", ctx.started_at},
                 {"owned_by", "arbiter"},
                 {"capability", CapabilityName(m.capability)},
                 {"status", ModelStateName(m.state)}};
    if (m.state == ModelState::kFailed) item["error"] = m.last_error;
    data.push_back(std::move(item));
  }
  res.set_content(json{{"object", "list"}, {"data", std::move(data)}}.dump(), kJson);
}

}  // namespace

void AddOpenAIRoutes(httplib::Server& http, ServerContext& ctx) {
  http.Get("/v1/models",
           [&ctx](const httplib::Request&, httplib::Response& res) { HandleModels(ctx, res); });
  http.Post("/v1/chat/completions", [&ctx](const httplib::Request& req, httplib::Response& res) {
    HandleChat(ctx, req, res);
  });
  http.Post("/v1/completions", [&ctx](const httplib::Request& req, httplib::Response& res) {
    HandleCompletion(ctx, req, res);
  });
  http.Post("/v1/embeddings", [&ctx](const httplib::Request& req, httplib::Response& res) {
    HandleEmbeddings(ctx, req, res);
  });
}

}  // namespace arbiter::server_internal
