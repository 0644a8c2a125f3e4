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

#include "arbiter/base/clip.h"
#include "arbiter/base/log_safe.h"
#include "arbiter/server/openai.h"
#include "server/internal/context.h"
#include "server/internal/errors.h"

namespace arbiter::server_internal {
namespace {

using json = nlohmann::json;

int64_t UnixNow() { return static_cast<int64_t>(std::time(nullptr)); }

// Collects one choice's logprobs from the engine's per-token callback
// (TextRequest::on_token): the token's bytes are read while the model is
// pinned. `tokens` holds the tokens not taken yet: a stream takes them
// with each chunk's text, a JSON answer all of them at the end.
struct TokenCollector {
  const TextGeneration* generation = nullptr;
  std::vector<LogprobToken> tokens;
  void Add(int32_t id, const TokenLogprob* lp) {
    if (lp == nullptr || generation == nullptr) return;
    LogprobToken t;
    t.bytes = generation->TokenBytes(id);
    t.logprob = lp->logprob;
    for (const auto& [alt, alt_lp] : lp->top) t.top.emplace_back(generation->TokenBytes(alt), alt_lp);
    tokens.push_back(std::move(t));
  }
};

// What the text runner needs to shape a response, besides the generations.
struct TextJob {
  // One admitted generation per choice, with its collector (null without
  // logprobs); choice i ran with seed + i when a seed was given.
  std::vector<std::unique_ptr<TextGeneration>> choices;
  std::vector<std::unique_ptr<TokenCollector>> collectors;
  bool chat = true;
  bool logprobs = false;
  std::string id;
  std::string model;
  int64_t created = 0;
  bool include_usage = false;
  TextRun metrics;  // TTFT, TPOT, e2e, tokens, running/waiting (internal/metrics.h)
};

// Usage over the choices: the prompt counts once.
Usage UsageOf(const std::vector<TextResult>& results) {
  Usage u;
  if (results.empty()) return u;
  u.prompt_tokens = results[0].generation.prompt_tokens;
  u.cached_tokens = results[0].generation.cached_tokens;
  for (const TextResult& r : results) u.completion_tokens += static_cast<int>(r.generation.output_ids.size());
  return u;
}

// Tool calls get their ids here (the runtime parses them without).
void AssignToolCallIds(TextResult* r) {
  for (ToolCall& c : r->tool_calls) c.id = NewToolCallId();
}

// The text runner: the admitted choices, run one after the other, answered as JSON.
void RunNonStreaming(ServerContext& ctx, http::Responder& out, TextJob& job) {
  std::vector<TextResult> results;
  std::vector<std::pair<std::string, std::string>> headers;
  for (size_t i = 0; i < job.choices.size(); ++i) {
    Result<TextResult> result =
        job.choices[i]->Run(
            [&job](std::string_view) {
              job.metrics.FirstToken();
              return true;
            },
            out.cancel_token());
    if (!result.ok()) return SendStatus(out, result.status());
    if (result->generation.finish_reason == FinishReason::kCancelled) {
      spdlog::info("{} {}: client went away; generation stopped after {} tokens", LogSafe(job.id),
                   LogSafe(job.model), result->generation.output_ids.size());
      return SendStatus(out, CancelledError("generation cancelled", ErrorReason::kCancelled));
    }
    if (i == 0 && result->kv.slot >= 0) {
      const KvOutcome& kv = result->kv;
      headers.emplace_back("X-Arbiter-Kv-Slot", std::to_string(kv.slot));
      headers.emplace_back("X-Arbiter-Kv-Source", std::string(KvSourceName(kv.source)));
      if (kv.restored_tokens > 0) {
        headers.emplace_back("X-Arbiter-Kv-Restored", std::to_string(kv.restored_tokens));
      }
    }
    AssignToolCallIds(&*result);
    results.push_back(std::move(result).value());
  }
  std::vector<Choice> choices;
  for (size_t i = 0; i < results.size(); ++i) {
    Choice c;
    const std::string& echo = job.choices[i]->echo_text();
    c.text = job.chat ? results[i].content : echo + results[i].generation.text;
    c.tool_calls = std::move(results[i].tool_calls);
    c.finish = results[i].generation.finish_reason;
    c.logprobs = job.logprobs;
    if (job.logprobs) c.tokens = std::move(job.collectors[i]->tokens);
    c.text_offset = echo.size();
    choices.push_back(std::move(c));
  }
  const Usage usage = UsageOf(results);
  job.metrics.Finished(usage.prompt_tokens, usage.completion_tokens);
  SendJson(out, 200,
           job.chat ? ChatCompletionJson(job.id, job.created, job.model, choices, usage)
                    : CompletionJson(job.id, job.created, job.model, choices, usage),
           std::move(headers));
  (void)ctx;
}

// The text runner: the admitted choices as SSE chunks (choice after
// choice, each with its index), ending in `data: [DONE]`. The headers go
// out with the first piece of output, or when the generation ends: an
// error before that — the weights cannot get room in the budget,
// externally managed weights were demoted — is still a plain JSON error
// with its status and Retry-After (docs/http-api.md "Streaming"). Errors
// after the headers are reported in-band.
void RunStreaming(ServerContext& ctx, http::Responder& out, TextJob& job) {
  bool client_ok = true;
  bool started = false;
  auto write = [&](const std::string& payload) {
    if (client_ok && !out.Write(SseData(payload))) client_ok = false;
    return client_ok;
  };
  auto start = [&] {
    if (started) return client_ok;
    started = true;
    if (!out.StartStream(200, "text/event-stream",
                         {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}})) {
      client_ok = false;  // the client is gone already
    }
    return client_ok;
  };
  auto send = [&](const std::string& payload) { return start() && write(payload); };
  const std::string assistant = "assistant";
  const std::string empty;
  std::vector<TextResult> results;
  for (size_t i = 0; i < job.choices.size(); ++i) {
    const int index = static_cast<int>(i);
    TextGeneration& gen = *job.choices[i];
    TokenCollector* tokens = job.logprobs ? job.collectors[i].get() : nullptr;
    const std::string& echo = gen.echo_text();
    size_t offset = 0;  // completions: text sent so far in this choice
    bool opened = false;
    auto open = [&] {
      if (opened) return client_ok;
      opened = true;
      if (job.chat) {
        ChunkDelta d;
        d.index = index;
        d.role = &assistant;
        d.content = &empty;
        return send(ChatChunkJson(job.id, job.created, job.model, d, job.include_usage));
      }
      if (echo.empty()) return start();
      offset = echo.size();
      return send(CompletionChunkJson(job.id, job.created, job.model, index, echo, nullptr, 0, "",
                                      job.include_usage));
    };
    // A chunk of text (or of nothing but `finish`) with the tokens behind it.
    auto chunk = [&](const std::string& text, std::string_view finish) {
      std::vector<LogprobToken> lps;
      if (tokens != nullptr) lps.swap(tokens->tokens);
      // The last chunk carries logprobs only for tokens not yet sent.
      const std::vector<LogprobToken>* lp =
          tokens != nullptr && !(lps.empty() && !finish.empty()) ? &lps : nullptr;
      if (job.chat) {
        ChunkDelta d;
        d.index = index;
        d.content = text.empty() ? nullptr : &text;
        d.logprobs = lp;
        d.finish = finish;
        return send(ChatChunkJson(job.id, job.created, job.model, d, job.include_usage));
      }
      const size_t at = offset;
      offset += text.size();
      return send(CompletionChunkJson(job.id, job.created, job.model, index, text, lp, at, finish,
                                      job.include_usage));
    };
    TextCallback on_text = [&](std::string_view delta) {
      job.metrics.FirstToken();
      return open() && chunk(std::string(delta), "");
    };
    Result<TextResult> result = gen.Run(on_text, out.cancel_token());
    if (!client_ok) {
      spdlog::info("stream {}: client went away; generation stopped", LogSafe(job.id));
      return;
    }
    if (!result.ok()) {
      const Status& st = result.status();
      if (!started) return SendStatus(out, st);  // nothing sent yet: a normal error
      // Headers are gone; report in-band, then end the stream.
      spdlog::error("stream {}: generation failed: {}", LogSafe(job.id),
                    LogSafe(st.ToString(), kLogSafeMessageBytes));
      send(ErrorJson(st.message(), kServerErrorType, "generation_failed"));
      if (client_ok && out.Write("data: [DONE]\n\n")) out.End();
      return;
    }
    if (result->generation.finish_reason == FinishReason::kCancelled) {
      spdlog::info("stream {}: cancelled after {} tokens ({})", LogSafe(job.id),
                   result->generation.output_ids.size(),
                   ctx.stopping.load() ? "server stopping" : "client went away");
      if (!started) SendStatus(out, CancelledError("generation cancelled", ErrorReason::kCancelled));
      return;
    }
    AssignToolCallIds(&*result);
    open();
    if (!result->tool_calls.empty()) {
      ChunkDelta d;
      d.index = index;
      d.tool_calls = &result->tool_calls;
      send(ChatChunkJson(job.id, job.created, job.model, d, job.include_usage));
      chunk("", "tool_calls");
    } else {
      chunk("", OpenAIFinishReason(result->generation.finish_reason));
    }
    results.push_back(std::move(result).value());
  }
  job.metrics.Finished(UsageOf(results).prompt_tokens, UsageOf(results).completion_tokens);
  if (job.include_usage) {
    send(UsageChunkJson(job.id, job.created, job.model,
                        job.chat ? "chat.completion.chunk" : "text_completion", UsageOf(results)));
  }
  if (client_ok && out.Write("data: [DONE]\n\n")) out.End();
}

// Admits `n` choices of `request` (choice i with seed + i when a seed is
// given: reproducible per choice) and answers them, streaming or not.
// `top_logprobs`: -1 = no logprobs.
void RunText(ServerContext& ctx, http::Responder& out, TextRequest request, int n, bool stream,
             bool include_usage, int top_logprobs) {
  TextJob job;
  job.chat = request.chat;
  job.model = request.model;
  job.logprobs = top_logprobs >= 0;
  request.top_logprobs = top_logprobs;
  for (int i = 0; i < n; ++i) {
    TextRequest one = request;
    if (one.sampling.has_seed) one.sampling.seed += static_cast<uint64_t>(i);
    if (job.logprobs) {
      auto collector = std::make_unique<TokenCollector>();
      one.on_token = [c = collector.get()](int32_t id, const TokenLogprob* lp) { c->Add(id, lp); };
      job.collectors.push_back(std::move(collector));
    }
    Result<std::unique_ptr<TextGeneration>> admitted = ctx.runtime->StartText(std::move(one));
    if (!admitted.ok()) return SendStatus(out, admitted.status());
    if (job.logprobs) job.collectors.back()->generation = admitted->get();
    job.choices.push_back(std::move(admitted).value());
  }
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
  t.constraint = r.format.kind;
  t.constraint_text = std::move(r.format.text);
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
  t.tools = std::move(r.tools.tools);
  t.tool_choice = r.tools.choice;
  if (Status st = AddChatImages(ctx, r.images, &t); !st.ok()) return SendStatus(out, st);
  RunText(ctx, out, std::move(t), r.n, r.stream, r.include_usage,
          r.logprobs ? r.top_logprobs : -1);
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
  RunText(ctx, out, std::move(t), r.n, r.stream, r.include_usage, r.logprobs.value_or(-1));
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
  SendStatus(out, NotFoundError(fmt::format("The model '{}' does not exist", ClipInput(id)),
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
