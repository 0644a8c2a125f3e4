// arbiter/engine/json_schema.h — JSON Schema → GBNF, for structured output
// (response_format json_schema / json_object, tool-call arguments;
// docs/grammar.md). The GBNF is parsed by Grammar::Parse
// (arbiter/engine/grammar.h) and enforced token by token.
//
// Every sentence of the generated grammar is JSON that validates against
// the schema (for the keywords below); not every valid document is a
// sentence (whitespace is bounded, object keys come in declared order).
//
// Keywords (JSON Schema 2020-12 names; draft-07 `definitions` too):
//   type (a name or an array of names), enum, const (any JSON values; a
//     `type` beside them drops the values of other types);
//   objects: properties (in declared order, the non-required ones
//     optional), required, additionalProperties (false or absent → only the
//     declared properties: absent is treated as false for generation, which
//     still validates; true or a schema → more string keys, after the
//     declared ones, none of them a declared name, with values of that
//     schema);
//   arrays: items, prefixItems, minItems, maxItems (≤ 10 000);
//   strings: minLength, maxLength (code points, ≤ 10 000), pattern (a
//     regex subset, matched against the whole string as if anchored: ^ $,
//     literals, escapes \d \D \w \W \s \S \. \\ \/ \- \t \n \r \uHHHH,
//     classes and negated classes, `.`, groups (...) and (?:...), `|`,
//     `*` `+` `?` `{m}` `{m,}` `{m,n}` (lazy `?` suffix accepted); anything
//     else — lookarounds, backreferences, \b — is an error naming
//     "pattern"), format (date, time, date-time, uuid enforced; time needs
//     an offset, as RFC 3339; day 31 is allowed in every month; other
//     formats are annotations);
//   integer and number: minimum, maximum, exclusiveMinimum,
//     exclusiveMaximum (enforced; integer bounds within ±(2^53 − 1) =
//     ±9007199254740991, larger ones are an error naming the keyword;
//     number bounds any finite value, see Numbers below);
//   boolean, null; anyOf, oneOf (as anyOf: a sentence matches at least one
//   branch, which validates oneOf only when branches are disjoint),
//   allOf with one subschema; $ref to "#", "#/$defs/NAME" or
//   "#/definitions/NAME" (recursion allowed);
//   annotations title, description, default, examples, $schema, $id,
//   $comment, deprecated, readOnly, writeOnly: accepted and ignored.
// A constraining keyword beside $ref, anyOf/oneOf or allOf (or beside
// enum/const, other than type) is rejected rather than merged.
// Anything else is kInvalidArgument naming the JSON pointer and keyword
// (the root's pointer is written "/"):
//   schema: "/properties/x": unsupported keyword "not"
// Invalid JSON: kInvalidArgument "schema is not valid JSON: ...".
//
// Whitespace: between JSON tokens at most one space, or a newline and up to
// 20 spaces or tabs, so a model cannot loop on whitespace (llama.cpp's
// rule). Strings: JSON string syntax (escapes, no raw control characters,
// a \uD800-\uDFFF escape only as a high and low surrogate pair); lengths
// count code points, an escape (or a pair) counting as one.
//
// Numbers (Note [Numbers every client can read] in json_schema.cc): every
// number a sentence holds parses (strtod, JSON.parse) to a finite double
// that is zero or normal.
//   number: `-`? an integer part of ≤ 16 digits (no leading zeros), an
//     optional fraction of 1..16 digits, an optional exponent [eE][-+]? of
//     1..2 digits (so |value| < 10^115, and ≥ 10^-115 unless zero); with
//     bounds: no exponent (|value| < 10^16), between the bounds as a client
//     comparing the parsed doubles sees it (an exclusive bound is the next
//     double inside it); bounds of magnitude ≥ 10^115 (±Number.MAX_VALUE)
//     leave the unbounded rule; bounds that leave no such number are an
//     error.
//   integer: no fraction or exponent, no `-0`, within its bounds and
//     within ±(2^53 − 1) (JavaScript's safe integers) when none are given.
//   enum and const numbers are written as given (nlohmann's spelling); one
//     that is infinite or below DBL_MIN in magnitude (not zero) is an error.
//
// Rule names: the start rule is `root_rule`; every other rule is
// `root_rule + "-" + ...`, so grammars generated under different root names
// can be concatenated into one GBNF text.
//
// Thread safety: pure functions; thread-safe.
#pragma once

#include <string>
#include <string_view>

#include "arbiter/base/status.h"

namespace arbiter {

// JSON schema (JSON text) → GBNF text with start rule `root_rule`.
// Errors: as above; kInvalidArgument also when root_rule is not
// [a-zA-Z0-9-]+.
Result<std::string> JsonSchemaToGbnf(std::string_view schema_json, std::string_view root_rule = "root");

// Any JSON object (response_format json_object), start rule `root_rule`,
// named as JsonSchemaToGbnf's.
// REQUIRES: root_rule matches [a-zA-Z0-9-]+.
std::string JsonObjectGbnf(std::string_view root_rule = "root");

}  // namespace arbiter
