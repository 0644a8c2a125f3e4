// engine/internal/text_stream.h — turns generated token bytes into text
// deltas that are safe to send to a client.
//
// Two kinds of holdback (both required by engine.h's TextCallback contract):
//   1. UTF-8: a token may end in the middle of a multi-byte character; those
//      bytes wait for the next token. Invalid bytes (a stray continuation
//      byte, an overlong or surrogate lead, a truncated sequence followed by
//      a non-continuation) become U+FFFD, so the output is always valid UTF-8.
//   2. Stop strings: the longest tail of the pending text that is a prefix of
//      some stop string is held until the next bytes resolve it. When a stop
//      string appears, the text before it is released, the stop string and
//      everything after it are dropped, and the stream is stopped.
// Because every tail that could start a stop string is held, an occurrence can
// never straddle released text and pending text.
//
// Usage:
//   TextStream ts({"\n\n"});
//   for each token: send(ts.Append(tokenizer.TokenBytes(id))); if (ts.stopped()) break;
//   send(ts.Finish());
//
// Thread safety: thread-compatible.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace arbiter::engine_internal {

class TextStream {
 public:
  // Empty stop strings are ignored.
  explicit TextStream(std::vector<std::string> stop_strings = {});

  // Adds raw bytes; returns the text now safe to release (possibly empty).
  // After stopped(), returns "" and ignores the bytes.
  std::string Append(std::string_view bytes);
  // End of stream: releases all held text; a truncated UTF-8 tail becomes
  // U+FFFD. Returns "" if already stopped. Call once.
  std::string Finish();

  bool stopped() const { return stopped_; }
  // Everything released so far (the concatenation of all returned deltas).
  const std::string& text() const { return text_; }

 private:
  // Moves complete characters from raw_ to pending_. `final`: treat a
  // truncated tail as invalid.
  void DecodeRaw(bool final);
  // Releases what pending_ allows; `final` holds nothing back.
  std::string Release(bool final);

  std::vector<std::string> stops_;
  std::string raw_;      // bytes not yet known to form complete characters
  std::string pending_;  // valid UTF-8 not yet released
  std::string text_;
  bool stopped_ = false;
};

}  // namespace arbiter::engine_internal
