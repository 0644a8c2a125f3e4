// Added-token matching (added_vocabulary.h): a byte trie walked from each
// position, which gives Aho-Corasick's LeftmostLongest matches.
#include "engine/internal/added_vocabulary.h"

#include <algorithm>

#include "engine/internal/byte_level.h"
#include "engine/internal/unicode_text.h"

namespace arbiter::internal {
namespace {

// The last character of text[0, end) (invalid bytes count as non-word,
// non-space), or 0xFFFFFFFF when there is none.
uint32_t LastChar(std::string_view text, size_t end, size_t* start) {
  if (end == 0) return 0xFFFFFFFF;
  size_t k = end - 1;
  while (k > 0 && end - k < 4 && (static_cast<unsigned char>(text[k]) & 0xC0) == 0x80) --k;
  uint32_t cp;
  size_t len = Utf8CharLen(text, k, &cp);
  if (k + len != end) {  // `end - 1` is an invalid byte
    *start = end - 1;
    return 0xFFFFFFFF;
  }
  *start = k;
  return cp;
}

}  // namespace

void AddedVocabulary::Add(const std::string& pattern, const TokenizerAddedToken& token) {
  if (pattern.empty()) return;
  int32_t node = 0;
  for (unsigned char c : pattern) {
    auto& ch = nodes_[node].children;
    auto it = std::lower_bound(ch.begin(), ch.end(), std::make_pair(c, int32_t{-1}));
    if (it != ch.end() && it->first == c) {
      node = it->second;
      continue;
    }
    int32_t fresh = static_cast<int32_t>(nodes_.size());
    ch.insert(it, {c, fresh});  // may reallocate nodes_[node].children only
    nodes_.emplace_back();
    node = fresh;
  }
  Entry e{token.id, pattern.size(), token.special, token.lstrip, token.rstrip, token.single_word};
  if (nodes_[node].token >= 0) {
    tokens_[nodes_[node].token] = e;
  } else {
    nodes_[node].token = static_cast<int32_t>(tokens_.size());
    tokens_.push_back(e);
  }
}

int32_t AddedVocabulary::LongestAt(std::string_view text, size_t pos) const {
  int32_t node = 0, best = -1;
  for (size_t i = pos; i < text.size(); ++i) {
    const auto& ch = nodes_[node].children;
    unsigned char c = static_cast<unsigned char>(text[i]);
    auto it = std::lower_bound(ch.begin(), ch.end(), std::make_pair(c, int32_t{-1}));
    if (it == ch.end() || it->first != c) break;
    node = it->second;
    if (nodes_[node].token >= 0) best = nodes_[node].token;
  }
  return best;
}

void AddedVocabulary::Split(std::string_view text, bool parse_special,
                            std::vector<Segment>* out) const {
  size_t start_offset = 0;  // end of the last token split
  size_t pos = 0;           // where the search resumes
  if (!tokens_.empty()) {
    const auto& root = nodes_[0].children;
    while (pos < text.size()) {
      // Leftmost position where some pattern starts.
      int32_t hit = -1;
      size_t at = pos;
      for (; at < text.size(); ++at) {
        unsigned char c = static_cast<unsigned char>(text[at]);
        auto it = std::lower_bound(root.begin(), root.end(), std::make_pair(c, int32_t{-1}));
        if (it == root.end() || it->first != c) continue;
        hit = LongestAt(text, at);
        if (hit >= 0) break;
      }
      if (hit < 0) break;
      const Entry& e = tokens_[hit];
      size_t begin = at, end = at + e.length;
      pos = end;
      if (e.special && !parse_special) continue;
      if (e.single_word) {
        size_t unused;
        uint32_t before = LastChar(text, begin, &unused);
        uint32_t after = 0xFFFFFFFF;
        if (end < text.size()) Utf8CharLen(text, end, &after);
        bool word_before = before != 0xFFFFFFFF && IsWordChar(before);
        bool word_after = after != 0xFFFFFFFF && IsWordChar(after);
        if (word_before || word_after) continue;
      }
      if (e.lstrip) {
        size_t b = begin;
        while (b > start_offset) {
          size_t k;
          uint32_t cp = LastChar(text, b, &k);
          if (cp == 0xFFFFFFFF || !IsWhitespace(cp)) break;
          b = k;
        }
        begin = b;
      }
      if (e.rstrip) {
        while (end < text.size()) {
          uint32_t cp;
          size_t len = Utf8CharLen(text, end, &cp);
          if (cp == 0xFFFFFFFF || !IsWhitespace(cp)) break;
          end += len;
        }
        pos = end;
      }
      if (start_offset < begin) out->push_back({start_offset, begin, -1});
      out->push_back({begin, end, e.id});
      start_offset = end;
    }
  }
  if (start_offset < text.size()) out->push_back({start_offset, text.size(), -1});
}

}  // namespace arbiter::internal
