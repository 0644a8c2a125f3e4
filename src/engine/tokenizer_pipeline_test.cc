// Unit tests of the tokenizer pipeline stages (tokenizer_pipeline.h,
// added_vocabulary.h, unicode_text.h) and of the Tokenizer features they
// serve, each against a value worked out from HF `tokenizers`' definition.
// tests/tokenizer_conformance/ checks whole real tokenizers.
#include "engine/internal/tokenizer_pipeline.h"

#include <gtest/gtest.h>

#include "arbiter/engine/tokenizer.h"
#include "arbiter/formats/tokenizer_json.h"
#include "engine/internal/added_vocabulary.h"
#include "engine/internal/unicode_text.h"

namespace arbiter {
namespace {

using internal::NormalForm;
using Behavior = TokenizerPreTokenizerStep::Behavior;
using Strings = std::vector<std::string>;

std::string Norm(std::vector<TokenizerNormalizerStep> steps, std::string s) {
  auto n = internal::TokenizerNormalizer::Build(steps, "t");
  EXPECT_TRUE(n.ok()) << n.status().ToString();
  n->Apply(&s);
  return s;
}

TokenizerNormalizerStep N(TokenizerNormalizerStep::Kind k) {
  TokenizerNormalizerStep s;
  s.kind = k;
  return s;
}

TEST(TokenizerPipelineTest, UnicodeNormalizers) {
  using K = TokenizerNormalizerStep::Kind;
  EXPECT_EQ(Norm({N(K::kNfc)}, "e\xCC\x81"), "\xC3\xA9");            // e + U+0301 → é
  EXPECT_EQ(Norm({N(K::kNfd)}, "\xC3\xA9"), "e\xCC\x81");
  EXPECT_EQ(Norm({N(K::kNfkc)}, "\xEF\xAC\x81 \xE2\x91\xA0"), "fi 1");  // ﬁ ①
  EXPECT_EQ(Norm({N(K::kNfkd)}, "\xEF\xAC\x81\xC3\xA9"), "fie\xCC\x81");
  EXPECT_EQ(Norm({N(K::kNfc)}, "a\xFF" "e\xCC\x81"), "a\xFF\xC3\xA9");  // invalid byte kept
  EXPECT_EQ(Norm({N(K::kLowercase)}, "HeLLo \xC3\x89\xCE\xA3 \xC4\xB0"), "hello \xC3\xA9\xCF\x83 i\xCC\x87");
  EXPECT_EQ(Norm({N(K::kNfd), N(K::kStripAccents)}, "\xC3\xA9t\xC3\xA9"), "ete");
  TokenizerNormalizerStep strip = N(K::kStrip);
  EXPECT_EQ(Norm({strip}, " \t\xE3\x80\x80 hi \n"), "hi");  // U+3000 is White_Space
  strip.strip_left = false;
  EXPECT_EQ(Norm({strip}, "  hi  "), "  hi");
  TokenizerNormalizerStep rep = N(K::kReplace);
  rep.pattern = "\\s+";
  rep.pattern_is_regex = true;
  rep.content = "_";
  TokenizerNormalizerStep pre = N(K::kPrepend);
  pre.prepend = ">";
  EXPECT_EQ(Norm({rep, pre}, "a  b\tc"), ">a_b_c");
  EXPECT_EQ(Norm({pre}, ""), "");  // Prepend leaves an empty input empty
}

Strings Pre(std::vector<TokenizerPreTokenizerStep> steps, std::string text, bool at_origin = true) {
  auto p = internal::TokenizerPreTokenizer::Build(steps, "t");
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  std::vector<internal::PreTokenizedPiece> pieces;
  p->Apply(std::move(text), at_origin, &pieces);
  Strings out;
  for (auto& piece : pieces) out.push_back(piece.text);
  return out;
}

TokenizerPreTokenizerStep SplitStep(const std::string& pattern, bool regex, Behavior b,
                                    bool invert = false) {
  TokenizerPreTokenizerStep s;
  s.kind = TokenizerPreTokenizerStep::Kind::kSplit;
  s.pattern = pattern;
  s.pattern_is_regex = regex;
  s.behavior = b;
  s.invert = invert;
  return s;
}

TEST(TokenizerPipelineTest, SplitBehaviorsAsHf) {
  // HF's own examples for NormalizedString::split on "The-final--countdown"
  // with the delimiter '-'.
  const std::string text = "The-final--countdown";
  EXPECT_EQ(Pre({SplitStep("-", false, Behavior::kRemoved)}, text),
            (Strings{"The", "final", "countdown"}));
  EXPECT_EQ(Pre({SplitStep("-", false, Behavior::kIsolated)}, text),
            (Strings{"The", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(Pre({SplitStep("-", false, Behavior::kMergedWithPrevious)}, text),
            (Strings{"The-", "final-", "-", "countdown"}));
  EXPECT_EQ(Pre({SplitStep("-", false, Behavior::kMergedWithNext)}, text),
            (Strings{"The", "-final", "-", "-countdown"}));
  EXPECT_EQ(Pre({SplitStep("-", false, Behavior::kContiguous)}, text),
            (Strings{"The", "-", "final", "--", "countdown"}));
  // invert: the pattern matches the pieces.
  EXPECT_EQ(Pre({SplitStep("\\p{L}+", true, Behavior::kRemoved, true)}, "ab, cd!"),
            (Strings{"ab", "cd"}));
  EXPECT_EQ(Pre({SplitStep("\\d+", true, Behavior::kIsolated)}, "ab12cd3"),
            (Strings{"ab", "12", "cd", "3"}));
}

TEST(TokenizerPipelineTest, DigitsWhitespaceAndSequences) {
  TokenizerPreTokenizerStep digits;
  digits.kind = TokenizerPreTokenizerStep::Kind::kDigits;
  EXPECT_EQ(Pre({digits}, "Call 123 or 45\xD9\xA6"), (Strings{"Call ", "123", " or ", "45\xD9\xA6"}));
  digits.individual_digits = true;
  EXPECT_EQ(Pre({digits}, "a123"), (Strings{"a", "1", "2", "3"}));
  TokenizerPreTokenizerStep ws;
  ws.kind = TokenizerPreTokenizerStep::Kind::kWhitespace;
  EXPECT_EQ(Pre({ws}, "Hey friend!     How are you?!?"),
            (Strings{"Hey", "friend", "!", "How", "are", "you", "?!?"}));
  TokenizerPreTokenizerStep wss;
  wss.kind = TokenizerPreTokenizerStep::Kind::kWhitespaceSplit;
  EXPECT_EQ(Pre({wss}, " Hey friend!\t\xC2\xA0 x "), (Strings{"Hey", "friend!", "x"}));
  EXPECT_EQ(Pre({wss, digits}, "ab12 c3"), (Strings{"ab", "1", "2", "c", "3"}));
}

TEST(TokenizerPipelineTest, MetaspacePrependSchemes) {
  TokenizerPreTokenizerStep m;
  m.kind = TokenizerPreTokenizerStep::Kind::kMetaspace;
  m.prepend_scheme = TokenizerPreTokenizerStep::PrependScheme::kAlways;
  EXPECT_EQ(Pre({m}, "Hey   friend!"), (Strings{"\u2581Hey", "\u2581", "\u2581", "\u2581friend!"}));
  m.prepend_scheme = TokenizerPreTokenizerStep::PrependScheme::kFirst;
  EXPECT_EQ(Pre({m}, "a b", /*at_origin=*/true), (Strings{"\u2581a", "\u2581b"}));
  EXPECT_EQ(Pre({m}, "a b", /*at_origin=*/false), (Strings{"a", "\u2581b"}));
  m.split = false;
  EXPECT_EQ(Pre({m}, "a b", false), (Strings{"a\u2581b"}));
}

Strings Dec(std::vector<TokenizerDecoderStep> steps, Strings toks, bool whole = true) {
  auto d = internal::TokenizerDecoder::Build(steps, "t");
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  d->Apply(&toks, whole);
  return toks;
}

TEST(TokenizerPipelineTest, Decoders) {
  using K = TokenizerDecoderStep::Kind;
  TokenizerDecoderStep bf;
  bf.kind = K::kByteFallback;
  // Consecutive byte tokens become one token (HF groups them).
  EXPECT_EQ(Dec({bf}, {"a", "<0xC3>", "<0xA9>", "b", "<0x41>"}),
            (Strings{"a", "\xC3\xA9", "b", "A"}));
  TokenizerDecoderStep meta;
  meta.kind = K::kMetaspace;
  // Every "▁" of the first token is dropped (HF's decode_chain), later ones are spaces.
  EXPECT_EQ(Dec({meta}, {"\u2581\u2581Hey", "\u2581friend"}), (Strings{"Hey", " friend"}));
  EXPECT_EQ(Dec({meta}, {"\u2581Hey"}, /*whole=*/false), (Strings{" Hey"}));
  TokenizerDecoderStep strip;
  strip.kind = K::kStrip;
  strip.content = " ";
  strip.strip_start = 1;
  strip.strip_stop = 1;
  EXPECT_EQ(Dec({strip}, {"  a  ", " b"}), (Strings{" a ", "b"}));
  TokenizerDecoderStep rep;
  rep.kind = K::kReplace;
  rep.pattern = "_+";
  rep.pattern_is_regex = true;
  rep.content = " ";
  TokenizerDecoderStep fuse;
  fuse.kind = K::kFuse;
  EXPECT_EQ(Dec({rep, fuse}, {"a__b", "_c"}), (Strings{"a b c"}));
  TokenizerDecoderStep bl;
  bl.kind = K::kByteLevel;
  // Tokens outside the byte alphabet pass through; the result is one token.
  EXPECT_EQ(Dec({bl}, {"\xC4\xA0hi", "<\xEF\xBD\x9C" "x>"}), (Strings{" hi<\xEF\xBD\x9C" "x>"}));
}

std::vector<internal::AddedVocabulary::Segment> Find(const internal::AddedVocabulary& v,
                                                     std::string_view text, bool special = true) {
  std::vector<internal::AddedVocabulary::Segment> out;
  v.Split(text, special, &out);
  return out;
}

std::string Show(std::string_view text, const std::vector<internal::AddedVocabulary::Segment>& s) {
  std::string r;
  for (const auto& x : s) {
    if (x.id >= 0) {
      r.append("[").append(std::to_string(x.id)).append(":");
    } else {
      r.append("(");
    }
    r.append(text.substr(x.begin, x.end - x.begin)).append(x.id >= 0 ? "]" : ")");
  }
  return r;
}

TEST(TokenizerPipelineTest, AddedTokenMatchingAsHf) {
  internal::AddedVocabulary v;
  auto tok = [](int32_t id, bool special, bool l, bool r, bool single) {
    TokenizerAddedToken t;
    t.id = id;
    t.special = special;
    t.lstrip = l;
    t.rstrip = r;
    t.single_word = single;
    return t;
  };
  v.Add("<mask>", tok(1, true, true, true, false));
  v.Add("ab", tok(2, false, false, false, false));
  v.Add("bcd", tok(3, false, false, false, false));
  v.Add("<s>", tok(4, true, false, false, false));
  v.Add("<s>x", tok(5, true, false, false, false));
  v.Add("yes", tok(6, false, false, false, true));
  std::string t = "I   <mask>  you";
  EXPECT_EQ(Show(t, Find(v, t)), "(I)[1:   <mask>  ](you)");
  t = "abcd";  // leftmost first, not longest overall
  EXPECT_EQ(Show(t, Find(v, t)), "[2:ab](cd)");
  t = "<s>x<s>";  // longest at one position
  EXPECT_EQ(Show(t, Find(v, t)), "[5:<s>x][4:<s>]");
  t = "<s>xab";  // special tokens skipped as text when not parsed; the search resumes after them
  EXPECT_EQ(Show(t, Find(v, t, false)), "(<s>x)[2:ab]");
  t = "yes yesno ayes, yes";
  EXPECT_EQ(Show(t, Find(v, t)), "[6:yes]( yesno ayes, )[6:yes]");
  t = "";
  EXPECT_TRUE(Find(v, t).empty());
}

std::unique_ptr<Tokenizer> Make(const std::string& json) {
  auto t = Tokenizer::FromJson(json, "t");
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(*t) : nullptr;
}

TEST(TokenizerPipelineTest, NormalizedAddedTokensMatchTheNormalizedText) {
  // Lowercase normalizer; "[day]" (normalized) matches "[DAY]" in the text,
  // "[RAW]" (not normalized) only as written.
  auto t = Make(R"({"model": {"type": "BPE", "vocab": {"a": 0, "d": 1, "y": 2, "[": 3, "]": 4,
      "r": 5, "w": 6, " ": 7}, "merges": []},
    "normalizer": {"type": "Lowercase"},
    "added_tokens": [{"id": 10, "content": "[day]", "normalized": true},
                     {"id": 11, "content": "[RAW]", "normalized": false}]})");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->Encode("[DAY] [RAW] [raw]"), (std::vector<int32_t>{10, 7, 11, 7, 3, 5, 0, 6, 4}));
}

TEST(TokenizerPipelineTest, SentencePieceScoresMergeBestFirst) {
  TokenizerJsonSpec spec;
  spec.model_type = "BPE";
  spec.vocab = {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"bc", 4}, {"abc", 5}, {"<0x78>", 6}};
  spec.scores = {0, 0, 0, -2, -1, -3, 0};
  spec.byte_fallback = true;
  auto t = Tokenizer::FromSpec(spec, "spm");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  // "bc" scores higher than "ab": a [bc]; "abc" cannot form from a + bc? It
  // can: a + bc is adjacent and "abc" is in the vocab.
  EXPECT_EQ((*t)->Encode("abc"), (std::vector<int32_t>{5}));
  EXPECT_EQ((*t)->Encode("abab"), (std::vector<int32_t>{3, 3}));
  EXPECT_EQ((*t)->Encode("bcx"), (std::vector<int32_t>{4, 6}));  // x → byte fallback
  spec.vocab.pop_back();
  spec.scores.pop_back();
  spec.unk_token = "c";
  auto u = Tokenizer::FromSpec(spec, "spm");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ((*u)->Encode("x"), (std::vector<int32_t>{2}));  // no byte token: unk
  spec.scores.pop_back();
  EXPECT_EQ(Tokenizer::FromSpec(spec, "spm").status().code(), StatusCode::kDataLoss);
}

TEST(TokenizerPipelineTest, FuseUnkAndByteFallbackInBpe) {
  const char* json = R"({"model": {"type": "BPE", "vocab": {"<unk>": 0, "a": 1, "<0xC3>": 2},
      "merges": [], "unk_token": "<unk>", "fuse_unk": FUSE, "byte_fallback": true}})";
  std::string fused = json;
  fused.replace(fused.find("FUSE"), 4, "true");
  std::string unfused = json;
  unfused.replace(unfused.find("FUSE"), 4, "false");
  // "xyé": x and y have no byte tokens → unk; é's bytes C3 A9: A9 is missing → unk.
  EXPECT_EQ(Make(fused)->Encode("axy\xC3\xA9" "a"), (std::vector<int32_t>{1, 0, 1}));
  EXPECT_EQ(Make(unfused)->Encode("axy\xC3\xA9" "a"), (std::vector<int32_t>{1, 0, 0, 0, 1}));
}

}  // namespace
}  // namespace arbiter
