// Normalizers and pre-tokenizers of the Tokenizer (tokenizer_pipeline.h).
//
// Note [Tokenizer pipeline]
// Each step follows the HF `tokenizers` component of the same name:
//   - NFC/NFD/NFKC/NFKD come from utf8proc, Lowercase is the per-character
//     full lowercase mapping (unicode_text.h), Strip removes White_Space.
//   - Split finds the pattern's matches (a Regex run by PCRE2 with Unicode
//     properties, or every occurrence of a String), lays them out with the
//     text between them as (span, is_match) — with `invert` the flags flip —
//     and then applies the behavior exactly as HF's NormalizedString::split:
//     Removed drops matches; Isolated keeps every span; MergedWithPrevious
//     appends a match to the span before it (unless that span was itself a
//     match); MergedWithNext prepends it to the span after it (same rule,
//     right to left); Contiguous joins runs of spans with the same flag.
//   - Digits and WhitespaceSplit split on a character class, where each
//     matching character is its own match (HF's char-predicate patterns), so
//     Digits(individual_digits=false) is Contiguous and WhitespaceSplit is
//     Removed. Whitespace keeps the matches of \w+|[^\w\s]+.
//   - ByteLevel adds a prefix space to every piece not starting with one,
//     optionally splits with the GPT-2 regex, and maps bytes to the GPT-2
//     alphabet. Metaspace replaces spaces, prepends the replacement (always,
//     or only to the piece at offset 0 for prepend_scheme "first"), and splits
//     MergedWithNext on it.
// Where the regex engines differ: PCRE2 implements the Unicode properties of
// its own Unicode version; HF uses Oniguruma. The patterns real tokenizers
// use (\p{L}, \p{N}, \s, (?i:...)) agree on every character the conformance
// corpus (tests/tokenizer_conformance/) covers.
#include "engine/internal/tokenizer_pipeline.h"

#include <algorithm>
#include <utility>

#include "engine/internal/byte_level.h"
#include "engine/internal/unicode_text.h"

