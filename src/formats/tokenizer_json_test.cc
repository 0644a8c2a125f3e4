#include "arbiter/formats/tokenizer_json.h"

#include <gtest/gtest.h>

#include <string>

namespace arbiter {
namespace {

// A minimal valid file; tests substitute parts of it.
std::string File(const std::string& model, const std::string& rest = "") {
  return "{\"model\": " + model + (rest.empty() ? "" : ", " + rest) + "}";
}
const char kModel[] =
    R"({"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "c": 3}, "merges": ["a b"]})";

Status Parse(const std::string& text) {
  return ParseTokenizerJson(text, "tokenizer.json").status();
}

void ExpectError(const std::string& text, StatusCode code, const std::string& needle) {
  Status s = Parse(text);
  EXPECT_EQ(s.code(), code) << s.ToString() << "\nfor: " << text;
  EXPECT_NE(s.message().find(needle), std::string::npos)
      << "message \"" << s.message() << "\" lacks \"" << needle << "\"";
  EXPECT_EQ(s.message().rfind("tokenizer.json", 0), 0u) << s.message();
}

TEST(TokenizerJsonTest, ParsesMinimalBpe) {
  auto spec = ParseTokenizerJson(File(kModel), "t");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->model_type, "BPE");
  EXPECT_EQ(spec->vocab.size(), 4u);
  ASSERT_EQ(spec->merges.size(), 1u);
  EXPECT_EQ(spec->merges[0], (std::pair<std::string, std::string>{"a", "b"}));
  EXPECT_FALSE(spec->byte_fallback);
  EXPECT_TRUE(spec->added_tokens.empty());
  EXPECT_TRUE(spec->pre_tokenizer.empty());
  EXPECT_TRUE(spec->decoder.empty());
}

TEST(TokenizerJsonTest, ParsesPairMergesAndQwenStylePipeline) {
  std::string text = File(
      R"({"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b"]],
          "ignore_merges": true, "dropout": null, "unk_token": null})",
      R"("added_tokens": [{"id": 3, "content": "<|im_start|>", "special": true},
                          {"id": 4, "content": "word", "special": false}],
         "normalizer": {"type": "NFC"},
         "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "\\p{L}+"}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]},
         "decoder": {"type": "ByteLevel", "add_prefix_space": true},
         "post_processor": {"type": "ByteLevel"}, "truncation": null)");
  auto spec = ParseTokenizerJson(text, "t");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_TRUE(spec->ignore_merges);
  ASSERT_EQ(spec->added_tokens.size(), 2u);
  EXPECT_EQ(spec->added_tokens[0].id, 3);
  EXPECT_EQ(spec->added_tokens[0].content, "<|im_start|>");
  EXPECT_TRUE(spec->added_tokens[0].special);
  EXPECT_FALSE(spec->added_tokens[1].special);
  ASSERT_EQ(spec->normalizer.size(), 1u);
  EXPECT_EQ(spec->normalizer[0].kind, TokenizerNormalizerStep::Kind::kNfc);
  ASSERT_EQ(spec->pre_tokenizer.size(), 2u);
  EXPECT_EQ(spec->pre_tokenizer[0].kind, TokenizerPreTokenizerStep::Kind::kSplit);
  EXPECT_EQ(spec->pre_tokenizer[0].pattern, "\\p{L}+");
  EXPECT_TRUE(spec->pre_tokenizer[0].pattern_is_regex);
  EXPECT_EQ(spec->pre_tokenizer[1].kind, TokenizerPreTokenizerStep::Kind::kByteLevel);
  EXPECT_FALSE(spec->pre_tokenizer[1].use_regex);
  EXPECT_FALSE(spec->pre_tokenizer[1].add_prefix_space);
  ASSERT_EQ(spec->decoder.size(), 1u);
  EXPECT_EQ(spec->decoder[0].kind, TokenizerDecoderStep::Kind::kByteLevel);
}

TEST(TokenizerJsonTest, ParsesLlama2SentencePieceStyle) {
  std::string text = File(
      R"({"type": "BPE", "vocab": {"<unk>": 0, "<0x41>": 1, "▁": 2, "h": 3, "▁h": 4},
          "merges": ["▁ h"], "byte_fallback": true, "fuse_unk": true, "unk_token": "<unk>"})",
      R"("normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
         "pre_tokenizer": null,
         "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]})");
  auto spec = ParseTokenizerJson(text, "t");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_TRUE(spec->byte_fallback);
  EXPECT_TRUE(spec->fuse_unk);
  EXPECT_EQ(spec->unk_token, "<unk>");
  ASSERT_EQ(spec->normalizer.size(), 2u);
  EXPECT_EQ(spec->normalizer[0].kind, TokenizerNormalizerStep::Kind::kPrepend);
  EXPECT_EQ(spec->normalizer[0].prepend, "\xE2\x96\x81");
  EXPECT_EQ(spec->normalizer[1].kind, TokenizerNormalizerStep::Kind::kReplace);
  EXPECT_EQ(spec->normalizer[1].pattern, " ");
  EXPECT_FALSE(spec->normalizer[1].pattern_is_regex);
  ASSERT_EQ(spec->decoder.size(), 4u);
  EXPECT_EQ(spec->decoder[3].kind, TokenizerDecoderStep::Kind::kStrip);
  EXPECT_EQ(spec->decoder[3].strip_start, 1);
  EXPECT_EQ(spec->decoder[3].strip_stop, 0);
}

