// src/engine/internal/pcre2_regex.h — a compiled PCRE2 pattern for
// pre-tokenizer splits.
//
// Compiled once with PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF (so
// \p{L}, \s etc. follow Unicode, and input that is not valid UTF-8 is matched
// without crashing: invalid bytes simply never match and end up in the gaps
// between matches), JIT-compiled when the library supports it.
//
// Thread safety: immutable after Compile; SplitIsolated is thread-safe (it
// allocates its own match data per call).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "arbiter/base/status.h"

namespace arbiter::internal {

class Pcre2Regex {
 public:
  // kInvalidArgument with PCRE2's message and offset when `pattern` does not
  // compile.
  static Result<std::shared_ptr<const Pcre2Regex>> Compile(const std::string& pattern);
  ~Pcre2Regex();
  Pcre2Regex(const Pcre2Regex&) = delete;
  Pcre2Regex& operator=(const Pcre2Regex&) = delete;

  // Splits `text` into matches and the non-empty gaps between them, in order
  // (HF SplitDelimiterBehavior::Isolated). Appends [begin, end) byte ranges
  // (relative to `text`) to `out`. Empty matches are skipped. A matching
  // error (e.g. match limit) ends splitting; the rest becomes one gap.
  void SplitIsolated(std::string_view text, std::vector<std::pair<size_t, size_t>>* out) const;
  // Appends the [begin, end) ranges of the non-empty, non-overlapping matches
  // of the pattern in `text`, left to right.
  void FindAll(std::string_view text, std::vector<std::pair<size_t, size_t>>* out) const;

 private:
  Pcre2Regex() = default;
  void* code_ = nullptr;  // pcre2_code_8*
};

}  // namespace arbiter::internal
