// See json_fields.h.
#include "server/internal/json_fields.h"

#include <charconv>
#include <cmath>
#include <limits>
#include <utility>

#include "arbiter/base/clip.h"
#include "arbiter/base/json_reader.h"

namespace arbiter::server_internal {
namespace {

using json = RequestJson;

Status Invalid(std::string message) {
  return InvalidArgumentError(std::move(message), ErrorReason::kInvalidRequest);
}

}  // namespace

Result<RequestJson> ParseJson(std::string_view text, std::string_view what) {
  Result<RequestJson> j = ReadJson(text, what, kMaxJsonDepth);
  if (!j.ok()) return j.status().WithReason(ErrorReason::kInvalidRequest);
  return j;
}

Result<RequestJson> ParseBody(std::string_view body) {
  ARBITER_ASSIGN_OR_RETURN(json j, ParseJson(body, "request body"));
  if (!j.is_object()) return Invalid("request body must be a JSON object");
  return j;
}

std::string DumpJson(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string DumpJson(const RequestJson& j) {
  return j.dump(-1, ' ', false, RequestJson::error_handler_t::replace);
}

// Looks up `key`; nullptr when absent or null.
const RequestJson* Field(const RequestJson& obj, const char* key) {
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
    return InvalidArgumentError(
        fmt::format("\"{}\" must be {} (got \"{}\")", name, what, ClipInput(value)),
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

std::string IntRangeText(int64_t lo, int64_t hi) {
  if (lo == std::numeric_limits<int64_t>::min() && hi == std::numeric_limits<int64_t>::max()) {
    return "an integer";
  }
  return fmt::format("an integer between {} and {}", lo, hi);
}

// An integer (a float with an integral value is accepted) in [lo, hi].
Status GetInt(const json& obj, const char* key, int64_t lo, int64_t hi, std::optional<int64_t>* out,
              std::string_view name) {
  if (name.empty()) name = key;
  const json* f = Field(obj, key);
  if (f == nullptr) return OkStatus();
  const std::string what = IntRangeText(lo, hi);
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
    if (!std::isfinite(d) || std::floor(d) != d) {
      return InvalidArgumentError(fmt::format("\"{}\" must be {} (got {})", name, what, d));
    }
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
  if (!f->is_number()) return TypeError(name, fmt::format("a number {}", range));
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
      return InvalidArgumentError(fmt::format(
          "unrecognized field \"{}{}\": arbiter implements, ignores as documented, or refuses "
          "every field of this API by name (docs/http-api.md \"Request fields\")",
          prefix, ClipInput(it.key())));
    }
  }
  return OkStatus();
}

Status RejectField(const json& obj, const char* key, std::string_view why) {
  if (Field(obj, key) == nullptr) return OkStatus();
  return InvalidArgumentError(fmt::format("\"{}\" is not supported: {}", key, why));
}

}  // namespace arbiter::server_internal
