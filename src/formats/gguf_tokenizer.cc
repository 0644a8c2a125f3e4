// formats/gguf_tokenizer.cc — TokenizerSpecFromGguf
// (arbiter/formats/gguf_tokenizer.h).
//
// The pre-tokenizer regexes are those of the Hugging Face tokenizer.json
// files each tokenizer.ggml.pre name stands for, which llama.cpp's
// llama-vocab.cpp also carries (there, (?i:...) groups are spelled out as
// character classes because std::regex lacks them; PCRE2 has them).
#include "arbiter/formats/gguf_tokenizer.h"

#include <string>
#include <utility>
#include <vector>

namespace arbiter {
namespace {

// Qwen2 / Qwen2.5 / Qwen3: single digits.
constexpr char kQwen2SplitRegex[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// Llama 3: digits in groups of up to three.
constexpr char kLlama3SplitRegex[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// DeepSeek V3: three splits in sequence (digits, CJK runs, the rest).
const char* const kDeepSeek3SplitRegexes[] = {
    "\\p{N}{1,3}",
    "[\xE4\xB8\x80-\xE9\xBE\xA5\xE3\x81\x80-\xE3\x82\x9F\xE3\x82\xA0-\xE3\x83\xBF]+",  // 一-龥぀-ゟ゠-ヿ
    // One regex over two lines (parenthesized: not two array elements).
    ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
     "?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"),
};
// llama.cpp's "default" BPE pre-tokenizer: four splits in sequence.
const char* const kDefaultSplitRegexes[] = {
    "[\\p{P}\\$\\+<=>\\^~\\|]+",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    "\\p{N}+",
    "[0-9][0-9][0-9]",
};

constexpr int64_t kTokenUnknown = 2;
constexpr int64_t kTokenControl = 3;
constexpr int64_t kTokenUserDefined = 4;

constexpr char kSpace[] = "\xE2\x96\x81";  // "▁", SentencePiece's space

TokenizerPreTokenizerStep Split(const char* regex) {
  TokenizerPreTokenizerStep s;
  s.kind = TokenizerPreTokenizerStep::Kind::kSplit;
  s.pattern = regex;
  s.pattern_is_regex = true;
  s.behavior = TokenizerPreTokenizerStep::Behavior::kIsolated;
  return s;
}

// The "gpt2" pipeline for tokenizer.ggml.pre = `pre`: Split steps, then
// ByteLevel without prefix space or regex; decoder ByteLevel.
Status GptPipeline(const std::string& file, const std::string& pre, TokenizerJsonSpec* spec) {
  if (pre == "default") {
    for (const char* r : kDefaultSplitRegexes) spec->pre_tokenizer.push_back(Split(r));
  } else if (pre == "gpt2" || pre == "gpt-2") {
    spec->pre_tokenizer.push_back(Split(kGpt2SplitRegex));
  } else if (pre == "qwen2") {
    spec->pre_tokenizer.push_back(Split(kQwen2SplitRegex));
    // Qwen's tokenizer.json normalizes to NFC before splitting (llama.cpp
    // does not; the Hugging Face tokenizer is the reference).
    TokenizerNormalizerStep nfc;
    nfc.kind = TokenizerNormalizerStep::Kind::kNfc;
    spec->normalizer.push_back(nfc);
  } else if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3") {
    spec->pre_tokenizer.push_back(Split(kLlama3SplitRegex));
    spec->ignore_merges = true;  // Llama 3's tokenizer.json sets it
  } else if (pre == "deepseek-v3") {
    for (const char* r : kDeepSeek3SplitRegexes) spec->pre_tokenizer.push_back(Split(r));
  } else {
    return UnimplementedError(file + ": key \"tokenizer.ggml.pre\" is \"" + pre +
                              "\", which arbiter does not know; known values: \"default\", "
                              "\"gpt2\", \"gpt-2\", \"qwen2\", \"llama-bpe\", \"llama3\", "
                              "\"llama-v3\", \"deepseek-v3\"");
  }
  TokenizerPreTokenizerStep byte_level;
  byte_level.kind = TokenizerPreTokenizerStep::Kind::kByteLevel;
  byte_level.add_prefix_space = false;
  byte_level.use_regex = false;
  spec->pre_tokenizer.push_back(byte_level);
  TokenizerDecoderStep decoder;
  decoder.kind = TokenizerDecoderStep::Kind::kByteLevel;
  spec->decoder = {decoder};
  return OkStatus();
}

// The SentencePiece pipeline (llama.cpp's SPM tokenizer, HF's Llama 2
// tokenizer.json): spaces become "▁", one "▁" is prepended to each text
// segment when add_space_prefix; decoding reverses both.
void SentencePiecePipeline(bool add_space_prefix, TokenizerJsonSpec* spec) {
  if (add_space_prefix) {
    TokenizerNormalizerStep prepend;
    prepend.kind = TokenizerNormalizerStep::Kind::kPrepend;
    prepend.prepend = kSpace;
    spec->normalizer.push_back(prepend);
  }
  TokenizerNormalizerStep replace;
  replace.kind = TokenizerNormalizerStep::Kind::kReplace;
  replace.pattern = " ";
  replace.content = kSpace;
  spec->normalizer.push_back(replace);
  TokenizerDecoderStep d;
  d.kind = TokenizerDecoderStep::Kind::kReplace;
  d.pattern = kSpace;
  d.content = " ";
  spec->decoder.push_back(d);
  d = TokenizerDecoderStep{};
  d.kind = TokenizerDecoderStep::Kind::kByteFallback;
  spec->decoder.push_back(d);
  d.kind = TokenizerDecoderStep::Kind::kFuse;
  spec->decoder.push_back(d);
  if (add_space_prefix) {
    d.kind = TokenizerDecoderStep::Kind::kStrip;
    d.content = " ";
    d.strip_start = 1;
    d.strip_stop = 0;
    spec->decoder.push_back(d);
  }
}

}  // namespace

Result<TokenizerJsonSpec> TokenizerSpecFromGguf(const GgufFile& gguf) {
  const std::string& file = gguf.name();
  ARBITER_ASSIGN_OR_RETURN(std::string model, gguf.GetString("tokenizer.ggml.model"));
  const bool spm = model == "llama";
  if (model != "gpt2" && !spm) {
    return UnimplementedError(file + ": key \"tokenizer.ggml.model\" is \"" + model +
                              "\"; arbiter reads \"gpt2\" (byte-level BPE) and \"llama\" "
                              "(SentencePiece BPE) vocabularies from GGUF files");
  }
  ARBITER_ASSIGN_OR_RETURN(std::vector<std::string> tokens,
                           gguf.GetStringArray("tokenizer.ggml.tokens"));
  std::vector<int64_t> types(tokens.size(), 1);
  if (gguf.FindValue("tokenizer.ggml.token_type") != nullptr) {
    ARBITER_ASSIGN_OR_RETURN(types, gguf.GetIntArray("tokenizer.ggml.token_type"));
    if (types.size() != tokens.size()) {
      return DataLossError(file + ": key \"tokenizer.ggml.token_type\" has " +
                           std::to_string(types.size()) + " entries for " +
                           std::to_string(tokens.size()) + " tokens");
    }
  }

  TokenizerJsonSpec spec;
  spec.model_type = "BPE";
  spec.vocab.reserve(tokens.size());
  for (size_t id = 0; id < tokens.size(); ++id) {
    const int64_t type = types[id];
    const bool added =
        type == kTokenUnknown || type == kTokenControl || type == kTokenUserDefined;
    if (added) {
      // Matched in the raw text before anything else, as llama.cpp does;
      // unknown and control tokens only when parsing specials.
      TokenizerAddedToken t;
      t.id = static_cast<int32_t>(id);
      t.content = tokens[id];
      t.special = type != kTokenUserDefined;
      t.normalized = false;
      if (!t.content.empty()) spec.added_tokens.push_back(std::move(t));
    }
    // A SentencePiece vocabulary keeps every token in the model vocab (as
    // HF's Llama 2 tokenizer.json does); a GPT-2 one only the BPE tokens.
    if (spm || !added) spec.vocab.emplace_back(std::move(tokens[id]), static_cast<int32_t>(id));
  }

  if (spm) {
    spec.scores.assign(spec.vocab.size(), 0.0f);
    if (gguf.FindValue("tokenizer.ggml.scores") != nullptr) {
      ARBITER_ASSIGN_OR_RETURN(std::vector<double> scores,
                               gguf.GetFloatArray("tokenizer.ggml.scores"));
      if (scores.size() != spec.vocab.size()) {
        return DataLossError(file + ": key \"tokenizer.ggml.scores\" has " +
                             std::to_string(scores.size()) + " entries for " +
                             std::to_string(spec.vocab.size()) + " tokens");
      }
      for (size_t i = 0; i < scores.size(); ++i) spec.scores[i] = static_cast<float>(scores[i]);
    }
    bool add_space_prefix = true;
    if (gguf.FindValue("tokenizer.ggml.add_space_prefix") != nullptr) {
      ARBITER_ASSIGN_OR_RETURN(add_space_prefix, gguf.GetBool("tokenizer.ggml.add_space_prefix"));
    }
    uint64_t unk = 0;
    if (gguf.FindValue("tokenizer.ggml.unknown_token_id") != nullptr) {
      ARBITER_ASSIGN_OR_RETURN(unk, gguf.GetUint("tokenizer.ggml.unknown_token_id"));
    }
    if (unk < spec.vocab.size()) spec.unk_token = spec.vocab[unk].first;
    spec.byte_fallback = true;
    SentencePiecePipeline(add_space_prefix, &spec);
    return spec;
  }

  std::string pre = "default";
  if (gguf.FindValue("tokenizer.ggml.pre") != nullptr) {
    ARBITER_ASSIGN_OR_RETURN(pre, gguf.GetString("tokenizer.ggml.pre"));
  }
  ARBITER_RETURN_IF_ERROR(GptPipeline(file, pre, &spec));
  ARBITER_ASSIGN_OR_RETURN(std::vector<std::string> merges,
                           gguf.GetStringArray("tokenizer.ggml.merges"));
  spec.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string& m = merges[i];
    const size_t space = m.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == m.size() ||
        m.find(' ', space + 1) != std::string::npos) {
      return DataLossError(file + ": key \"tokenizer.ggml.merges\" entry " + std::to_string(i) +
                           " is not two tokens separated by one space");
    }
    spec.merges.emplace_back(m.substr(0, space), m.substr(space + 1));
  }
  return spec;
}

}  // namespace arbiter