namespace arbiter::internal {
namespace {

using Behavior = TokenizerPreTokenizerStep::Behavior;

struct Span {
  size_t begin;
  size_t end;
  bool is_match;
};

// Lays `matches` (sorted, non-overlapping, non-empty) out over [0, n) with the
// gaps between them.
void Layout(size_t n, const std::vector<std::pair<size_t, size_t>>& matches, bool invert,
            std::vector<Span>* spans) {
  spans->clear();
  size_t prev = 0;
  for (auto [b, e] : matches) {
    if (b > prev) spans->push_back({prev, b, invert});
    spans->push_back({b, e, !invert});
    prev = e;
  }
  if (prev < n) spans->push_back({prev, n, invert});
}

// HF NormalizedString::split: the spans to keep, in order.
void ApplyBehavior(Behavior behavior, std::vector<Span>* spans) {
  std::vector<Span> out;
  out.reserve(spans->size());
  bool previous_match = false;
  switch (behavior) {
    case Behavior::kRemoved:
      for (const Span& s : *spans) {
        if (!s.is_match) out.push_back(s);
      }
      break;
    case Behavior::kIsolated:
      out = *spans;
      break;
    case Behavior::kMergedWithPrevious:
      for (const Span& s : *spans) {
        if (s.is_match && !previous_match && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back(s);
        }
        previous_match = s.is_match;
      }
      break;
    case Behavior::kMergedWithNext:
      for (size_t i = spans->size(); i-- > 0;) {
        const Span& s = (*spans)[i];
        if (s.is_match && !previous_match && !out.empty()) {
          out.back().begin = s.begin;
        } else {
          out.push_back(s);
        }
        previous_match = s.is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
    case Behavior::kContiguous:
      for (size_t i = 0; i < spans->size(); ++i) {
        const Span& s = (*spans)[i];
        if (i > 0 && s.is_match == previous_match) {
          out.back().end = s.end;
        } else {
          out.push_back(s);
        }
        previous_match = s.is_match;
      }
      break;
  }
  spans->swap(out);
}

void FindString(std::string_view text, std::string_view pat,
                std::vector<std::pair<size_t, size_t>>* out) {
  if (pat.empty()) return;
  for (size_t f = text.find(pat); f != std::string_view::npos; f = text.find(pat, f + pat.size())) {
    out->emplace_back(f, f + pat.size());
  }
}

// Every character for which `pred` holds is its own match.
template <typename Pred>
void FindChars(std::string_view text, Pred pred, std::vector<std::pair<size_t, size_t>>* out) {
  for (size_t i = 0; i < text.size();) {
    uint32_t cp;
    size_t len = Utf8CharLen(text, i, &cp);
    if (cp != 0xFFFFFFFF && pred(cp)) out->emplace_back(i, i + len);
    i += len;
  }
}

void StripWhitespace(std::string* s, bool left, bool right) {
  size_t b = 0, e = s->size();
  if (left) {
    while (b < e) {
      uint32_t cp;
      size_t len = Utf8CharLen(*s, b, &cp);
      if (cp == 0xFFFFFFFF || !IsWhitespace(cp)) break;
      b += len;
    }
  }
  if (right) {
    while (e > b) {
      // Step back to the start of the last character.
      size_t k = e - 1;
      while (k > b && (static_cast<unsigned char>((*s)[k]) & 0xC0) == 0x80 && e - k < 4) --k;
      uint32_t cp;
      size_t len = Utf8CharLen(*s, k, &cp);
      if (k + len != e || cp == 0xFFFFFFFF || !IsWhitespace(cp)) break;
      e = k;
    }
  }
  if (b > 0 || e < s->size()) *s = s->substr(b, e - b);
}

// The Whitespace pre-tokenizer's pattern (HF: \w+|[^\w\s]+), \w spelled out
// as Oniguruma's Unicode word class.
constexpr char kWhitespaceRegex[] = "[\\p{L}\\p{M}\\p{Nd}\\p{Pc}]+|[^\\p{L}\\p{M}\\p{Nd}\\p{Pc}\\s]+";

}  // namespace

void ReplaceAll(std::string* s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  size_t f = s->find(from);
  if (f == std::string::npos) return;
  std::string out;
  size_t pos = 0;
  for (; f != std::string::npos; f = s->find(from, pos)) {
    out.append(*s, pos, f - pos);
    out.append(to);
    pos = f + from.size();
  }
  out.append(*s, pos, std::string::npos);
  *s = std::move(out);
}

Result<TokenizerNormalizer> TokenizerNormalizer::Build(
    const std::vector<TokenizerNormalizerStep>& steps, const std::string& name) {
  TokenizerNormalizer n;
  for (size_t i = 0; i < steps.size(); ++i) {
    Step s{steps[i], nullptr};
    if (s.spec.kind == TokenizerNormalizerStep::Kind::kReplace && s.spec.pattern_is_regex) {
      auto re = Pcre2Regex::Compile(s.spec.pattern);
      if (!re.ok()) {
        return DataLossError(name + ": normalizer step " + std::to_string(i) +
                             " (Replace) pattern: " + re.status().message());
      }
      s.regex = *re;
    }
    n.steps_.push_back(std::move(s));
  }
  return n;
}

void TokenizerNormalizer::Apply(std::string* s) const {
  using K = TokenizerNormalizerStep::Kind;
  for (const Step& n : steps_) {
    switch (n.spec.kind) {
      case K::kPrepend:
        if (!s->empty()) s->insert(0, n.spec.prepend);
        break;
      case K::kReplace:
        if (n.regex) {
          std::vector<std::pair<size_t, size_t>> matches;
          n.regex->FindAll(*s, &matches);
          if (matches.empty()) break;
          std::string r;
          size_t gap = 0;
          for (auto [mb, me] : matches) {
            r.append(*s, gap, mb - gap);
            r += n.spec.content;
            gap = me;
          }
          r.append(*s, gap, std::string::npos);
          *s = std::move(r);
        } else {
          ReplaceAll(s, n.spec.pattern, n.spec.content);
        }
        break;
      case K::kNfc: NormalizeUnicode(NormalForm::kNfc, s); break;
      case K::kNfd: NormalizeUnicode(NormalForm::kNfd, s); break;
      case K::kNfkc: NormalizeUnicode(NormalForm::kNfkc, s); break;
      case K::kNfkd: NormalizeUnicode(NormalForm::kNfkd, s); break;
      case K::kLowercase: LowercaseUnicode(s); break;
      case K::kStripAccents: StripCombiningMarks(s); break;
      case K::kStrip: StripWhitespace(s, n.spec.strip_left, n.spec.strip_right); break;
    }
  }
}

Result<TokenizerPreTokenizer> TokenizerPreTokenizer::Build(
    const std::vector<TokenizerPreTokenizerStep>& steps, const std::string& name) {
  using K = TokenizerPreTokenizerStep::Kind;
  TokenizerPreTokenizer p;
  for (size_t i = 0; i < steps.size(); ++i) {
    Step s{steps[i], nullptr};
    std::string pattern;
    if (s.spec.kind == K::kSplit && s.spec.pattern_is_regex) {
      pattern = s.spec.pattern;
    } else if (s.spec.kind == K::kByteLevel && s.spec.use_regex) {
      pattern = kGpt2SplitRegex;
    } else if (s.spec.kind == K::kWhitespace) {
      pattern = kWhitespaceRegex;
    }
    if (!pattern.empty()) {
      auto re = Pcre2Regex::Compile(pattern);
      if (!re.ok()) {
        return DataLossError(name + ": pre_tokenizer step " + std::to_string(i) +
                             " pattern: " + re.status().message());
      }
      s.regex = *re;
    }
    p.steps_.push_back(std::move(s));
  }
  return p;
}

void TokenizerPreTokenizer::Apply(std::string text, bool at_origin,
                                  std::vector<PreTokenizedPiece>* out) const {
  using K = TokenizerPreTokenizerStep::Kind;
  std::vector<PreTokenizedPiece> pieces;
  pieces.push_back({std::move(text), false, {}, at_origin});
  std::vector<std::pair<size_t, size_t>> matches;
  std::vector<Span> spans;
  std::vector<PreTokenizedPiece> next;
  for (const Step& step : steps_) {
    next.clear();
    next.reserve(pieces.size() * 2);
    for (PreTokenizedPiece& p : pieces) {
      matches.clear();
      Behavior behavior = Behavior::kIsolated;
      bool invert = false;
      switch (step.spec.kind) {
        case K::kSplit:
          if (step.regex) {
            step.regex->FindAll(p.text, &matches);
          } else {
            FindString(p.text, step.spec.pattern, &matches);
          }
          behavior = step.spec.behavior;
          invert = step.spec.invert;
          break;
        case K::kDigits:
          FindChars(p.text, IsNumeric, &matches);
          behavior = step.spec.individual_digits ? Behavior::kIsolated : Behavior::kContiguous;
          break;
        case K::kWhitespace:
          step.regex->FindAll(p.text, &matches);
          behavior = Behavior::kRemoved;
          invert = true;
          break;
        case K::kWhitespaceSplit:
          FindChars(p.text, IsWhitespace, &matches);
          behavior = Behavior::kRemoved;
          break;
        case K::kByteLevel: {
          if (p.byte_level) {  // already mapped (a second ByteLevel step)
            next.push_back(std::move(p));
            continue;
          }
          if (step.spec.add_prefix_space && (p.text.empty() || p.text[0] != ' ')) {
            p.text.insert(0, " ");
          }
          if (step.regex) {
            step.regex->FindAll(p.text, &matches);
            Layout(p.text.size(), matches, false, &spans);
          } else {
            spans.assign(1, Span{0, p.text.size(), false});
          }
          for (const Span& s : spans) {
            if (s.end == s.begin) continue;
            std::string_view bytes = std::string_view(p.text).substr(s.begin, s.end - s.begin);
            next.push_back({BytesToByteLevel(bytes), true, std::string(bytes),
                            p.at_origin && s.begin == 0});
          }
          continue;
        }
        case K::kMetaspace: {
          const std::string& rep = step.spec.replacement;
          ReplaceAll(&p.text, " ", rep);
          using S = TokenizerPreTokenizerStep::PrependScheme;
          bool prepend = step.spec.prepend_scheme == S::kAlways ||
                         (step.spec.prepend_scheme == S::kFirst && p.at_origin);
          if (prepend && p.text.compare(0, rep.size(), rep) != 0) p.text.insert(0, rep);
          if (!step.spec.split) {
            next.push_back(std::move(p));
            continue;
          }
          FindString(p.text, rep, &matches);
          behavior = Behavior::kMergedWithNext;
          break;
        }
      }
      Layout(p.text.size(), matches, invert, &spans);
      ApplyBehavior(behavior, &spans);
      if (spans.size() == 1 && spans[0].begin == 0 && spans[0].end == p.text.size()) {
        next.push_back(std::move(p));  // unsplit: keeps its raw bytes
        continue;
      }
      for (const Span& s : spans) {
        if (s.end == s.begin) continue;
        next.push_back({p.text.substr(s.begin, s.end - s.begin), p.byte_level, {},
                        p.at_origin && s.begin == 0});
      }
    }
    pieces.swap(next);
  }
  for (PreTokenizedPiece& p : pieces) {
    if (!p.text.empty()) out->push_back(std::move(p));
  }
}

}  // namespace arbiter::internal
