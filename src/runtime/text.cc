// The Runtime's model operations (arbiter/runtime/runtime.h): text
// generation (chat and completion share one path), embeddings, prewarm.
//
// A text request is admitted before anything is generated — model resolved,
// pinned (loaded if needed), prompt rendered, tokenized and checked against
// the context — so the edge can refuse it with a clean error before it
// sends a streaming response's first byte.
#include <algorithm>

#include <fmt/format.h>

#include "arbiter/base/clip.h"
#include "arbiter/engine/tool_calls.h"
#include "runtime/internal/runtime_impl.h"

namespace arbiter::runtime_internal {
namespace {

// Default completion length for completions (OpenAI's default).
constexpr int kDefaultCompletionTokens = 16;

// kEmptyPrompt, kContextLengthExceeded or kInvalidTokenId unless `ids` is a
// non-empty, in-vocabulary prompt leaving room for one generated token.
Status CheckPrompt(const Engine& engine, const std::string& model,
                   const std::vector<int32_t>& ids) {
  if (ids.empty()) return InvalidArgumentError("the prompt is empty", ErrorReason::kEmptyPrompt);
  if (static_cast<int>(ids.size()) > engine.n_ctx() - 1) {
    return InvalidArgumentError(
        fmt::format("the prompt is {} tokens; model \"{}\" has a context of {} tokens (shorten "
                    "the prompt or raise [[models]] ctx)",
                    ids.size(), model, engine.n_ctx()),
        ErrorReason::kContextLengthExceeded);
  }
  const int vocab = engine.tokenizer().vocab_size();
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return InvalidArgumentError(
          fmt::format("\"prompt[{}]\" is token id {}, outside the model's vocabulary [0, {})", i,
                      ids[i], vocab),
          ErrorReason::kInvalidTokenId);
    }
  }
  return OkStatus();
}

Result<ChatTemplateKind> TemplateOf(const Engine& engine, const std::string& model,
                                    std::string_view instead) {
  Result<ChatTemplateKind> kind = engine.chat_template();
  if (kind.ok()) return kind;
  return InvalidArgumentError(fmt::format("model \"{}\" has no chat template ({}); {}", model,
                                          kind.status().message(), instead),
                              ErrorReason::kNoChatTemplate);
}

Result<TtlClass> TtlOf(const std::string& text) {
  if (text.empty()) return TtlClass::kShort;
  Result<TtlClass> t = ParseTtlClass(text);
  if (!t.ok()) return t.status().WithReason(ErrorReason::kInvalidRequest);
  return t;
}

// Note [Tool-call hold-back]
// With tools, a streaming client must not see the text of a call as
// content: text is passed on only while the output cannot be starting a
// call — text that might be the beginning of the family's opening
// ("<tool_call>", or "{" for Llama-3 at the very start) is held until it
// resolves, and once an opening is seen everything after it is held. When
// the run ends, the calls parsed from the whole output are the answer's
// tool_calls; without any, the held text is flushed as content (not for a
// forced call: Note [Forced tool calls]).
class ToolCallHoldBack {
 public:
  ToolCallHoldBack(std::string_view opening, const TextCallback& downstream)
      : opening_(opening), downstream_(downstream) {
    callback_ = [this](std::string_view delta) { return Take(delta); };
  }
  const TextCallback& callback() const { return callback_; }
  void Flush() {
    if (!held_.empty() && downstream_) downstream_(held_);
    held_.clear();
  }

 private:
  bool Take(std::string_view delta) {
    held_ += delta;
    if (in_call_) return true;
    if (opening_ == "{") {
      // Llama-3: a call is the whole output, so "{" opens one only at the
      // start (after whitespace).
      if (sent_any_) return Send(held_.size());
      const size_t first = held_.find_first_not_of(" \t\n\r");
      if (first == std::string::npos) return true;  // whitespace so far: wait
      if (held_[first] == '{') {
        in_call_ = true;
        return true;
      }
      return Send(held_.size());
    }
    const size_t at = held_.find(opening_);
    if (at != std::string::npos) {
      in_call_ = true;
      return Send(at);
    }
    // Keep the longest suffix that is a prefix of the opening.
    size_t keep = std::min(held_.size(), opening_.size() - 1);
    while (keep > 0 && opening_.compare(0, keep, held_, held_.size() - keep, keep) != 0) --keep;
    return Send(held_.size() - keep);
  }
  // Passes held_[0, n) downstream.
  bool Send(size_t n) {
    if (n == 0) return true;
    const std::string out = held_.substr(0, n);
    held_.erase(0, n);
    if (out.find_first_not_of(" \t\n\r") != std::string::npos) sent_any_ = true;
    return !downstream_ || downstream_(out);
  }

