// Property test (rapidcheck) of JSON Schema → GBNF and the matcher
// together: a random schema from the supported subset (json_schema.h), then
// random token streams through GrammarConstraint::FillAllowed with the
// length-aware budget, as the engine runs them, over a synthetic vocabulary
// that has every single byte and multi-byte pieces of JSON and numbers
// (some of which split UTF-8 sequences). Every output must
//   - be complete when the budget ran out or end-of-sequence was chosen
//     (the budget starts at MinCharsToEnd() or more: Note [Length-aware
//     masking] in grammar.cc promises that it then always closes),
//   - parse with nlohmann::json and validate against its schema (Validate
//     below: JSON Schema's meaning of the subset this test generates),
//   - hold only numbers that strtod reads as finite doubles, zero or
//     normal, and integers within their bounds, ±(2^53 − 1) without
//     (Note [Numbers every client can read] in json_schema.cc).
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <nlohmann/json.hpp>

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "arbiter/engine/grammar.h"
#include "arbiter/engine/json_schema.h"
#include "engine/testing/synthetic_tokenizer.h"
#include "engine/testing/test_size.h"

namespace arbiter {
namespace {

using ojson = nlohmann::ordered_json;
using json = nlohmann::json;

constexpr int64_t kMaxSafeInteger = 9007199254740991;

// Debug and sanitizer builds (CI runs this under ASan) walk one stream per
// schema and smaller schemas.
constexpr int kStreamsPerSchema = testing::kFullSizeTests ? 6 : 1;
constexpr int kMaxSchemaDepth = testing::kFullSizeTests ? 3 : 2;

// Pieces a BPE vocabulary has besides every byte: JSON punctuation, words,
// whitespace runs, digit runs and exponents (among them the numbers the old
// rule let through), escapes (surrogates too), UTF-8 split across tokens.
// clang-format off
const char* const kPieces[] = {
    "{\"", "\":", "\": ", "\",", "\", \"", "\"}", "{}", "[]", "[", "],", "}]", "true", "false", "null",
    "abc", " the", "name", "\n  ", "\n\t", "\n                    ", "  ",
    "0", "00", "000", "0000", "123", "999", "9999", "90071992547409", "9007199254740991",
    "9007199254740992", "18446744073709551616", "1e", "e9", "E-", "e+", "e99", "E688", "e-999", "e308",
    ".5", ".0", ".000000", "-0", "-", "0.", "-9", "1.7976931348623157e308", "5e-324",
    "2024-", "-01", "T12:", ":00Z", "\\u00", "\\ud83d", "\\ude00", "\\uD8", "\\n", "\\\"", "\\/",
    "\xC3\xA9", "\xC3", "\xA9x", "\xE2\x82", "\xAC", "\xF0\x9F\x98\x80"};
// clang-format on

const std::shared_ptr<const GrammarVocabulary>& Vocab() {
  // Every byte as a token, then kPieces, then one special token.
  static const auto* v = new std::shared_ptr<const GrammarVocabulary>(
      GrammarVocabulary::Build(testing::SyntheticTokenizer(
          std::vector<std::string>(std::begin(kPieces), std::end(kPieces)))));
  return *v;
}

// ---- Random schemas -------------------------------------------------------

int Pick(int n) { return *rc::gen::inRange(0, n); }

// The bounds numbers and integers share, `which` in 0..3: 0, small
// integers, eighths, ±(2^53 − 1).
ojson SharedBound(int which) {
  switch (which) {
    case 0:
      return 0;
    case 1:
      return *rc::gen::inRange(-1000, 1000);
    case 2:
      return *rc::gen::inRange(-1000, 1000) / 8.0;
    default:
      return Pick(2) ? kMaxSafeInteger : -kMaxSafeInteger;
  }
}

// A bound as JSON: small values, fractions, values near 0, ±(2^53 − 1),
// zod's float32 and float64 limits.
ojson NumberBound() {
  const int which = Pick(9);
  switch (which) {
    case 4:
      return Pick(2) ? 1.7976931348623157e308 : -1.7976931348623157e308;
    case 5:
      return Pick(2) ? 3.4028234663852886e38 : -3.4028234663852886e38;
    case 6:
      return *rc::gen::inRange(-99999, 99999) * 1e-5;
    case 7:
      return *rc::gen::inRange<int64_t>(-kMaxSafeInteger, kMaxSafeInteger);
    case 8:
      return 0.1 * *rc::gen::inRange(-30, 30);
    default:
      return SharedBound(which);
  }
}

ojson IntegerBound() {
  const int which = Pick(6);
  switch (which) {
    case 4:
      return Pick(2) ? kMaxSafeInteger - 1 : -kMaxSafeInteger + 1;
    case 5:
      return *rc::gen::inRange<int64_t>(-kMaxSafeInteger, kMaxSafeInteger);
    default:
      return SharedBound(which);
  }
}

// Lower and upper bound keywords (inclusive or exclusive); with both, an
// open range of length ≥ 2, so an integer lies inside (an empty range is
// an error, tested in json_schema_test.cc).
void AddBounds(ojson* s, bool integer) {
  const int shape = Pick(5);  // none, lower, upper, both, both exclusive
  if (shape == 0) return;
  ojson lo = integer ? IntegerBound() : NumberBound(),
        hi = integer ? IntegerBound() : NumberBound();
  if (shape >= 3) {
    if (lo.get<double>() > hi.get<double>()) std::swap(lo, hi);
    if (hi.get<double>() - lo.get<double>() < 2) {
      if (lo.get<double>() <= 0) {
        hi = lo.get<double>() + 2.5;
      } else {
        lo = hi.get<double>() - 2.5;
      }
    }
  }
  const bool exclusive = shape == 4 || Pick(3) == 0;
  if (integer && exclusive) {  // an exclusive bound at ±(2^53 − 1) alone leaves no integer
    if (lo.get<double>() >= kMaxSafeInteger) lo = kMaxSafeInteger - 1;
    if (hi.get<double>() <= -kMaxSafeInteger) hi = -kMaxSafeInteger + 1;
  }
  if (shape == 1 || shape >= 3) (*s)[exclusive ? "exclusiveMinimum" : "minimum"] = lo;
  if (shape == 2 || shape >= 3) (*s)[exclusive && Pick(2) ? "exclusiveMaximum" : "maximum"] = hi;
  if (!integer) {
    // Bounded numbers have no exponent (|x| < 10^16): drop a lower bound
    // above that, or an upper one below its negative.
    for (const char* kw : {"minimum", "exclusiveMinimum"}) {
      if (s->contains(kw) && (*s)[kw].get<double>() > 9.5e15) s->erase(kw);
    }
    for (const char* kw : {"maximum", "exclusiveMaximum"}) {
      if (s->contains(kw) && (*s)[kw].get<double>() < -9.5e15) s->erase(kw);
    }
  }
}

ojson ScalarValue() {
  switch (Pick(7)) {
    case 0:
      return std::string(1, 's') + std::to_string(Pick(5));
    case 1:
      return *rc::gen::inRange(-50, 50);
    case 2:
      return *rc::gen::inRange(-50, 50) / 4.0;
    case 3:
      return Pick(2) == 0;
    case 4:
      return nullptr;
    case 5:
      return 1e300;
    default:
      return "caf\xC3\xA9 \"q\"";
  }
}

ojson GenSchema(int depth, const std::vector<std::string>& defs);

ojson GenObject(int depth, const std::vector<std::string>& defs) {
  ojson s = {{"type", "object"}};
  ojson props = ojson::object();
  ojson required = ojson::array();
  const int n = Pick(5);
  for (int i = 0; i < n; ++i) {
    const std::string key =
        std::string(1, static_cast<char>('a' + i)) + (Pick(4) == 0 ? "\xC3\xA9 \"x\"" : "");
    props[key] = GenSchema(depth - 1, defs);
    if (Pick(4) != 0) required.push_back(key);
  }
  if (n > 0) s["properties"] = props;
  if (!required.empty()) s["required"] = required;
  switch (Pick(4)) {
    case 0:
      break;
    case 1:
      s["additionalProperties"] = false;
      break;
    case 2:
      s["additionalProperties"] = true;
      break;
    default:
      s["additionalProperties"] = GenSchema(0, defs);
      break;
  }
  return s;
}

ojson GenArray(int depth, const std::vector<std::string>& defs) {
  ojson s = {{"type", "array"}};
  const int prefix = Pick(3);
  if (prefix > 0) {
    s["prefixItems"] = ojson::array();
    for (int i = 0; i < prefix; ++i) s["prefixItems"].push_back(GenSchema(depth - 1, defs));
  }
  const bool items = prefix == 0 || Pick(2);
  if (items) {
    s["items"] = GenSchema(depth - 1, defs);
  } else if (Pick(2)) {
    s["items"] = false;
  }
  int min = Pick(3);
  if (!items && min > prefix) min = prefix;
  if (Pick(2)) s["minItems"] = min;
  if (Pick(2)) s["maxItems"] = min + Pick(4);
  return s;
}

ojson GenString() {
  ojson s = {{"type", "string"}};
  switch (Pick(6)) {
    case 0:
      break;
    case 1: {
      const int min = Pick(4);
      s["minLength"] = min;
      if (Pick(2)) s["maxLength"] = min + Pick(5);
      break;
    }
    case 2:
      s["maxLength"] = Pick(6);
      break;
    case 3:
      s["pattern"] =
          *rc::gen::element<std::string>("^[a-z]{1,4}$", "^(ab|c)+-\\d{2}$", "^\\w+[ -]?$");
      break;
    case 4:
      s["format"] = *rc::gen::element<std::string>("date", "uuid", "date-time");
      break;
    default:
      s["format"] = "email";  // an annotation
      break;
  }
  return s;
}

ojson GenSchema(int depth, const std::vector<std::string>& defs) {
  const int kind = depth <= 0 ? Pick(8) : Pick(15);
  switch (kind) {
    case 0:
      return GenString();
    case 1: {
      ojson s = {{"type", "integer"}};
      AddBounds(&s, /*integer=*/true);
      return s;
    }
    case 2: {
      ojson s = {{"type", "number"}};
      AddBounds(&s, /*integer=*/false);
      return s;
    }
    case 3:
      return {{"type", *rc::gen::element<std::string>("boolean", "null")}};
    case 4: {
      ojson values = ojson::array();
      const int n = 1 + Pick(4);
      for (int i = 0; i < n; ++i) values.push_back(ScalarValue());
      if (Pick(3) == 0) values.push_back({{"k", ojson::array({1, "x", nullptr})}});
      return {{"enum", values}};
    }
    case 5:
      return {{"const", ScalarValue()}};
    case 6: {
      if (defs.empty()) return ojson::object();  // any value
      return {{"$ref", "#/$defs/" + defs[Pick(static_cast<int>(defs.size()))]}};
    }
    case 7:
      return Pick(2) ? ojson::object()
                     : ojson({{"type", ojson::array({"string", "null"})}, {"maxLength", 3}});
    case 8:
    case 9:
    case 10:
      return GenObject(depth, defs);
    case 11:
    case 12:
      return GenArray(depth, defs);
    default: {
      ojson alts = ojson::array();
      const int n = 2 + Pick(2);
      for (int i = 0; i < n; ++i) alts.push_back(GenSchema(depth - 1, defs));
      return {{"anyOf", alts}};
    }
  }
}

// A root schema, sometimes with $defs: a plain one and a recursive tree.
ojson GenRoot(int depth) {
  std::vector<std::string> defs;
  ojson d = ojson::object();
  if (Pick(3) == 0) {
    d["leaf"] = GenSchema(0, {});
    defs.push_back("leaf");
    ojson tree = {
        {"type", "object"},
        {"properties",
         {{"v", GenSchema(0, {})},
          {"kids", {{"type", "array"}, {"items", {{"$ref", "#/$defs/tree"}}}, {"maxItems", 2}}}}},
        {"required", {"v"}}};
    d["tree"] = tree;
    defs.push_back("tree");
  }
  // Mostly objects, as structured output and tool arguments are.
  const int shape = Pick(4);
  ojson root = shape <= 1   ? GenObject(depth, defs)
               : shape == 2 ? GenArray(depth, defs)
                            : GenSchema(depth, defs);
  if (!defs.empty()) {
    if (!root.is_object() || root.contains("$ref") || root.empty() || Pick(2)) {
      root = {{"type", "array"}, {"items", root}, {"maxItems", 3}};
    }
    root["$defs"] = d;
  }
  return root;
}

// ---- Validation -------------------------------------------------------------

size_t CodePoints(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool IsInteger(const json& v) {
  return v.is_number_integer() ||
         (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
}

// JSON Schema's meaning of what GenRoot writes; `why` names the first
// violation. Also: an integer without bounds is within ±(2^53 − 1).
bool Validate(const ojson& s, const json& v, const ojson& root, std::string* why) {
  auto fail = [&](const std::string& what) {
    *why = what + " (value " + v.dump().substr(0, 80) + ", schema " + s.dump().substr(0, 120) + ")";
    return false;
  };
  if (s.is_boolean()) return s.get<bool>() || fail("schema false");
  if (s.contains("$ref")) {
    const std::string ref = s["$ref"].get<std::string>();
    return Validate(root.at(ojson::json_pointer(ref.substr(1))), v, root, why);
  }
  if (s.contains("anyOf")) {
    for (const ojson& b : s["anyOf"]) {
      std::string ignored;
      if (Validate(b, v, root, &ignored)) return true;
    }
    return fail("no anyOf branch");
  }
  if (s.contains("enum") || s.contains("const")) {
    const ojson values = s.contains("enum") ? s["enum"] : ojson::array({s["const"]});
    for (const ojson& x : values) {
      if (json::parse(x.dump()) == v) return true;
    }
    return fail("not in enum/const");
  }
  if (s.contains("type")) {
    bool ok = false;
    const ojson types = s["type"].is_array() ? s["type"] : ojson::array({s["type"]});
    for (const ojson& t : types) {
      const std::string n = t.get<std::string>();
      ok = ok || (n == "object" && v.is_object()) || (n == "array" && v.is_array()) ||
           (n == "string" && v.is_string()) || (n == "number" && v.is_number()) ||
           (n == "integer" && v.is_number() && IsInteger(v)) ||
           (n == "boolean" && v.is_boolean()) || (n == "null" && v.is_null());
    }
    if (!ok) return fail("wrong type");
  }
  if (v.is_object()) {
    const ojson props = s.value("properties", ojson::object());
    for (const ojson& r : s.value("required", ojson::array())) {
      if (!v.contains(r.get<std::string>())) return fail("missing " + r.get<std::string>());
    }
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (props.contains(it.key())) {
        if (!Validate(props[it.key()], it.value(), root, why)) return false;
      } else if (s.contains("additionalProperties")) {
        if (!Validate(s["additionalProperties"], it.value(), root, why)) return false;
      }
    }
  }
  if (v.is_array()) {
    const size_t n_prefix = s.contains("prefixItems") ? s["prefixItems"].size() : 0;
    for (size_t i = 0; i < v.size(); ++i) {
      if (i < n_prefix) {
        if (!Validate(s["prefixItems"][i], v[i], root, why)) return false;
      } else if (s.contains("items")) {
        if (!Validate(s["items"], v[i], root, why)) return false;
      }
    }
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return fail("minItems");
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return fail("maxItems");
  }
  if (v.is_string()) {
    const std::string str = v.get<std::string>();
    const size_t n = CodePoints(str);
    if (s.contains("minLength") && n < s["minLength"].get<size_t>()) return fail("minLength");
    if (s.contains("maxLength") && n > s["maxLength"].get<size_t>()) return fail("maxLength");
    if (s.contains("pattern") &&
        !std::regex_search(str, std::regex(s["pattern"].get<std::string>()))) {
      return fail("pattern");
    }
    const std::string format = s.value("format", "");
    static const std::regex kDate("^\\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\\d|3[01])$");
    static const std::regex kUuid("^[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$");
    static const std::regex kDateTime(
        "^\\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\\d|3[01])[tT]"
        "([01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(\\.\\d+)?([zZ]|[+-]([01]\\d|2[0-3]):[0-5]\\d)$");
    if (format == "date" && !std::regex_match(str, kDate)) return fail("format date");
    if (format == "uuid" && !std::regex_match(str, kUuid)) return fail("format uuid");
    if (format == "date-time" && !std::regex_match(str, kDateTime)) return fail("format date-time");
  }
  if (v.is_number()) {
    const double x = v.get<double>();
    if (s.contains("minimum") && !(x >= s["minimum"].get<double>())) return fail("minimum");
    if (s.contains("maximum") && !(x <= s["maximum"].get<double>())) return fail("maximum");
    if (s.contains("exclusiveMinimum") && !(x > s["exclusiveMinimum"].get<double>())) {
      return fail("exclusiveMinimum");
    }
    if (s.contains("exclusiveMaximum") && !(x < s["exclusiveMaximum"].get<double>())) {
      return fail("exclusiveMaximum");
    }
    if (s.value("type", ojson()) == "integer" &&
        std::fabs(x) > static_cast<double>(kMaxSafeInteger)) {
      return fail("integer beyond ±(2^53 − 1)");
    }
  }
  return true;
}

// Every number token of `text` (valid JSON): strtod reads it as a finite
// double that is zero or normal.
bool NumbersReadable(const std::string& text, std::string* why) {
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
      continue;
    }
    if (c != '-' && !(c >= '0' && c <= '9')) continue;
    size_t end = i;
    while (end < text.size() && std::string_view("0123456789+-.eE").find(text[end]) != std::string_view::npos) {
      ++end;
    }
    const std::string number = text.substr(i, end - i);
    const double d = std::strtod(number.c_str(), nullptr);
    if (!std::isfinite(d) || (d != 0 && std::fabs(d) < DBL_MIN)) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%g", d);
      *why = "number " + number + " reads as " + buf;
      return false;
    }
    i = end - 1;
  }
  return true;
}

