// arbiter/formats/tokenizer_json.h — Hugging Face tokenizer.json reader.
//
// Parses the JSON file written by HF `tokenizers` into native types, early
// and completely, so the engine's Tokenizer never touches JSON. Only what a
// BPE tokenizer of the Llama family needs is kept; everything else
// (truncation, padding, post_processor, offsets flags) is ignored.
//
// Supported (anything else is kUnimplemented naming the field and value):
//   model         {"type": "BPE"} (a missing "type" with vocab + merges is
//                 taken as BPE, as HF does); "vocab" object token → id;
//                 "merges" as "a b" strings or ["a", "b"] pairs; byte_fallback,
//                 unk_token, ignore_merges, fuse_unk. Each merge's parts and
//                 their concatenation must be in the vocab.
//   added_tokens  [{id, content, special, lstrip, rstrip, normalized,
//                 single_word}] (normalized defaults to !special, as in HF).
//   normalizer    null | NFC | NFD | NFKC | NFKD | Lowercase | StripAccents |
//                 Strip {strip_left, strip_right} | Replace {String|Regex} |
//                 Prepend | Sequence of those.
//   pre_tokenizer null | ByteLevel {add_prefix_space, use_regex} |
//                 Split {pattern {Regex|String}, behavior Removed | Isolated |
//                 MergedWithPrevious | MergedWithNext | Contiguous, invert} |
//                 Digits {individual_digits} | Metaspace {replacement,
//                 prepend_scheme, split} | Whitespace | WhitespaceSplit |
//                 Sequence of those.
//   decoder       null | ByteLevel | Replace {String|Regex} | ByteFallback |
//                 Fuse | Strip | Metaspace | Sequence of those.
//
// Errors: kDataLoss for malformed JSON or a field with a wrong type or value;
// the message names the file and the field path, e.g.
//   tokenizer.json: field "model.merges[12]" must be a string "a b" or a pair
// kUnimplemented for a valid but unsupported model/normalizer/pre-tokenizer/
// decoder type. Regex patterns are not compiled here (the engine compiles
// them with PCRE2 and reports syntax errors).
//
// Thread safety: pure functions; TokenizerJsonSpec is a plain value.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "arbiter/base/status.h"

namespace arbiter {

struct TokenizerAddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;       // the match takes the whitespace on its left
  bool rstrip = false;       // ... and on its right
  bool normalized = true;    // matched in the normalized text (else the raw)
  bool single_word = false;  // matched only between word boundaries
};

struct TokenizerNormalizerStep {
  enum class Kind {
    kPrepend, kReplace, kNfc, kNfd, kNfkc, kNfkd, kLowercase, kStrip, kStripAccents
  };
  Kind kind = Kind::kPrepend;
  std::string prepend;          // kPrepend: text put before a non-empty input
  std::string pattern;          // kReplace: the text or regex to replace
  bool pattern_is_regex = false;
  std::string content;          // kReplace: replacement
  bool strip_left = true;       // kStrip: remove leading whitespace
  bool strip_right = true;      // kStrip: remove trailing whitespace
};

struct TokenizerPreTokenizerStep {
  enum class Kind { kByteLevel, kSplit, kMetaspace, kDigits, kWhitespace, kWhitespaceSplit };
  // What a Split does with the delimiters it finds (HF SplitDelimiterBehavior).
  enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
  Kind kind = Kind::kByteLevel;
  // kByteLevel
  bool add_prefix_space = false;
  bool use_regex = true;        // split with the GPT-2 regex first
  // kSplit: the delimiter pattern; with `invert` the pattern matches the
  // pieces and the text between matches is the delimiter.
  std::string pattern;
  bool pattern_is_regex = true;
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;
  // kDigits: every digit its own piece (else runs of digits)
  bool individual_digits = false;
  // kMetaspace
  std::string replacement = "\xE2\x96\x81";  // "▁"
  enum class PrependScheme { kAlways, kFirst, kNever };
  PrependScheme prepend_scheme = PrependScheme::kAlways;
  bool split = true;
};

struct TokenizerDecoderStep {
  enum class Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace };
  Kind kind = Kind::kByteLevel;
  std::string pattern;          // kReplace: the text or regex to replace
  bool pattern_is_regex = false;
  std::string content;          // kReplace: replacement; kStrip: char to strip
  int strip_start = 0;          // kStrip: max chars removed at the start
  int strip_stop = 0;           // kStrip: max chars removed at the end
  std::string replacement = "\xE2\x96\x81";  // kMetaspace
  bool add_prefix_space = true; // kMetaspace: strip the first token's space
};

// A parsed tokenizer.json (BPE model), or a GGUF vocabulary put in the same
// terms (arbiter/formats/gguf_tokenizer.h).
struct TokenizerJsonSpec {
  std::string model_type;  // "BPE"
  // vocab[i] = (token, id); ids are unique, in [0, 2^21), not necessarily
  // dense (added tokens may fill the holes).
  std::vector<std::pair<std::string, int32_t>> vocab;
  // Merges in rank order (rank = index).
  std::vector<std::pair<std::string, std::string>> merges;
  // SentencePiece-style BPE (GGUF "llama" vocabularies; never set from a
  // tokenizer.json): scores[i] is vocab[i]'s score; when non-empty, `merges`
  // is empty and two adjacent symbols merge whenever their concatenation is
  // in the vocab, highest score first, leftmost on ties.
  std::vector<float> scores;
  bool byte_fallback = false;
  bool ignore_merges = false;
  bool fuse_unk = false;
  std::string unk_token;   // empty when none
  std::vector<TokenizerAddedToken> added_tokens;
  std::vector<TokenizerNormalizerStep> normalizer;        // empty: none
  std::vector<TokenizerPreTokenizerStep> pre_tokenizer;   // empty: none
  std::vector<TokenizerDecoderStep> decoder;              // empty: none
};

// The GPT-2 pre-tokenizer regex used by ByteLevel{use_regex: true}.
extern const char kGpt2SplitRegex[];

// Parses tokenizer.json text; `name` (e.g. the path) prefixes error messages.
Result<TokenizerJsonSpec> ParseTokenizerJson(std::string_view json_text, const std::string& name);
// Reads and parses `path`. kNotFound when the file does not exist.
Result<TokenizerJsonSpec> LoadTokenizerJson(const std::string& path);

// The Jinja chat template of a tokenizer_config.json text: its
// "chat_template" string, or, when that is a list of {"name", "template"}
// (several templates), the one named "default" (else the first); "" when
// the file has none. Errors: kDataLoss naming `name` and the field for
// malformed JSON or a chat_template of another shape.
Result<std::string> ParseChatTemplateField(std::string_view tokenizer_config_json,
                                           const std::string& name);

}  // namespace arbiter
