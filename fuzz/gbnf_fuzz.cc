// libFuzzer target for the GBNF parser and the grammar matcher: any input
// must give a Status or a working Grammar, never a crash, a hang or a
// sanitizer report. A grammar that parses then drives a GrammarConstraint
// over a small synthetic vocabulary (every byte, ASCII words, UTF-8 pieces
// that split code points) for a few steps, checking the matcher's own
// invariants: an allowed token is accepted, the length-aware budget holds
// when it can, and MustEnd implies CanEnd.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "arbiter/engine/grammar.h"
#include "engine/testing/synthetic_tokenizer.h"

namespace {

// A broken invariant: say which, then crash so libFuzzer keeps the input.
[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "gbnf_fuzz: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto* vocab = new std::shared_ptr<const arbiter::GrammarVocabulary>(
      arbiter::GrammarVocabulary::Build(arbiter::testing::SyntheticTokenizer(
          {"{\"", "\":", "\",", "\"}", "true", "null", "ab", "abc", " the", "\n  ", "\xC3\xA9",
           "\xC3", "\xA9x", "\xE2\x82", "\xAC", "\xF0\x9F\x98\x80", "[\"", "0.5"})));
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto g = arbiter::Grammar::Parse(text);
  if (!g.ok()) return 0;
  (void)(*g)->Matches(text.substr(0, 64));
  (void)(*g)->MatchesPrefix(text.substr(0, 64));
  arbiter::GrammarConstraint c(*g, *vocab);
  std::vector<uint8_t> allowed((*vocab)->size() + 3);
  uint32_t pick = static_cast<uint32_t>(size) * 2654435761u;
  const int budget = 24;
  for (int step = 0; step < budget; ++step) {
    const int tokens_left = budget - step;
    const bool could_close = c.MinCharsToEnd() <= tokens_left;
    std::fill(allowed.begin(), allowed.end(), uint8_t{0});
    c.FillAllowed(tokens_left, allowed);
    std::vector<int32_t> ids;
    for (size_t t = 0; t < allowed.size(); ++t) {
      if (allowed[t]) ids.push_back(static_cast<int32_t>(t));
    }
    if (c.MustEnd() && !c.CanEnd()) Fail("MustEnd without CanEnd");
    if (ids.empty()) break;
    pick = pick * 1664525u + 1013904223u;
    const int32_t t = ids[pick % ids.size()];
    if (!c.Accept(t).ok()) Fail("Accept refused a token FillAllowed allowed");
    // Every byte is a token, so a state that could close keeps that promise.
    if (could_close && c.MinCharsToEnd() > tokens_left - 1) Fail("an allowed token broke the length budget");
    if (c.MustEnd()) break;
  }
  return 0;
}
