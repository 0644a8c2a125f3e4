// src/engine/internal/added_vocabulary.h — finding added tokens in text, as
// HF `tokenizers`' AddedVocabulary::find_matches does: leftmost match first
// and, at one position, the longest (Aho-Corasick LeftmostLongest); then
//   - a special token's match is skipped when !parse_special (left as text;
//     the search goes on after it, so no shorter token inside it is found);
//   - single_word: skipped unless neither the character before nor the one
//     after is a word character (\w);
//   - lstrip: the match extends left over the whitespace before it (not past
//     the previous match); rstrip: right over the whitespace after it.
// One deviation, for added tokens that begin with whitespace: after an
// rstrip the search resumes after the stripped whitespace (HF resumes at the
// end of the token and may emit overlapping splits).
//
// Thread safety: immutable after the last Add; Split is thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "arbiter/formats/tokenizer_json.h"

namespace arbiter::internal {

class AddedVocabulary {
 public:
  struct Segment {
    size_t begin;
    size_t end;
    int32_t id;  // the added token, or -1 for text between tokens
  };

  // Adds `token`, matched by `pattern` (its content, or the normalized
  // content). A later pattern equal to an earlier one replaces it. An empty
  // pattern is ignored.
  void Add(const std::string& pattern, const TokenizerAddedToken& token);
  bool empty() const { return tokens_.empty(); }

  // Cuts `text` into text and token splits covering it in order (no empty
  // text splits; an empty `text` gives none).
  void Split(std::string_view text, bool parse_special, std::vector<Segment>* out) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // byte → node, sorted by byte
    int32_t token = -1;                                 // index into tokens_, or -1
  };
  struct Entry {
    int32_t id;
    size_t length;
    bool special;
    bool lstrip;
    bool rstrip;
    bool single_word;
  };
  // Longest pattern starting at `pos`: index into tokens_, or -1.
  int32_t LongestAt(std::string_view text, size_t pos) const;

  std::vector<Node> nodes_{Node{}};
  std::vector<Entry> tokens_;
};

}  // namespace arbiter::internal
