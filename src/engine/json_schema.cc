// JSON Schema → GBNF (arbiter/engine/json_schema.h).
//
// One rule per visited subschema, named from its place in the schema
// (`root-city`, `root-tags-item`, ...) and made unique with a counter; the
// JSON primitives (`root-string`, `root-ws`, ...) are written once, on
// first use. A `$ref` target gets its rule name before it is visited, so a
// recursive reference becomes a recursive rule. Objects and arrays with
// optional members are chains of rules, one pair per member: "nothing
// written yet" (no comma before the next member) and "something written"
// (a comma first), so the declared order is kept without exponential
// alternatives. Each member value is followed by `ws` and each "{", "[" and
// "," by `ws`, so no two `ws` are ever adjacent (they would double the
// whitespace allowed and the matcher's stacks).
//
// The result is parsed by Grammar::Parse before it is returned, which
// catches what only the whole grammar shows (a `$ref` cycle that consumes
// nothing, a required recursion that never ends).
//
// Note [Numbers every client can read]
// Every number a grammar from here admits parses (strtod, JSON.parse, ...)
// to a finite double that is zero or normal, so no client meets an infinity
// or a value that underflowed (llama.cpp's rule admits `6E688`):
//   - `number` without bounds: an integer part of at most 16 digits, a
//     fraction of at most 16 and an exponent of at most 2. A nonzero
//     mantissa written so lies in [10^-16, 10^16), so with |e| ≤ 99 the
//     value lies in [10^-115, 10^115): far inside [DBL_MIN ≈ 2.2e-308,
//     DBL_MAX ≈ 1.8e308]. A zero mantissa (`0`, `-0.0e5`) parses to zero.
//   - `number` with bounds: no exponent, so 10^-16 ≤ |x| < 10^16 unless x
//     is zero, and x is held between the bounds digit by digit
//     (MagnitudeRange). A bound is a double b; its shortest round-trip decimal
//     d parses back to b and rounding is monotone, so every decimal x ≤ d
//     parses to a double ≤ b: a client that compares the parsed doubles
//     agrees. An exclusive bound b becomes the inclusive bound next to it
//     (nextafter toward the allowed side): x < d alone could still round to
//     b. Bounds the unbounded rule already keeps (|b| ≥ 10^115, such as
//     zod's ±Number.MAX_VALUE) give the unbounded rule.
//   - `integer`: between its bounds, and within ±(2^53 − 1) (what every
//     JSON client reads exactly) when none are given; bounds beyond that
//     are refused. No `-0`, no leading zeros.
//   - `enum` and `const` numbers are written as given, so one that is not
//     a finite normal double (1e400 parses to infinity, 5e-324 is
//     subnormal) is refused.
//
// Note [Keys beside declared properties]
// With additionalProperties a schema (or true), an extra key must not be a
// declared property's name: a validator checks that key's value against the
// property, not against additionalProperties (and a duplicate of a written
// key would replace its value). KeyOutside writes "a JSON string that is
// none of these names once its escapes are decoded": a trie of the names'
// code points with one rule per node, whose alternatives are the closing
// quote (unless the node ends a name), each child code point in every
// spelling JSON has for it (raw, short escape, \uHHHH in either case, a
// surrogate pair) and then the child's rule, or any other code point and
// then any string. At a node with a child above U+FFFF, surrogate pairs
// are left out of "any other" (the pair could spell the child), a small
// loss that keeps the rule exact.
#include "arbiter/engine/json_schema.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cfloat>
#include <charconv>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "arbiter/engine/grammar.h"

