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
  return Status(code_, std::move(m));
}

#define ARBITER_DEFINE_ERROR_(Fn, Code) \
  Status Fn(std::string message) { return Status(StatusCode::Code, std::move(message)); }
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