// One constrained generation: random choices (often number-like, long or
// not closing anything), end-of-sequence sometimes when allowed, as the
// engine offers it. Returns the text; `complete`: the constraint can end.
std::string Walk(std::shared_ptr<const Grammar> g, int max_tokens, uint64_t seed, bool* complete) {
  const auto& vocab = Vocab();
  GrammarConstraint c(g, vocab);
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> allowed(vocab->size() + 3);  // padded, as logits are
  std::string text;
  for (int step = 0; step < max_tokens; ++step) {
    std::fill(allowed.begin(), allowed.end(), uint8_t{0});
    c.FillAllowed(max_tokens - step, allowed);
    std::vector<int32_t> ids, open, numeric, longest;
    size_t longest_len = 0;
    for (int t = 0; t < static_cast<int>(allowed.size()); ++t) {
      if (!allowed[t]) continue;
      ids.push_back(t);
      const std::string& b = vocab->TokenBytes(t);
      if (b.find_first_not_of("0123456789eE+-.") == std::string::npos) numeric.push_back(t);
      if (b.find_first_of("]}") == std::string::npos) open.push_back(t);
      if (b.size() > longest_len) {
        longest.clear();
        longest_len = b.size();
      }
      if (b.size() == longest_len) longest.push_back(t);
    }
    if (c.CanEnd() && (ids.empty() || rng() % 6 == 0)) break;
    if (ids.empty()) break;
    // 0-2: number-like, 3: longest, 4-7: not closing anything, else any.
    const int style = static_cast<int>(rng() % 10);
    const std::vector<int32_t>& from = style <= 2 && !numeric.empty() ? numeric
                                       : style == 3                   ? longest
                                       : style <= 7 && !open.empty()  ? open
                                                                      : ids;
    const int32_t t = from[rng() % from.size()];
    RC_ASSERT(c.Accept(t).ok());  // an allowed token is accepted
    text += vocab->TokenBytes(t);
    if (c.MustEnd()) break;
  }
  *complete = c.CanEnd();
  return text;
}

