// The llama.cpp server's endpoints (docs/http-api.md "llama.cpp server
// compatibility"): POST /tokenize, POST /detokenize, GET /props, GET /slots.
//
// llama.cpp serves one model; arbiter serves several, so each route takes
// the model from `?model=` (or a body's "model"), else the first configured
// text model. /props and /slots never load the model: a model that is not
// loaded is described from its [[models]] entry (its slots empty of
// tokens). /tokenize and /detokenize load it (they need its tokenizer).
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "arbiter/base/clip.h"
#include "server/internal/context.h"
#include "server/internal/errors.h"
#include "server/internal/json_fields.h"

namespace arbiter::server_internal {
namespace {

using json = nlohmann::json;

// ?model=, else the body's "model" (already parsed into `body_model`), else
// the first text model.
Result<std::string> PickModel(ServerContext& ctx, const http::Request& req,
                              const std::string& body_model) {
  std::string m = req.query_value("model");
  if (m.empty()) m = body_model;
  if (!m.empty()) return m;
  for (const auto& [name, cap] : ctx.runtime->ModelNames()) {
    if (cap == Capability::kText) return name;
  }
  return NotFoundError("no text model is configured", ErrorReason::kModelNotFound);
}

Status Unknown(const RequestJson& j, std::initializer_list<const char*> known) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool ok = false;
    for (const char* k : known) ok |= it.key() == k;
    if (!ok)
      return InvalidArgumentError(fmt::format("\"{}\" is not supported", ClipInput(it.key())));
  }
  return OkStatus();
}

// A piece as llama.cpp shows it: a string when valid UTF-8, else its bytes.
json PieceJson(const std::string& piece) {
  json s = piece;
  try {
    (void)s.dump();
    return s;
  } catch (const json::exception&) {
    json bytes = json::array();
    for (unsigned char c : piece) bytes.push_back(c);
    return bytes;
  }
}

void HandleTokenize(ServerContext& ctx, const http::Request& req, http::Responder& out) {
  Result<RequestJson> body = ParseBody(req.body);
  if (!body.ok()) return SendStatus(out, body.status().WithReason(ErrorReason::kInvalidRequest));
  std::string content, model;
  bool add_special = false, parse_special = true, with_pieces = false;
  Status st = Unknown(*body, {"content", "add_special", "parse_special", "with_pieces", "model"});
  if (st.ok()) st = GetString(*body, "content", false, &content);
  if (st.ok()) st = GetString(*body, "model", false, &model);
  if (st.ok()) st = GetBool(*body, "add_special", &add_special);
  if (st.ok()) st = GetBool(*body, "parse_special", &parse_special);
  if (st.ok()) st = GetBool(*body, "with_pieces", &with_pieces);
  if (!st.ok()) return SendStatus(out, st.WithReason(ErrorReason::kInvalidRequest));
  Result<std::string> name = PickModel(ctx, req, model);
  if (!name.ok()) return SendStatus(out, name.status());
  Result<TokenizeResult> t = ctx.runtime->Tokenize(*name, content, add_special, parse_special);
  if (!t.ok()) return SendStatus(out, t.status());
  json tokens = json::array();
  for (size_t i = 0; i < t->ids.size(); ++i) {
    if (with_pieces) {
      tokens.push_back({{"id", t->ids[i]}, {"piece", PieceJson(t->pieces[i])}});
    } else {
      tokens.push_back(t->ids[i]);
    }
  }
  SendJson(out, 200, json{{"tokens", std::move(tokens)}}.dump());
}

