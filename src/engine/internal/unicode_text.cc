// Unicode helpers for the tokenizer (see unicode_text.h), on utf8proc.
#include "engine/internal/unicode_text.h"

#include <utf8proc.h>

#include <cstdlib>
#include <string_view>

#include "engine/internal/byte_level.h"

namespace arbiter::internal {
namespace {

bool IsAscii(std::string_view s) {
  for (unsigned char c : s) {
    if (c >= 0x80) return false;
  }
  return true;
}

// Calls `fn(run, out)` on each maximal valid UTF-8 run of `s` and copies the
// invalid bytes between runs unchanged.
template <typename Fn>
void ForEachValidRun(const std::string& s, std::string* out, Fn fn) {
  size_t run = 0;
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    size_t len = Utf8CharLen(s, i, &cp);
    if (cp == 0xFFFFFFFF) {
      if (i > run) fn(std::string_view(s).substr(run, i - run), out);
      out->push_back(s[i]);
      run = i + 1;
    }
    i += len;
  }
  if (run < s.size()) fn(std::string_view(s).substr(run), out);
}

void MapRun(std::string_view run, int options, std::string* out) {
  utf8proc_uint8_t* dst = nullptr;
  utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(run.data()),
                                    static_cast<utf8proc_ssize_t>(run.size()), &dst,
                                    static_cast<utf8proc_option_t>(options));
  if (n < 0) {
    out->append(run);  // cannot happen for valid UTF-8 but for memory
  } else {
    out->append(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
  }
  std::free(dst);
}

}  // namespace

void NormalizeUnicode(NormalForm form, std::string* s) {
  if (IsAscii(*s)) return;  // ASCII is invariant under every form
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::kNfc: options |= UTF8PROC_COMPOSE; break;
    case NormalForm::kNfd: options |= UTF8PROC_DECOMPOSE; break;
    case NormalForm::kNfkc: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case NormalForm::kNfkd: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  std::string out;
  out.reserve(s->size() + 8);
  ForEachValidRun(*s, &out, [&](std::string_view run, std::string* o) { MapRun(run, options, o); });
  *s = std::move(out);
}

void LowercaseUnicode(std::string* s) {
  std::string out;
  out.reserve(s->size());
  ForEachValidRun(*s, &out, [](std::string_view run, std::string* o) {
    for (size_t i = 0; i < run.size();) {
      uint32_t cp;
      size_t len = Utf8CharLen(run, i, &cp);
      i += len;
      if (cp == 0x130) {  // İ: the one unconditional multi-character lowercase
        o->append("i\xCC\x87");
        continue;
      }
      AppendUtf8(static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))), o);
    }
  });
  *s = std::move(out);
}

void StripCombiningMarks(std::string* s) {
  if (IsAscii(*s)) return;
  std::string out;
  out.reserve(s->size());
  ForEachValidRun(*s, &out, [](std::string_view run, std::string* o) {
    for (size_t i = 0; i < run.size();) {
      uint32_t cp;
      size_t len = Utf8CharLen(run, i, &cp);
      utf8proc_category_t c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
      if (c != UTF8PROC_CATEGORY_MN && c != UTF8PROC_CATEGORY_MC && c != UTF8PROC_CATEGORY_ME) {
        o->append(run.substr(i, len));
      }
      i += len;
    }
  });
  *s = std::move(out);
}

bool IsWhitespace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

bool IsNumeric(uint32_t cp) {
  if (cp > 0x10FFFF) return false;
  utf8proc_category_t c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

bool IsWordChar(uint32_t cp) {
  if (cp > 0x10FFFF) return false;
  if (cp == 0x200C || cp == 0x200D) return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

}  // namespace arbiter::internal
