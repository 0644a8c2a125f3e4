// GBNF parsing and matching, the trie walk against a brute-force mask, the
// length-aware rule (random walks that must always close), and the engine
// under a JSON-schema constraint on the `tiny` preset.
#include "arbiter/engine/grammar.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "arbiter/engine/engine.h"
#include "arbiter/engine/json_schema.h"
#include "engine/internal/test_model.h"
#include "engine/testing/test_size.h"
#include "tools/model_maker/model_maker.h"

namespace arbiter {
namespace {

std::shared_ptr<const Grammar> MustParse(const std::string& text) {
  Result<std::shared_ptr<const Grammar>> g = Grammar::Parse(text);
  EXPECT_TRUE(g.ok()) << g.status().ToString() << "\n" << text;
  return g.ok() ? *g : nullptr;
}

std::string ParseError(const std::string& text) {
  Result<std::shared_ptr<const Grammar>> g = Grammar::Parse(text);
  EXPECT_FALSE(g.ok()) << text;
  if (g.ok()) return "";
  EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
  return g.status().message();
}

TEST(GrammarParse, ErrorsNameLineAndColumn) {
  EXPECT_EQ(ParseError("root ::= foo\n"), "grammar: line 1, column 10: undefined rule \"foo\"");
  EXPECT_EQ(ParseError("a ::= \"x\"\n"), "grammar: line 1, column 1: missing rule \"root\"");
  EXPECT_EQ(ParseError("root ::= \"x\"\nb ::= \"abc\n"), "grammar: line 2, column 7: unterminated string literal");
  EXPECT_EQ(ParseError("root ::= \"\\q\""), "grammar: line 1, column 11: bad escape \"\\q\"");
  EXPECT_EQ(ParseError("root ::= [a-z"), "grammar: line 1, column 10: unterminated character class");
  EXPECT_EQ(ParseError(""), "grammar: line 1, column 1: empty grammar");
  EXPECT_EQ(ParseError("  # only a comment\n"), "grammar: line 1, column 1: empty grammar");
  EXPECT_EQ(ParseError("root ::= x\nx ::= x \"a\" | \"b\""), "grammar: line 2, column 1: left recursion through rule \"x\"");
  EXPECT_EQ(ParseError("root ::= \"a\" root"), "grammar: line 1, column 1: rule \"root\" can never end");
  EXPECT_EQ(ParseError("root ::= \"a\"\nroot ::= \"b\""), "grammar: line 2, column 1: rule \"root\" defined twice");
  EXPECT_EQ(ParseError("root ::= [z-a]"), "grammar: line 1, column 13: character range out of order");
  EXPECT_EQ(ParseError("root ::= (\"a\""), "grammar: line 1, column 10: unclosed \"(\"");
  EXPECT_NE(ParseError("root ::= \"a\"{20000}").find("repetition count above 10000"), std::string::npos);
  EXPECT_NE(ParseError("root ::= \"\\x4\"").find("hex digits"), std::string::npos);
  EXPECT_NE(ParseError("root ::= \"\\U00110000\"").find("above U+10FFFF"), std::string::npos);
  EXPECT_NE(ParseError("root ::= \"a\" b ::= \"c\"").find("expected end of line"), std::string::npos);
  EXPECT_NE(ParseError("root ::= \"a\"{3,2}").find("n < m"), std::string::npos);
  EXPECT_NE(ParseError("root = \"a\"").find("expected \"::=\""), std::string::npos);
  std::string deep = "root ::= " + std::string(70, '(') + "\"a\"" + std::string(70, ')');
  EXPECT_NE(ParseError(deep).find("nested deeper than 64"), std::string::npos);
  // Huge repetitions of repetitions run into the element limit, not memory.
  // Repeating a group repeats one reference, so this stays small...
  EXPECT_NE(MustParse("root ::= ((\"a\"{0,10000}){10000}){10000}"), nullptr);
  // ...while many large expansions hit the rule or element limits.
  std::string many_rules = "root ::=";
  for (int i = 0; i < 3; ++i) many_rules += " [a]{0,10000}";
  EXPECT_NE(ParseError(many_rules).find("more than 20000 rules"), std::string::npos);
  std::string many_elems = "root ::=";
  for (int i = 0; i < 201; ++i) many_elems += " [a]{10000}";
  EXPECT_NE(ParseError(many_elems).find("larger than 2000000 elements"), std::string::npos);
}

TEST(GrammarParse, AcceptsAndRejectsSentences) {
  auto g = MustParse(R"(
# a comment
root ::= greeting " " name ("!" | "?")?   # trailing comment
greeting ::= "hi" | "hello"
name ::= [A-Z] [a-z]{1,3}
)");
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(g->Matches("hi Bob"));
  EXPECT_TRUE(g->Matches("hello Anna!"));
  EXPECT_TRUE(g->Matches("hi Al?"));
  EXPECT_FALSE(g->Matches("hi bob"));
  EXPECT_FALSE(g->Matches("hi Bobby"));   // {1,3}
  EXPECT_FALSE(g->Matches("hi B"));
  EXPECT_FALSE(g->Matches("hey Bob"));
  EXPECT_FALSE(g->Matches("hi Bob!!"));
  EXPECT_TRUE(g->MatchesPrefix("hel"));
  EXPECT_FALSE(g->MatchesPrefix("hex"));
  EXPECT_EQ(g->MinBytes(), 5);  // "hi Ab"

  auto rep = MustParse("root ::= \"ab\"+ [^a-z\\n]* \"x\"{2} \"y\"{1,} \"z\"{0,2} .");
  EXPECT_TRUE(rep->Matches("abab1Qxxyyz\xE2\x82\xAC"));
  EXPECT_TRUE(rep->Matches("abxxy-"));
  EXPECT_FALSE(rep->Matches("axxy-"));     // "ab"+ repeats the whole literal
  EXPECT_FALSE(rep->Matches("abqxxy-"));   // negated class
  EXPECT_FALSE(rep->Matches("abxy-"));     // {2}
  EXPECT_FALSE(rep->Matches("abxxyzzz-"));  // {0,2}
  EXPECT_FALSE(rep->Matches("abxxy"));     // `.` needs a code point

  // Escapes, a multi-line alternation, Unicode.
  auto esc = MustParse("root ::= \"\\x41\\u00e9\\U0001F600\\t\\\"\\\\\"\n  | \"é\" [\\u0100-\\u017F]\n  | [\\[\\]]");
  EXPECT_TRUE(esc->Matches("A\xC3\xA9\xF0\x9F\x98\x80\t\"\\"));
  EXPECT_TRUE(esc->Matches("\xC3\xA9\xC4\x80"));
  EXPECT_TRUE(esc->Matches("]"));
  EXPECT_FALSE(esc->Matches("\xC3\xA9" "a"));
  // Invalid UTF-8 never matches, even against `.`.
  auto any = MustParse("root ::= .+");
  EXPECT_TRUE(any->Matches("x\xC3\xA9"));
  EXPECT_FALSE(any->Matches("\xC3"));        // incomplete: a prefix only
  EXPECT_TRUE(any->MatchesPrefix("\xC3"));
  EXPECT_FALSE(any->MatchesPrefix("\xC3x"));
  EXPECT_FALSE(any->MatchesPrefix("\xC0\x80"));      // overlong
  EXPECT_FALSE(any->MatchesPrefix("\xED\xA0\x80"));  // surrogate
  EXPECT_FALSE(any->MatchesPrefix("\xE0\x80"));      // overlong, caught at the second byte
  // Empty alternatives, nullable rules, nested groups, right recursion.
  auto list = MustParse("root ::= \"[\" (item (\",\" item)*)? \"]\"\nitem ::= \"x\" | \"(\" root \")\" | ");
  EXPECT_TRUE(list->Matches("[]"));
  EXPECT_TRUE(list->Matches("[x,,([x])]"));
  EXPECT_FALSE(list->Matches("[x,,(x)]"));
  EXPECT_TRUE(list->Matches("[(x,([x]))]") == false);
  EXPECT_TRUE(list->Matches("[([x]),x]"));
}

TEST(GrammarConstraintTest, Utf8SplitAcrossTokens) {
  auto g = MustParse("root ::= \"\xC3\xA9\" [\xE2\x82\xAC-\xE2\x82\xAF] \"!\"");  // é, U+20AC..U+20AF, !
  auto vocab = std::make_shared<const GrammarVocabulary>();
  GrammarConstraint c(g, vocab);
  EXPECT_EQ(c.MinCharsToEnd(), 6);
  ASSERT_TRUE(c.AcceptBytes("\xC3").ok());
  EXPECT_FALSE(c.CanEnd());
  EXPECT_EQ(c.MinCharsToEnd(), 5);
  ASSERT_TRUE(c.AcceptBytes("\xA9\xE2").ok());
  EXPECT_EQ(c.MinCharsToEnd(), 3);
  EXPECT_FALSE(c.AcceptBytes("\x81").ok());  // U+2040.. is out of the class
  ASSERT_TRUE(c.AcceptBytes("\x82").ok());
  EXPECT_FALSE(c.AcceptBytes("\xB0").ok());  // U+20B0
  ASSERT_TRUE(c.AcceptBytes("\xAC").ok());
  EXPECT_FALSE(c.CanEnd());
  ASSERT_TRUE(c.AcceptBytes("!").ok());
  EXPECT_TRUE(c.CanEnd());
  EXPECT_TRUE(c.MustEnd());
  EXPECT_EQ(c.MinCharsToEnd(), 0);
  // A failed Accept leaves the state unchanged.
  GrammarConstraint d(g, vocab);
  ASSERT_TRUE(d.AcceptBytes("\xC3").ok());
  EXPECT_FALSE(d.AcceptBytes("\xA8").ok());  // è
  EXPECT_TRUE(d.AcceptBytes("\xA9").ok());
}

TEST(GrammarConstraintTest, CanEndAndMustEnd) {
  auto g = MustParse("root ::= \"a\" \"b\"?");
  auto vocab = std::make_shared<const GrammarVocabulary>();
  GrammarConstraint c(g, vocab);
  EXPECT_FALSE(c.CanEnd());
  ASSERT_TRUE(c.AcceptBytes("a").ok());
  EXPECT_TRUE(c.CanEnd());
  EXPECT_FALSE(c.MustEnd());
  ASSERT_TRUE(c.AcceptBytes("b").ok());
  EXPECT_TRUE(c.MustEnd());
  EXPECT_FALSE(c.AcceptBytes("b").ok());
}

// ---------------------------------------------------------------------------
// Against a real vocabulary (the `tiny` preset's byte-level BPE tokenizer).

class GrammarVocabTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(engine_internal::MakeTempDir("arbiter_grammar_test_"));
    Status s = MakeModel("tiny", *dir_, 11);
    ASSERT_TRUE(s.ok()) << s.ToString();
    auto t = Tokenizer::Load(*dir_ + "/tokenizer.json");
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    tokenizer_ = t->release();
    vocab_ = new std::shared_ptr<const GrammarVocabulary>(GrammarVocabulary::Build(*tokenizer_));
  }
  static void TearDownTestSuite() {
    delete vocab_;
    delete tokenizer_;
    delete dir_;
  }