namespace arbiter {
namespace {

using json = nlohmann::ordered_json;  // keeps the declared property order

constexpr int kMaxDepth = 64;
constexpr int64_t kMaxCount = Grammar::kMaxRepetition;
// Note [Numbers every client can read]: an integer is at most
// 2^53 − 1 in magnitude (JavaScript's Number.MAX_SAFE_INTEGER), so a bound
// beyond it is refused.
constexpr int64_t kMaxSafeInteger = 9007199254740991;  // 2^53 − 1
constexpr int kMaxIntDigits = 16;    // integer part of a number
constexpr int kMaxFracDigits = 16;   // fraction of a number
// Every number of the unbounded rule is below this in magnitude:
// (10^16 − 10^−16) · 10^99.
constexpr double kPlainNumberLimit = 1e115;

const std::set<std::string>& Annotations() {
  static const std::set<std::string> k = {"title",   "description", "default",  "examples",
                                          "$schema", "$id",         "$comment", "deprecated",
                                          "readOnly", "writeOnly"};
  return k;
}

const std::set<std::string>& Known() {
  static const std::set<std::string> k = {
      "type",      "enum",      "const",    "properties",       "required",         "additionalProperties",
      "items",     "prefixItems", "minItems", "maxItems",       "minLength",        "maxLength",
      "pattern",   "format",    "minimum",  "maximum",          "exclusiveMinimum", "exclusiveMaximum",
      "anyOf",     "oneOf",     "allOf",    "$ref",             "$defs",            "definitions"};
  return k;
}

std::string PointerEscape(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

std::string Hex2(uint32_t v) {
  static const char* d = "0123456789ABCDEF";
  return std::string("\\x") + d[(v >> 4) & 15] + d[v & 15];
}

// A GBNF string literal spelling `bytes` (UTF-8 passes through).
std::string Literal(std::string_view bytes) {
  std::string out = "\"";
  for (unsigned char c : bytes) {
    if (c == '"') {
      out += "\\\"";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (c < 0x20 || c == 0x7F) {
      out += Hex2(c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xC0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xE0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    *out += static_cast<char>(0xF0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// One code point inside a GBNF character class.
std::string ClassChar(uint32_t cp) {
  if (cp < 0x20 || cp == 0x7F || cp == ']' || cp == '[' || cp == '\\' || cp == '^' || cp == '-' ||
      cp == '"') {
    return Hex2(cp);
  }
  if (cp >= 0xD800 && cp <= 0xDFFF) return "\\u" + std::to_string(cp);  // never produced
  std::string s;
  AppendUtf8(cp, &s);
  return s;
}

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

Ranges Normalize(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges m;
  for (const auto& x : r) {
    if (!m.empty() && x.first <= m.back().second + 1) {
      m.back().second = std::max(m.back().second, x.second);
    } else {
      m.push_back(x);
    }
  }
  return m;
}

Ranges Complement(const Ranges& r) {
  Ranges c;
  uint32_t next = 0;
  for (const auto& x : Normalize(r)) {
    if (x.first > next) c.push_back({next, x.first - 1});
    next = x.second + 1;
  }
  if (next <= 0x10FFFF) c.push_back({next, 0x10FFFF});
  return c;
}

// The JSON-string spelling of a set of code points (a regex class): the
// characters that need no escape as a class, the others as their escapes.
std::string JsonCharSet(const Ranges& in) {
  Ranges r = Normalize(in);
  std::vector<std::string> alts;
  std::string cls;
  auto contains = [&](uint32_t cp) {
    for (const auto& x : r) {
      if (cp >= x.first && cp <= x.second) return true;
    }
    return false;
  };
  for (const auto& x : r) {
    uint32_t lo = std::max<uint32_t>(x.first, 0x20);
    uint32_t hi = x.second;
    if (lo > hi) continue;
    // Split out '"' (0x22) and '\\' (0x5C).
    std::vector<std::pair<uint32_t, uint32_t>> parts = {{lo, hi}};
    for (uint32_t cut : {uint32_t{0x22}, uint32_t{0x5C}}) {
      std::vector<std::pair<uint32_t, uint32_t>> next;
      for (auto p : parts) {
        if (cut < p.first || cut > p.second) {
          next.push_back(p);
          continue;
        }
        if (p.first < cut) next.push_back({p.first, cut - 1});
        if (cut < p.second) next.push_back({cut + 1, p.second});
      }
      parts = next;
    }
    for (auto p : parts) {
      cls += ClassChar(p.first);
      if (p.second > p.first) {
        cls += '-';
        cls += ClassChar(p.second);
      }
    }
  }
  if (!cls.empty()) alts.push_back("[" + cls + "]");
  if (contains('"')) alts.push_back(Literal("\\\""));
  if (contains('\\')) alts.push_back(Literal("\\\\"));
  for (uint32_t c = 0; c < 0x20; ++c) {
    if (!contains(c)) continue;
    const char* shortform = c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t" : c == 8 ? "\\b" : c == 12 ? "\\f" : nullptr;
    if (shortform != nullptr) {
      alts.push_back(Literal(shortform));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      alts.push_back(Literal(buf));
    }
  }
  if (alts.empty()) return "[^\\x00-\\U0010FFFF]";  // matches nothing
  if (alts.size() == 1) return alts[0];
  std::string out = "(";
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return out + ")";
}

std::string Count(int64_t min, int64_t max) {  // max < 0: unbounded
  if (max < 0) return min == 0 ? "*" : min == 1 ? "+" : "{" + std::to_string(min) + ",}";
  if (min == max) return "{" + std::to_string(min) + "}";
  if (min == 0 && max == 1) return "?";
  return "{" + std::to_string(min) + "," + std::to_string(max) + "}";
}

// Regex subset → GBNF expression for the JSON-string body that spells a
// matching string (json_schema.h lists the subset).
class RegexConverter {
 public:
  RegexConverter(std::string re, std::string ptr) : re_(std::move(re)), ptr_(std::move(ptr)) {}

  Result<std::string> Run() {
    if (!re_.empty() && re_[0] == '^') ++pos_;
    ARBITER_ASSIGN_OR_RETURN(std::string e, Alternation(0));
    if (pos_ < re_.size() && re_[pos_] == '$' && pos_ + 1 == re_.size()) ++pos_;
    if (pos_ < re_.size()) return Error(std::string("unexpected \"") + re_[pos_] + "\"");
    return e;
  }

 private:
  Status Error(const std::string& what) const {
    return InvalidArgumentError("schema: \"" + ptr_ + "\": unsupported \"pattern\" (at offset " +
                                std::to_string(pos_) + "): " + what);
  }
  bool AtEnd() const { return pos_ >= re_.size(); }
  char Peek() const { return AtEnd() ? '\0' : re_[pos_]; }

  Result<std::string> Alternation(int depth) {
    if (depth > kMaxDepth) return Error("groups nested too deeply");
    std::vector<std::string> alts;
    while (true) {
      ARBITER_ASSIGN_OR_RETURN(std::string s, Sequence(depth));
      alts.push_back(s.empty() ? "\"\"" : s);
      if (Peek() != '|') break;
      ++pos_;
    }
    if (alts.size() == 1) return alts[0];
    std::string out = "(";
    for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
    return out + ")";
  }

  Result<std::string> Sequence(int depth) {
    std::string out;
    while (!AtEnd() && Peek() != '|' && Peek() != ')') {
      if (Peek() == '$' && pos_ + 1 == re_.size()) break;
      ARBITER_ASSIGN_OR_RETURN(std::string atom, Atom(depth));
      ARBITER_ASSIGN_OR_RETURN(std::string q, Quantifier());
      if (!q.empty()) atom = "(" + atom + ")" + q;
      out += (out.empty() ? "" : " ") + atom;
    }
    return out;
  }

  Result<std::string> Quantifier() {
    std::string q;
    char c = Peek();
    if (c == '*' || c == '+' || c == '?') {
      ++pos_;
      q = std::string(1, c);
    } else if (c == '{') {
      size_t save = pos_++;
      auto num = [&](int64_t* v) {
        if (!(Peek() >= '0' && Peek() <= '9')) return false;
        *v = 0;
        while (Peek() >= '0' && Peek() <= '9') {
          *v = std::min<int64_t>(*v * 10 + (Peek() - '0'), kMaxCount + 1);
          ++pos_;
        }
        return true;
      };
      int64_t m = 0, n = -1;
      if (!num(&m)) {
        pos_ = save;
        return Error("\"{\" is not a quantifier");
      }
      if (Peek() == ',') {
        ++pos_;
        if (Peek() != '}' && !num(&n)) return Error("bad quantifier");
      } else {
        n = m;
      }
      if (Peek() != '}') return Error("bad quantifier");
      ++pos_;
      if (m > kMaxCount || n > kMaxCount) return Error("repetition above " + std::to_string(kMaxCount));
      if (n >= 0 && n < m) return Error("quantifier {m,n} with n < m");
      q = Count(m, n);
    } else {
      return q;
    }
    if (Peek() == '?') ++pos_;  // lazy: same language
    if (Peek() == '*' || Peek() == '+' || Peek() == '{') return Error("possessive or doubled quantifier");
    return q;
  }

  Result<uint32_t> CodePoint() {
    unsigned char c = static_cast<unsigned char>(re_[pos_]);
    int len = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (len == 0 || pos_ + len > re_.size()) return Error("invalid UTF-8");
    uint32_t cp = len == 1 ? c : c & (0xFF >> (len + 1));
    for (int i = 1; i < len; ++i) cp = cp << 6 | (static_cast<unsigned char>(re_[pos_ + i]) & 0x3F);
    pos_ += len;
    return cp;
  }

  Result<uint32_t> Hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      char h = Peek();
      int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
      if (d < 0) return Error("bad hex escape");
      v = v * 16 + d;
      ++pos_;
    }
    return v;
  }

  // An escape after '\\': a class (\d ...) or one code point.
  Result<Ranges> Escape(bool in_class) {
    if (AtEnd()) return Error("escape at end of pattern");
    char e = re_[pos_++];
    static const Ranges kDigit = {{'0', '9'}};
    static const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
    static const Ranges kSpace = {{'\t', '\r'}, {' ', ' '}, {0xA0, 0xA0}, {0x2028, 0x2029}, {0xFEFF, 0xFEFF}};
    switch (e) {
      case 'd': return kDigit;
      case 'D': return Complement(kDigit);
      case 'w': return kWord;
      case 'W': return Complement(kWord);
      case 's': return kSpace;
      case 'S': return Complement(kSpace);
      case 't': return Ranges{{'\t', '\t'}};
      case 'n': return Ranges{{'\n', '\n'}};
      case 'r': return Ranges{{'\r', '\r'}};
      case 'f': return Ranges{{12, 12}};
      case 'v': return Ranges{{11, 11}};
      case 'u': {
        ARBITER_ASSIGN_OR_RETURN(uint32_t v, Hex(4));
        return Ranges{{v, v}};
      }
      case 'x': {
        ARBITER_ASSIGN_OR_RETURN(uint32_t v, Hex(2));
        return Ranges{{v, v}};
      }
      case 'b':
        if (in_class) return Ranges{{8, 8}};
        return Error("word boundaries (\\b) are not supported");
      case 'B': return Error("word boundaries (\\B) are not supported");
      default:
        if (e >= '1' && e <= '9') return Error("backreferences are not supported");
        if (std::string_view(".\\/-^$|()[]{}*+?\"").find(e) != std::string_view::npos) {
          return Ranges{{static_cast<uint32_t>(e), static_cast<uint32_t>(e)}};
        }
        return Error(std::string("unknown escape \"\\") + e + "\"");
    }
  }

  Result<std::string> Atom(int depth) {
    char c = Peek();
    if (c == '(') {
      ++pos_;
      if (Peek() == '?') {
        if (pos_ + 1 < re_.size() && re_[pos_ + 1] == ':') {
          pos_ += 2;
        } else {
          return Error("lookarounds and named groups are not supported");
        }
      }
      ARBITER_ASSIGN_OR_RETURN(std::string inner, Alternation(depth + 1));
      if (Peek() != ')') return Error("unclosed \"(\"");
      ++pos_;
      return "(" + inner + ")";
    }
    if (c == '[') {
      ++pos_;
      bool negate = false;
      if (Peek() == '^') {
        negate = true;
        ++pos_;
      }
      Ranges r;
      bool first = true;
      while (true) {
        if (AtEnd()) return Error("unterminated character class");
        if (Peek() == ']' && !first) {
          ++pos_;
          break;
        }
        first = false;
        Ranges lo_set;
        if (Peek() == '\\') {
          ++pos_;
          ARBITER_ASSIGN_OR_RETURN(lo_set, Escape(true));
        } else {
          ARBITER_ASSIGN_OR_RETURN(uint32_t cp, CodePoint());
          lo_set = {{cp, cp}};
        }
        if (lo_set.size() == 1 && lo_set[0].first == lo_set[0].second && Peek() == '-' &&
            pos_ + 1 < re_.size() && re_[pos_ + 1] != ']') {
          ++pos_;
          uint32_t hi;
          if (Peek() == '\\') {
            ++pos_;
            ARBITER_ASSIGN_OR_RETURN(Ranges h, Escape(true));
            if (h.size() != 1 || h[0].first != h[0].second) return Error("class range ends in a class");
            hi = h[0].first;
          } else {
            ARBITER_ASSIGN_OR_RETURN(hi, CodePoint());
          }
          if (hi < lo_set[0].first) return Error("class range out of order");
          r.push_back({lo_set[0].first, hi});
        } else {
          r.insert(r.end(), lo_set.begin(), lo_set.end());
        }
      }
      return JsonCharSet(negate ? Complement(r) : r);
    }
    if (c == '.') {
      ++pos_;
      return JsonCharSet(Complement({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}));
    }
    if (c == '\\') {
      ++pos_;
      ARBITER_ASSIGN_OR_RETURN(Ranges r, Escape(false));
      return JsonCharSet(r);
    }
    if (c == '^' || c == '$') return Error("anchors are supported only at the start and end");
    if (c == '*' || c == '+' || c == '?' || c == '{') return Error(std::string("nothing to repeat before \"") + c + "\"");
    if (c == ']' || c == '}') {
      ++pos_;
      return JsonCharSet({{static_cast<uint32_t>(c), static_cast<uint32_t>(c)}});
    }
    ARBITER_ASSIGN_OR_RETURN(uint32_t cp, CodePoint());
    return JsonCharSet({{cp, cp}});
  }

  std::string re_;
  std::string ptr_;
  size_t pos_ = 0;
};

// Decimal strings of the integers in [lo, hi] (0 ≤ lo ≤ hi), no leading zeros.
std::string SameLength(const std::string& a, const std::string& b) {
  const size_t n = a.size();
  if (n == 0) return "";
  if (a == b) return Literal(a);
  if (a[0] == b[0]) return Literal(a.substr(0, 1)) + " " + SameLength(a.substr(1), b.substr(1));
  const std::string ra = a.substr(1), rb = b.substr(1);
  const bool all0 = ra.find_first_not_of('0') == std::string::npos;
  const bool all9 = rb.find_first_not_of('9') == std::string::npos;
  auto any = [](size_t k) { return k == 0 ? std::string() : " [0-9]" + (k == 1 ? std::string() : "{" + std::to_string(k) + "}"); };
  if (all0 && all9) return "[" + std::string(1, a[0]) + "-" + std::string(1, b[0]) + "]" + any(n - 1);
  std::vector<std::string> alts;
  alts.push_back(Literal(a.substr(0, 1)) + (n > 1 ? " " + SameLength(ra, std::string(n - 1, '9')) : ""));
  if (b[0] - a[0] >= 2) {
    alts.push_back("[" + std::string(1, static_cast<char>(a[0] + 1)) + "-" + std::string(1, static_cast<char>(b[0] - 1)) + "]" + any(n - 1));
  }
  alts.push_back(Literal(b.substr(0, 1)) + (n > 1 ? " " + SameLength(std::string(n - 1, '0'), rb) : ""));
  std::string out = "(";
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return out + ")";
}

// Decimal strings of the integers in [lo, hi] (0 ≤ lo ≤ hi ≤ 10^16 − 1),
// no leading zeros: lo's length, the lengths between as one alternative,
// hi's length — so reading digits keeps at most three parses alive.
std::string NonNegativeRange(int64_t lo, int64_t hi) {
  const std::string a = std::to_string(lo), b = std::to_string(hi);
  if (a.size() == b.size()) return "(" + SameLength(a, b) + ")";
  std::vector<std::string> alts;
  alts.push_back(SameLength(a, std::string(a.size(), '9')));
  if (b.size() - a.size() >= 2) {
    alts.push_back("[1-9] [0-9]" + Count(static_cast<int64_t>(a.size()), static_cast<int64_t>(b.size()) - 2));
  }
  alts.push_back(SameLength("1" + std::string(b.size() - 1, '0'), b));
  std::string out = "(";
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return out + ")";
}

// A non-negative decimal: integer digits without leading zeros ("0" for
// zero) and fraction digits without trailing zeros.
struct Decimal {
  std::string int_digits;
  std::string frac;
};

// |d| exactly as its shortest round-trip spelling (which parses back to |d|).
// REQUIRES: d finite.
Decimal DecimalOf(double d) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, std::fabs(d), std::chars_format::scientific);
  const std::string s(buf, r.ptr);  // "D.DDDe±XX" or "De±XX"
  const size_t e = s.find('e');
  std::string digits;
  for (char c : s.substr(0, e)) {
    if (c != '.') digits += c;
  }
  const int point = std::stoi(s.substr(e + 1)) + 1;  // digits before the decimal point
  Decimal out;
  if (point <= 0) {
    out.int_digits = "0";
    out.frac = std::string(static_cast<size_t>(-point), '0') + digits;
  } else if (static_cast<size_t>(point) >= digits.size()) {
    out.int_digits = digits + std::string(static_cast<size_t>(point) - digits.size(), '0');
  } else {
    out.int_digits = digits.substr(0, static_cast<size_t>(point));
    out.frac = digits.substr(static_cast<size_t>(point));
  }
  while (!out.frac.empty() && out.frac.back() == '0') out.frac.pop_back();
  const size_t nz = out.int_digits.find_first_not_of('0');
  out.int_digits = nz == std::string::npos ? "0" : out.int_digits.substr(nz);
  return out;
}

// -1, 0, 1 as a <, =, > b.
int Compare(const Decimal& a, const Decimal& b) {
  if (a.int_digits.size() != b.int_digits.size()) return a.int_digits.size() < b.int_digits.size() ? -1 : 1;
  if (int c = a.int_digits.compare(b.int_digits)) return c < 0 ? -1 : 1;
  if (int c = a.frac.compare(b.frac)) return c < 0 ? -1 : 1;  // no trailing zeros: lexicographic
  return 0;
}

std::string AnyDigits(int min, int max) {  // [0-9]{min,max}; "" for {0,0}
  if (max == 0) return "\"\"";
  return "[0-9]" + Count(min, max);
}

std::string Group(const std::vector<std::string>& alts) {
  if (alts.size() == 1) return alts[0];
  std::string out = "(";
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return out + ")";
}

std::string DigitClass(char lo, char hi) {
  return lo == hi ? Literal(std::string(1, lo)) : "[" + std::string(1, lo) + "-" + std::string(1, hi) + "]";
}

// Fraction digit strings s of `min`..n digits (min 0 or 1), as GBNF, by
// the value 0.s against fraction digits `f` (no trailing zeros); nullopt
// when no string qualifies.
// 0.s ≥ 0.f:
std::optional<std::string> FracAtLeast(std::string_view f, int n, int min) {
  if (f.empty()) return AnyDigits(min, n);
  if (n == 0) return std::nullopt;
  std::vector<std::string> alts;
  if (f[0] < '9') alts.push_back(DigitClass(static_cast<char>(f[0] + 1), '9') + " " + AnyDigits(0, n - 1));
  if (std::optional<std::string> rest = FracAtLeast(f.substr(1), n - 1, 0)) {
    alts.push_back(Literal(f.substr(0, 1)) + " " + *rest);
  }
  if (alts.empty()) return std::nullopt;
  return Group(alts);
}

// 0.s ≤ 0.f (never empty: "0"{min} qualifies). REQUIRES: n ≥ min.
std::string FracAtMost(std::string_view f, int n, int min) {
  if (f.empty()) return n == 0 ? "\"\"" : "\"0\"" + Count(min, n);
  if (n == 0) return "\"\"";
  std::vector<std::string> alts;
  if (min == 0) alts.push_back("\"\"");
  if (f[0] > '0') alts.push_back(DigitClass('0', static_cast<char>(f[0] - 1)) + " " + AnyDigits(0, n - 1));
  alts.push_back(Literal(f.substr(0, 1)) + " " + FracAtMost(f.substr(1), n - 1, 0));
  return Group(alts);
}

// 0.lo ≤ 0.s ≤ 0.hi. REQUIRES: 0.lo ≤ 0.hi.
std::optional<std::string> FracBetween(std::string_view lo, std::string_view hi, int n, int min) {
  if (lo.empty()) return FracAtMost(hi, n, min);
  if (n == 0) return std::nullopt;
  if (lo[0] == hi[0]) {
    std::optional<std::string> rest = FracBetween(lo.substr(1), hi.substr(1), n - 1, 0);
    if (!rest) return std::nullopt;
    return Literal(lo.substr(0, 1)) + " " + *rest;
  }
  std::vector<std::string> alts;
  if (std::optional<std::string> rest = FracAtLeast(lo.substr(1), n - 1, 0)) {
    alts.push_back(Literal(lo.substr(0, 1)) + " " + *rest);
  }
  if (hi[0] - lo[0] >= 2) {
    alts.push_back(DigitClass(static_cast<char>(lo[0] + 1), static_cast<char>(hi[0] - 1)) + " " +
                   AnyDigits(0, n - 1));
  }
  alts.push_back(Literal(hi.substr(0, 1)) + " " + FracAtMost(hi.substr(1), n - 1, 0));
  return Group(alts);
}

// What may follow an integer part so that the fraction's value is in
// [0.lo, 0.hi] (hi nullopt: below 1): "." and 1..16 digits, optional when
// the value 0 is in range; nullopt when nothing can.
std::optional<std::string> FractionPart(std::string_view lo, std::optional<std::string_view> hi) {
  std::optional<std::string> digits =
      hi ? FracBetween(lo, *hi, kMaxFracDigits, 1) : FracAtLeast(lo, kMaxFracDigits, 1);
  if (!digits) return std::nullopt;
  if (lo.empty()) return "( \".\" " + *digits + " )?";  // 0 is in range: no fraction is fine
  return "\".\" " + *digits;
}

// Magnitudes x (an integer part of ≤ 16 digits, an optional fraction of
// ≤ 16 digits, no exponent) with lo ≤ x ≤ hi (hi nullopt: no upper bound);
// nullopt when there is none.
std::optional<std::string> MagnitudeRange(const Decimal& lo, std::optional<Decimal> hi) {
  constexpr int64_t kCap = 9999999999999999;  // the largest integer part
  if (hi && static_cast<int>(hi->int_digits.size()) > kMaxIntDigits) hi.reset();
  if (static_cast<int>(lo.int_digits.size()) > kMaxIntDigits) return std::nullopt;
  if (hi && Compare(lo, *hi) > 0) return std::nullopt;
  const int64_t a = std::stoll(lo.int_digits);
  const int64_t b = hi ? std::stoll(hi->int_digits) : kCap + 1;  // b: the first excluded integer part
  std::vector<std::string> alts;
  auto add = [&](int64_t int_part, std::optional<std::string> frac) {
    if (frac) alts.push_back(Literal(std::to_string(int_part)) + " " + *frac);
  };
  if (hi && a == b) {
    add(a, FractionPart(lo.frac, std::string_view(hi->frac)));
  } else {
    add(a, FractionPart(lo.frac, std::nullopt));
    if (a + 1 <= b - 1) {
      alts.push_back(NonNegativeRange(a + 1, b - 1) + " ( \".\" " + AnyDigits(1, kMaxFracDigits) + " )?");
    }
    if (hi) add(b, FractionPart("", std::string_view(hi->frac)));
  }
  if (alts.empty()) return std::nullopt;
  return Group(alts);
}

// The integers in [lo, hi], as Integer's grammar writes them (no "-0").
// REQUIRES: −(10^16 − 1) ≤ lo ≤ hi ≤ 10^16 − 1.
std::string IntegerRange(int64_t lo, int64_t hi) {
  if (lo >= 0) return NonNegativeRange(lo, hi);
  if (hi < 0) return "\"-\" " + NonNegativeRange(-hi, -lo);
  return "\"-\" " + NonNegativeRange(1, -lo) + " | " + NonNegativeRange(0, hi);
}

// False when `v` holds a number that does not parse to a finite, zero or
// normal double (Note [Numbers every client can read]).
bool ReadableNumbers(const json& v) {
  if (v.is_number_float()) {
    const double d = v.get<double>();
    return std::isfinite(d) && (d == 0 || std::fabs(d) >= DBL_MIN);
  }
  if (v.is_array() || v.is_object()) {
    for (const json& x : v) {
      if (!ReadableNumbers(x)) return false;
    }
  }
  return true;
}

// The hex digits of a \u escape after "u", either case:
// a code point outside the surrogates, or a surrogate pair.
constexpr std::string_view kUnicodeEscape =
    "( [0-9a-cA-CefEF] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} | "
    "[dD] [89abAB] [0-9a-fA-F]{2} \"\\\\u\" [dD] [c-fC-F] [0-9a-fA-F]{2} )";

// A class of hex digit values, either case: [0-3aA].
std::string HexClass(const std::vector<int>& digits) {
  std::string out = "[";
  for (int h : digits) {
    if (h < 10) {
      out += static_cast<char>('0' + h);
    } else {
      out += static_cast<char>('a' + h - 10);
      out += static_cast<char>('A' + h - 10);
    }
  }
  return out + "]";
}

// The 4-hex-digit spellings (either case) of the values in
// [base, base + 16^n) outside `ex` (normalized ranges), as GBNF; nullopt
// when every value is excluded.
std::optional<std::string> HexOutside(uint32_t base, int n, const Ranges& ex) {
  const uint32_t step = 1u << (4 * (n - 1));
  std::vector<int> free_digits;
  std::vector<std::string> alts;
  for (int h = 0; h < 16; ++h) {
    const uint32_t lo = base + static_cast<uint32_t>(h) * step, hi = lo + step - 1;
    bool overlap = false, covered = false;
    for (const auto& r : ex) {
      if (r.second < lo || r.first > hi) continue;
      overlap = true;
      covered = covered || (r.first <= lo && r.second >= hi);
    }
    if (!overlap) {
      free_digits.push_back(h);
    } else if (!covered) {
      if (std::optional<std::string> rest = HexOutside(lo, n - 1, ex)) alts.push_back(HexClass({h}) + " " + *rest);
    }
  }
  if (!free_digits.empty()) {
    alts.insert(alts.begin(), HexClass(free_digits) + (n > 1 ? " [0-9a-fA-F]" + Count(n - 1, n - 1) : ""));
  }
  if (alts.empty()) return std::nullopt;
  return Group(alts);
}

// The JSON spellings of one code point inside a string: raw, a short
// escape, \uHHHH (either case) or a surrogate pair.
std::string SpellCodePoint(uint32_t cp) {
  std::vector<std::string> alts;
  if (cp >= 0x20 && cp != '"' && cp != '\\') {
    std::string raw;
    AppendUtf8(cp, &raw);
    alts.push_back(Literal(raw));
  }
  static const std::map<uint32_t, char> kShort = {{'"', '"'}, {'\\', '\\'}, {'/', '/'}, {8, 'b'},
                                                  {12, 'f'},  {10, 'n'},    {13, 'r'},   {9, 't'}};
  if (auto it = kShort.find(cp); it != kShort.end()) alts.push_back(Literal(std::string("\\") + it->second));
  auto hex4 = [](uint32_t v) {
    std::string out = Literal("\\u");
    for (int shift = 12; shift >= 0; shift -= 4) out += " " + HexClass({static_cast<int>((v >> shift) & 15)});
    return out;
  };
  if (cp < 0x10000) {
    alts.push_back(hex4(cp));
  } else {
    alts.push_back(hex4(0xD800 + ((cp - 0x10000) >> 10)) + " " + hex4(0xDC00 + ((cp - 0x10000) & 0x3FF)));
  }
  return Group(alts);
}

// Code points of valid UTF-8 (JSON text nlohmann accepted).
std::vector<uint32_t> CodePointsOf(std::string_view s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const int len = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    uint32_t cp = len == 1 ? c : c & (0xFF >> (len + 1));
    for (int k = 1; k < len && i + k < s.size(); ++k) cp = cp << 6 | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    out.push_back(cp);
    i += static_cast<size_t>(len);
  }
  return out;
}

class Converter {
 public:
  Converter(const json& doc, std::string root) : doc_(doc), root_(std::move(root)) {}

  Result<std::string> Run() {
    ARBITER_ASSIGN_OR_RETURN(std::string body, Visit(doc_, "", 0));
    std::string out = root_ + " ::= " + body + "\n";
    for (const auto& [name, rule] : rules_) out += name + " ::= " + rule + "\n";
    return out;
  }

  std::string Prim(const std::string& what) {
    const std::string name = root_ + "-" + what;
    if (prims_.count(what)) return name;
    prims_.insert(what);
    std::string body;
    if (what == "ws") {
      body = "( \" \" | \"\\n\" [ \\t]{0,20} )?";
    } else if (what == "char") {
      // A \u escape is a code point outside the surrogates, or a high and
      // a low surrogate together (a lone one is not JSON to nlohmann, Rust's
      // serde_json and others).
      body = "[^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" " + std::string(kUnicodeEscape) + " )";
    } else if (what == "string") {
      body = "\"\\\"\" " + Prim("char") + "* \"\\\"\"";
    } else if (what == "integer") {
      // Note [Numbers every client can read]: ±(2^53 − 1).
      body = IntegerRange(-kMaxSafeInteger, kMaxSafeInteger);
    } else if (what == "number") {
      // Note [Numbers every client can read]: 16 + 16 digits, |exponent| ≤ 99.
      body = "\"-\"? ( \"0\" | [1-9] [0-9]{0,15} ) ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?";
    } else if (what == "boolean") {
      body = "\"true\" | \"false\"";
    } else if (what == "null") {
      body = "\"null\"";
    } else if (what == "value") {
      body = Prim("object") + " | " + Prim("array") + " | " + Prim("string") + " | " + Prim("number") +
             " | " + Prim("boolean") + " | " + Prim("null");
    } else if (what == "object") {
      const std::string kv = Prim("string") + " " + Prim("ws") + " \":\" " + Prim("ws") + " " + Prim("value") + " " + Prim("ws");
      body = "\"{\" " + Prim("ws") + " ( " + kv + " ( \",\" " + Prim("ws") + " " + kv + " )* )? \"}\"";
    } else if (what == "array") {
      const std::string item = Prim("value") + " " + Prim("ws");
      body = "\"[\" " + Prim("ws") + " ( " + item + " ( \",\" " + Prim("ws") + " " + item + " )* )? \"]\"";
    } else if (what == "date") {
      body = "[0-9]{4} \"-\" ( \"0\" [1-9] | \"1\" [0-2] ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"3\" [01] )";
    } else if (what == "time") {
      body = "( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,9} )? "
             "( [zZ] | [+-] ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )";
    } else if (what == "date-time") {
      body = Prim("date") + " [tT] " + Prim("time");
    } else if (what == "uuid") {
      body = "[0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{12}";
    }
    rules_.emplace_back(name, body);
    return name;
  }

 private:
  Status Err(const std::string& ptr, const std::string& what) const {
    return InvalidArgumentError("schema: \"" + (ptr.empty() ? std::string("/") : ptr) + "\": " + what);
  }

  std::string NewRule(const std::string& hint, std::string body) {
    std::string clean;
    for (char c : hint) {
      bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
      if (ok) {
        clean += c;
      } else if (!clean.empty() && clean.back() != '-') {
        clean += '-';
      }
      if (clean.size() >= 40) break;
    }
    while (!clean.empty() && clean.back() == '-') clean.pop_back();
    if (clean.empty()) clean = "r";
    std::string name = root_ + "-" + clean;
    // Primitive names are kept for Prim, which may write them later.
    static const std::set<std::string> kPrimitives = {"ws",      "char",   "string", "integer", "number",
                                                      "boolean", "null",   "value",  "object",  "array",
                                                      "date",    "time",   "date-time", "uuid"};
    if (kPrimitives.count(clean) || !used_.insert(name).second) {
      name = root_ + "-" + clean + "-" + std::to_string(++counter_);
      used_.insert(name);
    }
    rules_.emplace_back(name, std::move(body));
    return name;
  }

  // Reserves a rule name now, fills its body later (for $ref targets).
  size_t Reserve(const std::string& hint) {
    NewRule(hint, "");
    return rules_.size() - 1;
  }

  Result<std::string> Sub(const json& s, const std::string& ptr, const std::string& hint, int depth) {
    ARBITER_ASSIGN_OR_RETURN(std::string body, Visit(s, ptr, depth + 1));
    if (body.find(' ') == std::string::npos && body.rfind(root_ + "-", 0) == 0) return body;  // a rule already
    return NewRule(hint, body);
  }

  static std::string Alts(const std::vector<std::string>& alts) {
    std::string out;
    for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
    return out;
  }

  Result<std::string> JsonLiteral(const json& v, const std::string& ptr) {
    try {
      return Literal(v.dump());
    } catch (const std::exception& e) {
      return Err(ptr, std::string("cannot write value: ") + e.what());
    }
  }

  Result<int64_t> CountKeyword(const json& s, const char* key, const std::string& ptr, int64_t dflt) {
    if (!s.contains(key)) return dflt;
    const json& v = s[key];
    if (!v.is_number_integer() && !(v.is_number_float() && std::floor(v.get<double>()) == v.get<double>())) {
      return Err(ptr, std::string("\"") + key + "\" must be a non-negative integer");
    }
    const double d = v.get<double>();
    if (d < 0) return Err(ptr, std::string("\"") + key + "\" must be a non-negative integer");
    if (d > kMaxCount) return Err(ptr, std::string("\"") + key + "\" above " + std::to_string(kMaxCount) + " is not supported");
    return static_cast<int64_t>(d);
  }

  // Whether `v` has one of the schema's types (true without `type`).
  Result<bool> TypeAllows(const json& s, const json& v, const std::string& ptr) {
    if (!s.contains("type")) return true;
    std::vector<std::string> types;
    const json& t = s["type"];
    if (t.is_string()) {
      types.push_back(t.get<std::string>());
    } else if (t.is_array()) {
      for (const json& x : t) {
        if (!x.is_string()) return Err(ptr, "\"type\" must be a string or an array of strings");
        types.push_back(x.get<std::string>());
      }
    } else {
      return Err(ptr, "\"type\" must be a string or an array of strings");
    }
    for (const std::string& name : types) {
      if ((name == "string" && v.is_string()) || (name == "boolean" && v.is_boolean()) ||
          (name == "null" && v.is_null()) || (name == "object" && v.is_object()) ||
          (name == "array" && v.is_array()) || (name == "number" && v.is_number()) ||
          (name == "integer" && (v.is_number_integer() ||
                                 (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>())))) {
        return true;
      }
    }
    return false;
  }

  Result<std::string> Visit(const json& s, const std::string& ptr, int depth) {
    if (depth > kMaxDepth) return Err(ptr, "schema nested deeper than " + std::to_string(kMaxDepth));
    if (s.is_boolean()) {
      if (s.get<bool>()) return Prim("value");
      return Err(ptr, "schema false allows no value");
    }
    if (!s.is_object()) return Err(ptr, "a schema must be an object or a boolean");
    std::vector<std::string> keys;  // constraining keywords present
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (Annotations().count(it.key())) continue;
      if (!Known().count(it.key())) return Err(ptr, "unsupported keyword \"" + it.key() + "\"");
      if (it.key() != "$defs" && it.key() != "definitions") keys.push_back(it.key());
    }
    auto only = [&](const char* kw) -> Status {
      for (const std::string& k : keys) {
        if (k != kw) return Err(ptr, "keyword \"" + k + "\" beside \"" + kw + "\" is not supported");
      }
      return OkStatus();
    };
    if (s.contains("$ref")) {
      ARBITER_RETURN_IF_ERROR(only("$ref"));
      if (!s["$ref"].is_string()) return Err(ptr, "\"$ref\" must be a string");
      const std::string ref = s["$ref"].get<std::string>();
      if (ref.empty() || ref[0] != '#') return Err(ptr, "\"$ref\" \"" + ref + "\": only references inside the schema (\"#/...\") are supported");
      auto found = refs_.find(ref);
      if (found != refs_.end()) return found->second;
      const json* target = nullptr;
      try {
        json::json_pointer jp(ref.substr(1));
        if (doc_.contains(jp)) target = &doc_.at(jp);
      } catch (const std::exception&) {
      }
      if (target == nullptr) return Err(ptr, "\"$ref\" \"" + ref + "\" does not resolve");
      const size_t slot = Reserve(ref.substr(ref.rfind('/') + 1));
      const std::string name = rules_[slot].first;
      refs_[ref] = name;
      ARBITER_ASSIGN_OR_RETURN(std::string body, Visit(*target, ref.substr(1), depth + 1));
      rules_[slot].second = body;
      return name;
    }
    for (const char* kw : {"const", "enum"}) {
      if (!s.contains(kw)) continue;
      // `type` may stand beside them: values of other types are dropped.
      for (const std::string& k : keys) {
        if (k != kw && k != "type") return Err(ptr, "keyword \"" + k + "\" beside \"" + kw + "\" is not supported");
      }
      json values = std::string(kw) == "const" ? json::array({s[kw]}) : s[kw];
      if (!values.is_array() || values.empty()) return Err(ptr, "\"enum\" must be a non-empty array");
      std::vector<std::string> alts;
      for (const json& v : values) {
        if (!ReadableNumbers(v)) {
          return Err(ptr, std::string("\"") + kw + "\" holds a number that is infinite or too close to 0 for a double");
        }
        ARBITER_ASSIGN_OR_RETURN(bool fits, TypeAllows(s, v, ptr));
        if (!fits) continue;
        ARBITER_ASSIGN_OR_RETURN(std::string lit, JsonLiteral(v, ptr));
        alts.push_back(lit);
      }
      if (alts.empty()) return Err(ptr, std::string("no value of \"") + kw + "\" has the schema's \"type\"");
      return Alts(alts);
    }
    for (const char* kw : {"anyOf", "oneOf"}) {
      if (!s.contains(kw)) continue;
      ARBITER_RETURN_IF_ERROR(only(kw));
      const json& a = s[kw];
      if (!a.is_array() || a.empty()) return Err(ptr, std::string("\"") + kw + "\" must be a non-empty array");
      std::vector<std::string> alts;
      for (size_t i = 0; i < a.size(); ++i) {
        ARBITER_ASSIGN_OR_RETURN(std::string r, Sub(a[i], ptr + "/" + kw + "/" + std::to_string(i), kw, depth));
        alts.push_back(r);
      }
      return Alts(alts);
    }
    if (s.contains("allOf")) {
      ARBITER_RETURN_IF_ERROR(only("allOf"));
      const json& a = s["allOf"];
      if (!a.is_array() || a.size() != 1) return Err(ptr, "\"allOf\" is supported with exactly one subschema");
      return Visit(a[0], ptr + "/allOf/0", depth + 1);
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const json& x : t) {
          if (!x.is_string()) return Err(ptr, "\"type\" must be a string or an array of strings");
          types.push_back(x.get<std::string>());
        }
      } else {
        return Err(ptr, "\"type\" must be a string or an array of strings");
      }
    } else {
      auto has = [&](std::initializer_list<const char*> ks) {
        for (const char* k : ks) {
          if (s.contains(k)) return true;
        }
        return false;
      };
      if (has({"properties", "additionalProperties", "required"})) {
        types.push_back("object");
      } else if (has({"items", "prefixItems", "minItems", "maxItems"})) {
        types.push_back("array");
      } else if (has({"minLength", "maxLength", "pattern", "format"})) {
        types.push_back("string");
      } else if (has({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})) {
        return Err(ptr, "\"minimum\"/\"maximum\" need \"type\": \"integer\" or \"number\"");
      } else {
        return Prim("value");
      }
    }
    std::vector<std::string> alts;
    for (const std::string& t : types) {
      Result<std::string> r = Type(s, t, ptr, depth);
      if (!r.ok()) return r.status();
      alts.push_back(types.size() > 1 ? NewRule(t, *r) : *r);
    }
    return Alts(alts);
  }