void HandleDetokenize(ServerContext& ctx, const http::Request& req, http::Responder& out) {
  Result<RequestJson> body = ParseBody(req.body);
  if (!body.ok()) return SendStatus(out, body.status().WithReason(ErrorReason::kInvalidRequest));
  std::string model;
  Status st = Unknown(*body, {"tokens", "model"});
  if (st.ok()) st = GetString(*body, "model", false, &model);
  std::vector<int32_t> ids;
  if (st.ok()) {
    const RequestJson* tokens = Field(*body, "tokens");
    if (tokens != nullptr && !tokens->is_array()) st = TypeError("tokens", "an array of token ids");
    for (size_t i = 0; st.ok() && tokens != nullptr && i < tokens->size(); ++i) {
      const RequestJson& v = (*tokens)[i];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) {
        st = TypeError(fmt::format("tokens[{}]", i), "a token id");
      } else {
        ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
      }
    }
  }
  if (!st.ok()) return SendStatus(out, st.WithReason(ErrorReason::kInvalidRequest));
  Result<std::string> name = PickModel(ctx, req, model);
  if (!name.ok()) return SendStatus(out, name.status());
  Result<std::string> text = ctx.runtime->Detokenize(*name, ids);
  if (!text.ok()) return SendStatus(out, text.status());
  SendJson(out, 200,
           DumpJson(json{{"content", *text}}));
}

void HandleProps(ServerContext& ctx, const http::Request& req, http::Responder& out) {
  Result<std::string> name = PickModel(ctx, req, "");
  if (!name.ok()) return SendStatus(out, name.status());
  Result<TextModelView> v = ctx.runtime->InspectTextModel(*name);
  if (!v.ok()) return SendStatus(out, v.status());
  Result<ModelEntry> entry = ctx.runtime->Model(*name);
  const bool vision = entry.ok() && !entry->vision.empty();
  json settings = {{"id", 0},
                   {"n_ctx", v->n_ctx},
                   {"model", v->name},
                   {"params",
                    {{"temperature", 1.0},
                     {"top_p", 1.0},
                     {"top_k", 0},
                     {"min_p", 0.0},
                     {"presence_penalty", 0.0},
                     {"frequency_penalty", 0.0},
                     {"repeat_penalty", 1.0},
                     {"n_predict", -1},
                     {"seed", -1},
                     {"stop", json::array()}}}};
  SendJson(out, 200,
           json{{"default_generation_settings", std::move(settings)},
                {"total_slots", v->n_slots},
                {"model_path", v->path},
                {"model_alias", v->name},
                {"chat_template", v->chat_template},
                {"loaded", v->loaded},
                {"modalities", {{"vision", vision}, {"audio", false}}},
                {"build_info", "arbiter"}}
               .dump());
}

void HandleSlots(ServerContext& ctx, const http::Request& req, http::Responder& out) {
  Result<std::string> name = PickModel(ctx, req, "");
  if (!name.ok()) return SendStatus(out, name.status());
  Result<TextModelView> v = ctx.runtime->InspectTextModel(*name);
  if (!v.ok()) return SendStatus(out, v.status());
  json slots = json::array();
  for (const KvSlotView& s : v->slots) {
    slots.push_back({{"id", s.index},
                     {"id_task", -1},
                     {"n_ctx", v->n_ctx},
                     {"is_processing", s.busy},
                     {"n_tokens", s.n_tokens},
                     {"conversation_id", s.conversation_id},
                     {"model", v->name}});
  }
  SendJson(out, 200, slots.dump());
}

}  // namespace

std::vector<Route> LlamaCppRoutes(ServerContext& ctx) {
  using http::Dispatch;
  using http::Request;
  using http::Responder;
  return {
      {"POST", "/tokenize", Dispatch::kWorker,
       [&ctx](const Request& req, Responder& out) { HandleTokenize(ctx, req, out); }},
      {"POST", "/detokenize", Dispatch::kWorker,
       [&ctx](const Request& req, Responder& out) { HandleDetokenize(ctx, req, out); }},
      // May pin a loaded model briefly (InspectTextModel): workers.
      {"GET", "/props", Dispatch::kWorker,
       [&ctx](const Request& req, Responder& out) { HandleProps(ctx, req, out); }},
      {"GET", "/slots", Dispatch::kWorker,
       [&ctx](const Request& req, Responder& out) { HandleSlots(ctx, req, out); }},
  };
}

}  // namespace arbiter::server_internal
