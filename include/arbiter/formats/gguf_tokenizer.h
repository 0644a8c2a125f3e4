// arbiter/formats/gguf_tokenizer.h — the tokenizer stored in a GGUF file's
// metadata, as the spec the engine's Tokenizer is built from
// (Tokenizer::FromSpec).
//
// Keys read (llama.cpp's converter writes them):
//   tokenizer.ggml.model        "gpt2": byte-level BPE with merges
//   tokenizer.ggml.tokens       [string] the vocabulary, id = index
//   tokenizer.ggml.token_type   [int] per token: 1 normal, 2 unknown,
//                               3 control, 4 user-defined, 5 unused, 6 byte
//                               (absent: every token normal)
//   tokenizer.ggml.merges       [string] "a b", in rank order
//   tokenizer.ggml.pre          the pre-tokenizer: "default" / "gpt2" (the
//                               GPT-2 split regex), "qwen2", "llama-bpe"
//                               (Llama 3); absent = "default"
// Control (3) and user-defined (4) tokens become added tokens (special for
// control), matched in the text before BPE, as tokenizer.json's
// added_tokens are; every other token is in the BPE vocabulary.
// The pipeline is tokenizer.json's for these models: Split(regex,
// Isolated) → ByteLevel(no prefix space, no regex); decoder ByteLevel.
//
// Errors: kDataLoss naming the file and key for a missing or mistyped key
// or a token_type array of another length; kUnimplemented naming the key
// and value for another tokenizer.ggml.model ("llama" SentencePiece
// vocabularies, "bert", …) or tokenizer.ggml.pre.
//
// Thread safety: pure function.
#pragma once

#include "arbiter/base/status.h"
#include "arbiter/formats/gguf.h"
#include "arbiter/formats/tokenizer_json.h"

namespace arbiter {

Result<TokenizerJsonSpec> TokenizerSpecFromGguf(const GgufFile& gguf);

}  // namespace arbiter
