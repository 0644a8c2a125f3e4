// The HTTP edge's one error table: a Status (its typed reason first, else
// its code) → HTTP status, OpenAI error type and code, and Retry-After
// (docs/http-api.md "Errors"; Note [Typed error reasons] in base/status.h).
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "arbiter/base/status.h"

namespace arbiter::server_internal {

inline constexpr const char* kInvalidRequestType = "invalid_request_error";
inline constexpr const char* kServerErrorType = "server_error";
// Seconds a client is told to wait before retrying a transient refusal.
inline constexpr int kRetryAfterSeconds = 5;

struct HttpError {
  int status = 500;
  std::string_view type = kServerErrorType;  // OpenAI error "type"
  std::string_view code;                     // OpenAI error "code" ("" → null-ish empty)
  int retry_after_s = 0;                     // > 0: a Retry-After header
  bool bug = false;                          // 500: logged as a bug
};

// The table. A reason decides when there is one; else the code.
HttpError HttpErrorFor(const Status& status);

}  // namespace arbiter::server_internal
