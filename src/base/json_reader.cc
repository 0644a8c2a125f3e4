// See json_reader.h.
#include "arbiter/base/json_reader.h"

#include <algorithm>
#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "arbiter/base/clip.h"

namespace arbiter {
namespace {

using json = nlohmann::ordered_json;

// nlohmann's DOM builder (json_sax_dom_parser) with json_reader.h's
// rules: an array or object opened at depth max_depth, or an object that
// closes with a key twice, stops the parse (a SAX call returning false)
// with `error_`.
//
// An object's members wait in its Frame until it closes, then move into
// the object at once, in the order read. Appending them to the
// ordered_map as they come would copy every earlier member, subtree and
// all, each time its vector grows (its pairs have const keys, so they are
// copied, not moved); and ordered_map's own insert searches the keys
// before it appends. Containers stay put while they are filled: an array
// gets its next element, and an object's Frame its next member, only
// after the open child is closed; Frames never move (the stack holds room
// for max_depth of them from the start).
//
// Duplicate keys are found as the object closes: its keys sorted by (hash,
// key), a repeat is two equal neighbours. O(n log n) comparisons whatever
// the keys are (colliding hashes only make them string comparisons),
// where a hash set could be flooded into O(n²), and without a node
// allocated per key.
class StrictDomBuilder {
 public:
  using number_integer_t = json::number_integer_t;
  using number_unsigned_t = json::number_unsigned_t;
  using number_float_t = json::number_float_t;
  using string_t = json::string_t;
  using binary_t = json::binary_t;

  StrictDomBuilder(std::string_view what, int max_depth) : what_(what), max_depth_(max_depth) {
    stack_.reserve(static_cast<size_t>(max_depth));
  }

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
    stack_.back().members.emplace_back(std::move(k), nullptr);
    return true;
  }

  bool parse_error(std::size_t /*position*/, const std::string& /*last_token*/,
                   const json::exception& e) {
    // nlohmann's message quotes the token read so far ("last read:
    // '...'"), which can be the whole text.
    error_ =
        InvalidArgumentError(fmt::format("{} is not valid JSON: {}", what_, ClipInput(e.what())));
    return false;
  }

  // The document, or the error that stopped the parse. `parsed`: what
  // sax_parse returned.
  Result<json> Take(bool parsed) {
    if (!error_.ok()) return error_;
    if (!parsed) return InvalidArgumentError(fmt::format("{} is not valid JSON", what_));
    return std::move(root_);
  }

 private:
  // An open array or object (`value`, in the document), and an object's
  // members read so far.
  struct Frame {
    json* value = nullptr;
    std::vector<std::pair<std::string, json>> members;
  };

  // Adds a value where the parse is (the root, the next array element, or
  // the value of the last key). Always true (the parse goes on).
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
    Frame& top = stack_.back();
    if (top.value->is_array()) {
      top.value->emplace_back(std::forward<V>(v));
      return &top.value->back();
    }
    json& slot = top.members.back().second;
    slot = json(std::forward<V>(v));
    return &slot;
  }

  bool Open(json container) {
    if (stack_.size() >= static_cast<size_t>(max_depth_)) {
      error_ = InvalidArgumentError(
          fmt::format("{} is not valid JSON: arrays and objects nest deeper than {} levels", what_,
                      max_depth_));
      return false;
    }
    json* value = At(std::move(container));
    stack_.emplace_back();
    stack_.back().value = value;
    return true;
  }

  bool Close() {
    Frame& top = stack_.back();
    if (top.value->is_object()) {
      // The vector under the ordered_map: appends without a search.
      json::object_t::Container& object = top.value->get_ref<json::object_t&>();
      object.reserve(top.members.size());
      for (auto& [k, v] : top.members) object.emplace_back(std::move(k), std::move(v));
      if (const std::string_view* twice = RepeatedKey(object)) {
        std::string path = OpenPath();
        if (!path.empty()) path += '.';
        path += *twice;
        error_ = InvalidArgumentError(
            fmt::format("{} has the key \"{}\" twice; a key may appear once per object", what_,
                        ClipInput(path)));
        return false;
      }
    }
    stack_.pop_back();
    return true;
  }

  // A key that `object` holds twice, or nullptr (see the class comment).
  const std::string_view* RepeatedKey(const json::object_t::Container& object) {
    if (object.size() < 2) return nullptr;
    sorted_keys_.clear();
    sorted_keys_.reserve(object.size());
    for (const auto& member : object) {
      const std::string_view k = member.first;
      sorted_keys_.emplace_back(std::hash<std::string_view>{}(k), k);
    }
    std::sort(sorted_keys_.begin(), sorted_keys_.end());
    auto twice = std::adjacent_find(sorted_keys_.begin(), sorted_keys_.end());
    return twice == sorted_keys_.end() ? nullptr : &twice->second;
  }

  // The path of the innermost open container ("messages[0]"): each
  // enclosing container's current key or index.
  std::string OpenPath() const {
    std::string path;
    for (size_t i = 0; i + 1 < stack_.size(); ++i) {
      const Frame& f = stack_[i];
      if (f.value->is_array()) {
        path += fmt::format("[{}]", f.value->size() - 1);
      } else {
        if (!path.empty()) path += '.';
        path += f.members.back().first;
      }
    }
    return path;
  }

  std::string_view what_;
  int max_depth_;
  json root_;
  std::vector<Frame> stack_;  // the open arrays and objects, outermost first
  std::vector<std::pair<size_t, std::string_view>> sorted_keys_;  // RepeatedKey's scratch
  Status error_;
};

}  // namespace

Result<nlohmann::ordered_json> ReadJson(std::string_view text, std::string_view what,
                                        int max_depth) {
  StrictDomBuilder builder(what, max_depth);
  bool parsed = false;
  try {
    parsed = json::sax_parse(text.begin(), text.end(), &builder);
  } catch (const json::exception& e) {  // not expected: the SAX parse reports its errors
    return InvalidArgumentError(fmt::format("{} is not valid JSON: {}", what, ClipInput(e.what())));
  }
  return builder.Take(parsed);
}

}  // namespace arbiter
