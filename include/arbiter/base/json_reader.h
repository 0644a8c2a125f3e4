// arbiter/base/json_reader.h — JSON text from outside (a request body, a
// JSON schema) read into a DOM that keeps each object's keys in the order
// written, in bounded work.
//
// nlohmann::ordered_json keeps key order, but its own parser checks each
// key against every earlier key of its object (ordered_map's insert is a
// linear search), so an object of n keys costs O(n²) comparisons, which a
// body of well under a megabyte turns into seconds of work. ReadJson builds
// the same DOM in O(n log n), and with these rules:
//   - depth: at most `max_depth` arrays and objects open at once; the next
//     one is refused as it opens, before anything under it is built, so a
//     text of 8 MiB of `[` costs no memory;
//   - duplicate keys: a key appears at most once per object (nlohmann
//     keeps one of a repeated key silently), an error naming its path;
//   - numbers: a number beyond a double (1e400) is an error, not infinity;
//   - errors quote at most kMaxQuotedInputBytes of the input (ClipInput).
//
// Usage:
//   Result<nlohmann::ordered_json> doc = ReadJson(text, "schema", 128);
//
// Thread safety: a pure function.
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

#include "arbiter/base/status.h"

namespace arbiter {

// Parses `text` (any JSON value). `what` names the text in errors ("request
// body", "schema"). Errors, kInvalidArgument:
//   "<what> is not valid JSON: <the parser's message>",
//   "<what> is not valid JSON: arrays and objects nest deeper than <max_depth> levels",
//   "<what> has the key \"<path>\" twice; a key may appear once per object"
//   (path: "model", "messages[0].role", "[1].a").
// REQUIRES: max_depth ≥ 1.
Result<nlohmann::ordered_json> ReadJson(std::string_view text, std::string_view what,
                                        int max_depth);

}  // namespace arbiter
