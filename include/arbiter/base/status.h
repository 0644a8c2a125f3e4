// arbiter/base/status.h — errors as values across the library API.
//
// `Status` carries a canonical code and a message; `Result<T>` is a T or a
// non-OK Status. Modeled on absl::Status (canonical codes) and leveldb::Status.
//
// Which code to pick (STYLE.md rule 4):
//   kInvalidArgument    caller passed a bad value (bad request field, bad size)
//   kNotFound           a named object does not exist (model, file, tensor)
//   kAlreadyExists      a named object exists and must not
//   kFailedPrecondition state is wrong for the call (handle misuse, not resident)
//   kResourceExhausted  over a budget or limit (memory budget, slots)
//   kDataLoss           a file or buffer is corrupt or truncated
//   kUnavailable        transient refusal (memory pressure, shutting down)
//   kDeadlineExceeded   a deadline passed before the operation completed
//   kCancelled          the caller went away (client disconnected)
//   kUnimplemented      a valid but unsupported feature (dtype, architecture)
//   kInternal           a bug: an invariant did not hold
//
// Messages say what failed, on which object, and what to do about it.
//
// Note [Typed error reasons]
// Beside its code, a Status may carry an ErrorReason: a machine-readable
// "why" that callers branch on (STYLE.md rule 16) instead of reading the
// message. It is set where the error is born (the arbiter refusing under
// critical pressure sets kMemoryPressure, the weight cache that cannot make
// room sets kBudgetExceeded, ...), survives WithPrefix, and is mapped to an
// HTTP status, an OpenAI error `code` and Retry-After by one table at the
// edge (src/server/errors.cc). kNone means "the code says it all".
//
// Thread safety: Status and Result are values; thread-compatible.
#pragma once

#include <cassert>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace arbiter {

enum class StatusCode {
  kOk = 0,
  kCancelled,
  kInvalidArgument,
  kDeadlineExceeded,
  kNotFound,
  kAlreadyExists,
  kPermissionDenied,
  kResourceExhausted,
  kFailedPrecondition,
  kOutOfRange,
  kUnimplemented,
  kInternal,
  kUnavailable,
  kDataLoss,
  kUnauthenticated,
};

// Canonical name of a code, e.g. "INVALID_ARGUMENT".
std::string_view StatusCodeName(StatusCode code);

// Note [Typed error reasons]. ErrorReasonName gives the snake_case name
// ("memory_pressure") for logs and tests; the HTTP error codes come from the
// edge's table (docs/http-api.md "Errors").
enum class ErrorReason {
  kNone = 0,
  kInvalidRequest,         // a request field is missing or malformed
  kModelNotFound,          // no model of that name is configured
  kWrongCapability,        // the model serves another capability
  kModelBroken,            // the model failed its startup check (no weights registered)
  kLoadFailed,             // a model's load failed (files, format); retrying will not help
  kMemoryPressure,         // critical OS memory pressure refuses non-text work
  kBudgetExceeded,         // the memory budget cannot make room while others hold it
  kNotResident,            // externally managed weights are not on the device
  kModelHeld,              // an unload found the model held by requests
  kLoadInProgress,         // an unload found the model still loading
  kAcquireTimeout,         // the deadline passed waiting for a load or a swap's drain
  kShuttingDown,           // the runtime is stopping
  kTooManyStreams,         // too many open event streams
  kContextLengthExceeded,  // the prompt does not fit the model's context
  kEmptyPrompt,            // the prompt has no tokens
  kInvalidTokenId,         // a prompt token id is outside the vocabulary
  kNoChatTemplate,         // the model's tokenizer has no known chat format
  kPinDoesNotFit,          // a residency pin cannot fit the weight pool
  kConversationNotFound,   // no open conversation of that id
  kNoKvPrecache,           // the server (or the model) has no KV precache
  kCancelled,              // the client went away or the server is stopping
  kQueueFull,              // the model's request queue is full ([[models]] queue)
  kToolCallUnparsed,       // a forced tool call's output did not parse (a bug)
};
// "none", "invalid_request", "model_not_found", ..., "cancelled".
std::string_view ErrorReasonName(ErrorReason reason);

