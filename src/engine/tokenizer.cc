// Tokenizer: HF `tokenizers` semantics over a TokenizerJsonSpec.
//
// Encode pipeline (mirrors TokenizerImpl::encode in HF tokenizers):
//   1. Added tokens with normalized=false are cut out of the raw text:
//      leftmost match first and, at one position, the longest (HF's
//      Aho-Corasick LeftmostLongest), then single_word / lstrip / rstrip are
//      applied to the match as HF's AddedVocabulary::find_matches does.
//      With parse_special=false a special token's match is skipped (left as
//      text, its bytes not searched again), as HF's encode_special_tokens.
//   2. Each remaining segment is normalized (tokenizer_pipeline.h); added
//      tokens with normalized=true are then cut out of the normalized text,
//      matched by their normalized content.
//   3. Each remaining piece is pre-tokenized into words, and each word goes
//      through the model:
//      - BPE: one symbol per character (per byte for ByteLevel words); a
//        character missing from the vocab becomes its <0xNN> byte tokens
//        with byte_fallback, else the unk token (runs fused with fuse_unk),
//        else is dropped (as HF does). Symbols merge by merge rank: a
//        min-heap of (rank, position), lowest rank first and leftmost on
//        ties; stale entries are detected by re-checking the pair (HF
//        Word::merge_all). With ignore_merges a word that is itself in the
//        vocab is one token.
//      - SentencePiece BPE (spec.scores set; GGUF "llama" vocabularies): the
//        same loop, where two adjacent symbols may merge whenever their
//        concatenation is in the vocab, highest score first and leftmost on
//        ties; a final symbol not in the vocab is written as byte tokens
//        (llama.cpp's llm_tokenizer_spm).
//
// Decode maps ids to token strings, drops specials when asked, and runs the
// decoder chain. The output is raw bytes, never lossy (see
// tokenizer_decoder.cc). Without a decoder the tokens are concatenated (HF
// joins them with spaces).
//
// Everything is immutable after Build, so all methods are thread-safe;
// PCRE2 match data is allocated per call.
#include "arbiter/engine/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <limits>
#include <queue>
#include <unordered_map>

#include "arbiter/base/file.h"
#include "arbiter/formats/tokenizer_json.h"
#include "engine/internal/added_vocabulary.h"
#include "engine/internal/byte_level.h"
#include "engine/internal/tokenizer_pipeline.h"

namespace arbiter {
namespace {

using internal::AddedVocabulary;
using internal::PreTokenizedPiece;

struct MergeInfo {
  int32_t rank;
  int32_t new_id;
};

inline uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

class BpeTokenizer final : public Tokenizer {
 public:
  static Result<std::unique_ptr<Tokenizer>> Build(TokenizerJsonSpec spec, const std::string& name);

  std::vector<int32_t> Encode(std::string_view text, bool parse_special) const override;
  std::string Decode(const std::vector<int32_t>& ids, bool skip_special) const override;
  std::string TokenBytes(int32_t id) const override;
  int32_t TokenId(std::string_view token) const override;
  bool IsSpecial(int32_t id) const override {
    return id >= 0 && id < vocab_size_ && kinds_[id] == kSpecial;
  }
  int vocab_size() const override { return vocab_size_; }

 private:
  enum Kind : uint8_t { kNone = 0, kModel = 1, kAdded = 2, kSpecial = 3 };

  void EncodeNormalizedSegment(std::string segment, bool at_origin, bool parse_special,
                               std::vector<int32_t>* out) const;
  void EncodeWord(const PreTokenizedPiece& word, std::vector<int32_t>* out) const;
  void AppendSymbol(std::string_view ch, std::vector<int32_t>* syms, int32_t* pending_unk) const;
  void MergeSymbols(std::vector<int32_t>* syms) const;
  void EncodeSentencePiece(std::string_view word, std::vector<int32_t>* out) const;
  void AppendBytes(std::string_view bytes, std::vector<int32_t>* out) const;
  int32_t VocabId(std::string_view token) const {
    auto it = vocab_.find(std::string(token));
    return it == vocab_.end() ? -1 : it->second;
  }