TEST(TokenizerJsonTest, ParsesFullPipelineVocabulary) {
  std::string text = File(
      kModel,
      R"("added_tokens": [{"id": 4, "content": "<s>", "special": true},
                          {"id": 5, "content": "[X]", "lstrip": true, "rstrip": true,
                           "single_word": true, "normalized": false},
                          {"id": 6, "content": "yo"}],
         "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "NFD"}, {"type": "NFKC"}, {"type": "NFKD"}, {"type": "Lowercase"},
            {"type": "StripAccents"}, {"type": "Strip", "strip_left": false, "strip_right": true}]},
         "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": true},
            {"type": "Digits", "individual_digits": true}, {"type": "Whitespace"},
            {"type": "WhitespaceSplit"}]},
         "decoder": {"type": "Replace", "pattern": {"Regex": "a+"}, "content": "b"})");
  auto spec = ParseTokenizerJson(text, "t");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  ASSERT_EQ(spec->added_tokens.size(), 3u);
  EXPECT_FALSE(spec->added_tokens[0].normalized);  // special: defaults to false
  EXPECT_TRUE(spec->added_tokens[1].lstrip);
  EXPECT_TRUE(spec->added_tokens[1].rstrip);
  EXPECT_TRUE(spec->added_tokens[1].single_word);
  EXPECT_FALSE(spec->added_tokens[1].normalized);
  EXPECT_TRUE(spec->added_tokens[2].normalized);   // not special: defaults to true
  using N = TokenizerNormalizerStep::Kind;
  ASSERT_EQ(spec->normalizer.size(), 6u);
  EXPECT_EQ(spec->normalizer[0].kind, N::kNfd);
  EXPECT_EQ(spec->normalizer[3].kind, N::kLowercase);
  EXPECT_EQ(spec->normalizer[4].kind, N::kStripAccents);
  EXPECT_EQ(spec->normalizer[5].kind, N::kStrip);
  EXPECT_FALSE(spec->normalizer[5].strip_left);
  using P = TokenizerPreTokenizerStep;
  ASSERT_EQ(spec->pre_tokenizer.size(), 4u);
  EXPECT_EQ(spec->pre_tokenizer[0].behavior, P::Behavior::kMergedWithPrevious);
  EXPECT_TRUE(spec->pre_tokenizer[0].invert);
  EXPECT_FALSE(spec->pre_tokenizer[0].pattern_is_regex);
  EXPECT_EQ(spec->pre_tokenizer[1].kind, P::Kind::kDigits);
  EXPECT_TRUE(spec->pre_tokenizer[1].individual_digits);
  EXPECT_EQ(spec->pre_tokenizer[2].kind, P::Kind::kWhitespace);
  EXPECT_EQ(spec->pre_tokenizer[3].kind, P::Kind::kWhitespaceSplit);
  ASSERT_EQ(spec->decoder.size(), 1u);
  EXPECT_TRUE(spec->decoder[0].pattern_is_regex);
}

