#include "arbiter/engine/tokenizer.h"
#include "tools/model_maker/bpe_trainer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <thread>

#include "engine/internal/byte_level.h"
#include "engine/internal/pcre2_regex.h"

namespace arbiter {
namespace {

using Ids = std::vector<int32_t>;

const char kQwenRegex[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

std::unique_ptr<Tokenizer> MustLoad(const std::string& json) {
  auto t = Tokenizer::FromJson(json, "test tokenizer.json");
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(t).value() : nullptr;
}

// A GPT-2 style tokenizer whose merges are easy to follow by hand.
const char kHandBpe[] = R"({
  "added_tokens": [
    {"id": 100, "content": "<|im_start|>", "special": true},
    {"id": 101, "content": "<|im", "special": false},
    {"id": 102, "content": "<|im_end|>", "special": true}],
  "normalizer": null,
  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
  "decoder": {"type": "ByteLevel"},
  "model": {"type": "BPE", "vocab": {
      "h": 0, "e": 1, "l": 2, "o": 3, "Ġ": 4, "w": 5, "r": 6, "d": 7, "he": 8, "ll": 9,
      "hell": 10, "hello": 11, "Ġw": 12, "or": 13, "Ġwor": 14, "!": 15, "Ċ": 16},
    "merges": ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or"]}
})";

TEST(TokenizerTest, HandComputedMerges) {
  auto t = MustLoad(kHandBpe);
  ASSERT_TRUE(t);
  // "hello" → he l l o → he ll o → hell o → hello.
  // " world" → Ġ w o r l d → Ġw o r l d → Ġw or l d → Ġwor l d.
  EXPECT_EQ(t->Encode("hello world"), (Ids{11, 14, 2, 7}));
  // Equal ranks: the leftmost pair merges first.
  EXPECT_EQ(t->Encode("lll"), (Ids{9, 2}));
  // The lower rank wins even when it is to the right: "l l" (1) before "he ll" (2).
  EXPECT_EQ(t->Encode("hell"), (Ids{10}));
  EXPECT_EQ(t->Encode(""), Ids{});
  EXPECT_EQ(t->Decode({11, 14, 2, 7}), "hello world");
  EXPECT_EQ(t->Decode({16}), "\n");
  EXPECT_EQ(t->TokenBytes(14), " wor");
  EXPECT_EQ(t->TokenBytes(4), " ");
  EXPECT_EQ(t->TokenBytes(-5), "");
  EXPECT_EQ(t->TokenBytes(50), "");  // a hole in the id space
  EXPECT_EQ(t->vocab_size(), 103);
  EXPECT_EQ(t->TokenId("Ġwor"), 14);
  EXPECT_EQ(t->TokenId("<|im_end|>"), 102);
  EXPECT_EQ(t->TokenId("nope"), -1);
}

TEST(TokenizerTest, AddedTokensMatchLongestFirstInRawText) {
  auto t = MustLoad(kHandBpe);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->Encode("<|im_start|>hello<|im_end|>"), (Ids{100, 11, 102}));
  EXPECT_EQ(t->Encode("hello<|im_start|> world"), (Ids{11, 100, 14, 2, 7}));
  // "<|im" (non-special) is a prefix of both specials; the longer wins.
  EXPECT_EQ(t->Encode("<|imhello"), (Ids{101, 11}));
  // Without parse_special the specials are text; the non-special "<|im"
  // still matches; of the rest ("_start|>") only "r" is in the vocab, the
  // other characters are dropped (no byte fallback, no unk — HF behaviour).
  Ids plain = t->Encode("<|im_start|>", /*parse_special=*/false);
  EXPECT_EQ(plain, (Ids{101, 6}));
  EXPECT_TRUE(t->IsSpecial(100));
  EXPECT_FALSE(t->IsSpecial(101));
  EXPECT_FALSE(t->IsSpecial(11));
  EXPECT_FALSE(t->IsSpecial(-1));
  EXPECT_EQ(t->Decode({100, 11, 102}), "<|im_start|>hello<|im_end|>");
  EXPECT_EQ(t->Decode({100, 11, 102}, /*skip_special=*/true), "hello");
  EXPECT_EQ(t->Decode({101, 11}, /*skip_special=*/true), "<|imhello");
  EXPECT_EQ(t->TokenBytes(100), "<|im_start|>");
  EXPECT_EQ(t->Decode({-1, 11, 9999}), "hello");  // out-of-range ids are skipped
}

TEST(TokenizerTest, ByteLevelPrefixSpaceAndIgnoreMerges) {
  std::string json = kHandBpe;
  json.replace(json.find("\"add_prefix_space\": false"), 25, "\"add_prefix_space\": true ");
  auto t = MustLoad(json);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->Encode("wor"), (Ids{14}));  // " wor"
  EXPECT_EQ(t->Encode(" wor"), (Ids{14}));  // already starts with a space

