#include "arbiter/base/status.h"

namespace arbiter {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kCancelled: return "CANCELLED";
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case StatusCode::kNotFound: return "NOT_FOUND";
    case StatusCode::kAlreadyExists: return "ALREADY_EXISTS";
    case StatusCode::kPermissionDenied: return "PERMISSION_DENIED";
    case StatusCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case StatusCode::kOutOfRange: return "OUT_OF_RANGE";
    case StatusCode::kUnimplemented: return "UNIMPLEMENTED";
    case StatusCode::kInternal: return "INTERNAL";
    case StatusCode::kUnavailable: return "UNAVAILABLE";
    case StatusCode::kDataLoss: return "DATA_LOSS";
    case StatusCode::kUnauthenticated: return "UNAUTHENTICATED";
  }
  return "UNKNOWN";
}

std::string_view ErrorReasonName(ErrorReason reason) {
  switch (reason) {
    case ErrorReason::kNone: return "none";
    case ErrorReason::kInvalidRequest: return "invalid_request";
    case ErrorReason::kModelNotFound: return "model_not_found";
    case ErrorReason::kWrongCapability: return "wrong_capability";
    case ErrorReason::kModelBroken: return "model_broken";
    case ErrorReason::kLoadFailed: return "load_failed";
    case ErrorReason::kMemoryPressure: return "memory_pressure";
    case ErrorReason::kBudgetExceeded: return "budget_exceeded";
    case ErrorReason::kNotResident: return "not_resident";
    case ErrorReason::kModelHeld: return "model_held";
    case ErrorReason::kLoadInProgress: return "load_in_progress";
    case ErrorReason::kAcquireTimeout: return "acquire_timeout";
    case ErrorReason::kShuttingDown: return "shutting_down";
    case ErrorReason::kTooManyStreams: return "too_many_streams";
    case ErrorReason::kContextLengthExceeded: return "context_length_exceeded";
    case ErrorReason::kEmptyPrompt: return "empty_prompt";
    case ErrorReason::kInvalidTokenId: return "invalid_token_id";
    case ErrorReason::kNoChatTemplate: return "no_chat_template";
    case ErrorReason::kPinDoesNotFit: return "pin_does_not_fit";
    case ErrorReason::kConversationNotFound: return "conversation_not_found";
    case ErrorReason::kNoKvPrecache: return "no_kv_precache";
    case ErrorReason::kCancelled: return "cancelled";
    case ErrorReason::kQueueFull: return "queue_full";
    case ErrorReason::kToolCallUnparsed: return "tool_call_unparsed";
  }
  return "none";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s(StatusCodeName(code_));
  s += ": ";
  s += message_;
  return s;
}

Status Status::WithPrefix(std::string_view prefix) const {
  if (ok()) return *this;
  std::string m(prefix);
  m += ": ";
  m += message_;
  return Status(code_, std::move(m), reason_);
}

Status Status::WithReason(ErrorReason reason) const {
  if (ok()) return *this;
  return Status(code_, message_, reason);
}

#define ARBITER_DEFINE_ERROR_(Fn, Code) \
  Status Fn(std::string message, ErrorReason reason) {                \
    return Status(StatusCode::Code, std::move(message), reason);     \
  }
ARBITER_DEFINE_ERROR_(CancelledError, kCancelled)
ARBITER_DEFINE_ERROR_(InvalidArgumentError, kInvalidArgument)
ARBITER_DEFINE_ERROR_(DeadlineExceededError, kDeadlineExceeded)
ARBITER_DEFINE_ERROR_(NotFoundError, kNotFound)
ARBITER_DEFINE_ERROR_(AlreadyExistsError, kAlreadyExists)
ARBITER_DEFINE_ERROR_(PermissionDeniedError, kPermissionDenied)
ARBITER_DEFINE_ERROR_(ResourceExhaustedError, kResourceExhausted)
ARBITER_DEFINE_ERROR_(FailedPreconditionError, kFailedPrecondition)
ARBITER_DEFINE_ERROR_(OutOfRangeError, kOutOfRange)
ARBITER_DEFINE_ERROR_(UnimplementedError, kUnimplemented)
ARBITER_DEFINE_ERROR_(InternalError, kInternal)
ARBITER_DEFINE_ERROR_(UnavailableError, kUnavailable)
ARBITER_DEFINE_ERROR_(DataLossError, kDataLoss)
ARBITER_DEFINE_ERROR_(UnauthenticatedError, kUnauthenticated)
#undef ARBITER_DEFINE_ERROR_

}  // namespace arbiter