TEST(TokenizerJsonTest, MalformedFilesNameTheField) {
  const auto kD = StatusCode::kDataLoss;
  ExpectError("{not json", kD, "not valid JSON");
  ExpectError("[]", kD, "top level must be a JSON object");
  ExpectError("{}", kD, "field \"model\" must be an object");
  ExpectError(File(R"({"type": "BPE", "vocab": [], "merges": []})"), kD,
              "field \"model.vocab\" must be an object");
  ExpectError(File(R"({"type": "BPE", "vocab": {"a": "0"}, "merges": []})"), kD,
              "field \"model.vocab[\"a\"]\" must be an integer id");
  ExpectError(File(R"({"type": "BPE", "vocab": {"a": -1}, "merges": []})"), kD,
              "model.vocab[\"a\"]");
  ExpectError(File(R"({"type": "BPE", "vocab": {"a": 0, "b": 0}, "merges": []})"), kD,
              "reuses id 0");
  ExpectError(File(R"({"type": "BPE", "vocab": {"a": 0}, "merges": {}})"), kD,
              "field \"model.merges\" must be an array");
  ExpectError(File(R"({"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b", 12]})"),
              kD, "tokenizer.json: field \"model.merges[1]\" must be a string \"a b\" or a pair");
  ExpectError(File(R"({"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["ab"]})"), kD,
              "field \"model.merges[0]\" must be a string \"a b\" or a pair");
  ExpectError(File(R"({"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a"]]})"),
              kD, "field \"model.merges[0]\" must be a string \"a b\" or a pair");
  ExpectError(File(R"({"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a b"]})"), kD,
              "field \"model.merges[0]\" produces \"ab\", which is not in model.vocab");
  ExpectError(File(R"({"type": "BPE", "vocab": {"a": 0, "ab": 1}, "merges": ["a b"]})"), kD,
              "field \"model.merges[0]\" uses \"b\"");
  ExpectError(File(R"({"type": "BPE", "vocab": {"a": 0}, "merges": [], "byte_fallback": 1})"), kD,
              "field \"model.byte_fallback\" must be a boolean");
  ExpectError(File(R"({"type": "BPE", "vocab": {"a": 0}, "merges": [], "unk_token": "<unk>"})"), kD,
              "field \"model.unk_token\"");
  ExpectError(File(kModel, R"("added_tokens": {})"), kD, "field \"added_tokens\" must be an array");
  ExpectError(File(kModel, R"("added_tokens": [{"content": "x"}])"), kD,
              "field \"added_tokens[0].id\" must be an integer");
  ExpectError(File(kModel, R"("added_tokens": [{"id": 5, "content": 3}])"), kD,
              "field \"added_tokens[0].content\" must be a string");
  ExpectError(File(kModel, R"("added_tokens": [{"id": 5, "content": "x", "special": "yes"}])"), kD,
              "field \"added_tokens[0].special\" must be a boolean");
  ExpectError(File(kModel, R"("normalizer": {"type": "Replace", "pattern": {"String": " "}})"), kD,
              "field \"normalizer.content\" must be a string");
  ExpectError(File(kModel, R"("normalizer": {"type": "Prepend"})"), kD,
              "field \"normalizer.prepend\" must be a string");
  ExpectError(File(kModel, R"("normalizer": {"type": "Sequence", "normalizers": 3})"), kD,
              "field \"normalizer.normalizers\" must be an array");
  ExpectError(File(kModel, R"("pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": 1}]})"),
              kD, "field \"pre_tokenizer.pretokenizers[0].type\" must be a string");
  ExpectError(File(kModel, R"("pre_tokenizer": {"type": "Split", "pattern": "x", "behavior": "Isolated"})"),
              kD, "field \"pre_tokenizer.pattern\" must be an object");
  ExpectError(File(kModel, R"("pre_tokenizer": {"type": "Split", "pattern": {"Regex": 5}, "behavior": "Isolated"})"),
              kD, "field \"pre_tokenizer.pattern.Regex\" must be a string");
  ExpectError(File(kModel, R"("pre_tokenizer": {"type": "ByteLevel", "use_regex": "no"})"), kD,
              "field \"pre_tokenizer.use_regex\" must be a boolean");
  ExpectError(File(kModel, R"("decoder": {"type": "Strip", "content": " ", "start": "1"})"), kD,
              "field \"decoder.start\" must be an integer");
  ExpectError(File(kModel, R"("decoder": 7)"), kD, "field \"decoder\" must be an object or null");
  ExpectError(File(kModel, R"("pre_tokenizer": {"type": "Split", "pattern": {"Regex": "x"}, "behavior": "Sideways"})"),
              kD, "field \"pre_tokenizer.behavior\" is \"Sideways\"");
}

TEST(TokenizerJsonTest, UnsupportedFeaturesAreUnimplemented) {
  const auto kU = StatusCode::kUnimplemented;
  ExpectError(File(R"({"type": "WordPiece", "vocab": {"a": 0}})"), kU,
              "field \"model.type\" is \"WordPiece\"");
  ExpectError(File(R"({"type": "Unigram", "vocab": [["a", 0.0]]})"), kU, "model.type");
  ExpectError(File(kModel, R"("normalizer": {"type": "BertNormalizer"})"), kU,
              "field \"normalizer.type\" is \"BertNormalizer\"");
  ExpectError(File(kModel, R"("pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Punctuation"}]})"),
              kU, "field \"pre_tokenizer.pretokenizers[0].type\" is \"Punctuation\"");
  ExpectError(File(kModel, R"("decoder": {"type": "WordPiece"})"), kU, "field \"decoder.type\"");
}

TEST(TokenizerJsonTest, LoadReportsMissingFile) {
  auto r = LoadTokenizerJson("/nonexistent/tokenizer.json");
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace arbiter