// Walks `g` from a budget of MinCharsToEnd() + up to `slack` tokens and
// checks the output (the properties in the file comment); `schema` null:
// any JSON object.
void WalkAndCheck(std::shared_ptr<const Grammar> g, const ojson* schema, int slack) {
  const int min_start = GrammarConstraint(g, Vocab()).MinCharsToEnd();
  RC_ASSERT(min_start < 4096);
  const int max_tokens = min_start + *rc::gen::inRange(0, slack + 1);
  bool complete = false;
  const std::string text = Walk(g, max_tokens, *rc::gen::arbitrary<uint64_t>(), &complete);
  RC_LOG() << "max_tokens " << max_tokens << ": " << text << "\n";
  RC_ASSERT(complete);
  RC_ASSERT(g->Matches(text));
  json v;
  try {
    v = json::parse(text);
  } catch (const std::exception& e) {
    RC_FAIL(std::string("not JSON: ") + e.what());
  }
  std::string why;
  if (schema == nullptr) {
    RC_ASSERT(v.is_object());
  } else if (!Validate(*schema, v, *schema, &why)) {
    RC_FAIL("does not validate: " + why);
  }
  if (!NumbersReadable(text, &why)) RC_FAIL(why);
}

std::shared_ptr<const Grammar> Compile(const ojson& schema) {
  const std::string text = schema.dump();
  RC_LOG() << text << "\n";
  Result<std::string> gbnf = JsonSchemaToGbnf(text);
  if (!gbnf.ok()) RC_FAIL(gbnf.status().ToString());
  Result<std::shared_ptr<const Grammar>> g = Grammar::Parse(*gbnf);
  if (!g.ok()) RC_FAIL(g.status().ToString());
  return *g;
}

