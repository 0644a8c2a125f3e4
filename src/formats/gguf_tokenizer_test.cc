#include "arbiter/formats/gguf_tokenizer.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "arbiter/formats/gguf.h"

namespace arbiter {
namespace {

using K = TokenizerPreTokenizerStep::Kind;

// A GGUF image holding a tiny vocabulary: "a", "b", "ab", one control token.
Result<GgufFile> Vocab(const std::string& model, const std::string& pre, bool with_merges = true) {
  GgufWriter w;
  EXPECT_TRUE(w.AddString("tokenizer.ggml.model", model).ok());
  if (!pre.empty()) {
    EXPECT_TRUE(w.AddString("tokenizer.ggml.pre", pre).ok());
  }
  EXPECT_TRUE(w.AddStringArray("tokenizer.ggml.tokens", {"<s>", "a", "b", "ab", "<0x41>"}).ok());
  auto types = GgufValue::IntArray(GgufValueType::kInt32, {3, 1, 1, 1, 6});
  EXPECT_TRUE(types.ok());
  EXPECT_TRUE(w.Add("tokenizer.ggml.token_type", *types).ok());
  if (model == "gpt2" && with_merges) {
    EXPECT_TRUE(w.AddStringArray("tokenizer.ggml.merges", {"a b"}).ok());
  }
  if (model == "llama") {
    auto scores = GgufValue::FloatArray(GgufValueType::kFloat32, {0, -1, -2, -3, 0});
    EXPECT_TRUE(scores.ok());
    EXPECT_TRUE(w.Add("tokenizer.ggml.scores", *scores).ok());
    EXPECT_TRUE(w.AddBool("tokenizer.ggml.add_space_prefix", false).ok());
  }
  return ParseGguf(w.Serialize(), "v.gguf");
}

TEST(GgufTokenizerTest, Gpt2PreTokenizers) {
  struct Case {
    const char* pre;
    size_t splits;
    bool nfc;
    bool ignore_merges;
  };
  for (const Case& c : {Case{"default", 4, false, false}, Case{"gpt2", 1, false, false},
                        Case{"gpt-2", 1, false, false}, Case{"qwen2", 1, true, false},
                        Case{"llama-bpe", 1, false, true}, Case{"deepseek-v3", 3, false, false}}) {
    auto gguf = Vocab("gpt2", c.pre);
    ASSERT_TRUE(gguf.ok()) << gguf.status().ToString();
    auto spec = TokenizerSpecFromGguf(*gguf);
    ASSERT_TRUE(spec.ok()) << c.pre << ": " << spec.status().ToString();
    ASSERT_EQ(spec->pre_tokenizer.size(), c.splits + 1) << c.pre;
    for (size_t i = 0; i < c.splits; ++i) EXPECT_EQ(spec->pre_tokenizer[i].kind, K::kSplit);
    EXPECT_EQ(spec->pre_tokenizer.back().kind, K::kByteLevel);
    EXPECT_EQ(spec->normalizer.size(), c.nfc ? 1u : 0u) << c.pre;
    EXPECT_EQ(spec->ignore_merges, c.ignore_merges) << c.pre;
    ASSERT_EQ(spec->added_tokens.size(), 1u);
    EXPECT_TRUE(spec->added_tokens[0].special);
    EXPECT_FALSE(spec->added_tokens[0].normalized);
    EXPECT_EQ(spec->vocab.size(), 4u);  // the control token is only an added token
    EXPECT_EQ(spec->merges.size(), 1u);
    EXPECT_TRUE(spec->scores.empty());
  }
}

TEST(GgufTokenizerTest, UnknownPreIsAnErrorNamingKeyAndValue) {
  auto gguf = Vocab("gpt2", "tekken-9000");
  ASSERT_TRUE(gguf.ok());
  auto spec = TokenizerSpecFromGguf(*gguf);
  EXPECT_EQ(spec.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(spec.status().message().find("v.gguf: key \"tokenizer.ggml.pre\" is \"tekken-9000\""),
            std::string::npos)
      << spec.status().message();
}

TEST(GgufTokenizerTest, UnknownModelAndMissingMerges) {
  auto bert = Vocab("bert", "");
  ASSERT_TRUE(bert.ok());
  auto spec = TokenizerSpecFromGguf(*bert);
  EXPECT_EQ(spec.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(spec.status().message().find("\"tokenizer.ggml.model\" is \"bert\""), std::string::npos);
  auto no_merges = Vocab("gpt2", "qwen2", /*with_merges=*/false);
  ASSERT_TRUE(no_merges.ok());
  EXPECT_FALSE(TokenizerSpecFromGguf(*no_merges).ok());
}

TEST(GgufTokenizerTest, SentencePieceVocabulary) {
  auto gguf = Vocab("llama", "");
  ASSERT_TRUE(gguf.ok());
  auto spec = TokenizerSpecFromGguf(*gguf);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->vocab.size(), 5u);  // every token, the control one too
  ASSERT_EQ(spec->scores.size(), 5u);
  EXPECT_EQ(spec->scores[3], -3.0f);
  EXPECT_TRUE(spec->merges.empty());
  EXPECT_TRUE(spec->byte_fallback);
  EXPECT_EQ(spec->unk_token, "<s>");  // unknown_token_id absent: id 0
  // add_space_prefix false: no Prepend, no Strip.
  ASSERT_EQ(spec->normalizer.size(), 1u);
  EXPECT_EQ(spec->normalizer[0].kind, TokenizerNormalizerStep::Kind::kReplace);
  ASSERT_EQ(spec->decoder.size(), 3u);
  EXPECT_EQ(spec->decoder[2].kind, TokenizerDecoderStep::Kind::kFuse);
}

}  // namespace
}  // namespace arbiter
