// arbiter/base/clip.h — how an error message quotes what a client sent.
//
// A message names the offending value so the client can find it, but the
// value can be megabytes (a 7.9 MB "model" name): every message that quotes
// client input passes it through ClipInput, which keeps at most
// kMaxQuotedInputBytes of it.
//
// Usage:
//   return NotFoundError(fmt::format("model \"{}\" not found", ClipInput(name)));
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace arbiter {

// The most bytes of client input an error message quotes.
inline constexpr size_t kMaxQuotedInputBytes = 256;

// `text` itself when it is at most `max_bytes` long; else its first bytes,
// cut at a UTF-8 character boundary (never inside a multi-byte sequence)
// so that they are at most `max_bytes`, followed by "…" (U+2026, 3 bytes).
std::string ClipInput(std::string_view text, size_t max_bytes = kMaxQuotedInputBytes);

}  // namespace arbiter