  std::string opening_;
  const TextCallback& downstream_;
  TextCallback callback_;
  std::string held_;
  bool in_call_ = false;
  bool sent_any_ = false;
};

// Note [Forced tool calls]
// With tool_choice "required" or a named function the grammar holds the
// output to exactly one call (OutputConstraint), and the answer is that
// call or says why there is none; it never falls back to content:
//  - the call parsed: it is the answer's tool call, whatever the engine's
//    finish reason (a budget that ran out exactly at the close still left
//    a complete call);
//  - the budget (max_tokens or the context) ran out before the call was
//    complete, which the length-aware mask allows only when the budget was
//    smaller than the shortest call (docs/grammar.md "The length-aware
//    rule"): no call, no content, finish reason kLength;
//  - the grammar accepted output that the parser refuses: a bug, kInternal
//    with reason kToolCallUnparsed (nothing was sent: the hold-back keeps
//    the whole call).
// Stop strings do not apply to a forced call: the grammar ends the output
// at the call's close, so a stop string could only cut the call.

class TextGenerationImpl final : public TextGeneration {
 public:
  TextGenerationImpl(ArbiterHandle handle, std::string model) 
      : handle_(std::move(handle)), model_(std::move(model)) {
    engine_ = handle_.backend<Engine>();
  }

  const std::string& model() const override { return model_; }
  int prompt_tokens() const override { return static_cast<int>(request_.prompt_ids.size()); }
  const std::vector<int32_t>& prompt_ids() const override { return request_.prompt_ids; }
  const std::string& echo_text() const override { return echo_; }

  std::string TokenBytes(int32_t id) const override { return engine_->tokenizer().TokenBytes(id); }

  Result<TextResult> Run(const TextCallback& on_text, const Cancellation& cancelled) override {
    if (!handle_.valid()) {
      return FailedPreconditionError("TextGeneration::Run called twice");
    }
    TextResult out;
    ToolCallHoldBack hold(tools_.empty() ? std::string_view() : ToolCallOpening(kind_), on_text);
    const TextCallback& text_cb = tools_.empty() ? on_text : hold.callback();
    Result<GenerationResult> r =
        precache_ == nullptr
            ? engine_->Generate(request_, text_cb, cancelled)
            : precache_->Generate(engine_, conversation_, ttl_, request_, text_cb, cancelled,
                                  &out.kv);
    handle_.Release();
    if (!r.ok()) return r.status();
    out.generation = std::move(r).value();
    if (tools_.empty()) {
      out.content = out.generation.text;
      return out;
    }
    ParsedToolCalls parsed = ParseToolCalls(kind_, out.generation.text, tools_);
    out.content = std::move(parsed.content);
    out.tool_calls = std::move(parsed.calls);
    if (!out.tool_calls.empty() || out.generation.finish_reason == FinishReason::kCancelled) {
      return out;
    }
    if (!forced_call_) {
      hold.Flush();  // no call after all: the text held back goes out now
      return out;
    }
    // Note [Forced tool calls]: no call in a forced call's output.
    if (out.generation.finish_reason == FinishReason::kLength && !constraint_->CanEnd()) {
      out.content.clear();
      return out;
    }
    return InternalError(
        fmt::format("model \"{}\": the output of the forced tool call did not parse as a call "
                    "of the request's tools ({} bytes, starting \"{}\")",
                    model_, out.generation.text.size(), ClipInput(out.generation.text)),
        ErrorReason::kToolCallUnparsed);
  }

  Engine* engine_ = nullptr;
  GenerationRequest request_;
  std::unique_ptr<TokenConstraint> constraint_;  // request_.constraint points here
  ChatTemplateKind kind_ = ChatTemplateKind::kChatML;
  std::vector<ToolDefinition> tools_;  // rendered into the prompt; parsed back
  bool forced_call_ = false;           // Note [Forced tool calls]
  std::string echo_;
  KvPrecache* precache_ = nullptr;  // null: the engine picks the slot
  std::string conversation_;
  TtlClass ttl_ = TtlClass::kShort;

