// The HTTP edge's error table (server/internal/errors.h).
#include "server/internal/errors.h"

namespace arbiter::server_internal {

HttpError HttpErrorFor(const Status& st) {
  constexpr const char* kBad = kInvalidRequestType;
  constexpr const char* kServer = kServerErrorType;
  constexpr int kRetry = kRetryAfterSeconds;
  switch (st.reason()) {
    case ErrorReason::kNone: break;
    case ErrorReason::kInvalidRequest: return {400, kBad, "invalid_request"};
    case ErrorReason::kModelNotFound: return {404, kBad, "model_not_found"};
    case ErrorReason::kWrongCapability: return {400, kBad, "wrong_model_capability"};
    case ErrorReason::kModelBroken: return {409, kBad, "model_broken"};
    // Retrying will not help until the files are fixed: no Retry-After.
    case ErrorReason::kLoadFailed: return {503, kServer, "model_load_failed"};
    case ErrorReason::kMemoryPressure: return {503, kServer, "memory_pressure", kRetry};
    case ErrorReason::kBudgetExceeded: return {503, kServer, "budget_exceeded", kRetry};
    case ErrorReason::kNotResident: return {503, kServer, "not_resident", kRetry};
    case ErrorReason::kModelHeld: return {409, kBad, "model_in_use"};
    case ErrorReason::kLoadInProgress: return {409, kBad, "model_loading"};
    case ErrorReason::kAcquireTimeout: return {503, kServer, "model_loading", kRetry};
    case ErrorReason::kShuttingDown: return {503, kServer, "unavailable", kRetry};
    case ErrorReason::kTooManyStreams: return {503, kServer, "too_many_streams", kRetry};
    case ErrorReason::kContextLengthExceeded: return {400, kBad, "context_length_exceeded"};
    case ErrorReason::kEmptyPrompt: return {400, kBad, "empty_prompt"};
    case ErrorReason::kInvalidTokenId: return {400, kBad, "invalid_token_id"};
    case ErrorReason::kNoChatTemplate: return {400, kBad, "no_chat_template"};
    case ErrorReason::kPinDoesNotFit: return {409, kBad, "pin_does_not_fit"};
    case ErrorReason::kConversationNotFound: return {404, kBad, "conversation_not_found"};
    case ErrorReason::kNoKvPrecache: return {503, kServer, "unavailable"};
    case ErrorReason::kCancelled: return {503, kServer, "cancelled"};
    case ErrorReason::kQueueFull: return {503, kServer, "queue_full", kRetry};
    // The grammar let through a call the parser refuses: our bug, logged.
    case ErrorReason::kToolCallUnparsed:
      return {500, kServer, "tool_call_unparsed", 0, /*bug=*/true};
  }
  switch (st.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kOutOfRange:
      return {400, kBad, ""};
    case StatusCode::kNotFound: return {404, kBad, "not_found"};
    case StatusCode::kResourceExhausted: return {503, kServer, "budget_exceeded", kRetry};
    case StatusCode::kDeadlineExceeded: return {503, kServer, "model_loading", kRetry};
    case StatusCode::kUnavailable: return {503, kServer, "unavailable", kRetry};
    case StatusCode::kCancelled: return {503, kServer, "cancelled"};
    default: return {500, kServer, "internal_error", 0, /*bug=*/true};
  }
}

}  // namespace arbiter::server_internal
