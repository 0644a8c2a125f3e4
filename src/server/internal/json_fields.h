// server/internal/json_fields.h — reading request bodies (and integer query
// parameters, ParseQueryInt): the one JSON reader of client input (Note
// [One JSON reader]), and typed field getters whose errors name the field
// (the parsing policy of openai.cc: `null` is absent, a wrong type or an
// out-of-range value is kInvalidArgument naming the field and, for numbers,
// the range). Shared by every route that reads a JSON body, and by the
// fuzz targets of the request parsers.
//
// Note [One JSON reader]
// Every JSON text a client sends goes through ParseJson (ReadJson,
// arbiter/base/json_reader.h, with the depth below): each route's body
// (the API routes', the admin actions', /ui/login's, and the proxy's peek
// at `model`) and JSON carried inside a string field (an assistant tool
// call's `arguments`). One configuration, so no route is weaker than the
// others:
//   - depth: at most kMaxJsonDepth (128) arrays and objects open at once;
//     the 129th is refused as it opens, before anything under it is built,
//     so an 8 MiB body of `[` costs no memory;
//   - duplicate keys: a key appears at most once per object (nlohmann keeps
//     the last of a repeated key silently; a client that sends `model`
//     twice meant one of them) — a 400 naming the key's path;
//   - size: the HTTP body's limit ([server] max_body_bytes), which the
//     transport enforces before any byte is parsed; a string field is part
//     of its body;
//   - numbers: a number beyond a double (1e400) is an error, not infinity;
//   - errors quote at most kMaxQuotedInputBytes of the input (ClipInput);
//   - key order: an object's keys stay in the order the client wrote them
//     (RequestJson is nlohmann::ordered_json), so a JSON schema reaches the
//     grammar compiler with its properties in declared order, and a tool's
//     parameters reach the chat template as written (docs/grammar.md);
//   - bounded work: an object of n keys is read in O(n log n), 800k keys
//     included. ordered_json's own find, contains and operator[] are
//     linear in the object's size: a parser may look up its fixed fields
//     (after CheckKnownFields has bounded the keys, or a few times at
//     most), but never look a key up once per key of a client's object.
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

// Deepest nesting of arrays and objects ParseJson accepts.
inline constexpr int kMaxJsonDepth = 128;

// A parsed request body: objects keep the client's key order (Note [One
// JSON reader]). Responses are built with nlohmann::json.
using RequestJson = nlohmann::ordered_json;

// Parses `text` (any JSON value) under Note [One JSON reader]. `what` names
// the text in errors ("request body", "\"input[2].arguments\""). Errors,
// kInvalidArgument (reason kInvalidRequest):
//   "<what> is not valid JSON: <the parser's message>",
//   "<what> is not valid JSON: arrays and objects nest deeper than 128 levels",
//   "<what> has the key \"<path>\" twice; a key may appear once per object"
//   (path: "model", "messages[0].role").
Result<RequestJson> ParseJson(std::string_view text, std::string_view what);
// A request body: ParseJson's rules, and it must be a JSON object
// ("request body must be a JSON object").
Result<RequestJson> ParseBody(std::string_view body);
// Compact JSON text; invalid UTF-8 in strings becomes U+FFFD (what every
// response body and NDJSON / SSE line is written with).
std::string DumpJson(const nlohmann::json& j);
// The same for ordered JSON (a request's schema handed on as text, or an
// answer that echoes one): keys in the order written.
std::string DumpJson(const RequestJson& j);
// Looks up `key`; nullptr when absent or null.
const RequestJson* Field(const RequestJson& obj, const char* key);
// kInvalidArgument `"field" must be what`.
Status TypeError(std::string_view field, std::string_view what);
// The getters read `key` of `obj` and name the field `name` in their errors
// (empty: `key`; e.g. "options.temperature" when reading Ollama's options).
Status GetString(const RequestJson& obj, const char* key, bool required, std::string* out,
                 std::string_view name = {});
Status GetBool(const RequestJson& obj, const char* key, bool* out, std::string_view name = {});
// An integer (a float with an integral value is accepted) in [lo, hi].
// Errors name the range: `"n" must be an integer between 1 and 16 (got 17)`
// (IntRangeText).
Status GetInt(const RequestJson& obj, const char* key, int64_t lo, int64_t hi,
              std::optional<int64_t>* out, std::string_view name = {});
// "an integer between <lo> and <hi>" ("an integer" for the whole int64
// range): how the errors of GetInt word [lo, hi].
std::string IntRangeText(int64_t lo, int64_t hi);
// A finite number in [lo, hi] ((lo, hi] when lo_open); `range` words it
// ("between 0 and 2"), in the errors for a wrong type too.
Status GetNumber(const RequestJson& obj, const char* key, double lo, double hi, bool lo_open,
                 std::string_view range, std::optional<double>* out, std::string_view name = {});

// A query parameter's value as a decimal integer in [lo, hi] (`?since=`,
// `?timeout_ms=`). Errors: kInvalidArgument (reason kInvalidRequest)
// `"<name>" must be <what> (got "<value>")` for an empty, non-decimal or
// out-of-range value.
Result<int64_t> ParseQueryInt(std::string_view name, std::string_view value, int64_t lo,
                              int64_t hi, std::string_view what);

// "No field is silently ignored": kInvalidArgument
// `unrecognized field "<prefix><key>" ...` for the first key of `obj` not
// in `known` (each request parser lists every field it implements, accepts
// as a documented no-op, or refuses by name; docs/http-api.md "Request
// fields"). `prefix` names the enclosing object ("" at the top,
// "response_format." inside). A null-valued unknown key is refused too.
Status CheckKnownFields(const RequestJson& obj, std::initializer_list<std::string_view> known,
                        std::string_view prefix = "");
// kInvalidArgument `"<key>" is not supported: <why>` when `key` is present
// and not null.
Status RejectField(const RequestJson& obj, const char* key, std::string_view why);

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
