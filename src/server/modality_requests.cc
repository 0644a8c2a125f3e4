// The request bodies of the modality routes that are JSON
// (arbiter/server/openai.h): POST /v1/audio/speech and
// POST /v1/vision/describe, with openai.cc's parsing policy
// (server/internal/json_fields.h).
#include <optional>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "arbiter/base/clip.h"
#include "arbiter/server/openai.h"
#include "server/internal/json_fields.h"

namespace arbiter {

using json = server_internal::RequestJson;  // a request body (Note [One JSON reader])
using server_internal::CheckKnownFields;
using server_internal::Field;
using server_internal::GetNumber;
using server_internal::GetString;
using server_internal::Guard;
using server_internal::ParseBody;
using server_internal::TypeError;

Result<SpeechBody> ParseSpeechRequest(std::string_view body) {
  return Guard([&]() -> Result<SpeechBody> {
    ARBITER_ASSIGN_OR_RETURN(json j, ParseBody(body));
    ARBITER_RETURN_IF_ERROR(CheckKnownFields(
        j, {"model", "input", "voice", "response_format", "speed", "stream_format", "instructions"}));
    SpeechBody r;
    ARBITER_RETURN_IF_ERROR(GetString(j, "model", true, &r.model));
    ARBITER_RETURN_IF_ERROR(GetString(j, "input", true, &r.input));
    if (r.input.empty()) return InvalidArgumentError("\"input\" must not be empty");
    ARBITER_RETURN_IF_ERROR(GetString(j, "voice", false, &r.voice));
    if (const json* v = Field(j, "voice"); v != nullptr && v->is_object()) {
      return InvalidArgumentError("\"voice\" must be a voice name; custom voice objects are not "
                                  "supported");
    }
    ARBITER_RETURN_IF_ERROR(GetString(j, "response_format", false, &r.response_format));
    if (r.response_format.empty()) r.response_format = "mp3";
    if (r.response_format != "mp3" && r.response_format != "wav" && r.response_format != "pcm") {
      return InvalidArgumentError(
          fmt::format("\"response_format\" \"{}\" is not supported: one of mp3 (default), wav, pcm",
                      ClipInput(r.response_format)));
    }
    std::optional<double> speed;
    ARBITER_RETURN_IF_ERROR(GetNumber(j, "speed", 0.25, 4.0, false, "between 0.25 and 4.0", &speed));
    r.speed = speed.value_or(1.0);
    if (const json* f = Field(j, "stream_format"); f != nullptr && !(f->is_string() && *f == "audio")) {
      return InvalidArgumentError("\"stream_format\" must be \"audio\" (\"sse\" is not supported)");
    }
    if (Field(j, "instructions") != nullptr) {
      return InvalidArgumentError("\"instructions\" is not supported by these speech models");
    }
    return r;
  });
}

Result<DescribeBody> ParseDescribeRequest(std::string_view body) {
  return Guard([&]() -> Result<DescribeBody> {
    ARBITER_ASSIGN_OR_RETURN(json j, ParseBody(body));
    ARBITER_RETURN_IF_ERROR(CheckKnownFields(j, {"model", "image", "image_url"}));
    DescribeBody r;
    ARBITER_RETURN_IF_ERROR(GetString(j, "model", true, &r.model));
    for (const char* field : {"image", "image_url"}) {
      const json* v = Field(j, field);
      if (v == nullptr) continue;
      if (!r.field.empty()) return InvalidArgumentError("give one of \"image\" and \"image_url\"");
      const json* url = v->is_object() ? Field(*v, "url") : v;
      if (url == nullptr || !url->is_string()) {
        return TypeError(field, "a data: URL string (or {\"url\": ...})");
      }
      r.image = url->get<std::string>();
      r.field = field;
    }
    if (r.field.empty()) return InvalidArgumentError("\"image\" is required (a data: URL)");
    return r;
  });
}

}  // namespace arbiter
