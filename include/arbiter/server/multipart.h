// arbiter/server/multipart.h — multipart/form-data bodies (RFC 7578), the
// upload format of POST /v1/audio/transcriptions and /v1/audio/vad.
//
// A pure, bounds-checked reader of untrusted bytes (fuzzed:
// fuzz/multipart_fuzz.cc). It reads the boundary from the Content-Type
// header, then each part's header block (Content-Disposition with `name`
// and an optional `filename`, Content-Type) and its content, which is a
// view into the body (no copy). Part headers other than those two are
// ignored; a Content-Transfer-Encoding is refused (RFC 7578 4.7 deprecates
// it and no client sends one).
//
// A field appears once: a second part of the same name is an error, except
// for array fields, whose names end in "[]" ("timestamp_granularities[]").
//
// Limits: at most kMaxMultipartParts parts, header blocks of at most
// kMaxMultipartHeaderBytes each. Errors are kInvalidArgument with a message
// naming what is wrong ("multipart body: part 2 has no Content-Disposition
// name"); the caller adds nothing.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "arbiter/base/status.h"

namespace arbiter {

inline constexpr size_t kMaxMultipartParts = 64;
inline constexpr size_t kMaxMultipartHeaderBytes = 8 << 10;

struct FormPart {
  std::string name;          // Content-Disposition name="..."
  std::string filename;      // filename="..." ("" when absent)
  bool has_filename = false;
  std::string content_type;  // the part's Content-Type ("" when absent)
  std::string_view data;     // the content: a view into the body passed in
};

// The boundary parameter of a multipart/form-data Content-Type header.
// Errors: not multipart/form-data; no or an invalid boundary (1..70
// characters, RFC 2046 5.1.1).
Result<std::string> MultipartBoundary(std::string_view content_type);

// Parses `body` (REQUIRES: outlives the returned views). Errors: no opening
// boundary, a part without a header block end or a closing boundary, a part
// without a form-data Content-Disposition name, a field sent twice (not
// "...[]"), too many parts, a header block over the limit.
Result<std::vector<FormPart>> ParseMultipart(std::string_view content_type, std::string_view body);

// The first part named `name`, or nullptr.
const FormPart* FindPart(const std::vector<FormPart>& parts, std::string_view name);

}  // namespace arbiter
