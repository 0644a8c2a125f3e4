// Ollama's API (docs/http-api.md "Ollama compatibility"): GET /api/tags,
// GET /api/ps, POST /api/show, POST /api/chat, POST /api/generate,
// POST /api/embed, POST /api/embeddings (legacy), GET /api/version and the
// GET / HEAD / probe. Bodies are parsed by internal/ollama.h; generation
// goes through the Runtime's StartText / Run like the OpenAI runner
// (routes_openai.cc), answered as one JSON object or as NDJSON (one object
// per line, the last with done: true and the timings in nanoseconds).
//
// Errors are Ollama's shape, {"error": "message"}, with the HTTP status of
// the one error table (internal/errors.h) — the ollama client reads
// `error` as a string.
//
// Note [keep_alive]
// A request's keep_alive replaces the model's idle TTL from then on
// (Runtime::SetIdleTtl), applied when the request is done so that a TTL of
// 0 unloads the model right after it (the arbiter's idle sweep runs every
// second; held models are never reaped). A request without keep_alive
// leaves the TTL as it is (the [[models]] idle_ttl, else never). A
// generate with an empty prompt (or a chat without messages) only loads
// the model, or with keep_alive 0 unloads it, as Ollama does.
#include <chrono>
#include <cstdint>
#include <ctime>
#include <limits>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "arbiter/base/log_safe.h"
#include "arbiter/base/hash.h"
#include "arbiter/server/openai.h"
#include "server/internal/context.h"
#include "server/internal/errors.h"
#include "server/internal/json_fields.h"
#include "server/internal/ollama.h"