 private:
  ArbiterHandle handle_;
  std::string model_;
};

}  // namespace

Result<std::unique_ptr<TextGeneration>> RuntimeImpl::StartText(TextRequest r) {
  ARBITER_ASSIGN_OR_RETURN(Capability cap, FindModel(r.model));
  ARBITER_RETURN_IF_ERROR(CheckCapability(r.model, cap, Capability::kText));
  ARBITER_ASSIGN_OR_RETURN(TtlClass ttl, TtlOf(r.cache_ttl));
  if (!r.images.empty()) {
    // Before the text model is pinned: the vision model's load may evict
    // idle voice models, never the text target.
    ARBITER_RETURN_IF_ERROR(
        DescribeChatImages(r.model, std::move(r.images), &r.messages, nullptr));
  }
  ARBITER_ASSIGN_OR_RETURN(ArbiterHandle handle, AcquireModel(r.model, Capability::kText));
  auto job = std::make_unique<TextGenerationImpl>(std::move(handle), r.model);
  Engine* engine = job->engine_;
  GenerationRequest& g = job->request_;
  std::optional<ChatTemplateKind> template_kind;
  if (r.chat) {
    ARBITER_ASSIGN_OR_RETURN(ChatTemplateKind kind,
                             TemplateOf(*engine, r.model, "use /v1/completions"));
    template_kind = kind;
    // tool_choice "none": the tools are not offered (nor parsed back).
    if (r.tool_choice.mode != ToolChoice::Mode::kNone) job->tools_ = r.tools;
    Result<std::vector<ChatMessage>> rendered =
        RenderToolMessages(kind, r.messages, job->tools_);
    if (!rendered.ok()) return rendered.status().WithReason(ErrorReason::kInvalidRequest);
    job->kind_ = kind;
    // Message text never becomes control tokens (no template injection).
    g.prompt_ids = EncodeChat(engine->tokenizer(), kind, *rendered, true);
  } else {
    g.prompt_ids = r.prompt_is_ids ? r.prompt_ids : engine->tokenizer().Encode(r.prompt, true);
  }
  ARBITER_RETURN_IF_ERROR(CheckPrompt(*engine, r.model, g.prompt_ids));
  if (r.chat) {
    const int room = engine->n_ctx() - static_cast<int>(g.prompt_ids.size());
    g.max_tokens = std::min(r.max_tokens.value_or(room), std::max(room, 1));
  } else {
    // The engine stops at the context end (finish_reason "length").
    g.max_tokens = r.max_tokens.value_or(kDefaultCompletionTokens);
    if (r.echo) {
      job->echo_ = r.prompt_is_ids ? engine->tokenizer().Decode(r.prompt_ids) : r.prompt;
    }
  }
  g.sampling = r.sampling;
  job->forced_call_ = r.chat && ForcesToolCall(r);
  // Note [Forced tool calls]: a stop string could only cut the call.
  if (!job->forced_call_) g.stop = std::move(r.stop);
  g.ignore_eos = r.ignore_eos;
  g.top_logprobs = r.top_logprobs;
  g.on_token = std::move(r.on_token);
  ARBITER_ASSIGN_OR_RETURN(job->constraint_, OutputConstraint(r.model, *engine, template_kind, r));
  g.constraint = job->constraint_.get();
  job->precache_ = PrecacheFor(r.model);
  job->conversation_ = std::move(r.conversation_id);
  job->ttl_ = ttl;
  return std::unique_ptr<TextGeneration>(std::move(job));
}

