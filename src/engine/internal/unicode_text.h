// src/engine/internal/unicode_text.h — the Unicode operations tokenizer
// normalizers and pre-tokenizers need: normalization forms and case mapping
// from utf8proc (not by hand: the tables are Unicode's), and the character
// classes HF `tokenizers` tests with Rust's `char` methods.
//
// Inputs need not be valid UTF-8: each maximal run of valid UTF-8 is
// transformed and every invalid byte is kept where it was (HF cannot see such
// input; the tokenizer must still not lose bytes).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>

namespace arbiter::internal {

enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };

// Applies Unicode normalization form `form` to `s` in place.
void NormalizeUnicode(NormalForm form, std::string* s);
// Lowercases every character with its full lowercase mapping (Rust's
// char::to_lowercase: the simple mapping, except U+0130 → "i\u0307"). No
// context-dependent rules (a final sigma stays σ), as in HF's Lowercase.
void LowercaseUnicode(std::string* s);
// Removes combining marks (general category M), as HF's StripAccents.
void StripCombiningMarks(std::string* s);

// Unicode White_Space (Rust char::is_whitespace; Rust regex \s).
bool IsWhitespace(uint32_t cp);
// General category Nd, Nl or No (Rust char::is_numeric).
bool IsNumeric(uint32_t cp);
// Rust regex \w: alphabetic, marks, decimal digits, connector punctuation,
// join controls (alphabetic approximated as letters and letter numbers).
bool IsWordChar(uint32_t cp);

}  // namespace arbiter::internal