  std::string im = kHandBpe;
  im.replace(im.find("\"type\": \"BPE\""), 13, "\"type\": \"BPE\", \"ignore_merges\": true");
  auto t2 = MustLoad(im);
  ASSERT_TRUE(t2);
  EXPECT_EQ(t2->Encode("hello"), (Ids{11}));
}

// Llama-2 / sentencepiece style: Prepend + Replace normalizer, no
// pre-tokenizer, byte fallback, Replace/ByteFallback/Fuse/Strip decoder.
std::string SpmJson() {
  std::string vocab = R"("<unk>": 0, "<s>": 1, "</s>": 2)";
  for (int b = 0; b < 256; ++b) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), ", \"<0x%02X>\": %d", b, 3 + b);
    vocab += buf;
  }
  vocab += R"(, "▁": 259, "h": 260, "i": 261, "▁h": 262, "▁hi": 263)";
  return R"({
    "added_tokens": [{"id": 0, "content": "<unk>", "special": true},
                     {"id": 1, "content": "<s>", "special": true},
                     {"id": 2, "content": "</s>", "special": true}],
    "normalizer": {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
    "pre_tokenizer": null,
    "decoder": {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    "model": {"type": "BPE", "byte_fallback": true, "fuse_unk": true, "unk_token": "<unk>",
              "vocab": {)" + vocab + R"(}, "merges": ["▁ h", "▁h i"]}
  })";
}

