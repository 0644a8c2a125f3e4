// Tokenizer: HF `tokenizers` BPE semantics over a parsed tokenizer.json.
//
// Encode pipeline (mirrors TokenizerImpl::encode in HF tokenizers):
//   1. Added tokens are cut out of the raw text first, leftmost and, at one
//      position, longest first. With parse_special=false only non-special
//      added tokens are cut; special ones stay plain text.
//   2. Each remaining segment is normalized (Prepend/Replace; NFC is taken as
//      identity — inputs are assumed NFC), then pre-tokenized: a list of
//      pieces that every step splits further (Split regex → Isolated;
//      ByteLevel → optional prefix space, optional GPT-2 regex split, then
//      byte → unicode mapping; Metaspace → space replacement and split).
//   3. Each piece ("word") becomes one symbol per character (per byte for
//      ByteLevel words); symbols missing from the vocab use byte fallback
//      <0xNN> tokens, else the unk token, else are dropped (as HF does).
//      Symbols are then merged by merge rank: a min-heap of (rank, position)
//      over adjacent pairs, lowest rank first and leftmost on ties; stale
//      heap entries are detected by re-checking the pair (HF Word::merge_all).
//
// Decode maps ids to token strings, drops specials when asked, and runs the
// decoder chain (ByteLevel reverses the byte mapping; ByteFallback turns
// <0xNN> back into bytes; ...). The output is raw bytes, never lossy: where
// HF would put U+FFFD for invalid UTF-8 we keep the bytes, so that
// Decode(Encode(s)) == s holds for any byte string on byte-level tokenizers.
//
// Everything is immutable after FromJson, so all methods are thread-safe;
// PCRE2 match data is allocated per call.
#include "arbiter/engine/tokenizer.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <queue>
#include <unordered_map>

#include "arbiter/base/file.h"
#include "arbiter/formats/tokenizer_json.h"
#include "engine/internal/byte_level.h"
#include "engine/internal/pcre2_regex.h"

