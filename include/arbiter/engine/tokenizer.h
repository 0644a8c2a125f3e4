// arbiter/engine/tokenizer.h — Hugging Face tokenizer.json BPE tokenizer.
//
// Implements HF `tokenizers`' encode and decode for BPE models as described
// by tokenizer.json (or by a GGUF vocabulary put in the same terms,
// arbiter/formats/gguf_tokenizer.h): added tokens are cut out first (those
// with normalized=false in the raw text, the others in the normalized text;
// leftmost-longest, with lstrip/rstrip/single_word), the rest is normalized
// (NFC/NFD/NFKC/NFKD via utf8proc, Lowercase, Replace, Prepend, Strip, ...),
// pre-tokenized (Split with the file's regex run by PCRE2 and any split
// behavior, ByteLevel, Digits, Metaspace, Whitespace, ...) and merged by BPE
// (merge ranks, or SentencePiece scores for GGUF "llama" vocabularies; byte
// fallback, unk and fuse_unk, ignore_merges). Decoding runs the file's
// decoder chain (ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace).
// The full list of supported components: arbiter/formats/tokenizer_json.h.
//
// Conformance: identical ids to a port of the HF reference on the real
// Qwen3, Llama 3, Llama 2, Gemma 3 and DeepSeek V3 tokenizer.json files over a
// multilingual corpus (tests/tokenizer_conformance/).
//
// Deviations from HF, all on inputs HF cannot represent or rarely sees:
// input need not be valid UTF-8 (invalid bytes never match a split regex,
// are left alone by normalizers and form their own pieces); Decode returns
// raw bytes instead of replacing invalid UTF-8 with U+FFFD, and concatenates
// tokens when there is no decoder (HF joins them with spaces); regex
// Unicode properties are PCRE2's and Unicode tables utf8proc's, not
// Oniguruma's and Rust's (they agree on the corpus); after an rstrip added
// token the search for the next added token resumes after the stripped
// whitespace.
//
// Errors: Load/FromJson return kDataLoss naming the file and the field for a
// malformed tokenizer.json (including a regex PCRE2 rejects),
// kUnimplemented for unsupported model types or components, kNotFound for a
// missing file. FromSpec: kDataLoss when scores and vocab differ in length.
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

  // Token ids for `text`; no BOS/EOS is added. With `parse_special` (HF's
  // default), special tokens written in the text (e.g. "<|im_start|>") map to
  // their ids; otherwise they are tokenized as plain text (HF's
  // encode_special_tokens). Non-special added tokens always map to their ids.
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
