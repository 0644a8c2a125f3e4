#include "engine/internal/pcre2_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "engine/internal/byte_level.h"

namespace arbiter::internal {

Result<std::shared_ptr<const Pcre2Regex>> Pcre2Regex::Compile(const std::string& pattern) {
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err,
                                   &err_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof(buf));
    return InvalidArgumentError("regex does not compile at offset " + std::to_string(err_offset) +
                                ": " + reinterpret_cast<const char*>(buf));
  }
  // JIT is an optimisation only: on failure pcre2_match interprets.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  std::shared_ptr<Pcre2Regex> re(new Pcre2Regex());
  re->code_ = code;
  return std::shared_ptr<const Pcre2Regex>(std::move(re));
}

Pcre2Regex::~Pcre2Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void Pcre2Regex::FindAll(std::string_view text,
                         std::vector<std::pair<size_t, size_t>>* out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> md(
      pcre2_match_data_create_from_pattern(code, nullptr), pcre2_match_data_free);
  size_t pos = 0;  // where the next search starts
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  while (md && pos < text.size()) {
    int rc = pcre2_match(code, subject, text.size(), pos, 0, md.get(), nullptr);
    if (rc < 0) break;  // no match, or a matching error (e.g. match limit)
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    size_t mb = ov[0], me = ov[1];
    if (mb >= text.size()) break;
    if (me <= mb) {  // empty match: step over one character and retry
      uint32_t cp;
      pos = mb + Utf8CharLen(text, mb, &cp);
      continue;
    }
    out->emplace_back(mb, me);
    pos = me;
  }
}

void Pcre2Regex::SplitIsolated(std::string_view text,
                               std::vector<std::pair<size_t, size_t>>* out) const {
  size_t first = out->size();
  FindAll(text, out);
  std::vector<std::pair<size_t, size_t>> matches(out->begin() + first, out->end());
  out->resize(first);
  size_t gap = 0;
  for (auto [b, e] : matches) {
    if (b > gap) out->emplace_back(gap, b);
    out->emplace_back(b, e);
    gap = e;
  }
  if (gap < text.size()) out->emplace_back(gap, text.size());
}

}  // namespace arbiter::internal