namespace arbiter {
namespace {

using internal::Pcre2Regex;

struct MergeInfo {
  int32_t rank;
  int32_t new_id;
};

inline uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

struct PreStep {
  TokenizerPreTokenizerStep spec;
  std::shared_ptr<const Pcre2Regex> regex;  // Split (regex) / ByteLevel with use_regex
};

struct NormStep {
  TokenizerNormalizerStep spec;
  std::shared_ptr<const Pcre2Regex> regex;  // Replace with a Regex pattern
};

// A piece of text during pre-tokenization. `byte_level` pieces are already
// mapped to the GPT-2 alphabet.
struct Piece {
  std::string text;
  bool byte_level = false;
  std::string raw;  // byte_level pieces: the bytes before mapping
};

void ReplaceAll(std::string* s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  size_t pos = 0;
  while (true) {
    size_t f = s->find(from, pos);
    if (f == std::string::npos) break;
    out.append(*s, pos, f - pos);
    out.append(to);
    pos = f + from.size();
  }
  if (pos == 0) return;
  out.append(*s, pos, std::string::npos);
  *s = std::move(out);
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

  void EncodeSegment(std::string_view segment, bool first_segment,
                     std::vector<int32_t>* out) const;
  void PreTokenize(std::string text, bool first_segment, std::vector<Piece>* pieces) const;
  void EncodeWord(const Piece& word, std::vector<int32_t>* out) const;
  void AppendSymbol(std::string_view ch, std::vector<int32_t>* syms) const;
  void MergeSymbols(std::vector<int32_t>* syms) const;
  int32_t VocabId(std::string_view token) const {
    auto it = vocab_.find(std::string(token));
    return it == vocab_.end() ? -1 : it->second;
  }
  // Applies the per-token decoder steps (all but Fuse/Strip, and Metaspace's
  // first-token rule) to one token.
  void DecodeTokens(std::vector<std::string>* toks, const std::vector<bool>& raw,
                    bool whole_sequence) const;

  std::unordered_map<std::string, int32_t> vocab_;  // model vocab
  std::unordered_map<uint64_t, MergeInfo> merges_;
  std::vector<std::string> id_to_token_;            // [vocab_size]
  std::vector<uint8_t> kinds_;                      // [vocab_size] Kind
  int vocab_size_ = 0;
  std::array<int32_t, 256> byte_level_ids_;         // byte → id of its mapped char, or -1
  std::array<int32_t, 256> byte_fallback_ids_;      // byte → id of "<0xNN>", or -1
  int32_t unk_id_ = -1;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  bool fuse_unk_ = false;
  std::vector<NormStep> normalizer_;
  std::vector<PreStep> pre_;
  std::vector<TokenizerDecoderStep> decoder_;
  // Added tokens by first byte, longest first: (content, id, special).
  struct Added {
    std::string content;
    int32_t id;
    bool special;
  };
  std::array<std::vector<Added>, 256> added_by_byte_;
  std::unordered_map<std::string, int32_t> added_ids_;
};

Result<std::unique_ptr<Tokenizer>> BpeTokenizer::Build(TokenizerJsonSpec spec,
                                                       const std::string& name) {
  auto t = std::make_unique<BpeTokenizer>();
  int32_t max_id = -1;
  for (const auto& [tok, id] : spec.vocab) max_id = std::max(max_id, id);
  for (const auto& a : spec.added_tokens) max_id = std::max(max_id, a.id);
  t->vocab_size_ = max_id + 1;
  t->id_to_token_.resize(t->vocab_size_);
  t->kinds_.assign(t->vocab_size_, kNone);
  t->vocab_.reserve(spec.vocab.size() * 2);
  for (auto& [tok, id] : spec.vocab) {
    t->id_to_token_[id] = tok;
    t->kinds_[id] = kModel;
    t->vocab_.emplace(tok, id);
  }
  for (const auto& a : spec.added_tokens) {
    t->id_to_token_[a.id] = a.content;
    t->kinds_[a.id] = a.special ? kSpecial : kAdded;
    t->added_ids_[a.content] = a.id;
    auto& bucket = t->added_by_byte_[static_cast<unsigned char>(a.content[0])];
    bucket.erase(std::remove_if(bucket.begin(), bucket.end(),
                                [&](const Added& x) { return x.content == a.content; }),
                 bucket.end());
    bucket.push_back({a.content, a.id, a.special});
  }
  for (auto& bucket : t->added_by_byte_) {
    std::stable_sort(bucket.begin(), bucket.end(), [](const Added& x, const Added& y) {
      return x.content.size() > y.content.size();
    });
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
  for (size_t i = 0; i < spec.normalizer.size(); ++i) {
    NormStep s{spec.normalizer[i], nullptr};
    if (s.spec.kind == TokenizerNormalizerStep::Kind::kReplace && s.spec.pattern_is_regex) {
      auto re = Pcre2Regex::Compile(s.spec.pattern);
      if (!re.ok()) {
        return DataLossError(name + ": normalizer step " + std::to_string(i) +
                             " (Replace) pattern: " + re.status().message());
      }
      s.regex = *re;
    }
    t->normalizer_.push_back(std::move(s));
  }
  for (size_t i = 0; i < spec.pre_tokenizer.size(); ++i) {
    PreStep s{spec.pre_tokenizer[i], nullptr};
    std::string pattern;
    if (s.spec.kind == TokenizerPreTokenizerStep::Kind::kSplit && s.spec.pattern_is_regex) {
      pattern = s.spec.pattern;
    } else if (s.spec.kind == TokenizerPreTokenizerStep::Kind::kByteLevel && s.spec.use_regex) {
      pattern = kGpt2SplitRegex;
    }
    if (!pattern.empty()) {
      auto re = Pcre2Regex::Compile(pattern);
      if (!re.ok()) {
        return DataLossError(name + ": pre_tokenizer step " + std::to_string(i) +
                             " pattern: " + re.status().message());
      }
      s.regex = *re;
    }
    t->pre_.push_back(std::move(s));
  }
  t->decoder_ = std::move(spec.decoder);
  return std::unique_ptr<Tokenizer>(std::move(t));
}

std::vector<int32_t> BpeTokenizer::Encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  size_t seg_begin = 0;
  bool first = true;
  for (size_t i = 0; i < text.size();) {
    const auto& bucket = added_by_byte_[static_cast<unsigned char>(text[i])];
    const Added* hit = nullptr;
    for (const Added& a : bucket) {
      if (a.special && !parse_special) continue;
      if (text.size() - i >= a.content.size() &&
          std::memcmp(text.data() + i, a.content.data(), a.content.size()) == 0) {
        hit = &a;  // bucket is longest-first
        break;
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    if (i > seg_begin) {
      EncodeSegment(text.substr(seg_begin, i - seg_begin), first, &out);
      first = false;
    }
    out.push_back(hit->id);
    i += hit->content.size();
    seg_begin = i;
  }
  if (seg_begin < text.size()) EncodeSegment(text.substr(seg_begin), first, &out);
  return out;
}

void BpeTokenizer::EncodeSegment(std::string_view segment, bool first_segment,
                                 std::vector<int32_t>* out) const {
  std::string s(segment);
  for (const NormStep& n : normalizer_) {
    switch (n.spec.kind) {
      case TokenizerNormalizerStep::Kind::kPrepend:
        if (!s.empty()) s.insert(0, n.spec.prepend);
        break;
      case TokenizerNormalizerStep::Kind::kReplace:
        if (n.regex) {
          std::vector<std::pair<size_t, size_t>> matches;
          n.regex->FindAll(s, &matches);
          std::string r;
          size_t gap = 0;
          for (auto [mb, me] : matches) {
            r.append(s, gap, mb - gap);
            r += n.spec.content;
            gap = me;
          }
          r.append(s, gap, std::string::npos);
          s = std::move(r);
        } else {
          ReplaceAll(&s, n.spec.pattern, n.spec.content);
        }
        break;
      case TokenizerNormalizerStep::Kind::kNfc:
        break;
    }
  }
  if (s.empty()) return;
  std::vector<Piece> pieces;
  PreTokenize(std::move(s), first_segment, &pieces);
  for (const Piece& p : pieces) EncodeWord(p, out);
}

void BpeTokenizer::PreTokenize(std::string text, bool first_segment,
                               std::vector<Piece>* pieces) const {
  pieces->push_back({std::move(text), false, {}});
  std::vector<std::pair<size_t, size_t>> spans;
  for (const PreStep& step : pre_) {
    std::vector<Piece> next;
    next.reserve(pieces->size() * 2);
    for (size_t pi = 0; pi < pieces->size(); ++pi) {
      Piece& p = (*pieces)[pi];
      switch (step.spec.kind) {
        case TokenizerPreTokenizerStep::Kind::kSplit: {
          spans.clear();
          if (step.regex) {
            step.regex->SplitIsolated(p.text, &spans);
          } else {
            const std::string& pat = step.spec.pattern;
            size_t gap = 0;
            for (size_t f = p.text.find(pat); f != std::string::npos;
                 f = p.text.find(pat, f + pat.size())) {
              if (f > gap) spans.emplace_back(gap, f);
              spans.emplace_back(f, f + pat.size());
              gap = f + pat.size();
            }
            if (gap < p.text.size()) spans.emplace_back(gap, p.text.size());
          }
          for (auto [b, e] : spans) next.push_back({p.text.substr(b, e - b), p.byte_level, {}});
          break;
        }
        case TokenizerPreTokenizerStep::Kind::kByteLevel: {
          if (p.byte_level) {  // already mapped (a second ByteLevel step)
            next.push_back(std::move(p));
            break;
          }
          std::string t = std::move(p.text);
          if (step.spec.add_prefix_space && (t.empty() || t[0] != ' ')) t.insert(0, " ");
          spans.clear();
          if (step.regex) {
            step.regex->SplitIsolated(t, &spans);
          } else if (!t.empty()) {
            spans.emplace_back(0, t.size());
          }
          for (auto [b, e] : spans) {
            std::string_view bytes = std::string_view(t).substr(b, e - b);
            next.push_back({internal::BytesToByteLevel(bytes), true, std::string(bytes)});
          }
          break;
        }
        case TokenizerPreTokenizerStep::Kind::kMetaspace: {
          const std::string& rep = step.spec.replacement;
          std::string t = p.text;
          ReplaceAll(&t, " ", rep);
          using S = TokenizerPreTokenizerStep::PrependScheme;
          bool prepend = step.spec.prepend_scheme == S::kAlways ||
                         (step.spec.prepend_scheme == S::kFirst && first_segment && pi == 0);
          if (prepend && t.compare(0, rep.size(), rep) != 0) t.insert(0, rep);
          if (!step.spec.split) {
            next.push_back({std::move(t), p.byte_level, {}});
            break;
          }
          // MergedWithNext: each replacement char starts a new piece.
          size_t start = 0;
          for (size_t f = t.find(rep); f != std::string::npos; f = t.find(rep, f + rep.size())) {
            if (f > start) {
              next.push_back({t.substr(start, f - start), p.byte_level, {}});
              start = f;
            }
          }
          if (start < t.size()) next.push_back({t.substr(start), p.byte_level, {}});
          break;
        }
      }
    }
    pieces->swap(next);
  }
}

void BpeTokenizer::AppendSymbol(std::string_view ch, std::vector<int32_t>* syms) const {
  int32_t id = VocabId(ch);
  if (id >= 0) {
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
  if (unk_id_ >= 0) {
    if (fuse_unk_ && !syms->empty() && syms->back() == unk_id_) return;
    syms->push_back(unk_id_);
  }
  // No unk token: the character is dropped, as HF does.
}

void BpeTokenizer::EncodeWord(const Piece& word, std::vector<int32_t>* out) const {
  if (word.text.empty()) return;
  if (ignore_merges_) {
    int32_t id = VocabId(word.text);
    if (id >= 0) {
      out->push_back(id);
      return;
    }
  }
  std::vector<int32_t> syms;
  syms.reserve(word.text.size());
  if (word.byte_level && !word.raw.empty()) {
    // Fast path: one symbol per byte, looked up in a table. (Pieces split
    // again after the ByteLevel step carry no raw bytes and take the
    // general path below, which handles mapped text too.)
    const auto& tables = internal::GetByteLevelTables();
    for (unsigned char c : word.raw) {
      if (byte_level_ids_[c] >= 0) {
        syms.push_back(byte_level_ids_[c]);
      } else {
        AppendSymbol(tables.byte_to_utf8[c], &syms);
      }
    }
    MergeSymbols(&syms);
    out->insert(out->end(), syms.begin(), syms.end());
    return;
  }
  const std::string& s = word.text;
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    size_t len = internal::Utf8CharLen(s, i, &cp);
    AppendSymbol(std::string_view(s).substr(i, len), &syms);
    i += len;
  }
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

void BpeTokenizer::DecodeTokens(std::vector<std::string>* toks, const std::vector<bool>& raw,
                                bool whole_sequence) const {
  for (const TokenizerDecoderStep& d : decoder_) {
    using K = TokenizerDecoderStep::Kind;
    switch (d.kind) {
      case K::kByteLevel:
        for (size_t i = 0; i < toks->size(); ++i) {
          if (i < raw.size() && raw[i]) continue;
          std::string bytes;
          if (internal::ByteLevelToBytes((*toks)[i], &bytes)) (*toks)[i] = std::move(bytes);
        }
        break;
      case K::kReplace:
        for (auto& t : *toks) ReplaceAll(&t, d.pattern, d.content);
        break;
      case K::kByteFallback:
        for (auto& t : *toks) {
          if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' &&
              std::isxdigit(static_cast<unsigned char>(t[3])) &&
              std::isxdigit(static_cast<unsigned char>(t[4]))) {
            t = std::string(1, static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16)));
          }
        }
        break;
      case K::kFuse:
        if (whole_sequence && toks->size() > 1) {
          std::string all;
          for (auto& t : *toks) all += t;
          toks->assign(1, std::move(all));
        }
        break;
      case K::kStrip:
        if (!whole_sequence) break;
        for (auto& t : *toks) {
          size_t b = 0, e = t.size();
          const std::string& c = d.content;
          if (c.empty()) break;
          for (int k = 0; k < d.strip_start && e - b >= c.size() && t.compare(b, c.size(), c) == 0; ++k) {
            b += c.size();
          }
          for (int k = 0; k < d.strip_stop && e - b >= c.size() &&
                          t.compare(e - c.size(), c.size(), c) == 0;
               ++k) {
            e -= c.size();
          }
          t = t.substr(b, e - b);
        }
        break;
      case K::kMetaspace:
        for (size_t i = 0; i < toks->size(); ++i) {
          std::string& t = (*toks)[i];
          ReplaceAll(&t, d.replacement, " ");
          if (whole_sequence && i == 0 && d.add_prefix_space && !t.empty() && t[0] == ' ') {
            t.erase(0, 1);
          }
        }
        break;
    }
  }
}

std::string BpeTokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::vector<std::string> toks;
  std::vector<bool> raw;
  toks.reserve(ids.size());
  raw.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size_ || kinds_[id] == kNone) continue;
    if (skip_special && kinds_[id] == kSpecial) continue;
    toks.push_back(id_to_token_[id]);
    raw.push_back(kinds_[id] == kSpecial || kinds_[id] == kAdded);
  }
  DecodeTokens(&toks, raw, /*whole_sequence=*/true);
  std::string out;
  for (auto& t : toks) out += t;
  return out;
}

std::string BpeTokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size_ || kinds_[id] == kNone) return "";
  std::vector<std::string> toks{id_to_token_[id]};
  std::vector<bool> raw{kinds_[id] == kSpecial || kinds_[id] == kAdded};
  DecodeTokens(&toks, raw, /*whole_sequence=*/false);
  return toks[0];
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