  // Brute force, one token at a time: MinCharsToEnd after accepting token t
  // alone (-1: not accepted).
  static std::vector<int> MinAfterEachToken(const std::vector<int32_t>& prefix, std::shared_ptr<const Grammar> g,
                                            int n) {
    std::vector<int> min_after(n, -1);
    for (int t = 0; t < n && t < (*vocab_)->size(); ++t) {
      GrammarConstraint c(g, *vocab_);
      for (int32_t p : prefix) EXPECT_TRUE(c.Accept(p).ok());
      if (c.Accept(t).ok()) min_after[t] = c.MinCharsToEnd();
    }
    return min_after;
  }

  // The mask the contract asks for: viable tokens whose completion fits
  // tokens_left − 1; if none fits, nothing when the output is complete, else
  // the viable tokens with the shortest completion.
  static std::vector<uint8_t> Expected(const std::vector<int>& min_after, bool can_end, int tokens_left) {
    int best = 1 << 30;
    for (int m : min_after) {
      if (m >= 0) best = std::min(best, m);
    }
    const bool any = best <= tokens_left - 1;
    std::vector<uint8_t> out(min_after.size(), 0);
    if (!any && can_end) return out;  // only end-of-sequence
    const int limit = any ? tokens_left - 1 : best;
    for (size_t t = 0; t < min_after.size(); ++t) out[t] = min_after[t] >= 0 && min_after[t] <= limit;
    return out;
  }