  std::unordered_map<std::string, int32_t> vocab_;  // model vocab
  std::unordered_map<uint64_t, MergeInfo> merges_;
  std::vector<float> scores_;                       // [vocab_size] SentencePiece scores, or empty
  std::vector<std::string> id_to_token_;            // [vocab_size]
  std::vector<uint8_t> kinds_;                      // [vocab_size] Kind
  int vocab_size_ = 0;
  std::array<int32_t, 256> byte_level_ids_;         // byte → id of its mapped char, or -1
  std::array<int32_t, 256> byte_fallback_ids_;      // byte → id of "<0xNN>", or -1
  int32_t unk_id_ = -1;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  bool fuse_unk_ = false;
  internal::TokenizerNormalizer normalizer_;
  internal::TokenizerPreTokenizer pre_;
  internal::TokenizerDecoder decoder_;
  AddedVocabulary raw_added_;         // added tokens with normalized=false
  AddedVocabulary normalized_added_;  // normalized=true, keyed by normalized content
  std::unordered_map<std::string, int32_t> added_ids_;
};

Result<std::unique_ptr<Tokenizer>> BpeTokenizer::Build(TokenizerJsonSpec spec,
                                                       const std::string& name) {
  auto t = std::make_unique<BpeTokenizer>();
  if (!spec.scores.empty() && spec.scores.size() != spec.vocab.size()) {
    return DataLossError(name + ": " + std::to_string(spec.scores.size()) + " scores for " +
                         std::to_string(spec.vocab.size()) + " vocabulary tokens");
  }
  int32_t max_id = -1;
  for (const auto& [tok, id] : spec.vocab) max_id = std::max(max_id, id);
  for (const auto& a : spec.added_tokens) max_id = std::max(max_id, a.id);
  t->vocab_size_ = max_id + 1;
  t->id_to_token_.resize(t->vocab_size_);
  t->kinds_.assign(t->vocab_size_, kNone);
  t->vocab_.reserve(spec.vocab.size() * 2);
  if (!spec.scores.empty()) t->scores_.assign(t->vocab_size_, 0.0f);
  for (size_t i = 0; i < spec.vocab.size(); ++i) {
    auto& [tok, id] = spec.vocab[i];
    t->id_to_token_[id] = tok;
    t->kinds_[id] = kModel;
    t->vocab_.emplace(tok, id);
    if (!spec.scores.empty()) {
      // A NaN would break the merge queue's ordering; it ranks last.
      float score = spec.scores[i];
      t->scores_[id] = score == score ? score : -std::numeric_limits<float>::infinity();
    }
  }
  ARBITER_ASSIGN_OR_RETURN(t->normalizer_,
                           internal::TokenizerNormalizer::Build(spec.normalizer, name));
  ARBITER_ASSIGN_OR_RETURN(t->pre_, internal::TokenizerPreTokenizer::Build(spec.pre_tokenizer, name));
  ARBITER_ASSIGN_OR_RETURN(t->decoder_, internal::TokenizerDecoder::Build(spec.decoder, name));
  for (const auto& a : spec.added_tokens) {
    t->id_to_token_[a.id] = a.content;
    t->kinds_[a.id] = a.special ? kSpecial : kAdded;
    t->added_ids_[a.content] = a.id;
    if (a.normalized) {
      // HF matches these by their normalized content.
      std::string content = a.content;
      t->normalizer_.Apply(&content);
      t->normalized_added_.Add(content, a);
    } else {
      t->raw_added_.Add(a.content, a);
    }
  }
  t->merges_.reserve(spec.merges.size() * 2);
  for (size_t r = 0; r < spec.merges.size(); ++r) {
    const auto& [a, b] = spec.merges[r];
    int32_t ia = t->VocabId(a), ib = t->VocabId(b), in = t->VocabId(a + b);
    if (ia < 0 || ib < 0 || in < 0) {
      return DataLossError(name + ": field \"model.merges[" + std::to_string(r) +
                           "]\" uses a token missing from model.vocab");
    }
    // The first (lowest-rank) occurrence of a pair wins, as in HF.
    t->merges_.emplace(PairKey(ia, ib), MergeInfo{static_cast<int32_t>(r), in});
  }
  const auto& tables = internal::GetByteLevelTables();
  for (int b = 0; b < 256; ++b) {
    t->byte_level_ids_[b] = t->VocabId(tables.byte_to_utf8[b]);
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    t->byte_fallback_ids_[b] = t->VocabId(buf);
  }
  if (!spec.unk_token.empty()) t->unk_id_ = t->VocabId(spec.unk_token);
  t->byte_fallback_ = spec.byte_fallback;
  t->ignore_merges_ = spec.ignore_merges;
  t->fuse_unk_ = spec.fuse_unk;
  return std::unique_ptr<Tokenizer>(std::move(t));
}

std::vector<int32_t> BpeTokenizer::Encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  std::vector<AddedVocabulary::Segment> splits;
  raw_added_.Split(text, parse_special, &splits);
  for (const auto& s : splits) {
    if (s.id >= 0) {
      out.push_back(s.id);
      continue;
    }
    std::string segment(text.substr(s.begin, s.end - s.begin));
    normalizer_.Apply(&segment);
    EncodeNormalizedSegment(std::move(segment), s.begin == 0, parse_special, &out);
  }
  return out;
}

void BpeTokenizer::EncodeNormalizedSegment(std::string segment, bool at_origin,
                                           bool parse_special, std::vector<int32_t>* out) const {
  if (segment.empty()) return;
  std::vector<AddedVocabulary::Segment> splits;
  normalized_added_.Split(segment, parse_special, &splits);
  std::vector<PreTokenizedPiece> words;
  for (const auto& s : splits) {
    if (s.id >= 0) {
      out->push_back(s.id);
      continue;
    }
    words.clear();
    pre_.Apply(segment.substr(s.begin, s.end - s.begin), at_origin && s.begin == 0, &words);
    for (const PreTokenizedPiece& w : words) EncodeWord(w, out);
  }
}

void BpeTokenizer::AppendBytes(std::string_view bytes, std::vector<int32_t>* out) const {
  for (unsigned char c : bytes) {
    if (byte_fallback_ids_[c] >= 0) {
      out->push_back(byte_fallback_ids_[c]);
    } else if (unk_id_ >= 0) {
      out->push_back(unk_id_);
    }
  }
}

// HF BPE::merge_word for one character. `pending_unk` holds an unk token not
// yet appended (so that fuse_unk can extend it): -1 or unk_id_.
void BpeTokenizer::AppendSymbol(std::string_view ch, std::vector<int32_t>* syms,
                                int32_t* pending_unk) const {
  int32_t id = VocabId(ch);
  if (id >= 0) {
    if (*pending_unk >= 0) syms->push_back(*pending_unk);
    *pending_unk = -1;
    syms->push_back(id);
    return;
  }
  if (byte_fallback_) {
    bool all = true;
    for (unsigned char c : ch) all = all && byte_fallback_ids_[c] >= 0;
    if (all) {
      for (unsigned char c : ch) syms->push_back(byte_fallback_ids_[c]);
      return;
    }
  }
  if (unk_id_ < 0) return;  // no unk token: the character is dropped, as HF does
  if (*pending_unk >= 0 && !fuse_unk_) syms->push_back(*pending_unk);
  *pending_unk = unk_id_;
}

void BpeTokenizer::EncodeWord(const PreTokenizedPiece& word, std::vector<int32_t>* out) const {
  if (word.text.empty()) return;
  if (!scores_.empty()) {
    EncodeSentencePiece(word.text, out);
    return;
  }
  if (ignore_merges_) {
    int32_t id = VocabId(word.text);
    if (id >= 0) {
      out->push_back(id);
      return;
    }
  }
  std::vector<int32_t> syms;
  syms.reserve(word.text.size());
  int32_t pending_unk = -1;
  if (word.byte_level && !word.raw.empty()) {
    // Fast path: one symbol per byte, looked up in a table. (Pieces split
    // again after the ByteLevel step carry no raw bytes and take the
    // general path below, which handles mapped text too.)
    const auto& tables = internal::GetByteLevelTables();
    for (unsigned char c : word.raw) {
      if (byte_level_ids_[c] >= 0 && pending_unk < 0) {
        syms.push_back(byte_level_ids_[c]);
      } else {
        AppendSymbol(tables.byte_to_utf8[c], &syms, &pending_unk);
      }
    }
  } else {
    const std::string& s = word.text;
    for (size_t i = 0; i < s.size();) {
      uint32_t cp;
      size_t len = internal::Utf8CharLen(s, i, &cp);
      AppendSymbol(std::string_view(s).substr(i, len), &syms, &pending_unk);
      i += len;
    }
  }
  if (pending_unk >= 0) syms.push_back(pending_unk);
  MergeSymbols(&syms);
  out->insert(out->end(), syms.begin(), syms.end());
}

void BpeTokenizer::MergeSymbols(std::vector<int32_t>* syms) const {
  const size_t n = syms->size();
  if (n < 2 || merges_.empty()) return;
  std::vector<int32_t>& id = *syms;
  std::vector<int32_t> prev(n), next(n);
  std::vector<uint8_t> alive(n, 1);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int32_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
  }
  struct Cand {
    int32_t rank;
    int32_t pos;
    int32_t left;   // ids expected at pos / next(pos) when pushed
    int32_t right;
    bool operator>(const Cand& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int32_t pos) {
    if (pos < 0 || next[pos] < 0) return;
    auto it = merges_.find(PairKey(id[pos], id[next[pos]]));
    if (it != merges_.end()) heap.push({it->second.rank, pos, id[pos], id[next[pos]]});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    int32_t r = next[c.pos];
    if (!alive[c.pos] || r < 0 || id[c.pos] != c.left || id[r] != c.right) continue;
    id[c.pos] = merges_.at(PairKey(c.left, c.right)).new_id;
    alive[r] = 0;
    next[c.pos] = next[r];
    if (next[r] >= 0) prev[next[r]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  size_t w = 0;
  for (int32_t i = 0; i >= 0; i = next[i]) id[w++] = id[i];
  id.resize(w);
}

void BpeTokenizer::EncodeSentencePiece(std::string_view word, std::vector<int32_t>* out) const {
  // Symbols are byte ranges of `word`: [begin[i], begin[i] + len[i]).
  struct Sym {
    int32_t begin;
    int32_t len;  // 0 once merged into its left neighbour
    int32_t prev;
    int32_t next;
  };
  std::vector<Sym> sym;
  for (size_t i = 0; i < word.size();) {
    uint32_t cp;
    size_t len = internal::Utf8CharLen(word, i, &cp);
    int32_t k = static_cast<int32_t>(sym.size());
    sym.push_back({static_cast<int32_t>(i), static_cast<int32_t>(len), k - 1, k + 1});
    i += len;
  }
  if (sym.empty()) return;
  sym.back().next = -1;
  struct Bigram {
    float score;
    int32_t left;
    int32_t size;  // bytes of the merged text, to detect stale entries
    bool operator<(const Bigram& o) const {  // max-heap: highest score, then leftmost
      return score != o.score ? score < o.score : left > o.left;
    }
  };
  std::priority_queue<Bigram> heap;
  auto try_add = [&](int32_t l) {
    if (l < 0 || sym[l].next < 0) return;
    const Sym& a = sym[l];
    const Sym& b = sym[a.next];
    int32_t id = VocabId(word.substr(a.begin, a.len + b.len));
    if (id < 0) return;
    heap.push({scores_[id], l, a.len + b.len});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) try_add(i);
  while (!heap.empty()) {
    Bigram g = heap.top();
    heap.pop();
    Sym& a = sym[g.left];
    if (a.len == 0 || a.next < 0) continue;
    Sym& b = sym[a.next];
    if (a.len + b.len != g.size) continue;  // one side changed since the push
    a.len += b.len;
    b.len = 0;
    a.next = b.next;
    if (a.next >= 0) sym[a.next].prev = g.left;
    try_add(a.prev);
    try_add(g.left);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) {
    std::string_view piece = word.substr(sym[i].begin, sym[i].len);
    int32_t id = VocabId(piece);
    if (id >= 0) {
      out->push_back(id);
    } else {
      AppendBytes(piece, out);
    }
  }
}

std::string BpeTokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::vector<std::string> toks;
  toks.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size_ || kinds_[id] == kNone) continue;
    if (skip_special && kinds_[id] == kSpecial) continue;
    toks.push_back(id_to_token_[id]);
  }
  decoder_.Apply(&toks, /*whole_sequence=*/true);
  std::string out;
  for (auto& t : toks) out += t;
  return out;
}

std::string BpeTokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size_ || kinds_[id] == kNone) return "";
  std::vector<std::string> toks{id_to_token_[id]};
  decoder_.Apply(&toks, /*whole_sequence=*/false);
  std::string out;
  for (auto& t : toks) out += t;
  return out;
}

int32_t BpeTokenizer::TokenId(std::string_view token) const {
  std::string key(token);
  auto a = added_ids_.find(key);
  if (a != added_ids_.end()) return a->second;
  auto v = vocab_.find(key);
  return v == vocab_.end() ? -1 : v->second;
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(std::string_view json_text,
                                                       const std::string& name) {
  ARBITER_ASSIGN_OR_RETURN(TokenizerJsonSpec spec, ParseTokenizerJson(json_text, name));
  return BpeTokenizer::Build(std::move(spec), name);
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::FromSpec(TokenizerJsonSpec spec,
                                                       const std::string& name) {
  return BpeTokenizer::Build(std::move(spec), name);
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& tokenizer_json_path) {
  ARBITER_ASSIGN_OR_RETURN(std::string text, ReadFile(tokenizer_json_path));
  return FromJson(text, tokenizer_json_path);
}

}  // namespace arbiter
