// server/internal/json_fields.h — reading request bodies (and integer query
// parameters, ParseQueryInt): the JSON parse
// with its nesting bound, and typed field getters whose errors name the
// field (the parsing policy of openai.cc: `null` is absent, a wrong type or
// an out-of-range value is kInvalidArgument naming the field). Shared by
// the OpenAI request parsers (openai.cc) and the modality ones
// (modality_requests.cc).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <exception>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "arbiter/base/status.h"

namespace arbiter::server_internal {

// Parses a request body that must be a JSON object nesting at most 128
// levels. Errors: kInvalidArgument "request body is not valid JSON: ...".
Result<nlohmann::json> ParseBody(std::string_view body);
// Compact JSON text; invalid UTF-8 in strings becomes U+FFFD (what every
// response body and NDJSON / SSE line is written with).
std::string DumpJson(const nlohmann::json& j);
// Looks up `key`; nullptr when absent or null.
const nlohmann::json* Field(const nlohmann::json& obj, const char* key);
// kInvalidArgument `"field" must be what`.
Status TypeError(std::string_view field, std::string_view what);
// The getters read `key` of `obj` and name the field `name` in their errors
// (empty: `key`; e.g. "options.temperature" when reading Ollama's options).
Status GetString(const nlohmann::json& obj, const char* key, bool required, std::string* out,
                 std::string_view name = {});
Status GetBool(const nlohmann::json& obj, const char* key, bool* out, std::string_view name = {});
// An integer (a float with an integral value is accepted) in [lo, hi];
// `what` words the expectation ("an integer between 1 and 16").
Status GetInt(const nlohmann::json& obj, const char* key, int64_t lo, int64_t hi,
              std::string_view what, std::optional<int64_t>* out, std::string_view name = {});
// A finite number in [lo, hi] ((lo, hi] when lo_open); `range` words it.
Status GetNumber(const nlohmann::json& obj, const char* key, double lo, double hi, bool lo_open,
                 std::string_view range, std::optional<double>* out, std::string_view name = {});

// A query parameter's value as a decimal integer in [lo, hi] (`?since=`,
// `?timeout_ms=`). Errors: kInvalidArgument (reason kInvalidRequest)
// `"<name>" must be <what> (got "<value>")` for an empty, non-decimal or
// out-of-range value.
Result<int64_t> ParseQueryInt(std::string_view name, std::string_view value, int64_t lo,
                              int64_t hi, std::string_view what);

// Issue 15 point 1, "no field is silently ignored": kInvalidArgument
// `unrecognized field "<prefix><key>" ...` for the first key of `obj` not
// in `known` (each request parser lists every field it implements, accepts
// as a documented no-op, or refuses by name; docs/http-api.md "Request
// fields"). `prefix` names the enclosing object ("" at the top,
// "response_format." inside). A null-valued unknown key is refused too.
Status CheckKnownFields(const nlohmann::json& obj, std::initializer_list<std::string_view> known,
                        std::string_view prefix = "");
// kInvalidArgument `"<key>" is not supported: <why>` when `key` is present
// and not null.
Status RejectField(const nlohmann::json& obj, const char* key, std::string_view why);

// Runs a parser; any exception not already handled (should not happen)
// becomes a 400 rather than escaping into the transport.
template <typename F>
auto Guard(F&& f) -> decltype(f()) {
  // Any nlohmann exception not already handled (should not happen) becomes
  // a 400 rather than escaping into httplib.
  try {
    return f();
  } catch (const std::exception& e) {
    return InvalidArgumentError(fmt::format("invalid request: {}", e.what()));
  }
}

}  // namespace arbiter::server_internal