Result<EmbedResult> RuntimeImpl::Embed(const EmbedRequest& r, const Cancellation& cancelled) {
  ARBITER_ASSIGN_OR_RETURN(Capability cap, FindModel(r.model));
  ARBITER_RETURN_IF_ERROR(CheckCapability(r.model, cap, Capability::kEmbedding));
  // Per-request limits (docs/config.md "[server]"): refused before any
  // embedding is computed, so one request cannot hold the model for long.
  const ServerSettings& limits = config_.server;
  if (r.inputs.size() > static_cast<size_t>(limits.max_embedding_inputs)) {
    return InvalidArgumentError(fmt::format("\"input\" has {} items; at most {} per request "
                                            "([server] max_embedding_inputs)",
                                            r.inputs.size(), limits.max_embedding_inputs),
                                ErrorReason::kInvalidRequest);
  }
  ARBITER_ASSIGN_OR_RETURN(ArbiterHandle handle, AcquireModel(r.model, Capability::kEmbedding));
  Engine* engine = handle.backend<Engine>();
  if (r.dimensions && *r.dimensions != engine->config().hidden_size) {
    return InvalidArgumentError(fmt::format("\"dimensions\" must be {} for model \"{}\" (got {})",
                                            engine->config().hidden_size, r.model, *r.dimensions),
                                ErrorReason::kInvalidRequest);
  }
  std::vector<std::vector<int32_t>> ids(r.inputs.size());
  EmbedResult out;
  int64_t total_tokens = 0;
  for (size_t i = 0; i < r.inputs.size(); ++i) {
    ids[i] = engine->tokenizer().Encode(r.inputs[i], false);
    if (ids[i].empty() || static_cast<int>(ids[i].size()) > engine->n_ctx()) {
      return InvalidArgumentError(fmt::format("\"input[{}]\" is {} tokens; model \"{}\" accepts "
                                              "1 to {}",
                                              i, ids[i].size(), r.model, engine->n_ctx()),
                                  ErrorReason::kContextLengthExceeded);
    }
    total_tokens += static_cast<int64_t>(ids[i].size());
    if (total_tokens > limits.max_embedding_tokens) {
      return InvalidArgumentError(fmt::format("\"input\" totals more than {} tokens, the limit "
                                              "per request ([server] max_embedding_tokens; "
                                              "passed at input[{}]); split it across requests",
                                              limits.max_embedding_tokens, i),
                                  ErrorReason::kInvalidRequest);
    }
    out.prompt_tokens += static_cast<int>(ids[i].size());
  }
  for (const auto& one : ids) {
    Result<std::vector<float>> v = engine->Embed(one, cancelled);
    if (!v.ok()) {
      if (v.status().code() == StatusCode::kCancelled) {
        return v.status().WithReason(ErrorReason::kCancelled);
      }
      return v.status();
    }
    out.vectors.push_back(std::move(v).value());
  }
  return out;
}

Result<PrewarmResult> RuntimeImpl::Prewarm(const PrewarmSpec& r) {
  ARBITER_ASSIGN_OR_RETURN(Capability cap, FindModel(r.model));
  ARBITER_RETURN_IF_ERROR(CheckCapability(r.model, cap, Capability::kText));
  KvPrecache* precache = PrecacheFor(r.model);
  if (precache == nullptr) {
    return UnavailableError(fmt::format("model \"{}\" has no KV precache (its files could not be "
                                        "read at startup)",
                                        r.model),
                            ErrorReason::kNoKvPrecache);
  }
  ARBITER_ASSIGN_OR_RETURN(TtlClass ttl, TtlOf(r.cache_ttl));
  ARBITER_ASSIGN_OR_RETURN(ArbiterHandle handle, AcquireModel(r.model, Capability::kText));
  Engine* engine = handle.backend<Engine>();
  std::vector<int32_t> ids;
  if (!r.messages.empty()) {
    ARBITER_ASSIGN_OR_RETURN(ChatTemplateKind kind,
                             TemplateOf(*engine, r.model, "prewarm a \"prompt\" instead"));
    // The stable prefix: the messages as a request would render them,
    // without the generation prompt the real turn adds after them.
    ids = EncodeChat(engine->tokenizer(), kind, r.messages, /*add_generation_prompt=*/false);
  } else {
    ids = engine->tokenizer().Encode(r.prompt, true);
  }
  ARBITER_RETURN_IF_ERROR(CheckPrompt(*engine, r.model, ids));
  const CancelFn cancel = [this] { return stopping(); };
  Result<GenerationResult> g = precache->Prewarm(engine, r.conversation_id, std::move(ids), ttl,
                                                 cancel);
  handle.Release();
  if (!g.ok()) return g.status();
  if (g->finish_reason == FinishReason::kCancelled) {
    return CancelledError("prewarm cancelled: the server is stopping", ErrorReason::kCancelled);
  }
  PrewarmResult out;
  out.generation = std::move(g).value();
  return out;
}

}  // namespace arbiter::runtime_internal
