// arbiter/base/log_safe.h — text from outside made fit for one log line.
//
// Everything a request carries (paths, model names, conversation ids, header
// values, error messages that quote input) goes through LogSafe before it is
// formatted into a log message, so a client can neither forge log lines
// (CR/LF) nor write terminal escapes or megabytes into the log.
//
// Usage:
//   spdlog::info("{} {} {}", req.method, LogSafe(req.path), status);
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace arbiter {

// The default bound on the bytes of input LogSafe keeps: a name, an id, a
// path, a header value.
inline constexpr size_t kLogSafeMaxBytes = 256;
// The bound for a whole error message, which may quote several such values.
inline constexpr size_t kLogSafeMessageBytes = 1024;

// `text` with every byte that is not printable written as `\xHH`: C0
// controls (CR, LF, TAB, ESC, ...), DEL, bytes of invalid UTF-8 (stray
// continuation bytes, overlong forms, surrogates, code points past
// U+10FFFF, sequences cut short), and the valid UTF-8 encodings of C1
// controls (U+0080..U+009F), the line and paragraph separators (U+2028,
// U+2029) and the bidirectional overrides (U+202A..U+202E, U+2066..U+2069),
// each of their bytes. A backslash is written `\\`, so the escaping can be
// read back unambiguously. Other valid UTF-8 is kept as it is.
//
// At most `max_bytes` bytes of `text` are kept (cut at a character
// boundary); a longer text ends with "…". The result is at most
// 4 × max_bytes + 3 bytes.
std::string LogSafe(std::string_view text, size_t max_bytes = kLogSafeMaxBytes);

}  // namespace arbiter
