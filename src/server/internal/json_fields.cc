// See json_fields.h.
#include "server/internal/json_fields.h"

#include <charconv>
#include <cmath>
#include <limits>

namespace arbiter::server_internal {
namespace {

using json = nlohmann::json;

// Deepest JSON nesting accepted in a request body. OpenAI requests nest ~6
// levels (messages[i].content[j].text); tool schemas, which we ignore, a few
// more. Without a bound an 8 MiB body of `[` builds 8M nested arrays
// (~0.5 GiB per request) before nlohmann reports the missing `]`.
constexpr int kMaxJsonDepth = 128;
// Longest parse-error text echoed to the client: nlohmann's message quotes
// the token read so far ("last read: '...'"), which can be the whole body.
constexpr size_t kMaxParseErrorChars = 256;

// True when `body` opens more than kMaxJsonDepth arrays/objects at once.
// Tracks strings (and escapes in them) so brackets inside strings do not
// count. On malformed input it agrees with a JSON lexer up to the first
// error, which is as far as the parser reads, so it never rejects a body the
// parser would accept within the bound.
bool NestsTooDeep(std::string_view body) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (const char c : body) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

}  // namespace

Result<nlohmann::json> ParseBody(std::string_view body) {
  if (NestsTooDeep(body)) {
    return InvalidArgumentError(fmt::format(
        "request body is not valid JSON: arrays and objects nest deeper than {} levels",
        kMaxJsonDepth));
  }
  json j;
  try {
    j = json::parse(body.begin(), body.end());
  } catch (const json::exception& e) {
    std::string what = e.what();
    if (what.size() > kMaxParseErrorChars) {
      what.resize(kMaxParseErrorChars);
      what += "...";
    }
    return InvalidArgumentError(fmt::format("request body is not valid JSON: {}", what));
  }
  if (!j.is_object()) return InvalidArgumentError("request body must be a JSON object");
  return j;
}

// Looks up `key`; nullptr when absent or null.
std::string DumpJson(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

const nlohmann::json* Field(const nlohmann::json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

Result<int64_t> ParseQueryInt(std::string_view name, std::string_view value, int64_t lo,
                              int64_t hi, std::string_view what) {
  int64_t v = 0;
  const char* end = value.data() + value.size();
  const auto [ptr, ec] = std::from_chars(value.data(), end, v);
  if (value.empty() || ec != std::errc() || ptr != end || v < lo || v > hi) {
    return InvalidArgumentError(fmt::format("\"{}\" must be {} (got \"{}\")", name, what, value),
                                ErrorReason::kInvalidRequest);
  }
  return v;
}

Status TypeError(std::string_view field, std::string_view what) {
  return InvalidArgumentError(fmt::format("\"{}\" must be {}", field, what));
}

Status GetString(const json& obj, const char* key, bool required, std::string* out,
                 std::string_view name) {
  if (name.empty()) name = key;
  const json* f = Field(obj, key);
  if (f == nullptr) {
    if (required) return InvalidArgumentError(fmt::format("\"{}\" is required", name));
    return OkStatus();
  }
  if (!f->is_string()) return TypeError(name, "a string");
  *out = f->get<std::string>();
  if (required && out->empty()) {
    return InvalidArgumentError(fmt::format("\"{}\" must not be empty", name));
  }
  return OkStatus();
}

Status GetBool(const json& obj, const char* key, bool* out, std::string_view name) {
  if (name.empty()) name = key;
  const json* f = Field(obj, key);
  if (f == nullptr) return OkStatus();
  if (!f->is_boolean()) return TypeError(name, "a boolean");
  *out = f->get<bool>();
  return OkStatus();
}

// An integer (a float with an integral value is accepted) in [lo, hi].
Status GetInt(const json& obj, const char* key, int64_t lo, int64_t hi, std::string_view what,
              std::optional<int64_t>* out, std::string_view name) {
  if (name.empty()) name = key;
  const json* f = Field(obj, key);
  if (f == nullptr) return OkStatus();
  // Outside int64 (an unsigned above INT64_MAX, a float beyond ±9e18) is
  // outside every range; converting it would be undefined.
  bool huge = false;
  int64_t v = 0;
  if (f->is_number_unsigned()) {
    const uint64_t u = f->get<uint64_t>();
    huge = u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    if (!huge) v = static_cast<int64_t>(u);
  } else if (f->is_number_integer()) {
    v = f->get<int64_t>();
  } else if (f->is_number_float()) {
    const double d = f->get<double>();
    if (!std::isfinite(d) || std::floor(d) != d) return TypeError(name, what);
    huge = std::fabs(d) > 9e18;
    if (!huge) v = static_cast<int64_t>(d);
  } else {
    return TypeError(name, what);
  }
  if (huge || v < lo || v > hi) {
    return InvalidArgumentError(fmt::format("\"{}\" must be {} (got {})", name, what, f->dump()));
  }
  *out = v;
  return OkStatus();
}

Status GetNumber(const json& obj, const char* key, double lo, double hi, bool lo_open,
                 std::string_view range, std::optional<double>* out, std::string_view name) {
  if (name.empty()) name = key;
  const json* f = Field(obj, key);
  if (f == nullptr) return OkStatus();
  if (!f->is_number()) return TypeError(name, "a number");
  double v = f->get<double>();
  if (!std::isfinite(v) || v > hi || v < lo || (lo_open && v == lo)) {
    return InvalidArgumentError(fmt::format("\"{}\" must be {} (got {})", name, range, v));
  }
  *out = v;
  return OkStatus();
}

Status CheckKnownFields(const json& obj, std::initializer_list<std::string_view> known,
                        std::string_view prefix) {
  if (!obj.is_object()) return OkStatus();
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    bool found = false;
    for (std::string_view k : known) {
      if (k == it.key()) {
        found = true;
        break;
      }
    }
    if (!found) {
      std::string key = it.key();
      if (key.size() > 64) key = key.substr(0, 64) + "...";
      return InvalidArgumentError(fmt::format(
          "unrecognized field \"{}{}\": arbiter implements, ignores as documented, or refuses "
          "every field of this API by name (docs/http-api.md \"Request fields\")",
          prefix, key));
    }
  }
  return OkStatus();
}

Status RejectField(const json& obj, const char* key, std::string_view why) {
  if (Field(obj, key) == nullptr) return OkStatus();
  return InvalidArgumentError(fmt::format("\"{}\" is not supported: {}", key, why));
}

}  // namespace arbiter::server_internal
