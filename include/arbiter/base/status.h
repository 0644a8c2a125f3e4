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

class [[nodiscard]] Status {
 public:
  // OK.
  Status() = default;
  Status(StatusCode code, std::string message)
      : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: message", or "OK".
  std::string ToString() const;

  // Returns a copy whose message is "<prefix>: <message>"; OK stays OK.
  Status WithPrefix(std::string_view prefix) const;

  // Explicitly discards a status the caller does not need.
  void IgnoreError() const {}

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status OkStatus() { return Status(); }
Status CancelledError(std::string message);
Status InvalidArgumentError(std::string message);
Status DeadlineExceededError(std::string message);
Status NotFoundError(std::string message);
Status AlreadyExistsError(std::string message);
Status PermissionDeniedError(std::string message);
Status ResourceExhaustedError(std::string message);
Status FailedPreconditionError(std::string message);
Status OutOfRangeError(std::string message);
Status UnimplementedError(std::string message);
Status InternalError(std::string message);
Status UnavailableError(std::string message);
Status DataLossError(std::string message);
Status UnauthenticatedError(std::string message);

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
