// Constrained decoding for text requests (RuntimeImpl::OutputConstraint,
// issue 15 points 3 and 4): a request's response format, GBNF grammar or
// forced tool call becomes one GBNF grammar, parsed into a Grammar and run
// as a GrammarConstraint over the model's vocabulary
// (arbiter/engine/grammar.h, docs/grammar.md).
//
// Note [Grammar vocabularies]
// A GrammarConstraint needs the model's vocabulary as a byte trie
// (GrammarVocabulary), built from the tokenizer once per loaded model and
// shared by every constrained request: vocabularies_ keeps it per model
// name with the address of the tokenizer it was built from. A reloaded
// model has a new tokenizer, so the entry is rebuilt on its first
// constrained request (the old one is freed when the last request using it
// ends), and a model's entry is dropped when the model unloads (an arbiter
// event listener set up in Runtime::Create). Its bytes are charged to the
// ledger under the model's resident key (kind scratch): about 0.5 MiB for
// demo-chat's 4k-token vocabulary, a few tens of MiB for a 150k one.
#include <fmt/format.h>

#include "arbiter/engine/grammar.h"
#include "arbiter/engine/json_schema.h"
#include "arbiter/engine/tool_calls.h"
#include "runtime/internal/runtime_impl.h"

namespace arbiter::runtime_internal {
namespace {

Status Invalid(std::string_view what, const Status& s) {
  return InvalidArgumentError(fmt::format("{}: {}", what, s.message()),
                              ErrorReason::kInvalidRequest);
}

// The GBNF of a forced call of one of `functions` (their parameters'
// schemas; none = any object).
Result<std::string> ForcedCallGbnf(ChatTemplateKind kind, const std::vector<ToolDefinition>& functions) {
  std::vector<std::string> names, rules;
  for (size_t i = 0; i < functions.size(); ++i) {
    names.push_back("tool-args-" + std::to_string(i));
    if (functions[i].parameters.empty()) {
      rules.push_back(JsonObjectGbnf(names.back()));
      continue;
    }
    Result<std::string> r = JsonSchemaToGbnf(functions[i].parameters, names.back());
    if (!r.ok()) return Invalid("\"tools\": the parameters of \"" + functions[i].name + "\"", r.status());
    rules.push_back(std::move(r).value());
  }
  return ToolCallGbnf(kind, functions, names, rules);
}

}  // namespace

bool RuntimeImpl::ForcesToolCall(const TextRequest& r) {
  return !r.tools.empty() && (r.tool_choice.mode == ToolChoice::Mode::kRequired ||
                              r.tool_choice.mode == ToolChoice::Mode::kFunction);
}

Result<std::unique_ptr<TokenConstraint>> RuntimeImpl::OutputConstraint(
    const std::string& model, const Engine& engine, std::optional<ChatTemplateKind> kind,
    const TextRequest& r) {
  const bool forced_call = ForcesToolCall(r);
  if (r.constraint == OutputConstraintKind::kNone && !forced_call) {
    return std::unique_ptr<TokenConstraint>();
  }
  std::string gbnf;
  if (forced_call) {
    if (r.constraint != OutputConstraintKind::kNone) {
      return InvalidArgumentError(
          "give either a response format (or grammar) or a forced \"tool_choice\", not both",
          ErrorReason::kInvalidRequest);
    }
    if (!kind || !HasToolFormat(*kind)) {
      return InvalidArgumentError("\"tool_choice\": the model has no tool-call format",
                                  ErrorReason::kInvalidRequest);
    }
    std::vector<ToolDefinition> functions;
    for (const ToolDefinition& t : r.tools) {
      if (r.tool_choice.mode == ToolChoice::Mode::kRequired || t.name == r.tool_choice.function) {
        functions.push_back(t);
      }
    }
    ARBITER_ASSIGN_OR_RETURN(gbnf, ForcedCallGbnf(*kind, functions));
  } else if (r.constraint == OutputConstraintKind::kJsonObject) {
    gbnf = JsonObjectGbnf();
  } else if (r.constraint == OutputConstraintKind::kJsonSchema) {
    Result<std::string> g = JsonSchemaToGbnf(r.constraint_text);
    if (!g.ok()) return Invalid("the response format's JSON schema", g.status());
    gbnf = std::move(g).value();
  } else {
    gbnf = r.constraint_text;
  }
  Result<std::shared_ptr<const Grammar>> grammar = Grammar::Parse(gbnf);
  if (!grammar.ok()) {
    return Invalid(r.constraint == OutputConstraintKind::kGrammar ? "\"grammar\"" : "the output grammar",
                   grammar.status());
  }
  std::shared_ptr<const GrammarVocabulary> vocab;
  VocabularyEntry replaced;  // freed after the lock
  {
    MutexLock l(&vocab_mu_);
    VocabularyEntry& e = vocabularies_[model];
    if (e.tokenizer != &engine.tokenizer() || e.vocabulary == nullptr) {
      replaced = std::move(e);
      e = VocabularyEntry{};
      e.tokenizer = &engine.tokenizer();
      e.vocabulary = GrammarVocabulary::Build(engine.tokenizer());
      // Unconditional: the model is loaded and pinned by this request;
      // the bytes are small next to it and go when it unloads.
      e.charge = ledger_->Charge(ResidentKey(Capability::kText, model), ChargeKind::kScratch,
                                 e.vocabulary->bytes());
    }
    vocab = e.vocabulary;
  }
  return std::unique_ptr<TokenConstraint>(
      std::make_unique<GrammarConstraint>(std::move(grammar).value(), std::move(vocab)));
}

}  // namespace arbiter::runtime_internal