namespace arbiter::server_internal {
namespace {

// Keys in the order written: a tool call's arguments as the model wrote
// them (a schema's declared order), the answers' own fields as built.
using json = nlohmann::ordered_json;

// The Ollama version /api/version reports: the API level these routes
// follow (clients gate features on it).
constexpr const char* kOllamaVersion = "0.9.0";
constexpr int64_t kUnloadTimeoutMs = 10000;

int64_t UnixNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}
int64_t SteadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void SendOllamaError(http::Responder& out, const Status& status) {
  const HttpError e = HttpErrorFor(status);
  if (e.bug) {
    spdlog::error("bug: unexpected error: {}", LogSafe(status.ToString(), kLogSafeMessageBytes));
  }
  std::vector<std::pair<std::string, std::string>> headers;
  if (e.retry_after_s > 0) headers.emplace_back("Retry-After", std::to_string(e.retry_after_s));
  SendJson(out, e.status, DumpJson(json{{"error", status.message()}}), std::move(headers));
}

Status BadRequest(const Status& s) { return s.WithReason(ErrorReason::kInvalidRequest); }

// A stable digest per configured model (Ollama's is the manifest's sha256).
std::string DigestOf(const ModelEntry& m) {
  return HexEncode(Sha256Of(m.name + '\n' + m.path));
}

json DetailsOf(const ModelEntry& m) {
  const bool gguf = m.path.size() > 5 && m.path.compare(m.path.size() - 5, 5, ".gguf") == 0;
  return {{"parent_model", ""},
          {"format", gguf ? "gguf" : "safetensors"},
          {"family", "arbiter"},
          {"families", json::array({"arbiter"})},
          {"parameter_size", ""},
          {"quantization_level", ""}};
}

bool OllamaCapability(Capability c) { return c == Capability::kText || c == Capability::kEmbedding; }

// The model entries Ollama's routes list (text and embedding models).
std::vector<const ModelEntry*> OllamaModels(const Config& config) {
  std::vector<const ModelEntry*> out;
  for (const ModelEntry& m : config.models) {
    if (OllamaCapability(m.capability)) out.push_back(&m);
  }
  return out;
}

std::string StartedAt(const ServerContext& ctx) { return OllamaTime(ctx.started_at * 1000000000); }

void HandleTags(ServerContext& ctx, http::Responder& out) {
  RuntimeStatus s = ctx.runtime->Status();
  json models = json::array();
  for (const ModelEntry* m : OllamaModels(ctx.runtime->config())) {
    uint64_t bytes = 0;
    for (const ModelStatus& ms : s.models) {
      if (ms.arbiter.name == m->name) bytes = ms.total_bytes;
    }
    models.push_back({{"name", OllamaTagged(m->name)},
                      {"model", OllamaTagged(m->name)},
                      {"modified_at", StartedAt(ctx)},
                      {"size", bytes},
                      {"digest", DigestOf(*m)},
                      {"details", DetailsOf(*m)}});
  }
  SendJson(out, 200, json{{"models", std::move(models)}}.dump());
}

// expires_at of a loaded model: now + what is left of its idle TTL (the
// whole TTL while a request holds it), or Ollama's "forever" (now + the
// largest Go duration, ~292 years) without a TTL.
// Computed in seconds: a TTL of centuries in nanoseconds overflows int64.
std::string ExpiresAt(const ModelStats& m) {
  const int64_t now_ns = UnixNowNs();
  const int64_t now_s = now_ns / 1000000000;
  const int64_t frac_ns = now_ns % 1000000000;
  if (!m.idle_ttl_ms) {
    return OllamaTime(now_s + std::numeric_limits<int64_t>::max() / 1000000000, frac_ns);
  }
  const int64_t left_ms = std::max<int64_t>(0, *m.idle_ttl_ms - m.idle_ms);
  return OllamaTime(now_s + left_ms / 1000, frac_ns + (left_ms % 1000) * 1000000);
}

void HandlePs(ServerContext& ctx, http::Responder& out) {
  RuntimeStatus s = ctx.runtime->Status();
  json models = json::array();
  for (const ModelEntry* m : OllamaModels(ctx.runtime->config())) {
    for (const ModelStatus& ms : s.models) {
      if (ms.arbiter.name != m->name || ms.arbiter.state != ModelState::kLoaded) continue;
      models.push_back({{"name", OllamaTagged(m->name)},
                        {"model", OllamaTagged(m->name)},
                        {"size", ms.total_bytes},
                        {"digest", DigestOf(*m)},
                        {"details", DetailsOf(*m)},
                        {"expires_at", ExpiresAt(ms.arbiter)},
                        {"size_vram", 0},
                        {"context_length", m->ctx}});
    }
  }
  SendJson(out, 200, json{{"models", std::move(models)}}.dump());
}

void HandleShow(ServerContext& ctx, const http::Request& req, http::Responder& out) {
  Result<std::string> name = ParseOllamaShow(req.body);
  if (!name.ok()) return SendOllamaError(out, BadRequest(name.status()));
  Result<ModelEntry> m = ctx.runtime->Model(*name);
  if (!m.ok()) return SendOllamaError(out, m.status());
  if (!OllamaCapability(m->capability)) {
    return SendOllamaError(
        out, InvalidArgumentError(fmt::format("model \"{}\" is a {} model; Ollama's API serves "
                                              "text and embedding models",
                                              *name, CapabilityName(m->capability)),
                                  ErrorReason::kWrongCapability));
  }
  json capabilities = json::array();
  std::string tmpl;
  if (m->capability == Capability::kText) {
    capabilities.push_back("completion");
    if (!m->vision.empty()) capabilities.push_back("vision");
    if (Result<TextModelView> v = ctx.runtime->InspectTextModel(*name); v.ok()) {
      tmpl = v->chat_template;
      if (tmpl == "chatml" || tmpl == "llama3") capabilities.push_back("tools");
    }
  } else {
    capabilities.push_back("embedding");
  }
  json info = {{"general.architecture", "arbiter"},
               {"general.basename", *name},
               {"arbiter.context_length", m->ctx},
               {"arbiter.parallel", m->parallel}};
  SendJson(out, 200,
           json{{"license", ""},
                {"modelfile", fmt::format("# arbiter model \"{}\"\nFROM {}\n", *name, m->path)},
                {"parameters", ""},
                {"template", tmpl},
                {"details", DetailsOf(*m)},
                {"model_info", std::move(info)},
                {"capabilities", std::move(capabilities)},
                {"modified_at", StartedAt(ctx)}}
               .dump());
}

void ApplyKeepAlive(ServerContext& ctx, const std::string& model,
                    const std::optional<OllamaKeepAlive>& keep_alive) {
  if (!keep_alive) return;
  if (Status st = ctx.runtime->SetIdleTtl(model, keep_alive->ttl_ms); !st.ok()) {
    spdlog::warn("keep_alive of model \"{}\": {}", LogSafe(model),
                 LogSafe(st.ToString(), kLogSafeMessageBytes));
  }
}

// What the runner needs besides the generation.
struct OllamaJob {
  std::unique_ptr<TextGeneration> generation;
  bool chat_api = true;        // /api/chat ("message") or /api/generate ("response")
  std::string model;
  bool with_tools = false;     // buffer the output: tool calls come parsed at the end
  int64_t start_ns = 0;        // steady clock, request start
  int64_t load_ns = 0;         // admission (model load included)
  TextRun metrics;
};

json Chunk(const OllamaJob& job, const std::string& text) {
  json j = {{"model", OllamaTagged(job.model)}, {"created_at", OllamaTime(UnixNowNs())}};
  if (job.chat_api) {
    j["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    j["response"] = text;
  }
  j["done"] = false;
  return j;
}

json ToolCallsJson(const std::vector<ToolCall>& calls) {
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json args = json::parse(calls[i].arguments, nullptr, /*allow_exceptions=*/false);
    if (args.is_discarded()) args = calls[i].arguments;  // not JSON: as text
    out.push_back({{"id", calls[i].id.empty() ? NewToolCallId() : calls[i].id},
                   {"function", {{"index", i}, {"name", calls[i].name}, {"arguments", args}}}});
  }
  return out;
}

// The final object: done, done_reason and the timings (ns).
void AddDone(const OllamaJob& job, const GenerationResult& g, json* j) {
  (*j)["done"] = true;
  (*j)["done_reason"] = OllamaDoneReason(g.finish_reason);
  (*j)["total_duration"] = SteadyNs() - job.start_ns;
  (*j)["load_duration"] = job.load_ns;
  (*j)["prompt_eval_count"] = g.prompt_tokens;
  (*j)["prompt_eval_duration"] = static_cast<int64_t>(g.timings.prefill_ms * 1e6);
  (*j)["eval_count"] = g.output_ids.size();
  (*j)["eval_duration"] = static_cast<int64_t>(g.timings.decode_ms * 1e6);
}

void RunOllama(ServerContext& ctx, http::Responder& out, OllamaJob& job, bool stream) {
  bool client_ok = true;
  bool started = false;
  auto write = [&](const json& j) {
    if (!client_ok) return false;
    if (!started) {
      started = true;
      if (!out.StartStream(200, "application/x-ndjson", {{"Cache-Control", "no-cache"}})) {
        client_ok = false;
        return false;
      }
    }
    if (!out.Write(DumpJson(j) + "\n")) {
      client_ok = false;
    }
    return client_ok;
  };
  TextCallback on_text = [&](std::string_view delta) {
    job.metrics.FirstToken();
    if (!stream || job.with_tools) return true;
    return write(Chunk(job, std::string(delta)));
  };
  Result<TextResult> result = job.generation->Run(on_text, out.cancel_token());
  if (result.ok()) {
    job.metrics.Finished(result->generation.prompt_tokens,
                         static_cast<int>(result->generation.output_ids.size()));
  }
  if (!client_ok) {
    spdlog::info("ollama stream {}: client went away; generation stopped", LogSafe(job.model));
    return;
  }
  if (!result.ok()) {
    if (!started) return SendOllamaError(out, result.status());
    spdlog::error("ollama stream {}: generation failed: {}", LogSafe(job.model),
                  LogSafe(result.status().ToString(), kLogSafeMessageBytes));
    write(json{{"error", result.status().message()}});
    out.End();
    return;
  }
  const GenerationResult& g = result->generation;
  if (g.finish_reason == FinishReason::kCancelled) {
    if (!started) {
      SendOllamaError(out, CancelledError("generation cancelled", ErrorReason::kCancelled));
    }
    return;
  }
  if (!stream) {
    json j = Chunk(job, result->content);
    if (job.chat_api && !result->tool_calls.empty()) {
      j["message"]["tool_calls"] = ToolCallsJson(result->tool_calls);
    }
    AddDone(job, g, &j);
    return SendJson(out, 200, DumpJson(j));
  }
  if (job.with_tools) {  // the buffered output, calls parsed, in one chunk
    json j = Chunk(job, result->content);
    if (!result->tool_calls.empty()) j["message"]["tool_calls"] = ToolCallsJson(result->tool_calls);
    write(j);
  }
  json done = Chunk(job, "");
  AddDone(job, g, &done);
  if (write(done)) out.End();
}

// A request without input: load the model (or unload it with keep_alive 0).
void LoadOnly(ServerContext& ctx, http::Responder& out, const OllamaTextRequest& r,
              bool chat_api) {
  const int64_t start = SteadyNs();
  const std::string& model = r.text.model;
  std::string reason = "load";
  if (r.keep_alive && r.keep_alive->ttl_ms && *r.keep_alive->ttl_ms == 0) {
    Result<UnloadResult> u = ctx.runtime->UnloadModel(model, kUnloadTimeoutMs);
    if (!u.ok()) return SendOllamaError(out, u.status());
    reason = "unload";
  } else {
    Result<ModelStatus> l = ctx.runtime->LoadModel(model);
    if (!l.ok()) return SendOllamaError(out, l.status());
    ApplyKeepAlive(ctx, model, r.keep_alive);
  }
  json j = {{"model", OllamaTagged(model)}, {"created_at", OllamaTime(UnixNowNs())}};
  if (chat_api) {
    j["message"] = {{"role", "assistant"}, {"content", ""}};
  } else {
    j["response"] = "";
  }
  j["done"] = true;
  j["done_reason"] = reason;
  if (reason == "load") j["load_duration"] = SteadyNs() - start;
  if (!r.stream) return SendJson(out, 200, j.dump());
  if (out.StartStream(200, "application/x-ndjson", {}) && out.Write(j.dump() + "\n")) out.End();
}

// The model's context per slot must be what options.num_ctx asks for.
Status CheckNumCtx(ServerContext& ctx, const std::string& model, std::optional<int64_t> num_ctx) {
  if (!num_ctx) return OkStatus();
  ARBITER_ASSIGN_OR_RETURN(ModelEntry m, ctx.runtime->Model(model));
  if (*num_ctx == m.ctx) return OkStatus();
  return InvalidArgumentError(
      fmt::format("\"options.num_ctx\" = {} is not supported: model \"{}\" has a context of {} "
                  "tokens per slot (set [[models]] ctx)",
                  *num_ctx, model, m.ctx),
      ErrorReason::kInvalidRequest);
}

void HandleText(ServerContext& ctx, const http::Request& req, http::Responder& out,
                bool chat_api) {
  const int64_t start = SteadyNs();
  Result<OllamaTextRequest> parsed =
      chat_api ? ParseOllamaChat(req.body) : ParseOllamaGenerate(req.body);
  if (!parsed.ok()) return SendOllamaError(out, BadRequest(parsed.status()));
  OllamaTextRequest& r = *parsed;
  if (Status st = CheckNumCtx(ctx, r.text.model, r.num_ctx); !st.ok()) {
    return SendOllamaError(out, st);
  }
  if (r.load_only) return LoadOnly(ctx, out, r, chat_api);
  if (Status st = AddChatImages(ctx, r.images, &r.text); !st.ok()) return SendOllamaError(out, st);
  OllamaJob job;
  job.chat_api = chat_api;
  job.model = r.text.model;
  job.with_tools = !r.text.tools.empty();
  job.start_ns = start;
  const std::string model = r.text.model;
  Result<std::unique_ptr<TextGeneration>> admitted = ctx.runtime->StartText(std::move(r.text));
  if (!admitted.ok()) {
    ApplyKeepAlive(ctx, model, r.keep_alive);
    return SendOllamaError(out, admitted.status());
  }
  job.generation = std::move(admitted).value();
  job.load_ns = SteadyNs() - start;
  job.metrics = ctx.metrics->StartTextRun(model);
  RunOllama(ctx, out, job, r.stream);
  job.generation.reset();  // released before the TTL applies (Note [keep_alive])
  ApplyKeepAlive(ctx, model, r.keep_alive);
}

void HandleEmbed(ServerContext& ctx, const http::Request& req, http::Responder& out,
                 bool legacy) {
  const int64_t start = SteadyNs();
  Result<OllamaEmbedRequest> parsed = ParseOllamaEmbed(req.body, legacy);
  if (!parsed.ok()) return SendOllamaError(out, BadRequest(parsed.status()));
  OllamaEmbedRequest& r = *parsed;
  if (Status st = CheckNumCtx(ctx, r.embed.model, r.num_ctx); !st.ok()) {
    return SendOllamaError(out, st);
  }
  Result<EmbedResult> e = ctx.runtime->Embed(r.embed, out.cancel_token());
  ApplyKeepAlive(ctx, r.embed.model, r.keep_alive);
  if (!e.ok()) return SendOllamaError(out, e.status());
  if (legacy) {
    return SendJson(out, 200, json{{"embedding", e->vectors.front()}}.dump());
  }
  SendJson(out, 200,
           json{{"model", OllamaTagged(r.embed.model)},
                {"embeddings", e->vectors},
                {"total_duration", SteadyNs() - start},
                {"load_duration", 0},
                {"prompt_eval_count", e->prompt_tokens}}
               .dump());
}

}  // namespace

