// Constrained decoding for text requests (RuntimeImpl::OutputConstraint).
// Interim: the grammar library (arbiter/engine/grammar.h) lands in the next
// commit; until then a request that asks for a constraint is refused.
#include "runtime/internal/runtime_impl.h"

namespace arbiter::runtime_internal {

Result<std::unique_ptr<TokenConstraint>> RuntimeImpl::OutputConstraint(
    const std::string& model, const Engine& engine, std::optional<ChatTemplateKind> kind,
    const TextRequest& r) {
  (void)model;
  (void)engine;
  (void)kind;
  const bool forced_call = !r.tools.empty() && (r.tool_choice.mode == ToolChoice::Mode::kRequired ||
                                                r.tool_choice.mode == ToolChoice::Mode::kFunction);
  if (r.constraint == OutputConstraintKind::kNone && !forced_call) {
    return std::unique_ptr<TokenConstraint>();
  }
  return InvalidArgumentError("constrained decoding is not available in this build",
                              ErrorReason::kInvalidRequest);
}

}  // namespace arbiter::runtime_internal
