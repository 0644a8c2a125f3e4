// src/engine/internal/byte_level.h — the GPT-2 byte ↔ unicode mapping used by
// ByteLevel pre-tokenizers and decoders (bytes_to_unicode() in GPT-2's
// encoder.py): printable bytes '!'..'~', '¡'..'¬', '®'..'ÿ' map to the code
// point of the same value; the other 68 bytes map to U+0100.. in byte order.
// Every byte thus becomes one visible, non-space character.
//
// Thread safety: the tables are built once (function-local static) and are
// immutable afterwards.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace arbiter::internal {

struct ByteLevelTables {
  std::array<uint32_t, 256> byte_to_cp;     // byte → code point
  std::array<std::string, 256> byte_to_utf8;  // byte → UTF-8 of its code point
  std::array<int16_t, 324> cp_to_byte;      // code point (< 324) → byte, or -1
};

inline void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

inline const ByteLevelTables& GetByteLevelTables() {
  static const ByteLevelTables tables = [] {
    ByteLevelTables t;
    t.cp_to_byte.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      uint32_t cp = printable ? static_cast<uint32_t>(b) : next++;
      t.byte_to_cp[b] = cp;
      AppendUtf8(cp, &t.byte_to_utf8[b]);
      t.cp_to_byte[cp] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return tables;
}

// Length of the UTF-8 sequence starting at s[i] when it is complete and well
// formed (1..4), else 1 (an invalid byte stands alone). Sets *cp.
inline size_t Utf8CharLen(std::string_view s, size_t i, uint32_t* cp) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size();
  unsigned char c = p[i];
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  size_t len;
  uint32_t v;
  uint32_t min;
  if ((c & 0xE0) == 0xC0) {
    len = 2, v = c & 0x1F, min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3, v = c & 0x0F, min = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4, v = c & 0x07, min = 0x10000;
  } else {
    *cp = 0xFFFFFFFF;
    return 1;
  }
  if (i + len > n) {
    *cp = 0xFFFFFFFF;
    return 1;
  }
  for (size_t k = 1; k < len; ++k) {
    if ((p[i + k] & 0xC0) != 0x80) {
      *cp = 0xFFFFFFFF;
      return 1;
    }
    v = (v << 6) | (p[i + k] & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
    *cp = 0xFFFFFFFF;
    return 1;
  }
  *cp = v;
  return len;
}

// Maps raw bytes to their ByteLevel string.
inline std::string BytesToByteLevel(std::string_view bytes) {
  const auto& t = GetByteLevelTables();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) out += t.byte_to_utf8[c];
  return out;
}

// Reverses BytesToByteLevel. False (and *out untouched) when `s` holds a
// character outside the mapping.
inline bool ByteLevelToBytes(std::string_view s, std::string* out) {
  const auto& t = GetByteLevelTables();
  std::string r;
  r.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    size_t len = Utf8CharLen(s, i, &cp);
    if (cp >= t.cp_to_byte.size() || t.cp_to_byte[cp] < 0) return false;
    r.push_back(static_cast<char>(t.cp_to_byte[cp]));
    i += len;
  }
  out->append(r);
  return true;
}

}  // namespace arbiter::internal
