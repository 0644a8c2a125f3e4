// Test support: a Tokenizer over a synthetic vocabulary, for building a
// GrammarVocabulary without a model (grammar tests, property tests, the GBNF
// fuzz target). Ids 0..255 are the 256 single bytes, then `pieces` in their
// order, then one special token (the last id, whose bytes are
// "<|special|>"). Only what GrammarVocabulary::Build reads is real: Encode
// and Decode return nothing, TokenId -1.
//
// Thread safety: thread-safe (immutable after construction).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "arbiter/engine/tokenizer.h"

namespace arbiter::testing {

class SyntheticTokenizer final : public Tokenizer {
 public:
  explicit SyntheticTokenizer(const std::vector<std::string>& pieces) {
    for (int b = 0; b < 256; ++b) tokens_.push_back(std::string(1, static_cast<char>(b)));
    for (const std::string& t : pieces) tokens_.push_back(t);
    tokens_.push_back("<|special|>");
  }
  std::vector<int32_t> Encode(std::string_view, bool) const override { return {}; }
  std::string Decode(const std::vector<int32_t>&, bool) const override { return ""; }
  std::string TokenBytes(int32_t id) const override {
    return id >= 0 && id < static_cast<int32_t>(tokens_.size()) ? tokens_[id] : "";
  }
  int32_t TokenId(std::string_view) const override { return -1; }
  bool IsSpecial(int32_t id) const override {
    return id == static_cast<int32_t>(tokens_.size()) - 1;
  }
  int vocab_size() const override { return static_cast<int>(tokens_.size()); }

 private:
  std::vector<std::string> tokens_;
};

}  // namespace arbiter::testing