class [[nodiscard]] Status {
 public:
  // OK.
  Status() = default;
  Status(StatusCode code, std::string message, ErrorReason reason = ErrorReason::kNone)
      : code_(code), reason_(reason), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  // Note [Typed error reasons]; kNone for OK.
  ErrorReason reason() const { return reason_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: message", or "OK".
  std::string ToString() const;

  // Returns a copy whose message is "<prefix>: <message>" (same code and
  // reason); OK stays OK.
  Status WithPrefix(std::string_view prefix) const;
  // Returns a copy with `reason`; OK stays OK.
  Status WithReason(ErrorReason reason) const;

  // Explicitly discards a status the caller does not need.
  void IgnoreError() const {}

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.reason_ == b.reason_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  ErrorReason reason_ = ErrorReason::kNone;
  std::string message_;
};

inline Status OkStatus() { return Status(); }
Status CancelledError(std::string message, ErrorReason reason = ErrorReason::kNone);
Status InvalidArgumentError(std::string message, ErrorReason reason = ErrorReason::kNone);
Status DeadlineExceededError(std::string message, ErrorReason reason = ErrorReason::kNone);
Status NotFoundError(std::string message, ErrorReason reason = ErrorReason::kNone);
Status AlreadyExistsError(std::string message, ErrorReason reason = ErrorReason::kNone);
Status PermissionDeniedError(std::string message, ErrorReason reason = ErrorReason::kNone);
Status ResourceExhaustedError(std::string message, ErrorReason reason = ErrorReason::kNone);
Status FailedPreconditionError(std::string message, ErrorReason reason = ErrorReason::kNone);
Status OutOfRangeError(std::string message, ErrorReason reason = ErrorReason::kNone);
Status UnimplementedError(std::string message, ErrorReason reason = ErrorReason::kNone);
Status InternalError(std::string message, ErrorReason reason = ErrorReason::kNone);
Status UnavailableError(std::string message, ErrorReason reason = ErrorReason::kNone);
Status DataLossError(std::string message, ErrorReason reason = ErrorReason::kNone);
Status UnauthenticatedError(std::string message, ErrorReason reason = ErrorReason::kNone);

// A value of type T or a non-OK Status.
// REQUIRES: constructing from a Status requires !status.ok().
// REQUIRES: value() / operator* / operator-> require ok().
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    assert(!std::get<Status>(v_).ok() && "Result built from an OK Status");
    if (std::get<Status>(v_).ok()) {
      v_ = Status(StatusCode::kInternal, "Result built from an OK Status");
    }
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  // OK when holding a value.
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }

  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace arbiter

#define ARBITER_STATUS_CONCAT_INNER_(a, b) a##b
#define ARBITER_STATUS_CONCAT_(a, b) ARBITER_STATUS_CONCAT_INNER_(a, b)

// Returns from the current function if `expr` (a Status) is not OK.
#define ARBITER_RETURN_IF_ERROR(expr)                     \
  do {                                                    \
    ::arbiter::Status arbiter_status_ = (expr);           \
    if (!arbiter_status_.ok()) return arbiter_status_;    \
  } while (0)

// `lhs = value of expr` (a Result<T>), or returns its Status.
#define ARBITER_ASSIGN_OR_RETURN(lhs, expr) \
  ARBITER_ASSIGN_OR_RETURN_IMPL_(           \
      ARBITER_STATUS_CONCAT_(arbiter_result_, __LINE__), lhs, expr)
#define ARBITER_ASSIGN_OR_RETURN_IMPL_(result, lhs, expr) \
  auto result = (expr);                                   \
  if (!result.ok()) return result.status();               \
  lhs = std::move(result).value()