TEST(TokenizerTest, SentencePieceStyleWithByteFallback) {
  auto t = MustLoad(SpmJson());
  ASSERT_TRUE(t);
  EXPECT_EQ(t->Encode("hi"), (Ids{263}));
  // "hi é" → ▁hi ▁ é; é is not in the vocab → its UTF-8 bytes C3 A9.
  Ids ids = t->Encode("hi \xC3\xA9");
  EXPECT_EQ(ids, (Ids{263, 259, 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(t->Decode(ids), "hi \xC3\xA9");
  EXPECT_EQ(t->TokenBytes(263), " hi");
  EXPECT_EQ(t->TokenBytes(3 + 0x41), "A");
  EXPECT_EQ(t->Encode("<s>hi"), (Ids{1, 263}));
  EXPECT_EQ(t->Decode({1, 263}, true), "hi");

  std::mt19937 rng(7);
  for (int iter = 0; iter < 300; ++iter) {
    std::string s;
    int len = rng() % 40;
    for (int k = 0; k < len; ++k) {
      // ASCII, spaces and arbitrary (often invalid UTF-8) bytes; not "▁".
      int kind = rng() % 3;
      s.push_back(kind == 0 ? ' ' : kind == 1 ? char('a' + rng() % 26) : char(rng() % 256));
    }
    if (s.find("\xE2\x96\x81") != std::string::npos || s.find('<') != std::string::npos) continue;
    EXPECT_EQ(t->Decode(t->Encode(s)), s) << "iteration " << iter;
  }
}

TEST(TokenizerTest, MetaspacePreTokenizer) {
  std::string json = SpmJson();
  json.replace(json.find("\"pre_tokenizer\": null"), 21,
               R"("pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true})");
  json.replace(json.find("{\"type\": \"Prepend\", \"prepend\": \"▁\"},"),
               std::string("{\"type\": \"Prepend\", \"prepend\": \"▁\"},").size(), "");
  auto t = MustLoad(json);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->Encode("hi hi"), (Ids{263, 263}));
  EXPECT_EQ(t->Decode({263, 263}), "hi hi");
}

// The split regex of Qwen2 / Llama-3 run through PCRE2.
std::vector<std::string> Split(const std::string& text) {
  auto re = internal::Pcre2Regex::Compile(kQwenRegex);
  EXPECT_TRUE(re.ok()) << re.status().ToString();
  std::vector<std::pair<size_t, size_t>> spans;
  (*re)->SplitIsolated(text, &spans);
  std::vector<std::string> out;
  for (auto [b, e] : spans) out.push_back(text.substr(b, e - b));
  return out;
}

TEST(TokenizerTest, QwenRegexPreTokenization) {
  using V = std::vector<std::string>;
  EXPECT_EQ(Split("Hello world's 123 foo!!\n\n  bar"),
            (V{"Hello", " world", "'s", " ", "1", "2", "3", " foo", "!!\n\n", " ", " bar"}));
  EXPECT_EQ(Split("DON'T stop"), (V{"DON", "'T", " stop"}));
  EXPECT_EQ(Split("h\xC3\xA9llo \xD0\xBC\xD0\xB8\xD1\x80 \xE4\xBD\xA0\xE5\xA5\xBD"),
            (V{"h\xC3\xA9llo", " \xD0\xBC\xD0\xB8\xD1\x80", " \xE4\xBD\xA0\xE5\xA5\xBD"}));
  EXPECT_EQ(Split("a\r\nb   "), (V{"a", "\r\n", "b", "   "}));
  EXPECT_EQ(Split("x = (y+1);"), (V{"x", " =", " (", "y", "+", "1", ");"}));
  // Invalid UTF-8 never crashes; the bad byte ends up in a piece of its own.
  V bad = Split("ab\xFF" "cd");
  std::string joined;
  for (auto& p : bad) joined += p;
  EXPECT_EQ(joined, "ab\xFF" "cd");
}

TrainedBpe Trained(int merges) {
  auto corpus = DefaultTrainingCorpus();
  EXPECT_TRUE(corpus.ok()) << corpus.status().ToString();
  BpeTrainerOptions o;
  o.num_merges = merges;
  o.special_tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  auto bpe = TrainBpe(*corpus, o);
  EXPECT_TRUE(bpe.ok());
  return *bpe;
}

TEST(TokenizerTest, TrainedTokenizerRoundTripsArbitraryBytes) {
  TrainedBpe bpe = Trained(800);
  auto t = MustLoad(bpe.ToTokenizerJson());
  ASSERT_TRUE(t);
  EXPECT_EQ(t->vocab_size(), bpe.vocab_size());
  EXPECT_EQ(t->TokenBytes(t->TokenId("\xC4\xA0the")), " the");  // "Ġthe"
  for (uint32_t seed : {1u, 2u, 3u}) {
    std::mt19937 rng(seed);
    for (int iter = 0; iter < 400; ++iter) {
      std::string s;
      int len = rng() % 120;
      int mode = iter % 3;
      for (int k = 0; k < len; ++k) {
        if (mode == 0) {
          s.push_back(static_cast<char>(rng() % 256));  // raw bytes
        } else if (mode == 1) {
          const char* words[] = {"the ", "License", " \xC3\xA9t\xC3\xA9", "\n", "  ", "42",
                                 "'s", "\xE4\xBD\xA0", "\xF0\x9F\x98\x80", "\xE4\xBD", "<|im_end|>"};
          s += words[rng() % 11];
        } else {
          s.push_back(static_cast<char>(32 + rng() % 95));
        }
      }
      Ids ids = t->Encode(s);
      ASSERT_EQ(t->Decode(ids), s) << "seed " << seed << " iteration " << iter;
      std::string bytes;
      for (int32_t id : ids) bytes += t->TokenBytes(id);
      ASSERT_EQ(bytes, s);
      ASSERT_EQ(t->Decode(t->Encode(s, /*parse_special=*/false)), s);
    }
  }
}

TEST(TokenizerTest, TrainedTokenizerSpecialTokens) {
  TrainedBpe bpe = Trained(300);
  auto t = MustLoad(bpe.ToTokenizerJson());
  ASSERT_TRUE(t);
  int32_t start = t->TokenId("<|im_start|>"), end = t->TokenId("<|im_end|>");
  ASSERT_GE(start, 0);
  ASSERT_GE(end, 0);
  EXPECT_TRUE(t->IsSpecial(start));
  Ids ids = t->Encode("<|im_start|>user\nhi<|im_end|>");
  EXPECT_EQ(ids.front(), start);
  EXPECT_EQ(ids.back(), end);
  Ids plain = t->Encode("<|im_start|>", /*parse_special=*/false);
  EXPECT_GT(plain.size(), 1u);
  for (int32_t id : plain) EXPECT_FALSE(t->IsSpecial(id));
  EXPECT_EQ(t->Decode(plain), "<|im_start|>");
  EXPECT_EQ(t->Decode(ids, /*skip_special=*/true), "user\nhi");
}

TEST(TokenizerTest, ThreadSafeAndFast) {
  TrainedBpe bpe = Trained(2000);
  auto t = MustLoad(bpe.ToTokenizerJson());
  ASSERT_TRUE(t);
  auto corpus = DefaultTrainingCorpus();
  ASSERT_TRUE(corpus.ok());
  auto t0 = std::chrono::steady_clock::now();
  Ids all = t->Encode(*corpus);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("encode %zu bytes → %zu tokens in %.3f s\n", corpus->size(), all.size(), secs);
  EXPECT_LT(all.size(), corpus->size() / 3);  // trained on it: compresses well
  EXPECT_EQ(t->Decode(all), *corpus);

  std::string text = corpus->substr(0, 20000);
  Ids expected = t->Encode(text);
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      int good = 1;
      for (int k = 0; k < 20; ++k) good &= t->Encode(text) == expected;
      ok[i] = good;
    });
  }
  for (auto& th : threads) th.join();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(ok[i], 1) << "thread " << i;
}