  Result<std::string> Type(const json& s, const std::string& t, const std::string& ptr, int depth) {
    if (t == "object") return Object(s, ptr, depth);
    if (t == "array") return Array(s, ptr, depth);
    if (t == "string") return String(s, ptr);
    if (t == "integer") return Integer(s, ptr);
    if (t == "number") return Number(s, ptr);
    if (t == "boolean") return Prim("boolean");
    if (t == "null") return Prim("null");
    return Err(ptr, "unknown \"type\" \"" + t + "\"");
  }

  // A JSON string none of `names` once its escapes are decoded: a trie of
  // the names' code points, one rule per node (Note [Keys beside declared
  // properties]).
  std::string KeyOutside(const std::set<std::string>& names) {
    struct Node {
      std::map<uint32_t, size_t> kids;
      bool terminal = false;
    };
    std::vector<Node> trie(1);
    for (const std::string& name : names) {
      size_t at = 0;
      for (uint32_t cp : CodePointsOf(name)) {
        auto it = trie[at].kids.find(cp);
        if (it == trie[at].kids.end()) {
          trie.emplace_back();
          it = trie[at].kids.emplace(cp, trie.size() - 1).first;
        }
        at = it->second;
      }
      trie[at].terminal = true;
    }
    std::vector<size_t> slots;
    for (size_t i = 0; i < trie.size(); ++i) slots.push_back(Reserve("key"));
    const std::string quote = "\"\\\"\"";
    const std::string rest = Prim("char") + "* " + quote;  // after a code point no name has here
    for (size_t i = 0; i < trie.size(); ++i) {
      const Node& n = trie[i];
      std::vector<std::string> alts;
      if (!n.terminal) alts.push_back(quote);
      std::string raw_excluded;  // children written raw
      std::string short_free;    // short escapes of code points that are no child
      Ranges hex_excluded = {{0xD800, 0xDFFF}};
      bool astral_child = false;
      for (const auto& [cp, child] : n.kids) {
        alts.push_back(SpellCodePoint(cp) + " " + rules_[slots[child]].first);
        if (cp >= 0x20 && cp != '"' && cp != '\\') raw_excluded += ClassChar(cp);
        if (cp < 0x10000) hex_excluded.push_back({cp, cp});
        astral_child = astral_child || cp >= 0x10000;
      }
      for (const auto& [cp, letter] : std::vector<std::pair<uint32_t, const char*>>{
               {'"', "\"\\\"\""}, {'\\', "\"\\\\\""}, {'/', "\"/\""}, {8, "\"b\""}, {12, "\"f\""}, {10, "\"n\""},
               {13, "\"r\""}, {9, "\"t\""}}) {
        if (!n.kids.count(cp)) short_free += std::string(short_free.empty() ? "" : " | ") + letter;
      }
      std::vector<std::string> other = {"[^\"\\\\\\x00-\\x1F" + raw_excluded + "]"};
      std::vector<std::string> escapes;
      if (!short_free.empty()) escapes.push_back("( " + short_free + " )");
      if (std::optional<std::string> hex = HexOutside(0, 4, Normalize(hex_excluded))) escapes.push_back("\"u\" " + *hex);
      // A pair spells a code point above U+FFFF: free only when no child is one.
      if (!astral_child) escapes.push_back("\"u\" [dD] [89abAB] [0-9a-fA-F]{2} \"\\\\u\" [dD] [c-fC-F] [0-9a-fA-F]{2}");
      if (!escapes.empty()) other.push_back("\"\\\\\" " + Group(escapes));
      alts.push_back(Group(other) + " " + rest);
      rules_[slots[i]].second = Alts(alts);
    }
    return "\"\\\"\" " + rules_[slots[0]].first;
  }

