// src/engine/internal/tokenizer_pipeline.h — the normalizer, pre-tokenizer
// and decoder stages of the Tokenizer (src/engine/tokenizer.cc), compiled
// from a TokenizerJsonSpec. Each mirrors the HF `tokenizers` component of
// the same name; Note [Tokenizer pipeline] in tokenizer_pipeline.cc lists
// where we differ.
//
// Thread safety: immutable after Build; Apply methods are thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "arbiter/base/status.h"
#include "arbiter/formats/tokenizer_json.h"
#include "engine/internal/pcre2_regex.h"

namespace arbiter::internal {

// A normalizer chain (HF normalizers::Sequence).
class TokenizerNormalizer {
 public:
  // kDataLoss naming `name` and the step for a Replace regex PCRE2 rejects.
  static Result<TokenizerNormalizer> Build(const std::vector<TokenizerNormalizerStep>& steps,
                                           const std::string& name);
  bool empty() const { return steps_.empty(); }
  void Apply(std::string* s) const;

 private:
  struct Step {
    TokenizerNormalizerStep spec;
    std::shared_ptr<const Pcre2Regex> regex;  // Replace with a Regex pattern
  };
  std::vector<Step> steps_;
};

// A piece of text during pre-tokenization.
struct PreTokenizedPiece {
  std::string text;
  // Already mapped to the GPT-2 byte alphabet by a ByteLevel step; `raw`
  // then holds the bytes before mapping (empty once split again).
  bool byte_level = false;
  std::string raw;
  // Starts at offset 0 of the encoded text (Metaspace prepend_scheme first).
  bool at_origin = false;
};

// A pre-tokenizer chain (HF pre_tokenizers::Sequence).
class TokenizerPreTokenizer {
 public:
  // kDataLoss naming `name` and the step for a pattern PCRE2 rejects.
  static Result<TokenizerPreTokenizer> Build(const std::vector<TokenizerPreTokenizerStep>& steps,
                                             const std::string& name);
  // Splits `text` (one normalized segment; `at_origin` when it begins the
  // encoded text) into pieces, appended to `pieces`; empty pieces are dropped.
  void Apply(std::string text, bool at_origin, std::vector<PreTokenizedPiece>* pieces) const;

 private:
  struct Step {
    TokenizerPreTokenizerStep spec;
    std::shared_ptr<const Pcre2Regex> regex;  // Split/ByteLevel/Whitespace patterns
  };
  std::vector<Step> steps_;
};

// A decoder chain (HF decoders::Sequence). Tokens are strings of bytes.
class TokenizerDecoder {
 public:
  static Result<TokenizerDecoder> Build(const std::vector<TokenizerDecoderStep>& steps,
                                        const std::string& name);
  // `whole_sequence` false decodes one token for streaming: the steps that
  // only make sense on a whole sequence (Fuse, Strip, the first-token rule of
  // Metaspace) are skipped.
  void Apply(std::vector<std::string>* tokens, bool whole_sequence) const;

 private:
  struct Step {
    TokenizerDecoderStep spec;
    std::shared_ptr<const Pcre2Regex> regex;  // Replace with a Regex pattern
  };
  std::vector<Step> steps_;
};

// Replaces every occurrence of `from` (non-empty) in `s` by `to`.
void ReplaceAll(std::string* s, std::string_view from, std::string_view to);

}  // namespace arbiter::internal