std::vector<Route> OllamaRoutes(ServerContext& ctx) {
  using http::Dispatch;
  using http::Request;
  using http::Responder;
  auto probe = [](bool head) {
    return [head](const Request&, Responder& out) {
      http::Response r;
      r.content_type = "text/plain; charset=utf-8";
      if (!head) r.body = "Ollama is running";  // what clients probing / look for
      out.Send(std::move(r));
    };
  };
  return {
      {"GET", "/", Dispatch::kInline, probe(false)},
      {"HEAD", "/", Dispatch::kInline, probe(true)},
      {"GET", "/api/version", Dispatch::kInline,
       [](const Request&, Responder& out) {
         SendJson(out, 200, json{{"version", kOllamaVersion}}.dump());
       }},
      {"GET", "/api/tags", Dispatch::kInline,
       [&ctx](const Request&, Responder& out) { HandleTags(ctx, out); }},
      {"GET", "/api/ps", Dispatch::kInline,
       [&ctx](const Request&, Responder& out) { HandlePs(ctx, out); }},
      // May pin a loaded model briefly (InspectTextModel): a worker.
      {"POST", "/api/show", Dispatch::kWorker,
       [&ctx](const Request& req, Responder& out) { HandleShow(ctx, req, out); }},
      {"POST", "/api/chat", Dispatch::kWorker,
       [&ctx](const Request& req, Responder& out) { HandleText(ctx, req, out, true); }},
      {"POST", "/api/generate", Dispatch::kWorker,
       [&ctx](const Request& req, Responder& out) { HandleText(ctx, req, out, false); }},
      {"POST", "/api/embed", Dispatch::kWorker,
       [&ctx](const Request& req, Responder& out) { HandleEmbed(ctx, req, out, false); }},
      {"POST", "/api/embeddings", Dispatch::kWorker,
       [&ctx](const Request& req, Responder& out) { HandleEmbed(ctx, req, out, true); }},
  };
}

}  // namespace arbiter::server_internal