  Result<std::string> Object(const json& s, const std::string& ptr, int depth) {
    struct Prop {
      std::string kv;
      bool required;
    };
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) return Err(ptr, "\"required\" must be an array of strings");
      for (const json& r : s["required"]) {
        if (!r.is_string()) return Err(ptr, "\"required\" must be an array of strings");
        required.insert(r.get<std::string>());
      }
    }
    const std::string ws = Prim("ws");
    std::vector<Prop> props;
    std::set<std::string> declared;
    if (s.contains("properties")) {
      const json& p = s["properties"];
      if (!p.is_object()) return Err(ptr, "\"properties\" must be an object");
      for (auto it = p.begin(); it != p.end(); ++it) {
        const std::string sub_ptr = ptr + "/properties/" + PointerEscape(it.key());
        ARBITER_ASSIGN_OR_RETURN(std::string value, Sub(it.value(), sub_ptr, it.key(), depth));
        ARBITER_ASSIGN_OR_RETURN(std::string key, JsonLiteral(json(it.key()), sub_ptr));
        props.push_back({NewRule(it.key() + "-kv", key + " " + ws + " \":\" " + ws + " " + value + " " + ws),
                         required.count(it.key()) > 0});
        declared.insert(it.key());
      }
    }
    for (const std::string& r : required) {
      if (!declared.count(r)) return Err(ptr, "\"required\" names \"" + r + "\", which is not in \"properties\"");
    }
    std::string extra;  // rule for one extra key-value, or empty
    if (s.contains("additionalProperties")) {
      const json& a = s["additionalProperties"];
      if (!(a.is_boolean() && !a.get<bool>())) {
        ARBITER_ASSIGN_OR_RETURN(std::string value, Sub(a, ptr + "/additionalProperties", "additional", depth));
        // A declared name would be checked against its property, not
        // against additionalProperties: extra keys are other names.
        const std::string key = declared.empty() ? Prim("string") : KeyOutside(declared);
        extra = NewRule("additional-kv", key + " " + ws + " \":\" " + ws + " " + value + " " + ws);
      }
    }
    // Chains: first[i] = members i.. with nothing written yet; rest[i] = with a comma first.
    const size_t n = props.size();
    std::vector<std::string> first(n + 1), rest(n + 1);
    const std::string comma = "\",\" " + ws + " ";
    if (extra.empty()) {
      first[n] = "\"\"";
      rest[n] = "\"\"";
    } else {
      rest[n] = NewRule("more", "( " + comma + extra + " )*");
      first[n] = NewRule("extra", "( " + extra + " " + rest[n] + " )?");
    }
    for (size_t i = n; i-- > 0;) {
      const Prop& p = props[i];
      const std::string with_first = p.kv + " " + rest[i + 1];
      const std::string with_rest = comma + p.kv + " " + rest[i + 1];
      if (i == 0) {
        first[i] = p.required ? with_first : with_first + " | " + first[i + 1];
        rest[i] = "\"\"";  // unused
        break;
      }
      first[i] = NewRule("tail", p.required ? with_first : with_first + " | " + first[i + 1]);
      rest[i] = NewRule("tail", p.required ? with_rest : with_rest + " | " + rest[i + 1]);
    }
    const std::string body = n == 0 ? first[0] : NewRule("members", first[0]);
    return "\"{\" " + ws + " " + body + " \"}\"";
  }

  Result<std::string> Array(const json& s, const std::string& ptr, int depth) {
    const std::string ws = Prim("ws");
    ARBITER_ASSIGN_OR_RETURN(int64_t min, CountKeyword(s, "minItems", ptr, 0));
    ARBITER_ASSIGN_OR_RETURN(int64_t max, CountKeyword(s, "maxItems", ptr, -1));
    if (max >= 0 && max < min) return Err(ptr, "\"maxItems\" below \"minItems\"");
    std::vector<std::string> prefix;
    if (s.contains("prefixItems")) {
      const json& p = s["prefixItems"];
      if (!p.is_array()) return Err(ptr, "\"prefixItems\" must be an array");
      for (size_t i = 0; i < p.size(); ++i) {
        ARBITER_ASSIGN_OR_RETURN(std::string r, Sub(p[i], ptr + "/prefixItems/" + std::to_string(i), "item", depth));
        prefix.push_back(r);
      }
    }
    std::string item;  // empty: no items beyond the prefix
    if (s.contains("items")) {
      const json& it = s["items"];
      if (!(it.is_boolean() && !it.get<bool>())) {
        ARBITER_ASSIGN_OR_RETURN(item, Sub(it, ptr + "/items", "item", depth));
      }
    } else if (prefix.empty()) {
      item = Prim("value");
    }
    const std::string comma = "\",\" " + ws + " ";
    size_t k = prefix.size();
    if (max >= 0 && static_cast<int64_t>(k) > max) k = static_cast<size_t>(max);
    const int64_t rest_min = std::max<int64_t>(0, min - static_cast<int64_t>(k));
    const int64_t rest_max = max < 0 ? -1 : max - static_cast<int64_t>(k);
    if (item.empty() && rest_min > 0) return Err(ptr, "\"minItems\" above the items \"prefixItems\" allows");
    std::string first_tail, rest_tail;  // after the prefix
    if (item.empty() || rest_max == 0) {
      first_tail = rest_tail = "\"\"";
    } else {
      const std::string one = item + " " + ws;
      const std::string more = "( " + comma + one + " )";
      rest_tail = more + Count(rest_min, rest_max);
      if (rest_min == 0) {
        first_tail = "( " + one + " " + more + Count(0, rest_max < 0 ? -1 : rest_max - 1) + " )?";
      } else {
        first_tail = one + " " + more + Count(rest_min - 1, rest_max < 0 ? -1 : rest_max - 1);
      }
      if (k > 0) rest_tail = NewRule("more", rest_tail);
    }
    std::string f = first_tail, r = rest_tail;
    for (size_t j = k; j-- > 0;) {
      const bool req = static_cast<int64_t>(j) < min;
      const std::string e = prefix[j] + " " + ws + " " + r;
      const std::string nf = req ? e : "( " + e + " )?";
      const std::string nr = req ? comma + e : "( " + comma + e + " )?";
      if (j == 0) {
        f = nf;
        break;
      }
      f = NewRule("tail", nf);
      r = NewRule("tail", nr);
    }
    return "\"[\" " + ws + " " + NewRule("items", f) + " \"]\"";
  }

  Result<std::string> String(const json& s, const std::string& ptr) {
    ARBITER_ASSIGN_OR_RETURN(int64_t min, CountKeyword(s, "minLength", ptr, 0));
    ARBITER_ASSIGN_OR_RETURN(int64_t max, CountKeyword(s, "maxLength", ptr, -1));
    if (max >= 0 && max < min) return Err(ptr, "\"maxLength\" below \"minLength\"");
    const bool lengths = s.contains("minLength") || s.contains("maxLength");
    const std::string quote = "\"\\\"\"";
    if (s.contains("pattern")) {
      if (lengths) return Err(ptr, "\"pattern\" with \"minLength\"/\"maxLength\" is not supported");
      if (!s["pattern"].is_string()) return Err(ptr, "\"pattern\" must be a string");
      RegexConverter rc(s["pattern"].get<std::string>(), ptr.empty() ? "/" : ptr);
      ARBITER_ASSIGN_OR_RETURN(std::string body, rc.Run());
      return quote + " " + NewRule("pattern", body) + " " + quote;
    }
    if (s.contains("format")) {
      if (!s["format"].is_string()) return Err(ptr, "\"format\" must be a string");
      const std::string f = s["format"].get<std::string>();
      if (f == "date" || f == "time" || f == "date-time" || f == "uuid") {
        if (lengths) return Err(ptr, "\"format\" " + f + " with \"minLength\"/\"maxLength\" is not supported");
        return quote + " " + Prim(f) + " " + quote;
      }
    }
    if (!lengths) return Prim("string");
    return quote + " " + Prim("char") + Count(min, max) + " " + quote;
  }

  // Note [Numbers every client can read]: bounds within ±(2^53 − 1), which
  // is also the range without bounds.
  Result<std::string> Integer(const json& s, const std::string& ptr) {
    bool bounded = false;
    int64_t lo = -kMaxSafeInteger, hi = kMaxSafeInteger;
    for (const char* kw : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}) {
      if (!s.contains(kw)) continue;
      const json& v = s[kw];
      if (!v.is_number()) return Err(ptr, std::string("\"") + kw + "\" must be a number");
      const double d = v.get<double>();
      if (!(std::fabs(d) <= static_cast<double>(kMaxSafeInteger))) {
        return Err(ptr, std::string("\"") + kw + "\" beyond ±(2^53 − 1) (±9007199254740991) is not supported");
      }
      bounded = true;
      const std::string k = kw;
      if (k == "minimum" || k == "exclusiveMinimum") {
        int64_t b = static_cast<int64_t>(std::ceil(d));
        if (k == "exclusiveMinimum" && static_cast<double>(b) == d) ++b;
        lo = std::max(lo, b);
      } else {
        int64_t b = static_cast<int64_t>(std::floor(d));
        if (k == "exclusiveMaximum" && static_cast<double>(b) == d) --b;
        hi = std::min(hi, b);
      }
    }
    if (!bounded) return Prim("integer");
    if (lo > hi) return Err(ptr, "no integer between \"minimum\" and \"maximum\"");
    return IntegerRange(lo, hi);
  }

  // Note [Numbers every client can read]: each bound as the inclusive
  // double bound a client's comparison agrees with.
  Result<std::string> Number(const json& s, const std::string& ptr) {
    constexpr double kInf = std::numeric_limits<double>::infinity();
    double lo = -kInf, hi = kInf;
    for (const char* kw : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}) {
      if (!s.contains(kw)) continue;
      const json& v = s[kw];
      if (!v.is_number()) return Err(ptr, std::string("\"") + kw + "\" must be a number");
      const double d = v.get<double>();
      if (!std::isfinite(d)) return Err(ptr, std::string("\"") + kw + "\" must be a finite number");
      const std::string k = kw;
      if (k == "minimum") lo = std::max(lo, d);
      if (k == "exclusiveMinimum") lo = std::max(lo, std::nextafter(d, kInf));
      if (k == "maximum") hi = std::min(hi, d);
      if (k == "exclusiveMaximum") hi = std::min(hi, std::nextafter(d, -kInf));
    }
    if (lo <= -kPlainNumberLimit && hi >= kPlainNumberLimit) return Prim("number");
    std::vector<std::string> alts;
    if (lo < 0) {  // negative values: "-" and a magnitude in [max(−hi, tiny), −lo]
      const double tiny = std::numeric_limits<double>::denorm_min();
      const Decimal m_lo = DecimalOf(std::max(hi < 0 ? -hi : 0.0, tiny));
      std::optional<Decimal> m_hi;
      if (std::isfinite(lo)) m_hi = DecimalOf(lo);
      if (std::optional<std::string> m = MagnitudeRange(m_lo, m_hi)) alts.push_back("\"-\" " + *m);
    }
    if (hi >= 0) {
      std::optional<Decimal> m_hi;
      if (std::isfinite(hi)) m_hi = DecimalOf(hi);
      if (std::optional<std::string> m = MagnitudeRange(DecimalOf(std::max(lo, 0.0)), m_hi)) alts.push_back(*m);
    }
    if (alts.empty()) {
      return Err(ptr, "no number of at most 16 integer and 16 fraction digits between \"minimum\" and \"maximum\"");
    }
    return NewRule("number-range", Group(alts));
  }

  const json& doc_;
  std::string root_;
  std::vector<std::pair<std::string, std::string>> rules_;
  std::set<std::string> prims_;
  std::set<std::string> used_;
  std::map<std::string, std::string> refs_;
  int counter_ = 0;
};

