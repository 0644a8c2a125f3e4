// LogSafe (arbiter/base/log_safe.h): a strict UTF-8 reader that copies
// printable characters and writes everything else as \xHH.
#include "arbiter/base/log_safe.h"

#include <algorithm>
#include <cstdint>

namespace arbiter {
namespace {

// The length of the valid UTF-8 sequence at the start of `s` (1..4), or 0
// when it is not one (RFC 3629's table: no overlong forms, no surrogates,
// nothing past U+10FFFF). `*cp` gets the code point.
size_t Utf8Sequence(std::string_view s, uint32_t* cp) {
  const auto b = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const uint8_t lead = b(0);
  size_t n = 0;
  uint8_t lo = 0x80;  // the allowed range of the second byte
  uint8_t hi = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    n = 2;
    *cp = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    n = 3;
    *cp = lead & 0x0F;
    if (lead == 0xE0) lo = 0xA0;
    if (lead == 0xED) hi = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    n = 4;
    *cp = lead & 0x07;
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (s.size() < n) return 0;
  for (size_t i = 1; i < n; ++i) {
    const uint8_t c = b(i);
    if (i == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) return 0;
    *cp = (*cp << 6) | (c & 0x3F);
  }
  return n;
}

// Valid characters that still must not reach a log line as they are.
bool Unprintable(uint32_t cp) {
  return (cp >= 0x80 && cp <= 0x9F) || cp == 0x2028 || cp == 0x2029 ||
         (cp >= 0x202A && cp <= 0x202E) || (cp >= 0x2066 && cp <= 0x2069);
}

void AppendEscaped(std::string_view bytes, std::string* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (char ch : bytes) {
    const auto c = static_cast<uint8_t>(ch);
    out->append("\\x");
    out->push_back(kHex[c >> 4]);
    out->push_back(kHex[c & 0xF]);
  }
}

}  // namespace

std::string LogSafe(std::string_view text, size_t max_bytes) {
  std::string out;
  out.reserve(std::min(text.size(), max_bytes) + 8);
  size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<uint8_t>(text[i]);
    uint32_t cp = c;
    size_t n = 1;
    bool escape = false;
    if (c >= 0x80) {
      n = Utf8Sequence(text.substr(i), &cp);
      if (n == 0) {
        n = 1;
        escape = true;
      } else {
        escape = Unprintable(cp);
      }
    } else {
      escape = c < 0x20 || c == 0x7F;
    }
    if (i + n > max_bytes) break;
    const std::string_view piece = text.substr(i, n);
    if (escape) {
      AppendEscaped(piece, &out);
    } else if (c == '\\') {
      out.append("\\\\");
    } else {
      out.append(piece);
    }
    i += n;
  }
  if (i < text.size()) out.append("\xE2\x80\xA6");  // "…"
  return out;
}

}  // namespace arbiter