RC_GTEST_PROP(JsonSchemaProperty, CompletedOutputsParseValidateAndHoldReadableNumbers, ()) {
  const ojson schema = GenRoot(*rc::gen::inRange(1, kMaxSchemaDepth + 1));
  const std::shared_ptr<const Grammar> g = Compile(schema);
  for (int k = 0; k < kStreamsPerSchema; ++k) WalkAndCheck(g, &schema, 120);
}

// Bounds alone, many values per output: an array of numbers or integers
// under random bounds (the digit-by-digit range grammars of
// Note [Numbers every client can read]).
RC_GTEST_PROP(JsonSchemaProperty, NumbersStayWithinRandomBounds, ()) {
  const bool integer = *rc::gen::arbitrary<bool>();
  ojson item = {{"type", integer ? "integer" : "number"}};
  AddBounds(&item, integer);
  const ojson schema = {{"type", "array"}, {"items", item}, {"minItems", 1}, {"maxItems", 6}};
  const std::shared_ptr<const Grammar> g = Compile(schema);
  for (int k = 0; k < kStreamsPerSchema; ++k) WalkAndCheck(g, &schema, 80);
}

// json_object's grammar (any object; numbers anywhere).
RC_GTEST_PROP(JsonSchemaProperty, JsonObjectOutputsHoldReadableNumbers, ()) {
  static const std::shared_ptr<const Grammar> g = *Grammar::Parse(JsonObjectGbnf());
  WalkAndCheck(g, nullptr, 150);
}

}  // namespace
}  // namespace arbiter
