// See json_fields.h.
#include "server/internal/json_fields.h"

#include <charconv>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "arbiter/base/clip.h"

namespace arbiter::server_internal {
namespace {

using json = nlohmann::json;

Status Invalid(std::string message) {
  return InvalidArgumentError(std::move(message), ErrorReason::kInvalidRequest);
}

// nlohmann's DOM builder (json_sax_dom_parser) with Note [One JSON
// reader]'s checks: an array or object opened at depth kMaxJsonDepth, or a
// key already in its object, stops the parse (a SAX call returning false)
// with `error`. Containers on the stack stay put while they are filled: an
// array gets its next element only after the open child is closed, and
// std::map nodes do not move.
class StrictDomBuilder {
 public:
  using number_integer_t = json::number_integer_t;
  using number_unsigned_t = json::number_unsigned_t;
  using number_float_t = json::number_float_t;
  using string_t = json::string_t;
  using binary_t = json::binary_t;

  explicit StrictDomBuilder(std::string_view what) : what_(what) {}

  bool null() { return Put(nullptr); }
  bool boolean(bool v) { return Put(v); }
  bool number_integer(number_integer_t v) { return Put(v); }
  bool number_unsigned(number_unsigned_t v) { return Put(v); }
  bool number_float(number_float_t v, const string_t& /*text*/) { return Put(v); }
  bool string(string_t& v) { return Put(std::move(v)); }
  bool binary(binary_t& v) { return Put(json::binary(std::move(v))); }
  bool start_object(std::size_t /*n*/) { return Open(json::object()); }
  bool start_array(std::size_t /*n*/) { return Open(json::array()); }
  bool end_object() { return Close(); }
  bool end_array() { return Close(); }

  bool key(string_t& k) {
    json& top = *stack_.back();
    if (top.contains(k)) {
      std::string path = OpenPath();
      if (!path.empty()) path += '.';
      path += k;
      error_ = Invalid(fmt::format("{} has the key \"{}\" twice; a key may appear once per object",
                                   what_, ClipInput(path)));
      return false;
    }
    slot_ = &top[k];
    keys_.back() = std::move(k);
    return true;
  }

  bool parse_error(std::size_t /*position*/, const std::string& /*last_token*/,
                   const json::exception& e) {
    // nlohmann's message quotes the token read so far ("last read:
    // '...'"), which can be the whole body.
    error_ = Invalid(fmt::format("{} is not valid JSON: {}", what_, ClipInput(e.what())));
    return false;
  }

  // The document, or the error that stopped the parse. `parsed`: what
  // sax_parse returned.
  Result<json> Take(bool parsed) {
    if (!error_.ok()) return error_;
    if (!parsed) return Invalid(fmt::format("{} is not valid JSON", what_));
    return std::move(root_);
  }

 private:
  // Adds a value where the parse is (the root, the next array element, or
  // the slot of the last key). Always true (the parse goes on).
  template <typename V>
  bool Put(V&& v) {
    At(std::forward<V>(v));
    return true;
  }
  // Put's work; returns the value added.
  template <typename V>
  json* At(V&& v) {
    if (stack_.empty()) {
      root_ = json(std::forward<V>(v));
      return &root_;
    }
    json& top = *stack_.back();
    if (top.is_array()) {
      top.emplace_back(std::forward<V>(v));
      return &top.back();
    }
    *slot_ = json(std::forward<V>(v));
    return slot_;
  }

  bool Open(json container) {
    if (stack_.size() >= static_cast<size_t>(kMaxJsonDepth)) {
      error_ =
          Invalid(fmt::format("{} is not valid JSON: arrays and objects nest deeper than {} levels",
                              what_, kMaxJsonDepth));
      return false;
    }
    stack_.push_back(At(std::move(container)));
    keys_.emplace_back();
    return true;
  }

  bool Close() {
    stack_.pop_back();
    keys_.pop_back();
    return true;
  }

  // The path of the value being parsed inside the innermost open container
  // ("messages[0]"): each enclosing container's current key or index.
  std::string OpenPath() const {
    std::string path;
    for (size_t i = 0; i + 1 < stack_.size(); ++i) {
      if (stack_[i]->is_array()) {
        path += fmt::format("[{}]", stack_[i]->size() - 1);
      } else {
        if (!path.empty()) path += '.';
        path += keys_[i];
      }
    }
    return path;
  }

  std::string_view what_;
  json root_;
  std::vector<json*> stack_;       // the open arrays and objects, outermost first
  std::vector<std::string> keys_;  // per open container: its current key (objects)
  json* slot_ = nullptr;           // the value of the last key read
  Status error_;
};

}  // namespace

Result<nlohmann::json> ParseJson(std::string_view text, std::string_view what) {
  StrictDomBuilder builder(what);
  bool parsed = false;
  try {
    parsed = json::sax_parse(text.begin(), text.end(), &builder);
  } catch (const json::exception& e) {  // not expected: the SAX parse reports its errors
    return Invalid(fmt::format("{} is not valid JSON: {}", what, ClipInput(e.what())));
  }
  return builder.Take(parsed);
}

Result<nlohmann::json> ParseBody(std::string_view body) {
  ARBITER_ASSIGN_OR_RETURN(json j, ParseJson(body, "request body"));
  if (!j.is_object()) return Invalid("request body must be a JSON object");
  return j;
}

std::string DumpJson(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// Looks up `key`; nullptr when absent or null.
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
