// arbiter/engine/tokenizer.h — Hugging Face tokenizer.json BPE tokenizer.
//
// Implements the BPE model of HF `tokenizers` as described by tokenizer.json:
// added/special tokens are matched first (longest match, in the raw text);
// the remaining text is split by the pre-tokenizer (the file's own Split
// regex, run with PCRE2 in UTF mode, then ByteLevel byte→unicode mapping);
// each piece is merged by merge rank; unknown bytes use byte fallback
// (<0xNN> tokens) when the model enables it. Decoding reverses the ByteLevel
// mapping (or byte fallback), yielding raw bytes.
//
// Supported tokenizer.json features: see arbiter/formats/tokenizer_json.h
// (ByteLevel/GPT-2, Qwen2/Llama-3 Split regex, Llama-2 sentencepiece-style
// Prepend/Replace + byte fallback, Metaspace). Deviations from HF, all on
// inputs HF cannot represent or rarely sees: input need not be valid UTF-8
// (invalid bytes never match the split regex and form their own pieces);
// Decode returns raw bytes instead of replacing invalid UTF-8 with U+FFFD;
// an NFC normalizer is treated as identity; all added tokens are matched in
// the raw (unnormalized) text.
//
// Errors: Load/FromJson return kDataLoss naming the file and the field for a
// malformed tokenizer.json (including a split regex PCRE2 rejects),
// kUnimplemented for unsupported model types, kNotFound for a missing file.
//
// Thread safety: immutable after construction; all methods thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "arbiter/base/status.h"
#include "arbiter/formats/tokenizer_json.h"

namespace arbiter {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  static Result<std::unique_ptr<Tokenizer>> Load(const std::string& tokenizer_json_path);
  // `name` is used in error messages (e.g. the file path).
  static Result<std::unique_ptr<Tokenizer>> FromJson(std::string_view json_text,
                                                     const std::string& name);
  // From an already parsed spec (a GGUF file's vocabulary,
  // TokenizerSpecFromGguf). Errors as FromJson's, after the parse.
  static Result<std::unique_ptr<Tokenizer>> FromSpec(TokenizerJsonSpec spec,
                                                     const std::string& name);

  // Token ids for `text`. With `parse_special`, special/added tokens written
  // in the text (e.g. "<|im_start|>") map to their ids; otherwise they are
  // tokenized as plain text.
  virtual std::vector<int32_t> Encode(std::string_view text, bool parse_special = true) const = 0;
  // Bytes for `ids` (may end in a partial UTF-8 sequence). Special tokens are
  // rendered as their content unless `skip_special`.
  virtual std::string Decode(const std::vector<int32_t>& ids, bool skip_special = false) const = 0;
  // Raw bytes of one token (ByteLevel-decoded; may be a partial UTF-8 char).
  virtual std::string TokenBytes(int32_t id) const = 0;
  // Id of a token by its exact vocab/added-token string; -1 when absent.
  virtual int32_t TokenId(std::string_view token) const = 0;
  virtual bool IsSpecial(int32_t id) const = 0;
  // Largest id + 1 (vocab plus added tokens).
  virtual int vocab_size() const = 0;
};

}  // namespace arbiter
