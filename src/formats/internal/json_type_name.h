// formats/internal/json_type_name.h — how error messages name a JSON value's
// type ("an integer", "a float", "an array", "an object", "a string", ...).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace arbiter::formats_internal {

inline std::string JsonTypeName(const nlohmann::json& j) {
  if (j.is_number_integer()) return "an integer";
  if (j.is_number_float()) return "a float";
  if (j.is_array()) return "an array";
  if (j.is_object()) return "an object";
  return std::string("a ") + j.type_name();
}

}  // namespace arbiter::formats_internal
