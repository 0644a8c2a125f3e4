// engine/internal/text_stream.cc — see text_stream.h.
#include "engine/internal/text_stream.h"

#include <algorithm>

namespace arbiter::engine_internal {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

bool IsCont(unsigned char c) { return (c & 0xC0) == 0x80; }

// Length of the UTF-8 sequence led by `c`, 0 when `c` cannot lead one.
int SequenceLength(unsigned char c) {
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return 2;
  if (c >= 0xE0 && c <= 0xEF) return 3;
  if (c >= 0xF0 && c <= 0xF4) return 4;
  return 0;
}

// Whether `second` may follow `lead` (excludes overlongs, surrogates and
// code points above U+10FFFF; RFC 3629 table).
bool SecondByteOk(unsigned char lead, unsigned char second) {
  switch (lead) {
    case 0xE0: return second >= 0xA0 && second <= 0xBF;
    case 0xED: return second >= 0x80 && second <= 0x9F;
    case 0xF0: return second >= 0x90 && second <= 0xBF;
    case 0xF4: return second >= 0x80 && second <= 0x8F;
    default: return IsCont(second);
  }
}

}  // namespace

TextStream::TextStream(std::vector<std::string> stop_strings) {
  for (std::string& s : stop_strings) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

void TextStream::DecodeRaw(bool final) {
  size_t i = 0;
  const size_t n = raw_.size();
  while (i < n) {
    const unsigned char c = raw_[i];
    const int len = SequenceLength(c);
    if (len == 0) {
      pending_ += kReplacement;
      ++i;
      continue;
    }
    // Check the bytes that are present.
    int have = 1;
    bool bad = false;
    while (have < len && i + have < n) {
      const unsigned char b = raw_[i + have];
      if (!(have == 1 ? SecondByteOk(c, b) : IsCont(b))) {
        bad = true;
        break;
      }
      ++have;
    }
    if (bad) {  // the lead (and valid continuations so far) form no character
      pending_ += kReplacement;
      i += have;
      continue;
    }
    if (have < len) {  // truncated: wait for more bytes unless final
      if (!final) break;
      pending_ += kReplacement;
      i = n;
      break;
    }
    pending_.append(raw_, i, len);
    i += len;
  }
  raw_.erase(0, i);
}

std::string TextStream::Release(bool final) {
  size_t stop_at = std::string::npos;
  for (const std::string& s : stops_) stop_at = std::min(stop_at, pending_.find(s));
  std::string out;
  if (stop_at != std::string::npos) {
    out = pending_.substr(0, stop_at);
    pending_.clear();
    raw_.clear();
    stopped_ = true;
  } else {
    size_t hold = 0;
    if (!final) {
      for (const std::string& s : stops_) {
        const size_t max_k = std::min(s.size() - 1, pending_.size());
        for (size_t k = max_k; k > hold; --k) {
          if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) {
            hold = k;
            break;
          }
        }
      }
      // Never split a character (possible only for stop strings that are not
      // valid UTF-8 themselves).
      while (hold > 0 && hold < pending_.size() && IsCont(pending_[pending_.size() - hold])) ++hold;
    }
    out = pending_.substr(0, pending_.size() - hold);
    pending_.erase(0, pending_.size() - hold);
  }
  text_ += out;
  return out;
}

std::string TextStream::Append(std::string_view bytes) {
  if (stopped_) return "";
  raw_.append(bytes);
  DecodeRaw(/*final=*/false);
  return Release(/*final=*/false);
}

std::string TextStream::Finish() {
  if (stopped_) return "";
  DecodeRaw(/*final=*/true);
  return Release(/*final=*/true);
}

}  // namespace arbiter::engine_internal
