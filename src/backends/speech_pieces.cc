// Cutting speech input into pieces (arbiter/backends/tts.h).
//
// Note [Speech in pieces]
// Flite synthesizes an utterance whole: flite_text_to_wave tokenizes,
// analyses and builds the wave of all of its text before returning, and
// what it holds grows with the text, without bound, inside one call that
// cannot be interrupted (docs/BENCHMARKS.md "Speech in pieces"). So a
// synthesis is a sequence of utterances no longer than
// kMaxSpeechPieceBytes, as Flite's own flite_text_to_speech does with its
// utterance breaks: the memory of a call is what one piece needs (freed
// when the piece ends, and handed back to the OS when the synthesis ends:
// the runtime trims the heap), the first audio comes after the first
// piece, and the engine checks for cancellation between pieces. What one
// piece holds is bounded by the piece size and is not charged; what grows
// with the input (a WAV answer, buffered whole for its header) is charged
// to the model by the speech route.
//
// Where a piece ends, in order of preference:
//   - after a sentence: a terminator (. ! ? ;, or the CJK full stops
//     。！？ which need no space after them), then any closing quotes or
//     brackets, then white space — once the piece holds at least
//     kMinSentencePieceBytes, so "Dr. Smith" or "e.g. this" stay whole
//     and short sentences share an utterance;
//   - at a blank line (a paragraph);
//   - when the piece would pass the maximum: at its last white space, else
//     (one very long word) at its last UTF-8 character boundary.
// Each cut costs a short pause (an utterance ends in silence), which is
// what a sentence boundary sounds like anyway.
#include <string_view>
#include <vector>

#include "arbiter/backends/tts.h"

namespace arbiter {
namespace {

constexpr size_t kMinSentencePieceBytes = 32;

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool IsContinuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }
bool IsClosing(char c) { return c == '"' || c == '\'' || c == ')' || c == ']' || c == '}'; }

// The length of a CJK sentence terminator at text[i] (3), or 0.
size_t CjkStop(std::string_view text, size_t i) {
  const std::string_view rest = text.substr(i, 3);
  return rest == "\u3002" || rest == "\uFF01" || rest == "\uFF1F" ? 3 : 0;
}

// The end (exclusive) of the sentence whose terminator starts at text[i],
// or 0 when text[i] does not end one.
size_t SentenceEnd(std::string_view text, size_t i) {
  if (size_t n = CjkStop(text, i); n > 0) return i + n;
  const char c = text[i];
  if (c != '.' && c != '!' && c != '?' && c != ';') return 0;
  size_t j = i + 1;
  while (j < text.size() && (IsClosing(text[j]) || text[j] == c)) ++j;
  return j == text.size() || IsSpace(text[j]) ? j : 0;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && IsSpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsSpace(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace

std::vector<std::string_view> SplitSpeechText(std::string_view text, size_t max_piece_bytes) {
  std::vector<std::string_view> pieces;
  auto emit = [&](size_t begin, size_t end) {
    std::string_view p = Trim(text.substr(begin, end - begin));
    if (!p.empty()) pieces.push_back(p);
  };
  size_t start = 0;
  while (start < text.size() && IsSpace(text[start])) ++start;
  size_t i = start;
  while (i < text.size()) {
    if (i - start >= max_piece_bytes) {
      // Too long: the last white space inside the piece, else the last
      // character boundary.
      size_t cut = i;
      while (cut > start && !IsSpace(text[cut - 1])) --cut;
      if (cut == start) {
        cut = i;
        while (cut > start && IsContinuation(text[cut])) --cut;
        if (cut == start) cut = i;  // not UTF-8 after all: cut where we are
      }
      emit(start, cut);
      start = cut;
      while (start < text.size() && IsSpace(text[start])) ++start;
      i = start;
      continue;
    }
    if (const size_t end = SentenceEnd(text, i);
        end > 0 && end - start <= max_piece_bytes && end - start >= kMinSentencePieceBytes) {
      emit(start, end);
      start = end;
      while (start < text.size() && IsSpace(text[start])) ++start;
      i = start;
      continue;
    }
    if (text[i] == '\n' && i > start) {
      // A blank line: only white space up to the next newline.
      size_t j = i + 1;
      while (j < text.size() && IsSpace(text[j]) && text[j] != '\n') ++j;
      if (j < text.size() && text[j] == '\n') {
        emit(start, i);
        start = j;
        while (start < text.size() && IsSpace(text[start])) ++start;
        i = start;
        continue;
      }
    }
    ++i;
  }
  if (start < text.size()) emit(start, text.size());
  return pieces;
}

size_t CountCodePoints(std::string_view text, size_t stop_after) {
  size_t n = 0;
  for (char c : text) {
    if (!IsContinuation(c) && ++n > stop_after) break;
  }
  return n;
}

}  // namespace arbiter