  static std::string* dir_;
  static Tokenizer* tokenizer_;
  static std::shared_ptr<const GrammarVocabulary>* vocab_;
};
std::string* GrammarVocabTest::dir_ = nullptr;
Tokenizer* GrammarVocabTest::tokenizer_ = nullptr;
std::shared_ptr<const GrammarVocabulary>* GrammarVocabTest::vocab_ = nullptr;

const char kWeatherSchema[] =
    R"({"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"},)"
    R"("tags":{"type":"array","items":{"type":"string"},"maxItems":3}},"required":["city","days"],)"
    R"("additionalProperties":false})";

// The weather schema's validation, by hand.
bool ValidWeather(const std::string& text, std::string* why) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    *why = std::string("not JSON: ") + e.what();
    return false;
  }
  if (!j.is_object() || !j.contains("city") || !j.contains("days")) return *why = "missing keys", false;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() != "city" && it.key() != "days" && it.key() != "tags") return *why = "extra key", false;
  }
  if (!j["city"].is_string() || !j["days"].is_number_integer()) return *why = "bad types", false;
  if (j.contains("tags")) {
    if (!j["tags"].is_array() || j["tags"].size() > 3) return *why = "bad tags", false;
    for (const auto& t : j["tags"]) {
      if (!t.is_string()) return *why = "bad tag", false;
    }
  }
  return true;
}

