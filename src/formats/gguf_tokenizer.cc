// formats/gguf_tokenizer.cc — TokenizerSpecFromGguf
// (arbiter/formats/gguf_tokenizer.h).
#include "arbiter/formats/gguf_tokenizer.h"

#include <string>
#include <utility>
#include <vector>

namespace arbiter {
namespace {

// The split regexes of the tokenizer.json files these pre-tokenizer names
// stand for (Hugging Face's Qwen2 and Llama 3 tokenizers).
constexpr char kQwen2SplitRegex[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr char kLlama3SplitRegex[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

constexpr int64_t kTokenControl = 3;
constexpr int64_t kTokenUserDefined = 4;

}  // namespace

Result<TokenizerJsonSpec> TokenizerSpecFromGguf(const GgufFile& gguf) {
  const std::string& file = gguf.name();
  ARBITER_ASSIGN_OR_RETURN(std::string model, gguf.GetString("tokenizer.ggml.model"));
  if (model != "gpt2") {
    return UnimplementedError(file + ": key \"tokenizer.ggml.model\" is \"" + model +
                              "\"; arbiter reads \"gpt2\" (byte-level BPE) vocabularies from "
                              "GGUF files");
  }
  std::string pre = "default";
  if (gguf.FindValue("tokenizer.ggml.pre") != nullptr) {
    ARBITER_ASSIGN_OR_RETURN(pre, gguf.GetString("tokenizer.ggml.pre"));
  }
  std::string regex;
  if (pre == "default" || pre == "gpt2") {
    regex = kGpt2SplitRegex;
  } else if (pre == "qwen2") {
    regex = kQwen2SplitRegex;
  } else if (pre == "llama-bpe") {
    regex = kLlama3SplitRegex;
  } else {
    return UnimplementedError(file + ": key \"tokenizer.ggml.pre\" is \"" + pre +
                              "\"; arbiter knows \"default\", \"gpt2\", \"qwen2\" and "
                              "\"llama-bpe\"");
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
  ARBITER_ASSIGN_OR_RETURN(std::vector<std::string> merges,
                           gguf.GetStringArray("tokenizer.ggml.merges"));

  TokenizerJsonSpec spec;
  spec.model_type = "BPE";
  spec.vocab.reserve(tokens.size());
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (types[id] == kTokenControl || types[id] == kTokenUserDefined) {
      spec.added_tokens.push_back(TokenizerAddedToken{static_cast<int32_t>(id),
                                                      std::move(tokens[id]),
                                                      types[id] == kTokenControl});
    } else {
      spec.vocab.emplace_back(std::move(tokens[id]), static_cast<int32_t>(id));
    }
  }
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
  TokenizerPreTokenizerStep split;
  split.kind = TokenizerPreTokenizerStep::Kind::kSplit;
  split.pattern = regex;
  split.pattern_is_regex = true;
  TokenizerPreTokenizerStep byte_level;
  byte_level.kind = TokenizerPreTokenizerStep::Kind::kByteLevel;
  byte_level.add_prefix_space = false;
  byte_level.use_regex = false;
  spec.pre_tokenizer = {split, byte_level};
  TokenizerDecoderStep decoder;
  decoder.kind = TokenizerDecoderStep::Kind::kByteLevel;
  spec.decoder = {decoder};
  return spec;
}

}  // namespace arbiter