TEST(TokenizerTest, LoadErrors) {
  auto missing = Tokenizer::Load("/nonexistent/tokenizer.json");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  auto wp = Tokenizer::FromJson(R"({"model": {"type": "WordPiece", "vocab": {}}})", "x.json");
  EXPECT_EQ(wp.status().code(), StatusCode::kUnimplemented);
  std::string bad_regex = kHandBpe;
  bad_regex.replace(bad_regex.find("{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}"),
                    std::string("{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}").size(),
                    R"({"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"})");
  auto r = Tokenizer::FromJson(bad_regex, "x.json");
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("x.json"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("pattern"), std::string::npos) << r.status().message();
}

TEST(TokenizerTest, ByteLevelTableIsGpt2) {
  const auto& t = internal::GetByteLevelTables();
  EXPECT_EQ(t.byte_to_cp[' '], 0x120u);   // Ġ
  EXPECT_EQ(t.byte_to_cp['\n'], 0x10Au);  // Ċ
  EXPECT_EQ(t.byte_to_cp['!'], uint32_t('!'));
  EXPECT_EQ(t.byte_to_cp[0], 0x100u);
  EXPECT_EQ(t.byte_to_cp[0xAD], 0x143u);  // soft hyphen is remapped
  EXPECT_EQ(t.byte_to_cp[0xFF], 0xFFu);
}

}  // namespace
}  // namespace arbiter
