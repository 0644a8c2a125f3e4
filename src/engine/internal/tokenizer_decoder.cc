// Decoders of the Tokenizer (tokenizer_pipeline.h): HF `tokenizers`'
// decode_chain of each decoder, on tokens held as bytes.
//
// HF turns invalid UTF-8 into U+FFFD (ByteLevel: String::from_utf8_lossy;
// ByteFallback: one U+FFFD per byte token of an invalid run); we keep the
// bytes, so that a streaming caller can join partial characters and
// Decode(Encode(s)) == s holds for any bytes on byte-level tokenizers.
#include <cctype>
#include <utility>

#include "engine/internal/byte_level.h"
#include "engine/internal/tokenizer_pipeline.h"

namespace arbiter::internal {
namespace {

// "<0xNN>" → the byte; -1 for any other token.
int ByteFallbackValue(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  int hi = hex(t[3]), lo = hex(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

}  // namespace

Result<TokenizerDecoder> TokenizerDecoder::Build(const std::vector<TokenizerDecoderStep>& steps,
                                                 const std::string& name) {
  TokenizerDecoder d;
  for (size_t i = 0; i < steps.size(); ++i) {
    Step s{steps[i], nullptr};
    if (s.spec.kind == TokenizerDecoderStep::Kind::kReplace && s.spec.pattern_is_regex) {
      auto re = Pcre2Regex::Compile(s.spec.pattern);
      if (!re.ok()) {
        return DataLossError(name + ": decoder step " + std::to_string(i) +
                             " (Replace) pattern: " + re.status().message());
      }
      s.regex = *re;
    }
    d.steps_.push_back(std::move(s));
  }
  return d;
}

void TokenizerDecoder::Apply(std::vector<std::string>* toks, bool whole_sequence) const {
  using K = TokenizerDecoderStep::Kind;
  for (const Step& step : steps_) {
    const TokenizerDecoderStep& d = step.spec;
    switch (d.kind) {
      case K::kByteLevel: {
        // Tokens whose every character is in the byte alphabet become their
        // bytes; others pass through. The result is one token.
        std::string all;
        for (const std::string& t : *toks) {
          if (!ByteLevelToBytes(t, &all)) all += t;
        }
        toks->assign(1, std::move(all));
        break;
      }
      case K::kReplace:
        for (std::string& t : *toks) {
          if (!step.regex) {
            ReplaceAll(&t, d.pattern, d.content);
            continue;
          }
          std::vector<std::pair<size_t, size_t>> matches;
          step.regex->FindAll(t, &matches);
          if (matches.empty()) continue;
          std::string r;
          size_t gap = 0;
          for (auto [mb, me] : matches) {
            r.append(t, gap, mb - gap);
            r += d.content;
            gap = me;
          }
          r.append(t, gap, std::string::npos);
          t = std::move(r);
        }
        break;
      case K::kByteFallback: {
        // Consecutive byte tokens become one token of their bytes.
        std::vector<std::string> out;
        out.reserve(toks->size());
        bool in_bytes = false;
        for (std::string& t : *toks) {
          int b = ByteFallbackValue(t);
          if (b < 0) {
            out.push_back(std::move(t));
            in_bytes = false;
            continue;
          }
          if (!in_bytes) out.emplace_back();
          out.back().push_back(static_cast<char>(b));
          in_bytes = true;
        }
        toks->swap(out);
        break;
      }
      case K::kFuse:
        if (toks->size() > 1) {
          std::string all;
          for (const std::string& t : *toks) all += t;
          toks->assign(1, std::move(all));
        }
        break;
      case K::kStrip: {
        if (!whole_sequence || d.content.empty()) break;
        const std::string& c = d.content;
        for (std::string& t : *toks) {
          size_t b = 0, e = t.size();
          for (int k = 0; k < d.strip_start && e - b >= c.size() && t.compare(b, c.size(), c) == 0;
               ++k) {
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
      }
      case K::kMetaspace:
        // HF drops every replacement character of the first token (the
        // prepended space) unless prepend_scheme is "never".
        for (size_t i = 0; i < toks->size(); ++i) {
          bool drop = whole_sequence && i == 0 && d.add_prefix_space;
          ReplaceAll(&(*toks)[i], d.replacement, drop ? "" : " ");
        }
        break;
    }
  }
}

}  // namespace arbiter::internal
