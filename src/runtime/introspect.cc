// The Runtime's introspection operations (arbiter/runtime/runtime.h):
// Ollama's keep_alive (SetIdleTtl) and what the llama.cpp server's
// /tokenize, /detokenize, /props and /slots read (Tokenize, Detokenize,
// InspectTextModel).
//
// SetIdleTtl only replaces the arbiter entry's TTL; the arbiter's idle
// reaper (MemoryArbiter::ReapIdle, every idle_check_interval_ms) remains the
// one place that unloads for idleness. InspectTextModel never loads a
// model: a model that is not loaded is described from its [[models]] entry.
#include <fmt/format.h>

#include "runtime/internal/runtime_impl.h"

namespace arbiter::runtime_internal {

arbiter::Status RuntimeImpl::SetIdleTtl(const std::string& model, std::optional<int64_t> ttl_ms) {
  ARBITER_ASSIGN_OR_RETURN(Capability cap, FindModel(model));
  if (ttl_ms && *ttl_ms < 0) {
    return InvalidArgumentError(fmt::format("idle TTL of model \"{}\" must be ≥ 0 ms", model),
                                ErrorReason::kInvalidRequest);
  }
  return arbiter_->SetIdleTtl(cap, model, ttl_ms);
}

Result<TokenizeResult> RuntimeImpl::Tokenize(const std::string& model, std::string_view text,
                                             bool add_special, bool parse_special) {
  ARBITER_ASSIGN_OR_RETURN(Capability cap, FindModel(model));
  ARBITER_RETURN_IF_ERROR(CheckCapability(model, cap, Capability::kText));
  ARBITER_ASSIGN_OR_RETURN(ArbiterHandle handle, AcquireModel(model, Capability::kText));
  const Engine* engine = handle.backend<Engine>();
  const Tokenizer& tok = engine->tokenizer();
  TokenizeResult r;
  if (add_special && !engine->config().bos_token_ids.empty()) {
    r.ids.push_back(engine->config().bos_token_ids.front());
  }
  const std::vector<int32_t> ids = tok.Encode(text, parse_special);
  r.ids.insert(r.ids.end(), ids.begin(), ids.end());
  r.pieces.reserve(r.ids.size());
  for (int32_t id : r.ids) r.pieces.push_back(tok.TokenBytes(id));
  return r;
}

Result<std::string> RuntimeImpl::Detokenize(const std::string& model,
                                            const std::vector<int32_t>& ids) {
  ARBITER_ASSIGN_OR_RETURN(Capability cap, FindModel(model));
  ARBITER_RETURN_IF_ERROR(CheckCapability(model, cap, Capability::kText));
  ARBITER_ASSIGN_OR_RETURN(ArbiterHandle handle, AcquireModel(model, Capability::kText));
  const Tokenizer& tok = handle.backend<Engine>()->tokenizer();
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= tok.vocab_size()) {
      return InvalidArgumentError(
          fmt::format("\"tokens[{}]\" is token id {}, outside the model's vocabulary [0, {})", i,
                      ids[i], tok.vocab_size()),
          ErrorReason::kInvalidTokenId);
    }
  }
  return tok.Decode(ids);
}

Result<TextModelView> RuntimeImpl::InspectTextModel(const std::string& model) {
  ARBITER_ASSIGN_OR_RETURN(Capability cap, FindModel(model));
  ARBITER_RETURN_IF_ERROR(CheckCapability(model, cap, Capability::kText));
  ARBITER_ASSIGN_OR_RETURN(ModelEntry entry, Model(model));
  TextModelView v;
  v.name = model;
  v.path = entry.path;
  v.n_ctx = entry.ctx;
  v.n_slots = entry.parallel;
  if (std::optional<ArbiterHandle> h = ResidentHandle(model)) {
    const Engine* engine = h->backend<Engine>();
    v.loaded = true;
    v.n_ctx = engine->n_ctx();
    v.n_slots = engine->n_slots();
    v.vocab_size = engine->tokenizer().vocab_size();
    if (Result<ChatTemplateKind> kind = engine->chat_template(); kind.ok()) {
      v.chat_template = std::string(ChatTemplateName(*kind));
    }
  }
  if (KvPrecache* pc = PrecacheFor(model)) v.slots = pc->Slots();
  return v;
}

}  // namespace arbiter::runtime_internal