TEST_F(GrammarVocabTest, VocabularyHasEveryByte) {
  // The length-aware guarantee needs single-byte tokens for the closing path.
  std::vector<bool> seen(256, false);
  for (int t = 0; t < (*vocab_)->size(); ++t) {
    const std::string& b = (*vocab_)->TokenBytes(t);
    if (b.size() == 1) seen[static_cast<uint8_t>(b[0])] = true;
    if (tokenizer_->IsSpecial(t)) {
      EXPECT_TRUE(b.empty()) << t;
    }
  }
  for (int c = 0; c < 256; ++c) EXPECT_TRUE(seen[c]) << c;
}

// The brute force replays the prefix for every token of every state
// (quadratic in the steps): a Debug / sanitizer build walks fewer states
// (it took 234 s under ASan at 6 × 25).
constexpr int kBruteForceRuns = testing::kFullSizeTests ? 6 : 2;
constexpr int kBruteForceSteps = testing::kFullSizeTests ? 25 : 18;

TEST_F(GrammarVocabTest, FillAllowedEqualsBruteForce) {
  Result<std::string> gbnf = JsonSchemaToGbnf(kWeatherSchema);
  ASSERT_TRUE(gbnf.ok()) << gbnf.status().ToString();
  std::vector<std::string> grammars = {
      *gbnf,
      "root ::= \"\xC3\xA9t\xC3\xA9 \" [a-z\xC3\xA0-\xC3\xBF]+ \" \" [0-9]{1,3}",
      "root ::= (\"the\" | \"then\" | \" \" | [a-c]+)*",
  };
  const int n = (*vocab_)->size() + 7;  // padded logits
  std::mt19937 rng(5);
  int states = 0, compared_allowed = 0;
  for (const std::string& text : grammars) {
    auto g = MustParse(text);
    ASSERT_NE(g, nullptr);
    for (int run = 0; run < kBruteForceRuns; ++run) {
      GrammarConstraint c(g, *vocab_);
      std::vector<int32_t> prefix;
      for (int step = 0; step < kBruteForceSteps; ++step) {
        const std::vector<int> min_after = MinAfterEachToken(prefix, g, n);
        // Twice per state with different budgets: the second call is
        // served from the constraint's mask cache.
        for (int k = 0; k < 2; ++k) {
          const int tokens_left = std::uniform_int_distribution<int>(1, 40)(rng);
          std::vector<uint8_t> got(n, 0);
          c.FillAllowed(tokens_left, got);
          ASSERT_EQ(got, Expected(min_after, c.CanEnd(), tokens_left))
              << "grammar " << text.substr(0, 40) << " step " << step << " tokens_left " << tokens_left;
          for (uint8_t x : got) compared_allowed += x;
        }
        ++states;
        // Continue with an allowed token, ignoring the budget (so states
        // near and far from the end both occur).
        std::vector<uint8_t> wide(n, 0);
        c.FillAllowed(1000, wide);
        std::vector<int32_t> ids;
        for (int t = 0; t < n; ++t) {
          if (wide[t]) ids.push_back(t);
        }
        if (ids.empty()) break;
        const int32_t t = ids[std::uniform_int_distribution<size_t>(0, ids.size() - 1)(rng)];
        ASSERT_TRUE(c.Accept(t).ok());
        prefix.push_back(t);
        if (c.MustEnd()) break;
      }
    }
  }
  EXPECT_GT(states, kBruteForceRuns == 6 ? 50 : 20);
  EXPECT_GT(compared_allowed, kBruteForceRuns == 6 ? 1000 : 300);
}

