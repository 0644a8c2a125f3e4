// libFuzzer target: the multipart/form-data reader (server/multipart.h) on
// arbitrary bytes, i.e. an untrusted upload body, with the first line of
// the input as its Content-Type — the reader the audio routes and the
// proxy's peek use. Errors must be kInvalidArgument with a message;
// accepted parts must name themselves, stay within the limits, view bytes
// inside the body, and no name but an array field's ("...[]") repeats.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "arbiter/server/multipart.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  const size_t nl = all.find('\n');
  const std::string_view type = nl == std::string_view::npos ? all : all.substr(0, nl);
  const std::string_view body = nl == std::string_view::npos ? std::string_view() : all.substr(nl + 1);
  arbiter::Result<std::vector<arbiter::FormPart>> parts = arbiter::ParseMultipart(type, body);
  if (!parts.ok()) {
    if (parts.status().code() != arbiter::StatusCode::kInvalidArgument) __builtin_trap();
    if (parts.status().message().empty()) __builtin_trap();
    return 0;
  }
  if (parts->size() > arbiter::kMaxMultipartParts) __builtin_trap();
  for (const arbiter::FormPart& p : *parts) {
    if (p.name.empty()) __builtin_trap();
    const bool array_field = p.name.size() > 2 && p.name.substr(p.name.size() - 2) == "[]";
    if (!array_field && arbiter::FindPart(*parts, p.name) != &p) __builtin_trap();
    if (p.data.data() < body.data() || p.data.data() + p.data.size() > body.data() + body.size()) {
      __builtin_trap();
    }
  }
  return 0;
}