Status CheckRootName(std::string_view root) {
  if (root.empty()) return InvalidArgumentError("json schema: empty root rule name");
  for (char c : root) {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-')) {
      return InvalidArgumentError("json schema: root rule name \"" + std::string(root) + "\" must match [a-zA-Z0-9-]+");
    }
  }
  return OkStatus();
}

}  // namespace

Result<std::string> JsonSchemaToGbnf(std::string_view schema_json, std::string_view root_rule) {
  ARBITER_RETURN_IF_ERROR(CheckRootName(root_rule));
  json doc;
  try {
    doc = json::parse(schema_json);
  } catch (const std::exception& e) {
    return InvalidArgumentError(std::string("schema is not valid JSON: ") + e.what());
  }
  Converter c(doc, std::string(root_rule));
  ARBITER_ASSIGN_OR_RETURN(std::string gbnf, c.Run());
  std::string check = gbnf;
  if (root_rule != "root") check = "root ::= " + std::string(root_rule) + "\n" + gbnf;
  Result<std::shared_ptr<const Grammar>> g = Grammar::Parse(check);
  if (!g.ok()) return InvalidArgumentError("schema: \"/\": cannot build a grammar: " + g.status().message());
  return gbnf;
}

std::string JsonObjectGbnf(std::string_view root_rule) {
  json empty = json::object();
  Converter c(empty, std::string(root_rule));
  const std::string object = c.Prim("object");
  Result<std::string> rest = c.Run();  // root ::= value (unused) + the primitives
  std::string out = std::string(root_rule) + " ::= " + object + "\n";
  const std::string text = *rest;
  out += text.substr(text.find('\n') + 1);
  return out;
}

}  // namespace arbiter