// Runs one constrained generation with random (or rambling) choices.
// Returns the text; `complete` says whether the constraint ended complete.
std::string RandomWalk(std::shared_ptr<const Grammar> g, std::shared_ptr<const GrammarVocabulary> vocab,
                       const Tokenizer& tok, int max_tokens, uint64_t seed, bool ramble, bool* complete,
                       int* used) {
  GrammarConstraint c(g, vocab);
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> allowed(vocab->size());
  std::string text;
  *used = 0;
  for (int step = 0; step < max_tokens; ++step) {
    std::fill(allowed.begin(), allowed.end(), 0);
    c.FillAllowed(max_tokens - step, allowed);
    std::vector<int32_t> ids, rambling;
    for (int t = 0; t < vocab->size(); ++t) {
      if (!allowed[t]) continue;
      ids.push_back(t);
      const std::string& b = vocab->TokenBytes(t);
      bool word = !b.empty();
      for (char ch : b) word = word && ((ch >= 'a' && ch <= 'z') || ch == ' ' || (ch >= '0' && ch <= '9'));
      if (word) rambling.push_back(t);
    }
    // End-of-sequence, as the engine offers it, sometimes.
    if (c.CanEnd() && (ids.empty() || (!ramble && rng() % 8 == 0))) break;
    if (ids.empty()) break;
    const std::vector<int32_t>& from = ramble && !rambling.empty() ? rambling : ids;
    const int32_t t = from[rng() % from.size()];
    EXPECT_TRUE(c.Accept(t).ok());
    text += tok.TokenBytes(t);
    ++*used;
    if (c.MustEnd()) break;
  }
  *complete = c.CanEnd();
  return text;
}

TEST_F(GrammarVocabTest, RandomWalksAlwaysCloseWithinBudget) {
  Result<std::string> gbnf = JsonSchemaToGbnf(kWeatherSchema);
  ASSERT_TRUE(gbnf.ok()) << gbnf.status().ToString();
  auto g = MustParse(*gbnf);
  ASSERT_NE(g, nullptr);
  const int min_start = GrammarConstraint(g, *vocab_).MinCharsToEnd();
  EXPECT_EQ(min_start, static_cast<int>(std::string(R"({"city":"","days":0})").size()));
  int runs = 0, closed_by_budget = 0;
  for (int ramble = 0; ramble < 2; ++ramble) {
    for (int max_tokens = 1; max_tokens <= 60; ++max_tokens) {
      for (uint64_t seed = 0; seed < 6; ++seed) {
        bool complete = false;
        int used = 0;
        const std::string text = RandomWalk(g, *vocab_, *tokenizer_, max_tokens, seed * 131 + max_tokens,
                                            ramble == 1, &complete, &used);
        ASSERT_LE(used, max_tokens);
        // Below min_start bytes the budget may still suffice (tokens hold
        // several bytes) but nothing is promised.
        if (max_tokens < min_start) continue;
        ++runs;
        ASSERT_TRUE(complete) << "max_tokens " << max_tokens << " seed " << seed << " ramble " << ramble
                              << ": " << text;
        std::string why;
        ASSERT_TRUE(ValidWeather(text, &why)) << why << ": " << text;
        if (used == max_tokens) ++closed_by_budget;
      }
    }
  }
  EXPECT_GT(runs, 400);
  EXPECT_GT(closed_by_budget, 50);  // the budget, not luck, ended many of them
}

TEST_F(GrammarVocabTest, EngineGeneratesValidJsonUnderTheSchema) {
  EngineOptions o;
  o.n_ctx = 256;
  Result<std::unique_ptr<Engine>> e = Engine::Load(*dir_, o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  auto vocab = GrammarVocabulary::Build((*e)->tokenizer());
  Result<std::string> gbnf = JsonSchemaToGbnf(kWeatherSchema);
  ASSERT_TRUE(gbnf.ok());
  auto g = MustParse(*gbnf);
  const std::vector<int32_t> prompt = (*e)->tokenizer().Encode("Weather as JSON:", false);
  int lengths = 0;
  for (int max_tokens : {21, 24, 30, 45}) {
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      GrammarConstraint c(g, vocab);
      GenerationRequest r;
      r.prompt_ids = prompt;
      r.max_tokens = max_tokens;
      r.sampling.temperature = 1.0f;
      r.sampling.has_seed = true;
      r.sampling.seed = seed;
      r.constraint = &c;
      Result<GenerationResult> out = (*e)->Generate(r, nullptr, nullptr);
      ASSERT_TRUE(out.ok()) << out.status().ToString();
      std::string why;
      EXPECT_TRUE(ValidWeather(out->text, &why)) << why << ": " << out->text;
      EXPECT_LE(static_cast<int>(out->output_ids.size()), max_tokens);
      lengths += out->finish_reason == FinishReason::kLength;
    }
  }
  // Tokens span several bytes, so most end by the grammar ("}" must end);
  // when the budget ends one, it still parses (checked above).
  std::printf("engine runs ended by the budget: %d of 16\n", lengths);
}

}  // namespace
}  // namespace arbiter
