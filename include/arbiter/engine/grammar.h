// arbiter/engine/grammar.h — GBNF grammars and the TokenConstraint that
// holds a generation to one (constrained decoding; docs/grammar.md).
//
// Grammar: llama.cpp's GBNF. Rules `name ::= alternatives` (names
// [a-zA-Z0-9_-]+), start rule "root"; `|`, `( )`, postfix `*` `+` `?` `{m}`
// `{m,}` `{m,n}`; string literals "..." with escapes \n \r \t \\ \" \' \[ \]
// \xHH \uHHHH \UHHHHHHHH; character classes `[a-z\n]`, negated `[^...]`;
// `.` (any code point); `#` comments to the end of the line. A rule's body
// ends at the end of its line unless inside parentheses, after a `|`, or
// when the next line starts with `|`. The grammar's alphabet is Unicode code
// points; text is UTF-8.
//
// Parse rejects (kInvalidArgument, "grammar: line L, column C: <problem>"):
// empty input, a missing "root", an undefined rule (named), a rule defined
// twice, bad escapes, unterminated literals and classes, left recursion (a
// rule that can reach itself without consuming a code point), a rule that
// can never end, and the limits below (it parses hostile request text).
//
// GrammarConstraint (Note [Grammar matching] in src/engine/grammar.cc): the
// set of parse stacks of a pushdown matcher advanced per code point, with a
// partial UTF-8 sequence carried across tokens (a token may end inside a
// code point). FillAllowed walks the vocabulary's byte trie once, pruning a
// subtree as soon as no stack survives its prefix, and caches the states it
// meets with their byte transitions (≤ about 1.1 MB per constraint) and the
// allowed tokens of the last 4 states it started from (8 bytes per allowed
// token), so a step that starts in a state seen before — every step of a
// model rambling inside a string — skips the walk. Special
// tokens, tokens with no bytes and tokens longer than 1 KiB are never
// allowed.
//
// Length-aware masking (Note [Length-aware masking]): every position of the
// grammar knows the fewest bytes that complete it (a fixed point over the
// rules). FillAllowed(tokens_left, ...) allows token t only if, after t, the
// shortest completion is at most tokens_left − 1 bytes. A vocabulary that
// has every single byte as a token (byte-level BPE, SentencePiece byte
// fallback) can always close one byte per token, so a generation that starts
// with MinCharsToEnd() ≤ max_tokens always ends complete, however the model
// rambles. Weakness: with a vocabulary that lacks single-byte tokens for the
// closing bytes, the bound can be met by no token; then (and whenever the
// budget is already too small) FillAllowed allows the viable tokens with the
// shortest completion, so the output gets as close to complete as it can —
// unless the output is already complete: then it allows no token, and
// end-of-sequence (which the engine adds) is the way out.
//
// Limits: 1 MiB of grammar text, 20 000 rules, 2 000 000 grammar elements,
// parenthesis nesting 64, repetition counts ≤ 10 000. While matching: at
// most 512 live stacks (more are dropped: a grammar that ambiguous is cut to
// its first parses) and a stack depth of 512 (deeper nesting is refused).
//
// Thread safety: Grammar and GrammarVocabulary are immutable and
// thread-safe; GrammarConstraint is thread-compatible (one generation).
//
// Example:
//   auto g = Grammar::Parse(R"(root ::= "yes" | "no")");
//   auto vocab = GrammarVocabulary::Build(engine->tokenizer());  // once per model
//   GrammarConstraint c(*g, vocab);
//   request.constraint = &c;
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "arbiter/base/status.h"
#include "arbiter/engine/engine.h"
#include "arbiter/engine/tokenizer.h"

namespace arbiter {

namespace grammar_internal {
struct CompiledGrammar;
struct Trie;
struct Matcher;
}  // namespace grammar_internal

// A parsed, checked GBNF grammar (start rule "root").
class Grammar {
 public:
  static constexpr size_t kMaxTextBytes = size_t{1} << 20;
  static constexpr int kMaxRules = 20000;
  static constexpr int kMaxElements = 2000000;
  static constexpr int kMaxNesting = 64;
  static constexpr int kMaxRepetition = 10000;

  // Errors: kInvalidArgument "grammar: line L, column C: <problem>" (above).
  static Result<std::shared_ptr<const Grammar>> Parse(std::string_view gbnf);

  // The fewest bytes of a sentence of the grammar.
  int MinBytes() const;
  // True when `text` (UTF-8) is a whole sentence of the grammar.
  bool Matches(std::string_view text) const;
  // True when `text` is a prefix of some sentence (may end inside a UTF-8
  // sequence).
  bool MatchesPrefix(std::string_view text) const;

  // Internal representation (src/engine/grammar.cc).
  const grammar_internal::CompiledGrammar& compiled() const { return *compiled_; }
  explicit Grammar(std::unique_ptr<grammar_internal::CompiledGrammar> c);
  ~Grammar();

 private:
  std::unique_ptr<grammar_internal::CompiledGrammar> compiled_;
};

// A tokenizer's vocabulary as the matcher needs it: every non-special
// token's bytes (Tokenizer::TokenBytes) in a byte trie. Build once per
// loaded model and share it between generations.
class GrammarVocabulary {
 public:
  static std::shared_ptr<const GrammarVocabulary> Build(const Tokenizer& tokenizer);
  // The tokenizer's vocab_size(): ids ≥ size() are never allowed.
  int size() const;
  // Bytes of token `id`; empty for special tokens and ids out of range.
  const std::string& TokenBytes(int32_t id) const;
  // The heap bytes this vocabulary holds (its trie and token strings), for
  // the ledger.
  size_t bytes() const;

  const grammar_internal::Trie& trie() const { return *trie_; }
  GrammarVocabulary();
  ~GrammarVocabulary();

 private:
  std::unique_ptr<grammar_internal::Trie> trie_;
};

// The TokenConstraint for one generation over `grammar` and `vocab`
// (both shared, kept alive by this object).
// Thread safety: thread-compatible.
class GrammarConstraint final : public TokenConstraint {
 public:
  GrammarConstraint(std::shared_ptr<const Grammar> grammar,
                    std::shared_ptr<const GrammarVocabulary> vocab);
  ~GrammarConstraint() override;

  // allowed: [≥ 0] zeroed by the caller; sets 1 for allowed ids < vocab size.
  // REQUIRES: tokens_left ≥ 1.
  void FillAllowed(int tokens_left, std::span<uint8_t> allowed) override;
  // kInvalidArgument (state unchanged) for an id out of range, a special
  // token, or bytes the grammar does not allow here. Does not re-check the
  // length budget (it does not know it).
  Status Accept(int32_t token) override;
  bool CanEnd() const override;
  bool MustEnd() const override;

  // Accepts raw bytes as if a token spelled them (tests, prompts that
  // pre-fill part of the output). kInvalidArgument as Accept.
  Status AcceptBytes(std::string_view bytes);
  // The fewest bytes that complete the output so far (Note [Length-aware
  // masking]); a large number when nothing can.
  int MinCharsToEnd() const;

 private:
  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const GrammarVocabulary> vocab_;
  std::unique_ptr<grammar_internal::Matcher> m_;
};

}  // namespace arbiter
